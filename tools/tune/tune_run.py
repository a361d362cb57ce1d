"""kpool_tune.py run and check: every candidate of a bundle checked byte for
byte against the hand variants and timed, each unit in a worker process
(the family's machine; no Halide)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from tune_common import REPO, arithmetic_of, device_of, geomean_ratio, units
from tune_plan import knob_string
from tune_workloads import Device, cases, reference_module, time_reference


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
