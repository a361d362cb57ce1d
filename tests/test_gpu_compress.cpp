// compress_and_write_cache on the GPU: GpuCompress against the CPU, bit for
// bit; GpuTritonArithmetic, the Triton reference's arithmetic against the
// exact CPU kernels.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

// compress_and_write_cache: P x score dtype x mode; the page size (16 / 64),
// the padded page stride and round_scale vary with the mode.
using GpuCompressParam = std::tuple<int, kpool_dtype, CompressMode>;
class GpuCompress : public GpuParamTest<GpuCompressParam> {};

TEST_P(GpuCompress, MatchesCpu) {
    const auto [P, score_dtype, mode] = GetParam();
    const int m = static_cast<int>(mode);
    const int block_size = m % 2 ? 64 : 16;
    const bool padded = m % 3 != 0;
    const bool round_scale = (m + P) % 2 == 0;
    std::mt19937 rng(2000 + P * 17 + m * 3 + (score_dtype == KPOOL_DTYPE_FLOAT32));
    const int64_t n = 37;
    const int64_t num_blocks = (3 * n) / block_size + 2;
    const bool masked = mode == CompressMode::kWriteMasked;
    const bool write_cache = mode == CompressMode::kWrite || masked || mode == CompressMode::kWriteAndReturn;
    const bool ret = !write_cache || mode == CompressMode::kWriteAndReturn;
    const bool cache_given = mode != CompressMode::kReturnOnlyNoCache;

    CompressCase c(gpu(), rng, n, P, score_dtype, num_blocks, block_size, padded);
    const kpool_dtype ck_dtype = block_size == 16 ? KPOOL_DTYPE_FLOAT8_E4M3FN : KPOOL_DTYPE_UINT8;
    Mirrored ck(gpu(), random_bytes_like(rng, HostTensor(ck_dtype, {n, kD}))),
        cs(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_FLOAT32, {n})));
    auto opt_on = [](Mirrored &t, bool present, Side s) { return present ? t.on(s) : nullptr; };
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(opt_on(c.cache, cache_given, s), c.slot_k.on(s),
                                                  c.slot_score.on(s), c.ape.on(s), c.loc.on(s),
                                                  opt_on(c.write_mask, masked, s), opt_on(ck, ret, s),
                                                  opt_on(cs, ret, s), P, kD, round_scale, write_cache, ex, st);
        },
        {{"kv_cache", &c.cache}, {"compressed_k", &ck}, {"compressed_scale", &cs}});
    if (write_cache) {
        EXPECT_TRUE(c.cache.cpu().bytes() != c.cache0.bytes()) << "the test wrote nothing";
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuCompress,
                         Combine(ValuesIn(kGpuPoolSizes), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32),
                                 Values(CompressMode::kWrite, CompressMode::kWriteMasked,
                                        CompressMode::kWriteAndReturn, CompressMode::kReturnOnly,
                                        CompressMode::kReturnOnlyNoCache)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) + "_" +
                                    mode_tag(std::get<2>(info.param));
                         });

// Rows that do not start 16 bytes apart (keys and scores 130 elements
// apart, ape 129) take the CUDA kernel for any rows (element loads, the
// round_scale choice made per code); contiguous rows (GpuCompress above)
// take the aligned kernels (4 ape values per 16-byte load). Both are the
// CPU's bytes, with and without round_scale.
HostTensor with_row_stride(const HostTensor &t, int64_t row_stride) {
    std::vector<int64_t> shape = t.shape(), strides(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
        strides[i] = (i == static_cast<int>(shape.size()) - 2 ? row_stride : strides[i + 1] * shape[i + 1]);
    }
    HostTensor out(t.dtype(), shape, strides);
    const size_t row_bytes = static_cast<size_t>(shape.back()) * dtype_size(t.dtype());
    const int64_t rows = t.numel() / shape.back();
    for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(out.raw() + r * row_stride * dtype_size(t.dtype()),
                    t.bytes().data() + r * shape.back() * dtype_size(t.dtype()), row_bytes);
    }
    return out;
}

class GpuCompressUnalignedRows : public GpuParamTest<int> {};

TEST_P(GpuCompressUnalignedRows, MatchesCpu) {
    const int P = GetParam();
    std::mt19937 rng(4100 + P);
    const int64_t n = 37, block_size = 64, num_blocks = n / block_size + 2;
    const CompressInputs in = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, num_blocks * block_size);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false))),
        slot_k(gpu(), with_row_stride(in.slot_k, kD + 2)), slot_score(gpu(), with_row_stride(in.slot_score, kD + 2)),
        ape(gpu(), with_row_stride(in.ape, kD + 1)), loc(gpu(), in.loc);
    for (const bool round_scale : {false, true}) {
        run_both(
            [&](Side s, const kpool_exec *ex, kpool_status *st) {
                return kpool_compress_and_write_cache(cache.on(s), slot_k.on(s), slot_score.on(s), ape.on(s),
                                                      loc.on(s), nullptr, nullptr, nullptr, P, kD, round_scale,
                                                      /*write_cache=*/1, ex, st);
            },
            {{"kv_cache", &cache}});
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuCompressUnalignedRows, ValuesIn(kGpuPoolSizes),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

// The words kernels (CUDA, both arithmetics, rows of 16-byte-aligned data
// and strides: contiguous tensors) against the kernel for any rows (the
// same values 130 elements apart, ape 129) in the same arithmetic: the same
// bytes in the cache and the returned rows, bf16 and f32 scores, with and
// without round_scale. (In the exact arithmetic GpuCompress holds both to
// the CPU as well.)
using GpuCompressWordsParam = std::tuple<int, kpool_arithmetic>;
class GpuCompressWords : public GpuParamTest<GpuCompressWordsParam> {};

TEST_P(GpuCompressWords, MatchesTheKernelForAnyRows) {
    const auto [P, arithmetic] = GetParam();
    const int64_t n = 1000, block_size = 64, num_blocks = n / block_size + 2;
    const kpool_exec exec{nullptr, static_cast<int32_t>(arithmetic)};
    for (const kpool_dtype score : {KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32}) {
        std::mt19937 rng(4200 + P);
        const CompressInputs in = make_compress_inputs(rng, n, P, score, num_blocks * block_size);
        const HostTensor cache_before = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false));
        for (const bool round_scale : {false, true}) {
            SCOPED_TRACE(std::string(score == KPOOL_DTYPE_FLOAT32 ? "f32" : "bf16") + " scores, round_scale " +
                         std::to_string(round_scale));
            std::vector<uint8_t> cache_bytes[2], codes[2], scales[2];
            for (const int any_rows : {0, 1}) {
                Mirrored cache(gpu(), cache_before),
                    slot_k(gpu(), any_rows ? with_row_stride(in.slot_k, kD + 2) : in.slot_k),
                    slot_score(gpu(), any_rows ? with_row_stride(in.slot_score, kD + 2) : in.slot_score),
                    ape(gpu(), any_rows ? with_row_stride(in.ape, kD + 1) : in.ape), loc(gpu(), in.loc),
                    ck(gpu(), HostTensor(KPOOL_DTYPE_UINT8, {n, kD})), cs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {n}));
                kpool_status st{};
                ASSERT_EQ(kpool_compress_and_write_cache(cache.on(Side::Gpu), slot_k.on(Side::Gpu),
                                                         slot_score.on(Side::Gpu), ape.on(Side::Gpu),
                                                         loc.on(Side::Gpu), nullptr, ck.on(Side::Gpu),
                                                         cs.on(Side::Gpu), P, kD, round_scale, 1, &exec, &st),
                          KPOOL_OK)
                    << st.message;
                cache.download(), ck.download(), cs.download();
                cache_bytes[any_rows] = cache.gpu_host(), codes[any_rows] = ck.gpu_host();
                scales[any_rows] = cs.gpu_host();
            }
            EXPECT_TRUE(same_bytes("kv_cache (words vs any rows)", cache_bytes[1], cache_bytes[0]));
            EXPECT_TRUE(same_bytes("compressed_k (words vs any rows)", codes[1], codes[0]));
            EXPECT_TRUE(same_bytes("compressed_scale (words vs any rows)", scales[1], scales[0]));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuCompressWords,
                         Combine(ValuesIn(kGpuPoolSizes), Values(KPOOL_ARITHMETIC_EXACT, KPOOL_ARITHMETIC_TRITON)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) +
                                    (std::get<1>(info.param) == KPOOL_ARITHMETIC_TRITON ? "_triton" : "_exact");
                         });

// KPOOL_ARITHMETIC_TRITON: the reference's own instructions, checked bit
// for bit against the reference itself by the Python side-by-side test
// (python/tests/test_gpu_side_by_side.py). Here, against the exact CPU
// kernels: the same slots written and nothing else, the same scales but
// where a ue8m0 boundary moved, and codes that differ only where an
// approximate exp or division moved the pooled values by an ulp: in few rows
// (0.1-0.2% on the H200), a few codes each (a wrong row would differ in most
// of its 128). At least one row must differ, or the triton variant did not
// run; but at P = 1 none may: a pool of one token has the weight exp(0) / 1
// = 1 exactly in both arithmetics, so its row is the key's own.
class GpuTritonArithmetic : public GpuParamTest<int> {};

TEST_P(GpuTritonArithmetic, CompressDiffersFromExactInFewCodesOfFewRows) {
    const int P = GetParam();
    const int64_t n = 16384, block_size = 64, num_blocks = n / block_size + 1;
    std::mt19937 rng(5000 + P);
    CompressCase c(gpu(), rng, n, P, KPOOL_DTYPE_BFLOAT16, num_blocks, block_size, /*padded=*/true);
    Mirrored ck(gpu(), HostTensor(KPOOL_DTYPE_UINT8, {n, kD})), cs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {n}));
    const kpool_exec exact{nullptr, KPOOL_ARITHMETIC_EXACT}, triton{nullptr, KPOOL_ARITHMETIC_TRITON};
    for (Side s : {Side::Cpu, Side::Gpu}) {
        kpool_status st{};
        const kpool_status_code rc = kpool_compress_and_write_cache(
            c.cache.on(s), c.slot_k.on(s), c.slot_score.on(s), c.ape.on(s), c.loc.on(s), nullptr, ck.on(s),
            cs.on(s), P, kD, 1, 1, s == Side::Cpu ? &exact : &triton, &st);
        ASSERT_EQ(rc, KPOOL_OK) << st.message;
    }
    c.cache.download(), ck.download(), cs.download();
    // A row's scale moves only if its absmax crosses a power of two: by 2x.
    int64_t rows_differing = 0, scales_differing = 0, most_codes = 0;
    for (int64_t r = 0; r < n; ++r) {
        const float a_scale = cs.cpu().get<float>({r});
        float b_scale;
        std::memcpy(&b_scale, cs.gpu_host().data() + 4 * r, 4);
        if (a_scale != b_scale) {
            EXPECT_TRUE(b_scale == 2 * a_scale || a_scale == 2 * b_scale) << "row " << r << ": scale " << b_scale
                                                                          << ", exact " << a_scale;
            ++scales_differing, ++rows_differing;
            continue;
        }
        int64_t codes = 0;
        for (int d = 0; d < kD; ++d) {
            const size_t at = static_cast<size_t>(r * kD + d);
            codes += ck.cpu().bytes()[at] != ck.gpu_host()[at];
        }
        rows_differing += codes > 0;
        most_codes = std::max(most_codes, codes);
    }
    std::printf("P=%d: %lld of %lld rows differ from exact (%lld by their scale), at most %lld codes of a row\n",
                P, static_cast<long long>(rows_differing), static_cast<long long>(n),
                static_cast<long long>(scales_differing), static_cast<long long>(most_codes));
    if (P == 1) {
        EXPECT_EQ(rows_differing, 0) << "a pool of one token differs between the arithmetics";
    } else {
        EXPECT_GT(rows_differing, 0) << "no row differs: did the triton variant run?";
    }
    EXPECT_LT(rows_differing, n / 100);
    EXPECT_LE(most_codes, 32);
    EXPECT_LE(scales_differing, 2);
    // The cache holds the same rows: patch the returned rows' codes into the
    // CPU's cache image, then every byte must agree.
    std::vector<uint8_t> expected = c.cache.cpu().bytes();
    const int64_t page_stride = c.cache.cpu().strides()[0];
    for (int64_t r = 0; r < n; ++r) {
        const int64_t slot = c.in.loc.get<int64_t>({r});
        if (slot < 0) continue;
        const int64_t at = (slot / block_size) * page_stride + (slot % block_size) * kD;
        std::copy_n(ck.gpu_host().begin() + r * kD, kD, expected.begin() + at);
    }
    EXPECT_TRUE(same_bytes("kv_cache (GPU triton vs CPU exact, returned rows patched in)", expected,
                           std::vector<uint8_t>(c.cache.gpu_host())));
    // KPOOL_ARITHMETIC_DEFAULT on CUDA tensors is the reference's arithmetic:
    // the same call again with it leaves every byte as triton wrote it (the
    // exact arithmetic would rewrite the rows counted above).
    const std::vector<uint8_t> triton_cache = c.cache.gpu_host(), triton_codes = ck.gpu_host(),
                               triton_scales = cs.gpu_host();
    const kpool_exec by_default{nullptr, KPOOL_ARITHMETIC_DEFAULT};
    kpool_status st{};
    ASSERT_EQ(kpool_compress_and_write_cache(c.cache.on(Side::Gpu), c.slot_k.on(Side::Gpu),
                                             c.slot_score.on(Side::Gpu), c.ape.on(Side::Gpu), c.loc.on(Side::Gpu),
                                             nullptr, ck.on(Side::Gpu), cs.on(Side::Gpu), P, kD, 1, 1, &by_default,
                                             &st),
              KPOOL_OK)
        << st.message;
    c.cache.download(), ck.download(), cs.download();
    EXPECT_TRUE(same_bytes("kv_cache (GPU default vs triton)", triton_cache, c.cache.gpu_host()));
    EXPECT_TRUE(same_bytes("compressed_k (GPU default vs triton)", triton_codes, ck.gpu_host()));
    EXPECT_TRUE(same_bytes("compressed_scale (GPU default vs triton)", triton_scales, cs.gpu_host()));
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuTritonArithmetic, ValuesIn(kGpuPoolSizes),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

}  // namespace
}  // namespace kpool_test
