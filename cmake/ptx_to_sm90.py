"""Raise the PTX of a Halide CUDA kernel object to sm_90 and check it with ptxas.

    ptx_to_sm90.py OBJECT PTXAS

Halide 21 names no CUDA capability above 8.6, so the sm90 family's kernels
are generated for sm_80; their sm_90 instructions (cvt.rn.satfinite.e4m3x2.f32)
need `.version 7.8` and `.target sm_90`. The two header lines have the same
length as Halide's `.version 7.0` / `.target sm_80`, so the PTX text embedded
in the object is rewritten in place. Every embedded module is then assembled
with `ptxas -arch=sm_90`, so a kernel the driver would refuse fails the build.
"""
import os
import subprocess
import sys
import tempfile

SM80 = b".version 7.0\n.target sm_80\n"
SM90 = b".version 7.8\n.target sm_90\n"


def main(obj_path, ptxas):
    with open(obj_path, "rb") as f:
        data = f.read()
    if SM80 not in data and SM90 not in data:
        sys.exit(f"{obj_path}: no embedded PTX with Halide's sm_80 header")
    data = data.replace(SM80, SM90)
    tmp = obj_path + ".sm90"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, obj_path)

    start = data.find(SM90)
    while start >= 0:
        end = data.find(b"\0", start)
        with tempfile.NamedTemporaryFile(suffix=".ptx") as ptx:
            ptx.write(data[start:end])
            ptx.flush()
            result = subprocess.run([ptxas, "-arch=sm_90", ptx.name, "-o", os.devnull],
                                    capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"{obj_path}: ptxas -arch=sm_90 failed:\n{result.stderr}")
        start = data.find(SM90, end)


if __name__ == "__main__":
    main(*sys.argv[1:])
