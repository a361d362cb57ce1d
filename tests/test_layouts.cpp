// The GPU families' fwht row layouts (RowLayout: lanes x values in runs) and
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

// The generator under Halide's Mullapudi2016 autoscheduler (its schedule()
// steps aside, the estimates guide it): a twin as the autotuning tool
// builds them, the same bytes as the scheduled kernel.
TEST(AutoscheduledOnCpu, FwhtMatchesTheCpuKernel) {
    std::vector<uint16_t> q = layout_test_rows();
    expect_same(cpu_kernel(q), element_kernel(kpool_cpu_fwht_autoscheduled, q));
}

}  // namespace
