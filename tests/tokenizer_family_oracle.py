#!/usr/bin/env python3
"""Hugging Face `tokenizers` as the oracle for the Llama-family tokenizers
(tests/test_oracle_tokenizer_family.c). The tokenizers are built here, by
`tokenizers` itself: a small BPE trained on generated text, then given the
pre-tokenizer, normalizer, decoder, post-processor and added tokens of the
family it stands for.

usage:
  tokenizer_family_oracle.py text OUT.txt SEED          unseen multilingual text
  tokenizer_family_oracle.py build KIND TRAIN.txt OUTDIR tokenizer.json + tokenizer_config.json
      KIND: llama3 (Split with Llama 3's regex + ByteLevel, ignore_merges, BOS template)
            qwen2 (Qwen2's regex and NFC normalizer), smollm (Digits + ByteLevel),
            spm-legacy (Llama 2: Prepend/Replace normalizer, byte_fallback, Strip decoder),
            spm-first (Metaspace prepend_scheme first, split false, a token with an inner space),
            spm-split (Metaspace always + split, no byte_fallback: unknown characters, Metaspace decoder),
            spm-scores (spm-legacy with the merges a GGUF vocabulary's scores give)
  tokenizer_family_oracle.py encode TOKENIZER.json TEXT IDS.bin SPECIAL   SPECIAL 1: add BOS/EOS as encode() does
  tokenizer_family_oracle.py decode TOKENIZER.json IDS.bin OUT.txt        decode, special tokens kept
  tokenizer_family_oracle.py pretok KIND STEP TEXT LENS.bin   code points (every STEP-th above U+3000) in
      contexts, and the byte length of each piece Llama 3's (KIND llama3) or Qwen2's (qwen2) Split makes
  tokenizer_family_oracle.py nfc TEXT OUT   code points (marks, decomposable ones, Latin, Hangul, every 29th
      other) before U+0301 and U+0307 U+0323 and in NFD form, and jamo runs (TEXT); tokenizers' NFC of it (OUT)
IDS.bin and LENS.bin are little-endian uint32 arrays.
"""
import array
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_oracle  # noqa: E402  (its mixed-text generator)

L3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN = L3.replace(r"\p{N}{1,3}", r"\p{N}")
SPACE = "\u2581"

SAMPLES = [
    "Hello, world! It's a fine day; we'll see what they've done. I'M HERE, you'RE there.",
    "Привет, мир! Как дела? Ёлка и щука — 2024 год.",
    "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",
    "Emoji: 🙂🚀👍🏽❤️ 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵.",
    "Digits 1234567890 ١٢٣٤ ۱۲۳ १२३ ½ ⅫⅦ 3.14159 1,000,000 v2.0.1",
    "def f(x):\n    return x ** 2  # square\n\n\tif (a && b) { c[i] = \"s\\n\"; }\r\n",
    "spaces   three  two \t\t tabs\n\n\nthree newlines   \n  trailing   ",
    "ſ 'ſ x'Ss ((abc)) ..\n.\r\n ὈΔΥΣΣΕΎΣ Ǆǅǆ ﬁ ﬀ ẞß",
    "\u00a0nbsp \u3000ideographic \u2028line sep \u200bzero width",
    "decomposed: e\u0301 A\u030a o\u0308\u0304 \u1100\u1161\u11a8 \u1100\u1161 a\u0328\u0301 \u0041\u0301\u0328 \u2126 \u212b \uf900 \u0958 q\u0307\u0323",
    "Ünïcödé àçcèñtš ÀÉÎÕÜ αβγδε ΑΒΓΔ",
]
SPECIALS = {
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}


def text(out, seed):
    r = random.Random(int(seed))
    tmp = out + ".gen"
    tokenizer_oracle.gen(tmp, "0.3", seed)
    with open(tmp, encoding="utf-8", newline="") as f:
        gen = f.read()
    os.remove(tmp)
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<custom>", "my added phrase"]
    parts = []
    for i in range(400):
        parts.append(r.choice(SAMPLES))
        parts.append(r.choice([" ", "\n", "", "  ", "\n\n"]))
        if r.random() < 0.3:
            parts.append(r.choice(specials))
        parts.append(gen[i * 700:(i + 1) * 700])
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(parts))


def train(kind, train_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, Regex
    tok = Tokenizer(models.BPE())
    if kind.startswith("spm"):
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
        tr = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=300, show_progress=False)
    else:
        steps = {"llama3": [pre_tokenizers.Split(Regex(L3), behavior="isolated")],
                 "qwen2": [pre_tokenizers.Split(Regex(QWEN), behavior="isolated")],
                 "smollm": [pre_tokenizers.Digits(individual_digits=True)]}[kind]
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=kind == "smollm")])
        tr = trainers.BpeTrainer(vocab_size=3000, special_tokens=SPECIALS[kind], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False)
    tok.train([train_path], tr)
    return json.loads(tok.to_str())


def added(id_, content, special=True, normalized=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": normalized, "special": special}


def byte_level(d, kind):
    d["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    vocab = d["model"]["vocab"]
    if kind == "llama3":
        d["model"]["ignore_merges"] = True
        vocab["\u0120xyzzyplugh"] = len(vocab)  # a word only ignore_merges makes one token
        bos = vocab["<|begin_of_text|>"]
        d["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}]}
    if kind == "qwen2":
        d["normalizer"] = {"type": "NFC"}  # as Qwen2's file has it
    n = len(vocab)
    d["added_tokens"].append(added(n, "<custom>", special=False))
    d["added_tokens"].append(added(n + 1, "my added phrase", special=False, normalized=True))
    return {"llama3": ("<|begin_of_text|>", "<|eot_id|>"), "qwen2": (None, "<|im_end|>"), "smollm": ("<|im_start|>", "<|im_end|>")}[kind]


def extractor_merges(vocab):
    """Every way to cut a token into two tokens, the token's score (-id) first,
    then (id of left, id of right): what a GGUF "llama" vocabulary's scores
    give (loom_tokenizer_from_vocab) and transformers' converter writes."""
    special = {"<unk>", "<s>", "</s>"} | {"<0x%02X>" % b for b in range(256)}
    regular = {t: i for t, i in vocab.items() if t not in special}
    merges = []
    for tok, i in sorted(regular.items(), key=lambda x: x[1]):
        local = [(tok[:k], tok[k:], -i) for k in range(1, len(tok)) if tok[:k] in regular and tok[k:] in regular]
        merges += sorted(local, key=lambda x: (regular[x[0]], regular[x[1]]))
    merges.sort(key=lambda x: x[2], reverse=True)
    return [a + " " + b for a, b, _ in merges]


def sentencepiece(d, kind):
    """The trained vocabulary behind <unk> <s> </s> and the 256 byte tokens, as Llama 2's file has it."""
    trained = d["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    if kind != "spm-split":
        for b in range(256):
            vocab["<0x%02X>" % b] = len(vocab)
    for name in sorted(trained, key=trained.get):
        if name not in vocab:
            vocab[name] = len(vocab)
    if kind == "spm-first":
        vocab["d" + SPACE + "the"] = len(vocab)  # a token with an inner space: words are not cut at spaces
    m = d["model"]
    m.update(vocab=vocab, byte_fallback=kind != "spm-split", fuse_unk=True, unk_token="<unk>")
    d["added_tokens"] = [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"), added(len(vocab), "<custom>", special=False)]
    strip = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"},
                                              {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    if kind == "spm-scores":  # merges made from scores (-id) as transformers' SentencePieceExtractor makes them
        m["merges"] = extractor_merges(vocab)
    if kind in ("spm-legacy", "spm-scores"):
        d["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE},
                                                               {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
        d["pre_tokenizer"] = None
        d["decoder"] = strip
    elif kind == "spm-first":
        d["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": False}
        d["decoder"] = strip
    else:
        d["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True}
        d["decoder"] = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True}
    d["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return ("<s>", "</s>")


def build(kind, train_path, outdir):
    from tokenizers import Tokenizer
    d = train(kind, train_path)
    bos, eos = sentencepiece(d, kind) if kind.startswith("spm") else byte_level(d, kind)
    Tokenizer.from_str(json.dumps(d))  # `tokenizers` must accept what it is given
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)
    cfg = {"bos_token": bos, "eos_token": eos, "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    if kind.startswith("spm"):
        cfg.update(add_bos_token=True, add_eos_token=False)
    with open(os.path.join(outdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)


def encode(tok_path, text_path, ids_path, special):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    ids = tok.encode(tokenizer_oracle.read_text(text_path), add_special_tokens=special == "1").ids
    tokenizer_oracle.write_u32(ids_path, ids)


def decode(tok_path, ids_path, out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    a = array.array("I")
    with open(ids_path, "rb") as f:
        a.frombytes(f.read())
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write(tok.decode(list(a), skip_special_tokens=False))


def pretok(kind, step, text_path, lens_path):
    from tokenizers import pre_tokenizers, Regex
    step = int(step)
    cps = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF) and (c < 0x3000 or c % step == 0)]
    parts = [f"a{ch}1{ch} {ch}{ch}'s{ch}\t{ch}  {ch}!{ch}\n{ch}.\r\n{ch}1234{ch} \n" for ch in map(chr, cps)]
    t = "".join(parts)
    with open(text_path, "w", encoding="utf-8", newline="") as f:
        f.write(t)
    split = pre_tokenizers.Split(Regex(L3 if kind == "llama3" else QWEN), behavior="isolated")
    tokenizer_oracle.write_u32(lens_path, [len(t[a:b].encode()) for _, (a, b) in split.pre_tokenize_str(t)])


def nfc(text_path, out_path):
    from tokenizers import normalizers
    import unicodedata
    parts = []
    for c in range(0x110000):
        ch = chr(c)
        if 0xD800 <= c <= 0xDFFF or (c % 29 and not unicodedata.combining(ch) and not unicodedata.decomposition(ch)
                                     and not 0xAC00 <= c <= 0xD7A3 and c > 0x24F):
            continue  # every 29th of the code points where nothing happens
        parts.append(ch + "\u0301 " + ch + "\u0307\u0323|" + normalizers.NFD().normalize_str(ch) + "\u0300 ")
    r = random.Random(5)
    for _ in range(3000):  # jamo runs: L V T in and out of order
        parts.append("".join(chr(r.choice([0x1100 + r.randrange(19), 0x1161 + r.randrange(21), 0x11A7 + r.randrange(28)]))
                             for _ in range(r.randint(1, 5))) + " ")
    t = "".join(parts)
    with open(text_path, "w", encoding="utf-8", newline="") as f:
        f.write(t)
    with open(out_path, "w", encoding="utf-8", newline="") as f:
        f.write(normalizers.NFC().normalize_str(t))


if __name__ == "__main__":
    cmds = {"text": text, "build": build, "encode": encode, "decode": decode, "pretok": pretok, "nfc": nfc}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
