#!/usr/bin/env bash
# Spot-ready Slurm (issue 17): deploy/slurm/train-spot.sbatch on a real
# single-node Slurm. (a) `scontrol requeue` of the running job (what
# preemption with PreemptMode=REQUEUE does: SIGTERM, then the job goes back
# to the queue) and (b) SIGTERM to the batch shell alone (what
# --signal=B:TERM@120 sends before the time limit; the script requeues
# itself) must both end with the job COMPLETED, a resume in its log, and
# final weights bit-identical to an uninterrupted run of the same command.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
LOOM=${LOOM:-$PWD/build/loom}
SLURM_TEST=ft_slurm
SLURM_EXTRA_CONF="KillWait=20"
source tests/lib_slurm.sh
/usr/bin/python3 -c "import random; random.seed(7); print(' '.join(random.choice(['in','the','beginning','God','created','heaven','and','earth.']) for _ in range(40000)))" > "$tmp/text.txt"
STEPS=300
A=(--data "$tmp/text.txt" --layers 2 --channels 64 --heads 2 --context 64 --batch 4 --seq 64 --steps $STEPS --warmup 5
   --lr 1e-3 --ckpt-every 20 --eval-every 0 --sample-tokens 0 --log-every 50)
$LOOM train --resume auto "${A[@]}" --threads 1 --out "$tmp/ref" > "$tmp/ref.log" 2>&1 || { echo "FAIL ft_slurm_reference: $(tail -2 "$tmp/ref.log")"; exit 0; }
final=checkpoints/step_$(printf %08d $STEPS)/model.safetensors

# spot NAME HOW: submit, wait until the run holds after 25% of the steps,
# interrupt by HOW, wait for the end. LOOM_TEST_HOLD_AFTER_STEP (sbatch
# passes the environment on) makes the first attempt wait there for the
# signal, so a fast machine cannot finish all the steps before the
# interruption lands; the resumed attempt starts after that step and runs on.
spot() {
    local name=$1 how=$2 out="$tmp/$1"
    local job
    job=$(cd "$tmp" && LOOM=$LOOM LOOM_TEST_HOLD_AFTER_STEP=$((STEPS / 4)) sbatch --parsable --chdir="$tmp" --output="$tmp/$name.out" \
          --cpus-per-task=1 "$ROOT/deploy/slurm/train-spot.sbatch" "${A[@]}" --out "$out" 2>"$tmp/$name.err")
    [ -n "$job" ] || { echo "FAIL ft_slurm_$name: sbatch: $(cat "$tmp/$name.err")"; return; }
    for _ in $(seq 1 3000); do # a guard only: the hold line ends it
        grep -q "holding after step $((STEPS / 4))" "$tmp/$name.out" 2>/dev/null && break
        sleep 0.1
    done
    if [ "$how" = requeue ]; then scontrol requeue "$job"; else scancel --batch --signal=TERM "$job"; fi
    local state=""
    for _ in $(seq 1 900); do
        state=$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -1)
        # A requeued job waits for its begin time; let it go at once.
        if [ "$state" = JobState=PENDING ]; then scontrol update JobId="$job" StartTime=now > /dev/null 2>&1; fi
        [ "$state" = JobState=COMPLETED ] || [ "$state" = JobState=FAILED ] || [ "$state" = JobState=CANCELLED ] && break
        sleep 0.2
    done
    if [ "$state" = JobState=COMPLETED ] && grep -q "restart 1" "$tmp/$name.out" && grep -q "resuming" "$tmp/$name.out" &&
       cmp -s "$tmp/ref/$final" "$out/$final"; then
        echo "PASS ft_slurm_${name}_resumes_to_the_uninterrupted_weights ($(grep -m1 -o 'resuming .* from step [0-9]*' "$tmp/$name.out" | grep -o 'step [0-9]*'))"
    else
        echo "FAIL ft_slurm_$name: $state; $(grep -c 'loom-spot: job' "$tmp/$name.out" 2>/dev/null) start(s); weights $(cmp -s "$tmp/ref/$final" "$out/$final" && echo same || echo differ)"
        tail -5 "$tmp/$name.out" 2>/dev/null
    fi
}
spot requeue requeue
spot timelimit batch-term
