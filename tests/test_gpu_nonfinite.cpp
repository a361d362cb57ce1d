// GpuNonFinite: rows holding NaN, infinities and overflowing sums
// (nonfinite_inputs.h, SPEC step 4) on the GPU. In the exact arithmetic
// every byte against the CPU (which test_nonfinite.cpp checks against the
// scalar reference); in the Triton arithmetic the rows the rules alone fix
// (NaN or infinity in every rotated value) byte for byte against the CPU, the
// others need only be written where the CPU writes them.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_fixtures.h"
#include "nonfinite_inputs.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;

const kpool_exec kExact{nullptr, KPOOL_ARITHMETIC_EXACT}, kTriton{nullptr, KPOOL_ARITHMETIC_TRITON};

class GpuNonFinite : public GpuTest {};

TEST_F(GpuNonFinite, FwhtMatchesCpu) {
    std::mt19937 rng(62);
    const int64_t rows = 3 * 8 + 5;
    Mirrored q(gpu(), make_nonfinite_q(rng, rows));
    Mirrored fp8(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_UINT8, {rows, kD})));
    Mirrored scale(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_FLOAT32, {rows})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_fwht128_quant_fp8(q.on(s), fp8.on(s), scale.on(s), ex, st);
        },
        {{"q_fp8", &fp8}, {"q_scale", &scale}});
}

// The codes and scale of row r of the GPU's and the CPU's returned rows.
::testing::AssertionResult same_row(Mirrored &codes, Mirrored &scales, int64_t r) {
    const std::vector<uint8_t> &cpu_codes = codes.cpu().bytes(), &cpu_scales = scales.cpu().bytes();
    if (std::memcmp(cpu_codes.data() + r * kD, codes.gpu_host().data() + r * kD, kD) != 0 ||
        std::memcmp(cpu_scales.data() + r * 4, scales.gpu_host().data() + r * 4, 4) != 0) {
        return ::testing::AssertionFailure() << "row " << r << " differs";
    }
    return ::testing::AssertionSuccess();
}

using GpuCompressParam = std::tuple<int /*P*/, kpool_dtype /*score*/, bool /*round_scale*/, bool /*ape NaN*/>;
class GpuNonFiniteCompress : public GpuParamTest<GpuCompressParam> {};

TEST_P(GpuNonFiniteCompress, BothArithmetics) {
    // (Not a structured binding: the lambdas below capture them.)
    const int P = std::get<0>(GetParam());
    const kpool_dtype score_dtype = std::get<1>(GetParam());
    const bool round_scale = std::get<2>(GetParam()), ape_nan = std::get<3>(GetParam());
    std::mt19937 rng(72 + P);
    const int64_t n = 3 * kPoolRowKinds, slots = 64;
    const CompressInputs in = make_nonfinite_compress(rng, n, P, score_dtype, slots, ape_nan);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(slots / 16, 16, true)));
    Mirrored k(gpu(), in.slot_k), s(gpu(), in.slot_score), a(gpu(), in.ape), l(gpu(), in.loc);
    Mirrored codes(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_UINT8, {n, kD})));
    Mirrored scales(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_FLOAT32, {n})));
    auto call = [&](Side side, const kpool_exec *ex, kpool_status *st, bool write) {
        return kpool_compress_and_write_cache(write ? cache.on(side) : nullptr, k.on(side), s.on(side), a.on(side),
                                              l.on(side), nullptr, write ? nullptr : codes.on(side),
                                              write ? nullptr : scales.on(side), P, kD, round_scale, write, ex, st);
    };
    // The exact arithmetic: every byte, both kernels (the cache path, the rows path).
    for (const bool write : {true, false}) {
        SCOPED_TRACE(write ? "exact, write_cache" : "exact, return_compressed");
        run_both([&](Side side, const kpool_exec *, kpool_status *st) { return call(side, &kExact, st, write); },
                 {{"kv_cache", &cache}, {"compressed_k", &codes}, {"compressed_scale", &scales}});
    }
    // The Triton arithmetic: the returned rows the rules fix, byte for byte.
    kpool_status st{};
    ASSERT_EQ(call(Side::Gpu, &kTriton, &st, false), KPOOL_OK) << st.message;
    codes.download(), scales.download();
    for (int64_t i = 0; i < n; ++i) {
        if (!ape_nan && !pool_row_fixed_by_rules(PoolRow(i % kPoolRowKinds))) continue;
        EXPECT_TRUE(same_row(codes, scales, i)) << "triton, pool kind " << i % kPoolRowKinds;
    }
}

std::string compress_name(const ::testing::TestParamInfo<GpuCompressParam> &info) {
    const auto &[P, score_dtype, round_scale, ape_nan] = info.param;
    return "P" + std::to_string(P) + "_" + dtype_tag(score_dtype) + (round_scale ? "_ue8m0" : "_linear") +
           (ape_nan ? "_apeNaN" : "_apeFinite");
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuNonFiniteCompress,
                         Combine(Values(4, 8, 16), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32),
                                 Values(false, true), Values(false, true)),
                         compress_name);

using GpuDecodeParam = std::tuple<int /*P*/, bool /*round_scale*/, bool /*ape NaN*/>;
class GpuNonFiniteDecode : public GpuParamTest<GpuDecodeParam> {};

TEST_P(GpuNonFiniteDecode, BothArithmetics) {
    // (Not a structured binding: the lambdas below capture them.)
    const int P = std::get<0>(GetParam());
    const bool round_scale = std::get<1>(GetParam()), ape_nan = std::get<2>(GetParam());
    std::mt19937 rng(82 + P);
    const int64_t B = 3 * kDecodeRowKinds, ring = 2 * P, block_size = 16, pages = (B + block_size - 1) / block_size;
    DecodeCase c(gpu(), rng, make_nonfinite_decode(rng, B, P, ring, ape_nan), ring, B, pages, block_size, false);
    const HostTensor tail0 = make_nonfinite_tail(rng, B, ring);
    c.tail.assign(tail0);
    c.tail.upload();
    run_both([&](Side s, const kpool_exec *, kpool_status *st) { return c.call(s, P, round_scale, &kExact, st); },
             {{"kv_cache", &c.cache}, {"tail_kv_cache", &c.tail}});

    // The Triton arithmetic from the same caches: the rows the rules fix.
    const std::vector<uint8_t> exact_cache = c.cache.cpu().bytes();
    c.cache.assign(c.cache0);
    c.tail.assign(tail0);
    c.cache.upload(), c.tail.upload();
    kpool_status st{};
    ASSERT_EQ(c.call(Side::Gpu, P, round_scale, &kTriton, &st), KPOOL_OK) << st.message;
    c.cache.download();
    for (int64_t b = 0; b < B; ++b) {
        if (!ape_nan && !decode_row_fixed_by_rules(int(b % kDecodeRowKinds))) continue;
        const int64_t codes = (b / block_size) * c.cache.cpu().strides()[0] + (b % block_size) * kD;
        const int64_t scale = (b / block_size) * c.cache.cpu().strides()[0] + block_size * kD + (b % block_size) * 4;
        EXPECT_EQ(std::memcmp(exact_cache.data() + codes, c.cache.gpu_host().data() + codes, kD), 0)
            << "triton, request " << b << " (kind " << b % kDecodeRowKinds << "): codes";
        EXPECT_EQ(std::memcmp(exact_cache.data() + scale, c.cache.gpu_host().data() + scale, 4), 0)
            << "triton, request " << b << ": scale";
    }
}

std::string decode_name(const ::testing::TestParamInfo<GpuDecodeParam> &info) {
    const auto &[P, round_scale, ape_nan] = info.param;
    return "P" + std::to_string(P) + (round_scale ? "_ue8m0" : "_linear") + (ape_nan ? "_apeNaN" : "_apeFinite");
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuNonFiniteDecode, Combine(Values(4, 8, 16), Values(false, true), Values(false, true)),
                         decode_name);

}  // namespace
}  // namespace kpool_test
