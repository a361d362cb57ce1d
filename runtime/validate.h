// Argument checks shared by the ops (runtime/ops/). Each names the argument
// (as in kpool.h) and the value it rejects; none of them writes anything.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "errors.h"

namespace kpool::rt {

// A described tensor: non-NULL, known dtype, the given rank, on a device
// this build runs (the CPU, and CUDA when built with it), data present
// unless it is empty.
struct TensorArg {
    const char *name;
    const kpool_tensor *t;

    int64_t dim(int i) const { return t->shape[i]; }
    int64_t stride(int i) const { return t->strides[i]; }
    int64_t numel() const;
    // Bytes from the first to one past the last element addressed.
    int64_t span_bytes() const;
};

TensorArg require_tensor(const char *name, const kpool_tensor *t,
                         std::initializer_list<kpool_dtype> dtypes, int ndim);
// Either rank in `ndims` (e.g. [rows] or [rows, 1]).
TensorArg require_tensor_ranks(const char *name, const kpool_tensor *t,
                               std::initializer_list<kpool_dtype> dtypes,
                               std::initializer_list<int> ndims);
void require_dim(const TensorArg &a, int i, int64_t expected, const char *what);
void require_same_dim(const TensorArg &a, int i, const TensorArg &b, int j);
void require_stride(const TensorArg &a, int i, int64_t expected);
// Innermost-first strides the kernels take must be positive and fit int32;
// strides of size-1 dimensions are ignored.
void require_int32_strides(const TensorArg &a);
// A scale per row, [rows] or [rows, 1] (rows checked by the caller): a
// second dim of any other size is rejected (of size 0, the tensor holds no
// element, yet a row's scale would be written).
void require_row_scales_shape(const TensorArg &scales);
void require_same_device(const std::vector<const TensorArg *> &args);
void require_pool_size(int32_t pool_size);
void require_head_dim(int32_t head_dim);

// The arguments several ops share, each checked as kpool.h describes it.

// The paged K cache: uint8 [num_blocks, block_size, 132], planar pages whose
// stride (bytes) is a multiple of 4 so the f32 scales stay aligned.
TensorArg require_kv_cache(const kpool_tensor *t);
// The tail ring: bf16 [num_blocks, 2, RING, 128], strides (block, half, 128, 1),
// RING a multiple of P; halves and blocks may be padded, never overlap.
TensorArg require_tail(const kpool_tensor *t, int32_t pool_size);
// bf16 keys [n, tokens, 128], and their scores of the same shape (bf16, or
// f32 where `score_dtypes` allows it).
TensorArg require_keys(const char *name, const kpool_tensor *t);
TensorArg require_scores(const char *name, const kpool_tensor *t, std::initializer_list<kpool_dtype> score_dtypes,
                         const TensorArg &keys);
// The position bias: f32 [P, 128].
TensorArg require_ape(const kpool_tensor *t, int32_t pool_size);
void require_inner_contiguous(const TensorArg &a);
// A 2-D output [rows, cols] with dense rows: the rows must not overlap, or
// two elements would share memory (and the result depend on write order).
void require_disjoint_rows(const TensorArg &a);

// The slots a loc / slot_mapping addresses: pages x block_size.
int64_t cache_slot_count(const TensorArg &kv_cache);
// The slots a tail slot addresses: blocks x RING.
int64_t tail_slot_count(const TensorArg &tail);
// Every non-negative loc (of those `mask` enables, or all) addresses a slot
// of the cache; every non-negative tail slot a block of the tail cache.
void require_locs_in_cache(const TensorArg &locs, const TensorArg &kv_cache, const TensorArg *mask);
void require_tslots_in_tail(const TensorArg &tslots, const TensorArg &tail);

// Element i of an integer index tensor (int32 or int64, 1-D or 2-D in
// row-major element order of its shape), read with its strides.
int64_t index_at(const TensorArg &a, int64_t i);

// Bytes per element of `dtype` (bool and e4m3 as one byte; 0 if unknown).
int64_t element_bytes(kpool_dtype dtype);
// A row-major (C-contiguous) descriptor on the CPU (kpool_tensor_contiguous).
kpool_tensor contiguous_tensor(void *data, kpool_dtype dtype, int32_t ndim, const int64_t *shape);

// "loc[17]" or "slot_mapping[3, 1]": where an element sits, for messages.
std::string element_name(const TensorArg &a, int64_t flat_index);

}  // namespace kpool::rt
