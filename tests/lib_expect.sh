# Shared by the fault and input tests (sourced): PASS/FAIL lines, and
# expect_fail NAME PATTERN CMD...: CMD must exit 1..125 (no crash) with
# PATTERN in its output; expect_exit CODE NAME PATTERN CMD...: exactly CODE.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
expect_fail() { expect_exit 1-125 "$@"; }
expect_exit() {
    local code=$1 name=$2 pat=$3; shift 3
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -ge "${code%-*}" ] && [ $rc -le "${code#*-}" ] && printf '%s' "$out" | grep -q -- "$pat"; then pass "$name"
    else fail "$name" "exit $rc: $(printf '%s' "$out" | tail -2)"; fi
}
