#!/usr/bin/env bash
# The container image, built and run here (about 3-6 minutes: apt inside the
# build, then compiling loom; podman caches the apt layer). `make test`
# runs it when the Debian base is cached (deploy/container/base.sh --check)
# and says how to warm it when not; run it alone with `tests/image_test.sh`.
#
# The base comes from debootstrap (deploy/container/base.sh), podman builds
# deploy/container/Containerfile with FROM pointing at it (build argument
# BASE), then: a server on a read-only mounted run folder answers /health
# 200 and its health check passes, a greedy completion through the official
# openai client equals `loom sample` outside the container, the server runs
# as the image's non-root user, `loom --version` names this commit, and a
# training run inside writes its checkpoints to a mounted volume.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/py /usr/bin/python3"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/container/containers.conf}
. deploy/image.env
tag=${LOOM_IMAGE%%:*}:test
for t in podman debootstrap runc; do
    command -v $t > /dev/null || { echo "FAIL image_tools: $t is not installed (scripts/deps.sh installs podman, debootstrap, runc)"; exit 1; }
done
tmp=$(mktemp -d /tmp/loom-image-XXXXXX)
ctr=loom-image-test-$$
cleanup() { podman rm -f "$ctr" > /dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
if ! deploy/container/base.sh > "$tmp/base.log" 2>&1; then echo "FAIL image_base: $(tail -5 "$tmp/base.log")"; exit 1; fi
commit=$(git rev-parse --short=12 HEAD)
t0=$(date +%s)
if ! podman build --network host --format docker -f deploy/container/Containerfile --build-arg BASE=localhost/loom-base:bookworm \
        --build-arg LOOM_GIT_COMMIT="$commit" -t "$tag" . > "$tmp/build.log" 2>&1; then
    echo "FAIL image_build:"; tail -20 "$tmp/build.log"; exit 1
fi
echo "PASS image_build ($(($(date +%s) - t0)) s; $(podman image inspect "$tag" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}'))"
# One-shot containers without the health check: podman would start its
# timer through systemd, which this VM's podman cannot reach.
out=$(podman run --rm --no-healthcheck "$tag" --version 2>&1)
[ "$out" = "loom $(cat VERSION) (commit $commit)" ] && echo "PASS image_version ($out)" || echo "FAIL image_version: '$out', want commit $commit"
podman run --rm --no-healthcheck --entrypoint sh "$tag" -c 'command -v gcc cc make' > "$tmp/cc.txt" 2>&1
[ ! -s "$tmp/cc.txt" ] && echo "PASS image_no_compilers" || echo "FAIL image_no_compilers: $(cat "$tmp/cc.txt")"

# ---- serving a run folder mounted read-only ----
/usr/bin/python3 -c "
import random
random.seed(3)
words = 'the cat sat on a mat and then it ran to see the dog who was under old tree by river'.split()
print(' '.join(random.choice(words) for _ in range(5000)))" > "$tmp/corpus.txt"
$LOOM train --data "$tmp/corpus.txt" --model gpt2-tiny --steps 40 --batch 4 --seq 32 --eval-every 0 --threads 2 --sample-tokens 0 \
    --seed 3 --out "$tmp/run" > "$tmp/train.log" 2>&1 || { echo "FAIL image_train_outside: $(tail -3 "$tmp/train.log")"; exit 1; }
port=$(/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
podman run -d --name "$ctr" --network host -e LOOM_PORT="$port" -v "$tmp/run:/runs/model:ro" "$tag" \
    serve --run /runs/model --host 127.0.0.1 --port "$port" --threads 2 > "$tmp/run.id" 2> "$tmp/run.err" \
    || { echo "FAIL image_serve_start: $(cat "$tmp/run.id" "$tmp/run.err")"; exit 1; }
ok=0
for _ in $(seq 1 600); do  # up to 60 s for the model to load: a guard, not a measure
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && { ok=1; break; }
    sleep 0.1
done
[ $ok = 1 ] && echo "PASS image_health_200" || { echo "FAIL image_health_200:"; podman logs "$ctr" 2>&1 | tail -5; exit 1; }
podman healthcheck run "$ctr" > "$tmp/hc.log" 2>&1 && echo "PASS image_healthcheck (curl /health on LOOM_PORT inside)" || echo "FAIL image_healthcheck: $(cat "$tmp/hc.log")"
user=$(podman top "$ctr" user 2>/dev/null | tail -1 | tr -d ' ')
[ "$user" = loom ] && echo "PASS image_runs_as_non_root (user $user)" || echo "FAIL image_runs_as_non_root: '$user'"
prompt="the cat sat"
want=$($LOOM sample --run "$tmp/run" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
$PY - "$port" "$prompt" "$want" <<'PY'
import sys, openai
port, prompt, want = sys.argv[1], sys.argv[2], sys.argv[3]
cl = openai.OpenAI(base_url="http://127.0.0.1:%s/v1" % port, api_key="none")
r = cl.completions.create(model="model", prompt=prompt, max_tokens=24, temperature=0)
got = prompt + r.choices[0].text
ok = got == want.rstrip("\n")
print(("PASS" if ok else "FAIL") + " image_openai_greedy_equals_loom_sample" + ("" if ok else ": server %r, loom sample %r" % (got, want)))
PY
podman rm -f "$ctr" > /dev/null 2>&1

# ---- training inside, checkpoints to a mounted volume ----
mkdir -p "$tmp/data" "$tmp/out"
cp "$tmp/corpus.txt" "$tmp/data/"
chown 10001 "$tmp/out" 2>/dev/null || chmod 777 "$tmp/out"
podman run --rm --no-healthcheck -v "$tmp/data:/data:ro" -v "$tmp/out:/runs" "$tag" train --data /data/corpus.txt --model gpt2-tiny --steps 4 \
    --batch 2 --seq 32 --eval-every 0 --sample-tokens 0 --threads 2 --ckpt-every 2 --out /runs/inside > "$tmp/in.log" 2>&1; rc=$?
n=$(ls -d "$tmp/out/inside/checkpoints/"step_* 2>/dev/null | wc -l)
owner=$(stat -c %u "$tmp/out/inside/config.json" 2>/dev/null)
[ $rc = 0 ] && [ "$n" -ge 1 ] && [ "$owner" = 10001 ] && echo "PASS image_train_writes_checkpoints_to_volume ($n checkpoints, uid $owner)" \
    || echo "FAIL image_train_writes_checkpoints_to_volume: exit $rc, $n checkpoints, owner '$owner': $(tail -3 "$tmp/in.log")"
