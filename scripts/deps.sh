#!/usr/bin/env bash
# Install what loom needs to build and test, only what is missing.
# Debian packages through apt-get; PyPI packages for the test oracles and
# real clients, each set in an ignored folder of its own under .deps/ so that
# Debian's python3 stays as Debian ships it (except `tokenizers`, below).
set -eu
cd "$(dirname "$0")/.."
pkgs=(build-essential libopenblas-dev libcjson-dev bible-kjv python3-torch python3-numpy python3-pip
      libopenmpi-dev openmpi-bin slurmctld slurmd slurm-client munge
      libmicrohttpd-dev prometheus libjs-dygraphs chromium strace python3-yaml)
pkgs+=(podman debootstrap runc curl) # the container image test (tests/image_test.sh, deploy/container/)
pkgs+=(python3-jinja2) # jinja2: the oracle of the chat template tests (tests/test_chat_template.c)
pkgs+=(xxhash) # xxhsum: the reference for loom's XXH64 checksums (tests/test_ft_hash.c)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "deps: all Debian packages present"
fi
# Hugging Face `tokenizers`, the oracle of the tokenizer tests and the
# baseline of bench/tokenize.sh, for Debian's python3 (which the tests call as
# /usr/bin/python3). Debian marks that Python "externally managed", so pip
# needs --break-system-packages; it only adds this one package.
if ! /usr/bin/python3 -c 'import tokenizers' 2>/dev/null; then
    echo "deps: installing the tokenizers Python package"
    /usr/bin/python3 -m pip install -q --break-system-packages tokenizers
fi
# pip_target DIR MODULE PKG...: install PKGs into DIR unless MODULE imports from it.
pip_target() {
    local dir=$1 mod=$2; shift 2
    if ! PYTHONPATH=$dir /usr/bin/python3 -c "import $mod" 2>/dev/null; then
        echo "deps: installing $* into $dir"
        local log; log=$(mktemp)
        if ! /usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
                --target "$dir" "$@" >"$log" 2>&1; then
            cat "$log"; rm -f "$log"; echo "deps: pip could not install $* (see above)"; exit 1
        fi
        rm -f "$log"
    fi
}
# Real clients and readers used by tests (PYTHONPATH=.deps/py): the official
# openai client, llama.cpp's gguf reader, the Kubernetes schema validator.
pip_target .deps/py openai openai
pip_target .deps/py gguf gguf "numpy<2"
pip_target .deps/py kubernetes_validate kubernetes-validate
# jsonschema: every answer of the serve tests checked against tests/openai_schemas/
# and the structured outputs validated (kubernetes-validate brings it too).
pip_target .deps/py jsonschema jsonschema
# LangChain's OpenAI client (with_structured_output against loom serve,
# tests/serve_langchain.py), in its own folder: it brings its own openai.
pip_target .deps/lc langchain_openai langchain-openai
# Hugging Face transformers, the oracle of the interop and engine tests
# (PYTHONPATH=.deps/hf), pinned to versions that run on Debian's torch 1.13;
# kept apart so the tokenizer tests keep Debian python's own `tokenizers`.
pip_target .deps/hf transformers transformers==4.36.2 tokenizers==0.15.2 huggingface_hub==0.20.3 safetensors==0.4.2 "numpy<2"
# A newer transformers for the Llama-family oracles (tests/test_llama*.c): 4.36
# has no Qwen2 and no llama3 rope_scaling; 4.44 is the newest found to run
# on Debian's torch 1.13 (docs/llama.md). Its own folder so the GPT-2 tests
# keep their pin.
pip_target .deps/hf44 transformers transformers==4.44.2 tokenizers==0.19.1 huggingface_hub==0.24.7 safetensors==0.4.5 "numpy<2"
# NVIDIA's cudnn-frontend headers (header-only C++; the CUDA plugin's cuDNN
# attention is compiled only when they are here; see docs/cuda.md).
[ -f .deps/cudnn-fe/include/cudnn_frontend.h ] || /usr/bin/python3 -m pip install -q --disable-pip-version-check --no-deps --target .deps/cudnn-fe nvidia-cudnn-frontend==1.32.0
# NVIDIA's cuSPARSELt (2:4 sparse tensor cores): its header compiles the CUDA plugin's sparse path; the
# library is opened at run time where present (docs/quantization.md, "CUDA").
[ -n "$(ls .deps/cusparselt/nvidia/*/include/cusparseLt.h 2>/dev/null)" ] || /usr/bin/python3 -m pip install -q --disable-pip-version-check --no-deps --target .deps/cusparselt nvidia-cusparselt-cu13==0.10.0
