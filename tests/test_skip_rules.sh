#!/usr/bin/env bash
# SKIP means "not available", never "something failed" (issue 9, part 5):
# - check_available: another error FAILS; LOOM_EUNAVAIL SKIPs, and a GPU
#   one FAILS under LOOM_REQUIRE_GPU=1 while a non-GPU one still SKIPs;
# - LOOM_REQUIRE_GPU=1 leaves no GPU case of test_cuda_model skipped;
# - tests/run.sh fails when a test binary is missing and when no case ran;
# - the tokenizer oracle test fails when the oracle produced nothing.
set -u
cd "$(dirname "$0")/.."
B=${LOOM_TEST_BUILD:-build}/tests
tmp=$(mktemp -d /tmp/loom-test-skip-rules-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "PASS $1"; }
bad() { echo "FAIL $1: $2"; }

out=$("$B/test_ops_list" --check-rules 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q '^FAIL rule_other_error_fails: status' <<<"$out" &&
   grep -q '^SKIP rule_unavailable_gpu_skips: made-up: no GPU' <<<"$out" &&
   grep -q '^SKIP rule_unavailable_part_skips' <<<"$out"; then ok skip_only_when_unavailable
else bad skip_only_when_unavailable "rc $rc: $out"; fi

out=$(LOOM_REQUIRE_GPU=1 "$B/test_ops_list" --check-rules 2>&1)
if grep -q '^FAIL rule_unavailable_gpu_skips: LOOM_REQUIRE_GPU=1' <<<"$out" && grep -q '^SKIP rule_unavailable_part_skips' <<<"$out"; then
    ok require_gpu_turns_gpu_skips_into_fails
else bad require_gpu_turns_gpu_skips_into_fails "$out"; fi

# Under LOOM_REQUIRE_GPU=1 no GPU case of test binary $2 skips, and a FAIL
# line makes it exit non-zero.
require_gpu_case() { # case name, binary
    local out rc
    out=$(LOOM_REQUIRE_GPU=1 "$B/$2" 2>&1); rc=$?
    if grep -q '^SKIP cuda_' <<<"$out"; then bad "$1" "GPU cases still skipped: $(grep '^SKIP cuda_' <<<"$out" | head -1)"
    elif grep -q '^FAIL cuda_' <<<"$out" && [ $rc -eq 0 ]; then bad "$1" "FAIL lines but exit status 0"
    else ok "$1"; fi
}
require_gpu_case require_gpu_cuda_model test_cuda_model
require_gpu_case require_gpu_cuda_ops test_cuda_ops

mkdir -p "$tmp/emptybuild/tests"
out=$(LOOM_TEST_BUILD="$tmp/emptybuild" tests/run.sh test_ops_list 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'FAIL test_ops_list: .* is not built' <<<"$out"; then ok run_sh_fails_on_missing_binary
else bad run_sh_fails_on_missing_binary "rc $rc: $(tail -2 <<<"$out")"; fi

out=$(tests/run.sh no_such_test_matches_this 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'FAIL run.sh: no test case ran' <<<"$out"; then ok run_sh_fails_when_nothing_ran
else bad run_sh_fails_when_nothing_ran "rc $rc: $(tail -2 <<<"$out")"; fi

# A python that imports anything and whose oracle writes nothing.
cat > "$tmp/python" <<'PY'
#!/bin/sh
exit 0
PY
chmod +x "$tmp/python"
out=$(LOOM_PYTHON="$tmp/python" "$B/test_oracle_tokenizer" 2>&1); rc=$?
if [ $rc -ne 0 ] && ! grep -q '^PASS' <<<"$out" && ! grep -q '^SKIP' <<<"$out" && grep -q 'produced 0 bytes' <<<"$out"; then
    ok oracle_that_produced_nothing_fails
else bad oracle_that_produced_nothing_fails "rc $rc: $out"; fi
