"""ops.add_op (registered in tests/CMakeLists.txt): an op is its file of the
op table, its generator and its runtime op. This configures a build of this
source tree that adds tests/ops/toy (out = x * factor, CPU) by those three
files alone, reusing this build's generator for the library's own kernels
and compiling the toy's kernel only, then calls it through the C API (a C
program against the generated declarations and libkpool.so, which exports
it) and through the Python package (its ctypes function from the table,
and with torch its torch.ops.kpool operator).

    add_op.py SOURCE_DIR KPOOL_BUILD_DIR WORK_DIR CMAKE GENERATOR MAKE_PROGRAM C_COMPILER PYTHON
"""

import os
import shutil
import subprocess
import sys
import textwrap

source, kpool_build, work, cmake, generator, make_program, cc, python = sys.argv[1:9]
build = os.path.join(work, "build")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(what, *command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{what} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    print(f"-- {what}: done", flush=True)
    return done.stdout


run("configure a build with the toy op's table", cmake, "-S", source, "-B", build, "-G", generator,
    f"-DCMAKE_MAKE_PROGRAM={make_program}", f"-DPython3_EXECUTABLE={python}", "-DKPOOL_BUILD_TESTS=OFF",
    "-DKPOOL_CUDA=OFF", f"-DKPOOL_OP_TABLE_DIRS={source}/ops;{source}/tests/ops/toy", "-DKPOOL_KERNEL_OPS=toy_scale",
    f"-Dkpool-halide_generators_ROOT={kpool_build}/cmake")
run("build libkpool.so", cmake, "--build", build, "--target", "kpool_shared")
library = os.path.join(build, "libkpool.so")

# The C API: the entry point the table generated, its arguments checked.
program = os.path.join(work, "call_toy_scale.c")
with open(program, "w") as f:
    f.write(textwrap.dedent("""\
        #include <stdio.h>
        #include <string.h>
        #include "kpool_entry_points.h"
        int main(void) {
            int32_t x[6] = {1, -2, 3, 4, 5, -6}, out[6] = {0};
            int64_t shape[2] = {2, 3};
            kpool_tensor tx = kpool_tensor_contiguous(x, KPOOL_DTYPE_INT32, 2, shape);
            kpool_tensor tout = kpool_tensor_contiguous(out, KPOOL_DTYPE_INT32, 2, shape);
            kpool_status status;
            if (kpool_toy_scale(&tx, &tout, 3, NULL, &status) != KPOOL_OK) {
                printf("toy_scale failed: %s\\n", status.message);
                return 1;
            }
            for (int i = 0; i < 6; i++) {
                if (out[i] != 3 * x[i]) {
                    printf("out[%d] = %d, expected %d\\n", i, out[i], 3 * x[i]);
                    return 1;
                }
            }
            tx.dtype = KPOOL_DTYPE_INT64;
            if (kpool_toy_scale(&tx, &tout, 3, NULL, &status) != KPOOL_ERROR_INVALID_ARGUMENT ||
                strstr(status.message, "x") == NULL) {
                printf("an int64 x was not refused: %s\\n", status.message);
                return 1;
            }
            printf("C: %s\\n", status.message);
            return 0;
        }
        """))
executable = os.path.join(work, "call_toy_scale")
run("compile the C caller", cc, "-std=c11", "-I", os.path.join(source, "include"), "-I", build, program, "-o",
    executable, library, f"-Wl,-rpath,{build}")
print(run("call kpool_toy_scale from C", executable).strip())
exported = run("nm -D libkpool.so", "nm", "-D", "--defined-only", library)
if " kpool_toy_scale@@KPOOL_0.1" not in exported:
    sys.exit("libkpool.so does not export kpool_toy_scale")

# The Python package: the entry point as a ctypes function, from the table
# beside the library.
code = textwrap.dedent("""\
    import numpy as np
    from kpool import _calls, _lib
    x = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    out = np.zeros_like(x)
    _calls.ctypes_calls.toy_scale(x, out, 5)
    assert np.array_equal(out, 5 * x), out
    try:
        _calls.ctypes_calls.toy_scale(x.astype(np.int64), out, 5)
    except _lib.KpoolTypeError as e:
        print("Python:", e)
    else:
        raise AssertionError("an int64 x was not refused")
    try:
        import torch
    except ImportError:
        print("torch: not installed here, torch.ops.kpool.toy_scale not called")
    else:
        import kpool
        t = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4)
        result = torch.zeros_like(t)
        torch.ops.kpool.toy_scale(t, result, 7)
        assert torch.equal(result, 7 * t), result
        print("torch: torch.ops.kpool.toy_scale ran")
    """)
env = dict(os.environ, KPOOL_LIBRARY=library, PYTHONPATH=os.path.join(source, "python"))
print(run("call toy_scale from Python", python, "-c", code, env=env).strip())
print("-- toy_scale: added from its table file, generator and runtime op; called through C and Python")
