// The engine-native entry points on the GPU.
// GpuPrefillInsert: kpool_compress_tokens_and_write_cache on the GPU against
// the CPU (exact arithmetic, bit for bit), and against the engine's own
// sequence on the GPU (the gathered, masked compress and the seed) in the
// reference's arithmetic; int32 slots take the _I32 kernels, aligned rows
// the words kernels. GpuRaggedDecode: the ragged decode against the CPU,
// and against the batched call on the engine's padded grid on the GPU.
#include <random>
#include <string>
#include <tuple>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

// P x gate_score dtype x slot dtype x rows 16-byte aligned (the words kernels).
using GpuPrefillParam = std::tuple<int, kpool_dtype, kpool_dtype, bool>;
class GpuPrefillInsert : public GpuParamTest<GpuPrefillParam> {};

TokenBatch batch_for(const GpuPrefillParam &param, std::mt19937 &rng, int64_t cache_slots, int64_t ring,
                     int64_t tail_blocks) {
    const auto [P, score_dtype, slot_dtype, aligned] = param;
    TokenBatch b = make_token_batch(rng, P, score_dtype, slot_dtype, cache_slots, ring, tail_blocks);
    if (!aligned) {
        b.key = restride(b.key, {321, 1});  // rows 642 bytes apart: the element kernels
    }
    return b;
}

TEST_P(GpuPrefillInsert, MatchesCpu) {
    const auto [P, score_dtype, slot_dtype, aligned] = GetParam();
    std::mt19937 rng(9000 + P * 7 + 3 * (score_dtype == KPOOL_DTYPE_FLOAT32) + 5 * (slot_dtype == KPOOL_DTYPE_INT64) +
                     aligned);
    const int64_t block_size = 16, num_blocks = 9, ring = 2 * P, tail_blocks = 8;
    const TokenBatch b = batch_for(GetParam(), rng, block_size * num_blocks, ring, tail_blocks);
    const bool seed = score_dtype == KPOOL_DTYPE_BFLOAT16;  // the tail ring holds bf16 scores
    HostTensor ape0(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(ape0, rng, 0.5f);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    Mirrored cache(gpu(), cache0), tail(gpu(), random_bytes_like(rng, make_tail_cache(tail_blocks, ring, true))),
        key(gpu(), b.key), gate(gpu(), b.gate_score), ape(gpu(), ape0), slots(gpu(), b.slot_mapping),
        tail_slots(gpu(), b.tail_slot_mapping);
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_tokens_and_write_cache(cache.on(s), key.on(s), gate.on(s), ape.on(s), slots.on(s),
                                                         seed ? tail.on(s) : nullptr,
                                                         seed ? tail_slots.on(s) : nullptr, nullptr, P, kD, 1, ex, st);
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
    EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes()) << "the batch completed no pool";
}

// The engine's sequence and the one call, both on the GPU in the reference's
// arithmetic (the default on CUDA): the same bytes.
TEST_P(GpuPrefillInsert, EqualsTheEngineSequenceInTheReferenceArithmetic) {
    const auto [P, score_dtype, slot_dtype, aligned] = GetParam();
    std::mt19937 rng(9500 + P * 7 + 3 * (score_dtype == KPOOL_DTYPE_FLOAT32) + 5 * (slot_dtype == KPOOL_DTYPE_INT64) +
                     aligned);
    const int64_t block_size = 64, num_blocks = 5, ring = P, tail_blocks = 8;
    const TokenBatch b = batch_for(GetParam(), rng, block_size * num_blocks, ring, tail_blocks);
    const GatheredPools g = gather_engine_pools(b, P);
    HostTensor ape0(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(ape0, rng, 0.5f);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false));
    Mirrored sequence_cache(gpu(), cache0), call_cache(gpu(), cache0), key(gpu(), b.key), gate(gpu(), b.gate_score),
        ape(gpu(), ape0), slots(gpu(), b.slot_mapping), slot_k(gpu(), g.slot_k), slot_score(gpu(), g.slot_score),
        loc(gpu(), g.loc), write_mask(gpu(), g.write_mask);
    const kpool_exec triton{nullptr, KPOOL_ARITHMETIC_TRITON, nullptr};
    kpool_status st{};
    ASSERT_EQ(kpool_compress_and_write_cache(sequence_cache.on(Side::Gpu), slot_k.on(Side::Gpu),
                                             slot_score.on(Side::Gpu), ape.on(Side::Gpu), loc.on(Side::Gpu),
                                             write_mask.on(Side::Gpu), nullptr, nullptr, P, kD, 1, 1, &triton, &st),
              KPOOL_OK)
        << st.message;
    ASSERT_EQ(kpool_compress_tokens_and_write_cache(call_cache.on(Side::Gpu), key.on(Side::Gpu), gate.on(Side::Gpu),
                                                    ape.on(Side::Gpu), slots.on(Side::Gpu), nullptr, nullptr, nullptr,
                                                    P, kD, 1, &triton, &st),
              KPOOL_OK)
        << st.message;
    sequence_cache.download(), call_cache.download();
    EXPECT_TRUE(same_bytes("kv_cache (one call vs the engine's sequence)", sequence_cache.gpu_host(),
                           call_cache.gpu_host()));
    EXPECT_TRUE(call_cache.gpu_host() != cache0.bytes()) << "the batch completed no pool";
}

// With positions: a chunk whose pools began in an earlier chunk reads
// those members from the tail ring (random ring contents here).
TEST_P(GpuPrefillInsert, WithPositionsMatchesCpu) {
    const auto [P, score_dtype, slot_dtype, aligned] = GetParam();
    if (score_dtype != KPOOL_DTYPE_BFLOAT16) GTEST_SKIP() << "positions: bf16 scores (the ring's)";
    std::mt19937 rng(9600 + P * 7 + 5 * (slot_dtype == KPOOL_DTYPE_INT64) + aligned);
    const int64_t block_size = 16, num_blocks = 9, ring = 2 * P, tail_blocks = 8;
    TokenBatch b = batch_for(GetParam(), rng, block_size * num_blocks, ring, tail_blocks);
    // Positions from the tail slots (block * RING + pos % RING, the batch's
    // chunks start anywhere below 3P): the chunk's start inside a pool.
    HostTensor positions(slot_dtype, {b.key.shape(0)});
    for (int64_t i = 0, pos = 0; i < b.key.shape(0); ++i) {
        const int64_t ts = b.tail_slot_mapping.get_int({i});
        const bool same = i > 0 && ts >= 0 && b.tail_slot_mapping.get_int({i - 1}) / ring == ts / ring;
        pos = same ? pos + 1 : (ts >= 0 ? ts % ring : -1);
        positions.set_int({i}, pos);
    }
    HostTensor ape0(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(ape0, rng, 0.5f);
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0), key(gpu(), b.key), gate(gpu(), b.gate_score), ape(gpu(), ape0),
        slots(gpu(), b.slot_mapping), tail_slots(gpu(), b.tail_slot_mapping), pos(gpu(), positions);
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_tokens_and_write_cache(cache.on(s), key.on(s), gate.on(s), ape.on(s), slots.on(s),
                                                         tail.on(s), tail_slots.on(s), pos.on(s), P, kD, 1, ex, st);
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuPrefillInsert,
                         Combine(ValuesIn(kGpuPoolSizes), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32),
                                 Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64), Values(true, false)),
                         [](const ::testing::TestParamInfo<GpuPrefillParam> &info) {
                             return "p" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) + "_" + dtype_tag(std::get<2>(info.param)) +
                                    (std::get<3>(info.param) ? "_aligned" : "_unaligned");
                         });

// The ragged decode: P x index dtype x max_query_len given (else T) x rows
// aligned (the warp-per-request kernel where the layout rule picks it;
// unaligned rows take the warp-per-token one).
using GpuRaggedParam = std::tuple<int, kpool_dtype, bool, bool>;
class GpuRaggedDecode : public GpuParamTest<GpuRaggedParam> {};

RaggedBatch ragged_for(const GpuRaggedParam &param, std::mt19937 &rng, int64_t B, int64_t ring, int64_t tail_blocks,
                       int64_t cache_slots) {
    const auto [P, index_dtype, bounded, aligned] = param;
    RaggedBatch r = make_ragged_batch(rng, B, 4, P, ring, tail_blocks, cache_slots, index_dtype, 3);
    if (!aligned) {
        r.key = restride(r.key, {kD + 1, 1});  // rows 258 bytes apart: not 8-byte words
    }
    return r;
}

TEST_P(GpuRaggedDecode, MatchesCpu) {
    const auto [P, index_dtype, bounded, aligned] = GetParam();
    std::mt19937 rng(9700 + P * 7 + (index_dtype == KPOOL_DTYPE_INT64) + 2 * bounded + 4 * aligned);
    const int64_t B = 70, ring = 2 * P, tail_blocks = 80, block_size = 64, num_blocks = 8;
    const RaggedBatch r = ragged_for(GetParam(), rng, B, ring, tail_blocks, block_size * num_blocks);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng);
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0), tsm(gpu(), r.tail_slot_mapping), key(gpu(), r.key),
        score(gpu(), r.slot_score), ape(gpu(), r.ape), sm(gpu(), r.slot_mapping), pos(gpu(), r.positions),
        qsl(gpu(), r.query_start_loc);
    const int32_t bound = bounded ? int32_t(r.longest) : 0;
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_decode_update_and_maybe_write_cache_ragged(cache.on(s), tail.on(s), tsm.on(s), key.on(s),
                                                                    score.on(s), ape.on(s), sm.on(s), pos.on(s),
                                                                    qsl.on(s), bound, P, kD, 1, ex, st);
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
    EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes()) << "the batch completed no pool";
}

// The ragged call and the engine's padded batched call, both on the GPU in
// the reference's arithmetic: the same bytes.
TEST_P(GpuRaggedDecode, EqualsThePaddedBatchedCallInTheReferenceArithmetic) {
    const auto [P, index_dtype, bounded, aligned] = GetParam();
    std::mt19937 rng(9900 + P * 7 + (index_dtype == KPOOL_DTYPE_INT64) + 2 * bounded + 4 * aligned);
    const int64_t B = 64, ring = P, tail_blocks = 70, block_size = 64, num_blocks = 8;
    const RaggedBatch r = ragged_for(GetParam(), rng, B, ring, tail_blocks, block_size * num_blocks);
    const DecodeInputs g = pad_ragged_batch(r);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false));
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, false);
    fill_normal(tail0, rng);
    Mirrored padded_cache(gpu(), cache0), padded_tail(gpu(), tail0), ragged_cache(gpu(), cache0),
        ragged_tail(gpu(), tail0), tsm(gpu(), r.tail_slot_mapping), key(gpu(), r.key), score(gpu(), r.slot_score),
        ape(gpu(), r.ape), sm(gpu(), r.slot_mapping), pos(gpu(), r.positions), qsl(gpu(), r.query_start_loc),
        g_tsm(gpu(), g.tail_slot_mapping), g_key(gpu(), g.key), g_score(gpu(), g.slot_score), g_sm(gpu(), g.slot_mapping),
        g_pos(gpu(), g.positions);
    const kpool_exec triton{nullptr, KPOOL_ARITHMETIC_TRITON, nullptr};
    const Side G = Side::Gpu;
    kpool_status st{};
    ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(padded_cache.on(G), padded_tail.on(G), g_tsm.on(G),
                                                                g_key.on(G), g_score.on(G), ape.on(G), g_sm.on(G),
                                                                g_pos.on(G), P, kD, 1, &triton, &st),
              KPOOL_OK)
        << st.message;
    ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_ragged(ragged_cache.on(G), ragged_tail.on(G), tsm.on(G),
                                                               key.on(G), score.on(G), ape.on(G), sm.on(G), pos.on(G),
                                                               qsl.on(G), bounded ? int32_t(r.longest) : 0, P, kD, 1,
                                                               &triton, &st),
              KPOOL_OK)
        << st.message;
    for (Mirrored *m : {&padded_cache, &padded_tail, &ragged_cache, &ragged_tail}) m->download();
    EXPECT_TRUE(same_bytes("kv_cache (ragged vs padded)", padded_cache.gpu_host(), ragged_cache.gpu_host()));
    EXPECT_TRUE(same_bytes("tail_kv_cache (ragged vs padded)", padded_tail.gpu_host(), ragged_tail.gpu_host()));
    EXPECT_TRUE(ragged_cache.gpu_host() != cache0.bytes()) << "the batch completed no pool";
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuRaggedDecode,
                         Combine(ValuesIn(kGpuPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(true, false), Values(true, false)),
                         [](const ::testing::TestParamInfo<GpuRaggedParam> &info) {
                             return "p" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) +
                                    (std::get<2>(info.param) ? "_bounded" : "_unbounded") +
                                    (std::get<3>(info.param) ? "_aligned" : "_unaligned");
                         });

}  // namespace
}  // namespace kpool_test
