#!/usr/bin/env bash
# ZeRO over the data-parallel replicas of a pipeline (issue 24 part 4, the
# issue's oracle layout pp2 x dp2 --zero 3; docs/dist.md "Composition"):
# `loom train --nproc 4 --pp 2 --zero 1/2/3` -- each stage's replicas
# shard that stage's block (ZeRO-3: its own layers' weights) over their dp
# group with train/step.h's data-parallel code, the reduction overlapped
# with the backward passes -- must take the same steps as one process on
# the same global batch: the first 10 losses within 1e-5 relative and the
# final weights of the single-model checkpoint within 1e-5
# (tests/dist_compare.py), for GPT-2 (tied head: the two ends' wte
# gradients summed across stages after each end's replicas assemble theirs)
# and llama-tiny (grouped-query attention). --pp with --init-from-run
# fine-tunes a run's checkpoint with one process's losses.
set -u
cd "$(dirname "$0")/.."
. tests/lib_dist.sh pp_zero
A=(--data "$tmp/data.txt" --layers 2 --channels 64 --heads 2 --context 64 --seq 32 --steps 10 --lr 1e-3 --warmup 2
   --eval-every 5 --eval-batches 2 --sample-tokens 0 --seed 3 --log-every 1 --ckpt-every 0 --grad-accum 4 --threads 1 --dist-timeout 600)

for m in gpt2-tiny llama-tiny; do
    run one_$m --model $m --batch 4 || continue
    for z in 3 1; do
        run pp_$m$z --model $m --batch 2 --nproc 4 --pp 2 --zero $z &&
            check pp2xdp2_zero${z}_${m}_vs_1 "$tmp/one_$m" "$tmp/pp_$m$z" "$tmp/pp_$m$z.log"
    done
done
run pp_gpt2-tiny2 --model gpt2-tiny --batch 2 --nproc 4 --pp 2 --zero 2 &&
    check pp2xdp2_zero2_gpt2-tiny_vs_1 "$tmp/one_gpt2-tiny" "$tmp/pp_gpt2-tiny2" "$tmp/pp_gpt2-tiny2.log"

# --init-from-run with --pp: llama-tiny's run fine-tuned in pp2 and in one process, the same steps.
F=(--model llama-tiny --init-from-run "$tmp/one_llama-tiny" --steps 10 --batch 4)
run ft_one "${F[@]}" && run ft_pp "${F[@]}" --nproc 2 --pp 2 &&
    check pp2_init_from_run_vs_1 "$tmp/ft_one" "$tmp/ft_pp" "$tmp/ft_pp.log"

# The combination of streamed checkpoints (no rank holds the whole model:
# docs/dist.md "Memory per rank and checkpoints of sharded layouts") with
# ZeRO over the tp and pp replicas: before the units are gathered every
# rank assembles its part over its dp group, and a resume reads the units
# into part-sized buffers and keeps its ZeRO share. A tp2 x dp2 --zero 3
# and a pp2 x dp2 --zero 2 run each checkpoint step 2, which continues in
# one process with the one process's losses and final weights; and rank
# 0's peak resident memory (the trainer's VmHWM report) exceeds the
# highest other rank's by less than 2P bytes (half the whole model's
# weights; a whole copy on rank 0 would be 4P or more: test_dist_mem.sh).
# Weights within 3e-5: at this width (C = 256) the tp2 layout itself ends
# 8.5e-6 from one process after 4 steps (its sums run in another order),
# too near dist_compare's default 1e-5 to be a stable bound.
L=4; C=256; P=$(( 12 * L * C * C + 320 * C ))
M=(--layers $L --channels $C --heads 4 --context 32 --seq 16 --steps 4 --ckpt-every 2 --grad-accum 2 --eval-every 0)
mem_check() { # NAME LOG
    local line
    line=$(grep -oE 'peak resident memory \(VmHWM\) per rank: .*' "$2")
    $PY - "$1" "$P" "$line" <<'PY'
import re, sys
name, P, line = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mb = [float(x) for x in re.findall(r"rank \d+ ([0-9.]+) MB", line)]
ok = len(mb) == 4 and mb[0] - max(mb[1:]) < 2 * P / 1e6
print(f"{'PASS' if ok else 'FAIL'} {name} (per rank {mb} MB: rank 0 above the others' highest by "
      f"{mb[0] - max(mb[1:]) if len(mb) > 1 else 0:.1f} MB, limit 2P = {2 * P / 1e6:.1f} MB)")
PY
}
if run big_one "${M[@]}" --batch 4; then
    for lay in tp2_zero3 pp2_zero2; do
        fl=(--${lay:0:2} 2 --zero ${lay: -1})
        run big_$lay "${M[@]}" --batch 2 --nproc 4 "${fl[@]}" || continue
        mem_check ${lay:0:3}xdp2_zero${lay: -1}_rank0_no_whole_copy "$tmp/big_$lay.log"
        cp -r "$tmp/big_$lay" "$tmp/big_${lay}_1"
        run big_${lay}_1 "${M[@]}" --batch 2 --resume step_2 &&
            check ${lay:0:3}xdp2_zero${lay: -1}_ckpt_continues_in_1 "$tmp/big_one" "$tmp/big_${lay}_1" "$tmp/big_${lay}_1.log" --losses 4 --weight-tol 3e-5
    done
fi
