#!/usr/bin/env python3
"""Host time per call of every op from Python, kpool against the reference.

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so python3 bench/host_overhead.py [--device cuda|cpu]

Each op runs on small engine-shaped torch tensors (a decode step's sizes:
the kernels take a few µs, so the GPU keeps up and the loop measures the
CPU side; with --device cpu one row each, and the CPU kernels' time is
included), ``--calls`` back-to-back calls per sample, ``--samples``
samples; the median sample's µs per call is printed for:

  ours        the drop-in function (kpool.fwht128_quant_fp8, ...): eager,
              through the _torch_calls extension when it is built
  torch.ops   the custom operator's overload called through PyTorch's
              dispatcher (torch.ops.kpool.*.default), what compiled code
              calls outside CUDA graphs
  ctypes      the drop-in function with the extension switched off (the
              package's fallback)
  reference   the Triton reference's function (its launch), CUDA only

Then where ours goes, per op, each part measured on the same tensors:

  python      ours minus the extension's call the drop-in makes, called
              alone: the drop-in's Python layers
  outputs     that call (which allocates the outputs in C, through torch's
              C shim: fwht, expand, append) minus the extension's function
              given outputs allocated beforehand: the output allocation
  read        the extension's function minus the entry point alone
              (_torch_calls.time_calls: the C call repeated on descriptors
              read once): reading the tensors and torch's current stream
  C API       the entry point alone minus the launch floor: validation,
              Halide buffers, the pipelines' prologues
  launches    the kernel launches a call makes (runtime/ops/*.cpp, no index
              words) times the driver's floor per launch through Halide's
              CUDA runtime (`kpool overhead --device cuda`: the launch, three
              context push/pop pairs, the kernel's lookup by name); CUDA only

The reference module is found like bench_gpu.py finds it
($KPOOL_REFERENCE_DIR, else ../shared/reference next to the repo). The
target is ours <= 10 µs for every op. JSON goes to --out, else
$OUT/kpool_host_overhead.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

TARGET_US = 10.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when torch sees one")
    p.add_argument("--calls", type=int, default=200, help="back-to-back calls per sample (default 200)")
    p.add_argument("--samples", type=int, default=25, help="samples per op and path (default 25)")
    p.add_argument("--out", help="JSON results path (default $OUT/kpool_host_overhead.json when OUT is set)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time (default), or this thread's CPU time: steadier on a loaded machine, blind to "
                        "waits")
    p.add_argument("--tool", help="the kpool tool, for the launch floor (default: tools/kpool next to libkpool.so)")
    return p.parse_args(argv)


# Kernel launches per call of each op on CUDA tensors with the bench's
# inputs and no index words (runtime/ops/*.cpp): fwht's words kernel, one
# compress kernel, the one-kernel decode.
LAUNCHES = 1


def op_calls(kt, gen, torch, rows):
    """(name, call(lib), extension function, its arguments, allocating
    arguments) per op: the drop-in functions on ``rows`` rows, pools,
    requests (a decode step's sizes on CUDA; one on the CPU, where the
    kernels run inside the call), and the extension's call that the drop-in
    makes: the function given outputs allocated here, and for ops with
    outputs the arguments of its ``_new`` form, which allocates them (None
    for the others)."""
    P = 4
    fw = kt.fwht_inputs(gen, rows)
    c = kt.compress_inputs(gen, rows, P)
    s = kt.seed_inputs(gen, 16 * rows, P, requests=max(rows // 2, 1))
    d = kt.decode_inputs(gen, rows, 2, P)
    e = kt.expand_inputs(gen, rows, P, table_width=4096)
    expanded = torch.zeros((rows, kt.TOPK), dtype=torch.int32, device=gen.device)
    ids, seq = e["pool_ids"], e["seq_lens"]

    def out(shape, dtype):
        return torch.empty(shape, dtype=dtype, device=gen.device)

    groups = ids.shape[1]
    return [
        ("fwht128_quant_fp8", lambda lib: lib.fwht128_quant_fp8(fw["q"]),
         "fwht128_quant_fp8", (fw["q"], out((rows, 128), torch.float8_e4m3fn), out((rows, 1), torch.float32)),
         (fw["q"],)),
        ("kpool_compress_and_write_cache",
         lambda lib: lib.kpool_compress_and_write_cache(c["kv_cache"], c["slot_k"], c["slot_score"], c["ape"],
                                                        c["loc"], P),
         "compress_and_write_cache",
         (c["kv_cache"], c["slot_k"], c["slot_score"], c["ape"], c["loc"], None, None, None, P, 128, 1, 1), None),
        ("kpool_seed_tail_cache",
         lambda lib: lib.kpool_seed_tail_cache(s["tail_kv_cache"], s["key"], s["gate_score"], s["tslot"], P),
         "seed_tail_cache", (s["tail_kv_cache"], s["key"], s["gate_score"], s["tslot"], P, 128), None),
        ("kpool_decode_update_and_maybe_write_cache_batched",
         lambda lib: lib.kpool_decode_update_and_maybe_write_cache_batched(
             d["kv_cache"], d["tail_kv_cache"], d["tail_slot_mapping"], d["key"], d["slot_score"], d["ape"],
             d["slot_mapping"], d["positions"], P),
         "decode_update_and_maybe_write_cache_batched",
         (d["kv_cache"], d["tail_kv_cache"], d["tail_slot_mapping"], d["key"], d["slot_score"], d["ape"],
          d["slot_mapping"], d["positions"], P, 128, 1), None),
        ("expand_pools_and_append_tail", lambda lib: lib.expand_pools_and_append_tail(ids, seq, P),
         "expand_pools_and_append_tail", (ids, seq, out((rows, groups * P + P - 1), torch.int32), P, 0),
         (ids, seq, P, False)),
        ("expand_pools_to_tokens",
         lambda lib: lib.expand_pools_to_tokens(ids, e["group_valid"], kt.TOPK, P),
         "expand_pools_to_tokens", (ids, e["group_valid"], None, None, out((rows, kt.TOPK), torch.int32), kt.TOPK, P),
         (ids, e["group_valid"], None, None, kt.TOPK, P)),
        ("append_tail_to_topk", lambda lib: lib.append_tail_to_topk(expanded, seq, e["pool_lens"], P),
         "append_tail_to_topk",
         (expanded, seq, e["pool_lens"], None, None, out((rows, kt.TOPK + P - 1), torch.int32), P),
         (expanded, seq, e["pool_lens"], None, None, P)),
    ]


class Dispatcher:
    """The drop-in functions' names, called through the torch.ops.kpool
    overloads (the dispatcher, as compiled code calls them) with the
    arguments the drop-ins pass."""

    def __init__(self, torch):
        self.ops = torch.ops.kpool

    def fwht128_quant_fp8(self, q):
        return self.ops.fwht128_quant_fp8.default(q)

    def kpool_compress_and_write_cache(self, kv, sk, ss, ape, loc, P):
        return self.ops.compress_and_write_cache.default(kv, sk, ss, ape, loc, None, P, 128, True, True)

    def kpool_seed_tail_cache(self, tail, key, gate, tslot, P):
        return self.ops.seed_tail_cache.default(tail, key, gate, tslot, P, 128)

    def kpool_decode_update_and_maybe_write_cache_batched(self, kv, tail, tsm, key, score, ape, sm, pos, P):
        return self.ops.decode_update_and_maybe_write_cache_batched.default(kv, tail, tsm, key, score, ape, sm, pos,
                                                                            P, 128, True)

    def expand_pools_and_append_tail(self, ids, seq, P):
        return self.ops.expand_pools_and_append_tail.default(ids, seq, P, False)

    def expand_pools_to_tokens(self, ids, valid, topk, P):
        return self.ops.expand_pools_to_tokens.default(ids, valid, None, None, topk, P)

    def append_tail_to_topk(self, result, seq, plens, P):
        return self.ops.append_tail_to_topk.default(result, seq, plens, None, None, P)


def launch_floor_us(tool):
    """µs per kernel launch through Halide's CUDA runtime that the driver
    alone costs, from ``kpool overhead --device cuda``; (None, why) when the
    tool is missing or fails."""
    if not tool or not os.path.isfile(tool):
        return None, f"no kpool tool at {tool}"
    try:
        run = subprocess.run([tool, "overhead", "--device", "cuda", "--calls", "2000"], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{tool} overhead: {e}"
    for line in run.stdout.splitlines():
        if line.strip().startswith("per launch through Halide's runtime"):
            return float(line.rsplit(":", 1)[1]), run.stdout
    return None, f"{tool} overhead printed no launch floor (rc {run.returncode}): {run.stderr.strip()[-300:]}"


def median_us(torch, timed, samples, cuda):
    """Median over samples of ``timed()`` (host seconds per call), in µs."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timed()
    sync()
    per_call = []
    for _ in range(samples):
        per_call.append(timed() * 1e6)
        sync()
    return statistics.median(per_call)


def host_us(torch, fn, calls, samples, cuda, clock=time.perf_counter):
    """Median over samples of the host µs per call of ``calls`` back-to-back calls."""
    for _ in range(3):
        fn()

    def timed():
        t0 = clock()
        for _ in range(calls):
            fn()
        return (clock() - t0) / calls

    return median_us(torch, timed, samples, cuda)


def main(argv=None):
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("host_overhead.py: needs torch", file=sys.stderr)
        return 2
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    thread_clock = a.clock == "cpu"
    clock = time.thread_time if thread_clock else time.perf_counter

    import workloads as kt

    import kpool
    from kpool import _calls, _lib

    ref, why_no_ref = None, None
    if cuda:
        try:
            ref = kt.import_reference()
        except ImportError as e:
            why_no_ref = str(e)
        kpool.cuda_warm_up(torch.cuda.current_device())
    else:
        why_no_ref = "the reference runs on CUDA only"
    extension = _calls.torch_calls()
    has_extension = extension is not _calls.ctypes_calls
    gen = kt.Gen(5, device)
    calls = op_calls(kt, gen, torch, 16 if cuda else 1)
    paths = [("ours", kpool), ("torch.ops", Dispatcher(torch)), ("ctypes", kpool)]
    if ref is not None:
        paths.append(("reference", ref))

    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, {kpool.version()}")
    print(f"extension: {_calls.extension_path() if has_extension else 'not built (ours = ctypes)'}")
    if why_no_ref:
        print(f"reference: n/a ({why_no_ref})")
    print(f"host µs per call ({a.clock} clock), median of {a.samples} samples of {a.calls} back-to-back calls")
    names = [p for p, _ in paths]
    print(f"{'op':<52}" + "".join(f"{n:>11}" for n in names) + "   ours <= 10 µs")
    rows = []
    for op, call, _, _, _ in calls:
        row = dict(op=op)
        for path, lib in paths:
            if path == "ctypes":
                _calls._torch_calls = _calls.ctypes_calls
            try:
                row[path] = host_us(torch, lambda lib=lib: call(lib), a.calls, a.samples, cuda, clock)
            finally:
                _calls._torch_calls = extension
        row["within_target"] = row["ours"] <= TARGET_US
        rows.append(row)
        verdict = "yes" if row["within_target"] else "NO"
        print(f"{op:<52}" + "".join(f"{row[n]:>11.2f}" for n in names) + f"   {verdict}")

    floor = None
    if has_extension and not hasattr(extension, "time_calls"):
        print("where ours goes: n/a (this _torch_calls build has no time_calls)")
    elif has_extension:
        floor, floor_text = (None, "CPU tensors: no launches")
        if cuda:
            floor, floor_text = launch_floor_us(a.tool or os.path.join(os.path.dirname(_lib.library_path()), "tools",
                                                                      "kpool"))
        if floor:
            print(f"launch floor: {floor:.2f} µs per launch through Halide's runtime")
        else:
            print(f"launch floor: n/a ({floor_text})")
        parts = ["python", "outputs", "read", "C API", "launches"]
        print(f"where ours goes, µs per call (ours = {' + '.join(parts)})")
        print(f"  {'op':<50}{'ours':>9}" + "".join(f"{n:>10}" for n in parts))
        for row, (_, _, function, args, new_args) in zip(rows, calls):
            fn = getattr(extension, function)
            extension_us = host_us(torch, lambda: fn(*args), a.calls, a.samples, cuda, clock)
            allocating_us = extension_us
            if new_args is not None:
                new = getattr(extension, function + "_new")
                allocating_us = host_us(torch, lambda: new(*new_args), a.calls, a.samples, cuda, clock)
            entry_us = median_us(torch, lambda: extension.time_calls(function, a.calls, thread_clock, *args),
                                 a.samples, cuda)
            launches_us = LAUNCHES * floor if floor else 0.0
            row.update(extension_allocating=allocating_us, extension=extension_us, entry_point=entry_us,
                       launches=LAUNCHES if cuda else 0,
                       launch_floor=launches_us if floor else None)
            split = (row["ours"] - allocating_us, allocating_us - extension_us, extension_us - entry_us,
                     entry_us - launches_us, launches_us)
            print(f"  {row['op']:<50}{row['ours']:>9.2f}" + "".join(f"{v:>10.2f}" for v in split))
        if cuda and floor:
            print(floor_text.rstrip())
    out = a.out or (os.path.join(os.environ["OUT"], "kpool_host_overhead.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(dict(device=device, torch=torch.__version__, kpool=kpool.version(), extension=has_extension,
                           calls=a.calls, samples=a.samples, clock=a.clock, target_us=TARGET_US, launch_floor_us=floor, rows=rows), f, indent=1)
        print(f"wrote {out}")
    return 0 if all(r["within_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
