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


def _ctypes_call(entry):
    """The entry point of the op table as a function: its arguments in the
    C API's order (tensors or None, then ints), then optionally the call's
    arithmetic; each tensor described by its argument's rules."""
    symbol, arguments = entry["symbol"], entry["arguments"]
    count = len(arguments)

    def call(*args):
        if len(args) not in (count, count + 1):
            raise TypeError(f"{entry['name']}() takes {count} arguments and the arithmetic, {len(args)} given")
        c = Call(args[count] if len(args) > count else DEFAULT)
        return _run(symbol, c, *(c.tensor(x, a["name"], inner=a["inner"], output=a["output"])
                                 if a["type"] == "tensor" else x for x, a in zip(args, arguments)))

    call.__name__ = entry["name"]
    return call


def entry_points():
    """The entry points the extension carries, (function, kpool.h symbol) in
    the order of the addresses bind() takes (the op table's torch_extension)."""
    carried = sorted((e["torch_extension"], e["name"], e["symbol"]) for e in _lib.op_table()["entries"]
                     if e["torch_extension"] is not None)
    return tuple((name, symbol) for _, name, symbol in carried)


# The calls with outputs, which the extension also has as NAME_new: the
# call's arguments without its outputs, which it allocates and returns (or
# NotImplemented where the caller allocates them). The ctypes functions leave
# that to the caller.
ALLOCATING = ("fwht128_quant_fp8", "compress_and_write_cache", "expand_pools_and_append_tail",
              "expand_pools_to_tokens", "append_tail_to_topk")


def _caller_allocates(*args):
    return NotImplemented


class _CtypesCalls:
    """Every entry point of the op table with tensor arguments, made on first
    use (so that importing kpool loads no library), and the NAME_new forms."""

    def __getattr__(self, name):
        if name.endswith("_new") and name[:-4] in ALLOCATING:
            return _caller_allocates
        entry = next((e for e in _lib.op_table()["entries"]
                      if e["name"] == name and any(a["type"] == "tensor" for a in e["arguments"])), None)
        if entry is None:
            raise AttributeError(f"kpool has no entry point kpool_{name} taking tensors")
        function = _ctypes_call(entry)
        setattr(self, name, function)
        return function


ctypes_calls = _CtypesCalls()

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
    addresses = tuple(ctypes.cast(getattr(lib, entry), ctypes.c_void_p).value for _, entry in entry_points())
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
