"""The engine extension (ops.cpp, include/kpool/torch.hpp) on CPU tensors:
every op and out variant registered in the engine's namespace with the
Python package's schemas, the same bytes as torch.ops.kpool (the package's
ops, themselves checked against the reference's dump), out variants writing
the caller's tensors, kpool's rejections as torch's errors naming the
argument with nothing written, the Meta kernels under torch.library.opcheck
and torch.compile(fullgraph=True).

    KPOOL_ENGINE_OPS=<built libkpool_engine_ops.so> KPOOL_LIBRARY=<libkpool.so> \
        python -m pytest examples/torch_extension/test_extension.py

Skips without torch or without KPOOL_ENGINE_OPS. On a GPU the same tests
run on CUDA tensors with KPOOL_TEST_DEVICE=cuda (bench/run_on_gpu.sh).
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

LIBRARY = os.environ.get("KPOOL_ENGINE_OPS")
if not LIBRARY:
    pytest.skip("KPOOL_ENGINE_OPS names no built extension", allow_module_level=True)
torch.ops.load_library(LIBRARY)
NAMESPACE = os.environ.get("KPOOL_ENGINE_NAMESPACE", "kpool_engine")
engine = getattr(torch.ops, NAMESPACE)

# The Python package of this checkout, for its torch.ops.kpool.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kpool  # noqa: E402,F401  (registers torch.ops.kpool)

DEVICE = os.environ.get("KPOOL_TEST_DEVICE", "cpu")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("KPOOL_TEST_DEVICE=cuda but torch sees no GPU", allow_module_level=True)
D, P, PAGE = 128, 4, 64
OPS = ("fwht128_quant_fp8", "compress_and_write_cache", "compress_to_rows", "compress_tokens_and_write_cache",
       "seed_tail_cache", "decode_update_and_maybe_write_cache_batched", "decode_update_and_maybe_write_cache_ragged",
       "expand_pools_and_append_tail", "expand_pools_to_tokens", "append_tail_to_topk")
OUT_VARIANTS = ("fwht128_quant_fp8", "compress_to_rows", "expand_pools_and_append_tail", "expand_pools_to_tokens",
                "append_tail_to_topk")


def _bf16(g, *shape):
    return torch.randn(shape, generator=g).to(torch.bfloat16)


def _state(seed=0):
    """An engine's tensors for one of each op: a paged K cache of random
    bytes, a tail ring viewed out of a padded allocation, a prefill of two
    requests (10 and 6 tokens), a decode step of 2 tokens each."""
    g = torch.Generator().manual_seed(seed)
    ring, blocks = 2 * P, 4
    tail_base = _bf16(g, blocks, 2 * ring * D + 64)
    lens = [10, 6]
    tslot = [1 * ring + p % ring for p in range(lens[0])] + [3 * ring + p % ring for p in range(lens[1])]
    positions = [[lens[0], lens[0] + 1], [lens[1], lens[1] + 1]]
    s = dict(
        q=_bf16(g, 24, D),
        kv_cache=torch.randint(0, 256, (4, PAGE, D + 4), generator=g, dtype=torch.uint8),
        tail_kv_cache=tail_base.as_strided((blocks, 2, ring, D), (2 * ring * D + 64, ring * D, D, 1)),
        slot_k=_bf16(g, 5, P, D), slot_score=_bf16(g, 5, P, D), ape=torch.randn((P, D), generator=g) * 0.5,
        loc=torch.tensor([3, 9, 70, 100, 200]), write_mask=torch.tensor([True, False, True, True, False]),
        key=_bf16(g, sum(lens), D), gate_score=_bf16(g, sum(lens), D), tslot=torch.tensor(tslot, dtype=torch.int32),
        positions=torch.tensor(positions, dtype=torch.int32),
        tail_slot_mapping=torch.tensor([[ring + p % ring for p in positions[0]],
                                        [3 * ring + p % ring for p in positions[1]]], dtype=torch.int32),
        slot_mapping=torch.tensor([[-1, 11], [-1, 17]], dtype=torch.int32),  # pools end at positions 11 and 7
        step_key=_bf16(g, 2, 2, D), step_score=_bf16(g, 2, 2, D),
        pool_ids=torch.tensor([[0, 2, -1], [1, 0, 3]], dtype=torch.int32),
        seq_lens=torch.tensor([13, 17], dtype=torch.int32),
        page_table=torch.randint(0, 1 << 20, (2, 64), generator=g, dtype=torch.int32),
        topk_offsets=torch.tensor([0, 100], dtype=torch.int64),
        # The prefill's tokens as the engine holds them (a slot on each pool's
        # last token), and a ragged decode step (2 + 1 tokens, then padding).
        token_slots=torch.tensor([-1, -1, -1, 5, -1, -1, -1, 21] + [-1] * 5 + [33, -1, -1], dtype=torch.int32),
        ragged_key=_bf16(g, 4, D), ragged_score=_bf16(g, 4, D),
        ragged_positions=torch.tensor([10, 11, 6, -1], dtype=torch.int32),
        ragged_tail_slots=torch.tensor([ring + 10 % ring, ring + 11 % ring, 3 * ring + 6 % ring, -1],
                                       dtype=torch.int32),
        ragged_slots=torch.tensor([-1, 12, -1, -1], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
    )
    if DEVICE != "cpu":
        base = tail_base.to(DEVICE)
        s = {k: v.to(DEVICE) for k, v in s.items()}
        s["tail_kv_cache"] = base.as_strided((blocks, 2, ring, D), (2 * ring * D + 64, ring * D, D, 1))
    return s


def _args(s):
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
        "append_tail_to_topk": (s["pool_ids"], s["seq_lens"], s["seq_lens"] // P, None, s["topk_offsets"], P),
    }


def _bytes(x):
    return x.detach().cpu().contiguous().view(torch.uint8) if x.dtype != torch.bool else x.cpu()


def _same(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


@pytest.mark.parametrize("pool", [1, 32, 64])
def test_every_pool_size_of_the_contract_compresses_as_on_the_cpu(pool):
    """Every device takes every pool size of the contract (no
    KPOOL_ERROR_UNSUPPORTED on a GPU for a size the CPU takes): the
    engine's compress on this device gives the CPU package's bytes."""
    s = _state()
    g = torch.Generator().manual_seed(pool)
    inputs = (_bf16(g, 5, pool, D), _bf16(g, 5, pool, D), torch.randn((pool, D), generator=g) * 0.5)
    cache = s["kv_cache"].clone()
    ours = engine.compress_and_write_cache(cache, *(t.to(DEVICE) for t in inputs), s["loc"], s["write_mask"],
                                           pool, D, True, True)
    cpu_cache = s["kv_cache"].cpu()
    theirs = torch.ops.kpool.compress_and_write_cache(cpu_cache, *inputs, s["loc"].cpu(), s["write_mask"].cpu(),
                                                      pool, D, True, True)
    assert _same(cache, cpu_cache) and _same(ours, theirs)


def test_every_op_and_out_variant_has_the_packages_schema():
    # The package's ops end with `int arithmetic=0` (a per-call argument);
    # the engine's take it from kpool::torch::ScopedOptions.
    for name in OPS:
        ours, theirs = getattr(engine, name).default._schema, getattr(torch.ops.kpool, name).default._schema
        theirs = str(theirs).split("::", 1)[1].replace(", int arithmetic=0)", ")")
        assert str(ours).split("::", 1)[1] == theirs, name
    for name in OUT_VARIANTS:
        schema = getattr(engine, name).out._schema
        outs = [a.name for a in schema.arguments if a.kwarg_only]
        assert outs and all(a.alias_info is not None and a.alias_info.is_write
                            for a in schema.arguments if a.kwarg_only), str(schema)
        assert not schema.returns, str(schema)  # writes its arguments: nothing to return (torch.compile)


@pytest.mark.parametrize("name", OPS)
def test_the_same_bytes_as_the_packages_op(name):
    ours, theirs = _state(), _state()
    got = getattr(engine, name)(*_args(ours)[name])
    want = getattr(torch.ops.kpool, name)(*_args(theirs)[name])
    assert _same(got, want), name
    for k in ours:  # the tensors written in place too
        assert _same(ours[k], theirs[k]), (name, k)


@pytest.mark.parametrize("name", OUT_VARIANTS)
def test_out_variants_write_the_callers_tensors(name):
    s = _state()
    args = _args(s)[name]
    want = getattr(engine, name)(*args)
    want = want if isinstance(want, tuple) else (want,)
    outs = tuple(torch.full_like(w, 7) for w in want)
    if name == "fwht128_quant_fp8":  # q_scale as [rows]: the C API takes it too
        outs = (outs[0], torch.zeros(want[1].shape[0], dtype=torch.float32, device=DEVICE))
        want = (want[0], want[1].view(-1))
    names = [a.name for a in getattr(engine, name).out._schema.arguments if a.kwarg_only]
    assert getattr(engine, name).out(*args, **dict(zip(names, outs))) is None
    for o, w in zip(outs, want):
        assert _same(o, w), name


def test_rejections_are_torch_errors_naming_the_argument_and_write_nothing():
    s = _state()
    args = list(_args(s)["compress_and_write_cache"])
    before = s["kv_cache"].clone()
    args[4] = s["loc"] + 4 * PAGE  # past the cache
    if DEVICE == "cpu":  # (device calls skip such writes: kpool_exec.index_errors marks them)
        with pytest.raises(ValueError, match=r"kpool::compress_and_write_cache: loc\["):
            engine.compress_and_write_cache(*args)
    args = list(_args(s)["compress_and_write_cache"])
    args[3] = s["ape"].to(torch.bfloat16)
    with pytest.raises(TypeError, match="kpool::compress_and_write_cache: ape"):
        engine.compress_and_write_cache(*args)
    assert torch.equal(s["kv_cache"], before)
    with pytest.raises(TypeError, match="q has dtype Half"):
        engine.fwht128_quant_fp8(s["q"].half())
    with pytest.raises(ValueError, match=r"pool_size = 4294967300 is not a power of two in \[1, 64\]"):
        engine.expand_pools_and_append_tail(s["pool_ids"], s["seq_lens"], 4294967300, False)
    out = torch.zeros((2, 3 * P + P - 1), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="pool_size = 4294967300 is outside int32"):
        engine.expand_pools_and_append_tail.out(s["pool_ids"], s["seq_lens"], 4294967300, False, out=out)
    assert not out.any()


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    torch.library.opcheck(getattr(engine, name).default, _args(_state())[name])


@pytest.mark.parametrize("name", OUT_VARIANTS)
def test_opcheck_out(name):
    s = _state()
    args = _args(s)[name]
    outs = getattr(engine, name)(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    # e4m3 outputs as uint8 (the C API takes either): opcheck's mutation
    # check computes on the tensors, which torch cannot for float8 on the CPU.
    outs = [o.view(torch.uint8).clone() if o.dtype == torch.float8_e4m3fn else o.clone() for o in outs]
    names = [a.name for a in getattr(engine, name).out._schema.arguments if a.kwarg_only]
    torch.library.opcheck(getattr(engine, name).out, args, dict(zip(names, outs)))


def test_compiled_graph_of_ops_matches_eager():
    """A step of an indexer through torch.compile(fullgraph=True): Dynamo
    traces the ops with their Meta kernels; the result is eager's."""
    def step(s):
        q8, qs = engine.fwht128_quant_fp8(s["q"] * 2)
        engine.seed_tail_cache(*_args(s)["seed_tail_cache"])
        engine.compress_and_write_cache(*_args(s)["compress_and_write_cache"])
        engine.decode_update_and_maybe_write_cache_batched(*_args(s)["decode_update_and_maybe_write_cache_batched"])
        tokens = engine.expand_pools_and_append_tail(s["pool_ids"] + 1, s["seq_lens"], P, True)
        return q8, qs, tokens
    eager, compiled = _state(), _state()
    want = step(eager)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(compiled)
    assert _same(got, want)
    for k in eager:
        assert _same(compiled[k], eager[k]), k


def test_warm_up():
    engine.warm_up(torch.device(DEVICE))  # CPU: nothing to load; CUDA: every kernel, then graphs may capture


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA tensors only")
def test_cuda_graph_captures_the_ops_on_the_current_stream():
    """The ops launch on torch's current stream: a graph captured on a side
    stream holds them (a launch on another stream would break the capture)
    and its replay gives eager's bytes."""
    engine.warm_up(torch.device(DEVICE))
    s, eager = _state(), _state()
    want = engine.expand_pools_and_append_tail(eager["pool_ids"], eager["seq_lens"], P, False)
    engine.compress_and_write_cache(*_args(eager)["compress_and_write_cache"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = engine.expand_pools_and_append_tail(s["pool_ids"], s["seq_lens"], P, False)
        engine.compress_and_write_cache(*_args(s)["compress_and_write_cache"])
    graph.replay()
    torch.cuda.synchronize()
    assert _same(got, want) and _same(s["kv_cache"], eager["kv_cache"])


def test_options_of_a_call_count_the_skipped_completions():
    """ops.cpp's decode under kpool::torch::ScopedOptions: the count the
    Python package returns with return_skipped=True, and the same bytes."""
    ours, theirs = _state(), _state()
    for s in (ours, theirs):
        s["tail_slot_mapping"][1, 1] = -1  # request 1's pool ends at position 7 with no tail block
    args = _args(ours)["decode_update_and_maybe_write_cache_batched"]
    skipped = engine.decode_counting_skipped(*args)
    want = kpool.kpool_decode_update_and_maybe_write_cache_batched(
        *_args(theirs)["decode_update_and_maybe_write_cache_batched"][:9], return_skipped=True)
    assert skipped == want == 1
    for k in ours:
        assert _same(ours[k], theirs[k]), k
