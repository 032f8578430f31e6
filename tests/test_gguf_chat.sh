#!/usr/bin/env bash
# `loom serve --run FILE.gguf` chats through the file's own template
# (tokenizer.chat_template) and tokenizer (tokenizer.ggml.*), checked with
# the official openai client (tests/gguf_chat.py): for Llama 3's template
# on a byte-level BPE and Mistral's on a SentencePiece-style vocabulary,
# the prompt loom renders has the token count `tokenizers` gives jinja2's
# rendering, and its greedy answer equals the completions API's on
# jinja2's text; a model that answers <|eot_id|> (not its EOS) stops there
# in the chat with nothing said.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/py /usr/bin/python3"
if ! $PY -c "import openai, gguf, tokenizers, jinja2, numpy" 2>/dev/null; then
    echo "SKIP gguf_chat: openai, gguf, tokenizers, jinja2 or numpy is missing (scripts/deps.sh installs them)"; exit 0
fi
tmp=$(mktemp -d /tmp/loom-gguf-chat-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
$PY tests/tokenizer_family_oracle.py text "$tmp/train.txt" 1 || { echo "FAIL gguf_chat: no training text"; exit 1; }
$PY tests/gguf_chat.py serve "$LOOM" "$tmp/train.txt"
