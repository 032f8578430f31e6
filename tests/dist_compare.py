#!/usr/bin/env python3
"""Compare two loom training runs of the same global batch laid out
differently (ranks, ZeRO stage, tensor or pipeline parallel): the losses in
metrics.jsonl and the final weights of the newest checkpoint, read with
numpy and the safetensors package (independent of loom's reader).

usage: dist_compare.py REF RUN [--losses N] [--loss-tol R] [--weight-tol A] [--exact]
  --losses N      compare the first N steps' losses (default 10)
  --loss-tol R    largest relative loss difference (default 1e-5)
  --weight-tol A  largest absolute weight difference (default 1e-5)
  --exact         losses and weights must be bit for bit equal
Prints one line; exits 1 when the runs differ."""
import argparse
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def losses(run):
    by_step = {}
    for line in open(run + "/metrics.jsonl"):
        row = json.loads(line)
        if "loss" in row:
            by_step[row["step"]] = row["loss"]
    return [by_step[k] for k in sorted(by_step)]


def weights(run):
    name = open(run + "/latest").read().strip()
    return load_file(f"{run}/checkpoints/{name}/model.safetensors")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--losses", type=int, default=10)
    ap.add_argument("--loss-tol", type=float, default=1e-5)
    ap.add_argument("--weight-tol", type=float, default=1e-5)
    ap.add_argument("--exact", action="store_true")
    a = ap.parse_args()
    la, lb = losses(a.ref)[: a.losses], losses(a.run)[: a.losses]
    if len(la) < a.losses or len(lb) < a.losses:
        print(f"only {len(la)} and {len(lb)} losses, want {a.losses}")
        return 1
    lworst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    wa, wb = weights(a.ref), weights(a.run)
    if sorted(wa) != sorted(wb):
        print(f"different tensors: {sorted(wa)} vs {sorted(wb)}")
        return 1
    bad = [k for k in wa if wa[k].shape != wb[k].shape]
    if bad:
        print(f"different shapes of {bad}")
        return 1
    diff = {k: float(np.max(np.abs(wa[k].astype(np.float64) - wb[k]))) if wa[k].size else 0.0 for k in wa}
    wname = max(diff, key=diff.get)
    if a.exact:
        same = la == lb and all(np.array_equal(wa[k].view(np.uint32), wb[k].view(np.uint32)) for k in wa)
        print(f"bit-exact: {'yes' if same else 'no'} (losses within {lworst:.1e}, weights within {diff[wname]:.1e} at {wname})")
        return 0 if same else 1
    if lworst > a.loss_tol:
        print(f"losses differ by {lworst:.2e} relative (> {a.loss_tol:g}): {la} vs {lb}")
        return 1
    if diff[wname] > a.weight_tol:
        print(f"final weights differ by {diff[wname]:.2e} at {wname} (> {a.weight_tol:g})")
        return 1
    print(f"{len(la)} losses within {lworst:.1e} relative, {len(wa)} tensors within {diff[wname]:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
