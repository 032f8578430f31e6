# Sourced by bench/gpu-check.sh on the GPU machine: one function per kind
# of row (ROW_SPECS in gpu-check.sh names them). Each runs its commands
# through `run LIMIT NAME ...` (its own time limit) and ends with one `row`
# line. Uses BIN, BUNDLE, WORK, PY, OUTDIR, OPS_FILTER from gpu-check.sh.

limit_of() { spec_field "$(spec_of "$1")" 3; }

ok_no_skip() { # RC LOG: ok only when it exited 0 with no FAIL and no SKIP line
    local rc=$1 f=$2
    if [ "$rc" = 0 ] && [ "$(count FAIL "$f")" = 0 ] && [ "$(count SKIP "$f")" = 0 ] && [ "$(count PASS "$f")" -gt 0 ]; then
        echo ok
    elif [ "$rc" = 0 ]; then echo FAIL; else verdict "$rc"; fi
}

row_devices() {
    [ -n "$BIN" ] || { row devices FAIL "no loom binary"; return; }
    run "$(limit_of devices)" devices "$BIN/loom" devices
    local rc=$?
    if [ $rc = 0 ] && grep -q 'cuda:0' "$WORK/devices.log"; then
        row devices ok "$(grep -m1 'cuda:0' "$WORK/devices.log" | sed 's/^ *//' | cut -c1-160)"
    else
        row devices "$(verdict $((rc == 0 ? 1 : rc)))" "$(why "$WORK/devices.log")"
    fi
}

# row_test NAME [BINARY FILTER]: a C test binary (NAME, or BINARY under
# the row's NAME with LOOM_CUDA_OPS_ONLY=FILTER); the failing cases by
# name in the table
row_test() {
    local name=$1 bin=${2:-$1} filter=${3:-} rc f names
    if [ -z "$BIN" ] || [ ! -x "$BIN/tests/$bin" ]; then
        row "$name" FAIL "not built"
        return
    fi
    local only=()
    [ "$name" = test_cuda_ops ] && filter=$OPS_FILTER
    [ -n "$filter" ] && only=(LOOM_CUDA_OPS_ONLY="$filter")
    run "$(limit_of "$name")" "$name" env "${only[@]}" "$BIN/tests/$bin"
    rc=$? f="$WORK/$name.log"
    names=$(failing_cases "$f" "$name")
    grep -E '^(FAIL|SKIP)|check failed|fatal' "$f" | head -n 20 | sed 's/^/    /'
    row "$name" "$(ok_no_skip $rc "$f")" "$(count PASS "$f") passed, $(count FAIL "$f") failed, $(count SKIP "$f") skipped${names:+: $names}$([ $rc = 124 ] && echo "; stopped at its limit in: $(grep -E '^(PASS|FAIL|SKIP) ' "$f" | tail -n 1 | cut -c1-60)")"
}

# loom bench train on GPT-2 124M, T=1024, bf16 at GPU_CHECK_BATCH (32 fits
# an H200's 141 GB with room; halved once when it does not fit)
LOOM_TPS="" BATCH=""
bench_loom() { # NAME B ENV...: one bench train run; sets LINE, TPS
    local name=$1 b=$2; shift 2
    run "$(limit_of bench_train)" "$name" env "$@" "$BIN/loom" bench train --device cuda --dtype bf16 --model gpt2-small \
        --seq 1024 --batch "$b" --steps 5 --rounds 2 --torch off
    local rc=$?
    LINE=$(grep -E '^ *loom cuda' "$WORK/$name.log" | tail -n 1 | sed 's/^ *//')
    TPS=$(printf '%s\n' "$LINE" | awk '$4 ~ /^[0-9.]+$/ { print $4 }')
    return $rc
}
row_bench_train() {
    [ -n "$BIN" ] || { row bench_train FAIL "no loom binary"; return; }
    local b=${GPU_CHECK_BATCH:-32} rc
    bench_loom bench_train "$b" LOOM_GPU_CHECK=1; rc=$?
    if [ $rc != 0 ] && grep -qiE 'out of memory|no room' "$WORK/bench_train.log"; then
        b=$((b / 2))
        bench_loom bench_train "$b" LOOM_GPU_CHECK=1; rc=$?
    fi
    if [ $rc = 0 ] && [ -n "$TPS" ]; then
        LOOM_TPS=$TPS BATCH=$b
        row bench_train ok "B=$b: $LINE"
    else
        row bench_train "$(verdict $((rc == 0 ? 1 : rc)))" "B=$b: $(why "$WORK/bench_train.log")"
    fi
}
row_bench_fp32acts() {
    bench_loom bench_train_fp32acts "$BATCH" LOOM_CUDA_ACTIVATIONS=fp32
    local rc=$?
    if [ $rc = 0 ] && [ -n "$TPS" ]; then
        row bench_train_fp32acts info "B=$BATCH, fp32 activations: $LINE; bf16 activations $(awk -v a="$LOOM_TPS" -v b="$TPS" 'BEGIN { printf "%.2fx", a / b }') of it"
    else
        row bench_train_fp32acts "$(verdict $((rc == 0 ? 1 : rc)))" "$(why "$WORK/bench_train_fp32acts.log")"
    fi
}

# PyTorch on the same GPU at loom's batch: eager, and torch.compile whose
# compile time is bounded by its row's limit
row_torch() {
    local mode=$1 name=torch_$1 b=${BATCH:-${GPU_CHECK_BATCH:-32}} line tps rc
    if [ -z "$PY" ] || ! "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        row "$name" FAIL "no python3 with CUDA-enabled PyTorch here"
        return
    fi
    run "$(limit_of "$name")" "$name" "$PY" bench/torch_gpu.py "$b" 5 "$mode"; rc=$?
    line=$(grep "^torch-$mode:" "$WORK/$name.log" | tail -n 1)
    row "$name" "$(verdict $rc)" "${line:-$(why "$WORK/$name.log")}"
    tps=$(printf '%s\n' "$line" | grep -oE '[0-9]+ tok/s' | grep -oE '^[0-9]+')
    if [ -n "$LOOM_TPS" ] && [ -n "$tps" ]; then
        row "loom/$name" info "$(awk -v a="$LOOM_TPS" -v b="$tps" 'BEGIN { printf "%.2fx tokens/s", a / b }')$([ "$mode" = compile ] && echo " (goal: 1.10x torch.compile)")"
    fi
}

row_tokenize() {
    [ -n "$BIN" ] || { row tokenize FAIL "no loom binary"; return; }
    run "$(limit_of tokenize)" tokenize "$BIN/loom" tokenize --input "$WORK/kjv.txt" --vocab 2048 --val-fraction 0.05 \
        --out "$WORK/kjv"
    local rc=$?
    row tokenize "$(verdict $rc)" "$([ $rc = 0 ] && echo "the bundled corpus, vocab 2048" || why "$WORK/tokenize.log")"
}

train_summary() { # RUN_DIR: one line; exit 1 when the run did not learn
    "$PY" - "$1" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l]
cfg = json.load(open(sys.argv[1] + "/config.json"))
losses = [r["loss"] for r in rows if r.get("loss") is not None]
skipped = sum(1 for r in rows if r.get("skipped"))
scale = rows[-1].get("loss_scale") if rows else None
ok = len(losses) >= 90 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.5
print(f"{cfg.get('dtype')}, graphs {cfg.get('cuda_graphs')}, recompute {cfg.get('recompute')}: {len(losses)} steps, "
      f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {rows[-1].get('tokens_per_s', 0):.0f} tok/s"
      + (f", loss scale {scale:g}, {skipped} skipped" if scale is not None else ""))
sys.exit(0 if ok else 1)
PY
}
compare_losses() { # A B BOUND: the relative loss difference per step stays under BOUND
    "$PY" - "$@" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l] for d in sys.argv[1:3])
bound = float(sys.argv[3])
if not a or len(a) != len(b):
    print(f"FAIL {len(a)} and {len(b)} steps"); sys.exit(1)
worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
print(f"max relative loss difference {worst:.2e} over {len(a)} steps (bound {bound:g})")
sys.exit(0 if worst <= bound else 1)
PY
}
# Loss curves against train_bf16 (graphs on), with the bounds of
# docs/cuda.md ("What must be bitwise, what may drift").
declare -A CURVE_BOUND=([graphs_off]="graphs_vs_plain 0" [recompute]="recompute_vs_keep 2e-2"
    [fp32acts]="bf16_acts_vs_fp32_acts 2e-2" [fp32]="bf16_vs_fp32 3e-2")

# row_train NAME ENV ARGS...: 100 steps of gpt2-tiny (or ARGS' --model) on
# the bundled corpus
row_train() {
    local name=$1 envs=$2 rc line label bound; shift 2
    [ "$envs" = - ] && envs=LOOM_GPU_CHECK=1
    [ -n "$PY" ] || { row "train_$name" FAIL "no python3 to read the metrics"; return; }
    run "$(limit_of "train_$name")" "train_$name" env "$envs" "$BIN/loom" train --data "$WORK/kjv" --model gpt2-tiny \
        --steps 100 --batch 8 --seq 256 --warmup 10 --eval-every 0 --sample-tokens 0 --ckpt-every 0 --seed 7 --force \
        --device cuda --log-every 10 --out "$WORK/run_$name" "$@"
    rc=$?
    if [ $rc = 0 ]; then
        line=$(train_summary "$WORK/run_$name" 2>&1); rc=$?
        # graphs asked for must be what ran (the run's config says)
        case " $* " in *" --cuda-graphs on "*)
            case "$line" in *"graphs True"*) ;; *) rc=1 line="--cuda-graphs on, but the run's config says: $line" ;; esac ;;
        esac
        row "train_$name" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$line"
    else
        row "train_$name" "$(verdict $rc)" "$(why "$WORK/train_$name.log")"
    fi
    [ -n "${CURVE_BOUND[$name]:-}" ] && [ -f "$WORK/run_$name/metrics.jsonl" ] || return 0
    read -r label bound <<<"${CURVE_BOUND[$name]}"
    line=$(compare_losses "$WORK/run_bf16" "$WORK/run_$name" "$bound" 2>&1); rc=$?
    row "$label" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$line"
}

# loom serve on train_bf16's run, on the GPU: one completion over HTTP
row_serve() {
    local port="" pid rc=1 i wait_s
    "$BIN/loom" serve --run "$WORK/run_bf16" --device cuda --port 0 >"$WORK/serve_smoke.log" 2>&1 &
    pid=$!
    wait_s=$(limit_of serve_smoke)
    [ $(((DEADLINE - $(now_ms)) / 1000)) -lt "$wait_s" ] && wait_s=$(((DEADLINE - $(now_ms)) / 1000))
    for i in $(seq 1 "$wait_s"); do
        port=$(grep -oE 'ready on http://[^:]+:[0-9]+' "$WORK/serve_smoke.log" | grep -oE '[0-9]+$' | head -n 1)
        [ -n "$port" ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 1
    done
    if [ -n "$port" ]; then
        run 20 serve_request "$PY" - "$port" <<'PY'
import json, sys, urllib.request
body = json.dumps({"model": "run_bf16", "prompt": "In the beginning", "max_tokens": 16, "temperature": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", body, {"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=15))
n = r["usage"]["completion_tokens"]
print(f"completion of {n} tokens: {r['choices'][0]['text']!r:.60}")
sys.exit(0 if n > 0 else 1)
PY
        rc=$?
    fi
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
    cat "$WORK/serve_smoke.log" >>"$LOG"
    if [ $rc = 0 ]; then
        row serve_smoke ok "port $port: $(tail -n 1 "$WORK/serve_request.log")"
    else
        row serve_smoke FAIL "$([ -n "$port" ] && why "$WORK/serve_request.log" || echo "not ready: $(why "$WORK/serve_smoke.log")")"
    fi
}

# LOG of loom bench generate: each level's out tok/s and TTFT on one line
# (else what went wrong)
generate_summary() {
    awk '$2 == "one" && $3 == "request" { s = s "1 in flight " $7 " tok/s, TTFT " $9 " ms" }
        $2 == "continuous" { s = s "; " $4 + 0 " in flight " $5 " tok/s, TTFT " $7 " ms" } END { print s }' "$1" | grep . || why "$1"
}

# loom's generation benchmark on the GPU (fp32; W8A8 weights with an int8
# KV cache: cuda_int8.cu end to end; a smollm2-135m-shaped Llama)
row_generate() {
    local kind=$1 name=bench_generate; shift
    [ "$kind" = fp32 ] || name=bench_generate_$kind
    [ -n "$BIN" ] || { row "$name" FAIL "no loom binary"; return; }
    run "$(limit_of "$name")" "$name" "$BIN/loom" bench generate --device cuda "$@"
    local rc=$?
    row "$name" "$(verdict $rc)" "$(generate_summary "$WORK/$name.log")"
}

# compute-sanitizer on a reduced op test (the bf16 cases of test_cuda_ops
# but the NCCL one, which has a row of its own: sanitizer_tp, every dtype's
# tensor-parallel cases: the vocabulary shard, the bf16 conversions, NCCL
# with one rank)
TP_CASES="vocab_shard,wire_bf16,nccl_one_rank"
row_sanitizer() {
    local tool=$1 name=sanitizer_${2:-$1} san only f summary res rc
    san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
        /opt/nvidia/*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
    [ -n "$san" ] || { row "$name" FAIL "compute-sanitizer not found"; return; }
    only="/bf16,-nccl_one_rank" opts=() envs=()
    # NCCL probes kernels built for other GPUs at its start, and handles
    # the "no kernel image" answers itself: not errors of loom's
    [ "${2:-}" = tp ] && only=$TP_CASES opts=(--report-api-errors no)
    # loom's own attention kernels (LOOM_CUDA_ATTENTION=own): racecheck
    # reports hazards inside cuDNN's sm90 flash-attention kernels (wgmma,
    # bulk copies through the async proxy, which it does not model)
    [ "$tool" = racecheck ] && only="attention_fused/bf16,layernorm/bf16,crossentropy/bf16,sumsq/bf16,paged_kv/bf16,int8_kv/bf16" envs=(LOOM_CUDA_ATTENTION=own)
    # the children of the isolated cases are checked too
    run "$(limit_of "$name")" "$name" "$san" --tool "$tool" --target-processes all --error-exitcode 3 --print-limit 20 \
        "${opts[@]}" env "${envs[@]}" LOOM_CUDA_OPS_ONLY="$only" "$BIN/tests/test_cuda_ops"
    rc=$? f="$WORK/$name.log"
    # memcheck ends with ERROR SUMMARY: N errors, racecheck with
    # RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)
    summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$f" | sed 's/^=* *//' | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)
    res=$(ok_no_skip $rc "$f")
    [ -n "$summary" ] || res=FAIL
    grep -E 'ERROR SUMMARY' "$f" | grep -qv 'ERROR SUMMARY: 0 errors' && res=FAIL
    grep -E 'RACECHECK SUMMARY' "$f" | grep -qv '(0 errors' && res=FAIL
    [ "$res" = ok ] || failing_cases "$f" "$name" >/dev/null
    row "$name" "$res" "${summary:-no summary} ($(count PASS "$f") cases: $only)"
}

# Multi-GPU training: NCCL refuses two ranks on one device (a duplicate GPU
# is an error since NCCL 2.5), so on a one-GPU machine these rows say so,
# as info, with the command that runs them where there are two GPUs.
# row_multi NAME BOUND ARGS...: train_NAME on 2 ranks, one GPU each
# (--nproc 2: LOCAL_RANK picks the GPU), 100 steps of gpt2-tiny at bf16;
# BOUND: its loss curve against train_bf16 (the same global batch), or -
# when the batches differ (then only: it learns).
row_multi() {
    local name=$1 bound=$2 gpus rc line; shift 2
    gpus=$("$BIN/loom" devices 2>/dev/null | awk '/^[0-9]+ devices?; use --device/ { print $1; exit }')
    if [ "${gpus:-0}" -lt 2 ]; then
        row "train_$name" info "needs 2 GPUs, this machine has ${gpus:-0} (NCCL refuses two ranks on one device); on 2: bench/gpu-check.sh --only train_$name (loom train --model gpt2-tiny --steps 100 --batch 8 --seq 256 --device cuda --nproc 2 --dtype bf16 $*)"
        return
    fi
    [ "$bound" = - ] || CURVE_BOUND[$name]="${name}_vs_one $bound"
    row_train "$name" - --nproc 2 --dtype bf16 "$@"
}

# where single-stream decode time goes on the GPU (info: a measurement)
row_decode_profile() {
    [ -n "$BIN" ] || { row decode_profile FAIL "no loom binary"; return; }
    run "$(limit_of decode_profile)" decode_profile bench/gpu-decode-profile.sh "$BIN/loom" "$WORK/decode_profile"
    local rc=$?
    row decode_profile "$([ $rc = 0 ] && echo info || verdict $rc)" "$(grep -E '^decode-profile: [0-9]|^decode-profile: wall' "$WORK/decode_profile.log" |
        sed 's/^decode-profile: //' | paste -sd';' - | grep . || why "$WORK/decode_profile.log")"
}

# A Llama-architecture GGUF in k-quant blocks (the bundle's
# data/llama_q4k.gguf) through the engine on the GPU: the file's blocks
# are dequantized at load (a device model runs fp32, docs/quantization.md)
row_gguf_cuda() {
    local f=$BUNDLE/data/llama_q4k.gguf
    [ -n "$BIN" ] || { row gguf_llama_cuda FAIL "no loom binary"; return; }
    [ -s "$f" ] || { row gguf_llama_cuda FAIL "no data/llama_q4k.gguf in the bundle (make deps, then make gpu-bundle)"; return; }
    run "$(limit_of gguf_llama_cuda)" gguf_llama_cuda "$BIN/loom" bench generate --device cuda --run "$f" --concurrency 1,4 \
        --repeat 1 --prompt-len 16 --gen 16
    local rc=$?
    row gguf_llama_cuda "$(verdict $rc)" "$(generate_summary "$WORK/gguf_llama_cuda.log")"
}
