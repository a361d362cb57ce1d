// The split launches of a device, run on the CPU: under a ScopedLaunchSpan
// (runtime/placement.h) the host plans its launches as a device does past
// its 32-bit offsets (ranges of rows, windows of a K cache's
// pages), at a span small enough that every call here splits. Each call is
// compared byte for byte (every byte of every output, padding included)
// with the same call in one launch and with the scalar reference. The
// device side of the windows is GpuLarge.CacheOver2GiB (test_gpu_large.cpp).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "placement.h"
#include "test_util.h"

namespace kpool_test {
namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kPageStride = kBlock * kRowBytes + 48;  // padded pages: 2160 bytes
constexpr int64_t kPages = 10;
// Three pages a window: kPages of them in four windows.
constexpr int64_t kWindowSpan = 3 * kPageStride;

// `count` distinct cache slots: `edges` first, then random others (a slot
// written twice in one call is the caller's race).
std::vector<int64_t> slots_with_edges(std::mt19937 &rng, const std::vector<int64_t> &edges, int64_t count) {
    std::vector<int64_t> out = edges;
    for (int64_t slot : distinct_slots(rng, kPages * kBlock, kPages * kBlock)) {
        if (static_cast<int64_t>(out.size()) == count) break;
        if (std::find(edges.begin(), edges.end(), slot) == edges.end()) out.push_back(slot);
    }
    return out;
}

HostTensor random_cache(std::mt19937 &rng) {
    HostTensor cache(KPOOL_DTYPE_UINT8, {kPages, kBlock, kRowBytes}, {kPageStride, kRowBytes, 1});
    cache.fill_random_bytes(rng);
    return cache;
}

TEST(SplitLaunches, KCacheWindowsPlan) {
    const HostTensor cache(KPOOL_DTYPE_UINT8, {kPages, kBlock, kRowBytes}, {kPageStride, kRowBytes, 1});
    const kpool_tensor c = cache.desc();
    const kpool::rt::TensorArg arg{"kv_cache", &c};
    const auto windows = kpool::rt::split_rows(kPages, {&arg}, kWindowSpan);
    ASSERT_EQ(windows.size(), 4u);
    EXPECT_EQ(windows[0].count, 3);
    EXPECT_EQ(windows[3].begin, 9);
    EXPECT_EQ(windows[3].count, 1);
}

// compress_and_write_cache: pools written across every window (first and
// last slot of the cache, page edges), sentinels, a write mask, and the
// returned rows split by pools at the same time.
TEST(SplitLaunches, CompressAcrossCacheWindows) {
    std::mt19937 rng(29);
    const int64_t P = 4, n = 37;
    HostTensor slot_k(KPOOL_DTYPE_BFLOAT16, {n, P, kD}), score(KPOOL_DTYPE_FLOAT32, {n, P, kD}),
        ape(KPOOL_DTYPE_FLOAT32, {P, kD}), loc(KPOOL_DTYPE_INT64, {n}), mask(KPOOL_DTYPE_BOOL, {n});
    fill_normal(slot_k, rng);
    fill_normal(score, rng);
    fill_normal(ape, rng);
    // The cache's first and last slot, the last and first of a window's
    // edge, then random ones; one sentinel.
    std::vector<int64_t> slots = slots_with_edges(rng, {0, kPages * kBlock - 1, 3 * kBlock - 1, 3 * kBlock}, n);
    slots[4] = -1;
    for (int64_t i = 0; i < n; ++i) {
        loc.set<int64_t>({i}, slots[i]);
        mask.set<uint8_t>({i}, i % 5 != 3);
    }
    const kpool_tensor k = slot_k.desc(), s = score.desc(), a = ape.desc(), l = loc.desc(), m = mask.desc();
    for (const bool masked : {false, true}) {
        SCOPED_TRACE(masked ? "write_mask" : "no write_mask");
        HostTensor one = random_cache(rng), split = one, ref = one;
        const kpool_tensor c_one = one.desc(), c_split = split.desc(), c_ref = ref.desc();
        const kpool_tensor *mp = masked ? &m : nullptr;
        kpool_ref::compress_and_write_cache(&c_ref, &k, &s, &a, &l, mp, nullptr, nullptr, P, kD, 1, 1);
        kpool_status st{};
        ASSERT_EQ(kpool_compress_and_write_cache(&c_one, &k, &s, &a, &l, mp, nullptr, nullptr, P, kD, 1, 1, nullptr,
                                                 &st),
                  KPOOL_OK)
            << st.message;
        {
            const kpool::rt::ScopedLaunchSpan span(kWindowSpan);
            ASSERT_EQ(kpool_compress_and_write_cache(&c_split, &k, &s, &a, &l, mp, nullptr, nullptr, P, kD, 1, 1,
                                                     nullptr, &st),
                      KPOOL_OK)
                << st.message;
        }
        EXPECT_BYTES_EQ(ref, one);
        EXPECT_BYTES_EQ(one, split);
    }
    // The cache and the returned rows together: pools in ranges of 3
    // (slot_score's f32 rows decide), the cache in windows.
    HostTensor one = random_cache(rng), split = one;
    HostTensor codes_one(KPOOL_DTYPE_UINT8, {n, kD}), scale_one(KPOOL_DTYPE_FLOAT32, {n, 1});
    codes_one.fill_random_bytes(rng);
    scale_one.fill_random_bytes(rng);
    HostTensor codes_split = codes_one, scale_split = scale_one;
    const kpool_tensor c_one = one.desc(), c_split = split.desc(), q1 = codes_one.desc(), s1 = scale_one.desc(),
                       q2 = codes_split.desc(), s2 = scale_split.desc();
    kpool_status st{};
    ASSERT_EQ(kpool_compress_and_write_cache(&c_one, &k, &s, &a, &l, nullptr, &q1, &s1, P, kD, 0, 1, nullptr, &st),
              KPOOL_OK)
        << st.message;
    {
        const kpool::rt::ScopedLaunchSpan span(kWindowSpan);
        ASSERT_EQ(
            kpool_compress_and_write_cache(&c_split, &k, &s, &a, &l, nullptr, &q2, &s2, P, kD, 0, 1, nullptr, &st),
            KPOOL_OK)
            << st.message;
    }
    EXPECT_BYTES_EQ(one, split);
    EXPECT_BYTES_EQ(codes_one, codes_split);
    EXPECT_BYTES_EQ(scale_one, scale_split);
}

// decode: completions in every window, several tokens per request, and
// later tokens of a request stashing into ring slots that its earlier
// completions read (they read the ring as before the call, whatever the
// windows).
TEST(SplitLaunches, DecodeAcrossCacheWindows) {
    std::mt19937 rng(92);
    const int64_t P = 4, ring = 4, R = 6, N = 6;  // N > ring: the stashes wrap within one call
    HostTensor tail(KPOOL_DTYPE_BFLOAT16, {R, 2, ring, kD});
    fill_normal(tail, rng);
    HostTensor tsm(KPOOL_DTYPE_INT64, {R, N}), sm(KPOOL_DTYPE_INT64, {R, N}), pos(KPOOL_DTYPE_INT64, {R, N}),
        key(KPOOL_DTYPE_BFLOAT16, {R, N, kD}), score(KPOOL_DTYPE_BFLOAT16, {R, N, kD}), ape(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(key, rng);
    fill_normal(score, rng);
    fill_normal(ape, rng);
    // The completions write the cache's last slot, its first, then random
    // ones; the other tokens carry slots too (ignored).
    const std::vector<int64_t> slots = slots_with_edges(rng, {kPages * kBlock - 1, 0}, R * N);
    size_t next_completion = 0;
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t t = 0; t < N; ++t) {
            const int64_t p = 5 + r + t;
            pos.set<int64_t>({r, t}, p);
            tsm.set<int64_t>({r, t}, r * ring + p % ring);
            sm.set<int64_t>({r, t}, p % P == P - 1 ? slots[next_completion++] : slots[R * N - 1 - r * N - t]);
        }
    }
    ASSERT_GE(next_completion, 2u);
    const kpool_tensor a = tsm.desc(), k = key.desc(), s = score.desc(), ap = ape.desc(), m = sm.desc(),
                       p = pos.desc();
    HostTensor cache_one = random_cache(rng), cache_split = cache_one, cache_ref = cache_one;
    HostTensor tail_one = tail, tail_split = tail, tail_ref = tail;
    const kpool_tensor c1 = cache_one.desc(), c2 = cache_split.desc(), c3 = cache_ref.desc(), t1 = tail_one.desc(),
                       t2 = tail_split.desc(), t3 = tail_ref.desc();
    const int64_t skipped =
        kpool_ref::decode_update_and_maybe_write_cache_batched(&c3, &t3, &a, &k, &s, &ap, &m, &p, P, kD, 1);
    EXPECT_EQ(skipped, 0);
    kpool_status st{};
    ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(&c1, &t1, &a, &k, &s, &ap, &m, &p, P, kD, 1, nullptr,
                                                                &st),
              KPOOL_OK)
        << st.message;
    {
        const kpool::rt::ScopedLaunchSpan span(kWindowSpan);
        ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(&c2, &t2, &a, &k, &s, &ap, &m, &p, P, kD, 1,
                                                                    nullptr, &st),
                  KPOOL_OK)
            << st.message;
    }
    EXPECT_BYTES_EQ(cache_ref, cache_one);
    EXPECT_BYTES_EQ(tail_ref, tail_one);
    EXPECT_BYTES_EQ(cache_one, cache_split);
    EXPECT_BYTES_EQ(tail_one, tail_split);
}

// A page wider than a launch's span cannot be split: rejected, naming the
// cache, nothing written.
TEST(SplitLaunches, APageWiderThanALaunchIsRejected) {
    std::mt19937 rng(7);
    const int64_t P = 4, n = 2;
    HostTensor slot_k(KPOOL_DTYPE_BFLOAT16, {n, P, kD}), score(KPOOL_DTYPE_BFLOAT16, {n, P, kD}),
        ape(KPOOL_DTYPE_FLOAT32, {P, kD}), loc(KPOOL_DTYPE_INT64, {n});
    fill_normal(slot_k, rng);
    HostTensor cache = random_cache(rng);
    const HostTensor before = cache;
    const kpool_tensor k = slot_k.desc(), s = score.desc(), a = ape.desc(), l = loc.desc(), c = cache.desc();
    kpool_status st{};
    const kpool::rt::ScopedLaunchSpan span(kPageStride - 1);
    EXPECT_EQ(kpool_compress_and_write_cache(&c, &k, &s, &a, &l, nullptr, nullptr, nullptr, P, kD, 1, 1, nullptr, &st),
              KPOOL_ERROR_UNSUPPORTED);
    EXPECT_THAT(std::string(st.message), ::testing::HasSubstr("kv_cache"));
    EXPECT_BYTES_EQ(before, cache);
}

}  // namespace
}  // namespace kpool_test
