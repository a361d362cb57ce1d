// Duplicate write locations, where the reference is undefined (it races):
// the behaviour kpool defines in docs/behaviour.md, checked.
//   - Several writers aimed at one slot (two pools with the same loc, two
//     tokens seeding the same ring slot, two requests stashing into a shared
//     tail block, two completions with the same slot_mapping): every byte
//     of that slot comes from one of those writers' rows, and no other byte
//     of the cache changes (every other slot as the reference writes it).
//   - Within one decode request, stashes are ordered: the last token's stash
//     of a ring slot wins, and a completion sees its request's earlier
//     stashes (exactly the reference).
//   - A completion never sees another request's stashes of the same call:
//     it reads the ring as it was before the call (each request runs as the
//     reference does on that request alone).
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

const kpool_exec kExec{nullptr};

// Per byte of `got`: equal to `want`, or, inside a contested byte range, one
// of that byte's candidates.
struct Contested {
    std::map<size_t, std::set<uint8_t>> bytes;
    void add(size_t at, const uint8_t *candidate, size_t count) {
        for (size_t i = 0; i < count; ++i) bytes[at + i].insert(candidate[i]);
    }
};

::testing::AssertionResult MatchesWithContested(const HostTensor &want, const HostTensor &got, const Contested &c) {
    int64_t stray = 0, foreign = 0;
    std::ostringstream first;
    for (size_t b = 0; b < want.bytes().size(); ++b) {
        auto it = c.bytes.find(b);
        if (it == c.bytes.end()) {
            if (want.bytes()[b] != got.bytes()[b] && stray++ == 0) first << " first stray byte " << b << ";";
        } else if (it->second.count(got.bytes()[b]) == 0 && foreign++ == 0) {
            first << " first foreign byte " << b << ";";
        }
    }
    if (stray == 0 && foreign == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << stray << " uncontested bytes differ from the reference, " << foreign
                                         << " contested bytes hold a value no writer wrote:" << first.str();
}

// Byte offsets of a cache slot's codes and scale.
size_t codes_at(const HostTensor &cache, int64_t loc) {
    return size_t((loc / cache.shape(1)) * cache.strides()[0] + (loc % cache.shape(1)) * kD);
}
size_t scale_at(const HostTensor &cache, int64_t loc) {
    return size_t((loc / cache.shape(1)) * cache.strides()[0] + cache.shape(1) * kD + (loc % cache.shape(1)) * 4);
}

TEST(Duplicates, PoolsWithTheSameLocWriteOneOfTheirRows) {
    for (int P : {1, 4, 16, 64}) {
        for (kpool_dtype score : {KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32}) {
            std::mt19937 rng(900 + P);
            const int64_t n = 24, blocks = 4, block_size = 16;
            HostTensor cache = make_kv_cache(blocks, block_size, true);
            cache.fill_random_bytes(rng);
            CompressInputs in = make_compress_inputs(rng, n, P, score, blocks * block_size);
            // Groups of 2, 3 and 4 pools on one slot each; a masked-out
            // duplicate; everything else distinct.
            const int64_t groups[][4] = {{0, 7, -1, -1}, {1, 2, 3, -1}, {8, 9, 10, 11}, {14, 15, -1, -1}};
            const int64_t targets[] = {5, 17, 63, 40};
            for (int g = 0; g < 4; ++g) {
                for (int64_t i : groups[g]) {
                    if (i >= 0) in.loc.set<int64_t>({i}, targets[g]);
                }
            }
            for (int64_t i = 0; i < n; ++i) in.write_mask.set<uint8_t>({i}, 1);
            in.write_mask.set<uint8_t>({15}, 0);  // pool 15 is masked out: slot 40 has one writer

            HostTensor rows_k(KPOOL_DTYPE_UINT8, {n, kD}), rows_s(KPOOL_DTYPE_FLOAT32, {n});
            HostTensor want = cache, got = cache;
            const kpool_tensor k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(), l = in.loc.desc(),
                               m = in.write_mask.desc(), w = want.desc(), gd = got.desc(), rk = rows_k.desc(),
                               rs = rows_s.desc();
            kpool_ref::compress_and_write_cache(&w, &k, &s, &a, &l, &m, nullptr, nullptr, P, kD, 1, 1);
            kpool_ref::compress_and_write_cache(nullptr, &k, &s, &a, &l, nullptr, &rk, &rs, P, kD, 1, 0);
            kpool_status st{};
            ASSERT_EQ(kpool_compress_and_write_cache(&gd, &k, &s, &a, &l, &m, nullptr, nullptr, P, kD, 1, 1, &kExec, &st),
                      KPOOL_OK)
                << st.message;
            // Every slot's writers (the inputs put pool n-1 on the last slot too).
            std::map<int64_t, std::vector<int64_t>> writers;
            for (int64_t i = 0; i < n; ++i) {
                const int64_t loc = in.loc.get<int64_t>({i});
                if (loc >= 0 && in.write_mask.get<uint8_t>({i})) writers[loc].push_back(i);
            }
            Contested c;
            int contested_slots = 0;
            for (auto &[loc, pools] : writers) {
                if (pools.size() < 2) continue;
                ++contested_slots;
                for (int64_t i : pools) {
                    c.add(codes_at(cache, loc), rows_k.raw() + i * kD, kD);
                    c.add(scale_at(cache, loc), rows_s.raw() + i * 4, 4);
                }
            }
            EXPECT_GE(contested_slots, 3);
            EXPECT_TRUE(MatchesWithContested(want, got, c)) << "P = " << P;
            // Slot 40 has one unmasked writer (pool 14): exactly its row.
            EXPECT_EQ(0, std::memcmp(got.raw() + codes_at(cache, 40), rows_k.raw() + 14 * kD, kD));
        }
    }
}

TEST(Duplicates, TokensSeedingTheSameRingSlotWriteOneOfTheirRows) {
    for (int P : {1, 4, 16}) {
        for (kpool_dtype dtype : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
            std::mt19937 rng(950 + P);
            const int64_t ring = 2 * P, blocks = 4;
            // Two requests of P tokens in block 1, the second shifted by one
            // slot (P - 1 ring slots in common), then one in block 3.
            std::vector<int64_t> slots;
            for (int64_t t = 0; t < P; ++t) slots.push_back(1 * ring + t);
            slots.push_back(-1);
            for (int64_t t = 0; t < P; ++t) slots.push_back(1 * ring + (t + 1) % ring);
            slots.push_back(-1);
            for (int64_t t = 0; t < P; ++t) slots.push_back(3 * ring + t);
            const int64_t n = int64_t(slots.size());
            HostTensor key(KPOOL_DTYPE_BFLOAT16, {n, kD}), gate(KPOOL_DTYPE_BFLOAT16, {n, kD}), tslot(dtype, {n});
            fill_normal(key, rng);
            fill_normal(gate, rng, 2.0f);
            for (int64_t i = 0; i < n; ++i) tslot.set_int({i}, slots[i]);
            HostTensor tail = make_tail_cache(blocks, ring, true);
            tail.fill_random_bytes(rng);
            HostTensor want = tail, got = tail;
            const kpool_tensor k = key.desc(), g = gate.desc(), t = tslot.desc(), w = want.desc(), gd = got.desc();
            kpool_ref::seed_tail_cache(&w, &k, &g, &t, P, kD);
            kpool_status st{};
            ASSERT_EQ(kpool_seed_tail_cache(&gd, &k, &g, &t, P, kD, &kExec, &st), KPOOL_OK) << st.message;
            std::map<int64_t, std::vector<int64_t>> writers;  // ring slot of block 1 -> tokens
            for (int64_t i = 0; i < n; ++i) {
                if (slots[i] >= 0 && slots[i] / ring == 1) writers[slots[i] % ring].push_back(i);
            }
            Contested c;
            int contested_slots = 0;
            for (auto &[slot, tokens] : writers) {
                if (tokens.size() < 2) continue;
                ++contested_slots;
                for (int64_t i : tokens) {
                    c.add(size_t(tail.offset({1, 0, slot, 0}) * 2), key.raw() + key.offset({i, 0}) * 2, 2 * kD);
                    c.add(size_t(tail.offset({1, 1, slot, 0}) * 2), gate.raw() + gate.offset({i, 0}) * 2, 2 * kD);
                }
            }
            EXPECT_EQ(contested_slots, P - 1);
            EXPECT_TRUE(MatchesWithContested(want, got, c)) << "P = " << P;
        }
    }
}

// A decode batch whose requests each run alone through the reference, from
// the caches before the call: the defined result of the batch.
struct DecodeBatch {
    int P;
    int64_t B, N, ring;
    HostTensor cache, tail, tsm, sm, pos, key, score, ape;

    DecodeBatch(int pool, int64_t b, int64_t n, int64_t r, std::mt19937 &rng)
        : P(pool), B(b), N(n), ring(r) {
        cache = make_kv_cache(4, 16, true);
        cache.fill_random_bytes(rng);
        tail = make_tail_cache(4, ring, true);
        fill_normal(tail, rng, 1.5f);
        DecodeInputs in = make_decode_tensors(rng, B, N, P);
        tsm = std::move(in.tail_slot_mapping), sm = std::move(in.slot_mapping), pos = std::move(in.positions);
        key = std::move(in.key), score = std::move(in.slot_score), ape = std::move(in.ape);
    }
    void token(int64_t b, int64_t t, int32_t position, int32_t block, int32_t slot) {
        pos.set<int32_t>({b, t}, position);
        tsm.set<int32_t>({b, t}, int32_t(block * ring + position % ring));
        sm.set<int32_t>({b, t}, slot);
    }
    // Request b alone, from the caches before the call.
    kpool_tensor request(const HostTensor &t, int64_t b) const {
        kpool_tensor d = t.desc();
        d.data = const_cast<uint8_t *>(t.bytes().data()) + b * t.strides()[0] * dtype_size(t.dtype());
        d.shape[0] = 1;
        return d;
    }
    void reference_request(int64_t b, HostTensor &c, HostTensor &tl, const HostTensor &slots) const {
        const kpool_tensor cd = c.desc(), td = tl.desc(), ts = request(tsm, b), k = request(key, b),
                           s = request(score, b), a = ape.desc(), m = request(slots, b), p = request(pos, b);
        kpool_ref::decode_update_and_maybe_write_cache_batched(&cd, &td, &ts, &k, &s, &a, &m, &p, P, kD, 1);
    }
    void run(HostTensor &c, HostTensor &tl) const {
        const kpool_tensor cd = c.desc(), td = tl.desc(), ts = tsm.desc(), k = key.desc(), s = score.desc(),
                           a = ape.desc(), m = sm.desc(), p = pos.desc();
        kpool_status st{};
        ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(&cd, &td, &ts, &k, &s, &a, &m, &p, P, kD, 1,
                                                                    &kExec, &st),
                  KPOOL_OK)
            << st.message;
    }
};

TEST(Duplicates, DecodeStashesWithinARequestAreOrderedLastWins) {
    for (int P : {1, 2, 4, 8}) {
        std::mt19937 rng(1000 + P);
        // One request of N = 3 * ring tokens: every ring slot is stashed
        // three times in the call, completions read the call's own stashes.
        const int64_t ring = P, N = 3 * ring;
        DecodeBatch d(P, 2, N, ring, rng);
        for (int64_t t = 0; t < N; ++t) {
            d.token(0, t, int32_t(5 * P + t), 2, (t % P == P - 1) ? int32_t(t) : -1);
            d.token(1, t, int32_t(P + t), 0, (t % P == P - 1) ? int32_t(32 + t) : -1);
        }
        HostTensor want_cache = d.cache, want_tail = d.tail, got_cache = d.cache, got_tail = d.tail;
        {
            const kpool_tensor cd = want_cache.desc(), td = want_tail.desc(), ts = d.tsm.desc(), k = d.key.desc(),
                               s = d.score.desc(), a = d.ape.desc(), m = d.sm.desc(), p = d.pos.desc();
            kpool_ref::decode_update_and_maybe_write_cache_batched(&cd, &td, &ts, &k, &s, &a, &m, &p, P, kD, 1);
        }
        d.run(got_cache, got_tail);
        EXPECT_BYTES_EQ(want_cache, got_cache) << "P = " << P;
        EXPECT_BYTES_EQ(want_tail, got_tail) << "P = " << P;
        // The last token's stash of each ring slot.
        for (int64_t slot = 0; slot < ring; ++slot) {
            const int64_t last = 2 * ring + ((slot - (5 * P) % ring) % ring + ring) % ring;
            EXPECT_EQ(0, std::memcmp(got_tail.raw() + got_tail.offset({2, 0, slot, 0}) * 2,
                                     d.key.raw() + d.key.offset({0, last, 0}) * 2, 2 * kD))
                << "P = " << P << ", ring slot " << slot;
        }
    }
}

TEST(Duplicates, RequestsSharingATailBlockNeverReadEachOthersStashes) {
    for (int P : {2, 4, 16}) {
        std::mt19937 rng(1100 + P);
        const int64_t ring = P;
        DecodeBatch d(P, 3, 2, ring, rng);
        // Requests 0 and 1 share tail block 1. Request 0 stashes positions
        // 4P + 0, 4P + 1 (ring slots 0, 1); request 1 completes the pool of
        // positions 4P .. 5P - 1 at its token 1, reading ring slots 0 .. P-2
        // of block 1 (request 0's slots among them), and stashes slots
        // P - 2 and P - 1. Request 2 has its own block.
        d.token(0, 0, int32_t(4 * P), 1, -1);
        d.token(0, 1, int32_t(4 * P + 1), 1, -1);
        d.token(1, 0, int32_t(5 * P - 2), 1, -1);
        d.token(1, 1, int32_t(5 * P - 1), 1, 20);
        d.token(2, 0, int32_t(7 * P - 2), 3, -1);
        d.token(2, 1, int32_t(7 * P - 1), 3, 21);
        HostTensor got_cache = d.cache, got_tail = d.tail;
        d.run(got_cache, got_tail);
        if (HasFatalFailure()) return;

        // The defined result: each request alone on the caches before the
        // call; with P = 2 both requests stash ring slots 0 and 1 of block 1.
        HostTensor model_cache = d.cache, model_tail = d.tail;
        Contested no_contest, tail_c;
        for (int64_t b = 0; b < 3; ++b) {
            HostTensor c = d.cache, tl = d.tail;
            d.reference_request(b, c, tl, d.sm);
            for (int64_t t = 0; t < 2; ++t) {
                const int32_t loc = d.sm.get<int32_t>({b, t}), p = d.pos.get<int32_t>({b, t});
                if (loc >= 0 && p % P == P - 1) {
                    std::memcpy(model_cache.raw() + codes_at(d.cache, loc), c.raw() + codes_at(d.cache, loc), kD);
                    std::memcpy(model_cache.raw() + scale_at(d.cache, loc), c.raw() + scale_at(d.cache, loc), 4);
                }
                const int64_t block = d.tsm.get<int32_t>({b, t}) / ring, slot = p % ring;
                for (int half = 0; half < 2; ++half) {
                    const size_t at = size_t(d.tail.offset({block, half, slot, 0}) * 2);
                    const HostTensor &src = half ? d.score : d.key;
                    const uint8_t *row = src.bytes().data() + src.offset({b, t, 0}) * 2;
                    const bool shared = P == 2 && block == 1;  // P = 2: both requests stash slots 0 and 1
                    if (shared) {
                        tail_c.add(at, row, 2 * kD);
                    } else {
                        std::memcpy(model_tail.raw() + at, row, 2 * kD);
                    }
                }
            }
        }
        EXPECT_TRUE(MatchesWithContested(model_cache, got_cache, no_contest)) << "P = " << P;
        EXPECT_TRUE(MatchesWithContested(model_tail, got_tail, tail_c)) << "P = " << P;
        if (P > 2) {
            // The reference's sequential loop lets request 1 read request
            // 0's stashes: kpool's row for slot 20 differs from it.
            HostTensor seq_cache = d.cache, seq_tail = d.tail;
            const kpool_tensor cd = seq_cache.desc(), td = seq_tail.desc(), ts = d.tsm.desc(), k = d.key.desc(),
                               s = d.score.desc(), a = d.ape.desc(), m = d.sm.desc(), p = d.pos.desc();
            kpool_ref::decode_update_and_maybe_write_cache_batched(&cd, &td, &ts, &k, &s, &a, &m, &p, P, kD, 1);
            EXPECT_NE(0, std::memcmp(seq_cache.raw() + codes_at(d.cache, 20), got_cache.raw() + codes_at(d.cache, 20),
                                     kD))
                << "the test does not tell the two semantics apart";
        }
    }
}

TEST(Duplicates, CompletionsWithTheSameSlotWriteOneOfTheirRows) {
    for (int P : {1, 4}) {
        std::mt19937 rng(1200 + P);
        const int64_t ring = 2 * P;
        DecodeBatch d(P, 3, P, ring, rng);
        // Three requests in their own tail blocks complete a pool each at
        // their last token, all into cache slot 33.
        for (int64_t b = 0; b < 3; ++b) {
            for (int64_t t = 0; t < P; ++t) d.token(b, t, int32_t((b + 1) * P + t), int32_t(b), t == P - 1 ? 33 : -1);
        }
        HostTensor got_cache = d.cache, got_tail = d.tail, want_tail = d.tail, want_cache = d.cache;
        {
            const kpool_tensor cd = want_cache.desc(), td = want_tail.desc(), ts = d.tsm.desc(), k = d.key.desc(),
                               s = d.score.desc(), a = d.ape.desc(), m = d.sm.desc(), p = d.pos.desc();
            kpool_ref::decode_update_and_maybe_write_cache_batched(&cd, &td, &ts, &k, &s, &a, &m, &p, P, kD, 1);
        }
        d.run(got_cache, got_tail);
        if (HasFatalFailure()) return;
        EXPECT_BYTES_EQ(want_tail, got_tail);
        Contested c;
        for (int64_t b = 0; b < 3; ++b) {
            HostTensor cc = d.cache, tl = d.tail;
            d.reference_request(b, cc, tl, d.sm);
            c.add(codes_at(d.cache, 33), cc.raw() + codes_at(d.cache, 33), kD);
            c.add(scale_at(d.cache, 33), cc.raw() + scale_at(d.cache, 33), 4);
        }
        EXPECT_TRUE(MatchesWithContested(want_cache, got_cache, c)) << "P = " << P;
    }
}

}  // namespace
}  // namespace kpool_test
