#!/usr/bin/env bash
# make install / make uninstall: into DESTDIR with another PREFIX, the
# installed loom runs from any directory, says its version and the commit
# it was built from, and reads its run-time files (the GPU table, the
# dashboard's charting library) from beside itself, not from the source
# tree (strace shows which files it opens); uninstall leaves nothing.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/loom-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
make_args=(DESTDIR="$tmp/dest" PREFIX=/opt/loom)
[ -n "${NO_CUDA:-}" ] && make_args+=(NO_CUDA=1)
if ! make -s "${make_args[@]}" install > "$tmp/make.log" 2>&1; then
    echo "FAIL install_make: $(tail -5 "$tmp/make.log")"; exit 1
fi
bin=$tmp/dest/opt/loom/bin/loom
want=$(git rev-parse --short=12 HEAD 2>/dev/null)
out=$(cd / && "$bin" --version 2>&1)
case "$out" in "loom $(cat VERSION) (commit $want"*) echo "PASS install_version_and_commit ($out)" ;;
    *) echo "FAIL install_version_and_commit: '$out', want version $(cat VERSION) and commit $want" ;; esac
if command -v strace > /dev/null; then
    (cd "$tmp" && strace -f -e trace=openat -o "$tmp/plan.trace" "$bin" plan train --model gpt2-tiny > "$tmp/plan.log" 2>&1); rc=$?
    grep -q "\"$tmp/dest/opt/loom/bin/../share/loom/gpus.json\", O_RDONLY) = [0-9]" "$tmp/plan.trace" && [ $rc = 0 ] \
        && echo "PASS install_gpu_table_beside_binary" || echo "FAIL install_gpu_table_beside_binary: exit $rc: $(grep gpus.json "$tmp/plan.trace" | head -3) $(tail -2 "$tmp/plan.log")"
    /usr/bin/python3 -c "print(' '.join(['in the beginning']*3000))" > "$tmp/text.txt"
    (cd "$tmp" && strace -f -e trace=openat -o "$tmp/train.trace" "$bin" train --data text.txt --layers 1 --heads 2 --channels 32 --context 16 \
        --batch 2 --seq 16 --steps 2 --eval-every 0 --sample-tokens 0 --threads 1 --out run --metrics-port 0 --metrics-linger 0 > "$tmp/train.log" 2>&1); rc=$?
    if [ -f /usr/share/javascript/dygraphs/dygraph.min.js ]; then
        grep -q "\"$tmp/dest/opt/loom/bin/../share/loom/dygraphs/dygraph.min.js\", O_RDONLY) = [0-9]" "$tmp/train.trace" && [ $rc = 0 ] \
            && ! grep -q "charting library is missing" "$tmp/train.log" \
            && echo "PASS install_dygraphs_beside_binary" || echo "FAIL install_dygraphs_beside_binary: exit $rc: $(grep dygraph "$tmp/train.trace" | head -3)"
    else
        echo "SKIP install_dygraphs_beside_binary: libjs-dygraphs is not installed here, so make install had none to copy"
    fi
    # The CUDA plugin, when this build has one: `loom devices` loads it from beside the binary.
    if [ -f "$tmp/dest/opt/loom/lib/loom/libloom_cuda.so" ]; then
        (cd "$tmp" && strace -f -e trace=openat -o "$tmp/dev.trace" "$bin" devices > /dev/null 2>&1)
        grep -q "\"$tmp/dest/opt/loom/bin/../lib/loom/libloom_cuda.so\", O_RDONLY|O_CLOEXEC) = [0-9]" "$tmp/dev.trace" \
            && echo "PASS install_cuda_plugin_beside_binary" || echo "FAIL install_cuda_plugin_beside_binary: $(grep libloom_cuda "$tmp/dev.trace" | head -3)"
    elif [ -f build/libloom_cuda.so ] && [ -z "${NO_CUDA:-}" ]; then
        echo "FAIL install_cuda_plugin_beside_binary: build/libloom_cuda.so was built but not installed"
    fi
else
    echo "SKIP install_files_beside_binary: strace not installed (Debian package strace)"
fi
make -s "${make_args[@]}" uninstall > "$tmp/un.log" 2>&1
left=$(find "$tmp/dest" -type f | head -5)
[ -z "$left" ] && echo "PASS install_uninstall_leaves_nothing" || echo "FAIL install_uninstall_leaves_nothing: $left"

# ---- the deploy files name the image of deploy/image.env ----
. deploy/image.env
bad=$(grep -n "image:" deploy/k8s/*.yaml | grep -v "image: $LOOM_IMAGE\b" | head -3)
[ -n "$LOOM_IMAGE" ] && [ -z "$bad" ] && grep -q "image: $LOOM_IMAGE" deploy/k8s/serve.yaml \
    && echo "PASS deploy_image_in_one_place ($LOOM_IMAGE)" || echo "FAIL deploy_image_in_one_place: $bad (deploy/image.env: $LOOM_IMAGE)"
