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
from conftest import skip_without_kpool_cuda  # noqa: E402
import workloads as kt  # noqa: E402
from engine_model import Engine, compare, run_compiled_against  # noqa: E402
from test_torch_ops import _all_ops, _state  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

try:
    REF = kt.import_reference()
except ImportError as e:
    pytest.skip(f"the Triton reference does not import: {e}", allow_module_level=True)
skip_without_kpool_cuda(pytest, kpool)

DEV = "cuda"


@pytest.fixture(autouse=True, scope="module")
def _reference_arithmetic():
    previous = kpool.set_arithmetic("triton")
    kpool.cuda_warm_up(torch.cuda.current_device())
    yield
    kpool.set_arithmetic(previous)


@pytest.mark.parametrize("P,ring", [(4, 8), (16, 16)])
def test_compiled_indexer_matches_the_reference_for_100_decode_steps(P, ring):
    torch._dynamo.reset()
    counters.clear()
    run_compiled_against(Engine(P, ring, DEV), kpool, REF, steps=100, mode="reduce-overhead")
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
        compare(f"trial {trial}", [(k, got[k], want[k]) for k in want] +
                 [("kv_cache", module.kv_cache, eager["kv_cache"]), ("tail", module.tail_base, eager["tail_base"])])
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
