"""kpool in an engine's process, on the CPU: settings that belong to a call
or a context (never to the process), a second bundled copy of the package,
and a forked child. numpy only; torch CPU tensors too where torch imports.
The CUDA side (streams, captures, a child after CUDA init) is in
test_gpu_process_state.py.

    PYTHONPATH=python python -m pytest python/tests/test_process_state.py -q
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kpool  # noqa: E402
from kpool import _lib  # noqa: E402

D = kpool.INDEX_HEAD_DIM
PAGE, ROW = 64, D + 4

try:
    kpool.version()
except OSError as e:  # no library built
    pytest.skip(f"libkpool.so does not load: {e}", allow_module_level=True)


def _bf16(rng, shape):
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _compress_case(seed, n=24, P=4, blocks=2):
    """A cache with canaries and n pools to write into slots of their own."""
    rng = np.random.default_rng(seed)
    kv = rng.integers(0, 256, (blocks, PAGE, ROW), dtype=np.uint8)
    slot_k, slot_score = _bf16(rng, (n, P, D)), _bf16(rng, (n, P, D))
    ape = (rng.standard_normal((P, D)) * 0.5).astype(np.float32)
    loc = rng.permutation(blocks * PAGE)[:n].astype(np.int64)
    return kv, slot_k, slot_score, ape, loc, P


def _compress(case, **kw):
    kv, slot_k, slot_score, ape, loc, P = case
    kv = kv.copy()
    rows = kpool.kpool_compress_and_write_cache(kv, slot_k, slot_score, ape, loc, P, return_compressed=True, **kw)
    return kv, rows


def test_arithmetic_is_per_call_and_per_context():
    """The `arithmetic` argument wins over the context's default; the
    default set in one thread is not another's; an unknown name is refused
    by name, writing nothing."""
    case = _compress_case(1)
    kv_exact, rows_exact = _compress(case, arithmetic="exact")
    previous = kpool.set_arithmetic("triton")
    try:
        with pytest.raises(RuntimeError, match="exec->arithmetic"):
            _compress(case)  # triton: CUDA tensors only
        kv, rows = _compress(case, arithmetic="exact")
        np.testing.assert_array_equal(kv, kv_exact)
        np.testing.assert_array_equal(rows[0], rows_exact[0])
        seen = []
        worker = threading.Thread(target=lambda: seen.append(kpool.get_arithmetic()))
        worker.start()
        worker.join()
        assert seen == [os.environ.get("KPOOL_ARITHMETIC", "default")]
    finally:
        assert kpool.set_arithmetic(previous) == "triton"
    kv = case[0].copy()
    with pytest.raises(ValueError, match="arithmetic = 'fast'"):
        kpool.kpool_compress_and_write_cache(kv, *case[1:5], case[5], arithmetic="fast")
    np.testing.assert_array_equal(kv, case[0])
    with pytest.raises(ValueError, match="arithmetic"):
        kpool.fwht128_quant_fp8(case[1][:, 0], arithmetic="fast")


def test_threads_with_different_arithmetics_get_their_own_bytes():
    """One thread serves a model in the exact arithmetic through the
    context's default, another keeps switching its own default between
    triton and default (the issue's 19,338 failed calls of 29,424 when the
    setting was the process's): every exact call succeeds and equals the
    single-threaded bytes; slots the calls do not own keep their canaries."""
    cases = [_compress_case(seed) for seed in range(3)]
    expected = [_compress(c, arithmetic="exact") for c in cases]
    stop = threading.Event()
    failures, done = [], []

    def model_in_exact():
        kpool.set_arithmetic("exact")
        try:
            for i in range(60):
                c = cases[i % len(cases)]
                kv, rows = _compress(c)
                want_kv, want_rows = expected[i % len(cases)]
                if not (np.array_equal(kv, want_kv) and np.array_equal(rows[0], want_rows[0])
                        and np.array_equal(rows[1], want_rows[1])):
                    failures.append(f"call {i}: bytes differ")
                done.append(i)
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append(repr(e))
        finally:
            stop.set()

    def toggler():
        n = 0
        while not stop.is_set():
            kpool.set_arithmetic("triton" if n % 2 else "default")
            n += 1

    threads = [threading.Thread(target=model_in_exact), threading.Thread(target=toggler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
    assert len(done) == 60


def _copy_package(root, name):
    """python/kpool copied into root/<name>/kpool with libkpool.so and its op
    table in its lib/: the layout of a package that bundles kpool."""
    package = os.path.join(root, name)
    os.makedirs(package)
    open(os.path.join(package, "__init__.py"), "w").close()
    shutil.copytree(os.path.join(REPO, "python", "kpool"), os.path.join(package, "kpool"),
                    ignore=shutil.ignore_patterns("__pycache__", "lib"))
    lib = os.path.join(package, "kpool", "lib")
    os.makedirs(lib)
    shutil.copy(kpool.library_path(), os.path.join(lib, "libkpool.so"))
    shutil.copy(os.path.join(os.path.dirname(kpool.library_path()), _lib.OP_TABLE_NAME), lib)
    extension = os.path.join(os.path.dirname(kpool.library_path()), "_torch_calls.abi3.so")
    if os.path.isfile(extension):
        shutil.copy(extension, lib)
    return package


def _run_python(code, **env):
    environment = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=environment)


def test_two_bundled_copies_import_and_run_side_by_side(tmp_path):
    """kpool and a package that bundles its own copy, in one process: both
    import (with torch: each defines its ops, the copy in a namespace of its
    own), the copy loads its own libkpool.so whatever $KPOOL_LIBRARY says,
    and both compute the same bytes."""
    _copy_package(str(tmp_path), "vendored")
    code = f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np
        try:
            import torch
        except ImportError:
            torch = None
        import kpool
        import vendored.kpool as copy
        assert kpool.library_path() == {kpool.library_path()!r}, kpool.library_path()
        assert copy.library_path() == {str(tmp_path / "vendored" / "kpool" / "lib" / "libkpool.so")!r}, \\
            copy.library_path()
        rng = np.random.default_rng(3)
        q = (rng.standard_normal((9, 128)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        ours, theirs = kpool.fwht128_quant_fp8(q), copy.fwht128_quant_fp8(q)
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))
        if torch is not None and kpool.ops._torch_ops is not None:
            from kpool import _torch_ops as first
            from vendored.kpool import _torch_ops as second
            assert first.NAMESPACE == "kpool" and second.NAMESPACE.startswith("kpool_"), second.NAMESPACE
            t = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16)
            a, b = kpool.fwht128_quant_fp8(t), copy.fwht128_quant_fp8(t)
            assert torch.equal(a[1], b[1]) and torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
            c = getattr(torch.ops, second.NAMESPACE).fwht128_quant_fp8(t)
            assert torch.equal(c[1], a[1])
        print("two copies ok")
    """
    done = _run_python(code, KPOOL_LIBRARY=kpool.library_path())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "two copies ok" in done.stdout


def _task_threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self/task"), reason="needs fork and /proc")
def test_forked_child_runs_cpu_calls_on_a_thread_pool_of_its_own():
    """A child forked after the parent ran CPU kernels (Halide's pool
    started) starts a pool of its own at its first call, and computes the
    parent's bytes: without it the child's calls ran on one thread."""
    case = _compress_case(5, n=256, blocks=8)
    kv_parent, rows_parent = _compress(case)
    before = _task_threads()
    if before < 2:
        pytest.skip("the CPU kernels started no pool threads here (one core?)")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's teardown
        status = 1
        try:
            os.close(read)
            kv, rows = _compress(case)
            same = np.array_equal(kv, kv_parent) and np.array_equal(rows[0], rows_parent[0])
            os.write(write, f"{int(same)} {_task_threads()}".encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as f:
        reply = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, reply
    same, threads = (int(v) for v in reply.split())
    assert same == 1
    assert threads >= 2, f"the child ran its CPU call on {threads} thread(s)"
    kv, _ = _compress(case)  # the parent's pool, started again after the fork
    np.testing.assert_array_equal(kv, kv_parent)


def test_torch_ops_carry_the_arithmetic_eager_and_traced():
    """torch CPU tensors: the arithmetic reaches the C call through the
    extension (triton, CUDA-only, is refused on the CPU), each op's schema
    ends with it, and torch.compile(fullgraph=True) traces it: passed
    explicitly, or the context's default at trace time."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from kpool import _torch_ops

    for name in _torch_ops.SCHEMAS:
        op, _, overload = name.partition(".")  # (the out= forms: overload "out")
        schema = getattr(getattr(getattr(torch.ops, _torch_ops.NAMESPACE), op), overload or "default")._schema
        assert schema.arguments[-1].name == "arithmetic" and schema.arguments[-1].default_value == 0, name
    kv, slot_k, slot_score, ape, loc, P = _compress_case(7)
    case = [torch.from_numpy(kv), torch.from_numpy(slot_k.view(np.int16)).view(torch.bfloat16),
            torch.from_numpy(slot_score.view(np.int16)).view(torch.bfloat16), torch.from_numpy(ape),
            torch.from_numpy(loc)]

    def step(kv, slot_k, slot_score, ape, loc, arithmetic=None):
        kpool.kpool_compress_and_write_cache(kv, slot_k, slot_score, ape, loc, P, arithmetic=arithmetic)
        return kv

    want = step(case[0].clone(), *case[1:], arithmetic="exact")
    with pytest.raises(RuntimeError, match="exec->arithmetic"):
        step(case[0].clone(), *case[1:], arithmetic="triton")
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert torch.equal(compiled(case[0].clone(), *case[1:], arithmetic="exact"), want)
    with pytest.raises(RuntimeError, match="exec->arithmetic"):
        compiled(case[0].clone(), *case[1:], arithmetic="triton")
    previous = kpool.set_arithmetic("triton")
    try:
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match="exec->arithmetic"):
            torch.compile(step, fullgraph=True, backend="eager")(case[0].clone(), *case[1:])
    finally:
        kpool.set_arithmetic(previous)
