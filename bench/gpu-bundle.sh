#!/usr/bin/env bash
# gpu-bundle: makes .gpu/, the folder that bench/gpu-check.sh takes to a bare
# GPU machine (CUDA driver, nvcc, PyTorch and NVIDIA's CUDA libraries as
# Python packages; no Debian packages, no network). It holds:
#
#   .gpu/build/loom, .gpu/build/libloom_cuda.so, and the GPU tests the check
#       runs (.gpu/build/tests/: test_cuda_ops, test_cuda_attention,
#       test_cuda_model, test_engine_cuda), built here without MPI (Open MPI
#       is not on that machine, and a loom linked to it would not start) and
#       without OpenBLAS (NO_BLAS=1: 35 MiB that a GPU run does not use; the
#       CPU reference runs loom's own GEMM), for x86-64-v3 (not -march=native:
#       the GPU machine's CPU is another one; the GEMM picks AVX-512 at run
#       time), CUDA for sm_90 (+PTX): the H200. Stripped (the dynamic symbol
#       table stays: -rdynamic, backtraces).
#   .gpu/lib/       every shared library those need that is neither glibc nor
#                   CUDA's own (OpenMP, cJSON, libmicrohttpd and the TLS
#                   libraries it pulls in, ...)
#   .gpu/lib/compat/ libstdc++ and libgcc_s: used there only when the system
#                   has none (a newer system copy must win)
#   .gpu/include/   the headers of those libraries (cJSON, microhttpd, and the
#                   cudnn-frontend headers when present), so that the check
#                   can rebuild there with nvcc when the carried binaries
#                   cannot start
#   .gpu/data/kjv.txt.gz  1 MB of the King James Bible (Debian's bible-kjv), gzipped
#   .gpu/data/llama_q4k.gguf  a small Llama in k-quant blocks (tests/gguf_blocks.py)
#   .gpu/MANIFEST   what is inside: file, bytes, sha256, where it came from,
#                   the build's flags, the newest glibc symbol version used
#
# Usage: bench/gpu-bundle.sh [--out DIR] [--jobs N] [--from BUILD]   (make gpu-bundle)
#   --from BUILD  take the binaries from an existing build folder instead of
#                 building (the test suite does this with build/)
#   --max-mb N    the size limit (default 40; the suite's bundle of build/,
#                 with MPI and OpenBLAS, is larger)
# Prints what each part weighs and the headroom. Fails (exit 1) when the
# bundle would be over the limit or a library the binaries need cannot be
# found here.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTB=.gpu
JOBS=2
LIMIT_MB=40
GPU_TESTS="test_cuda_ops test_cuda_attention test_cuda_model test_engine_cuda"
FROM=
while [ $# -gt 0 ]; do
    case "$1" in
    --out) OUTB=${2:?--out needs a folder}; shift 2 ;;
    --jobs) JOBS=${2:?--jobs needs a number}; shift 2 ;;
    --from) FROM=${2:?--from needs a build folder}; shift 2 ;;
    --max-mb) LIMIT_MB=${2:?--max-mb needs a number}; shift 2 ;;
    -h | --help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
BUILD=build-gpu
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$NVCC" ] && [ -z "$FROM" ]; then
    echo "gpu-bundle: nvcc not found (PATH, /usr/local/cuda/bin): the bundle needs the CUDA plugin; install the CUDA toolkit" >&2
    exit 1
fi
ARCHS='-gencode arch=compute_90,code=[sm_90,compute_90]'
MAKEARGS=(BUILD="$BUILD" NO_MPI=1 NO_BLAS=1 ARCH=-march=x86-64-v3 "CUDA_ARCHS=$ARCHS")

if [ -n "$FROM" ]; then
    BUILD=$FROM
    MAKEARGS=("(taken from $FROM, not built by gpu-bundle)")
else
    echo "gpu-bundle: building into $BUILD/ (no MPI, no OpenBLAS, x86-64-v3, sm_90+PTX)"
    make --no-print-directory -j"$JOBS" "${MAKEARGS[@]}" "$BUILD/loom" "$BUILD/libloom_cuda.so" \
        $(for t in $GPU_TESTS; do echo "$BUILD/tests/$t"; done)
fi
for f in "$BUILD/loom" "$BUILD/libloom_cuda.so"; do
    [ -f "$f" ] || { echo "gpu-bundle: $f was not built" >&2; exit 1; }
done

rm -rf "$OUTB"
mkdir -p "$OUTB/build/tests" "$OUTB/lib/compat" "$OUTB/include" "$OUTB/data"
cp "$BUILD/loom" "$BUILD/libloom_cuda.so" "$OUTB/build/"
# the tests the check runs, and only those
for t in $GPU_TESTS; do
    [ -x "$BUILD/tests/$t" ] || { echo "gpu-bundle: $BUILD/tests/$t was not built" >&2; exit 1; }
    cp "$BUILD/tests/$t" "$OUTB/build/tests/"
done
# debug info and the static symbol table are most of the size; the dynamic
# symbol table stays (-rdynamic: the plugin resolves loom's functions, and
# backtraces name them)
find "$OUTB/build" -type f -exec strip --strip-all {} +

. bench/gpu-common.sh
declare -A SOURCE
missing=()
for b in "$OUTB"/build/loom "$OUTB"/build/libloom_cuda.so "$OUTB"/build/tests/test_*; do
    while read -r name path; do
        if [ "$path" = "not" ]; then
            gpu_is_system "$name" || missing+=("$b: $name")
            continue
        fi
        gpu_is_system "$name" "$path" && continue
        dest="$OUTB/lib"
        case "$name" in libstdc++.so* | libgcc_s.so*) dest="$OUTB/lib/compat" ;; esac
        if [ ! -f "$dest/$name" ]; then
            cp -L "$path" "$dest/$name"
            real=$(readlink -f "$path")
            SOURCE[$name]="$real ($(dpkg -S "$real" 2>/dev/null | cut -d: -f1 | head -n 1 || true))"
        fi
    done < <(gpu_ldd "$b")
done
if [ ${#missing[@]} -gt 0 ]; then
    printf 'gpu-bundle: not found here: %s\n' "${missing[@]}" >&2
    exit 1
fi
# link names for the rebuild there (-lopenblas, -lcjson, ...)
for f in "$OUTB"/lib/*.so.*; do
    base=${f##*/}
    ln -sf "$base" "$OUTB/lib/${base%%.so.*}.so"
done

# headers for the rebuild there: every header the CPU side includes from
# outside src/ and the C library, taken from the packages that own them
for h in cjson/cJSON.h microhttpd.h; do
    for dir in /usr/include /usr/include/x86_64-linux-gnu /usr/include/x86_64-linux-gnu/openblas-pthread; do
        if [ -f "$dir/$h" ]; then
            mkdir -p "$OUTB/include/$(dirname "$h")"
            cp -L "$dir/$h" "$OUTB/include/$h"
            break
        fi
    done
done
if [ -f .deps/cudnn-fe/include/cudnn_frontend.h ]; then
    mkdir -p "$OUTB/include/cudnn-fe"
    cp -rL .deps/cudnn-fe/include/. "$OUTB/include/cudnn-fe/"
fi

# the corpus: 1 MB of the King James Bible, gzipped (gpu-check unpacks it)
if [ -s data/kjv.txt ]; then
    head -c 1000000 data/kjv.txt >"$OUTB/data/kjv.txt"
elif command -v bible >/dev/null; then
    bible Gen1:1-Rev22:21 </dev/null | head -c 1000000 >"$OUTB/data/kjv.txt" || true
fi
[ -s "$OUTB/data/kjv.txt" ] || { echo "gpu-bundle: no corpus: install bible-kjv (make deps)" >&2; exit 1; }
gzip -9n "$OUTB/data/kjv.txt"
# a Llama-architecture GGUF in k-quant blocks (q4_K, ffn_down q8_0, 14.7M
# parameters, 9.4 MB; tests/gguf_blocks.py llama_q4k, written by the gguf
# package under .deps/py): what gpu-check's gguf_llama_cuda row loads on
# the GPU. Without the package here the row says it is not in the bundle.
gq=$(mktemp -d /tmp/loom-gpu-bundle-gguf.XXXXXX)
if PYTHONPATH=.deps/py:.deps/hf44 /usr/bin/python3 tests/gguf_blocks.py "$gq" llama_q4k >/dev/null 2>&1; then
    cp "$gq/llama_q4k.gguf" "$OUTB/data/llama_q4k.gguf"
else
    echo "gpu-bundle: note: no data/llama_q4k.gguf (the gguf package is not under .deps/py: make deps); gguf_llama_cuda will say so" >&2
fi
rm -rf "$gq"

glibc=$(for b in "$OUTB"/build/loom "$OUTB"/build/libloom_cuda.so "$OUTB"/build/tests/test_* "$OUTB"/lib/*.so.*; do
    objdump -T "$b" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'
done | sort -t. -k2,2n -k3,3n -u | tail -n 1)
{
    echo "# loom GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "# built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1), $("${NVCC:-false}" --version 2>/dev/null | tail -n 1)"
    echo "# make ${MAKEARGS[*]} (no MPI: Open MPI is not on the GPU machine)"
    echo "# newest glibc symbol version needed: ${glibc:-none} (the target's glibc must be at least that)"
    echo "# cuDNN attention: $([ -d "$OUTB/include/cudnn-fe" ] && echo "compiled in (libcudnn.so.9 needed there)" || echo "not compiled in (no .deps/cudnn-fe)")"
    echo "# file bytes sha256 source"
    (cd "$OUTB" && find . -type f ! -name MANIFEST | sort | while read -r f; do
        n=${f##*/}
        printf '%s %s %s %s\n' "${f#./}" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "${SOURCE[$n]:-loom}"
    done)
} >"$OUTB/MANIFEST"
# headers and the corpus come from known places; say so once instead of per file
sed -i -E 's#^(include/[^ ]+ [0-9]+ [0-9a-f]+) loom$#\1 header#; s#^(data/kjv.txt.gz [0-9]+ [0-9a-f]+) loom$#\1 bible-kjv (first 1000000 bytes, gzipped)#; s#^(data/llama_q4k.gguf [0-9]+ [0-9a-f]+) loom$#\1 tests/gguf_blocks.py llama_q4k (random blocks)#' "$OUTB/MANIFEST"

bytes=$(du -sb "$OUTB" | cut -f1)
mb=$(( (bytes + 1048575) / 1048576 ))
echo "gpu-bundle: $OUTB: $mb MiB, $(find "$OUTB" -type f | wc -l) files; newest glibc symbol ${glibc:-none}; manifest $OUTB/MANIFEST"
# what each part weighs, and the headroom under the limit
part() { printf '  %-34s %7.2f MiB\n' "$1" "$(echo "$2" | awk '{ printf "%.2f", $1 / 1048576 }')"; }
part "build/loom + plugin" "$(cat "$OUTB/build/loom" "$OUTB/build/libloom_cuda.so" | wc -c)"
part "build/tests ($(ls "$OUTB/build/tests" | wc -l) GPU tests)" "$(du -sb "$OUTB/build/tests" | cut -f1)"
part "lib/ (non-CUDA libraries)" "$(du -sb "$OUTB/lib" | cut -f1)"
for f in $(ls -S "$OUTB/lib" | head -n 4); do [ -f "$OUTB/lib/$f" ] && part "  lib/$f" "$(stat -c %s "$OUTB/lib/$f")"; done
part "include/ (for a rebuild there)" "$(du -sb "$OUTB/include" | cut -f1)"
part "data/ (corpus, a k-quant GGUF)" "$(du -sb "$OUTB/data" | cut -f1)"
echo "gpu-bundle: $mb of $LIMIT_MB MiB, headroom $((LIMIT_MB - mb)) MiB (the working tree travels too: 64 MiB in all)"
if [ "$mb" -gt "$LIMIT_MB" ]; then
    echo "gpu-bundle: $OUTB is $mb MiB, over the $LIMIT_MB MiB limit (the working tree and the carried folder travel together, 64 MiB at most)" >&2
    exit 1
fi
