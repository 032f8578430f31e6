#!/usr/bin/env bash
# A Llama-family Hugging Face folder through the CLI, as a user runs it:
#  1. transformers (4.44 under .deps/hf44) makes a random LlamaForCausalLM
#     (2 kv heads for 4 query heads, untied head, llama3 rope scaling) whose
#     tokenizer.json is one loom trained, and saves it;
#  2. `loom train --init-from` it: the fine-tune lowers the loss; the same
#     run on 2 ranks (--nproc 2 --zero 1, half the batch each) gives the
#     losses of one rank with the whole batch, and so does --nproc 2
#     --pp 2 (the folder's weights sliced into pipeline stages);
#  3. `loom export --format hf`: transformers' loss on the validation
#     shard equals `loom eval`'s, and on a text file's held-out share in
#     the folder's own tokens (Hugging Face's tokenizers encodes it);
#  4. `loom plan serve --config` reads the folder's config.json (its KV
#     cache per token is 2 x layers x kv heads x head size x 4 bytes);
#     `loom sample` runs on the fine-tuned run, on the Hugging Face folder
#     itself, with int8 weights and activations and an int8 KV cache, and on
#     a `loom prune --sparsity 2:4` copy.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/hf44 /usr/bin/python3"
if ! $PY -c 'import transformers, torch' 2>/dev/null; then
    echo "SKIP llama_cli: transformers is not importable from .deps/hf44 (scripts/deps.sh installs it)"; exit 0
fi
if ! command -v bible >/dev/null; then echo "SKIP llama_cli: the bible-kjv package is not installed"; exit 0; fi
tmp=$(mktemp -d /tmp/loom-llama-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bible Gen1:1-Gen20:18 </dev/null | head -c 60000 > "$tmp/text.txt"
$LOOM tokenize --input "$tmp/text.txt" --vocab 300 --out "$tmp/data" --quiet --threads 2 > /dev/null || { echo "FAIL llama_cli_setup: loom tokenize"; exit 1; }

# 1. The folder, made by transformers.
$PY - "$tmp/hf" "$tmp/data/tokenizer.json" <<'PY' || { echo "FAIL llama_cli_setup: transformers could not make the model"; exit 1; }
import json, shutil, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
out, tj = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
V = len(json.load(open(tj))["model"]["vocab"])
cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
                  rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=32))
model = LlamaForCausalLM(cfg)
with torch.no_grad():  # wider than the default init, so the loss is not ln(V)
    for n, p in model.named_parameters():
        if p.dim() == 2:
            p.mul_(4.0)
model.save_pretrained(out, safe_serialization=True)
shutil.copy(tj, out + "/tokenizer.json")
PY

# 2. Fine-tune, one rank and two.
A=(--init-from "$tmp/hf" --data "$tmp/data" --steps 10 --seq 32 --lr 3e-3 --warmup 1 --eval-every 0 --sample-tokens 0
   --ckpt-every 100 --log-every 1 --seed 7)
if ! $LOOM train "${A[@]}" --batch 4 --threads 1 --out "$tmp/one" > "$tmp/one.log" 2>&1; then
    echo "FAIL llama_cli_finetune: $(tail -3 "$tmp/one.log")"; exit 1
fi
python3 - "$tmp/one/metrics.jsonl" <<'PY' && echo "PASS llama_cli_finetune_lowers_loss" || echo "FAIL llama_cli_finetune_lowers_loss"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
print(f"  losses {l[0]:.4f} -> {l[-1]:.4f} over {len(l)} steps")
sys.exit(0 if len(l) == 10 and l[-1] < l[0] - 0.05 else 1)
PY
# vs_one NAME RUN ARGS...: `loom train` ARGS into $tmp/RUN; its 10 losses within 1e-5 relative of one rank's.
vs_one() {
    local name=$1 run=$2; shift 2
    $LOOM train "${A[@]}" "$@" --out "$tmp/$run" > "$tmp/$run.log" 2>&1 || echo "FAIL ${name}_run: $(tail -3 "$tmp/$run.log")"
    python3 - "$tmp/one/metrics.jsonl" "$tmp/$run/metrics.jsonl" <<'PY' && echo "PASS $name" || { echo "FAIL $name"; tail -3 "$tmp/$run.log"; }
import json, sys
a, b = ([json.loads(x)["loss"] for x in open(f) if '"loss"' in x] for f in sys.argv[1:3])
d = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) == 10 else 1
print(f"  vs 1 rank: worst relative loss difference {d:.1e}")
sys.exit(0 if d < 1e-5 else 1)
PY
}
vs_one llama_cli_nproc2_zero1_vs_1rank two --batch 2 --nproc 2 --zero 1
# --pp with --init-from: the folder's weights sliced into 2 stages.
vs_one llama_cli_init_from_pp2_vs_1rank pp2 --batch 4 --nproc 2 --pp 2

# 3. Back to transformers.
$LOOM export --run "$tmp/one" --format hf --out "$tmp/export" > /dev/null || echo "FAIL llama_cli_export: loom export failed"
# hf_loss FOLDER shard FILE | FOLDER text FILE: transformers' loss (fp64) on the first 33 tokens of a
# validation shard, or of a text file's held-out last tenth (loom eval's --val-fraction default) as
# Hugging Face's tokenizers encodes it with the folder's tokenizer.json.
hf_loss() {
    $PY - "$@" <<'PY'
import sys, numpy as np, torch
from transformers import AutoModelForCausalLM
folder, kind, path = sys.argv[1:4]
m = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64).eval()
if kind == "shard":
    hdr = np.fromfile(path, dtype=np.int32, count=256)  # the shard header (data/shard.h): 1 KiB
    toks = np.fromfile(path, dtype=np.uint16 if hdr[6] == 2 else np.uint32, offset=1024).astype(np.int64)
else:
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(folder + "/tokenizer.json").encode(open(path, encoding="utf-8").read(), add_special_tokens=False).ids
    toks = ids[len(ids) - int(len(ids) * 0.1):]
x = torch.tensor(toks[:33])[None]
with torch.no_grad():
    logits = m(x[:, :32]).logits
print(f"{torch.nn.functional.cross_entropy(logits[0], x[0, 1:33]).item():.9f}")
PY
}
ev=$($LOOM eval --run "$tmp/one" --data "$tmp/data" --batch 1 --seq 32 --batches 1 --threads 2 | awk '{print $2}')
hv=$(hf_loss "$tmp/export" shard "$tmp/data/val_000000.bin")
awk -v a="$ev" -v b="$hv" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d <= 6e-5)}' \
    && echo "PASS llama_cli_export_hf_val_loss (loom eval $ev, transformers $hv)" \
    || echo "FAIL llama_cli_export_hf_val_loss: loom eval $ev, transformers $hv"
# A text file evaluated in the model's own tokens (the folder's tokenizer.json).
ev=$($LOOM eval --run "$tmp/export" --data "$tmp/text.txt" --batch 1 --seq 32 --batches 1 --threads 2 2>&1 | awk '/^val_loss/{print $2}')
hv=$(hf_loss "$tmp/export" text "$tmp/text.txt")
awk -v a="$ev" -v b="$hv" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(a != "" && d <= 6e-5)}' \
    && echo "PASS llama_cli_eval_text_model_tokens (loom eval $ev, tokenizers + transformers $hv)" \
    || echo "FAIL llama_cli_eval_text_model_tokens: loom eval '$ev', tokenizers + transformers $hv"

# 4. Plan from the config, and sample.
kv=$($LOOM plan serve --config "$tmp/hf/config.json" --gpu a100-80gb --dtype fp32 --prompt 16 --output 16 --json |
     python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["gpu"]["kv_per_token"])' 2>/dev/null)
[ "$kv" = "512" ] && echo "PASS llama_cli_plan_serve_config (KV cache per token $kv bytes = 2 x 2 layers x 2 kv heads x 16 x 4)" \
    || echo "FAIL llama_cli_plan_serve_config: KV cache per token '$kv', expected 512"
out=$($LOOM sample --run "$tmp/one" --prompt "And God said" --tokens 8 --temperature 0 --threads 2 2>&1)
[ $? = 0 ] && [ -n "$out" ] && echo "PASS llama_cli_sample" || echo "FAIL llama_cli_sample: $out"
out=$($LOOM sample --run "$tmp/hf" --prompt "And God said" --tokens 8 --temperature 0 --threads 2 2>&1)
[ $? = 0 ] && [ -n "$out" ] && echo "PASS llama_cli_sample_hf_folder" || echo "FAIL llama_cli_sample_hf_folder: $out"
out=$($LOOM sample --run "$tmp/one" --prompt "And God said" --tokens 8 --temperature 0 --quant w8a8 --kv-dtype int8 --threads 2 2>&1)
[ $? = 0 ] && [ -n "$out" ] && echo "PASS llama_cli_sample_int8" || echo "FAIL llama_cli_sample_int8: $out"
if $LOOM prune --run "$tmp/one" --sparsity 2:4 --out "$tmp/pruned" > "$tmp/prune.log" 2>&1 &&
   out=$($LOOM sample --run "$tmp/pruned" --prompt "And God said" --tokens 8 --temperature 0 --threads 2 2>&1); then
    echo "PASS llama_cli_prune_24_sample ($(head -c 120 "$tmp/prune.log"))"
else
    echo "FAIL llama_cli_prune_24_sample: $(tail -2 "$tmp/prune.log") $out"
fi

# A model whose whole context (1,000,000 tokens here, 512 MB of KV cache)
# does not fit serve's default --kv-memory (256M): serve starts anyway with
# a shorter context and says so, and its greedy tokens equal loom generate's
# on the folder itself; an explicit --kv-memory too small for one whole
# context is refused naming it.
cp -r "$tmp/hf" "$tmp/hflong"
$PY -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['max_position_embeddings']=1000000; json.dump(c, open(p,'w'))" "$tmp/hflong/config.json"
echo '{"prompt": "And God said", "max_tokens": 8, "temperature": 0}' > "$tmp/p.jsonl"
$LOOM generate --run "$tmp/hf" --prompts "$tmp/p.jsonl" --out "$tmp/g1.jsonl" --threads 2 > /dev/null 2>&1
$LOOM serve --run "$tmp/hflong" --port 0 --threads 2 > /dev/null 2> "$tmp/long.log" &
lpid=$!
for _ in $(seq 1 600); do grep -q "ready on http" "$tmp/long.log" 2>/dev/null && break; kill -0 $lpid 2>/dev/null || break; sleep 0.1; done # a guard only
lport=$(sed -n 's/.*ready on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$tmp/long.log" | head -1)
got=$(curl -s "http://127.0.0.1:$lport/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model": "hflong", "prompt": "And God said", "max_tokens": 8, "temperature": 0, "logprobs": 1}' 2>/dev/null)
kill $lpid 2>/dev/null; wait $lpid 2>/dev/null
want=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['samples'][0]['text'])" "$tmp/g1.jsonl" 2>/dev/null)
have=$(printf '%s' "$got" | $PY -c "import json,sys; print(json.load(sys.stdin)['choices'][0]['text'])" 2>/dev/null)
if grep -q "requests get 131072 tokens of context, not the model's 1000000" "$tmp/long.log" && [ -n "$have" ] && [ "$have" = "$want" ]; then
    echo "PASS llama_cli_long_context_capped_by_default_kv ($(grep -o 'requests get [0-9]* tokens' "$tmp/long.log"))"
else
    echo "FAIL llama_cli_long_context_capped_by_default_kv: '$have' vs '$want'; $(tail -2 "$tmp/long.log")"
fi
out=$($LOOM generate --run "$tmp/hflong" --prompts "$tmp/p.jsonl" --out "$tmp/g3.jsonl" --threads 2 --kv-memory 64M 2>&1)
printf '%s' "$out" | grep -q "raise --kv-memory to at least" && echo "PASS llama_cli_long_context_explicit_kv_refused" \
    || echo "FAIL llama_cli_long_context_explicit_kv_refused: $out"

# 5. Serve the Hugging Face folder over HTTP, as a user would, and ask with
# the official openai client: the greedy completion (streamed and not) is
# transformers' greedy generate() on the same folder, token for token (the
# random model writes raw bytes: the API sends invalid UTF-8 and NUL as
# U+FFFD, so the reference text is decoded the same way).
if ! env PYTHONPATH=.deps/py /usr/bin/python3 -c 'import openai' 2>/dev/null; then
    echo "SKIP llama_cli_serve: the openai package is not importable from .deps/py (scripts/deps.sh installs it)"; exit 0
fi
$LOOM serve --run "$tmp/hf" --port 0 --threads 2 --kv-memory 16M > "$tmp/serve.out" 2> "$tmp/serve.log" &
spid=$!
port=""
for _ in $(seq 1 600); do  # a guard only: the loop ends at the "ready" line
    port=$(sed -n 's/.*ready on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$tmp/serve.log" | head -1)
    [ -n "$port" ] || ! kill -0 $spid 2>/dev/null && break
    sleep 0.2
done
if [ -z "$port" ]; then
    echo "FAIL llama_cli_serve_start: $(tail -3 "$tmp/serve.log")"; kill $spid 2>/dev/null; exit 1
fi
env PYTHONPATH=.deps/hf44:.deps/py /usr/bin/python3 - "$tmp/hf" "$port" <<'PY'
import sys, torch
from openai import OpenAI
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM
folder, port = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(folder + "/tokenizer.json")
model = LlamaForCausalLM.from_pretrained(folder).eval()
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
name = client.models.list().data[0].id
for prompt in ("And God said", "In the beginning God created"):
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    want = tok.decode(ref).replace("\x00", "\ufffd")
    r = client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0)
    got = r.choices[0].text
    ok = got == want and r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 16
    print(("PASS" if ok else "FAIL") + f" llama_cli_serve_greedy_equals_transformers ({prompt!r})"
          + ("" if ok else f": loom {got!r} ({r.usage.prompt_tokens}+{r.usage.completion_tokens} tokens), transformers {want!r}"))
    s = client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0, stream=True)
    streamed = "".join(c.choices[0].text for c in s if c.choices)
    print(("PASS" if streamed == got else "FAIL") + f" llama_cli_serve_stream_equals_plain ({prompt!r})"
          + ("" if streamed == got else f": streamed {streamed!r}, plain {got!r}"))
PY
kill -TERM $spid 2>/dev/null
wait $spid
rc=$?
[ $rc = 0 ] && echo "PASS llama_cli_serve_sigterm_clean_exit" || echo "FAIL llama_cli_serve_sigterm_clean_exit: exit $rc, $(tail -2 "$tmp/serve.log")"
