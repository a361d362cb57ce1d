"""The one-kernel decode's PTX: its power-of-two specialization and coherent loads.

    check_decode_ptx.py OBJECT...

Each OBJECT is a CUDA decode_update kernel library's object (the PTX is
embedded as text). Its module must hold two kernels: the one Halide emits
first runs where the ring and the cache page are both powers of two (the
schedule's `specialize(pow2_ring_and_page)`) and must divide by shifts only:
no integer div/rem; the other, the general one, divides (so this check
reads the right text and can fail). Neither reads through the non-coherent
path (`ld.global.nc`): the kernel writes the ring it reads
(cmake/ptx_coherent_loads.py).
"""
import re
import sys

from embedded_ptx import object_kernels

DIVISION = re.compile(rb"^\s*(div|rem)\.(u|s)(32|64)\s", re.M)
NON_COHERENT = re.compile(rb"ld\.global\.nc")


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
    print(f"{len(paths)} decode kernels: coherent loads; the power-of-two kernel divides by shifts only")


if __name__ == "__main__":
    main(sys.argv[1:])
