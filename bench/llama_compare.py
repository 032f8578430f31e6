#!/usr/bin/python3
"""Tables of bench/llama-compare.sh's results (WORK/results.tsv): per model
and measure, each side's median over the rounds with its spread (min-max),
and loom / llama.cpp. Usage: bench/llama_compare.py WORK"""
import collections
import statistics
import sys

work = sys.argv[1]
vals = collections.defaultdict(list)
for line in open(work + "/results.tsv"):
    f = line.rstrip("\n").split("\t")
    if len(f) == 5:
        try:
            vals[(f[0], f[1], f[2])].append(float(f[4]))
        except ValueError:
            pass

ROWS = [  # measure, label, higher is better
    ("fp32_decode", "fp32 decode, one stream, tok/s (bench generate decode / llama-bench tg)", 1),
    ("fp32_pp", "fp32 prompt processing, 128 tokens, tok/s (128 / TTFT / llama-bench pp128)", 1),
    ("fp32_16_out", "fp32, 16 sequences, output tok/s (bench generate / llama-batched-bench)", 1),
    ("w8a8_decode", "W8A8 vs Q8_0 decode, one stream, tok/s", 1),
    ("w8a8_pp", "W8A8 vs Q8_0 prompt processing, 128 tokens, tok/s", 1),
    ("w8a8_16_out", "W8A8 vs Q8_0, 16 sequences, output tok/s", 1),
    ("serve1_out", "bench serve fp32, 1 client, output tok/s", 1),
    ("serve1_itl_p50", "bench serve fp32, 1 client, inter-token p50 ms", 0),
    ("serve1_ttft_p50", "bench serve fp32, 1 client, TTFT p50 ms", 0),
    ("serve16_out", "bench serve fp32, 16 clients, output tok/s", 1),
    ("serve16_itl_p50", "bench serve fp32, 16 clients, inter-token p50 ms", 0),
    ("serve16_itl_p99", "bench serve fp32, 16 clients, inter-token p99 ms", 0),
    ("serve16_ttft_p50", "bench serve fp32, 16 clients, TTFT p50 ms", 0),
]


def cell(v):
    if not v:
        return "-", None
    med = statistics.median(v)
    return ("%.1f (%.1f-%.1f, n=%d)" % (med, min(v), max(v), len(v))), med


models = sorted({k[0] for k in vals})
for m in models:
    # loom's prompt processing from its TTFT
    for q in ("fp32", "w8a8"):
        t = vals.get((m, q + "_ttft_ms", "loom"), [])
        if t:
            vals[(m, q + "_pp", "loom")] = [128e3 / x for x in t if x > 0]
        for side in ("llama",):
            vals[(m, q + "_decode", side)] = vals.get((m, q + "_tg", side), [])
    print("\n### %s\n" % m)
    print("| measure | loom | llama.cpp | loom / llama.cpp |")
    print("|---|---|---|---|")
    for key, label, higher in ROWS:
        a, am = cell(vals.get((m, key, "loom"), []))
        b, bm = cell(vals.get((m, key, "llama"), []))
        ratio = "-"
        if am and bm:
            ratio = "%.2fx" % (am / bm) if higher else "%.2fx the time" % (am / bm)
        if a != "-" or b != "-":
            print("| %s | %s | %s | %s |" % (label, a, b, ratio))
    bw = vals.get((m, "bandwidth_gbs", "probe"), [])
    ld = vals.get((m, "load", "-"), [])
    for q in ("fp32", "w8a8"):
        fl, dec = vals.get((m, q + "_floor", "loom"), []), vals.get((m, q + "_decode", "loom"), [])
        if fl and dec:
            print("\n%s: loom's decode %.1f tok/s is %.0f%% of the bandwidth floor %.1f tok/s (median read bandwidth %.1f GB/s, %s)" %
                  (q, statistics.median(dec), 100 * statistics.median(dec) / statistics.median(fl), statistics.median(fl),
                   statistics.median(bw) if bw else 0, "probe range %.1f-%.1f" % (min(bw), max(bw)) if bw else ""))
    if ld:
        print("load average at the start of each pair: %s" % ", ".join("%.1f" % x for x in ld))
