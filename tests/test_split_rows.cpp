// The CUDA launch plan of the row-wise ops past 2 GiB (runtime/placement.h):
// split_rows' ranges cover the rows in order, every tensor spans at most the
// limit over each, and as few ranges as the widest tensor allows are used;
// row_slice addresses a range's rows. The device side, which launches these
// ranges, is GpuLarge (test_gpu_large.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "errors.h"
#include "placement.h"

namespace kpool_test {
namespace {

using kpool::rt::kCudaMaxSpanBytes;
using kpool::rt::RowRange;
using kpool::rt::split_rows;
using kpool::rt::TensorArg;

// A descriptor only (nothing is read): rows x cols of `dtype`, rows `row_stride` elements apart.
kpool_tensor rows_of(kpool_dtype dtype, int64_t rows, int64_t cols, int64_t row_stride) {
    kpool_tensor t{};
    t.data = reinterpret_cast<void *>(uintptr_t(1) << 20);
    t.dtype = dtype;
    t.ndim = 2;
    t.shape[0] = rows, t.shape[1] = cols;
    t.strides[0] = row_stride, t.strides[1] = 1;
    t.device = KPOOL_DEVICE_CUDA;
    return t;
}

// The ranges cover [0, rows) in order, and each tensor spans at most `max_span` over each.
void expect_plan(const std::vector<RowRange> &ranges, int64_t rows, const std::vector<const TensorArg *> &tensors,
                 int64_t max_span) {
    int64_t next = 0;
    for (const RowRange &r : ranges) {
        EXPECT_EQ(r.begin, next);
        EXPECT_GT(r.count, 0);
        next = r.begin + r.count;
        for (const TensorArg *a : tensors) {
            const kpool_tensor slice = kpool::rt::row_slice(*a, r);
            EXPECT_LE((TensorArg{a->name, &slice}.span_bytes()), max_span) << a->name << " rows " << r.begin;
            EXPECT_EQ(static_cast<const uint8_t *>(slice.data) - static_cast<const uint8_t *>(a->t->data),
                      r.begin * a->stride(0) * kpool::rt::element_bytes(a->t->dtype));
        }
    }
    EXPECT_EQ(next, rows);
}

TEST(SplitRows, FwhtPastTheReferencesLimit) {
    // 17M rows of q (bf16, 256 B a row), its codes and scales: q decides.
    const int64_t rows = 17'000'000;
    const kpool_tensor q = rows_of(KPOOL_DTYPE_BFLOAT16, rows, 128, 128),
                       codes = rows_of(KPOOL_DTYPE_FLOAT8_E4M3FN, rows, 128, 128),
                       scales = rows_of(KPOOL_DTYPE_FLOAT32, rows, 1, 1);
    const TensorArg a{"q", &q}, b{"q_fp8", &codes}, c{"q_scale", &scales};
    const auto ranges = split_rows(rows, {&a, &b, &c}, kCudaMaxSpanBytes);
    ASSERT_EQ(ranges.size(), 3u);
    EXPECT_EQ(ranges[0].count, kCudaMaxSpanBytes / 256);  // the most whole rows under 2^31 bytes
    expect_plan(ranges, rows, {&a, &b, &c}, kCudaMaxSpanBytes);
}

TEST(SplitRows, KCacheOfTwentyMillionSlots) {
    // 20M slots in pages of 64 (8448 bytes each), 2.64 GB: two windows of
    // pages, each under 2^31 bytes, also as Halide checks it (pages x stride).
    const int64_t pages = 20'000'000 / 64, page_bytes = 64 * 132;
    kpool_tensor cache = rows_of(KPOOL_DTYPE_UINT8, pages, page_bytes, page_bytes);
    const TensorArg a{"kv_cache", &cache};
    const auto windows = split_rows(pages, {&a}, kCudaMaxSpanBytes);
    ASSERT_EQ(windows.size(), 2u);
    EXPECT_EQ(windows[0].count, kCudaMaxSpanBytes / page_bytes);
    EXPECT_LE(windows[0].count * page_bytes, kCudaMaxSpanBytes);
    expect_plan(windows, pages, {&a}, kCudaMaxSpanBytes);
}

TEST(SplitRows, FitsInOneRange) {
    const kpool_tensor q = rows_of(KPOOL_DTYPE_BFLOAT16, 8'000'000, 128, 128);
    const TensorArg a{"q", &q};
    const auto ranges = split_rows(8'000'000, {&a}, kCudaMaxSpanBytes);
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_EQ(ranges[0].count, 8'000'000);
    EXPECT_TRUE(split_rows(0, {&a}, kCudaMaxSpanBytes).empty());
}

TEST(SplitRows, PaddedRowsAndTheWidestTensorDecide) {
    // Rows 400 bytes apart, 256 of them used: (count - 1) * 400 + 256 <= 4096.
    const kpool_tensor padded = rows_of(KPOOL_DTYPE_BFLOAT16, 1000, 128, 200),
                       narrow = rows_of(KPOOL_DTYPE_INT64, 1000, 1, 1);
    const TensorArg a{"slot_k", &padded}, b{"loc", &narrow};
    const auto ranges = split_rows(1000, {&b, &a}, 4096);
    EXPECT_EQ(ranges[0].count, (4096 - 256) / 400 + 1);
    expect_plan(ranges, 1000, {&a, &b}, 4096);
    EXPECT_EQ(ranges.size(), 100u);
}

TEST(SplitRows, ARowLargerThanTheLimitIsRejected) {
    const kpool_tensor wide = rows_of(KPOOL_DTYPE_BFLOAT16, 10, 4096, 4096);
    const TensorArg a{"slot_k", &wide};
    try {
        (void)split_rows(10, {&a}, 4096);
        FAIL() << "accepted";
    } catch (const kpool::rt::StatusError &e) {
        EXPECT_EQ(e.code(), KPOOL_ERROR_UNSUPPORTED);
        EXPECT_NE(std::string(e.what()).find("slot_k"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kpool_test
