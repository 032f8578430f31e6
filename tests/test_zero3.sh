#!/usr/bin/env bash
# Fully sharded data parallel (--zero 3): 2 and 4 CPU ranks (--nproc) must
# take the same steps as one process on the same global batch, for GPT-2
# and the Llama family (llama-tiny shape: RMSNorm, RoPE, SwiGLU, grouped-
# query attention): the first 10 losses within 1e-5 relative and the final
# weights within 1e-5, read from the checkpoints by tests/dist_compare.py
# (numpy + safetensors). A ZeRO-3 checkpoint of 4 ranks resumes on 2 ranks
# at ZeRO-1 with the uninterrupted run's losses; a SIGTERM'd ZeRO-3 run
# resumes bit for bit with --resume auto; the memory counted per rank falls
# with the number of ranks.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-$PWD/build/loom}
PY=/usr/bin/python3
export PYTHONPATH=$PWD/.deps/hf${PYTHONPATH:+:$PYTHONPATH}
tmp=$(mktemp -d /tmp/loom-zero3-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
pass() { echo "PASS $*"; }
fail() { echo "FAIL $1: $2"; }
if ! $PY -c "import numpy, safetensors" 2>/dev/null; then
    echo "SKIP zero3: /usr/bin/python3 lacks numpy or safetensors (scripts/deps.sh installs them into .deps/hf)"; exit 0
fi
python3 -c "import random; random.seed(1); print(' '.join(random.choice(['the','word','of','light','and','darkness']) for _ in range(40000)))" > "$tmp/data.txt"
A=(--data "$tmp/data.txt" --layers 2 --channels 64 --context 64 --seq 64 --steps 10 --lr 1e-3 --warmup 2 --eval-every 0
   --sample-tokens 0 --seed 3 --log-every 1 --ckpt-every 0 --threads 1 --dist-timeout 600) # the timeout is a guard only
GPT=(--heads 2)
LLAMA=(--model llama-tiny --heads 4) # 2 kv heads of 4: grouped-query attention

train() { # NAME ARGS...: a run into $tmp/NAME; FAIL when it does not finish
    local name=$1; shift
    $LOOM train "${A[@]}" "$@" --out "$tmp/$name" > "$tmp/$name.log" 2>&1 || { fail "zero3_run_$name" "$(tail -3 "$tmp/$name.log")"; return 1; }
}
check() { # NAME REF RUN [compare flags]
    local name=$1 out; shift
    if out=$($PY tests/dist_compare.py "$@" 2>&1); then pass "$name ($out)"; else fail "$name" "$out"; fi
}

# 1. GPT-2 and llama-tiny: one process with the global batch of 4 sequences,
# then 2 ranks x 2 and 4 ranks x 1 at ZeRO-3 (and, for llama, 2 ranks x 2
# micro-batches: ZeRO-3 reduces every micro-batch into the shard).
for fam in gpt2 llama; do
    if [ $fam = gpt2 ]; then F=("${GPT[@]}"); else F=("${LLAMA[@]}"); fi
    train ${fam}_one "${F[@]}" --batch 4 || continue
    train ${fam}_x2 "${F[@]}" --batch 2 --nproc 2 --zero 3 && check zero3_${fam}_2ranks_vs_1 "$tmp/${fam}_one" "$tmp/${fam}_x2"
    train ${fam}_x4 "${F[@]}" --batch 1 --nproc 4 --zero 3 && check zero3_${fam}_4ranks_vs_1 "$tmp/${fam}_one" "$tmp/${fam}_x4"
    [ $fam = llama ] && train ${fam}_x2acc "${F[@]}" --batch 1 --grad-accum 2 --nproc 2 --zero 3 &&
        check zero3_${fam}_2ranks_accum_vs_1 "$tmp/${fam}_one" "$tmp/${fam}_x2acc"
done
# Without prefetch (each gather waited for where it is issued) the numbers are the same.
train gpt2_x2_noov "${GPT[@]}" --batch 2 --nproc 2 --zero 3 --no-overlap &&
    check zero3_no_prefetch_same_steps "$tmp/gpt2_x2" "$tmp/gpt2_x2_noov" --exact

# Validation under ZeRO-3 runs on every rank (each forward gathers from
# all of them) and reports what ZeRO-1 reports.
E=(--eval-every 5 --eval-batches 2)
if train ev3 "${GPT[@]}" --batch 2 --nproc 2 --zero 3 "${E[@]}" && train ev1 "${GPT[@]}" --batch 2 --nproc 2 --zero 1 "${E[@]}"; then
    v3=$(grep -o '"val_loss":[0-9.]*' "$tmp/ev3/metrics.jsonl" | tr '\n' ' '); v1=$(grep -o '"val_loss":[0-9.]*' "$tmp/ev1/metrics.jsonl" | tr '\n' ' ')
    [ -n "$v3" ] && [ "$v3" = "$v1" ] && pass "zero3_validation_on_every_rank ($v3)" || fail zero3_validation_on_every_rank "'$v3' vs ZeRO-1 '$v1'"
fi

# 2. Reshard: ZeRO-3 on 4 ranks checkpoints at step 5; ZeRO-1 on 2 ranks
# (2 micro-batches each: the same 4 sequences per step) resumes it.
if train r4 "${GPT[@]}" --batch 1 --nproc 4 --zero 3 --ckpt-every 5 --keep-ckpts 3; then
    if $LOOM train "${A[@]}" "${GPT[@]}" --batch 1 --grad-accum 2 --nproc 2 --zero 1 --resume step_5 --out "$tmp/r4" > "$tmp/r4b.log" 2>&1 &&
       grep -q "regathered from 4 shard(s) (ZeRO-3) for 2 rank(s) at ZeRO-1" "$tmp/r4b.log"; then
        check zero3_x4_checkpoint_resumes_as_zero1_x2 "$tmp/gpt2_one" "$tmp/r4"
    else
        fail zero3_x4_checkpoint_resumes_as_zero1_x2 "$(tail -3 "$tmp/r4b.log")"
    fi
fi
# and the other way: a ZeRO-1 x2 checkpoint resumes as ZeRO-3 x4.
if train r2 "${GPT[@]}" --batch 1 --grad-accum 2 --nproc 2 --zero 1 --ckpt-every 5 --keep-ckpts 3; then
    if $LOOM train "${A[@]}" "${GPT[@]}" --batch 1 --nproc 4 --zero 3 --resume step_5 --out "$tmp/r2" > "$tmp/r2b.log" 2>&1; then
        check zero1_x2_checkpoint_resumes_as_zero3_x4 "$tmp/gpt2_one" "$tmp/r2"
    else
        fail zero1_x2_checkpoint_resumes_as_zero3_x4 "$(tail -3 "$tmp/r2b.log")"
    fi
fi

# 3. SIGTERM after step 5 (LOOM_TEST_HOLD_AFTER_STEP holds every rank
# there until the signal), exit 75 with a checkpoint, then --resume auto:
# bit for bit the uninterrupted ZeRO-3 run.
LOOM_TEST_HOLD_AFTER_STEP=5 $LOOM train "${A[@]}" "${GPT[@]}" --batch 2 --nproc 2 --zero 3 --resume auto --out "$tmp/st" > "$tmp/st.log" 2>&1 &
pid=$!
for _ in $(seq 1 2400); do grep -q "holding after step 5" "$tmp/st.log" 2>/dev/null && break; sleep 0.05; done
kill -TERM $pid; rc=0; wait $pid || rc=$?
if [ $rc = 75 ] && [ "$(cat "$tmp/st/latest" 2>/dev/null)" = step_00000005 ] &&
   $LOOM train "${A[@]}" "${GPT[@]}" --batch 2 --nproc 2 --zero 3 --resume auto --out "$tmp/st" > "$tmp/st2.log" 2>&1; then
    check zero3_sigterm_resume_auto_bit_exact "$tmp/gpt2_x2" "$tmp/st" --exact
else
    fail zero3_sigterm_resume_auto_bit_exact "exit $rc, latest '$(cat "$tmp/st/latest" 2>/dev/null)': $(tail -2 "$tmp/st.log" "$tmp/st2.log" 2>/dev/null)"
fi

# 4. Memory: the model-state bytes each rank counts (core/mem.h: params,
# grads, AdamW at the highest total) fall with the ranks on a model whose
# weights dominate (wide, short context, tiny vocabulary).
W=(--layers 8 --channels 128 --heads 4 --context 16 --seq 16 --steps 2 --lr 1e-3 --eval-every 0 --sample-tokens 0 --ckpt-every 0
   --threads 1 --dist-timeout 600 --data "$tmp/data.txt")
for n in 1 2 4; do
    LOOM_MEM_REPORT="$tmp/mem$n.jsonl" $LOOM train "${W[@]}" --batch 1 --nproc $n --zero 3 --out "$tmp/m$n" > "$tmp/m$n.log" 2>&1 ||
        fail zero3_memory_run_$n "$(tail -2 "$tmp/m$n.log")"
done
if out=$($PY - "$tmp" <<'PY'
import json, sys
def state(n):  # the largest rank's params + grads + AdamW bytes at its peak
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/mem{n}.jsonl")]
    return max(r["params"] + r["grads"] + r["optim"] for r in rows)
m = {n: state(n) for n in (1, 2, 4)}
print(" ".join(f"N={n}: {m[n] / 1e6:.2f} MB" for n in m))
sys.exit(0 if m[4] < m[2] < m[1] and m[4] < 0.5 * m[1] else 1)
PY
); then pass "zero3_memory_falls_with_ranks ($out)"; else fail zero3_memory_falls_with_ranks "$out"; fi

# 5. loom bench dist --layout: a comma list parsed in one place; the zero3
# rows (1 rank, 2 ranks with and without prefetch) run the same math, so
# their losses agree; an unknown layout is named with the known ones.
out=$($LOOM bench dist --layout zero3,dp --ranks 2 --layers 1 --channels 32 --heads 2 --seq 16 --batch 1 --vocab 64 \
      --steps 1 --warmup 0 --rounds 1 2>&1)
losses=$(printf '%s\n' "$out" | sed -n '/^layout zero3/,/^scaling/p' | grep -E '^(1 rank|2 ranks)' | awk '{print $NF}' | sort -u)
if printf '%s\n' "$out" | grep -q "^layout zero3" && printf '%s\n' "$out" | grep -q "^layout dp" && [ "$(printf '%s\n' "$losses" | wc -l)" = 1 ] &&
   printf '%s\n' "$out" | grep -q "peak RSS MB"; then
    pass "zero3_bench_dist_layouts (zero3 rows agree on loss $losses)"
else
    fail zero3_bench_dist_layouts "$(printf '%s\n' "$out" | tail -12)"
fi
out=$($LOOM bench dist --layout zero3,nope 2>&1); rc=$?
[ $rc = 2 ] && printf '%s' "$out" | grep -q "unknown layout 'nope'; known: .*zero3" && pass zero3_bench_dist_unknown_layout_named \
    || fail zero3_bench_dist_unknown_layout_named "exit $rc: $out"
