#!/usr/bin/env python3
"""Every legal value of every knob, built on the build machine: each value
the family's knobs file calls legal (kpool_tune.every_value: once, the other
knobs at their hand values where the file's requires allow) goes through the
build's own commands for the kernels of its op named by GLOB: the generator
(which refuses a plan it cannot launch, e.g. shared memory over 48 KiB) and
cmake/ptx_for_family.py (ptxas for the family's target, and no local access
wider than its stack frame's alignment). A value that fails here would fail
on every GPU; the GPU side runs each once (`kpool_tune.py plan --every-value`,
then `check`, bench/run_on_gpu.sh).

    every_value_builds.py BUILD_DIR FAMILY GLOB... [--jobs N] [--settings name=value,...]

GLOB: hand variants of the build (ninja targets) without kpool_<family>_,
e.g. 'compress_to_cache_words_p16_bf16*'. --settings: build that one
setting instead (the file's requires not applied), to see a value refused.
Exit status 1 naming the setting, the kernel and the error if any fails.
"""
import argparse
import concurrent.futures
import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kpool_tune as kt  # noqa: E402
import knobs as kf  # noqa: E402 (schedules/knobs.py, on the path kpool_tune puts it)

# The kernels of each op, by name (kpool_<family>_<kernel>).
KERNEL_OPS = {"fwht": r"fwht", "compress": r"compress", "decode": r"decode", "seed": r"seed_tail",
              "expand": r"expand|append_tail"}


def cache_entry(build_dir, name):
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    sys.exit(f"{build_dir}: no {name} in CMakeCache.txt")


def hand_kernels(build_dir, family, globs):
    out = subprocess.run(["ninja", "-C", build_dir, "-t", "targets", "all"], capture_output=True, text=True,
                         check=True).stdout
    prefix = f"kpool_{family}_"
    names = sorted({m for m in re.findall(r"^(%s\w+):" % prefix, out, re.M) if not re.search(r"_c\d+$", m)})
    return [n for n in names if any(fnmatch.fnmatch(n[len(prefix):], g) for g in globs)]


def build_command(build_dir, kernel):
    """The build's generator and ptx_for_family.py commands for `kernel`, as argument lists."""
    out = subprocess.run(["ninja", "-C", build_dir, "-t", "commands", kernel], capture_output=True, text=True,
                         check=True).stdout
    line = next(ln for ln in out.splitlines() if f" -f {kernel} " in ln and "knobs=" in ln)
    steps = [shlex.split(s) for s in line.split(" && ")]
    return [s for s in steps if s[0] != "cd"]


def kernels_of(unit, kernels, family):
    op, exact = unit.split(".")[0], unit.endswith(".exact")
    mine = [k for k in kernels if re.search(KERNEL_OPS[op], k[len(f"kpool_{family}_"):])]
    if any("_triton" in k for k in mine):  # an op of both arithmetics: the unit's
        mine = [k for k in mine if ("_triton" in k) != exact]
    return mine


def build(steps, kernel, knobs, out_dir):
    """Runs the kernel's commands with `knobs`, writing into out_dir; None or the error."""
    for step in steps:
        args = []
        for a in step:
            if a.startswith("knobs="):
                a = "knobs=" + kf.wire(knobs)
            elif a.endswith((f"{kernel}.o", f"{kernel}.sass")):
                a = os.path.join(out_dir, os.path.basename(a))
            args.append(a)
        if "-o" in args:
            args[args.index("-o") + 1] = out_dir
        r = subprocess.run(args, capture_output=True, text=True, cwd=out_dir)
        if r.returncode != 0:
            lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
            return " | ".join(lines[-6:])[:1500]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("family")
    ap.add_argument("globs", nargs="+")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--settings", help="name=value,... instead of every legal value")
    a = ap.parse_args()

    knobs = kf.Knobs(os.path.join(cache_entry(a.build_dir, "KPOOL_KNOBS_DIR"), f"{a.family}.knobs"))
    kernels = hand_kernels(a.build_dir, a.family, a.globs)
    if not kernels:
        sys.exit(f"no hand variant of {a.family} in {a.build_dir} matches {' '.join(a.globs)}")
    if a.settings:
        setting = {k: int(v) for k, v in (kv.split("=") for kv in a.settings.split(","))}
        unit_settings = [(kt.unit_of(name), setting) for name in setting][:1]
    else:
        unit_settings = kt.every_value(knobs, kt.units(knobs))
    jobs = [(s, k) for unit, s in unit_settings for k in kernels_of(unit, kernels, a.family)]
    commands = {k: build_command(a.build_dir, k) for k in {k for _, k in jobs}}
    failed = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        def one(index, setting, kernel):
            out_dir = os.path.join(tmp, str(index))
            os.makedirs(out_dir)
            return build(commands[kernel], kernel, {**knobs.values, **setting}, out_dir)

        futures = {pool.submit(one, i, s, k): (s, k) for i, (s, k) in enumerate(jobs)}
        for f in concurrent.futures.as_completed(futures):
            setting, kernel = futures[f]
            error = f.result()
            if error:
                failed.append(f"{kf.wire(setting)} {kernel}: {error}")
                print(f"FAILED {kf.wire(setting)} {kernel}: {error}", flush=True)
    print(f"{len(jobs) - len(failed)} of {len(jobs)} builds of {len(kernels)} {a.family} kernels over "
          f"{len(unit_settings)} knob settings passed the generator, ptxas and the alignment check")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
