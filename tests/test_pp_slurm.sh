#!/usr/bin/env bash
# deploy/slurm/train-pipeline.sbatch on a real single-node Slurm (tests/lib_slurm.sh):
# 2 tasks become a 2-stage pipeline (--pp = the task count) that finishes its
# steps with one metrics line each; SKIP with the reason when Slurm is absent.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$PWD/build/loom}
SLURM_TEST=pp_slurm
source tests/lib_slurm.sh
python3 -c "print('in the beginning was the word ' * 4000)" > "$tmp/data.txt"
job=$(cd "$tmp" && LOOM=$LOOM LOOM_DEVICE=cpu sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --chdir="$tmp" \
      --output="$tmp/job.out" "$ROOT/deploy/slurm/train-pipeline.sbatch" --data "$tmp/data.txt" --out "$tmp/run" \
      --layers 2 --channels 64 --heads 2 --context 64 --seq 64 --batch 2 --grad-accum 4 --steps 6 --warmup 2 \
      --eval-every 0 --sample-tokens 0 --log-every 1 --dist-timeout 600 2>"$tmp/sbatch.err")
if [ -z "$job" ]; then echo "FAIL pp_slurm_submit: $(cat "$tmp/sbatch.err")"; exit 0; fi
state=$(slurm_wait "$job") # waits for the job to leave the queue
if grep -q "pipeline 2 stages over 2 layers" "$tmp/job.out" 2>/dev/null && grep -q "loom train: done: 6 steps" "$tmp/job.out" \
   && [ "$(grep -c '"bubble_s"' "$tmp/run/metrics.jsonl" 2>/dev/null)" = 6 ]; then
    echo "PASS pp_slurm_sbatch_2_stages ($state)"
else
    echo "FAIL pp_slurm_sbatch_2_stages: $state"; tail -5 "$tmp/job.out" 2>/dev/null
fi

# deploy/slurm/train-3d.sbatch: the node's 2 tasks become one tensor-parallel
# group (--tp = tasks per node; LOOM_PP=1: this one-node Slurm has 2 CPUs and
# refuses a third task), the run finishing its steps with tp communication
# in every metrics line.
job=$(cd "$tmp" && LOOM=$LOOM LOOM_DEVICE=cpu LOOM_PP=1 sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
      --chdir="$tmp" --output="$tmp/job3d.out" "$ROOT/deploy/slurm/train-3d.sbatch" --data "$tmp/data.txt" \
      --out "$tmp/run3d" --layers 2 --channels 64 --heads 2 --context 64 --seq 64 --batch 2 --grad-accum 4 --steps 4 --warmup 2 \
      --eval-every 0 --sample-tokens 0 --log-every 1 2>"$tmp/sbatch3d.err")
if [ -z "$job" ]; then echo "FAIL pp_slurm_3d_submit: $(cat "$tmp/sbatch3d.err")"; exit 0; fi
state=$(slurm_wait "$job") # waits for the job to leave the queue
if grep -q "loom train: done: 4 steps" "$tmp/job3d.out" 2>/dev/null && [ "$(grep -c '"comm_tp_s"' "$tmp/run3d/metrics.jsonl" 2>/dev/null)" = 4 ]; then
    echo "PASS pp_slurm_sbatch_3d_tp_per_node ($state)"
else
    echo "FAIL pp_slurm_sbatch_3d_tp_per_node: $state"; tail -5 "$tmp/job3d.out" 2>/dev/null
fi
