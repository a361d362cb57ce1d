"""kpool in an engine's process on the GPU: two models with different
arithmetics in two threads on two streams, eager and captured; each
device's index-error words; a first call inside a CUDA-graph capture; a
child forked after CUDA init. The CPU side is test_process_state.py.

Skipped unless torch sees a CUDA device and libkpool.so has its CUDA path.
The capture test runs in a fresh process (nothing warmed up yet).

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so python3 -m pytest python/tests/test_gpu_process_state.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import kpool  # noqa: E402
from conftest import skip_without_kpool_cuda  # noqa: E402

skip_without_kpool_cuda(pytest, kpool)

D = kpool.INDEX_HEAD_DIM
PAGE, ROW = 64, D + 4


def _compress_case(seed, device, n=64, P=4, blocks=4):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randint(0, 256, (blocks, PAGE, ROW), dtype=torch.uint8, generator=g)
    slot_k = torch.randn((n, P, D), generator=g).to(torch.bfloat16)
    slot_score = torch.randn((n, P, D), generator=g).to(torch.bfloat16)
    ape = torch.randn((P, D), generator=g) * 0.5
    loc = torch.randperm(blocks * PAGE, generator=g)[:n]
    return [t.to(device) for t in (kv, slot_k, slot_score, ape, loc)] + [P]


def _compress(case, **kw):
    kv, slot_k, slot_score, ape, loc, P = case
    kv = kv.clone()
    k, s = kpool.kpool_compress_and_write_cache(kv, slot_k, slot_score, ape, loc, P, return_compressed=True, **kw)
    return kv, k.view(torch.uint8), s


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module", autouse=True)
def _warm():
    for i in range(torch.cuda.device_count()):
        kpool.cuda_warm_up(i)


def test_two_models_two_arithmetics_two_streams_eager_and_captured():
    """Thread A serves an exact model on one stream, thread B a triton model
    on another, each through its own context default, at once: every call
    equals the single-threaded bytes of its arithmetic, eager and as a
    replayed CUDA graph."""
    case = _compress_case(0, "cuda")
    want = {a: _compress(case, arithmetic=a) for a in ("exact", "triton")}
    failures = []

    def model(arithmetic):
        kpool.set_arithmetic(arithmetic)
        stream = torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                for _ in range(50):
                    got = _compress(case)
                    stream.synchronize()
                    if not _same(got, want[arithmetic]):
                        failures.append(f"{arithmetic}: eager bytes differ")
                kv = case[0].clone()
                graph = torch.cuda.CUDAGraph()
                # thread_local: the other thread's eager calls (its
                # synchronize) may not end this thread's capture, as under
                # the default global mode, where any thread's unsafe call
                # invalidates every capture in the process.
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    k, s = kpool.kpool_compress_and_write_cache(kv, *case[1:5], case[5], return_compressed=True)
                for _ in range(10):
                    kv.copy_(case[0])
                    graph.replay()
                    stream.synchronize()
                    if not _same((kv, k.view(torch.uint8), s), want[arithmetic]):
                        failures.append(f"{arithmetic}: replayed bytes differ")
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append(f"{arithmetic}: {e!r}")

    threads = [threading.Thread(target=model, args=(a,)) for a in ("exact", "triton")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:4]


def test_index_error_words_per_device_and_kept_alive():
    """Each device's words mark its own calls' out-of-range indices; words
    cannot be replaced during a capture, and words replaced after one stay
    allocated while the graph replays (compute-sanitizer memcheck runs this
    file in run_on_gpu.sh)."""
    devices = range(min(torch.cuda.device_count(), 2))
    words = {i: torch.zeros(4, dtype=torch.int32, device=f"cuda:{i}") for i in devices}
    for i in devices:
        kpool.set_index_errors(words[i])
    try:
        for i in devices:
            case = _compress_case(1, f"cuda:{i}")
            case[4] = case[4].clone()
            case[4][0] = 1 << 40  # loc outside the cache
            _compress(case)
            with pytest.raises(kpool.KpoolIndexRangeError, match="loc"):
                kpool.check_index_errors(i)
            kpool.check_index_errors(i)  # zeroed by the last check
        case = _compress_case(2, "cuda:0")
        kv = case[0].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kpool.kpool_compress_and_write_cache(kv, *case[1:5], case[5])
            with pytest.raises(RuntimeError, match="capturing"):
                kpool.set_index_errors(torch.zeros(4, dtype=torch.int32, device="cuda:0"))
        kpool.set_index_errors(torch.zeros(4, dtype=torch.int32, device="cuda:0"))
        del words[0]
        torch.cuda.empty_cache()
        graph.replay()  # writes the first words, which kpool keeps
        torch.cuda.synchronize()
    finally:
        for i in devices:
            kpool.set_index_errors(None, i)


def _run_python(code):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, env=env)


def test_first_call_inside_a_capture_fails_clearly():
    """In a fresh process, a kernel's first launch inside a capture (its
    module not loaded yet) raises a DEVICE error naming cuda_warm_up instead
    of breaking the capture; after kpool.cuda_warm_up the capture works."""
    done = _run_python("""
        import torch, kpool
        q = torch.randn(8, 128, device="cuda").to(torch.bfloat16)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                kpool.fwht128_quant_fp8(q)
        except kpool.KpoolError as e:
            assert e.code == 4 and "cuda_warm_up" in str(e), str(e)
            print("refused:", e)
        else:
            raise SystemExit("the capture of a first call was not refused")
        kpool.cuda_warm_up(0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = kpool.fwht128_quant_fp8(q)
        graph.replay()
        eager = kpool.fwht128_quant_fp8(q)
        torch.cuda.synchronize()
        assert torch.equal(out[1], eager[1])
        print("captured after warm-up")
    """)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "captured after warm-up" in done.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_after_cuda_init_fails_fast():
    """A child forked after kpool initialized CUDA gets a DEVICE error naming
    the fork from a CUDA call and from the warm-up (not INTERNAL, not a
    warm-up that returns having done nothing); its CPU calls still run."""
    done = _run_python("""
        import os, torch, kpool
        g = torch.Generator().manual_seed(0)
        kv = torch.zeros((2, 64, 132), dtype=torch.uint8, device="cuda")
        slot_k, slot_score = (torch.randn((4, 4, 128), generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        ape, loc = torch.zeros((4, 128), device="cuda"), torch.arange(4, device="cuda")
        q_cpu = torch.randn((8, 128), generator=g).to(torch.bfloat16)
        kpool.kpool_compress_and_write_cache(kv, slot_k, slot_score, ape, loc, 4)  # in place: no allocation
        torch.cuda.synchronize()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # torch refuses its own CUDA calls after a fork (the current
                # stream's getter among them): kpool's calls on the legacy
                # stream, through ctypes, show what kpool itself does.
                kpool._tensors._raw_stream = lambda index: 0
                calls = (lambda: kpool.cuda_warm_up(0),
                         lambda: kpool._calls.ctypes_calls.compress_and_write_cache(
                             kv, slot_k, slot_score, ape, loc, None, None, None, 4, 128, 1, 1))
                for call in calls:
                    try:
                        call()
                    except kpool.KpoolError as e:
                        assert e.code == 4 and "fork" in str(e), str(e)
                    else:
                        raise AssertionError("a CUDA call in the child did not fail")
                kpool.fwht128_quant_fp8(q_cpu)  # the CPU path still runs
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("child failed fast")
    """)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "child failed fast" in done.stdout
