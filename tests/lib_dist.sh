# lib_dist.sh: what the distributed-training oracle tests share, sourced
# from the repository root as `. tests/lib_dist.sh PREFIX` (PREFIX names the
# test in SKIP and FAIL lines): $tmp (removed at exit, with a background
# loom in $pid stopped) holding data.txt (a word stream), $LOOM, $PY (the
# python that reads safetensors: without numpy and safetensors the test
# SKIPs here), and two functions:
#   run NAME ARGS...              loom train "${A[@]}" ARGS into $tmp/NAME, its log $tmp/NAME.log
#   check NAME RUN_A RUN_B LOG [dist_compare.py flags]
#                                 PASS/FAIL: the first 10 losses within 1e-5 relative and
#                                 the final weights within 1e-5 (tests/dist_compare.py)
dist_prefix=$1
LOOM=${LOOM:-$PWD/build/loom}
tmp=$(mktemp -d "/tmp/loom-$dist_prefix-XXXXXX")
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
python3 -c "import random; random.seed(1); print(' '.join(random.choice(['the','word','of','light','and','darkness','in','beginning']) for _ in range(40000)))" > "$tmp/data.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
PY=/usr/bin/python3
export PYTHONPATH=$PWD/.deps/hf${PYTHONPATH:+:$PYTHONPATH}
if ! $PY -c "import numpy, safetensors" 2>/dev/null; then
    echo "SKIP $dist_prefix: /usr/bin/python3 lacks numpy or safetensors (scripts/deps.sh installs them into .deps/hf)"; exit 0
fi

check() {
    local out name=$1 a=$2 b=$3 log=$4; shift 4
    if out=$($PY tests/dist_compare.py "$a" "$b" "$@" 2>&1); then echo "PASS $name ($out)"; else echo "FAIL $name: $out"; tail -5 "$log"; fi
}

run() {
    local name=$1; shift
    $LOOM train "${A[@]}" "$@" --out "$tmp/$name" > "$tmp/$name.log" 2>&1 ||
        { echo "FAIL ${dist_prefix}_run_$name: $(tail -3 "$tmp/$name.log")"; return 1; }
}
