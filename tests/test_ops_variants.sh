#!/usr/bin/env bash
# Reruns the CPU op tests (build/tests/test_ops, test_gradcheck_ops,
# test_cpu_fused) once
# per kernel variant the backend can dispatch to -- LOOM_CPU_KERNEL=avx512,
# avx2, scalar with the own GEMM, and LOOM_GEMM=blas -- and prints one
# PASS/FAIL/SKIP line per variant and test. A variant this CPU cannot run
# is a SKIP with the reason. OPENBLAS_CORETYPE is left as the environment
# has it.
set -u
cd "$(dirname "$0")/.."
bins=(build/tests/test_ops build/tests/test_gradcheck_ops build/tests/test_cpu_fused)
for b in "${bins[@]}"; do
    if [ ! -x "$b" ]; then
        echo "FAIL variants: $b is not built (run make first)"
        exit 1
    fi
done
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
failed=0
run_variant() { # name, reason-to-skip-or-empty, env assignments...
    local name=$1 why=$2; shift 2
    for b in "${bins[@]}"; do
        local t; t=$(basename "$b")
        if [ -n "$why" ]; then
            echo "SKIP $t [$name]: $why"
            continue
        fi
        local out rc
        out=$(env "$@" "$b" 2>&1); rc=$?
        local nfail; nfail=$(printf '%s\n' "$out" | grep -c '^FAIL ')
        if [ "$rc" -eq 0 ] && [ "$nfail" -eq 0 ]; then
            echo "PASS $t [$name]: $(printf '%s\n' "$out" | grep -c '^PASS ') cases"
        else
            printf '%s\n' "$out" | grep -E '^FAIL |check failed' | head -20 | sed "s|^|  [$name] |"
            echo "FAIL $t [$name]: exit status $rc, $nfail failing cases"
            failed=1
        fi
    done
}
why512=""; has avx512f || why512="this CPU has no AVX-512F (/proc/cpuinfo flags)"
why2=""; { has avx2 && has fma; } || why2="this CPU has no AVX2+FMA (/proc/cpuinfo flags)"
run_variant "own gemm, avx512 kernel" "$why512" LOOM_GEMM=own LOOM_CPU_KERNEL=avx512
run_variant "own gemm, avx2 kernel" "$why2" LOOM_GEMM=own LOOM_CPU_KERNEL=avx2
run_variant "own gemm, scalar kernel" "" LOOM_GEMM=own LOOM_CPU_KERNEL=scalar
run_variant "blas gemm" "" LOOM_GEMM=blas
exit $failed
