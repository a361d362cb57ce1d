"""An engine's use of the indexer's kernels, for the torch.compile tests:
a ``torch.nn.Module`` holding the paged fp8 cache and the tail rings as
buffers (the rings as strided views of a padded allocation), and an engine
that makes each step's inputs (a prefill of R requests, then decode steps of
next_n tokens). test_gpu_torch_compile.py compiles it on CUDA with CUDA
graphs against the Triton reference; test_torch_ops.py compiles it on the
CPU against kpool in eager mode."""

from __future__ import annotations

import torch
import workloads as kt

D, PAGE = kt.D, kt.PAGE
HEADS = 4  # query heads per token


def _bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def compare(what, pairs):
    """Asserts that every (name, a, b) pair holds the same bytes."""
    bad = [name for name, a, b in pairs if not torch.equal(_bytes(a), _bytes(b))]
    assert not bad, f"{what}: {', '.join(bad)} differ"


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

    def __init__(self, P, ring, device, R=16, nn=2, G=8, steps=100, seed=11):
        self.P, self.ring, self.R, self.nn, self.G = P, ring, R, nn, G
        self.device = device
        self.gen = gen = kt.Gen(seed, device)
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
        return Indexer(lib, self.kv.clone(), self.tail_base.clone(), self.ring, self.ape.clone(), self.P)

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
        pool_rows = torch.tensor(starts, device=self.device)[:, None] + torch.arange(P, device=self.device)
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


def run_compiled_against(engine, lib, baseline, steps, **compile_options):
    """lib's module with prefill and decode compiled (fullgraph=True, and
    compile_options), next to baseline's module in eager mode on the same
    inputs: a prefill, then `steps` decode steps, every output compared at
    each step and the caches and tail rings (their padding included) at the
    end and after the prefill."""
    ours, ref = engine.module(lib), engine.module(baseline)
    prefill = torch.compile(ours.prefill, fullgraph=True, **compile_options)
    decode = torch.compile(ours.decode, fullgraph=True, **compile_options)

    x = engine.prefill_inputs()
    torch.compiler.cudagraph_mark_step_begin()
    got = prefill(*x)
    want = ref.prefill(*x)
    compare("prefill", [("q_fp8", got[0], want[0]), ("q_scale", got[1], want[1]),
                        ("kv_cache", ours.kv_cache, ref.kv_cache), ("tail", ours.tail_base, ref.tail_base)])
    for step in range(steps):
        x = engine.decode_inputs()
        torch.compiler.cudagraph_mark_step_begin()
        got = decode(*x)
        want = ref.decode(*x)
        compare(f"decode step {step}", [("q_fp8", got[0], want[0]), ("q_scale", got[1], want[1]),
                                        ("token_ids", got[2], want[2])])
    if engine.device != "cpu":
        torch.cuda.synchronize()
    compare(f"after {steps} decode steps", [("kv_cache", ours.kv_cache, ref.kv_cache),
                                            ("tail", ours.tail_base, ref.tail_base)])
