"""sdk.torch_extension (registered in CMakeLists.txt): an engine's C++
extension built against the installed SDK and torch's CMake package, then
its tests (examples/torch_extension/test_extension.py) on CPU tensors.

  1. cmake --install BUILD --prefix WORK/prefix (the SDK, as for
     sdk.install_and_consume);
  2. examples/torch_extension configured with nothing but that prefix and
     torch.utils.cmake_prefix_path to search, built (the build's compilers
     and generator);
  3. its pytest, the built library named by $KPOOL_ENGINE_OPS.

Exits 77 (ctest: skipped) when torch does not import.
"""

import argparse
import os
import subprocess
import sys

SKIPPED = 77


def run(what, *command, **kwargs):
    print(f"[torch_extension] {what}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True, **kwargs)


def main():
    p = argparse.ArgumentParser()
    for name in ("build-dir", "source-dir", "work-dir", "cmake", "generator", "make-program", "cxx-compiler",
                 "build-type", "library"):
        p.add_argument("--" + name, required=True)
    a = p.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"[torch_extension] skipped: torch does not import ({e})")
        return SKIPPED
    prefix, ext_build = os.path.join(a.work_dir, "prefix"), os.path.join(a.work_dir, "build")
    subprocess.run(["rm", "-rf", a.work_dir], check=True)
    run("install the SDK", a.cmake, "--install", a.build_dir, "--prefix", prefix)
    run("configure the extension", a.cmake, "-S", os.path.join(a.source_dir, "examples", "torch_extension"),
        "-B", ext_build, "-G", a.generator, f"-DCMAKE_MAKE_PROGRAM={a.make_program}",
        f"-DCMAKE_CXX_COMPILER={a.cxx_compiler}", f"-DCMAKE_BUILD_TYPE={a.build_type}",
        f"-DCMAKE_PREFIX_PATH={prefix};{torch.utils.cmake_prefix_path}",
        "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", "-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF")
    with open(os.path.join(ext_build, "CMakeCache.txt")) as f:
        kpool_dir = next(line.split("=", 1)[1].strip() for line in f if line.startswith("kpool_DIR:"))
    if not os.path.realpath(kpool_dir).startswith(os.path.realpath(prefix) + os.sep):
        print(f"[torch_extension] the extension found kpool in {kpool_dir}, not in {prefix}")
        return 1
    run("build the extension", a.cmake, "--build", ext_build)
    env = dict(os.environ, KPOOL_ENGINE_OPS=os.path.join(ext_build, "libkpool_engine_ops.so"),
               KPOOL_LIBRARY=a.library)
    run("test it", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        os.path.join(a.source_dir, "examples", "torch_extension", "test_extension.py"), env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
