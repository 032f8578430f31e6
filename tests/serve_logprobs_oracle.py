"""The oracle of tests/serve_client.py's part "promptlogprobs": Hugging Face
transformers (GPT2LMHeadModel, PyTorch) on a loom run's checkpoint, scoring
token ids: each token's log-probability given the ones before it, and the
top-k alternatives at each position.

usage: serve_logprobs_oracle.py CHECKPOINT_DIR IDS.json K   (IDS.json: a list of id lists;
prints JSON, for each list: [{"logprob": lp of ids[i] at i (null at 0), "top": [[id, lp], ...]
(k of them, null at 0)}])"""
import json, sys

import torch
from transformers import GPT2LMHeadModel

ck, lists, k = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
model = GPT2LMHeadModel.from_pretrained(ck).eval()
outs = []
for ids in lists:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    out = [{"logprob": None, "top": None}]
    for i in range(1, len(ids)):
        v, t = torch.topk(lp[i - 1], k)
        out.append({"logprob": lp[i - 1, ids[i]].item(), "top": [[int(a), float(b)] for a, b in zip(t, v)]})
    outs.append(out)
print(json.dumps(outs))
