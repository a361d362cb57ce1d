"""Packs libkpool.so into the wheel: build_py copies it to kpool/lib/.

The library comes from $KPOOL_LIBRARY, else ../build/libkpool.so (the repo's
CMake build). If neither exists the build fails and says so; set
KPOOL_NO_LIBRARY=1 to install the Python code alone (then point
$KPOOL_LIBRARY at a libkpool.so at run time).
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def library_source():
    env = os.environ.get("KPOOL_LIBRARY")
    return env or os.path.normpath(os.path.join(HERE, "..", "build", "libkpool.so"))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        if os.environ.get("KPOOL_NO_LIBRARY") == "1":
            return
        src = library_source()
        if not os.path.isfile(src):
            raise SystemExit(
                f"kpool: {src} not found. Build the library first (cmake --build build) or set "
                f"KPOOL_LIBRARY=/path/to/libkpool.so; KPOOL_NO_LIBRARY=1 installs without it.")
        dst_dir = os.path.join(self.build_lib, "kpool", "lib")
        os.makedirs(dst_dir, exist_ok=True)
        shutil.copy2(src, os.path.join(dst_dir, "libkpool.so"))


cmdclass = {"build_py": BuildPyWithLibrary}

try:  # the wheel holds a native library: tag it for this platform, not "any"
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = os.environ.get("KPOOL_NO_LIBRARY") == "1"

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:
    pass

setup(cmdclass=cmdclass)
