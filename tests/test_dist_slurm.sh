#!/usr/bin/env bash
# A real single-node Slurm: munged, slurmctld and slurmd configured for this
# host in a temporary folder (ports picked free, nothing system-wide
# touched), then deploy/slurm/train-single-node.sbatch runs 2 tasks and the
# job must finish with the expected log. SKIP with the reason when the
# packages are missing or the daemons cannot start here.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$PWD/build/loom}
SLURM_TEST=dist_slurm
source tests/lib_slurm.sh
if command -v bible >/dev/null; then bible Gen1:1-Rev22:21 </dev/null | head -c 100000 > "$tmp/data.txt"
else python3 -c "print('in the beginning was the word ' * 4000)" > "$tmp/data.txt"; fi
job=$(cd "$tmp" && LOOM=$LOOM sbatch --parsable --chdir="$tmp" --output="$tmp/job.out" \
      "$ROOT/deploy/slurm/train-single-node.sbatch" --data "$tmp/data.txt" --out "$tmp/run" \
      --layers 2 --channels 64 --heads 2 --context 64 --seq 64 --batch 2 --steps 10 --warmup 2 \
      --eval-every 0 --sample-tokens 0 --log-every 1 --dist-timeout 600 2>"$tmp/sbatch.err")
if [ -z "$job" ]; then echo "FAIL dist_slurm_submit: $(cat "$tmp/sbatch.err")"; exit 0; fi
state=$(slurm_wait "$job") # waits for the job to leave the queue
if grep -q "2 ranks over tcp" "$tmp/job.out" 2>/dev/null && grep -q "loom train: done: 10 steps" "$tmp/job.out" \
   && [ "$(grep -c '"loss"' "$tmp/run/metrics.jsonl" 2>/dev/null)" = 10 ]; then
    echo "PASS dist_slurm_sbatch_2_tasks ($state; $(grep -m1 'ranks over' "$tmp/job.out" | cut -c1-80))"
else
    echo "FAIL dist_slurm_sbatch_2_tasks: $state"; tail -5 "$tmp/job.out" 2>/dev/null; tail -3 "$tmp/slurmd.log" 2>/dev/null
fi
