#!/usr/bin/env python3
"""kpool vs the Triton reference on one GPU, every op over the reference's sweep.

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so python3 bench/bench_gpu.py [--quick]
        [--only copy,fwht,compress,seed,decode,expand,steps,engine] [--no-graph] [--out FILE]
        [--arithmetic exact|triton] [--twins BUNDLE]

Both libraries run in one process on the same tensors (the cases, sizes and
byte counts of shared/anchors/bench_triton.py). Per case it prints:
  ours / ref     median µs of triton.testing.do_bench (L2 flushed before each
                 run, warm-up 25 ms, at least 100 timed runs)
  graph          median µs per call of do_bench_cudagraph (CUDA-graph replay,
                 warm L2)
  GB/s, % copy   bytes moved (unique bytes read + written, bench_triton's
                 formulas) over our median, against a 2 GiB device-to-device
                 copy timed in the same run
  speed-up       reference median / our median
  host           direct median minus graph median: the per-call cost of
                 launching from Python (wrapper, validation, launch)
  enqueue        host wall time per call of 200 back-to-back calls (the CPU
                 side alone; the GPU runs behind)
  exact          our outputs and caches vs the reference's, compared once on
                 copies of the same inputs ("exact", or what differs)
  twin           with --twins BUNDLE (a tuning bundle, kpool_tune.py plan,
                 and KPOOL_LIBRARY its libkpool.so): the median µs of the
                 op's autoscheduled twin (the floor our schedules must beat;
                 docs/tuning.md), its autoscheduler, and its bytes against
                 ours ("exact", or what differs)
Engine steps (group "steps"): what an engine runs per step, its ops
captured back to back in one CUDA graph, ours and the reference's each, in
the same run: a decode step (fwht of requests x next_n x 64 heads query rows,
the decode update, expand_pools_and_append_tail with topk 2048 for each query
token) and a prefill step (fwht of tokens x 64 heads, compress of every whole
pool, seed). Per step: graph-replay µs of the whole step, speed-up, the step's
bytes at copy bandwidth (roofline), and each op's share of the step (the op's
own graph replay over the sum of the step's ops).
JSON goes to --out, else $OUT/kpool_bench.json when OUT is set;
bench/bench_chart.py draws it.

The reference module is found like the side-by-side test finds it
($KPOOL_REFERENCE_DIR, else ../shared/reference next to the repo). When
libkpool.so has no CUDA path, our columns read n/a and only the reference is
timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

GROUPS = ("copy", "fwht", "compress", "seed", "decode", "expand", "steps", "engine")
HEADS = 64  # query heads per token: the fwht rows of an engine step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the two smallest sizes of each sweep axis")
    p.add_argument("--only", help="comma list of: " + ",".join(GROUPS))
    p.add_argument("--no-graph", action="store_true", help="skip CUDA-graph replay timing")
    p.add_argument("--out", help="JSON results path (default $OUT/kpool_bench.json when OUT is set)")
    p.add_argument("--arithmetic", choices=("default", "exact", "triton"), default="default",
                   help="kpool's softmax-pool arithmetic (kpool.set_arithmetic; default: triton's on CUDA)")
    p.add_argument("--min-runs", type=int, default=100, help="timed runs per median, at least (default 100)")
    p.add_argument("--host-calls", type=int, default=200, help="back-to-back calls for the enqueue time")
    p.add_argument("--twins", metavar="BUNDLE",
                   help="time each op's autoscheduled twin from this tuning bundle (KPOOL_LIBRARY its libkpool.so)")
    p.add_argument("--ours-on-host", action="store_true",
                   help="check this script: run ours on host copies of the inputs, exactness only (not timed)")
    a = p.parse_args(argv)
    if a.only:
        bad = set(a.only.split(",")) - set(GROUPS)
        if bad:
            p.error(f"--only: unknown {sorted(bad)}; choose from {','.join(GROUPS)}")
    return a


# --- cases: (op, params, bytes, run(lib, state) -> outputs, state) --------------------------------------
class Case:
    """One benchmark case. ``state`` are (base, view) pairs of tensors the op
    updates in place (caches); ``run(lib, views)`` calls the op and returns
    its outputs (a tensor, a tuple, or None)."""

    def __init__(self, op, params, nbytes, run, state=()):
        self.op, self.params, self.nbytes, self.run, self.state = op, params, nbytes, run, list(state)

    def views(self):
        return [v for _, v in self.state]

    def fresh_state(self):
        out = []
        for base, view in self.state:
            b = base.clone()
            out.append((b, b.as_strided(view.shape, view.stride(), view.storage_offset())))
        return out


# The op calls, on a workload's inputs and the caches given (the case's own
# copies, or the inputs' caches themselves).
def call_compress(lib, x, P, kv_cache):
    return lib.kpool_compress_and_write_cache(kv_cache, x["slot_k"], x["slot_score"], x["ape"], x["loc"], P,
                                              write_mask=x["write_mask"])


def call_seed(lib, x, P, tail):
    return lib.kpool_seed_tail_cache(tail, x["key"], x["gate_score"], x["tslot"], P)


def call_decode(lib, x, P, kv_cache, tail):
    return lib.kpool_decode_update_and_maybe_write_cache_batched(
        kv_cache, tail, x["tail_slot_mapping"], x["key"], x["slot_score"], x["ape"], x["slot_mapping"],
        x["positions"], P)


def call_expand(lib, x, P):
    return lib.expand_pools_and_append_tail(x["pool_ids"], x["seq_lens"], P)


def cases_fwht(kt, gen, quick):
    for rows in kt.sweep(kt.FWHT_ROWS, quick):
        q = kt.fwht_inputs(gen, rows)["q"]
        yield Case("fwht128_quant_fp8", dict(rows=rows), kt.fwht_bytes(rows),
                   lambda lib, st, q=q: lib.fwht128_quant_fp8(q))


def cases_compress(kt, gen, quick):
    for n in kt.sweep(kt.COMPRESS_POOLS, quick):
        for P in kt.POOLS:
            for mask in ([None, kt.MASK_KEEP] if n == kt.MASKED_POOLS else [None]):
                x = kt.compress_inputs(gen, n, P, mask=mask)
                kv = x["kv_cache"]

                def run(lib, st, x=x, P=P):
                    return call_compress(lib, x, P, st[0])

                prm = dict(n_pools=n, pool=P, num_blocks=kv.shape[0], mask=mask)
                yield Case("kpool_compress_and_write_cache", prm, kt.compress_bytes(n, P, x["write_mask"]), run,
                           [(kv, kv)])


def cases_seed(kt, gen, quick):
    for n in kt.sweep(kt.SEED_TOKENS, quick):
        for P in kt.POOLS:
            x = kt.seed_inputs(gen, n, P)

            def run(lib, st, x=x, P=P):
                return call_seed(lib, x, P, st[0])

            prm = dict(tokens=n, requests=x["requests"], pool=P, ring=x["ring"], seeded=x["seeded"])
            yield Case("kpool_seed_tail_cache", prm, kt.seed_bytes(n, x["seeded"]), run,
                       [(x["tail_base"], x["tail_kv_cache"])])


def cases_decode(kt, gen, quick):
    for R in kt.sweep(kt.DEC_REQS, quick):
        for nn in kt.DEC_NEXT:
            for P in kt.POOLS:
                x = kt.decode_inputs(gen, R, nn, P)

                def run(lib, st, x=x, P=P):
                    return call_decode(lib, x, P, st[0], st[1])

                prm = dict(requests=R, next_n=nn, pool=P, ring=x["ring"], completions=x["completions"])
                yield Case("kpool_decode_update_..._batched", prm, kt.decode_bytes(*x["meta"], P), run,
                           [(x["kv_cache"], x["kv_cache"]), (x["tail_base"], x["tail_kv_cache"])])


def cases_expand(kt, gen, quick):
    for rows in kt.EXP_ROWS:
        for P in kt.POOLS:
            x = kt.expand_inputs(gen, rows, P, table_width=1)
            prm = dict(rows=rows, topk=kt.TOPK, pool=P)

            def fused(lib, st, x=x, P=P):
                return call_expand(lib, x, P)

            def twins(lib, st, x=x, P=P):
                e = lib.expand_pools_to_tokens(x["pool_ids"], x["group_valid"], kt.TOPK, P)
                return lib.append_tail_to_topk(e, x["seq_lens"], x["pool_lens"], P)

            yield Case("expand_pools_and_append_tail", prm, kt.expand_bytes(rows, P), fused)
            yield Case("expand_pools_to_tokens+append_tail_to_topk", prm, kt.expand_bytes(rows, P, twins=True),
                       twins)


STEP_DECODE = (32, 128, 512), (1, 2)  # requests, next_n
STEP_PREFILL = (2048, 16384)  # tokens


def engine_steps(kt, gen, quick):
    """(name, params, [(op, bytes, run(lib))]): each engine step's ops in order."""
    for R in STEP_DECODE[0][:2] if quick else STEP_DECODE[0]:
        for nn in STEP_DECODE[1]:
            for P in kt.POOLS:
                rows = R * nn
                q = kt.fwht_inputs(gen, rows * HEADS)["q"]
                d = kt.decode_inputs(gen, R, nn, P)
                e = kt.expand_inputs(gen, rows, P)
                ops = [("fwht", kt.fwht_bytes(rows * HEADS), lambda lib, q=q: lib.fwht128_quant_fp8(q)),
                       ("decode", kt.decode_bytes(*d["meta"], P),
                        lambda lib, d=d, P=P: call_decode(lib, d, P, d["kv_cache"], d["tail_kv_cache"])),
                       ("expand", kt.expand_bytes(rows, P), lambda lib, e=e, P=P: call_expand(lib, e, P))]
                yield "decode step", dict(requests=R, next_n=nn, pool=P), ops
    for n in STEP_PREFILL[:1] if quick else STEP_PREFILL:
        for P in kt.POOLS:
            q = kt.fwht_inputs(gen, n * HEADS)["q"]
            c = kt.compress_inputs(gen, n // P, P)
            s = kt.seed_inputs(gen, n, P)
            ops = [("fwht", kt.fwht_bytes(n * HEADS), lambda lib, q=q: lib.fwht128_quant_fp8(q)),
                   ("compress", kt.compress_bytes(n // P, P),
                    lambda lib, c=c, P=P: call_compress(lib, c, P, c["kv_cache"])),
                   ("seed", kt.seed_bytes(n, s["seeded"]),
                    lambda lib, s=s, P=P: call_seed(lib, s, P, s["tail_kv_cache"]))]
            yield "prefill step", dict(tokens=n, pool=P), ops


def run_steps(kt, torch, tt, gen, ours, ref, ours_ok, roof, quick):
    """Times every engine step in graph replay, ours and the reference's; rows for the JSON."""
    print("engine steps (one CUDA graph per step, replay µs; roofline = the step's bytes at copy bandwidth)")
    print(f"{'step':<13} {'params':<30} {'ours':>8} {'ref':>8} {'roof':>8} {'speedup':>7}  "
          f"share of the step, ours | ref")
    rows = []
    for name, params, ops in engine_steps(kt, gen, quick):
        row = dict(step=name, params=params, bytes=sum(b for _, b, _ in ops), ops=[o for o, _, _ in ops])
        row["roofline_us"] = row["bytes"] / roof / 1e3 if roof else None
        for who, lib in (("ref", ref), ("ours", ours)):
            if who == "ours" and not ours_ok:
                continue
            step_us, err = time_graph(torch, tt, lambda lib=lib: [run(lib) for _, _, run in ops])
            row[f"{who}_us"] = step_us
            if err:
                row[f"{who}_error"] = err
                continue
            alone = [time_graph(torch, tt, lambda lib=lib, run=run: run(lib))[0] for _, _, run in ops]
            row[f"{who}_op_us"] = alone
        o, r = row.get("ours_us"), row.get("ref_us")
        row["speedup"] = r / o if (o and r) else None
        rows.append(row)

        def shares(who):
            alone = row.get(f"{who}_op_us")
            if not alone or None in alone:
                return row.get(f"{who}_error", "n/a")
            return " ".join(f"{op} {100 * t / sum(alone):.0f}%" for op, t in zip(row["ops"], alone))

        ps = " ".join(f"{k}={v}" for k, v in params.items())
        print(f"{name:<13} {ps:<30} {num(o, 8, 2)} {num(r, 8, 2)} {num(row['roofline_us'], 8, 2)} "
              f"{num(row['speedup'], 7, 2)}  {shares('ours')} | {shares('ref')}")
        sys.stdout.flush()
    torch.cuda.empty_cache()
    return rows


# --- timing ------------------------------------------------------------------------------------------------
def time_direct(torch, tt, fn, min_runs):
    """Median / p20 / p80 µs of do_bench (L2 flushed), with >= min_runs timed runs."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    per_run_ms = start.elapsed_time(end) / 5  # what do_bench estimates too (flush included)
    del flush
    rep = max(100.0, 1.25 * min_runs * per_run_ms)
    try:
        q = tt.do_bench(fn, warmup=25, rep=rep, quantiles=[0.5, 0.2, 0.8])
    except TypeError:  # no quantiles in this triton: median only
        q = [tt.do_bench(fn, warmup=25, rep=rep, return_mode="median")] * 3
    return [x * 1e3 for x in q]


def time_graph(torch, tt, fn):
    try:
        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.Stream()):  # capture needs a side stream
            try:
                g = tt.do_bench_cudagraph(fn, rep=20, return_mode="median")
            except TypeError:  # older signature: mean only
                g = tt.do_bench_cudagraph(fn, rep=20)
        torch.cuda.synchronize()
        return g * 1e3, None
    except Exception as e:  # capture not possible: report, keep going
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {e}"


def time_enqueue(torch, fn, calls):
    """Host µs per call of back-to-back calls (the GPU catches up afterwards)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def compare(kt, torch, case, ours, ref):
    """Run both once on copies of the state; what differs ('exact' or a list)."""
    st_o, st_r = case.fresh_state(), case.fresh_state()
    out_o = case.run(ours, [v for _, v in st_o])
    out_r = case.run(ref, [v for _, v in st_r])
    torch.cuda.synchronize()
    as_list = lambda o: [] if o is None else (list(o) if isinstance(o, tuple) else [o])  # noqa: E731
    diffs = []
    lo, lr = as_list(out_o), as_list(out_r)
    if len(lo) != len(lr):
        return [f"outputs: {len(lo)} vs {len(lr)}"]
    for i, (a, b) in enumerate(zip(lo, lr)):
        if a.shape != b.shape or a.dtype != b.dtype:
            diffs.append(f"out{i}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
            continue
        n = kt.differing_bytes(a, b)
        if n:
            extra = f" (max e4m3 code distance {kt.e4m3_code_distance(a, b)})" if a.dtype == torch.float8_e4m3fn else ""
            diffs.append(f"out{i}: {n} bytes{extra}")
    for i, ((bo, vo), (br, vr)) in enumerate(zip(st_o, st_r)):
        if bo.dtype == torch.uint8 and bo.dim() == 3:  # the kv cache: classify by slot
            c = kt.compare_caches(bo, br)
            if c["other"]:
                diffs.append(f"kv_cache: {c['bytes']} bytes in {len(c['other'])} slots (<= {c['max_bytes_per_slot']}"
                             f"/slot, e4m3 code distance <= {c['code_distance']})")
            if c["boundary"]:
                diffs.append(f"kv_cache: {len(c['boundary'])} ue8m0 boundary slots (scale 2x)")
        else:
            n = kt.differing_bytes(bo, br)
            if n:
                diffs.append(f"state{i}: {n} bytes")
    return diffs or "exact"


class _NotTimed(Exception):
    pass


# The tuner's op of each case's op (tools/tune: a unit is the op, or
# op.exact for the exact arithmetic where the family has such knobs).
TWIN_OPS = {"fwht128_quant_fp8": "fwht", "kpool_compress_and_write_cache": "compress",
            "kpool_seed_tail_cache": "seed", "kpool_decode_update_..._batched": "decode",
            "expand_pools_and_append_tail": "expand", "expand_pools_to_tokens+append_tail_to_topk": "expand"}


class Twins:
    """The autoscheduled twins of a tuning bundle (its candidates.json),
    served in place of our kernels while `selected`; the process's library
    must be the bundle's (its hand variants are ours)."""

    def __init__(self, bundle, arithmetic, library):
        import ctypes

        with open(os.path.join(bundle, "candidates.json")) as f:
            plan = json.load(f)
        if os.path.realpath(library) != os.path.realpath(os.path.join(bundle, "libkpool.so")):
            raise SystemExit(f"--twins {bundle}: KPOOL_LIBRARY must be the bundle's libkpool.so (is {library})")
        self.select = ctypes.CDLL(library).kpool_tune_select
        self.select.argtypes, self.select.restype = [ctypes.c_int], ctypes.c_int
        self.by_unit = {c["unit"]: c for c in plan["candidates"] if c.get("autoscheduler")}
        self.exact = arithmetic == "exact"

    def of(self, case_op):
        """The twin of a case's op in this arithmetic (the softmax-pool ops
        have a unit per arithmetic), or None."""
        op = TWIN_OPS.get(case_op)
        return self.by_unit.get(op + ".exact" if self.exact and op in ("compress", "decode") else op)

    @contextlib.contextmanager
    def selected(self, c):
        """Twin c's kernels serve their keys (kpool_tune_select) inside the block."""
        if self.select(c["id"]) == 0:
            raise RuntimeError(f"the bundle holds no kernel of twin {c['id']}")
        try:
            yield
        finally:
            self.select(-1)


def time_twin(kt, torch, tt, case, ours, twins, twin, min_runs):
    """The twin's median µs on the case, its bytes against ours."""
    with twins.selected(twin):
        st_t = case.fresh_state()
        out_t = case.run(ours, [v for _, v in st_t])
        torch.cuda.synchronize()
        views = case.views()
        us = time_direct(torch, tt, lambda: case.run(ours, views), min_runs)[0]
    st_o = case.fresh_state()
    out_o = case.run(ours, [v for _, v in st_o])
    torch.cuda.synchronize()
    as_list = lambda o: [] if o is None else (list(o) if isinstance(o, tuple) else [o])  # noqa: E731
    differ = sum(kt.differing_bytes(a, b) for a, b in zip(as_list(out_t), as_list(out_o)))
    differ += sum(kt.differing_bytes(a, b) for (a, _), (b, _) in zip(st_t, st_o))
    return us, "exact" if differ == 0 else f"{differ} bytes differ from ours"


def fmt_us(x):
    return num(x, 9, 2)


def num(x, width, prec):
    return f"{x:{width}.{prec}f}" if x is not None else "n/a".rjust(width)


def main(argv=None):
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_gpu.py: needs torch (with CUDA) and triton", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_gpu.py: torch sees no CUDA device", file=sys.stderr)
        return 2
    import triton
    import triton.testing as tt

    import kpool
    import workloads as kt

    ref = kt.import_reference()
    try:
        version = kpool.version()
        ours_ok = "cuda" in version
        why = None if ours_ok else f"{kpool.library_path()} has no CUDA path ({version!r})"
    except OSError as e:
        version, ours_ok, why = None, False, str(e)
    ours = kpool
    kpool.set_arithmetic(a.arithmetic)
    print(f"kpool arithmetic: {a.arithmetic} (exp: "
          + ("ex2.approx.f32 of x*log2(e), div.full.f32, as the reference" if a.arithmetic != "exact"
             else "correctly rounded, IEEE division") + ")")
    if a.ours_on_host and version:
        ours, ours_ok, why = kt.OnHost(kpool), True, None
        print("kpool: on host copies (--ours-on-host): exactness only, ours not timed")
    if why:
        print(f"kpool: n/a ({why}); timing the reference only")
    twins = Twins(a.twins, a.arithmetic, kpool.library_path()) if a.twins and ours_ok else None
    only = set(a.only.split(",")) if a.only else None
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               kpool=version, kpool_library=kpool.library_path() if version else None, quick=a.quick,
               arithmetic=a.arithmetic,
               ours_on_host=a.ours_on_host,
               timing=f"median of triton.testing.do_bench (warmup 25 ms, >= {a.min_runs} runs, L2 flushed); "
                      "graph = do_bench_cudagraph median (warm L2); host = direct - graph; "
                      f"enqueue = host wall time per call over {a.host_calls} back-to-back calls",
               bytes="unique bytes read + unique bytes written (bench_triton.py formulas)", cases=[])
    roof = None
    if only is None or "copy" in only:
        n = 2 << 30
        src = torch.ones(n, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        med = time_direct(torch, tt, lambda: dst.copy_(src), 10)[0]
        roof = 2 * n / med / 1e3
        res["copy"] = dict(bytes=2 * n, median_us=med, GBps=roof)
        print(f"roofline: torch copy 2 GiB d2d: {med:.1f} us, {roof:.1f} GB/s")
        del src, dst
        torch.cuda.empty_cache()
    if not a.ours_on_host and (only is None or "steps" in only):
        res["steps"] = run_steps(kt, torch, tt, kt.Gen(4321, "cuda"), ours, ref, ours_ok, roof, a.quick)
    if not a.ours_on_host and ours_ok and (only is None or "engine" in only):
        import engine_sequences

        res["engine"] = engine_sequences.run(torch, tt, kt.Gen(99, "cuda"), ours, ref, roof, a.quick, time_graph)
    print(f"\n{'op':<44} {'params':<58} {'ours':>9} {'ref':>9} {'g.ours':>9} {'g.ref':>9} {'bytes':>11} "
          f"{'GB/s':>7} {'%copy':>6} {'speedup':>7} {'host.o':>7} {'host.r':>7} {'enq.o':>6} {'enq.r':>6}  exact")
    gen = kt.Gen(1234, "cuda")
    groups = dict(fwht=cases_fwht, compress=cases_compress, seed=cases_seed, decode=cases_decode,
                  expand=cases_expand)
    for name, make in groups.items():
        if only is not None and name not in only:
            continue
        for case in make(kt, gen, a.quick):
            row = dict(op=case.op, params=case.params, bytes=case.nbytes)
            views = case.views()
            fn_r = lambda: case.run(ref, views)  # noqa: E731
            fn_o = lambda: case.run(ours, views)  # noqa: E731
            r_med, r20, r80 = time_direct(torch, tt, fn_r, a.min_runs)
            row.update(ref_us=r_med, ref_p20_us=r20, ref_p80_us=r80)
            row["ref_enqueue_us"] = time_enqueue(torch, fn_r, a.host_calls)
            if not a.no_graph:
                row["ref_graph_us"], err = time_graph(torch, tt, fn_r)
                if err:
                    row["ref_graph_error"] = err
            if ours_ok:
                try:
                    row["exact"] = compare(kt, torch, case, ours, ref)
                    if a.ours_on_host:  # host copies: exactness only, no times
                        raise _NotTimed
                    o_med, o20, o80 = time_direct(torch, tt, fn_o, a.min_runs)
                    row.update(ours_us=o_med, ours_p20_us=o20, ours_p80_us=o80)
                    row["ours_enqueue_us"] = time_enqueue(torch, fn_o, a.host_calls)
                    if not a.no_graph:
                        row["ours_graph_us"], err = time_graph(torch, tt, fn_o)
                        if err:
                            row["ours_graph_error"] = err
                except _NotTimed:
                    pass
                except Exception as e:  # one failing case must not end the run
                    torch.cuda.synchronize()
                    row["ours_error"] = f"{type(e).__name__}: {e}"
            twin = twins.of(case.op) if twins and not a.ours_on_host else None
            if twin:
                row["twin"] = twin["autoscheduler"]
                try:
                    row["twin_us"], row["twin_exact"] = time_twin(kt, torch, tt, case, ours, twins, twin, a.min_runs)
                except Exception as e:  # a twin that faults or breaks: recorded, the run goes on
                    torch.cuda.synchronize()
                    row["twin_error"] = f"{type(e).__name__}: {e}"
            o, r = row.get("ours_us"), row["ref_us"]
            go, gr = row.get("ours_graph_us"), row.get("ref_graph_us")
            row["GBps"] = case.nbytes / o / 1e3 if o else None
            row["ref_GBps"] = case.nbytes / r / 1e3
            row["pct_of_copy"] = 100 * row["GBps"] / roof if (roof and o) else None
            row["speedup"] = r / o if o else None
            row["ours_host_us"] = o - go if (o and go) else None
            row["ref_host_us"] = r - gr if gr else None
            res["cases"].append(row)
            ps = " ".join(f"{k}={v}" for k, v in case.params.items())
            ex = row.get("ours_error") or row.get("exact", "n/a")
            ex = ex if isinstance(ex, str) else "; ".join(ex)
            print(f"{case.op:<44} {ps:<58} {fmt_us(o)} {fmt_us(r)} {fmt_us(go)} {fmt_us(gr)} {case.nbytes:>11} "
                  f"{num(row['GBps'] or row['ref_GBps'], 7, 1)} {num(row['pct_of_copy'], 6, 1)} "
                  f"{num(row['speedup'], 7, 2)} {num(row['ours_host_us'], 7, 2)} {num(row['ref_host_us'], 7, 2)} "
                  f"{num(row.get('ours_enqueue_us'), 6, 1)} {num(row['ref_enqueue_us'], 6, 1)}  {ex}"
                  + (f"  twin {num(row.get('twin_us'), 9, 2)} {row['twin']} "
                     f"{row.get('twin_error') or row.get('twin_exact')}" if twin else ""))
            sys.stdout.flush()
            del case, views, fn_r, fn_o
        torch.cuda.empty_cache()
    out = a.out or (os.path.join(os.environ["OUT"], "kpool_bench.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
