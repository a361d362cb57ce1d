"""The one-kernel decode's PTX: its power-of-two specialization and coherent loads.

    check_decode_ptx.py OBJECT...

Each OBJECT is a CUDA decode_update kernel library's object (the PTX is
embedded as text). Its module must hold two kernels: the one Halide emits
first runs where the ring and the cache page are both powers of two (the
schedule's `specialize(pow2_ring_and_page)`) and must divide by shifts only:
no integer div/rem; the other, the general one, divides (so this check
reads the right text and can fail). Neither reads through the non-coherent
path (`ld.global.nc`): the kernel writes the ring it reads
(cmake/ptx_coherent_loads.py). A warp-per-request kernel of the reference
arithmetic whose slot folds are unrolled whole (`by_request_p<P>_triton`,
P <= 16: the engines' kernels) loads a token's stash row, both halves (two
vector loads), in its token loop's first block, before any branch: beside
the token's indices, ahead of the stash's condition
(schedules/unconditional_producers.h). (Where the folds run in groups, or
in the exact arithmetic, LLVM sinks the half that only the stash uses back
into the stash's branch: there the completion's load of the token's own
row is not the same instruction as the stash's.)
"""
import re
import sys

from embedded_ptx import object_kernels

DIVISION = re.compile(rb"^\s*(div|rem)\.(u|s)(32|64)\s", re.M)
NON_COHERENT = re.compile(rb"ld\.global\.nc")
TOKEN_LOOP = re.compile(rb'^\$L__BB\d+_\d+:\s+// %"\d+_for_tail_out\.s1\.fused\.write\$y"$', re.M)
ROW_LOAD = re.compile(rb"ld\.global\.v2\.")
ROW_AHEAD = re.compile(r"by_request_p(1|2|4|8|16)_triton")


def row_loads_before_branch(ptx):
    """Vector loads in the token loop's first block before its first branch (None: no token loop)."""
    loop = TOKEN_LOOP.search(ptx)
    if not loop:
        return None
    body = ptx[loop.end():]
    return len(ROW_LOAD.findall(body[:body.find(b"bra")]))


def check(path):
    found = object_kernels(path)
    if len(found) != 2:
        return [f"{path}: {len(found)} kernels, expected 2 (power-of-two and general)"]
    (pow2_name, pow2), (general_name, general) = found
    errors = []
    divisions = [m.group(0).strip().decode() for m in DIVISION.finditer(pow2)]
    if divisions:
        errors.append(f"{path}: {pow2_name} (power-of-two ring and page) still divides: {divisions}")
    for name, ptx in found:
        if NON_COHERENT.search(ptx):
            errors.append(f"{path}: {name} reads through ld.global.nc")
    if ROW_AHEAD.search(path):
        for name, ptx in found:
            loads = row_loads_before_branch(ptx)
            if loads is None or loads < 2:
                errors.append(f"{path}: {name}: {loads} stash-row loads before the token loop's first branch, "
                              "expected 2 (both halves, ahead of the stash's condition)")
    if not DIVISION.search(general):
        errors.append(f"{path}: {general_name} (general ring) has no division: not the kernels expected")
    return errors


def main(paths):
    if not paths:
        sys.exit("usage: check_decode_ptx.py OBJECT...")
    errors = [e for p in paths for e in check(p)]
    for e in errors:
        print(e)
    if errors:
        sys.exit(1)
    print(f"{len(paths)} decode kernels: coherent loads; the power-of-two kernel divides by shifts only; "
          "a warp per request loads a token's row beside its indices")


if __name__ == "__main__":
    main(sys.argv[1:])
