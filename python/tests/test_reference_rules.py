"""The reference module's API and shape rules, side by side with kpool's.

The reference (``kpool_triton.py``) stays with the engine and cannot be
imported here (it needs Triton and a GPU), so its rules are written down
below from reading it: each function's parameters and defaults, and the
inputs its asserts and kernels take. Every rule is checked against kpool on
the CPU (numpy arrays, and torch CPU tensors when torch is installed). On a
GPU machine where the reference imports ($KPOOL_REFERENCE_DIR), the GPU
tests at the end also run each accepted case through the reference and
through kpool on CUDA tensors and compare the outputs; they skip elsewhere.

    PYTHONPATH=python python -m pytest python/tests/test_reference_rules.py -q
"""

from __future__ import annotations

import inspect
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "bench")))

import kpool  # noqa: E402

D = 128
REQUIRED = inspect.Parameter.empty

# The reference's public functions: parameters in order, with their defaults.
REFERENCE_SIGNATURES = {
    "fwht128_quant_fp8": [("q", REQUIRED)],
    "kpool_compress_and_write_cache": [
        ("kv_cache", REQUIRED), ("slot_k", REQUIRED), ("slot_score", REQUIRED), ("ape", REQUIRED),
        ("loc", REQUIRED), ("pool_size", REQUIRED), ("head_dim", 128), ("write_mask", None), ("round_scale", True),
        ("return_compressed", False), ("write_cache", True)],
    "kpool_seed_tail_cache": [
        ("tail_kv_cache", REQUIRED), ("key", REQUIRED), ("gate_score", REQUIRED), ("tslot", REQUIRED),
        ("kpool", REQUIRED), ("head_dim", 128)],
    "kpool_decode_update_and_maybe_write_cache_batched": [
        ("kv_cache", REQUIRED), ("tail_kv_cache", REQUIRED), ("tail_slot_mapping", REQUIRED), ("key", REQUIRED),
        ("slot_score", REQUIRED), ("ape", REQUIRED), ("slot_mapping", REQUIRED), ("positions", REQUIRED),
        ("pool_size", REQUIRED), ("head_dim", 128), ("round_scale", True)],
    "history_group_budget_for_topk": [("topk", REQUIRED), ("pool_size", REQUIRED)],
    "expand_pools_to_tokens": [
        ("group_ids", REQUIRED), ("group_valid", REQUIRED), ("topk", REQUIRED), ("pool_size", REQUIRED),
        ("page_table", None), ("topk_offsets", None)],
    "append_tail_to_topk": [
        ("topk_result", REQUIRED), ("seq_lens", REQUIRED), ("pool_lens", REQUIRED), ("pool_size", REQUIRED),
        ("page_table", None), ("topk_offsets", None)],
    "expand_pools_and_append_tail": [("pool_ids", REQUIRED), ("seq_lens", REQUIRED), ("pool_size", REQUIRED)],
}


@pytest.mark.parametrize("name", sorted(REFERENCE_SIGNATURES))
def test_signature_is_the_references(name):
    """Same parameters, order and defaults; kpool's extras (decode's
    return_skipped, the fused expand's bound_pool_ids, the expand ops' out,
    every op's arithmetic) come after them, with defaults that keep the
    reference's behaviour."""
    params = list(inspect.signature(getattr(kpool, name)).parameters.values())
    want = REFERENCE_SIGNATURES[name]
    assert [(p.name, p.default) for p in params[:len(want)]] == want
    assert all(p.default is False or p.default is None for p in params[len(want):])  # (out=, arithmetic=)


# --- the reference's input rules, each an input it takes --------------------------------------------------
def _bf16(rng, shape):
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _decode_case(rng, P=4, B=3, N=5, dtypes=(np.int32, np.int32, np.int32)):
    """Caches and inputs of one decode step (B requests x N tokens, ring P),
    the three index tensors in ``dtypes`` (tail_slot_mapping, slot_mapping,
    positions)."""
    ring, page = P, 16
    kv = rng.integers(0, 256, (4, page, D + 4), dtype=np.uint8)
    tail = _bf16(rng, (B + 1, 2, ring, D))
    pos = np.arange(N)[None, :] + 3 * np.arange(B)[:, None]
    tsm = np.arange(B)[:, None] * ring + pos % ring
    sm = np.where(pos % P == P - 1, np.arange(B * N).reshape(B, N), -1)
    key, score = _bf16(rng, (B, N, D)), _bf16(rng, (B, N, D))
    ape = rng.standard_normal((P, D)).astype(np.float32)
    return kv, tail, tsm.astype(dtypes[0]), key, score, ape, sm.astype(dtypes[1]), pos.astype(dtypes[2]), P


def _decode(case):
    kv, tail = case[0].copy(), case[1].copy()
    skipped = kpool.kpool_decode_update_and_maybe_write_cache_batched(kv, tail, *case[2:], return_skipped=True)
    return kv, tail, skipped


@pytest.mark.parametrize("dtypes", [(np.int64,) * 3, (np.int32, np.int64, np.int64), (np.int16, np.int32, np.int64),
                                    (np.int16,) * 3, (np.uint8, np.int32, np.int32)],
                         ids=lambda d: "-".join(np.dtype(t).name for t in d))
def test_decode_takes_the_integer_index_dtypes_the_reference_loads(dtypes):
    """The reference's kernel loads its three index tensors as they come;
    kpool gives the bytes of the all-int32 call for every mix."""
    base = _decode_case(np.random.default_rng(1))
    want = _decode(base)
    got = _decode(_decode_case(np.random.default_rng(1), dtypes=dtypes))
    assert not np.array_equal(want[0], base[0])
    for w, g in zip(want[:2], got[:2]):
        np.testing.assert_array_equal(w, g)
    assert want[2] == got[2]


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.uint8])
def test_seed_takes_any_integer_tslot(dtype):
    rng = np.random.default_rng(2)
    tail = np.zeros((3, 2, 4, D), np.uint16)
    key, gate = _bf16(rng, (6, D)), _bf16(rng, (6, D))
    tslot = np.array([0, 1, 2, 3, 4, 5])
    want = tail.copy()
    kpool.kpool_seed_tail_cache(want, key, gate, tslot.astype(np.int32), 4)
    kpool.kpool_seed_tail_cache(tail, key, gate, tslot.astype(dtype), 4)
    assert want.any()
    np.testing.assert_array_equal(tail, want)


@pytest.mark.parametrize("table_dtype", [np.int32, np.int64])
def test_page_table_with_more_rows_than_the_batch(table_dtype):
    """torch.gather in the reference takes a table with more rows than the
    index (an engine's persistent block table): rows past the batch are not
    read."""
    rng = np.random.default_rng(3)
    rows, G, P = 5, 6, 4
    ids = rng.integers(-1, 10, (rows, G)).astype(np.int64)
    valid = rng.random((rows, G)) < 0.8
    table = rng.integers(0, 1 << 20, (8, 10)).astype(table_dtype)
    got = kpool.expand_pools_to_tokens(ids, valid, G * P, P, page_table=table)
    np.testing.assert_array_equal(got, kpool.expand_pools_to_tokens(ids, valid, G * P, P,
                                                                     page_table=table[:rows].copy()))
    seq = np.array([3, 9, 22, 4, 17], np.int64)
    plens = seq // P
    tail = kpool.append_tail_to_topk(got, seq, plens, P, page_table=table)
    np.testing.assert_array_equal(tail, kpool.append_tail_to_topk(got, seq, plens, P, page_table=table[:rows].copy()))
    with pytest.raises(kpool.KpoolValueError, match="page_table"):
        kpool.expand_pools_to_tokens(ids, valid, G * P, P, page_table=table[:rows - 1])


def test_negative_seq_len_is_computed_as_the_reference_does():
    """The reference's fused kernel truncates seq_len // P: a negative
    seq_len has a tail count <= 0, so its row has no tail."""
    ids = np.array([[0, 1], [2, -1], [1, 0]], np.int32)
    seq = np.array([-3, -8, 6], np.int32)
    for bound in (False, True):
        out = kpool.expand_pools_and_append_tail(ids, seq, 4, bound_pool_ids=bound)
        assert (out[:2, 8:] == -1).all()
        np.testing.assert_array_equal(out[2, 8:], [4, 5, -1])
        if not bound:
            np.testing.assert_array_equal(out[0, :8], np.arange(8))


def test_budget_of_any_pool_size():
    assert kpool.history_group_budget_for_topk(12, 3) == 4  # the reference's asserts only topk % P == 0
    with pytest.raises(kpool.KpoolValueError, match="topk"):
        kpool.history_group_budget_for_topk(12, 8)


# --- the torch path: every wrong argument is a KpoolError naming it ---------------------------------------
def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def _compress_args(torch):
    kv = torch.zeros((2, 16, D + 4), dtype=torch.uint8)
    k = torch.randn((3, 4, D)).to(torch.bfloat16)
    return kv, k, k.clone(), torch.zeros((4, D)), torch.tensor([0, 1, 2]), 4


@pytest.mark.parametrize("bad", ["none", "list", "numpy"])
def test_torch_path_names_the_wrong_argument(bad):
    torch = _torch()
    kv, k, s, ape, loc, P = _compress_args(torch)
    before = kv.clone()
    wrong = {"none": None, "list": [0, 1, 2], "numpy": np.array([0, 1, 2])}[bad]
    with pytest.raises(kpool.KpoolError, match="loc") as info:
        kpool.kpool_compress_and_write_cache(kv, k, s, ape, wrong, P)
    assert "int64 (" not in str(info.value)
    with pytest.raises(kpool.KpoolError, match="slot_score"):
        kpool.kpool_compress_and_write_cache(kv, k, None if bad == "none" else wrong, ape, loc, P)
    case = _decode_case(np.random.default_rng(4))
    tensors = [torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in case]
    for i, name in [(2, "tail_slot_mapping"), (6, "slot_mapping"), (7, "positions")]:
        args = list(tensors)
        args[i] = wrong
        with pytest.raises(kpool.KpoolError, match=name):
            kpool.kpool_decode_update_and_maybe_write_cache_batched(*args)
    assert torch.equal(kv, before)


def test_torch_messages_name_dtypes():
    torch = _torch()
    kv, k, s, ape, loc, P = _compress_args(torch)
    with pytest.raises(kpool.KpoolTypeError) as info:
        kpool.kpool_compress_and_write_cache(kv, k, s, ape.to(torch.float64), loc, P)
    assert "float64" in str(info.value)
    with pytest.raises(kpool.KpoolTypeError) as info:
        kpool.kpool_compress_and_write_cache(kv, k, s, ape.to(torch.int32), loc, P)
    assert "has dtype int32, expected float32" in str(info.value)


@pytest.mark.parametrize("dtypes", [(np.int64,) * 3, (np.int32, np.int64, np.int16)],
                         ids=lambda d: "-".join(np.dtype(t).name for t in d))
def test_torch_decode_takes_integer_index_dtypes(dtypes):
    torch = _torch()
    want = _decode(_decode_case(np.random.default_rng(5)))
    case = _decode_case(np.random.default_rng(5), dtypes=dtypes)
    t = [torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in case]
    t[1] = t[1].view(torch.bfloat16)
    t[3], t[4] = t[3].view(torch.bfloat16), t[4].view(torch.bfloat16)
    kpool.kpool_decode_update_and_maybe_write_cache_batched(*t)
    np.testing.assert_array_equal(t[0].numpy(), want[0])
    np.testing.assert_array_equal(t[1].view(torch.uint16).numpy(), want[1])


# --- on a GPU: the accepted cases through the reference and kpool, compared --------------------------------
def _gpu_reference():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    if "cuda" not in kpool.version():
        pytest.skip(f"{kpool.library_path()} has no CUDA path")
    import workloads

    try:
        return torch, workloads.import_reference()
    except ImportError as e:
        pytest.skip(f"the Triton reference does not import: {e}")


@pytest.mark.parametrize("dtypes", [(np.int64,) * 3, (np.int32, np.int64, np.int64)],
                         ids=lambda d: "-".join(np.dtype(t).name for t in d))
def test_gpu_decode_index_dtypes_against_the_reference(dtypes):
    torch, ref = _gpu_reference()
    case = _decode_case(np.random.default_rng(6), dtypes=dtypes)
    results = []
    for module in (ref, kpool):
        t = [torch.from_numpy(np.ascontiguousarray(x)).cuda() if isinstance(x, np.ndarray) else x for x in case]
        t[1], t[3], t[4] = (x.view(torch.bfloat16) for x in (t[1], t[3], t[4]))
        module.kpool_decode_update_and_maybe_write_cache_batched(*t)
        results.append((t[0].cpu(), t[1].view(torch.int16).cpu()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_gpu_block_table_and_negative_seq_len_against_the_reference():
    torch, ref = _gpu_reference()
    rng = np.random.default_rng(7)
    rows, G, P = 5, 6, 4
    ids = torch.from_numpy(rng.integers(-1, 10, (rows, G))).cuda()
    valid = torch.from_numpy(rng.random((rows, G)) < 0.8).cuda()
    table = torch.from_numpy(rng.integers(0, 1 << 20, (8, 10)).astype(np.int32)).cuda()
    got = kpool.expand_pools_to_tokens(ids, valid, G * P, P, page_table=table)
    assert torch.equal(got, ref.expand_pools_to_tokens(ids, valid, G * P, P, page_table=table))
    seq = torch.tensor([3, 9, 22, 4, 17], dtype=torch.int32).cuda()
    assert torch.equal(kpool.append_tail_to_topk(got, seq, seq // P, P, page_table=table),
                       ref.append_tail_to_topk(got, seq, seq // P, P, page_table=table))
    neg = torch.tensor([-3, -8, 6, 0, 5], dtype=torch.int32).cuda()
    assert torch.equal(kpool.expand_pools_and_append_tail(ids, neg, P), ref.expand_pools_and_append_tail(ids, neg, P))
    assert kpool.history_group_budget_for_topk(12, 3) == ref.history_group_budget_for_topk(12, 3)
