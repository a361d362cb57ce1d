"""Every specialization a compress schedule promises is in its CUDA device code,
and none of them loses the exact arithmetic's rounding barriers.

    check_compress_ptx.py BUILD_DIR FAMILY

Each compress kernel object of the family (kpool_<family>_compress_*.o)
embeds its PTX. Its CUDA schedule specializes on round_scale (schedules/
cuda/compress.cpp, specialize_compress): three kernels (aligned rows with and
without round_scale, any rows), or two in a words object (kpool_<family>_
compress_to_*_words_*: rows always aligned). The kernel under round_scale
multiplies each code's quotient by the scale's exact reciprocal,
so it keeps only the pool's divisions (one per element of a lane), half of
what its siblings (the pool's and the quotient's) compute. A kernel that
still divided and selected per code would have as many as they do.

In the exact arithmetic (objects without `_triton`) every k*p product is
rounded on its own: a `mul.f32` whose bits are ORed with an opaque zero
(generators/kpool_numerics.h, RoundingBarrier) before it joins the sum, so
no compiler contracts it into an fma. Each of the three kernels must keep
the same number (> 0) of such barriers, and no `mul.f32` result may feed an
`add.f32`/`sub.f32` directly (ptxas may fuse a pair without `.rn`). A
specialization whose facts let the simplifier prove the opaque zero is 0
drops them and the kernel's codes differ from the CPU's by 1. Fails naming
the object and the counts.
"""
import glob
import os
import re
import sys

from embedded_ptx import object_kernels

DIVISION = re.compile(rb"\bdiv\.(?:full|rn|approx)(?:\.ftz)?\.f32\b")
PRODUCT = re.compile(rb"^\s*mul\.f32\s+(%r\d+),", re.M)
REGISTER_OR = re.compile(rb"^\s*or\.b32\s+(%r\d+),\s*%r\d+,\s*%r\d+;", re.M)
SUM = re.compile(rb"^\s*(?:add|sub)\.f32\s+%r\d+,\s*([^;]*);", re.M)
REG = re.compile(rb"%r\d+")


def barrier_counts(kernel):
    """(products ORed into a sum, products summed without a barrier) of a kernel."""
    products = set(PRODUCT.findall(kernel))
    ored = set(REGISTER_OR.findall(kernel))
    summed = [r for operands in SUM.findall(kernel) for r in REG.findall(operands)]
    return sum(r in ored for r in summed), sum(r in products for r in summed)


def check_exact(obj_path):
    counts = {name: barrier_counts(text) for name, text in object_kernels(obj_path)}
    barriers = {n for n, _ in counts.values()}
    if not counts or len(barriers) != 1 or 0 in barriers or any(bare for _, bare in counts.values()):
        return (f"{obj_path}: (rounding barriers into a sum, bare products into a sum) per kernel {counts}: "
                "every kernel should round each product on its own, the same number of times")
    return None


def check(obj_path):
    divisions = {name: len(DIVISION.findall(text)) for name, text in object_kernels(obj_path)}
    expected = 2 if "_words_" in os.path.basename(obj_path) else 3
    if len(divisions) != expected:
        return f"{obj_path}: {len(divisions)} kernels, expected {expected} (with and without round_scale, and any rows " \
               "outside the words kernels)"
    fewest, most = min(divisions.values()), max(divisions.values())
    if fewest == 0 or 2 * fewest != most or sorted(divisions.values()).count(fewest) != 1:
        return f"{obj_path}: divisions per kernel {divisions}: the round_scale kernel should keep half"
    return None


def main(build_dir, family):
    objects = sorted(glob.glob(os.path.join(build_dir, f"kpool_{family}_compress_*.o")))
    if not objects:
        sys.exit(f"no kpool_{family}_compress_*.o in {build_dir}")
    failures = [f for f in map(check, objects) if f]
    exact = [o for o in objects if "_triton" not in os.path.basename(o)]  # (_triton, _triton_i64)
    exact_failures = [f for f in map(check_exact, exact) if f]
    for failure in failures + exact_failures:
        print(failure)
    print(f"{len(objects) - len(failures)} of {len(objects)} compress objects specialize on round_scale")
    print(f"{len(exact) - len(exact_failures)} of {len(exact)} exact compress objects keep their rounding barriers")
    sys.exit(1 if failures or exact_failures else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
