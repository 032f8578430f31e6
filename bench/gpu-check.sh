#!/usr/bin/env bash
# gpu-check: everything loom's CUDA backend should prove on a GPU machine, in
# one run of under 8 minutes, on a bare machine (CUDA driver, nvcc, PyTorch
# and NVIDIA's CUDA libraries as Python packages; no Debian packages, no
# network). It uses the bundle that `make gpu-bundle` made here (.gpu/, carried
# along): binaries, the non-CUDA libraries they need, a corpus.
#
#   1. finds the CUDA libraries (system CUDA, or the nvidia/*/lib folders of
#      the machine's Python packages) and sets the library path
#   2. starts the carried binaries; when they cannot start, rebuilds there
#      with nvcc (CPU side against the bundle's headers and libraries) and
#      says which path it took, or says what it could not do
#   3. rows, each printed as it finishes, with LOOM_REQUIRE_GPU=1 (a SKIP in
#      a GPU test is a FAIL here): loom devices; test_cuda_ops;
#      test_cuda_attention; test_cuda_model; 100 training steps of gpt2-tiny
#      on the bundled corpus with CUDA graphs on and off (same losses), bf16,
#      fp16 with loss scaling, recompute, bf16 with fp32 activations and
#      fp32 (the bf16-activation loss curve against both); compute-sanitizer memcheck and
#      racecheck on a reduced op test; loom bench train on GPT-2 124M T=1024
#      bf16 at the largest batch that fits (and with fp32 activations at
#      that batch: what 16-bit storage gains), against PyTorch eager and
#      torch.compile at the same batch; loom's generation benchmark when this
#      loom has one
#   4. a table last; full logs in $OUT (gpu-check.log, gpu-check.txt, and
#      gpu-check-logs.tar.gz with one log per row)
#
# Usage: bench/gpu-check.sh [--dry-run] [--bundle DIR] [--budget SECONDS]
#   --dry-run        here, without a GPU: checks that every bundled binary's
#                    non-CUDA libraries resolve inside the bundle (ldd with the
#                    bundle on LD_LIBRARY_PATH), the manifest's checksums and
#                    the corpus; exit 1 when one does not
#   --bundle DIR     the bundle (default .gpu)
#   --budget S       total seconds for the rows (default 450, 60..3600); a row
#                    that would start too late is reported as not run
# Knobs: GPU_CHECK_FORCE_REBUILD=1 (rebuild even when the carried binaries
#        start), GPU_CHECK_STOP_AFTER_BUILD=1, GPU_CHECK_BATCHES="64 32 16 8".
# Exit status: 0 all rows ok, 1 a row failed or did not run, 2 usage error.
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/gpu-common.sh

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "gpu-check: $*; see bench/gpu-check.sh --help" >&2; exit 2; }
DRY=0
BUNDLE=.gpu
BUDGET=${GPU_CHECK_BUDGET:-450}
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1; shift ;;
    --bundle) [ $# -ge 2 ] || die_usage "--bundle needs a folder"; BUNDLE=$2; shift 2 ;;
    --budget) [ $# -ge 2 ] || die_usage "--budget needs a number of seconds"; BUDGET=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown argument '$1'" ;;
    esac
done
case "$BUDGET" in '' | *[!0-9]*) die_usage "--budget '$BUDGET' is not a whole number of seconds" ;; esac
[ "$BUDGET" -ge 60 ] && [ "$BUDGET" -le 3600 ] || die_usage "--budget $BUDGET is outside 60..3600 seconds"
[ -d "$BUNDLE" ] && [ -f "$BUNDLE/MANIFEST" ] ||
    { echo "gpu-check: no bundle in $BUNDLE (no MANIFEST): run \`make gpu-bundle\` first, and carry $BUNDLE" >&2; exit 1; }
BUNDLE=$(cd "$BUNDLE" && pwd)

# ---- the dry run: the bundle is complete ----

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
    while read -r f _ sum _; do
        case "$f" in '#'* | '') continue ;; esac
        [ -f "$BUNDLE/$f" ] || { echo "$f: listed in the manifest, missing"; continue; }
        [ "$(sha256sum "$BUNDLE/$f" | cut -c1-16)" = "$sum" ] || echo "$f: checksum differs from the manifest"
    done <"$BUNDLE/MANIFEST"
    [ -s "$BUNDLE/data/kjv.txt" ] || echo "data/kjv.txt: no corpus"
}

if [ "$DRY" = 1 ]; then
    problems=$(bundle_problems)
    nbin=$(find "$BUNDLE/build" -type f | wc -l)
    nlib=$(find "$BUNDLE/lib" -type f | wc -l)
    mb=$(( ($(du -sb "$BUNDLE" | cut -f1) + 1048575) / 1048576 ))
    if [ -n "$problems" ]; then
        printf 'gpu-check --dry-run: %s\n' "$problems"
        echo "gpu-check --dry-run: FAIL: the bundle $BUNDLE is incomplete ($nbin binaries, $nlib libraries, $mb MiB); rebuild it with \`make gpu-bundle\`"
        exit 1
    fi
    echo "gpu-check --dry-run: ok: $nbin binaries, $nlib libraries, $mb MiB; every non-CUDA library resolves inside $BUNDLE"
    grep -E '^# (newest glibc|cuDNN|make)' "$BUNDLE/MANIFEST" | sed 's/^# /gpu-check --dry-run: /'
    exit 0
fi

# ---- the run on the GPU machine ----

OUTDIR=${OUT:-/tmp/loom-gpu-check}
WORK=$(mktemp -d /tmp/loom-gpu-check.XXXXXX)
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu-check.log"
: >"$LOG"
export LOOM_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))
ROWS=()
NFAIL=0

say() { echo "== $*" | tee -a "$LOG"; }
# row NAME RESULT DETAIL: printed at once, kept for the table
row() {
    local line
    line=$(printf '[%4ds] %-20s %-8s %s' $(($(date +%s) - T0)) "$1" "$2" "$3")
    echo "$line" | tee -a "$LOG"
    ROWS+=("$1|$2|$3")
    case "$2" in ok | info) ;; *) NFAIL=$((NFAIL + 1)) ;; esac
}
# run CAP NAME CMD...: at most CAP seconds and never past the deadline;
# output to $WORK/NAME.log (and the main log). Returns the command's status,
# 124 when it ran out of time, 125 when no time was left to start it.
run() {
    local cap=$1 name=$2 left; shift 2
    left=$((DEADLINE - $(date +%s)))
    [ "$cap" -gt "$left" ] && cap=$left
    if [ "$cap" -lt 10 ]; then
        echo "not run: the ${BUDGET} s budget is spent" >"$WORK/$name.log"
        return 125
    fi
    echo "\$ $* (limit ${cap} s)" >"$WORK/$name.log"
    timeout --kill-after=5 "$cap" "$@" >>"$WORK/$name.log" 2>&1
    local rc=$?
    { echo "---- $name (rc $rc)"; cat "$WORK/$name.log"; } >>"$LOG"
    return $rc
}
# verdict RC: the result column for a command's status
verdict() {
    case "$1" in
    0) echo ok ;; 124 | 137) echo TIMEOUT ;; 125) echo "NOT RUN" ;; *) echo "FAIL" ;;
    esac
}
count() { grep -c "^$1 " "$2" 2>/dev/null || true; }
# why LOG: the line of a log that says what went wrong (else its last line)
why() {
    { grep -iE 'error|panic|fail|unavailable|cannot|no usable|not found' "$1" | grep -v '^\$ ' | tail -n 1; tail -n 1 "$1"; } 2>/dev/null |
        head -n 1 | sed 's/^ *//' | cut -c1-200
}

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"; } | tee -a "$LOG"
PY=$(command -v python3 || true)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
echo "nvcc: ${NVCC:-none} $([ -n "$NVCC" ] && "$NVCC" --version | tail -n 1); python3: ${PY:-none}" | tee -a "$LOG"

# 1. CUDA libraries: system CUDA, then NVIDIA's Python packages
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

# 2. the carried binaries, or a rebuild here
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
    [ -f "$BUNDLE/include/cblas.h" ] && [ -e "$BUNDLE/lib/libopenblas.so" ] ||
        why="${why:+$why; }the bundle has no OpenBLAS header or library (the CPU side needs them)"
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
    for lib in cublasLt cublas nccl cudart cudnn nvrtc; do
        for d in "${ROOTS[@]}"; do
            f=$(ls "$d/lib$lib.so" "$d"/lib"$lib".so.[0-9]* 2>/dev/null | head -n 1)
            if [ -n "$f" ]; then ln -sf "$f" "$linkdir/lib$lib.so"; libs="$libs -l$lib"; break; fi
        done
    done
    case "$libs" in *-lcudnn*-lnvrtc*) [ -f "$BUNDLE/include/cudnn-fe/cudnn_frontend.h" ] && fe="$BUNDLE/include/cudnn-fe/cudnn_frontend.h" ;; esac
    [ -n "$fe" ] || { libs=${libs/ -lcudnn/}; libs=${libs/ -lnvrtc/}; }
    run 240 rebuild make -j"$(nproc)" BUILD=build-there NO_MPI=1 ARCH=-march=native \
        "CUDA_ARCHS=-gencode arch=compute_90,code=[sm_90,compute_90]" "CUDNN_FE=$fe" \
        "EXTRA_CFLAGS=-I$BUNDLE/include$inc" "EXTRA_NVFLAGS=$inc" \
        "LDFLAGS=-L$BUNDLE/lib -Wl,-rpath,$BUNDLE/lib" \
        "CUDA_LIBS=-L$linkdir -Wl,-rpath,$linkdir$libs -lstdc++" all
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

if [ "${GPU_CHECK_STOP_AFTER_BUILD:-0}" = 1 ]; then
    echo "gpu-check: GPU_CHECK_STOP_AFTER_BUILD=1: stopping; binaries: ${BIN:-none}"
    rm -rf "$WORK"
    [ "$NFAIL" = 0 ]
    exit
fi

# 3. the rows
ok_no_skip() { # RC LOG: ok only when it exited 0 with no FAIL and no SKIP line
    local rc=$1 f=$2
    if [ "$rc" = 0 ] && [ "$(count FAIL "$f")" = 0 ] && [ "$(count SKIP "$f")" = 0 ] && [ "$(count PASS "$f")" -gt 0 ]; then
        echo ok
    elif [ "$rc" = 0 ]; then echo FAIL; else verdict "$rc"; fi
}
test_row() { # CAP NAME [ENV=VALUE...]: a C test binary
    local cap=$1 name=$2; shift 2
    if [ -z "$BIN" ] || [ ! -x "$BIN/tests/$name" ]; then
        row "$name" FAIL "not built"
        return
    fi
    run "$cap" "$name" env "$@" "$BIN/tests/$name"
    local rc=$? f="$WORK/$name.log"
    grep -E '^(FAIL|SKIP)|check failed' "$f" | head -n 20 | sed 's/^/    /'
    row "$name" "$(ok_no_skip $rc "$f")" "$(count PASS "$f") passed, $(count FAIL "$f") failed, $(count SKIP "$f") skipped (a SKIP fails here)"
}

if [ -n "$BIN" ]; then
    run 30 devices "$BIN/loom" devices; rc=$?
    if [ $rc = 0 ] && grep -q 'cuda:0' "$WORK/devices.log"; then
        row devices ok "$(grep -m1 'cuda:0' "$WORK/devices.log" | sed 's/^ *//' | cut -c1-160)"
    else
        row devices "$(verdict $((rc == 0 ? 1 : rc)))" "$(why "$WORK/devices.log")"
    fi
fi
test_row 100 test_cuda_ops
test_row 60 test_cuda_attention
test_row 90 test_cuda_model

# 100 training steps of gpt2-tiny on the bundled corpus
train_summary() { # RUN_DIR: one line; exit 1 when the run did not learn
    "$PY" - "$1" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l]
cfg = json.load(open(sys.argv[1] + "/config.json"))
losses = [r["loss"] for r in rows if r.get("loss") is not None]
skipped = sum(1 for r in rows if r.get("skipped"))
scale = rows[-1].get("loss_scale") if rows else None
ok = len(losses) >= 90 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.5
print(f"{cfg.get('dtype')}, graphs {cfg.get('cuda_graphs')}, recompute {cfg.get('recompute')}: {len(losses)} steps, "
      f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {rows[-1].get('tokens_per_s', 0):.0f} tok/s"
      + (f", loss scale {scale:g}, {skipped} skipped" if scale is not None else ""))
sys.exit(0 if ok else 1)
PY
}
compare_losses() { # A B BOUND: the relative loss difference per step stays under BOUND
    "$PY" - "$@" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l] for d in sys.argv[1:3])
bound = float(sys.argv[3])
if not a or len(a) != len(b):
    print(f"FAIL {len(a)} and {len(b)} steps"); sys.exit(1)
worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
print(f"max relative loss difference {worst:.2e} over {len(a)} steps (bound {bound:g})")
sys.exit(0 if worst <= bound else 1)
PY
}
if [ -n "$BIN" ] && [ -n "$PY" ]; then
    run 60 tokenize "$BIN/loom" tokenize --input "$BUNDLE/data/kjv.txt" --vocab 2048 --val-fraction 0.05 --out "$WORK/kjv"; rc=$?
    [ $rc = 0 ] || row tokenize "$(verdict $rc)" "see tokenize.log"
    targs=(--data "$WORK/kjv" --model gpt2-tiny --steps 100 --batch 8 --seq 256 --warmup 10 --eval-every 0
           --sample-tokens 0 --ckpt-every 0 --seed 7 --force --device cuda --log-every 10)
    # NAME ENV ARGS: bf16 stores activations in bf16 (docs/cuda.md);
    # fp32acts keeps them fp32 with bf16 GEMMs (LOOM_CUDA_ACTIVATIONS=fp32)
    for v in "graphs_on - --dtype bf16 --cuda-graphs on" "graphs_off - --dtype bf16 --cuda-graphs off" \
             "fp16 - --dtype fp16" "recompute - --dtype bf16 --recompute all" \
             "fp32acts LOOM_CUDA_ACTIVATIONS=fp32 --dtype bf16" "fp32 - --dtype fp32"; do
        read -r name envs extra <<<"$v"
        [ "$envs" = - ] && envs=LOOM_GPU_CHECK=1
        # shellcheck disable=SC2086 # $extra is several words on purpose
        run 45 "train_$name" env "$envs" "$BIN/loom" train "${targs[@]}" --out "$WORK/run_$name" $extra; rc=$?
        if [ $rc = 0 ]; then
            line=$(train_summary "$WORK/run_$name" 2>&1); rc=$?
            row "train_$name" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$line"
        else
            row "train_$name" "$(verdict $rc)" "$(why "$WORK/train_$name.log")"
        fi
    done
    if [ -f "$WORK/run_graphs_on/metrics.jsonl" ] && [ -f "$WORK/run_graphs_off/metrics.jsonl" ]; then
        line=$(compare_losses "$WORK/run_graphs_on" "$WORK/run_graphs_off" 1e-3 2>&1); rc=$?
        row graphs_vs_plain "$([ $rc = 0 ] && echo ok || echo FAIL)" "$line"
    fi
    # bounds set a priori: bf16 storage against fp32 storage of the same
    # bf16 GEMMs, and against fp32 throughout
    for v in "recompute_vs_keep recompute graphs_on 2e-2" "bf16_acts_vs_fp32_acts graphs_on fp32acts 2e-2" \
             "bf16_vs_fp32 graphs_on fp32 3e-2"; do
        read -r label a b bound <<<"$v"
        if [ -f "$WORK/run_$a/metrics.jsonl" ] && [ -f "$WORK/run_$b/metrics.jsonl" ]; then
            line=$(compare_losses "$WORK/run_$a" "$WORK/run_$b" "$bound" 2>&1); rc=$?
            row "$label" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$line"
        fi
    done
else
    row train FAIL "no loom binary or no python3 to read the metrics"
fi

# compute-sanitizer on a reduced op test (bf16 cases of test_cuda_ops)
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
      /opt/nvidia/*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
for tool in memcheck racecheck; do
    if [ -z "$SAN" ]; then row "sanitizer_$tool" FAIL "compute-sanitizer not found"; continue; fi
    [ -n "$BIN" ] || { row "sanitizer_$tool" FAIL "no test binary"; continue; }
    only="/bf16"
    [ "$tool" = racecheck ] && only="attention_fused/bf16,layernorm/bf16,crossentropy/bf16,sumsq/bf16"
    run 90 "sanitizer_$tool" "$SAN" --tool "$tool" --error-exitcode 3 --print-limit 20 \
        env LOOM_CUDA_OPS_ONLY="$only" "$BIN/tests/test_cuda_ops"; rc=$?
    f="$WORK/sanitizer_$tool.log"
    summary=$(grep -m1 'ERROR SUMMARY' "$f" | sed 's/^=* *//')
    res=$(ok_no_skip $rc "$f")
    [ "$res" = ok ] && ! grep -q 'ERROR SUMMARY: 0 errors' "$f" && res=FAIL
    row "sanitizer_$tool" "$res" "${summary:-no summary} ($(count PASS "$f") cases: $only)"
done

# loom bench train on GPT-2 124M, T=1024, bf16: the largest batch that fits
LOOM_TPS="" BATCH=""
if [ -n "$BIN" ]; then
    for b in ${GPU_CHECK_BATCHES:-64 32 16 8}; do
        run 120 "bench_loom_b$b" "$BIN/loom" bench train --device cuda --dtype bf16 --model gpt2-small \
            --seq 1024 --batch "$b" --steps 5 --rounds 2 --torch off; rc=$?
        line=$(grep -E '^ *loom cuda' "$WORK/bench_loom_b$b.log" | tail -n 1 | sed 's/^ *//')
        tps=$(printf '%s\n' "$line" | awk '$4 ~ /^[0-9.]+$/ { print $4 }')
        if [ $rc = 0 ] && [ -n "$tps" ]; then LOOM_TPS=$tps BATCH=$b; break; fi
        [ $rc = 124 ] || [ $rc = 125 ] && break
    done
    if [ -n "$LOOM_TPS" ]; then
        row bench_loom ok "B=$BATCH: $line"
        run 60 bench_loom_fp32acts env LOOM_CUDA_ACTIVATIONS=fp32 "$BIN/loom" bench train --device cuda --dtype bf16 \
            --model gpt2-small --seq 1024 --batch "$BATCH" --steps 5 --rounds 1 --torch off; rc=$?
        line=$(grep -E '^ *loom cuda' "$WORK/bench_loom_fp32acts.log" | tail -n 1 | sed 's/^ *//')
        tps=$(printf '%s\n' "$line" | awk '$4 ~ /^[0-9.]+$/ { print $4 }')
        if [ $rc = 0 ] && [ -n "$tps" ]; then
            row bench_loom_fp32acts info "B=$BATCH, fp32 activations: $line; bf16 activations $(awk -v a="$LOOM_TPS" -v b="$tps" 'BEGIN { printf "%.2fx", a / b }') of it"
        else
            row bench_loom_fp32acts "$(verdict $rc)" "$(why "$WORK/bench_loom_fp32acts.log")"
        fi
    else
        row bench_loom "$(verdict "${rc:-1}")" "no batch of ${GPU_CHECK_BATCHES:-64 32 16 8} ran: $(why "$(ls -t "$WORK"/bench_loom_b*.log | head -n 1)")"
    fi
fi
# PyTorch on the same GPU at the same batch (halved when it does not fit)
if [ -n "$PY" ] && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    for mode in eager compile; do
        b=${BATCH:-16} line=""
        for try in 1 2 3; do
            run $([ $mode = compile ] && echo 150 || echo 60) "torch_$mode" "$PY" bench/torch_gpu.py "$b" 5 "$mode"; rc=$?
            line=$(grep "^torch-$mode:" "$WORK/torch_$mode.log" | tail -n 1)
            [ $rc != 0 ] && grep -q 'OutOfMemory\|out of memory' "$WORK/torch_$mode.log" && [ "$b" -gt 1 ] && { b=$((b / 2)); continue; }
            break
        done
        row "torch_$mode" "$(verdict $rc)" "${line:-$(why "$WORK/torch_$mode.log")}"
        tps=$(printf '%s\n' "$line" | grep -oE '[0-9]+ tok/s' | grep -oE '^[0-9]+')
        if [ -n "$LOOM_TPS" ] && [ -n "$tps" ]; then
            row "loom/torch_$mode" info "$(awk -v a="$LOOM_TPS" -v b="$tps" 'BEGIN { printf "%.2fx tokens/s (goal: 1.10x torch.compile)", a / b }')"
        fi
    done
else
    row torch FAIL "no python3 with CUDA-enabled PyTorch here"
fi

# the inference engine's generation benchmark, when this loom has one
if [ -n "$BIN" ] && "$BIN/loom" bench generate --help 2>&1 | grep -q -- '--device'; then
    run 60 bench_generate "$BIN/loom" bench generate --device cuda; rc=$?
    row bench_generate "$(verdict $rc)" "$(grep -iE 'tokens/s|tok/s' "$WORK/bench_generate.log" | tail -n 1 | sed 's/^ *//' | cut -c1-160)"
    run 60 bench_generate_int8 "$BIN/loom" bench generate --device cuda --quant w8a8 --kv-dtype int8; rc=$? # cuda_int8.cu end to end
    row bench_generate_int8 "$(verdict $rc)" "$(grep -iE 'tokens/s|tok/s' "$WORK/bench_generate_int8.log" | tail -n 1 | sed 's/^ *//' | cut -c1-160)"
else
    row bench_generate info "not present in this loom (no 'bench generate --device')"
fi

# 4. the table, and the logs into $OUT (few files: the transfer takes 8 at most)
{
    echo
    echo "gpu-check: $(($(date +%s) - T0)) s (budget $BUDGET s); binaries: ${BIN:-none}; logs: $OUTDIR"
    printf '%-20s %-8s %s\n' row result detail
    printf '%-20s %-8s %s\n' -------------------- -------- ------
    for r in "${ROWS[@]}"; do
        IFS='|' read -r a b c <<<"$r"
        printf '%-20s %-8s %s\n' "$a" "$b" "$c"
    done
    echo "gpu-check: ${#ROWS[@]} rows, $NFAIL failed or not run"
} | tee "$OUTDIR/gpu-check.txt" | tee -a "$LOG"
tar -C "$WORK" -czf "$OUTDIR/gpu-check-logs.tar.gz" --exclude='kjv' --exclude='run_*/ckpt*' . 2>/dev/null
rm -rf "$WORK"
[ "$NFAIL" = 0 ]
