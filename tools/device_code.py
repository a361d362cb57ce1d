#!/usr/bin/env python3
"""The CUDA kernels' device-code figures, and their budgets.

    device_code.py report BUILD_DIR --knobs-dir DIR [--json FILE] [--family NAME ...]
    device_code.py check  BUILD_DIR --knobs-dir DIR [--json FILE] [--family NAME ...]
    device_code.py budgets BUILD_DIR --knobs-dir DIR --family NAME   (today's figures, as a budgets file)

For every CUDA kernel of every family the build holds, from the SASS the
library embeds (assembled by the build's ptxas for the family's target with
the register cap the runtime gives the driver's JIT: cmake/ptx_for_family.py
keeps each cubin and ptxas -v's report next to the kernel's object):
registers, spill bytes, SASS instructions per thread, instructions per element
a thread handles, global and shared memory instructions by bytes per
instruction, and block barriers (BAR instructions): in the kernel, and the
most in the body of one loop (a backward branch's span: in a decode kernel,
the barriers every thread passes per token, completing or not). `report` prints the table; `check` also holds every kernel to
its family's budgets (schedules/<family>.budgets) and fails naming the kernel,
the figure and the budget; `--json` writes the figures (and verdicts).

A budgets file holds one line per kernel group:

    <glob over the kernel's name without kpool_<family>_> : elements <expr>
        [: instructions_per_element <= N] [: load_bytes >= N] [: store_bytes >= N]
        [: spill_bytes <= N] [: registers <= N]
        [: barriers <= N] [: loop_barriers <= N]

`elements` is how many elements one thread handles (the unit of
instructions per element), an expression over the family's knobs (dots
allowed: fwht.values) and P, the kernel's pool size; the first line whose
glob matches a kernel applies, and a kernel no line matches fails the check.
load_bytes / store_bytes: the bytes a thread's global load (store)
instructions move, per instruction (static: each instruction once).
barriers / loop_barriers: BAR instructions (bar.sync and its kin) in the
kernel, and in the one loop body that holds the most (static: a barrier a
branch skips still counts; one no branch skips is passed by every thread).
"""
import argparse
import concurrent.futures
import fnmatch
import glob
import json
import os
import re
import subprocess
import sys

GLOBAL = {"LDG": "load", "STG": "store"}
SHARED = {"LDS": "shared load", "STS": "shared store"}
WIDTH = {"8": 1, "U8": 1, "S8": 1, "16": 2, "U16": 2, "S16": 2, "64": 8, "128": 16}
FIGURES = ("instructions_per_element", "load_bytes", "store_bytes", "spill_bytes", "registers", "barriers",
           "loop_barriers")
LIMIT_IS_MAX = {"instructions_per_element": True, "spill_bytes": True, "registers": True,
                "load_bytes": False, "store_bytes": False, "barriers": True, "loop_barriers": True}


def tool(name, build_dir):
    """ptxas/cuobjdump as the build found them (CMakeCache.txt)."""
    cache = os.path.join(build_dir, "CMakeCache.txt")
    with open(cache) as f:
        for line in f:
            m = re.match(rf"KPOOL_{name.upper()}:FILEPATH=(.+)", line.strip())
            if m and os.path.exists(m.group(1)):
                return m.group(1)
    sys.exit(f"{cache}: no KPOOL_{name.upper()} (a build with KPOOL_CUDA=ON has it)")


def read_knobs(path):
    """A family's knob values, through schedules/knobs.py (the one reader: its base included)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schedules"))
    import knobs  # noqa: E402 (schedules/knobs.py)
    return knobs.Knobs(path).values


def memory_width(op):
    """Bytes one LDG/STG/LDS/STS instruction moves per thread (4 without a size suffix)."""
    for part in op.split(".")[1:]:
        if part in WIDTH:
            return WIDTH[part]
    return 4


def parse_sass(text):
    """{entry: [(offset, opcode with modifiers, branch target or None), ...]} from
    cuobjdump -sass's text (NOP padding left out)."""
    functions, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        # Offsets past 0xfff0 (kernels of more than 4096 instructions) print 5 digits.
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", line)
        if m and current is not None and m.group(3) != "NOP":
            target = None
            if m.group(3).split(".")[0] == "BRA":
                t = re.search(r"0x([0-9a-f]+)\s*$", m.group(4))
                target = int(t.group(1), 16) if t else None
            current.append((int(m.group(1), 16), m.group(3), target))
    return functions


def sass_functions(cuobjdump, cubin):
    """parse_sass of a cubin."""
    out = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return parse_sass(out)


def is_barrier(op):
    """A block barrier: BAR.SYNC (.DEFER_BLOCKING), BAR.ARV, BAR.RED, BAR.SYNCALL (not the
    warp's WARPSYNC or the convergence barriers BSSY/BSYNC)."""
    return op.split(".")[0] == "BAR"


def barrier_counts(instructions):
    """(BAR instructions in the entry, the most BAR instructions in one loop body).
    A loop body is a backward branch's span, [target, branch]; an outer loop's span
    holds its inner loops', so the most is the outermost loop that has barriers."""
    bars = [offset for offset, op, _ in instructions if is_barrier(op)]
    most = 0
    for offset, op, target in instructions:
        if target is not None and target < offset:
            most = max(most, sum(1 for b in bars if target <= b <= offset))
    return len(bars), most


def ptxas_report(path):
    """{entry: (registers, spill bytes)} from ptxas -v."""
    report, entry = {}, None
    with open(path) as f:
        for line in f:
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                entry = m.group(1)
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and entry:
                report.setdefault(entry, [0, 0])[1] = int(m.group(1)) + int(m.group(2))
            m = re.search(r"Used (\d+) registers", line)
            if m and entry:
                report.setdefault(entry, [0, 0])[0] = int(m.group(1))
    return report


def kernel_figures(build_dir, families):
    """[{kernel, family, entry, registers, ...}] for every CUDA kernel of the build."""
    cuobjdump = tool("cuobjdump", build_dir)
    modules = []  # (variant, family, cubin)
    for manifest in sorted(glob.glob(os.path.join(build_dir, "kpool_*.sass"))):
        variant = os.path.basename(manifest)[: -len(".sass")]
        family = next((f for f in families if variant.startswith(f"kpool_{f}_")), None)
        if family is None:
            continue
        with open(manifest) as f:
            modules += [(variant, family, line.split(maxsplit=2)[2].strip()) for line in f if line.strip()]
    # (One cuobjdump per module, several at once.)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        sass = list(pool.map(lambda m: sass_functions(cuobjdump, m[2]), modules))
    rows = []
    for (variant, family, cubin), functions in zip(modules, sass):
        resources = ptxas_report(cubin + ".ptxas")
        for entry, instructions in functions.items():
            ops = [op for _, op, _ in instructions]
            barriers, loop_barriers = barrier_counts(instructions)
            memory = {}
            for op in ops:
                kind = GLOBAL.get(op.split(".")[0]) or SHARED.get(op.split(".")[0])
                if kind:
                    key = f"{kind} {memory_width(op)} B"
                    memory[key] = memory.get(key, 0) + 1
            loads = [memory_width(op) for op in ops if op.startswith("LDG")]
            stores = [memory_width(op) for op in ops if op.startswith("STG")]
            registers, spills = resources.get(entry, (None, None))
            rows.append({"kernel": variant, "family": family, "entry": entry,
                         "registers": registers, "spill_bytes": spills, "instructions": len(ops),
                         "barriers": barriers, "loop_barriers": loop_barriers,
                         "load_bytes": round(sum(loads) / len(loads), 2) if loads else None,
                         "store_bytes": round(sum(stores) / len(stores), 2) if stores else None,
                         "memory": dict(sorted(memory.items()))})
    return rows


def parse_budgets(path):
    budgets = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = [x.strip() for x in line.split(":")]
            m = re.match(r"elements (.+)$", fields[1]) if len(fields) > 1 else None
            if not m:
                sys.exit(f"{path}:{number}: not \"<glob> : elements <expr> : <figure> <= N ...\"")
            limits = {}
            for field in fields[2:]:
                b = re.match(r"([a-z_]+) *(<=|>=) *([0-9.]+)$", field)
                if not b or b.group(1) not in FIGURES or (b.group(2) == "<=") != LIMIT_IS_MAX[b.group(1)]:
                    sys.exit(f"{path}:{number}: not a budget: {field!r} (one of {', '.join(FIGURES)}, "
                             "<= for instructions, spills and registers, >= for bytes)")
                limits[b.group(1)] = float(b.group(3))
            budgets.append((fields[0], m.group(1), limits))
    return budgets


def elements_of(expr, knobs, kernel):
    env = {name.replace(".", "__"): value for name, value in knobs.items()}
    m = re.search(r"_p(\d+)(_|$)", kernel)
    env["P"] = int(m.group(1)) if m else 1
    return eval(re.sub(r"([a-z_]+)\.([a-z_]+)", r"\1__\2", expr), {"__builtins__": {}}, env)


def apply_budgets(rows, knobs_dir):
    """Sets each row's elements, instructions per element and budget verdicts; returns the failures."""
    failures = []
    cache = {}
    for row in rows:
        family = row["family"]
        if family not in cache:
            path = os.path.join(knobs_dir, f"{family}.budgets")
            cache[family] = (parse_budgets(path) if os.path.exists(path) else None,
                             read_knobs(os.path.join(knobs_dir, f"{family}.knobs")), path)
        budgets, knobs, path = cache[family]
        name = row["kernel"][len(f"kpool_{family}_"):]
        match = next((b for b in budgets or [] if fnmatch.fnmatchcase(name, b[0])), None)
        if match is None:
            failures.append(f"{row['kernel']}: no budget in {path}")
            continue
        row["elements"] = elements_of(match[1], knobs, name)
        row["instructions_per_element"] = round(row["instructions"] / row["elements"], 2)
        row["budget"] = match[2]
        for figure, limit in match[2].items():
            value = row.get(figure)
            if value is None:
                continue  # no global load/store in this entry
            if (value > limit) if LIMIT_IS_MAX[figure] else (value < limit):
                relation = ">" if LIMIT_IS_MAX[figure] else "<"
                failures.append(f"{row['kernel']} ({row['entry']}): {figure} {value} {relation} budget {limit:g}"
                                f" ({path}: {match[0]})")
    return failures


def table(rows):
    header = ("kernel", "regs", "spill B", "SASS", "elem", "SASS/elem", "BAR", "BAR/loop",
              "global and shared memory (bytes x count)")
    lines = [header]
    for r in rows:
        memory = ", ".join(f"{k} x {v}" for k, v in r["memory"].items())
        lines.append((f"{r['kernel']} [..{r['entry'][-24:]}]", str(r["registers"]), str(r["spill_bytes"]),
                      str(r["instructions"]), f"{r.get('elements', '?')}",
                      f"{r.get('instructions_per_element', '?')}", str(r["barriers"]), str(r["loop_barriers"]),
                      memory))
    widths = [max(len(l[i]) for l in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)) + "  " + l[-1] for l in lines)


def write_budgets(rows, family):
    """Today's figures as budget lines, one per kernel (its heaviest entry's elements expression: P-free)."""
    out = []
    for kernel in sorted({r["kernel"] for r in rows if r["family"] == family}):
        entries = [r for r in rows if r["kernel"] == kernel]
        name = kernel[len(f"kpool_{family}_"):]
        limits = [f"instructions_per_element <= {max(r['instructions_per_element'] for r in entries):g}"]
        loads = [r["load_bytes"] for r in entries if r["load_bytes"]]
        stores = [r["store_bytes"] for r in entries if r["store_bytes"]]
        if loads:
            limits.append(f"load_bytes >= {min(loads):g}")
        if stores:
            limits.append(f"store_bytes >= {min(stores):g}")
        limits.append(f"spill_bytes <= {max(r['spill_bytes'] or 0 for r in entries)}")
        limits.append(f"barriers <= {max(r['barriers'] for r in entries)}")
        limits.append(f"loop_barriers <= {max(r['loop_barriers'] for r in entries)}")
        out.append(f"{name} : elements {entries[0]['elements_expr']} : " + " : ".join(limits))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["report", "check", "budgets"])
    ap.add_argument("build_dir")
    ap.add_argument("--knobs-dir", required=True, help="the families' .knobs and .budgets (schedules/)")
    ap.add_argument("--family", action="append", help="a GPU family (default: every one with a .knobs file)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    families = args.family or sorted(os.path.basename(p)[: -len(".knobs")]
                                     for p in glob.glob(os.path.join(args.knobs_dir, "*.knobs")))
    rows = kernel_figures(args.build_dir, families)
    if not rows:
        sys.exit(f"{args.build_dir}: no CUDA kernels of {', '.join(families)} (no kpool_<family>_*.sass)")
    failures = apply_budgets(rows, args.knobs_dir)
    if args.command == "budgets":
        for r in rows:
            r["elements_expr"] = next((b[1] for b in parse_budgets(os.path.join(args.knobs_dir, f"{r['family']}.budgets"))
                                       if fnmatch.fnmatchcase(r["kernel"][len(f"kpool_{r['family']}_"):], b[0])), "1")
        print(write_budgets(rows, args.family[0]))
        return 0
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernels": rows, "failures": failures}, f, indent=1)
    if args.command == "check":
        if failures:
            print("\n".join(["", f"{len(failures)} kernel figures outside their budgets:"] + failures))
            return 1
        print(f"\nall {len(rows)} kernel entries within their budgets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
