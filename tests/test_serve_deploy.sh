#!/usr/bin/env bash
# Every manifest in deploy/k8s/ against the Kubernetes schemas
# (kubernetes-validate --strict: a misspelt field fails), a deliberately
# misspelt copy of serve.yaml rejected (so the check can fail), every
# `loom serve` flag the manifests and deploy/slurm/serve.sbatch use known
# to `loom serve --help`, and each MIG server's --kv-memory below its slice.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/py /usr/bin/python3"
if ! $PY -c "import kubernetes_validate" 2>/dev/null; then
    echo "SKIP serve_deploy: kubernetes-validate (scripts/deps.sh installs it into .deps/py) is missing"; exit 0
fi
tmp=$(mktemp -d /tmp/loom-deploy-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for f in deploy/k8s/*.yaml; do
    if out=$($PY -m kubernetes_validate --strict --quiet "$f" 2>&1); then echo "PASS k8s_valid_$(basename "$f" .yaml)"
    else echo "FAIL k8s_valid_$(basename "$f" .yaml): $(echo "$out" | head -3 | tr '\n' ' ')"; fi
done
sed 's/readinessProbe:/readinesProbe:/' deploy/k8s/serve.yaml > "$tmp/bad.yaml"
if $PY -m kubernetes_validate --strict --quiet "$tmp/bad.yaml" > /dev/null 2>&1; then
    echo "FAIL k8s_misspelt_field_rejected: a misspelt field passed validation"
else echo "PASS k8s_misspelt_field_rejected"; fi
bash -n deploy/slurm/serve.sbatch && echo "PASS slurm_serve_syntax" || echo "FAIL slurm_serve_syntax: bash -n failed"
$LOOM serve --help > "$tmp/help.txt" 2>&1
$PY - "$tmp/help.txt" deploy/k8s/serve.yaml deploy/k8s/serve-mig.yaml deploy/slurm/serve.sbatch <<'PY'
import re, sys, yaml
help_flags = set(re.findall(r"^\s+--([a-z-]+)", open(sys.argv[1]).read(), re.M))
used, kv_ok = set(), []
for path in sys.argv[2:4]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc["kind"] != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            args = c.get("args", [])
            used |= {a[2:] for a in args if a.startswith("--")}
            lim = c["resources"]["limits"]
            mig = [k for k in lim if k.startswith("nvidia.com/mig-")]
            if mig:
                slice_gb = float(re.search(r"\.(\d+)gb", mig[0]).group(1))
                kv = args[args.index("--kv-memory") + 1]
                kv_ok.append((mig[0], kv, kv.endswith("G") and float(kv[:-1]) < slice_gb))
# the flags given to `loom serve` on the line that runs it (not srun's --container-* before it)
used |= {f for line in open(sys.argv[4]) if re.search(r'\$\{?LOOM\}?"? serve ', line)
         for f in re.findall(r"--([a-z-]+)", line.split(" serve ", 1)[1])}
missing = used - help_flags
print("PASS serve_deploy_flags_known" if used and not missing else "FAIL serve_deploy_flags_known: %s" % missing)
print("PASS serve_mig_kv_fits_slice" if kv_ok and all(k[2] for k in kv_ok) else "FAIL serve_mig_kv_fits_slice: %s" % kv_ok)
PY
