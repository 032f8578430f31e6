#!/usr/bin/env bash
# Fuzz the request parser of `loom serve` (tests/fuzz/fuzz_request.c) with
# libFuzzer (Debian's clang and libclang-rt-14-dev), under ASan and UBSan.
#   bench/fuzz-serve.sh [SECONDS]     (default 180)
# Builds into build-fuzz/, seeds the corpus with valid and broken requests,
# prints libFuzzer's summary: executions, speed, crashes (a crash leaves
# its input as build-fuzz/crash-*). Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-180}
if ! command -v clang >/dev/null; then
    echo "fuzz-serve: clang is missing (apt-get install clang libclang-rt-14-dev)"; exit 2
fi
mkdir -p build-fuzz/corpus
clang -g -O1 -DLOOM_FUZZ_REQUEST_ALONE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
    tests/fuzz/fuzz_request.c src/serve/http_api.c src/core/core.c src/core/mem.c -lcjson -lm -lpthread \
    -o build-fuzz/fuzz_request
c=build-fuzz/corpus
printf '%s' '{"prompt":"In the beginning","max_tokens":50,"stream":true}' > $c/a
printf '%s' '{"model":"kjv","prompt":["a","b"],"n":2,"stop":["x","y"],"logprobs":3,"echo":true,"seed":7}' > $c/b
printf '%s' '{"prompt":[[1,2,3],[4]],"temperature":0.5,"top_p":0.9,"top_k":40,"stream_options":{"include_usage":true}}' > $c/c
printf '%s' '{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"logprobs":true,"top_logprobs":2}' > $c/d
printf '%s' '{"prompt":"\u00e9\ud83d\ude00","max_completion_tokens":3,"presence_penalty":0,"best_of":1,"ignore_eos":true}' > $c/e
printf '%s' '{"prompt": "a", "max_tok' > $c/f
cat > build-fuzz/json.dict <<'D'
"{"
"}"
"["
"]"
":"
","
"\"prompt\""
"\"messages\""
"\"role\""
"\"content\""
"\"max_tokens\""
"\"temperature\""
"\"top_p\""
"\"top_k\""
"\"stop\""
"\"stream\""
"\"stream_options\""
"\"include_usage\""
"\"seed\""
"\"n\""
"\"logprobs\""
"\"top_logprobs\""
"\"echo\""
"\"model\""
"true"
"false"
"null"
"1e309"
"-0"
"\"\\ud800\""
D
echo "fuzz-serve: $SECS s on build-fuzz/fuzz_request"
build-fuzz/fuzz_request -max_total_time="$SECS" -max_len=4096 -dict=build-fuzz/json.dict -artifact_prefix=build-fuzz/ \
    -print_final_stats=1 $c 2>&1 | tee build-fuzz/last.log | grep -E "stat::|Done|ERROR|crash|SUMMARY" || true
crashes=$( (ls build-fuzz/crash-* build-fuzz/leak-* build-fuzz/timeout-* 2>/dev/null || true) | wc -l)
echo "fuzz-serve: $crashes crashing inputs"
[ "$crashes" -eq 0 ]
