#!/usr/bin/env python3
"""W8A8 on a Q8_0 file: the rounding error of one product W x with the
activations rounded per row vs per block of 32 (docs/quantization.md,
*Per-block activations*), on the file's own block-0 matrices dequantized
by the gguf package, Gaussian rows and SwiGLU-like rows (the down input).

    PYTHONPATH=.deps/py /usr/bin/python3 bench/q8_act_rounding.py FILE.gguf
"""
import sys
import numpy as np
import gguf
from gguf import quants
r = gguf.GGUFReader(sys.argv[1])
rng = np.random.default_rng(0)
def q_row(x):
    s = np.abs(x).max(-1, keepdims=True) / 127
    return np.clip(np.round(x / s), -127, 127) * s
def q_blk(x):
    b = x.reshape(x.shape[0], -1, 32)
    s = np.abs(b).max(-1, keepdims=True) / 127
    s16 = s.astype(np.float16).astype(np.float32)  # llama.cpp's q8_0 scale is fp16
    return (np.clip(np.round(b / np.where(s16 > 0, s16, 1)), -127, 127) * s16).reshape(x.shape)
for name in ("blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"):
    t = next(t for t in r.tensors if t.name == name)
    W = quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0])).astype(np.float32)
    C = W.shape[1]
    if "down" in name:  # SwiGLU's product silu(g) * u: heavy-tailed
        g, u = rng.standard_normal((64, C)), rng.standard_normal((64, C))
        x = (g / (1 + np.exp(-g)) * u).astype(np.float32)
        kind = "silu(g)*u"
    else:
        x = rng.standard_normal((64, C)).astype(np.float32)
        kind = "gaussian"
    y = x @ W.T
    e = lambda xq: np.linalg.norm(xq @ W.T - y) / np.linalg.norm(y)
    print("%-24s %-10s C=%5d  per-row %.2e  per-32 %.2e  ratio %.2f" % (name, kind, C, e(q_row(x)), e(q_blk(x)), e(q_row(x)) / e(q_blk(x))))
