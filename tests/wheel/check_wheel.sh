#!/usr/bin/env bash
# wheel.fresh_venv (registered in CMakeLists.txt): the wheel an engine
# installs, made by python/README.md's commands, and the Python tests run
# from it alone.
#
#   check_wheel.sh SOURCE WORK PYTHON GENERATOR_ROOT
#
# 1. `pip wheel SOURCE` (pyproject.toml through scikit-build-core, without
#    build isolation: PYTHON's Halide, CMake and Ninja), CPU kernels only
#    and the build's generator imported from GENERATOR_ROOT (the kpool
#    build's cmake/ package), so the test compiles kernels and runtime
#    but no generator: the wheel's layout, tags and links are those of the
#    full one, which differs only by its CUDA kernels inside libkpool.so.
# 2. `auditwheel repair` retags it manylinux (the oldest glibc its symbols
#    allow), `auditwheel show` accepts the result, and nothing was grafted
#    into it: libkpool.so needs no library outside glibc and libgcc_s (no
#    libstdc++), and no glibc symbol past 2.34.
# 3. A fresh venv gets the wheel (pip install --no-index --no-deps); its
#    test dependencies (numpy, pytest, torch when PYTHON has it) are
#    PYTHON's, through a .pth file, not a second download. The package's
#    CPU and torch-op tests run from a copy of python/tests, outside the
#    checkout, with no $KPOOL_LIBRARY: kpool, libkpool.so and the torch call
#    extension are the venv's (checked first). About 2 minutes on 2 idle
#    cores, most of it the CPU kernels' and the runtime's compile.
set -euo pipefail

source=$1 work=$2 python=$3 generator_root=$4
step() { printf '[wheel] %s\n' "$*"; }
fail() { printf '[wheel] FAILED: %s\n' "$*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
bin=$(dirname "$python")

step "pip wheel $source (CPU kernels, generator from $generator_root)"
"$python" -m pip wheel "$source" --no-deps --no-build-isolation --disable-pip-version-check -q -w "$work/dist" \
    -C "build-dir=$work/build" -C cmake.define.KPOOL_CUDA=OFF \
    -C "cmake.define.kpool-halide_generators_ROOT=$generator_root"
plain=$(ls "$work"/dist/kpool-*.whl)
[[ $(basename "$plain") == kpool-*-cp311-abi3-linux_x86_64.whl ]] || fail "pip wheel made $(basename "$plain")"

step "auditwheel repair $(basename "$plain")"
"$bin/auditwheel" repair "$plain" -w "$work/wheelhouse"
wheel=$(ls "$work"/wheelhouse/kpool-*.whl)
[[ $(basename "$wheel") =~ ^kpool-[0-9.]+-cp311-abi3-manylinux_2_[0-9]+_x86_64(\.manylinux_2_[0-9]+_x86_64)*\.whl$ ]] ||
    fail "auditwheel repair made $(basename "$wheel")"
show=$("$bin/auditwheel" show "$wheel")
printf '%s\n' "$show"
# (auditwheel wraps its sentences: compare them on one line)
tr -s ' \n' ' ' <<<"$show" | grep -q 'is consistent with the following platform tag: "manylinux_2_[0-9]*_x86_64"' ||
    fail "auditwheel show does not accept it"
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
grafted = [n for n in names if n.startswith("kpool.libs/")]
assert not grafted, f"auditwheel bundled libraries into the wheel: {grafted}"
libs = sorted(n for n in names if n.endswith(".so"))
assert libs == ["kpool/lib/_torch_calls.abi3.so", "kpool/lib/libkpool.so"], libs
assert "kpool/lib/kpool_ops.json" in names, "the wheel holds no op table beside libkpool.so"
tests = [n for n in names if "/tests/" in n]
assert not tests, f"the wheel holds tests: {tests}"
print(f"[wheel] {len(names)} files, shared objects {libs}, nothing grafted")
PY
needed=$(cd "$work" && "$python" -m zipfile -e "$wheel" unpacked >/dev/null && readelf -d unpacked/kpool/lib/libkpool.so | grep NEEDED)
printf '%s\n' "$needed"
newest=$(objdump -T "$work/unpacked/kpool/lib/libkpool.so" | grep -o 'GLIBC_2\.[0-9]*' | sort -V | tail -1)
[[ $(printf '%s\n' "$newest" GLIBC_2.34 | sort -V | tail -1) == GLIBC_2.34 ]] ||
    fail "libkpool.so needs $newest: the wheel's glibc floor is past 2.34"
grep -q 'libstdc++' <<<"$needed" && fail "libkpool.so links the C++ runtime dynamically"

step "a fresh venv with $(basename "$wheel")"
"$python" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
deps=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$deps" >"$venv_site/kpool_test_dependencies.pth"
"$venv_python" -m pip install --no-index --no-deps --disable-pip-version-check -q "$wheel"

# The tests as a checkout lays them out (they find the dump under tests/ and
# put python/ first on the path), with no package in python/.
tree="$work/tree"
mkdir -p "$tree/python"
cp -r "$source/python/tests" "$tree/python/tests"
ln -s "$source/tests" "$tree/tests"
ln -s "$source/bench" "$tree/bench"
cd "$tree"
unset KPOOL_LIBRARY PYTHONPATH
"$venv_python" - "$work/venv" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "python"))
import kpool
from kpool import _calls
venv = os.path.realpath(sys.argv[1])
where = {"kpool": kpool.__file__, "libkpool.so": kpool.library_path()}
try:
    import torch  # noqa: F401
    assert _calls.torch_calls() is not _calls.ctypes_calls, "the torch call extension did not load"
    where["_torch_calls"] = _calls.extension_path()
except ImportError:
    print("[wheel] no torch: its tests skip")
for what, path in where.items():
    assert os.path.realpath(path).startswith(venv + os.sep), f"{what} comes from {path}, not the venv"
print(f"[wheel] {kpool.version()}: {where}")
PY
# (Inductor's compiles are python.pytest's: minutes of C++ codegen on two
# cores, the same for an installed package.)
step "python/tests (CPU and torch ops) from the venv"
"$venv_python" -m pytest -q -p no:cacheprovider python/tests/test_cpu.py python/tests/test_torch_ops.py \
    python/tests/test_reference_rules.py -k "not inductor and not compiled_indexer"
