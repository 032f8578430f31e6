"""Edit loom checkpoints and shards the way corruption or a careless hand
would, independently of loom's own code: safetensors headers, state.json,
float values, shard bytes; and rewrite a checkpoint's manifest.json with
checksums from the reference `xxhsum -H1`, so that loom's header and value
checks (not its checksum check) are what a test exercises."""
import json, os, struct, subprocess, sys


def xxh64(path):
    out = subprocess.run(["xxhsum", "-H1", path], capture_output=True, text=True, check=True).stdout
    return out.split()[0][-16:]


def remanifest(ckpt):
    path = os.path.join(ckpt, "manifest.json")
    m = json.load(open(path))
    for f in m["files"]:
        p = os.path.join(ckpt, f["name"])
        f["bytes"] = os.path.getsize(p)
        f["xxh64"] = xxh64(p)
    json.dump(m, open(path, "w"), indent=1)


def check_manifest(ckpt):
    """Every file but the manifest listed, with its size and xxhsum's hash."""
    m = json.load(open(os.path.join(ckpt, "manifest.json")))
    listed = {f["name"]: f for f in m["files"]}
    names = sorted(n for n in os.listdir(ckpt) if n != "manifest.json")
    assert sorted(listed) == names, (sorted(listed), names)
    for n in names:
        p = os.path.join(ckpt, n)
        assert listed[n]["bytes"] == os.path.getsize(p), n
        assert listed[n]["xxh64"] == xxh64(p), n
    return len(names)


def read_st(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_st(path, header, body):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + body)


def st_edit(ckpt, how):
    path = os.path.join(ckpt, "model.safetensors")
    hdr, body = read_st(path)
    t = hdr["h.0.ln_1.weight"]
    if how == "one_offset":
        t["data_offsets"] = t["data_offsets"][:1]
    elif how == "offsets_outside":
        t["data_offsets"] = [len(body), len(body) + 4 * t["shape"][0]]
    elif how == "overlap":
        o = hdr["h.0.ln_1.bias"]["data_offsets"]
        t["data_offsets"] = [o[0] + 4, o[0] + 4 + 4 * t["shape"][0]]
    elif how == "dtype_number":
        t["dtype"] = 5
    elif how == "shape_string":
        t["shape"] = ["x"]
    elif how == "wrong_shape":
        t["shape"] = [t["shape"][0] // 2, 2]
    elif how == "nan":
        b0 = t["data_offsets"][0]
        body = body[:b0 + 8] + struct.pack("<f", float("nan")) + body[b0 + 12:]
    else:
        raise SystemExit("unknown edit " + how)
    write_st(path, hdr, body)
    remanifest(ckpt)


def state_edit(ckpt, key, value):
    path = os.path.join(ckpt, "state.json")
    s = json.load(open(path))
    s[key] = json.loads(value)
    text = json.dumps(s)
    open(path, "w").write(text)
    remanifest(ckpt)


def flip(path, offset_fraction):
    data = bytearray(open(path, "rb").read())
    i = int(len(data) * float(offset_fraction))
    data[i] ^= 0x10
    open(path, "wb").write(bytes(data))


def optim_step(ckpt, step):
    """Rewrite the step in an optimizer shard's header (u64 at byte 56)."""
    path = os.path.join(ckpt, "optim-rank00000-of-00001.bin")
    data = bytearray(open(path, "rb").read())
    data[56:64] = struct.pack("<Q", int(step))
    open(path, "wb").write(bytes(data))
    remanifest(ckpt)


def optim_nan(ckpt):
    """NaN as AdamW's first m value, with the shard's own FNV-1a checksum
    (u64 at byte 64) and the manifest recomputed: only the values are wrong."""
    path = os.path.join(ckpt, "optim-rank00000-of-00001.bin")
    data = bytearray(open(path, "rb").read())
    hb = struct.unpack("<I", data[12:16])[0]
    data[hb:hb + 4] = struct.pack("<f", float("nan"))
    h = 1469598103934665603
    for b in data[hb:]:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    data[64:72] = struct.pack("<Q", h)
    open(path, "wb").write(bytes(data))
    remanifest(ckpt)


def shard_version(path, v):
    data = bytearray(open(path, "rb").read())
    data[4:8] = struct.pack("<i", int(v))
    open(path, "wb").write(bytes(data))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    r = {"remanifest": remanifest, "check_manifest": check_manifest, "st": st_edit, "state": state_edit,
         "flip": flip, "shard_version": shard_version, "optim_step": optim_step, "optim_nan": optim_nan}[cmd](*args)
    if r is not None:
        print(r)
