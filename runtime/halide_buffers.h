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

// The K cache as the kernels see it: two views of the same pages,
// codes (d, token, page) and f32 scales (d, token, page) with d stride 0,
// starting block_size * 128 bytes into each page (the planar layout).
struct CacheViews {
    HalideBuffer codes, scales;
};
CacheViews wrap_kv_cache(const TensorArg &kv_cache);

// Whether a [rows, 128] tensor's data and rows are aligned to `bytes`;
// and the tensor (inner-contiguous) as (word, row) words of `word_bytes`
// bytes (4 or 8): the words kernels load and store whole aligned words.
bool rows_fit_words(const TensorArg &a, int64_t bytes);
// Whether a tensor's data starts 16-byte aligned.
bool starts_16_byte_aligned(const TensorArg &a);
HalideBuffer wrap_row_words(const TensorArg &a, int64_t word_bytes);
// Whether a buffer's data and every stride past the first are multiples of
// 16 bytes (a size-1 dimension takes the dense stride, wrap()).
bool rows_of_16_bytes(const HalideBuffer &b);
// An inner-contiguous buffer of 16-bit elements (wrap()) as words of
// `word` (uint32 or uint64): the first element in the low bits.
HalideBuffer as_words(const HalideBuffer &b, halide_type_t word);

// Per-row f32 scales ([rows] or [rows, 1]) as (x, row) with x stride 0 and
// extent `per_row` (the elements or words of the row), the second view of a
// (codes, scale) output.
HalideBuffer wrap_row_scales(const TensorArg &scales, int32_t per_row = KPOOL_HEAD_DIM);

// The tail ring as (d, ring_pos, half, block).
HalideBuffer wrap_tail(const TensorArg &tail);

}  // namespace kpool::rt
