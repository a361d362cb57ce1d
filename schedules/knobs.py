#!/usr/bin/env python3
"""The one reader of a family's schedule parameters ("knobs"),
schedules/<family>.knobs, shared by the build (cmake/KpoolKernels.cmake runs
it at configure time), the tuner (tools/tune imports it) and
tools/device_code.py.

A file is lines of

    name = value : legal values      a knob (integers; a schedule reads it
                                     by name into a typed field of its plan:
                                     CpuPlan in schedules/cpu.cpp, CudaPlan
                                     in schedules/cuda/plan.h)
    require <expression>             a Python expression over the knobs
                                     (`fwht.run <= fwht.values`) that every
                                     build's values must satisfy
    base FILE                        (first) every knob, legal value and
                                     require of FILE (in the same folder:
                                     cuda.base, what every CUDA family
                                     shares), which the lines below override
    exact_only <name> ...            knobs that shape only the exact
                                     arithmetic's kernels (the tuner times
                                     them in it, a unit of their own)
    name = value                     an override of a base's knob, within
                                     its legal values, with its reason: a
                                     comment on the line or right above it

and comments (#). A file that breaks any rule (a malformed line, a knob
named twice, a value outside its legal values, an override of no base knob
or without a reason, a require that does not hold) is a KnobsError naming
the file, the line and the values.

    python3 schedules/knobs.py wire FILE    prints the values as the
                                            generators' knobs=name:value,...
    python3 schedules/knobs.py files FILE   prints FILE and the bases it reads
"""

from __future__ import annotations

import os
import re
import sys

KNOB_LINE = re.compile(r"^([a-z0-9_.]+)\s*=\s*(-?\d+)\s*:\s*([-\d ]+?)\s*$")
OVERRIDE_LINE = re.compile(r"^([a-z0-9_.]+)\s*=\s*(-?\d+)\s*$")
TUNED_REASON = "tuned: kpool_tune.py apply (tools/tune), the fastest measured"


def reason_above(raws, k):
    """Whether a comment line stands above line k (0-based) and the plain
    override lines from it up: one reason for a run of overrides (as
    write_values writes a tuner's winners)."""
    while k >= 0 and OVERRIDE_LINE.match(raws[k].strip()):
        k -= 1
    return k >= 0 and raws[k].strip().startswith("#")
KNOB_NAME = re.compile(r"\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\b")


class KnobsError(ValueError):
    pass


class Knobs:
    """A knobs file's values {name: int}, legal values {name: [int]} and
    require expressions (with their files and line numbers), its base's
    included; `overrides` names the knobs the file itself sets over its base."""

    def __init__(self, path):
        self.path = str(path)
        self.values, self.legal, self.requires = {}, {}, []
        self.base, self.overrides, self.exact_only = None, {}, set()
        with open(self.path) as f:
            raws = f.readlines()
        for number, raw in enumerate(raws, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = KNOB_LINE.match(line)
            o = OVERRIDE_LINE.match(line)
            where = f"{self.path}:{number}"
            if line.startswith("base "):
                if self.base or self.values:
                    raise KnobsError(f"{where}: `base` comes first, once")
                self.base = Knobs(os.path.join(os.path.dirname(self.path), line[len("base "):].strip()))
                self.values, self.legal = dict(self.base.values), dict(self.base.legal)
                self.requires = list(self.base.requires)
                self.exact_only = set(self.base.exact_only)
            elif line.startswith("exact_only "):
                self.exact_only |= set(line.split()[1:])
            elif line.startswith("require "):
                self.requires.append((where, line[len("require "):].strip()))
            elif o:
                name, value = o[1], int(o[2])
                if not self.base or name not in self.base.values:
                    raise KnobsError(f"{where}: {name} = {value} overrides no knob of a base (a knob of its own "
                                     f"is \"name = value : legal values\")")
                if name in self.overrides:
                    raise KnobsError(f"{where}: {name} given twice")
                if not ("#" in raw or reason_above(raws, number - 2)):
                    raise KnobsError(f"{where}: the override {name} = {value} says no reason (a comment on "
                                     f"its line, or right above it or above its run of overrides)")
                if value not in self.legal[name]:
                    raise KnobsError(f"{where}: {name} = {value} is not among its legal values "
                                     f"({' '.join(map(str, self.legal[name]))}, {self.base.path})")
                self.values[name] = self.overrides[name] = value
            elif not m:
                raise KnobsError(f"{where}: not \"name = value : legal values\", \"name = value\" nor "
                                 f"\"require <expression>\": {line}")
            elif m[1] in self.values:
                raise KnobsError(f"{where}: {m[1]} given twice" +
                                 (f" (the base has it: override it as \"{m[1]} = value\")" if self.base else ""))
            else:
                self.values[m[1]] = int(m[2])
                self.legal[m[1]] = [int(v) for v in m[3].split()]
                if self.values[m[1]] not in self.legal[m[1]]:
                    raise KnobsError(f"{where}: {m[1]} = {m[2]} is not among its legal values "
                                     f"({m[3]})")
        unknown = sorted(self.exact_only - set(self.values))
        if unknown:
            raise KnobsError(f"{self.path}: exact_only names no knob: {' '.join(unknown)}")
        self.check(self.values)

    def files(self):
        """This file and the bases it reads."""
        return [self.path] + (self.base.files() if self.base else [])

    def failed_requires(self, values):
        """The require lines that `values` (every knob of the file) break, as messages."""
        out = []
        for where, expression in self.requires:
            try:
                holds = evaluate(expression, values)
            except Exception as e:  # noqa: BLE001 - the line and the reason
                raise KnobsError(f"{where}: require {expression}: {type(e).__name__}: {e}") from e
            if not holds:
                named = ", ".join(f"{n} = {values[n]}" for n in dict.fromkeys(names_in(expression)) if n in values)
                of = "" if where.startswith(self.path + ":") else f" (in {self.path})"
                out.append(f"{where}: require {expression} does not hold for {named}{of}")
        return out

    def satisfies(self, values):
        return not self.failed_requires(values)

    def check(self, values):
        failed = self.failed_requires(values)
        if failed:
            raise KnobsError("\n".join(failed))


def names_in(expression):
    return [f"{a}.{b}" for a, b in KNOB_NAME.findall(expression)]


def evaluate(expression, values):
    """A require expression over the knobs (dotted names), without builtins."""
    env = {name.replace(".", "__"): v for name, v in values.items()}
    return bool(eval(KNOB_NAME.sub(r"\1__\2", expression), {"__builtins__": {}}, env))


def wire(values):
    """The values as the generators' knobs GeneratorParam: name:value,..."""
    return ",".join(f"{name}:{value}" for name, value in values.items())


def write_values(path, new_values, reason=TUNED_REASON):
    """Rewrites the values of the knobs in new_values, leaving every other
    line (comments, legal values, requires) and the column of the ':' as
    they are; a knob the file takes from its base unchanged gets an override
    line at the end, `reason` above it (a value equal to the base's needs
    none). The result is read back: a value that breaks the file's rules is
    a KnobsError and the file is left as it was."""
    with open(path) as f:
        lines = f.readlines()
    knobs = Knobs(path)
    out, written = [], set()
    for line in lines:
        code = line.split("#", 1)[0].strip()
        m = KNOB_LINE.match(code) or OVERRIDE_LINE.match(code)
        if m and m[1] in new_values:
            head = line[:line.index("=") + 1]
            if ":" in code:
                width = line.index(":") - len(head) - 1
                line = f"{head} {str(new_values[m[1]]).ljust(width)}{line[line.index(':'):]}"
            else:
                tail = line[line.index("#"):] if "#" in line else "\n"
                line = f"{head} {new_values[m[1]]}" + (f"  {tail}" if "#" in line else tail)
            written.add(m[1])
        out.append(line)
    added = [n for n in new_values if n not in written and knobs.base and new_values[n] != knobs.base.values.get(n)]
    if added:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(f"# {reason}\n")
        out += [f"{n} = {new_values[n]}\n" for n in added]
    with open(path, "w") as f:
        f.writelines(out)
    try:
        Knobs(path)
    except KnobsError:
        with open(path, "w") as f:
            f.writelines(lines)
        raise


def main(argv):
    if len(argv) != 3 or argv[1] not in ("wire", "files"):
        sys.exit(__doc__)
    try:
        knobs = Knobs(argv[2])
        print(wire(knobs.values) if argv[1] == "wire" else ";".join(knobs.files()))
    except (KnobsError, OSError) as e:
        sys.exit(f"schedule parameters: {e}")


if __name__ == "__main__":
    main(sys.argv)
