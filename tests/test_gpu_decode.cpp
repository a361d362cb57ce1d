// decode_update_and_maybe_write_cache_batched on the GPU against the CPU, bit
// for bit: GpuDecode over the axes an engine varies, GpuDecodeManyRequests
// past grid y.
#include <algorithm>
#include <random>
#include <string>
#include <tuple>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

// decode: P x RING (P, 2P) x next_n 1..6; page size, padding and
// round_scale vary with next_n.
using GpuDecodeParam = std::tuple<int, int, int>;
class GpuDecode : public GpuParamTest<GpuDecodeParam> {};

TEST_P(GpuDecode, MatchesCpu) {
    const auto [P, ring_mult, N] = GetParam();
    // One token per request runs decode's one-kernel variant on CUDA: more
    // requests there, so that several complete a pool.
    const int64_t ring = int64_t(P) * ring_mult, B = N == 1 ? 64 : 5, tail_blocks = B + 4;
    const bool padded = N % 2 == 0;
    const bool round_scale = N % 3 != 0;
    const int block_size = padded ? 64 : 16;
    const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2);
    std::mt19937 rng(4000 + P * 31 + ring_mult * 7 + N);
    DecodeCase d(gpu(), rng, B, N, P, ring, tail_blocks, num_blocks, block_size, padded);
    int64_t cpu_skipped = 0;
    const kpool_status gs = run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            const kpool_status_code rc = d.call(s, P, round_scale, ex, st);
            if (s == Side::Cpu) cpu_skipped = st->skipped_completions;
            return rc;
        },
        {{"kv_cache", &d.cache}, {"tail_kv_cache", &d.tail}});
    expect_device_skipped(gs.skipped_completions, cpu_skipped);
    EXPECT_TRUE(d.tail.cpu().bytes() != d.tail0.bytes()) << "the test stashed nothing";
    if (N >= P || N == 1) {
        EXPECT_TRUE(d.cache.cpu().bytes() != d.cache0.bytes()) << "the test completed no pool";
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecode,
                         Combine(ValuesIn(kGpuPoolSizes), Values(1, 2, 3), Values(1, 2, 3, 4, 5, 6)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_ring" +
                                    std::to_string(std::get<1>(info.param)) + "P_n" +
                                    std::to_string(std::get<2>(info.param));
                         });

// More requests than CUDA's grid y holds (65535): the decode kernels put
// blocks of all requests' tokens in grid x, so this launches and matches.
class GpuDecodeManyRequests : public GpuTest {};

TEST_F(GpuDecodeManyRequests, MoreRequestsThanGridYHolds) {
    for (const int N : {1, 2}) {  // the one-kernel variant, and the pair
        SCOPED_TRACE("next_n " + std::to_string(N));
        const int P = kGpuPoolSizes[0], block_size = 64;
        const int64_t ring = 2 * P, B = 70000, tail_blocks = B + 4;
        const int64_t num_blocks = (2 * B * N) / block_size + 2;
        std::mt19937 rng(4242);
        DecodeCase d(gpu(), rng, B, N, P, ring, tail_blocks, num_blocks, block_size, /*padded=*/false);
        run_both([&](Side s, const kpool_exec *ex, kpool_status *st) { return d.call(s, P, true, ex, st); },
                 {{"kv_cache", &d.cache}, {"tail_kv_cache", &d.tail}});
        EXPECT_TRUE(d.tail.cpu().bytes() != d.tail0.bytes()) << "the test stashed nothing";
        EXPECT_TRUE(d.cache.cpu().bytes() != d.cache0.bytes()) << "the test completed no pool";
    }
}

}  // namespace
}  // namespace kpool_test
