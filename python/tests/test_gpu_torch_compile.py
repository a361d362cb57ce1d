"""kpool's custom operators in compiled engine code on one GPU: an
indexer-shaped ``torch.nn.Module`` compiled with ``fullgraph=True`` and
``mode="reduce-overhead"`` (CUDA graphs inside the compiled region) against
the same module in eager mode with the Triton reference's functions.

Skipped unless torch sees a CUDA device, libkpool.so has its CUDA path and
the reference (``kpool_triton.py``: $KPOOL_REFERENCE_DIR, else
../shared/reference next to the repo) imports.

    PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so python3 -m pytest python/tests/test_gpu_torch_compile.py -q

Both sides run the reference's arithmetic (kpool.set_arithmetic("triton")),
so every byte must match: caches, tail rings (their padding included), fp8
queries, scales and token ids, at every step.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "bench")))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

import kpool  # noqa: E402
import workloads as kt  # noqa: E402
from test_torch_ops import _all_ops, _state  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

try:
    REF = kt.import_reference()
except ImportError as e:
    pytest.skip(f"the Triton reference does not import: {e}", allow_module_level=True)
try:
    _version = kpool.version()
except OSError as e:
    pytest.skip(f"libkpool.so does not load: {e}", allow_module_level=True)
if "cuda" not in _version:
    pytest.skip(f"{kpool.library_path()} has no CUDA path ({_version!r})", allow_module_level=True)

DEV = "cuda"
D, PAGE = kt.D, kt.PAGE
HEADS = 4  # query heads per token


@pytest.fixture(autouse=True, scope="module")
def _reference_arithmetic():
    previous = kpool.set_arithmetic("triton")
    kpool.cuda_warm_up(torch.cuda.current_device())
    yield
    kpool.set_arithmetic(previous)


def _bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class Indexer(torch.nn.Module):
    """The key-pooling indexer's kernels as an engine calls them: the paged
    fp8 cache and the tail rings (views of a padded allocation) are buffers
    the ops write in place; queries, keys and the step's metadata come in."""

    def __init__(self, lib, kv_cache, tail_base, ring, ape, pool_size):
        super().__init__()
        self.lib, self.ring, self.pool_size = lib, ring, pool_size
        self.register_buffer("kv_cache", kv_cache)
        self.register_buffer("tail_base", tail_base)
        self.register_buffer("ape", ape)

    def tail(self):
        blocks, width = self.tail_base.shape
        return self.tail_base.as_strided((blocks, 2, self.ring, D), (width, self.ring * D, D, 1))

    def prefill(self, q, key, gate, tslot, pool_rows, loc):
        lib, P = self.lib, self.pool_size
        q_fp8, q_scale = lib.fwht128_quant_fp8(q)
        lib.kpool_seed_tail_cache(self.tail(), key, gate, tslot, P)
        lib.kpool_compress_and_write_cache(self.kv_cache, key[pool_rows], gate[pool_rows], self.ape, loc, P)
        return q_fp8, q_scale

    def decode(self, q, key, score, tail_slot_mapping, slot_mapping, positions, pool_ids, seq_lens):
        lib, P = self.lib, self.pool_size
        q_fp8, q_scale = lib.fwht128_quant_fp8(q.reshape(-1, D))
        lib.kpool_decode_update_and_maybe_write_cache_batched(self.kv_cache, self.tail(), tail_slot_mapping, key,
                                                              score, self.ape, slot_mapping, positions, P)
        token_ids = lib.expand_pools_and_append_tail(pool_ids, seq_lens, P)
        return q_fp8, q_scale, token_ids


class Engine:
    """Prefill of R requests, then decode steps of next_n tokens: about 10%
    of the rows idle at each step, 1 or next_n tokens accepted (rejected
    positions are recomputed at the next step), and G selected pools per
    request expanded to token ids. Every input is made once per step and
    given to both modules."""

    def __init__(self, P, ring, R=16, nn=2, G=8, steps=100, seed=11):
        self.P, self.ring, self.R, self.nn, self.G = P, ring, R, nn, G
        self.gen = gen = kt.Gen(seed, DEV)
        self.prompts = gen.ints(P, 300, R)
        ntb = R + 8
        self.blocks = gen.perm(ntb)[:R]
        pools_max = sum((L + steps * nn) // P + 2 for L in self.prompts)
        nb = -(-pools_max // PAGE) + 1
        self.free = iter(gen.perm(nb * PAGE))
        self.slot_of = [dict() for _ in range(R)]
        self.kv = gen.cache_bytes((nb, PAGE, kt.ROW))
        self.tail_base, _ = kt.make_tail(gen, ntb, ring, pad=96)
        self.ape = gen.randn((P, D), 0.5, torch.float32)
        self.ctx = list(self.prompts)

    def module(self, lib):
        return Indexer(lib, self.kv.clone(), self.tail_base.clone(), self.ring, self.ape.clone(), self.P).to(DEV)

    def slot(self, r, pool):
        if pool not in self.slot_of[r]:
            self.slot_of[r][pool] = next(self.free)
        return self.slot_of[r][pool]

    def prefill_inputs(self):
        gen, P, T = self.gen, self.P, sum(self.prompts)
        starts, locs, off = [], [], 0
        for r, L in enumerate(self.prompts):
            for j in range(L // P):
                starts.append(off + j * P)
                locs.append(self.slot(r, j))
            off += L
        pool_rows = torch.tensor(starts, device=DEV)[:, None] + torch.arange(P, device=DEV)
        tslot = gen.i32(kt.tail_slots(self.prompts, [0] * self.R, self.blocks, self.ring))
        return (gen.randn((T * HEADS, D)), gen.randn((T, D)), gen.randn((T, D)), tslot, pool_rows, gen.i64(locs))

    def decode_inputs(self):
        gen, P, R, nn, ring = self.gen, self.P, self.R, self.nn, self.ring
        idle = gen.ints(0, 10, R)
        pos, ts, sm, ids = [], [], [], []
        for r in range(R):
            pools = self.ctx[r] // P
            ids.append([g if g < pools and g % 5 != 4 else -1 for g in gen.ints(0, pools + 2, self.G)])
            if idle[r] == 0:
                pos.append([-1] * nn), ts.append([-1] * nn), sm.append([-1] * nn)
                continue
            p = [self.ctx[r] + t for t in range(nn)]
            pos.append(p)
            ts.append([self.blocks[r] * ring + x % ring for x in p])
            sm.append([self.slot(r, x // P) if x % P == P - 1 else -1 for x in p])
        seq_lens = gen.i32([c + nn for c in self.ctx])
        accepted = gen.ints(1, nn + 1, R)
        for r in range(R):
            if idle[r] != 0:
                self.ctx[r] += accepted[r]
        return (gen.randn((R * nn * HEADS, D)), gen.randn((R, nn, D)), gen.randn((R, nn, D)), gen.i32(ts),
                gen.i32(sm), gen.i32(pos), gen.i32(ids), seq_lens)


def _compare(what, pairs):
    bad = [name for name, a, b in pairs if not torch.equal(_bytes(a), _bytes(b))]
    assert not bad, f"{what}: {', '.join(bad)} differ"


@pytest.mark.parametrize("P,ring", [(4, 8), (16, 16)])
def test_compiled_indexer_matches_the_reference_for_100_decode_steps(P, ring):
    torch._dynamo.reset()
    counters.clear()
    steps = 100
    engine = Engine(P, ring, steps=steps)
    ours, ref = engine.module(kpool), engine.module(REF)
    prefill = torch.compile(ours.prefill, fullgraph=True, mode="reduce-overhead")
    decode = torch.compile(ours.decode, fullgraph=True, mode="reduce-overhead")

    x = engine.prefill_inputs()
    torch.compiler.cudagraph_mark_step_begin()
    got = prefill(*x)
    want = ref.prefill(*x)
    _compare("prefill", [("q_fp8", got[0], want[0]), ("q_scale", got[1], want[1]),
                         ("kv_cache", ours.kv_cache, ref.kv_cache), ("tail", ours.tail_base, ref.tail_base)])
    for step in range(steps):
        x = engine.decode_inputs()
        torch.compiler.cudagraph_mark_step_begin()
        got = decode(*x)
        want = ref.decode(*x)
        _compare(f"decode step {step}", [("q_fp8", got[0], want[0]), ("q_scale", got[1], want[1]),
                                         ("token_ids", got[2], want[2])])
    torch.cuda.synchronize()
    _compare(f"after {steps} decode steps", [("kv_cache", ours.kv_cache, ref.kv_cache),
                                             ("tail", ours.tail_base, ref.tail_base)])
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


class AllOps(torch.nn.Module):
    """Every custom operator once, mixed with torch ops (test_torch_ops's
    sequence), its caches as buffers."""

    def __init__(self, state):
        super().__init__()
        self.register_buffer("kv_cache", state["kv_cache"])
        self.register_buffer("tail_base", state["tail_base"])
        self.tail_view = (tuple(state["tail_kv_cache"].shape), tuple(state["tail_kv_cache"].stride()))

    def forward(self, inputs):
        s = dict(inputs, kv_cache=self.kv_cache, tail_base=self.tail_base,
                 tail_kv_cache=self.tail_base.as_strided(*self.tail_view))
        return _all_ops(s)


def test_every_op_under_cuda_graphs_replays_like_eager():
    """test_torch_ops's mix of every op, compiled with reduce-overhead,
    replayed on three new sets of inputs and cache contents, each against
    the same calls in eager mode."""
    torch._dynamo.reset()
    counters.clear()
    static = {k: v.to(DEV) for k, v in _state(0).items()}
    module = AllOps(static)
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    for trial in range(4):
        fresh = {k: v.to(DEV) for k, v in _state(10 + trial).items()}
        module.kv_cache.copy_(fresh["kv_cache"])
        module.tail_base.copy_(fresh["tail_base"])
        inputs = {k: v for k, v in fresh.items() if k not in ("kv_cache", "tail_base", "tail_kv_cache")}
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled(inputs)
        eager = dict(fresh, tail_kv_cache=fresh["tail_base"].as_strided(*module.tail_view))
        want = _all_ops(eager)
        _compare(f"trial {trial}", [(k, got[k], want[k]) for k in want] +
                 [("kv_cache", module.kv_cache, eager["kv_cache"]), ("tail", module.tail_base, eager["tail_base"])])
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
