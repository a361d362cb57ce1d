// Every operation through the public C API against the scalar reference,
// bit for bit, over the axes an engine varies: pool size, page size, padded
// page / tail strides, ring size, next_n, masks, return paths, round_scale,
// score and index dtypes, negative sentinels, empty inputs. Inputs are built
// the way an engine builds them (random bf16 values, distinct slots from a
// shuffled free list, caches full of random bytes so a stray write shows),
// and every call is made twice to check that the results are deterministic.
#include <climits>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

const int kAllPoolSizes[] = {1, 2, 4, 8, 16, 32, 64};

kpool_exec cpu_exec() { return kpool_exec{nullptr}; }

// ---------------------------------------------------------------------------
// 1. fwht128_quant_fp8
// ---------------------------------------------------------------------------

class FwhtTest : public ::testing::TestWithParam<FwhtParam> {};

TEST_P(FwhtTest, MatchesReference) {
    const auto [rows, scale_2d, fp8_dtype] = GetParam();
    std::mt19937 rng(1000 + rows);
    HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
    fill_normal(q, rng, 2.0f);
    // Edge rows: zeros (absmax floor), tiny, huge, one spike, alternating signs.
    const float edge_sigma[] = {0.0f, 1e-7f, 1e30f, 1e-30f};
    for (int r = 0; r < rows && r < 4; ++r) {
        for (int d = 0; d < kD; ++d) q.set<uint16_t>({r, d}, random_bf16(rng, edge_sigma[r]));
    }
    if (rows > 4) {
        for (int d = 0; d < kD; ++d) q.set<uint16_t>({4, d}, bf16_of(d == 17 ? 3e4f : 0.0f));
    }
    if (rows > 5) {
        for (int d = 0; d < kD; ++d) q.set<uint16_t>({5, d}, bf16_of(d % 2 ? -448.0f : 448.0f));
    }

    const std::vector<int64_t> scale_shape =
        scale_2d ? std::vector<int64_t>{rows, 1} : std::vector<int64_t>{rows};
    HostTensor fp8_ref(fp8_dtype, {rows, kD}), scale_ref(KPOOL_DTYPE_FLOAT32, scale_shape);
    fp8_ref.fill_random_bytes(rng);
    scale_ref.fill_random_bytes(rng);
    HostTensor fp8_api = fp8_ref, scale_api = scale_ref, fp8_again = fp8_ref, scale_again = scale_ref;

    const kpool_tensor qd = q.desc();
    {
        const kpool_tensor f = fp8_ref.desc(), s = scale_ref.desc();
        kpool_ref::fwht128_quant_fp8(&qd, &f, &s);
    }
    for (auto *pair : {&fp8_api, &fp8_again}) {
        HostTensor &fp8 = *pair;
        HostTensor &scale = pair == &fp8_api ? scale_api : scale_again;
        const kpool_tensor f = fp8.desc(), s = scale.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_fwht128_quant_fp8(&qd, &f, &s, &ex, &st), st);
    }
    EXPECT_BYTES_EQ(fp8_ref, fp8_api);
    EXPECT_BYTES_EQ(scale_ref, scale_api);
    EXPECT_BYTES_EQ(fp8_api, fp8_again);
    EXPECT_BYTES_EQ(scale_api, scale_again);
}

INSTANTIATE_TEST_SUITE_P(Rows, FwhtTest,
                         Combine(Values(0, 1, 7, 64, 515), Values(false, true),
                                 Values(KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8)),
                         ParamName());

// ---------------------------------------------------------------------------
// 2. compress_and_write_cache
// ---------------------------------------------------------------------------

using CompressParam = std::tuple<int /*P*/, kpool_dtype /*score*/, int /*layout*/,
                                 bool /*round_scale*/, CompressMode>;

// Layouts: (block_size, padded page stride).
struct CacheLayout {
    int block_size;
    bool padded;
};
const CacheLayout kCacheLayouts[] = {{16, false}, {64, false}, {16, true}, {64, true}};

class CompressTest : public ::testing::TestWithParam<CompressParam> {};

TEST_P(CompressTest, MatchesReference) {
    const auto [P, score_dtype, layout_index, round_scale, mode] = GetParam();
    const CacheLayout layout = kCacheLayouts[layout_index];
    std::mt19937 rng(20000 + P * 97 + layout_index * 7 + int(mode) * 3 + round_scale);
    const int64_t n = 37;
    const int64_t num_blocks = (3 * n) / layout.block_size + 2;
    HostTensor cache = make_kv_cache(num_blocks, layout.block_size, layout.padded);
    cache.fill_random_bytes(rng);
    CompressInputs in =
        make_compress_inputs(rng, n, P, score_dtype, num_blocks * layout.block_size);

    const bool masked = mode == CompressMode::kWriteMasked;
    const bool write_cache = mode == CompressMode::kWrite || masked ||
                             mode == CompressMode::kWriteAndReturn;
    const bool ret = mode == CompressMode::kWriteAndReturn || mode == CompressMode::kReturnOnly ||
                     mode == CompressMode::kReturnOnlyNoCache;
    const bool cache_given = mode != CompressMode::kReturnOnlyNoCache;
    const kpool_dtype ck_dtype =
        layout.block_size == 16 ? KPOOL_DTYPE_FLOAT8_E4M3FN : KPOOL_DTYPE_UINT8;
    HostTensor ck(ck_dtype, {n, kD}), cs(KPOOL_DTYPE_FLOAT32, {n});
    ck.fill_random_bytes(rng);
    cs.fill_random_bytes(rng);

    struct Outputs {
        HostTensor cache, ck, cs;
    };
    Outputs ref{cache, ck, cs}, api{cache, ck, cs}, again{cache, ck, cs};
    const kpool_tensor k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(),
                       l = in.loc.desc(), m = in.write_mask.desc();
    {
        const kpool_tensor c = ref.cache.desc(), kd = ref.ck.desc(), sd = ref.cs.desc();
        kpool_ref::compress_and_write_cache(opt(c, cache_given), &k, &s, &a, &l, opt(m, masked),
                                            opt(kd, ret), opt(sd, ret), P, kD, round_scale,
                                            write_cache);
    }
    for (Outputs *o : {&api, &again}) {
        const kpool_tensor c = o->cache.desc(), kd = o->ck.desc(), sd = o->cs.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(opt(c, cache_given), &k, &s, &a, &l,
                                                       opt(m, masked), opt(kd, ret), opt(sd, ret),
                                                       P, kD, round_scale, write_cache, &ex, &st),
                        st);
    }
    EXPECT_BYTES_EQ(ref.cache, api.cache);
    EXPECT_BYTES_EQ(ref.ck, api.ck);
    EXPECT_BYTES_EQ(ref.cs, api.cs);
    EXPECT_BYTES_EQ(api.cache, again.cache);
    EXPECT_BYTES_EQ(api.ck, again.ck);
    EXPECT_BYTES_EQ(api.cs, again.cs);
    // The test is only as good as its writes: the reference must have changed something.
    if (write_cache) {
        EXPECT_NE(ref.cache.bytes(), cache.bytes());
    } else {
        EXPECT_BYTES_EQ(cache, api.cache);
    }
    if (ret) {
        EXPECT_NE(ref.cs.bytes(), cs.bytes());
    }
}

INSTANTIATE_TEST_SUITE_P(
    All, CompressTest,
    Combine(ValuesIn(kAllPoolSizes), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32),
            Values(0, 1, 2, 3), Values(true, false),
            Values(CompressMode::kWrite, CompressMode::kWriteMasked, CompressMode::kWriteAndReturn,
                   CompressMode::kReturnOnly, CompressMode::kReturnOnlyNoCache)),
    [](const auto &info) {
        const CacheLayout l = kCacheLayouts[std::get<2>(info.param)];
        return "P" + std::to_string(std::get<0>(info.param)) + "_" +
               dtype_tag(std::get<1>(info.param)) + "_page" + std::to_string(l.block_size) +
               (l.padded ? "pad" : "") + (std::get<3>(info.param) ? "_ue8m0" : "_linear") + "_" +
               mode_tag(std::get<4>(info.param));
    });

TEST(CompressEdge, EmptyBatch) {
    for (int P : {4, 16}) {
        for (bool ret : {false, true}) {
            std::mt19937 rng(5);
            HostTensor cache = make_kv_cache(4, 16, false);
            cache.fill_random_bytes(rng);
            HostTensor before = cache;
            CompressInputs in = make_compress_inputs(rng, 0, P, KPOOL_DTYPE_BFLOAT16, 64);
            HostTensor ck(KPOOL_DTYPE_UINT8, {0, kD}), cs(KPOOL_DTYPE_FLOAT32, {0});
            const kpool_tensor c = cache.desc(), k = in.slot_k.desc(), s = in.slot_score.desc(),
                               a = in.ape.desc(), l = in.loc.desc(), kd = ck.desc(), sd = cs.desc();
            kpool_status st{};
            const kpool_exec ex = cpu_exec();
            ASSERT_KPOOL_OK(kpool_compress_and_write_cache(&c, &k, &s, &a, &l, nullptr,
                                                           opt(kd, ret), opt(sd, ret), P, kD, 1, 1,
                                                           &ex, &st),
                            st);
            EXPECT_BYTES_EQ(before, cache);
        }
    }
}

// An engine hands over empty tensors with a NULL data pointer (torch does).
TEST(CompressEdge, EmptyBatchWithNullData) {
    HostTensor cache = make_kv_cache(4, 16, false);
    HostTensor k(KPOOL_DTYPE_BFLOAT16, {0, 4, kD}), s(KPOOL_DTYPE_BFLOAT16, {0, 4, kD}),
        a(KPOOL_DTYPE_FLOAT32, {4, kD}), l(KPOOL_DTYPE_INT64, {0});
    kpool_tensor c = cache.desc(), kd = k.desc(), sd = s.desc(), ad = a.desc(), ld = l.desc();
    kd.data = sd.data = ld.data = nullptr;
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(kpool_compress_and_write_cache(&c, &kd, &sd, &ad, &ld, nullptr, nullptr,
                                                   nullptr, 4, kD, 1, 1, &ex, &st),
                    st);
}

// ---------------------------------------------------------------------------
// 3. seed_tail_cache
// ---------------------------------------------------------------------------

class SeedTest : public ::testing::TestWithParam<SeedParam> {};

TEST_P(SeedTest, MatchesReference) {
    const auto [P, ring_mult, tslot_dtype, padded] = GetParam();
    const int64_t ring = int64_t(P) * ring_mult;
    std::mt19937 rng(30000 + P * 13 + ring_mult * 5 + padded + (tslot_dtype == KPOOL_DTYPE_INT64));
    const int64_t num_blocks = 11;
    HostTensor tail = make_tail_cache(num_blocks, ring, padded);
    tail.fill_random_bytes(rng);
    SeedInputs in = make_seed_inputs(rng, P, ring, tslot_dtype, num_blocks);
    HostTensor ref = tail, api = tail, again = tail;
    const kpool_tensor k = in.key.desc(), g = in.gate_score.desc(), t = in.tslot.desc();
    {
        const kpool_tensor td = ref.desc();
        kpool_ref::seed_tail_cache(&td, &k, &g, &t, P, kD);
    }
    for (HostTensor *out : {&api, &again}) {
        const kpool_tensor td = out->desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(&td, &k, &g, &t, P, kD, &ex, &st), st);
    }
    EXPECT_BYTES_EQ(ref, api);
    EXPECT_BYTES_EQ(api, again);
    EXPECT_NE(ref.bytes(), tail.bytes());
}

INSTANTIATE_TEST_SUITE_P(All, SeedTest,
                         Combine(ValuesIn(kAllPoolSizes), Values(1, 2),
                                 Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64), Values(false, true)),
                         ParamName());

TEST(SeedEdge, EmptyBatch) {
    for (kpool_dtype dt : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
        std::mt19937 rng(6);
        HostTensor tail = make_tail_cache(3, 16, true);
        tail.fill_random_bytes(rng);
        HostTensor before = tail;
        HostTensor key(KPOOL_DTYPE_BFLOAT16, {0, kD}), gate(KPOOL_DTYPE_BFLOAT16, {0, kD}),
            tslot(dt, {0});
        const kpool_tensor td = tail.desc(), k = key.desc(), g = gate.desc(), t = tslot.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(&td, &k, &g, &t, 16, kD, &ex, &st), st);
        EXPECT_BYTES_EQ(before, tail);
    }
}

// All tokens of the batch are padding: nothing is written.
TEST(SeedEdge, AllSentinels) {
    std::mt19937 rng(8);
    HostTensor tail = make_tail_cache(3, 4, false);
    tail.fill_random_bytes(rng);
    HostTensor before = tail;
    const int64_t n = 9;
    HostTensor key(KPOOL_DTYPE_BFLOAT16, {n, kD}), gate(KPOOL_DTYPE_BFLOAT16, {n, kD}),
        tslot(KPOOL_DTYPE_INT64, {n});
    fill_normal(key, rng);
    fill_normal(gate, rng);
    for (int64_t i = 0; i < n; ++i) {
        tslot.set<int64_t>({i}, i % 2 ? -1 : std::numeric_limits<int64_t>::min() + i);
    }
    const kpool_tensor td = tail.desc(), k = key.desc(), g = gate.desc(), t = tslot.desc();
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(kpool_seed_tail_cache(&td, &k, &g, &t, 4, kD, &ex, &st), st);
    EXPECT_BYTES_EQ(before, tail);
}

// ---------------------------------------------------------------------------
// 4. decode_update_and_maybe_write_cache_batched
// ---------------------------------------------------------------------------

struct DecodeRun {
    HostTensor cache, tail;
    int64_t skipped = 0;
};

// Runs the reference, then the API twice, on copies of cache and tail.
void run_decode_both(const HostTensor &cache, const HostTensor &tail, const DecodeInputs &in, int P,
                     bool round_scale, DecodeRun &ref, DecodeRun &api, DecodeRun &again) {
    ref = api = again = DecodeRun{cache, tail, 0};
    const kpool_tensor tsm = in.tail_slot_mapping.desc(), k = in.key.desc(),
                       s = in.slot_score.desc(), a = in.ape.desc(), sm = in.slot_mapping.desc(),
                       pos = in.positions.desc();
    {
        const kpool_tensor c = ref.cache.desc(), t = ref.tail.desc();
        ref.skipped = kpool_ref::decode_update_and_maybe_write_cache_batched(
            &c, &t, &tsm, &k, &s, &a, &sm, &pos, P, kD, round_scale);
    }
    for (DecodeRun *run : {&api, &again}) {
        const kpool_tensor c = run->cache.desc(), t = run->tail.desc();
        kpool_status st{};
        st.skipped_completions = -12345;
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(
                            &c, &t, &tsm, &k, &s, &a, &sm, &pos, P, kD, round_scale, &ex, &st),
                        st);
        run->skipped = st.skipped_completions;
    }
}

using DecodeParam = std::tuple<int /*P*/, int /*ring = P * this*/, int /*next_n kind*/,
                               bool /*padded*/, bool /*round_scale*/>;

int64_t next_n_of(int kind, int P) {
    switch (kind) {
        case 0: return 1;
        case 1: return std::max(1, P - 1);  // below P
        default: return P + 3;              // above P (the ring wraps within the call)
    }
}

class DecodeTest : public ::testing::TestWithParam<DecodeParam> {};

TEST_P(DecodeTest, MatchesReference) {
    const auto [P, ring_mult, n_kind, padded, round_scale] = GetParam();
    const int64_t ring = int64_t(P) * ring_mult;
    const int64_t N = next_n_of(n_kind, P);
    const int64_t B = 5;
    std::mt19937 rng(40000 + P * 31 + ring_mult * 7 + n_kind * 3 + padded * 2 + round_scale);
    const int block_size = padded ? 64 : 16;
    const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2);
    const int64_t tail_blocks = B + 4;
    HostTensor cache = make_kv_cache(num_blocks, block_size, padded);
    cache.fill_random_bytes(rng);
    // The ring holds what earlier steps stashed: finite bf16 values.
    HostTensor tail = make_tail_cache(tail_blocks, ring, padded);
    fill_normal(tail, rng, 1.5f);
    const DecodeInputs in =
        make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
    DecodeRun ref, api, again;
    run_decode_both(cache, tail, in, P, round_scale, ref, api, again);
    if (HasFatalFailure()) return;
    EXPECT_BYTES_EQ(ref.cache, api.cache);
    EXPECT_BYTES_EQ(ref.tail, api.tail);
    EXPECT_EQ(ref.skipped, 0);
    EXPECT_EQ(api.skipped, 0);
    EXPECT_BYTES_EQ(api.cache, again.cache);
    EXPECT_BYTES_EQ(api.tail, again.tail);
    EXPECT_NE(ref.tail.bytes(), tail.bytes());
    // With N >= P (or P == 1) every normal request completes a pool.
    if (N >= P) {
        EXPECT_NE(ref.cache.bytes(), cache.bytes());
    }
}

INSTANTIATE_TEST_SUITE_P(All, DecodeTest,
                         Combine(ValuesIn(kAllPoolSizes), Values(1, 2), Values(0, 1, 2),
                                 Values(false, true), Values(true, false)),
                         [](const auto &info) {
                             const int P = std::get<0>(info.param);
                             return "P" + std::to_string(P) + "_ring" +
                                    std::to_string(std::get<1>(info.param)) + "P_" +
                                    (std::get<2>(info.param) == 0   ? "n"
                                     : std::get<2>(info.param) == 1 ? "nBelowP"
                                                                    : "nAboveP") +
                                    std::to_string(next_n_of(std::get<2>(info.param), P)) +
                                    (std::get<3>(info.param) ? "_padded" : "_dense") +
                                    (std::get<4>(info.param) ? "_ue8m0" : "_linear");
                         });

// A pool completion whose tail slot is negative has no tail block: it writes
// nothing (the reference would read block 0) and is counted in the status.
TEST(DecodeEdge, CompletionWithoutTailSlotIsSkippedAndCounted) {
    for (int P : {1, 4, 16}) {
        SCOPED_TRACE("P = " + std::to_string(P));
        std::mt19937 rng(50 + P);
        const int64_t ring = P, B = 3, N = P + 1;
        HostTensor cache = make_kv_cache(8, 16, true);
        cache.fill_random_bytes(rng);
        HostTensor tail = make_tail_cache(B + 2, ring, true);
        fill_normal(tail, rng);
        DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, B + 2, 8 * 16);
        // Request 0: every token valid, then drop the tail slot of each completion.
        int64_t dropped = 0;
        for (int64_t t = 0; t < N; ++t) {
            if (in.slot_mapping.get<int32_t>({0, t}) >= 0) {
                in.tail_slot_mapping.set<int32_t>({0, t}, -1);
                ++dropped;
            }
        }
        ASSERT_GT(dropped, 0);
        DecodeRun ref, api, again;
        run_decode_both(cache, tail, in, P, true, ref, api, again);
        if (HasFatalFailure()) return;
        EXPECT_EQ(ref.skipped, dropped);
        EXPECT_EQ(api.skipped, dropped);
        EXPECT_EQ(again.skipped, dropped);
        EXPECT_BYTES_EQ(ref.cache, api.cache);
        EXPECT_BYTES_EQ(ref.tail, api.tail);
        // Nothing at the skipped slots: neither the K row nor the scale.
        for (int64_t t = 0; t < N; ++t) {
            const int64_t loc = in.slot_mapping.get<int32_t>({0, t});
            if (loc < 0) continue;
            const int64_t page = loc / 16, off = loc % 16, page_base = page * cache.strides()[0];
            for (int64_t b = 0; b < kD; ++b) {
                ASSERT_EQ(api.cache.bytes()[page_base + off * kD + b],
                          cache.bytes()[page_base + off * kD + b])
                    << "K row of skipped slot " << loc;
            }
            for (int64_t b = 0; b < 4; ++b) {
                ASSERT_EQ(api.cache.bytes()[page_base + 16 * kD + off * 4 + b],
                          cache.bytes()[page_base + 16 * kD + off * 4 + b])
                    << "scale of skipped slot " << loc;
            }
        }
    }
}

TEST(DecodeEdge, EmptyBatch) {
    for (auto [B, N] : {std::pair<int64_t, int64_t>{0, 1}, {3, 0}, {0, 0}}) {
        std::mt19937 rng(9);
        HostTensor cache = make_kv_cache(4, 16, false);
        cache.fill_random_bytes(rng);
        HostTensor tail = make_tail_cache(4, 4, false);
        tail.fill_random_bytes(rng);
        const HostTensor cache0 = cache, tail0 = tail;
        DecodeInputs in = make_decode_inputs(rng, B, N, 4, 4, 4, 64);
        const kpool_tensor c = cache.desc(), t = tail.desc(), tsm = in.tail_slot_mapping.desc(),
                           k = in.key.desc(), s = in.slot_score.desc(), a = in.ape.desc(),
                           sm = in.slot_mapping.desc(), pos = in.positions.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(
                            &c, &t, &tsm, &k, &s, &a, &sm, &pos, 4, kD, 1, &ex, &st),
                        st);
        EXPECT_EQ(st.skipped_completions, 0);
        EXPECT_BYTES_EQ(cache0, cache);
        EXPECT_BYTES_EQ(tail0, tail);
    }
}

// Seed a prefill, then decode tokens one call at a time, as an engine does:
// after each call the caches match the reference run of the same sequence.
TEST(DecodeEdge, SeedThenDecodeChain) {
    for (int P : {4, 16}) {
        SCOPED_TRACE("P = " + std::to_string(P));
        std::mt19937 rng(77 + P);
        const int64_t ring = 2 * P, tail_blocks = 4, block_size = 16;
        HostTensor cache = make_kv_cache(16, block_size, true);
        cache.fill_random_bytes(rng);
        HostTensor tail = make_tail_cache(tail_blocks, ring, true);
        tail.fill_random_bytes(rng);
        // Prefill: one request of 3P + 2 tokens in block 2.
        const int64_t prefill = 3 * P + 2, block = 2;
        HostTensor key(KPOOL_DTYPE_BFLOAT16, {prefill, kD}), gate(KPOOL_DTYPE_BFLOAT16, {prefill, kD}),
            tslot(KPOOL_DTYPE_INT64, {prefill});
        fill_normal(key, rng);
        fill_normal(gate, rng, 2.0f);
        for (int64_t i = 0; i < prefill; ++i) tslot.set<int64_t>({i}, block * ring + i % ring);
        HostTensor cache_ref = cache, tail_ref = tail;
        {
            const kpool_tensor td = tail_ref.desc(), k = key.desc(), g = gate.desc(), t = tslot.desc();
            kpool_ref::seed_tail_cache(&td, &k, &g, &t, P, kD);
            const kpool_tensor ta = tail.desc();
            kpool_status st{};
            const kpool_exec ex = cpu_exec();
            ASSERT_KPOOL_OK(kpool_seed_tail_cache(&ta, &k, &g, &t, P, kD, &ex, &st), st);
        }
        ASSERT_BYTES_EQ(tail_ref, tail);
        std::vector<int64_t> free_slots = distinct_slots(rng, 16 * block_size, 16 * block_size);
        for (int64_t pos = prefill; pos < prefill + 2 * P + 1; ++pos) {
            DecodeInputs in = make_decode_inputs(rng, 1, 1, P, ring, tail_blocks, 16 * block_size);
            in.positions.set<int32_t>({0, 0}, static_cast<int32_t>(pos));
            in.tail_slot_mapping.set<int32_t>({0, 0}, static_cast<int32_t>(block * ring + pos % ring));
            in.slot_mapping.set<int32_t>(
                {0, 0}, pos % P == P - 1 ? static_cast<int32_t>(free_slots[pos]) : -1);
            const kpool_tensor tsm = in.tail_slot_mapping.desc(), k = in.key.desc(),
                               s = in.slot_score.desc(), a = in.ape.desc(),
                               sm = in.slot_mapping.desc(), p = in.positions.desc();
            {
                const kpool_tensor c = cache_ref.desc(), t = tail_ref.desc();
                kpool_ref::decode_update_and_maybe_write_cache_batched(&c, &t, &tsm, &k, &s, &a,
                                                                       &sm, &p, P, kD, 1);
            }
            const kpool_tensor c = cache.desc(), t = tail.desc();
            kpool_status st{};
            const kpool_exec ex = cpu_exec();
            ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(
                                &c, &t, &tsm, &k, &s, &a, &sm, &p, P, kD, 1, &ex, &st),
                            st);
            ASSERT_BYTES_EQ(cache_ref, cache) << "after decoding position " << pos;
            ASSERT_BYTES_EQ(tail_ref, tail) << "after decoding position " << pos;
        }
    }
}

// ---------------------------------------------------------------------------
// 5. expand_pools_and_append_tail
// ---------------------------------------------------------------------------

class ExpandAndAppendTest : public ::testing::TestWithParam<ExpandTailParam> {};

void check_expand_and_append(int P, kpool_dtype ids_dtype, bool bound, int64_t rows, int64_t G,
                             uint32_t seed) {
    std::mt19937 rng(seed);
    HostTensor ids(ids_dtype, {rows, G}), seq_lens(KPOOL_DTYPE_INT32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t seq = r == 0 ? 0 : r == 1 ? P - 1 : std::uniform_int_distribution<int64_t>(0, 5000)(rng);
        seq_lens.set<int32_t>({r}, static_cast<int32_t>(seq));
        const int64_t pools = seq / P;
        for (int64_t g = 0; g < G; ++g) {
            int64_t id = std::uniform_int_distribution<int64_t>(-2, pools + 2)(rng);
            if (g % 5 == 3) id = -1;
            if (g == 7) {
                id = ids_dtype == KPOOL_DTYPE_INT32 ? int64_t(std::numeric_limits<int32_t>::min())
                                                    : std::numeric_limits<int64_t>::min();
            }
            ids.set_int({r, g}, id);
        }
    }
    HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, G * P + P - 1});
    out_ref.fill_random_bytes(rng);
    HostTensor out_api = out_ref, out_again = out_ref;
    const kpool_tensor i = ids.desc(), s = seq_lens.desc();
    {
        const kpool_tensor o = out_ref.desc();
        kpool_ref::expand_pools_and_append_tail(&i, &s, &o, P, bound);
    }
    for (HostTensor *out : {&out_api, &out_again}) {
        const kpool_tensor o = out->desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_expand_pools_and_append_tail(&i, &s, &o, P, bound, &ex, &st), st);
    }
    EXPECT_BYTES_EQ(out_ref, out_api);
    EXPECT_BYTES_EQ(out_api, out_again);
}

TEST_P(ExpandAndAppendTest, MatchesReference) {
    const auto [P, dtype, bound] = GetParam();
    check_expand_and_append(P, dtype, bound, 23, 9, 60000 + P * 3 + bound);
}

TEST_P(ExpandAndAppendTest, EmptyRowsAndGroups) {
    const auto [P, dtype, bound] = GetParam();
    check_expand_and_append(P, dtype, bound, 0, 9, 1);
    check_expand_and_append(P, dtype, bound, 5, 0, 2);
    check_expand_and_append(P, dtype, bound, 0, 0, 3);
}

INSTANTIATE_TEST_SUITE_P(All, ExpandAndAppendTest,
                         Combine(ValuesIn(kAllPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(false, true)),
                         ParamName());

// Large pool ids: id * P + c wraps to int32 as the reference's .to(int32).
TEST(ExpandEdge, LargePoolIdsWrapLikeTheReference) {
    for (int P : {4, 16}) {
        const int64_t rows = 2, G = 4;
        HostTensor ids(KPOOL_DTYPE_INT64, {rows, G}), seq_lens(KPOOL_DTYPE_INT32, {rows});
        const int64_t big[] = {int64_t(1) << 33, (int64_t(1) << 31) / P, std::numeric_limits<int32_t>::max(), 5};
        for (int64_t r = 0; r < rows; ++r) {
            seq_lens.set<int32_t>({r}, 1000 + int32_t(r));
            for (int64_t g = 0; g < G; ++g) ids.set<int64_t>({r, g}, big[g] + r);
        }
        HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, G * P + P - 1});
        HostTensor out_api = out_ref;
        const kpool_tensor i = ids.desc(), s = seq_lens.desc(), o = out_ref.desc(), oa = out_api.desc();
        kpool_ref::expand_pools_and_append_tail(&i, &s, &o, P, 0);
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_expand_pools_and_append_tail(&i, &s, &oa, P, 0, &ex, &st), st);
        EXPECT_BYTES_EQ(out_ref, out_api);
    }
}

// A padding row with seq_len < 0. The reference (C division, as Triton's)
// emits no tail for it: tail_count = seq_len - (seq_len / P) * P <= 0. A
// floor division would emit negative token ids instead. Rejecting the row
// with an error that names it is also acceptable; silently emitting
// something else is not.
TEST(ExpandEdge, NegativeSeqLenHasNoTailOrIsRejected) {
    for (int P : {4, 16}) {
        SCOPED_TRACE("P = " + std::to_string(P));
        const int64_t rows = 3, G = 2;
        HostTensor ids(KPOOL_DTYPE_INT32, {rows, G}), seq_lens(KPOOL_DTYPE_INT32, {rows});
        const int32_t seqs[] = {7, -1, -P - 1};
        for (int64_t r = 0; r < rows; ++r) {
            seq_lens.set<int32_t>({r}, seqs[r]);
            ids.set<int32_t>({r, 0}, -1);
            ids.set<int32_t>({r, 1}, 0);
        }
        HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, G * P + P - 1});
        out_ref.fill_byte(0x5A);
        HostTensor out_api = out_ref;
        const HostTensor before = out_ref;
        const kpool_tensor i = ids.desc(), s = seq_lens.desc(), o = out_ref.desc(), oa = out_api.desc();
        kpool_ref::expand_pools_and_append_tail(&i, &s, &o, P, 0);
        for (int64_t r = 1; r < rows; ++r) {
            for (int64_t c = G * P; c < G * P + P - 1; ++c) {
                ASSERT_EQ(out_ref.get<int32_t>({r, c}), -1) << "reference tail of seq_len " << seqs[r];
            }
        }
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        const kpool_status_code rc = kpool_expand_pools_and_append_tail(&i, &s, &oa, P, 0, &ex, &st);
        if (rc == KPOOL_OK) {
            EXPECT_BYTES_EQ(out_ref, out_api);
        } else {
            EXPECT_THAT(std::string(st.message), ::testing::HasSubstr("seq_lens[1]")) << st.message;
            EXPECT_BYTES_EQ(before, out_api);
        }
    }
}

// Empty tensors as kpool_tensor_contiguous builds them: a dim before an empty
// one gets stride 0 there. Nothing is read or written; the call must succeed.
TEST(ExpandEdge, EmptyDescriptorsFromTensorContiguous) {
    int32_t storage[16] = {};
    const int64_t ids_shape[2] = {5, 0}, seq_shape[1] = {5}, out_shape[2] = {5, 3};
    const kpool_tensor ids = kpool_tensor_contiguous(storage, KPOOL_DTYPE_INT32, 2, ids_shape);
    const kpool_tensor seq = kpool_tensor_contiguous(storage, KPOOL_DTYPE_INT32, 1, seq_shape);
    std::vector<int32_t> out_data(15, 77);
    const kpool_tensor out = kpool_tensor_contiguous(out_data.data(), KPOOL_DTYPE_INT32, 2, out_shape);
    kpool_status st{};
    const kpool_exec ex = cpu_exec();
    ASSERT_KPOOL_OK(kpool_expand_pools_and_append_tail(&ids, &seq, &out, 4, 0, &ex, &st), st);
    for (int32_t v : out_data) EXPECT_EQ(v, -1);  // seq_len 0: no tail
    const int64_t q_shape[2] = {0, kD}, fp8_shape[2] = {0, kD}, scale_shape[2] = {0, 1};
    const kpool_tensor q = kpool_tensor_contiguous(storage, KPOOL_DTYPE_BFLOAT16, 2, q_shape);
    const kpool_tensor fp8 = kpool_tensor_contiguous(storage, KPOOL_DTYPE_UINT8, 2, fp8_shape);
    const kpool_tensor scale = kpool_tensor_contiguous(storage, KPOOL_DTYPE_FLOAT32, 2, scale_shape);
    ASSERT_KPOOL_OK(kpool_fwht128_quant_fp8(&q, &fp8, &scale, &ex, &st), st);
}

// ---------------------------------------------------------------------------
// 6. expand_pools_to_tokens, 7. append_tail_to_topk
// ---------------------------------------------------------------------------

class ExpandToTokensTest : public ::testing::TestWithParam<ToTokensParam> {};

void check_expand_to_tokens(int P, kpool_dtype ids_dtype, TokenMap map, int64_t rows, int64_t G,
                            uint32_t seed) {
    std::mt19937 rng(seed);
    const int64_t topk = G * P;
    const GroupInputs groups = make_group_inputs(rng, P, ids_dtype, rows, G);
    TokenMapInputs tm = make_token_map(rng, map, rows, 3000);
    HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, topk});
    out_ref.fill_random_bytes(rng);
    HostTensor out_api = out_ref, out_again = out_ref;
    const kpool_tensor i = groups.ids.desc(), v = groups.valid.desc(), pt = tm.page_table.desc(),
                       to = tm.topk_offsets.desc();
    {
        const kpool_tensor o = out_ref.desc();
        kpool_ref::expand_pools_to_tokens(&i, &v, opt(pt, tm.has_table), opt(to, tm.has_offsets),
                                          &o, static_cast<int32_t>(topk), P);
    }
    for (HostTensor *out : {&out_api, &out_again}) {
        const kpool_tensor o = out->desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_expand_pools_to_tokens(&i, &v, opt(pt, tm.has_table),
                                                     opt(to, tm.has_offsets), &o,
                                                     static_cast<int32_t>(topk), P, &ex, &st),
                        st);
    }
    EXPECT_BYTES_EQ(out_ref, out_api);
    EXPECT_BYTES_EQ(out_api, out_again);
}

TEST_P(ExpandToTokensTest, MatchesReference) {
    const auto [P, dtype, map] = GetParam();
    check_expand_to_tokens(P, dtype, map, 17, 12, 70000 + P * 5 + int(map));
}

TEST_P(ExpandToTokensTest, EmptyRowsAndGroups) {
    const auto [P, dtype, map] = GetParam();
    check_expand_to_tokens(P, dtype, map, 0, 12, 4);
    check_expand_to_tokens(P, dtype, map, 3, 0, 5);
}

INSTANTIATE_TEST_SUITE_P(All, ExpandToTokensTest,
                         Combine(ValuesIn(kAllPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(TokenMap::kNone, TokenMap::kPageTable, TokenMap::kOffsets1d,
                                        TokenMap::kOffsets2d)),
                         ParamName());

class AppendTailTest : public ::testing::TestWithParam<AppendParam> {};

void check_append_tail(int P, TokenMap map, int64_t rows, int64_t C, uint32_t seed) {
    std::mt19937 rng(seed);
    HostTensor topk(KPOOL_DTYPE_INT32, {rows, C}), seq_lens(KPOOL_DTYPE_INT32, {rows}),
        pool_lens(KPOOL_DTYPE_INT32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < C; ++c) {
            topk.set<int32_t>({r, c}, std::uniform_int_distribution<int32_t>(-1, 1 << 20)(rng));
        }
        const int32_t seq = r == 0 ? 0 : std::uniform_int_distribution<int32_t>(0, 5000)(rng);
        int32_t pools = seq / P;
        // Mostly seq_len / P; some rows claim one pool fewer (a full tail) or one more (none).
        if (r % 7 == 3 && pools > 0) pools -= 1;
        if (r % 7 == 5) pools += 1;
        seq_lens.set<int32_t>({r}, seq);
        pool_lens.set<int32_t>({r}, pools);
    }
    TokenMapInputs tm = make_token_map(rng, map, rows, 3000);
    HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, C + P - 1});
    out_ref.fill_random_bytes(rng);
    HostTensor out_api = out_ref, out_again = out_ref;
    const kpool_tensor t = topk.desc(), s = seq_lens.desc(), pl = pool_lens.desc(),
                       pt = tm.page_table.desc(), to = tm.topk_offsets.desc();
    {
        const kpool_tensor o = out_ref.desc();
        kpool_ref::append_tail_to_topk(&t, &s, &pl, opt(pt, tm.has_table), opt(to, tm.has_offsets),
                                       &o, P);
    }
    for (HostTensor *out : {&out_api, &out_again}) {
        const kpool_tensor o = out->desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_append_tail_to_topk(&t, &s, &pl, opt(pt, tm.has_table),
                                                  opt(to, tm.has_offsets), &o, P, &ex, &st),
                        st);
    }
    EXPECT_BYTES_EQ(out_ref, out_api);
    EXPECT_BYTES_EQ(out_api, out_again);
    if (P == 1) {
        // With P == 1 the output is the input, whatever the map.
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < C; ++c) {
                ASSERT_EQ(out_api.get<int32_t>({r, c}), topk.get<int32_t>({r, c}));
            }
        }
    }
}

TEST_P(AppendTailTest, MatchesReference) {
    const auto [P, map] = GetParam();
    check_append_tail(P, map, 21, 40, 80000 + P * 11 + int(map));
}

TEST_P(AppendTailTest, EmptyRowsAndColumns) {
    const auto [P, map] = GetParam();
    check_append_tail(P, map, 0, 40, 6);
    check_append_tail(P, map, 4, 0, 7);
}

INSTANTIATE_TEST_SUITE_P(All, AppendTailTest,
                         Combine(ValuesIn(kAllPoolSizes),
                                 Values(TokenMap::kNone, TokenMap::kPageTable, TokenMap::kOffsets1d,
                                        TokenMap::kOffsets2d)),
                         ParamName());

// expand_pools_and_append_tail is expand_pools_to_tokens + append_tail_to_topk
// on the identity path (SPEC op 5).
TEST(ExpandEdge, FusedEqualsTwoStep) {
    for (int P : {1, 4, 16}) {
        std::mt19937 rng(90 + P);
        const int64_t rows = 9, G = 6;
        HostTensor ids(KPOOL_DTYPE_INT32, {rows, G}), valid(KPOOL_DTYPE_BOOL, {rows, G}),
            seq_lens(KPOOL_DTYPE_INT32, {rows}), pool_lens(KPOOL_DTYPE_INT32, {rows});
        for (int64_t r = 0; r < rows; ++r) {
            const int32_t seq = std::uniform_int_distribution<int32_t>(0, 900)(rng);
            seq_lens.set<int32_t>({r}, seq);
            pool_lens.set<int32_t>({r}, seq / P);
            for (int64_t g = 0; g < G; ++g) {
                const int32_t id = std::uniform_int_distribution<int32_t>(-1, seq / P)(rng);
                ids.set<int32_t>({r, g}, id);
                valid.set<uint8_t>({r, g}, id >= 0);
            }
        }
        HostTensor fused(KPOOL_DTYPE_INT32, {rows, G * P + P - 1}), tokens(KPOOL_DTYPE_INT32, {rows, G * P}),
            two_step(KPOOL_DTYPE_INT32, {rows, G * P + P - 1});
        const kpool_tensor i = ids.desc(), v = valid.desc(), s = seq_lens.desc(), pl = pool_lens.desc(),
                           f = fused.desc(), t = tokens.desc(), o = two_step.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_expand_pools_and_append_tail(&i, &s, &f, P, 0, &ex, &st), st);
        ASSERT_KPOOL_OK(kpool_expand_pools_to_tokens(&i, &v, nullptr, nullptr, &t,
                                                     static_cast<int32_t>(G * P), P, &ex, &st),
                        st);
        ASSERT_KPOOL_OK(kpool_append_tail_to_topk(&t, &s, &pl, nullptr, nullptr, &o, P, &ex, &st), st);
        EXPECT_BYTES_EQ(fused, two_step);
    }
}

// ---------------------------------------------------------------------------
// Strided views: every input and output as a view into a padded allocation
// (outer strides padded, 1-D and per-token index tensors with non-unit
// strides). The results must equal the reference on the same views, and the
// padding of the outputs must stay as it was.
// ---------------------------------------------------------------------------

TEST(StridedViews, Fwht) {
    for (bool scale_2d : {false, true}) {
        std::mt19937 rng(501);
        const int64_t rows = 37;
        HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
        fill_normal(q, rng, 3.0f);
        const HostTensor qs = restride(q, {kD + 48, 1});
        HostTensor fp8(KPOOL_DTYPE_UINT8, {rows, kD}, {kD + 16, 1});
        fp8.fill_random_bytes(rng);
        HostTensor scale = scale_2d ? HostTensor(KPOOL_DTYPE_FLOAT32, {rows, 1}, {5, 9})
                                    : HostTensor(KPOOL_DTYPE_FLOAT32, {rows}, {3});
        scale.fill_random_bytes(rng);
        HostTensor fp8_api = fp8, scale_api = scale;
        const kpool_tensor qd = qs.desc();
        {
            const kpool_tensor f = fp8.desc(), sc = scale.desc();
            kpool_ref::fwht128_quant_fp8(&qd, &f, &sc);
        }
        const kpool_tensor f = fp8_api.desc(), sc = scale_api.desc();
        kpool_status st{};
        const kpool_exec ex = cpu_exec();
        ASSERT_KPOOL_OK(kpool_fwht128_quant_fp8(&qd, &f, &sc, &ex, &st), st);
        EXPECT_BYTES_EQ(fp8, fp8_api);
        EXPECT_BYTES_EQ(scale, scale_api);
    }
}

TEST(StridedViews, Compress) {
    for (int P : {1, 4, 16}) {
        for (CompressMode mode : {CompressMode::kWrite, CompressMode::kWriteMasked, CompressMode::kWriteAndReturn}) {
            SCOPED_TRACE("P = " + std::to_string(P) + " " + mode_tag(mode));
            std::mt19937 rng(600 + P);
            const int64_t n = 29, block_size = 16, num_blocks = 8;
            HostTensor cache = make_kv_cache(num_blocks, block_size, true);
            cache.fill_random_bytes(rng);
            const CompressInputs in =
                make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, num_blocks * block_size);
            const HostTensor k = restride(in.slot_k, {P * (kD + 32) + 64, kD + 32, 1});
            const HostTensor sc = restride(in.slot_score, {P * (kD + 8) + 8, kD + 8, 1});
            const HostTensor a = restride(in.ape, {kD + 4, 1});
            const HostTensor l = restride(in.loc, {2});
            const HostTensor m = restride(in.write_mask, {3}, 0x00);
            const bool masked = mode == CompressMode::kWriteMasked;
            const bool ret = mode == CompressMode::kWriteAndReturn;
            HostTensor ck(KPOOL_DTYPE_FLOAT8_E4M3FN, {n, kD}, {kD + 72, 1});
            HostTensor cs(KPOOL_DTYPE_FLOAT32, {n, 1}, {3, 11});
            ck.fill_random_bytes(rng);
            cs.fill_random_bytes(rng);
            HostTensor cache_api = cache, ck_api = ck, cs_api = cs;
            const kpool_tensor kd = k.desc(), sd = sc.desc(), ad = a.desc(), ld = l.desc(), md = m.desc();
            {
                const kpool_tensor c = cache.desc(), o1 = ck.desc(), o2 = cs.desc();
                kpool_ref::compress_and_write_cache(&c, &kd, &sd, &ad, &ld, opt(md, masked), opt(o1, ret),
                                                    opt(o2, ret), P, kD, 1, 1);
            }
            const kpool_tensor c = cache_api.desc(), o1 = ck_api.desc(), o2 = cs_api.desc();
            kpool_status st{};
            const kpool_exec ex = cpu_exec();
            ASSERT_KPOOL_OK(kpool_compress_and_write_cache(&c, &kd, &sd, &ad, &ld, opt(md, masked), opt(o1, ret),
                                                           opt(o2, ret), P, kD, 1, 1, &ex, &st),
                            st);
            EXPECT_BYTES_EQ(cache, cache_api);
            EXPECT_BYTES_EQ(ck, ck_api);
            EXPECT_BYTES_EQ(cs, cs_api);
        }
    }
}

TEST(StridedViews, Seed) {
    for (int P : {4, 16}) {
        for (kpool_dtype dt : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
            SCOPED_TRACE("P = " + std::to_string(P) + " " + dtype_tag(dt));
            std::mt19937 rng(700 + P);
            const int64_t ring = 2 * P, num_blocks = 9;
            HostTensor tail = make_tail_cache(num_blocks, ring, true);
            tail.fill_random_bytes(rng);
            const SeedInputs in = make_seed_inputs(rng, P, ring, dt, num_blocks);
            const HostTensor k = restride(in.key, {kD + 72, 1}), g = restride(in.gate_score, {kD + 8, 1}),
                             t = restride(in.tslot, {2});
            HostTensor tail_api = tail;
            const kpool_tensor kd = k.desc(), gd = g.desc(), td = t.desc();
            {
                const kpool_tensor tl = tail.desc();
                kpool_ref::seed_tail_cache(&tl, &kd, &gd, &td, P, kD);
            }
            const kpool_tensor tl = tail_api.desc();
            kpool_status st{};
            const kpool_exec ex = cpu_exec();
            ASSERT_KPOOL_OK(kpool_seed_tail_cache(&tl, &kd, &gd, &td, P, kD, &ex, &st), st);
            EXPECT_BYTES_EQ(tail, tail_api);
        }
    }
}

TEST(StridedViews, Decode) {
    for (int P : {1, 4, 16}) {
        for (int64_t N : {int64_t(1), int64_t(P + 3)}) {
            SCOPED_TRACE("P = " + std::to_string(P) + " N = " + std::to_string(N));
            std::mt19937 rng(800 + P + N);
            const int64_t B = 6, ring = 2 * P, block_size = 16;
            const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2), tail_blocks = B + 3;
            HostTensor cache = make_kv_cache(num_blocks, block_size, true);
            cache.fill_random_bytes(rng);
            HostTensor tail = make_tail_cache(tail_blocks, ring, true);
            fill_normal(tail, rng);
            DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
            // Drop the tail slot of one completion, so the skipped count is
            // computed through the strided views too.
            int64_t dropped = 0;
            for (int64_t t = 0; t < N && dropped == 0; ++t) {
                if (in.slot_mapping.get<int32_t>({0, t}) >= 0) {
                    in.tail_slot_mapping.set<int32_t>({0, t}, -1);
                    ++dropped;
                }
            }
            DecodeInputs v;
            v.tail_slot_mapping = restride(in.tail_slot_mapping, {2 * N + 5, 2});
            v.slot_mapping = restride(in.slot_mapping, {N + 1, 1});
            v.positions = restride(in.positions, {1, B});  // column-major
            v.key = restride(in.key, {N * (kD + 32) + 32, kD + 32, 1});
            v.slot_score = restride(in.slot_score, {N * (kD + 8), kD + 8, 1});
            v.ape = restride(in.ape, {kD + 16, 1});
            DecodeRun ref, api, again;
            run_decode_both(cache, tail, v, P, true, ref, api, again);
            if (HasFatalFailure()) return;
            EXPECT_EQ(ref.skipped, dropped);
            EXPECT_EQ(api.skipped, dropped);
            EXPECT_BYTES_EQ(ref.cache, api.cache);
            EXPECT_BYTES_EQ(ref.tail, api.tail);
        }
    }
}

TEST(StridedViews, ExpandFamily) {
    for (int P : {1, 4, 16}) {
        SCOPED_TRACE("P = " + std::to_string(P));
        std::mt19937 rng(900 + P);
        const int64_t rows = 11, G = 5, W = 300;
        HostTensor ids(KPOOL_DTYPE_INT64, {rows, G}), valid(KPOOL_DTYPE_BOOL, {rows, G}),
            seq(KPOOL_DTYPE_INT32, {rows}), pools(KPOOL_DTYPE_INT32, {rows});
        for (int64_t r = 0; r < rows; ++r) {
            const int32_t len = std::uniform_int_distribution<int32_t>(0, 400)(rng);
            seq.set<int32_t>({r}, len);
            pools.set<int32_t>({r}, len / P);
            for (int64_t g = 0; g < G; ++g) {
                ids.set<int64_t>({r, g}, std::uniform_int_distribution<int64_t>(-1, len / P + 1)(rng));
                valid.set<uint8_t>({r, g}, (r + g) % 3 != 0);
            }
        }
        TokenMapInputs tm1 = make_token_map(rng, TokenMap::kOffsets1d, rows, W);
        TokenMapInputs tm2 = make_token_map(rng, TokenMap::kOffsets2d, rows, W);
        const HostTensor ids_s = restride(ids, {G + 3, 1}), valid_s = restride(valid, {G + 2, 1}, 0),
                         seq_s = restride(seq, {2}), pools_s = restride(pools, {3}),
                         table_s = restride(tm1.page_table, {W + 7, 1}), off1_s = restride(tm1.topk_offsets, {3}),
                         off2_s = restride(tm2.topk_offsets, {4, 1});
        const kpool_tensor i = ids_s.desc(), v = valid_s.desc(), s = seq_s.desc(), pl = pools_s.desc(),
                           pt = table_s.desc(), o1 = off1_s.desc(), o2 = off2_s.desc();
        const kpool_exec ex = cpu_exec();
        kpool_status st{};
        {
            HostTensor out(KPOOL_DTYPE_INT32, {rows, G * P + P - 1}, {G * P + P + 5, 1});
            out.fill_random_bytes(rng);
            HostTensor out_api = out;
            const kpool_tensor o = out.desc(), oa = out_api.desc();
            kpool_ref::expand_pools_and_append_tail(&i, &s, &o, P, 1);
            ASSERT_KPOOL_OK(kpool_expand_pools_and_append_tail(&i, &s, &oa, P, 1, &ex, &st), st);
            EXPECT_BYTES_EQ(out, out_api);
        }
        for (int map = 0; map < 4; ++map) {
            SCOPED_TRACE("token map " + std::to_string(map));
            const kpool_tensor *table = map == 1 ? &pt : nullptr;
            const kpool_tensor *offsets = map == 2 ? &o1 : map == 3 ? &o2 : nullptr;
            HostTensor tokens(KPOOL_DTYPE_INT32, {rows, G * P}, {G * P + 9, 1});
            tokens.fill_random_bytes(rng);
            HostTensor tokens_api = tokens;
            const kpool_tensor t = tokens.desc(), ta = tokens_api.desc();
            kpool_ref::expand_pools_to_tokens(&i, &v, table, offsets, &t, static_cast<int32_t>(G * P), P);
            ASSERT_KPOOL_OK(kpool_expand_pools_to_tokens(&i, &v, table, offsets, &ta, static_cast<int32_t>(G * P),
                                                         P, &ex, &st),
                            st);
            EXPECT_BYTES_EQ(tokens, tokens_api);
            // The tokens as a strided topk_result for append_tail_to_topk.
            const HostTensor topk = restride(tokens_api, {G * P + 2, 1});
            HostTensor out(KPOOL_DTYPE_INT32, {rows, G * P + P - 1}, {G * P + P + 3, 1});
            out.fill_random_bytes(rng);
            HostTensor out_api = out;
            const kpool_tensor tk = topk.desc(), o = out.desc(), oa = out_api.desc();
            kpool_ref::append_tail_to_topk(&tk, &s, &pl, table, offsets, &o, P);
            ASSERT_KPOOL_OK(kpool_append_tail_to_topk(&tk, &s, &pl, table, offsets, &oa, P, &ex, &st), st);
            EXPECT_BYTES_EQ(out, out_api);
        }
    }
}

// ---------------------------------------------------------------------------
// The engine layout: the tail ring aliases the indexer allocation. Each page
// of one buffer holds block_size K rows + scales, then the page's tail ring
// (both halves); kv_cache and tail_kv_cache are two views of it. Seed,
// compress and decode on those views match the reference on the same views.
// ---------------------------------------------------------------------------

TEST(AliasedLayout, TailRingInsideIndexerPages) {
    for (int P : {4, 16}) {
        SCOPED_TRACE("P = " + std::to_string(P));
        std::mt19937 rng(1100 + P);
        const int64_t block_size = 16, ring = P, num_blocks = 12;
        const int64_t tail_bytes = 2 * ring * kD * 2;
        const int64_t page = block_size * kRowBytes + tail_bytes + 32;  // a multiple of 4
        HostTensor storage(KPOOL_DTYPE_UINT8, {num_blocks * page});
        storage.fill_random_bytes(rng);
        {
            // Finite bf16 everywhere in the ring parts (reads of earlier stashes).
            for (int64_t b = 0; b < num_blocks; ++b) {
                auto *ring_bits = reinterpret_cast<uint16_t *>(storage.raw() + b * page + block_size * kRowBytes);
                for (int64_t e = 0; e < tail_bytes / 2; ++e) ring_bits[e] = random_bf16(rng);
            }
        }
        auto views = [&](HostTensor &buf, kpool_tensor &kv, kpool_tensor &tail) {
            kv = kpool_tensor{};
            kv.data = buf.raw();
            kv.dtype = KPOOL_DTYPE_UINT8;
            kv.ndim = 3;
            kv.shape[0] = num_blocks;
            kv.shape[1] = block_size;
            kv.shape[2] = kRowBytes;
            kv.strides[0] = page;
            kv.strides[1] = kRowBytes;
            kv.strides[2] = 1;
            tail = kpool_tensor{};
            tail.data = buf.raw() + block_size * kRowBytes;
            tail.dtype = KPOOL_DTYPE_BFLOAT16;
            tail.ndim = 4;
            tail.shape[0] = num_blocks;
            tail.shape[1] = 2;
            tail.shape[2] = ring;
            tail.shape[3] = kD;
            tail.strides[0] = page / 2;
            tail.strides[1] = ring * kD;
            tail.strides[2] = kD;
            tail.strides[3] = 1;
        };
        HostTensor ref = storage, api = storage;
        kpool_tensor kv_ref, tail_ref, kv_api, tail_api;
        views(ref, kv_ref, tail_ref);
        views(api, kv_api, tail_api);
        const kpool_exec ex = cpu_exec();
        kpool_status st{};

        // Prefill: seed the tails and compress the complete pools.
        const SeedInputs seed = make_seed_inputs(rng, P, ring, KPOOL_DTYPE_INT64, num_blocks);
        const kpool_tensor k = seed.key.desc(), g = seed.gate_score.desc(), t = seed.tslot.desc();
        kpool_ref::seed_tail_cache(&tail_ref, &k, &g, &t, P, kD);
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(&tail_api, &k, &g, &t, P, kD, &ex, &st), st);
        const CompressInputs comp = make_compress_inputs(rng, 19, P, KPOOL_DTYPE_BFLOAT16, num_blocks * block_size);
        const kpool_tensor ck = comp.slot_k.desc(), cs = comp.slot_score.desc(), ca = comp.ape.desc(),
                           cl = comp.loc.desc();
        kpool_ref::compress_and_write_cache(&kv_ref, &ck, &cs, &ca, &cl, nullptr, nullptr, nullptr, P, kD, 1, 1);
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(&kv_api, &ck, &cs, &ca, &cl, nullptr, nullptr, nullptr, P,
                                                       kD, 1, 1, &ex, &st),
                        st);
        ASSERT_BYTES_EQ(ref, api) << "after seed + compress";

        // Decode two steps of next_n = P + 1.
        for (int step = 0; step < 2; ++step) {
            const DecodeInputs in = make_decode_inputs(rng, 5, P + 1, P, ring, num_blocks, num_blocks * block_size);
            const kpool_tensor tsm = in.tail_slot_mapping.desc(), dk = in.key.desc(), ds = in.slot_score.desc(),
                               da = in.ape.desc(), sm = in.slot_mapping.desc(), pos = in.positions.desc();
            kpool_ref::decode_update_and_maybe_write_cache_batched(&kv_ref, &tail_ref, &tsm, &dk, &ds, &da, &sm, &pos,
                                                                   P, kD, 1);
            ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(&kv_api, &tail_api, &tsm, &dk, &ds, &da,
                                                                              &sm, &pos, P, kD, 1, &ex, &st),
                            st);
            ASSERT_BYTES_EQ(ref, api) << "after decode step " << step;
        }
        EXPECT_NE(ref.bytes(), storage.bytes());
    }
}

// Independent calls from several threads at once (an engine with several
// streams or workers): each matches the reference.
TEST(Concurrency, CallsFromSeveralThreads) {
    const int kThreads = 4;
    std::vector<HostTensor> caches_ref, caches_api;
    std::vector<CompressInputs> inputs;
    std::vector<HostTensor> q, fp8_ref, fp8_api, scale_ref, scale_api;
    for (int i = 0; i < kThreads; ++i) {
        std::mt19937 rng(1200 + i);
        HostTensor cache = make_kv_cache(8, 16, i % 2 == 1);
        cache.fill_random_bytes(rng);
        caches_ref.push_back(cache);
        caches_api.push_back(cache);
        inputs.push_back(make_compress_inputs(rng, 41, i % 2 ? 16 : 4, KPOOL_DTYPE_BFLOAT16, 128));
        HostTensor qi(KPOOL_DTYPE_BFLOAT16, {300, kD});
        fill_normal(qi, rng);
        q.push_back(qi);
        fp8_ref.emplace_back(KPOOL_DTYPE_UINT8, std::vector<int64_t>{300, kD});
        fp8_api.emplace_back(KPOOL_DTYPE_UINT8, std::vector<int64_t>{300, kD});
        scale_ref.emplace_back(KPOOL_DTYPE_FLOAT32, std::vector<int64_t>{300});
        scale_api.emplace_back(KPOOL_DTYPE_FLOAT32, std::vector<int64_t>{300});
    }
    for (int i = 0; i < kThreads; ++i) {
        const int P = i % 2 ? 16 : 4;
        const kpool_tensor c = caches_ref[i].desc(), k = inputs[i].slot_k.desc(), s = inputs[i].slot_score.desc(),
                           a = inputs[i].ape.desc(), l = inputs[i].loc.desc();
        kpool_ref::compress_and_write_cache(&c, &k, &s, &a, &l, nullptr, nullptr, nullptr, P, kD, 1, 1);
        const kpool_tensor qd = q[i].desc(), f = fp8_ref[i].desc(), sc = scale_ref[i].desc();
        kpool_ref::fwht128_quant_fp8(&qd, &f, &sc);
    }
    std::vector<kpool_status_code> codes(kThreads, KPOOL_ERROR_INTERNAL);
    std::vector<std::string> messages(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back([&, i] {
            const int P = i % 2 ? 16 : 4;
            const kpool_exec ex = cpu_exec();
            for (int rep = 0; rep < 5; ++rep) {
                kpool_status st{};
                const kpool_tensor c = caches_api[i].desc(), k = inputs[i].slot_k.desc(),
                                   s = inputs[i].slot_score.desc(), a = inputs[i].ape.desc(), l = inputs[i].loc.desc();
                codes[i] = kpool_compress_and_write_cache(&c, &k, &s, &a, &l, nullptr, nullptr, nullptr, P, kD, 1, 1,
                                                          &ex, &st);
                if (codes[i] != KPOOL_OK) {
                    messages[i] = st.message;
                    return;
                }
                const kpool_tensor qd = q[i].desc(), f = fp8_api[i].desc(), sc = scale_api[i].desc();
                codes[i] = kpool_fwht128_quant_fp8(&qd, &f, &sc, &ex, &st);
                if (codes[i] != KPOOL_OK) {
                    messages[i] = st.message;
                    return;
                }
            }
        });
    }
    for (auto &th : threads) th.join();
    for (int i = 0; i < kThreads; ++i) {
        ASSERT_EQ(codes[i], KPOOL_OK) << "thread " << i << ": " << messages[i];
        EXPECT_BYTES_EQ(caches_ref[i], caches_api[i]);
        EXPECT_BYTES_EQ(fp8_ref[i], fp8_api[i]);
        EXPECT_BYTES_EQ(scale_ref[i], scale_api[i]);
    }
}

TEST(GroupBudget, DividesTopkByPoolSize) {
    for (int P : kAllPoolSizes) {
        for (int64_t topk : {int64_t(0), int64_t(P), int64_t(2048), int64_t(1) << 40}) {
            int64_t groups = -1;
            kpool_status st{};
            ASSERT_KPOOL_OK(kpool_history_group_budget_for_topk(topk, P, &groups, &st), st);
            EXPECT_EQ(groups, topk / P);
            EXPECT_EQ(groups, kpool_ref::history_group_budget_for_topk(topk, P));
        }
    }
}

TEST(Api, VersionAndNames) {
    EXPECT_THAT(std::string(kpool_version()), ::testing::StartsWith("kpool "));
    EXPECT_THAT(std::string(kpool_version()), ::testing::HasSubstr("cpu"));
    ASSERT_NE(kpool_status_name(KPOOL_OK), nullptr);
    ASSERT_NE(kpool_status_name(KPOOL_ERROR_OUT_OF_RANGE), nullptr);
    EXPECT_STRNE(kpool_status_name(KPOOL_OK), kpool_status_name(KPOOL_ERROR_OUT_OF_RANGE));
    ASSERT_NE(kpool_dtype_name(KPOOL_DTYPE_BFLOAT16), nullptr);
    EXPECT_STRNE(kpool_dtype_name(KPOOL_DTYPE_BFLOAT16), kpool_dtype_name(KPOOL_DTYPE_FLOAT32));
    const int64_t shape[3] = {2, 3, 5};
    float data[30];
    const kpool_tensor t = kpool_tensor_contiguous(data, KPOOL_DTYPE_FLOAT32, 3, shape);
    EXPECT_EQ(t.data, data);
    EXPECT_EQ(t.ndim, 3);
    EXPECT_EQ(t.strides[0], 15);
    EXPECT_EQ(t.strides[1], 5);
    EXPECT_EQ(t.strides[2], 1);
    EXPECT_EQ(t.device, KPOOL_DEVICE_CPU);
}

}  // namespace
}  // namespace kpool_test
