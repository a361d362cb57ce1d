// Rows holding NaN, infinities and sums that overflow are inside the
// contract (SPEC step 4, "Non-finite values"): every max and min ignores NaN.
// The rules from first principles on the scalar reference and the shared
// numerics, then every CPU kernel against the reference on such rows, byte
// for byte (nonfinite_inputs.h; test_gpu_nonfinite.cpp does the same on the
// GPU in both arithmetics).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "HalideBuffer.h"
#include "kpool_cpu_numerics_probe.h"
#include "nonfinite_inputs.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;

const float kFloorScale = kpool_ref::ue8m0_scale(1e-4f * float(1.0 / 448.0));

kpool_ref::Row row_of(float fill) {
    kpool_ref::Row r;
    r.fill(fill);
    return r;
}

// ---------------------------------------------------------------------------
// The rules, on the scalar reference and the shared numerics
// ---------------------------------------------------------------------------

TEST(NonFiniteRules, ClampIgnoresNaN) {
    // min(max(NaN, -448), 448) = -448 with NaN-ignoring max and min.
    EXPECT_EQ(kpool_ref::fp8_quantize(kNaN, 1.0f), 0xFE);
    EXPECT_EQ(kpool_ref::fp8_quantize(-kNaN, 1.0f), 0xFE);
    EXPECT_EQ(kpool_ref::fp8_quantize(kInf, 1.0f), 0x7E);
    EXPECT_EQ(kpool_ref::fp8_quantize(-kInf, 1.0f), 0xFE);
    // An infinite scale: finite / inf = +-0, inf / inf = NaN -> -448.
    EXPECT_EQ(kpool_ref::fp8_quantize(3.0f, kInf), 0x00);
    EXPECT_EQ(kpool_ref::fp8_quantize(-3.0f, kInf), 0x80);
    EXPECT_EQ(kpool_ref::fp8_quantize(kInf, kInf), 0xFE);
}

TEST(NonFiniteRules, AbsmaxIgnoresNaN) {
    kpool_ref::Row x = row_of(0.5f);
    x[3] = kNaN;
    // A NaN element never raises the absmax (here 0.5).
    EXPECT_EQ(kpool_ref::fp8_scale(x, true), kpool_ref::ue8m0_scale(0.5f * float(1.0 / 448.0)));
    EXPECT_EQ(kpool_ref::fp8_scale(x, false), 0.5f * float(1.0 / 448.0));
    // NaN only: absmax 1e-4.
    EXPECT_EQ(kpool_ref::fp8_scale(row_of(kNaN), true), kFloorScale);
    EXPECT_EQ(kpool_ref::fp8_scale(row_of(kNaN), false), 1e-4f * float(1.0 / 448.0));
    // An infinity: an infinite scale.
    x[7] = -kInf;
    EXPECT_EQ(kpool_ref::fp8_scale(x, true), kInf);
    EXPECT_EQ(kpool_ref::fp8_scale(x, false), kInf);
}

// The probe applies the kernels' fp8_scale to one value as a row's absmax.
TEST(NonFiniteRules, KernelScaleOfNaNAbsmaxIsTheFloor) {
    std::vector<float> x = {kNaN, -kNaN, kInf, 0.0f};
    std::vector<float> ue8m0(x.size()), linear(x.size()), exp_f32(x.size());
    std::vector<uint8_t> e4m3(x.size());
    std::vector<uint16_t> bf16(x.size());
    const int n = int(x.size());
    Halide::Runtime::Buffer<float> in(x.data(), n), u(ue8m0.data(), n), l(linear.data(), n), e(exp_f32.data(), n);
    Halide::Runtime::Buffer<uint8_t> codes(e4m3.data(), n);
    Halide::Runtime::Buffer<uint16_t> b(bf16.data(), n);
    ASSERT_EQ(kpool_cpu_numerics_probe(in, codes, b, u, l, e), 0);
    for (int i : {0, 1, 3}) {
        EXPECT_EQ(ue8m0[i], kFloorScale) << "absmax " << x[i];
        EXPECT_EQ(linear[i], 1e-4f * float(1.0 / 448.0)) << "absmax " << x[i];
    }
    EXPECT_EQ(ue8m0[2], kInf);
    EXPECT_EQ(linear[2], kInf);
}

// ---------------------------------------------------------------------------
// fwht128_quant_fp8
// ---------------------------------------------------------------------------

class NonFiniteFwht : public ::testing::TestWithParam<kpool_dtype> {};

TEST_P(NonFiniteFwht, MatchesReference) {
    std::mt19937 rng(61);
    const int64_t rows = 2 * 8 + 3;
    const HostTensor q = make_nonfinite_q(rng, rows);
    HostTensor want8(GetParam(), {rows, kD}), wants(KPOOL_DTYPE_FLOAT32, {rows});
    want8.fill_random_bytes(rng);
    wants.fill_random_bytes(rng);
    HostTensor got8 = want8, gots = wants;
    const kpool_tensor qd = q.desc(), w8 = want8.desc(), ws = wants.desc(), g8 = got8.desc(), gs = gots.desc();
    kpool_ref::fwht128_quant_fp8(&qd, &w8, &ws);
    kpool_status st{};
    const kpool_exec ex{nullptr};
    ASSERT_KPOOL_OK(kpool_fwht128_quant_fp8(&qd, &g8, &gs, &ex, &st), st);
    EXPECT_BYTES_EQ(want8, got8);
    EXPECT_BYTES_EQ(wants, gots);

    // What the rules give, independently of the reference.
    for (int64_t r = 0; r < rows; ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        const FwhtRow kind = kFwhtRows[r % 8];
        const float scale = wants.get<float>({r});
        int all_fe = 0, zeros = 0;
        for (int d = 0; d < kD; ++d) {
            const uint8_t c = want8.get<uint8_t>({r, d});
            all_fe += c == 0xFE;
            zeros += (c & 0x7F) == 0;
        }
        switch (kind) {
            case FwhtRow::kOneNaN:
            case FwhtRow::kAllNaN:  // NaN everywhere after the rotation: absmax 1e-4, codes -448
                EXPECT_EQ(scale, kFloorScale);
                EXPECT_EQ(all_fe, kD);
                break;
            case FwhtRow::kPlusInf:
            case FwhtRow::kMinusInf:
            case FwhtRow::kBothInfs:  // +-inf or NaN everywhere: scale inf, inf / inf = NaN
                EXPECT_EQ(scale, kInf);
                EXPECT_EQ(all_fe, kD);
                break;
            case FwhtRow::kRotationOverflow:
            case FwhtRow::kHalfHuge:  // some outputs overflow, the finite ones encode as +-0 (x / inf)
                EXPECT_EQ(scale, kInf);
                EXPECT_GT(all_fe, 0);
                EXPECT_GT(zeros, 0);
                EXPECT_EQ(all_fe + zeros, kD);
                break;
            case FwhtRow::kFinite:
                EXPECT_TRUE(std::isfinite(scale));
                break;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Codes, NonFiniteFwht, Values(KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8),
                         [](const ::testing::TestParamInfo<kpool_dtype> &info) { return dtype_tag(info.param); });

// ---------------------------------------------------------------------------
// compress_and_write_cache: the cache path and the returned rows
// ---------------------------------------------------------------------------

using CompressNonFiniteParam = std::tuple<int /*P*/, kpool_dtype /*score*/, bool /*round_scale*/, bool /*ape NaN*/>;
class NonFiniteCompress : public ::testing::TestWithParam<CompressNonFiniteParam> {};

TEST_P(NonFiniteCompress, MatchesReference) {
    const auto [P, score_dtype, round_scale, ape_nan] = GetParam();
    std::mt19937 rng(71 + P);
    const int64_t n = 2 * kPoolRowKinds, slots = 64;
    const CompressInputs in = make_nonfinite_compress(rng, n, P, score_dtype, slots, ape_nan);
    HostTensor cache0 = make_kv_cache(slots / 16, 16, true);
    cache0.fill_random_bytes(rng);
    HostTensor codes0(KPOOL_DTYPE_UINT8, {n, kD}), scales0(KPOOL_DTYPE_FLOAT32, {n});
    codes0.fill_random_bytes(rng);
    scales0.fill_random_bytes(rng);
    const kpool_tensor k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(), l = in.loc.desc();

    // The cache path and the rows path, each on its own (two kernels).
    for (const bool write : {true, false}) {
        SCOPED_TRACE(write ? "write_cache" : "return_compressed");
        HostTensor want_cache = cache0, got_cache = cache0, want_codes = codes0, got_codes = codes0,
                   want_scales = scales0, got_scales = scales0;
        const kpool_tensor wc = want_cache.desc(), gc = got_cache.desc(), wk = want_codes.desc(),
                           gk = got_codes.desc(), ws = want_scales.desc(), gs = got_scales.desc();
        kpool_ref::compress_and_write_cache(write ? &wc : nullptr, &k, &s, &a, &l, nullptr, write ? nullptr : &wk,
                                            write ? nullptr : &ws, P, kD, round_scale, write);
        kpool_status st{};
        const kpool_exec ex{nullptr};
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(write ? &gc : nullptr, &k, &s, &a, &l, nullptr,
                                                       write ? nullptr : &gk, write ? nullptr : &gs, P, kD,
                                                       round_scale, write, &ex, &st),
                        st);
        EXPECT_BYTES_EQ(want_cache, got_cache);
        EXPECT_BYTES_EQ(want_codes, got_codes);
        EXPECT_BYTES_EQ(want_scales, got_scales);
        if (write) continue;
        // The rows whose outcome the rules fix: a NaN in the pooled row
        // spreads through the rotation (codes 0xFE, scale the floor); an
        // infinite one gives scale inf. -inf in half the slots is finite.
        for (int64_t i = 0; i < n; ++i) {
            SCOPED_TRACE("pool " + std::to_string(i));
            const float scale = want_scales.get<float>({i});
            switch (PoolRow(i % kPoolRowKinds)) {
                case PoolRow::kNaNKey:
                case PoolRow::kNaNScore:
                case PoolRow::kPlusInfScore:
                case PoolRow::kAllMinusInfDim:
                case PoolRow::kAllNaNScoreDim:
                    EXPECT_EQ(scale, round_scale ? kFloorScale : 1e-4f * float(1.0 / 448.0));
                    for (int d = 0; d < kD; ++d) ASSERT_EQ(want_codes.get<uint8_t>({i, d}), 0xFE) << "dim " << d;
                    break;
                case PoolRow::kMinusInfScore:
                case PoolRow::kFinite:
                    if (!ape_nan) EXPECT_TRUE(std::isfinite(scale));
                    break;
                default: break;
            }
        }
    }
}

// "P4_bf16_ue8m0_apeNaN"
std::string compress_name(const ::testing::TestParamInfo<CompressNonFiniteParam> &info) {
    const auto &[P, score_dtype, round_scale, ape_nan] = info.param;
    return "P" + std::to_string(P) + "_" + dtype_tag(score_dtype) + (round_scale ? "_ue8m0" : "_linear") +
           (ape_nan ? "_apeNaN" : "_apeFinite");
}

INSTANTIATE_TEST_SUITE_P(Pools, NonFiniteCompress,
                         Combine(Values(4, 16), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32), Values(false, true),
                                 Values(false, true)),
                         compress_name);

// ---------------------------------------------------------------------------
// decode_update_and_maybe_write_cache_batched
// ---------------------------------------------------------------------------

using DecodeNonFiniteParam = std::tuple<int /*P*/, bool /*round_scale*/, bool /*ape NaN*/>;
class NonFiniteDecode : public ::testing::TestWithParam<DecodeNonFiniteParam> {};

TEST_P(NonFiniteDecode, MatchesReference) {
    const auto [P, round_scale, ape_nan] = GetParam();
    std::mt19937 rng(81 + P);
    const int64_t B = 2 * kDecodeRowKinds, ring = 2 * P;
    const DecodeInputs in = make_nonfinite_decode(rng, B, P, ring, ape_nan);
    HostTensor cache0 = make_kv_cache(1, 16 * ((B + 15) / 16), false);
    cache0.fill_random_bytes(rng);
    const HostTensor tail0 = make_nonfinite_tail(rng, B, ring);
    HostTensor want_cache = cache0, got_cache = cache0, want_tail = tail0, got_tail = tail0;
    const kpool_tensor tsm = in.tail_slot_mapping.desc(), k = in.key.desc(), s = in.slot_score.desc(),
                       a = in.ape.desc(), sm = in.slot_mapping.desc(), pos = in.positions.desc();
    const kpool_tensor wc = want_cache.desc(), gc = got_cache.desc(), wt = want_tail.desc(), gt = got_tail.desc();
    kpool_ref::decode_update_and_maybe_write_cache_batched(&wc, &wt, &tsm, &k, &s, &a, &sm, &pos, P, kD, round_scale);
    kpool_status st{};
    const kpool_exec ex{nullptr};
    ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(&gc, &gt, &tsm, &k, &s, &a, &sm, &pos, P, kD,
                                                                      round_scale, &ex, &st),
                    st);
    EXPECT_BYTES_EQ(want_cache, got_cache);
    EXPECT_BYTES_EQ(want_tail, got_tail);
    // The NaN rows (requests 0 and 1, cache slots 0 and 1 of the one
    // planar page) are all 0xFE: the inputs reached the kernels.
    for (int64_t b = 0; b < 2; ++b) {
        for (int d = 0; d < kD; ++d) ASSERT_EQ(want_cache.bytes()[b * kD + d], 0xFE) << "request " << b << " dim " << d;
    }
}

// "P4_ue8m0_apeNaN"
std::string decode_name(const ::testing::TestParamInfo<DecodeNonFiniteParam> &info) {
    const auto &[P, round_scale, ape_nan] = info.param;
    return "P" + std::to_string(P) + (round_scale ? "_ue8m0" : "_linear") + (ape_nan ? "_apeNaN" : "_apeFinite");
}

INSTANTIATE_TEST_SUITE_P(Pools, NonFiniteDecode, Combine(Values(4, 16), Values(false, true), Values(false, true)),
                         decode_name);

}  // namespace
}  // namespace kpool_test
