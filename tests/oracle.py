#!/usr/bin/python3
"""The independent oracle for loom's GPT-2: the same model, written again in
PyTorch from the GPT-2 definition rather than from loom's code, so that a
mistake shared by loom's forward and backward cannot hide.

Usage: /usr/bin/python3 tests/oracle.py DIR

DIR (written by tests/test_oracle.c) holds
  config.json        model shape, batch and optimizer hyperparameters
  model.safetensors  the initial weights, Hugging Face GPT2Model names,
                     Conv1D (in, out) layout, V rows of wte
  tokens.bin         int32 (steps, B, T) inputs; batch 0 is also the one
  targets.bin        int32 (steps, B, T) next tokens  of the gradient check

For each precision P in (f32, f64) it writes float64 raw files P_NAME.bin:
  logits     (B, T, V)  forward on batch 0
  loss       (1)        mean cross-entropy on batch 0
  grad_X     gradient of that loss for loom's tensor X, in loom's layout
             (layers stacked, (out, in) matrices, V rows of wte)
  losses     (steps)    loss of each AdamW step, before its update
  norms      (steps)    global gradient norm of each step, before clipping
  param_X    tensor X after the steps, in loom's layout

The safetensors file is parsed here directly (8-byte little-endian header
length, JSON header, raw data), so the test needs no safetensors package.
"""
import json
import math
import os
import struct
import sys

import torch


def read_safetensors(path):
    """Map tensor name -> float32 tensor, checking what the format promises."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SystemExit(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise SystemExit(f"{path}: header length {hlen} runs past the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = blob[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} has dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        count = math.prod(shape)
        if end - begin != 4 * count or end > len(data):
            raise SystemExit(f"{path}: {name} shape {shape} does not match data_offsets {begin}..{end} (data {len(data)} bytes)")
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        out[name] = t.reshape(shape).clone()
    return out


def hf_shapes(cfg):
    """Every tensor GPT2Model has, with its shape (Conv1D weights are (in, out))."""
    C, V, T, L = cfg["channels"], cfg["vocab_size"], cfg["max_seq_len"], cfg["n_layer"]
    s = {"wte.weight": [V, C], "wpe.weight": [T, C]}
    for l in range(L):
        h = f"h.{l}."
        s.update({
            h + "ln_1.weight": [C], h + "ln_1.bias": [C],
            h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
            h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
            h + "ln_2.weight": [C], h + "ln_2.bias": [C],
            h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
            h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C],
        })
    s.update({"ln_f.weight": [C], "ln_f.bias": [C]})
    return s


# loom's tensor -> (HF name inside block h.{l}. or a global name, transposed?)
LOOM_TENSORS = [
    ("wte", "wte.weight", False, False),
    ("wpe", "wpe.weight", False, False),
    ("qkvw", "attn.c_attn.weight", True, True),
    ("attprojw", "attn.c_proj.weight", True, True),
    ("fcw", "mlp.c_fc.weight", True, True),
    ("fcprojw", "mlp.c_proj.weight", True, True),
    ("ln1w", "ln_1.weight", True, False),
    ("ln1b", "ln_1.bias", True, False),
    ("qkvb", "attn.c_attn.bias", True, False),
    ("attprojb", "attn.c_proj.bias", True, False),
    ("ln2w", "ln_2.weight", True, False),
    ("ln2b", "ln_2.bias", True, False),
    ("fcb", "mlp.c_fc.bias", True, False),
    ("fcprojb", "mlp.c_proj.bias", True, False),
    ("lnfw", "ln_f.weight", False, False),
    ("lnfb", "ln_f.bias", False, False),
]


def to_loom_layout(tensors, n_layer):
    """{HF name: tensor} -> {loom name: tensor in loom's layout}."""
    out = {}
    for loom, hf, per_layer, conv1d in LOOM_TENSORS:
        if not per_layer:
            out[loom] = tensors[hf]
            continue
        parts = [tensors[f"h.{l}.{hf}"] for l in range(n_layer)]
        if conv1d:  # Conv1D keeps (in, out); loom keeps (out, in)
            parts = [p.t() for p in parts]
        out[loom] = torch.stack(parts)
    return out


class GPT2(torch.nn.Module):
    """GPT-2 with Conv1D (x @ W + b) projections and an lm head tied to wte."""

    def __init__(self, cfg, weights, dtype):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict()
        for name, t in weights.items():
            # ParameterDict keys may not contain '.'
            self.p[name.replace(".", "/")] = torch.nn.Parameter(t.to(dtype).clone())

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def named_hf_parameters(self):
        return [(k.replace("/", "."), v) for k, v in self.p.items()]

    @staticmethod
    def layernorm(x, w, b):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * w + b

    @staticmethod
    def gelu(x):  # GPT-2's tanh approximation
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def attention(self, x, l):
        B, T, C = x.shape
        NH = self.cfg["n_head"]
        hs = C // NH
        qkv = x @ self.w(f"h.{l}.attn.c_attn.weight") + self.w(f"h.{l}.attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (z.reshape(B, T, NH, hs).transpose(1, 2) for z in (q, k, v))  # (B, NH, T, hs)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        att = e / e.sum(dim=-1, keepdim=True)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return y @ self.w(f"h.{l}.attn.c_proj.weight") + self.w(f"h.{l}.attn.c_proj.bias")

    def mlp(self, x, l):
        h = x @ self.w(f"h.{l}.mlp.c_fc.weight") + self.w(f"h.{l}.mlp.c_fc.bias")
        return self.gelu(h) @ self.w(f"h.{l}.mlp.c_proj.weight") + self.w(f"h.{l}.mlp.c_proj.bias")

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.w("wte.weight")[tokens] + self.w("wpe.weight")[:T]
        for l in range(self.cfg["n_layer"]):
            x = x + self.attention(self.layernorm(x, self.w(f"h.{l}.ln_1.weight"), self.w(f"h.{l}.ln_1.bias")), l)
            x = x + self.mlp(self.layernorm(x, self.w(f"h.{l}.ln_2.weight"), self.w(f"h.{l}.ln_2.bias")), l)
        x = self.layernorm(x, self.w("ln_f.weight"), self.w("ln_f.bias"))
        logits = x @ self.w("wte.weight").t()  # tied head, (B, T, V)
        z = logits - logits.max(dim=-1, keepdim=True).values
        logp = z - torch.log(torch.exp(z).sum(dim=-1, keepdim=True))
        loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()
        return logits, loss


def run(cfg, weights, tokens, targets, dtype, write):
    L = cfg["n_layer"]
    model = GPT2(cfg, weights, dtype)
    named = model.named_hf_parameters()

    logits, loss = model(tokens[0], targets[0])
    loss.backward()
    write("logits", logits.detach())
    write("loss", loss.detach().reshape(1))
    grads = to_loom_layout({n: p.grad for n, p in named}, L)
    for name, g in grads.items():
        write("grad_" + name, g)

    # GPT-2 practice, and loom's split: decay matrices and embeddings only.
    decay = [p for _, p in named if p.dim() >= 2]
    no_decay = [p for _, p in named if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    losses, norms = [], []
    for s in range(cfg["steps"]):
        opt.zero_grad(set_to_none=True)
        _, loss = model(tokens[s], targets[s])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg["clip"])
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
    write("losses", torch.tensor(losses, dtype=torch.float64))
    write("norms", torch.tensor(norms, dtype=torch.float64))
    final = to_loom_layout({n: p.detach() for n, p in named}, L)
    for name, t in final.items():
        write("param_" + name, t)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: oracle.py DIR (written by tests/test_oracle.c)")
    d = sys.argv[1]
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    weights = read_safetensors(os.path.join(d, "model.safetensors"))
    expected = hf_shapes(cfg)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise SystemExit(f"model.safetensors: missing tensors {missing}, unexpected tensors {extra}")
    for name, shape in expected.items():
        if list(weights[name].shape) != shape:
            raise SystemExit(f"model.safetensors: {name} has shape {list(weights[name].shape)}, expected {shape}")

    S, B, T = cfg["steps"], cfg["B"], cfg["T"]

    def tokens_file(name):
        with open(os.path.join(d, name), "rb") as f:
            raw = bytearray(f.read())
        if len(raw) != 4 * S * B * T:
            raise SystemExit(f"{name}: {len(raw)} bytes, expected {4 * S * B * T} (int32 {S}x{B}x{T})")
        return torch.frombuffer(raw, dtype=torch.int32).reshape(S, B, T).long()

    tokens, targets = tokens_file("tokens.bin"), tokens_file("targets.bin")
    torch.set_num_threads(1)  # deterministic and small
    for tag, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        def write(name, t, tag=tag):
            t.detach().to(torch.float64).contiguous().numpy().tofile(os.path.join(d, f"{tag}_{name}.bin"))
        run(cfg, weights, tokens, targets, dtype, write)


if __name__ == "__main__":
    main()
