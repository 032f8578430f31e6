#!/bin/bash
# loom pipeline-parallel training under Open MPI: one stage per rank
# (--pp = NP), ranks placed in hostfile order so consecutive stages sit on
# the same or neighbouring hosts. Extra arguments go to `loom train`.
#   NP=4 HOSTFILE=hosts deploy/mpi/train-pipeline.sh --data data/web --model gpt2-medium --grad-accum 32 --out runs/web-pp4
# Without HOSTFILE the ranks run on this machine. LOOM names the binary
# (default: loom on PATH); threads per rank default to the cores / NP.
set -eu
LOOM=${LOOM:-loom}
NP=${NP:-2}
HOSTS=()
[ -n "${HOSTFILE:-}" ] && HOSTS=(--hostfile "$HOSTFILE")
THREADS=${THREADS:-$(( $(nproc) / NP > 0 ? $(nproc) / NP : 1 ))}
exec mpirun -np "$NP" "${HOSTS[@]}" --map-by slot --bind-to none \
     "$LOOM" train --threads "$THREADS" --pp "$NP" --dist-timeout 600 "$@"
