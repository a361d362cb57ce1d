"""The Python package on the CPU library: every op against the reference's
seed-0 dump (tests/data/dump_seed0), bad input, in-place writes, and the
reference-defect fixes. numpy only; torch CPU tensors are checked too when
torch is installed.

    PYTHONPATH=python python -m pytest python/tests/test_cpu.py -q
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kpool  # noqa: E402

DUMP = os.environ.get("KPOOL_DUMP_DIR", os.path.join(REPO, "tests", "data", "dump_seed0"))
D = kpool.INDEX_HEAD_DIM
PAGE, ROW = 64, D + 4

# dump dtype -> the numpy dtype we hand to kpool (bf16 bits as uint16, e4m3 as uint8)
_NP = dict(bfloat16=np.uint16, float8_e4m3fn=np.uint8, bool=np.bool_, uint8=np.uint8, int32=np.int32,
           int64=np.int64, float32=np.float32)


def _manifest():
    path = os.path.join(DUMP, "manifest.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return json.load(f)["cases"]


CASES = _manifest()


def _cases(op_prefix):
    found = [c for c in CASES if c["op"].startswith(op_prefix)]
    return pytest.mark.parametrize("case", found, ids=[c["name"] for c in found])


def _load(entry):
    """(base array, the view the op saw) of one dumped tensor."""
    a = np.fromfile(os.path.join(DUMP, entry["file"]), dtype=_NP[entry["dtype"]])
    a = a.reshape(entry["shape"])
    v = entry.get("view")
    if v is None:
        return a, a
    item = a.itemsize
    flat = a.reshape(-1)[v["storage_offset"]:]
    view = np.lib.stride_tricks.as_strided(flat, v["shape"], [s * item for s in v["strides"]])
    return a, view


def _inputs(case):
    return {k: _load(e) for k, e in case["inputs"].items()}


def _expected(case, key):
    return _load(case["outputs"][key])[0]


def _assert_bytes_equal(got, want, what):
    g, w = np.ascontiguousarray(got).view(np.uint8).reshape(-1), np.ascontiguousarray(want).view(np.uint8)
    w = w.reshape(-1)
    assert g.shape == w.shape, f"{what}: {g.shape} bytes vs {w.shape}"
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} of {g.size} bytes differ, first at byte {bad[0]}"


def test_library_loads():
    assert kpool.version().startswith("kpool ")
    assert os.path.isfile(kpool.library_path())


def test_dump_present():
    assert CASES, f"no dump at {DUMP} (manifest.json)"


# --- every op against the dump ------------------------------------------------------------
@_cases("fwht128_quant_fp8")
def test_dump_fwht(case):
    ins = _inputs(case)
    q_fp8, q_scale = kpool.fwht128_quant_fp8(ins["q"][1])
    assert q_fp8.dtype == np.uint8 and q_fp8.shape == (ins["q"][1].shape[0], D)
    assert q_scale.dtype == np.float32 and q_scale.shape == (ins["q"][1].shape[0], 1)
    _assert_bytes_equal(q_fp8, _expected(case, "q_fp8"), "q_fp8")
    _assert_bytes_equal(q_scale, _expected(case, "q_scale"), "q_scale")


@_cases("kpool_compress_and_write_cache")
def test_dump_compress(case):
    ins, a = _inputs(case), case["args"]
    kv = ins["kv_cache"][1]
    rc, wc = a.get("return_compressed", False), a.get("write_cache", True)
    r = kpool.kpool_compress_and_write_cache(
        kv, ins["slot_k"][1], ins["slot_score"][1], ins["ape"][1], ins["loc"][1], a["pool_size"],
        head_dim=a["head_dim"], write_mask=ins["write_mask"][1] if "write_mask" in ins else None,
        round_scale=a["round_scale"], return_compressed=rc, write_cache=wc)
    _assert_bytes_equal(kv, _expected(case, "kv_cache"), "kv_cache")
    if rc:
        ck, cs = r
        assert ck.dtype == np.uint8 and ck.shape == (ins["slot_k"][1].shape[0], D)
        assert cs.dtype == np.float32 and cs.shape == (ins["slot_k"][1].shape[0],)
        _assert_bytes_equal(ck, _expected(case, "compressed_k"), "compressed_k")
        _assert_bytes_equal(cs, _expected(case, "compressed_scale"), "compressed_scale")
    else:
        assert r is None


@_cases("kpool_seed_tail_cache")
def test_dump_seed(case):
    ins, a = _inputs(case), case["args"]
    base, tail = ins["tail_kv_cache"]
    assert kpool.kpool_seed_tail_cache(tail, ins["key"][1], ins["gate_score"][1], ins["tslot"][1], a["kpool"],
                                       head_dim=a["head_dim"]) is None
    _assert_bytes_equal(base, _expected(case, "tail_kv_cache"), "tail_kv_cache")


def _skipped_completion_slots(ins, pool_size):
    """Cache slots of completions without a tail block: the reference wrote
    block-0 garbage there, we write nothing (SPEC, reference defects)."""
    ts, sm, pos = (ins[k][1].reshape(-1) for k in ("tail_slot_mapping", "slot_mapping", "positions"))
    hit = (sm >= 0) & (pos >= 0) & (pos % pool_size == pool_size - 1) & (ts < 0)
    return sm[hit].tolist()


@_cases("kpool_decode_update_and_maybe_write_cache_batched")
def test_dump_decode(case):
    ins, a = _inputs(case), case["args"]
    P = a["pool_size"]
    kv = ins["kv_cache"][1]
    kv_before = kv.copy()
    base, tail = ins["tail_kv_cache"]
    skipped = kpool.kpool_decode_update_and_maybe_write_cache_batched(
        kv, tail, ins["tail_slot_mapping"][1], ins["key"][1], ins["slot_score"][1], ins["ape"][1],
        ins["slot_mapping"][1], ins["positions"][1], P, head_dim=a["head_dim"], round_scale=a["round_scale"],
        return_skipped=True)
    excused = _skipped_completion_slots(ins, P)
    assert skipped == len(excused)
    want = _expected(case, "kv_cache").copy()
    flat_want, flat_before = want.reshape(-1), kv_before.reshape(-1)
    page_bytes = kv.strides[0]
    for loc in excused:  # expected there: the input bytes (we write nothing)
        o, t = loc // PAGE * page_bytes, loc % PAGE
        for lo, hi in [(o + t * D, o + t * D + D), (o + PAGE * D + 4 * t, o + PAGE * D + 4 * t + 4)]:
            flat_want[lo:hi] = flat_before[lo:hi]
    _assert_bytes_equal(kv, want, "kv_cache")
    _assert_bytes_equal(base, _expected(case, "tail_kv_cache"), "tail_kv_cache")


@_cases("expand_pools_and_append_tail")
def test_dump_expand(case):
    ins, a = _inputs(case), case["args"]
    P, topk = a["pool_size"], a["topk"]
    x = {k: v[1] for k, v in ins.items()}
    fused = kpool.expand_pools_and_append_tail(x["pool_ids"], x["seq_lens"], P)
    assert fused.dtype == np.int32
    np.testing.assert_array_equal(fused, _expected(case, "fused"))
    for tag, kw in [("identity", {}), ("offsets", dict(topk_offsets=x["topk_offsets"])),
                    ("page_table", dict(page_table=x["page_table"]))]:
        e = kpool.expand_pools_to_tokens(x["pool_ids"], x["group_valid"], topk, P, **kw)
        np.testing.assert_array_equal(e, _expected(case, "expand_" + tag), err_msg="expand_" + tag)
        t = kpool.append_tail_to_topk(e, x["seq_lens"], x["pool_lens"], P, **kw)
        np.testing.assert_array_equal(t, _expected(case, "append_" + tag), err_msg="append_" + tag)


# --- engine-shaped random data ---------------------------------------------------------------
def _bf16(rng, shape, scale=1.0):
    """Random bf16 bits (uint16), rounded to nearest even from f32."""
    f = (rng.standard_normal(shape) * scale).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _compress_inputs(rng, n, P, nb=4):
    kv = rng.integers(0, 256, (nb, PAGE, ROW), dtype=np.uint8)
    sk, ss = _bf16(rng, (n, P, D)), _bf16(rng, (n, P, D))
    ape = (rng.standard_normal((P, D)) * 0.5).astype(np.float32)
    loc = rng.permutation(nb * PAGE)[:n].astype(np.int64)
    return kv, sk, ss, ape, loc


def _tail(rng, blocks, ring, pad=0):
    """bf16 tail ring [blocks, 2, ring, D] as a view of a padded allocation."""
    blk = 2 * ring * D + pad
    base = _bf16(rng, (blocks, blk))
    view = np.lib.stride_tricks.as_strided(base, (blocks, 2, ring, D), (blk * 2, ring * D * 2, D * 2, 2))
    return base, view


def _row(kv, loc):
    """(K bytes, f32 scale) of cache slot loc."""
    page, t = divmod(int(loc), kv.shape[1])
    flat = kv[page].reshape(-1)
    return flat[t * D:(t + 1) * D].copy(), flat[kv.shape[1] * D + 4 * t:][:4].copy().view(np.float32)[0]


def test_compress_writes_in_place_and_only_at_loc():
    rng = np.random.default_rng(1)
    kv, sk, ss, ape, loc = _compress_inputs(rng, 9, 4)
    before = kv.copy()
    ptr = kv.__array_interface__["data"][0]
    assert kpool.kpool_compress_and_write_cache(kv, sk, ss, ape, loc, 4) is None
    assert kv.__array_interface__["data"][0] == ptr
    ck, cs = kpool.kpool_compress_and_write_cache(None, sk, ss, ape, loc, 4, return_compressed=True,
                                                  write_cache=False)
    touched = np.zeros(kv.shape[0] * kv.strides[0], dtype=bool)
    for i, l in enumerate(loc):
        k, s = _row(kv, l)
        np.testing.assert_array_equal(k, ck[i])
        assert s.tobytes() == cs[i:i + 1].tobytes()
        page, t = divmod(int(l), PAGE)
        o = page * kv.strides[0]
        touched[o + t * D:o + t * D + D] = True
        touched[o + PAGE * D + 4 * t:o + PAGE * D + 4 * t + 4] = True
    np.testing.assert_array_equal(kv.reshape(-1)[~touched], before.reshape(-1)[~touched])


def test_compress_mask_and_padded_pages():
    rng = np.random.default_rng(2)
    kv_full, sk, ss, ape, loc = _compress_inputs(rng, 12, 16, nb=6)
    # pages padded to 8704 bytes: a [6, 64, 132] view of a [6, 8704] allocation
    alloc = rng.integers(0, 256, (6, 8704), dtype=np.uint8)
    kv = np.lib.stride_tricks.as_strided(alloc, (6, PAGE, ROW), (8704, ROW, 1))
    before = alloc.copy()
    mask = rng.random(12) < 0.5
    kpool.kpool_compress_and_write_cache(kv, sk, ss, ape, loc, 16, write_mask=mask)
    ck, cs = kpool.kpool_compress_and_write_cache(None, sk, ss, ape, loc, 16, return_compressed=True,
                                                  write_cache=False)
    for i, l in enumerate(loc):
        k, s = _row(kv, l)
        if mask[i]:
            np.testing.assert_array_equal(k, ck[i])
            assert s == cs[i]
        else:
            kb, sb = _row(np.lib.stride_tricks.as_strided(before, (6, PAGE, ROW), (8704, ROW, 1)), l)
            np.testing.assert_array_equal(k, kb)
    # the padding bytes of every page stay as they were
    np.testing.assert_array_equal(alloc[:, PAGE * ROW:], before[:, PAGE * ROW:])


def test_compress_f32_scores_and_strided_inputs():
    rng = np.random.default_rng(3)
    kv, sk, ss, ape, loc = _compress_inputs(rng, 7, 4)
    ss32 = (ss.astype(np.uint32) << 16).view(np.float32)  # the same scores, exactly, as f32
    a = kpool.kpool_compress_and_write_cache(None, sk, ss, ape, loc, 4, return_compressed=True, write_cache=False)
    b = kpool.kpool_compress_and_write_cache(None, sk, ss32, ape, loc, 4, return_compressed=True,
                                             write_cache=False)
    # a non-contiguous slot_k (inner stride 2) is copied first, like .contiguous() in the reference
    wide = np.zeros((7, 4, 2 * D), np.uint16)
    wide[:, :, ::2] = sk
    c = kpool.kpool_compress_and_write_cache(None, wide[:, :, ::2], ss, ape, loc, 4, return_compressed=True,
                                             write_cache=False)
    # float16 / float64 scores are converted to f32 (what the reference's loads do)
    d = kpool.kpool_compress_and_write_cache(None, sk, ss32.astype(np.float64), ape, loc, 4,
                                             return_compressed=True, write_cache=False)
    for other in (b, c, d):
        np.testing.assert_array_equal(a[0], other[0])
        np.testing.assert_array_equal(a[1], other[1])


def test_compress_negative_loc_writes_nothing():
    rng = np.random.default_rng(12)
    kv, sk, ss, ape, loc = _compress_inputs(rng, 3, 4)
    before = kv.copy()
    loc[0], loc[2] = -1, -100
    kpool.kpool_compress_and_write_cache(kv, sk, ss, ape, loc, 4)
    changed = np.flatnonzero((kv != before).reshape(-1))
    page, t = divmod(int(loc[1]), PAGE)
    o = page * kv.strides[0]
    allowed = set(range(o + t * D, o + t * D + D)) | set(range(o + PAGE * D + 4 * t, o + PAGE * D + 4 * t + 4))
    assert set(changed.tolist()) <= allowed and changed.size > 0


def test_compress_empty():
    kv = np.zeros((2, PAGE, ROW), np.uint8)
    sk = np.zeros((0, 4, D), np.uint16)
    ape = np.zeros((4, D), np.float32)
    loc = np.zeros((0,), np.int64)
    assert kpool.kpool_compress_and_write_cache(kv, sk, sk, ape, loc, 4) is None
    ck, cs = kpool.kpool_compress_and_write_cache(kv, sk, sk, ape, loc, 4, return_compressed=True)
    assert ck.shape == (0, D) and ck.dtype == np.uint8 and cs.shape == (0,) and cs.dtype == np.float32
    q8, qs = kpool.fwht128_quant_fp8(np.zeros((0, D), np.uint16))
    assert q8.shape == (0, D) and qs.shape == (0, 1)


def test_decode_completion_equals_compress_and_is_deterministic():
    """A pool completed by decode (P-1 tokens from the ring, one from the
    inputs, next_n spanning a pool boundary) equals compress on the same P
    tokens; two runs give identical bytes."""
    rng = np.random.default_rng(4)
    P, ring, R, nn = 4, 8, 3, 6
    hk, hs = _bf16(rng, (R, 64, D)), _bf16(rng, (R, 64, D))
    ape = (rng.standard_normal((P, D)) * 0.5).astype(np.float32)
    ctx = [5, 8, 10]  # tokens already in each ring (positions ctx - ring .. ctx - 1)
    blocks = [2, 0, 3]
    base, tail = _tail(rng, 5, ring, pad=96)
    for r in range(R):
        for p in range(max(0, ctx[r] - ring), ctx[r]):
            tail[blocks[r], 0, p % ring] = hk[r, p]
            tail[blocks[r], 1, p % ring] = hs[r, p]
    pos = np.array([[c + t for t in range(nn)] for c in ctx], np.int32)
    ts = np.array([[blocks[r] * ring + p % ring for p in pos[r]] for r in range(R)], np.int32)
    free = iter(rng.permutation(4 * PAGE).tolist())
    sm = np.array([[next(free) if p % P == P - 1 else -1 for p in row] for row in pos], np.int32)
    key = np.stack([hk[r, ctx[r]:ctx[r] + nn] for r in range(R)])
    sc = np.stack([hs[r, ctx[r]:ctx[r] + nn] for r in range(R)])
    kv = np.zeros((4, PAGE, ROW), np.uint8)
    tail0, kv0 = base.copy(), kv.copy()
    n = kpool.kpool_decode_update_and_maybe_write_cache_batched(kv, tail, ts, key, sc, ape, sm, pos, P,
                                                               return_skipped=True)
    assert n == 0
    chk = [(r, int(pos[r, t]) - P + 1, int(sm[r, t])) for r in range(R) for t in range(nn) if sm[r, t] >= 0]
    assert len(chk) >= 4
    wk = np.stack([hk[r, s:s + P] for r, s, _ in chk])
    ws = np.stack([hs[r, s:s + P] for r, s, _ in chk])
    ck, cs = kpool.kpool_compress_and_write_cache(None, wk, ws, ape, np.zeros(len(chk), np.int64), P,
                                                  return_compressed=True, write_cache=False)
    for i, (_, _, l) in enumerate(chk):
        k, s = _row(kv, l)
        np.testing.assert_array_equal(k, ck[i])
        assert s == cs[i]
    # every token stashed at pos % ring of its block
    for r in range(R):
        for t in range(nn):
            np.testing.assert_array_equal(tail[blocks[r], 0, pos[r, t] % ring], key[r, t])
            np.testing.assert_array_equal(tail[blocks[r], 1, pos[r, t] % ring], sc[r, t])
    first = (kv.copy(), base.copy())
    kv[...] = kv0
    base[...] = tail0
    kpool.kpool_decode_update_and_maybe_write_cache_batched(kv, tail, ts, key, sc, ape, sm, pos, P)
    np.testing.assert_array_equal(kv, first[0])
    np.testing.assert_array_equal(base, first[1])


def test_decode_skips_completions_without_tail_block():
    rng = np.random.default_rng(5)
    P, ring = 4, 4
    base, tail = _tail(rng, 3, ring)
    tail_before = base.copy()
    kv = rng.integers(0, 256, (2, PAGE, ROW), dtype=np.uint8)
    kv_before = kv.copy()
    pos = np.array([[2, 3]], np.int32)
    ts = np.array([[-1, -1]], np.int32)
    sm = np.array([[-1, 17]], np.int32)
    key, sc = _bf16(rng, (1, 2, D)), _bf16(rng, (1, 2, D))
    ape = np.zeros((P, D), np.float32)
    assert kpool.kpool_decode_update_and_maybe_write_cache_batched(
        kv, tail, ts, key, sc, ape, sm, pos, P, return_skipped=True) == 1
    np.testing.assert_array_equal(kv, kv_before)
    np.testing.assert_array_equal(base, tail_before)
    assert kpool.kpool_decode_update_and_maybe_write_cache_batched(kv, tail, ts, key, sc, ape, sm, pos, P) is None


def test_seed_writes_into_strided_tail_in_place():
    rng = np.random.default_rng(6)
    P, ring = 4, 8
    base, tail = _tail(rng, 4, ring, pad=96)
    before = base.copy()
    # one request of 6 tokens at positions 3..8 in block 2: the last 4 (pos 5..8) are seeded
    ts = np.array([2 * ring + p % ring for p in range(3, 9)], np.int32)
    key, gate = _bf16(rng, (6, D)), _bf16(rng, (6, D))
    kpool.kpool_seed_tail_cache(tail, key, gate, ts, P)
    for i, p in enumerate(range(3, 9)):
        if i >= 2:
            np.testing.assert_array_equal(tail[2, 0, p % ring], key[i])
            np.testing.assert_array_equal(tail[2, 1, p % ring], gate[i])
    changed = np.flatnonzero((base != before).any(axis=1))
    assert changed.tolist() == [2]
    np.testing.assert_array_equal(base[:, 2 * ring * D:], before[:, 2 * ring * D:])  # padding untouched


# --- the top-k helpers against a numpy model of the reference's torch code ------------------------
def _model_expand(ids, valid, topk, P, page_table=None, offsets=None):
    rows = ids.shape[0]
    tok = (ids.astype(np.int64)[:, :, None] * P + np.arange(P)).reshape(rows, topk)
    ok = np.repeat(valid.astype(bool), P, axis=1)
    if page_table is not None:
        out = np.take_along_axis(page_table, np.clip(tok, 0, page_table.shape[1] - 1), 1).astype(np.int32)
    elif offsets is not None:
        out = (tok + offsets.reshape(rows, 1).astype(np.int64)).astype(np.int32)
    else:
        out = tok.astype(np.int32)
    return np.where(ok, out, np.int32(-1)).astype(np.int32)


def _model_append(topk_result, seq_lens, pool_lens, P, page_table=None, offsets=None):
    rows, cols = topk_result.shape
    out_cols = cols + P - 1
    start = pool_lens.astype(np.int32) * np.int32(P)
    count = seq_lens.astype(np.int32) - start
    c = np.arange(out_cols)[None, :]
    off = c - cols
    is_tail = (off >= 0) & (off < count[:, None])
    raw = start[:, None].astype(np.int64) + off
    if page_table is not None:
        tail = np.take_along_axis(page_table, np.clip(raw, 0, page_table.shape[1] - 1), 1).astype(np.int32)
    elif offsets is not None:
        tail = (raw + offsets.reshape(rows, 1).astype(np.int64)).astype(np.int32)
    else:
        tail = raw.astype(np.int32)
    hist = np.take_along_axis(topk_result, np.broadcast_to(np.minimum(c, cols - 1), (rows, out_cols)), 1)
    out = np.where(c < cols, hist, np.int32(-1))
    return np.where(is_tail, tail, out).astype(np.int32)


def _model_fused(ids, seq_lens, P, bound=False):
    rows, G = ids.shape
    topk = G * P
    pool_len = seq_lens // P
    ids = ids.astype(np.int64)
    if bound:
        ids = np.where(ids >= pool_len[:, None], -1, ids)
    hist = np.where(np.repeat(ids, P, axis=1) >= 0, (ids[:, :, None] * P + np.arange(P)).reshape(rows, topk), -1)
    off = np.arange(P - 1)[None, :]
    tail = np.where(off < (seq_lens - pool_len * P)[:, None], pool_len[:, None] * P + off, -1)
    return np.concatenate([hist, tail], axis=1).astype(np.int32)


def _expand_case(rng, rows, P, G):
    seq = rng.integers(0, 5000, rows).astype(np.int32)
    seq[0] = 0
    avail = seq // P
    ids = (rng.random((rows, G)) * np.maximum(avail, 1)[:, None]).astype(np.int64)
    ids[rng.random((rows, G)) < 0.2] = -1
    ids[rng.random((rows, G)) < 0.05] = -7  # another negative sentinel
    valid = rng.random((rows, G)) < 0.8  # also true on some negative ids, like any caller may pass
    pt = rng.integers(-5, 1 << 20, (rows, max(int(seq.max()), 1) + P)).astype(np.int32)
    off = (np.cumsum(seq.astype(np.int64)) - seq).astype(np.int64)
    return ids, valid, seq, avail.astype(np.int32), pt, off


@pytest.mark.parametrize("P", [1, 2, 4, 16, 64])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
def test_topk_helpers_match_model(P, idtype):
    rng = np.random.default_rng(P * 7 + (idtype == np.int64))
    G = 8
    ids, valid, seq, plens, pt, off = _expand_case(rng, 37, P, G)
    ids = ids.astype(idtype)
    topk = G * P
    assert kpool.history_group_budget_for_topk(topk, P) == G
    for kw in [{}, dict(topk_offsets=off), dict(topk_offsets=off[:, None]), dict(page_table=pt)]:
        e = kpool.expand_pools_to_tokens(ids, valid, topk, P, **kw)
        np.testing.assert_array_equal(e, _model_expand(ids, valid, topk, P, kw.get("page_table"),
                                                       kw.get("topk_offsets")))
        t = kpool.append_tail_to_topk(e, seq, plens, P, **kw)
        if P == 1:
            assert t is e
            continue
        np.testing.assert_array_equal(t, _model_append(e, seq, plens, P, kw.get("page_table"),
                                                       kw.get("topk_offsets")))
    for bound in (False, True):
        f = kpool.expand_pools_and_append_tail(ids, seq, P, bound_pool_ids=bound)
        np.testing.assert_array_equal(f, _model_fused(ids, seq, P, bound))
        if not bound:
            np.testing.assert_array_equal(
                f, _model_append(_model_expand(ids, ids >= 0, topk, P), seq, seq // P, P))


def test_append_tail_offsets_rows_and_rows_by_one_agree():
    rng = np.random.default_rng(8)
    ids, valid, seq, plens, _, off = _expand_case(rng, 9, 4, 4)
    e = kpool.expand_pools_to_tokens(ids, valid, 16, 4)
    a = kpool.append_tail_to_topk(e, seq, plens, 4, topk_offsets=off)
    b = kpool.append_tail_to_topk(e, seq, plens, 4, topk_offsets=off[:, None])
    assert a.shape == (9, 19)
    np.testing.assert_array_equal(a, b)


def test_topk_helpers_convert_like_the_reference():
    """Where the reference converts (``.to(torch.int32)`` of seq/pool lens,
    ``.to(torch.int64)`` of offsets, gathers from any page table dtype), so do we."""
    rng = np.random.default_rng(9)
    ids, valid, seq, plens, pt, off = _expand_case(rng, 11, 4, 4)
    e = kpool.expand_pools_to_tokens(ids.astype(np.int16), valid, 16, 4, topk_offsets=off.astype(np.int32))
    np.testing.assert_array_equal(e, kpool.expand_pools_to_tokens(ids, valid, 16, 4, topk_offsets=off))
    a = kpool.append_tail_to_topk(e, seq.astype(np.int64), plens.astype(np.int64), 4, page_table=pt.astype(np.int64))
    np.testing.assert_array_equal(a, kpool.append_tail_to_topk(e, seq, plens, 4, page_table=pt))
    f = kpool.expand_pools_and_append_tail(ids, seq.astype(np.int64), 4)
    np.testing.assert_array_equal(f, kpool.expand_pools_and_append_tail(ids, seq, 4))


def test_append_tail_pool_size_one_returns_input():
    t = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert kpool.append_tail_to_topk(t, np.zeros(3, np.int32), np.zeros(3, np.int32), 1) is t


# --- bad input: the argument is named, nothing is written -----------------------------------------
def _err(exc, fn, *args, **kw):
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    assert isinstance(info.value, kpool.KpoolError)
    return str(info.value)


def test_errors_compress():
    rng = np.random.default_rng(10)
    kv, sk, ss, ape, loc = _compress_inputs(rng, 5, 4)
    before = kv.copy()
    f = kpool.kpool_compress_and_write_cache
    bad_loc = loc.copy()
    bad_loc[3] = 4 * PAGE
    msg = _err(ValueError, f, kv, sk, ss, ape, bad_loc, 4)
    assert "loc[3]" in msg and str(4 * PAGE) in msg
    assert "head_dim" in _err(ValueError, f, kv, sk, ss, ape, loc, 4, head_dim=64)
    assert "pool_size" in _err(ValueError, f, kv, sk, ss, ape, loc, 8)
    assert "slot_k" in _err(TypeError, f, kv, sk.astype(np.int32), ss, ape, loc, 4)
    assert "loc" in _err(TypeError, f, kv, sk, ss, ape, loc.astype(np.int32), 4)
    assert "ape" in _err(ValueError, f, kv, sk, ss, ape[:2], loc, 4)
    assert "kv_cache" in _err(ValueError, f, kv[:, :, :130], sk, ss, ape, loc, 4)
    assert "kv_cache" in _err(TypeError, f, kv.view(np.int8), sk, ss, ape, loc, 4)
    assert "write_mask" in _err(ValueError, f, kv, sk, ss, ape, loc, 4, write_mask=np.ones(5, bool),
                                return_compressed=True)
    assert "write_cache" in _err(ValueError, f, kv, sk, ss, ape, loc, 4, write_cache=False)
    assert "slot_k" in _err(ValueError, f, kv, sk[0], ss, ape, loc, 4)
    ro = kv.copy()
    ro.setflags(write=False)
    assert "kv_cache" in _err(ValueError, f, ro, sk, ss, ape, loc, 4)
    assert "slot_k" in _err(TypeError, f, kv, [[1]], ss, ape, loc, 4)
    assert "pool_size" in _err(ValueError, f, kv, sk, ss, ape, loc, 1 << 33)
    np.testing.assert_array_equal(kv, before)


def test_triton_arithmetic_is_cuda_only():
    """kpool.set_arithmetic("triton") (the reference's GPU instructions) on
    host arrays: the softmax-pool ops refuse, naming the option, and write
    nothing; fwht, which has no approximate step, runs as in exact."""
    rng = np.random.default_rng(11)
    kv, sk, ss, ape, loc = _compress_inputs(rng, 5, 4)
    before = kv.copy()
    q = rng.standard_normal((3, D)).astype(np.float32).view(np.uint32) >> 16
    exact = kpool.fwht128_quant_fp8(q.astype(np.uint16))
    previous = kpool.set_arithmetic("triton")
    try:
        assert kpool.get_arithmetic() == "triton"
        msg = _err(RuntimeError, kpool.kpool_compress_and_write_cache, kv, sk, ss, ape, loc, 4)
        assert "exec->arithmetic" in msg and "CUDA" in msg
        triton = kpool.fwht128_quant_fp8(q.astype(np.uint16))
    finally:
        kpool.set_arithmetic(previous)
    np.testing.assert_array_equal(kv, before)
    np.testing.assert_array_equal(exact[0], triton[0])
    np.testing.assert_array_equal(exact[1], triton[1])
    with pytest.raises(ValueError, match="arithmetic"):
        kpool.set_arithmetic("fast")


def test_errors_seed_and_decode():
    rng = np.random.default_rng(11)
    base, tail = _tail(rng, 3, 4)
    before = base.copy()
    key, gate = _bf16(rng, (4, D)), _bf16(rng, (4, D))
    ts = np.array([0, 1, 2, 12], np.int32)  # 12 / 4 = block 3 of 3
    msg = _err(ValueError, kpool.kpool_seed_tail_cache, tail, key, gate, ts, 4)
    assert "tslot[3]" in msg
    ok = np.array([0, 1, 2, 3], np.int32)
    assert "RING" in _err(ValueError, kpool.kpool_seed_tail_cache, tail, key, gate, ok, 8)
    assert "gate_score" in _err(ValueError, kpool.kpool_seed_tail_cache, tail, key, gate[:3], ok, 4)
    assert "head_dim" in _err(ValueError, kpool.kpool_seed_tail_cache, tail, key, gate, ok, 4, head_dim=96)
    assert "tslot" in _err(TypeError, kpool.kpool_seed_tail_cache, tail, key, gate, ok.astype(np.float32), 4)
    np.testing.assert_array_equal(base, before)

    kv = np.zeros((2, PAGE, ROW), np.uint8)
    pos = np.array([[3, 4]], np.int32)
    tsm = np.array([[3, 4]], np.int32)
    sm = np.array([[2 * PAGE, -1]], np.int32)  # outside the 128-slot cache
    k2, s2 = _bf16(rng, (1, 2, D)), _bf16(rng, (1, 2, D))
    ape = np.zeros((4, D), np.float32)
    f = kpool.kpool_decode_update_and_maybe_write_cache_batched
    assert "slot_mapping[0, 0]" in _err(ValueError, f, kv, tail, tsm, k2, s2, ape, sm, pos, 4)
    sm[0, 0] = 5
    assert "positions" in _err(ValueError, f, kv, tail, tsm, k2, s2, ape, sm, pos[:, :1], 4)
    assert "slot_mapping" in _err(TypeError, f, kv, tail, tsm, k2, s2, ape, sm.astype(np.float32), pos, 4)
    tsm[0, 1] = 99
    assert "tail_slot_mapping[0, 1]" in _err(ValueError, f, kv, tail, tsm, k2, s2, ape, sm, pos, 4)
    np.testing.assert_array_equal(base, before)
    assert not kv.any()


def test_errors_topk_helpers():
    ids = np.zeros((2, 4), np.int32)
    valid = np.ones((2, 4), bool)
    assert "topk" in _err(ValueError, kpool.history_group_budget_for_topk, 10, 4)
    assert "topk" in _err(ValueError, kpool.expand_pools_to_tokens, ids, valid, 18, 4)
    assert "group_ids" in _err(ValueError, kpool.expand_pools_to_tokens, ids, valid, 32, 4)
    assert "group_valid" in _err(ValueError, kpool.expand_pools_to_tokens, ids, valid[:1], 16, 4)
    assert "page_table" in _err(ValueError, kpool.expand_pools_to_tokens, ids, valid, 16, 4,
                                page_table=np.zeros((2, 8), np.int32), topk_offsets=np.zeros(2, np.int64))
    assert "topk_offsets" in _err(ValueError, kpool.expand_pools_to_tokens, ids, valid, 16, 4,
                                  topk_offsets=np.zeros((2, 2), np.int64))
    assert "topk_offsets" in _err(TypeError, kpool.expand_pools_to_tokens, ids, valid, 16, 4,
                                  topk_offsets=np.zeros(2, np.float32))
    t = np.zeros((2, 16), np.int32)
    z = np.zeros(2, np.int32)
    assert "topk_result" in _err(TypeError, kpool.append_tail_to_topk, t.astype(np.int64), z, z, 4)
    assert "seq_lens" in _err(ValueError, kpool.append_tail_to_topk, t, z[:, None], z, 4)
    assert "pool_lens" in _err(ValueError, kpool.append_tail_to_topk, t, z, z[:1], 4)
    assert "pool_size" in _err(ValueError, kpool.expand_pools_and_append_tail, ids, z, 3)
    assert "pool_ids" in _err(ValueError, kpool.expand_pools_and_append_tail, ids[0], z, 4)


def test_error_codes():
    e = _err(ValueError, kpool.history_group_budget_for_topk, 10, 4)
    assert e
    with pytest.raises(kpool.KpoolIndexRangeError) as info:
        kpool.kpool_seed_tail_cache(_tail(np.random.default_rng(0), 1, 4)[1], np.zeros((1, D), np.uint16),
                                    np.zeros((1, D), np.uint16), np.array([4], np.int32), 4)
    assert info.value.code == 2


# --- torch CPU tensors, when torch is here --------------------------------------------------------
def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    case = next(c for c in CASES if c["name"] == "compress_p16_return_and_write")
    ins = {k: torch.from_numpy(v[1].copy()) for k, v in _inputs(case).items()}
    for k in ("slot_k", "slot_score"):
        ins[k] = ins[k].view(torch.bfloat16)
    kv = ins["kv_cache"]
    ck, cs = kpool.kpool_compress_and_write_cache(kv, ins["slot_k"], ins["slot_score"], ins["ape"], ins["loc"],
                                                  16, return_compressed=True)
    assert ck.dtype == torch.float8_e4m3fn and cs.dtype == torch.float32 and ck.device.type == "cpu"
    _assert_bytes_equal(kv.numpy(), _expected(case, "kv_cache"), "kv_cache")
    _assert_bytes_equal(ck.view(torch.uint8).numpy(), _expected(case, "compressed_k"), "compressed_k")
    q = torch.from_numpy(_inputs(next(c for c in CASES if c["op"] == "fwht128_quant_fp8"))["q"][1].copy())
    q8, qs = kpool.fwht128_quant_fp8(q.view(torch.bfloat16))
    assert q8.dtype == torch.float8_e4m3fn and qs.shape == (q.shape[0], 1)


def test_cuda_tensor_on_a_cpu_only_build_is_a_runtime_error():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or "cuda" in kpool.version():
        pytest.skip("needs a CUDA device and a CPU-only libkpool.so")
    q = torch.zeros((4, D), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError) as info:
        kpool.fwht128_quant_fp8(q)
    assert "cuda" in str(info.value) and info.value.code == 3


# --- the GPU-side scripts import and parse here ------------------------------------------------------
def test_bench_help_and_helpers_without_torch():
    import subprocess

    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_gpu.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "kpool vs the Triton reference" in r.stdout
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import bench_gpu

    a = bench_gpu.parse_args(["--quick", "--only", "fwht,decode"])
    assert a.quick and a.only == "fwht,decode"
    import workloads as kt

    assert kt.sweep(kt.FWHT_ROWS, True) == (4096, 65536)
    assert kt.fwht_bytes(4096) == 4096 * (256 + 128 + 4)
    assert kt.seeded_tokens([0, 1, 2, 3, 4, -1, 8, 9], 2, 4) == [2, 3, 4, 6, 7]
    pos, ts, sm = kt.decode_meta([3, 6], 2, 4, 4, [1, 2], iter(range(100)))
    assert pos == [[3, 4], [6, 7]] and ts == [[7, 4], [10, 11]] and sm == [[0, -1], [-1, 1]]
    assert kt.decode_bytes(pos, ts, sm, 4) == 4 * (2 * 256 + 12) + 2 * 3 * 512 + 4 * 128 * 4 + 4 * 512 + 2 * 132


def test_bench_twins_of_a_bundle(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import bench_gpu

    twin = lambda i, unit, auto: dict(id=i, unit=unit, autoscheduler=auto)  # noqa: E731
    plan = dict(family="sm90", candidates=[dict(id=0, unit="compress", knobs={}), twin(1, "compress", "Anderson2021"),
                                           twin(2, "compress.exact", "Anderson2021"), twin(3, "fwht", "Anderson2021"),
                                           twin(5, "decode", "Li2018")],
                failed=[twin(4, "decode", "Anderson2021")])
    (tmp_path / "candidates.json").write_text(json.dumps(plan))
    # The bundle's library only: its hand variants are the "ours" a twin is held to.
    with pytest.raises(SystemExit, match="KPOOL_LIBRARY must be the bundle's libkpool.so"):
        bench_gpu.Twins(str(tmp_path), "default", "/elsewhere/libkpool.so")
    twins = bench_gpu.Twins.__new__(bench_gpu.Twins)
    twins.by_unit = {c["unit"]: c for c in plan["candidates"] if c.get("autoscheduler")}
    for exact, op, want in [(False, "kpool_compress_and_write_cache", 1), (True, "kpool_compress_and_write_cache", 2),
                            (True, "fwht128_quant_fp8", 3), (False, "kpool_decode_update_..._batched", 5),
                            (True, "kpool_decode_update_..._batched", None), (False, "kpool_seed_tail_cache", None)]:
        twins.exact = exact
        assert (twins.of(op) or {}).get("id") == want, (exact, op)


def test_index_errors_words_are_cuda_int32_tensors():
    with pytest.raises(kpool.KpoolTypeError, match="index_errors"):
        kpool.set_index_errors(np.zeros(4, np.int32))
    assert kpool.set_index_errors(None) is None
    with pytest.raises(kpool.KpoolValueError, match="set_index_errors"):
        kpool.check_index_errors()


def test_cuda_warm_up_names_a_missing_device():
    for device in (99, "cuda:99"):
        with pytest.raises(kpool.KpoolError, match="device_index"):
            kpool.cuda_warm_up(device)
    with pytest.raises(kpool.KpoolValueError, match="not a CUDA device"):
        kpool.cuda_warm_up("cpu")
