#!/usr/bin/env python3
# bench/torch_gpu.py B STEPS eager|compile: PyTorch on the GPU, for bench/gpu-check.sh.
# GPT-2 124M as loom builds it (pre-LN, tanh GELU, tied head), bf16 autocast,
# fused AdamW, global-norm clipping, flash SDPA. Prints one line per mode.
import math, sys, time, torch, torch.nn as nn, torch.nn.functional as F
L, C, NH, V, T = 12, 768, 12, 50257, 1024
B, STEPS, MODE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.backends.cuda.matmul.allow_tf32 = True
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, 2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(b, t, C))
        return x + s.fcproj(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.lnf = nn.LayerNorm(C)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in s.blocks: x = blk(x)
        logits = F.linear(s.lnf(x), s.wte.weight)
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))
dev = "cuda"
model = GPT().to(dev)
nparams = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
fwd = torch.compile(model) if MODE == "compile" else model
idx = torch.randint(0, V, (B, T), device=dev); tgt = torch.randint(0, V, (B, T), device=dev)
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fwd(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
for _ in range(3): step()
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
for _ in range(STEPS): step()
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / STEPS
tps = B * T / dt
flops_tok = 6 * nparams + 6 * L * C * T
name = torch.cuda.get_device_name()
peak = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
pk = next((v for k, v in peak.items() if k in name), 0)
mfu = f"{100 * tps * flops_tok / pk:.1f}%" if pk else "?"
print(f"torch-{MODE}: {tps:.0f} tok/s, MFU {mfu}, peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, {dt * 1000:.1f} ms/step (B={B}, {name})")
