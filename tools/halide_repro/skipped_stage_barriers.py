"""Halide 21 reproducer (no GPU needed): in a CUDA kernel with a serial loop
at the block level, every stage computed in that loop gets a block barrier
after it (src/FuseGPUThreadLoops.cpp, InjectThreadBarriers: one between
every two block-level statements, and one at the end of each iteration),
and the condition that skips a stage (skip_stages, which runs before the
fusion) sits inside those barriers. So an iteration whose stages are all
skipped still passes every barrier, and so do stages that share no memory
(registers only, the barrier mask 0).

Three stages (a, b, c: registers of each thread, no shared memory), each
computed per iteration of a serial loop over t at the block level, all
needed only where flags(t) != 0 (the output's RDom.where). The lowered
Stmt (compile_to_conceptual_stmt, what the device code is made from) has
per iteration: `if (c.used) a`, barrier, `if (c.used) b`, barrier,
`if (c.used) c`, barrier, the output's store under flags(t), barrier: four
barriers for an iteration that computes nothing, where none is needed (no
two stages share memory across threads) and, were it needed, one
condition around the run would do.

    .venv/bin/python tools/halide_repro/skipped_stage_barriers.py

prints the loop's statements and exits 0 when the placement reproduces.
(kpool works around it with a lowering pass of its own:
schedules/block_barriers.h.)
"""
import os
import re
import sys
import tempfile

import halide as hl

inp = hl.ImageParam(hl.Float(32), 3, "inp")  # (x, t, k)
flags = hl.ImageParam(hl.Int(32), 2, "flags")  # (t, k)
x, t, k = hl.Var("x"), hl.Var("t"), hl.Var("k")
a, b, c, out = hl.Func("a"), hl.Func("b"), hl.Func("c"), hl.Func("out")
a[x, t, k] = inp[x, t, k] * 2.0
b[x, t, k] = a[x, t, k] + 1.0
c[x, t, k] = b[x, t, k] * 3.0
out[x, t, k] = hl.f32(0)
r = hl.RDom([(0, 32), (0, inp.dim(1).extent())], "r")
r.where(flags[r.y, k] != 0)
out[r.x, r.y, k] = c[r.x, r.y, k]

out.gpu_single_thread()
out.update(0).reorder(r.x, r.y, k).gpu_blocks(k).gpu_threads(r.x)
for f in (a, b, c):
    f.compute_at(out, r.y).store_in(hl.MemoryType.Register).gpu_threads(x)

target = hl.Target("host-cuda-cuda_capability_80")
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "skipped_stage_barriers.stmt")
    hl.Pipeline(out).compile_to_conceptual_stmt(path, [inp, flags], hl.StmtOutputFormat.Text, target)
    with open(path) as f:
        text = f.read()

# The serial loop over r.y and its statements at its own level.
start = text.index("for (out.s1.r$y")
indent = len(text[: start].rsplit("\n", 1)[1])
body = []
for line in text[start:].splitlines()[1:]:
    if len(line) - len(line.lstrip()) <= indent:
        break
    body.append(line)
print("\n".join(body))
top = [l.strip() for l in body if len(l) - len(l.lstrip()) == indent + 1]
barriers = [l for l in top if l.startswith("gpu_thread_barrier")]
guarded = [l for l in top if re.match(r"if \(c\.used\)", l)]
print(f"\n{len(barriers)} barriers at the loop's level; {len(guarded)} stages under `if (c.used)` between them")
reproduced = len(barriers) >= 3 and len(guarded) >= 2
print("reproduced" if reproduced else "not reproduced: the barriers sit elsewhere in this Halide")
sys.exit(0 if reproduced else 1)
