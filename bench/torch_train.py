#!/usr/bin/python3
"""PyTorch reference for `loom bench train`: the same GPT-2 as loom
(pre-LayerNorm blocks, tanh GELU, output head tied to the token embedding,
float32), or with --llama the same Llama-family model (RMSNorm, rotary
positions, SwiGLU, grouped-query attention; written for Debian's torch 1.13), the same batch, sequence length and thread count, AdamW with
global-norm clipping at 1.0, as loom_train_step does.

It is driven over stdin/stdout so that loom can alternate it with its own
steps in one run (absolute times drift on a shared machine, ratios measured
side by side do not):

  ready                      <- printed once the model is built and warm
  run K      -> times S1 .. SK   (seconds per optimizer step)
  mem        -> maxrss BYTES     (peak resident memory of this process)
  quit

Run by hand: bench/torch_train.py --layers 4 --channels 256 --heads 4 \
  --vocab 50257 --batch 4 --seq 256 --threads 2 --steps 5
"""
import argparse
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        hs = C // self.NH
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, C, NH, V, maxT):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT)).view(1, 1, maxT, maxT))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):  # x (B, H, T, hs), rotate-half pairing as Hugging Face's Llama
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, KV, H, eps):
        super().__init__()
        self.NH, self.KV, self.hs = NH, KV, C // NH
        self.ln1 = RMSNorm(C, eps)
        self.qkv = nn.Linear(C, (NH + 2 * KV) * self.hs, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.ln2 = RMSNorm(C, eps)
        self.gate_up = nn.Linear(C, 2 * H, bias=False)
        self.down = nn.Linear(H, C, bias=False)

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        hs, NH, KV = self.hs, self.NH, self.KV
        q, k, v = self.qkv(self.ln1(x)).split([NH * hs, KV * hs, KV * hs], dim=2)
        q = rope(q.view(B, T, NH, hs).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, KV, hs).transpose(1, 2), cos, sin).repeat_interleave(NH // KV, dim=1)
        v = v.view(B, T, KV, hs).transpose(1, 2).repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        g, u = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    """The Llama family as loom runs it (RMSNorm, rotary positions, SwiGLU,
    grouped-query attention, no biases), for `--llama KV,H,THETA,EPS,TIED`."""

    def __init__(self, L, C, NH, V, maxT, KV, H, theta, eps, tied):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, NH, KV, H, eps) for _ in range(L)])
        self.lnf = RMSNorm(C, eps)
        self.head = None if tied else nn.Linear(C, V, bias=False)
        hs = C // NH
        inv = 1.0 / (theta ** (torch.arange(0, hs, 2).float() / hs))
        f = torch.outer(torch.arange(maxT).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos()[None, None])
        self.register_buffer("sin", emb.sin()[None, None])
        self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT)).view(1, 1, maxT, maxT))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        for b in self.blocks:
            x = b(x, self.mask, cos, sin)
        x = self.lnf(x)
        logits = F.linear(x, self.wte.weight) if self.head is None else self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--channels", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--maxT", type=int, default=0)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=0, help="run this many steps and print times (no stdin protocol)")
    ap.add_argument("--llama", default="", help="KV,H,THETA,EPS,TIED: the Llama family (loom bench train passes it)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    if a.llama:
        kv, h, theta, eps, tied = a.llama.split(",")
        model = Llama(a.layers, a.channels, a.heads, a.vocab, a.maxT or a.seq, int(kv), int(h), float(theta),
                      float(eps), int(tied))
    else:
        model = GPT(a.layers, a.channels, a.heads, a.vocab, a.maxT or a.seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    g = torch.Generator().manual_seed(42)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return time.perf_counter() - t0

    step()  # warm-up: allocator, optimizer state
    if a.steps:
        ts = [step() for _ in range(a.steps)]
        print("times " + " ".join("%.6f" % t for t in ts))
        print("maxrss %d" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
        return
    print("ready", flush=True)
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        if w[0] == "run":
            ts = [step() for _ in range(int(w[1]))]
            print("times " + " ".join("%.6f" % t for t in ts), flush=True)
        elif w[0] == "mem":
            print("maxrss %d" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), flush=True)
        elif w[0] == "quit":
            break


if __name__ == "__main__":
    main()
