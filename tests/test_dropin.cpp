// What an engine swapping kpool in for the reference passes, through the C
// API: int64 decode indices (the kernel variant per index dtype), a
// persistent block table with more rows than the batch, and the inputs the
// reference computes on that a stricter check would refuse (a negative
// seq_len, a pool size that is no power of two in the budget), each against
// the scalar reference or the int32 call's bytes.
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

const kpool_exec kHost{};

// The same values in an int64 tensor of the same shape.
HostTensor widened(const HostTensor &t) {
    HostTensor w(KPOOL_DTYPE_INT64, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) {
        w.set<int64_t>({i / t.shape(1), i % t.shape(1)}, t.get<int32_t>({i / t.shape(1), i % t.shape(1)}));
    }
    return w;
}

kpool_status_code run_decode(HostTensor &cache, HostTensor &tail, const HostTensor &tsm, const DecodeInputs &in,
                             const HostTensor &sm, const HostTensor &pos, int P, kpool_status *st) {
    const kpool_tensor c = cache.desc(), t = tail.desc(), ts = tsm.desc(), k = in.key.desc(),
                       s = in.slot_score.desc(), a = in.ape.desc(), m = sm.desc(), p = pos.desc();
    return kpool_decode_update_and_maybe_write_cache_batched(&c, &t, &ts, &k, &s, &a, &m, &p, P, kD, 1, &kHost, st);
}

// int64 tail_slot_mapping / slot_mapping / positions give the int32 call's
// bytes (and the scalar reference's), skipped completions included.
TEST(DropIn, DecodeTakesInt64Indices) {
    for (int P : {4, 16}) {
        SCOPED_TRACE("P = " + std::to_string(P));
        std::mt19937 rng(2900 + P);
        const int64_t B = 5, N = P + 3, ring = 2 * P, block_size = 16, blocks = 2 * B * N / block_size + 2;
        HostTensor cache = make_kv_cache(blocks, block_size, true), tail = make_tail_cache(B + 4, ring, true);
        cache.fill_random_bytes(rng);
        fill_normal(tail, rng, 1.5f);
        DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, B + 4, blocks * block_size);
        // A completion without a tail block: skipped.
        for (int64_t t = 0; t < N; ++t) {
            if (in.slot_mapping.get<int32_t>({0, t}) >= 0) in.tail_slot_mapping.set<int32_t>({0, t}, -1);
        }
        HostTensor cache32 = cache, tail32 = tail, cache64 = cache, tail64 = tail;
        kpool_status st32{}, st64{};
        ASSERT_KPOOL_OK(run_decode(cache32, tail32, in.tail_slot_mapping, in, in.slot_mapping, in.positions, P, &st32),
                        st32);
        const HostTensor tsm64 = widened(in.tail_slot_mapping), sm64 = widened(in.slot_mapping),
                         pos64 = widened(in.positions);
        ASSERT_KPOOL_OK(run_decode(cache64, tail64, tsm64, in, sm64, pos64, P, &st64), st64);
        EXPECT_BYTES_EQ(cache32, cache64);
        EXPECT_BYTES_EQ(tail32, tail64);
        EXPECT_EQ(st32.skipped_completions, st64.skipped_completions);
        EXPECT_GT(st64.skipped_completions, 0);
        EXPECT_NE(cache64.bytes(), cache.bytes());

        HostTensor cache_ref = cache, tail_ref = tail;
        const kpool_tensor c = cache_ref.desc(), t = tail_ref.desc(), ts = tsm64.desc(), k = in.key.desc(),
                           s = in.slot_score.desc(), a = in.ape.desc(), m = sm64.desc(), p = pos64.desc();
        EXPECT_EQ(kpool_ref::decode_update_and_maybe_write_cache_batched(&c, &t, &ts, &k, &s, &a, &m, &p, P, kD, 1),
                  st64.skipped_completions);
        EXPECT_BYTES_EQ(cache_ref, cache64);
        EXPECT_BYTES_EQ(tail_ref, tail64);
    }
}

// An int64 index past int32 is out of range, not wrapped onto a valid slot
// (2^32 + 5 would be slot 5 in 32 bits); nothing is written.
TEST(DropIn, DecodeInt64IndexPastInt32IsOutOfRange) {
    const int P = 4;
    std::mt19937 rng(2911);
    const int64_t B = 2, N = 4, ring = 8, block_size = 16, blocks = 4;
    HostTensor cache = make_kv_cache(blocks, block_size, false), tail = make_tail_cache(B + 2, ring, false);
    cache.fill_random_bytes(rng);
    fill_normal(tail, rng, 1.5f);
    const DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, B + 2, blocks * block_size);
    for (const char *arg : {"slot_mapping", "tail_slot_mapping"}) {
        HostTensor tsm = widened(in.tail_slot_mapping), sm = widened(in.slot_mapping), pos = widened(in.positions);
        HostTensor &bad = std::string(arg) == "slot_mapping" ? sm : tsm;
        int64_t token = 0;
        while (sm.get<int64_t>({0, token}) < 0) ++token;  // a completing token of request 0
        bad.set<int64_t>({0, token}, (int64_t(1) << 32) + 5);
        HostTensor c = cache, t = tail;
        kpool_status st{};
        EXPECT_EQ(run_decode(c, t, tsm, in, sm, pos, P, &st), KPOOL_ERROR_OUT_OF_RANGE) << arg;
        EXPECT_THAT(std::string(st.message), ::testing::HasSubstr(std::string(arg) + "[0, "));
        EXPECT_BYTES_EQ(cache, c);
        EXPECT_BYTES_EQ(tail, t);
    }
    // A position past int32, which the kernels could not compute: rejected.
    HostTensor tsm = widened(in.tail_slot_mapping), sm = widened(in.slot_mapping), pos = widened(in.positions);
    pos.set<int64_t>({1, 2}, (int64_t(1) << 31) + 3);
    HostTensor c = cache, t = tail;
    kpool_status st{};
    EXPECT_EQ(run_decode(c, t, tsm, in, sm, pos, P, &st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(st.message), ::testing::HasSubstr("positions[1, 2] = 2147483651"));
    EXPECT_BYTES_EQ(cache, c);
    EXPECT_BYTES_EQ(tail, t);
}

// A block table with more rows than the batch (an engine's persistent one):
// rows past the batch are not read, and the result is the one of its first
// `rows` rows alone.
TEST(DropIn, PersistentBlockTable) {
    std::mt19937 rng(2920);
    const int P = 4;
    const int64_t rows = 5, G = 6, width = 10, table_rows = 8;
    const GroupInputs groups = make_group_inputs(rng, P, KPOOL_DTYPE_INT64, rows, G);
    HostTensor table(KPOOL_DTYPE_INT32, {table_rows, width});
    for (int64_t r = 0; r < table_rows; ++r) {
        for (int64_t c = 0; c < width; ++c) table.set<int32_t>({r, c}, int32_t(1000 * r + c));
    }
    HostTensor batch_table(KPOOL_DTYPE_INT32, {rows, width});
    std::copy_n(table.bytes().begin(), rows * width * 4, batch_table.bytes().begin());
    HostTensor out(KPOOL_DTYPE_INT32, {rows, G * P}), want = out, ref = out;
    const kpool_tensor ids = groups.ids.desc(), valid = groups.valid.desc(), pt = table.desc(),
                       bt = batch_table.desc(), o = out.desc(), w = want.desc(), r = ref.desc();
    kpool_status st{};
    ASSERT_KPOOL_OK(kpool_expand_pools_to_tokens(&ids, &valid, &pt, nullptr, &o, G * P, P, &kHost, &st), st);
    ASSERT_KPOOL_OK(kpool_expand_pools_to_tokens(&ids, &valid, &bt, nullptr, &w, G * P, P, &kHost, &st), st);
    kpool_ref::expand_pools_to_tokens(&ids, &valid, &bt, nullptr, &r, G * P, P);
    EXPECT_BYTES_EQ(want, out);
    EXPECT_BYTES_EQ(ref, out);

    HostTensor topk(KPOOL_DTYPE_INT32, {rows, 8}), seq(KPOOL_DTYPE_INT32, {rows}), pools(KPOOL_DTYPE_INT32, {rows});
    for (int64_t i = 0; i < rows; ++i) {
        seq.set<int32_t>({i}, int32_t(4 * i + i % P));
        pools.set<int32_t>({i}, int32_t(i));
    }
    HostTensor tail_out(KPOOL_DTYPE_INT32, {rows, 8 + P - 1}), tail_ref = tail_out;
    const kpool_tensor t = topk.desc(), s = seq.desc(), pl = pools.desc(), to = tail_out.desc(), tr = tail_ref.desc();
    ASSERT_KPOOL_OK(kpool_append_tail_to_topk(&t, &s, &pl, &pt, nullptr, &to, P, &kHost, &st), st);
    kpool_ref::append_tail_to_topk(&t, &s, &pl, &bt, nullptr, &tr, P);
    EXPECT_BYTES_EQ(tail_ref, tail_out);
}

// A negative seq_len: the reference's kernel computes it (its integer
// division truncates, so the tail count is <= 0: no tail); kpool gives the
// same, with and without bound_pool_ids.
TEST(DropIn, NegativeSeqLenHasNoTail) {
    const int P = 4;
    const int64_t rows = 4, G = 2;
    HostTensor ids(KPOOL_DTYPE_INT32, {rows, G}), seq(KPOOL_DTYPE_INT32, {rows});
    const int32_t lens[rows] = {-3, -4, std::numeric_limits<int32_t>::min(), 7};
    for (int64_t r = 0; r < rows; ++r) {
        seq.set<int32_t>({r}, lens[r]);
        for (int64_t g = 0; g < G; ++g) ids.set<int32_t>({r, g}, int32_t(g + r));
    }
    for (int32_t bound : {0, 1}) {
        HostTensor out(KPOOL_DTYPE_INT32, {rows, G * P + P - 1}), ref = out;
        const kpool_tensor i = ids.desc(), s = seq.desc(), o = out.desc(), r = ref.desc();
        kpool_status st{};
        ASSERT_KPOOL_OK(kpool_expand_pools_and_append_tail(&i, &s, &o, P, bound, &kHost, &st), st);
        kpool_ref::expand_pools_and_append_tail(&i, &s, &r, P, bound);
        EXPECT_BYTES_EQ(ref, out);
        for (int64_t row = 0; row < 3; ++row) {
            for (int64_t c = G * P; c < G * P + P - 1; ++c) EXPECT_EQ(out.get<int32_t>({row, c}), -1);
        }
        EXPECT_EQ(out.get<int32_t>({3, G * P}), 4);  // seq_len 7: tail tokens 4, 5, 6
    }
}

// The budget is arithmetic: the reference's rule, any positive pool size
// that divides topk.
TEST(DropIn, BudgetOfAnyPoolSize) {
    int64_t groups = 0;
    kpool_status st{};
    ASSERT_KPOOL_OK(kpool_history_group_budget_for_topk(12, 3, &groups, &st), st);
    EXPECT_EQ(groups, 4);
    ASSERT_KPOOL_OK(kpool_history_group_budget_for_topk(2048, 16, &groups, &st), st);
    EXPECT_EQ(groups, 128);
}

// Dtypes are named in messages, never shown as enum numbers.
TEST(DropIn, DtypesByName) {
    HostTensor ids(KPOOL_DTYPE_FLOAT32, {2, 2}), seq(KPOOL_DTYPE_INT32, {2}), out(KPOOL_DTYPE_INT32, {2, 11});
    const kpool_tensor i = ids.desc(), s = seq.desc(), o = out.desc();
    kpool_status st{};
    EXPECT_EQ(kpool_expand_pools_and_append_tail(&i, &s, &o, 4, 0, &kHost, &st), KPOOL_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(st.message), "pool_ids has dtype float32, expected int32 or int64");
}

}  // namespace
}  // namespace kpool_test
