"""The tuner's workloads: each unit's cases (engine-shaped inputs), the
device that runs them (candidates and hand variants through the bundle's
library), and the Triton reference's times on the same cases."""

from __future__ import annotations

import os
import statistics
import sys
import time

from tune_common import REPO


# The benchmark's sweep sizes and layout (bench/workloads.py; torch only inside its functions).
sys.path.insert(0, os.path.join(REPO, "bench"))
import workloads as wl  # noqa: E402

D, PAGE, ROW = wl.D, wl.PAGE, wl.ROW


def bf16(rng, shape, scale=1.0):
    import numpy as np
    f = (rng.standard_normal(shape) * scale).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def cases(unit, device, quick):
    """(name, make(rng) -> dict of numpy inputs, call(kpool, x) -> outputs, state keys) per case:
    the reference's sweep sizes on CUDA (the benchmark's two largest of each, next_n 1 and 4),
    smaller ones on the CPU."""
    import numpy as np
    op = unit.split(".")[0]
    gpu = device == "cuda"
    pools = wl.POOLS
    out = []
    if op == "fwht":
        for rows in (wl.FWHT_ROWS[1:] if gpu else (4096, 32768)):
            out.append((f"rows={rows}", lambda rng, rows=rows: dict(q=bf16(rng, (rows, D))),
                        lambda k, x: k.fwht128_quant_fp8(x["q"]), ()))
    elif op == "compress":
        for n in (wl.COMPRESS_POOLS[1:] if gpu else (1024, 8192)):
            for P in pools:
                def make(rng, n=n, P=P):
                    nb = -(-n // PAGE) + 1
                    return dict(kv=rng.integers(0, 256, (nb, PAGE, ROW), dtype=np.uint8), sk=bf16(rng, (n, P, D)),
                                ss=bf16(rng, (n, P, D)), ape=(rng.standard_normal((P, D)) * 0.5).astype(np.float32),
                                loc=rng.permutation(nb * PAGE)[:n].astype(np.int64))
                out.append((f"pools={n} P={P}", make,
                            lambda k, x, P=P: k.kpool_compress_and_write_cache(x["kv"], x["sk"], x["ss"], x["ape"],
                                                                               x["loc"], P), ("kv",)))
    elif op == "seed":
        for n in (wl.SEED_TOKENS[1:] if gpu else (4096, 32768)):
            for P in pools:
                def make(rng, n=n, P=P, length=512):
                    requests = n // length
                    blocks = rng.permutation(2 * requests)[:requests]
                    pos = np.arange(n) % length
                    ts = (blocks[np.arange(n) // length] * P + pos % P).astype(np.int32)
                    return dict(tail=bf16(rng, (2 * requests, 2, P, D)), key=bf16(rng, (n, D)),
                                gate=bf16(rng, (n, D)), ts=ts)
                out.append((f"tokens={n} P={P}", make,
                            lambda k, x, P=P: k.kpool_seed_tail_cache(x["tail"], x["key"], x["gate"], x["ts"], P),
                            ("tail",)))
    elif op == "decode":
        for R in (wl.DEC_REQS[1:] if gpu else (64,)):
            for nn in (wl.DEC_NEXT[0], wl.DEC_NEXT[-1]):
                for P in pools:
                    def make(rng, R=R, nn=nn, P=P):
                        nb = max(64, -(-4 * R * nn // PAGE))
                        blocks = rng.permutation(2 * R + 8)[:R].tolist()
                        ctx = rng.integers(4 * P, 8192, R).tolist()
                        free = iter(rng.permutation(nb * PAGE).tolist())
                        pos, ts, sm = (np.array(m, np.int32) for m in wl.decode_meta(ctx, nn, P, P, blocks, free))
                        return dict(kv=np.zeros((nb, PAGE, ROW), np.uint8), tail=bf16(rng, (2 * R + 8, 2, P, D)),
                                    ts=ts, key=bf16(rng, (R, nn, D)), score=bf16(rng, (R, nn, D)),
                                    ape=(rng.standard_normal((P, D)) * 0.5).astype(np.float32), sm=sm, pos=pos)
                    out.append((f"requests={R} next_n={nn} P={P}", make,
                                lambda k, x, P=P: k.kpool_decode_update_and_maybe_write_cache_batched(
                                    x["kv"], x["tail"], x["ts"], x["key"], x["score"], x["ape"], x["sm"], x["pos"], P),
                                ("kv", "tail")))
    elif op == "expand":
        for rows in (wl.EXP_ROWS[1:] if gpu else (64,)):
            for P in pools:
                def make(rng, rows=rows, P=P, topk=wl.TOPK):
                    seq = rng.integers(topk, 131072, rows).astype(np.int32)
                    ids = (rng.random((rows, topk // P)) * (seq[:, None] // P)).astype(np.int32)
                    return dict(ids=ids, seq=seq)
                out.append((f"rows={rows} P={P}", make,
                            lambda k, x, P=P: k.expand_pools_and_append_tail(x["ids"], x["seq"], P), ()))
    return out[:2] if quick else out


class Device:
    """Moves numpy inputs to the device, reads results back as bytes, times calls."""

    def __init__(self, kind):
        self.kind = kind
        if kind == "cuda":
            import torch
            self.torch = torch

    def name(self):
        """The machine the times are of, for the results and the docs' table."""
        if self.kind == "cuda":
            return self.torch.cuda.get_device_name()
        import platform
        return f"CPU ({platform.machine()}, {os.cpu_count()} threads)"

    def put(self, x):
        import numpy as np
        if self.kind == "cpu":
            return {k: v.copy() for k, v in x.items()}
        t = self.torch
        out = {}
        for k, v in x.items():
            if v.dtype == np.uint16:
                out[k] = t.from_numpy(v.view(np.int16)).view(t.bfloat16).cuda()
            else:
                out[k] = t.from_numpy(v).cuda()
        return out

    def host_bytes(self, v):
        import numpy as np
        if v is None:
            return []
        if isinstance(v, (tuple, list)):
            return [b for e in v for b in self.host_bytes(e)]
        if self.kind == "cuda" and hasattr(v, "cpu"):
            v = v.contiguous().view(self.torch.uint8).cpu().numpy()
        return [np.ascontiguousarray(v).view(np.uint8).tobytes()]

    def result(self, kpool, call, x, state):
        xs = self.put(x)
        out = call(kpool, xs)
        if self.kind == "cuda":
            self.torch.cuda.synchronize()
        return self.host_bytes(out) + [b for k in state for b in self.host_bytes(xs[k])]

    def time_us(self, kpool, call, x):
        xs = self.put(x)
        if self.kind == "cpu":
            call(kpool, xs)
            batches = []
            for _ in range(5):
                n, t0 = 0, time.perf_counter()
                while n == 0 or time.perf_counter() - t0 < 0.05:
                    call(kpool, xs)
                    n += 1
                batches.append((time.perf_counter() - t0) / n * 1e6)
            return statistics.median(batches)
        t = self.torch
        stream = t.cuda.Stream()
        stream.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(stream):
            for _ in range(3):
                call(kpool, xs)
        t.cuda.current_stream().wait_stream(stream)
        # 20 calls a replay, fewer for a slow candidate (one of 500 ms
        # would otherwise take minutes).
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        start.record()
        call(kpool, xs)
        end.record()
        end.synchronize()
        calls = max(1, min(20, int(20e3 / max(start.elapsed_time(end) * 1e3, 1.0))))
        graph = t.cuda.CUDAGraph()
        try:
            with t.cuda.graph(graph):
                for _ in range(calls):
                    call(kpool, xs)
        except Exception as e:
            # What breaks capture in a Halide kernel: device memory allocated
            # per call (a compute_root intermediate: halide_device_malloc,
            # cuMemAlloc, is illegal while a stream is captured).
            raise RuntimeError(f"breaks CUDA-graph capture (allocates device memory per call?): "
                               f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
        graph.replay()
        times = []
        for _ in range(5):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
        return statistics.median(times)


def reference_module(kind):
    """The Triton reference (bench/workloads.py finds it: $KPOOL_REFERENCE_DIR)
    on CUDA, timed beside the candidates; None on the CPU or where it does not
    import (said once)."""
    if kind != "cuda":
        return None
    try:
        return wl.import_reference()
    except ImportError as e:
        print(f"no reference column: {e}", flush=True)
        return None


def time_reference(device, reference, unit_cases):
    """The reference's time per case (its functions take the drop-in's
    arguments), or the reason it has none. Its bytes are not compared: the
    side-by-side test does that, with the defects kpool fixes excused."""
    try:
        return dict(times={name: device.time_us(reference, call, x) for name, x, call, _ in unit_cases})
    except Exception as e:  # noqa: BLE001 - the candidates are still timed
        device.torch.cuda.synchronize()
        return dict(times={}, error=f"{type(e).__name__}: {e}")
