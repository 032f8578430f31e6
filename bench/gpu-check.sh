#!/usr/bin/env bash
# gpu-check: what loom's CUDA backend must prove on a lent GPU machine, in
# priority order, in one run that ends by itself (its --budget, 440 s by default, the
# table printed last), on a bare machine (CUDA driver, nvcc, PyTorch and
# NVIDIA's CUDA libraries as Python packages; no Debian packages, no
# network). It uses the bundle `make gpu-bundle` made here (.gpu/, carried
# along): binaries, the non-CUDA libraries they need, a corpus.
#
#   setup: finds the CUDA libraries (system CUDA, or the nvidia/*/lib
#      folders of the machine's Python packages) and sets the library path;
#      starts the carried binaries, or rebuilds there with nvcc when they
#      cannot start (and says which path it took, or what it could not do)
#   rows, in this order, each under its own time limit, each printed as it
#   ends (LOOM_REQUIRE_GPU=1: a SKIP in a GPU test is a FAIL here):
#     1 the facts that decide everything: devices; test_cuda_ops (every op
#       against the CPU at fp32, bf16, fp16); test_cuda_model (forward,
#       backward, training, graphs); bench_train (GPT-2 124M, T=1024, bf16)
#       against torch_eager and torch_compile at the same batch
#     2 the engine and serving: test_engine_cuda; tokenize and train_bf16
#       (gpt2-tiny, 100 steps); serve_smoke (loom serve on that run, one
#       completion over HTTP); train_llama (llama-tiny: RMSNorm, rotary,
#       SwiGLU, grouped-query attention end to end, bf16, graphs on);
#       bench_generate (fp32 and W8A8 + int8 KV; smollm2-135m-shaped);
#       gguf_llama_cuda (a Llama GGUF in q4_K/q8_0 blocks run on the GPU)
#     3 compute-sanitizer memcheck and racecheck on a reduced op test;
#       tp_ops (test_cuda_ops' tensor-parallel cases: the vocabulary
#       shard, the bf16 wire conversions, NCCL with one rank) and
#       memcheck over them (sanitizer_tp)
#     4 the rest: test_cuda_attention; the other training runs (graphs off,
#       fp16 with loss scaling, recompute, fp32 activations, fp32) and their
#       loss curves against train_bf16; bench_train with fp32 activations;
#       2-GPU training (tp2, pp2, zero3, --grad-dtype bf16 at bf16): on one
#       GPU each says, as info, that it needs two and how to run it; decode_profile
#       (bench/gpu-decode-profile.sh: kernels and their time per decoded
#       token under ncu, against the wall time per token)
#   A row starts only when its estimate fits in what is left of the budget
#   (else NOT RUN, and later rows that fit still run); a row past its own
#   limit is stopped (TIMEOUT). The run ends with the table, the failing
#   case names, and the command that re-runs what failed or did not run.
#   Under $OUT (default /tmp/loom-gpu-check): gpu-check.txt (the table),
#   gpu-check-failures.txt (every failing case with its reason),
#   gpu-check.log (everything), gpu-check-logs.tar.gz (one log per row).
#
# Usage: bench/gpu-check.sh [--dry-run] [--list] [--bundle DIR] [--budget S] [--only ROWS] [ROW...]
#   ROW..., --only ROW,ROW  run only these rows (and the rows they need:
#                    tokenize before a training row, train_bf16 before
#                    serve_smoke); test_cuda_ops:FILTER runs only its cases
#                    whose name contains FILTER (a,b: either; e.g.
#                    test_cuda_ops:matmul_forward/bf16)
#   --list           the rows in order with their limits and estimates
#   --dry-run        here, without a GPU: (1) the bundle is whole: every
#                    bundled binary's non-CUDA libraries resolve inside it,
#                    the manifest's checksums, the corpus; (2) the plan fits:
#                    the rows of group 1 and 2 fit the budget on their
#                    estimates; (3) timeout(1) stops a command at its limit;
#                    (4) the whole run on a simulated clock: each row takes
#                    its estimate, one (GPU_CHECK_SIM_SLOW, default
#                    torch_compile) overruns and its limit must stop it,
#                    the rows must end within the budget and the table and
#                    files must be written; exit 1 when any part fails
#   --bundle DIR     the bundle (default .gpu)
#   --budget S       seconds for the whole run, setup included (default
#                    440, 60..3600); 15 s of it are kept for the table
# Knobs: GPU_CHECK_FORCE_REBUILD=1 (rebuild even when the carried binaries
#        start), GPU_CHECK_STOP_AFTER_BUILD=1, GPU_CHECK_BATCH=32 (bench_train).
# Exit status: 0 all rows ok, 1 a row failed or did not run, 2 usage error.
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/gpu-common.sh

# ---- the rows: name|group|limit s|estimate s|needs|what runs it ----
# Estimates are for an H200 (docs/cuda.md, "The GPU check"); a row starts
# only when its estimate fits in what is left.
ROW_SPECS=(
    "devices|1|30|5||row_devices"
    "test_cuda_ops|1|110|60||row_test test_cuda_ops"
    "test_cuda_model|1|80|40||row_test test_cuda_model"
    "bench_train|1|80|40||row_bench_train"
    "torch_eager|1|60|30||row_torch eager"
    "torch_compile|1|120|80||row_torch compile"
    "test_engine_cuda|2|40|15||row_test test_engine_cuda"
    "tokenize|2|40|10||row_tokenize"
    "train_bf16|2|45|20|tokenize|row_train bf16 - --dtype bf16 --cuda-graphs on"
    "serve_smoke|2|40|15|train_bf16|row_serve"
    "train_llama|2|45|20|tokenize|row_train llama - --model llama-tiny --dtype bf16 --cuda-graphs on"
    "bench_generate_llama|2|50|20||row_generate llama --model smollm2-135m --concurrency 1,16 --repeat 1 --gen 64"
    "gguf_llama_cuda|2|40|10||row_gguf_cuda"
    "bench_generate|2|50|20||row_generate fp32"
    "bench_generate_int8|2|50|20||row_generate int8 --quant w8a8 --kv-dtype int8"
    "sanitizer_memcheck|3|90|60||row_sanitizer memcheck"
    "sanitizer_racecheck|3|90|60||row_sanitizer racecheck"
    "tp_ops|3|60|25||row_test tp_ops test_cuda_ops vocab_shard,wire_bf16,nccl_one_rank"
    "sanitizer_tp|3|90|40||row_sanitizer memcheck tp"
    "test_cuda_attention|4|60|20||row_test test_cuda_attention"
    "train_graphs_off|4|45|20|train_bf16|row_train graphs_off - --dtype bf16 --cuda-graphs off"
    "train_fp16|4|45|20|tokenize|row_train fp16 - --dtype fp16"
    "train_recompute|4|45|20|train_bf16|row_train recompute - --dtype bf16 --recompute all"
    "train_fp32acts|4|45|20|train_bf16|row_train fp32acts LOOM_CUDA_ACTIVATIONS=fp32 --dtype bf16"
    "train_fp32|4|45|25|train_bf16|row_train fp32 - --dtype fp32"
    "bench_train_fp32acts|4|60|30|bench_train|row_bench_fp32acts"
    "train_tp2|4|60|30|train_bf16|row_multi tp2 2e-2 --tp 2"
    "train_pp2|4|60|30|tokenize|row_multi pp2 - --pp 2 --grad-accum 4 --batch 2"
    "train_zero3|4|60|30|tokenize|row_multi zero3 - --zero 3 --batch 4"
    "train_grad_bf16|4|60|30|tokenize|row_multi grad_bf16 - --grad-dtype bf16 --batch 4"
    "decode_profile|4|150|60||row_decode_profile"
)
RESERVE=15 # seconds kept for the table and the logs

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "gpu-check: $*; see bench/gpu-check.sh --help" >&2; exit 2; }
spec_field() { # SPEC N: field N (1-based) of a row spec
    local IFS='|' f
    read -r -a f <<<"$1"
    echo "${f[$(($2 - 1))]:-}"
}
spec_of() { local s; for s in "${ROW_SPECS[@]}"; do [ "${s%%|*}" = "$1" ] && { echo "$s"; return 0; }; done; return 1; }

DRY=0 LIST=0
BUNDLE=.gpu
BUDGET=${GPU_CHECK_BUDGET:-440}
ONLY=()
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1; shift ;;
    --list) LIST=1; shift ;;
    --bundle) [ $# -ge 2 ] || die_usage "--bundle needs a folder"; BUNDLE=$2; shift 2 ;;
    --budget) [ $# -ge 2 ] || die_usage "--budget needs a number of seconds"; BUDGET=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || die_usage "--only needs row names (--list shows them)"; IFS=, read -r -a more <<<"$2"; ONLY+=("${more[@]}"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) die_usage "unknown argument '$1'" ;;
    *) ONLY+=("$1"); shift ;;
    esac
done
case "$BUDGET" in '' | *[!0-9]*) die_usage "--budget '$BUDGET' is not a whole number of seconds" ;; esac
[ "$BUDGET" -ge 60 ] && [ "$BUDGET" -le 3600 ] || die_usage "--budget $BUDGET is outside 60..3600 seconds"

# the rows asked for (ONLY) with what they need, in the table's order
OPS_FILTER=""
declare -A WANT=()
want_row() {
    local spec need
    spec=$(spec_of "$1") || die_usage "no row '$1' (--list shows the rows)"
    WANT[$1]=1
    need=$(spec_field "$spec" 5)
    [ -n "$need" ] && [ -z "${WANT[$need]:-}" ] && want_row "$need"
    return 0
}
for r in "${ONLY[@]}"; do
    case "$r" in test_cuda_ops:*) OPS_FILTER=${r#test_cuda_ops:}; r=test_cuda_ops ;; esac
    want_row "$r"
done
SELECTED=()
for s in "${ROW_SPECS[@]}"; do
    n=${s%%|*}
    [ ${#ONLY[@]} -eq 0 ] || [ -n "${WANT[$n]:-}" ] && SELECTED+=("$s")
done

if [ "$LIST" = 1 ]; then
    printf '%-22s %5s %6s %8s  %s\n' row group limit estimate needs
    for s in "${ROW_SPECS[@]}"; do
        printf '%-22s %5s %5ss %7ss  %s\n' "${s%%|*}" "$(spec_field "$s" 2)" "$(spec_field "$s" 3)" "$(spec_field "$s" 4)" "$(spec_field "$s" 5)"
    done
    exit 0
fi

[ -d "$BUNDLE" ] && [ -f "$BUNDLE/MANIFEST" ] ||
    { echo "gpu-check: no bundle in $BUNDLE (no MANIFEST): run \`make gpu-bundle\` first, and carry $BUNDLE" >&2; exit 1; }
BUNDLE=$(cd "$BUNDLE" && pwd)

# ---- time, in milliseconds: the wall clock, or in the dry run a clock
# the script advances itself (SIM_CLOCK), so that the simulation does not
# depend on how fast this machine is ----
SIM_CLOCK=""
now_ms() { if [ -n "$SIM_CLOCK" ]; then echo "$SIM_CLOCK"; else echo $(($(date +%s%N) / 1000000)); fi; }
ms() { echo $(($1 * 1000)); } # whole seconds -> ms
secs() { awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }'; }

# ---- rows, the table, the files ----
ROWS=() NFAIL=0 RERUN=()
declare -A RESULT=()
say() { echo "== $*" | tee -a "$LOG"; }
# row NAME RESULT DETAIL: printed at once, kept for the table
row() {
    local line
    line=$(printf '[%4ds] %-22s %-8s %s' $((($(now_ms) - T0) / 1000)) "$1" "$2" "$3")
    echo "$line" | tee -a "$LOG"
    ROWS+=("$1|$2|$3")
    RESULT[$1]=$2
    case "$2" in
    ok | info) ;;
    *) NFAIL=$((NFAIL + 1)); spec_of "$1" >/dev/null && RERUN+=("$1") ;;
    esac
}
# run CAP NAME CMD...: at most CAP seconds (scaled) and never past the
# deadline; output to $WORK/NAME.log and the main log. Returns the
# command's status, 124 when it ran out of time.
run() {
    local cap name=$2 left; cap=$(ms "$1"); shift 2
    left=$((DEADLINE - $(now_ms)))
    [ "$cap" -gt "$left" ] && cap=$left
    [ "$cap" -lt 1 ] && cap=1
    echo "\$ $* (limit $(secs "$cap") s)" >"$WORK/$name.log"
    timeout --kill-after=5 "$(secs "$cap")" "$@" >>"$WORK/$name.log" 2>&1
    local rc=$?
    { echo "---- $name (rc $rc)"; cat "$WORK/$name.log"; } >>"$LOG"
    return $rc
}
verdict() {
    case "$1" in 0) echo ok ;; 124 | 137) echo TIMEOUT ;; *) echo FAIL ;; esac
}
count() { grep -c "^$1 " "$2" 2>/dev/null || true; }
# why LOG: the line of a log that says what went wrong (else its last line)
why() {
    # (not the telemetry notes: NVML and RAPL are absent on many machines, as expected)
    { grep -iE 'error|panic|fatal|fail|unavailable|cannot|no usable|not found|no GPU' "$1" | grep -v '^\$ ' |
        grep -viE 'RAPL|telemetry' | tail -n 1; tail -n 1 "$1"; } 2>/dev/null |
        head -n 1 | sed 's/^ *//' | cut -c1-200
}

# the table, the failures and the logs: last, whatever happened before
finish() {
    local r a b c
    {
        echo
        echo "gpu-check: $((($(now_ms) - T0) / 1000)) s of a $BUDGET s budget$([ -n "$SIM_CLOCK" ] && echo " (simulated)"); binaries: ${BIN:-none}; files: $OUTDIR"
        printf '%-22s %-8s %s\n' row result detail
        printf '%-22s %-8s %s\n' ---------------------- -------- ------
        for r in "${ROWS[@]}"; do
            IFS='|' read -r a b c <<<"$r"
            printf '%-22s %-8s %s\n' "$a" "$b" "$c"
        done
        echo "gpu-check: ${#ROWS[@]} rows, $NFAIL failed or not run"
        [ ${#RERUN[@]} -eq 0 ] || echo "gpu-check: re-run those: bench/gpu-check.sh --only $(IFS=,; echo "${RERUN[*]}")"
    } | tee "$OUTDIR/gpu-check.txt" | tee -a "$LOG"
    tar -C "$WORK" -czf "$OUTDIR/gpu-check-logs.tar.gz" --exclude='kjv' --exclude='run_*' . 2>/dev/null
    rm -rf "$WORK"
}

# failing_cases LOG ROW: the FAIL lines of a test log into the failures
# file; prints "name, name, ... (+N)" for the table
failing_cases() {
    local names n
    grep -E '^FAIL ' "$1" | sed "s/^/$2: /" >>"$OUTDIR/gpu-check-failures.txt"
    n=$(grep -cE '^FAIL ' "$1")
    names=$(grep -E '^FAIL ' "$1" | sed -E 's/^FAIL ([^:]*).*/\1/' | head -n 6 | paste -sd, - | sed 's/,/, /g')
    [ "$n" -gt 6 ] && names="$names (+$((n - 6)) more)"
    echo "$names"
}

# schedule: every selected row in order; a row whose need failed fails
# at once, a row whose estimate does not fit is NOT RUN
schedule() {
    local s name need est fn left
    for s in "${SELECTED[@]}"; do
        name=${s%%|*}
        need=$(spec_field "$s" 5)
        est=$(ms "$(spec_field "$s" 4)")
        fn=$(spec_field "$s" 6)
        left=$((DEADLINE - $(now_ms)))
        if [ -n "$need" ] && [ "${RESULT[$need]:-}" != ok ]; then
            row "$name" FAIL "needs $need, which is ${RESULT[$need]:-not run}"
        elif [ "$est" -gt "$left" ]; then
            row "$name" "NOT RUN" "its estimate $(secs "$est") s does not fit the $(secs "$((left > 0 ? left : 0))") s left"
        else
            # shellcheck disable=SC2086 # fn is a function name and its words
            $ROW_RUNNER "$name" $fn
        fi
    done
}
real_row() { shift; "$@"; } # NAME FN WORDS...: the row's function

# ---- the dry run: the bundle, the plan, a simulated run ----

# bundle_problems: prints one line per problem, nothing when the bundle is whole
bundle_problems() {
    local f name path n=0
    for f in "$BUNDLE"/build/loom "$BUNDLE"/build/libloom_cuda.so "$BUNDLE"/build/tests/test_*; do
        [ -f "$f" ] || { echo "missing: ${f#"$BUNDLE"/}"; continue; }
        n=$((n + 1))
        while read -r name path; do
            if [ "$path" = not ]; then
                gpu_is_cuda "$name" || echo "${f#"$BUNDLE"/}: $name is not found in the bundle"
            elif ! gpu_is_system "$name" "$path"; then
                case "$(readlink -f "$path")" in
                "$BUNDLE"/*) ;;
                *) echo "${f#"$BUNDLE"/}: $name resolves outside the bundle, to $path" ;;
                esac
            fi
        done < <(LD_LIBRARY_PATH="$BUNDLE/lib:$BUNDLE/lib/compat" gpu_ldd "$f")
    done
    [ "$n" -gt 0 ] || echo "no binaries in $BUNDLE/build"
    for t in test_cuda_ops test_cuda_model test_engine_cuda test_cuda_attention; do
        [ -x "$BUNDLE/build/tests/$t" ] || echo "build/tests/$t: a GPU test the check runs is not in the bundle"
    done
    while read -r f _ sum _; do
        case "$f" in '#'* | '') continue ;; esac
        [ -f "$BUNDLE/$f" ] || { echo "$f: listed in the manifest, missing"; continue; }
        [ "$(sha256sum "$BUNDLE/$f" | cut -c1-16)" = "$sum" ] || echo "$f: checksum differs from the manifest"
    done <"$BUNDLE/MANIFEST"
    [ -s "$BUNDLE/data/kjv.txt.gz" ] || echo "data/kjv.txt.gz: no corpus"
}

# plan_problems: group 1 and 2 must fit the budget on their estimates
plan_problems() {
    local s t=20 g # 20 s of setup: library search, the start check
    for s in "${ROW_SPECS[@]}"; do
        g=$(spec_field "$s" 2)
        [ "$g" -le 2 ] && t=$((t + $(spec_field "$s" 4)))
        [ "$(spec_field "$s" 4)" -le "$(spec_field "$s" 3)" ] || echo "${s%%|*}: its estimate is over its limit"
    done
    [ $((t + RESERVE)) -le "$BUDGET" ] ||
        echo "groups 1 and 2 need about $t s (+$RESERVE for the table) on their estimates: over the $BUDGET s budget"
    echo "# plan: groups 1 and 2 about $t s of $BUDGET" >&2
}

# sim_row NAME ...: the row on the simulated clock: it takes its estimate,
# or its limit (TIMEOUT) when the estimate is over it (GPU_CHECK_SIM_SLOW,
# default torch_compile, takes three times its limit), cut at the
# deadline as `run` cuts a real row, plus 1 s of the script's own work.
sim_row() {
    local s name=$1 est cap left took res
    s=$(spec_of "$name")
    est=$(ms "$(spec_field "$s" 4)") cap=$(ms "$(spec_field "$s" 3)")
    [ "$name" = "${GPU_CHECK_SIM_SLOW-torch_compile}" ] && est=$((cap * 3))
    left=$((DEADLINE - SIM_CLOCK))
    [ "$cap" -gt "$left" ] && cap=$left
    if [ "$est" -le "$cap" ]; then took=$est res=ok; else took=$cap res=TIMEOUT; fi
    echo "simulated: $took ms" >"$WORK/$name.log"
    SIM_CLOCK=$((SIM_CLOCK + took + 1000))
    row "$name" "$res" "simulated: $(spec_field "$s" 4) s estimate, $(spec_field "$s" 3) s limit"
}

if [ "$DRY" = 1 ]; then
    problems=$(bundle_problems; plan_problems 2>/dev/null)
    nbin=$(find "$BUNDLE/build" -type f | wc -l)
    nlib=$(find "$BUNDLE/lib" -type f | wc -l)
    mb=$(( ($(du -sb "$BUNDLE" | cut -f1) + 1048575) / 1048576 ))
    plan_problems 2>&1 >/dev/null | sed 's/^# /gpu-check --dry-run: /'
    if [ -n "$problems" ]; then
        printf 'gpu-check --dry-run: %s\n' "$problems"
        echo "gpu-check --dry-run: FAIL: the bundle $BUNDLE or the plan is incomplete ($nbin binaries, $nlib libraries, $mb MiB); rebuild it with \`make gpu-bundle\`"
        exit 1
    fi
    echo "gpu-check --dry-run: ok: $nbin binaries, $nlib libraries, $mb MiB; every non-CUDA library resolves inside $BUNDLE"
    grep -E '^# (newest glibc|cuDNN|make)' "$BUNDLE/MANIFEST" | sed 's/^# /gpu-check --dry-run: /'
    # the limits are enforced by timeout(1): a command past its limit is stopped
    timeout --kill-after=5 1 sleep 30
    [ $? = 124 ] || { echo "gpu-check --dry-run: FAIL: timeout(1) did not stop \`sleep 30\` after 1 s"; exit 1; }
    # the whole run on the simulated clock
    OUTDIR=${OUT:-$(mktemp -d /tmp/loom-gpu-check-sim.XXXXXX)}
    mkdir -p "$OUTDIR"
    WORK=$(mktemp -d /tmp/loom-gpu-check.XXXXXX)
    LOG="$OUTDIR/gpu-check.log"
    : >"$LOG"
    : >"$OUTDIR/gpu-check-failures.txt"
    SIM_CLOCK=1000000
    T0=$SIM_CLOCK
    SIM_CLOCK=$((SIM_CLOCK + 20000)) # setup: library search, the start check
    DEADLINE=$((T0 + $(ms "$BUDGET") - $(ms "$RESERVE")))
    ROW_RUNNER=sim_row
    schedule >/dev/null
    BIN=simulated
    finish >"$WORK.table" 2>&1
    took=$((SIM_CLOCK - T0))
    slow=${GPU_CHECK_SIM_SLOW-torch_compile}
    bad=""
    [ "$took" -le "$(ms $((BUDGET - RESERVE)))" ] || bad="$bad; its rows ended at $(secs "$took") s, past the $((BUDGET - RESERVE)) s kept for them"
    [ -z "$slow" ] || [ "${RESULT[$slow]:-}" = TIMEOUT ] || bad="$bad; $slow overran and was not stopped at its limit (${RESULT[$slow]:-not run})"
    for f in gpu-check.txt gpu-check.log gpu-check-failures.txt gpu-check-logs.tar.gz; do
        [ -f "$OUTDIR/$f" ] || bad="$bad; no $f in $OUTDIR"
    done
    [ "$(tail -n 1 "$OUTDIR/gpu-check.txt" | cut -c1-10)" = "gpu-check:" ] || bad="$bad; the table is not last"
    sed 's/^/gpu-check --dry-run: | /' "$OUTDIR/gpu-check.txt"
    rm -f "$WORK.table"
    if [ -n "$bad" ]; then
        echo "gpu-check --dry-run: FAIL: the simulated run${bad}"
        exit 1
    fi
    echo "gpu-check --dry-run: ok: the simulated run ended by itself: rows done at $(secs "$took") s of $BUDGET (15 kept for the table)${slow:+, $slow stopped at its limit}, the table last, files in $OUTDIR"
    exit 0
fi

# ---- the run on the GPU machine ----

OUTDIR=${OUT:-/tmp/loom-gpu-check}
WORK=$(mktemp -d /tmp/loom-gpu-check.XXXXXX)
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu-check.log"
: >"$LOG"
: >"$OUTDIR/gpu-check-failures.txt"
export LOOM_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
T0=$(now_ms)
DEADLINE=$((T0 + $(ms "$BUDGET") - $(ms "$RESERVE")))
trap 'row interrupted FAIL "stopped by a signal"; finish; exit 1' INT TERM

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"; } | tee -a "$LOG"
PY=$(command -v python3 || true)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
echo "nvcc: ${NVCC:-none} $([ -n "$NVCC" ] && "$NVCC" --version | tail -n 1); python3: ${PY:-none}" | tee -a "$LOG"

. bench/gpu-check-setup.sh

if [ "${GPU_CHECK_STOP_AFTER_BUILD:-0}" = 1 ]; then
    echo "gpu-check: GPU_CHECK_STOP_AFTER_BUILD=1: stopping; binaries: ${BIN:-none}"
    rm -rf "$WORK"
    [ "$NFAIL" = 0 ]
    exit
fi
gunzip -c "$BUNDLE/data/kjv.txt.gz" >"$WORK/kjv.txt" 2>/dev/null

. bench/gpu-check-rows.sh
ROW_RUNNER=real_row
schedule
finish
[ "$NFAIL" = 0 ]
