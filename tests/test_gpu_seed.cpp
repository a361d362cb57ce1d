// GpuSeed: seed_tail_cache on the GPU against the CPU, bit for bit.
#include <random>
#include <string>
#include <tuple>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

// seed_tail_cache: P x RING (P, 2P) x tslot dtype x padded tail strides.
class GpuSeed : public GpuParamTest<SeedParam> {};

TEST_P(GpuSeed, MatchesCpu) {
    const auto [P, ring_mult, tslot_dtype, padded] = GetParam();
    const int64_t ring = int64_t(P) * ring_mult, num_blocks = 11;
    std::mt19937 rng(3000 + P * 13 + ring_mult * 5 + padded + 2 * (tslot_dtype == KPOOL_DTYPE_INT64));
    const HostTensor tail0 = random_bytes_like(rng, make_tail_cache(num_blocks, ring, padded));
    SeedInputs in = make_seed_inputs(rng, P, ring, tslot_dtype, num_blocks);
    Mirrored tail(gpu(), tail0), key(gpu(), in.key), gate(gpu(), in.gate_score), tslot(gpu(), in.tslot);
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_seed_tail_cache(tail.on(s), key.on(s), gate.on(s), tslot.on(s), P, kD, ex, st);
        },
        {{"tail_kv_cache", &tail}});
    EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes()) << "the test wrote nothing";
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuSeed,
                         Combine(ValuesIn(kGpuPoolSizes), Values(1, 2),
                                 Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64), Values(false, true)),
                         ParamName());

}  // namespace
}  // namespace kpool_test
