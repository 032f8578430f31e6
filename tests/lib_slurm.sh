# Sourced by the Slurm tests: start a real single-node Slurm (munged,
# slurmctld, slurmd configured for this host in a temporary folder $tmp,
# ports picked free, nothing system-wide touched) and export SLURM_CONF.
# Set SLURM_TEST (the test's name, for SKIP lines) and SLURM_EXTRA_CONF
# (more slurm.conf lines) before sourcing. Exits with a SKIP line when the
# packages are missing or the daemons cannot start here. The caller's EXIT
# trap must call slurm_cleanup.
for b in munged slurmctld slurmd sbatch squeue scontrol; do
    command -v $b >/dev/null || { echo "SKIP ${SLURM_TEST}: $b not installed (scripts/deps.sh installs slurmctld slurmd slurm-client munge)"; exit 0; }
done
tmp=$(mktemp -d /tmp/loom-slurm-XXXXXX)
pids=()
slurm_cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    [ -f "$tmp/munged.pid" ] && kill "$(cat "$tmp/munged.pid")" 2>/dev/null
    sleep 0.3
    rm -rf "$tmp"
}
trap slurm_cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/munge"
chmod 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$tmp/munge/munge.key"
if ! munged --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.sock" \
       --pid-file="$tmp/munged.pid" --log-file="$tmp/munged.log" --seed-file="$tmp/munge/seed" 2>"$tmp/munged.err"; then
    echo "SKIP ${SLURM_TEST}: munged cannot start here: $(head -c 200 "$tmp/munged.err")"; exit 0
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
${SLURM_EXTRA_CONF:-}
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -f "$tmp/slurm.conf" > "$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$tmp/slurm.conf" > "$tmp/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 1 240); do # a guard: the node coming up ends it
    if sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then up=1; break; fi
    for p in "${pids[@]}"; do [ -d /proc/$p ] || break 2; done
    sleep 0.5
done
if [ $up = 0 ]; then
    why=$(cat "$tmp/slurmctld.out" "$tmp/slurmd.out" "$tmp/slurmctld.log" "$tmp/slurmd.log" 2>/dev/null | grep -iE "error|fatal" | head -2 | tr '\n' ' ')
    echo "SKIP ${SLURM_TEST}: slurmctld/slurmd did not bring the node up here: ${why:-no node after 120 s}"; exit 0
fi

# slurm_wait JOB: wait until JOB leaves the queue (the loop's 600 s is a
# guard against a hang, not a measure), then print its JobState=... field.
slurm_wait() {
    for _ in $(seq 1 1200); do
        squeue -h -j "$1" 2>/dev/null | grep -q . || break
        sleep 0.5
    done
    scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z]*' | head -1
}
