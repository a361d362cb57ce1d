// GpuFwht: fwht128_quant_fp8 on the GPU against the CPU, bit for bit.
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;

// fwht128_quant_fp8: rows, q_scale [rows, 1] or [rows], e4m3 or uint8 codes.
class GpuFwht : public GpuParamTest<FwhtParam> {};

TEST_P(GpuFwht, MatchesCpu) {
    const auto [rows, scale_2d, fp8_dtype] = GetParam();
    std::mt19937 rng(100 + rows * 3 + scale_2d);
    Mirrored q(gpu(), make_fwht_q(rng, rows));
    Mirrored fp8(gpu(), random_bytes_like(rng, HostTensor(fp8_dtype, {rows, kD})));
    Mirrored scale(gpu(), random_bytes_like(
                              rng, HostTensor(KPOOL_DTYPE_FLOAT32, scale_2d ? std::vector<int64_t>{rows, 1}
                                                                            : std::vector<int64_t>{rows})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_fwht128_quant_fp8(q.on(s), fp8.on(s), scale.on(s), ex, st);
        },
        {{"q_fp8", &fp8}, {"q_scale", &scale}});
}

// The same rows starting one element into their buffers (q 2 bytes, the
// codes 1 byte past a 16-byte boundary, every row off alignment): views a
// caller may pass, unlike the fresh allocations of the test above.
TEST_P(GpuFwht, RowsNotStarting16ByteAlignedMatchCpu) {
    const auto [rows, scale_2d, fp8_dtype] = GetParam();
    std::mt19937 rng(200 + rows * 3 + scale_2d);
    Mirrored q(gpu(), make_fwht_q(rng, rows + 1));
    Mirrored fp8(gpu(), random_bytes_like(rng, HostTensor(fp8_dtype, {rows + 1, kD})));
    Mirrored scale(gpu(), random_bytes_like(
                              rng, HostTensor(KPOOL_DTYPE_FLOAT32, scale_2d ? std::vector<int64_t>{rows, 1}
                                                                            : std::vector<int64_t>{rows})));
    const int64_t view_rows = rows;  // (a structured binding cannot be captured in C++17)
    auto one_element_in = [&](const Mirrored &t, Side s, int64_t element_bytes) {
        kpool_tensor view = *t.on(s);
        view.data = static_cast<uint8_t *>(view.data) + element_bytes;
        view.shape[0] = view_rows;
        return view;
    };
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            const kpool_tensor q_view = one_element_in(q, s, 2), fp8_view = one_element_in(fp8, s, 1);
            return kpool_fwht128_quant_fp8(&q_view, &fp8_view, scale.on(s), ex, st);
        },
        {{"q_fp8", &fp8}, {"q_scale", &scale}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuFwht,
                         Combine(Values(1, 7, 300), Values(false, true),
                                 Values(KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8)),
                         ParamName());

}  // namespace
}  // namespace kpool_test
