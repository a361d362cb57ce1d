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

import contextvars
import ctypes
import operator
import os
import sys
import threading

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
    KpoolError,
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


def require_flag(v, name):
    """A bool parameter; an array there is an output passed by position."""
    if is_array(v):
        raise KpoolTypeError(f"{name} is a {type(v).__name__}: pass the output buffer as out=... (keyword only)")
    return v


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


def _index_errors_changed():
    # The extension holds the words of each device (and a reference to them).
    calls = sys.modules.get(__package__ + "._calls")
    if calls is not None:
        calls.index_errors_changed()


# The softmax pool's arithmetic (include/kpool/kpool.h, kpool_arithmetic):
# "default" (the reference's on CUDA tensors, the contract's on the CPU),
# "exact" (the contract) or "triton" (the reference's own GPU instructions,
# CUDA tensors only). Every drop-in function and torch op takes it as its
# `arithmetic` argument; this is the default of calls that do not pass one,
# local to the context (each thread and asyncio task has its own, starting
# from $KPOOL_ARITHMETIC or "default"), never shared by the process.
def _checked_arithmetic(name, what="arithmetic"):
    if name not in _lib.ARITHMETICS:
        raise KpoolValueError(f"{what} = {name!r} is not one of {', '.join(repr(a) for a in _lib.ARITHMETICS)}")
    return name


_arithmetic = contextvars.ContextVar(
    "kpool_arithmetic", default=_checked_arithmetic(os.environ.get("KPOOL_ARITHMETIC", "default"), "$KPOOL_ARITHMETIC"))


def set_arithmetic(name: str) -> str:
    """Sets the arithmetic of later calls in this context (thread, asyncio
    task) that pass none ("default", "exact" or "triton"); returns the
    previous one. Other threads keep theirs; a call captured in a CUDA graph
    or traced by torch.compile keeps the arithmetic it was made with."""
    previous = _arithmetic.get()
    _arithmetic.set(_checked_arithmetic(name))
    return previous


def get_arithmetic() -> str:
    """This context's default arithmetic (kpool.set_arithmetic)."""
    return _arithmetic.get()


_ARITHMETIC_CODES = _lib.ARITHMETICS


def context_arithmetic_code() -> int:
    """The kpool_arithmetic code of this context's default."""
    return _ARITHMETIC_CODES[_arithmetic.get()]


def arithmetic_code(name=None) -> int:
    """The kpool_arithmetic code of a call's ``arithmetic`` argument: its
    name, or None for this context's default."""
    if name is None:
        return _ARITHMETIC_CODES[_arithmetic.get()]
    code = _ARITHMETIC_CODES.get(name) if isinstance(name, str) else None
    return code if code is not None else _ARITHMETIC_CODES[_checked_arithmetic(name)]


# The words CUDA calls mark out-of-range indices in (kpool.h,
# kpool_exec.index_errors), one torch int32 tensor per CUDA device. Every
# tensor ever set is kept alive: a CUDA graph captured with a device's words
# goes on writing them when it is replayed, after they were replaced.
_index_errors = {}  # device index -> tensor
_retired_index_errors = []
_index_errors_lock = threading.Lock()


def set_index_errors(words, device=None):
    """Later calls on CUDA tensors of ``words``' device mark each index
    argument that had an out-of-range entry (its writes are skipped) in
    ``words``: a zeroed torch int32 CUDA tensor of 4 elements (loc, tslot,
    slot_mapping, tail_slot_mapping), on the call's stream, without a
    synchronization (graph capturable). Each device has its own words;
    ``set_index_errors(None, device)`` stops them on ``device``, and
    ``set_index_errors(None)`` on every device. Returns the device's previous
    tensor (for None: torch's current device's). Refused while the device's current stream
    captures a CUDA graph; replaced words stay allocated, so graphs captured
    with them keep marking memory that exists (``check_index_errors``
    reads the device's current words). ``check_index_errors()`` reads and
    zeroes them."""
    if words is not None:
        torch = _torch_of(words)
        if (torch is None or not words.is_cuda or words.dtype != torch.int32 or words.numel() != len(_lib.INDEX_ARGS)
                or not words.is_contiguous()):
            raise KpoolTypeError(f"index_errors must be a contiguous torch int32 CUDA tensor of "
                                 f"{len(_lib.INDEX_ARGS)} elements ({', '.join(_lib.INDEX_ARGS)})")
        index = words.device.index
        if device is not None and _cuda_index(device, "set_index_errors") != index:
            raise KpoolValueError(f"set_index_errors: device {device!r} is not the words' device ({words.device})")
    else:
        index = _cuda_index("cuda" if device is None else device, "set_index_errors")
    torch = sys.modules.get("torch")
    for i in sorted(_index_errors) if words is None and device is None else [index]:
        if torch is not None and torch.cuda.is_available() and i < torch.cuda.device_count():
            with torch.cuda.device(i):
                capturing = torch.cuda.is_current_stream_capturing()
            if capturing:
                raise KpoolRuntimeError(f"set_index_errors: cuda:{i}'s current stream is capturing a CUDA graph, "
                                        f"which records the device's words; set them before or after the capture")
    with _index_errors_lock:
        previous = _index_errors.get(index)
        if words is None and device is None:
            _index_errors.clear()
        else:
            _index_errors.pop(index, None)
        if words is not None:
            _index_errors[index] = words
            if all(w is not words for w in _retired_index_errors):
                _retired_index_errors.append(words)
    _index_errors_changed()
    return previous


def index_errors_of(device_index: int):
    """The index-error words set for a CUDA device, or None."""
    return _index_errors.get(device_index)


def index_errors_by_device():
    """(words tensors by device index, None where unset; their addresses)."""
    with _index_errors_lock:
        count = max(_index_errors, default=-1) + 1
        words = tuple(_index_errors.get(i) for i in range(count))
    return words, tuple(w.data_ptr() if w is not None else 0 for w in words)


def _cuda_index(device, what) -> int:
    """A CUDA device's index from an int, a torch.device or "cuda[:N]"."""
    if isinstance(device, int):
        return device
    text = str(device)
    if text.split(":")[0] != "cuda":
        raise KpoolValueError(f"{what}: device {device!r} is not a CUDA device")
    index = text.partition(":")[2]
    if not index:
        torch = sys.modules.get("torch")
        return torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
    return int(index)


def check_index_errors(device=None, *, after=()) -> None:
    """Raises KpoolIndexRangeError naming every argument that had an
    out-of-range index in a CUDA call since the last check, and zeroes the
    words: those of ``device`` (an index, torch.device or "cuda:N"), or of
    every device with words when None (set_index_errors).

    The check reads and zeroes the words on the device's current stream and
    waits for it (a synchronization): it covers the calls queued before it
    on that stream, and on each stream of ``after`` (torch CUDA streams of
    the device, which the current stream waits for first). A call on a
    stream it does not wait for may still be running: its mark can land
    after the read (reported by the next check) or between the read and the
    zeroing (lost)."""
    indices = sorted(_index_errors) if device is None else [_cuda_index(device, "check_index_errors")]
    if not indices or any(i not in _index_errors for i in indices):
        raise KpoolValueError("check_index_errors: no index_errors words were set"
                              + ("" if device is None else f" on cuda:{indices[0]}") + " (kpool.set_index_errors)")
    torch = sys.modules.get("torch")
    for stream in after:
        if stream.device.index in indices:
            torch.cuda.current_stream(stream.device.index).wait_stream(stream)
    errors = []
    for index in indices:
        words = _index_errors[index]
        e = KpoolExec()
        e.stream = _current_stream(index)
        e.index_errors = words.data_ptr()
        status = new_status()
        code = _lib.load().kpool_check_index_errors(index, ctypes.byref(e), ctypes.byref(status))
        try:
            _lib.check(code, status)
        except KpoolError as error:
            if len(indices) == 1:
                raise
            errors.append((index, error))
    if errors:
        index, first = errors[0]
        error = type(first)("; ".join(f"cuda:{i}: {e}" for i, e in errors))
        error.code = first.code
        raise error


def cuda_warm_up(device=0) -> None:
    """Loads and runs every CUDA kernel of the library once on ``device`` (an
    index, or a torch.device / "cuda:N"), on torch's current stream, which it
    then synchronizes: call before serving and before capturing CUDA graphs
    (kpool_cuda_warm_up). Later calls return at once."""
    index = _cuda_index(device, "cuda_warm_up")
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

    __slots__ = ("keep", "cuda_index", "arithmetic")

    def __init__(self, arithmetic: int = _lib.KPOOL_ARITHMETIC_DEFAULT):
        self.keep = []
        self.cuda_index = None
        self.arithmetic = arithmetic

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
        call's arithmetic; the index-error words of that device."""
        e = KpoolExec()
        e.arithmetic = self.arithmetic
        if self.cuda_index is not None:
            e.stream = _current_stream(self.cuda_index)
            words = _index_errors.get(self.cuda_index)
            if words is not None:
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
