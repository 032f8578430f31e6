"""What the distributed tests read back from a run folder (tests/test_dist.sh,
tests/test_pp.sh): the per-step losses of metrics.jsonl and the newest
checkpoint's weights, parsed from the safetensors file directly (no loom
code in between)."""
import array, json, struct


def losses(run):
    """{step: loss} from the run's metrics log."""
    return {r["step"]: r["loss"] for r in map(json.loads, open(run + "/metrics.jsonl"))}


def val_losses(run):
    """{step: val_loss} for the steps that measured one."""
    return {r["step"]: r["val_loss"] for r in map(json.loads, open(run + "/metrics.jsonl")) if "val_loss" in r}


def weights(run):
    """{tensor name: float32 array} of the checkpoint `latest` names."""
    name = open(run + "/latest").read().strip()
    raw = open(f"{run}/checkpoints/{name}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n
    return {k: array.array("f", raw[base + v["data_offsets"][0]: base + v["data_offsets"][1]])
            for k, v in hdr.items() if k != "__metadata__"}
