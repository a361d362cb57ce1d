// decode_update_and_maybe_write_cache_batched on the GPU (one kernel: its
// requests' completions, then their stashes; a warp per token at P = 4 with
// next_n >= 4, else a warp per request, the family's knobs) against the CPU
// (two kernels), bit for bit: GpuDecode over the axes an engine varies (both
// layouts), GpuDecodeUnalignedRows the warp-per-token kernel for rows that
// are not 8-byte words at every P, GpuDecodeManyRequests past grid y,
// GpuDecodeSharedTailBlock the cross-request rule of docs/behaviour.md,
// GpuDecodeByBlock the block-per-request layout (a completion over four
// warps) forced, against the CPU and against the other layouts (at the
// pool sizes without its kernels, the warp per token it falls back to).
#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "gpu_fixtures.h"
#include "ops/decode_layouts.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

// decode: P x RING (P, 2P, 3P) x next_n 1..8, 20, 40 and 2100 (past P: a
// ring slot stashed several times in one call, completions reading earlier
// tokens' stashes; past 32: the warp per request loads a call's indices 32
// tokens at a time; past 2048: the warp per token, whatever the pool);
// page size, padding and round_scale vary with next_n.
using GpuDecodeParam = std::tuple<int, int, int>;
class GpuDecode : public GpuParamTest<GpuDecodeParam> {};

TEST_P(GpuDecode, MatchesCpu) {
    const auto [P, ring_mult, N] = GetParam();
    // One token per request: more requests, so that several complete a pool.
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
                         Combine(ValuesIn(kGpuPoolSizes), Values(1, 2, 3), Values(1, 2, 3, 4, 5, 6, 7, 8, 20, 40, 2100)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_ring" +
                                    std::to_string(std::get<1>(info.param)) + "P_n" +
                                    std::to_string(std::get<2>(info.param));
                         });

// A call of 9 requests of N tokens whose inputs `unfit` makes unfit for the
// warp-per-request kernel: the runtime takes the warp-per-token kernel (any
// strides), which matches the CPU.
template <typename Unfit>
void expect_warp_per_token_matches_cpu(Device &gpu, int P, int N, unsigned seed, Unfit unfit) {
    const int64_t ring = 2 * P, B = 9, tail_blocks = B + 4, block_size = 16;
    const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2);
    std::mt19937 rng(seed);
    DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
    unfit(in);
    DecodeCase d(gpu, rng, std::move(in), ring, tail_blocks, num_blocks, block_size, /*padded=*/false);
    run_both([&](Side s, const kpool_exec *ex, kpool_status *st) { return d.call(s, P, true, ex, st); },
             {{"kv_cache", &d.cache}, {"tail_kv_cache", &d.tail}});
    EXPECT_TRUE(d.tail.cpu().bytes() != d.tail0.bytes()) << "the test stashed nothing";
}

using GpuDecodeUnalignedParam = std::tuple<int, int>;  // P, next_n
std::string pool_and_tokens(const ::testing::TestParamInfo<GpuDecodeUnalignedParam> &info) {
    return "P" + std::to_string(std::get<0>(info.param)) + "_n" + std::to_string(std::get<1>(info.param));
}

// Key and score rows 130 elements apart (260 bytes: not 8-byte words).
class GpuDecodeUnalignedRows : public GpuParamTest<GpuDecodeUnalignedParam> {};

HostTensor with_row_stride(const HostTensor &rows, int64_t row_stride) {
    const int64_t B = rows.shape(0), N = rows.shape(1);
    HostTensor out(rows.dtype(), {B, N, kD}, {N * row_stride, row_stride, 1});
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < N; ++t) {
            for (int64_t d = 0; d < kD; ++d) out.set<uint16_t>({b, t, d}, rows.get<uint16_t>({b, t, d}));
        }
    }
    return out;
}

TEST_P(GpuDecodeUnalignedRows, MatchesCpu) {
    const auto [P, N] = GetParam();
    expect_warp_per_token_matches_cpu(gpu(), P, N, 4600 + P * 31 + N, [](DecodeInputs &in) {
        in.key = with_row_stride(in.key, kD + 2);
        in.slot_score = with_row_stride(in.slot_score, kD + 2);
    });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecodeUnalignedRows, Combine(ValuesIn(kGpuPoolSizes), Values(1, 2, 5, 20)),
                         pool_and_tokens);

// ape rows 132 floats apart (16-byte aligned, not dense: the warp-per-request
// kernel reads every slot's run at a constant offset from the first's).
class GpuDecodePaddedApe : public GpuParamTest<GpuDecodeUnalignedParam> {};

TEST_P(GpuDecodePaddedApe, MatchesCpu) {
    const auto [P, N] = GetParam();
    expect_warp_per_token_matches_cpu(gpu(), P, N, 4700 + P * 31 + N, [P = P](DecodeInputs &in) {
        HostTensor ape(KPOOL_DTYPE_FLOAT32, {P, kD}, {kD + 4, 1});
        for (int64_t j = 0; j < P; ++j) {
            for (int64_t d = 0; d < kD; ++d) ape.set<float>({j, d}, in.ape.get<float>({j, d}));
        }
        in.ape = std::move(ape);
    });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecodePaddedApe, Combine(ValuesIn(kGpuPoolSizes), Values(1, 5)), pool_and_tokens);

// More requests than CUDA's grid y holds (65535): the decode kernel's
// blocks (one per request) are in grid x, so this launches and matches.
class GpuDecodeManyRequests : public GpuTest {};

TEST_F(GpuDecodeManyRequests, MoreRequestsThanGridYHolds) {
    for (const int N : {1, 2}) {
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

// Two requests of one call sharing a tail block (docs/behaviour.md, "Across
// the requests of a decode call"): request 0 completes the pool of ring
// slots [0, P) at position P - 1, request 1 runs N tokens at positions
// `other_start`..: ring slots other_start % RING on.
struct SharedTailBlock {
    static constexpr int64_t kBlockSize = 16, kNumBlocks = 4, kTailBlocks = 2;
    SharedTailBlock(Device &gpu, int P, int64_t N, int64_t ring, int64_t other_start)
        : rng(9100 + P * 13 + N), d(gpu, rng, inputs(P, N, ring, other_start), ring, kTailBlocks, kNumBlocks,
                                    kBlockSize, /*padded=*/false) {}
    DecodeInputs inputs(int P, int64_t N, int64_t ring, int64_t other_start) {
        DecodeInputs in = make_decode_tensors(rng, 2, N, P);
        for (int64_t t = 0; t < N; ++t) {
            const int64_t own = P - N + t, other = other_start + t;  // positions; request 0 ends at P - 1
            in.positions.set<int32_t>({0, t}, int32_t(own));
            in.positions.set<int32_t>({1, t}, int32_t(other));
            in.tail_slot_mapping.set<int32_t>({0, t}, int32_t(own % ring));  // tail block 0, both
            in.tail_slot_mapping.set<int32_t>({1, t}, int32_t(other % ring));
            in.slot_mapping.set<int32_t>({0, t}, own % P == P - 1 ? int32_t(kCompletionSlot) : -1);
            in.slot_mapping.set<int32_t>({1, t}, other % P == P - 1 ? int32_t(kCompletionSlot + 1) : -1);
        }
        return in;
    }
    static constexpr int64_t kCompletionSlot = 5;  // request 0's row; request 1's, if it completes, the next
    std::mt19937 rng;
    DecodeCase d;
};

class GpuDecodeSharedTailBlock : public GpuParamTest<int> {};

// Disjoint ring slots (RING = 4P; request 1 at [2P, 3P)): nothing either
// request reads is written by the other, so the result is the reference's.
TEST_P(GpuDecodeSharedTailBlock, DisjointSlotsMatchTheCpu) {
    const int P = GetParam();
    for (const int64_t N : {int64_t(1), int64_t(2), int64_t(P)}) {
        SCOPED_TRACE("next_n " + std::to_string(N));
        SharedTailBlock c(gpu(), P, N, 4 * P, 3 * P - N);
        run_both([&](Side s, const kpool_exec *ex, kpool_status *st) { return c.d.call(s, P, true, ex, st); },
                 {{"kv_cache", &c.d.cache}, {"tail_kv_cache", &c.d.tail}});
        EXPECT_TRUE(c.d.cache.cpu().bytes() != c.d.cache0.bytes()) << "the test completed no pool";
    }
}

// Request 1 stashes into ring slots [0, N) that request 0's completion reads
// (RING = 2P, request 1 at [2P, 2P + N)): that completion's row may hold
// either value of each element (the one-kernel exception), and it is the
// only byte left open: the ring and every other cache byte are the CPU's.
TEST_P(GpuDecodeSharedTailBlock, ReadingAnothersStashLeavesOnlyThatRowOpen) {
    const int P = GetParam();
    if (P == 1) GTEST_SKIP() << "a pool of one token reads no ring slot";
    const int64_t N = P / 2;  // request 0 reads slots [0, P - N) from the ring
    SharedTailBlock c(gpu(), P, N, 2 * P, 2 * P);
    run_both([&](Side s, const kpool_exec *ex, kpool_status *st) { return c.d.call(s, P, true, ex, st); },
             {{"tail_kv_cache", &c.d.tail}});
    c.d.cache.download();
    std::vector<uint8_t> expected = c.d.cache.cpu().bytes(), got = c.d.cache.gpu_host();
    const int64_t page_stride = c.d.cache.cpu().strides()[0], slot = SharedTailBlock::kCompletionSlot;
    const int64_t page = slot / SharedTailBlock::kBlockSize, row = slot % SharedTailBlock::kBlockSize;
    const int64_t codes_at = page * page_stride + row * kD,
                  scale_at = page * page_stride + SharedTailBlock::kBlockSize * kD + row * 4;
    EXPECT_TRUE(expected != c.d.cache0.bytes()) << "the CPU completed no pool";
    for (int64_t at : {codes_at, scale_at}) {  // the open row: the GPU's bytes there are allowed
        const int64_t n = at == codes_at ? kD : 4;
        std::copy_n(got.begin() + at, n, expected.begin() + at);
    }
    EXPECT_TRUE(same_bytes("kv_cache outside request 0's completion (GPU vs CPU)", expected, got));
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecodeSharedTailBlock, ValuesIn(kGpuPoolSizes),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

// The block-per-request layout (a completion over a block's four warps,
// schedules/cuda/decode_block.cpp), forced for every call of the test:
// against the CPU in the exact arithmetic, and against the other two
// layouts in the reference's (the same instructions in the same order:
// the same bytes), batched and ragged.
using GpuDecodeByBlockParam = std::tuple<int, int>;  // P, next_n
class GpuDecodeByBlock : public GpuParamTest<GpuDecodeByBlockParam> {};

using kpool::rt::DecodeLayoutChoice;
using kpool::rt::ScopedDecodeLayout;

// Whether every built family has the block-per-request kernels of pool size
// P for int32 indices (a forced layout without its kernel would run another).
bool block_kernels_built(int P) {
    namespace rt = kpool::rt;
    bool built = true;
    for (const rt::Kernel kind : {rt::Kernel::DECODE_UPDATE_BY_BLOCK, rt::Kernel::DECODE_UPDATE_RAGGED_BY_BLOCK}) {
        for (const rt::Arithmetic arith : {rt::Arithmetic::exact, rt::Arithmetic::triton}) {
#define KPOOL_TEST_FAMILY(name, capability) \
    built = built && rt::find_kernel({rt::Family::name, kind, P, rt::ElementType::int32, arith}) != nullptr;
            KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_TEST_FAMILY)
#undef KPOOL_TEST_FAMILY
        }
    }
    return built;
}

// Whether P is one of kGpuBlockPoolSizes.
bool block_pool_size(int P) {
    return std::find(std::begin(kGpuBlockPoolSizes), std::end(kGpuBlockPoolSizes), P) != std::end(kGpuBlockPoolSizes);
}

// The block-per-request kernels are built for kGpuBlockPoolSizes only: at
// another pool size a call forced into the layout runs the warp per token
// (runtime/ops/decode.cpp), so these tests then check that fallback.
void check_block_kernels(int P) {
    const bool listed = block_pool_size(P);
    ASSERT_EQ(block_kernels_built(P), listed) << "block-per-request kernels of P = " << P
                                              << (listed ? " missing" : " built, not in kGpuBlockPoolSizes");
}

// The pool sizes without block-per-request kernels.
std::vector<int> pool_sizes_without_block_kernels() {
    std::vector<int> sizes;
    for (const int P : kGpuPoolSizes) {
        if (!block_pool_size(P)) {
            sizes.push_back(P);
        }
    }
    return sizes;
}

TEST_P(GpuDecodeByBlock, MatchesCpu) {
    const auto [P, N] = GetParam();
    ASSERT_NO_FATAL_FAILURE(check_block_kernels(P));
    const ScopedDecodeLayout layout(DecodeLayoutChoice::block_per_request);
    for (const int ring_mult : {1, 2, 3}) {
        SCOPED_TRACE("ring " + std::to_string(ring_mult) + "P");
        // (Enough requests that some complete a pool at every next_n.)
        const int64_t ring = int64_t(P) * ring_mult, B = N <= 4 ? 64 : 17, tail_blocks = B + 4;
        const bool padded = ring_mult == 2, round_scale = ring_mult != 3;
        const int block_size = padded ? 64 : 16;
        const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2);
        std::mt19937 rng(7000 + P * 31 + ring_mult * 7 + N);
        DecodeCase d(gpu(), rng, B, N, P, ring, tail_blocks, num_blocks, block_size, padded);
        run_both([&, P = P](Side s, const kpool_exec *ex, kpool_status *st) { return d.call(s, P, round_scale, ex, st); },
                 {{"kv_cache", &d.cache}, {"tail_kv_cache", &d.tail}});
        EXPECT_TRUE(d.tail.cpu().bytes() != d.tail0.bytes()) << "the test stashed nothing";
        EXPECT_TRUE(d.cache.cpu().bytes() != d.cache0.bytes()) << "the test completed no pool";
    }
}

TEST_P(GpuDecodeByBlock, EqualsTheOtherLayoutsInTheReferenceArithmetic) {
    const auto [P, N] = GetParam();
    ASSERT_NO_FATAL_FAILURE(check_block_kernels(P));
    const int64_t ring = 2 * int64_t(P), B = N <= 4 ? 64 : 17, tail_blocks = B + 4, block_size = 16;
    const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2);
    std::mt19937 rng(7300 + P * 31 + N);
    DecodeCase d(gpu(), rng, B, N, P, ring, tail_blocks, num_blocks, block_size, /*padded=*/false);
    const kpool_exec triton{nullptr, KPOOL_ARITHMETIC_TRITON, nullptr};
    std::vector<std::vector<uint8_t>> caches, tails;
    for (const DecodeLayoutChoice choice :
         {DecodeLayoutChoice::block_per_request, DecodeLayoutChoice::warp_per_request, DecodeLayoutChoice::warp_per_token}) {
        const ScopedDecodeLayout layout(choice);
        d.cache.assign(d.cache0), d.tail.assign(d.tail0);
        d.cache.upload(), d.tail.upload();
        kpool_status st{};
        ASSERT_EQ(d.call(Side::Gpu, P, true, &triton, &st), KPOOL_OK) << st.message;
        d.cache.download(), d.tail.download();
        caches.push_back(d.cache.gpu_host());
        tails.push_back(d.tail.gpu_host());
    }
    EXPECT_TRUE(caches[0] != d.cache0.bytes()) << "the test completed no pool";
    for (size_t other = 1; other < caches.size(); ++other) {
        SCOPED_TRACE(other == 1 ? "against a warp per request" : "against a warp per token");
        EXPECT_TRUE(same_bytes("kv_cache (block per request vs the other layout)", caches[other], caches[0]));
        EXPECT_TRUE(same_bytes("tail_kv_cache (block per request vs the other layout)", tails[other], tails[0]));
    }
}

// The ragged decode (flat tokens, query_start_loc) in the block layout:
// requests of 0 to N tokens, against the CPU (which pads on the host).
TEST_P(GpuDecodeByBlock, RaggedMatchesCpu) {
    const auto [P, N] = GetParam();
    ASSERT_NO_FATAL_FAILURE(check_block_kernels(P));
    const ScopedDecodeLayout layout(DecodeLayoutChoice::block_per_request);
    std::mt19937 rng(7600 + P * 31 + N);
    // A cache slot for every token of the grid (no two completions race for one row).
    const int64_t B = 40, ring = 2 * P, tail_blocks = 48, block_size = 64;
    const int64_t num_blocks = std::max<int64_t>(8, (B * N) / block_size + 1);
    const RaggedBatch r = make_ragged_batch(rng, B, N, P, ring, tail_blocks, block_size * num_blocks, KPOOL_DTYPE_INT32, 3);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng);
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0), tsm(gpu(), r.tail_slot_mapping), key(gpu(), r.key),
        score(gpu(), r.slot_score), ape(gpu(), r.ape), sm(gpu(), r.slot_mapping), pos(gpu(), r.positions),
        qsl(gpu(), r.query_start_loc);
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_decode_update_and_maybe_write_cache_ragged(cache.on(s), tail.on(s), tsm.on(s), key.on(s),
                                                                    score.on(s), ape.on(s), sm.on(s), pos.on(s),
                                                                    qsl.on(s), 0, P, kD, 1, ex, st);
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
    EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes()) << "the test stashed nothing";
}

std::string pool_and_next_n(const ::testing::TestParamInfo<std::tuple<int, int>> &info) {
    return "P" + std::to_string(std::get<0>(info.param)) + "_n" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecodeByBlock, Combine(ValuesIn(kGpuBlockPoolSizes), Values(1, 2, 3, 4, 7, 20)),
                         pool_and_next_n);
// Forced into the block layout where it has no kernel: the warp per token runs.
INSTANTIATE_TEST_SUITE_P(GpuWithoutBlockKernels, GpuDecodeByBlock,
                         Combine(ValuesIn(pool_sizes_without_block_kernels()), Values(1, 4)), pool_and_next_n);

}  // namespace
}  // namespace kpool_test
