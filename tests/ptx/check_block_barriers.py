"""The block barriers of a CUDA kernel's serial loops, read from its lowered
Stmt (the generator's conceptual_stmt, after the schedule's lowering passes:
schedules/block_barriers.h): in every serial loop with barriers, a barrier
at the loop's own level only as the iteration's last statement, and every
other barrier inside a condition that is uniform over the block (it names
no thread variable, directly or through a let), so a token whose stages
are skipped passes only that one.

    check_block_barriers.py GENERATOR OUT_DIR NAME [--knob NAME:VALUE]
                            [--loop-barriers N] -- GENERATOR_ARGS...

runs GENERATOR -e conceptual_stmt for the variant NAME into OUT_DIR (with
--knob: that knob's value in its knobs= argument replaced) and checks it
(exit 1 naming the loop and the barrier otherwise); with --loop-barriers,
also that no serial loop holds more than N barriers in all.
"""
import os
import re
import subprocess
import sys

BARRIER = "gpu_thread_barrier("


class Node:
    def __init__(self, header, parent=None):
        self.header, self.parent, self.children = header, parent, []


def parse(text):
    """The Stmt's statements as a tree of brace blocks: each child a line or a Node."""
    root = node = Node("")
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line == "}":
            node = node.parent
        elif line.startswith("} else"):
            node = node.parent
            child = Node(line, node)
            node.children.append(child)
            node = child
        elif line.endswith("{"):
            child = Node(line, node)
            node.children.append(child)
            node = child
        else:
            node.children.append(line)
    return root


def walk(node):
    yield node
    for c in node.children:
        if isinstance(c, Node):
            yield from walk(c)


def lines(node):
    for c in node.children:
        if isinstance(c, Node):
            yield c.header
            yield from lines(c)
        else:
            yield c


def varying_names(text):
    """Names of lets whose value depends on a thread variable (to a fixed point)."""
    lets = re.findall(r"^\s*let (\S+) = (.*)$", text, re.M)
    varying = set()
    changed = True
    while changed:
        changed = False
        for name, value in lets:
            if name not in varying and mentions_varying(value, varying):
                varying.add(name)
                changed = True
    return varying


def mentions_varying(expr, varying):
    if "thread_id" in expr:
        return True
    return any(re.search(r"(?<![\w.$])" + re.escape(v) + r"(?![\w.$])", expr) for v in varying)


def check(text, most_loop_barriers=None):
    """The failures of the Stmt `text`, and how many serial loops with barriers it has."""
    varying = varying_names(text)
    failures, loops = [], 0
    for node in walk(parse(text)):
        if not node.header.startswith("for ("):
            continue
        top_barriers = [i for i, c in enumerate(node.children) if isinstance(c, str) and c.startswith(BARRIER)]
        nested = [c for c in node.children if isinstance(c, Node) and any(l.startswith(BARRIER) for l in lines(c))]
        if not top_barriers and not nested:
            continue
        loops += 1
        loop = node.header[:80]
        total = sum(1 for l in lines(node) if l.startswith(BARRIER))
        if most_loop_barriers is not None and total > most_loop_barriers:
            failures.append(f"{loop}: {total} barriers in the loop, more than {most_loop_barriers}")
        if top_barriers and top_barriers != [len(node.children) - 1]:
            failures.append(f"{loop}: {len(top_barriers)} barriers at the loop's level (only the iteration's "
                            f"last statement may be one)")
        for c in nested:
            m = re.match(r"if \((.*)\) \{$", c.header)
            if not m:
                failures.append(f"{loop}: a barrier in a statement that is not a condition: {c.header[:80]}")
            elif mentions_varying(m.group(1), varying):
                failures.append(f"{loop}: a barrier under a condition that varies over the block: "
                                f"{c.header[:120]}")
    return failures, loops


def main():
    if "--" not in sys.argv[4:] or len(sys.argv) < 5:
        sys.exit(__doc__)
    split = sys.argv.index("--")
    generator, out_dir, name = sys.argv[1:4]
    options, generator_args = sys.argv[4:split], sys.argv[split + 1:]
    most_loop_barriers = None
    while options:
        option, value = options[0], options[1] if len(options) > 1 else sys.exit(__doc__)
        options = options[2:]
        if option == "--knob":
            knob = value.split(":")[0]
            pattern = r"((?:^knobs=|,)" + re.escape(knob) + r"):-?\d+"
            if not any(re.search(pattern, a) for a in generator_args):
                sys.exit(f"--knob {value}: no {knob} in the generator's knobs= argument")
            generator_args = [re.sub(pattern, r"\g<1>:" + value.split(":")[1], a) for a in generator_args]
        elif option == "--loop-barriers":
            most_loop_barriers = int(value)
        else:
            sys.exit(__doc__)
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([generator, "-n", name, "-f", name, "-e", "conceptual_stmt", "-o", out_dir] + generator_args,
                   check=True)
    with open(os.path.join(out_dir, f"{name}.conceptual.stmt"), errors="replace") as f:
        text = f.read()
    failures, loops = check(text, most_loop_barriers)
    if loops == 0:
        failures.append("no serial loop with a barrier: not the kernel this test reads")
    if failures:
        print("\n".join(f"{name}: {f}" for f in failures))
        return 1
    print(f"{name}: {loops} serial loops with barriers, each passed by a skipped token once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
