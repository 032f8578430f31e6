#!/usr/bin/env bash
# test_gpu_check: the parts of bench/gpu-check.sh and bench/gpu-bundle.sh that
# need no GPU: argument handling, a bundle assembled from build/, and the dry
# run that must pass on a whole bundle and fail on a broken one. The oracle
# for "the bundle is whole" is readelf's list of NEEDED libraries, not the
# ldd walk the scripts use.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# expect NAME WANT_RC GREP CMD...: exit status and a line of its output
expect() {
    local name=$1 want=$2 pat=$3; shift 3
    "$@" >"$tmp/out" 2>&1
    local rc=$?
    if [ "$rc" != "$want" ]; then
        fail "$name" "exit $rc, want $want: $(head -c 300 "$tmp/out")"
    elif ! grep -qE -- "$pat" "$tmp/out"; then
        fail "$name" "output lacks /$pat/: $(head -c 300 "$tmp/out")"
    else
        pass "$name"
    fi
}

expect gpu_check_help 0 'Usage: bench/gpu-check.sh' bench/gpu-check.sh --help
expect gpu_check_unknown_arg 2 "unknown argument '--frobnicate'" bench/gpu-check.sh --frobnicate
expect gpu_check_budget_not_number 2 "not a whole number" bench/gpu-check.sh --budget 5m
expect gpu_check_budget_range 2 "outside 60..3600" bench/gpu-check.sh --budget 30
expect gpu_check_budget_missing 2 "needs a number" bench/gpu-check.sh --budget
expect gpu_check_no_bundle 1 "make gpu-bundle" bench/gpu-check.sh --dry-run --bundle "$tmp/nothing"
expect gpu_bundle_unknown_arg 2 "unknown argument" bench/gpu-bundle.sh --frobnicate

if [ ! -x build/loom ] || [ ! -f build/libloom_cuda.so ]; then
    for t in cuda_plugin_loads gpu_bundle_from_build gpu_check_dry_run_whole gpu_check_fails_without_gpu gpu_check_dry_run_missing_library gpu_check_dry_run_checksum; do
        echo "SKIP $t: build/loom or build/libloom_cuda.so not built (needs nvcc; run make all)"
    done
    exit 0
fi

# the plugin loads (every symbol it needs resolves): no GPU is needed for that
if build/loom devices 2>&1 | grep -q 'plugin could not be loaded'; then
    fail cuda_plugin_loads "$(build/loom devices 2>&1 | grep -m1 'plugin could not be loaded')"
else
    pass cuda_plugin_loads
fi

b="$tmp/bundle"
# build/ has MPI and debug info: more than the 60 MiB of a real bundle
if bench/gpu-bundle.sh --from build --out "$b" --max-mb 400 >"$tmp/bundle.log" 2>&1; then
    # every NEEDED library of loom and the plugin that is neither glibc nor CUDA is in lib/
    . bench/gpu-common.sh
    absent=""
    for f in build/loom build/libloom_cuda.so; do
        for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            gpu_is_system "$n" || [ -f "$b/lib/$n" ] || [ -f "$b/lib/compat/$n" ] || absent="$absent $f:$n"
        done
    done
    if [ -n "$absent" ]; then
        fail gpu_bundle_from_build "NEEDED but not bundled:$absent"
    elif ! grep -q '^lib/libopenblas.so.0 ' "$b/MANIFEST" || ! grep -q '^data/kjv.txt ' "$b/MANIFEST"; then
        fail gpu_bundle_from_build "the manifest lists no OpenBLAS or no corpus: $(head -c 400 "$b/MANIFEST")"
    elif ls "$b/lib" | grep -qE '^lib(c|m|cuda|cudart|cublas.*|nccl)\.so'; then
        fail gpu_bundle_from_build "glibc or CUDA libraries were bundled: $(ls "$b/lib" | tr '\n' ' ')"
    else
        pass gpu_bundle_from_build
    fi
else
    fail gpu_bundle_from_build "$(tail -n 5 "$tmp/bundle.log")"
fi

expect gpu_check_dry_run_whole 0 'ok: .* every non-CUDA library resolves inside' bench/gpu-check.sh --dry-run --bundle "$b"

# a library taken out: the dry run must name it and fail
lib=$(ls "$b/lib" | grep -m1 '^libcjson.so.[0-9]')
if [ -n "$lib" ]; then
    mv "$b/lib/$lib" "$tmp/$lib"
    expect gpu_check_dry_run_missing_library 1 "$lib (is not found in the bundle|resolves outside the bundle)" \
        bench/gpu-check.sh --dry-run --bundle "$b"
    mv "$tmp/$lib" "$b/lib/$lib"
else
    fail gpu_check_dry_run_missing_library "no libcjson in the bundle: $(ls "$b/lib" | tr '\n' ' ')"
fi

# the real run on a machine without a usable GPU: it must fail (never "ok"
# for the wrong reason), say why per row, end with the table and leave its
# three files in $OUT
if ! nvidia-smi >/dev/null 2>&1; then
    mkdir -p "$tmp/outdir"
    OUT="$tmp/outdir" GPU_CHECK_BATCHES=8 timeout 200 bench/gpu-check.sh --bundle "$b" --budget 60 >"$tmp/run.log" 2>&1
    rc=$?
    if [ "$rc" != 1 ]; then
        fail gpu_check_fails_without_gpu "exit $rc, want 1: $(tail -n 5 "$tmp/run.log")"
    elif ! grep -qE '^devices +(FAIL|TIMEOUT)' "$tmp/run.log" || ! grep -qE '^test_cuda_ops +(FAIL|TIMEOUT|NOT RUN)' "$tmp/run.log"; then
        fail gpu_check_fails_without_gpu "devices or test_cuda_ops not failed in the table: $(grep -A30 '^row ' "$tmp/run.log" | head -n 12)"
    elif grep -qE '^rebuild ' "$tmp/run.log"; then
        fail gpu_check_fails_without_gpu "it rebuilt although the carried binaries start: $(grep -m1 '^binaries ' "$tmp/run.log")"
    elif [ "$(ls "$tmp/outdir" | sort | tr '\n' ' ')" != "gpu-check-logs.tar.gz gpu-check.log gpu-check.txt " ]; then
        fail gpu_check_fails_without_gpu "files in \$OUT: $(ls "$tmp/outdir" | tr '\n' ' ')"
    else
        pass gpu_check_fails_without_gpu
    fi
else
    echo "SKIP gpu_check_fails_without_gpu: this machine has a GPU (nvidia-smi answers)"
fi

# a file changed after bundling: the manifest's checksum catches it
echo "changed" >>"$b/data/kjv.txt"
expect gpu_check_dry_run_checksum 1 'data/kjv.txt: checksum differs' bench/gpu-check.sh --dry-run --bundle "$b"
