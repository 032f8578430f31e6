#!/usr/bin/env bash
# gpu-bundle: makes .gpu/, the folder that bench/gpu-check.sh takes to a bare
# GPU machine (CUDA driver, nvcc, PyTorch and NVIDIA's CUDA libraries as
# Python packages; no Debian packages, no network). It holds:
#
#   .gpu/build/loom, .gpu/build/libloom_cuda.so, .gpu/build/tests/test_*
#       built here without MPI (Open MPI is not on that machine, and a loom
#       linked to it would not start), for x86-64-v3 (not -march=native: the
#       GPU machine's CPU is another one; the GEMM picks AVX-512 at run time),
#       CUDA for sm_90 (+PTX): the H200. Debug info stripped.
#   .gpu/lib/       every shared library those need that is neither glibc nor
#                   CUDA's own (OpenBLAS, its Fortran runtime, OpenMP, cJSON,
#                   libmicrohttpd and what it pulls in, ...)
#   .gpu/lib/compat/ libstdc++ and libgcc_s: used there only when the system
#                   has none (a newer system copy must win)
#   .gpu/include/   the headers of those libraries (cJSON, cblas, and the
#                   cudnn-frontend headers when present), so that the check
#                   can rebuild there with nvcc when the carried binaries
#                   cannot start
#   .gpu/data/kjv.txt  1 MB of the King James Bible (Debian's bible-kjv)
#   .gpu/MANIFEST   what is inside: file, bytes, sha256, where it came from,
#                   the build's flags, the newest glibc symbol version used
#
# Usage: bench/gpu-bundle.sh [--out DIR] [--jobs N] [--from BUILD]   (make gpu-bundle)
#   --from BUILD  take the binaries from an existing build folder instead of
#                 building (the test suite does this with build/)
#   --max-mb N    the size limit (default 60; the suite's bundle of build/,
#                 with MPI and debug info, is larger)
# Fails (exit 1) when the bundle would be over 60 MiB or a library the
# binaries need cannot be found here.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTB=.gpu
JOBS=2
LIMIT_MB=60
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
MAKEARGS=(BUILD="$BUILD" NO_MPI=1 ARCH=-march=x86-64-v3 "CUDA_ARCHS=$ARCHS")

if [ -n "$FROM" ]; then
    BUILD=$FROM
    MAKEARGS=("(taken from $FROM, not built by gpu-bundle)")
else
    echo "gpu-bundle: building into $BUILD/ (no MPI, x86-64-v3, sm_90+PTX)"
    make --no-print-directory -j"$JOBS" "${MAKEARGS[@]}" all
fi
for f in "$BUILD/loom" "$BUILD/libloom_cuda.so"; do
    [ -f "$f" ] || { echo "gpu-bundle: $f was not built" >&2; exit 1; }
done

rm -rf "$OUTB"
mkdir -p "$OUTB/build/tests" "$OUTB/lib/compat" "$OUTB/include" "$OUTB/data"
cp "$BUILD/loom" "$BUILD/libloom_cuda.so" "$OUTB/build/"
# the tests the check runs: the CUDA ones
for t in "$BUILD"/tests/test_cuda_*; do
    [ -x "$t" ] && [ -f "$t" ] && cp "$t" "$OUTB/build/tests/"
done
# debug info is most of the size; symbols stay (backtraces, -rdynamic)
find "$OUTB/build" -type f -exec strip --strip-debug {} +

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
for h in cjson/cJSON.h cblas.h openblas_config.h microhttpd.h; do
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

# the corpus: 1 MB of the King James Bible
if [ -s data/kjv.txt ]; then
    head -c 1000000 data/kjv.txt >"$OUTB/data/kjv.txt"
elif command -v bible >/dev/null; then
    bible Gen1:1-Rev22:21 </dev/null | head -c 1000000 >"$OUTB/data/kjv.txt" || true
fi
[ -s "$OUTB/data/kjv.txt" ] || { echo "gpu-bundle: no corpus: install bible-kjv (make deps)" >&2; exit 1; }

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
sed -i -E 's#^(include/[^ ]+ [0-9]+ [0-9a-f]+) loom$#\1 header#; s#^(data/kjv.txt [0-9]+ [0-9a-f]+) loom$#\1 bible-kjv (first 1000000 bytes)#' "$OUTB/MANIFEST"

bytes=$(du -sb "$OUTB" | cut -f1)
mb=$(( (bytes + 1048575) / 1048576 ))
echo "gpu-bundle: $OUTB: $mb MiB, $(find "$OUTB" -type f | wc -l) files; newest glibc symbol ${glibc:-none}; manifest $OUTB/MANIFEST"
if [ "$mb" -gt "$LIMIT_MB" ]; then
    echo "gpu-bundle: $OUTB is $mb MiB, over the $LIMIT_MB MiB limit (the working tree and the carried folder travel together, 64 MiB at most)" >&2
    exit 1
fi
