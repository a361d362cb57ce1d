"""kpool_tune.py plan: a family's candidates enumerated per unit and built into
one tuning bundle (the build machine: Halide, no GPU)."""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tune_common import AUTOSCHEDULERS, REPO, arithmetic_of, device_of, knobs_file, units


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


def build_twins(candidates, order, configure, build_one):
    """Builds the twins among `candidates` (configured with every candidate
    not failed), each twin whose kernels fail (build_one sets its "error")
    tried again with the next autoscheduler of `order`, appended to
    `candidates`; returns the twins that failed."""
    failed = []
    twins = [c for c in candidates if c.get("autoscheduler")]
    configure(candidates)
    while twins:
        for c in twins:
            build_one(c)
        retried, now_failed = [], [c for c in twins if "error" in c]
        for c in now_failed:
            following = order[order.index(c["autoscheduler"]) + 1:]
            if following:
                retried.append({**c, "id": len(candidates), "autoscheduler": following[0]})
                del retried[-1]["error"]
                candidates.append(retried[-1])
        if now_failed:
            configure([c for c in candidates if "error" not in c])
        failed += now_failed
        twins = retried
    return failed


def build_twin(a, build, log, c):
    """Builds twin c's kernels one by one; on a failure sets c["error"]."""
    for target in kernel_targets(build, c["id"]):
        rc, out = cmake([a.cmake, "--build", build, "--target", target], log, timeout=a.autoschedule_timeout)
        if rc > 0 and not halide_errors(out):
            # Halide prints an internal error's text only with debug output on.
            rc, out = cmake([a.cmake, "--build", build, "--target", target], log, env={"HL_DEBUG_CODEGEN": "1"},
                            timeout=a.autoschedule_timeout)
        if rc != 0:
            errors = halide_errors(out)
            c["error"] = f"{target}: " + (" | ".join(errors[:3]) or out.strip().splitlines()[-1])[:600]
            print(f"autoscheduled {c['unit']} ({c['autoscheduler']}) not built: {c['error']}", flush=True)
            return


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
                                   autoscheduler=AUTOSCHEDULERS[device_of(a.family)][0]))
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
    # updates): its kernels are built one by one first, and a twin whose
    # kernel fails is reported with the error and left out of the library;
    # the device's next autoscheduler then tries the unit.
    failed += build_twins(candidates, AUTOSCHEDULERS[device_of(a.family)], configure,
                          lambda c: build_twin(a, build, log, c))
    built = [c for c in candidates if "error" not in c]
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
    # The library and the op table the Python package reads beside it.
    for name in ("libkpool.so", "kpool_ops.json"):
        shutil.copy2(os.path.join(build, name), os.path.join(a.bundle, name))
    with open(os.path.join(a.bundle, "candidates.json"), "w") as f:
        json.dump(dict(family=a.family, knobs=values, candidates=built, failed=failed), f, indent=1)
    n_units = len({c["unit"] for c in built})
    print(f"kpool_tune plan: {len(built)} candidates in {n_units} units built ({time.time() - t0:.0f} s), "
          f"{len(failed)} not; bundle: {a.bundle}/libkpool.so + candidates.json")
