#!/usr/bin/env python3
"""Every legal value of every knob, built on the build machine: each value
the family's knobs file calls legal (kpool_tune.every_value: once, the other
knobs at their hand values where the file's requires allow) goes through the
build's own commands for the kernels of its op named by GLOB: the generator
(which refuses a plan it cannot launch, e.g. shared memory over 48 KiB) and
cmake/ptx_for_family.py (ptxas for the family's target, and no local access
wider than its stack frame's alignment); then every kernel's launch is held
to the limits of every CUDA GPU (launch_bounds_errors): threads a block,
registers (ptxas -v) times threads, and shared memory (Halide's launch, from
the generator's stmt). A value that fails here would fail
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
import glob
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


# What a launch may ask of any CUDA GPU from sm_80 on (a kernel of Halide
# 21: its shared memory is the launch's dynamic size, never raised past the
# default): threads a block, registers a block (allocated per warp, in
# units of 256 registers: a thread's count rounded up to 8), shared bytes.
MAX_BLOCK_THREADS, MAX_BLOCK_REGISTERS, MAX_DYNAMIC_SHARED_BYTES = 1024, 65536, 48 * 1024


def launches(stmt):
    """{kernel: (threads a block, shared bytes)} of each halide_cuda_run call
    in Halide's stmt, each None where the launch computes it (a block sized
    by the call's shapes: decode's per-request token indices); grid sizes
    are the call's, not the kernel's."""
    out = {}
    for m in re.finditer(r'halide_cuda_run\(cuda\[0\], "(\w+)", ', stmt):
        args, depth, start, i = [], 0, m.end(), m.end()
        while len(args) < 7:
            c = stmt[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "," and depth == 0:
                args.append(stmt[start:i].strip())
                start = i + 1
            i += 1
        block, shared = args[3:6], args[6]
        threads = (int(block[0]) * int(block[1]) * int(block[2])
                   if all(re.fullmatch(r"\d+", b) for b in block) else None)
        out[m.group(1)] = (threads, eval(shared, {"__builtins__": {}})
                           if re.fullmatch(r"[\d+*() ]+", shared) else None)
    return out


def registers(ptxas_report):
    """{kernel: registers a thread} from ptxas -v."""
    out, kernel = {}, None
    for line in ptxas_report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and kernel:
            out[kernel] = int(m.group(1))
    return out


def launch_bounds_errors(stmt, ptxas_report):
    """Why each kernel of the pipeline could not launch on a CUDA GPU ([] if all can)."""
    errors = []
    regs = registers(ptxas_report)
    for kernel, (threads, shared) in launches(stmt).items():
        block_registers = -(-regs.get(kernel, 0) // 8) * 8 * (threads or 0)
        if threads and threads > MAX_BLOCK_THREADS:
            errors.append(f"{kernel}: {threads} threads a block, over {MAX_BLOCK_THREADS}")
        if block_registers > MAX_BLOCK_REGISTERS:
            errors.append(f"{kernel}: {regs[kernel]} registers x {threads} threads = {block_registers} a block, "
                          f"over {MAX_BLOCK_REGISTERS}")
        if shared and shared > MAX_DYNAMIC_SHARED_BYTES:
            errors.append(f"{kernel}: {shared} bytes of shared memory a block, over {MAX_DYNAMIC_SHARED_BYTES}")
    return errors


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
        if "-e" in args:  # the stmt too: its launches' block sizes and shared memory
            args[args.index("-e") + 1] += ",stmt"
        r = subprocess.run(args, capture_output=True, text=True, cwd=out_dir)
        if r.returncode != 0:
            lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
            return " | ".join(lines[-6:])[:1500]
    with open(os.path.join(out_dir, f"{kernel}.stmt"), errors="replace") as f:
        stmt = f.read()
    report = ""
    for path in sorted(glob.glob(os.path.join(out_dir, f"{kernel}.*.cubin.ptxas"))):
        with open(path) as f:
            report += f.read()
    if not launches(stmt) or not registers(report):
        return "no launch or no ptxas -v report to check (the build's commands changed?)"
    return " | ".join(launch_bounds_errors(stmt, report)) or None


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
        unit_settings = [(kt.unit_of(knobs, name), setting) for name in setting][:1]
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
          f"{len(unit_settings)} knob settings passed the generator, ptxas, the alignment check and the launch bounds")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
