#!/usr/bin/env bash
# gpu-check: everything loom's CUDA backend should prove on a GPU machine,
# in one run of under 8 minutes, ending with a short table.
#
#   1. build for sm_80 and sm_90 (+PTX), warnings as errors
#   2. `loom devices`
#   3. build/tests/test_cuda_ops: every CUDA op against the CPU op, per dtype
#   4. the other C tests (the slow whole-program ones left out), among
#      them test_cuda_model (whole model and training step, GPU vs CPU)
#   4b. `loom train --device cuda` on gpt2-tiny: CUDA graphs on vs off (same
#      losses), the bf16 default, fp16 loss scaling, --recompute all
#   5. `loom bench train --device cuda` on GPT-2 124M, T=1024, bf16
#      (if this loom has `bench train`), and PyTorch on the same model on the
#      same GPU, eager and torch.compile, bf16 autocast, fused AdamW,
#      flash SDPA: tokens/s, MFU and peak memory of each
#
# Usage: bench/gpu-check.sh            (from anywhere; writes build/ and $OUT or /tmp)
# Knobs: GPU_CHECK_BATCH=16 (sequences per step, both sides), GPU_CHECK_STEPS=10,
#        GPU_CHECK_JOBS=$(nproc), GPU_CHECK_SKIP_BUILD=1, GPU_CHECK_TORCH=0.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
OUTDIR=${OUT:-/tmp/loom-gpu-check}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu-check.log"
: >"$LOG"
BATCH=${GPU_CHECK_BATCH:-16}
STEPS=${GPU_CHECK_STEPS:-10}
JOBS=${GPU_CHECK_JOBS:-$(nproc)}
ROWS=() # "name|result|detail" lines for the final table

say() { echo "== $*" | tee -a "$LOG"; }
row() { ROWS+=("$1|$2|$3"); }
elapsed() { echo $(($(date +%s) - T0)); }
# run LIMIT_S NAME CMD...: runs with a time limit, output to the log and to NAME.out
run() {
    local limit=$1 name=$2; shift 2
    timeout --kill-after=10 "$limit" "$@" >"$OUTDIR/$name.out" 2>&1
    local rc=$?
    cat "$OUTDIR/$name.out" >>"$LOG"
    return $rc
}

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv 2>&1 || echo "nvidia-smi: not available"; } | tee -a "$LOG"
PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null && nvcc --version | tail -n 2 | tee -a "$LOG"

# 1. build
if [ "${GPU_CHECK_SKIP_BUILD:-0}" != 1 ]; then
    say "build (sm_80 + sm_90, -j$JOBS)"
    # flags are not tracked by make: start the CUDA objects from scratch
    rm -rf build/src/backend/cuda
    if run 300 build make -j"$JOBS" all; then
        row build ok "$(tail -n 1 "$OUTDIR/build.out")"
    else
        row build FAIL "see $OUTDIR/build.out"
        tail -n 30 "$OUTDIR/build.out"
    fi
fi

# 2. devices
say "loom devices"
if [ -x build/loom ]; then
    run 30 devices build/loom devices; rc=$?
    cat "$OUTDIR/devices.out"
    row devices "$([ $rc = 0 ] && echo ok || echo "rc=$rc")" \
        "$(grep -m1 'cuda:0\|no usable GPU\|no GPUs' "$OUTDIR/devices.out" | sed 's/^ *//')"
else
    row devices FAIL "no build/loom"
fi

count() { grep -c "^$1 " "$2" 2>/dev/null || true; }

# 3. CUDA op tests
say "test_cuda_ops"
if [ -x build/tests/test_cuda_ops ]; then
    run 240 test_cuda_ops build/tests/test_cuda_ops; rc=$?
    f="$OUTDIR/test_cuda_ops.out"
    grep -E '^(FAIL|SKIP)|check failed' "$f" | head -n 60
    row test_cuda_ops "$([ $rc = 0 ] && echo ok || echo "FAIL rc=$rc")" \
        "$(count PASS "$f") passed, $(count FAIL "$f") failed, $(count SKIP "$f") skipped"
else
    row test_cuda_ops FAIL "not built"
fi

# 4. the other C tests (whole-program e2e/oracle tests are left to `make test`)
say "other tests"
p=0; fl=0; s=0; failed=""
for b in build/tests/test_*; do
    [ -x "$b" ] || continue
    n=$(basename "$b")
    case "$n" in test_cuda_ops|test_e2e*|test_oracle*) continue ;; esac
    run 60 "$n" "$b"; rc=$?
    f="$OUTDIR/$n.out"
    p=$((p + $(count PASS "$f"))); s=$((s + $(count SKIP "$f")))
    nf=$(count FAIL "$f")
    [ "$rc" != 0 ] && [ "$nf" = 0 ] && nf=1
    fl=$((fl + nf))
    [ "$nf" != 0 ] && failed="$failed $n"
done
row other_tests "$([ $fl = 0 ] && echo ok || echo FAIL)" "$p passed, $fl failed, $s skipped${failed:+ (failed:$failed)}"

# 4b. loom train on the GPU: the device-resident step with CUDA graphs and
# with plain launches must give the same losses; the bf16 default, fp16
# loss scaling and activation recompute must train
say "loom train --device cuda (gpt2-tiny: graphs on/off, fp16, recompute all)"
if [ -x build/loom ] && [ -f data/kjv.txt ]; then
    head -c 1000000 data/kjv.txt >"$OUTDIR/kjv.txt"
    targs=(--data "$OUTDIR/kjv.txt" --model gpt2-tiny --steps 60 --batch 8 --seq 256 --eval-every 0
           --sample-tokens 0 --ckpt-every 0 --seed 7 --force --device cuda)
    for v in "graphs_on --cuda-graphs on" "graphs_off --cuda-graphs off" "fp16 --dtype fp16" "recompute_all --recompute all"; do
        read -r name extra <<<"$v"
        # shellcheck disable=SC2086 # $extra is two words on purpose
        run 120 "train_$name" build/loom train "${targs[@]}" --out "$OUTDIR/run_$name" $extra; rc=$?
        last=$(python3 - "$OUTDIR/run_$name" <<'PY' 2>/dev/null
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
cfg = json.load(open(sys.argv[1] + "/config.json"))
skipped = sum(1 for r in rows if r.get("skipped"))
print(f"{cfg['dtype']} ({cfg['dtype_source']}), graphs {cfg['cuda_graphs']}, recompute {cfg['recompute']}: "
      f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, {rows[-1]['tokens_per_s']:.0f} tok/s, {skipped} skipped")
PY
)
        row "train_$name" "$([ $rc = 0 ] && echo ok || echo "FAIL rc=$rc")" "${last:-see $OUTDIR/train_$name.out}"
    done
    cmp_out=$(python3 - "$OUTDIR/run_graphs_on" "$OUTDIR/run_graphs_off" <<'PY' 2>&1
import json, sys
try:
    a, b = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:3])
except OSError as e:
    sys.exit(print(f"FAIL no metrics to compare ({e.filename})"))
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"{'ok' if worst <= 1e-4 else 'FAIL'} max relative loss difference {worst:.2e} over {len(a)} steps (bound 1e-4)")
PY
)
    row graphs_vs_plain "${cmp_out%% *}" "${cmp_out#* }"
else
    row loom_train skipped "no build/loom or no data/kjv.txt"
fi

# 5a. loom bench train on the GPU
say "loom bench train --device cuda (GPT-2 124M, T=1024, bf16, batch $BATCH)"
LOOM_TPS=""
if [ -x build/loom ] && build/loom bench train --help 2>&1 | grep -q -- '--device'; then
    run 200 bench_loom build/loom bench train --device cuda --dtype bf16 --model gpt2-small \
        --seq 1024 --batch "$BATCH" --steps "$STEPS" --rounds 1 --torch off; rc=$?
    tail -n 15 "$OUTDIR/bench_loom.out"
    # the table row: "loom cuda  <step ms> <tokens/s> <GFLOP/s> <MFU> <peak MB> ..."
    line=$(grep -E '^ *loom cuda' "$OUTDIR/bench_loom.out" | tail -n 1 | sed 's/^ *//')
    LOOM_TPS=$(printf '%s\n' "$line" | awk '$4 ~ /^[0-9.]+$/ { print $4 }')
    if [ $rc = 0 ] && [ -n "$LOOM_TPS" ]; then
        row loom_bench ok "$line"
    else
        row loom_bench "FAIL rc=$rc" "${line:-no 'loom cuda' row; see $OUTDIR/bench_loom.out}"
    fi
else
    row loom_bench skipped "this loom has no 'bench train --device'"
fi

# 5b. PyTorch on the same GPU: eager and torch.compile
if [ "${GPU_CHECK_TORCH:-1}" = 1 ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    cat >"$OUTDIR/torch_gpu.py" <<'PY'
# GPT-2 124M as loom builds it (pre-LN, tanh GELU, tied head), bf16 autocast,
# fused AdamW, global-norm clipping, flash SDPA. Prints one line per mode.
import math, sys, time, torch, torch.nn as nn, torch.nn.functional as F
L, C, NH, V, T = 12, 768, 12, 50257, 1024
B, STEPS, MODE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.backends.cuda.matmul.allow_tf32 = True
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, 2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(b, t, C))
        return x + s.fcproj(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.lnf = nn.LayerNorm(C)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in s.blocks: x = blk(x)
        logits = F.linear(s.lnf(x), s.wte.weight)
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))
dev = "cuda"
model = GPT().to(dev)
nparams = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
fwd = torch.compile(model) if MODE == "compile" else model
idx = torch.randint(0, V, (B, T), device=dev); tgt = torch.randint(0, V, (B, T), device=dev)
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fwd(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
for _ in range(3): step()
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
for _ in range(STEPS): step()
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / STEPS
tps = B * T / dt
flops_tok = 6 * nparams + 6 * L * C * T
name = torch.cuda.get_device_name()
peak = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
pk = next((v for k, v in peak.items() if k in name), 0)
mfu = f"{100 * tps * flops_tok / pk:.1f}%" if pk else "?"
print(f"torch-{MODE}: {tps:.0f} tok/s, MFU {mfu}, peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, {dt * 1000:.1f} ms/step (B={B}, {name})")
PY
    for mode in eager compile; do
        say "PyTorch $mode (batch $BATCH)"
        run 180 "torch_$mode" python3 "$OUTDIR/torch_gpu.py" "$BATCH" "$STEPS" "$mode"; rc=$?
        line=$(grep "^torch-$mode:" "$OUTDIR/torch_$mode.out" | tail -n 1)
        [ -n "$line" ] || tail -n 5 "$OUTDIR/torch_$mode.out"
        row "torch_$mode" "$([ $rc = 0 ] && echo ok || echo "FAIL rc=$rc")" "${line:-see $OUTDIR/torch_$mode.out}"
        tps=$(printf '%s\n' "$line" | grep -oE '[0-9]+ tok/s' | grep -oE '^[0-9]+')
        if [ -n "$LOOM_TPS" ] && [ -n "$tps" ]; then
            row "loom/torch_$mode" ratio "$(awk -v a="$LOOM_TPS" -v b="$tps" 'BEGIN { printf "%.2fx (goal: 1.10x of the best)", a / b }')"
        fi
    done
else
    row torch skipped "no PyTorch with CUDA here (or GPU_CHECK_TORCH=0)"
fi

echo
echo "gpu-check: $(elapsed) s; full log $LOG"
printf '%-18s %-10s %s\n' step result detail
printf '%-18s %-10s %s\n' ------------------ ---------- ------
for r in "${ROWS[@]}"; do
    IFS='|' read -r a b c <<<"$r"
    printf '%-18s %-10s %s\n' "$a" "$b" "$c"
done
