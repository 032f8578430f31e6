# Shared by the fault and input tests (sourced): PASS/FAIL lines, and
# expect_fail NAME PATTERN CMD...: CMD must exit 1..125 (no crash) with
# PATTERN in its output.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
expect_fail() {
    local name=$1 pat=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -ge 1 ] && [ $rc -le 125 ] && printf '%s' "$out" | grep -q -- "$pat"; then pass "$name"
    else fail "$name" "exit $rc: $(printf '%s' "$out" | tail -2)"; fi
}
