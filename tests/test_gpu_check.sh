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
expect gpu_check_unknown_row 2 "no row 'nope'" bench/gpu-check.sh --only nope
expect gpu_check_list 0 '^serve_smoke +2 +40s +15s +train_bf16$' bench/gpu-check.sh --list

# Every copy and fill in the CUDA backend goes on its own stream: a
# synchronous cudaMemcpy/cudaMemset runs on the legacy stream, which the
# backend's non-blocking stream does not wait for (the 2:4 weights' copy
# had this bug). Source check, no GPU needed.
legacy=$(grep -nE '\bcuda(Memcpy|Memset|Memcpy2D|MemcpyToSymbol)\(' src/backend/cuda/*.cu src/backend/cuda/*.cpp src/backend/cuda/*.h 2>/dev/null)
[ -z "$legacy" ] && pass cuda_copies_on_the_backend_stream || fail cuda_copies_on_the_backend_stream "$legacy"

if [ ! -x build/loom ] || [ ! -f build/libloom_cuda.so ]; then
    for t in cuda_plugin_loads cuda_plugin_has_every_kernel cuda_plugin_needs_no_nccl gpu_bundle_from_build gpu_check_dry_run_whole gpu_check_dry_run_files gpu_check_dry_run_only gpu_check_only_brings_needs \
        gpu_check_fails_without_gpu gpu_check_dry_run_missing_library gpu_check_dry_run_checksum; do
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

# Every CUDA kernel the generated table names is in the plugin: a shared
# library links with undefined symbols, so a required ops.h row without its
# cuda_<name> kernel (or with a kernel whose signature differs: another C++
# overload) would only show when dlopen refuses the plugin on a GPU machine
nokernel=$(nm -D --undefined-only build/libloom_cuda.so | awk '$1 == "U" && $2 ~ /^cuda_|^_Z[0-9]+cuda_/ { print $2 }' | tr '\n' ' ')
[ -z "$nokernel" ] && pass cuda_plugin_has_every_kernel ||
    fail cuda_plugin_has_every_kernel "undefined in build/libloom_cuda.so (a row of src/backend/ops.h without its CUDA kernel, or one whose signature differs from the row): $nokernel"

# NCCL is opened with dlopen by the multi-GPU transport: one GPU needs no libnccl
if readelf -d build/libloom_cuda.so | grep -q 'NEEDED.*libnccl'; then
    fail cuda_plugin_needs_no_nccl "build/libloom_cuda.so lists libnccl as NEEDED"
else
    pass cuda_plugin_needs_no_nccl
fi

b="$tmp/bundle"
# build/ has MPI, OpenBLAS and debug info: more than the 40 MiB of a real bundle
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
    elif ! grep -q '^data/kjv.txt.gz ' "$b/MANIFEST" || [ "$(ls "$b/build/tests" | tr '\n' ' ')" != "test_cuda_attention test_cuda_model test_cuda_ops test_engine_cuda " ]; then
        fail gpu_bundle_from_build "no corpus in the manifest, or not the four GPU tests: $(ls "$b/build/tests" | tr '\n' ' ')"
    elif ls "$b/lib" | grep -qE '^lib(c|m|cuda|cudart|cublas.*|nccl)\.so'; then
        fail gpu_bundle_from_build "glibc or CUDA libraries were bundled: $(ls "$b/lib" | tr '\n' ' ')"
    else
        pass gpu_bundle_from_build
    fi
else
    fail gpu_bundle_from_build "$(tail -n 5 "$tmp/bundle.log")"
fi

# the whole bundle, the plan, and the run on a simulated clock (no
# sleeping, so no dependence on this machine's speed): it ends by itself,
# the planted overrun is stopped at its limit, the table comes last with
# the command that re-runs what did not pass
mkdir -p "$tmp/sim"
OUT="$tmp/sim" expect gpu_check_dry_run_whole 0 'the simulated run ended by itself.*torch_compile stopped at its limit' \
    bench/gpu-check.sh --dry-run --bundle "$b"
if [ "$(ls "$tmp/sim" | sort | tr '\n' ' ')" != "gpu-check-failures.txt gpu-check-logs.tar.gz gpu-check.log gpu-check.txt " ] ||
    ! tail -n 1 "$tmp/sim/gpu-check.txt" | grep -q '^gpu-check: re-run those: bench/gpu-check.sh --only torch_compile'; then
    fail gpu_check_dry_run_files "files in \$OUT: $(ls "$tmp/sim" | tr '\n' ' '); last line: $(tail -n 1 "$tmp/sim/gpu-check.txt")"
else
    pass gpu_check_dry_run_files
fi
# a row named alone brings what it needs, and nothing else
OUT="$tmp/sim2" GPU_CHECK_SIM_SLOW= expect gpu_check_dry_run_only 0 'ok: the simulated run' bench/gpu-check.sh --dry-run --bundle "$b" --only serve_smoke
rows=$(sed -n 's/^\([a-z_0-9]*\) \{2,\}\(ok\|FAIL\|TIMEOUT\|NOT RUN\) .*/\1/p' "$tmp/sim2/gpu-check.txt" | tr '\n' ' ')
[ "$rows" = "tokenize train_bf16 serve_smoke " ] && pass gpu_check_only_brings_needs || fail gpu_check_only_brings_needs "rows run: $rows"

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
    OUT="$tmp/outdir" timeout 200 bench/gpu-check.sh --bundle "$b" --budget 90 --only devices,test_cuda_ops >"$tmp/run.log" 2>&1
    rc=$?
    if [ "$rc" != 1 ]; then
        fail gpu_check_fails_without_gpu "exit $rc, want 1: $(tail -n 5 "$tmp/run.log")"
    elif ! grep -qE '^devices +(FAIL|TIMEOUT)' "$tmp/run.log" || ! grep -qE '^test_cuda_ops +(FAIL|TIMEOUT|NOT RUN)' "$tmp/run.log"; then
        fail gpu_check_fails_without_gpu "devices or test_cuda_ops not failed in the table: $(grep -A30 '^row ' "$tmp/run.log" | head -n 12)"
    elif ! grep -qE '^test_cuda_ops +FAIL +[0-9]+ passed, [0-9]+ failed.*[:,] cuda_encoder/fp32' "$tmp/run.log" ||
        ! grep -q '^test_cuda_ops: FAIL cuda_encoder/fp32: LOOM_REQUIRE_GPU=1' "$tmp/outdir/gpu-check-failures.txt"; then
        fail gpu_check_fails_without_gpu "the failing cases are not named in the table or the failures file: $(grep -m1 '^test_cuda_ops ' "$tmp/run.log"; head -n 2 "$tmp/outdir/gpu-check-failures.txt")"
    elif grep -qE '^rebuild ' "$tmp/run.log"; then
        fail gpu_check_fails_without_gpu "it rebuilt although the carried binaries start: $(grep -m1 '^binaries ' "$tmp/run.log")"
    elif [ "$(ls "$tmp/outdir" | sort | tr '\n' ' ')" != "gpu-check-failures.txt gpu-check-logs.tar.gz gpu-check.log gpu-check.txt " ]; then
        fail gpu_check_fails_without_gpu "files in \$OUT: $(ls "$tmp/outdir" | tr '\n' ' ')"
    else
        pass gpu_check_fails_without_gpu
    fi
else
    echo "SKIP gpu_check_fails_without_gpu: this machine has a GPU (nvidia-smi answers)"
fi

# a file changed after bundling: the manifest's checksum catches it
echo "changed" >>"$b/data/kjv.txt.gz"
expect gpu_check_dry_run_checksum 1 'data/kjv.txt.gz: checksum differs' bench/gpu-check.sh --dry-run --bundle "$b"
