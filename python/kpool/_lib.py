"""Finding and loading libkpool.so, and the ctypes mirror of include/kpool/kpool.h
(the entry points' prototypes from the op table beside the library).

Nothing here knows about torch or numpy; ``_tensors`` turns their arrays into
``KpoolTensor`` descriptors and ``ops`` calls the entry points declared below.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading

# --- constants of kpool.h ---------------------------------------------------
KPOOL_HEAD_DIM = 128
KPOOL_MAX_DIMS = 4
KPOOL_MESSAGE_SIZE = 512

# kpool_status_code
KPOOL_OK = 0
KPOOL_ERROR_INVALID_ARGUMENT = 1
KPOOL_ERROR_OUT_OF_RANGE = 2
KPOOL_ERROR_UNSUPPORTED = 3
KPOOL_ERROR_DEVICE = 4
KPOOL_ERROR_INTERNAL = 5

# kpool_dtype
KPOOL_DTYPE_UINT8 = 0
KPOOL_DTYPE_BOOL = 1
KPOOL_DTYPE_INT32 = 2
KPOOL_DTYPE_INT64 = 3
KPOOL_DTYPE_BFLOAT16 = 4
KPOOL_DTYPE_FLOAT32 = 5
KPOOL_DTYPE_FLOAT8_E4M3FN = 6
KPOOL_DTYPES = 7
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# kpool_device_type
KPOOL_DEVICE_CPU = 0
KPOOL_DEVICE_CUDA = 1

# --- structs ------------------------------------------------------------------
# C enums are int-sized on every ABI we target (x86-64 / aarch64 Linux).
class KpoolTensor(ctypes.Structure):
    """kpool_tensor: data pointer, dtype, rank, shape and strides in elements, device."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * KPOOL_MAX_DIMS),
        ("strides", ctypes.c_int64 * KPOOL_MAX_DIMS),
        ("device", ctypes.c_int),
        ("device_index", ctypes.c_int32),
    ]


class KpoolStatus(ctypes.Structure):
    """kpool_status: code, decode's skipped completions, and the message."""

    _fields_ = [
        ("code", ctypes.c_int),
        ("skipped_completions", ctypes.c_int64),
        ("message", ctypes.c_char * KPOOL_MESSAGE_SIZE),
    ]


KPOOL_ARITHMETIC_DEFAULT = 0
KPOOL_ARITHMETIC_EXACT = 1
KPOOL_ARITHMETIC_TRITON = 2
ARITHMETICS = {"default": KPOOL_ARITHMETIC_DEFAULT, "exact": KPOOL_ARITHMETIC_EXACT, "triton": KPOOL_ARITHMETIC_TRITON}


# kpool_index_arg: the words of kpool_exec.index_errors, in order.
INDEX_ARGS = ("loc", "tslot", "slot_mapping", "tail_slot_mapping")


class KpoolExec(ctypes.Structure):
    """kpool_exec: the CUDA stream of the call (NULL: legacy default stream),
    the softmax pool's arithmetic (kpool_arithmetic) and the device words
    that mark out-of-range indices (NULL: none)."""

    _fields_ = [("stream", ctypes.c_void_p), ("arithmetic", ctypes.c_int32), ("index_errors", ctypes.c_void_p)]


# The C layout, written out by hand from kpool.h; a mismatch is a bug here.
assert ctypes.sizeof(KpoolTensor) == 88 and KpoolTensor.shape.offset == 16
assert KpoolTensor.strides.offset == 48 and KpoolTensor.device.offset == 80
assert ctypes.sizeof(KpoolStatus) == 16 + KPOOL_MESSAGE_SIZE
assert KpoolStatus.skipped_completions.offset == 8 and KpoolStatus.message.offset == 16
assert ctypes.sizeof(KpoolExec) == 24 and KpoolExec.arithmetic.offset == 8 and KpoolExec.index_errors.offset == 16

_T = ctypes.POINTER(KpoolTensor)
_S = ctypes.POINTER(KpoolStatus)
_E = ctypes.POINTER(KpoolExec)
_i32 = ctypes.c_int32
_code = ctypes.c_int

# The C types of the op table's argument and return types (cmake/op_table.py).
_ARGUMENT_CTYPES = {"tensor": _T, "int32": _i32, "int64": ctypes.c_int64,
                    "int64_out": ctypes.POINTER(ctypes.c_int64), "dtype": ctypes.c_int, "status_code": ctypes.c_int,
                    "pointer": ctypes.c_void_p, "shape": ctypes.POINTER(ctypes.c_int64), "images": ctypes.c_void_p}
_RETURN_CTYPES = {"status": _code, "skipped_completions": _code, "string": ctypes.c_char_p, "int32": _i32,
                  "tensor_value": KpoolTensor}
OP_TABLE_NAME = "kpool_ops.json"


def prototype(entry) -> tuple:
    """(restype, argtypes) of an entry point of the op table."""
    argtypes = [_ARGUMENT_CTYPES[a["type"]] for a in entry["arguments"]]
    argtypes += [_E] if entry["exec"] else []
    argtypes += [_S] if entry["status"] else []
    return _RETURN_CTYPES[entry["returns"]], argtypes


LIBRARY_ENV = "KPOOL_LIBRARY"
_LIBRARY_NAME = "libkpool.so"
_package_dir = os.path.dirname(os.path.abspath(__file__))


def candidate_paths() -> list[str]:
    """Where the library is looked for, in order: $KPOOL_LIBRARY (by the
    top-level package ``kpool`` only: a copy bundled inside another package
    loads its own library), the copy packaged in kpool/lib/, then
    <repo>/build/libkpool.so next to python/."""
    env = os.environ.get(LIBRARY_ENV)
    if env and __package__ == "kpool":
        return [env]  # an explicit choice is never second-guessed
    return [
        os.path.join(_package_dir, "lib", _LIBRARY_NAME),
        os.path.normpath(os.path.join(_package_dir, "..", "..", "build", _LIBRARY_NAME)),
    ]


_lock = threading.Lock()
_lib = None
_lib_path = None
_table = None


def load() -> ctypes.CDLL:
    """The loaded library (loaded on first use, so ``import kpool`` never fails)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths = candidate_paths()
        path = next((p for p in paths if os.path.isfile(p)), None)
        if path is None:
            raise OSError(
                f"kpool: {_LIBRARY_NAME} not found (looked at: {', '.join(paths)}). Build it with "
                f"`cmake --build build` and set {LIBRARY_ENV}=/path/to/{_LIBRARY_NAME}, or reinstall the "
                f"package after building so that it is copied into kpool/lib/")
        table = _read_op_table(path)
        lib = ctypes.CDLL(path)
        for entry in table["entries"]:
            fn = getattr(lib, entry["symbol"])  # AttributeError names a missing symbol: wrong library
            fn.restype, fn.argtypes = prototype(entry)
        global _table
        _table = table  # (the library's own, whatever op_table() read before)
        _lib_path = path
        _lib = lib
        return lib


def _read_op_table(path):
    """The op table the library at ``path`` was built from, beside it (the
    build's cmake/op_table.py writes it there, the wheel packs it there)."""
    table_path = os.path.join(os.path.dirname(path), OP_TABLE_NAME)
    try:
        with open(table_path) as f:
            return json.load(f)
    except OSError as e:
        raise OSError(f"kpool: {path} has no op table beside it ({table_path}: {e.strerror}); "
                      f"rebuild the library, or reinstall the package") from None


def op_table() -> dict:
    """The op table of the library the package loads (read, the library not
    loaded, on first use): its C entry points, each with its arguments and
    their rules, and its torch operators' schemas (cmake/op_table.py)."""
    global _table
    if _table is None:
        path = _lib_path or next((p for p in candidate_paths() if os.path.isfile(p)), None)
        if path is None:
            load()  # (raises, naming where it looked)
        table = _read_op_table(path)
        with _lock:
            if _table is None:
                _table = table
    return _table


def library_path() -> str:
    """The file the library was loaded from (loads it if needed)."""
    load()
    return _lib_path


def version() -> str:
    """kpool_version(): e.g. "kpool 0.1.0 (cpu)" or "... (cpu, cuda)"."""
    return load().kpool_version().decode()


def status_name(code: int) -> str:
    """kpool_status_name(): the runtime's name of a status code."""
    return load().kpool_status_name(code).decode()


# --- errors ---------------------------------------------------------------------
class KpoolError(Exception):
    """Base of every error kpool raises; ``code`` is the kpool_status_code
    (the class's, or the status a failed call returned). No __init__ of its
    own, so that torch.compile can raise these from traced code."""

    code = KPOOL_ERROR_INTERNAL


class KpoolValueError(KpoolError, ValueError):
    """Bad shape, stride or parameter (KPOOL_ERROR_INVALID_ARGUMENT)."""

    code = KPOOL_ERROR_INVALID_ARGUMENT


class KpoolIndexRangeError(KpoolValueError):
    """An index input addresses outside its cache (KPOOL_ERROR_OUT_OF_RANGE)."""

    code = KPOOL_ERROR_OUT_OF_RANGE


class KpoolTypeError(KpoolError, TypeError):
    """A dtype (or argument type) the op does not take."""

    code = KPOOL_ERROR_INVALID_ARGUMENT


class KpoolRuntimeError(KpoolError, RuntimeError):
    """Unsupported variant or device, device failure, internal error."""


def error_for(code: int, message: str) -> KpoolError:
    """The Python exception for a failed status."""
    if code == KPOOL_ERROR_OUT_OF_RANGE:
        error = KpoolIndexRangeError(message)
    elif code == KPOOL_ERROR_INVALID_ARGUMENT:
        error = KpoolTypeError(message) if "dtype" in message else KpoolValueError(message)
    else:
        error = KpoolRuntimeError(f"{message} [{status_name(code)}]")
    error.code = code
    return error


def check(code: int, status: KpoolStatus) -> None:
    """Raise the error a non-OK call returned, with the runtime's message."""
    if code != KPOOL_OK:
        text = status.message.decode("utf-8", "replace") or status_name(code)
        raise error_for(code, text)
