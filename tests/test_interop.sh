#!/usr/bin/env bash
# Fine-tuning a Hugging Face GPT-2 and handing it back, checked by transformers:
#  1. transformers itself makes a small random GPT2LMHeadModel (save_pretrained,
#     safetensors) with a tokenizer loom trained (400 ids; loom pads to 448);
#  2. `loom train --init-from` on data tokenized with that tokenizer: loom's
#     first-step loss equals transformers' loss on the same batch (1e-5 rel.);
#  3. refusals: byte-level data (another tokenizer), a non-GPT-2 model_type,
#     pytorch_model.bin only; each exits 2 with a message saying what to do;
#  4. `loom export --format hf`: transformers' validation loss on the export
#     equals `loom eval`'s, and transformers' greedy text equals loom's;
#  5. `loom export --format gguf` + `loom sample --gguf` (and --run FILE.gguf):
#     the same greedy text as `loom sample --run`.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
PY="env PYTHONPATH=.deps/hf /usr/bin/python3"
if ! $PY -c 'import transformers, torch' 2>/dev/null; then
    echo "SKIP interop_init_from: transformers is not importable from .deps/hf (scripts/deps.sh installs it)"; exit 0
fi
if ! command -v bible >/dev/null; then echo "SKIP interop_init_from: the bible-kjv package is not installed"; exit 0; fi
tmp=$(mktemp -d /tmp/loom-interop-sh-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bible Gen1:1-Rev22:21 </dev/null | head -c 120000 > "$tmp/kjv.txt"
$LOOM tokenize --input "$tmp/kjv.txt" --vocab 400 --out "$tmp/tokdata" --quiet --threads 2 > /dev/null || { echo "FAIL interop_setup: loom tokenize"; exit 1; }

# 1. The Hugging Face model, made by transformers.
$PY - "$tmp/hf" "$tmp/tokdata/tokenizer.json" <<'PY' || { echo "FAIL interop_setup: transformers could not make the model"; exit 1; }
import shutil, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
out, tj = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
tok = GPT2TokenizerFast(tokenizer_file=tj, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")
cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=64, n_layer=2, n_head=4,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=256, eos_token_id=256)
model = GPT2LMHeadModel(cfg)
with torch.no_grad():  # wider than the default init, so the loss is not ln(V)
    for n, p in model.named_parameters():
        if p.dim() == 2:
            p.mul_(4.0)
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
PY
ls "$tmp/hf/model.safetensors" "$tmp/hf/tokenizer.json" > /dev/null || { echo "FAIL interop_setup: no model.safetensors/tokenizer.json"; exit 1; }

# 2. Fine-tune from it; the first step's loss against transformers'.
$LOOM tokenize --input "$tmp/kjv.txt" --tokenizer "$tmp/hf/tokenizer.json" --out "$tmp/data" --quiet --threads 2 > /dev/null
targs=(--data "$tmp/data" --steps 5 --batch 2 --seq 32 --lr 1e-3 --warmup 0 --eval-every 0 --eval-batches 2 --sample-tokens 0 --threads 2)
if $LOOM train --init-from "$tmp/hf" "${targs[@]}" --out "$tmp/run" > "$tmp/train.log" 2>&1; then
    echo "PASS interop_train_init_from"
else
    echo "FAIL interop_train_init_from: $(tail -3 "$tmp/train.log")"; exit 1
fi
l1=$(head -1 "$tmp/run/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
ref=$($PY tests/interop_oracle.py loss "$tmp/hf" "$tmp/data/train_000000.bin" 2 32)
awk -v a="$l1" -v b="$ref" 'BEGIN{d=(a-b)/b; if(d<0)d=-d; exit !(d <= 1e-5)}' \
    && echo "PASS interop_first_step_loss (loom $l1, transformers $ref)" \
    || echo "FAIL interop_first_step_loss: loom $l1, transformers $ref"
grep -q "2 layers, 4 heads, 64 channels, context 64, vocabulary 400 (padded 448)" "$tmp/train.log" \
    && echo "PASS interop_architecture_from_config" || echo "FAIL interop_architecture_from_config: $(grep vocabulary "$tmp/train.log")"

# 3. Refusals.
refuse() { # name, expected text, command...
    local name=$1 want=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q -- "$want"; then echo "PASS $name"
    else echo "FAIL $name: exit $rc: $out"; fi
}
refuse interop_refuses_other_tokenizer "another tokenizer" \
    $LOOM train --init-from "$tmp/hf" --data "$tmp/kjv.txt" --steps 1 --out "$tmp/r1"
mkdir -p "$tmp/llama" && sed 's/"gpt2"/"llama"/' "$tmp/hf/config.json" > "$tmp/llama/config.json"
refuse interop_refuses_model_type 'model_type "gpt2"' \
    $LOOM train --init-from "$tmp/llama" --data "$tmp/data" --steps 1 --out "$tmp/r2"
mkdir -p "$tmp/pt" && cp "$tmp/hf/config.json" "$tmp/hf/tokenizer.json" "$tmp/pt/" && cp "$tmp/hf/model.safetensors" "$tmp/pt/pytorch_model.bin"
refuse interop_refuses_pytorch_bin "out of scope" \
    $LOOM train --init-from "$tmp/pt" --data "$tmp/data" --steps 1 --out "$tmp/r3"

# 4. Back to transformers: validation loss and greedy text.
$LOOM export --run "$tmp/run" --format hf --out "$tmp/export" > /dev/null || echo "FAIL interop_export_hf: loom export failed"
ev=$($LOOM eval --run "$tmp/run" --data "$tmp/data" --batch 1 --seq 32 --batches 1 --threads 2 | awk '{print $2}')
hv=$($PY tests/interop_oracle.py loss "$tmp/export" "$tmp/data/val_000000.bin" 1 32)
awk -v a="$ev" -v b="$hv" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d <= 6e-5)}' \
    && echo "PASS interop_export_hf_val_loss (loom eval $ev, transformers $hv)" \
    || echo "FAIL interop_export_hf_val_loss: loom eval $ev, transformers $hv"
prompt="And God said"
lg=$($LOOM sample --run "$tmp/run" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
hg=$($PY tests/interop_oracle.py greedy "$tmp/export" "$prompt" 24)
[ "$lg" = "$hg" ] && echo "PASS interop_export_hf_greedy_text" || echo "FAIL interop_export_hf_greedy_text: loom '$lg' vs transformers '$hg'"

# 5. GGUF back into loom.
$LOOM export --run "$tmp/run" --format gguf --out "$tmp/m.gguf" > /dev/null || echo "FAIL interop_export_gguf: loom export failed"
gg=$($LOOM sample --gguf "$tmp/m.gguf" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
gr=$($LOOM sample --run "$tmp/m.gguf" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
[ "$gg" = "$lg" ] && [ "$gr" = "$lg" ] && echo "PASS interop_sample_gguf_greedy_text" || echo "FAIL interop_sample_gguf_greedy_text: '$gg' / '$gr' vs '$lg'"
refuse interop_export_refuses_existing "already exists" $LOOM export --run "$tmp/run" --format gguf --out "$tmp/m.gguf"
refuse interop_export_hf_refuses_q8_0 "GGUF type" $LOOM export --run "$tmp/run" --format hf --dtype q8_0 --out "$tmp/e2"

# 6. Every kind of source through the one call (ckpt/open.h): the Hugging
#    Face folder transformers made, read by loom sample and loom eval,
#    against transformers on the same folder; a checkpoint folder of the
#    run gives the run's text; a Hugging Face folder exports to GGUF with
#    transformers' greedy text; a GGUF is refused as an export source.
hs=$($LOOM sample --run "$tmp/hf" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
ho=$($PY tests/interop_oracle.py greedy "$tmp/hf" "$prompt" 24)
[ -n "$ho" ] && [ "$hs" = "$ho" ] && echo "PASS open_hf_folder_greedy_text" || echo "FAIL open_hf_folder_greedy_text: loom '$hs' vs transformers '$ho'"
he=$($LOOM eval --run "$tmp/hf" --data "$tmp/data" --batch 1 --seq 32 --batches 1 --threads 2 | awk '{print $2}')
hl=$($PY tests/interop_oracle.py loss "$tmp/hf" "$tmp/data/val_000000.bin" 1 32)
awk -v a="$he" -v b="$hl" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(a != "" && d <= 6e-5)}' \
    && echo "PASS open_hf_folder_eval (loom $he, transformers $hl)" || echo "FAIL open_hf_folder_eval: loom '$he', transformers '$hl'"
ck=$(ls -d "$tmp/run/checkpoints/step_"* | tail -1)
cs=$($LOOM sample --run "$ck" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
[ -n "$cs" ] && [ "$cs" = "$lg" ] && echo "PASS open_checkpoint_folder_text" || echo "FAIL open_checkpoint_folder_text: '$cs' vs the run's '$lg'"
$LOOM export --run "$tmp/hf" --format gguf --out "$tmp/hf.gguf" > /dev/null || echo "FAIL open_export_hf_to_gguf: loom export failed"
hg2=$($LOOM sample --run "$tmp/hf.gguf" --prompt "$prompt" --tokens 24 --temperature 0 --threads 2 2>/dev/null)
[ -n "$hg2" ] && [ "$hg2" = "$ho" ] && echo "PASS open_export_hf_to_gguf" || echo "FAIL open_export_hf_to_gguf: '$hg2' vs transformers '$ho'"
refuse open_export_refuses_gguf_source "is a GGUF file" $LOOM export --run "$tmp/m.gguf" --format hf --out "$tmp/e3"
