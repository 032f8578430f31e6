"""Independent readers for loom's exports (used by tests/test_interop.c and
tests/test_interop.sh). Each mode prints one line per check, "ok NAME ..." or
"bad NAME: why", and a last line "RESULT ok" or "RESULT fail".

  hf DIR TOKENS LOGITS B T     transformers loads DIR (model and tokenizer);
                               its logits on TOKENS (int32, B*T) must equal
                               loom's LOGITS (float32, B*T*V)
  gguf FILE HFDIR [q8_0|f16]   the gguf package (llama.cpp's reader) reads
                               FILE: metadata as llama.cpp's converter writes
                               it for GPT-2, tensor names and shapes, values
                               equal to HFDIR/model.safetensors (f32: exactly;
                               q8_0: within one quantisation step per block)
  loss DIR SHARD B T           transformers' mean next-token loss on the
                               first B*T+1 tokens of a loom shard (printed)
  greedy DIR PROMPT N          transformers' greedy continuation (printed)
  q8raw FILE DUMP L            loom's int8 weights read from the Q8_0 GGUF FILE
                               (DUMP) equal the file's blocks as gguf reads them
"""
import json
import sys

import numpy as np

failed = []


def check(name, ok, why=""):
    print(("ok %s %s" % (name, why)) if ok else ("bad %s: %s" % (name, why)))
    if not ok:
        failed.append(name)


def finish():
    print("RESULT " + ("fail" if failed else "ok"))
    sys.exit(0)


def load_hf(d):
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(d).float().eval()
    tok = AutoTokenizer.from_pretrained(d)
    return torch, model, tok


def mode_hf(d, tokens, logits, B, T):
    torch, model, tok = load_hf(d)
    V = model.config.vocab_size
    ids = np.fromfile(tokens, dtype=np.int32).reshape(B, T)
    ref = np.fromfile(logits, dtype=np.float32).reshape(B, T, -1)[:, :, :V]
    with torch.no_grad():
        got = model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    err = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max())
    check("hf_logits", err <= 1e-4 * max(scale, 1.0), "max |transformers - loom| = %.3g (max |logit| %.3g)" % (err, scale))
    text = "In the beginning God created"
    check("hf_tokenizer_loads", len(tok(text)["input_ids"]) > 0, "%s encodes %r" % (type(tok).__name__, text))
    finish()


EXPECT_KEYS = {
    "general.architecture": "gpt2",
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt-2",
}


def field_value(f):
    from gguf import GGUFValueType
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    if f.types[0] == GGUFValueType.ARRAY:
        return len(f.data)
    return f.parts[f.data[0]][0]


def read_safetensors(path):
    """The format by hand (8-byte header length, JSON header, data), F32 only,
    so that this check needs only numpy next to the gguf package."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", v["dtype"]
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
    return out


def mode_gguf(path, hfdir, qtype):
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    r = gguf.GGUFReader(path)
    cfg = json.load(open(hfdir + "/config.json"))
    C, L, V, T, NH = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"], cfg["n_head"]
    f = r.fields
    want = dict(EXPECT_KEYS)
    want.update({"gpt2.block_count": L, "gpt2.context_length": T, "gpt2.embedding_length": C,
                 "gpt2.feed_forward_length": 4 * C, "gpt2.attention.head_count": NH,
                 "tokenizer.ggml.tokens": V, "tokenizer.ggml.token_type": V})
    for k, v in want.items():
        got = field_value(f[k]) if k in f else None
        check("gguf_key " + k, got == v, "%r (want %r)" % (got, v))
    eps = field_value(f["gpt2.attention.layer_norm_epsilon"])
    check("gguf_key layer_norm_epsilon", abs(eps - 1e-5) < 1e-9, str(eps))
    nm = field_value(f["tokenizer.ggml.merges"]) if "tokenizer.ggml.merges" in f else None
    check("gguf_merges", nm is not None and nm > 0, "%s merges" % nm)
    types = list(f["tokenizer.ggml.token_type"].contents()) if "tokenizer.ggml.token_type" in f else []
    eot = field_value(f["tokenizer.ggml.eos_token_id"]) if "tokenizer.ggml.eos_token_id" in f else None
    check("gguf_token_types", eot is not None and types[eot] == 3 and types[-1] == 5 and types[0] == 1,
          "eos %s CONTROL, padding ids UNUSED, others NORMAL" % eot)
    check("gguf_version", r.fields["GGUF.version"].parts[-1][0] == 3, "")
    st = read_safetensors(hfdir + "/model.safetensors")
    names = {"token_embd.weight": ("wte.weight", False), "position_embd.weight": ("wpe.weight", False),
             "output_norm.weight": ("ln_f.weight", False), "output_norm.bias": ("ln_f.bias", False)}
    per = {"attn_norm": ("ln_1", False), "attn_qkv": ("attn.c_attn", True), "attn_output": ("attn.c_proj", True),
           "ffn_norm": ("ln_2", False), "ffn_up": ("mlp.c_fc", True), "ffn_down": ("mlp.c_proj", True)}
    for l in range(L):
        for g, (h, conv) in per.items():
            names["blk.%d.%s.weight" % (l, g)] = ("h.%d.%s.weight" % (l, h), conv)
            names["blk.%d.%s.bias" % (l, g)] = ("h.%d.%s.bias" % (l, h), False)
    tensors = {t.name: t for t in r.tensors}
    check("gguf_tensor_names", set(tensors) == set(names), "extra %s missing %s" % (
        sorted(set(tensors) - set(names))[:3], sorted(set(names) - set(tensors))[:3]))
    worst = 0.0
    for g, (h, conv) in names.items():
        if g not in tensors:
            continue
        t = tensors[g]
        ref = st[h].astype(np.float32)
        if conv:
            ref = ref.T  # Conv1D (in, out) -> (out, in), as the converter transposes
        # gguf lists ne0 first: [cols, rows]
        shape_ok = list(t.shape) == list(reversed(ref.shape))
        check("gguf_shape " + g, shape_ok, "%s vs %s" % (list(t.shape), list(ref.shape)))
        if not shape_ok:
            continue
        if t.tensor_type == Q.F32:
            vals = np.array(t.data).reshape(ref.shape)
            if qtype == "f32" or ref.ndim == 1:
                ok = np.array_equal(vals, ref)
                if not ok:
                    check("gguf_f32_exact " + g, False, "max diff %g" % float(np.abs(vals - ref).max()))
            continue
        vals = dequantize(t.data, t.tensor_type).reshape(ref.shape)
        if t.tensor_type == Q.Q8_0:
            blocks = ref.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127.0  # the block's scale d
            err = np.abs(vals.reshape(-1, 32) - blocks)
            ratio = float((err / np.maximum(step * 1.001, 1e-30)).max())
            worst = max(worst, ratio)
            if ratio > 1.0:
                check("gguf_q8_0_within_step " + g, False, "error %.3f steps" % ratio)
        elif t.tensor_type == Q.F16:
            ok = np.array_equal(vals, ref.astype(np.float16).astype(np.float32))
            if not ok:
                check("gguf_f16_round " + g, False, "differs from numpy's float16 rounding")
        else:
            check("gguf_type " + g, False, "unexpected type %s" % t.tensor_type.name)
    types = sorted({t.tensor_type.name for t in r.tensors})
    check("gguf_values", not failed, "%s file, tensor types %s, q8_0 worst error %.3f of a step" % (qtype, types, worst))
    finish()


def mode_q8raw(path, dump, L):
    """loom's int8 view of a Q8_0 GGUF (DUMP: per layer, for attn_qkv,
    attn_output, ffn_up, ffn_down: the fp32 block scales then the int8
    values, row-major) must be the file's bytes as the gguf package reads
    them: each block's fp16 d widened exactly, its 32 int8 q unchanged."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    raw = open(dump, "rb").read()
    at, bad, n = 0, [], 0
    for l in range(L):
        for g in ("attn_qkv", "attn_output", "ffn_up", "ffn_down"):
            t = tensors["blk.%d.%s.weight" % (l, g)]
            if t.tensor_type != Q.Q8_0:
                bad.append("%s is %s" % (t.name, t.tensor_type.name))
                continue
            blocks = np.frombuffer(np.asarray(t.data).tobytes(), dtype=np.uint8).reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32).ravel()
            q = blocks[:, 2:].copy().view(np.int8).ravel()
            ls = np.frombuffer(raw, dtype=np.float32, count=d.size, offset=at)
            lq = np.frombuffer(raw, dtype=np.int8, count=q.size, offset=at + 4 * d.size)
            at += 4 * d.size + q.size
            deq = dequantize(t.data, t.tensor_type).ravel()
            mine = (lq.reshape(-1, 32).astype(np.float32) * ls[:, None]).ravel()
            if not (np.array_equal(ls, d) and np.array_equal(lq, q) and np.array_equal(mine, deq)):
                bad.append(t.name)
            n += 1
    check("q8_0_int8_bytes", not bad and at == len(raw),
          "%d Q8_0 matrices: loom's int8 values and block scales equal the file's (gguf reader) %s" % (n, bad[:3]))
    finish()


def mode_loss(d, shard, B, T):
    torch, model, tok = load_hf(d)
    hdr = np.fromfile(shard, dtype=np.int32, count=256)
    dt = np.uint16 if hdr[6] == 2 else np.uint32
    toks = np.fromfile(shard, dtype=dt, offset=1024)[: B * T + 1].astype(np.int64)
    x = torch.tensor(toks[:-1]).view(B, T)
    y = torch.tensor(toks[1:]).view(B, T)
    with torch.no_grad():
        logits = model(x).logits.double()
        loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1), y.reshape(-1))
    print("%.9f" % loss.item())


def mode_greedy(d, prompt, n):
    torch, model, tok = load_hf(d)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=model.config.eos_token_id,
                             attention_mask=torch.ones_like(ids))
    # Raw bytes, as loom prints them: tok.decode would turn a token that ends
    # inside a UTF-8 character into U+FFFD.
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    inv = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tok.all_special_tokens)
    raw = b"".join(t.encode() if t in special else bytes(inv[c] for c in t) for t in tok.convert_ids_to_tokens(out[0]))
    sys.stdout.buffer.write(raw)


if __name__ == "__main__":
    m, a = sys.argv[1], sys.argv[2:]
    if m == "hf":
        mode_hf(a[0], a[1], a[2], int(a[3]), int(a[4]))
    elif m == "gguf":
        mode_gguf(a[0], a[1], a[2] if len(a) > 2 else "f32")
    elif m == "q8raw":
        mode_q8raw(a[0], a[1], int(a[2]))
    elif m == "loss":
        mode_loss(a[0], a[1], int(a[2]), int(a[3]))
    elif m == "greedy":
        mode_greedy(a[0], a[1], int(a[2]))
    else:
        sys.exit("unknown mode " + m)
