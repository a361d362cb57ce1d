"""kpool's ops as PyTorch custom operators (``torch.ops.kpool.*``), and the
torch side of the drop-in functions.

Every op is defined with ``torch.library`` in the namespace ``kpool``: a
schema that marks the caches and tail rings it writes (``Tensor(a!)``) and
ends with the call's arithmetic (``int arithmetic=0``, a kpool_arithmetic
code: what torch.compile traces and a CUDA graph captures), one kernel for
CPU and CUDA tensors (kpool picks the device from the tensors) and a fake
implementation that gives the outputs' shapes, dtypes and devices, so
``torch.compile(fullgraph=True)`` traces them and CUDA graphs capture them.
A second copy of kpool in the process (bundled by another package) defines
its ops in a namespace of its own, ``kpool_<hash of its name and directory>``
(``NAMESPACE``). The drop-in functions (``kpool.fwht128_quant_fp8``, ...) call
the ops whenever something traces them (Dynamo, a dispatch mode, a tensor
subclass such as a fake tensor); on plain tensors in eager mode they run
the op's kernel directly, skipping the dispatcher's few µs, with the same
bytes.

Imported by ``kpool`` when torch imports; kpool without torch never loads it.
"""

from __future__ import annotations

import hashlib
import os

import torch

if not hasattr(torch.library, "register_fake"):  # ops.py then takes torch tensors through ctypes only
    raise ImportError(f"kpool's torch operators need torch >= 2.4 (this is {torch.__version__})")

from . import _calls, _lib, _tensors
from ._lib import KPOOL_HEAD_DIM, KpoolTypeError, KpoolValueError

D = KPOOL_HEAD_DIM
E4M3 = torch.float8_e4m3fn
F32, I32, I64, BF16 = torch.float32, torch.int32, torch.int64, torch.bfloat16
Tensor = torch.Tensor


def _define_library():
    """The namespace and library this copy of kpool defines its ops in:
    ``kpool``, unless another copy in the process has taken it."""
    try:
        return "kpool", torch.library.Library("kpool", "DEF")  # noqa: TOR901 (kept for the life of the process)
    except RuntimeError:  # "Only a single TORCH_LIBRARY can be used to register the namespace kpool"
        copy = f"{__name__} in {os.path.dirname(os.path.abspath(__file__))}".encode()
        namespace = "kpool_" + hashlib.sha1(copy).hexdigest()[:12]
        return namespace, torch.library.Library(namespace, "DEF")  # noqa: TOR901


NAMESPACE, _library = _define_library()

# Each op's schema, from the op table (ops/*.toml's [torch]): one that marks
# the caches and tail rings it writes (Tensor(a!)); the arithmetic is added
# as its last argument (with_arithmetic).
SCHEMAS = _lib.op_table()["torch"]


def _not_a_tensor(x, name):
    return KpoolTypeError(f"{name} is a {type(x).__name__}, expected a torch.Tensor")


def _require_dims(x, name, ndim, what):
    if not isinstance(x, Tensor):
        raise _not_a_tensor(x, name)
    if x.dim() != ndim:
        raise KpoolValueError(f"{name} has shape {list(x.shape)} ({x.dim()} dims), expected {what}")


def _rows(x, name, ndim, what):
    _require_dims(x, name, ndim, what)
    return x.shape[0]


def _empty(like, shape, dtype):
    # new_empty: like's device without building a torch.device and parsing it
    # again (a µs less than torch.empty(..., device=like.device) per output).
    return like.new_empty(shape, dtype=dtype)


# --- outputs: shapes, dtypes and devices, shared by the kernels and the fakes ----
def _fwht_outputs(q):
    rows = _rows(q, "q", 2, "[rows, 128]")
    return _empty(q, (rows, D), E4M3), _empty(q, (rows, 1), F32)


def _compressed_rows(slot_k):
    n = _rows(slot_k, "slot_k", 3, "[n_pools, pool_size, 128]")
    return _empty(slot_k, (n, D), E4M3), _empty(slot_k, (n,), F32)


def _expand_and_append_out(pool_ids, pool_size):
    rows = _rows(pool_ids, "pool_ids", 2, "[rows, n_groups]")
    return _empty(pool_ids, (rows, max(pool_ids.shape[1] * pool_size + pool_size - 1, 0)), I32)


def _expand_to_tokens_out(group_ids, topk):
    rows = _rows(group_ids, "group_ids", 2, "[rows, topk / pool_size]")
    return _empty(group_ids, (rows, max(topk, 0)), I32)


def _append_tail_out(topk_result, pool_size):
    rows = _rows(topk_result, "topk_result", 2, "[rows, cols]")
    return _empty(topk_result, (rows, max(topk_result.shape[1] + pool_size - 1, 0)), I32)


# --- kernels: outputs allocated, then the C call -----------------------------------
# The extension allocates the outputs itself where it can (its NAME_new
# functions, in about half the time per output); NotImplemented leaves them to the
# functions above, whose checks name a wrong argument.
def _fwht_kernel(q, arithmetic=_calls.DEFAULT):
    calls = _calls.torch_calls()
    outputs = calls.fwht128_quant_fp8_new(q, arithmetic)
    if outputs is NotImplemented:
        outputs = _fwht_outputs(q)
        calls.fwht128_quant_fp8(q, *outputs, arithmetic)
    return outputs


def _compress_kernel(kv_cache, slot_k, slot_score, ape, loc, write_mask, pool_size, head_dim, round_scale,
                     write_cache, arithmetic=_calls.DEFAULT):
    _calls.torch_calls().compress_and_write_cache(kv_cache if write_cache else None, slot_k, slot_score, ape, loc,
                                                  write_mask, None, None, pool_size, head_dim, round_scale,
                                                  write_cache, arithmetic)


def _compress_to_rows_kernel(kv_cache, slot_k, slot_score, ape, loc, write_mask, pool_size, head_dim, round_scale,
                             write_cache, arithmetic=_calls.DEFAULT):
    inputs = (kv_cache if write_cache else None, slot_k, slot_score, ape, loc, write_mask)
    params = (pool_size, head_dim, round_scale, write_cache, arithmetic)
    calls = _calls.torch_calls()
    rows = calls.compress_and_write_cache_new(*inputs, *params)
    if rows is NotImplemented:
        rows = _compressed_rows(slot_k)
        calls.compress_and_write_cache(*inputs, *rows, *params)
    return rows


def _compress_tokens_kernel(*args, **kwargs):
    _calls.ctypes_calls.compress_tokens_and_write_cache(*args, **kwargs)


def _seed_kernel(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, arithmetic=_calls.DEFAULT):
    _calls.torch_calls().seed_tail_cache(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, arithmetic)


def _decode_kernel(kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions,
                   pool_size, head_dim, round_scale, arithmetic=_calls.DEFAULT):
    """Returns the skipped completions (the op itself returns nothing)."""
    return _calls.torch_calls().decode_update_and_maybe_write_cache_batched(
        kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions, pool_size,
        head_dim, round_scale, arithmetic)


def _ragged_decode_kernel(*args, **kwargs):
    """Returns the skipped completions (the op itself returns nothing)."""
    return _calls.ctypes_calls.decode_update_and_maybe_write_cache_ragged(*args, **kwargs)


def _ragged_decode_op_kernel(*args, **kwargs):
    _ragged_decode_kernel(*args, **kwargs)


def _decode_op_kernel(*args, **kwargs):
    _decode_kernel(*args, **kwargs)


def _expand_and_append_kernel(pool_ids, seq_lens, pool_size, bound_pool_ids, arithmetic=_calls.DEFAULT):
    calls = _calls.torch_calls()
    out = calls.expand_pools_and_append_tail_new(pool_ids, seq_lens, pool_size, bound_pool_ids, arithmetic)
    if out is NotImplemented:
        out = _expand_and_append_out(pool_ids, pool_size)
        calls.expand_pools_and_append_tail(pool_ids, seq_lens, out, pool_size, bound_pool_ids, arithmetic)
    return out


def _expand_to_tokens_kernel(group_ids, group_valid, page_table, topk_offsets, topk, pool_size,
                             arithmetic=_calls.DEFAULT):
    calls = _calls.torch_calls()
    out = calls.expand_pools_to_tokens_new(group_ids, group_valid, page_table, topk_offsets, topk, pool_size,
                                           arithmetic)
    if out is NotImplemented:
        out = _expand_to_tokens_out(group_ids, topk)
        calls.expand_pools_to_tokens(group_ids, group_valid, page_table, topk_offsets, out, topk, pool_size,
                                     arithmetic)
    return out


def _append_tail_kernel(topk_result, seq_lens, pool_lens, page_table, topk_offsets, pool_size,
                        arithmetic=_calls.DEFAULT):
    calls = _calls.torch_calls()
    out = calls.append_tail_to_topk_new(topk_result, seq_lens, pool_lens, page_table, topk_offsets, pool_size,
                                        arithmetic)
    if out is NotImplemented:
        out = _append_tail_out(topk_result, pool_size)
        calls.append_tail_to_topk(topk_result, seq_lens, pool_lens, page_table, topk_offsets, out, pool_size,
                                  arithmetic)
    return out


def _expand_and_append_out_kernel(pool_ids, seq_lens, pool_size, bound_pool_ids, out, arithmetic=_calls.DEFAULT):
    _calls.torch_calls().expand_pools_and_append_tail(pool_ids, seq_lens, out, pool_size, bound_pool_ids, arithmetic)


def _expand_to_tokens_out_kernel(group_ids, group_valid, page_table, topk_offsets, topk, pool_size, out,
                                 arithmetic=_calls.DEFAULT):
    _calls.torch_calls().expand_pools_to_tokens(group_ids, group_valid, page_table, topk_offsets, out, topk,
                                                pool_size, arithmetic)


def _append_tail_out_kernel(topk_result, seq_lens, pool_lens, page_table, topk_offsets, pool_size, out,
                            arithmetic=_calls.DEFAULT):
    _calls.torch_calls().append_tail_to_topk(topk_result, seq_lens, pool_lens, page_table, topk_offsets, out,
                                             pool_size, arithmetic)


def _nothing(*args):
    return None


# name: (kernel, fake). Each kernel takes the arithmetic last (the schemas
# end with it, below); the fakes are given the arguments without it.
_OPS = {
    "fwht128_quant_fp8": (_fwht_kernel, _fwht_outputs),
    "compress_and_write_cache": (_compress_kernel, _nothing),
    "compress_to_rows": (_compress_to_rows_kernel, lambda kv, slot_k, *rest: _compressed_rows(slot_k)),
    "compress_tokens_and_write_cache": (_compress_tokens_kernel, _nothing),
    "seed_tail_cache": (_seed_kernel, _nothing),
    "decode_update_and_maybe_write_cache_batched": (_decode_op_kernel, _nothing),
    "decode_update_and_maybe_write_cache_ragged": (_ragged_decode_op_kernel, _nothing),
    "expand_pools_and_append_tail": (_expand_and_append_kernel,
                                     lambda pool_ids, seq_lens, P, bound: _expand_and_append_out(pool_ids, P)),
    "expand_pools_to_tokens": (_expand_to_tokens_kernel,
                               lambda ids, valid, table, offsets, topk, P: _expand_to_tokens_out(ids, topk)),
    "append_tail_to_topk": (_append_tail_kernel,
                            lambda result, seq, plens, table, offsets, P: _append_tail_out(result, P)),
    "expand_pools_and_append_tail.out": (_expand_and_append_out_kernel, _nothing),
    "expand_pools_to_tokens.out": (_expand_to_tokens_out_kernel, _nothing),
    "append_tail_to_topk.out": (_append_tail_out_kernel, _nothing),
}


def with_arithmetic(schema: str) -> str:
    """An op's schema with the arithmetic as its last argument: a
    kpool_arithmetic code, KPOOL_ARITHMETIC_DEFAULT when left out."""
    arguments, arrow, returns = schema.partition(") ->")
    return f"{arguments}, int arithmetic={_calls.DEFAULT}{arrow}{returns}"


def _without_arithmetic(fake, schema):
    """The fake of an op, called with the op's arguments as given (the
    arithmetic among them or not: torch passes no defaults), on those
    before the arithmetic."""
    count = len(torch._C.parse_schema("op" + schema).arguments)

    def fake_of_call(*args, arithmetic=_calls.DEFAULT):
        return fake(*args[:count])

    return fake_of_call




def _entry_point_kernel(name):
    """The kernel of a table op written here by nothing else: its entry
    point on the op's arguments as they are (its schema is the C call's:
    outputs passed in, nothing returned)."""

    def kernel(*args):
        getattr(_calls.torch_calls() if name in dict(_calls.entry_points()) else _calls.ctypes_calls, name)(*args)

    return kernel


for _name in SCHEMAS.keys() - _OPS.keys():
    _OPS[_name] = (_entry_point_kernel(_name), _nothing)

for _name, (_kernel, _fake) in _OPS.items():
    _library.define(_name + with_arithmetic(SCHEMAS[_name]))
    _library.impl(_name, _kernel, "CPU")
    _library.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _without_arithmetic(_fake, SCHEMAS[_name]), lib=_library)

ops = getattr(torch.ops, NAMESPACE)


# --- the drop-in functions' torch side ------------------------------------------------
# The context's default arithmetic (kpool.set_arithmetic) as torch.compile
# sees it: Dynamo cannot trace a contextvar read (a graph break), so it runs
# this once per trace and keeps the code in the graph as a constant, without
# a guard: a compiled function keeps the default of its trace, and one that
# passes `arithmetic=` is traced (and guarded) per value. Eager calls read it
# each time (the decorator only marks the function).
_context_arithmetic = torch.compiler.assume_constant_result(_tensors.context_arithmetic_code)


def arithmetic_code(name=None) -> int:
    """The kpool_arithmetic code of a call's ``arithmetic`` argument (None:
    the context's default), traceable by torch.compile."""
    return _context_arithmetic() if name is None else _tensors.arithmetic_code(name)


_is_compiling = torch.compiler.is_compiling  # Dynamo folds it to True while it traces
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _eager(t) -> bool:
    """Run the kernel directly: nothing is tracing this call (Dynamo, a
    dispatch mode such as fake tensors or make_fx) and t is a plain tensor."""
    return not _is_compiling() and type(t) is Tensor and not _dispatch_modes()


def _integer(x, name, dtype):
    """x, or x converted where the reference converts it too (``.to(dtype)``)."""
    if x is None or (type(x) is Tensor and x.dtype == dtype):
        return x
    if not isinstance(x, Tensor):
        raise _not_a_tensor(x, name)
    if x.dtype == dtype:
        return x
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise KpoolTypeError(f"{name} has dtype {str(x.dtype).replace('torch.', '')}, expected an integer dtype")
    return x.to(dtype)


def _index_ids(ids, name):
    return ids if ids.dtype in (I32, I64) else _integer(ids, name, I64)


def _require_tensors(**tensors):
    """The traced path's argument check (torch.ops' own schema error would
    not name the argument as kpool's errors do); None is passed through for
    the runtime to name."""
    for name, x in tensors.items():
        if x is not None and not isinstance(x, Tensor):
            raise _not_a_tensor(x, name)


def _as_index(x, name, dtype):
    """An index tensor of another integer dtype (int8, int16, uint8, ... as
    the reference's kernels load them) as ``dtype``: the same values."""
    if not isinstance(x, Tensor):
        raise _not_a_tensor(x, name)
    return _integer(x, name, dtype)


def _decode_indices(tail_slot_mapping, slot_mapping, positions):
    """The decode kernels take their three index tensors in one dtype, int32
    or int64: any other mix of integer dtypes is converted, to int64 where
    one of them is int64 (values kept), else to int32."""
    named = {"tail_slot_mapping": tail_slot_mapping, "slot_mapping": slot_mapping, "positions": positions}
    wide = any(isinstance(x, Tensor) and x.dtype == I64 for x in named.values())
    return tuple(_as_index(x, name, I64 if wide else I32) for name, x in named.items())


def fwht128_quant_fp8(q, arithmetic):
    if _eager(q):
        return _fwht_kernel(q, arithmetic)
    return ops.fwht128_quant_fp8(q, arithmetic)


def compress_and_write_cache(kv_cache, slot_k, slot_score, ape, loc, pool_size, head_dim, write_mask, round_scale,
                             return_compressed, write_cache, arithmetic):
    try:
        widen = slot_score.dtype not in (BF16, F32) and slot_score.dtype.is_floating_point
    except AttributeError:  # None or no tensor: named by the runtime or here
        widen = False
        _require_tensors(slot_score=slot_score)
    if widen:
        slot_score = slot_score.to(F32)  # what the reference's loads do
    args = (kv_cache if write_cache else None, slot_k, slot_score, ape, loc, write_mask, pool_size, head_dim,
            bool(round_scale), bool(write_cache), arithmetic)
    eager = _eager(slot_k)
    if not eager:
        _require_tensors(kv_cache=kv_cache, slot_score=slot_score, ape=ape, loc=loc, write_mask=write_mask)
    if return_compressed:
        if eager:
            return _compress_to_rows_kernel(*args)
        return ops.compress_to_rows(*args)
    if eager:
        _compress_kernel(*args)
    else:
        ops.compress_and_write_cache(*args)
    return None


def compress_tokens_and_write_cache(kv_cache, key, gate_score, ape, slot_mapping, pool_size, head_dim, round_scale,
                                    tail_kv_cache, tail_slot_mapping, positions, arithmetic):
    _require_tensors(slot_mapping=slot_mapping)
    if positions is not None:
        named = {"slot_mapping": slot_mapping, "tail_slot_mapping": tail_slot_mapping, "positions": positions}
        wide = any(isinstance(x, Tensor) and x.dtype == I64 for x in named.values())
        slot_mapping, tail_slot_mapping, positions = (_as_index(x, name, I64 if wide else I32)
                                                      for name, x in named.items())
    elif tail_slot_mapping is not None and (type(tail_slot_mapping) is not Tensor
                                            or tail_slot_mapping.dtype not in (I32, I64)):
        tail_slot_mapping = _as_index(tail_slot_mapping, "tail_slot_mapping", I32)
    args = (kv_cache, key, gate_score, ape, _index_ids(slot_mapping, "slot_mapping"), tail_kv_cache,
            tail_slot_mapping, positions, pool_size, head_dim, bool(round_scale), arithmetic)
    if _eager(key):
        _compress_tokens_kernel(*args)
    else:
        _require_tensors(kv_cache=kv_cache, gate_score=gate_score, ape=ape, tail_kv_cache=tail_kv_cache)
        ops.compress_tokens_and_write_cache(*args)


def seed_tail_cache(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, arithmetic):
    if type(tslot) is not Tensor or tslot.dtype not in (I32, I64):
        tslot = _as_index(tslot, "tslot", I32)
    if _eager(key):
        _seed_kernel(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, arithmetic)
    else:
        _require_tensors(tail_kv_cache=tail_kv_cache, gate_score=gate_score)
        ops.seed_tail_cache(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, arithmetic)


def decode_update_and_maybe_write_cache_batched(kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape,
                                                slot_mapping, positions, pool_size, head_dim, round_scale,
                                                return_skipped, arithmetic):
    if not (type(tail_slot_mapping) is Tensor and type(slot_mapping) is Tensor and type(positions) is Tensor
            and tail_slot_mapping.dtype == slot_mapping.dtype == positions.dtype and positions.dtype in (I32, I64)):
        tail_slot_mapping, slot_mapping, positions = _decode_indices(tail_slot_mapping, slot_mapping, positions)
    args = (kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions, pool_size,
            head_dim, bool(round_scale), arithmetic)
    return _decode_step(_decode_kernel, ops.decode_update_and_maybe_write_cache_batched, args, return_skipped)


def _decode_step(kernel, op, args, return_skipped):
    """A decode step's call (batched or ragged: args start with kv_cache,
    tail_kv_cache, tail_slot_mapping, key, slot_score, ape): eager, it
    returns the skipped completions when asked; traced, the op."""
    kv_cache, tail_kv_cache, _, key, slot_score, ape = args[:6]
    if _eager(key):
        skipped = kernel(*args)
        return skipped if return_skipped else None
    if return_skipped:
        raise KpoolValueError("return_skipped=True is for eager calls: the count is a host value, which a traced "
                              "graph cannot return")
    _require_tensors(kv_cache=kv_cache, tail_kv_cache=tail_kv_cache, slot_score=slot_score, ape=ape)
    op(*args)
    return None


def _into_out(like, out_kernel, out_op, args, out, arithmetic):
    """An expand op's out= form: the caller's int32 buffer written in place
    (its shape, dtype and strides checked by the C entry point), returned."""
    if not isinstance(out, Tensor):
        raise _not_a_tensor(out, "out")
    if _eager(like):
        out_kernel(*args, out, arithmetic)
    else:
        out_op(*args, out, arithmetic)
    return out


def decode_update_and_maybe_write_cache_ragged(kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape,
                                               slot_mapping, positions, query_start_loc, pool_size, head_dim,
                                               round_scale, max_query_len, return_skipped, arithmetic):
    named = {"tail_slot_mapping": tail_slot_mapping, "slot_mapping": slot_mapping, "positions": positions,
             "query_start_loc": query_start_loc}
    if not (all(type(x) is Tensor for x in named.values()) and len({x.dtype for x in named.values()}) == 1
            and positions.dtype in (I32, I64)):
        wide = any(isinstance(x, Tensor) and x.dtype == I64 for x in named.values())
        tail_slot_mapping, slot_mapping, positions, query_start_loc = (
            _as_index(x, name, I64 if wide else I32) for name, x in named.items())
    if max_query_len is None:
        max_query_len = 0
    elif isinstance(max_query_len, bool) or not isinstance(max_query_len, int) or max_query_len < 1:
        raise KpoolValueError(f"max_query_len = {max_query_len!r}: expected a positive int (or None)")
    args = (kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions, query_start_loc,
            max_query_len, pool_size, head_dim, bool(round_scale), arithmetic)
    return _decode_step(_ragged_decode_kernel, ops.decode_update_and_maybe_write_cache_ragged, args, return_skipped)


# The three expand helpers from their drop-in function (ops.py), each in one
# step: the arithmetic's name resolved, then on eager plain tensors in the
# dtypes the kernel takes the extension's one call, which allocates the
# output; anything else (conversions, out=, tracing, the ctypes fallback)
# the general path below it.
_IDS = (I32, I64)


def expand_pools_to_tokens(group_ids, group_valid, topk, pool_size, page_table, topk_offsets, arithmetic, out=None):
    arithmetic = arithmetic_code(arithmetic)
    if (out is None and group_ids.dtype in _IDS and page_table is None and topk_offsets is None
            and _eager(group_ids)):
        result = _calls.torch_calls().expand_pools_to_tokens_new(group_ids, group_valid, None, None, topk, pool_size,
                                                                 arithmetic)
        if result is not NotImplemented:
            return result
    args = (_index_ids(group_ids, "group_ids"), group_valid, _integer(page_table, "page_table", I32),
            _integer(topk_offsets, "topk_offsets", I64), topk, pool_size)
    if out is not None:
        _require_tensors(group_valid=group_valid)
        return _into_out(group_ids, _expand_to_tokens_out_kernel, ops.expand_pools_to_tokens.out, args, out, arithmetic)
    args += (arithmetic,)
    if _eager(group_ids):
        return _expand_to_tokens_kernel(*args)
    _require_tensors(group_valid=group_valid)
    return ops.expand_pools_to_tokens(*args)


def append_tail_to_topk(topk_result, seq_lens, pool_lens, pool_size, page_table, topk_offsets, arithmetic, out=None):
    arithmetic = arithmetic_code(arithmetic)
    if topk_result.dtype != I32:
        raise KpoolTypeError(f"topk_result has dtype {str(topk_result.dtype).replace('torch.', '')}, expected int32")
    _require_dims(seq_lens, "seq_lens", 1, "[rows]")
    _require_dims(pool_lens, "pool_lens", 1, "[rows]")
    if pool_size == 1 and out is None:
        return topk_result  # no tail; the reference returns its input too
    if (out is None and seq_lens.dtype == I32 and pool_lens.dtype == I32 and page_table is None
            and topk_offsets is None and _eager(topk_result)):
        result = _calls.torch_calls().append_tail_to_topk_new(topk_result, seq_lens, pool_lens, None, None, pool_size,
                                                              arithmetic)
        if result is not NotImplemented:
            return result
    args = (topk_result, _integer(seq_lens, "seq_lens", I32), _integer(pool_lens, "pool_lens", I32),
            _integer(page_table, "page_table", I32), _integer(topk_offsets, "topk_offsets", I64), pool_size)
    if out is not None:
        return _into_out(topk_result, _append_tail_out_kernel, ops.append_tail_to_topk.out, args, out, arithmetic)
    args += (arithmetic,)
    if _eager(topk_result):
        return _append_tail_kernel(*args)
    return ops.append_tail_to_topk(*args)


def expand_pools_and_append_tail(pool_ids, seq_lens, pool_size, bound_pool_ids, arithmetic, out=None):
    if type(bound_pool_ids) is not bool:
        _tensors.require_flag(bound_pool_ids, "bound_pool_ids")
        bound_pool_ids = bool(bound_pool_ids)
    arithmetic = arithmetic_code(arithmetic)
    if (out is None and pool_ids.dtype in _IDS and type(seq_lens) is Tensor and seq_lens.dtype == I32
            and _eager(pool_ids)):
        result = _calls.torch_calls().expand_pools_and_append_tail_new(pool_ids, seq_lens, pool_size, bound_pool_ids,
                                                                       arithmetic)
        if result is not NotImplemented:
            return result
    args = (_index_ids(pool_ids, "pool_ids"), _integer(seq_lens, "seq_lens", I32), pool_size, bound_pool_ids)
    if out is not None:
        return _into_out(pool_ids, _expand_and_append_out_kernel, ops.expand_pools_and_append_tail.out, args, out,
                         arithmetic)
    args += (arithmetic,)
    if _eager(pool_ids):
        return _expand_and_append_kernel(*args)
    return ops.expand_pools_and_append_tail(*args)
