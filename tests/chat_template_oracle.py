#!/usr/bin/env python3
"""Python jinja2, set up as Hugging Face transformers sets it up for
apply_chat_template, as the oracle of tests/test_chat_template.c.

usage: chat_template_oracle.py JOBS.json OUT.json
JOBS.json is a list of {"template", "messages", "tools" (optional),
"bos_token", "eos_token", "add_generation_prompt"}; OUT.json gets, for each,
{"text": rendered} or {"error": message}.
"""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' own tojson: no HTML escaping, no key sorting, non-ASCII kept
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(env, job):
    kw = {"messages": job["messages"], "add_generation_prompt": job["add_generation_prompt"]}
    for k in ("tools", "bos_token", "eos_token"):
        if job.get(k) is not None:
            kw[k] = job[k]
    try:
        return {"text": env.from_string(job["template"]).render(**kw)}
    except Exception as e:  # the oracle reports what jinja2 refused
        return {"error": f"{type(e).__name__}: {e}"}


def main(jobs_path, out_path):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump([render(env, j) for j in jobs], f, ensure_ascii=False)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
