"""The entry points that take what an engine holds, against the engine's own
call sequences written in torch as the engine writes them (vLLM's sparse
indexer over the drop-in ops), byte for byte on the CPU:

- the prefill insert: every token a row, its pool gathered (``k[idx]``),
  masked where it has no slot, the slots as int64, compress, then seed;
- the ragged decode: repeat_interleave, cumsum and index_put into padded
  ``[B, max]`` grids, then the batched decode;
- the selection into rows of a preallocated buffer (``out=``), on numpy
  arrays and torch tensors, and its errors.

The GPU side (the same sequences on CUDA, and their timing) is in
test_gpu_side_by_side.py and bench/engine_sequences.py.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import kpool  # noqa: E402

try:
    kpool.version()
except OSError as e:
    pytest.skip(f"libkpool.so does not load: {e}", allow_module_level=True)

D, PAGE = 128, 16


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _prefill_batch(g, P, slot_dtype, lens=(9, 1, 23, 6), starts=(0, 5, 2, 13)):
    """Requests' chunks back to back (some starting inside a pool), key and
    gate column slices of a fused projection, a slot on each pool's last
    token (one in four -1), tail slots block * ring + pos % ring."""
    ring = 2 * P
    slots, tail_slots, free = [], [], iter(torch.randperm(8 * PAGE, generator=g).tolist())
    for r, (n, start) in enumerate(zip(lens, starts)):
        for pos in range(start, start + n):
            end = pos % P == P - 1
            slots.append(next(free) if end and torch.rand(1, generator=g).item() > 0.25 else -1)
            tail_slots.append((2 * r + 1) * ring + pos % ring)
    n = len(slots)
    fused = torch.randn((n, 320), generator=g).to(torch.bfloat16)
    return dict(key=fused[:, :D], gate=fused[:, D + 32:2 * D + 32], ape=torch.randn((P, D), generator=g) * 0.5,
                slots=torch.tensor(slots, dtype=slot_dtype), tail_slots=torch.tensor(tail_slots, dtype=slot_dtype),
                kv_cache=torch.randint(0, 256, (8, PAGE, D + 4), generator=g, dtype=torch.uint8),
                tail=torch.randn((2 * len(lens) + 2, 2, ring, D), generator=g).to(torch.bfloat16))


def _engine_prefill_insert(b, P, kv_cache, tail):
    """The engine's sequence today (vLLM's sparse indexer)."""
    n = b["key"].shape[0]
    i = torch.arange(n)
    write_mask = (b["slots"] >= 0) & (i >= P - 1)
    idx = (i[:, None] - (P - 1) + torch.arange(P)).clamp_(min=0)
    kpool.kpool_compress_and_write_cache(kv_cache, b["key"][idx], b["gate"][idx], b["ape"], b["slots"].to(torch.int64),
                                         P, write_mask=write_mask)
    kpool.kpool_seed_tail_cache(tail, b["key"], b["gate"], b["tail_slots"], P)


@pytest.mark.parametrize("P", [4, 8, 16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", [False, True])
def test_prefill_insert_is_the_engine_sequence(P, slot_dtype, seed):
    b = _prefill_batch(torch.Generator().manual_seed(P), P, slot_dtype)
    want_cache, want_tail = b["kv_cache"].clone(), b["tail"].clone()
    _engine_prefill_insert(b, P, want_cache, want_tail)
    if not seed:
        want_tail = b["tail"]
    got_cache, got_tail = b["kv_cache"].clone(), b["tail"].clone()
    kpool.kpool_compress_tokens_and_write_cache(got_cache, b["key"], b["gate"], b["ape"], b["slots"], P,
                                                tail_kv_cache=got_tail if seed else None,
                                                tail_slot_mapping=b["tail_slots"] if seed else None)
    assert torch.equal(_bytes(got_cache), _bytes(want_cache))
    assert torch.equal(_bytes(got_tail), _bytes(want_tail))
    assert not torch.equal(got_cache, b["kv_cache"])  # pools were written


def test_prefill_insert_through_torch_ops_and_compile():
    P = 4
    b = _prefill_batch(torch.Generator().manual_seed(7), P, torch.int32)
    want_cache, want_tail = b["kv_cache"].clone(), b["tail"].clone()
    _engine_prefill_insert(b, P, want_cache, want_tail)

    def insert(kv_cache, tail, key, gate, ape, slots, tail_slots):
        kpool.kpool_compress_tokens_and_write_cache(kv_cache, key, gate, ape, slots, P, tail_kv_cache=tail,
                                                    tail_slot_mapping=tail_slots)

    got_cache, got_tail = b["kv_cache"].clone(), b["tail"].clone()
    torch._dynamo.reset()
    torch.compile(insert, fullgraph=True, backend="aot_eager")(got_cache, got_tail, b["key"], b["gate"], b["ape"],
                                                                b["slots"], b["tail_slots"])
    assert torch.equal(_bytes(got_cache), _bytes(want_cache)) and torch.equal(_bytes(got_tail), _bytes(want_tail))


def test_prefill_insert_on_numpy_arrays():
    P = 4
    b = _prefill_batch(torch.Generator().manual_seed(3), P, torch.int64)
    want_cache, want_tail = b["kv_cache"].clone(), b["tail"].clone()
    _engine_prefill_insert(b, P, want_cache, want_tail)
    cache, tail = b["kv_cache"].numpy().copy(), b["tail"].view(torch.uint16).numpy().copy()
    key, gate = b["key"].view(torch.uint16).numpy(), b["gate"].view(torch.uint16).numpy()  # strided slices
    kpool.kpool_compress_tokens_and_write_cache(cache, key, gate, b["ape"].numpy(), b["slots"].numpy(), P,
                                                tail_kv_cache=tail, tail_slot_mapping=b["tail_slots"].numpy())
    assert np.array_equal(cache, want_cache.numpy())
    assert np.array_equal(tail, want_tail.view(torch.uint16).numpy())


def test_prefill_insert_errors_name_the_argument():
    P = 4
    b = _prefill_batch(torch.Generator().manual_seed(5), P, torch.int32)
    cache = b["kv_cache"].clone()
    with pytest.raises(kpool.KpoolValueError, match="tail_slot_mapping"):
        kpool.kpool_compress_tokens_and_write_cache(cache, b["key"], b["gate"], b["ape"], b["slots"], P,
                                                    tail_kv_cache=b["tail"])
    bad = b["slots"].clone()
    bad[torch.nonzero(bad >= 0)[-1]] = 8 * PAGE
    with pytest.raises(kpool.KpoolValueError, match=r"slot_mapping\[\d+\] = 128 is outside the cache"):
        kpool.kpool_compress_tokens_and_write_cache(cache, b["key"], b["gate"], b["ape"], bad, P)
    with pytest.raises(kpool.KpoolTypeError, match="slot_mapping"):
        kpool.kpool_compress_tokens_and_write_cache(cache, b["key"], b["gate"], b["ape"], b["slots"].float(), P)
    assert torch.equal(cache, b["kv_cache"])


@pytest.mark.parametrize("P", [4, 16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_chunks_with_positions_write_what_one_call_writes(P, index_dtype):
    """A chunked prefill whose second chunks start inside a pool, with
    positions, against the whole prefill in one call."""
    g = torch.Generator().manual_seed(40 + P)
    lens, ring = [3 * P + 1, P, 2 * P - 1, 5 * P + 3], 2 * P
    splits = [int(torch.randint(1, n + 1, (1,), generator=g)) for n in lens]
    free = iter(torch.randperm(8 * PAGE, generator=g).tolist())
    rows = []  # (request, position, slot, tail slot)
    for r, n in enumerate(lens):
        rows += [(r, p, next(free) if p % P == P - 1 else -1, r * ring + p % ring) for p in range(n)]
    key, gate = torch.randn((len(rows), 2, D), generator=g).to(torch.bfloat16).unbind(1)
    ape = torch.randn((P, D), generator=g) * 0.5
    cache0 = torch.randint(0, 256, (8, PAGE, D + 4), generator=g, dtype=torch.uint8)
    tail0 = torch.randn((len(lens), 2, ring, D), generator=g).to(torch.bfloat16)

    def column(which, idx, dtype=index_dtype):
        return torch.tensor([rows[i][which] for i in idx], dtype=dtype)

    whole_cache, tail = cache0.clone(), tail0.clone()
    every = range(len(rows))
    kpool.kpool_compress_tokens_and_write_cache(whole_cache, key, gate, ape, column(2, every), P, tail_kv_cache=tail,
                                                tail_slot_mapping=column(3, every))
    chunked_cache, tail = cache0.clone(), tail0.clone()
    for part in (0, 1):
        idx = [i for i, (r, p, _, _) in enumerate(rows) if (p < splits[r]) == (part == 0)]
        kpool.kpool_compress_tokens_and_write_cache(chunked_cache, key[idx], gate[idx], ape, column(2, idx), P,
                                                    tail_kv_cache=tail, tail_slot_mapping=column(3, idx),
                                                    positions=column(1, idx, torch.int64))  # a mix: converted
    assert torch.equal(chunked_cache, whole_cache)


# --- the ragged decode ----------------------------------------------------------------------------
def _ragged_step(g, P, index_dtype, counts=(2, 0, 1, 4, 3, 1), padding=2):
    """A decode step mixing plain decode (1 token) and speculative verify
    (2-4), one request empty, then graph-padding tokens."""
    ring, blocks = 2 * P, 2 * len(counts) + 2
    ctx = torch.randint(P, 40, (len(counts),), generator=g).tolist()
    free = iter(torch.randperm(8 * PAGE, generator=g).tolist())
    pos, tsm, sm = [], [], []
    for r, (c, n) in enumerate(zip(ctx, counts)):
        for p in range(c, c + n):
            pos.append(p)
            tsm.append((2 * r + 1) * ring + p % ring)
            sm.append(next(free) if p % P == P - 1 else -1)
    pos += [-1] * padding
    tsm += [-1] * padding
    sm += [-1] * padding
    T = len(pos)
    qsl = [0]
    for n in counts:
        qsl.append(qsl[-1] + n)
    as_index = lambda v: torch.tensor(v, dtype=index_dtype)  # noqa: E731
    return dict(key=torch.randn((T, D), generator=g).to(torch.bfloat16),
                score=torch.randn((T, D), generator=g).to(torch.bfloat16),
                ape=torch.randn((P, D), generator=g) * 0.5, positions=as_index(pos), tail_slots=as_index(tsm),
                slots=as_index(sm), query_start_loc=as_index(qsl), max_query_len=max(counts),
                kv_cache=torch.randint(0, 256, (8, PAGE, D + 4), generator=g, dtype=torch.uint8),
                tail=torch.randn((blocks, 2, ring, D), generator=g).to(torch.bfloat16))


def _engine_ragged_decode(s, P, kv_cache, tail):
    """The engine's glue today: the flat tokens scattered into padded
    [B, max] grids (key and score 0, every index -1), then the batched op."""
    qsl = s["query_start_loc"].to(torch.int64)
    counts = qsl[1:] - qsl[:-1]
    B, N, T = counts.numel(), s["max_query_len"], int(qsl[-1])
    request = torch.repeat_interleave(torch.arange(B), counts, output_size=T)
    within = torch.arange(T) - torch.cumsum(counts, 0)[request] + counts[request]
    grids = {}
    for name, fill in (("key", 0), ("score", 0), ("tail_slots", -1), ("slots", -1), ("positions", -1)):
        x = s[name]
        grid = torch.full((B, N) + tuple(x.shape[1:]), fill, dtype=x.dtype)
        grid.index_put_((request, within), x[:T])
        grids[name] = grid
    kpool.kpool_decode_update_and_maybe_write_cache_batched(kv_cache, tail, grids["tail_slots"], grids["key"],
                                                            grids["score"], s["ape"], grids["slots"],
                                                            grids["positions"], P)


@pytest.mark.parametrize("P", [4, 8, 16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bounded", [True, False])
def test_ragged_decode_is_the_engine_sequence(P, index_dtype, bounded):
    s = _ragged_step(torch.Generator().manual_seed(P), P, index_dtype)
    want_cache, want_tail = s["kv_cache"].clone(), s["tail"].clone()
    _engine_ragged_decode(s, P, want_cache, want_tail)
    got_cache, got_tail = s["kv_cache"].clone(), s["tail"].clone()
    kpool.kpool_decode_update_and_maybe_write_cache_ragged(
        got_cache, got_tail, s["tail_slots"], s["key"], s["score"], s["ape"], s["slots"], s["positions"],
        s["query_start_loc"], P, max_query_len=s["max_query_len"] if bounded else None)
    assert torch.equal(_bytes(got_cache), _bytes(want_cache))
    assert torch.equal(_bytes(got_tail), _bytes(want_tail))
    assert not torch.equal(got_tail, s["tail"])  # tokens were stashed


def test_ragged_decode_through_compile_and_with_mixed_index_dtypes():
    P = 4
    s = _ragged_step(torch.Generator().manual_seed(11), P, torch.int32)
    want_cache, want_tail = s["kv_cache"].clone(), s["tail"].clone()
    _engine_ragged_decode(s, P, want_cache, want_tail)

    def step(kv_cache, tail, tsm, key, score, ape, sm, pos, qsl):
        kpool.kpool_decode_update_and_maybe_write_cache_ragged(kv_cache, tail, tsm, key, score, ape, sm, pos, qsl, P,
                                                               max_query_len=4)

    got_cache, got_tail = s["kv_cache"].clone(), s["tail"].clone()
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True, backend="aot_eager")(
        got_cache, got_tail, s["tail_slots"], s["key"], s["score"], s["ape"], s["slots"].to(torch.int64),
        s["positions"], s["query_start_loc"])
    assert torch.equal(_bytes(got_cache), _bytes(want_cache)) and torch.equal(_bytes(got_tail), _bytes(want_tail))


def test_ragged_decode_rejects_hostile_offsets():
    P = 4
    s = _ragged_step(torch.Generator().manual_seed(13), P, torch.int32)
    cache, tail = s["kv_cache"].clone(), s["tail"].clone()
    args = lambda qsl, bound=None: (cache, tail, s["tail_slots"], s["key"], s["score"], s["ape"], s["slots"],  # noqa
                                    s["positions"], qsl, P)
    decreasing = s["query_start_loc"].clone()
    decreasing[3] = decreasing[2] - 1
    with pytest.raises(kpool.KpoolValueError, match=r"query_start_loc\[3\]"):
        kpool.kpool_decode_update_and_maybe_write_cache_ragged(*args(decreasing))
    past = s["query_start_loc"].clone()
    past[-1] = s["key"].shape[0] + 1
    with pytest.raises(kpool.KpoolValueError, match=r"query_start_loc\[6\] = \d+ is past the \d+ tokens"):
        kpool.kpool_decode_update_and_maybe_write_cache_ragged(*args(past))
    with pytest.raises(kpool.KpoolValueError, match="more than max_query_len = 3"):
        kpool.kpool_decode_update_and_maybe_write_cache_ragged(*args(s["query_start_loc"]), max_query_len=3)
    with pytest.raises(kpool.KpoolValueError, match="max_query_len"):
        kpool.kpool_decode_update_and_maybe_write_cache_ragged(*args(s["query_start_loc"]), max_query_len=0)
    assert torch.equal(cache, s["kv_cache"]) and torch.equal(tail, s["tail"])


# --- the selection with out= -----------------------------------------------------------------------
def _selection(g, rows=5, groups=6, P=4):
    seq = torch.randint(P, 200, (rows,), generator=g, dtype=torch.int32)
    ids = (torch.rand((rows, groups), generator=g) * (seq[:, None] // P)).to(torch.int32)
    ids[0, 2] = -1
    return ids, seq


@pytest.mark.parametrize("on", ["torch", "numpy"])
def test_selection_writes_rows_of_a_wider_buffer(on):
    P = 4
    ids, seq = _selection(torch.Generator().manual_seed(1), P=P)
    want = kpool.expand_pools_and_append_tail(ids, seq, P)
    buffer = torch.full((9, want.shape[1] + 7), -5, dtype=torch.int32)
    if on == "numpy":
        buf = buffer.numpy()
        got = kpool.expand_pools_and_append_tail(ids.numpy(), seq.numpy(), P, out=buf[2:2 + ids.shape[0], 3:-4])
        assert got.base is not None and np.shares_memory(got, buf)
    else:
        got = kpool.expand_pools_and_append_tail(ids, seq, P, out=buffer[2:2 + ids.shape[0], 3:-4])
        assert got.data_ptr() == buffer[2, 3:].data_ptr()
    inner = buffer[2:2 + ids.shape[0], 3:-4]
    assert torch.equal(inner, want)
    rest = buffer.clone()
    rest[2:2 + ids.shape[0], 3:-4] = -5
    assert bool((rest == -5).all())  # nothing outside the rows moved


def test_out_forms_of_the_other_expand_ops():
    P = 4
    ids, seq = _selection(torch.Generator().manual_seed(2), P=P)
    want = kpool.expand_pools_to_tokens(ids, ids >= 0, ids.shape[1] * P, P)
    buffer = torch.full((ids.shape[0], want.shape[1] + 3), -5, dtype=torch.int32)
    out = kpool.expand_pools_to_tokens(ids, ids >= 0, ids.shape[1] * P, P, out=buffer[:, 1:-2])
    assert out.data_ptr() == buffer[:, 1:].data_ptr() and torch.equal(out, want)
    want = kpool.append_tail_to_topk(want, seq, seq // P, P)
    buffer = torch.full((ids.shape[0] + 2, want.shape[1]), -5, dtype=torch.int32)
    assert torch.equal(kpool.append_tail_to_topk(out, seq, seq // P, P, out=buffer[1:-1]), want)
    assert bool((buffer[0] == -5).all() and (buffer[-1] == -5).all())


def test_selection_out_errors_name_the_argument():
    P = 4
    ids, seq = _selection(torch.Generator().manual_seed(3), P=P)
    cols = ids.shape[1] * P + P - 1
    with pytest.raises(kpool.KpoolTypeError, match=r"bound_pool_ids is a Tensor: pass the output buffer as out="):
        kpool.expand_pools_and_append_tail(ids, seq, P, torch.empty((ids.shape[0], cols), dtype=torch.int32))
    with pytest.raises(kpool.KpoolTypeError, match="out"):
        kpool.expand_pools_and_append_tail(ids, seq, P, out=torch.empty((ids.shape[0], cols), dtype=torch.int64))
    with pytest.raises(kpool.KpoolValueError, match="out"):
        kpool.expand_pools_and_append_tail(ids, seq, P, out=torch.empty((ids.shape[0], cols + 1), dtype=torch.int32))
    with pytest.raises(kpool.KpoolTypeError, match="out is a list"):
        kpool.expand_pools_and_append_tail(ids, seq, P, out=[0])


def test_selection_out_under_compile_stays_in_place():
    P = 4
    ids, seq = _selection(torch.Generator().manual_seed(4), P=P)
    want = kpool.expand_pools_and_append_tail(ids, seq, P)

    def select(buffer, ids, seq):
        kpool.expand_pools_and_append_tail(ids, seq, P, out=buffer[: ids.shape[0]])
        return buffer.sum()

    buffer = torch.full((ids.shape[0] + 3, want.shape[1]), -5, dtype=torch.int32)
    torch._dynamo.reset()
    torch.compile(select, fullgraph=True, backend="aot_eager")(buffer, ids, seq)
    assert torch.equal(buffer[: ids.shape[0]], want) and bool((buffer[ids.shape[0]:] == -5).all())
