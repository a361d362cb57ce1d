// The GPU families' fwht row layouts (RowLayout: lanes x values in runs),
// compress's words layout, and
// the words form of the kernel (4-byte words of bf16 pairs in, 8-byte words
// of codes out), built for the CPU from the same generators (CMakeLists.txt,
// kpool_cpu_fwht*_as_<family>): the algorithm each GPU kernel runs, here
// byte for byte against the CPU kernel; and an autoscheduled twin. (A schedule cannot change what an
// algorithm computes; what differs per family is the algorithm's layout.
// The sm_90 e4m3 instruction itself is checked on the GPU, GpuFwht.)
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "HalideBuffer.h"
#include "kpool_cpu_fwht_autoscheduled.h"
#include "kpool_layout_kernels.inc"  // KPOOL_FOR_EACH_LAYOUT_FAMILY(X): X(family, element kernel, words kernel)
#include "kpool_cpu_compress_words_as_sm90_p16_f32.h"
#include "kpool_cpu_compress_words_as_sm90_p4_bf16.h"
#include "test_util.h"

namespace {

using Halide::Runtime::Buffer;
using namespace kpool_test;

constexpr int kRows = 300;

// Random rows, and the finite edge rows of FwhtTest: zeros, tiny, huge, one
// spike, alternating +-448. (Non-finite rows are outside the bit-exactness
// contract, docs/behaviour.md: a NaN's absmax depends on the reduction order.)
std::vector<uint16_t> layout_test_rows() {
    std::mt19937 rng(77);
    std::vector<uint16_t> q(size_t(kRows) * kD);
    const float sigma[] = {0.0f, 1e-7f, 1e30f, 1e-30f};
    for (int r = 0; r < kRows; ++r) {
        for (int d = 0; d < kD; ++d) {
            uint16_t v = random_bf16(rng, r < 4 ? sigma[r] : 2.0f);
            if (r == 4) v = bf16_of(d == 17 ? 3e4f : 0.0f);
            if (r == 5) v = bf16_of(d % 2 ? -448.0f : 448.0f);
            q[size_t(r) * kD + d] = v;
        }
    }
    return q;
}

struct Quantized {
    std::vector<uint8_t> codes = std::vector<uint8_t>(size_t(kRows) * kD);
    std::vector<float> scales = std::vector<float>(kRows);
};

// The (codes, scale) output pair: codes (x, row), scales with x stride 0.
template <typename Code>
Buffer<Code> codes_view(Quantized &out, int per_row) {
    return Buffer<Code>(reinterpret_cast<Code *>(out.codes.data()), per_row, kRows);
}
Buffer<float> scales_view(Quantized &out, int per_row) {
    halide_dimension_t dims[2] = {{0, per_row, 0}, {0, kRows, 1}};
    return Buffer<float>(out.scales.data(), 2, dims);
}

Quantized cpu_kernel(std::vector<uint16_t> &q) {
    Quantized out;
    kpool_tensor qd{}, fd{}, sd{};
    const int64_t shape[2] = {kRows, kD};
    qd = kpool_tensor_contiguous(q.data(), KPOOL_DTYPE_BFLOAT16, 2, shape);
    fd = kpool_tensor_contiguous(out.codes.data(), KPOOL_DTYPE_UINT8, 2, shape);
    sd = kpool_tensor_contiguous(out.scales.data(), KPOOL_DTYPE_FLOAT32, 1, shape);
    kpool_status st{};
    EXPECT_EQ(kpool_fwht128_quant_fp8(&qd, &fd, &sd, nullptr, &st), KPOOL_OK) << st.message;
    return out;
}

using ElementKernel = int (*)(halide_buffer_t *, halide_buffer_t *, halide_buffer_t *);

Quantized element_kernel(ElementKernel kernel, std::vector<uint16_t> &q) {
    Quantized out;
    Buffer<uint16_t> in(q.data(), kD, kRows);
    Buffer<uint8_t> codes = codes_view<uint8_t>(out, kD);
    Buffer<float> scales = scales_view(out, kD);
    EXPECT_EQ(kernel(in, codes, scales), 0);
    return out;
}

Quantized words_kernel(ElementKernel kernel, std::vector<uint16_t> &q) {
    Quantized out;
    Buffer<uint32_t> in(reinterpret_cast<uint32_t *>(q.data()), kD / 2, kRows);
    Buffer<uint64_t> codes = codes_view<uint64_t>(out, kD / 8);
    Buffer<float> scales = scales_view(out, kD / 8);
    EXPECT_EQ(kernel(in, codes, scales), 0);
    return out;
}

void expect_same(const Quantized &expected, const Quantized &got) {
    EXPECT_EQ(expected.codes, got.codes);
    EXPECT_EQ(0, std::memcmp(expected.scales.data(), got.scales.data(), sizeof(float) * kRows));
}

// One test per GPU family of the build (the family table, CMakeLists.txt).
#define KPOOL_LAYOUT_TEST(family, element_fn, words_fn)            \
    TEST(GpuLayoutsOnCpu, family##_FwhtMatchesTheCpuKernel) {      \
        std::vector<uint16_t> q = layout_test_rows();              \
        const Quantized expected = cpu_kernel(q);                  \
        expect_same(expected, element_kernel(element_fn, q));      \
        expect_same(expected, words_kernel(words_fn, q));          \
    }
KPOOL_FOR_EACH_LAYOUT_FAMILY(KPOOL_LAYOUT_TEST)
#undef KPOOL_LAYOUT_TEST

// Compress's words layout of sm_90 (bf16 keys and scores as 64-bit words
// of 4, each lane's keys, scores and ape of a slot read by the lane itself):
// the same bytes as the CPU kernel, with and without round_scale.
using CompressRowsKernel = int (*)(halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, bool, bool,
                                   halide_buffer_t *, halide_buffer_t *);

template <typename Score>
void expect_compress_words_match(CompressRowsKernel kernel, int pool_size) {
    constexpr int kPoolsHere = 37;
    std::mt19937 rng(pool_size);
    const size_t n = size_t(kPoolsHere) * pool_size * kD;
    std::vector<uint16_t> keys(n);
    std::vector<Score> scores(n);
    std::vector<float> ape(size_t(pool_size) * kD);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < n; i++) {
        keys[i] = random_bf16(rng, i < size_t(pool_size) * kD ? 1e-30f : 2.0f);
        if constexpr (sizeof(Score) == 2) {
            scores[i] = random_bf16(rng, 3.0f);
        } else {
            scores[i] = 3.0f * normal(rng);
        }
    }
    for (float &a : ape) {
        a = normal(rng);
    }
    const kpool_dtype score_dtype = sizeof(Score) == 2 ? KPOOL_DTYPE_BFLOAT16 : KPOOL_DTYPE_FLOAT32;
    for (bool round_scale : {false, true}) {
        SCOPED_TRACE(round_scale ? "round_scale" : "no round_scale");
        std::vector<uint8_t> want_codes(size_t(kPoolsHere) * kD), got_codes(want_codes.size());
        std::vector<float> want_scales(kPoolsHere), got_scales(kPoolsHere);
        const int64_t rows_shape[3] = {kPoolsHere, pool_size, kD}, ape_shape[2] = {pool_size, kD},
                      codes_shape[2] = {kPoolsHere, kD}, loc_shape[1] = {kPoolsHere};
        std::vector<int64_t> loc(kPoolsHere, 0);
        kpool_tensor k = kpool_tensor_contiguous(keys.data(), KPOOL_DTYPE_BFLOAT16, 3, rows_shape),
                     s = kpool_tensor_contiguous(scores.data(), score_dtype, 3, rows_shape),
                     a = kpool_tensor_contiguous(ape.data(), KPOOL_DTYPE_FLOAT32, 2, ape_shape),
                     l = kpool_tensor_contiguous(loc.data(), KPOOL_DTYPE_INT64, 1, loc_shape),
                     c = kpool_tensor_contiguous(want_codes.data(), KPOOL_DTYPE_UINT8, 2, codes_shape),
                     sc = kpool_tensor_contiguous(want_scales.data(), KPOOL_DTYPE_FLOAT32, 1, loc_shape);
        kpool_status st{};
        ASSERT_EQ(kpool_compress_and_write_cache(nullptr, &k, &s, &a, &l, nullptr, &c, &sc, pool_size, kD,
                                                 round_scale, 0, nullptr, &st),
                  KPOOL_OK)
            << st.message;
        Buffer<uint64_t> key_words(reinterpret_cast<uint64_t *>(keys.data()), kD / 4, pool_size, kPoolsHere);
        Buffer<float> ape_b(ape.data(), kD, pool_size);
        Buffer<uint8_t> codes(got_codes.data(), kD, kPoolsHere);
        halide_dimension_t scale_dims[2] = {{0, kD, 0}, {0, kPoolsHere, 1}};
        Buffer<float> scales(got_scales.data(), 2, scale_dims);
        int rc = 0;
        if constexpr (sizeof(Score) == 2) {
            Buffer<uint64_t> score_words(reinterpret_cast<uint64_t *>(scores.data()), kD / 4, pool_size, kPoolsHere);
            rc = kernel(key_words, score_words, ape_b, round_scale, true, codes, scales);
        } else {
            Buffer<float> score_b(scores.data(), kD, pool_size, kPoolsHere);
            rc = kernel(key_words, score_b, ape_b, round_scale, true, codes, scales);
        }
        ASSERT_EQ(rc, 0);
        EXPECT_EQ(want_codes, got_codes);
        EXPECT_EQ(0, std::memcmp(want_scales.data(), got_scales.data(), sizeof(float) * kPoolsHere));
    }
}

TEST(GpuLayoutsOnCpu, Sm90CompressWordsMatchTheCpuKernel) {
    expect_compress_words_match<uint16_t>(kpool_cpu_compress_words_as_sm90_p4_bf16, 4);
    expect_compress_words_match<float>(kpool_cpu_compress_words_as_sm90_p16_f32, 16);
}

// The generator under Halide's Mullapudi2016 autoscheduler (its schedule()
// steps aside, the estimates guide it): a twin as the autotuning tool
// builds them, the same bytes as the scheduled kernel.
TEST(AutoscheduledOnCpu, FwhtMatchesTheCpuKernel) {
    std::vector<uint16_t> q = layout_test_rows();
    expect_same(cpu_kernel(q), element_kernel(kpool_cpu_fwht_autoscheduled, q));
}

}  // namespace
