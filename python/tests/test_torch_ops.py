"""kpool's PyTorch custom operators on CPU tensors: registration, schemas,
fake implementations, torch.library.opcheck, torch.compile(fullgraph=True)
bit for bit against eager, and the two call paths (the _torch_calls
extension and ctypes) against each other. Skipped without torch.

An engine-shaped module (engine_model.py) runs compiled for 100 decode steps
against eager calls. The CUDA side (CUDA graphs under mode="reduce-overhead",
the engine-shaped module against the reference) is test_gpu_torch_compile.py.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import kpool  # noqa: E402
from engine_model import Engine, run_compiled_against  # noqa: E402
from kpool import _calls  # noqa: E402

try:
    kpool.version()
except OSError as e:
    pytest.skip(f"libkpool.so does not load: {e}", allow_module_level=True)

D, P, PAGE = 128, 4, 64
OPS = ("fwht128_quant_fp8", "compress_and_write_cache", "compress_to_rows", "compress_tokens_and_write_cache",
       "seed_tail_cache", "decode_update_and_maybe_write_cache_batched", "decode_update_and_maybe_write_cache_ragged",
       "expand_pools_and_append_tail", "expand_pools_to_tokens", "append_tail_to_topk")
# The out= forms (overload "out" of their op): the caller's buffer written in place.
OUT_OPS = ("expand_pools_and_append_tail", "expand_pools_to_tokens", "append_tail_to_topk")
# What each op writes in place (its schema's Tensor(a!) arguments).
MUTATED = {"compress_and_write_cache": ["kv_cache"], "compress_to_rows": ["kv_cache"],
           "compress_tokens_and_write_cache": ["kv_cache", "tail_kv_cache"],
           "seed_tail_cache": ["tail_kv_cache"],
           "decode_update_and_maybe_write_cache_batched": ["kv_cache", "tail_kv_cache"],
           "decode_update_and_maybe_write_cache_ragged": ["kv_cache", "tail_kv_cache"]}


def _bf16(g, *shape, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)


def _state(seed=0, device="cpu"):
    """Small engine-shaped tensors for every op: a paged cache with random
    bytes, a padded tail allocation viewed as [blocks, 2, ring, 128], a
    prefill batch of two requests and one decode step of next_n = 2."""
    g = torch.Generator().manual_seed(seed)
    ring, blocks = 2 * P, 4
    tail_base = _bf16(g, blocks, 2 * ring * D + 64)
    lens = [10, 6]
    tslot = torch.tensor([1 * ring + p % ring for p in range(lens[0])] + [3 * ring + p % ring for p in range(lens[1])],
                         dtype=torch.int32)
    pos = torch.tensor([[lens[0], lens[0] + 1], [lens[1], lens[1] + 1]], dtype=torch.int32)
    return dict(
        q=_bf16(g, 24, D),
        kv_cache=torch.randint(0, 256, (4, PAGE, D + 4), generator=g, dtype=torch.uint8),
        tail_base=tail_base,
        tail_kv_cache=tail_base.as_strided((blocks, 2, ring, D), (2 * ring * D + 64, ring * D, D, 1)),
        slot_k=_bf16(g, 5, P, D), slot_score=_bf16(g, 5, P, D), ape=torch.randn((P, D), generator=g) * 0.5,
        loc=torch.tensor([3, 9, 70, 100, 200]), write_mask=torch.tensor([True, False, True, True, False]),
        key=_bf16(g, sum(lens), D), gate_score=_bf16(g, sum(lens), D), tslot=tslot,
        positions=pos, tail_slot_mapping=torch.tensor([[ring + p % ring for p in pos[0].tolist()],
                                                      [3 * ring + p % ring for p in pos[1].tolist()]],
                                                     dtype=torch.int32),
        slot_mapping=torch.tensor([[-1, 11], [-1, 17]], dtype=torch.int32),  # pool ends: positions 11 and 7
        step_key=_bf16(g, 2, 2, D), step_score=_bf16(g, 2, 2, D),
        pool_ids=torch.tensor([[0, 2, -1], [1, 0, 3]], dtype=torch.int32),
        seq_lens=torch.tensor([13, 17], dtype=torch.int32),
        page_table=torch.randint(0, 1 << 20, (2, 64), generator=g, dtype=torch.int32),
        # The prefill's tokens as the engine holds them: a slot on each pool's
        # last token (positions 3 and 7 of request 0, 3 of request 1).
        token_slots=torch.tensor([-1, -1, -1, 5, -1, -1, -1, 21] + [-1] * 5 + [33, -1, -1], dtype=torch.int32),
        # A ragged decode step: request 0 at positions 10 and 11 (completing a
        # pool), request 1 at 6, then a graph-padding token.
        ragged_key=_bf16(g, 4, D), ragged_score=_bf16(g, 4, D),
        ragged_positions=torch.tensor([10, 11, 6, -1], dtype=torch.int32),
        ragged_tail_slots=torch.tensor([ring + 10 % ring, ring + 11 % ring, 3 * ring + 6 % ring, -1],
                                       dtype=torch.int32),
        ragged_slots=torch.tensor([-1, 12, -1, -1], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
    )


def _op_args(s):
    """(op, args) for opcheck: every op on the state's tensors."""
    return {
        "fwht128_quant_fp8": (s["q"],),
        "compress_and_write_cache": (s["kv_cache"], s["slot_k"], s["slot_score"], s["ape"], s["loc"],
                                     s["write_mask"], P, D, True, True),
        "compress_to_rows": (s["kv_cache"], s["slot_k"], s["slot_score"], s["ape"], s["loc"], None, P, D, True, True),
        "compress_tokens_and_write_cache": (s["kv_cache"], s["key"], s["gate_score"], s["ape"], s["token_slots"],
                                            s["tail_kv_cache"], s["tslot"], None, P, D, True),
        "seed_tail_cache": (s["tail_kv_cache"], s["key"], s["gate_score"], s["tslot"], P, D),
        "decode_update_and_maybe_write_cache_batched": (
            s["kv_cache"], s["tail_kv_cache"], s["tail_slot_mapping"], s["step_key"], s["step_score"], s["ape"],
            s["slot_mapping"], s["positions"], P, D, True),
        "decode_update_and_maybe_write_cache_ragged": (
            s["kv_cache"], s["tail_kv_cache"], s["ragged_tail_slots"], s["ragged_key"], s["ragged_score"], s["ape"],
            s["ragged_slots"], s["ragged_positions"], s["query_start_loc"], 2, P, D, True),
        "expand_pools_and_append_tail": (s["pool_ids"], s["seq_lens"], P, False),
        "expand_pools_to_tokens": (s["pool_ids"], s["pool_ids"] >= 0, s["page_table"], None, 12, P),
        "append_tail_to_topk": (s["pool_ids"], s["seq_lens"], s["seq_lens"] // P, None,
                                torch.tensor([0, 100], dtype=torch.int64, device=s["seq_lens"].device), P),
    }


def test_every_op_is_registered_with_its_mutations():
    for name in OPS:
        schema = getattr(torch.ops.kpool, name).default._schema
        mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert mutated == MUTATED.get(name, []), (name, str(schema))


@pytest.mark.parametrize("name", OUT_OPS)
def test_out_overloads_mutate_only_out(name):
    schema = getattr(torch.ops.kpool, name).out._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == ["out"] and len(schema.returns) == 0, str(schema)


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    torch.library.opcheck(getattr(torch.ops.kpool, name).default, _op_args(_state())[name])


@pytest.mark.parametrize("name", OUT_OPS)
def test_opcheck_out(name):
    s = _state()
    args = _op_args(s)[name]
    out = getattr(torch.ops.kpool, name)(*args)
    buffer = torch.full((out.shape[0] + 3, out.shape[1] + 5), -9, dtype=torch.int32)
    torch.library.opcheck(getattr(torch.ops.kpool, name).out, (*args, buffer[1:-2, 2:-3]))


def test_fake_outputs_have_the_reference_shapes_dtypes_and_devices():
    s = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _state().items()}
    s["tail_kv_cache"] = s["tail_base"].as_strided((4, 2, 2 * P, D), (2 * 2 * P * D + 64, 2 * P * D, D, 1))
    args = _op_args(s)
    q8, qs = torch.ops.kpool.fwht128_quant_fp8(*args["fwht128_quant_fp8"])
    assert (q8.shape, q8.dtype, qs.shape, qs.dtype) == ((24, D), torch.float8_e4m3fn, (24, 1), torch.float32)
    assert q8.device.type == qs.device.type == "meta"
    ck, cs = torch.ops.kpool.compress_to_rows(*args["compress_to_rows"])
    assert (ck.shape, ck.dtype, cs.shape, cs.dtype) == ((5, D), torch.float8_e4m3fn, (5,), torch.float32)
    out = torch.ops.kpool.expand_pools_and_append_tail(*args["expand_pools_and_append_tail"])
    assert (out.shape, out.dtype, out.device.type) == ((2, 3 * P + P - 1), torch.int32, "meta")
    out = torch.ops.kpool.expand_pools_to_tokens(*args["expand_pools_to_tokens"])
    assert (out.shape, out.dtype) == ((2, 12), torch.int32)
    out = torch.ops.kpool.append_tail_to_topk(*args["append_tail_to_topk"])
    assert (out.shape, out.dtype) == ((2, 3 + P - 1), torch.int32)
    for name in MUTATED:
        assert getattr(torch.ops.kpool, name)(*args[name]) is None or name == "compress_to_rows"
    with pytest.raises(kpool.KpoolValueError, match="q has shape"):
        torch.ops.kpool.fwht128_quant_fp8(s["q"][0])


def _all_ops(s, lib=kpool):
    """Every drop-in function once, mixed with torch ops, the way an indexer
    uses them; returns the outputs (the caches are updated in place)."""
    q8, qs = lib.fwht128_quant_fp8(s["q"] * 2)
    lib.kpool_seed_tail_cache(s["tail_kv_cache"], s["key"], s["gate_score"], s["tslot"], P)
    lib.kpool_compress_and_write_cache(s["kv_cache"], s["slot_k"], s["slot_score"].float(), s["ape"], s["loc"], P,
                                       write_mask=s["write_mask"])
    ck, cs = lib.kpool_compress_and_write_cache(None, s["slot_k"], s["slot_score"], s["ape"], s["loc"], P,
                                                return_compressed=True, write_cache=False)
    lib.kpool_decode_update_and_maybe_write_cache_batched(
        s["kv_cache"], s["tail_kv_cache"], s["tail_slot_mapping"], s["step_key"], s["step_score"], s["ape"],
        s["slot_mapping"], s["positions"], P)
    if lib is kpool:  # the entry points of the engine's own layouts (the reference has none)
        lib.kpool_compress_tokens_and_write_cache(s["kv_cache"], s["key"], s["gate_score"], s["ape"],
                                                  s["token_slots"], P, tail_kv_cache=s["tail_kv_cache"],
                                                  tail_slot_mapping=s["tslot"])
        lib.kpool_decode_update_and_maybe_write_cache_ragged(
            s["kv_cache"], s["tail_kv_cache"], s["ragged_tail_slots"], s["ragged_key"], s["ragged_score"], s["ape"],
            s["ragged_slots"], s["ragged_positions"], s["query_start_loc"], P, max_query_len=2)
    ids = lib.expand_pools_and_append_tail(s["pool_ids"].long(), s["seq_lens"], P)
    tokens = lib.expand_pools_to_tokens(s["pool_ids"], s["pool_ids"] >= 0, 12, P, page_table=s["page_table"])
    topk = lib.append_tail_to_topk(tokens, s["seq_lens"].long(), s["seq_lens"] // P, P,
                                   topk_offsets=torch.tensor([0, 100], device=s["q"].device))
    selected = torch.full((4, ids.shape[1] + 2), -5, dtype=torch.int32, device=s["q"].device)
    lib.expand_pools_and_append_tail(s["pool_ids"], s["seq_lens"], P, out=selected[1:3, 1:-1])
    return dict(q8=q8.view(torch.uint8), qs=qs * 1, ck=ck, cs=cs, ids=ids + 1, topk=topk, selected=selected)


def _bytes_equal(a, b):
    a, b = a.detach(), b.detach()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                       b.reshape(-1).view(torch.uint8))


def _compare(got, want):
    for k in want:
        assert _bytes_equal(got[k], want[k]), k


def _skip_without_a_cxx_compiler():
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("inductor compiles its CPU kernels with a C++ compiler; there is none here")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_is_bit_identical_to_eager(backend):
    if backend == "inductor":
        _skip_without_a_cxx_compiler()
    eager, compiled = _state(1), _state(1)
    want = _all_ops(eager)
    torch._dynamo.reset()
    got = torch.compile(_all_ops, fullgraph=True, backend=backend)(compiled)
    _compare(got, want)
    for k in ("kv_cache", "tail_base"):  # the padding of the tail allocation included
        assert _bytes_equal(compiled[k], eager[k]), k
    assert not torch.equal(compiled["kv_cache"], _state(1)["kv_cache"])  # the caches were written


@pytest.mark.parametrize("pool_size,ring", [(4, 8), (16, 16)])
def test_compiled_indexer_matches_eager_for_100_decode_steps(pool_size, ring):
    """The engine-shaped module (engine_model.py: fwht, seed and compress at
    prefill; fwht, the decode update with next_n = 2 and expand at each
    decode step; the tail rings as strided views of a padded buffer)
    compiled with fullgraph=True, against the same module calling kpool in
    eager mode: every output, cache and ring byte, step by step."""
    _skip_without_a_cxx_compiler()
    torch._dynamo.reset()
    run_compiled_against(Engine(pool_size, ring, "cpu"), kpool, kpool, steps=100)


def test_dispatcher_and_direct_kernels_write_the_same_bytes():
    """Eager calls of plain tensors skip the dispatcher; a dispatch mode (here
    torch.ops through a TorchDispatchMode that only forwards) takes it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Forward(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    direct, dispatched = _state(2), _state(2)
    want = _all_ops(direct)
    with Forward():
        got = _all_ops(dispatched)
    assert {f"kpool.{n}.default" for n in OPS} - {"kpool.compress_to_rows.default"} <= set(seen) | {
        "kpool.compress_and_write_cache.default"}
    _compare(got, want)
    assert _bytes_equal(dispatched["kv_cache"], direct["kv_cache"])
    assert _bytes_equal(dispatched["tail_base"], direct["tail_base"])


def test_extension_and_ctypes_calls_agree():
    extension = _calls.torch_calls()
    if extension is _calls.ctypes_calls:
        pytest.skip(f"the _torch_calls extension is not built ({_calls.extension_path()} is missing)")
    a, b = _state(3), _state(3)
    want = _all_ops(a)
    _calls._torch_calls = _calls.ctypes_calls
    try:
        got = _all_ops(b)
    finally:
        _calls._torch_calls = extension
    _compare(got, want)
    assert _bytes_equal(a["kv_cache"], b["kv_cache"]) and _bytes_equal(a["tail_base"], b["tail_base"])


def _python_reads(extension):
    """The extension reading tensors through their Python interface, until
    the shim is bound again."""
    extension.bind_tensor_shim(None)


def test_tensor_shim_reads_like_the_python_interface():
    extension = _calls.torch_calls()
    if extension is _calls.ctypes_calls:
        pytest.skip("the _torch_calls extension is not built")
    # This torch has the shim, and the probes agree: the fast reads are on.
    assert _calls.bind_tensor_shim(extension, torch)
    a, b = _state(7), _state(7)
    want = _all_ops(a)
    # A subclass (what a Parameter or a wrapper tensor is) takes the Python interface.
    q8, qs = kpool.fwht128_quant_fp8(torch.nn.Parameter(b["q"] * 2, requires_grad=False))
    _python_reads(extension)
    try:
        got = _all_ops(b)
    finally:
        assert _calls.bind_tensor_shim(extension, torch)
    _compare(got, want)
    assert _bytes_equal(a["kv_cache"], b["kv_cache"]) and _bytes_equal(a["tail_base"], b["tail_base"])
    assert _bytes_equal(q8.view(torch.uint8), want["q8"]) and _bytes_equal(qs, want["qs"])


# The ops with outputs, and the extension's function that allocates them.
ALLOCATING = {"fwht128_quant_fp8": "fwht128_quant_fp8_new", "compress_to_rows": "compress_and_write_cache_new",
              "expand_pools_and_append_tail": "expand_pools_and_append_tail_new",
              "expand_pools_to_tokens": "expand_pools_to_tokens_new", "append_tail_to_topk": "append_tail_to_topk_new"}


def test_extension_allocates_outputs_like_the_python_kernels():
    """The extension's NAME_new functions allocate the outputs through torch's
    C shim: the tensors the Python kernels allocate (shape, dtype, strides,
    device) with the same bytes; NotImplemented where the caller allocates."""
    extension = _calls.torch_calls()
    if extension is _calls.ctypes_calls:
        pytest.skip("the _torch_calls extension is not built")
    assert _calls.bind_tensor_shim(extension, torch) and _calls.bind_output_allocator(extension, torch)
    ours, python = _op_args(_state(8)), _op_args(_state(8))
    extension.bind_output_allocator(None)  # the kernels allocate in Python until bound again
    try:
        want = {op: getattr(torch.ops.kpool, op).default(*python[op]) for op in ALLOCATING}
        assert getattr(extension, ALLOCATING["fwht128_quant_fp8"])(*ours["fwht128_quant_fp8"]) is NotImplemented
    finally:
        assert _calls.bind_output_allocator(extension, torch)
    for op, function in ALLOCATING.items():
        got = getattr(extension, function)(*ours[op])
        assert got is not NotImplemented, op
        for g, w in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (got, want[op]))):
            assert type(g) is torch.Tensor and g.device == w.device, op
            assert g._use_count() == 1, f"{op}: the output's at::Tensor handle is still held (a leak)"
            assert (g.shape, g.dtype, g.stride()) == (w.shape, w.dtype, w.stride()), op
            assert _bytes_equal(g, w), op
    # A wrapping function that copies the at::Tensor and keeps the handle (each output would leak) is refused.
    lib = _calls._torch_shim(torch)
    shim = [ctypes.cast(getattr(lib, "aoti_torch_" + f), ctypes.c_void_p).value
            for f in ("empty_strided", "delete_tensor_object")]
    try:
        assert not extension.bind_output_allocator(*shim, torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr)
        assert extension.fwht128_quant_fp8_new(ours["fwht128_quant_fp8"][0]) is NotImplemented
    finally:
        assert _calls.bind_output_allocator(extension, torch)
    # Empty outputs: the strides torch gives a size 0 (a C API rejection must be the same on both paths).
    s = _state(8)
    empty = {"fwht128_quant_fp8": (s["q"][:0],),
             "expand_pools_to_tokens": (s["pool_ids"][:, :0], s["pool_ids"][:, :0] >= 0, None, None, 0, P)}
    for op, args in empty.items():
        results = []
        for allocate in (True, False):
            if not allocate:
                extension.bind_output_allocator(None)
            try:
                results.append(getattr(torch.ops.kpool, op).default(*args))
            except kpool.KpoolError as e:
                results.append(f"{type(e).__name__}: {e}")
            finally:
                assert _calls.bind_output_allocator(extension, torch)
        got, want = results
        if isinstance(want, str):
            assert got == want, op
            continue
        for g, w in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (got, want))):
            assert (g.shape, g.dtype, g.stride()) == (w.shape, w.dtype, w.stride()), op
    # Where the sizes cannot be taken from the arguments: the caller's checks name them.
    q = _state(8)["q"]
    for args in [(q.reshape(2, 12, D),), (torch.nn.Parameter(q, requires_grad=False),), (q.tolist(),), (q, q)]:
        assert extension.fwht128_quant_fp8_new(*args) is NotImplemented
    ids = ours["expand_pools_and_append_tail"]
    assert extension.expand_pools_and_append_tail_new(ids[0], ids[1], 1 << 33, False) is NotImplemented
    with pytest.raises(kpool.KpoolValueError, match="q has shape"):
        torch.ops.kpool.fwht128_quant_fp8.default(q.reshape(2, 12, D))


@pytest.mark.parametrize("path", ["extension", "extension, python reads", "ctypes"])
def test_errors_name_the_argument_on_both_paths(path):
    extension = _calls.torch_calls()
    if path != "ctypes" and extension is _calls.ctypes_calls:
        pytest.skip("the _torch_calls extension is not built")
    s = _state(4)
    before = s["kv_cache"].clone()
    if path == "ctypes":
        _calls._torch_calls = _calls.ctypes_calls
    elif path == "extension, python reads":
        _python_reads(extension)
    try:
        bad = s["loc"].clone()
        bad[2] = 4 * PAGE
        with pytest.raises(kpool.KpoolIndexRangeError, match=r"loc\[2\]"):
            kpool.kpool_compress_and_write_cache(s["kv_cache"], s["slot_k"], s["slot_score"], s["ape"], bad, P)
        with pytest.raises(kpool.KpoolTypeError, match="slot_k"):
            kpool.kpool_compress_and_write_cache(s["kv_cache"], s["slot_k"].float(), s["slot_score"], s["ape"],
                                                 s["loc"], P)
        with pytest.raises(kpool.KpoolTypeError, match="q has dtype"):
            kpool.fwht128_quant_fp8(s["q"].to(torch.float16))
        with pytest.raises(kpool.KpoolValueError, match=str(1 << 33)):  # ctypes would truncate it
            kpool.kpool_seed_tail_cache(s["tail_kv_cache"], s["key"], s["gate_score"], s["tslot"], 1 << 33)
        with pytest.raises(kpool.KpoolValueError, match="dims"):
            kpool.fwht128_quant_fp8(s["q"].reshape(1, 1, 1, 24, D))
        # Dynamo reports the error raised in traced code as a compile error naming it.
        with pytest.raises(Exception, match="return_skipped=True is for eager calls"):
            torch.compile(lambda x: kpool.kpool_decode_update_and_maybe_write_cache_batched(
                s["kv_cache"], s["tail_kv_cache"], s["tail_slot_mapping"], x, s["step_score"], s["ape"],
                s["slot_mapping"], s["positions"], P, return_skipped=True), fullgraph=True, backend="eager")(
                s["step_key"])
    finally:
        _calls._torch_calls = extension
        if extension is not _calls.ctypes_calls:
            _calls.bind_tensor_shim(extension, torch)
    assert torch.equal(s["kv_cache"], before)


def test_decode_returns_its_skipped_completions_in_eager():
    s = _state(5)
    s["tail_slot_mapping"][1] = -1  # request 1 completes a pool (position 7) without a tail block
    n = kpool.kpool_decode_update_and_maybe_write_cache_batched(
        s["kv_cache"], s["tail_kv_cache"], s["tail_slot_mapping"], s["step_key"], s["step_score"], s["ape"],
        s["slot_mapping"], s["positions"], P, return_skipped=True)
    assert n == 1


def test_strided_inputs_are_read_like_contiguous_copies():
    s, t = _state(6), _state(6)
    q = torch.stack([s["q"], s["q"]], dim=2).reshape(24, 2 * D)[:, ::2]  # innermost stride 2: copied first
    a = kpool.fwht128_quant_fp8(q)
    b = kpool.fwht128_quant_fp8(t["q"])
    assert _bytes_equal(a[0], b[0]) and _bytes_equal(a[1], b[1])
