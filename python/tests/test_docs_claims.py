"""README.md's and python/README.md's checkable claims (names, versions,
limits, the quoted error messages) against the code and the build files.

    PYTHONPATH=python python -m pytest python/tests/test_docs_claims.py -q
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kpool  # noqa: E402


def _read(*path):
    with open(os.path.join(REPO, *path)) as f:
        return f.read()


README, PY_README, BEHAVIOUR = _read("README.md"), _read("python", "README.md"), _read("docs", "behaviour.md")
PYPROJECT, CMAKE, HEADER = _read("pyproject.toml"), _read("CMakeLists.txt"), _read("include", "kpool", "kpool.h")


def _pyproject(key):
    return re.search(rf'^{re.escape(key)} = "([^"]+)"', PYPROJECT, re.M).group(1)


def test_versions_agree():
    version = _pyproject("version")
    assert re.search(r"^project\(kpool VERSION ([0-9.]+)", CMAKE, re.M).group(1) == version
    assert kpool.__version__ == version
    assert kpool.version().startswith(f"kpool {version} (cpu")
    assert f'"kpool {version} (cpu)"' in PY_README


def test_wheel_tag_and_python_requirement():
    """The wheel file names of README and python/README carry pyproject's
    version, its abi3 tag and the manylinux tag auditwheel gives
    (wheel.fresh_venv checks that tag's glibc), and requires-python is the
    abi3 tag's lowest Python."""
    api = _pyproject("wheel.py-api")  # "cp311": the limited API of 3.11
    name = f"kpool-{_pyproject('version')}-{api}-abi3-manylinux_2_34_x86_64.whl"
    for text in (README, PY_README):
        assert set(re.findall(r"kpool-[0-9.]+-[a-z0-9_]+-[a-z0-9_]+-[a-z0-9_]+\.whl", text)) == {name}
    assert f"`{api}-abi3` tag" in PY_README
    lowest = f"{api[2]}.{api[3:]}"
    assert _pyproject("requires-python") == f">={lowest}"
    assert f"CPython >= {lowest}" in PY_README


def test_readme_ops_are_the_c_api():
    named = set(re.findall(r"^\| `(kpool_[a-z0-9_]+)`(?:, `(kpool_[a-z0-9_]+)`)?", README, re.M))
    ops = {n for pair in named for n in pair if n}
    declared = set(re.findall(r"kpool_status_code (kpool_[a-z0-9_]+)\(", HEADER))
    # Every op of kpool.h is in README's tables; the device utilities are not ops.
    assert ops == declared - {"kpool_cuda_warm_up", "kpool_cuda_loaded_images", "kpool_check_index_errors"}
    assert {n.removeprefix("kpool_") for n in ops} <= {n.removeprefix("kpool_") for n in kpool.__all__}


def test_pool_size_limits():
    """behaviour.md's pool sizes are the build's defaults; README's "P a
    power of two in [1, 64]" is the runtime's check."""
    # The CPU list is every power of two up to kpool.h's KPOOL_MAX_POOL_SIZE.
    max_pool = int(re.search(r"^#define KPOOL_MAX_POOL_SIZE ([0-9]+)$", HEADER, re.M).group(1))
    assert "foreach (P 1 2 4 8 16 32 64 128 256)" in CMAKE and max_pool == 64
    # Every CUDA family builds the CPU's list (KPOOL_CUDA_POOL_SIZES defaults to it).
    assert "set(KPOOL_CUDA_POOL_SIZES ${KPOOL_POOL_SIZES} CACHE STRING" in CMAKE
    assert "on the CPU and every CUDA family alike: every power\n  of two from 1 to 64" in BEHAVIOUR
    assert "`P` a power of two in\n[1, 64]" in README
    for bad in (0, 3, 128):
        with pytest.raises(kpool.KpoolValueError, match=rf"pool_size = {bad} is not a power of two in \[1, 64\]"):
            kpool.expand_pools_and_append_tail(np.zeros((1, 1), np.int32), np.zeros(1, np.int32), bad)


def test_readme_messages_are_the_runtimes():
    """The two messages README quotes, from the calls it describes."""
    D, P = kpool.INDEX_HEAD_DIM, 4
    assert re.search(r"#define KPOOL_CACHE_ROW_BYTES \(KPOOL_HEAD_DIM \+ 4\)", HEADER) and D == 128
    cache = np.zeros((2, 64, D + 4), np.uint8)
    k = np.zeros((2, P, D), np.uint16)
    ape = np.zeros((P, D), np.float32)
    with pytest.raises(kpool.KpoolIndexRangeError) as info:
        kpool.kpool_compress_and_write_cache(cache, k, k, ape, np.array([5, 128], np.int64), P)
    assert str(info.value).endswith("loc[1] = 128 is outside the cache (128 slots)")
    assert "`loc[1] = 128 is outside the cache (128 slots)`" in README
    with pytest.raises(kpool.KpoolValueError) as info:
        kpool.kpool_compress_and_write_cache(cache, k[:, :3], k[:, :3], ape[:3], np.array([5, 6], np.int64), P)
    assert str(info.value).endswith("pool_size = 4 does not match slot_k dim 1 = 3")
    assert "`pool_size = 4 does not match slot_k dim 1 = 3`" in README
    assert not cache.any()


def test_dump_case_count():
    with open(os.path.join(REPO, "tests", "data", "dump_seed0", "manifest.json")) as f:
        cases = len(json.load(f)["cases"])
    assert f"the {cases} reference cases" in README
    assert f"{cases} of {cases} cases ok" in README


def test_offset_claims_name_the_cuda_limit():
    """The 64-bit offset claims are the CPU's; each names CUDA's 2 GiB limit,
    which placement.cpp enforces."""
    assert "CUDA tensors must be below 2 GiB" in _read("runtime", "placement.cpp")
    assert "kCudaMaxSpanBytes = std::numeric_limits<int32_t>::max()" in _read("runtime", "placement.h")
    for text in (README, PY_README):
        for claim in re.finditer(r"64-bit", text):
            nearby = text[claim.start():claim.start() + 300]
            assert "2 GiB" in nearby, nearby
