"""The workloads of bench/bench_gpu.py and the GPU side-by-side test
(python/tests): the reference module's location, the benchmark sweep,
engine-shaped torch inputs, the byte counts of each case and bit-level
comparison.

Not part of the kpool package; torch is imported only inside functions.
The sweep sizes, input distributions and byte formulas are those of
shared/anchors/bench_triton.py, so our numbers line up with the reference's
published ones.
"""

from __future__ import annotations

import importlib.util
import os
import sys

D = 128  # head dim
PAGE = 64  # indexer cache block_size (pool slots per page)
ROW = D + 4  # bytes per cache slot: e4m3 K + f32 scale
VEC = 2 * D  # bytes of one bf16 head vector

POOLS = (4, 16)
FWHT_ROWS = (4096, 65536, 1048576)
COMPRESS_POOLS = (1024, 16384, 262144)
MASKED_POOLS, MASK_KEEP = 16384, 0.75  # the one size also run with a 75% write mask
SEED_TOKENS = (4096, 65536, 262144)
DEC_REQS, DEC_NEXT = (1, 64, 512), (1, 2, 4)
EXP_ROWS, TOPK = (1, 64, 4096), 2048

_here = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(_here, ".."))
REFERENCE_ENV = "KPOOL_REFERENCE_DIR"


def sweep(sizes, quick: bool):
    """The sizes of one sweep axis; quick keeps the two smallest (like the reference's --quick)."""
    return tuple(sizes[:2]) if quick else tuple(sizes)


def reference_dirs() -> list[str]:
    env = os.environ.get(REFERENCE_ENV)
    if env:
        return [env]
    return [os.path.join(REPO, "..", "shared", "reference"), os.path.join(REPO, "shared", "reference")]


def import_reference():
    """The Triton reference module ``kpool_triton`` (imports triton), or an
    ImportError that says where it was looked for and why it failed."""
    tried = []
    for d in reference_dirs():
        path = os.path.join(d, "kpool_triton.py")
        if not os.path.isfile(path):
            tried.append(f"{path} (missing)")
            continue
        if "kpool_triton" in sys.modules:
            return sys.modules["kpool_triton"]
        spec = importlib.util.spec_from_file_location("kpool_triton", path)
        module = importlib.util.module_from_spec(spec)
        try:
            sys.modules["kpool_triton"] = module
            spec.loader.exec_module(module)
        except Exception as e:  # triton missing, no GPU driver, ...
            sys.modules.pop("kpool_triton", None)
            raise ImportError(f"{path}: {type(e).__name__}: {e}") from e
        return module
    raise ImportError("reference kpool_triton.py not found; set " + REFERENCE_ENV + " (tried: " +
                      ", ".join(tried) + ")")


# --- engine-shaped inputs ----------------------------------------------------------------------
class Gen:
    """Bulk data from a torch generator on ``device``; metadata (lengths,
    permutations) from a CPU generator, as Python lists."""

    def __init__(self, seed: int, device):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cpu = torch.Generator().manual_seed(seed)
        self.g = torch.Generator(device=self.device).manual_seed(seed + 1)

    def randn(self, shape, scale=1.0, dtype=None):
        t = self.torch
        x = t.randn(shape, generator=self.g, device=self.device) * scale
        return x.to(dtype or t.bfloat16)

    def rand(self, shape):
        return self.torch.rand(shape, generator=self.g, device=self.device)

    def perm(self, n):
        return self.torch.randperm(n, generator=self.cpu).tolist()

    def ints(self, lo, hi, n):
        return self.torch.randint(lo, hi, (n,), generator=self.cpu).tolist()

    def cache_bytes(self, shape):
        """Random bytes (a cache that is not zeros shows stray writes)."""
        return self.torch.randint(0, 256, shape, generator=self.g, device=self.device, dtype=self.torch.uint8)

    def i32(self, values):
        return self.torch.tensor(values, dtype=self.torch.int32, device=self.device)

    def i64(self, values):
        return self.torch.tensor(values, dtype=self.torch.int64, device=self.device)


def fwht_inputs(gen: Gen, rows: int, edges: bool = False):
    q = gen.randn((rows, D))
    if edges and rows >= 8:
        q[0] = 0
        q[1] = gen.randn((D,), 1e4)
        q[2] = gen.randn((D,), 1e-8)
        q[3] = 0
        q[3, 17] = -1e4
        q[4], q[5], q[6] = 1.0, 1e-8, 448.0
        q[6, 1::2] = -448.0
        q[7] = gen.randn((D,), 1e35)  # large, with room for the rotation's growth (up to 128x) below f32 max
    return dict(q=q)


def fwht_bytes(rows):
    return rows * (VEC + D + 4)


def compress_inputs(gen: Gen, n: int, P: int, mask=None, nb=None, edges=False, random_cache=False):
    torch = gen.torch
    nb = nb or max(2, 2 * -(-n // PAGE))
    kv = gen.cache_bytes((nb, PAGE, ROW)) if random_cache else torch.zeros((nb, PAGE, ROW), dtype=torch.uint8,
                                                                              device=gen.device)
    sk, ss = gen.randn((n, P, D)), gen.randn((n, P, D))
    ape = gen.randn((P, D), 0.5, torch.float32)
    loc = gen.i64(gen.perm(nb * PAGE)[:n])
    wm = None
    if mask is not None:
        wm = gen.rand((n,)) < mask
    if edges and n >= 5:
        sk[0], ss[0], ss[4] = 0, 0, 3.0  # zero pool; constant scores (uniform softmax)
        sk[1], sk[2], ss[3] = sk[1] * 1e4, sk[2] * 1e-8, ss[3] * 1e4  # huge K, tiny K, one-hot-ish softmax
        if wm is not None:
            loc[~wm] = -1  # masked-off pools may carry any loc, sentinels included
    return dict(kv_cache=kv, slot_k=sk, slot_score=ss, ape=ape, loc=loc, write_mask=wm)


def compress_bytes(n, P, write_mask=None):
    m = n if write_mask is None else int(write_mask.sum())  # masked-off pools read nothing
    return m * (2 * P * VEC + 8 + ROW) + P * D * 4 + (0 if write_mask is None else n)


def make_tail(gen: Gen, blocks: int, ring: int, pad: int = 0):
    """(base allocation [blocks, 2*ring*D + pad], bf16 view [blocks, 2, ring, D])."""
    blk = 2 * ring * D + pad
    base = gen.randn((blocks, blk))
    return base, base.as_strided((blocks, 2, ring, D), (blk, ring * D, D, 1))


def tail_slots(lens, starts, blocks, ring, pads=None):
    """Per token ``block * ring + pos % ring``, requests back to back, with
    ``pads[r]`` padding entries (-1) after request r."""
    out = []
    for r, n in enumerate(lens):
        out += [blocks[r] * ring + p % ring for p in range(starts[r], starts[r] + n)]
        out += [-1] * (pads[r] if pads else 0)
    return out


def seeded_tokens(ts, P, ring):
    """Which tokens the seed op writes: valid, and the token P ahead is past
    the batch, padding, or in another tail block."""
    n = len(ts)
    out = []
    for i, t in enumerate(ts):
        if t < 0:
            continue
        a = ts[i + P] if i + P < n else -1
        if not (a >= 0 and a // ring == t // ring):
            out.append(i)
    return out


def seed_inputs(gen: Gen, n: int, P: int, ring=None, pad=0, pads=False, index_dtype="int32", requests=None):
    torch = gen.torch
    ring = ring or P
    n_req = min(n, requests) if requests else max(1, n // 2048)
    cuts = sorted(gen.perm(n - 1)[:n_req - 1]) if n > 1 else []
    bounds = [0] + [c + 1 for c in cuts] + [n]
    lens = [b - a for a, b in zip(bounds, bounds[1:])]
    pad_counts = None
    if pads:  # a few padding entries after some requests, total length still n
        pad_counts = [0] * n_req
        for r in range(n_req):
            if lens[r] > 2 and r % 3 == 1:
                pad_counts[r] = min(2, lens[r] - 1)
                lens[r] -= pad_counts[r]
    ntb = 2 * n_req + 8
    blocks = gen.perm(ntb)[:n_req]
    ts = tail_slots(lens, gen.ints(0, 4096, n_req), blocks, ring, pad_counts)
    base, tail = make_tail(gen, ntb, ring, pad)
    tdt = torch.int64 if index_dtype == "int64" else torch.int32
    tslot = torch.tensor(ts, dtype=tdt, device=gen.device)
    seeded = len(seeded_tokens(ts, P, ring))
    return dict(tail_base=base, tail_kv_cache=tail, key=gen.randn((n, D)), gate_score=gen.randn((n, D)),
                tslot=tslot, requests=n_req, seeded=seeded, ring=ring)


def seed_bytes(n, seeded):
    return n * 4 + seeded * 4 * VEC


def decode_meta(ctx, next_n, P, ring, blocks, free):
    """positions / tail_slot_mapping / slot_mapping as [R][next_n] lists; the
    pool-granular slot_mapping is >= 0 only on a pool's last token."""
    pos = [[c + t for t in range(next_n)] for c in ctx]
    ts = [[blocks[r] * ring + p % ring for p in row] for r, row in enumerate(pos)]
    sm = [[next(free) if p % P == P - 1 else -1 for p in row] for row in pos]
    return pos, ts, sm


def decode_completions(pos, ts, sm, P):
    flat = [(p, t, s) for rows in zip(pos, ts, sm) for p, t, s in zip(*rows)]
    return [(p, t, s) for p, t, s in flat if p >= 0 and s >= 0 and p % P == P - 1]


def decode_bytes(pos, ts, sm, P):
    flat = [(p, t, s) for rows in zip(pos, ts, sm) for p, t, s in zip(*rows)]
    comp = sum(1 for p, t, s in flat if p >= 0 and s >= 0 and p % P == P - 1)
    stash = sum(1 for p, t, s in flat if p >= 0 and t >= 0)
    rd = len(flat) * (2 * VEC + 12) + comp * (P - 1) * 2 * VEC + (P * D * 4 if comp else 0)
    return rd + stash * 2 * VEC + comp * ROW


def decode_inputs(gen: Gen, R: int, nn: int, P: int, ring=None, pad=0, edges=False, random_cache=False):
    """One decode step of R requests x nn tokens (bench_triton's distribution).

    With ``edges``, four rows are appended: a padded row (all -1), a row whose
    pool end has no cache slot (stash only), a row whose non-completing token
    has no tail slot (no stash), and a row with valid positions and cache
    slots but tail_slot -1 (completions the reference computes from tail
    block 0; ours writes nothing: ``excused`` lists those cache slots)."""
    torch = gen.torch
    ring = ring or P
    rows = R + (4 if edges else 0)
    ntb = 2 * rows + 8
    nb = max(64, -(-4 * rows * nn // PAGE))
    blocks = gen.perm(ntb)[:rows]
    free = iter(gen.perm(nb * PAGE))
    ctx = gen.ints(4 * P, 8192, rows)
    pos, ts, sm = decode_meta(ctx, nn, P, ring, blocks, free)
    excused = []
    if edges:
        r = R
        pos[r], ts[r], sm[r] = [-1] * nn, [-1] * nn, [-1] * nn
        r = R + 1  # a pool end without a cache slot: its stash still happens
        pos[r] = [P - 1 + t for t in range(nn)]
        ts[r] = [blocks[r] * ring + p % ring for p in pos[r]]
        sm[r] = [-1] * nn
        r = R + 2  # a non-completing token without a tail slot: no stash
        pos[r] = [P * 3 + t for t in range(nn)]
        ts[r] = [blocks[r] * ring + p % ring for p in pos[r]]
        sm[r] = [next(free) if p % P == P - 1 else -1 for p in pos[r]]
        ts[r][0] = -1
        r = R + 3  # completions without a tail block
        pos[r] = [P - nn + t if P >= nn else t for t in range(nn)]
        pos[r] = [max(p, 0) for p in pos[r]]
        ts[r] = [-1] * nn
        sm[r] = [next(free) if p % P == P - 1 else -1 for p in pos[r]]
        excused = [s for p, s in zip(pos[r], sm[r]) if s >= 0 and p % P == P - 1]
    kv = gen.cache_bytes((nb, PAGE, ROW)) if random_cache else torch.zeros((nb, PAGE, ROW), dtype=torch.uint8,
                                                                              device=gen.device)
    base, tail = make_tail(gen, ntb, ring, pad)
    return dict(kv_cache=kv, tail_base=base, tail_kv_cache=tail, tail_slot_mapping=gen.i32(ts),
                key=gen.randn((rows, nn, D)), slot_score=gen.randn((rows, nn, D)),
                ape=gen.randn((P, D), 0.5, torch.float32), slot_mapping=gen.i32(sm), positions=gen.i32(pos),
                meta=(pos, ts, sm), excused=excused, ring=ring,
                completions=len(decode_completions(pos, ts, sm, P)))


def expand_inputs(gen: Gen, rows: int, P: int, topk: int = TOPK, index_dtype="int32", table_width=None):
    torch = gen.torch
    seq = gen.ints(P, 131072, rows)
    G = topk // P
    avail = torch.tensor(seq, dtype=torch.int64) // P
    ids = (torch.rand((rows, G), generator=gen.cpu) * avail[:, None]).long()
    ids[torch.arange(G)[None, :] >= avail[:, None]] = -1  # fewer pools than G
    ids[torch.rand((rows, G), generator=gen.cpu) < 0.01] = -1  # sparse invalid
    idt = torch.int64 if index_dtype == "int64" else torch.int32
    ids = ids.to(idt).to(gen.device)
    seq_t = gen.i32(seq)
    width = table_width or (max(seq) + P)
    page_table = torch.randint(0, 1 << 20, (rows, width), generator=gen.cpu, dtype=torch.int32).to(gen.device)
    offsets = torch.cumsum(seq_t.to(torch.int64), 0) - seq_t
    return dict(pool_ids=ids, seq_lens=seq_t, group_valid=ids >= 0, pool_lens=seq_t // P, page_table=page_table,
                topk_offsets=offsets, groups=G)


def expand_bytes(rows, P, topk=TOPK, twins=False):
    G = topk // P
    nb = rows * G * 4 + rows * 4 + rows * (topk + P - 1) * 4
    return nb + rows * (G + 4) if twins else nb


# --- bit-level comparison ---------------------------------------------------------------------
def raw_bytes(t):
    """The bytes of a tensor, flat uint8 (bool as 0/1)."""
    torch = sys.modules["torch"]
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.contiguous().reshape(-1).view(torch.uint8)


def e4m3_code_distance(a, b):
    """Largest |code(a) - code(b)| over e4m3 bytes, in units of one code
    (sign-magnitude order: neighbouring representable values are 1 apart)."""
    torch = sys.modules["torch"]
    a, b = raw_bytes(a).to(torch.int32), raw_bytes(b).to(torch.int32)
    sa = torch.where(a >= 128, -(a - 128), a)
    sb = torch.where(b >= 128, -(b - 128), b)
    if a.numel() == 0:
        return 0
    return int((sa - sb).abs().max())


def differing_bytes(ours, ref) -> int:
    a, b = raw_bytes(ours), raw_bytes(ref)
    if a.shape != b.shape:
        return max(a.numel(), b.numel())
    return int((a != b).sum())


class OnHost:
    """Runs kpool's functions on host copies of CUDA tensors and copies the
    caches back: checks the test harness (and the CPU library against the GPU
    reference) while the library has no CUDA path.

    Whole storages travel, so strided views (padded tails) keep their layout
    and the padding is checked too. Arguments that alias one storage get
    separate host copies: don't use it for calls whose caches alias."""

    IN_PLACE = {
        "kpool_compress_and_write_cache": (0,),
        "kpool_seed_tail_cache": (0,),
        "kpool_decode_update_and_maybe_write_cache_batched": (0, 1),
    }

    def __init__(self, module):
        self.module = module

    def __getattr__(self, name):
        fn = getattr(self.module, name)
        if not callable(fn):
            return fn
        in_place = self.IN_PLACE.get(name, ())

        def call(*args, **kwargs):
            torch = sys.modules["torch"]
            host_args = [self._to_host(a) for a in args]
            host_kwargs = {k: self._to_host(v) for k, v in kwargs.items()}
            result = fn(*host_args, **host_kwargs)
            for i in in_place:
                if i < len(args) and isinstance(args[i], torch.Tensor):
                    self._copy_back(host_args[i], args[i])
            device = next((a.device for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)),
                          None)
            return self._to_device(result, device)

        return call

    @staticmethod
    def _to_host(x):
        torch = sys.modules["torch"]
        if not isinstance(x, torch.Tensor) or x.device.type == "cpu":
            return x
        st = x.untyped_storage()
        whole = torch.empty((0,), dtype=torch.uint8, device=x.device).set_(st, 0, (st.nbytes(),), (1,))
        return whole.cpu().view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())

    @staticmethod
    def _copy_back(host_view, dev):
        torch = sys.modules["torch"]
        st = dev.untyped_storage()
        whole = torch.empty((0,), dtype=torch.uint8, device=dev.device).set_(st, 0, (st.nbytes(),), (1,))
        hst = host_view.untyped_storage()
        hwhole = torch.empty((0,), dtype=torch.uint8).set_(hst, 0, (hst.nbytes(),), (1,))
        whole.copy_(hwhole)

    @classmethod
    def _to_device(cls, x, device):
        torch = sys.modules["torch"]
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, tuple):
            return tuple(cls._to_device(v, device) for v in x)
        return x


def cache_slot_of_byte(kv, flat_offsets):
    """Cache slot (loc) of each byte offset into a contiguous kv cache; -1 for page padding."""
    torch = sys.modules["torch"]
    block = kv.shape[1]
    page_bytes = kv.stride(0)
    page, within = flat_offsets // page_bytes, flat_offsets % page_bytes
    k_part = within < block * D
    t = torch.where(k_part, within // D, (within - block * D) // 4)
    t = torch.where(within < block * ROW, t, torch.full_like(t, -1))
    return torch.where(t >= 0, page * block + t, t)


def cache_scales(kv, slots):
    """The f32 scales stored at cache slots (1-D int64 tensor)."""
    torch = sys.modules["torch"]
    block = kv.shape[1]
    flat = kv.reshape(-1)
    base = (slots // block) * kv.stride(0) + block * D + 4 * (slots % block)
    idx = base[:, None] + torch.arange(4, device=kv.device)
    return flat[idx].contiguous().view(torch.float32).reshape(-1)


def cache_k_rows(kv, slots):
    torch = sys.modules["torch"]
    block = kv.shape[1]
    flat = kv.reshape(-1)
    base = (slots // block) * kv.stride(0) + D * (slots % block)
    return flat[base[:, None] + torch.arange(D, device=kv.device)]


def compare_caches(ours, ref, round_scale=True):
    """How two kv caches differ, slot by slot: a dict of ``bytes`` (differing
    bytes), ``boundary`` (slots whose scales differ by exactly 2x: a ue8m0
    boundary case, SPEC shared numerics 3, the exact ceil(log2) against the
    reference's approximate one), ``other`` (every other differing slot;
    -1 stands for page padding), ``code_distance`` (largest e4m3 code
    distance in the K bytes of ``other``) and ``max_bytes_per_slot`` (of the
    132 bytes of one slot in ``other``: last-ulp arithmetic differences touch
    a few, a wrong slot or layout most of them)."""
    torch = sys.modules["torch"]
    a, b = raw_bytes(ours), raw_bytes(ref)
    bad = torch.nonzero(a != b).reshape(-1)
    res = dict(bytes=int(bad.numel()), boundary=[], other=[], code_distance=0, max_bytes_per_slot=0)
    if bad.numel() == 0:
        return res
    per_byte = cache_slot_of_byte(ours, bad)
    slots, counts = torch.unique(per_byte, return_counts=True)
    pad = slots < 0
    keep = slots[~pad]
    so, sr = cache_scales(ours, keep), cache_scales(ref, keep)
    boundary = (so == 2 * sr) | (sr == 2 * so) if round_scale else torch.zeros_like(so, dtype=torch.bool)
    other = keep[~boundary]
    res["boundary"] = keep[boundary].tolist()
    res["other"] = other.tolist() + ([-1] if bool(pad.any()) else [])
    res["code_distance"] = e4m3_code_distance(cache_k_rows(ours, other), cache_k_rows(ref, other))
    other_counts = counts[~pad][~boundary]
    res["max_bytes_per_slot"] = int(other_counts.max()) if other_counts.numel() else 0
    return res
