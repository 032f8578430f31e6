"""A randomly initialised Hugging Face Llama folder for llama.cpp's own
converter (bench/llama-kquant.sh, bench/llama-speed.sh):

  PYTHONPATH=.deps/hf44:.deps/py python3 bench/llama_random.py SHAPE TRAIN.txt OUTDIR

SHAPE: tiny (4 layers, 256 channels, 4 heads, 2 kv heads, FFN 768, context
256: widths multiples of 256, so llama-quantize keeps its k-quants),
smollm2-135m or llama-3.2-1b (those models' shapes, Llama 3's RoPE scaling
for the 1B; loom's presets). The tokenizer is a Llama 3-style byte-level
BPE trained by Hugging Face `tokenizers` on TRAIN.txt
(tests/tokenizer_family_oracle.py's "llama3" kind: Llama 3's split regex,
<|begin_of_text|>, <|eot_id|>); the model's vocabulary is the preset's
(the converter pads the tokenizer's with [PADn] ids), the tiny one's the
tokenizer's. Weights: transformers' own initialisation with
initializer_range INIT (default 0.02; the tiny model takes 0.08, so that
the logits are not all near-equal), seed 0, saved in float32 (tiny) or
bfloat16.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

SHAPES = {
    "tiny": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
                 max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False),
    "smollm2-135m": dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True, vocab_size=49152),
    "llama-3.2-1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                         max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True, vocab_size=128256,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
}
LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
                   "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
                   "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def main(shape, train_path, outdir):
    import torch
    import tokenizer_family_oracle
    from transformers import LlamaConfig, LlamaForCausalLM
    tokenizer_family_oracle.build("llama3", train_path, outdir)
    with open(os.path.join(outdir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    ntok = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
    ids = dict(tj["model"]["vocab"], **{a["content"]: a["id"] for a in tj["added_tokens"]})
    kw = dict(SHAPES[shape])
    kw.setdefault("vocab_size", ntok)
    assert kw["vocab_size"] >= ntok
    cfg = LlamaConfig(rms_norm_eps=1e-5, initializer_range=float(os.environ.get("INIT", "0.08" if shape == "tiny" else "0.02")),
                      bos_token_id=ids["<|begin_of_text|>"], eos_token_id=ids["<|eot_id|>"], **kw)
    torch.manual_seed(0)
    dtype = torch.float32 if shape == "tiny" else torch.bfloat16
    m = LlamaForCausalLM(cfg).to(dtype)
    m.config.torch_dtype = dtype
    m.save_pretrained(outdir, safe_serialization=True)
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "add_bos_token": True,
                   "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": LLAMA3_TEMPLATE}, f)
    n = sum(p.numel() for p in m.parameters())
    print("llama_random: %s, %.1fM parameters, vocabulary %d (tokenizer %d) -> %s" % (shape, n / 1e6, kw["vocab_size"], ntok, outdir))


if __name__ == "__main__":
    main(*sys.argv[1:4])
