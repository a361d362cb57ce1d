// The index check kernel (generators/kpool_index_check.cpp) that device
// calls run when the caller passes exec->index_errors, here through its
// test-only CPU variants: a word is set iff an enabled entry is >= the limit,
// and it is never cleared. The GPU tests (GpuBadIndex) run it inside calls.
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "HalideBuffer.h"
#include "kpool_cpu_index_check_int32.h"
#include "kpool_cpu_index_check_int64.h"

namespace {

using Halide::Runtime::Buffer;

// The word after checking `values` as (i, row) with row stride `row_stride`
// (>= cols), entries enabled where `enabled` is non-zero (empty: all).
template <typename Index>
int32_t mark_after(const std::vector<Index> &values, int cols, int rows, int row_stride, int64_t limit,
                   const std::vector<uint8_t> &enabled = {}, int32_t word = 0) {
    halide_dimension_t dims[2] = {{0, cols, 1}, {0, rows, row_stride}};
    Buffer<Index> index(const_cast<Index *>(values.data()), 2, dims);
    const uint8_t all = 1;
    halide_dimension_t mask_dim = {0, cols, enabled.empty() ? 0 : 1};
    Buffer<uint8_t> mask(const_cast<uint8_t *>(enabled.empty() ? &all : enabled.data()), 1, &mask_dim);
    Buffer<int32_t> mark(&word, 1);
    int rc;
    if constexpr (sizeof(Index) == 4) {
        rc = kpool_cpu_index_check_int32(index, mask, limit, mark);
    } else {
        rc = kpool_cpu_index_check_int64(index, mask, limit, mark);
    }
    EXPECT_EQ(rc, 0);
    return word;
}

TEST(IndexCheck, InRangeAndSentinelsMarkNothing) {
    const std::vector<int32_t> v = {0, 5, -1, 9, std::numeric_limits<int32_t>::min(), 3};
    EXPECT_EQ(mark_after(v, 6, 1, 6, 10), 0);
    const std::vector<int64_t> w = {0, 9, -1, std::numeric_limits<int64_t>::min()};
    EXPECT_EQ(mark_after(w, 4, 1, 4, 10), 0);
}

TEST(IndexCheck, TheLimitItselfIsOutOfRange) {
    EXPECT_EQ(mark_after(std::vector<int32_t>{0, 10, 2}, 3, 1, 3, 10), 1);
    EXPECT_EQ(mark_after(std::vector<int32_t>{0, 9, 2}, 3, 1, 3, 10), 0);
    // A cache without slots: every non-negative index is out of range.
    EXPECT_EQ(mark_after(std::vector<int32_t>{-1, 0}, 2, 1, 2, 0), 1);
    EXPECT_EQ(mark_after(std::vector<int32_t>{-1, -7}, 2, 1, 2, 0), 0);
}

// int64 indices are compared whole: low 32 bits that name a valid slot do
// not hide the rest.
TEST(IndexCheck, Int64ComparedInFull) {
    EXPECT_EQ(mark_after(std::vector<int64_t>{1, (int64_t(1) << 32) + 5}, 2, 1, 2, 100), 1);
    EXPECT_EQ(mark_after(std::vector<int64_t>{std::numeric_limits<int64_t>::max()}, 1, 1, 1, 100), 1);
}

// Disabled entries (a compress write mask's 0) are not writes.
TEST(IndexCheck, MaskedOutEntriesAreNotChecked) {
    const std::vector<int64_t> v = {1, 500, 2};
    EXPECT_EQ(mark_after(v, 3, 1, 3, 100, {1, 0, 1}), 0);
    EXPECT_EQ(mark_after(v, 3, 1, 3, 100, {1, 2, 0}), 1);
}

// A decode batch [B, N] with a row stride past N: every row is checked, and
// the padding between rows is not.
TEST(IndexCheck, EveryRowOfAStridedBatch) {
    const int N = 3, B = 4, stride = 5;
    std::vector<int32_t> v(B * stride, 999);  // padding out of range
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < N; ++t) v[b * stride + t] = b * N + t;
    EXPECT_EQ(mark_after(v, N, B, stride, 64), 0);
    v[3 * stride + 2] = 64;
    EXPECT_EQ(mark_after(v, N, B, stride, 64), 1);
}

TEST(IndexCheck, AMarkIsNeverCleared) {
    EXPECT_EQ(mark_after(std::vector<int32_t>{0, 1}, 2, 1, 2, 10, {}, /*word=*/1), 1);
}

}  // namespace
