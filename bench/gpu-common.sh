# Shared by bench/gpu-bundle.sh and bench/gpu-check.sh (sourced, not run).

# gpu_is_system NAME [PATH]: true for the libraries a GPU machine brings
# itself and the bundle must not carry: glibc's, and CUDA's own (the
# driver's libcuda, the toolkit's or NVIDIA's Python packages' libraries).
gpu_is_system() {
    case "${1##*/}" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | \
        libresolv.so* | libutil.so* | libanl.so* | libmvec.so*) return 0 ;;
    esac
    gpu_is_cuda "$1" "${2:-}"
}

# gpu_is_cuda NAME [PATH]: CUDA's own libraries only.
gpu_is_cuda() {
    case "${1##*/}" in
    libcuda.so* | libcudart* | libcublas* | libcudnn* | libnccl* | libnvrtc* | libnvJitLink* | \
        libcufft* | libcurand* | libcusparse* | libcusolver* | libnvidia-* | libcupti*) return 0 ;;
    esac
    case "${2:-}" in /usr/local/cuda*) return 0 ;; esac
    return 1
}

# gpu_ldd FILE: "name path" per needed library ("name not" when not found).
gpu_ldd() {
    ldd "$1" 2>/dev/null | awk '/=>/ { print $1, $3 } !/=>/ && NF { print $1, $1 }'
}
