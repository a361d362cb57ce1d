"""torch tensors and numpy arrays as kpool_tensor descriptors, without copies.

A descriptor points at the caller's memory: ``data_ptr()`` and ``stride()``
for torch, ``__array_interface__`` and byte strides / itemsize for numpy.
Neither library is imported here: an argument is recognised by looking the
library up in ``sys.modules`` (an object of it exists, so it is imported).

numpy has no bfloat16 or float8: pass bf16 data as ``uint16`` arrays
(``x.view(np.uint16)``), and e4m3 comes back as ``uint8``. ml_dtypes'
``bfloat16`` / ``float8_e4m3fn`` arrays are taken as well.
"""

from __future__ import annotations

import ctypes
import operator
import os
import sys

from . import _lib
from ._lib import (
    KPOOL_DEVICE_CPU,
    KPOOL_DEVICE_CUDA,
    KPOOL_DTYPE_BFLOAT16,
    KPOOL_DTYPE_BOOL,
    KPOOL_DTYPE_FLOAT8_E4M3FN,
    KPOOL_DTYPE_FLOAT32,
    KPOOL_DTYPE_INT32,
    KPOOL_DTYPE_INT64,
    KPOOL_DTYPE_UINT8,
    KPOOL_MAX_DIMS,
    KpoolExec,
    KpoolRuntimeError,
    KpoolStatus,
    KpoolTensor,
    KpoolTypeError,
    KpoolValueError,
)

# numpy dtype name -> kpool dtype. uint16 is how numpy callers spell bf16.
_NUMPY_DTYPES = {
    "uint8": KPOOL_DTYPE_UINT8,
    "bool": KPOOL_DTYPE_BOOL,
    "int32": KPOOL_DTYPE_INT32,
    "int64": KPOOL_DTYPE_INT64,
    "uint16": KPOOL_DTYPE_BFLOAT16,
    "bfloat16": KPOOL_DTYPE_BFLOAT16,
    "float32": KPOOL_DTYPE_FLOAT32,
    "float8_e4m3fn": KPOOL_DTYPE_FLOAT8_E4M3FN,
}
# kpool dtype -> numpy dtype name of arrays we allocate.
_NUMPY_ALLOC = {
    KPOOL_DTYPE_UINT8: "uint8",
    KPOOL_DTYPE_BOOL: "bool",
    KPOOL_DTYPE_INT32: "int32",
    KPOOL_DTYPE_INT64: "int64",
    KPOOL_DTYPE_BFLOAT16: "uint16",
    KPOOL_DTYPE_FLOAT32: "float32",
    KPOOL_DTYPE_FLOAT8_E4M3FN: "uint8",
}

_torch_dtypes = None  # torch.dtype -> kpool dtype, built on first torch argument
_torch_alloc = None  # kpool dtype -> torch.dtype
_raw_stream = None  # torch's current-stream getter, resolved once


def _torch_tables(torch):
    global _torch_dtypes, _torch_alloc
    if _torch_dtypes is None:
        table = {
            torch.uint8: KPOOL_DTYPE_UINT8,
            torch.bool: KPOOL_DTYPE_BOOL,
            torch.int32: KPOOL_DTYPE_INT32,
            torch.int64: KPOOL_DTYPE_INT64,
            torch.bfloat16: KPOOL_DTYPE_BFLOAT16,
            torch.float32: KPOOL_DTYPE_FLOAT32,
        }
        e4m3 = getattr(torch, "float8_e4m3fn", None)
        if e4m3 is not None:
            table[e4m3] = KPOOL_DTYPE_FLOAT8_E4M3FN
        _torch_alloc = {v: k for k, v in table.items()}
        _torch_dtypes = table
    return _torch_dtypes


def torch_dtype_of_code(torch, code: int):
    """The torch dtype of a kpool dtype code (None when this torch lacks it)."""
    _torch_tables(torch)
    return _torch_alloc.get(code)


def _torch_of(x):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def _numpy_of(x):
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return np
    return None


def is_array(x) -> bool:
    return _torch_of(x) is not None or _numpy_of(x) is not None


def _not_an_array(x, name):
    return KpoolTypeError(f"{name} is a {type(x).__name__}, expected a torch.Tensor or a numpy.ndarray")


def kpool_dtype(x, name: str):
    """The kpool dtype of an array, or None when kpool has no such dtype."""
    torch = _torch_of(x)
    if torch is not None:
        return _torch_tables(torch).get(x.dtype)
    np = _numpy_of(x)
    if np is not None:
        if x.dtype.byteorder == ">":
            return None
        return _NUMPY_DTYPES.get(x.dtype.name)
    raise _not_an_array(x, name)


def dtype_label(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def ndim(x, name: str) -> int:
    if not is_array(x):
        raise _not_an_array(x, name)
    return x.ndim


def shape(x, name: str) -> tuple:
    if not is_array(x):
        raise _not_an_array(x, name)
    return tuple(x.shape)


def require_ndim(x, name: str, ranks, what: str) -> tuple:
    """x's shape, after checking that it has one of ``ranks`` dims (needed
    before outputs can be allocated; the runtime checks everything else)."""
    s = shape(x, name)
    if len(s) not in ranks:
        raise KpoolValueError(f"{name} has shape {list(s)} ({len(s)} dims), expected {what}")
    return s


def as_int(v, name: str, lo: int, hi: int) -> int:
    """A Python int parameter, range-checked before ctypes could truncate it."""
    try:
        i = operator.index(v)
    except TypeError:
        raise KpoolTypeError(f"{name} = {v!r} is a {type(v).__name__}, expected an int") from None
    if not lo <= i <= hi:
        raise KpoolValueError(f"{name} = {i} is out of range [{lo}, {hi}]")
    return i


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def is_integer_dtype(x) -> bool:
    torch = _torch_of(x)
    if torch is not None:
        return not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool
    np = _numpy_of(x)
    return np is not None and x.dtype.kind in "iu"


def is_float_dtype(x) -> bool:
    torch = _torch_of(x)
    if torch is not None:
        return x.dtype.is_floating_point
    np = _numpy_of(x)
    return np is not None and x.dtype.kind == "f"


def cast(x, code: int):
    """A copy of x converted to kpool dtype ``code`` (integer conversions wrap
    like torch's ``.to``; used only where the reference converts too)."""
    torch = _torch_of(x)
    if torch is not None:
        _torch_tables(torch)
        return x.to(_torch_alloc[code])
    return x.astype(_NUMPY_ALLOC[code])


def empty(like, shape, code: int):
    """An uninitialised output of kpool dtype ``code``: torch.empty on like's
    device, or np.empty (uint8 for e4m3, uint16 for bf16)."""
    torch = _torch_of(like)
    if torch is not None:
        _torch_tables(torch)
        return torch.empty(shape, dtype=_torch_alloc[code], device=like.device)
    np = _numpy_of(like)
    if np is None:
        raise _not_an_array(like, "input")
    return np.empty(shape, dtype=_NUMPY_ALLOC[code])


def _options_changed():
    # The extension keeps its own copy of the execution options.
    calls = sys.modules.get(__package__ + "._calls")
    if calls is not None:
        calls.options_changed()


# The softmax pool's arithmetic for every call (include/kpool/kpool.h,
# kpool_arithmetic): "default" (the reference's on CUDA tensors, the
# contract's on the CPU), "exact" (the contract) or "triton" (the reference's
# own GPU instructions, CUDA tensors only). Process-wide, as a drop-in's calls
# keep the reference's signatures; $KPOOL_ARITHMETIC sets the start value.
_arithmetic = ["default"]


def set_arithmetic(name: str) -> str:
    """Sets the arithmetic of later calls ("default", "exact" or "triton"); returns the
    previous one. Calls already captured in a CUDA graph keep theirs."""
    if name not in _lib.ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {sorted(_lib.ARITHMETICS)}, not {name!r}")
    previous, _arithmetic[0] = _arithmetic[0], name
    _options_changed()
    return previous


def get_arithmetic() -> str:
    return _arithmetic[0]


set_arithmetic(os.environ.get("KPOOL_ARITHMETIC", "default"))


# The words CUDA calls mark out-of-range indices in (kpool.h,
# kpool_exec.index_errors): a torch int32 tensor, or None. Process-wide, like
# the arithmetic.
_index_errors = [None]


def set_index_errors(words):
    """Later calls on CUDA tensors of ``words``' device mark each index
    argument that had an out-of-range entry (its writes are skipped) in
    ``words``: a zeroed torch int32 CUDA tensor of 4 elements (loc, tslot,
    slot_mapping, tail_slot_mapping), on the current stream, without a
    synchronization (graph capturable). None stops it. Returns the previous
    tensor. ``check_index_errors()`` reads and zeroes them."""
    if words is not None:
        torch = _torch_of(words)
        if (torch is None or not words.is_cuda or words.dtype != torch.int32 or words.numel() != len(_lib.INDEX_ARGS)
                or not words.is_contiguous()):
            raise KpoolTypeError(f"index_errors must be a contiguous torch int32 CUDA tensor of "
                                 f"{len(_lib.INDEX_ARGS)} elements ({', '.join(_lib.INDEX_ARGS)})")
    previous, _index_errors[0] = _index_errors[0], words
    _options_changed()
    return previous


def execution_options():
    """(arithmetic code, device of the index-error words or -1, their address or 0)."""
    words = _index_errors[0]
    if words is None:
        return _lib.ARITHMETICS[_arithmetic[0]], -1, 0
    return _lib.ARITHMETICS[_arithmetic[0]], words.device.index, words.data_ptr()


def check_index_errors() -> None:
    """Raises KpoolIndexRangeError naming every argument that had an
    out-of-range index in a CUDA call since the last check, and zeroes the
    words (this synchronizes the current stream). Needs set_index_errors()."""
    words = _index_errors[0]
    if words is None:
        raise KpoolValueError("check_index_errors: no index_errors words were set (kpool.set_index_errors)")
    e = KpoolExec()
    e.stream = _current_stream(words.device.index)
    e.index_errors = words.data_ptr()
    status = new_status()
    _lib.check(_lib.load().kpool_check_index_errors(words.device.index, ctypes.byref(e), ctypes.byref(status)),
               status)


def cuda_warm_up(device=0) -> None:
    """Loads and runs every CUDA kernel of the library once on ``device`` (an
    index, or a torch.device / "cuda:N"), on torch's current stream, which it
    then synchronizes: call before serving and before capturing CUDA graphs
    (kpool_cuda_warm_up). Later calls return at once."""
    if isinstance(device, int):
        index = device
    else:  # a torch.device or "cuda" / "cuda:N"
        text = str(device)
        if text.split(":")[0] != "cuda":
            raise KpoolValueError(f"cuda_warm_up: device {device!r} is not a CUDA device")
        index = int(text.partition(":")[2] or 0)
    e = KpoolExec()
    torch = sys.modules.get("torch")
    if torch is not None and 0 <= index < torch.cuda.device_count():  # else the library names the device
        e.stream = _current_stream(index)
    status = new_status()
    _lib.check(_lib.load().kpool_cuda_warm_up(index, ctypes.byref(e), ctypes.byref(status)), status)


def _current_stream(device_index: int) -> int:
    global _raw_stream
    if _raw_stream is None:
        torch = sys.modules["torch"]
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if getter is None:  # older / other builds: the public, slower path
            def getter(i):
                return torch.cuda.current_stream(i).cuda_stream
        _raw_stream = getter
    return _raw_stream(device_index)


class Call:
    """The descriptors of one C call; keeps every object they point into alive."""

    __slots__ = ("keep", "cuda_index")

    def __init__(self):
        self.keep = []
        self.cuda_index = None

    def tensor(self, x, name: str, *, inner: bool = False, output: bool = False):
        """``byref`` of x's descriptor, or None (NULL) for None.

        Inputs whose layout the kernels cannot address (a zero or negative
        stride, or a non-unit innermost stride where ``inner``) are copied to
        a contiguous array first, as the reference does with .contiguous().
        Outputs (caches included) are never copied: they are written in place.
        """
        if x is None:
            return None
        torch = _torch_of(x)
        if torch is not None:
            desc = self._from_torch(torch, x, name, inner, output)
        else:
            np = _numpy_of(x)
            if np is None:
                raise _not_an_array(x, name)
            desc = self._from_numpy(np, x, name, inner, output)
        self.keep.append(desc)
        return ctypes.byref(desc)

    def _from_torch(self, torch, t, name, inner, output):
        code = _torch_tables(torch).get(t.dtype)
        if code is None:
            raise KpoolTypeError(f"{name} has dtype {dtype_label(t)}, which kpool does not take")
        nd = t.dim()
        if nd > KPOOL_MAX_DIMS:
            raise KpoolValueError(f"{name} has {nd} dims (at most {KPOOL_MAX_DIMS})")
        if not output and not t.is_contiguous() and not _addressable(t.shape, t.stride(), inner):
            t = t.contiguous()
            self.keep.append(t)
        dev = t.device
        d = KpoolTensor()
        d.data = t.data_ptr()
        d.dtype = code
        d.ndim = nd
        d.shape[:nd] = t.shape
        d.strides[:nd] = t.stride() if t.numel() else _row_major(t.shape)
        if dev.type == "cuda":
            d.device = KPOOL_DEVICE_CUDA
            d.device_index = dev.index if dev.index is not None else torch.cuda.current_device()
            if self.cuda_index is None:
                self.cuda_index = d.device_index
        elif dev.type != "cpu":
            raise KpoolRuntimeError(f"{name} is on device {dev}; kpool runs on cpu and cuda tensors")
        return d

    def _from_numpy(self, np, a, name, inner, output):
        code = _NUMPY_DTYPES.get(a.dtype.name) if a.dtype.byteorder != ">" else None
        if code is None:
            raise KpoolTypeError(
                f"{name} has dtype {a.dtype}, which kpool does not take (numpy arrays: uint8, bool, int32, "
                f"int64, float32, and uint16 holding bfloat16 bits)")
        nd = a.ndim
        if nd > KPOOL_MAX_DIMS:
            raise KpoolValueError(f"{name} has {nd} dims (at most {KPOOL_MAX_DIMS})")
        if output and not a.flags.writeable:
            raise KpoolValueError(f"{name} is a read-only array, but kpool writes into it")
        size = a.itemsize
        strides = a.strides
        if any(s % size for s in strides):
            if output:
                raise KpoolValueError(f"{name} has byte strides {strides}, not multiples of its item size {size}")
            a = np.ascontiguousarray(a)
            strides = a.strides
        elems = tuple(s // size for s in strides)
        if not output and not a.flags.c_contiguous and not _addressable(a.shape, elems, inner):
            a = np.ascontiguousarray(a)
            elems = tuple(s // size for s in a.strides)
        self.keep.append(a)
        d = KpoolTensor()
        d.data = a.__array_interface__["data"][0]
        d.dtype = code
        d.ndim = nd
        d.shape[:nd] = a.shape
        d.strides[:nd] = elems if a.size else _row_major(a.shape)
        d.device = KPOOL_DEVICE_CPU
        return d

    def exec(self):
        """byref of the kpool_exec: torch's current stream on the CUDA device
        of the call's first CUDA tensor, NULL for host-only calls; the
        arithmetic set by kpool.set_arithmetic()."""
        e = KpoolExec()
        e.arithmetic = _lib.ARITHMETICS[_arithmetic[0]]
        if self.cuda_index is not None:
            e.stream = _current_stream(self.cuda_index)
            words = _index_errors[0]
            if words is not None and words.device.index == self.cuda_index:
                e.index_errors = words.data_ptr()
        self.keep.append(e)
        return ctypes.byref(e)


def _row_major(shape):
    # An empty array addresses nothing, so its strides are free; numpy gives
    # all-zero ones, which the runtime's layout checks would refuse.
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(n), 1)
    return strides[::-1]


def _addressable(shape, strides, inner: bool) -> bool:
    """Whether the runtime can address this layout as it is."""
    n = len(shape)
    for i in range(n):
        if shape[i] > 1 and strides[i] <= 0:
            return False
    if inner and n and shape[-1] > 1 and strides[-1] != 1:
        return False
    return True


def new_status() -> KpoolStatus:
    return KpoolStatus()


check = _lib.check
