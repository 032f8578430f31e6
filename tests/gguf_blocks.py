"""Oracle files for tests/test_gguf_blocks.c, written by the gguf package.

usage: gguf_blocks.py OUT_DIR [gpt2|llama]

OUT_DIR/blocks.gguf: one 2-D tensor per block format loom reads, named by
the format ("q4_K"), in shapes (rows, cols) of several blocks per row; q4_0,
q4_1, q5_0, q5_1 and q8_0 are quantized by gguf.quants from random floats,
the k-quants are random bytes whose fp16 scale fields are set to finite
values (any such bytes are a valid block). Also f32, f16 and bf16.
OUT_DIR/ref.gguf: the same names in f32, as gguf.quants.dequantize reads
them: the values loom's dequantization must equal bit for bit.
With `gpt2`, OUT_DIR/gpt2.gguf: a small GPT-2 (C 256, 2 layers) whose
linear weights are in one block format each (k-quants, 32-value formats
and q8_0 mixed, as a Q4_K_M file mixes them), the rest f32, no tokenizer.
With `gemm`, OUT_DIR/gemm.gguf and gemm_ref.gguf: one 100 x 768 tensor per
block format and its values (tests/test_kquant_gemm.c).
With `llama_q4k`, OUT_DIR/llama_q4k.gguf: a Llama (C 512, 4 layers, V
4096) with every matrix in blocks (q4_K, ffn_down q8_0, tied head), and
llama_nan.gguf / llama_inf.gguf: copies with one NaN or infinite scale.
With `llama_ends`, OUT_DIR/llama_ends.gguf: the same with token_embd in
q6_K and output in q8_0. With `llama`, OUT_DIR/llama.gguf: a small Llama (C 256, 4 heads, 2 kv
heads, H 512, untied head) as llama.cpp's convert_hf_to_gguf.py lays it
out (attn_q and attn_k rows permuted by its `permute`), layer 0 in f32,
layer 1 in block formats; OUT_DIR/llama_expect.gguf: loom's fused
parameters (qkvw.N = q, k, v in Hugging Face's row order; fcw.N = gate,
up; ...) as numpy computes them from the same values.
"""
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

out = sys.argv[1]
rng = np.random.default_rng(1234)


def kquant_bytes(qtype, rows, cols, scale=0.02):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    # the fp16 fields: d (and dmin) first for q4_K/q5_K, d last for q6_K
    fields = [0, 2] if qtype in (T.Q4_K, T.Q5_K) else [size - 2]
    for f in fields:
        d = rng.uniform(-scale, scale, size=b.shape[0]).astype(np.float16)
        b[:, f:f + 2] = d.view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, cols // block * size)


def block_tensor(qtype, rows, cols, std):
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):  # values d * sc * q: sc, q < 64
        return kquant_bytes(qtype, rows, cols, std / 400)
    return quantize(rng.standard_normal((rows, cols)).astype(np.float32) * std, qtype)


def gpt2_file(path):
    C, L, V, T_ = 256, 2, 300, 64
    w = gguf.GGUFWriter(path, "gpt2")
    for k, v in (("block_count", L), ("context_length", T_), ("embedding_length", C),
                 ("feed_forward_length", 4 * C), ("attention.head_count", 4)):
        w.add_uint32(f"gpt2.{k}", v)
    w.add_float32("gpt2.attention.layer_norm_epsilon", 1e-5)
    f32 = lambda *shape, std=0.02: (rng.standard_normal(shape) * std).astype(np.float32)
    w.add_tensor("token_embd.weight", f32(V, C))
    w.add_tensor("position_embd.weight", f32(T_, C, std=0.01))
    types = [(T.Q4_K, T.Q6_K, T.Q5_K, T.Q4_K), (T.Q5_0, T.Q8_0, T.Q4_1, T.Q5_1)]
    for l in range(L):
        for name, rows, cols, qt in (("attn_qkv", 3 * C, C, types[l][0]), ("attn_output", C, C, types[l][1]),
                                     ("ffn_up", 4 * C, C, types[l][2]), ("ffn_down", C, 4 * C, types[l][3])):
            w.add_tensor(f"blk.{l}.{name}.weight", block_tensor(qt, rows, cols, 0.02), raw_dtype=qt)
            w.add_tensor(f"blk.{l}.{name}.bias", f32(rows, std=0.01))
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{l}.{name}.weight", 1 + f32(C, std=0.1))
            w.add_tensor(f"blk.{l}.{name}.bias", f32(C, std=0.1))
    w.add_tensor("output_norm.weight", 1 + f32(C, std=0.1))
    w.add_tensor("output_norm.bias", f32(C, std=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_writer(path, C, L, H, NH, KV, ctx):
    """A GGUFWriter for a llama file with its shape's keys written."""
    w = gguf.GGUFWriter(path, "llama")
    for k, v in (("block_count", L), ("context_length", ctx), ("embedding_length", C), ("feed_forward_length", H),
                 ("attention.head_count", NH), ("attention.head_count_kv", KV), ("rope.dimension_count", C // NH)):
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    return w


def llama_file(path, expect_path, ends=False):
    C, L, V, H, NH, KV = 256, 2, 300, 512, 4, 2
    hs = C // NH
    w = llama_writer(path, C, L, H, NH, KV, 128)
    w.add_float32("llama.rope.freq_base", 500000.0)
    ex = gguf.GGUFWriter(expect_path, "llama")
    f32 = lambda *shape, std=0.02: (rng.standard_normal(shape) * std).astype(np.float32)
    top = {"token_embd.weight": ("wte", f32(V, C)), "output.weight": ("lm_head", f32(V, C)),
           "output_norm.weight": ("lnfw", 1 + f32(C, std=0.1))}
    hfw = {}  # the weights in Hugging Face's layout, for llama_logits
    for name, (loom, x) in top.items():
        qt = {"token_embd.weight": T.Q6_K, "output.weight": T.Q8_0}.get(name) if ends else None
        if qt is not None:  # stored in a block format: the embedding and the head run on the file's rows
            data = kquant_bytes(qt, *x.shape) if qt == T.Q6_K else quantize(x, qt)
            w.add_tensor(name, data, raw_dtype=qt)
            x = np.asarray(dequantize(data, qt), dtype=np.float32).reshape(x.shape)
            top[name] = (loom, x)
        else:
            w.add_tensor(name, x)
        ex.add_tensor(loom, x)
        hfw[loom] = x
    kinds = [dict(q=T.F32, k=T.F32, v=T.F32, o=T.F32, gate=T.F32, up=T.F32, down=T.F32),
             dict(q=T.Q4_K, k=T.Q4_K, v=T.Q4_K, o=T.Q6_K, gate=T.Q5_K, up=T.Q4_K, down=T.Q8_0)]
    for l in range(L):
        parts = {}
        for key, name, rows, cols, heads in (("q", "attn_q", NH * hs, C, NH), ("k", "attn_k", KV * hs, C, KV),
                                             ("v", "attn_v", KV * hs, C, 0), ("o", "attn_output", C, C, 0),
                                             ("gate", "ffn_gate", H, C, 0), ("up", "ffn_up", H, C, 0), ("down", "ffn_down", C, H, 0)):
            qt = kinds[l][key]
            hf = f32(rows, cols)
            stored = permute(hf, heads) if heads else hf
            if qt == T.F32:
                w.add_tensor(f"blk.{l}.{name}.weight", np.ascontiguousarray(stored))
                vals = stored
            else:
                data = block_tensor(qt, rows, cols, 0.02) if qt != T.Q8_0 else quantize(stored, qt)
                w.add_tensor(f"blk.{l}.{name}.weight", data, raw_dtype=qt)
                vals = dequantize(data, qt).reshape(rows, cols)
            parts[key] = unpermute(vals, heads) if heads else vals
            if qt == T.F32 and heads:
                assert np.array_equal(parts[key], hf)
        norms = []
        for name, loom in (("attn_norm", "ln1w"), ("ffn_norm", "ln2w")):
            x = 1 + f32(C, std=0.1)
            w.add_tensor(f"blk.{l}.{name}.weight", x)
            ex.add_tensor(f"{loom}.{l}", x)
            norms.append(x)
        ex.add_tensor(f"qkvw.{l}", np.ascontiguousarray(np.concatenate([parts["q"], parts["k"], parts["v"]])))
        ex.add_tensor(f"attprojw.{l}", np.ascontiguousarray(parts["o"]))
        ex.add_tensor(f"fcw.{l}", np.ascontiguousarray(np.concatenate([parts["gate"], parts["up"]])))
        ex.add_tensor(f"fcprojw.{l}", np.ascontiguousarray(parts["down"]))
        for key, x in parts.items():
            hfw[f"{l}.{key}"] = np.asarray(x, dtype=np.float32)
        hfw[f"{l}.ln1"], hfw[f"{l}.ln2"] = norms
    for f in (w, ex):
        f.write_header_to_file()
        f.write_kv_data_to_file()
        f.write_tensors_to_file()
        f.close()
    np.savez(expect_path.replace(".gguf", ".npz"), **hfw)


def llama_logits(npz, out_path, T=40):
    """transformers' LlamaForCausalLM (float64) on the Hugging Face-order
    weights: logits (T, V) of tokens (i * 37 + 5) % V, raw float64."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    hf = np.load(npz)
    V, C = hf["wte"].shape
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=hf["0.gate"].shape[0], num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                      rope_theta=500000.0, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).double().eval()
    sd = {"model.embed_tokens.weight": hf["wte"], "lm_head.weight": hf["lm_head"], "model.norm.weight": hf["lnfw"]}
    for l in range(2):
        p = f"model.layers.{l}."
        for k, name in (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
                        ("o", "self_attn.o_proj"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj")):
            sd[p + name + ".weight"] = hf[f"{l}.{k}"]
        sd[p + "input_layernorm.weight"], sd[p + "post_attention_layernorm.weight"] = hf[f"{l}.ln1"], hf[f"{l}.ln2"]
    m.load_state_dict({k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in sd.items()}, strict=False)
    ids = torch.tensor([[(i * 37 + 5) % V for i in range(T)]])
    with torch.no_grad():
        logits = m(ids).logits[0].numpy().astype(np.float64)
    logits.tofile(out_path)


if len(sys.argv) > 3 and sys.argv[2] == "llama_logits":
    llama_logits(f"{out}/llama_expect.npz", sys.argv[3])
    print("ok llama_logits")
    sys.exit(0)


def compare(loom_path, orig_path):
    """loom's f32 export of the llama file against the file itself."""
    a, b = gguf.GGUFReader(loom_path), gguf.GGUFReader(orig_path)
    assert a.fields["general.architecture"].contents() == "llama"
    for k in b.fields:
        if k.startswith("llama."):
            assert k in a.fields and a.fields[k].contents() == b.fields[k].contents(), k
    ta = {t.name: t for t in a.tensors}
    for t in b.tensors:
        assert t.name in ta, t.name
        got = ta[t.name]
        assert got.tensor_type == T.F32 and list(got.shape) == list(t.shape), t.name
        want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).ravel()
        assert np.array_equal(np.asarray(got.data).ravel().view(np.uint32), want.view(np.uint32)), t.name
    assert len(a.tensors) == len(b.tensors)


if len(sys.argv) > 3 and sys.argv[2] == "compare":
    compare(sys.argv[3], f"{out}/llama.gguf")
    print("ok compare")
    sys.exit(0)

if len(sys.argv) > 2 and sys.argv[2] == "llama_ends":
    llama_file(f"{out}/llama_ends.gguf", f"{out}/llama_ends_expect.gguf", ends=True)
    print("ok llama_ends")
    sys.exit(0)

if len(sys.argv) > 2 and sys.argv[2] == "llama":
    llama_file(f"{out}/llama.gguf", f"{out}/llama_expect.gguf")
    print("ok llama")
    sys.exit(0)

def llama_q4k_file(path):
    """A Llama whose every matrix is stored in blocks, as a Q4_K_M file
    is: q4_K (random bytes, finite scales), ffn_down q8_0 (quantized by
    gguf), the head tied to the q4_K embedding; fp32 would be ~7x its
    bytes. Then two copies with one scale made non-finite: a q8_0 block's
    d NaN (llama_nan.gguf: blk.1.ffn_down.weight, block 5) and a q4_K
    block's dmin infinite (llama_inf.gguf: blk.2.ffn_up.weight, block 9)."""
    import shutil
    C, L, V, H, NH, KV = 512, 4, 4096, 1536, 8, 4
    hs = C // NH
    w = llama_writer(path, C, L, H, NH, KV, 256)
    w.add_tensor("token_embd.weight", kquant_bytes(T.Q4_K, V, C, 0.02 / 400), raw_dtype=T.Q4_K)
    w.add_tensor("output_norm.weight", np.ones(C, dtype=np.float32))
    for l in range(L):
        for name, rows, cols in (("attn_q", NH * hs, C), ("attn_k", KV * hs, C), ("attn_v", KV * hs, C), ("attn_output", C, C),
                                 ("ffn_gate", H, C), ("ffn_up", H, C), ("ffn_down", C, H)):
            qt = T.Q8_0 if name == "ffn_down" else T.Q4_K
            w.add_tensor(f"blk.{l}.{name}.weight", block_tensor(qt, rows, cols, 0.02), raw_dtype=qt)
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{l}.{name}.weight", (1 + rng.standard_normal(C) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, tensor, at in (("llama_nan.gguf", "blk.1.ffn_down.weight", 5 * 34), ("llama_inf.gguf", "blk.2.ffn_up.weight", 9 * 144 + 2)):
        bad = f"{out}/{name}"
        shutil.copy(path, bad)
        t = [t for t in gguf.GGUFReader(bad).tensors if t.name == tensor][0]
        with open(bad, "r+b") as f:
            f.seek(int(t.data_offset) + at)
            f.write(np.array([0x7e00 if "nan" in name else 0x7c00], dtype=np.uint16).tobytes())


if len(sys.argv) > 2 and sys.argv[2] == "llama_q4k":
    llama_q4k_file(f"{out}/llama_q4k.gguf")
    print("ok llama_q4k")
    sys.exit(0)

def rope(path, factor, low, high, orig):
    """rope_freqs.weight of loom's file against what llama.cpp's converter
    (conversion/llama.py, generate_extra_tensors) computes for the same
    rope_scaling: the same float32 values within float32 rounding."""
    import math
    r = gguf.GGUFReader(path)
    base = float(r.fields["llama.rope.freq_base"].contents())
    dim = int(r.fields["llama.rope.dimension_count"].contents())
    freqs = 1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor, low, high, orig = float(factor), float(low), float(high), float(orig)
    want = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < orig / high:
            want.append(1)
        elif wavelen > orig / low:
            want.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            want.append(1 / ((1 - smooth) / factor + smooth))
    got = [t for t in r.tensors if t.name == "rope_freqs.weight"]
    assert len(got) == 1 and got[0].tensor_type == T.F32, "no f32 rope_freqs.weight"
    g = np.asarray(got[0].data, dtype=np.float64).ravel()
    want = np.asarray(want, dtype=np.float64)
    assert g.shape == want.shape and np.max(np.abs(g - want) / want) < 1e-5, (g, want)
    assert len(r.tensors) == 1 + 3 + 2 * 9, len(r.tensors)


if len(sys.argv) > 3 and sys.argv[2] == "rope":
    rope(*sys.argv[3:8])
    print("ok rope")
    sys.exit(0)

if len(sys.argv) > 2 and sys.argv[2] == "gpt2":
    gpt2_file(f"{out}/gpt2.gguf")
    print("ok gpt2")
    sys.exit(0)

def gemm_files(path, ref_path):
    """For tests/test_kquant_gemm.c: one tensor per block format, 100 rows
    (not a multiple of the GEMM's panels) of 768 values (3 super-blocks),
    and the same values as gguf.quants.dequantize reads them, in f32."""
    w, ref = gguf.GGUFWriter(path, "llama"), gguf.GGUFWriter(ref_path, "llama")
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K):
        data = block_tensor(qtype, 100, 768, 0.05)
        w.add_tensor(qtype.name.lower(), data, raw_dtype=qtype)
        ref.add_tensor(qtype.name.lower(), np.ascontiguousarray(dequantize(data, qtype).astype(np.float32).reshape(100, 768)))
    for f in (w, ref):
        f.write_header_to_file()
        f.write_kv_data_to_file()
        f.write_tensors_to_file()
        f.close()


if len(sys.argv) > 2 and sys.argv[2] == "gemm":
    gemm_files(f"{out}/gemm.gguf", f"{out}/gemm_ref.gguf")
    print("ok gemm")
    sys.exit(0)

# (type, rows, cols): 32-value formats with widths of fewer than 8 blocks,
# of whole groups of 8 (the x86 kernels' step) and of 18 blocks (2 groups
# and 2 more, smollm2's 576), k-quants with 2 and 9 super-blocks a row (9:
# more blocks than the kernels' 8 partial sums).
cases = [
    (T.F32, 3, 64), (T.F16, 3, 64), (T.BF16, 3, 64), (T.Q8_0, 5, 96),
    (T.Q4_0, 5, 96), (T.Q4_1, 5, 96), (T.Q5_0, 5, 96), (T.Q5_1, 5, 96),
    (T.Q4_0, 7, 512), (T.Q5_1, 7, 512), (T.Q4_1, 5, 576), (T.Q5_0, 5, 576),
    (T.Q4_K, 3, 2304), (T.Q6_K, 3, 2304),
    (T.Q4_K, 7, 512), (T.Q5_K, 7, 512), (T.Q6_K, 7, 512),  # the broken-file cases expect these last
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
