#!/usr/bin/env bash
# Spot recipes (issue 17): the Kubernetes manifests pass the official schema
# (kubernetes-validate, strict: unknown fields refused; a broken copy must
# fail, so the validator is really checking), and the spot Job has what a
# preemptible run needs: --resume auto, a restart policy the
# podFailurePolicy accepts, exit 75 and disruptions not counted, a grace
# period, the run folder on a claim. The Slurm spot script asks for
# --requeue and --signal=B:TERM@120 and parses.
set -u
cd "$(dirname "$0")/.."
PY="env PYTHONPATH=.deps/py /usr/bin/python3"
if ! $PY -c "import kubernetes_validate" 2>/dev/null; then
    echo "SKIP ft_k8s_manifests_validate: kubernetes-validate not installed in .deps/py (scripts/deps.sh)"
else
    out=$($PY -m kubernetes_validate --strict deploy/k8s/*.yaml 2>&1); rc=$?
    [ $rc = 0 ] && echo "PASS ft_k8s_manifests_validate ($(printf '%s\n' "$out" | grep -c passed) resources)" || echo "FAIL ft_k8s_manifests_validate: $out"
    tmp=$(mktemp -d /tmp/loom-k8s-XXXXXX)
    sed 's/terminationGracePeriodSeconds: 120/terminationGracePeriodSecond: 120/' deploy/k8s/train-job-spot.yaml > "$tmp/bad.yaml"
    $PY -m kubernetes_validate --strict "$tmp/bad.yaml" > /dev/null 2>&1 && echo "FAIL ft_k8s_validator_catches_a_typo" || echo "PASS ft_k8s_validator_catches_a_typo"
    rm -rf "$tmp"
fi
if /usr/bin/python3 - <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open("deploy/k8s/train-job-spot.yaml")) if d]
job = next(d for d in docs if d["kind"] == "Job")
pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
pod = job["spec"]["template"]["spec"]
c = pod["containers"][0]
args = c["args"]
rules = job["spec"]["podFailurePolicy"]["rules"]
ok = [
    ("--resume auto", args[args.index("--resume") + 1] == "auto"),
    ("restartPolicy Never (podFailurePolicy needs it)", pod["restartPolicy"] == "Never"),
    ("exit 75 ignored", any(r["action"] == "Ignore" and 75 in r.get("onExitCodes", {}).get("values", []) for r in rules)),
    ("disruption ignored", any(r["action"] == "Ignore" and any(p["type"] == "DisruptionTarget" for p in r.get("onPodConditions", [])) for r in rules)),
    ("grace >= 60 s", pod["terminationGracePeriodSeconds"] >= 60),
    ("runs on the claim", any(v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"] for v in pod["volumes"])),
    ("--out on the runs mount", any(args[args.index("--out") + 1].startswith(m["mountPath"]) for m in c["volumeMounts"] if m["name"] == "runs")),
    ("WORLD_SIZE = completions", next(e["value"] for e in c["env"] if e["name"] == "WORLD_SIZE") == str(job["spec"]["completions"])),
]
bad = [n for n, good in ok if not good]
print("  missing: " + ", ".join(bad)) if bad else None
sys.exit(1 if bad else 0)
PY
then echo "PASS ft_k8s_spot_job_shape"; else echo "FAIL ft_k8s_spot_job_shape"; fi
s=deploy/slurm/train-spot.sbatch
if bash -n "$s" && grep -q '^#SBATCH --requeue' "$s" && grep -q '^#SBATCH --signal=B:TERM@120' "$s" && grep -q -- '--resume auto' "$s"; then
    echo "PASS ft_slurm_spot_script_shape"
else
    echo "FAIL ft_slurm_spot_script_shape"
fi
