// Argument checks shared by every entry point. Each names the argument (as
// in kpool.h) and the value it rejects; none of them writes anything.
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
void require_same_device(const std::vector<const TensorArg *> &args);
void require_pool_size(int32_t pool_size);
void require_head_dim(int32_t head_dim);

// Element i of an integer index tensor (int32 or int64, 1-D or 2-D in
// row-major element order of its shape), read with its strides.
int64_t index_at(const TensorArg &a, int64_t i);

// Bytes per element of `dtype` (bool and e4m3 as one byte; 0 if unknown).
int64_t element_bytes(kpool_dtype dtype);

// "loc[17]" or "slot_mapping[3, 1]": where an element sits, for messages.
std::string element_name(const TensorArg &a, int64_t flat_index);

}  // namespace kpool::rt
