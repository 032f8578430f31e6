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
for b in munged slurmctld slurmd sbatch squeue scontrol; do
    command -v $b >/dev/null || { echo "SKIP dist_slurm: $b not installed (scripts/deps.sh installs slurmctld slurmd slurm-client munge)"; exit 0; }
done
tmp=$(mktemp -d /tmp/loom-slurm-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    [ -f "$tmp/munged.pid" ] && kill "$(cat "$tmp/munged.pid")" 2>/dev/null
    sleep 0.3
    rm -rf "$tmp"
}
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/munge"
chmod 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$tmp/munge/munge.key"
if ! munged --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.sock" \
       --pid-file="$tmp/munged.pid" --log-file="$tmp/munged.log" --seed-file="$tmp/munge/seed" 2>"$tmp/munged.err"; then
    echo "SKIP dist_slurm: munged cannot start here: $(head -c 200 "$tmp/munged.err")"; exit 0
fi
user=$(id -un)
cat > "$tmp/slurm.conf" <<EOF
ClusterName=loomtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$user
SlurmdUser=root
SlurmctldPort=$(freeport)
SlurmdPort=$(freeport)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=loom Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -f "$tmp/slurm.conf" > "$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$tmp/slurm.conf" > "$tmp/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 1 60); do
    if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then up=1; break; fi
    for p in "${pids[@]}"; do [ -d /proc/$p ] || break 2; done
    sleep 0.5
done
if [ $up = 0 ]; then
    why=$(cat "$tmp/slurmctld.out" "$tmp/slurmd.out" "$tmp/slurmctld.log" "$tmp/slurmd.log" 2>/dev/null | grep -iE "error|fatal" | head -2 | tr '\n' ' ')
    echo "SKIP dist_slurm: slurmctld/slurmd did not bring the node up here: ${why:-no node after 30 s}"; exit 0
fi
if command -v bible >/dev/null; then bible Gen1:1-Rev22:21 </dev/null | head -c 100000 > "$tmp/data.txt"
else python3 -c "print('in the beginning was the word ' * 4000)" > "$tmp/data.txt"; fi
job=$(cd "$tmp" && LOOM=$LOOM sbatch --parsable --chdir="$tmp" --output="$tmp/job.out" \
      "$ROOT/deploy/slurm/train-single-node.sbatch" --data "$tmp/data.txt" --out "$tmp/run" \
      --layers 2 --channels 64 --heads 2 --context 64 --seq 64 --batch 2 --steps 10 --warmup 2 \
      --eval-every 0 --sample-tokens 0 --log-every 1 --dist-timeout 30 2>"$tmp/sbatch.err")
if [ -z "$job" ]; then echo "FAIL dist_slurm_submit: $(cat "$tmp/sbatch.err")"; exit 0; fi
for _ in $(seq 1 240); do
    squeue -h -j "$job" 2>/dev/null | grep -q . || break
    sleep 0.5
done
state=$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z]*' | head -1)
if grep -q "2 ranks over tcp" "$tmp/job.out" 2>/dev/null && grep -q "loom train: done: 10 steps" "$tmp/job.out" \
   && [ "$(grep -c '"loss"' "$tmp/run/metrics.jsonl" 2>/dev/null)" = 10 ]; then
    echo "PASS dist_slurm_sbatch_2_tasks ($state; $(grep -m1 'ranks over' "$tmp/job.out" | cut -c1-80))"
else
    echo "FAIL dist_slurm_sbatch_2_tasks: $state"; tail -5 "$tmp/job.out" 2>/dev/null; tail -3 "$tmp/slurmd.log" 2>/dev/null
fi
