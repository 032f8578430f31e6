#!/usr/bin/env bash
# Greedy output of `loom generate` (the engine: paged KV cache, continuous
# batching of the three prompts together) against Hugging Face transformers
# generating greedily from the same checkpoint folder: three prompts, 50 new
# tokens each, identical ids. Also checks the output file's shape, the text
# prompt path and a bad prompt's one-line error.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/hf /usr/bin/python3"
if ! $PY -c "import torch, transformers" 2>/dev/null; then
    echo "SKIP engine_hf: transformers (scripts/deps.sh installs it into .deps/hf) or torch is missing"; exit 0
fi
tmp=$(mktemp -d /tmp/loom-engine-hf-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# A small corpus with structure, so that training makes the model's choices clear-cut.
$PY -c "
import random
random.seed(3)
words = 'the cat sat on a mat and then it ran to see the dog who was under old tree by river'.split()
print(' '.join(random.choice(words) for _ in range(30000)))" > "$tmp/corpus.txt"
if ! $LOOM train --data "$tmp/corpus.txt" --model gpt2-tiny --steps 30 --batch 4 --seq 64 --lr 3e-3 --warmup 5 \
      --eval-every 0 --threads 2 --sample-tokens 0 --seed 3 --out "$tmp/run" > "$tmp/train.log" 2>&1; then
    echo "FAIL engine_hf_train: loom train failed:"; tail -5 "$tmp/train.log"; exit 1
fi
ck=$(ls -d "$tmp"/run/checkpoints/step_* | tail -1)
cat > "$tmp/in.jsonl" <<'J'
{"prompt_ids": [116, 104, 101, 32, 99, 97, 116]}
{"prompt_ids": [32]}
{"prompt_ids": [111, 110, 32, 97, 32, 109, 97, 116, 32, 97, 110, 100, 32, 116, 104, 101, 110, 32, 105, 116, 32, 114, 97, 110]}
{"prompt": "the dog who"}
J
if ! $LOOM generate --run "$tmp/run" --prompts "$tmp/in.jsonl" --out "$tmp/out.jsonl" --max-tokens 50 --threads 2 \
      --kv-memory 64M --block-size 16 --max-batch-tokens 8 > "$tmp/gen.log" 2>&1; then
    echo "FAIL engine_hf_generate: loom generate failed:"; tail -5 "$tmp/gen.log"; exit 1
fi
grep -q "4/4 requests" "$tmp/gen.log" && echo "PASS engine_generate_progress" || { echo "FAIL engine_generate_progress:"; tail -2 "$tmp/gen.log"; }
$PY - "$ck" "$tmp/in.jsonl" "$tmp/out.jsonl" <<'PY'
import json, sys, torch
from transformers import GPT2LMHeadModel
ck, inp, out = sys.argv[1:]
model = GPT2LMHeadModel.from_pretrained(ck).eval()
ins = [json.loads(l) for l in open(inp)]
outs = [json.loads(l) for l in open(out)]
ok = len(outs) == 4 and all(o["samples"][0]["finish_reason"] == "length" and len(o["samples"][0]["token_ids"]) == 50 for o in outs)
print(("PASS" if ok else "FAIL") + " engine_generate_output_shape" + ("" if ok else ": %s" % outs))
bad = []
for i in range(3):
    ids = torch.tensor([ins[i]["prompt_ids"]])
    with torch.no_grad():
        g = model.generate(ids, max_new_tokens=50, do_sample=False, pad_token_id=0)
    want = g[0, ids.shape[1]:].tolist()
    got = outs[i]["samples"][0]["token_ids"]
    if got != want:
        k = next(j for j in range(50) if j >= len(got) or got[j] != want[j])
        bad.append("prompt %d differs at token %d: loom %s, transformers %s" % (i, k, got[k:k+5], want[k:k+5]))
print("PASS engine_greedy_matches_transformers" if not bad else "FAIL engine_greedy_matches_transformers: " + "; ".join(bad))
text = outs[3]["samples"][0]["text"]
print(("PASS" if len(text) > 0 and text == bytes(outs[3]["samples"][0]["token_ids"]).decode("utf-8", "replace") else "FAIL") + " engine_generate_text_prompt")
PY
echo '{"prompt_ids": [1, 99999]}' > "$tmp/bad.jsonl"
msg=$($LOOM generate --run "$tmp/run" --prompts "$tmp/bad.jsonl" --out "$tmp/bad.out" --kv-memory 64M 2>&1); rc=$?
[ $rc = 2 ] && printf '%s' "$msg" | grep -q "line 1: prompt token 99999" && echo "PASS engine_generate_bad_prompt" \
    || echo "FAIL engine_generate_bad_prompt: rc $rc, $msg"
