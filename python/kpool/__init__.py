"""kpool: the key-pooling sparse-attention indexer kernels (libkpool.so) for
Python, as a drop-in for the Triton reference module ``kpool_triton``.

The shared library is loaded with ctypes on first use, from
``$KPOOL_LIBRARY`` (for the top-level package ``kpool``; a copy bundled in
another package ignores it), else ``kpool/lib/libkpool.so`` (copied there by
``pip install``), else ``<repo>/build/libkpool.so``. Arguments are torch
tensors (CPU or CUDA; CUDA calls run on torch's current stream) or numpy
arrays (CPU; bf16 as ``uint16`` arrays, e4m3 as ``uint8``), used in place.

With torch installed, ``import kpool`` registers every op as a PyTorch
custom operator (``torch.ops.kpool.*``), which the functions below call
when torch.compile traces them; torch tensors are run through the
``_torch_calls`` extension next to the library when it is there.

Errors: ``ValueError`` for bad shapes, strides, parameters and out-of-range
indices, ``TypeError`` for dtypes, ``RuntimeError`` for unsupported variants or
devices and device failures; all are ``kpool.KpoolError`` with a ``code``.

Compress and decode run, by default, the reference's own GPU instructions on
CUDA tensors (bit for bit with it) and the contract's exact arithmetic
(a correctly rounded exp and IEEE division) on the CPU. Every function takes
``arithmetic="exact"`` or ``"triton"`` (triton needs CUDA tensors) per call;
``kpool.set_arithmetic`` sets the default of the calls that pass none in the
current context (thread or asyncio task), never for the whole process.

Process state: index-error words are per CUDA device (``set_index_errors``);
a process forked after kpool initialized CUDA gets a device error from every
CUDA call (start workers with "spawn"), and its CPU calls run on a thread
pool of its own.
"""

from ._lib import (
    KpoolError,
    KpoolIndexRangeError,
    KpoolRuntimeError,
    KpoolTypeError,
    KpoolValueError,
    library_path,
    version,
)
from ._tensors import check_index_errors, cuda_warm_up, get_arithmetic, set_arithmetic, set_index_errors
from .ops import (
    INDEX_HEAD_DIM,
    append_tail_to_topk,
    expand_pools_and_append_tail,
    expand_pools_to_tokens,
    fwht128_quant_fp8,
    history_group_budget_for_topk,
    kpool_compress_and_write_cache,
    kpool_decode_update_and_maybe_write_cache_batched,
    kpool_decode_update_and_maybe_write_cache_ragged,
    kpool_compress_tokens_and_write_cache,
    kpool_seed_tail_cache,
)

__version__ = "0.1.0"

__all__ = [
    "INDEX_HEAD_DIM",
    "append_tail_to_topk",
    "expand_pools_and_append_tail",
    "expand_pools_to_tokens",
    "fwht128_quant_fp8",
    "history_group_budget_for_topk",
    "kpool_compress_and_write_cache",
    "kpool_decode_update_and_maybe_write_cache_batched",
    "kpool_decode_update_and_maybe_write_cache_ragged",
    "kpool_compress_tokens_and_write_cache",
    "kpool_seed_tail_cache",
    "KpoolError",
    "KpoolIndexRangeError",
    "KpoolRuntimeError",
    "KpoolTypeError",
    "KpoolValueError",
    "check_index_errors",
    "cuda_warm_up",
    "get_arithmetic",
    "library_path",
    "set_arithmetic",
    "set_index_errors",
    "version",
]
