"""Halide 21 reproducer (no GPU needed): Anderson2021 bounds a footprint by a
scalar parameter's *estimate* (`bound_extent`), and Halide checks that bound
inside the CUDA kernel with `trap`, so a call with a larger value is an
"unspecified launch failure" that loses the context, not an error.

`seeded(x)` reads `slots(x)` and `slots(x + k)`: the footprint per x is k + 1
values. With k estimated at 4 the schedule says
`constant_exterior.in(seeded)...bound_extent(_0, 5)`, and the PTX holds
`trap` under `k <= 4`. This is kpool's autoscheduled seed kernel in small
(pool_size for k; the H100 tuning run's candidate 38 faulted at P = 16).

    .venv/bin/python tools/tune/halide_repro/anderson2021_bound_extent_trap.py
"""
import os
import sys

import halide as hl

hl.load_plugin(os.path.join(hl.install_dir(), "lib64", "libautoschedule_anderson2021.so"))
slots = hl.ImageParam(hl.Int(32), 1, "slots")
k = hl.Param(hl.Int(32), "k")
x = hl.Var("x")
clamped = hl.BoundaryConditions.constant_exterior(slots, -1)
seeded = hl.Func("seeded")
seeded[x] = hl.select(clamped[x] >= 0, clamped[x] != clamped[x + k], False)
out = hl.Func("out")
out[x] = hl.u8(0)
r = hl.RDom([(0, slots.dim(0).extent())])
r.where(seeded[r.x])
out[hl.clamp(clamped[r.x], 0, 1023)] = hl.u8(1)
slots.set_estimates([(0, 16384)])
k.set_estimate(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
out.set_estimates([(0, 1024)])
pipeline = hl.Pipeline(out)
target = hl.Target("x86-64-linux-cuda-cuda_capability_80")
schedule = pipeline.apply_autoscheduler(target, hl.AutoschedulerParams("Anderson2021")).schedule_source
print("\n".join(line for line in schedule.splitlines() if "bound_extent" in line or ".in(" in line))
stmt = "anderson2021_bound_extent_trap.stmt"
pipeline.compile_to({hl.OutputFileType.stmt: stmt}, [slots, k], "repro", target)
traps = open(stmt, errors="replace").read().count("trap;")
os.remove(stmt)
print(f"trap instructions in the kernels: {traps}")
