"""Every specialization a compress schedule promises is in its CUDA device code.

    ptx_specializations.py BUILD_DIR FAMILY

Each compress kernel object of the family (kpool_<family>_compress_*.o)
embeds its PTX. Its CUDA schedule specializes on round_scale (schedules/
cuda.cpp, specialize_compress): three kernels (aligned rows with and
without round_scale, any rows), or two in a words object (kpool_<family>_
compress_to_*_words_*: rows always aligned). The kernel under round_scale
multiplies each code's quotient by the scale's exact reciprocal,
so it keeps only the pool's divisions (one per element of a lane), half of
what its siblings (the pool's and the quotient's) compute. A kernel that
still divided and selected per code would have as many as they do. Fails
naming the object and the counts.
"""
import glob
import os
import re
import sys

DIVISION = re.compile(rb"\bdiv\.(?:full|rn|approx)(?:\.ftz)?\.f32\b")
ENTRY = re.compile(rb"\.entry\s+(\w+)")


def modules(data):
    """The PTX modules embedded in an object: from `.version` to the NUL."""
    start = data.find(b".version ")
    while start >= 0:
        end = data.find(b"\0", start)
        end = len(data) if end < 0 else end
        yield data[start:end]
        start = data.find(b".version ", end)


def kernels(ptx):
    """(name, text) of each kernel entry of a PTX module."""
    found = list(ENTRY.finditer(ptx))
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(ptx)
        yield m.group(1).decode(), ptx[m.start():end]


def check(obj_path):
    with open(obj_path, "rb") as f:
        data = f.read()
    divisions = {name: len(DIVISION.findall(text)) for ptx in modules(data) for name, text in kernels(ptx)}
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
    for failure in failures:
        print(failure)
    print(f"{len(objects) - len(failures)} of {len(objects)} compress objects specialize on round_scale")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
