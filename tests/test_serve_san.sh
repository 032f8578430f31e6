#!/usr/bin/env bash
# The concurrency, disconnect and bad-input parts of test_serve.sh against
# the AddressSanitizer/UBSan build (make SANITIZE=address,undefined, into
# build-san/); skipped when that build is absent.
set -u
cd "$(dirname "$0")/.."
if [ ! -x build-san/loom ]; then
    echo "SKIP serve_san: build-san/loom is not built (make SANITIZE=address,undefined)"; exit 0
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} LOOM_SANITIZED=1
LOOM=build-san/loom SERVE_PARTS="concurrency disconnect badinput" bash tests/test_serve.sh
