"""The library's entry points as Python functions: arrays (or None) then int
parameters, in the order of the C API, then optionally the call's
kpool_arithmetic code (KPOOL_ARITHMETIC_DEFAULT when left out: every
function of both implementations takes it last, so every op has it); they
raise on a failed status, and decode returns its skipped completions.

Two implementations with the same functions:

- ``ctypes_calls``: descriptors built in Python (``_tensors.Call``), for
  torch tensors and numpy arrays alike; always there.
- ``torch_calls()``: the ``_torch_calls`` extension (python/src/torch_calls.c,
  built by CMake next to libkpool.so as ``_torch_calls.abi3.so``), for torch
  tensors only: it reads the tensors and calls the entry points in C, a few
  µs less per call. Looked for next to the loaded libkpool.so; when it is
  absent (or ``$KPOOL_TORCH_CALLS=ctypes``) the ctypes functions stand in.
  It reads plain tensors through torch's C shim (the ``aoti_torch_get_*``
  functions of libtorch) once bind_tensor_shim has checked the reads on
  probe tensors, else (or with ``$KPOOL_TENSOR_SHIM=0``) through their
  Python interface.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import threading
import types

from . import _lib
from ._tensors import Call

# The extension's functions, each with its kpool.h entry point: the order of
# the addresses bind() takes.
ENTRY_POINTS = (
    ("fwht128_quant_fp8", "kpool_fwht128_quant_fp8"),
    ("compress_and_write_cache", "kpool_compress_and_write_cache"),
    ("seed_tail_cache", "kpool_seed_tail_cache"),
    ("decode_update_and_maybe_write_cache_batched", "kpool_decode_update_and_maybe_write_cache_batched"),
    ("expand_pools_and_append_tail", "kpool_expand_pools_and_append_tail"),
    ("expand_pools_to_tokens", "kpool_expand_pools_to_tokens"),
    ("append_tail_to_topk", "kpool_append_tail_to_topk"),
)
EXTENSION_NAME = "_torch_calls.abi3.so"
EXTENSION_ENV = "KPOOL_TORCH_CALLS"  # "ctypes": don't load the extension
SHIM_ENV = "KPOOL_TENSOR_SHIM"  # "0": read tensors through their Python interface
# The arithmetic of a call that passes none: the reference's on CUDA, the contract's on the CPU.
DEFAULT = _lib.KPOOL_ARITHMETIC_DEFAULT
# What the extension reads a tensor with (torch/csrc/inductor/aoti_torch/c/shim.h),
# in bind_tensor_shim's order.
SHIM_GETTERS = ("dtype", "layout", "device_type", "device_index", "dim", "sizes", "strides", "data_ptr")


def _run(entry, c, *args):
    for v in args:  # ctypes would truncate an int32 parameter silently
        if isinstance(v, int) and not _lib.INT32_MIN <= v <= _lib.INT32_MAX:
            raise _lib.KpoolValueError(f"{entry}: parameter {v} is out of range [{_lib.INT32_MIN}, {_lib.INT32_MAX}]")
    status = _lib.KpoolStatus()
    code = getattr(_lib.load(), entry)(*args, c.exec(), ctypes.byref(status))
    _lib.check(code, status)
    return int(status.skipped_completions)


def _fwht128_quant_fp8(q, q_fp8, q_scale, arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_fwht128_quant_fp8", c, c.tensor(q, "q", inner=True), c.tensor(q_fp8, "q_fp8", output=True),
                c.tensor(q_scale, "q_scale", output=True))


def _compress_and_write_cache(kv_cache, slot_k, slot_score, ape, loc, write_mask, compressed_k, compressed_scale,
                              pool_size, head_dim, round_scale, write_cache, arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_compress_and_write_cache", c, c.tensor(kv_cache, "kv_cache", output=True),
                c.tensor(slot_k, "slot_k", inner=True), c.tensor(slot_score, "slot_score", inner=True),
                c.tensor(ape, "ape", inner=True), c.tensor(loc, "loc"), c.tensor(write_mask, "write_mask"),
                c.tensor(compressed_k, "compressed_k", output=True),
                c.tensor(compressed_scale, "compressed_scale", output=True),
                pool_size, head_dim, round_scale, write_cache)


def _compress_tokens_and_write_cache(kv_cache, key, gate_score, ape, slot_mapping, tail_kv_cache, tail_slot_mapping,
                                     positions, pool_size, head_dim, round_scale, arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_compress_tokens_and_write_cache", c, c.tensor(kv_cache, "kv_cache", output=True),
                c.tensor(key, "key", inner=True), c.tensor(gate_score, "gate_score", inner=True),
                c.tensor(ape, "ape", inner=True), c.tensor(slot_mapping, "slot_mapping"),
                c.tensor(tail_kv_cache, "tail_kv_cache", output=True), c.tensor(tail_slot_mapping, "tail_slot_mapping"),
                c.tensor(positions, "positions"), pool_size, head_dim, round_scale)


def _seed_tail_cache(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_seed_tail_cache", c, c.tensor(tail_kv_cache, "tail_kv_cache", output=True),
                c.tensor(key, "key", inner=True), c.tensor(gate_score, "gate_score", inner=True),
                c.tensor(tslot, "tslot"), pool_size, head_dim)


def _decode_update_and_maybe_write_cache_batched(kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape,
                                                 slot_mapping, positions, pool_size, head_dim, round_scale,
                                                 arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_decode_update_and_maybe_write_cache_batched", c, c.tensor(kv_cache, "kv_cache", output=True),
                c.tensor(tail_kv_cache, "tail_kv_cache", output=True),
                c.tensor(tail_slot_mapping, "tail_slot_mapping"), c.tensor(key, "key", inner=True),
                c.tensor(slot_score, "slot_score", inner=True), c.tensor(ape, "ape", inner=True),
                c.tensor(slot_mapping, "slot_mapping"), c.tensor(positions, "positions"),
                pool_size, head_dim, round_scale)


def _decode_update_and_maybe_write_cache_ragged(kv_cache, tail_kv_cache, tail_slot_mapping, key, slot_score, ape,
                                                slot_mapping, positions, query_start_loc, max_query_len, pool_size,
                                                head_dim, round_scale, arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_decode_update_and_maybe_write_cache_ragged", c, c.tensor(kv_cache, "kv_cache", output=True),
                c.tensor(tail_kv_cache, "tail_kv_cache", output=True),
                c.tensor(tail_slot_mapping, "tail_slot_mapping"), c.tensor(key, "key", inner=True),
                c.tensor(slot_score, "slot_score", inner=True), c.tensor(ape, "ape", inner=True),
                c.tensor(slot_mapping, "slot_mapping"), c.tensor(positions, "positions"),
                c.tensor(query_start_loc, "query_start_loc"), max_query_len, pool_size, head_dim, round_scale)


def _expand_pools_and_append_tail(pool_ids, seq_lens, out, pool_size, bound_pool_ids, arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_expand_pools_and_append_tail", c, c.tensor(pool_ids, "pool_ids", inner=True),
                c.tensor(seq_lens, "seq_lens"), c.tensor(out, "out", output=True), pool_size, bound_pool_ids)


def _expand_pools_to_tokens(group_ids, group_valid, page_table, topk_offsets, out, topk, pool_size,
                            arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_expand_pools_to_tokens", c, c.tensor(group_ids, "group_ids", inner=True),
                c.tensor(group_valid, "group_valid", inner=True), c.tensor(page_table, "page_table"),
                c.tensor(topk_offsets, "topk_offsets"), c.tensor(out, "out", output=True), topk, pool_size)


def _append_tail_to_topk(topk_result, seq_lens, pool_lens, page_table, topk_offsets, out, pool_size,
                         arithmetic=DEFAULT):
    c = Call(arithmetic)
    return _run("kpool_append_tail_to_topk", c, c.tensor(topk_result, "topk_result", inner=True),
                c.tensor(seq_lens, "seq_lens"), c.tensor(pool_lens, "pool_lens"), c.tensor(page_table, "page_table"),
                c.tensor(topk_offsets, "topk_offsets"), c.tensor(out, "out", output=True), pool_size)


# The calls with outputs, which the extension also has as NAME_new: the
# call's arguments without its outputs, which it allocates and returns (or
# NotImplemented where the caller allocates them). The ctypes functions leave
# that to the caller.
# The entry points the extension does not carry: torch tensors take them
# through ctypes too (ctypes_calls).
CTYPES_ONLY = ("compress_tokens_and_write_cache", "decode_update_and_maybe_write_cache_ragged")
ALLOCATING = ("fwht128_quant_fp8", "compress_and_write_cache", "expand_pools_and_append_tail",
              "expand_pools_to_tokens", "append_tail_to_topk")


def _caller_allocates(*args):
    return NotImplemented


ctypes_calls = types.SimpleNamespace(**{name: globals()["_" + name] for name, _ in ENTRY_POINTS},
                                     **{name: globals()["_" + name] for name in CTYPES_ONLY},
                                     **{name + "_new": _caller_allocates for name in ALLOCATING})

_lock = threading.Lock()
_torch_calls = None


def torch_calls():
    """The functions torch tensors are run with: the extension, bound to the
    loaded library, else ``ctypes_calls``. Decided once, on first use."""
    global _torch_calls
    if _torch_calls is None:
        with _lock:
            if _torch_calls is None:
                _torch_calls = _load_extension() or ctypes_calls
    return _torch_calls


def extension_path():
    """Where the extension is looked for: next to the loaded libkpool.so."""
    return os.path.join(os.path.dirname(os.path.abspath(_lib.library_path())), EXTENSION_NAME)


def _load_extension():
    if os.environ.get(EXTENSION_ENV) == "ctypes":
        return None
    path = extension_path()
    if not os.path.isfile(path):
        return None
    loader = importlib.machinery.ExtensionFileLoader("kpool._torch_calls", path)
    spec = importlib.util.spec_from_file_location("kpool._torch_calls", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    import torch

    from ._tensors import _current_stream, torch_dtype_of_code

    lib = _lib.load()
    addresses = tuple(ctypes.cast(getattr(lib, entry), ctypes.c_void_p).value for _, entry in ENTRY_POINTS)
    dtypes = tuple(torch_dtype_of_code(torch, code) for code in range(_lib.KPOOL_DTYPES))
    module.bind(addresses, dtypes, _current_stream, _lib.error_for, _lib.KpoolTypeError, _lib.KpoolValueError,
                _lib.KpoolRuntimeError)
    if os.environ.get(SHIM_ENV) != "0" and bind_tensor_shim(module, torch):
        bind_output_allocator(module, torch)
    _configure(module)
    return module


def _torch_shim(torch):
    """libtorch's C shim as a ctypes library, or None (an install without it)."""
    for path in (None, os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")):
        try:
            lib = ctypes.CDLL(path)
            lib.aoti_torch_get_sizes  # noqa: B018 (raises AttributeError when absent)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def bind_tensor_shim(module, torch) -> bool:
    """Lets the extension read tensors through torch's C shim, after it has
    checked the reads against the Python interface on probe tensors (a
    transposed bf16 slice, an offset int64 row, an empty one). Returns
    whether it does."""
    lib = _torch_shim(torch)
    if lib is None:
        return module.bind_tensor_shim(None)
    from ._tensors import torch_dtype_of_code

    def code(name):
        fn = getattr(lib, "aoti_torch_" + name, None)
        if fn is None:
            return -1
        fn.restype = ctypes.c_int32
        return fn()

    names = {torch.uint8: "uint8", torch.bool: "bool", torch.int32: "int32", torch.int64: "int64",
             torch.bfloat16: "bfloat16", torch.float32: "float32", getattr(torch, "float8_e4m3fn", None): "float8_e4m3fn"}
    dtypes = tuple(code("dtype_" + names[d]) if d is not None else -1
                   for d in (torch_dtype_of_code(torch, c) for c in range(_lib.KPOOL_DTYPES)))
    try:
        getters = tuple(ctypes.cast(getattr(lib, "aoti_torch_get_" + g), ctypes.c_void_p).value for g in SHIM_GETTERS)
    except AttributeError:
        return module.bind_tensor_shim(None)
    probes = [torch.zeros((3, 8), dtype=torch.bfloat16)[1:, 2:].t(), torch.arange(12).view(3, 4)[2],
              torch.empty((0, 4), dtype=torch.int32)]
    return module.bind_tensor_shim(getters, dtypes, (code("layout_strided"), code("device_type_cpu"),
                                                     code("device_type_cuda")), torch.Tensor, probes,
                                   _current_stream_getter(torch))


def bind_output_allocator(module, torch) -> bool:
    """Lets the extension's ``*_new`` functions allocate outputs through
    torch's C shim (aoti_torch_empty_strided, wrapped as tensors by
    torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs) once a probe
    allocated that way reads back right. Returns whether they do; when they
    do not, they return NotImplemented and the caller allocates."""
    lib = _torch_shim(torch)
    steal = getattr(getattr(torch._C, "_aoti", None), "alloc_tensors_by_stealing_from_void_ptrs", None)
    shim = [getattr(lib, "aoti_torch_" + name, None) for name in ("empty_strided", "delete_tensor_object")]
    if steal is None or None in shim:
        return module.bind_output_allocator(None)
    return module.bind_output_allocator(*(ctypes.cast(f, ctypes.c_void_p).value for f in shim), steal)


def _current_stream_getter(torch) -> int:
    """The address of libtorch_cuda's aoti_torch_get_current_cuda_stream, 0
    in a torch without CUDA (the extension checks it against torch's getter
    on each device before using it). Only looked up: CUDA is not
    initialized here."""
    for path in (None, os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")):
        try:
            return ctypes.cast(ctypes.CDLL(path).aoti_torch_get_current_cuda_stream, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return 0


def _configure(module):
    from ._tensors import index_errors_by_device

    module.set_index_errors(*index_errors_by_device())


def index_errors_changed():
    """kpool.set_index_errors changed a device's words: tell the extension
    (under the lock its loading holds, so that words set while it loads are
    not missed)."""
    with _lock:
        if _torch_calls is not None and _torch_calls is not ctypes_calls:
            _configure(_torch_calls)
