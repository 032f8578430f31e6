#!/usr/bin/env bash
# Inputs (issue 28): a folder where a file is expected gets a message, never
# an abort; a data folder without shards is refused; one writer per run
# folder (a second `loom train` is refused naming the first one's PID and
# touches nothing); readers of a live run never fail because a checkpoint
# was pruned while they opened it. Nothing here waits on a clock: the live
# run is given far more steps than the test needs and stopped at the end.
set -u
cd "$(dirname "$0")/.."
LOOM=$(realpath "${LOOM:-build/loom}")
tmp=$(mktemp -d /tmp/loom-inputs-XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT
/usr/bin/python3 -c "import random; random.seed(3); print(' '.join(random.choice(['in','the','beginning','God','created','heaven','and','earth.','light']) for _ in range(20000)))" > "$tmp/text.txt"
$LOOM tokenize --input "$tmp/text.txt" --vocab 300 --val-fraction 0.1 --out "$tmp/bpe" --quiet > /dev/null 2>&1
A=(--layers 1 --channels 32 --heads 2 --context 32 --batch 2 --seq 16 --warmup 2 --eval-every 0 --sample-tokens 0 --threads 1)
. tests/lib_expect.sh
mkdir -p "$tmp/adir" "$tmp/empty"

# ---- a folder where a file is expected ----
expect_fail tokenizer_is_a_folder "adir: a folder, not a file" \
    $LOOM tokenize --input "$tmp/text.txt" --tokenizer "$tmp/adir" --out "$tmp/t2" --quiet
expect_fail input_is_an_empty_folder "adir" $LOOM tokenize --input "$tmp/adir" --vocab 300 --out "$tmp/t3" --quiet
$LOOM train --data "$tmp/bpe" "${A[@]}" --steps 2 --out "$tmp/small" > "$tmp/small.log" 2>&1 \
    || fail inputs_setup "$(tail -2 "$tmp/small.log")"
expect_fail prompts_is_a_folder "adir: a folder, not a file" \
    $LOOM generate --run "$tmp/small" --prompts "$tmp/adir" --out "$tmp/out.jsonl"
cp -r "$tmp/small" "$tmp/small2"; rm "$tmp/small2/tokenizer.json"; mkdir "$tmp/small2/tokenizer.json"
expect_fail run_tokenizer_is_a_folder "tokenizer.json: a folder, not a file" $LOOM sample --run "$tmp/small2" --tokens 2
mkdir -p "$tmp/hf"; mkdir "$tmp/hf/config.json"
expect_fail hf_config_is_a_folder "config.json" $LOOM sample --run "$tmp/hf" --tokens 2

# ---- a data folder without shards ----
cp "$tmp/bpe/tokenizer.json" "$tmp/empty/" 2>/dev/null
expect_fail data_folder_without_shards "empty" $LOOM train --data "$tmp/empty" "${A[@]}" --steps 2 --out "$tmp/e"

# ---- one writer per run folder ----
$LOOM train --data "$tmp/bpe" "${A[@]}" --steps 1000000 --ckpt-every 1 --keep-ckpts 2 --out "$tmp/live" > "$tmp/live.log" 2>&1 &
live=$!; pids+=($live)
for _ in $(seq 1 3000); do [ -e "$tmp/live/latest" ] && break; sleep 0.1; done  # a guard, not a measure
[ -e "$tmp/live/latest" ] || fail live_run_started "$(tail -3 "$tmp/live.log")"
expect_fail second_writer_refused_names_pid "another loom train (PID $live)" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --steps 5 --resume auto --out "$tmp/live"
expect_fail second_writer_force_refused "another loom train (PID $live)" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --steps 5 --force --out "$tmp/live"

# ---- readers of the live run: the newest complete checkpoint, every time ----
bad=0
for i in $(seq 1 6); do
    out=$($LOOM sample --run "$tmp/live" --prompt "in the" --tokens 2 2>&1) || { bad=$((bad + 1)); last=$out; }
done
[ $bad = 0 ] && pass "sample_during_ckpt_every_1_run (6 of 6)" || fail sample_during_ckpt_every_1_run "$bad of 6 failed: $(printf '%s' "$last" | tail -1)"
kill -0 $live 2>/dev/null && pass live_run_survived_second_writers || fail live_run_survived_second_writers "$(tail -3 "$tmp/live.log")"
kill -TERM $live; wait $live; rc=$?
[ $rc = 75 ] && pass "live_run_sigterm_resumable_exit" || fail live_run_sigterm_resumable_exit "exit $rc: $(tail -2 "$tmp/live.log")"
# the lock died with its holder: a new run may take the folder
out=$($LOOM train --data "$tmp/bpe" "${A[@]}" --steps 2 --force --out "$tmp/live" 2>&1); rc=$?
[ $rc = 0 ] && pass lock_released_when_holder_ends || fail lock_released_when_holder_ends "exit $rc: $(printf '%s' "$out" | tail -2)"

# ---- a resume refuses what would change the steps, naming the difference ----
$LOOM train --data "$tmp/bpe" "${A[@]}" --steps 2 --out "$tmp/r" > /dev/null 2>&1 || fail resume_setup "train failed"
cp -r "$tmp/bpe" "$tmp/bpe_copy"
expect_fail resume_other_shape_refused "--layers 2 differs from the run's 1" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --layers 2 --steps 4 --resume auto --out "$tmp/r"
expect_fail resume_other_model_refused "--model gpt2-small differs" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --model gpt2-small --steps 4 --resume auto --out "$tmp/r"
expect_fail resume_other_val_fraction_refused "--val-fraction 0.2 differs" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --val-fraction 0.2 --steps 4 --resume auto --out "$tmp/r"
expect_fail resume_other_data_refused "--data .*bpe_copy differs" \
    $LOOM train --data "$tmp/bpe_copy" "${A[@]}" --steps 4 --resume auto --out "$tmp/r"
out=$($LOOM train --data "$tmp/bpe" "${A[@]}" --steps 4 --resume auto --out "$tmp/r" 2>&1) \
    && pass resume_same_settings_accepted || fail resume_same_settings_accepted "$(printf '%s' "$out" | tail -2)"
# eval from another folder finds the run's data (config.json keeps it resolved)
rel=$(cd "$tmp" && mkdir -p w && cd w && $LOOM train --data ../bpe "${A[@]}" --steps 2 --out ../rel > /dev/null 2>&1; echo $?)
out=$(cd / && $LOOM eval --run "$tmp/rel" 2>&1) && printf '%s' "$out" | grep -q val_loss \
    && pass eval_from_another_folder_finds_relative_data || fail eval_from_another_folder_finds_relative_data "train $rel: $(printf '%s' "$out" | tail -1)"

# ---- a tokenizer.json with a sparse, huge id: refused, not a multi-GB table ----
/usr/bin/python3 -c "
import json, sys; t = json.load(open(sys.argv[1])); v = t['model']['vocab']; v[list(v)[5]] = 2**30; json.dump(t, open(sys.argv[2], 'w'))" \
    "$tmp/bpe/tokenizer.json" "$tmp/sparse.json"
expect_fail tokenizer_sparse_huge_id_refused "far above the file's" \
    $LOOM tokenize --input "$tmp/text.txt" --tokenizer "$tmp/sparse.json" --out "$tmp/t6" --quiet

# ---- NaN in the optimizer state (checksums valid): the resume is refused, no NaN checkpoint is committed ----
if command -v xxhsum > /dev/null; then
    $LOOM train --data "$tmp/bpe" "${A[@]}" --steps 2 --out "$tmp/on" > /dev/null 2>&1
    /usr/bin/python3 tests/ft_tamper.py optim_nan "$tmp/on/checkpoints/step_00000002"
    expect_fail optimizer_nan_refused "AdamW m\[0\] is nan" \
        $LOOM train --data "$tmp/bpe" "${A[@]}" --steps 4 --resume auto --out "$tmp/on"
    [ ! -d "$tmp/on/checkpoints/step_00000004" ] && pass optimizer_nan_no_checkpoint_committed \
        || fail optimizer_nan_no_checkpoint_committed "step 4 was written"
else
    echo "SKIP optimizer_nan_refused: xxhsum not installed (Debian package xxhash)"
fi

# ---- a model config out of bounds, whichever way it arrives: the CLI's bounds, refused by name ----
$LOOM train --data "$tmp/bpe" "${A[@]}" --steps 2 --out "$tmp/base" > /dev/null 2>&1 || fail base_setup "train failed"
ck=$(ls -d "$tmp"/base/checkpoints/step_* | tail -1)
for c in 131072 536870912; do
    rm -rf "$tmp/hfc"; mkdir "$tmp/hfc"; cp "$ck/config.json" "$ck/model.safetensors" "$tmp/base/tokenizer.json" "$tmp/hfc/"
    /usr/bin/python3 -c "
import json, sys; p = sys.argv[1]; j = json.load(open(p)); j['n_embd'] = int(sys.argv[2]); j['n_head'] = 1; json.dump(j, open(p, 'w'))" "$tmp/hfc/config.json" $c
    expect_fail "hf_config_n_embd_${c}_refused" "n_embd\|$c channels; expected 1 to 65536" $LOOM sample --run "$tmp/hfc" --tokens 2
    expect_fail "init_from_n_embd_${c}_refused" "n_embd\|$c channels; expected 1 to 65536" \
        $LOOM train --data "$tmp/bpe" --init-from "$tmp/hfc" --batch 2 --seq 16 --steps 1 --threads 1 --out "$tmp/ic"
done
expect_fail cli_channels_bound "65536" $LOOM train --data "$tmp/bpe" "${A[@]}" --channels 131072 --heads 1 --steps 1 --out "$tmp/cc"

# ---- NaN in weights from any loader: refused with the tensor named ----
$LOOM export --run "$tmp/base" --format gguf --out "$tmp/base.gguf" > /dev/null 2>&1 || fail gguf_setup "export failed"
PYTHONPATH=.deps/py /usr/bin/python3 -c "
import sys, shutil, struct
from gguf import GGUFReader
shutil.copy(sys.argv[1], sys.argv[2])
t = [t for t in GGUFReader(sys.argv[2]).tensors if t.name == 'blk.0.attn_qkv.weight'][0]
f = open(sys.argv[2], 'r+b'); f.seek(int(t.data_offset) + 28); f.write(struct.pack('<f', float('nan')))" "$tmp/base.gguf" "$tmp/nan.gguf" \
    || fail gguf_nan_setup "the gguf package is missing (.deps/py)"
expect_fail gguf_nan_weights_refused "blk.0.attn_qkv.weight holds NaN at element 7" $LOOM sample --gguf "$tmp/nan.gguf" --tokens 2
rm -rf "$tmp/hfn"; mkdir "$tmp/hfn"; cp "$ck/config.json" "$ck/model.safetensors" "$tmp/base/tokenizer.json" "$tmp/hfn/"
/usr/bin/python3 -c "
import sys, json, struct
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
o = h['h.0.mlp.c_fc.weight']['data_offsets'][0] + 8 + n + 4 * 3; b[o:o + 4] = struct.pack('<f', float('inf')); open(p, 'wb').write(b)" "$tmp/hfn/model.safetensors"
expect_fail init_from_inf_weights_refused "h.0.mlp.c_fc.weight holds infinity at element 3" \
    $LOOM train --data "$tmp/bpe" --init-from "$tmp/hfn" --batch 2 --seq 16 --steps 1 --threads 1 --out "$tmp/in"
expect_fail export_inf_weights_refused "h.0.mlp.c_fc.weight holds infinity" $LOOM export --run "$tmp/hfn" --format gguf --out "$tmp/hfn.gguf"

# ---- export and --init-from read safetensors through the one checked reader ----
for how in overlap metadata fraction; do
    rm -rf "$tmp/hfo"; mkdir "$tmp/hfo"; cp "$ck/config.json" "$ck/model.safetensors" "$tmp/base/tokenizer.json" "$tmp/hfo/"
    /usr/bin/python3 -c "
import sys, json, struct
p, how = sys.argv[1], sys.argv[2]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
if how == 'overlap': h['h.0.ln_1.bias']['data_offsets'] = h['h.0.ln_1.weight']['data_offsets']
if how == 'metadata': h['__metadata__'] = {'format': 7}
if how == 'fraction': h['h.0.ln_1.bias']['data_offsets'][0] += 0.5
hj = json.dumps(h).encode(); hj += b' ' * (-len(hj) % 8)
open(p, 'wb').write(struct.pack('<Q', len(hj)) + hj + b[8 + n:])" "$tmp/hfo/model.safetensors" $how
    pat=$(case $how in overlap) echo "overlap";; metadata) echo "__metadata__.format is not a string";; fraction) echo "whole numbers";; esac)
    expect_fail "export_safetensors_${how}_refused" "$pat" $LOOM export --run "$tmp/hfo" --format gguf --out "$tmp/hfo.gguf"
    expect_fail "init_from_safetensors_${how}_refused" "$pat" \
        $LOOM train --data "$tmp/bpe" --init-from "$tmp/hfo" --batch 2 --seq 16 --steps 1 --threads 1 --out "$tmp/io"
done

# ---- export enforces the run's tokenizer hash, as sample and serve do ----
$LOOM tokenize --input "$tmp/text.txt" --vocab 280 --val-fraction 0.1 --out "$tmp/bpe2" --quiet > /dev/null 2>&1
rm -rf "$tmp/swapped"; cp -r "$tmp/base" "$tmp/swapped"; cp "$tmp/bpe2/tokenizer.json" "$tmp/swapped/"
expect_fail export_swapped_tokenizer_refused "is not the one the run trained with" \
    $LOOM export --run "$tmp/swapped" --format gguf --out "$tmp/sw.gguf"
expect_fail export_checkpoint_swapped_tokenizer_refused "is not the one the run trained with" \
    $LOOM export --run "$(ls -d "$tmp"/swapped/checkpoints/step_* | tail -1)" --format hf --out "$tmp/sw_hf"

# ---- a checkpoint without manifest.json: refused unless --no-verify; a manifest that omits a file: refused ----
rm -rf "$tmp/nm"; cp -r "$tmp/base" "$tmp/nm"; rm "$(ls -d "$tmp"/nm/checkpoints/step_* | tail -1)/manifest.json"
expect_fail no_manifest_refused "no manifest.json.*--no-verify" $LOOM sample --run "$tmp/nm" --tokens 2
expect_fail no_manifest_resume_refused "no manifest.json" $LOOM train --data "$tmp/bpe" "${A[@]}" --steps 4 --resume auto --out "$tmp/nm"
out=$($LOOM sample --run "$tmp/nm" --tokens 2 --no-verify 2>&1) && printf '%s' "$out" | grep -q "unverified" \
    && pass no_manifest_loads_with_no_verify || fail no_manifest_loads_with_no_verify "$(printf '%s' "$out" | tail -1)"
rm -rf "$tmp/om"; cp -r "$tmp/base" "$tmp/om"
/usr/bin/python3 -c "
import json, sys; p = sys.argv[1]; j = json.load(open(p)); j['files'] = [f for f in j['files'] if f['name'] != 'state.json']; json.dump(j, open(p, 'w'))" \
    "$(ls -d "$tmp"/om/checkpoints/step_* | tail -1)/manifest.json"
expect_fail manifest_omitting_state_refused "does not list state.json" $LOOM sample --run "$tmp/om" --tokens 2 --no-verify

# ---- token shards record their tokenizer; train refuses a swapped tokenizer.json ----
rm -rf "$tmp/bsw"; cp -r "$tmp/bpe" "$tmp/bsw"
/usr/bin/python3 -c "
import json, sys; p = sys.argv[1]; t = json.load(open(p)); v = t['model']['vocab']; k = list(v); v[k[260]], v[k[261]] = v[k[261]], v[k[260]]; json.dump(t, open(p, 'w'))" \
    "$tmp/bsw/tokenizer.json"
expect_fail shards_other_tokenizer_refused "train shard 0 was made by another tokenizer" \
    $LOOM train --data "$tmp/bsw" "${A[@]}" --steps 1 --out "$tmp/tsw"
# a shard of an older loom (no hash recorded): a one-line note, not a refusal
rm -rf "$tmp/bold"; cp -r "$tmp/bpe" "$tmp/bold"
for f in "$tmp"/bold/*.bin; do printf '\0\0\0\0\0\0\0\0' | dd of="$f" bs=1 seek=36 conv=notrunc status=none; done
out=$($LOOM train --data "$tmp/bold" "${A[@]}" --steps 1 --out "$tmp/told" 2>&1) && printf '%s' "$out" | grep -q "do not record their tokenizer" \
    && pass old_shards_load_with_note || fail old_shards_load_with_note "$(printf '%s' "$out" | tail -1)"

# ---- a write that fails (disk full) exits 74 (EX_IOERR), not 2 (usage) ----
echo '{"prompt":"in the","max_tokens":2}' > "$tmp/p.jsonl"
$LOOM generate --run "$tmp/base" --prompts "$tmp/p.jsonl" --out /dev/full > /dev/null 2>&1; rc=$?
[ $rc = 74 ] && pass disk_full_generate_exits_74 || fail disk_full_generate_exits_74 "exit $rc"
mkdir -p "$tmp/full"
if mount -t tmpfs -o size=160k tmpfs "$tmp/full" 2> /dev/null; then
    out=$($LOOM train --data "$tmp/bpe" "${A[@]}" --steps 2 --out "$tmp/full/run" 2>&1); rc=$?
    umount "$tmp/full"
    [ $rc = 74 ] && printf '%s' "$out" | grep -q "No space left" && pass disk_full_checkpoint_exits_74 \
        || fail disk_full_checkpoint_exits_74 "exit $rc: $(printf '%s' "$out" | tail -1)"
else
    echo "SKIP disk_full_checkpoint_exits_74: cannot mount a small tmpfs here (not root)"
fi

# ---- loom export onto a full disk or a read-only folder: 74 naming the path; onto
# a device or a folder of other files: refused, even with --force (the writers
# rename a staging copy over OUT, which would replace /dev/full or wipe the folder) ----
X=(export --run "$tmp/small")
mkdir -p "$tmp/xfull" "$tmp/xro"
if mount -t tmpfs -o size=16k tmpfs "$tmp/xfull" 2> /dev/null; then
    expect_exit 74 export_gguf_disk_full_exits_74 "$tmp/xfull/m.gguf.*No space left" $LOOM "${X[@]}" --format gguf --out "$tmp/xfull/m.gguf"
    expect_exit 74 export_hf_disk_full_exits_74 "$tmp/xfull/hf.*No space left" $LOOM "${X[@]}" --format hf --out "$tmp/xfull/hf"
    left=$(ls -A "$tmp/xfull"); [ -z "$left" ] && pass export_disk_full_leaves_nothing || fail export_disk_full_leaves_nothing "left: $left"
    umount "$tmp/xfull"
    mount -t tmpfs -o ro,size=16k tmpfs "$tmp/xro"
    expect_exit 74 export_gguf_read_only_exits_74 "$tmp/xro/m.gguf.*Read-only" $LOOM "${X[@]}" --format gguf --out "$tmp/xro/m.gguf"
    expect_exit 74 export_hf_read_only_exits_74 "$tmp/xro/hf.*Read-only" $LOOM "${X[@]}" --format hf --out "$tmp/xro/hf"
    umount "$tmp/xro"
else
    echo "SKIP export_disk_full_exits_74: cannot mount a small tmpfs here (not root)"
fi
if mknod "$tmp/fulldev" c 1 7 2> /dev/null; then  # a /dev/full of the test's own
    for f in gguf hf; do
        out=$($LOOM "${X[@]}" --format $f --out "$tmp/fulldev" --force 2>&1); rc=$?
        [ $rc = 2 ] && [ -c "$tmp/fulldev" ] && printf '%s' "$out" | grep -q "fulldev exists and is not" \
            && pass export_${f}_force_onto_device_refused || fail export_${f}_force_onto_device_refused \
            "exit $rc, $(stat -c %F "$tmp/fulldev"): $(printf '%s' "$out" | tail -1)"
    done
else
    echo "SKIP export_force_onto_device_refused: mknod is not allowed here"
fi
mkdir -p "$tmp/home"; echo keep > "$tmp/home/notes.txt"
expect_exit 2 export_hf_force_onto_other_folder_refused "home exists and is not a model folder" \
    $LOOM "${X[@]}" --format hf --out "$tmp/home" --force
[ "$(cat "$tmp/home/notes.txt" 2>&1)" = keep ] && pass export_other_folder_kept || fail export_other_folder_kept "notes.txt is gone"
$LOOM "${X[@]}" --format hf --out "$tmp/xhf" > /dev/null 2>&1 && $LOOM "${X[@]}" --format gguf --out "$tmp/x.gguf" > /dev/null 2>&1
mkdir -p "$tmp/xhf.tmp"; echo keep > "$tmp/xhf.tmp/notes.txt" # a folder and a file of the user's beside OUT, named like staging
echo keep > "$tmp/x.gguf.tmp"
expect_exit 0 export_force_replaces_an_export "GGUF v3" sh -c "$LOOM ${X[*]} --format hf --out $tmp/xhf --force && $LOOM ${X[*]} --format gguf --out $tmp/x.gguf --force"
[ "$(cat "$tmp/xhf.tmp/notes.txt" 2>&1)" = keep ] && pass export_hf_keeps_a_user_folder_named_out_tmp || fail export_hf_keeps_a_user_folder_named_out_tmp "xhf.tmp/notes.txt is gone"
[ "$(cat "$tmp/x.gguf.tmp" 2>&1)" = keep ] && pass export_gguf_keeps_a_user_file_named_out_tmp || fail export_gguf_keeps_a_user_file_named_out_tmp "x.gguf.tmp was overwritten"
[ "$(stat -c %a "$tmp/x.gguf")" = 644 ] && [ "$(stat -c %a "$tmp/xhf")" = 755 ] && pass export_modes_are_public \
    || fail export_modes_are_public "x.gguf $(stat -c %a "$tmp/x.gguf"), xhf $(stat -c %a "$tmp/xhf")"

# ---- a rank killed by SIGKILL: the launcher exits 3 (a peer died), as documented ----
$LOOM train --data "$tmp/bpe" "${A[@]}" --nproc 2 --steps 1000000 --ckpt-every 1 --keep-ckpts 1 --out "$tmp/np" > "$tmp/np.log" 2>&1 &
launcher=$!; pids+=($launcher)
for _ in $(seq 1 3000); do [ -e "$tmp/np/latest" ] && break; sleep 0.1; done  # a guard, not a measure
rank=$(pgrep -P $launcher | tail -1)
if [ -n "$rank" ]; then
    kill -KILL "$rank"; wait $launcher; rc=$?
    [ $rc = 3 ] && pass killed_rank_launcher_exits_3 || fail killed_rank_launcher_exits_3 "exit $rc: $(tail -2 "$tmp/np.log")"
else
    fail killed_rank_launcher_exits_3 "no rank process under the launcher: $(tail -2 "$tmp/np.log")"
fi

# ---- a SIGTERM to the launcher before its ranks have their handlers: the ranks die of the
# signal passed on, and the job ends as the signal asked (143), not as a dead peer (3) ----
mkdir -p "$tmp/hold"
LOOM_TEST_HOLD_BEFORE_START="$tmp/hold" $LOOM train --data "$tmp/bpe" "${A[@]}" --nproc 2 --steps 2 --out "$tmp/np2" > "$tmp/np2.log" 2>&1 &
launcher=$!; pids+=($launcher)
for _ in $(seq 1 3000); do [ -e "$tmp/hold/rank0" ] && [ -e "$tmp/hold/rank1" ] && break; sleep 0.1; done  # a guard, not a measure
kill -TERM $launcher; wait $launcher; rc=$?
[ $rc = 143 ] && pass early_sigterm_launcher_exits_143 || fail early_sigterm_launcher_exits_143 "exit $rc: $(tail -2 "$tmp/np2.log")"

# ---- 1 rank x --grad-accum 3 resumed on 2 ranks: the advice names world sizes that work ----
$LOOM train --data "$tmp/bpe" "${A[@]}" --grad-accum 3 --steps 2 --out "$tmp/ga" > /dev/null 2>&1 || fail grad_accum_setup "train failed"
expect_fail resume_accum3_on_2_ranks_advice "do not split over 2 ranks; resume with --nproc 1 --grad-accum 3 or --nproc 3 --grad-accum 1" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --grad-accum 3 --nproc 2 --steps 4 --resume auto --out "$tmp/ga"
expect_fail sample_missing_gguf_no_train_advice "missing.gguf: no such file; check the path" $LOOM sample --gguf "$tmp/missing.gguf" --tokens 2

# ---- a layout that does not divide --nproc is refused before any rank starts ----
expect_fail pp3_on_2_ranks_before_launch "2 ranks (--nproc 2 x --nnodes 1) is not a multiple of --tp 1 x --pp 3 = 3; use a multiple of 3 ranks" \
    $LOOM train --data "$tmp/bpe" "${A[@]}" --layers 3 --nproc 2 --pp 3 --steps 2 --out "$tmp/pp3"
[ -e "$tmp/pp3" ] && fail pp3_on_2_ranks_nothing_written "$tmp/pp3 was created" || pass pp3_on_2_ranks_nothing_written
