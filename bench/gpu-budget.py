#!/usr/bin/env python3
"""gpu-budget: the FLOP and byte budget of one loom training step on a GPU,
kernel by kernel, with each kernel's roofline time (the larger of FLOPs /
peak and bytes / bandwidth), so that a measured profile (nsys, ncu) can be
read against it. Written into docs/cuda.md, "The training step: budget and
roofline"; re-run it when a kernel changes.

Usage: bench/gpu-budget.py [--batch 32] [--seq 1024] [--peak 989e12] [--bw 4.8e12]
       [--markdown]

The model is GPT-2 124M as loom builds it (L=12, C=768, NH=12, V=50257
padded to 50304, tied head), bf16 activations (2 bytes), fp32 parameters,
gradients and AdamW moments (4 bytes), the device-resident step with CUDA
graphs (docs/cuda.md). Defaults: H200 SXM, 989 TFLOP/s dense bf16,
4.8 TB/s. Bytes count each tensor read or written once per kernel (what a
kernel that streams must move at least); FLOPs count multiply-adds as 2.
"""
import argparse

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--peak", type=float, default=989e12)
ap.add_argument("--bw", type=float, default=4.8e12)
ap.add_argument("--markdown", action="store_true")
# what share of the roofline each kind of kernel reaches, a priori (cuBLASLt
# bf16 GEMMs of these shapes on Hopper ~70% of dense peak, cuDNN's flash
# attention ~55%, streaming kernels ~80% of the bandwidth): the prediction
# a profile is compared with
ap.add_argument("--eff-gemm", type=float, default=0.70)
ap.add_argument("--eff-attn", type=float, default=0.55)
ap.add_argument("--eff-mem", type=float, default=0.80)
a = ap.parse_args()

L, C, NH, V, Vp = 12, 768, 12, 50257, 50304
B, T = a.batch, a.seq
N = B * T          # rows (tokens) per step
A, F = 2, 4        # bytes: activation (bf16), fp32
act = N * C * A    # one (N, C) activation tensor

# parameters of the linear layers (the weights the GEMMs read), and all
lin = L * (3 * C * C + C * C + 4 * C * C + 4 * C * C)
params = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
model_flops = 6.0 * (params - T * C) + 6.0 * L * C * T  # per token: loom_gpt_flops_per_token

rows = []  # (name, count per step, flops per call, bytes per call, note)


def k(name, count, flops, nbytes, note=""):
    rows.append((name, count, flops, nbytes, note))


def gemm(name, count, m, n, kk, a_bytes, b_bytes, out_bytes, note=""):
    k(name, count, 2.0 * m * n * kk, a_bytes + b_bytes + out_bytes, note)


# ---- forward, per layer ----
k("fwd residual+layernorm (fused)", L, 10.0 * N * C, 4 * act + 2 * N * F, "reads a, b; writes res, out")
gemm("fwd qkv GEMM (+bias)", L, N, 3 * C, C, act, 3 * C * C * A, 3 * act)
k("fwd attention (cuDNN SDPA, causal)", L, 2.0 * 2 * B * T * T * C / 2, 3 * act + act + B * NH * T * F,
  "QK^T and PV over the causal half")
gemm("fwd attn proj GEMM (+bias)", L, N, C, C, act, C * C * A, act)
gemm("fwd fc GEMM + GELU epilogue", L, N, 4 * C, C, act, 4 * C * C * A, 2 * 4 * act, "writes pre and gelu(pre)")
gemm("fwd fcproj GEMM (+bias)", L, N, C, 4 * C, 4 * act, 4 * C * C * A, act)
# ---- head and loss ----
k("fwd final layernorm", 1, 10.0 * N * C, 2 * act + 2 * N * F)
gemm("fwd lm head GEMM", 1, N, Vp, C, act, Vp * C * A, N * Vp * A)
k("cross-entropy + its gradient, one pass", 1, 5.0 * N * Vp, 2 * N * Vp * A, "row kept in shared memory")
k("  ... in two passes (row too wide for shared memory)", 0, 5.0 * N * Vp, 3 * N * Vp * A, "read, then read + write")
gemm("bwd lm head dinp GEMM", 1, N, C, Vp, N * Vp * A, Vp * C * A, act)
gemm("bwd lm head dW GEMM", 1, Vp, C, N, N * Vp * A, act, Vp * C * F * 2, "dW fp32 read + write (accumulate)")
k("bwd final layernorm", 1, 12.0 * N * C, 4 * act + 2 * N * F)
# ---- backward, per layer ----
gemm("bwd fcproj dinp GEMM + DGELU epilogue", L, N, 4 * C, C, act, 4 * C * C * A, 4 * act + 4 * act, "reads pre")
gemm("bwd fcproj dW GEMM + BGRADB", L, C, 4 * C, N, act, 4 * act, 4 * C * C * F * 2)
gemm("bwd fc dinp GEMM", L, N, C, 4 * C, 4 * act, 4 * C * C * A, act)
gemm("bwd fc dW GEMM + BGRADB", L, 4 * C, C, N, 4 * act, act, 4 * C * C * F * 2)
k("bwd layernorm 2 (per-warp dw/db partials)", L, 12.0 * N * C, 4 * act + 2 * N * F)
gemm("bwd attn proj dinp GEMM", L, N, C, C, act, C * C * A, act)
gemm("bwd attn proj dW GEMM + BGRADB", L, C, C, N, act, act, C * C * F * 2)
k("bwd attention (cuDNN SDPA, deterministic)", L, 2.5 * 2.0 * 2 * B * T * T * C / 2, 3 * act + 2 * act + 3 * act,
  "reads q,k,v,o,do; writes dq,dk,dv")
gemm("bwd qkv dinp GEMM", L, N, C, 3 * C, 3 * act, 3 * C * C * A, act)
gemm("bwd qkv dW GEMM + BGRADB", L, 3 * C, C, N, 3 * act, act, 3 * C * C * F * 2)
k("bwd layernorm 1", L, 12.0 * N * C, 4 * act + 2 * N * F)
k("bwd residual adds (dinp accumulate)", 2 * L, 1.0 * N * C, 3 * act)
k("bwd encoder (sorted dwte, dwpe)", 1, 2.0 * N * C, act + N * C * F + T * C * F * 2 + 4 * N * 4)
# ---- the optimizer and the rest ----
k("zero gradients (once per step)", 1, 0, params * F)
k("weights fp32 -> bf16 per GEMM call (fwd + bwd)", 2, 0, lin * (F + A) + Vp * C * (F + A),
  "today; a bf16 copy refreshed by AdamW removes it")
k("sumsq of the gradients", 1, 2.0 * params, params * F)
k("AdamW (fused, float4)", 1, 12.0 * params, params * F * 7, "p, g, m, v read; p, m, v written")
k("  ... writing the bf16 weight copy too", 0, 0, lin * A, "goal: +2 bytes/weight")

def predicted(name, f, b):
    """Seconds a kernel is predicted to take: its roofline over the share of it reached."""
    tf, tb = f / a.peak, b / a.bw
    if tf <= tb:
        return tb / a.eff_mem
    return tf / (a.eff_attn if "attention" in name else a.eff_gemm)


flops_total = sum(c * f for _, c, f, _, _ in rows)
bytes_total = sum(c * b for _, c, _, b, _ in rows)
t_total = sum(c * max(f / a.peak, b / a.bw) for _, c, f, b, _ in rows)
t_pred = sum(c * predicted(n, f, b) for n, c, f, b, _ in rows)
step_model_flops = model_flops * N

w = [44, 5, 10, 10, 10, 10]
if a.markdown:
    print(f"GPT-2 124M, B={B}, T={T}, bf16 activations; {a.peak / 1e12:.0f} TFLOP/s, {a.bw / 1e12:.1f} TB/s\n")
    print("| kernel | calls | GFLOP/call | MB/call | roofline us/call | predicted us/call | bound | note |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
for name, c, f, b, note in rows:
    tf, tb = f / a.peak, b / a.bw
    t = max(tf, tb)
    bound = "compute" if tf > tb else "memory"
    if a.markdown:
        print(f"| {name} | {c} | {f / 1e9:.1f} | {b / 1e6:.1f} | {t * 1e6:.1f} | {predicted(name, f, b) * 1e6:.1f} | {bound} | {note} |")
    else:
        print(f"{name:<{w[0]}} {c:>{w[1]}} {f / 1e9:>{w[2]}.1f} GF {b / 1e6:>{w[3]}.1f} MB {t * 1e6:>{w[4]}.1f} us "
              f"{predicted(name, f, b) * 1e6:>{w[5]}.1f} us {bound}")
mfu_roof = step_model_flops / (t_total * a.peak)
print()
print(f"per step: {flops_total / 1e12:.2f} TFLOP executed, {bytes_total / 1e9:.2f} GB moved, "
      f"roofline {t_total * 1e3:.1f} ms (every kernel at its roofline, none overlapped)")
print(f"model FLOPs (loom_gpt_flops_per_token x {N} tokens): {step_model_flops / 1e12:.2f} TFLOP; "
      f"MFU at the roofline {100 * mfu_roof:.1f}%")
print(f"predicted (GEMM {a.eff_gemm:.0%}, attention {a.eff_attn:.0%}, memory {a.eff_mem:.0%} of their roofline): "
      f"{t_pred * 1e3:.1f} ms per step, {N / t_pred:.0f} tokens/s, MFU {100 * step_model_flops / (t_pred * a.peak):.1f}%")
print(f"45% MFU needs {step_model_flops / (0.45 * a.peak) * 1e3:.1f} ms per step = "
      f"{N / (step_model_flops / (0.45 * a.peak)):.0f} tokens/s")
