"""Oracle for tests/test_llama.c: Hugging Face transformers' own Llama-family
models (PYTHONPATH=.deps/hf44, transformers 4.44 on Debian's torch 1.13).

  make DIR          build the variants below as random models, save each with
                    save_pretrained into DIR/NAME, and write the references
                    loom must reproduce (raw little-endian files):
                      tokens.i32    (B, T) token ids
                      logits.f64    (B, T, V) logits, the model in float64
                      loss.f64      mean cross-entropy of tokens -> targets
                      targets.i32   (B, T)
                      grad/NAME.f64 d loss / d tensor NAME, float64
                      prompt.i32    (P) a prompt; gen.i32 (50) greedy tokens
                                    of generate() in float32
                    and two copies in other encodings, each with tokens.i32 and
                    logits.f64 of its own rounded weights: DIR/llama3_f16 (fp16,
                    sharded: model.safetensors.index.json and several files)
                    and DIR/qwen2_bf16 (bf16, one file).
  logits DIR OUT... load each DIR with AutoModelForCausalLM (a folder loom
                    exported), write its float64 logits of DIR/../tokens.i32
                    to OUT.
Prints "RESULT ok" at the end.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

B, T, P, GEN = 2, 24, 6, 50
COMMON = dict(vocab_size=331, hidden_size=64, intermediate_size=100, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5)

# name: (model class, config class, extra config)
VARIANTS = {
    # GQA, untied head, Llama 3's rope scaling (every branch: wavelengths
    # above 64, between 16 and 64, below 16 at head size 16)
    "llama3": (LlamaForCausalLM, LlamaConfig,
               dict(tie_word_embeddings=False, rope_theta=10000.0,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=64))),
    # tied head, linear scaling, another theta
    "llama_tied": (LlamaForCausalLM, LlamaConfig,
                   dict(tie_word_embeddings=True, rope_theta=500000.0,
                        rope_scaling=dict(type="linear", factor=2.0))),
    "mistral": (MistralForCausalLM, MistralConfig,
                dict(tie_word_embeddings=False, sliding_window=None, rope_theta=1000000.0)),
    # q/k/v biases, tied head
    "qwen2": (Qwen2ForCausalLM, Qwen2Config,
              dict(tie_word_embeddings=True, use_sliding_window=False, rope_theta=1000000.0,
                   rms_norm_eps=1e-6)),
}


def widen(model, seed):
    """Weights that put activations at O(1), as in a trained model:
    HF's init (std 0.02) makes every logit ~0, where greedy decoding is a
    coin toss between implementations and errors hide in rounding."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.125 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def write(path, arr, dtype):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.ascontiguousarray(arr, dtype=dtype).tofile(path)


def make(root):
    for k, (name, (cls, cfg_cls, extra)) in enumerate(VARIANTS.items()):
        torch.manual_seed(1000 + k)
        cfg = cfg_cls(**{**COMMON, **extra})
        model = cls(cfg).eval()
        widen(model, 2000 + k)
        d = os.path.join(root, name)
        model.save_pretrained(d, safe_serialization=True)
        rng = np.random.default_rng(3000 + k)
        tokens = rng.integers(0, cfg.vocab_size, size=(B, T))
        targets = rng.integers(0, cfg.vocab_size, size=(B, T))
        write(f"{d}/tokens.i32", tokens, np.int32)
        write(f"{d}/targets.i32", targets, np.int32)
        m64 = cls(cfg).double().eval()
        m64.load_state_dict({n: p.double() for n, p in model.state_dict().items()})
        x = torch.tensor(tokens)
        logits = m64(x).logits
        write(f"{d}/logits.f64", logits.detach().numpy(), np.float64)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.tensor(targets).reshape(-1))
        loss.backward()
        write(f"{d}/loss.f64", np.array([loss.item()]), np.float64)
        for n, p in m64.named_parameters():
            write(f"{d}/grad/{n}.f64", p.grad.numpy(), np.float64)
        prompt = rng.integers(0, cfg.vocab_size, size=(P,))
        with torch.no_grad():
            out = model.generate(torch.tensor(prompt)[None], max_new_tokens=GEN, do_sample=False,
                                 attention_mask=torch.ones(1, P, dtype=torch.long), pad_token_id=0)
        write(f"{d}/prompt.i32", prompt, np.int32)
        write(f"{d}/gen.i32", out[0, P:].numpy(), np.int32)
        print(f"ok {name}: {cls.__name__}, loss {loss.item():.4f}, {sum(p.numel() for p in model.parameters())} parameters")
        if name in ("llama3", "qwen2"):
            copy(model, m64, cls, cfg, tokens, f"{root}/llama3_f16" if name == "llama3" else f"{root}/qwen2_bf16",
                 torch.float16 if name == "llama3" else torch.bfloat16)


def copy(model, m64, cls, cfg, tokens, d, dtype):
    """The model saved in a 16-bit type (sharded at fp16), and the float64
    logits of exactly those rounded weights."""
    low = cls(cfg).to(dtype)
    low.load_state_dict({n: p.to(dtype) for n, p in model.state_dict().items()})
    low.save_pretrained(d, safe_serialization=True, max_shard_size="100KB" if dtype == torch.float16 else "1GB")
    m64.load_state_dict({n: p.double() for n, p in low.state_dict().items()})
    write(f"{d}/tokens.i32", tokens, np.int32)
    with torch.no_grad():
        write(f"{d}/logits.f64", m64(torch.tensor(tokens)).logits.numpy(), np.float64)
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    print(f"ok {os.path.basename(d)}: {dtype} in {len(files)} file(s)")


def logits_of(folder, out):
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64).eval()
    tokens = np.fromfile(os.path.join(folder, "..", "tokens.i32"), dtype=np.int32).reshape(B, T)
    with torch.no_grad():
        logits = model(torch.tensor(tokens, dtype=torch.long)).logits
    write(out, logits.numpy(), np.float64)
    print(f"ok {folder}: {type(model).__name__} loaded by transformers {transformers.__version__}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "logits":
        for folder, out in zip(sys.argv[2::2], sys.argv[3::2]):
            logits_of(folder, out)
    print("RESULT ok")
