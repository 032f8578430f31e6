#!/usr/bin/env bash
# Seed inputs for tests/fuzz/fuzz_readers.c, one folder per reader (and the
# request parser's bodies), into $1:
# a real file of each kind, written by loom (a tiny run, its checkpoint, a
# GGUF export) or by hand where the reader's own shape is smaller.
#   tests/fuzz/seeds.sh OUT [LOOM]
set -eu
out=$1; LOOM=${2:-build/loom}
mkdir -p "$out"/{safetensors,gguf,tokenizer,config,state,manifest,shard,chat_template,request}
w=$(mktemp -d /tmp/loom-seeds-XXXXXX); trap 'rm -rf "$w"' EXIT
/usr/bin/python3 -c "import random; random.seed(3); print(' '.join(random.choice(['in','the','God','created','heaven','and','earth.']) for _ in range(3000)))" > "$w/t.txt"
$LOOM tokenize --input "$w/t.txt" --vocab 270 --val-fraction 0.1 --out "$w/d" --quiet > /dev/null 2>&1
$LOOM train --data "$w/d" --layers 1 --channels 8 --heads 2 --context 4 --batch 1 --seq 4 --steps 1 --eval-every 0 --sample-tokens 0 --threads 1 --out "$w/r" > /dev/null 2>&1
ck=$(ls -d "$w"/r/checkpoints/step_* | tail -1)
$LOOM export --run "$w/r" --format gguf --out "$out/gguf/tiny.gguf" > /dev/null
# and one whose matrices are q8_0 blocks (rows of 32): the blocks' reader (ckpt/gguf_map.c) under mutation
$LOOM train --data "$w/d" --layers 1 --channels 32 --heads 2 --context 4 --batch 1 --seq 4 --steps 1 --eval-every 0 --sample-tokens 0 --threads 1 --out "$w/r32" > /dev/null 2>&1
$LOOM export --run "$w/r32" --format gguf --dtype q8_0 --out "$out/gguf/tiny_q8_0.gguf" > /dev/null
cp "$w/d/tokenizer.json" "$out/tokenizer/bpe.json"
cp "$ck/config.json" "$out/config/gpt2.json"; cp "$ck/state.json" "$out/state/state.json"; cp "$ck/manifest.json" "$out/manifest/manifest.json"
head -c 1100 "$w/d/val_000000.bin" > "$out/shard/short.bin"   # a header and 38 tokens: the count disagrees
printf '%s' '{"prompt":"In the beginning","max_tokens":50,"stream":true,"stream_options":{"include_usage":true}}' > "$out/request/completion.json"
printf '%s' '{"model":"kjv","prompt":[[1,2,3],[4]],"n":2,"stop":["x","y"],"logprobs":3,"echo":true,"seed":7,"top_p":0.9,"top_k":40}' > "$out/request/ids.json"
printf '%s' '{"messages":[{"role":"system","content":"s"},{"role":"user","content":"\u00e9"}],"logprobs":true,"top_logprobs":2,"temperature":0.5}' > "$out/request/chat.json"
/usr/bin/python3 - "$out" <<'PY'
import json, struct, sys
out = sys.argv[1]
# safetensors for the fuzz model: GPT-2, 1 layer, 8 channels, context 4, vocabulary 10
C, T, V = 8, 4, 10
shapes = {"wte.weight": [V, C], "wpe.weight": [T, C], "h.0.ln_1.weight": [C], "h.0.ln_1.bias": [C],
          "h.0.attn.c_attn.weight": [C, 3 * C], "h.0.attn.c_attn.bias": [3 * C], "h.0.attn.c_proj.weight": [C, C],
          "h.0.attn.c_proj.bias": [C], "h.0.ln_2.weight": [C], "h.0.ln_2.bias": [C], "h.0.mlp.c_fc.weight": [C, 4 * C],
          "h.0.mlp.c_fc.bias": [4 * C], "h.0.mlp.c_proj.weight": [4 * C, C], "h.0.mlp.c_proj.bias": [C],
          "ln_f.weight": [C], "ln_f.bias": [C]}
hdr, off = {"__metadata__": {"format": "pt"}}, 0
for k, s in shapes.items():
    n = 1
    for d in s: n *= d
    hdr[k] = {"dtype": "F32", "shape": s, "data_offsets": [off, off + 4 * n]}; off += 4 * n
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(out + "/safetensors/gpt2.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<f", 0.5) * (off // 4))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 128,
           "vocab_size": 300, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64}}, open(out + "/config/llama.json", "w"))
# a shard: header (version 2, vocabulary 1000, 16 uint16 tokens) without the right checksum, and a llm.c one
toks = list(range(16))
hd = [0x4c4f4f4d, 2, 1024, 1000, 16, 0, 2, 0, 0, 0, 0] + [0] * 245
open(out + "/shard/v2.bin", "wb").write(struct.pack("<256i", *hd) + struct.pack("<16H", *toks))
hd = [20240520, 1, 16] + [0] * 253
open(out + "/shard/llmc.bin", "wb").write(struct.pack("<256i", *hd) + struct.pack("<16H", *toks))
templates = {
    "chatml": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "llama3": "{{ bos_token }}{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
              "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    "mistral": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('roles must alternate') }}{% endif %}{% if message['role'] == 'user' %}"
               "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
    "macro": "{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{% set ns = namespace(n=0) %}{% for m in messages[1:] if m.role != 'x' %}"
             "{% set ns.n = ns.n + 1 %}{{ f(ns.n) }}{{ m.content|length }}{{ m|tojson }}{% endfor %}{{ 'a,b'.split(',')|join('-') }}",
}
for k, v in templates.items(): open(out + "/chat_template/" + k + ".jinja", "w").write(v)
PY
