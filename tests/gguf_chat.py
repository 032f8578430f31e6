#!/usr/bin/env python3
"""Llama-family GGUF files with their own tokenizer and chat template, as
llama.cpp's converter writes them, and `loom serve` on them driven by the
official openai client (tests/test_gguf_tokenizer.c, tests/test_gguf_chat.sh).

usage:
  gguf_chat.py build KIND TRAIN.txt OUTDIR   KIND llama3 or spm-scores: the tokenizer
      tests/tokenizer_family_oracle.py builds with Hugging Face `tokenizers`
      (OUTDIR/tokenizer.json), written by the `gguf` package into
      OUTDIR/model.gguf (tokenizer.ggml.* and tokenizer.chat_template) beside
      a tiny random Llama; for llama3 also OUTDIR/stop.gguf, the same model
      made to answer <|eot_id|> every time.
  gguf_chat.py serve LOOM TRAIN.txt     the chat checks (PASS/FAIL lines)
  gguf_chat.py meta ORIG.gguf EXPORT.gguf   `loom export`'s tokenizer metadata
      (EXPORT, written by loom from the model it loaded from ORIG) read by the
      `gguf` package's GGUFReader: model, pre (llama.cpp's name for the split;
      none for "llama"), tokens, token types, special ids and flags and the
      chat template equal ORIG's; a "llama" file's scores rank every token a
      merge makes as ORIG's do (-1e9 only for tokens no two tokens make).
      Exit status 0 when all agree, each difference printed.

The byte-level file is Llama 3's layout: tokenizer.ggml.model "gpt2", pre
"llama-bpe", merges, BOS <|begin_of_text|>, EOS <|end_of_text|> (a base
model's), EOT <|eot_id|>, add_bos_token, Llama 3's template. The
SentencePiece-style one is Llama 2's / Mistral's: model "llama", scores
(-id, no merges), byte tokens <0xNN> of type 6, <unk> 0, <s> 1, </s> 2,
Mistral's template.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import loom_server  # noqa: E402 (tests/ on the path first)

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
          "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
           "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' "
           "+ message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
           "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


def vocab_of(outdir):
    """(names by id, types by id, merges, added token contents that are special) as the converter sees tokenizer.json."""
    with open(os.path.join(outdir, "tokenizer.json"), encoding="utf-8") as f:
        d = json.load(f)
    ids = dict(d["model"]["vocab"])
    special, user = set(), set()
    for a in d["added_tokens"]:
        ids[a["content"]] = a["id"]
        (special if a["special"] else user).add(a["content"])
    names = [None] * (max(ids.values()) + 1)
    for k, i in ids.items():
        names[i] = k
    assert all(n is not None for n in names)
    types = []
    for n in names:
        if n in special:
            types.append(2 if n == "<unk>" else 3)  # unknown, control
        elif n in user:
            types.append(4)  # user defined
        elif re.fullmatch(r"<0x[0-9A-F]{2}>", n):
            types.append(6)  # byte
        else:
            types.append(1)
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"].get("merges", [])]
    return names, types, merges


def write_model(path, kind, names, types, merges, stop=False):
    import gguf
    rng = np.random.default_rng(7)
    C, L, NH, KV, H = 64, 1, 2, 1, 128
    V, hs = len(names), C // NH
    w = gguf.GGUFWriter(path, "llama")
    for k, v in (("block_count", L), ("context_length", 512), ("embedding_length", C), ("feed_forward_length", H),
                 ("attention.head_count", NH), ("attention.head_count_kv", KV), ("rope.dimension_count", hs), ("vocab_size", V)):
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    ix = {n: i for i, n in enumerate(names)}
    if kind == "llama3":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_token_list(names)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(ix["<|begin_of_text|>"])
        w.add_eos_token_id(ix["<|end_of_text|>"])
        w.add_uint32("tokenizer.ggml.eot_token_id", ix["<|eot_id|>"])
        w.add_add_bos_token(True)
        w.add_chat_template(LLAMA3)
    else:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(names)
        w.add_token_scores([-float(i) for i in range(V)])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(True)
        w.add_chat_template(MISTRAL)
    f32 = lambda *s, std=0.02: (rng.standard_normal(s) * std).astype(np.float32)
    emb, out, norm = f32(V, C, std=1.0), f32(V, C, std=0.3), np.ones(C, np.float32)
    if stop:  # every position's hidden state leans on channel 0, and <|eot_id|>'s logit reads it
        emb[:, 0] += 20
        out[ix["<|eot_id|>"], 0] = 100
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", norm)
    for l in range(L):
        for name, rows, cols in (("attn_q", NH * hs, C), ("attn_k", KV * hs, C), ("attn_v", KV * hs, C), ("attn_output", C, C),
                                 ("ffn_gate", H, C), ("ffn_up", H, C), ("ffn_down", C, H)):
            w.add_tensor(f"blk.{l}.{name}.weight", f32(rows, cols, std=0.1))
        w.add_tensor(f"blk.{l}.attn_norm.weight", np.ones(C, np.float32))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", np.ones(C, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build(kind, train_path, outdir):
    import tokenizer_family_oracle
    tokenizer_family_oracle.build(kind, train_path, outdir)
    names, types, merges = vocab_of(outdir)
    write_model(os.path.join(outdir, "model.gguf"), kind, names, types, merges)
    if kind == "llama3":
        write_model(os.path.join(outdir, "stop.gguf"), kind, names, types, merges, stop=True)


# --- loom serve on the files -------------------------------------------------
def report(name, ok, why=""):
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, why)), flush=True)


def Server(loom, model):
    return loom_server.LoomServer([loom, "serve", "--port", "0", "--threads", "2", "--kv-memory", "16M", "--run", model],
                                  start_s=300, stop_s=120)


def jinja(template, msgs, bos, eos):
    import chat_template_oracle, jinja2.ext, jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    return chat_template_oracle.render(env, {"template": template, "messages": msgs, "add_generation_prompt": True,
                                             "bos_token": bos, "eos_token": eos})["text"]


def chat_case(loom, kind, d, msgs_list):
    """Each conversation through the openai client's chat API: the prompt loom
    rendered has as many tokens as `tokenizers` gives jinja2's rendering, and
    the greedy answer equals the completions API's on jinja2's text (BOS
    text cut: completions adds BOS itself)."""
    import openai
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tmpl, bos, eos = (LLAMA3, "<|begin_of_text|>", "<|end_of_text|>") if kind == "llama3" else (MISTRAL, "<s>", "</s>")
    srv = Server(loom, os.path.join(d, "model.gguf"))
    try:
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="none", max_retries=0, timeout=300)
        said = "".join(srv.log)
        report("gguf_%s_tokenizer_loaded" % kind, "without its tokenizer" not in said, said[-400:])
        for i, msgs in enumerate(msgs_list):
            text = jinja(tmpl, msgs, bos, eos)
            want_n = len(tok.encode(text, add_special_tokens=False).ids)
            r = cl.chat.completions.create(model="model", messages=msgs, max_tokens=8, temperature=0)
            c = cl.completions.create(model="model", prompt=text[len(bos):], max_tokens=8, temperature=0)
            got, ref = r.choices[0].message.content, c.choices[0].text
            report("gguf_%s_chat_template_%d" % (kind, i), r.usage.prompt_tokens == want_n and c.usage.prompt_tokens == want_n and got == ref,
                   "prompt tokens %d (completions %d), jinja2 + tokenizers %d; answer %r vs %r" % (
                       r.usage.prompt_tokens, c.usage.prompt_tokens, want_n, got, ref))
    finally:
        srv.stop()


def stop_case(loom, d):
    """A model whose every next token is <|eot_id|> (by its weights; not its
    EOS, <|end_of_text|>): the chat stops there at once, the template's end
    of turn, with nothing said."""
    import openai
    srv = Server(loom, os.path.join(d, "stop.gguf"))
    try:
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="none", max_retries=0, timeout=300)
        r = cl.chat.completions.create(model="stop", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
        ok = r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "" and r.usage.completion_tokens <= 1
        report("gguf_llama3_chat_stops_at_eot_id", ok, "chat %r %r, %d tokens" % (
            r.choices[0].finish_reason, r.choices[0].message.content, r.usage.completion_tokens))
    finally:
        srv.stop()


def serve(loom, train_path):
    convs = [[{"role": "user", "content": "Hello there, how are you? Привет 🙂"}],
             [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "日本語で 1234 answer"},
              {"role": "assistant", "content": "Sure: 42."}, {"role": "user", "content": "and again?"}]]
    mistral = [[{"role": "user", "content": "Hello there, how are you? Привет"}],
               [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two 2"}, {"role": "user", "content": "three ünï"}]]
    for kind, msgs in (("llama3", convs), ("spm-scores", mistral)):
        d = tempfile.mkdtemp(prefix="loom-gguf-chat-")
        try:
            build(kind, train_path, d)
            chat_case(loom, kind, d, msgs)
            if kind == "llama3":
                stop_case(loom, d)
        except Exception as e:
            import traceback
            traceback.print_exc()
            report("gguf_%s_chat" % kind, False, repr(e))
        finally:
            subprocess.run(["rm", "-rf", d])


def meta(orig, export):
    import gguf
    a, b = gguf.GGUFReader(orig), gguf.GGUFReader(export)

    def val(r, key):
        f = r.fields.get(key)
        if f is None:
            return None
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            return [f.contents(i) for i in range(len(f.data))] if f.types[-1] == gguf.GGUFValueType.STRING else list(f.contents())
        return f.contents()
    bad = []
    model = val(a, "tokenizer.ggml.model")
    keys = ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]
    keys += ["tokenizer.ggml.pre"] if model == "gpt2" else ["tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_eos_token",
                                                            "tokenizer.ggml.add_space_prefix"]
    for k in keys:
        if val(a, k) != val(b, k):
            bad.append("%s: %r vs loom's %r" % (k, str(val(a, k))[:80], str(val(b, k))[:80]))
    if model == "llama":
        if val(b, "tokenizer.ggml.pre") is not None:
            bad.append("a \"llama\" tokenizer got a pre-tokenizer %r" % val(b, "tokenizer.ggml.pre"))
        names, types = val(a, "tokenizer.ggml.tokens"), val(a, "tokenizer.ggml.token_type")
        sa, sb = val(a, "tokenizer.ggml.scores"), val(b, "tokenizer.ggml.scores")
        vocab = {n: i for i, n in enumerate(names) if types[i] == 1}
        made = [i for i, n in enumerate(names) if types[i] == 1 and any(n[:k] in vocab and n[k:] in vocab for k in range(1, len(n)))]
        order = lambda sc: sorted(made, key=lambda i: (-sc[i], i))
        if order(sa) != order(sb):
            bad.append("the scores rank the %d tokens merges make differently" % len(made))
        lost = [names[i] for i in made if sb[i] <= -1e9]
        if lost:
            bad.append("%d tokens two tokens make have no merge score: %r" % (len(lost), lost[:5]))
        print("  %d tokens made by merges, ranked as the original's scores rank them" % len(made))
    for x in bad:
        print("  differs: " + x)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    cmds = {"build": build, "serve": serve, "meta": meta}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
