#!/usr/bin/env python3
"""Hugging Face `tokenizers` as the oracle for loom's tokenizer tests.

usage:
  tokenizer_oracle.py gen OUT.txt MB SEED       mixed text (KJV, many scripts, odd spaces, specials)
  tokenizer_oracle.py encode TOKENIZER.json TEXT IDS.bin
  tokenizer_oracle.py encode-gpt2 VOCAB.json MERGES.txt TEXT IDS.bin
  tokenizer_oracle.py train TEXT VOCAB OUTDIR   tokenizer.json + vocab.json + merges.txt
  tokenizer_oracle.py pretok-text OUT.txt STEP  code points in many contexts, every STEP-th
  tokenizer_oracle.py pretok TEXT LENS.bin      byte length of each ByteLevel pre-token
  tokenizer_oracle.py shard-ids SHARD [SKIP]    print a loom shard's ids (after SKIP), read independently
IDS.bin and LENS.bin are little-endian uint32 arrays.
"""
import array
import os
import random
import subprocess
import sys


def write_u32(path, xs):
    a = array.array("I", xs)
    if sys.byteorder != "little":
        a.byteswap()
    with open(path, "wb") as f:
        a.tofile(f)


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


SCRIPTS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÉÎÕÜŒœŠšŽž",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘ",
    "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГДЕЖЗ",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "あいうえおかきくけこアイウエオカキクケコ",
    "가나다라마바사아자차카타파하한국어",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह",  # with marks below
    "ािीुूृेैोौं्",  # Devanagari vowel signs: marks, not letters
]
DIGITS = "0123456789٠١٢٣٤٥٦٧٨٩۰۱۲０１２３४५६¹²³½⅓ⅫⅦ①②"
PUNCT = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»—–…‘’“”•€£¥©®™°±×÷§¶🙂🚀👍🏽❤️"
SPACES = [" ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x85",
          "\u2003", "\u200b", " \t ", "    \n"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'x", "'"]


def word(r):
    k = r.random()
    if k < 0.55:
        s = r.choice(SCRIPTS)
        w = "".join(r.choice(s) for _ in range(r.randint(1, 10)))
        if r.random() < 0.1:
            w += r.choice(CONTRACTIONS)
        return w
    if k < 0.7:
        return "".join(r.choice(DIGITS) for _ in range(r.randint(1, 6)))
    if k < 0.85:
        return "".join(r.choice(PUNCT) for _ in range(r.randint(1, 4)))
    if k < 0.97:
        cp = r.randrange(0x110000)
        while 0xD800 <= cp <= 0xDFFF:
            cp = r.randrange(0x110000)
        return chr(cp) * r.randint(1, 2)
    return "<|endoftext|>" if r.random() < 0.7 else "<|endoftext|"


def gen(out, mb, seed):
    r = random.Random(seed)
    target = int(float(mb) * 1e6)
    parts, size = [], 0
    try:
        kjv = subprocess.run(["bible", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        kjv = ""
    if kjv:
        start = r.randrange(max(1, len(kjv) - target // 3))
        parts.append(kjv[start:start + target // 3])
        size += target // 3
    # long runs take loom's heap-ordered merge path
    parts += ["=" * 3000, " " + "a" * 1000, "9" * 700, "!?" * 400, "\n" * 300]
    while size < target:
        doc = []
        for _ in range(r.randint(5, 200)):
            doc.append(word(r))
            doc.append(r.choice(SPACES) if r.random() < 0.3 else " ")
        d = "".join(doc)
        parts.append(d)
        size += len(d.encode())
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(parts))


def encode(tok_path, text_path, ids_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    write_u32(ids_path, tok.encode(read_text(text_path)).ids)


def encode_gpt2(vocab, merges, text_path, ids_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    write_u32(ids_path, tok.encode(read_text(text_path)).ids)


def train(text_path, vocab, outdir):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=int(vocab), special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([text_path], tr)
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"))
    tok.model.save(outdir)  # vocab.json + merges.txt
    write_u32(os.path.join(outdir, "ids.bin"), tok.encode(read_text(text_path)).ids)


def pretok_text(out, step):
    step = int(step)
    cps = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF) and (c < 0x3000 or c % step == 0)]
    parts = []
    for c in cps:
        ch = chr(c)
        parts.append(f"a{ch}1{ch} {ch}{ch}'s{ch}\t{ch}  {ch}!")
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(parts))


def pretok(text_path, lens_path):
    from tokenizers import pre_tokenizers
    text = read_text(text_path)
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    write_u32(lens_path, [len(text[a:b].encode()) for _, (a, b) in pt.pre_tokenize_str(text)])


def shard_ids(path, skip="0"):
    import struct
    with open(path, "rb") as f:
        data = f.read()
    h = struct.unpack("<7i", data[:28])
    assert h[0] == 0x4C4F4F4D and h[1] in (1, 2), f"{path}: not a loom shard"  # version 2 adds a token checksum
    count, tb = h[4] | (h[5] << 32), h[6]
    a = array.array("H" if tb == 2 else "I", data[h[2]:])
    assert len(a) == count, f"{path}: {len(a)} tokens, header says {count}"
    print(" ".join(map(str, a[int(skip):])))


if __name__ == "__main__":
    cmds = {"shard-ids": shard_ids, "gen": gen, "encode": encode, "encode-gpt2": encode_gpt2, "train": train, "pretok-text": pretok_text, "pretok": pretok}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
