"""kpool vs the Triton reference on one GPU, bit for bit, in one process.

Skipped unless torch sees a CUDA device and the reference module
(``kpool_triton.py``: $KPOOL_REFERENCE_DIR, else ../shared/reference next to
the repo) imports. Covers every op over the
benchmark's sweep (pool sizes 4 and 16, the 75% write mask, sentinels, padded
/ strided tails, edge rows), a CUDA-graph capture of every op replayed on new
inputs (each replay equal to an eager run), and an engine-like loop (prefill, then 200 decode steps of next_n=2
over 32 requests) run once with each library, caches compared at the end.

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so python3 -m pytest python/tests/test_gpu_side_by_side.py -q

Environment:
    KPOOL_GPU_TEST_KPOOL_DEVICE=cpu  run kpool on host copies of the GPU inputs
        (checks this harness, and the CPU library against the GPU reference,
        while libkpool.so has no CUDA path; graph capture is skipped)
    KPOOL_GPU_TEST_QUICK=1|0  the two smallest sizes of each sweep axis
        (default: 1 with KPOOL_GPU_TEST_KPOOL_DEVICE=cpu, else 0)
    KPOOL_GPU_TEST_ARITHMETIC=default|triton|exact  kpool's arithmetic for the op tests
        (default: kpool's default, which is triton's on CUDA and exact on the CPU)

The reference's fp32 ``exp`` is ``ex2.approx.f32(x * log2(e))``, its weighted
sum ``fma.rn.f32`` and its fp32 division ``div.full.f32`` (Triton's defaults;
seen in its PTX on the H200). kpool's default arithmetic (the SPEC's: a
correctly rounded exp and IEEE division) differs from that on about 0.1-0.2%
of pools on random data; ``kpool.set_arithmetic("triton")`` runs the same
instructions as the reference, and that is what the op tests compare, bit for
bit, with nothing tolerated. ``test_compress_arithmetic_model`` checks both
arithmetics against torch models of them (refmodel.py): the reference
equals the model of its instructions, kpool's exact arithmetic equals the
SPEC's model, and kpool's triton arithmetic equals the reference.

Allowed differences, each reported in the summary, none hidden: a cache row
or fwht row whose ue8m0 scale is exactly 2x the reference's (SPEC, shared
numerics 3: the exact ceil(log2) differs from the reference's approximate one
only there), and, in decode, the cache slots of completions without a tail
block (the reference writes garbage from tail block 0 there; kpool writes
nothing, so the expected bytes are the input bytes).
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "bench")))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import kpool  # noqa: E402
import workloads as kt  # noqa: E402
from side_by_side_results import record  # noqa: E402

try:
    REF = kt.import_reference()
except ImportError as e:
    pytest.skip(f"the Triton reference does not import: {e}", allow_module_level=True)

MODE = os.environ.get("KPOOL_GPU_TEST_KPOOL_DEVICE", "cuda")
if MODE == "cpu":
    OURS = kt.OnHost(kpool)
else:
    try:
        _version = kpool.version()
    except OSError as e:
        pytest.skip(f"libkpool.so does not load: {e}", allow_module_level=True)
    if "cuda" not in _version:
        pytest.skip(f"{kpool.library_path()} has no CUDA path ({_version!r}); "
                    "KPOOL_GPU_TEST_KPOOL_DEVICE=cpu runs kpool on host copies instead", allow_module_level=True)
    OURS = kpool
QUICK = os.environ.get("KPOOL_GPU_TEST_QUICK", "1" if MODE == "cpu" else "0") == "1"
ARITHMETIC = os.environ.get("KPOOL_GPU_TEST_ARITHMETIC", "default")
kpool.set_arithmetic(ARITHMETIC)
DEV = "cuda"
D, PAGE, TOPK = kt.D, kt.PAGE, kt.TOPK


def _sync():
    torch.cuda.synchronize()


def _check(test, case, pairs, note=""):
    """Assert every (name, ours, ref) pair equal byte for byte; record it."""
    compared = differing = 0
    problems = []
    for name, a, b in pairs:
        n = kt.differing_bytes(a, b)
        compared += kt.raw_bytes(b).numel()
        differing += n
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{name}: ours {a.dtype} {list(a.shape)} vs reference {b.dtype} {list(b.shape)}")
        elif n:
            extra = ""
            if a.dtype == torch.float8_e4m3fn:
                extra = f", max e4m3 code distance {kt.e4m3_code_distance(a, b)}"
            problems.append(f"{name}: {n} bytes differ{extra}")
    record(test, case, not problems, compared, differing, note=note or "; ".join(problems))
    assert not problems, f"{case}: " + "; ".join(problems)


def _check_cache(test, case, ours, ref, round_scale=True, excused_slots=(), before=None, extra=()):
    """Compare two kv caches; excused slots must hold their ``before`` bytes
    in ours and are taken out of the comparison; 2x-scale slots are reported."""
    ref = ref.clone()
    excused = 0
    if excused_slots:
        slots = torch.tensor(sorted(set(excused_slots)), dtype=torch.int64, device=ours.device)
        k_o, k_b = kt.cache_k_rows(ours, slots), kt.cache_k_rows(before, slots)
        s_o, s_b = kt.cache_scales(ours, slots), kt.cache_scales(before, slots)
        assert torch.equal(k_o, k_b) and torch.equal(s_o.view(torch.int32), s_b.view(torch.int32)), \
            f"{case}: kpool wrote at a completion without a tail block"
        # expected there: the input bytes
        flat_r, flat_b = ref.reshape(-1), before.reshape(-1)
        block = ours.shape[1]
        for s in slots.tolist():
            o, t = s // block * ours.stride(0), s % block
            for lo, n in ((o + t * D, D), (o + block * D + 4 * t, 4)):
                flat_r[lo:lo + n] = flat_b[lo:lo + n]
                excused += n
    c = kt.compare_caches(ours, ref, round_scale)
    n, boundary, other = c["bytes"], c["boundary"], c["other"]
    problems = []
    if other:
        problems.append(f"kv_cache: {n} bytes differ in {len(other)} slots (first {other[:4]}), at most "
                        f"{c['max_bytes_per_slot']} of {kt.ROW} in one slot, max e4m3 code distance "
                        f"{c['code_distance']}")
    for name, a, b in extra:
        m = kt.differing_bytes(a, b)
        if m:
            problems.append(f"{name}: {m} bytes differ")
    note = "; ".join(problems)
    if boundary:
        note = (note + "; " if note else "") + f"{len(boundary)} ue8m0 boundary slots (scale 2x): {boundary[:8]}"
    if excused:
        note = (note + "; " if note else "") + f"{len(excused_slots)} tail-less completions excused"
    record(test, case, not problems, kt.raw_bytes(ref).numel(), n, excused, note)
    assert not problems, f"{case}: " + "; ".join(problems)


def _ids(params):
    return "-".join(f"{k}{v}" for k, v in params.items())


# --- 1. fwht ---------------------------------------------------------------------------------------
FWHT_CASES = [dict(rows=r, edges=0) for r in kt.sweep(kt.FWHT_ROWS, QUICK)] + \
             [dict(rows=r, edges=1) for r in (0, 1, 31, 33, 70)]


@pytest.mark.parametrize("p", FWHT_CASES, ids=_ids)
def test_fwht(p):
    gen = kt.Gen(100 + p["rows"], DEV)
    q = kt.fwht_inputs(gen, p["rows"], edges=bool(p["edges"]))["q"]
    o8, os_ = OURS.fwht128_quant_fp8(q)
    r8, rs = REF.fwht128_quant_fp8(q)
    _sync()
    rows_bad = (kt.raw_bytes(o8).view(-1, D) != kt.raw_bytes(r8).view(-1, D)).any(1) | \
        (os_.view(torch.int32) != rs.view(torch.int32)).reshape(-1) if p["rows"] else None
    if rows_bad is not None and bool(rows_bad.any()):
        so, sr = os_.reshape(-1)[rows_bad], rs.reshape(-1)[rows_bad]
        boundary = (so == 2 * sr) | (sr == 2 * so)
        if bool(boundary.all()):
            record("fwht", _ids(p), True, kt.raw_bytes(r8).numel(), int(rows_bad.sum()),
                      note=f"{int(rows_bad.sum())} ue8m0 boundary rows (scale 2x)")
            return
    _check("fwht", _ids(p), [("q_fp8", o8, r8), ("q_scale", os_, rs)])


# --- 2. compress ------------------------------------------------------------------------------------
COMPRESS_CASES = [dict(n=n, P=P, mask=m, rs=1, mode="write", score="bf16", edges=0)
                  for n in kt.sweep(kt.COMPRESS_POOLS, QUICK) for P in kt.POOLS
                  for m in ([None, kt.MASK_KEEP] if n == kt.MASKED_POOLS else [None])]
COMPRESS_CASES += [
    dict(n=37, P=4, mask=None, rs=1, mode="write", score="bf16", edges=1),
    dict(n=19, P=16, mask=0.6, rs=1, mode="write", score="bf16", edges=1),
    dict(n=23, P=4, mask=None, rs=0, mode="write", score="bf16", edges=1),
    dict(n=300, P=16, mask=None, rs=1, mode="write", score="f32", edges=1),
    dict(n=11, P=4, mask=None, rs=1, mode="return", score="bf16", edges=1),
    dict(n=4096, P=16, mask=None, rs=1, mode="both", score="bf16", edges=1),
    dict(n=4096, P=4, mask=None, rs=0, mode="both", score="f32", edges=0),
]


@pytest.mark.parametrize("p", COMPRESS_CASES, ids=_ids)
def test_compress(p):
    gen = kt.Gen(200 + p["n"] + p["P"], DEV)
    x = kt.compress_inputs(gen, p["n"], p["P"], mask=p["mask"], edges=bool(p["edges"]), random_cache=True)
    if p["score"] == "f32":
        x["slot_score"] = x["slot_score"].float() * 1.0001  # scores that are not bf16
    kv_o, kv_r = x["kv_cache"].clone(), x["kv_cache"].clone()
    rc, wc = p["mode"] in ("return", "both"), p["mode"] in ("write", "both")
    kw = dict(write_mask=x["write_mask"], round_scale=bool(p["rs"]), return_compressed=rc, write_cache=wc)
    got = OURS.kpool_compress_and_write_cache(kv_o, x["slot_k"], x["slot_score"], x["ape"], x["loc"], p["P"], **kw)
    want = REF.kpool_compress_and_write_cache(kv_r, x["slot_k"], x["slot_score"], x["ape"], x["loc"], p["P"], **kw)
    _sync()
    extra = []
    if rc:
        extra = [("compressed_k", got[0], want[0]), ("compressed_scale", got[1], want[1])]
        assert got[0].dtype == torch.float8_e4m3fn and got[0].shape == want[0].shape
    else:
        assert got is None and want is None
    _check_cache("compress", _ids(p), kv_o, kv_r, bool(p["rs"]), extra=extra)


# --- 3. seed ----------------------------------------------------------------------------------------
SEED_CASES = [dict(n=n, P=P, ring=P, pad=0, pads=0, idx="int32", req=0) for n in kt.sweep(kt.SEED_TOKENS, QUICK)
              for P in kt.POOLS]
SEED_CASES += [
    dict(n=45, P=4, ring=4, pad=0, pads=1, idx="int32", req=6),
    dict(n=5000, P=4, ring=8, pad=96, pads=1, idx="int64", req=40),
    dict(n=5000, P=16, ring=32, pad=96, pads=1, idx="int32", req=40),
    dict(n=3, P=16, ring=16, pad=0, pads=0, idx="int32", req=1),
]


@pytest.mark.parametrize("p", SEED_CASES, ids=_ids)
def test_seed(p):
    gen = kt.Gen(300 + p["n"] + p["P"], DEV)
    x = kt.seed_inputs(gen, p["n"], p["P"], ring=p["ring"], pad=p["pad"], pads=bool(p["pads"]),
                       index_dtype=p["idx"], requests=p["req"] or None)
    base_o, base_r = x["tail_base"].clone(), x["tail_base"].clone()
    view = x["tail_kv_cache"]
    tail_o = base_o.as_strided(view.shape, view.stride())
    tail_r = base_r.as_strided(view.shape, view.stride())
    assert OURS.kpool_seed_tail_cache(tail_o, x["key"], x["gate_score"], x["tslot"], p["P"]) is None
    REF.kpool_seed_tail_cache(tail_r, x["key"], x["gate_score"], x["tslot"], p["P"])
    _sync()
    _check("seed", _ids(p), [("tail_kv_cache (whole allocation)", base_o, base_r)])


# --- 4. decode ----------------------------------------------------------------------------------------
DECODE_CASES = [dict(R=R, nn=nn, P=P, ring=P, pad=0, rs=1) for R in kt.sweep(kt.DEC_REQS, QUICK)
                for nn in kt.DEC_NEXT for P in kt.POOLS]
DECODE_CASES += [
    dict(R=64, nn=4, P=4, ring=8, pad=96, rs=1),
    dict(R=64, nn=2, P=16, ring=32, pad=96, rs=0),
    dict(R=7, nn=6, P=4, ring=4, pad=0, rs=1),
]


@pytest.mark.parametrize("p", DECODE_CASES, ids=_ids)
def test_decode(p):
    gen = kt.Gen(400 + p["R"] * 10 + p["nn"] + p["P"], DEV)
    x = kt.decode_inputs(gen, p["R"], p["nn"], p["P"], ring=p["ring"], pad=p["pad"], edges=True, random_cache=True)
    before = x["kv_cache"].clone()
    kv_o, kv_r = before.clone(), before.clone()
    base_o, base_r = x["tail_base"].clone(), x["tail_base"].clone()
    view = x["tail_kv_cache"]
    tail_o = base_o.as_strided(view.shape, view.stride())
    tail_r = base_r.as_strided(view.shape, view.stride())
    args = (x["tail_slot_mapping"], x["key"], x["slot_score"], x["ape"], x["slot_mapping"], x["positions"], p["P"])
    skipped = OURS.kpool_decode_update_and_maybe_write_cache_batched(kv_o, tail_o, *args, round_scale=bool(p["rs"]),
                                                                     return_skipped=True)
    REF.kpool_decode_update_and_maybe_write_cache_batched(kv_r, tail_r, *args, round_scale=bool(p["rs"]))
    _sync()
    case = _ids(p) + f"-completions{x['completions']}"
    if MODE == "cpu":
        assert skipped == len(x["excused"]), f"skipped {skipped}, expected {len(x['excused'])}"
    _check_cache("decode", case, kv_o, kv_r, bool(p["rs"]), excused_slots=x["excused"], before=before,
                 extra=[("tail_kv_cache (whole allocation)", base_o, base_r)])


# --- 5. top-k helpers --------------------------------------------------------------------------------
EXPAND_CASES = [dict(rows=r, P=P, idx="int32") for r in kt.sweep(kt.EXP_ROWS, QUICK) for P in kt.POOLS]
EXPAND_CASES += [dict(rows=64, P=16, idx="int64"), dict(rows=5, P=1, idx="int32"), dict(rows=33, P=2, idx="int64")]


@pytest.mark.parametrize("p", EXPAND_CASES, ids=_ids)
def test_expand(p):
    gen = kt.Gen(500 + p["rows"] + p["P"], DEV)
    P = p["P"]
    x = kt.expand_inputs(gen, p["rows"], P, index_dtype=p["idx"], table_width=20000 if p["rows"] > 64 else None)
    pairs = [("fused", OURS.expand_pools_and_append_tail(x["pool_ids"], x["seq_lens"], P),
              REF.expand_pools_and_append_tail(x["pool_ids"], x["seq_lens"], P))]
    for tag, kw in [("identity", {}), ("offsets", dict(topk_offsets=x["topk_offsets"])),
                    ("page_table", dict(page_table=x["page_table"]))]:
        eo = OURS.expand_pools_to_tokens(x["pool_ids"], x["group_valid"], TOPK, P, **kw)
        er = REF.expand_pools_to_tokens(x["pool_ids"], x["group_valid"], TOPK, P, **kw)
        ao = OURS.append_tail_to_topk(er, x["seq_lens"], x["pool_lens"], P, **kw)
        ar = REF.append_tail_to_topk(er, x["seq_lens"], x["pool_lens"], P, **kw)
        if P == 1 and MODE != "cpu":
            assert ao is er
        pairs += [("expand_" + tag, eo, er), ("append_" + tag, ao, ar)]
    _sync()
    _check("expand", _ids(p), pairs)


# --- 5b. the reference's arithmetic, modelled -----------------------------------------------------------
# f32 scores of 262144 pools of 16 span 2 GiB, past the CUDA kernels' limit.
MODEL_CASES = [dict(n=n, P=P, rs=rs, score=sc) for n in kt.sweep((16384, 262144), QUICK) for P in kt.POOLS
               for rs, sc in ((1, "bf16"), (0, "f32")) if n * P * D * (4 if sc == "f32" else 2) < 2 ** 31]


@pytest.mark.parametrize("p", MODEL_CASES, ids=_ids)
def test_compress_arithmetic_model(p):
    """Explains the compress differences: a torch model with the reference's
    PTX arithmetic (ex2.approx of t*log2e, fma.rn accumulation, div.full)
    must reproduce the reference bit for bit, and kpool must equal the model
    of each arithmetic: exact = the SPEC's model (correctly rounded exp,
    IEEE division, separate multiply and add), triton = the reference."""
    import refmodel

    gen = kt.Gen(700 + p["n"] + p["P"], DEV)
    x = kt.compress_inputs(gen, p["n"], p["P"])
    ss = x["slot_score"] if p["score"] == "bf16" else x["slot_score"].float() * 1.0001
    rs = bool(p["rs"])
    kw = dict(round_scale=rs, return_compressed=True, write_cache=False)
    rk, rsc = REF.kpool_compress_and_write_cache(x["kv_cache"], x["slot_k"], ss, x["ape"], x["loc"], p["P"], **kw)
    ours = {}
    for arithmetic in ("exact", "triton") if MODE != "cpu" else ("exact",):
        previous = kpool.set_arithmetic(arithmetic)
        try:
            k, sc = OURS.kpool_compress_and_write_cache(None, x["slot_k"], ss, x["ape"], x["loc"], p["P"], **kw)
        finally:
            kpool.set_arithmetic(previous)
        ours[arithmetic] = (k.view(torch.uint8), sc)
    rk = rk.view(torch.uint8)

    def rows(codes, scales, codes2, scales2):
        return int(((codes != codes2).any(1) | (scales.view(torch.int32) != scales2.view(torch.int32))).sum())

    models = {f: refmodel.compress_rows(x["slot_k"], ss, x["ape"], rs, f) for f in ("spec", "triton")}
    _sync()
    model_vs_ref = rows(*models["triton"], rk, rsc)
    exact_vs_ref = rows(*ours["exact"], rk, rsc)
    exact_vs_spec = rows(*ours["exact"], *models["spec"])
    triton_vs_ref = rows(*ours["triton"], rk, rsc) if "triton" in ours else 0
    note = (f"of {p['n']} pools: reference vs its model {model_vs_ref}; kpool exact vs SPEC model "
            f"{exact_vs_spec}, vs reference {exact_vs_ref}; kpool triton vs reference "
            + (str(triton_vs_ref) if "triton" in ours else "(not on the CPU)"))
    good = model_vs_ref == 0 and exact_vs_spec == 0 and triton_vs_ref == 0
    record("arith_model", _ids(p), good, rk.numel(), 0, note=note)
    assert good, note


# --- 6. CUDA-graph capture -------------------------------------------------------------------------------
def _graph_case(gen, P):
    return dict(
        fw=kt.fwht_inputs(gen, 1000, edges=True),
        c=kt.compress_inputs(gen, 300, P, mask=kt.MASK_KEEP, nb=16, random_cache=True),
        s=kt.seed_inputs(gen, 3000, P, ring=2 * P, pad=96, pads=True, requests=24),
        d=kt.decode_inputs(gen, 16, 2, P, ring=2 * P, pad=96, edges=False, random_cache=True),
        e=kt.expand_inputs(gen, 64, P, table_width=4096),
    )


def _all_ops(lib, st, P, kv_c, tail_s, kv_d, tail_d):
    fw, c, s, d, e = st["fw"], st["c"], st["s"], st["d"], st["e"]
    out = {}
    out["q_fp8"], out["q_scale"] = lib.fwht128_quant_fp8(fw["q"])
    lib.kpool_compress_and_write_cache(kv_c, c["slot_k"], c["slot_score"], c["ape"], c["loc"], P,
                                       write_mask=c["write_mask"])
    lib.kpool_seed_tail_cache(tail_s, s["key"], s["gate_score"], s["tslot"], P)
    lib.kpool_decode_update_and_maybe_write_cache_batched(kv_d, tail_d, d["tail_slot_mapping"], d["key"],
                                                          d["slot_score"], d["ape"], d["slot_mapping"],
                                                          d["positions"], P)
    out["fused"] = lib.expand_pools_and_append_tail(e["pool_ids"], e["seq_lens"], P)
    x = lib.expand_pools_to_tokens(e["pool_ids"], e["group_valid"], TOPK, P, page_table=e["page_table"])
    out["append"] = lib.append_tail_to_topk(x, e["seq_lens"], e["pool_lens"], P, page_table=e["page_table"])
    return out


def _refill(dst, src):
    """Copy every tensor of a fresh case into the static one (same shapes)."""
    for k, v in src.items():
        if isinstance(v, dict):
            _refill(dst[k], v)
        elif isinstance(v, torch.Tensor) and k != "tail_kv_cache":
            assert dst[k].shape == v.shape, (k, dst[k].shape, v.shape)
            dst[k].copy_(v)


@pytest.mark.parametrize("P", [4, 16])
def test_cuda_graph_capture(P):
    if MODE == "cpu":
        pytest.skip("graph capture needs kpool's CUDA path (KPOOL_GPU_TEST_KPOOL_DEVICE=cpu)")
    gen = kt.Gen(600 + P, DEV)
    st = _graph_case(gen, P)
    views = lambda base, like: base.as_strided(like.shape, like.stride())  # noqa: E731
    kv_c, base_s, kv_d, base_d = (st["c"]["kv_cache"], st["s"]["tail_base"], st["d"]["kv_cache"],
                                  st["d"]["tail_base"])
    tail_s, tail_d = views(base_s, st["s"]["tail_kv_cache"]), views(base_d, st["d"]["tail_kv_cache"])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            _all_ops(kpool, st, P, kv_c, tail_s, kv_d, tail_d)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _all_ops(kpool, st, P, kv_c, tail_s, kv_d, tail_d)

    # Replays must see new input values and cache contents: compare each
    # replay with an eager kpool run on copies of the same state (kpool vs the
    # reference is what the tests above check).
    for trial in range(3):
        _refill(st, _graph_case(gen, P))  # new inputs and new cache contents, same shapes
        eager_state = [t.clone() for t in (kv_c, base_s, kv_d, base_d)]
        graph.replay()
        r_kv_c, r_base_s, r_kv_d, r_base_d = eager_state
        want = _all_ops(kpool, st, P, r_kv_c, views(r_base_s, tail_s), r_kv_d, views(r_base_d, tail_d))
        _sync()
        _check("cuda_graph", f"P{P}-replay{trial}",
               [(k, outs[k], want[k]) for k in outs] +
               [("kv_cache (compress)", kv_c, r_kv_c), ("tail (seed)", base_s, r_base_s),
                ("kv_cache (decode)", kv_d, r_kv_d), ("tail (decode)", base_d, r_base_d)])


# --- 7. an engine-like loop -------------------------------------------------------------------------------
def _engine(lib, P, ring, steps=200, R=32, nn=2, seed=7):
    """Prefill 32 requests (seed the tails, compress the full pools), then
    ``steps`` decode steps of nn tokens; about 10% of the rows are idle
    (padding) at each step, and 1 or 2 of the nn tokens are accepted, so
    rejected positions are recomputed (re-stashed, pools re-written to the
    same slot) at the next step. No completion lacks a tail block, so the
    reference's defect plays no part."""
    gen = kt.Gen(seed, DEV)
    prompts = gen.ints(1, 300, R)
    ntb = R + 8
    blocks = gen.perm(ntb)[:R]
    pools_max = sum((L + steps * nn) // P + 2 for L in prompts)
    nb = -(-pools_max // PAGE) + 1
    free = iter(gen.perm(nb * PAGE))
    slot_of = [dict() for _ in range(R)]

    def slot(r, pool):
        if pool not in slot_of[r]:
            slot_of[r][pool] = next(free)
        return slot_of[r][pool]

    kv = gen.cache_bytes((nb, PAGE, kt.ROW))
    base, tail = kt.make_tail(gen, ntb, ring, pad=96)
    ape = gen.randn((P, D), 0.5, torch.float32)
    key, gate = gen.randn((sum(prompts), D)), gen.randn((sum(prompts), D))
    lib.kpool_seed_tail_cache(tail, key, gate, gen.i32(kt.tail_slots(prompts, [0] * R, blocks, ring)), P)
    starts, locs, off = [], [], 0
    for r, L in enumerate(prompts):
        for j in range(L // P):
            starts.append(off + j * P)
            locs.append(slot(r, j))
        off += L
    if starts:
        rows = torch.tensor(starts, device=DEV)[:, None] + torch.arange(P, device=DEV)
        lib.kpool_compress_and_write_cache(kv, key[rows], gate[rows], ape, gen.i64(locs), P)
    prefill = (kv.clone(), base.clone())
    ctx = list(prompts)
    completions = 0
    for _ in range(steps):
        idle = gen.ints(0, 10, R)
        pos, ts, sm = [], [], []
        for r in range(R):
            if idle[r] == 0:
                pos.append([-1] * nn), ts.append([-1] * nn), sm.append([-1] * nn)
                continue
            p = [ctx[r] + t for t in range(nn)]
            pos.append(p)
            ts.append([blocks[r] * ring + q % ring for q in p])
            sm.append([slot(r, q // P) if q % P == P - 1 else -1 for q in p])
        completions += len(kt.decode_completions(pos, ts, sm, P))
        k, s = gen.randn((R, nn, D)), gen.randn((R, nn, D))
        lib.kpool_decode_update_and_maybe_write_cache_batched(kv, tail, gen.i32(ts), k, s, ape, gen.i32(sm),
                                                              gen.i32(pos), P)
        accepted = gen.ints(1, nn + 1, R)
        for r in range(R):
            if idle[r] != 0:
                ctx[r] += accepted[r]
    _sync()
    return prefill, (kv, base), completions


@pytest.mark.parametrize("P,ring", [(4, 4), (4, 8), (16, 16)])
def test_engine_loop(P, ring):
    steps = 200
    (pk_r, pt_r), (kv_r, tb_r), comp = _engine(REF, P, ring, steps)
    (pk_o, pt_o), (kv_o, tb_o), comp_o = _engine(OURS, P, ring, steps)
    assert comp == comp_o
    case = f"P{P}-ring{ring}-32req-{steps}steps-next_n2-completions{comp}"
    failures = []
    for test, kv, ref_kv, extra in [("engine_prefill", pk_o, pk_r, [("tail", pt_o, pt_r)]),
                                    ("engine_loop", kv_o, kv_r, [("tail", tb_o, tb_r)])]:
        try:
            _check_cache(test, case, kv, ref_kv, extra=extra)
        except AssertionError as e:
            failures.append(f"{test}: {e}")
    assert not failures, "; ".join(failures)


@pytest.mark.skipif(MODE == "cpu", reason="only CUDA calls mark index_errors (host calls reject the index)")
def test_index_errors_mark_out_of_range_slots():
    P, ring, B, N = 4, 4, 2, 4
    cache = torch.zeros((2, PAGE, D + 4), dtype=torch.uint8, device=DEV)
    tail = torch.randn((B, 2, ring, D), device=DEV).to(torch.bfloat16)
    key = torch.randn((B, N, D), device=DEV).to(torch.bfloat16)
    score = torch.randn((B, N, D), device=DEV).to(torch.bfloat16)
    ape = torch.randn((P, D), device=DEV)
    positions = torch.arange(N, dtype=torch.int32, device=DEV).repeat(B, 1)
    tail_slots = (torch.arange(B, dtype=torch.int32, device=DEV)[:, None] * ring + positions % ring).int()
    slots = torch.full((B, N), -1, dtype=torch.int32, device=DEV)
    slots[0, P - 1], slots[1, P - 1] = 5, 2 * PAGE  # request 1 completes into a slot past the cache
    words = torch.zeros(4, dtype=torch.int32, device=DEV)
    previous = kpool.set_index_errors(words)
    try:
        kpool.kpool_decode_update_and_maybe_write_cache_batched(cache, tail, tail_slots, key, score, ape, slots,
                                                                positions, P)
        assert words.tolist() == [0, 0, 1, 0]  # slot_mapping alone
        assert cache[0].any() and not cache[1:].any()  # slot 5 written, nothing past it
        with pytest.raises(kpool.KpoolIndexRangeError, match="slot_mapping"):
            kpool.check_index_errors()
        assert words.tolist() == [0, 0, 0, 0]
        kpool.check_index_errors()  # zeroed: nothing to report
    finally:
        kpool.set_index_errors(previous)
