# Sourced by bench/gpu-check.sh on the GPU machine: finds the CUDA
# libraries and sets LD_LIBRARY_PATH, then checks that the carried binaries
# start (BIN), or rebuilds them there with nvcc. Uses run, row, why,
# verdict, BUNDLE, WORK, PY, NVCC, LOG from gpu-check.sh.

# CUDA libraries: system CUDA, then NVIDIA's Python packages
cuda_roots() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        [ -d "$d" ] && echo "$d"
    done
    [ -n "$PY" ] || return 0
    "$PY" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")])
try:
    import nvidia
    roots.update(os.path.dirname(p) for p in nvidia.__path__)
except Exception:
    pass
for r in sorted(roots):
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "*", "*", "lib"))):
        print(d)
PY
}
mapfile -t ROOTS < <(cuda_roots | awk '!seen[$0]++')
LIBPATH="$BUNDLE/lib"
ldconfig -p 2>/dev/null | grep -q 'libstdc++.so.6 ' || LIBPATH="$LIBPATH:$BUNDLE/lib/compat"
missing_cuda=()
# every CUDA library the plugin needs, from the first root that has it
while read -r name path; do
    [ "$path" = not ] || continue
    found=""
    for d in "${ROOTS[@]}"; do
        [ -e "$d/$name" ] && { found=$d; break; }
    done
    if [ -n "$found" ]; then
        case ":$LIBPATH:" in *":$found:"*) ;; *) LIBPATH="$LIBPATH:$found" ;; esac
        echo "  $name: $found" >>"$LOG"
    else
        missing_cuda+=("$name")
    fi
done < <(LD_LIBRARY_PATH="$LIBPATH" gpu_ldd "$BUNDLE/build/libloom_cuda.so")
# the rest (cuDNN's engine libraries, nvrtc for its run-time compiled ones)
for d in "${ROOTS[@]}"; do
    case ":$LIBPATH:" in *":$d:"*) ;; *) LIBPATH="$LIBPATH:$d" ;; esac
done
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ${#missing_cuda[@]} -eq 0 ]; then
    row cuda_libraries ok "${#ROOTS[@]} folders searched; the plugin's CUDA libraries all found"
else
    row cuda_libraries FAIL "not found in ${#ROOTS[@]} folders (system CUDA, nvidia/*/lib): ${missing_cuda[*]}"
fi

# the carried binaries, or a rebuild here
BIN=$BUNDLE/build
# what the loader or loom says when a binary cannot start or cannot load
# its CUDA plugin (not NVML's or RAPL's notes, which are expected)
NOSTART="error while loading shared libraries|CUDA plugin could not be loaded|version .GLIBC"
starts() { # DIR: loom starts and loads its CUDA plugin
    timeout 60 "$1/loom" devices >"$WORK/start.log" 2>&1
    local rc=$?
    ! grep -qE "$NOSTART" "$WORK/start.log" &&
        [ "$rc" != 127 ] && [ "$rc" != 126 ] && [ "$rc" != 124 ]
}
# rebuild_here: make in build-there/ with nvcc; CPU side from the bundle's
# headers and libraries (no Debian packages here). Sets BIN, or says why not.
rebuild_here() {
    local why=""
    [ -n "$NVCC" ] || why="no nvcc on this machine"
    command -v gcc >/dev/null || command -v cc >/dev/null || why="${why:+$why; }no C compiler"
    [ -f "$BUNDLE/include/cjson/cJSON.h" ] && [ -e "$BUNDLE/lib/libcjson.so" ] ||
        why="${why:+$why; }the bundle has no cJSON header or library (the CPU side needs them)"
    if [ -n "$why" ]; then
        row rebuild FAIL "cannot rebuild here: $why; nothing below can run"
        return 1
    fi
    # headers and link names of CUDA's libraries from wherever they are here
    local inc="" d lib linkdir="$WORK/linkdir" libs="" fe=""
    mkdir -p "$linkdir"
    for d in "${ROOTS[@]}"; do
        [ -d "$d/../include" ] && inc="$inc -I$(cd "$d/../include" && pwd)"
    done
    for lib in cublasLt cublas cudart cudnn nvrtc; do
        for d in "${ROOTS[@]}"; do
            f=$(ls "$d/lib$lib.so" "$d"/lib"$lib".so.[0-9]* 2>/dev/null | head -n 1)
            if [ -n "$f" ]; then ln -sf "$f" "$linkdir/lib$lib.so"; libs="$libs -l$lib"; break; fi
        done
    done
    case "$libs" in *-lcudnn*-lnvrtc*) [ -f "$BUNDLE/include/cudnn-fe/cudnn_frontend.h" ] && fe="$BUNDLE/include/cudnn-fe/cudnn_frontend.h" ;; esac
    [ -n "$fe" ] || { libs=${libs/ -lcudnn/}; libs=${libs/ -lnvrtc/}; }
    run 240 rebuild make -j"$(nproc)" BUILD=build-there NO_MPI=1 NO_BLAS=1 ARCH=-march=native \
        "CUDA_ARCHS=-gencode arch=compute_90,code=[sm_90,compute_90]" "CUDNN_FE=$fe" \
        "EXTRA_CFLAGS=-I$BUNDLE/include$inc" "EXTRA_NVFLAGS=$inc" \
        "LDFLAGS=-L$BUNDLE/lib -Wl,-rpath,$BUNDLE/lib" \
        "CUDA_LIBS=-L$linkdir -Wl,-rpath,$linkdir$libs -lstdc++" build-there/loom build-there/libloom_cuda.so \
        build-there/tests/test_cuda_ops build-there/tests/test_cuda_model build-there/tests/test_engine_cuda \
        build-there/tests/test_cuda_attention
    local rc=$?
    if [ $rc = 0 ] && starts build-there; then
        BIN=$(pwd)/build-there
        row rebuild ok "the carried binaries could not start; rebuilt here with $NVCC (cuDNN attention $([ -n "$fe" ] && echo on || echo off))"
        return 0
    fi
    row rebuild "$(verdict $rc)" "the carried binaries could not start and the rebuild failed: $(why "$WORK/rebuild.log")"
    return 1
}

if [ "${GPU_CHECK_FORCE_REBUILD:-0}" = 1 ]; then
    row binaries info "GPU_CHECK_FORCE_REBUILD=1: rebuilding here"
    rebuild_here || BIN=""
elif starts "$BIN"; then
    row binaries ok "the carried binaries start ($BIN)"
else
    row binaries info "the carried binaries cannot start: $({ grep -m1 -E "$NOSTART" "$WORK/start.log" || tail -n 1 "$WORK/start.log"; } | cut -c1-200); rebuilding here"
    rebuild_here || BIN=""
fi

