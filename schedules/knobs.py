#!/usr/bin/env python3
"""The one reader of a family's schedule parameters ("knobs"),
schedules/<family>.knobs, shared by the build (cmake/KpoolKernels.cmake runs
it at configure time) and the tuner (tools/tune imports it).

A file is lines of

    name = value : legal values      a knob (integers; a schedule reads it
                                     by name into a typed field of its plan:
                                     CpuPlan in schedules/cpu.cpp, CudaPlan
                                     in schedules/cuda.cpp)
    require <expression>             a Python expression over the knobs
                                     (`fwht.run <= fwht.values`) that every
                                     build's values must satisfy

and comments (#). A file that breaks any rule (a malformed line, a knob
named twice, a value outside its legal values, a require that does not hold)
is a KnobsError naming the file, the line and the values.

    python3 schedules/knobs.py wire FILE    prints the values as the
                                            generators' knobs=name:value,...
"""

from __future__ import annotations

import re
import sys

KNOB_LINE = re.compile(r"^([a-z0-9_.]+)\s*=\s*(-?\d+)\s*:\s*([-\d ]+?)\s*$")
KNOB_NAME = re.compile(r"\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\b")


class KnobsError(ValueError):
    pass


class Knobs:
    """A knobs file's values {name: int}, legal values {name: [int]} and
    require expressions (with their line numbers)."""

    def __init__(self, path):
        self.path = str(path)
        self.values, self.legal, self.requires = {}, {}, []
        with open(self.path) as f:
            for number, raw in enumerate(f, 1):
                line = raw.split("#", 1)[0].strip()
                if not line:
                    continue
                m = KNOB_LINE.match(line)
                if line.startswith("require "):
                    self.requires.append((number, line[len("require "):].strip()))
                elif not m:
                    raise KnobsError(f"{self.path}:{number}: not \"name = value : legal values\" nor "
                                     f"\"require <expression>\": {line}")
                elif m[1] in self.values:
                    raise KnobsError(f"{self.path}:{number}: {m[1]} given twice")
                else:
                    self.values[m[1]] = int(m[2])
                    self.legal[m[1]] = [int(v) for v in m[3].split()]
                    if self.values[m[1]] not in self.legal[m[1]]:
                        raise KnobsError(f"{self.path}:{number}: {m[1]} = {m[2]} is not among its legal values "
                                         f"({m[3]})")
        self.check(self.values)

    def failed_requires(self, values):
        """The require lines that `values` (every knob of the file) break, as messages."""
        out = []
        for number, expression in self.requires:
            try:
                holds = evaluate(expression, values)
            except Exception as e:  # noqa: BLE001 - the line and the reason
                raise KnobsError(f"{self.path}:{number}: require {expression}: {type(e).__name__}: {e}") from e
            if not holds:
                named = ", ".join(f"{n} = {values[n]}" for n in dict.fromkeys(names_in(expression)) if n in values)
                out.append(f"{self.path}:{number}: require {expression} does not hold for {named}")
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


def write_values(path, new_values):
    """Rewrites the values of the knobs in new_values, leaving every other
    line (comments, legal values, requires) and the column of the ':' as
    they are. The result is read back: a value that breaks the file's rules
    is a KnobsError and the file is left as it was."""
    with open(path) as f:
        lines = f.readlines()
    out = []
    for line in lines:
        m = KNOB_LINE.match(line.split("#", 1)[0].strip())
        if m and m[1] in new_values:
            head = line[:line.index("=") + 1]
            width = line.index(":") - len(head) - 1
            line = f"{head} {str(new_values[m[1]]).ljust(width)}{line[line.index(':'):]}"
        out.append(line)
    with open(path, "w") as f:
        f.writelines(out)
    try:
        Knobs(path)
    except KnobsError:
        with open(path, "w") as f:
            f.writelines(lines)
        raise


def main(argv):
    if len(argv) != 3 or argv[1] != "wire":
        sys.exit(__doc__)
    try:
        print(wire(Knobs(argv[2]).values))
    except (KnobsError, OSError) as e:
        sys.exit(f"schedule parameters: {e}")


if __name__ == "__main__":
    main(sys.argv)
