// The entry points that take what an engine holds, against the sequences
// engines run today (vLLM's sparse indexer over the drop-in ops), computed
// by the scalar reference: kpool_compress_tokens_and_write_cache against
// the gathered, masked compress plus the seed; the ragged decode against the
// batched one on the engine's padded grid.
#include <functional>
#include <random>
#include <string>
#include <tuple>

#include "placement.h"
#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::HasSubstr;
using ::testing::Values;

kpool_exec cpu_exec() { return kpool_exec{nullptr, KPOOL_ARITHMETIC_EXACT, nullptr}; }

// The engine's sequence by the scalar reference: the gathered pools over
// all n rows with the write mask, then the seed of the same tokens.
void engine_prefill_insert(HostTensor &cache, HostTensor *tail, const TokenBatch &b, const HostTensor &ape, int P) {
    const GatheredPools g = gather_engine_pools(b, P);
    const kpool_tensor c = cache.desc(), k = g.slot_k.desc(), s = g.slot_score.desc(), a = ape.desc(),
                       l = g.loc.desc(), m = g.write_mask.desc();
    kpool_ref::compress_and_write_cache(&c, &k, &s, &a, &l, &m, nullptr, nullptr, P, kD, 1, 1);
    if (tail != nullptr) {
        const kpool_tensor t = tail->desc(), key = b.key.desc(), gate = b.gate_score.desc(),
                           ts = b.tail_slot_mapping.desc();
        kpool_ref::seed_tail_cache(&t, &key, &gate, &ts, P, kD);
    }
}

// A prefill case: the engine's tokens for a cache of num_blocks pages of
// block_size slots and a tail of tail_blocks rings, ape, and both caches
// filled with random bytes (so every byte a call leaves is checked).
struct PrefillCase {
    TokenBatch b;
    HostTensor ape, cache, tail;
};
PrefillCase make_prefill_case(std::mt19937 &rng, int P, kpool_dtype score_dtype, kpool_dtype slot_dtype,
                              int64_t block_size, int64_t num_blocks, int64_t ring, int64_t tail_blocks) {
    PrefillCase c{make_token_batch(rng, P, score_dtype, slot_dtype, block_size * num_blocks, ring, tail_blocks),
                  HostTensor(KPOOL_DTYPE_FLOAT32, {P, kD}), make_kv_cache(num_blocks, block_size, true),
                  make_tail_cache(tail_blocks, ring, true)};
    fill_normal(c.ape, rng, 0.5f);
    c.cache.fill_random_bytes(rng);
    c.tail.fill_random_bytes(rng);
    return c;
}

// P x gate_score dtype x slot dtype x with the tail seed.
using PrefillParam = std::tuple<int, kpool_dtype, kpool_dtype, bool>;
class PrefillInsert : public ::testing::TestWithParam<PrefillParam> {};

TEST_P(PrefillInsert, EqualsTheEngineSequence) {
    const auto [P, score_dtype, slot_dtype, seed] = GetParam();
    if (score_dtype == KPOOL_DTYPE_FLOAT32 && seed) GTEST_SKIP() << "the tail ring holds bf16 scores (BadInput case)";
    std::mt19937 rng(700 + P * 11 + 3 * (score_dtype == KPOOL_DTYPE_FLOAT32) + 5 * (slot_dtype == KPOOL_DTYPE_INT64));
    PrefillCase pc = make_prefill_case(rng, P, score_dtype, slot_dtype, 16, 9, 2 * P, 8);
    const TokenBatch &b = pc.b;
    HostTensor &ape = pc.ape, &cache = pc.cache, &tail = pc.tail;
    HostTensor cache_api = cache, tail_api = tail;
    const HostTensor cache0 = cache;
    engine_prefill_insert(cache, seed ? &tail : nullptr, b, ape, P);

    const kpool_tensor c = cache_api.desc(), k = b.key.desc(), g = b.gate_score.desc(), a = ape.desc(),
                       sm = b.slot_mapping.desc(), t = tail_api.desc(), tsm = b.tail_slot_mapping.desc();
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(kpool_compress_tokens_and_write_cache(&c, &k, &g, &a, &sm, opt(t, seed), opt(tsm, seed), nullptr, P,
                                                          kD, 1, &ex, &st),
                    st);
    EXPECT_BYTES_EQ(cache, cache_api);
    EXPECT_BYTES_EQ(tail, tail_api);
    EXPECT_TRUE(cache_api.bytes() != cache0.bytes()) << "the batch completed no pool";
}

INSTANTIATE_TEST_SUITE_P(All, PrefillInsert,
                         Combine(Values(4, 8, 16), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32),
                                 Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64), Values(false, true)),
                         [](const ::testing::TestParamInfo<PrefillParam> &info) {
                             return "p" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) + "_" + dtype_tag(std::get<2>(info.param)) +
                                    (std::get<3>(info.param) ? "_seed" : "");
                         });

// With the seed the call is one launch (the pools and the seed in one
// kernel) where it fits one; split as a device splits past its 32-bit
// offsets (here: windows of three pages), it runs the compress and the seed
// as two: both give the engine's bytes, for either slot dtype.
TEST(PrefillInsertEdge, OneLaunchAndSplitLaunchesEqualTheEngineSequence) {
    for (const kpool_dtype slot_dtype : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
        SCOPED_TRACE(dtype_tag(slot_dtype));
        std::mt19937 rng(79 + (slot_dtype == KPOOL_DTYPE_INT64));
        const int P = 8;
        PrefillCase pc = make_prefill_case(rng, P, KPOOL_DTYPE_BFLOAT16, slot_dtype, 16, 9, 2 * P, 8);
        const TokenBatch &b = pc.b;
        HostTensor &ape = pc.ape, &cache = pc.cache, &tail = pc.tail;
        HostTensor one_cache = cache, one_tail = tail, split_cache = cache, split_tail = tail;
        engine_prefill_insert(cache, &tail, b, ape, P);
        const kpool_tensor k = b.key.desc(), g = b.gate_score.desc(), a = ape.desc(), sm = b.slot_mapping.desc(),
                           tsm = b.tail_slot_mapping.desc();
        auto call = [&](HostTensor &c_out, HostTensor &t_out) {
            const kpool_tensor c = c_out.desc(), t = t_out.desc();
            kpool_status st{};
            const kpool_exec ex = cpu_exec();
            ASSERT_KPOOL_OK(kpool_compress_tokens_and_write_cache(&c, &k, &g, &a, &sm, &t, &tsm, nullptr, P, kD, 1,
                                                                  &ex, &st),
                            st);
        };
        call(one_cache, one_tail);
        {
            const kpool::rt::ScopedLaunchSpan span(3 * cache.strides()[0] * dtype_size(cache.dtype()));
            call(split_cache, split_tail);
        }
        EXPECT_BYTES_EQ(cache, one_cache);
        EXPECT_BYTES_EQ(tail, one_tail);
        EXPECT_BYTES_EQ(cache, split_cache);
        EXPECT_BYTES_EQ(tail, split_tail);
    }
}

// Fewer tokens than a pool: nothing completes, nothing is written.
TEST(PrefillInsertEdge, FewerTokensThanAPool) {
    std::mt19937 rng(77);
    const int P = 16;
    HostTensor key(KPOOL_DTYPE_BFLOAT16, {P - 1, kD}), gate(KPOOL_DTYPE_BFLOAT16, {P - 1, kD});
    HostTensor slots(KPOOL_DTYPE_INT32, {P - 1}), ape(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(key, rng);
    fill_normal(gate, rng);
    for (int64_t i = 0; i < P - 1; ++i) slots.set_int({i}, i);
    HostTensor cache = make_kv_cache(2, 16, false);
    cache.fill_random_bytes(rng);
    const HostTensor before = cache;
    const kpool_tensor c = cache.desc(), k = key.desc(), g = gate.desc(), a = ape.desc(), sm = slots.desc();
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(
        kpool_compress_tokens_and_write_cache(&c, &k, &g, &a, &sm, nullptr, nullptr, nullptr, P, kD, 1, &ex, &st), st);
    EXPECT_BYTES_EQ(before, cache);
}

// Every rejection names its argument, and neither cache changes: the
// tail's arguments are checked before the compress writes.
TEST(PrefillInsertEdge, BadInputNamesTheArgumentAndWritesNothing) {
    std::mt19937 rng(78);
    const int P = 4;
    const int64_t ring = 8, tail_blocks = 8, block_size = 16, num_blocks = 4;
    PrefillCase pc =
        make_prefill_case(rng, P, KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_INT32, block_size, num_blocks, ring, tail_blocks);
    const TokenBatch &b = pc.b;
    HostTensor &ape = pc.ape, &cache = pc.cache, &tail = pc.tail;
    const HostTensor cache0 = cache, tail0 = tail;
    const int64_t n = b.key.shape(0);
    auto call = [&](const TokenBatch &in, const kpool_tensor *tail_t, const kpool_tensor *tsm_t, int pool_size,
                    kpool_status &st) {
        const kpool_tensor c = cache.desc(), k = in.key.desc(), g = in.gate_score.desc(), a = ape.desc(),
                           sm = in.slot_mapping.desc();
        const kpool_exec ex = cpu_exec();
        return kpool_compress_tokens_and_write_cache(&c, &k, &g, &a, &sm, tail_t, tsm_t, nullptr, pool_size, kD, 1, &ex,
                                                     &st);
    };
    const kpool_tensor t = tail.desc();
    struct Case {
        std::string what;
        std::function<void(TokenBatch &)> spoil;
        bool with_tail, only_tail;
        kpool_status_code code;
        std::string names;
    };
    const int64_t last_end = [&] {
        for (int64_t i = n - 1; i >= 0; --i) {
            if (b.slot_mapping.get_int({i}) >= 0 && i >= P - 1) return i;
        }
        return int64_t(-1);
    }();
    ASSERT_GE(last_end, 0);
    const std::vector<Case> cases = {
        {"slot past the cache", [&](TokenBatch &x) { x.slot_mapping.set_int({last_end}, block_size * num_blocks); },
         true, false, KPOOL_ERROR_OUT_OF_RANGE, "slot_mapping[" + std::to_string(last_end) + "]"},
        {"tail slot past the ring", [&](TokenBatch &x) { x.tail_slot_mapping.set_int({n - 3}, tail_blocks * ring); },
         true, false, KPOOL_ERROR_OUT_OF_RANGE, "tail_slot_mapping[" + std::to_string(n - 3) + "]"},
        {"slot_mapping of another length", [&](TokenBatch &x) { x.slot_mapping = HostTensor(KPOOL_DTYPE_INT32, {n - 1}); },
         false, false, KPOOL_ERROR_INVALID_ARGUMENT, "slot_mapping"},
        {"float slot_mapping", [&](TokenBatch &x) { x.slot_mapping = HostTensor(KPOOL_DTYPE_FLOAT32, {n}); }, false,
         false, KPOOL_ERROR_INVALID_ARGUMENT, "slot_mapping"},
        {"gate_score of another length",
         [&](TokenBatch &x) { x.gate_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {n + 1, kD}); }, false, false,
         KPOOL_ERROR_INVALID_ARGUMENT, "gate_score"},
        {"f32 gate_score with a tail seed",
         [&](TokenBatch &x) { x.gate_score = HostTensor(KPOOL_DTYPE_FLOAT32, {n, kD}); }, true, false,
         KPOOL_ERROR_INVALID_ARGUMENT, "gate_score"},
        {"tail_kv_cache without tail_slot_mapping", [](TokenBatch &) {}, true, true, KPOOL_ERROR_INVALID_ARGUMENT,
         "tail_slot_mapping"},
    };
    for (const Case &cs : cases) {
        SCOPED_TRACE(cs.what);
        TokenBatch in = b;
        cs.spoil(in);
        const kpool_tensor tsm = in.tail_slot_mapping.desc();
        kpool_status st{};
        const kpool_status_code rc =
            call(in, cs.with_tail ? &t : nullptr, cs.with_tail && !cs.only_tail ? &tsm : nullptr, P, st);
        EXPECT_EQ(rc, cs.code) << st.message;
        EXPECT_THAT(std::string(st.message), HasSubstr(cs.names));
        EXPECT_BYTES_EQ(cache0, cache);
        EXPECT_BYTES_EQ(tail0, tail);
    }
    kpool_status st{};
    EXPECT_EQ(call(b, nullptr, nullptr, 3, st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("pool_size"));
    EXPECT_BYTES_EQ(cache0, cache);
}

// A chunked prefill with positions: requests from first_position (0, or
// near int32's limit), each split at any position into two chunks (the
// second starting inside a pool).
struct ChunkedPrefill {
    TokenBatch whole;                 // every request's tokens in one call (pools from position 0)
    TokenBatch chunk[2];              // the two chunks
    HostTensor chunk_positions[2];
};

ChunkedPrefill make_chunked_prefill(std::mt19937 &rng, int P, kpool_dtype index_dtype, int64_t cache_slots,
                                    int64_t ring, int64_t first_position = 0) {
    const std::vector<int64_t> lengths = {3 * P + 1, P, 2 * P - 1, 5 * P + 3, 1};
    std::vector<std::vector<int64_t>> rows(3), positions(3), slots(3), tail_slots(3);  // whole, chunk 0, chunk 1
    const std::vector<int64_t> free_slots = distinct_slots(rng, cache_slots, cache_slots);
    int64_t next = 0;
    int64_t first_row = 0;
    for (size_t r = 0; r < lengths.size(); ++r) {
        const int64_t split = std::uniform_int_distribution<int64_t>(std::min<int64_t>(1, lengths[r]), lengths[r])(rng);
        for (int64_t i = 0; i < lengths[r]; ++i) {
            const int64_t pos = first_position + i;
            const int64_t slot = pos % P == P - 1 && rng() % 6 != 0 ? free_slots[next++] : -1;
            const int64_t tail_slot = int64_t(r) * ring + pos % ring;
            for (int part : {0, i < split ? 1 : 2}) {
                rows[part].push_back(first_row + i);
                positions[part].push_back(pos);
                slots[part].push_back(slot);
                tail_slots[part].push_back(tail_slot);
            }
        }
        first_row += lengths[r];
    }
    HostTensor key(KPOOL_DTYPE_BFLOAT16, {first_row, kD}), gate(KPOOL_DTYPE_BFLOAT16, {first_row, kD});
    fill_normal(key, rng);
    fill_normal(gate, rng, 2.0f);
    ChunkedPrefill c;
    auto make = [&](int part, TokenBatch &b, HostTensor *pos) {
        const int64_t n = static_cast<int64_t>(rows[part].size());
        b.key = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD}, {136, 1});
        b.gate_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD});
        b.slot_mapping = HostTensor(index_dtype, {n});
        b.tail_slot_mapping = HostTensor(index_dtype, {n});
        if (pos) *pos = HostTensor(index_dtype, {n});
        for (int64_t i = 0; i < n; ++i) {
            std::memcpy(b.key.raw() + b.key.offset({i, 0}) * 2, key.bytes().data() + key.offset({rows[part][i], 0}) * 2,
                        kD * 2);
            std::memcpy(b.gate_score.raw() + b.gate_score.offset({i, 0}) * 2,
                        gate.bytes().data() + gate.offset({rows[part][i], 0}) * 2, kD * 2);
            b.slot_mapping.set_int({i}, slots[part][i]);
            b.tail_slot_mapping.set_int({i}, tail_slots[part][i]);
            if (pos) pos->set_int({i}, positions[part][i]);
        }
    };
    make(0, c.whole, nullptr);
    make(1, c.chunk[0], &c.chunk_positions[0]);
    make(2, c.chunk[1], &c.chunk_positions[1]);
    return c;
}

// Chunks that start inside a pool complete it from the tail ring: two
// chunks with positions write the cache of one call over every token.
TEST_P(PrefillInsert, ChunksWithPositionsEqualOneCall) {
    const auto [P, score_dtype, slot_dtype, seed] = GetParam();
    if (score_dtype != KPOOL_DTYPE_BFLOAT16 || !seed) GTEST_SKIP() << "positions: bf16 scores and a tail ring";
    std::mt19937 rng(900 + P * 5 + (slot_dtype == KPOOL_DTYPE_INT64));
    const int64_t block_size = 16, num_blocks = 8, ring = 2 * P, tail_blocks = 6;
    const ChunkedPrefill c = make_chunked_prefill(rng, P, slot_dtype, block_size * num_blocks, ring);
    HostTensor ape(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(ape, rng, 0.5f);
    HostTensor cache = make_kv_cache(num_blocks, block_size, true), tail = make_tail_cache(tail_blocks, ring, true);
    cache.fill_random_bytes(rng);
    fill_normal(tail, rng);
    HostTensor chunked_cache = cache, chunked_tail = tail;
    const kpool_exec ex = cpu_exec();
    kpool_status st{};
    {
        const kpool_tensor cd = cache.desc(), td = tail.desc(), k = c.whole.key.desc(), g = c.whole.gate_score.desc(),
                           a = ape.desc(), sm = c.whole.slot_mapping.desc(), tsm = c.whole.tail_slot_mapping.desc();
        ASSERT_KPOOL_OK(kpool_compress_tokens_and_write_cache(&cd, &k, &g, &a, &sm, &td, &tsm, nullptr, P, kD, 1, &ex,
                                                              &st),
                        st);
    }
    for (int part : {0, 1}) {
        const TokenBatch &b = c.chunk[part];
        const kpool_tensor cd = chunked_cache.desc(), td = chunked_tail.desc(), k = b.key.desc(),
                           g = b.gate_score.desc(), a = ape.desc(), sm = b.slot_mapping.desc(),
                           tsm = b.tail_slot_mapping.desc(), pos = c.chunk_positions[part].desc();
        ASSERT_KPOOL_OK(kpool_compress_tokens_and_write_cache(&cd, &k, &g, &a, &sm, &td, &tsm, &pos, P, kD, 1, &ex, &st),
                        st);
    }
    EXPECT_BYTES_EQ(cache, chunked_cache);
}

// One chunk with positions against the rule computed here from the scalar
// reference: each completing token's members from its rows or the ring.
// P x the requests' first position: 0, or so that the last token sits at
// int32's largest position (no sum of positions may pass it).
using RingParam = std::tuple<int, bool>;
class PositionsFromTheRing : public ::testing::TestWithParam<RingParam> {};

TEST_P(PositionsFromTheRing, TakeEarlierMembersFromTheRing) {
    const auto [P, near_int32_max] = GetParam();
    std::mt19937 rng(79 + P);
    const int64_t block_size = 16, num_blocks = 8, ring = 2 * P, tail_blocks = 6;
    const int64_t longest_request = 5 * P + 3;  // (make_chunked_prefill's)
    const int64_t first = near_int32_max ? std::numeric_limits<int32_t>::max() - (longest_request - 1) : 0;
    const ChunkedPrefill c = make_chunked_prefill(rng, P, KPOOL_DTYPE_INT32, block_size * num_blocks, ring, first);
    const TokenBatch &b = c.chunk[1];
    const HostTensor &positions = c.chunk_positions[1];
    HostTensor ape(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(ape, rng, 0.5f);
    HostTensor cache = make_kv_cache(num_blocks, block_size, false), tail = make_tail_cache(tail_blocks, ring, false);
    cache.fill_random_bytes(rng);
    fill_normal(tail, rng);
    HostTensor want = cache, want_tail = tail;
    const int64_t n = b.key.shape(0);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t p = positions.get_int({i}), slot = b.slot_mapping.get_int({i}), ts = b.tail_slot_mapping.get_int({i});
        if (slot < 0 || p % P != P - 1) continue;
        HostTensor k(KPOOL_DTYPE_BFLOAT16, {1, P, kD}), g(KPOOL_DTYPE_BFLOAT16, {1, P, kD}), loc(KPOOL_DTYPE_INT64, {1});
        for (int j = 0; j < P; ++j) {
            const int64_t back = P - 1 - j, member = p - back, row = i - back;
            const bool in_chunk = row >= 0 && positions.get_int({row}) == member &&
                                  b.tail_slot_mapping.get_int({row}) / ring == ts / ring;
            for (int half = 0; half < 2; ++half) {
                const HostTensor &rows = half == 0 ? b.key : b.gate_score;
                const uint8_t *src = in_chunk ? rows.bytes().data() + rows.offset({row, 0}) * 2
                                              : tail.bytes().data() + tail.offset({ts / ring, half, member % ring, 0}) * 2;
                HostTensor &dst = half == 0 ? k : g;
                std::memcpy(dst.raw() + dst.offset({0, j, 0}) * 2, src, kD * 2);
            }
        }
        loc.set<int64_t>({0}, slot);
        const kpool_tensor cd = want.desc(), kd = k.desc(), gd = g.desc(), a = ape.desc(), l = loc.desc();
        kpool_ref::compress_and_write_cache(&cd, &kd, &gd, &a, &l, nullptr, nullptr, nullptr, P, kD, 1, 1);
    }
    {
        const kpool_tensor t = want_tail.desc(), k = b.key.desc(), g = b.gate_score.desc(), ts = b.tail_slot_mapping.desc();
        kpool_ref::seed_tail_cache(&t, &k, &g, &ts, P, kD);
    }
    const kpool_tensor cd = cache.desc(), td = tail.desc(), k = b.key.desc(), g = b.gate_score.desc(), a = ape.desc(),
                       sm = b.slot_mapping.desc(), tsm = b.tail_slot_mapping.desc(), pos = positions.desc();
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(kpool_compress_tokens_and_write_cache(&cd, &k, &g, &a, &sm, &td, &tsm, &pos, P, kD, 1, &ex, &st), st);
    EXPECT_BYTES_EQ(want, cache);
    EXPECT_BYTES_EQ(want_tail, tail);
    // Positions need the tail ring they read from.
    EXPECT_EQ(kpool_compress_tokens_and_write_cache(&cd, &k, &g, &a, &sm, nullptr, nullptr, &pos, P, kD, 1, &ex, &st),
              KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("positions"));
}

INSTANTIATE_TEST_SUITE_P(All, PositionsFromTheRing, Combine(Values(4, 32), Values(false, true)),
                         [](const ::testing::TestParamInfo<RingParam> &info) {
                             return "p" + std::to_string(std::get<0>(info.param)) +
                                    (std::get<1>(info.param) ? "_near_int32_max" : "_from_0");
                         });

// The ragged decode against the engine's padded grid through the scalar
// reference: P x index dtype x max_query_len (the longest request's, or 0).
using RaggedParam = std::tuple<int, kpool_dtype, bool>;
class RaggedDecode : public ::testing::TestWithParam<RaggedParam> {};

TEST_P(RaggedDecode, EqualsTheBatchedCallOnThePaddedGrid) {
    const auto [P, index_dtype, bounded] = GetParam();
    std::mt19937 rng(800 + P * 3 + (index_dtype == KPOOL_DTYPE_INT64) + 2 * bounded);
    const int64_t B = 13, N = 5, ring = 2 * P, tail_blocks = 16, block_size = 16, num_blocks = 8;
    const RaggedBatch r =
        make_ragged_batch(rng, B, N, P, ring, tail_blocks, block_size * num_blocks, index_dtype, /*trailing=*/3);
    const DecodeInputs g = pad_ragged_batch(r);
    HostTensor cache = make_kv_cache(num_blocks, block_size, true), tail = make_tail_cache(tail_blocks, ring, true);
    cache.fill_random_bytes(rng);
    fill_normal(tail, rng);
    HostTensor cache_api = cache, tail_api = tail;
    const HostTensor cache0 = cache, tail0 = tail;
    {
        const kpool_tensor c = cache.desc(), t = tail.desc(), tsm = g.tail_slot_mapping.desc(), k = g.key.desc(),
                           sc = g.slot_score.desc(), a = g.ape.desc(), sm = g.slot_mapping.desc(),
                           pos = g.positions.desc();
        kpool_ref::decode_update_and_maybe_write_cache_batched(&c, &t, &tsm, &k, &sc, &a, &sm, &pos, P, kD, 1);
    }
    const kpool_tensor c = cache_api.desc(), t = tail_api.desc(), tsm = r.tail_slot_mapping.desc(), k = r.key.desc(),
                       sc = r.slot_score.desc(), a = r.ape.desc(), sm = r.slot_mapping.desc(),
                       pos = r.positions.desc(), qsl = r.query_start_loc.desc();
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_ragged(&c, &t, &tsm, &k, &sc, &a, &sm, &pos, &qsl,
                                                                     bounded ? int32_t(r.longest) : 0, P, kD, 1, &ex,
                                                                     &st),
                    st);
    EXPECT_BYTES_EQ(cache, cache_api);
    EXPECT_BYTES_EQ(tail, tail_api);
    EXPECT_TRUE(cache_api.bytes() != cache0.bytes()) << "the batch completed no pool";
    EXPECT_TRUE(tail_api.bytes() != tail0.bytes()) << "the batch stashed nothing";
}

INSTANTIATE_TEST_SUITE_P(All, RaggedDecode,
                         Combine(Values(4, 8, 16), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64), Values(true, false)),
                         [](const ::testing::TestParamInfo<RaggedParam> &info) {
                             return "p" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) +
                                    (std::get<2>(info.param) ? "_bounded" : "_unbounded");
                         });

// Hostile offsets and bounds are rejected on the host, naming the entry;
// neither cache moves.
TEST(RaggedDecodeEdge, HostileOffsetsAreRejectedAndWriteNothing) {
    std::mt19937 rng(81);
    const int P = 4;
    const int64_t B = 6, N = 4, ring = 8, tail_blocks = 8, block_size = 16, num_blocks = 4;
    const RaggedBatch r =
        make_ragged_batch(rng, B, N, P, ring, tail_blocks, block_size * num_blocks, KPOOL_DTYPE_INT32, 2);
    const int64_t T = r.key.shape(0);
    HostTensor cache = make_kv_cache(num_blocks, block_size, false), tail = make_tail_cache(tail_blocks, ring, false);
    cache.fill_random_bytes(rng);
    fill_normal(tail, rng);
    const HostTensor cache0 = cache, tail0 = tail;
    struct Case {
        std::string what;
        std::function<void(HostTensor &)> spoil;
        int32_t max_query_len;
        kpool_status_code code;
        std::string names;
    };
    const int64_t second = r.query_start_loc.get_int({2});
    const std::vector<Case> cases = {
        {"decreasing", [&](HostTensor &q) { q.set_int({3}, q.get_int({2}) - 1); }, 0, KPOOL_ERROR_OUT_OF_RANGE,
         "query_start_loc[3]"},
        {"past the tokens", [&](HostTensor &q) { q.set_int({B}, T + 1); }, 0, KPOOL_ERROR_OUT_OF_RANGE,
         "query_start_loc[" + std::to_string(B) + "]"},
        {"negative", [&](HostTensor &q) { q.set_int({0}, -1); }, 0, KPOOL_ERROR_OUT_OF_RANGE, "query_start_loc[0]"},
        {"a request past max_query_len", [](HostTensor &) {}, int32_t(std::max<int64_t>(r.longest - 1, 1)),
         KPOOL_ERROR_INVALID_ARGUMENT, "max_query_len"},
        {"negative max_query_len", [](HostTensor &) {}, -2, KPOOL_ERROR_INVALID_ARGUMENT, "max_query_len"},
        {"an int64 query_start_loc among int32 indices",
         [&](HostTensor &q) {
             HostTensor wide(KPOOL_DTYPE_INT64, {B + 1});
             for (int64_t b = 0; b <= B; ++b) wide.set_int({b}, q.get_int({b}));
             q = wide;
         },
         0, KPOOL_ERROR_INVALID_ARGUMENT, "query_start_loc"},
    };
    ASSERT_GT(second, 0);
    ASSERT_GT(r.longest, 1);
    for (const Case &cs : cases) {
        SCOPED_TRACE(cs.what);
        HostTensor q = r.query_start_loc;
        cs.spoil(q);
        const kpool_tensor c = cache.desc(), t = tail.desc(), tsm = r.tail_slot_mapping.desc(), k = r.key.desc(),
                           sc = r.slot_score.desc(), a = r.ape.desc(), sm = r.slot_mapping.desc(),
                           pos = r.positions.desc(), qsl = q.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        EXPECT_EQ(kpool_decode_update_and_maybe_write_cache_ragged(&c, &t, &tsm, &k, &sc, &a, &sm, &pos, &qsl,
                                                                   cs.max_query_len, P, kD, 1, &ex, &st),
                  cs.code)
            << st.message;
        EXPECT_THAT(std::string(st.message), HasSubstr(cs.names));
        EXPECT_BYTES_EQ(cache0, cache);
        EXPECT_BYTES_EQ(tail0, tail);
    }
}

}  // namespace
}  // namespace kpool_test
