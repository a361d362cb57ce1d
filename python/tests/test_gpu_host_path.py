"""The eager call path on CUDA tensors: the _torch_calls extension reads the
tensors and torch's current stream through torch's C shim once it has
checked them (python/src/torch_calls.c); these calls must land on the
stream torch says is current, on a side stream and under CUDA graph
capture, with the same bytes as the Python-interface reads.

Skipped unless torch sees a CUDA device and libkpool.so has its CUDA path.

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so python3 -m pytest python/tests/test_gpu_host_path.py -q
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))

import kpool  # noqa: E402
from conftest import skip_without_kpool_cuda  # noqa: E402
from kpool import _calls  # noqa: E402
from test_torch_ops import ALLOCATING, P, _all_ops, _bytes_equal, _compare, _op_args, _state  # noqa: E402

skip_without_kpool_cuda(pytest, kpool)

DEV = "cuda"


@pytest.fixture(scope="module")
def extension():
    ext = _calls.torch_calls()
    if ext is _calls.ctypes_calls:
        pytest.skip("the _torch_calls extension is not built")
    kpool.cuda_warm_up(torch.cuda.current_device())
    assert _calls.bind_tensor_shim(ext, torch)
    yield ext
    _calls.bind_tensor_shim(ext, torch)


def _on_device(seed, device=DEV):
    """_state on the GPU, its tail ring again a view of its padded allocation."""
    cpu = _state(seed)
    s = {k: v.to(device) for k, v in cpu.items()}
    ring = cpu["tail_kv_cache"]
    s["tail_kv_cache"] = s["tail_base"].as_strided(ring.shape, ring.stride(), ring.storage_offset())
    return s


def _step(s):
    """The ops whose arguments are all device tensors already (capturable as
    they are): fwht, seed, compress, decode, expand."""
    q8, qs = kpool.fwht128_quant_fp8(s["q"])
    kpool.kpool_seed_tail_cache(s["tail_kv_cache"], s["key"], s["gate_score"], s["tslot"], P)
    kpool.kpool_compress_and_write_cache(s["kv_cache"], s["slot_k"], s["slot_score"], s["ape"], s["loc"], P)
    kpool.kpool_decode_update_and_maybe_write_cache_batched(
        s["kv_cache"], s["tail_kv_cache"], s["tail_slot_mapping"], s["step_key"], s["step_score"], s["ape"],
        s["slot_mapping"], s["positions"], P)
    ids = kpool.expand_pools_and_append_tail(s["pool_ids"], s["seq_lens"], P)
    return dict(q8=q8.view(torch.uint8), qs=qs, ids=ids)


def test_shim_and_python_reads_agree_on_cuda_tensors(extension):
    a, b = _on_device(20), _on_device(20)
    want = _all_ops(a)
    extension.bind_tensor_shim(None)
    try:
        got = _all_ops(b)
    finally:
        assert _calls.bind_tensor_shim(extension, torch)
    torch.cuda.synchronize()
    _compare(got, want)
    assert _bytes_equal(a["kv_cache"], b["kv_cache"]) and _bytes_equal(a["tail_base"], b["tail_base"])


def test_calls_run_on_the_current_side_stream(extension):
    want_state, side_state = _on_device(21), _on_device(21)
    want = _all_ops(want_state)  # the default stream (and the shim's stream checked against torch's)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Slow kernels queued first: a call on another stream would run before they finish.
        torch.cuda._sleep(50_000_000)
        got = _all_ops(side_state)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _compare(got, want)
    assert _bytes_equal(want_state["kv_cache"], side_state["kv_cache"])
    assert _bytes_equal(want_state["tail_base"], side_state["tail_base"])


def test_captured_calls_replay_like_eager(extension):
    static = _on_device(22)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(_on_device(22))  # warm-up on the capture's stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _step(static)
    for trial in range(3):
        fresh = _on_device(30 + trial)
        for k, v in static.items():
            if k != "tail_kv_cache":  # a view of tail_base
                v.copy_(fresh[k])
        graph.replay()
        want = _step(fresh)
        torch.cuda.synchronize()
        _compare(out, want)
        assert _bytes_equal(static["kv_cache"], fresh["kv_cache"]), f"trial {trial}: kv_cache"
        assert _bytes_equal(static["tail_base"], fresh["tail_base"]), f"trial {trial}: tail ring"


def test_outputs_are_allocated_on_the_inputs_device(extension):
    """The extension's NAME_new functions allocate on the device of the
    input the outputs follow, also when it is not the current device (with
    two GPUs), with the Python kernels' bytes (the shim-off path)."""
    assert _calls.bind_tensor_shim(extension, torch) and _calls.bind_output_allocator(extension, torch)
    for index in range(min(torch.cuda.device_count(), 2)):
        device = torch.device("cuda", index)
        ours, python = _op_args(_on_device(23, device)), _op_args(_on_device(23, device))
        extension.bind_output_allocator(None)
        try:
            want = {op: getattr(torch.ops.kpool, op).default(*python[op]) for op in ALLOCATING}
        finally:
            assert _calls.bind_output_allocator(extension, torch)
        for op, function in ALLOCATING.items():
            got = getattr(extension, function)(*ours[op])
            assert got is not NotImplemented, op
            torch.cuda.synchronize(device)
            for g, w in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (got, want[op]))):
                assert g.device == device and (g.shape, g.dtype, g.stride()) == (w.shape, w.dtype, w.stride()), op
                assert g._use_count() == 1, f"{op}: the output's at::Tensor handle is still held (a leak)"
                assert _bytes_equal(g, w), op


def _pool_case(P, seed):
    """Engine-shaped tensors for compress and a decode step at pool size P:
    a paged K cache, a tail ring of 2P slots a request, 3 requests of 3
    tokens whose positions complete a pool (and stash into the ring)."""
    g = torch.Generator().manual_seed(seed)
    D, page, ring, B, N = 128, 64, 2 * P, 3, 3

    def bf16(*shape):
        return torch.randn(shape, generator=g).to(torch.bfloat16)

    n = 5
    positions = torch.tensor([[b * 7 + P - 2 + t for t in range(N)] for b in range(B)], dtype=torch.int32)
    positions[2, 2] = -1  # padding
    slots = torch.where(positions % P == P - 1, torch.arange(B * N, dtype=torch.int32).view(B, N) + 40, -1)
    slots = torch.where(positions >= 0, slots, -1).to(torch.int32)
    tail_slots = torch.where(positions >= 0, torch.arange(B, dtype=torch.int32).view(B, 1) * ring + positions % ring,
                             -1).to(torch.int32)
    return dict(
        kv_cache=torch.randint(0, 256, (4, page, D + 4), generator=g, dtype=torch.uint8),
        tail_kv_cache=bf16(B, 2, ring, D),
        slot_k=bf16(n, P, D), slot_score=bf16(n, P, D), ape=torch.randn((P, D), generator=g) * 0.5,
        loc=torch.tensor([3, 9, 70, 100, 200]),
        step_key=bf16(B, N, D), step_score=bf16(B, N, D),
        positions=positions, slot_mapping=slots, tail_slot_mapping=tail_slots,
    )


def _pool_ops(s, P):
    kpool.kpool_compress_and_write_cache(s["kv_cache"], s["slot_k"], s["slot_score"], s["ape"], s["loc"], P)
    kpool.kpool_decode_update_and_maybe_write_cache_batched(
        s["kv_cache"], s["tail_kv_cache"], s["tail_slot_mapping"], s["step_key"], s["step_score"], s["ape"],
        s["slot_mapping"], s["positions"], P)


@pytest.mark.parametrize("P", [1, 2, 4, 8, 16, 32, 64])
def test_every_pool_size_of_the_contract_gives_the_cpus_bytes_on_cuda(P):
    """Every pool size the CPU takes runs on CUDA (one rule, SPEC): compress
    and a decode step in the exact arithmetic write the CPU's bytes into the
    cache and the tail ring."""
    cpu = _pool_case(P, 900 + P)
    gpu = {k: v.to(DEV) for k, v in cpu.items()}
    previous = kpool.set_arithmetic("exact")
    try:
        _pool_ops(cpu, P)
        _pool_ops(gpu, P)
    finally:
        kpool.set_arithmetic(previous)
    torch.cuda.synchronize()
    assert _bytes_equal(gpu["kv_cache"].cpu(), cpu["kv_cache"])
    assert _bytes_equal(gpu["tail_kv_cache"].cpu(), cpu["tail_kv_cache"])
