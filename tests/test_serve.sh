#!/usr/bin/env bash
# loom serve against real clients (tests/serve_client.py): the official
# openai package (completions, chat, streaming, n, seeds, stop strings,
# logprobs, echo, two models, API key; greedy output equal to `loom sample
# --temperature 0`), promtool on /metrics, 32 concurrent clients equal to
# single-client outputs, overload (--max-queue 4, 64 clients: 429s, no
# hang, no truncated body), 20 clients hanging up mid-stream (KV blocks
# back to zero), a corpus of malformed requests, SIGTERM with streams in
# flight; a Jinja --chat-template rendered as jinja2 renders it, its errors
# and its refusal; the OpenAI API's details (tests/serve_conformance.py) and
# every answer checked against the JSON schemas of tests/openai_schemas/;
# --cors-origin; --draft-run (a draft model, its tokenizer checked); structured outputs (tests/serve_structured.py); tool calling
# (tests/serve_tools.py, on a second model with a 4096-token context); prompt
# logprobs with echo against transformers. The model: gpt2-tiny trained for 2 steps (any weights do: every
# check compares the server with itself under another path or with loom sample).
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/py /usr/bin/python3"
if ! $PY -c "import openai" 2>/dev/null; then
    echo "SKIP serve: the openai package (scripts/deps.sh installs it into .deps/py) is missing"; exit 0
fi
tmp=$(mktemp -d /tmp/loom-serve-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
$PY -c "
import random
random.seed(3)
words = 'the cat sat on a mat and then it ran to see the dog who was under old tree by river'.split()
print(' '.join(random.choice(words) for _ in range(5000)))" > "$tmp/corpus.txt"
if ! $LOOM train --data "$tmp/corpus.txt" --model gpt2-tiny --steps 2 --batch 2 --seq 32 --eval-every 0 --threads 2 \
      --sample-tokens 0 --seed 3 --out "$tmp/run" > "$tmp/train.log" 2>&1; then
    echo "FAIL serve_train: loom train failed:"; tail -5 "$tmp/train.log"; exit 1
fi
PARTS=${SERVE_PARTS:-openai concurrency load quantmem draft overload disconnect badinput sigterm chattemplate cors structured tools promptlogprobs}
# tool calling needs a context that holds a published template's tool prompt (~2000 byte tokens: Llama 3.1 indents its tools)
case " $PARTS " in *" tools "*)
    if ! $LOOM train --data "$tmp/corpus.txt" --model gpt2-tiny --context 4096 --steps 2 --batch 2 --seq 32 --eval-every 0 --threads 2 \
          --sample-tokens 0 --seed 3 --out "$tmp/run4k" > "$tmp/train4k.log" 2>&1; then
        echo "FAIL serve_train_4k: loom train failed:"; tail -5 "$tmp/train4k.log"; exit 1
    fi;;
esac
LOOM_TOOLS_RUN="$tmp/run4k" $PY tests/serve_client.py "$LOOM" "$tmp/run" $PARTS
