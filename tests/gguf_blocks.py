"""Oracle files for tests/test_gguf_blocks.c, written by the gguf package.

usage: gguf_blocks.py OUT_DIR

OUT_DIR/blocks.gguf: one 2-D tensor per block format loom reads, named by
the format ("q4_K"), in shapes (rows, cols) of several blocks per row; q4_0,
q4_1, q5_0, q5_1 and q8_0 are quantized by gguf.quants from random floats,
the k-quants are random bytes whose fp16 scale fields are set to finite
values (any such bytes are a valid block). Also f32, f16 and bf16.
OUT_DIR/ref.gguf: the same names in f32, as gguf.quants.dequantize reads
them: the values loom's dequantization must equal bit for bit.
"""
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

out = sys.argv[1]
rng = np.random.default_rng(1234)


def kquant_bytes(qtype, rows, cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    # the fp16 fields: d (and dmin) first for q4_K/q5_K, d last for q6_K
    fields = [0, 2] if qtype in (T.Q4_K, T.Q5_K) else [size - 2]
    for f in fields:
        scale = rng.uniform(-0.02, 0.02, size=b.shape[0]).astype(np.float16)
        b[:, f:f + 2] = scale.view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, cols // block * size)


# (type, rows, cols): 32-value formats with a width that is not a multiple
# of 64 too (the AVX-512 path's step), k-quants with 2 super-blocks a row.
cases = [
    (T.F32, 3, 64), (T.F16, 3, 64), (T.BF16, 3, 64), (T.Q8_0, 5, 96),
    (T.Q4_0, 5, 96), (T.Q4_1, 5, 96), (T.Q5_0, 5, 96), (T.Q5_1, 5, 96),
    (T.Q4_0, 7, 512), (T.Q5_1, 7, 512),
    (T.Q4_K, 7, 512), (T.Q5_K, 7, 512), (T.Q6_K, 7, 512),
]
w = gguf.GGUFWriter(f"{out}/blocks.gguf", "llama")
ref = gguf.GGUFWriter(f"{out}/ref.gguf", "llama")
for qtype, rows, cols in cases:
    name = f"{qtype.name.lower()}.{cols}"
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        data = kquant_bytes(qtype, rows, cols)
    else:
        x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
        data = quantize(x, qtype) if qtype != T.BF16 else gguf.quants.quantize(x, T.BF16)
    if qtype in (T.F32, T.F16):
        w.add_tensor(name, data)
        vals = dequantize(data, qtype)
    else:
        w.add_tensor(name, data, raw_dtype=qtype)
        vals = dequantize(data, qtype)
    assert np.all(np.isfinite(vals)), name
    ref.add_tensor(name, np.ascontiguousarray(vals.astype(np.float32).reshape(rows, cols)))
for f in (w, ref):
    f.write_header_to_file()
    f.write_kv_data_to_file()
    f.write_tensors_to_file()
    f.close()
print("ok", len(cases))
