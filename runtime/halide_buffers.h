// Caller tensors as the buffers the kernels take: the same memory, never
// copied, with Halide's innermost-first dimension order.
#pragma once

#include <vector>

#include <initializer_list>

#include "HalideBuffer.h"
#include "validate.h"

namespace kpool::rt {

using HalideBuffer = Halide::Runtime::Buffer<void>;

// The tensor's dims reversed (dim 0 = innermost), elements as `type`
// (bf16 as uint16, e4m3 and bool as uint8).
HalideBuffer wrap(const TensorArg &a);

// Rows [begin, begin + count) of dim 0 of a tensor (of a row-wise op, or a
// K cache's pages): one launch's share.
struct RowRange {
    int64_t begin, count;
};

// The K cache as the kernels see it: two views of the same pages,
// codes (d, token, page) and f32 scales (d, token, page) with d stride 0,
// starting block_size * 128 bytes into each page (the planar layout). Of
// pages [pages.begin, pages.begin + pages.count) (a window of a launch split
// by pages; placement.h, cache_windows), or all of them: each view starts
// at the window's first page, its page index the min of its dim 2.
struct CacheViews {
    HalideBuffer codes, scales;
};
CacheViews wrap_kv_cache(const TensorArg &kv_cache, RowRange pages);
CacheViews wrap_kv_cache(const TensorArg &kv_cache);

// Whether every row of `a` (its innermost dimension) starts on a multiple of
// `bytes`: the data and the strides of the outer dimensions `row_dims`
// (torch order; a dimension of size 1 has no second row) are multiples of
// it. The words kernels load and store whole aligned words.
bool rows_aligned(const TensorArg &a, int64_t bytes, std::initializer_list<int> row_dims);
// A [rows, 128] tensor (inner-contiguous) as (word, row) words of
// `word_bytes` bytes (4 or 8).
HalideBuffer wrap_row_words(const TensorArg &a, int64_t word_bytes);
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
