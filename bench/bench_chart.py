#!/usr/bin/env python3
"""Draws bench_gpu.py's JSON as one PNG: the engine steps and the largest case
of each op, ours next to the reference and the copy roofline.

    python3 bench/bench_chart.py docs/measured/h200_bench.json docs/h200_bench.png

Every bar is a CUDA-graph replay time divided by the reference's (the
reference is 1.0: shorter is faster); the roofline bar is the case's bytes at
the device-to-device copy bandwidth of the same run. The reference's µs are
in the labels. Needs matplotlib.
"""

from __future__ import annotations

import json
import sys


def step_bars(res):
    for s in res.get("steps", []):
        p = s["params"]
        label = (f"decode {p['requests']}x{p['next_n']} P{p['pool']}" if s["step"] == "decode step"
                 else f"prefill {p['tokens'] // 1024}K P{p['pool']}")
        yield label, s.get("ours_us"), s.get("ref_us"), s.get("roofline_us")


# The op table's largest cases: where bandwidth, not launch latency, decides.
LARGEST = {"fwht128_quant_fp8": ("rows", 1048576), "kpool_compress_and_write_cache": ("n_pools", 262144),
           "kpool_seed_tail_cache": ("tokens", 262144), "kpool_decode_update_..._batched": ("requests", 512),
           "expand_pools_and_append_tail": ("rows", 4096)}
SHORT = {"fwht128_quant_fp8": "fwht 1M", "kpool_compress_and_write_cache": "compress 256K",
         "kpool_seed_tail_cache": "seed 256K", "kpool_decode_update_..._batched": "decode 512",
         "expand_pools_and_append_tail": "expand 4096"}


def op_bars(res):
    gbps = res.get("copy", {}).get("GBps")
    for c in res["cases"]:
        key = LARGEST.get(c["op"])
        p = c["params"]
        if not key or p.get(key[0]) != key[1] or p.get("mask"):
            continue
        label = SHORT[c["op"]] + (f"x{p['next_n']}" if "next_n" in p else "") + (f" P{p['pool']}" if "pool" in p else "")
        ours = c.get("ours_graph_us") or c.get("ours_us")
        ref = c.get("ref_graph_us") or c.get("ref_us")
        yield label, ours, ref, c["bytes"] / gbps / 1e3 if gbps else None


def draw(ax, bars, title):
    import numpy as np

    bars = [b for b in bars if b[2]]
    if not bars:
        ax.set_title(title + ": not in this run", fontsize=10)
        return
    x = np.arange(len(bars))
    w = 0.27
    for i, (name, idx, color) in enumerate((("kpool", 1, "tab:blue"), ("reference", 2, "tab:gray"),
                                            ("copy roofline", 3, "tab:green"))):
        ys = [(b[idx] or 0) / b[2] for b in bars]
        ax.bar(x + (i - 1) * w, ys, w, label=name, color=color)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(x, [f"{b[0]}\n(ref {b[2]:.1f} µs)" for b in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("time / reference's time")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.load(open(argv[1]))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(13, 9))
    draw(a1, list(step_bars(res)), f"engine steps, one CUDA graph each ({res.get('device')}, "
                                   f"kpool arithmetic {res.get('arithmetic')})")
    draw(a2, list(op_bars(res)), "ops, largest cases (CUDA-graph replay)")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print("wrote", argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
