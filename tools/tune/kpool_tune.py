#!/usr/bin/env python3
"""Schedule autotuning for one kpool family (cpu, sm80, sm90), across the
two machines kpool is built and measured on.

  plan   (build machine: Halide, no GPU) reads schedules/<family>.knobs,
         enumerates each tuning unit's legal knob values (pruned by the
         file's `require` lines, sampled down to --max per unit; with
         --every-value also each legal value of each knob once), adds a
         Halide-autoscheduled candidate per unit, and builds them all into
         one tuning library next to the hand-scheduled variants (a build of
         this project with KPOOL_TUNE_CANDIDATES): BUNDLE/libkpool.so and
         BUNDLE/candidates.json. Candidates that fail to build are listed
         there with the compiler's reason.
  run    (the family's machine: the GPU machine for a GPU family; no Halide)
         checks every candidate byte for byte against the hand variants on
         the same inputs (and, in the exact arithmetic, against the CPU
         kernels), times the valid ones (CUDA: graph replay; CPU: wall
         clock), one progress line each, within --budget seconds, and on
         CUDA the Triton reference on the same cases; the
         results file is rewritten after every candidate, so a run cut off
         keeps what it measured.
  apply  writes each unit's winner (the valid candidate with the lowest
         geometric-mean time over the unit's cases, if it beats the hand
         values by more than --min-gain) into schedules/<family>.knobs and prints the table
         (reference, hand, tuned, autoscheduled per case).

A tuning unit is the knobs of one op (the name's prefix: fwht, compress,
decode, seed, expand); knobs named *exact* form a unit of their own, timed in
the exact arithmetic, the others in the reference's (the CUDA default). The
CPU family has the exact arithmetic only. numpy is all `plan` and `apply`
need; `run` needs torch on CUDA.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OPS = ("fwht", "compress", "decode", "seed", "expand")
# Halide's autoscheduler per device: Anderson2021 is the GPU one the wheel
# ships; Mullapudi2016 schedules the CPU from the generators' estimates.
AUTOSCHEDULERS = {"cpu": "Mullapudi2016", "cuda": "Anderson2021"}


# --- the knobs file: schedules/knobs.py, the one reader (the build runs it too) -------------------
sys.path.insert(0, os.path.join(REPO, "schedules"))
import knobs as knobs_file  # noqa: E402


def unit_of(knob):
    op = knob.split(".")[0]
    if op not in OPS:
        return None  # not a kernel's knob of an op: no unit times it
    return f"{op}.exact" if "exact" in knob else op


def units(knobs):
    """{unit: [knob names]} of the knobs (a knobs_file.Knobs) with more than one legal value."""
    out = {}
    for name in knobs.values:
        u = unit_of(name)
        if u and len(knobs.legal[name]) > 1:
            out.setdefault(u, []).append(name)
    return out


def device_of(family):
    return "cpu" if family == "cpu" else "cuda"


def arithmetic_of(family, unit):
    return "exact" if family == "cpu" or unit.endswith(".exact") else "triton"


# --- plan -----------------------------------------------------------------------------------------
def enumerate_unit(knobs, names, limit, rng):
    """The unit's settings of the knobs `names` other than the hand one (all
    that satisfy the file's requires, or `limit` of them sampled)."""
    settings = []
    for combo in itertools.product(*(knobs.legal[k] for k in names)):
        s = dict(zip(names, combo))
        if s == {k: knobs.values[k] for k in names}:
            continue
        if knobs.satisfies({**knobs.values, **s}):
            settings.append(s)
    if limit is not None and len(settings) > limit:
        settings = rng.sample(settings, limit)
    return settings


def every_value(knobs, unit_names):
    """[(unit, setting)]: each legal value of each unit's knobs other than its
    hand value, once, for the pre-flight to run (`plan --every-value`). A
    value goes with the other knobs at their hand values where the file's
    requires allow, else with the fewest of the knobs those requires name
    changed too, the unit's own first. A value of a knob of both arithmetics
    (compress.row_threads) is run in the op's exact unit as well, whose
    kernels it also shapes."""
    out = []
    for unit, names in unit_names.items():
        exact_unit = f"{unit}.exact"
        for name in names:
            both = exact_unit in unit_names and "triton" not in name
            for value in knobs.legal[name]:
                if value == knobs.values[name]:
                    continue
                setting = legal_setting(knobs, {name: value}, names)
                if setting is None:
                    continue  # no setting of the file holds this value
                out += [(u, setting) for u in [unit] + ([exact_unit] if both else [])]
    return out


def legal_setting(knobs, wanted, prefer=()):
    """`wanted` with the fewest other knobs changed from their hand values
    (only knobs named by the requires it breaks; of as many, those in
    `prefer` rather than others) so that the file's requires hold; None if
    none does."""
    values = {**knobs.values, **wanted}
    failed = [e for _, e in knobs.requires if not knobs_file.evaluate(e, values)]
    if not failed:
        return dict(wanted)
    free = sorted({n for e in failed for n in knobs_file.names_in(e) if n in knobs.values and n not in wanted})
    best = None
    for combo in itertools.product(*(knobs.legal[n] for n in free)):
        s = {**wanted, **{n: v for n, v in zip(free, combo) if v != knobs.values[n]}}
        cost = (len(s), sum(n not in prefer for n in s))
        if knobs.satisfies({**knobs.values, **s}) and (best is None or cost < best[0]):
            best = cost, s
    return best and best[1]


def knob_string(knobs):
    return knobs_file.wire(knobs)


def cmake_line(family, c):
    op = c["unit"].split(".")[0]
    args = [family, "CANDIDATE", str(c["id"]), "KNOBS", f'"{knob_string(c["knobs"])}"', "OPS", op]
    if family != "cpu":
        args += ["ARITHMETICS", c["arithmetic"]]
    if c.get("autoscheduler"):
        args += ["AUTOSCHEDULER", f"Halide::{c['autoscheduler']}"]
    return "kpool_add_device_kernels(" + " ".join(args) + ")\n"


def kernel_targets(build_dir, cid):
    """The ninja targets of candidate cid's kernels (their functions end in _c<id>)."""
    with open(os.path.join(build_dir, "kpool_variants.inc")) as f:
        return re.findall(r"X\(%d, \w+, \w+, \d+, \w+, \w+, (\w+)\)" % cid, f.read())


def cmake(args, log, env=None, timeout=None):
    """Runs a cmake command; returns (exit code, its error lines and last lines).
    The whole output goes through a file: Halide's debug output runs to
    gigabytes."""
    with tempfile.TemporaryFile("w+", errors="replace") as f:
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env=None if env is None else {**os.environ, **env})
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the generator under ninja too
            p.wait()
            return -1, f"error: not done after {timeout:.0f} s (--autoschedule-timeout)"
        f.seek(0)
        errors, tail = [], collections.deque(maxlen=200)
        for line in f:
            tail.append(line)
            if HALIDE_ERROR.search(line) and not line.startswith("FAILED") and len(errors) < 20:
                errors.append(line)
    out = "".join(errors) + "".join(tail)
    with open(log, "a") as f:
        f.write(out)
    return p.returncode, out


HALIDE_ERROR = re.compile(r"(Error|error):\s*\S")


def halide_errors(out):
    """The lines of a failed generator run that say why (an error with its text)."""
    return list(dict.fromkeys(line.strip() for line in out.splitlines()
                              if HALIDE_ERROR.search(line) and not line.startswith("FAILED")))


def plan(a):
    knobs_path = os.path.join(a.knobs_dir, f"{a.family}.knobs")
    knobs = knobs_file.Knobs(knobs_path)
    values = knobs.values
    rng = random.Random(a.seed)
    candidates = []
    tuned = {u: names for u, names in units(knobs).items() if not a.units or u in a.units}
    by_unit = {unit: enumerate_unit(knobs, names, a.max, rng) for unit, names in tuned.items()}
    if a.every_value:
        for unit, s in every_value(knobs, tuned):
            if s not in by_unit[unit]:
                by_unit[unit].append(s)
    for unit in tuned:
        arith = arithmetic_of(a.family, unit)
        for s in by_unit[unit]:
            candidates.append(dict(id=len(candidates), unit=unit, arithmetic=arith, changed=s, knobs={**values, **s}))
        if not a.no_autoscheduler:
            candidates.append(dict(id=len(candidates), unit=unit, arithmetic=arith, changed={}, knobs=values,
                                   autoscheduler=AUTOSCHEDULERS[device_of(a.family)]))
    os.makedirs(a.bundle, exist_ok=True)
    build = os.path.join(a.bundle, "build")
    log = os.path.join(a.bundle, "build.log")
    open(log, "w").close()
    failed = []

    def configure(cands):
        with open(os.path.join(a.bundle, "candidates.cmake"), "w") as f:
            f.write(f"# Generated by tools/tune/kpool_tune.py plan: {a.family} candidates.\n")
            f.writelines(cmake_line(a.family, c) for c in cands)
        families = [] if a.family == "cpu" else [f"-DKPOOL_CUDA_FAMILIES={a.family}"]
        rc, out = cmake([a.cmake, "-S", REPO, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                         "-DKPOOL_BUILD_TESTS=OFF", f"-DKPOOL_KNOBS_DIR={a.knobs_dir}",
                         f"-DKPOOL_TUNE_CANDIDATES={os.path.abspath(os.path.join(a.bundle, 'candidates.cmake'))}",
                         f"-DKPOOL_CUDA={'OFF' if a.family == 'cpu' else 'ON'}", *families, *a.cmake_arg], log)
        if rc != 0:
            sys.exit(f"kpool_tune plan: cmake configure failed (see {log}):\n{out[-3000:]}")

    # An autoscheduler may not take an op (warp shuffles, in-place scatter
    # updates): its kernels are built one by one first, and a candidate whose
    # kernel fails is reported with the error and left out of the library.
    configure(candidates)
    for c in [c for c in candidates if c.get("autoscheduler")]:
        for target in kernel_targets(build, c["id"]):
            rc, out = cmake([a.cmake, "--build", build, "--target", target], log, timeout=a.autoschedule_timeout)
            if rc > 0 and not halide_errors(out):
                # Halide prints an internal error's text only with debug output on.
                rc, out = cmake([a.cmake, "--build", build, "--target", target], log, env={"HL_DEBUG_CODEGEN": "1"},
                                timeout=a.autoschedule_timeout)
            if rc != 0:
                errors = halide_errors(out)
                c["error"] = f"{target}: " + (" | ".join(errors[:3]) or out.strip().splitlines()[-1])[:600]
                failed.append(c)
                print(f"autoscheduled {c['unit']} ({c['autoscheduler']}) not built: {c['error']}", flush=True)
                break
    built = [c for c in candidates if "error" not in c]
    if failed:
        configure(built)
    # Every candidate's kernels, keeping going past failures: a candidate
    # whose kernel does not compile (or that ptxas rejects) is reported with
    # its error, built alone again to find it, and left out.
    t0 = time.time()
    rc, out = cmake([a.cmake, "--build", build, "--", f"-j{a.jobs}", "-k", "0"], log)
    if rc != 0:
        for c in built:
            for target in kernel_targets(build, c["id"]):
                if not os.path.exists(os.path.join(build, f"lib{target}.a")):
                    _, out = cmake([a.cmake, "--build", build, "--target", target], log)
                    errors = halide_errors(out)
                    c["error"] = f"{target}: " + (" | ".join(errors[:3]) or out.strip().splitlines()[-1])[:600]
                    failed.append(c)
                    print(f"candidate {c['id']} ({c['unit']}: {knob_string(c['changed'])}) not built: {c['error']}",
                          flush=True)
                    break
        built = [c for c in built if "error" not in c]
        configure(built)
    rc, out = cmake([a.cmake, "--build", build, "--target", "kpool_shared", "--", f"-j{a.jobs}"], log)
    if rc != 0:
        sys.exit(f"kpool_tune plan: build failed (see {log}):\n{out[-3000:]}")
    shutil.copy2(os.path.join(build, "libkpool.so"), os.path.join(a.bundle, "libkpool.so"))
    with open(os.path.join(a.bundle, "candidates.json"), "w") as f:
        json.dump(dict(family=a.family, knobs=values, candidates=built, failed=failed), f, indent=1)
    n_units = len({c["unit"] for c in built})
    print(f"kpool_tune plan: {len(built)} candidates in {n_units} units built ({time.time() - t0:.0f} s), "
          f"{len(failed)} not; bundle: {a.bundle}/libkpool.so + candidates.json")


# --- run: inputs, check, time ---------------------------------------------------------------------
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


# --- run: every candidate in a worker process ----------------------------------------------------
# A candidate may fault (an out-of-bounds write kills the CUDA context), hang,
# or break CUDA-graph capture; none of that may end the run. Each unit runs in
# a worker process (forked: the parent never loads the library or CUDA) that
# reports over a pipe; a worker that dies, stops reporting within the
# candidate time limit, or meets a CUDA error (its context may be lost) is
# replaced by a fresh one for the unit's remaining candidates, and the
# candidate it was on is recorded as failed with its knobs and the reason.


class CandidateError(Exception):
    """A candidate ran but is wrong (its bytes differ): the process is fine."""


class Session:
    """One worker's view of the bundle: the library with candidate `select`,
    the unit's cases on the family's device, and the hand variants' bytes."""

    def __init__(self, bundle, family, unit, small, quick, seed):
        os.environ["KPOOL_LIBRARY"] = os.path.abspath(os.path.join(bundle, "libkpool.so"))
        if family != "cpu":
            os.environ["KPOOL_CUDA_FAMILY"] = family
        sys.path.insert(0, os.path.join(REPO, "python"))
        import ctypes

        import numpy as np
        import kpool
        self.kpool = kpool
        self.select = ctypes.CDLL(os.environ["KPOOL_LIBRARY"]).kpool_tune_select
        self.select.argtypes, self.select.restype = [ctypes.c_int], ctypes.c_int
        self.family, self.unit = family, unit
        self.device = Device(device_of(family))
        kpool.set_arithmetic(arithmetic_of(family, unit))
        rng = np.random.default_rng(seed)
        # The pre-flight's small cases are the CPU family's sizes, on the family's device.
        sized = cases(unit, "cpu", quick=True) if small else cases(unit, self.device.kind, quick)
        self.cases = [(name, make(rng), call, state) for name, make, call, state in sized]
        self.select(-1)
        self.expected = {name: self.device.result(kpool, call, x, state) for name, x, call, state in self.cases}
        # The CPU kernels' bytes of the first case where the CPU computes this
        # arithmetic (CUDA candidates in the exact arithmetic).
        self.cpu_expected = None
        if self.device.kind == "cuda" and arithmetic_of(family, unit) == "exact":
            name, x, call, state = self.cases[0]
            self.cpu_expected = (name, Device("cpu").result(kpool, call, x, state))

    def device_name(self):
        return self.device.name()

    def hand_times(self):
        return {name: self.device.time_us(self.kpool, call, x) for name, x, call, _ in self.cases}

    def reference_times(self):
        reference = reference_module(self.device.kind)
        return None if reference is None else time_reference(self.device, reference, self.cases)

    def candidate(self, c, timed):
        """Candidate c's times per case (empty when not timed); a
        CandidateError where its bytes differ."""
        try:
            if self.select(c["id"]) == 0:
                raise CandidateError("the library holds no kernel of this candidate")
            times = {}
            for name, x, call, state in self.cases:
                got = self.device.result(self.kpool, call, x, state)
                if got != self.expected[name]:
                    raise CandidateError(f"{name}: bytes differ from the hand variant's")
                if self.cpu_expected and self.cpu_expected[0] == name and got != self.cpu_expected[1]:
                    raise CandidateError(f"{name}: bytes differ from the CPU kernels'")
                if timed:
                    times[name] = self.device.time_us(self.kpool, call, x)
            return times
        finally:
            self.select(-1)

    def healthy(self):
        """Whether the process can go on after a failure: on CUDA, an error
        other than wrong bytes may have lost the context."""
        return self.device.kind == "cpu"


def unit_worker(conn, job):
    """A worker process: the unit's hand variants (timed if asked), then each
    candidate of job["candidates"], every step reported on conn."""
    try:
        session = open_session(job["bundle"], job["family"], job["unit"], job["small"], job["quick"], job["seed"])
        if job["time_hand"]:
            conn.send(("hand", dict(times=session.hand_times(), device=session.device_name())))
        if job["time_reference"]:
            conn.send(("reference", session.reference_times()))
    except Exception as e:  # noqa: BLE001 - the parent records why the unit has no baseline
        conn.send(("unit_error", f"{type(e).__name__}: {e}"))
        return
    for c in job["candidates"]:
        if time.time() > job["deadline"]:
            conn.send(("cut_off", c["id"]))
            return
        conn.send(("start", c["id"]))
        try:
            conn.send(("result", dict(id=c["id"], times=session.candidate(c, job["timed"]), valid=True)))
        except CandidateError as e:
            conn.send(("result", dict(id=c["id"], times={}, valid=False, error=f"CandidateError: {e}")))
        except Exception as e:  # noqa: BLE001 - every failure is reported with its reason
            conn.send(("result", dict(id=c["id"], times={}, valid=False, error=f"{type(e).__name__}: {e}")))
            if not session.healthy():
                conn.send(("restart", None))  # a fresh process for the rest
                return
    conn.send(("done", None))


def open_session(bundle, family, unit, small, quick, seed):
    return Session(bundle, family, unit, small, quick, seed)


def describe_exit(code):
    if code is not None and code < 0:
        return f"the process died of {signal.Signals(-code).name}"
    return f"the process ended (exit code {code}) without a result"


def run_unit(job, candidates, limit, report):
    """Runs the unit's candidates in worker processes, as many as it takes:
    report(kind, payload) gets the baseline and every candidate's result
    (a failed one with its knobs and error). Returns the ids not reached
    (the budget ran out first)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    pending = list(candidates)
    job = dict(job)
    while pending:
        job["candidates"] = pending
        receive, send = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=unit_worker, args=(send, job), daemon=True)
        worker.start()
        send.close()
        current, finished = None, False
        while not finished:
            # The baseline (hand variants and reference) and each candidate get the time limit.
            if not receive.poll(limit):
                why = f"no result after {limit:.0f} s (--candidate-timeout): killed"
                worker.kill()
                if current is None:
                    report("unit_error", why + " before its candidates")
                    pending = []
                else:
                    report("result", failure(current, why))
                    pending = [c for c in pending if c["id"] != current["id"]]
                break
            try:
                kind, payload = receive.recv()
            except EOFError:  # the worker is gone
                worker.join()
                if current is None:
                    report("unit_error", describe_exit(worker.exitcode) + " before its candidates")
                    pending = []
                else:
                    report("result", failure(current, describe_exit(worker.exitcode)))
                    pending = [c for c in pending if c["id"] != current["id"]]
                break
            if kind == "start":
                current = next(c for c in pending if c["id"] == payload)
            elif kind == "result":
                c = next(c for c in pending if c["id"] == payload["id"])
                report("result", dict(payload, changed=c["changed"], knobs=c["knobs"],
                                      autoscheduler=c.get("autoscheduler")))
                pending = [p for p in pending if p["id"] != c["id"]]
                current = None
            elif kind in ("hand", "reference"):
                report(kind, payload)
                job["time_hand" if kind == "hand" else "time_reference"] = False
            elif kind == "unit_error":
                report(kind, payload)
                pending = []
            elif kind == "cut_off":
                worker.join(5)
                return [c["id"] for c in pending]
            if kind in ("done", "unit_error", "restart"):
                finished = True
        worker.join(5)
        receive.close()
    return []


def failure(c, why):
    return dict(id=c["id"], changed=c["changed"], knobs=c["knobs"], autoscheduler=c.get("autoscheduler"),
                times={}, valid=False, error=why)


def what(c):
    return c.get("autoscheduler") or knob_string(c["changed"])


def check_all(a, bundle, order, by_unit, deadline):
    """The pre-flight: every candidate once on small inputs (no timing),
    isolated as in `run`, before anything is timed: a candidate that faults
    is found in seconds, whatever the budget leaves for timing. Returns
    ({id: failed result} of those that fault or differ, [ids not reached])."""
    failed, not_reached = {}, []
    for unit in order:
        def report(kind, payload, unit=unit):
            if kind == "result" and not payload["valid"]:
                failed[payload["id"]] = payload
                print(f"pre-flight {unit:13} {what(payload):50} {payload['error']}", flush=True)
            elif kind == "unit_error":
                for c in by_unit[unit]:
                    failed[c["id"]] = failure(c, f"pre-flight: the hand variants failed: {payload}")
                print(f"pre-flight {unit}: the hand variants failed: {payload}", flush=True)
        job = dict(bundle=a.bundle, family=bundle["family"], unit=unit, small=True, quick=True, seed=a.seed,
                   time_hand=False,
                   time_reference=False, timed=False, deadline=deadline)
        not_reached += run_unit(job, by_unit[unit], a.candidate_timeout, report)
    return failed, not_reached


def end_on_sigterm():
    """A SIGTERM (`timeout`, the GPU call's deadline) ends the run as an
    exit does: the worker processes are killed with it, the results kept."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def load_bundle(a):
    with open(os.path.join(a.bundle, "candidates.json")) as f:
        bundle = json.load(f)
    by_unit = {}
    for c in bundle["candidates"]:
        by_unit.setdefault(c["unit"], []).append(c)
    return bundle, by_unit, [u for u in (a.units or by_unit) if u in by_unit]


def check(a):
    end_on_sigterm()
    bundle, by_unit, order = load_bundle(a)
    total = sum(len(by_unit[u]) for u in order)
    failed, not_reached = check_all(a, bundle, order, by_unit, time.time() + a.budget)
    print(f"kpool_tune check: {total - len(failed) - len(not_reached)} of {total} candidates match the hand "
          f"variants on small inputs; {len(failed)} failed, {len(not_reached)} not reached")
    return 1 if failed or not_reached else 0


def run(a):
    end_on_sigterm()
    bundle, by_unit, order = load_bundle(a)
    family = bundle["family"]
    deadline = time.time() + a.budget
    results = dict(family=family, knobs=bundle["knobs"], failed_to_build=bundle["failed"], units={})

    def save():
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)

    total, done = sum(len(by_unit[u]) for u in order), 0
    preflight = {} if a.no_preflight else check_all(a, bundle, order, by_unit, deadline)[0]
    reference_ops = set()
    for unit in order:
        entry = results["units"][unit] = dict(arithmetic=arithmetic_of(family, unit), hand=dict(times={}),
                                              candidates=[], not_reached=[])
        for c in by_unit[unit]:
            if c["id"] in preflight:
                entry["candidates"].append(preflight[c["id"]])
                done += 1
                print(f"[{done}/{total}] {unit:13} {what(c):50} {preflight[c['id']]['error']}", flush=True)
        save()

        def report(kind, payload, entry=entry, unit=unit):
            nonlocal done
            if kind == "hand":
                results.setdefault("device", payload.pop("device", None))
                entry["hand"] = payload
            elif kind == "reference" and payload is not None:
                entry["reference"] = payload
                reference_ops.add(unit.split(".")[0])
            elif kind == "unit_error":
                entry["error"] = payload
                print(f"{unit}: the hand variants failed, its candidates are not measured: {payload}", flush=True)
            elif kind == "result":
                done += 1
                entry["candidates"].append(payload)
                status = (f"{geomean_ratio(payload['times'], entry['hand']['times']):.3f}x hand" if payload["valid"]
                          else payload["error"])
                print(f"[{done}/{total}] {unit:13} {what(payload):50} {status}", flush=True)
            save()

        to_time = [c for c in by_unit[unit] if c["id"] not in preflight]
        job = dict(bundle=a.bundle, family=family, unit=unit, small=False, quick=a.quick, seed=a.seed, time_hand=True,
                   time_reference=unit.split(".")[0] not in reference_ops, timed=True, deadline=deadline)
        if to_time and time.time() < deadline:
            entry["not_reached"] = run_unit(job, to_time, a.candidate_timeout, report)
        else:
            entry["not_reached"] = [c["id"] for c in to_time]
        if "error" in entry:
            entry["not_reached"] = [c["id"] for c in to_time
                                    if c["id"] not in {r["id"] for r in entry["candidates"]}]
        if entry["not_reached"]:
            entry["cut_off"] = True
            print(f"{unit}: {len(entry['not_reached'])} candidates not reached", flush=True)
        save()
    results["summary"] = summary(results)
    save()
    s = results["summary"]
    print(f"kpool_tune run: {s['measured']} of {total} candidates measured, {s['failed']} failed, "
          f"{s['not_reached']} not reached; {s['not_built']} did not build; results in {a.out}")


def summary(results):
    candidates = [c for e in results["units"].values() for c in e["candidates"]]
    return dict(measured=sum(c["valid"] for c in candidates), failed=sum(not c["valid"] for c in candidates),
                not_reached=sum(len(e.get("not_reached", [])) for e in results["units"].values()),
                not_built=len(results.get("failed_to_build", [])))

# --- apply ----------------------------------------------------------------------------------------
def geomean_ratio(times, hand):
    names = [n for n in hand if n in times]
    if not names or len(names) < len(hand):
        return math.inf
    return math.exp(sum(math.log(times[n] / hand[n]) for n in names) / len(names))


def winners(results, min_gain=0.02):
    """{unit: (best candidate or None, autoscheduled candidate or None)}: a
    candidate replaces the hand values only if it is faster by more than
    min_gain (timing noise), on every case of the unit measured."""
    out = {}
    for unit, e in results["units"].items():
        tuned = [c for c in e["candidates"] if c["valid"] and not c.get("autoscheduler")]
        best = min(tuned, key=lambda c: geomean_ratio(c["times"], e["hand"]["times"]), default=None)
        if best is not None and geomean_ratio(best["times"], e["hand"]["times"]) > 1.0 - min_gain:
            best = None  # the hand values stay
        auto = next((c for c in e["candidates"] if c.get("autoscheduler")), None)
        out[unit] = (best, auto)
    return out


def table(results, min_gain=0.02):
    lines = ["| unit | case | reference µs | hand µs | tuned µs | tuned knobs | autoscheduled µs |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    not_built = results.get("failed_to_build", [])
    failed = {c["unit"]: c for c in not_built if c.get("autoscheduler")}
    for unit, (best, auto) in winners(results, min_gain).items():
        e = results["units"][unit]
        reference = e.get("reference", {}).get("times", {})
        for name, hand_us in e["hand"]["times"].items():
            tuned_us = best["times"][name] if best else hand_us
            knobs = knob_string(best["changed"]) if best else "(hand)"
            if auto and auto["valid"]:
                auto_s = f"{auto['times'][name]:.1f}"
            elif auto:
                auto_s = "wrong bytes" if "differ" in auto.get("error", "") else "failed"
            else:
                auto_s = "not built" if unit in failed else "-"
            ref_s = f"{reference[name]:.1f}" if name in reference else "-"
            lines.append(f"| {unit} ({e['arithmetic']}) | {name} | {ref_s} | {hand_us:.1f} | {tuned_us:.1f} | {knobs} "
                         f"| {auto_s} |")
    lines.append("")
    for unit, e in results["units"].items():
        if e.get("reference", {}).get("error"):
            lines.append(f"{unit}: the reference was not timed: {e['reference']['error']}")
    for unit, c in failed.items():
        lines.append(f"{unit}: {c['autoscheduler']} could not schedule it: {c['error']}")
    for c in not_built:
        if not c.get("autoscheduler"):
            lines.append(f"{c['unit']}: {knob_string(c['changed'])} did not build: {c['error']}")
    for unit, e in results["units"].items():
        for c in e["candidates"]:
            if not c["valid"]:
                what = c.get("autoscheduler") or knob_string(c["changed"])
                lines.append(f"{unit}: {what} failed: {c['error']}")
    return "\n".join(lines)


DOCS = os.path.join(REPO, "docs")


def keep(results, table_text, docs_dir):
    """The run's results as docs/measured/tune_<family>.json, and its table
    in docs/tuning.md between the family's markers (added at the end the
    first time)."""
    family = results["family"]
    os.makedirs(os.path.join(docs_dir, "measured"), exist_ok=True)
    measured = os.path.join(docs_dir, "measured", f"tune_{family}.json")
    with open(measured, "w") as f:
        json.dump(results, f, indent=1)
    begin, end = f"<!-- tune table {family}: kpool_tune.py apply --keep -->", f"<!-- end tune table {family} -->"
    s = results.get("summary") or summary(results)
    section = (f"{begin}\n### {family}, measured on {results.get('device') or 'an unnamed device'}\n\n"
               f"{s['measured']} candidates measured, {s['failed']} failed, {s['not_reached']} not reached, "
               f"{s['not_built']} not built (`docs/measured/tune_{family}.json`).\n\n{table_text}\n{end}")
    path = os.path.join(docs_dir, "tuning.md")
    with open(path) as f:
        doc = f.read()
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin)] + section + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(doc)
    print(f"kept: {measured} and the table in {path}")


def apply(a):
    with open(a.results) as f:
        results = json.load(f)
    path = os.path.join(a.knobs_dir, f"{results['family']}.knobs")
    new = {}
    for unit, (best, _) in winners(results, a.min_gain).items():
        if best:
            new.update(best["changed"])
            ratio = geomean_ratio(best["times"], results["units"][unit]["hand"]["times"])
            print(f"{unit}: {knob_string(best['changed'])} ({ratio:.3f}x the hand values' time)")
        else:
            print(f"{unit}: the hand values stay")
    if new and not a.no_knobs:
        knobs_file.write_values(path, new)
        print(f"wrote {len(new)} values into {path}")
    text = table(results, a.min_gain)
    print(text)
    if a.keep:
        keep(results, text, a.docs_dir)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="build the candidates into a bundle (build machine)")
    pl.add_argument("family")
    pl.add_argument("bundle")
    pl.add_argument("--units", nargs="*", help="tuning units (default: every one of the family)")
    pl.add_argument("--max", type=int, default=16, help="candidates per unit at most (sampled)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--no-autoscheduler", action="store_true")
    pl.add_argument("--every-value", action="store_true",
                    help="also each legal value of each knob once (with --max 0: only those), so that the "
                         "pre-flight runs every value the knobs file calls legal")
    pl.add_argument("--autoschedule-timeout", type=float, default=240, help="seconds per autoscheduled kernel")
    pl.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    pl.add_argument("--cmake", default=shutil.which("cmake") or "cmake")
    pl.add_argument("--cmake-arg", action="append", default=[], help="passed to cmake's configure")
    rn = sub.add_parser("run", help="check and time every candidate (the family's machine)")
    ck = sub.add_parser("check", help="the pre-flight alone: every candidate once on small inputs, bytes "
                                      "against the hand variants (exit status 1 if any fails)")
    for q in (rn, ck):
        q.add_argument("bundle")
        q.add_argument("--budget", type=float, default=480, help="seconds; results so far are kept")
        q.add_argument("--units", nargs="*")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--candidate-timeout", type=float, default=300,
                       help="seconds a candidate (or a unit's baseline) may take before its process is killed")
    rn.add_argument("--out", default="tune_results.json")
    rn.add_argument("--quick", action="store_true", help="the first two cases of each unit only")
    rn.add_argument("--no-preflight", action="store_true", help="skip the pre-flight check on small inputs")
    ap = sub.add_parser("apply", help="write the winners into the family's .knobs")
    ap.add_argument("results")
    ap.add_argument("--min-gain", type=float, default=0.02, help="how much faster a winner must be (0.02: 2 %%)")
    ap.add_argument("--no-knobs", action="store_true", help="print (and keep) the table, leave the .knobs as it is")
    ap.add_argument("--keep", action="store_true",
                    help="also write the results to docs/measured/tune_<family>.json and the table into docs/tuning.md")
    ap.add_argument("--docs-dir", default=DOCS)
    for q in (pl, ap):
        q.add_argument("--knobs-dir", default=os.path.join(REPO, "schedules"))
    a = p.parse_args(argv)
    return {"plan": plan, "run": run, "check": check, "apply": apply}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
