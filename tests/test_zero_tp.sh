#!/usr/bin/env bash
# ZeRO over the data-parallel replicas of a tensor-parallel run (issue 24
# part 4, docs/dist.md "Composition"): `loom train --nproc 4 --tp 2 --zero
# 1/2/3` (tp2 x dp2: each replica's tp shard sharded over the dp group by
# train/step.h's data-parallel code, its reduction bucketed and overlapped
# with backward) must take the same steps as one process on the same
# global batch: the first 10 losses within 1e-5 relative and the final
# weights of the single-model checkpoint within 1e-5 (tests/dist_compare.py,
# numpy + safetensors), for GPT-2 (biases: the row-parallel ones live on tp
# rank 0) and llama-tiny (grouped-query attention, kv heads split).
# Checkpoints: a tp2 x dp2 --zero 3 checkpoint continues in one process
# with the one process's losses, and --resume auto after SIGTERM on the
# same layout is bit for bit.
set -u
cd "$(dirname "$0")/.."
. tests/lib_dist.sh zero_tp
# --grad-accum 2: ZeRO-2 reduces (and keeps its shard of) every micro-batch
A=(--data "$tmp/data.txt" --layers 2 --channels 64 --context 64 --seq 32 --steps 10 --lr 1e-3 --warmup 2 --grad-accum 2
   --eval-every 0 --sample-tokens 0 --seed 3 --log-every 1 --ckpt-every 5 --threads 1 --dist-timeout 600) # a guard only
GPT=(--model gpt2-tiny --heads 2)
LLAMA=(--model llama-tiny --heads 4) # 4 query heads, 2 kv heads: split over tp2

# References: one process, the global batch (4 sequences x 2 micro-batches).
run gpt_one "${GPT[@]}" --batch 4 || exit 1
run llama_one "${LLAMA[@]}" --batch 4 || exit 1

for z in 1 2 3; do
    run gpt_z$z "${GPT[@]}" --batch 2 --nproc 4 --tp 2 --zero $z &&
        check tp2xdp2_zero${z}_gpt2_vs_1 "$tmp/gpt_one" "$tmp/gpt_z$z" "$tmp/gpt_z$z.log"
    run llama_z$z "${LLAMA[@]}" --batch 2 --nproc 4 --tp 2 --zero $z &&
        check tp2xdp2_zero${z}_llama_vs_1 "$tmp/llama_one" "$tmp/llama_z$z" "$tmp/llama_z$z.log"
done
grep -q "ZeRO-3 over 2 data-parallel replicas of each shard" "$tmp/llama_z3.log" && echo "PASS zero_tp_layout_named" ||
    echo "FAIL zero_tp_layout_named: $(grep 'loom train:' "$tmp/llama_z3.log" | head -8)"

# Reshard: tp2 x dp2 --zero 3's step 5 continues in one process (--batch 2: the accumulation
# doubles to keep the global batch) with the one process's losses.
cp -r "$tmp/llama_z3" "$tmp/z3_to_1"
run z3_to_1 "${LLAMA[@]}" --batch 2 --resume step_5 && check tp2xdp2_zero3_ckpt_continues_in_1 "$tmp/llama_one" "$tmp/z3_to_1" "$tmp/z3_to_1.log"

# SIGTERM while every rank holds after step 5 (LOOM_TEST_HOLD_AFTER_STEP), exit 75 with
# step 5's checkpoint, then --resume auto on the same layout: bit for bit the uninterrupted run.
LOOM_TEST_HOLD_AFTER_STEP=5 $LOOM train "${A[@]}" "${LLAMA[@]}" --batch 2 --nproc 4 --tp 2 --zero 3 --resume auto --out "$tmp/st" > "$tmp/st.log" 2>&1 &
pid=$!
for _ in $(seq 1 12000); do grep -q "holding after step 5" "$tmp/st.log" 2>/dev/null && break; sleep 0.05; done # a failure guard only
kill -TERM $pid; rc=0; wait $pid || rc=$?
pid=
if [ $rc = 75 ] && [ "$(cat "$tmp/st/latest" 2>/dev/null)" = step_00000005 ] &&
   $LOOM train "${A[@]}" "${LLAMA[@]}" --batch 2 --nproc 4 --tp 2 --zero 3 --resume auto --out "$tmp/st" > "$tmp/st2.log" 2>&1; then
    check tp2xdp2_zero3_sigterm_resume_auto_bit_exact "$tmp/llama_z3" "$tmp/st" "$tmp/st2.log" --exact
else
    echo "FAIL tp2xdp2_zero3_sigterm_resume_auto_bit_exact: exit $rc, latest '$(cat "$tmp/st/latest" 2>/dev/null)': $(tail -2 "$tmp/st.log" "$tmp/st2.log" 2>/dev/null)"
fi
