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
