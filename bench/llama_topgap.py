"""Where loom's greedy tokens and llama.cpp's part, is it a near tie? For
bench/llama-kquant.sh:

  PYTHONPATH=LLAMA_SRC/gguf-py:.deps/hf44:.deps/py python3 bench/llama_topgap.py \
      FILE.gguf HF_DIR PROMPT LLAMA_TEXT LOOM_OUT.jsonl

LLAMA_TEXT is llama-simple's output (BOS text, prompt, then its tokens),
LOOM_OUT.jsonl `loom generate`'s (token_ids). Prints "equal N" when loom's
tokens spell llama.cpp's text; else, at the first token that does not: the
reference logits there, those of transformers' LlamaForCausalLM (float64)
on the file's weights dequantized by gguf.quants (what both engines
approximate), for loom's token and llama.cpp's (the token whose text starts
llama.cpp's remaining text; the likeliest if several do), and the format's
error E: how far the same reference moves when every linear layer's input
is rounded to int8 blocks of 32 as the quantized formats' dot products
round them (max over the vocabulary). Exit 0 when the two tokens' reference
logits are within 2E (each engine may be off by E), 1 otherwise.
"""
import json
import sys

import numpy as np


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tok, special):
    dec = byte_decoder()
    out = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        s = tok.id_to_token(i)
        if s is None:
            out.append(b"")
        elif s in special:
            out.append(s.encode())
        else:
            out.append(bytes(dec[c] for c in s))
    return out


def reference(gguf_path, hf_dir):
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig.from_pretrained(hf_dir)
    m = LlamaForCausalLM(cfg).double().eval()
    r = gguf.GGUFReader(gguf_path)
    nh, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    names = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    sd = {}
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "rope_freqs":
            continue
        v = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        v = v.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else v.reshape(-1)
        if parts[0] == "blk":
            key, l = parts[2], int(parts[1])
            if key in ("attn_q", "attn_k"):  # undo convert_hf_to_gguf.py's permute
                h = nh if key == "attn_q" else kv
                v = v.reshape(h, v.shape[0] // h // 2, 2, *v.shape[1:]).swapaxes(1, 2).reshape(v.shape)
            sd["model.layers.%d.%s.weight" % (l, names[key])] = v
        else:
            sd[names[parts[0]] + ".weight"] = v
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict({k: torch.tensor(v) for k, v in sd.items()}, strict=False)
    return m


def logits(m, ids, blocks):
    import torch
    hooks = []
    if blocks:
        def q8(mod, args):
            x = args[0]
            shp = x.shape
            b = x.reshape(-1, 32)
            d = b.abs().amax(dim=1, keepdim=True) / 127
            q = torch.where(d > 0, torch.round(b / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(b))
            return (q * d).reshape(shp),
        hooks = [mod.register_forward_pre_hook(q8) for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    with torch.no_grad():
        z = m(torch.tensor([ids])).logits[0, -1].numpy()
    for h in hooks:
        h.remove()
    return z


def main(gguf_path, hf_dir, prompt, llama_path, loom_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(hf_dir + "/tokenizer.json")
    cfgj = json.load(open(hf_dir + "/tokenizer_config.json"))
    special = {a.content for a in tok.get_added_tokens_decoder().values()} if hasattr(tok, "get_added_tokens_decoder") else set()
    special |= {cfgj.get("bos_token"), cfgj.get("eos_token")}
    tb = token_bytes(tok, special)
    S = open(llama_path, "rb").read()
    head = (cfgj["bos_token"] + prompt).encode()
    if not S.startswith(head):
        head = prompt.encode()
    S = S[len(head):]
    L = json.loads(open(loom_path, "rb").readline().decode("utf-8", "replace"))["samples"][0]["token_ids"]  # text may hold a cut character
    off, k = 0, None
    for i, t in enumerate(L):
        b = tb[t]
        if S[off:off + len(b)] != b:
            k = i
            break
        off += len(b)
    if k is None:
        print("equal %d (loom's %d tokens spell llama.cpp's text)" % (len(L), len(L)))
        return 0
    rest = S[off:]
    cands = [i for i, b in enumerate(tb) if b and rest.startswith(b)]
    if not rest:  # llama.cpp stopped there: it drew an end-of-generation token
        cands = [i for i in (tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|end_of_text|>")) if i is not None]
    ids = tok.encode(prompt).ids + L[:k]
    m = reference(gguf_path, hf_dir)
    z, zq = logits(m, ids, False), logits(m, ids, True)
    E = float(np.max(np.abs(zq - z)))
    a = L[k]
    if not cands:
        print("differ at token %d: loom %r, llama.cpp's text %r matches no token" % (k, tb[a], rest[:16]))
        return 1
    b = max(cands, key=lambda i: z[i])
    gap = float(z[a] - z[b])
    top = np.argsort(-z)[:2]
    ok = abs(gap) <= 2 * E
    print("differ at token %d of %d: loom %r (reference logit %.5f), llama.cpp %r (%.5f): gap %.5f; the format's error E %.5f "
          "(int8 blocks of 32 on every linear input); reference top two %r %.5f, %r %.5f: %s" % (
              k, len(L), tb[a], z[a], tb[b], z[b], gap, E, tb[top[0]], z[top[0]], tb[top[1]], z[top[1]],
              "within 2E, a near tie" if ok else "NOT within 2E"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
