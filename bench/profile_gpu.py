#!/usr/bin/env python3
"""Run chosen benchmark cases a few times each, for a profiler to watch.

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so \
        ncu --clock-control none --kernel-name regex:_kernel --launch-skip 2 --launch-count 1 \
        python3 bench/profile_gpu.py fwht:rows=1048576

Each argument is GROUP[:KEY=VALUE,...] (groups as in bench_gpu.py --only);
every case of the group whose params match runs `--calls` times (default 3)
with kpool, or with the Triton reference when --reference is given. Nothing
is timed here: bench_gpu.py does that, this gives ncu the same inputs.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402


def matches(params, want):
    return all(str(params.get(k)) == v for k, v in want.items())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="+", help="GROUP[:KEY=VALUE,...]")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--reference", action="store_true", help="run the Triton reference instead of kpool")
    p.add_argument("--arithmetic", choices=("default", "exact", "triton"), default="default",
                   help="kpool's softmax-pool arithmetic (kpool.set_arithmetic)")
    a = p.parse_args(argv)

    import torch

    import kpool
    import workloads as kt

    kpool.set_arithmetic(a.arithmetic)
    lib = kt.import_reference() if a.reference else kpool
    gen = kt.Gen(1234, "cuda")
    groups = dict(fwht=bench_gpu.cases_fwht, compress=bench_gpu.cases_compress, seed=bench_gpu.cases_seed,
                  decode=bench_gpu.cases_decode, expand=bench_gpu.cases_expand)
    for spec in a.cases:
        group, _, rest = spec.partition(":")
        want = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
        for case in groups[group](kt, gen, False):
            if not matches(case.params, want):
                continue
            views = case.views()
            for _ in range(a.calls):
                case.run(lib, views)
            torch.cuda.synchronize()
            print(case.op, case.params, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
