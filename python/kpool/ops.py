"""The drop-in API: the public functions of the Triton reference module, same
names, arguments, defaults, output shapes and dtypes, on libkpool.so.

Each function allocates its outputs the way the reference does (``torch.empty``
on the input's device, or ``np.empty`` for numpy inputs), builds descriptors
of the caller's memory and calls the C entry point, which validates every
argument before anything is written. Caches are updated in place.

Each also takes the keyword ``arithmetic``: "default" (the reference's on
CUDA tensors, the contract's on the CPU), "exact" or "triton" (CUDA
tensors only), or None for this context's default (``kpool.set_arithmetic``),
resolved when the call is made (or traced: a compiled graph keeps it).

torch tensors go through ``_torch_ops`` (the ``torch.ops.kpool`` operators,
which torch.compile traces); numpy arrays through the ctypes calls here.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _lib
from ._calls import ctypes_calls as _c
from ._lib import (
    KPOOL_DTYPE_BFLOAT16,
    KPOOL_DTYPE_FLOAT8_E4M3FN,
    KPOOL_DTYPE_FLOAT32,
    KPOOL_DTYPE_INT32,
    KPOOL_DTYPE_INT64,
    KPOOL_HEAD_DIM,
    KpoolTypeError,
)
from ._tensors import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    as_int,
    cast,
    dtype_label,
    empty,
    is_array,
    is_float_dtype,
    is_integer_dtype,
    kpool_dtype,
    new_status,
    require_flag,
    require_ndim,
)
from ._tensors import arithmetic_code

try:
    from . import _torch_ops
except (ImportError, OSError):  # no torch (or one that does not import): numpy arrays only
    _torch_ops = None

if TYPE_CHECKING:  # for the annotations only: neither is imported at run time
    import numpy
    import torch

    # A torch tensor (CPU or CUDA) or a numpy array (CPU).
    Array = Union[torch.Tensor, numpy.ndarray]

# The indexer head dimension: the Hadamard transform is the 128-point one.
INDEX_HEAD_DIM = KPOOL_HEAD_DIM


def _i32(v, name):
    return as_int(v, name, INT32_MIN, INT32_MAX)


def _converted(x, name, code, *, integer=True):
    """x, or a converted copy where the reference converts this argument too
    (``.to(torch.int32)`` and the like); non-integer inputs are rejected."""
    if x is None:
        return None
    have = kpool_dtype(x, name)
    if have == code:
        return x
    if integer and not is_integer_dtype(x):
        raise KpoolTypeError(f"{name} has dtype {dtype_label(x)}, expected an integer dtype")
    return cast(x, code)


def _decode_indices(tail_slot_mapping, slot_mapping, positions):
    return _same_index_dtype(("tail_slot_mapping", tail_slot_mapping), ("slot_mapping", slot_mapping),
                             ("positions", positions))


def _same_index_dtype(*named):
    """Index tensors a kernel takes in one dtype, int32 or int64 (decode's,
    the ragged decode's, the prefill insert's with positions): other integer
    dtypes and mixes are converted (int64 where one of them is int64, else
    int32), keeping the values."""
    codes = [kpool_dtype(x, name) if is_array(x) else None for name, x in named]
    if codes[0] in (KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64) and codes.count(codes[0]) == len(codes):
        return tuple(x for _, x in named)
    code = KPOOL_DTYPE_INT64 if KPOOL_DTYPE_INT64 in codes else KPOOL_DTYPE_INT32
    return tuple(_index(x, name, code) for name, x in named)


def _output(out, like, shape):
    """The caller's ``out`` (checked by the C entry point: int32, ``shape``,
    any strides), or a new int32 array of that shape."""
    if out is None:
        return empty(like, shape, KPOOL_DTYPE_INT32)
    if not is_array(out):
        raise KpoolTypeError(f"out is a {type(out).__name__}, expected a torch.Tensor or a numpy.ndarray")
    return out


def _index(x, name, code):
    if not is_array(x):
        raise KpoolTypeError(f"{name} is a {type(x).__name__}, expected a torch.Tensor or a numpy.ndarray")
    return _converted(x, name, code)


# What takes the torch path: isinstance(x, _TORCH_TENSOR), () without torch.
_TORCH_TENSOR = _torch_ops.Tensor if _torch_ops is not None else ()
# A call's arithmetic code (None: the context's default), as torch.compile
# can trace it where torch is there.
_arithmetic = _torch_ops.arithmetic_code if _torch_ops is not None else arithmetic_code


# --- 1. FWHT + fp8 quant ----------------------------------------------------------
def fwht128_quant_fp8(q: Array, *, arithmetic: Optional[str] = None) -> Tuple[Array, Array]:
    """Hadamard-128 rotation of each bf16 row of ``q [rows, 128]``, then
    per-row ue8m0-scaled e4m3 quantization.

    Returns ``(q_fp8 [rows, 128] float8_e4m3fn, q_scale [rows, 1] float32)``
    (numpy: uint8 codes and float32 scales).
    """
    if isinstance(q, _TORCH_TENSOR):
        return _torch_ops.fwht128_quant_fp8(q, _arithmetic(arithmetic))
    rows = require_ndim(q, "q", (2,), "[rows, 128]")[0]
    q_fp8 = empty(q, (rows, INDEX_HEAD_DIM), KPOOL_DTYPE_FLOAT8_E4M3FN)
    q_scale = empty(q, (rows, 1), KPOOL_DTYPE_FLOAT32)
    _c.fwht128_quant_fp8(q, q_fp8, q_scale, _arithmetic(arithmetic))
    return q_fp8, q_scale


# --- 2. compress pools into the cache ------------------------------------------------
def kpool_compress_and_write_cache(
    kv_cache: Optional[Array],
    slot_k: Array,
    slot_score: Array,
    ape: Array,
    loc: Array,
    pool_size: int,
    head_dim: int = INDEX_HEAD_DIM,
    write_mask: Optional[Array] = None,
    round_scale: bool = True,
    return_compressed: bool = False,
    write_cache: bool = True,
    *,
    arithmetic: Optional[str] = None,
) -> Optional[Tuple[Array, Array]]:
    """Softmax-pool each pool's ``pool_size`` tokens, rotate, quantize, and
    write one row (128 e4m3 bytes + one f32 scale) of the paged ``kv_cache``
    at ``loc``, in place.

    kv_cache uint8 ``[num_blocks, block_size, 132]`` (planar pages; may be
    None when ``write_cache=False``); slot_k bf16 ``[n, P, 128]``; slot_score
    bf16 or f32 ``[n, P, 128]`` (other float dtypes are converted to f32,
    exactly as the reference's loads do); ape f32 ``[P, 128]``; loc int64
    ``[n]``; write_mask bool ``[n]`` or None (pools whose flag is false write
    nothing; not with ``return_compressed``).

    Returns ``(compressed_k [n, 128] float8_e4m3fn, compressed_scale [n]
    float32)`` when ``return_compressed``, else None.
    """
    if isinstance(slot_k, _TORCH_TENSOR):
        return _torch_ops.compress_and_write_cache(kv_cache, slot_k, slot_score, ape, loc, pool_size, head_dim,
                                                   write_mask, round_scale, return_compressed, write_cache,
                                                   _arithmetic(arithmetic))
    n = require_ndim(slot_k, "slot_k", (3,), "[n_pools, pool_size, 128]")[0]
    if slot_score is not None and is_float_dtype(slot_score) and kpool_dtype(slot_score, "slot_score") not in (
            KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32):
        slot_score = cast(slot_score, KPOOL_DTYPE_FLOAT32)
    pool_size = _i32(pool_size, "pool_size")
    head_dim = _i32(head_dim, "head_dim")
    compressed_k = compressed_scale = None
    if return_compressed:
        compressed_k = empty(slot_k, (n, INDEX_HEAD_DIM), KPOOL_DTYPE_FLOAT8_E4M3FN)
        compressed_scale = empty(slot_k, (n,), KPOOL_DTYPE_FLOAT32)
    _c.compress_and_write_cache(kv_cache if write_cache else None, slot_k, slot_score, ape, loc, write_mask,
                                compressed_k, compressed_scale, pool_size, head_dim, int(bool(round_scale)),
                                int(bool(write_cache)), _arithmetic(arithmetic))
    if return_compressed:
        return compressed_k, compressed_scale
    return None


# --- 2b. the prefill insert on the engine's tokens ------------------------------------
def kpool_compress_tokens_and_write_cache(
    kv_cache: Array,
    key: Array,
    gate_score: Array,
    ape: Array,
    slot_mapping: Array,
    pool_size: int,
    head_dim: int = INDEX_HEAD_DIM,
    round_scale: bool = True,
    tail_kv_cache: Optional[Array] = None,
    tail_slot_mapping: Optional[Array] = None,
    positions: Optional[Array] = None,
    *,
    arithmetic: Optional[str] = None,
) -> None:
    """The prefill insert as an engine holds its tokens, in one call: every
    pool a token completes, compressed from ``key`` / ``gate_score``
    ``[n, 128]`` read in place (rows of any stride), into ``kv_cache``.

    ``slot_mapping`` int32 or int64 ``[n]`` is pool-granular: token
    ``i >= pool_size - 1`` with ``slot_mapping[i] >= 0`` compresses tokens
    ``i - pool_size + 1 .. i`` into that slot, the others write nothing.
    With ``tail_kv_cache`` and ``tail_slot_mapping`` the same call seeds the
    tail ring exactly as ``kpool_seed_tail_cache(tail_kv_cache, key,
    gate_score, tail_slot_mapping, pool_size)``, in the same launch (on CUDA
    where the rows are 16-byte aligned and both slot mappings share a
    dtype; else a second launch). The bytes are the engine's
    sequence's: ``write_mask = (slot_mapping >= 0) & (i >= P-1)``, the
    gathered ``[n, P, 128]`` pools, ``kpool_compress_and_write_cache`` and
    ``kpool_seed_tail_cache``.

    With ``positions`` ``[n]`` (and the tail arguments) a chunk may start
    inside a pool: token ``i`` completes the pool of positions
    ``p-P+1 .. p`` (``p = positions[i]``, ``p % P == P-1``), each member
    from the row that holds its position in the same tail block, else from
    the tail ring (an earlier chunk's seed), as decode reads it. Returns None.
    """
    if isinstance(key, _TORCH_TENSOR):
        return _torch_ops.compress_tokens_and_write_cache(kv_cache, key, gate_score, ape, slot_mapping, pool_size,
                                                          head_dim, round_scale, tail_kv_cache, tail_slot_mapping,
                                                          positions, _arithmetic(arithmetic))
    if positions is not None:
        slot_mapping, tail_slot_mapping, positions = _same_index_dtype(
            ("slot_mapping", slot_mapping), ("tail_slot_mapping", tail_slot_mapping), ("positions", positions))
    elif tail_slot_mapping is not None and kpool_dtype(tail_slot_mapping, "tail_slot_mapping") not in (
            KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64):
        tail_slot_mapping = _converted(tail_slot_mapping, "tail_slot_mapping", KPOOL_DTYPE_INT32)
    _c.compress_tokens_and_write_cache(kv_cache, key, gate_score, ape, _index_ids(slot_mapping, "slot_mapping"),
                                       tail_kv_cache, tail_slot_mapping, positions, _i32(pool_size, "pool_size"),
                                       _i32(head_dim, "head_dim"), int(bool(round_scale)), _arithmetic(arithmetic))
    return None


# --- 3. seed the tail rings ----------------------------------------------------------
def kpool_seed_tail_cache(tail_kv_cache: Array, key: Array, gate_score: Array, tslot: Array, kpool: int,
                          head_dim: int = INDEX_HEAD_DIM, *, arithmetic: Optional[str] = None) -> None:
    """Copy each request's last ``kpool`` (= pool size) prefill tokens, raw K
    and gate score, into its tail ring, in place.

    tail_kv_cache bf16 ``[num_blocks, 2, RING, 128]`` (block and half strides
    free, e.g. a view of a padded allocation); key, gate_score bf16
    ``[n, 128]``; tslot int32 or int64 ``[n]`` (``block * RING + pos % RING``,
    negative = padding; other integer dtypes converted). Returns None.
    """
    if isinstance(key, _TORCH_TENSOR):
        return _torch_ops.seed_tail_cache(tail_kv_cache, key, gate_score, tslot, kpool, head_dim,
                                          _arithmetic(arithmetic))
    if kpool_dtype(tslot, "tslot") not in (KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64):
        tslot = _converted(tslot, "tslot", KPOOL_DTYPE_INT32)  # int8, int16, uint8 ...: the same values
    _c.seed_tail_cache(tail_kv_cache, key, gate_score, tslot, _i32(kpool, "kpool"), _i32(head_dim, "head_dim"),
                       _arithmetic(arithmetic))
    return None


# --- 4. one decode step ----------------------------------------------------------------
def kpool_decode_update_and_maybe_write_cache_batched(
    kv_cache: Array,
    tail_kv_cache: Array,
    tail_slot_mapping: Array,
    key: Array,
    slot_score: Array,
    ape: Array,
    slot_mapping: Array,
    positions: Array,
    pool_size: int,
    head_dim: int = INDEX_HEAD_DIM,
    round_scale: bool = True,
    *,
    return_skipped: bool = False,
    arithmetic: Optional[str] = None,
) -> Optional[int]:
    """One decode step of ``B`` requests x ``N`` tokens, each request's tokens
    in order: a token that completes a pool (``slot_mapping >= 0``,
    ``pos % P == P-1``) compresses it from its tail ring plus itself and
    writes it at ``slot_mapping``; then every token with ``pos >= 0`` and
    ``tail_slot >= 0`` is stashed into its ring. Updates both caches in place.

    int32 or int64 ``[B, N]`` tail_slot_mapping / slot_mapping / positions
    (other integer dtypes and mixes converted, keeping the values); bf16
    ``[B, N, 128]`` key / slot_score; f32 ``[P, 128]`` ape.

    Differs from the reference on one defect: a completion whose
    ``tail_slot`` is negative has no tail ring to read, and writes nothing
    (the reference compresses garbage from tail block 0, which may be
    another request's). With ``return_skipped=True`` the call returns how
    many such completions it skipped (as counted by the runtime); otherwise
    it returns None like the reference.
    """
    if isinstance(key, _TORCH_TENSOR):
        return _torch_ops.decode_update_and_maybe_write_cache_batched(
            kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions, pool_size,
            head_dim, round_scale, return_skipped, _arithmetic(arithmetic))
    tail_slot_mapping, slot_mapping, positions = _decode_indices(tail_slot_mapping, slot_mapping, positions)
    skipped = _c.decode_update_and_maybe_write_cache_batched(
        kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions,
        _i32(pool_size, "pool_size"), _i32(head_dim, "head_dim"), int(bool(round_scale)), _arithmetic(arithmetic))
    return skipped if return_skipped else None


def kpool_decode_update_and_maybe_write_cache_ragged(
    kv_cache: Array,
    tail_kv_cache: Array,
    tail_slot_mapping: Array,
    key: Array,
    slot_score: Array,
    ape: Array,
    slot_mapping: Array,
    positions: Array,
    query_start_loc: Array,
    pool_size: int,
    head_dim: int = INDEX_HEAD_DIM,
    round_scale: bool = True,
    *,
    max_query_len: Optional[int] = None,
    return_skipped: bool = False,
    arithmetic: Optional[str] = None,
) -> Optional[int]:
    """One decode step on the tokens as a ragged batch holds them (plain
    decode mixed with speculative verify), in one launch with no host
    synchronization: ``T`` tokens flat, request ``r``'s at
    ``query_start_loc[r] .. query_start_loc[r+1]`` in position order.

    bf16 ``[T, 128]`` key / slot_score; ``[T]`` tail_slot_mapping /
    slot_mapping / positions and ``[B + 1]`` query_start_loc, int32 or int64
    (other integer dtypes and mixes converted, keeping the values). The
    same bytes as the batched op on the engine's padded ``[B, max]`` grid.
    ``max_query_len`` (the engine's, a host int) bounds every request's
    tokens: device calls run a grid of that many tokens per request, so
    pass it (``None``: ``T``, always safe, slower). Host calls reject
    offsets out of order or past ``T`` and requests longer than the bound.
    """
    if isinstance(key, _TORCH_TENSOR):
        return _torch_ops.decode_update_and_maybe_write_cache_ragged(
            kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions,
            query_start_loc, pool_size, head_dim, round_scale, max_query_len, return_skipped, _arithmetic(arithmetic))
    tail_slot_mapping, slot_mapping, positions, query_start_loc = _same_index_dtype(
        ("tail_slot_mapping", tail_slot_mapping), ("slot_mapping", slot_mapping), ("positions", positions),
        ("query_start_loc", query_start_loc))
    skipped = _c.decode_update_and_maybe_write_cache_ragged(
        kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions, query_start_loc,
        _max_query_len(max_query_len), _i32(pool_size, "pool_size"), _i32(head_dim, "head_dim"),
        int(bool(round_scale)), _arithmetic(arithmetic))
    return skipped if return_skipped else None


def _max_query_len(v):
    return 0 if v is None else as_int(v, "max_query_len", 1, INT32_MAX)




# --- 5. pool-level top-k helpers --------------------------------------------------------
def history_group_budget_for_topk(topk: int, pool_size: int) -> int:
    """How many pools to select so that expanding them yields ``topk`` tokens
    (``topk // pool_size``; ``topk`` must be a multiple of ``pool_size``,
    any ``pool_size >= 1``)."""
    groups = ctypes.c_int64()
    status = new_status()
    code = _lib.load().kpool_history_group_budget_for_topk(
        as_int(topk, "topk", INT64_MIN, INT64_MAX), _i32(pool_size, "pool_size"), ctypes.byref(groups), status)
    _lib.check(code, status)
    return groups.value


def _token_map(page_table, topk_offsets):
    # The reference gathers from page_table whatever its integer dtype and
    # converts the result to int32; offsets are added as int64.
    return (_converted(page_table, "page_table", KPOOL_DTYPE_INT32),
            _converted(topk_offsets, "topk_offsets", KPOOL_DTYPE_INT64))


def _index_ids(ids, name):
    # int32 / int64 as they are; other integer dtypes hold the same values as int64.
    if kpool_dtype(ids, name) in (KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64):
        return ids
    return _converted(ids, name, KPOOL_DTYPE_INT64)


def expand_pools_to_tokens(group_ids: Array, group_valid: Array, topk: int, pool_size: int,
                           page_table: Optional[Array] = None, topk_offsets: Optional[Array] = None, *,
                           out: Optional[Array] = None, arithmetic: Optional[str] = None) -> Array:
    """Expand selected pool ids ``[rows, topk / P]`` to token ids
    ``[rows, topk]`` int32 (pool ``g`` -> tokens ``g*P .. g*P+P-1``), -1 where
    ``group_valid`` is false; optionally through ``page_table [R >= rows, W]``
    (gather, index clamped to ``[0, W-1]``) or plus per-row ``topk_offsets``
    (``[rows]`` or ``[rows, 1]``), not both. With ``out`` (int32
    ``[rows, topk]``, any strides, e.g. rows of a wider buffer) the ids are
    written there and ``out`` is returned."""
    if isinstance(group_ids, _TORCH_TENSOR):  # the whole torch call, checks included: one step
        return _torch_ops.expand_pools_to_tokens(group_ids, group_valid, topk, pool_size, page_table, topk_offsets,
                                                 arithmetic, out)
    rows = require_ndim(group_ids, "group_ids", (2,), "[rows, topk / pool_size]")[0]
    topk = _i32(topk, "topk")
    pool_size = _i32(pool_size, "pool_size")
    group_ids = _index_ids(group_ids, "group_ids")
    page_table, topk_offsets = _token_map(page_table, topk_offsets)
    out = _output(out, group_ids, (rows, max(topk, 0)))
    _c.expand_pools_to_tokens(group_ids, group_valid, page_table, topk_offsets, out, topk, pool_size,
                              _arithmetic(arithmetic))
    return out


def append_tail_to_topk(topk_result: Array, seq_lens: Array, pool_lens: Array, pool_size: int,
                        page_table: Optional[Array] = None, topk_offsets: Optional[Array] = None, *,
                        out: Optional[Array] = None, arithmetic: Optional[str] = None) -> Array:
    """Append each row's incomplete trailing pool (tokens
    ``[pool_len * P, seq_len)``, then -1) after its ``topk_result [rows, C]``
    int32 history: returns ``[rows, C + P - 1]`` int32. Tail token ids go
    through ``page_table`` or get ``topk_offsets`` added (``[rows]`` or
    ``[rows, 1]``; the reference mis-broadcasts the latter), not both.

    With ``pool_size == 1`` there is no tail and ``topk_result`` itself is
    returned, as in the reference (with ``out``, copied into ``out``). With
    ``out`` (int32 ``[rows, C + P - 1]``, any strides) the result is written
    there and ``out`` is returned.
    """
    if isinstance(topk_result, _TORCH_TENSOR):  # the whole torch call, checks included: one step
        return _torch_ops.append_tail_to_topk(topk_result, seq_lens, pool_lens, pool_size, page_table, topk_offsets,
                                              arithmetic, out)
    if kpool_dtype(topk_result, "topk_result") != KPOOL_DTYPE_INT32:
        raise KpoolTypeError(f"topk_result has dtype {dtype_label(topk_result)}, expected int32")
    require_ndim(seq_lens, "seq_lens", (1,), "[rows]")
    require_ndim(pool_lens, "pool_lens", (1,), "[rows]")
    pool_size = _i32(pool_size, "pool_size")
    if pool_size == 1 and out is None:
        return topk_result
    rows, cols = require_ndim(topk_result, "topk_result", (2,), "[rows, cols]")
    seq_lens = _converted(seq_lens, "seq_lens", KPOOL_DTYPE_INT32)
    pool_lens = _converted(pool_lens, "pool_lens", KPOOL_DTYPE_INT32)
    page_table, topk_offsets = _token_map(page_table, topk_offsets)
    out = _output(out, topk_result, (rows, max(cols + pool_size - 1, 0)))
    _c.append_tail_to_topk(topk_result, seq_lens, pool_lens, page_table, topk_offsets, out, pool_size,
                           _arithmetic(arithmetic))
    return out


def expand_pools_and_append_tail(pool_ids: Array, seq_lens: Array, pool_size: int,
                                 bound_pool_ids: bool = False, *, out: Optional[Array] = None,
                                 arithmetic: Optional[str] = None) -> Array:
    """``expand_pools_to_tokens`` + ``append_tail_to_topk`` on the identity
    path in one kernel: ``pool_ids [rows, G]`` (negative = none) and
    ``seq_lens [rows]`` -> int32 ``[rows, G*P + P-1]``, the trailing pool
    derived from ``seq_len // P``.

    ``bound_pool_ids=True`` also treats ids ``>= seq_len // P`` as -1 (off by
    default, for parity with the reference, which trusts them).

    With ``out`` (int32 ``[rows, G*P + P-1]``, any strides: e.g.
    ``topk_buffer[:rows]`` of a wider preallocated buffer) the ids are
    written there, with no other allocation or copy, and ``out`` is returned.
    """
    if isinstance(pool_ids, _TORCH_TENSOR):  # the whole torch call, checks included: one step
        return _torch_ops.expand_pools_and_append_tail(pool_ids, seq_lens, pool_size, bound_pool_ids, arithmetic, out)
    require_flag(bound_pool_ids, "bound_pool_ids")
    rows, groups = require_ndim(pool_ids, "pool_ids", (2,), "[rows, n_groups]")
    pool_size = _i32(pool_size, "pool_size")
    pool_ids = _index_ids(pool_ids, "pool_ids")
    seq_lens = _converted(seq_lens, "seq_lens", KPOOL_DTYPE_INT32)
    out = _output(out, pool_ids, (rows, max(groups * pool_size + pool_size - 1, 0)))
    _c.expand_pools_and_append_tail(pool_ids, seq_lens, out, pool_size, int(bool(bound_pool_ids)),
                                    _arithmetic(arithmetic))
    return out


__all__ = [
    "INDEX_HEAD_DIM",
    "fwht128_quant_fp8",
    "kpool_compress_and_write_cache",
    "kpool_compress_tokens_and_write_cache",
    "kpool_seed_tail_cache",
    "kpool_decode_update_and_maybe_write_cache_batched",
    "kpool_decode_update_and_maybe_write_cache_ragged",
    "history_group_budget_for_topk",
    "expand_pools_to_tokens",
    "append_tail_to_topk",
    "expand_pools_and_append_tail",
]
