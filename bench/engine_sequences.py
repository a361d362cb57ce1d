"""The engine's own call sequences (group "engine" of bench/bench_gpu.py):
what vLLM's sparse indexer runs around the drop-in ops today, glue included,
against kpool's one-call entry points that take what the engine holds.

Each sequence is captured in one CUDA graph and timed in replay, in the same
run: the engine's sequence with the reference's ops, the same sequence with
kpool's drop-in ops, and kpool's one call. Their bytes are compared once
(the reference's against the one call), and each is set against the copy
time of the work's minimal bytes (each token's key and score read once, the
pool rows and tail rows written).

- prefill insert: the cache's slot_mapping is pool-granular (a slot only on a
  pool's last token); the engine makes every token a row, gathers its pool
  (`k[idx]`, `gate[idx]`, idx = i-P+1 .. i clamped at 0) into [n, P, 128],
  masks the rows without a slot, converts the slots to int64, compresses over
  the n rows and seeds the tail over the n tokens. kpool:
  `kpool_compress_tokens_and_write_cache(..., tail_kv_cache=, tail_slot_mapping=)`.
- ragged decode: plain decode mixed with speculative verify (1-4 tokens per
  request); the engine builds padded [B, max] grids (repeat_interleave,
  cumsum, five torch.full pads and five index_put) for the batched op. kpool:
  `kpool_decode_update_and_maybe_write_cache_ragged(..., query_start_loc,
  max_query_len=)` on the flat tokens.
- selection with out=: the engine writes the ids into rows of a preallocated
  int32 topk buffer; the reference returns a new tensor, which the engine
  copies in. kpool: `expand_pools_and_append_tail(..., out=topk_buffer[:rows])`.
"""

from __future__ import annotations

import sys

import workloads as kt

PREFILL_TOKENS = (2048, 16384)
RAGGED_REQUESTS = (64, 512)
RAGGED_MAX = 4  # tokens per request: 1 (plain decode) to 4 (speculative verify)
SELECTION_ROWS = (64, 4096)
REQUEST_TOKENS = 2048  # a prefill batch: requests of this many tokens back to back


def prefill_batch(gen: kt.Gen, n: int, P: int):
    """n tokens of n / REQUEST_TOKENS requests, each a chunk from position 0,
    their key and score column slices of a fused projection (rows 320
    elements apart), int32 slot_mapping with a slot on each pool's last token
    (one pool in 8 prefix-cached: -1), tail slots block * RING + pos % RING."""
    torch = gen.torch
    requests = max(1, n // REQUEST_TOKENS)
    lens = [n // requests] * requests
    lens[-1] += n - sum(lens)
    pools = sum(length // P for length in lens)
    nb = max(2, 2 * -(-pools // kt.PAGE))
    free = iter(gen.perm(nb * kt.PAGE))
    slots = []
    for length in lens:
        slots += [(next(free) if (p // P) % 8 != 7 else -1) if p % P == P - 1 else -1 for p in range(length)]
    ring = P
    blocks = gen.perm(2 * requests + 8)[:requests]
    ts = kt.tail_slots(lens, [0] * requests, blocks, ring)
    fused = gen.randn((n, 320))
    tail_base, tail = kt.make_tail(gen, 2 * requests + 8, ring)
    return dict(key=fused[:, :kt.D], gate=fused[:, kt.D:2 * kt.D], ape=gen.randn((P, kt.D), 0.5, torch.float32),
                slot_mapping=gen.i32(slots), tail_slot_mapping=gen.i32(ts),
                kv_cache=gen.cache_bytes((nb, kt.PAGE, kt.ROW)), tail_base=tail_base, tail=tail,
                written=sum(s >= 0 for s in slots), seeded=len(kt.seeded_tokens(ts, P, ring)))


def prefill_min_bytes(n, b):
    """Each token's key and score read once, the pool rows and seeded tail rows written."""
    return n * 2 * kt.VEC + b["written"] * kt.ROW + b["seeded"] * 2 * kt.VEC


def engine_prefill_insert(lib, b, P, kv_cache, tail):
    """The engine's sequence today: every token a row, its pool gathered."""
    torch = sys.modules["torch"]
    n = b["key"].shape[0]
    i = torch.arange(n, device=b["key"].device)
    slots = b["slot_mapping"]
    write_mask = (slots >= 0) & (i >= P - 1)
    idx = (i[:, None] - (P - 1) + torch.arange(P, device=i.device)).clamp_(min=0)
    lib.kpool_compress_and_write_cache(kv_cache, b["key"][idx], b["gate"][idx], b["ape"], slots.to(torch.int64), P,
                                       kt.D, write_mask=write_mask)
    # (The reference's seed reads rows 128 elements apart whatever their
    # stride: an engine passes it contiguous rows. README, "Reference defects".)
    lib.kpool_seed_tail_cache(tail, b["key"].contiguous(), b["gate"].contiguous(), b["tail_slot_mapping"], P, kt.D)


def kpool_prefill_insert(kpool, b, P, kv_cache, tail):
    kpool.kpool_compress_tokens_and_write_cache(kv_cache, b["key"], b["gate"], b["ape"], b["slot_mapping"], P,
                                                tail_kv_cache=tail, tail_slot_mapping=b["tail_slot_mapping"])


def ragged_step(gen: kt.Gen, B: int, P: int):
    """B requests of 1 to RAGGED_MAX tokens (bench_triton's context lengths),
    flat, int32 indices, with query_start_loc."""
    torch = gen.torch
    counts = [1 + c for c in gen.ints(0, RAGGED_MAX, B)]
    ring, ntb = P, 2 * B + 8
    blocks = gen.perm(ntb)[:B]
    nb = max(64, -(-4 * B * RAGGED_MAX // kt.PAGE))
    free = iter(gen.perm(nb * kt.PAGE))
    pos, ts, sm = [], [], []
    for r, (ctx, n) in enumerate(zip(gen.ints(4 * P, 8192, B), counts)):
        for p in range(ctx, ctx + n):
            pos.append(p)
            ts.append(blocks[r] * ring + p % ring)
            sm.append(next(free) if p % P == P - 1 else -1)
    T = len(pos)
    qsl = [0]
    for n in counts:
        qsl.append(qsl[-1] + n)
    tail_base, tail = kt.make_tail(gen, ntb, ring)
    return dict(key=gen.randn((T, kt.D)), score=gen.randn((T, kt.D)), ape=gen.randn((P, kt.D), 0.5, torch.float32),
                positions=gen.i32(pos), tail_slot_mapping=gen.i32(ts), slot_mapping=gen.i32(sm),
                query_start_loc=gen.i32(qsl), max_query_len=max(counts), tail_base=tail_base, tail=tail,
                kv_cache=gen.cache_bytes((nb, kt.PAGE, kt.ROW)),
                written=sum(s >= 0 for s in sm), T=T)


def ragged_min_bytes(s, P):
    """Each token's key and score read once and stashed, its three indices
    and the offsets read, each completion's P-1 ring members read and its
    row written."""
    return s["T"] * (4 * kt.VEC + 12) + 4 * s["query_start_loc"].numel() + \
        s["written"] * ((P - 1) * 2 * kt.VEC + kt.ROW)


def engine_ragged_decode(lib, s, P, kv_cache, tail):
    """The engine's glue today: the flat step scattered into padded grids."""
    torch = sys.modules["torch"]
    qsl, T, N = s["query_start_loc"], s["T"], s["max_query_len"]
    B = qsl.shape[0] - 1
    counts = qsl[1:] - qsl[:-1]
    request = torch.repeat_interleave(torch.arange(B, device=qsl.device), counts, output_size=T)
    within = torch.arange(T, device=qsl.device) - qsl[request]
    grids = []
    for name, fill in (("key", 0), ("score", 0), ("tail_slot_mapping", -1), ("slot_mapping", -1), ("positions", -1)):
        x = s[name]
        grid = torch.full((B, N) + tuple(x.shape[1:]), fill, dtype=x.dtype, device=x.device)
        grid.index_put_((request, within), x)
        grids.append(grid)
    key, score, tsm, sm, pos = grids
    lib.kpool_decode_update_and_maybe_write_cache_batched(kv_cache, tail, tsm, key, score, s["ape"], sm, pos, P)


def kpool_ragged_decode(kpool, s, P, kv_cache, tail):
    kpool.kpool_decode_update_and_maybe_write_cache_ragged(
        kv_cache, tail, s["tail_slot_mapping"], s["key"], s["score"], s["ape"], s["slot_mapping"], s["positions"],
        s["query_start_loc"], P, max_query_len=s["max_query_len"])


def engine_selection(lib, e, P, buffer):
    rows = e["pool_ids"].shape[0]
    buffer[:rows].copy_(lib.expand_pools_and_append_tail(e["pool_ids"], e["seq_lens"], P))


def kpool_selection(kpool, e, P, buffer):
    rows = e["pool_ids"].shape[0]
    kpool.expand_pools_and_append_tail(e["pool_ids"], e["seq_lens"], P, out=buffer[:rows])


def launched_kernels(torch, fn):
    """The CUDA kernels one call launches, by the profiler."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], profile_memory=True) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return names


def run(torch, tt, gen, kpool, ref, roof, quick, time_graph):
    """Times each sequence three ways in graph replay; rows for the JSON."""
    print("\nengine sequences (one CUDA graph each, replay µs; min = the work's minimal bytes at copy bandwidth)")
    print(f"{'sequence':<18} {'params':<22} {'engine+ref':>10} {'engine+ours':>11} {'ours 1 call':>11} "
          f"{'min':>7} {'x ref':>7} {'%copy':>6}  exact")
    rows = []
    for n in PREFILL_TOKENS[:1] if quick else PREFILL_TOKENS:
        for P in kt.POOLS:
            b = prefill_batch(gen, n, P)
            calls = dict(ref=lambda kv, tail: engine_prefill_insert(ref, b, P, kv, tail),
                         ours_seq=lambda kv, tail: engine_prefill_insert(kpool, b, P, kv, tail),
                         ours=lambda kv, tail: kpool_prefill_insert(kpool, b, P, kv, tail))
            row = dict(sequence="prefill insert", params=dict(tokens=n, pool=P), min_bytes=prefill_min_bytes(n, b))
            time_cache_calls(torch, tt, time_graph, row, calls, b)
            row["ours_kernels"] = one_call_kernels(torch, calls["ours"], b)
            rows.append(finish(row, roof, note=f"{len(row['ours_kernels'])} kernel(s)"))
            del b, calls
    for B in RAGGED_REQUESTS[:1] if quick else RAGGED_REQUESTS:
        for P in kt.POOLS:
            s = ragged_step(gen, B, P)
            calls = dict(ref=lambda kv, tail: engine_ragged_decode(ref, s, P, kv, tail),
                         ours_seq=lambda kv, tail: engine_ragged_decode(kpool, s, P, kv, tail),
                         ours=lambda kv, tail: kpool_ragged_decode(kpool, s, P, kv, tail))
            row = dict(sequence="ragged decode", params=dict(requests=B, tokens=s["T"], pool=P),
                       min_bytes=ragged_min_bytes(s, P))
            time_cache_calls(torch, tt, time_graph, row, calls, s)
            row["ours_kernels"] = one_call_kernels(torch, calls["ours"], s)
            rows.append(finish(row, roof, note=f"{len(row['ours_kernels'])} kernel(s)"))
            del s, calls
    for rows_n in SELECTION_ROWS[:1] if quick else SELECTION_ROWS:
        for P in kt.POOLS:
            e = kt.expand_inputs(gen, rows_n, P)
            cols = e["pool_ids"].shape[1] * P + P - 1
            buffers = {who: torch.full((rows_n + 64, cols + 128), -7, dtype=torch.int32, device="cuda")[:, :cols]
                       for who in ("ref", "ours")}
            runs = dict(ref=lambda: engine_selection(ref, e, P, buffers["ref"]),
                        ours=lambda: kpool_selection(kpool, e, P, buffers["ours"]))
            row = dict(sequence="selection out=", params=dict(rows=rows_n, pool=P),
                       min_bytes=kt.expand_bytes(rows_n, P))
            for who, fn in runs.items():
                fn()
                row[f"{who}_us"], err = time_graph(torch, tt, fn)
                if err:
                    row[f"{who}_graph_error"] = err
            row["exact"] = "exact" if torch.equal(buffers["ours"], buffers["ref"]) else "differs"
            kernels = launched_kernels(torch, runs["ours"])
            row["ours_kernels"] = kernels
            rows.append(finish(row, roof, note=f"{len(kernels)} kernel(s)"))
    return rows


def cache_copies(state):
    """Fresh copies of a sequence's caches: the K cache, and the tail ring
    (its base buffer and the strided view the calls take)."""
    kv, tail_base = state["kv_cache"].clone(), state["tail_base"].clone()
    return kv, tail_base, tail_base.as_strided(state["tail"].shape, state["tail"].stride())


def one_call_kernels(torch, call, state):
    """The kernels kpool's one call launches on fresh copies of the caches."""
    kv, _, tail = cache_copies(state)
    return launched_kernels(torch, lambda: call(kv, tail))


def time_cache_calls(torch, tt, time_graph, row, calls, state):
    """Each call once on fresh copies of the caches (their bytes compared:
    the engine's sequence with the reference against kpool's one call),
    then timed in graph replay on those copies."""
    exact = {}
    for who, call in calls.items():
        kv, tail_base, tail = cache_copies(state)
        try:
            call(kv, tail)
            exact[who] = (kv.clone(), tail_base.clone())
        except Exception as e:  # report, keep going
            row[f"{who}_error"] = f"{type(e).__name__}: {e}"
            continue
        row[f"{who}_us"], err = time_graph(torch, tt, lambda call=call, kv=kv, tail=tail: call(kv, tail))
        if err:
            row[f"{who}_graph_error"] = err
    if "ref" in exact and "ours" in exact:
        cmp = kt.compare_caches(exact["ours"][0], exact["ref"][0])
        same_tail = bool(torch.equal(exact["ours"][1], exact["ref"][1]))
        row["exact"] = ("exact" if cmp["bytes"] == 0 and same_tail else
                        f"cache bytes differ: {cmp['bytes']} ({len(cmp['boundary'])} boundary slots); "
                        f"tail {'same' if same_tail else 'differs'}")
    return row


def finish(row, roof, note=""):
    row["min_us"] = row["min_bytes"] / roof / 1e3 if roof else None
    o, r = row.get("ours_us"), row.get("ref_us")
    row["speedup_vs_engine_ref"] = r / o if (o and r) else None
    row["pct_of_copy"] = 100 * row["min_us"] / o if (o and row["min_us"]) else None
    ps = " ".join(f"{k}={v}" for k, v in row["params"].items())

    def num(x, w, p):
        return f"{x:>{w}.{p}f}" if isinstance(x, (int, float)) else f"{'n/a':>{w}}"

    errors = "; ".join(f"{k}: {v}" for k, v in row.items() if k.endswith("error"))
    print(f"{row['sequence']:<18} {ps:<22} {num(r, 10, 2)} {num(row.get('ours_seq_us'), 11, 2)} {num(o, 11, 2)} "
          f"{num(row['min_us'], 7, 2)} {num(row['speedup_vs_engine_ref'], 7, 1)} {num(row['pct_of_copy'], 6, 1)}  "
          f"{row.get('exact', 'n/a')} {note} {errors}")
    sys.stdout.flush()
    return row
