// Regression tests for what the fuzzers (tests/fuzz/) found: each case is a
// minimal form of an input that once broke the contract (an error with a
// message and nothing written, or the reference's result).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

const kpool_exec kExec{nullptr};
using ::testing::HasSubstr;

// A cache without pages, a tail without blocks: valid (every index is a
// sentinel), nothing to write. The kernels once failed on the empty views
// ("Output buffer cache.0 is accessed at 0, which is beyond the max (-1)").
TEST(Hostile, DecodeWithAnEmptyCacheOrTail) {
    for (int P : {1, 4}) {
        for (bool empty_cache : {true, false}) {
            for (bool empty_tail : {true, false}) {
                std::mt19937 rng(P);
                const int64_t ring = 2 * P, B = 2, N = 3;
                HostTensor cache = make_kv_cache(empty_cache ? 0 : 2, 16, false);
                HostTensor tail = make_tail_cache(empty_tail ? 0 : 2, ring, false);
                cache.fill_random_bytes(rng);
                fill_normal(tail, rng, 1.5f);  // finite, as stashes leave it
                DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, 2, 32);
                for (int64_t b = 0; b < B; ++b) {
                    for (int64_t t = 0; t < N; ++t) {
                        if (empty_cache) in.slot_mapping.set<int32_t>({b, t}, t == 0 ? -1 : -5);
                        if (empty_tail) in.tail_slot_mapping.set<int32_t>({b, t}, -1);
                    }
                }
                HostTensor want_cache = cache, want_tail = tail, got_cache = cache, got_tail = tail;
                const kpool_tensor ts = in.tail_slot_mapping.desc(), k = in.key.desc(), s = in.slot_score.desc(),
                                   a = in.ape.desc(), sm = in.slot_mapping.desc(), p = in.positions.desc(),
                                   wc = want_cache.desc(), wt = want_tail.desc(), gc = got_cache.desc(),
                                   gt = got_tail.desc();
                const int64_t skipped = kpool_ref::decode_update_and_maybe_write_cache_batched(
                    &wc, &wt, &ts, &k, &s, &a, &sm, &p, P, kD, 1);
                kpool_status st{};
                ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(&gc, &gt, &ts, &k, &s, &a, &sm, &p, P, kD,
                                                                            1, &kExec, &st),
                          KPOOL_OK)
                    << "P = " << P << ", empty cache " << empty_cache << ", empty tail " << empty_tail << ": "
                    << st.message;
                EXPECT_EQ(st.skipped_completions, skipped);
                EXPECT_BYTES_EQ(want_cache, got_cache);
                EXPECT_BYTES_EQ(want_tail, got_tail);
            }
        }
    }
}

TEST(Hostile, CompressIntoAnEmptyCache) {
    for (bool ret : {false, true}) {
        std::mt19937 rng(3);
        const int P = 4, n = 5;
        HostTensor cache = make_kv_cache(0, 16, false);
        CompressInputs in = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, 16);
        for (int64_t i = 0; i < n; ++i) in.loc.set<int64_t>({i}, -1 - i);
        HostTensor ck(KPOOL_DTYPE_UINT8, {n, kD}), cs(KPOOL_DTYPE_FLOAT32, {n});
        HostTensor want_ck = ck, want_cs = cs;
        const kpool_tensor c = cache.desc(), k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(),
                           l = in.loc.desc(), kd = ck.desc(), sd = cs.desc(), wkd = want_ck.desc(),
                           wsd = want_cs.desc();
        kpool_ref::compress_and_write_cache(&c, &k, &s, &a, &l, nullptr, ret ? &wkd : nullptr, ret ? &wsd : nullptr,
                                            P, kD, 1, 1);
        kpool_status st{};
        ASSERT_EQ(kpool_compress_and_write_cache(&c, &k, &s, &a, &l, nullptr, ret ? &kd : nullptr,
                                                 ret ? &sd : nullptr, P, kD, 1, 1, &kExec, &st),
                  KPOOL_OK)
            << st.message;
        EXPECT_BYTES_EQ(want_ck, ck);
        EXPECT_BYTES_EQ(want_cs, cs);
    }
}

TEST(Hostile, SeedIntoAnEmptyTail) {
    std::mt19937 rng(4);
    const int P = 4;
    HostTensor tail = make_tail_cache(0, P, false);
    HostTensor key(KPOOL_DTYPE_BFLOAT16, {3, kD}), gate(KPOOL_DTYPE_BFLOAT16, {3, kD}), tslot(KPOOL_DTYPE_INT64, {3});
    fill_normal(key, rng);
    fill_normal(gate, rng);
    for (int64_t i = 0; i < 3; ++i) tslot.set<int64_t>({i}, -1 - 7 * i);
    const kpool_tensor t = tail.desc(), k = key.desc(), g = gate.desc(), ts = tslot.desc();
    kpool_status st{};
    EXPECT_EQ(kpool_seed_tail_cache(&t, &k, &g, &ts, P, kD, &kExec, &st), KPOOL_OK) << st.message;
}

// Output rows that overlap (a row stride below the row length) would make
// elements share memory: rejected, nothing written.
TEST(Hostile, OverlappingOutputRowsAreRejected) {
    std::mt19937 rng(5);
    const int64_t rows = 3;
    {
        HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
        fill_normal(q, rng);
        HostTensor fp8(KPOOL_DTYPE_UINT8, {rows, kD}, {kD - 1, 1}), scale(KPOOL_DTYPE_FLOAT32, {rows});
        fp8.fill_byte(0xA5);
        const HostTensor before = fp8;
        const kpool_tensor qd = q.desc(), fd = fp8.desc(), sd = scale.desc();
        kpool_status st{};
        EXPECT_EQ(kpool_fwht128_quant_fp8(&qd, &fd, &sd, &kExec, &st), KPOOL_ERROR_INVALID_ARGUMENT);
        EXPECT_THAT(std::string(st.message), HasSubstr("q_fp8"));
        EXPECT_BYTES_EQ(before, fp8);
    }
    {
        CompressInputs in = make_compress_inputs(rng, rows, 4, KPOOL_DTYPE_BFLOAT16, 16);
        HostTensor ck(KPOOL_DTYPE_UINT8, {rows, kD}, {64, 1}), cs(KPOOL_DTYPE_FLOAT32, {rows});
        const kpool_tensor k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(), l = in.loc.desc(),
                           kd = ck.desc(), sd = cs.desc();
        kpool_status st{};
        EXPECT_EQ(kpool_compress_and_write_cache(nullptr, &k, &s, &a, &l, nullptr, &kd, &sd, 4, kD, 1, 0, &kExec, &st),
                  KPOOL_ERROR_INVALID_ARGUMENT);
        EXPECT_THAT(std::string(st.message), HasSubstr("compressed_k"));
    }
    {
        const int P = 4, G = 2;
        HostTensor ids(KPOOL_DTYPE_INT32, {rows, G}), lens(KPOOL_DTYPE_INT32, {rows}), valid(KPOOL_DTYPE_BOOL, {rows, G});
        HostTensor out(KPOOL_DTYPE_INT32, {rows, G * P + P - 1}, {G * P, 1});
        HostTensor out_topk(KPOOL_DTYPE_INT32, {rows, G * P}, {1, 1});
        out.fill_byte(0xA5);
        const HostTensor before = out;
        const kpool_tensor i = ids.desc(), sl = lens.desc(), v = valid.desc(), o = out.desc(), ot = out_topk.desc();
        kpool_status st{};
        EXPECT_EQ(kpool_expand_pools_and_append_tail(&i, &sl, &o, P, 0, &kExec, &st), KPOOL_ERROR_INVALID_ARGUMENT);
        EXPECT_THAT(std::string(st.message), HasSubstr("out"));
        EXPECT_EQ(kpool_expand_pools_to_tokens(&i, &v, nullptr, nullptr, &ot, G * P, P, &kExec, &st),
                  KPOOL_ERROR_INVALID_ARGUMENT);
        HostTensor topk(KPOOL_DTYPE_INT32, {rows, G * P});
        const kpool_tensor t = topk.desc();
        EXPECT_EQ(kpool_append_tail_to_topk(&t, &sl, &sl, nullptr, nullptr, &o, P, &kExec, &st),
                  KPOOL_ERROR_INVALID_ARGUMENT);
        EXPECT_BYTES_EQ(before, out);
    }
}

// Ids near INT64_MAX: token = id * P + offset wraps modulo 2^64 before it
// is narrowed to int32 (or clamped into the page table), as in torch.
TEST(Hostile, Int64IdsWrapLikeTorch) {
    const int P = 64, rows = 1, G = 3;
    HostTensor ids(KPOOL_DTYPE_INT64, {rows, G}), valid(KPOOL_DTYPE_BOOL, {rows, G}), lens(KPOOL_DTYPE_INT32, {rows});
    const int64_t big[] = {std::numeric_limits<int64_t>::max(), (int64_t(1) << 62) + 5, std::numeric_limits<int64_t>::max() / 64 + 1};
    for (int g = 0; g < G; ++g) {
        ids.set<int64_t>({0, g}, big[g]);
        valid.set<uint8_t>({0, g}, 1);
    }
    lens.set<int32_t>({0}, 100);
    std::mt19937 rng(6);
    for (int map = 0; map < 3; ++map) {
        TokenMapInputs tm = make_token_map(rng, TokenMap(map), rows, 50);
        HostTensor want(KPOOL_DTYPE_INT32, {rows, G * P}), got = want;
        const kpool_tensor i = ids.desc(), v = valid.desc(), pt = tm.page_table.desc(), to = tm.topk_offsets.desc(),
                           w = want.desc(), o = got.desc();
        kpool_ref::expand_pools_to_tokens(&i, &v, opt(pt, tm.has_table), opt(to, tm.has_offsets), &w, G * P, P);
        kpool_status st{};
        ASSERT_EQ(kpool_expand_pools_to_tokens(&i, &v, opt(pt, tm.has_table), opt(to, tm.has_offsets), &o, G * P, P,
                                               &kExec, &st),
                  KPOOL_OK)
            << st.message;
        EXPECT_BYTES_EQ(want, got) << "map " << map;
    }
    HostTensor want(KPOOL_DTYPE_INT32, {rows, G * P + P - 1}), got = want;
    const kpool_tensor i = ids.desc(), l = lens.desc(), w = want.desc(), o = got.desc();
    kpool_ref::expand_pools_and_append_tail(&i, &l, &w, P, 0);
    kpool_status st{};
    ASSERT_EQ(kpool_expand_pools_and_append_tail(&i, &l, &o, P, 0, &kExec, &st), KPOOL_OK) << st.message;
    EXPECT_BYTES_EQ(want, got);
}

// Descriptors the validation once mishandled (UBSan: signed overflow, a
// misaligned load), each rejected now with a message naming the argument.
TEST(Hostile, HugeBroadcastDimsAreRejectedWithoutOverflow) {
    std::mt19937 rng(7);
    HostTensor q(KPOOL_DTYPE_BFLOAT16, {2, kD}), fp8(KPOOL_DTYPE_UINT8, {2, kD}), scale(KPOOL_DTYPE_FLOAT32, {2});
    kpool_tensor qd = q.desc(), fd = fp8.desc(), sd = scale.desc();
    // [2^63 - 1, 128] with stride 0 in dim 0: one row of memory, seen
    // INT64_MAX times; its element count overflows int64.
    qd.shape[0] = std::numeric_limits<int64_t>::max();
    qd.strides[0] = 0;
    kpool_status st{};
    EXPECT_EQ(kpool_fwht128_quant_fp8(&qd, &fd, &sd, &kExec, &st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("q"));
    // An empty pool_ids [0, 2^62]: out's width (2^62 * P) once overflowed.
    HostTensor ids(KPOOL_DTYPE_INT64, {1, 1}), lens(KPOOL_DTYPE_INT32, {1}), out(KPOOL_DTYPE_INT32, {1, 3});
    kpool_tensor i = ids.desc(), l = lens.desc(), o = out.desc();
    i.shape[0] = 0;
    i.shape[1] = int64_t(1) << 62;
    l.shape[0] = 0;
    o.shape[0] = 0;
    st = kpool_status{};
    EXPECT_EQ(kpool_expand_pools_and_append_tail(&i, &l, &o, 32, 0, &kExec, &st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("pool_ids"));
}

// Strides near INT64_MAX on the caches: the layout checks once summed them
// (tail strides[1] + RING * 128, block_size * 132) before checking them
// against int32 (UBSan: signed overflow; issue 26's decode input made the
// fuzz harness do the same sum).
TEST(Hostile, HugeCacheStridesAreRejectedWithoutOverflow) {
    const int P = 4;
    std::mt19937 rng(9);
    HostTensor tail = make_tail_cache(2, P, false), key(KPOOL_DTYPE_BFLOAT16, {1, kD}),
               gate(KPOOL_DTYPE_BFLOAT16, {1, kD}), tslot(KPOOL_DTYPE_INT32, {1});
    tslot.set<int32_t>({0}, 0);
    tail.fill_random_bytes(rng);
    const HostTensor tail0 = tail;
    kpool_tensor t = tail.desc(), k = key.desc(), g = gate.desc(), s = tslot.desc();
    t.strides[1] = std::numeric_limits<int64_t>::max();
    kpool_status st{};
    EXPECT_EQ(kpool_seed_tail_cache(&t, &k, &g, &s, P, kD, &kExec, &st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("tail_kv_cache"));
    EXPECT_BYTES_EQ(tail0, tail);
    // A kv_cache whose block_size * 132 overflows int64 (dim 1 broadcast).
    HostTensor cache = make_kv_cache(2, 16, false);
    const CompressInputs in = make_compress_inputs(rng, 1, P, KPOOL_DTYPE_BFLOAT16, 32);
    kpool_tensor c = cache.desc();
    c.shape[1] = std::numeric_limits<int64_t>::max() / 64;
    c.strides[1] = kRowBytes;
    const kpool_tensor sk = in.slot_k.desc(), ss = in.slot_score.desc(), a = in.ape.desc(), l = in.loc.desc();
    st = kpool_status{};
    EXPECT_EQ(kpool_compress_and_write_cache(&c, &sk, &ss, &a, &l, nullptr, nullptr, nullptr, P, kD, 1, 1, &kExec, &st),
              KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("kv_cache"));
}

TEST(Hostile, NegativeDimAfterAnEmptyDimIsRejected) {
    HostTensor topk(KPOOL_DTYPE_INT32, {1, 1}), lens(KPOOL_DTYPE_INT32, {1}), out(KPOOL_DTYPE_INT32, {1, 3});
    kpool_tensor t = topk.desc(), l = lens.desc(), o = out.desc();
    t.shape[0] = 0;
    t.shape[1] = -5;
    kpool_status st{};
    EXPECT_EQ(kpool_append_tail_to_topk(&t, &l, &l, nullptr, nullptr, &o, 4, &kExec, &st),
              KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("topk_result has a negative size"));
}

TEST(Hostile, MisalignedDataIsRejected) {
    std::mt19937 rng(8);
    const int P = 4;
    HostTensor ids(KPOOL_DTYPE_INT32, {2, 3}), lens(KPOOL_DTYPE_INT32, {3}), out(KPOOL_DTYPE_INT32, {2, 3 * P + P - 1});
    kpool_tensor i = ids.desc(), l = lens.desc(), o = out.desc();
    l.shape[0] = 2;
    l.data = static_cast<uint8_t *>(l.data) + 1;  // an int32 vector one byte in
    out.fill_byte(0xA5);
    const HostTensor before = out;
    kpool_status st{};
    EXPECT_EQ(kpool_expand_pools_and_append_tail(&i, &l, &o, P, 0, &kExec, &st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("seq_lens has data at"));
    EXPECT_BYTES_EQ(before, out);
    // The K cache holds f32 scales: 4-byte alignment.
    CompressInputs in = make_compress_inputs(rng, 2, P, KPOOL_DTYPE_BFLOAT16, 16);
    HostTensor cache(KPOOL_DTYPE_UINT8, {1, 16 * kRowBytes + 8});
    kpool_tensor c = make_kv_cache(1, 16, false).desc();
    c.data = cache.raw() + 2;
    const kpool_tensor k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(), lo = in.loc.desc();
    st = kpool_status{};
    EXPECT_EQ(kpool_compress_and_write_cache(&c, &k, &s, &a, &lo, nullptr, nullptr, nullptr, P, kD, 1, 1, &kExec, &st),
              KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), HasSubstr("kv_cache"));
}

// Found by fuzz_append_tail: the kernels computed pool_len * P and the tail
// test `c - C < seq_len - tail_start` in int32, and Halide's simplifier,
// which assumes int32 never overflows, rearranged the test, so seq_len near
// INT32_MAX lost its tail and pool_len * P past INT32_MAX wrapped.
TEST(Hostile, AppendTailNearInt32Max) {
    const int P = 8;
    const int64_t rows = 3, C = 9;
    HostTensor topk(KPOOL_DTYPE_INT32, {rows, C}), seq(KPOOL_DTYPE_INT32, {rows}), pools(KPOOL_DTYPE_INT32, {rows});
    const int32_t max = std::numeric_limits<int32_t>::max();
    const int32_t lens[] = {max, max - 3, 1000}, pool_lens[] = {351, max / P, max / 4};
    for (int64_t r = 0; r < rows; ++r) {
        seq.set<int32_t>({r}, lens[r]);
        pools.set<int32_t>({r}, pool_lens[r]);
        for (int64_t c = 0; c < C; ++c) topk.set<int32_t>({r, c}, int32_t(r * 100 + c));
    }
    HostTensor want(KPOOL_DTYPE_INT32, {rows, C + P - 1}), got = want;
    const kpool_tensor t = topk.desc(), s = seq.desc(), p = pools.desc(), w = want.desc(), o = got.desc();
    kpool_ref::append_tail_to_topk(&t, &s, &p, nullptr, nullptr, &w, P);
    kpool_status st{};
    ASSERT_EQ(kpool_append_tail_to_topk(&t, &s, &p, nullptr, nullptr, &o, P, &kExec, &st), KPOOL_OK) << st.message;
    EXPECT_BYTES_EQ(want, got);
}

}  // namespace
}  // namespace kpool_test
