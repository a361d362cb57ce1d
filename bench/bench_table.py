#!/usr/bin/env python3
"""Render bench_gpu.py's JSON as the markdown tables docs/benchmarks.md keeps:
the engine steps (when the run has them), then the ops.

    python3 bench/bench_table.py docs/measured/h200_bench.json
"""

from __future__ import annotations

import json
import sys

# Short names for the table; bench_gpu.py's op names are the reference's.
OPS = {
    "kpool_compress_and_write_cache": "compress",
    "kpool_seed_tail_cache": "seed_tail",
    "kpool_decode_update_..._batched": "decode",
    "expand_pools_to_tokens+append_tail_to_topk": "expand_to_tokens+append",
    "expand_pools_and_append_tail": "expand_and_append",
    "fwht128_quant_fp8": "fwht",
}
SKIP_PARAMS = {"num_blocks", "ring", "topk"}


def cell(x, fmt):
    return format(x, fmt) if x is not None else "n/a"


def shares(step, who):
    alone = step.get(f"{who}_op_us")
    if not alone or None in alone:
        return "n/a"
    return ", ".join(f"{op} {100 * t / sum(alone):.0f} %" for op, t in zip(step["ops"], alone))


def print_steps(steps):
    print("| step | case | ours µs | ref µs | roofline µs | speed-up | share of the step, ours | share, reference |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for s in steps:
        params = " ".join(f"{k}={v}" for k, v in s["params"].items())
        print(f"| {s['step']} | {params} | {cell(s.get('ours_us'), '.2f')} | {cell(s.get('ref_us'), '.2f')} "
              f"| {cell(s.get('roofline_us'), '.2f')} | {cell(s.get('speedup'), '.2f')} | {shares(s, 'ours')} "
              f"| {shares(s, 'ref')} |")
    print()


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        res = json.load(f)
    if res.get("steps"):
        print_steps(res["steps"])
    print(f"Copy roofline in the same run: {res['copy']['GBps']:.0f} GB/s ({res['device']}, torch {res['torch']}, "
          f"triton {res['triton']}); kpool arithmetic: {res.get('arithmetic', 'exact')}.\n")
    print("| op | case | ours µs | ref µs | ours graph µs | ref graph µs | % copy | speed-up | graph speed-up "
          "| host µs | vs reference |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for c in res["cases"]:
        params = " ".join(f"{k}={v}" for k, v in c["params"].items() if k not in SKIP_PARAMS)
        go, gr = c.get("ours_graph_us"), c.get("ref_graph_us")
        exact = c.get("ours_error") or c.get("exact", "n/a")
        exact = exact if isinstance(exact, str) else "; ".join(exact)
        print(f"| {OPS.get(c['op'], c['op'])} | {params} | {cell(c.get('ours_us'), '.2f')} | {c['ref_us']:.2f} "
              f"| {cell(go, '.2f')} | {cell(gr, '.2f')} | {cell(c.get('pct_of_copy'), '.1f')} "
              f"| {cell(c.get('speedup'), '.2f')} | {cell(gr / go if go and gr else None, '.2f')} "
              f"| {cell(c.get('ours_host_us'), '.1f')} | {exact} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
