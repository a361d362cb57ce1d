// Caller tensors as the buffers the kernels take: the same memory, never
// copied, with Halide's innermost-first dimension order.
#pragma once

#include <vector>

#include "HalideBuffer.h"
#include "validate.h"

namespace kpool::rt {

using HalideBuffer = Halide::Runtime::Buffer<void>;

// The tensor's dims reversed (dim 0 = innermost), elements as `type`
// (bf16 as uint16, e4m3 and bool as uint8).
HalideBuffer wrap(const TensorArg &a);

// The K cache as the kernels see it: (byte_in_page, page), extent
// block_size * 132 bytes per page, page stride kv_cache.strides[0].
HalideBuffer wrap_kv_cache(const TensorArg &kv_cache);

// The tail ring as (d, ring_pos, half, block).
HalideBuffer wrap_tail(const TensorArg &tail);

// A 1-D buffer of `extent` elements with stride 0 over one constant:
// stands for an absent optional input (write mask, page table, offsets).
HalideBuffer broadcast_u8(const uint8_t *value, int64_t extent);
HalideBuffer broadcast_i32(const int32_t *value, int64_t cols, int64_t rows);
HalideBuffer broadcast_i64(const int64_t *value, int64_t extent);

}  // namespace kpool::rt
