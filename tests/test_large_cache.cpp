// Caches larger than 2 GiB (and 4 GiB): every offset is 64-bit. The caches
// are anonymous mappings, so only the pages a call writes (or reads) become
// real memory; the reference runs on a second mapping of the same size, and
// the two are compared page by page wherever either has a resident page.
// Writes go to the first page, the pages around the 2^31- and 2^32-byte
// boundaries and the last page.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace kpool_test {
namespace {

// An anonymous, lazily backed mapping.
class LargeMapping {
public:
    explicit LargeMapping(size_t bytes) : size_(bytes) {
        void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
    }
    ~LargeMapping() {
        if (data_) munmap(data_, size_);
    }
    LargeMapping(const LargeMapping &) = delete;
    LargeMapping &operator=(const LargeMapping &) = delete;
    uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    bool ok() const { return data_ != nullptr; }

    // Indices of the OS pages that are resident (written, or read once).
    std::vector<size_t> resident_pages() const {
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        std::vector<unsigned char> vec((size_ + page - 1) / page);
        std::vector<size_t> out;
        if (mincore(data_, size_, vec.data()) != 0) return out;
        for (size_t i = 0; i < vec.size(); ++i) {
            if (vec[i] & 1) out.push_back(i);
        }
        return out;
    }

private:
    uint8_t *data_ = nullptr;
    size_t size_;
};

// Compares two mappings on every OS page resident in either; returns the
// number of differing bytes (and describes the first).
int64_t compare_resident(const LargeMapping &expected, const LargeMapping &actual, std::string *first,
                         size_t *pages_compared = nullptr) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<size_t> pages = expected.resident_pages();
    const std::vector<size_t> more = actual.resident_pages();
    pages.insert(pages.end(), more.begin(), more.end());
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    if (pages_compared) *pages_compared = pages.size();
    int64_t diff = 0;
    for (size_t p : pages) {
        const size_t begin = p * page, end = std::min(begin + page, expected.size());
        if (std::memcmp(expected.data() + begin, actual.data() + begin, end - begin) == 0) continue;
        for (size_t b = begin; b < end; ++b) {
            if (expected.data()[b] != actual.data()[b]) {
                if (diff == 0 && first) {
                    *first = "byte " + std::to_string(b) + ": expected " + std::to_string(expected.data()[b]) +
                             ", got " + std::to_string(actual.data()[b]);
                }
                ++diff;
            }
        }
    }
    return diff;
}

constexpr int64_t kBlockSize = 64;
constexpr int64_t kPageStride = kBlockSize * kRowBytes + 64;  // 8512 bytes, padded
// Just over 4.5 GiB of pages, so byte offsets pass both 2^31 and 2^32.
constexpr int64_t kNumBlocks = ((int64_t(9) << 29) + kPageStride - 1) / kPageStride;
constexpr int64_t kCacheBytes = kNumBlocks * kPageStride;

kpool_tensor large_kv_cache(const LargeMapping &m) {
    kpool_tensor t{};
    t.data = m.data();
    t.dtype = KPOOL_DTYPE_UINT8;
    t.ndim = 3;
    t.shape[0] = kNumBlocks;
    t.shape[1] = kBlockSize;
    t.shape[2] = kRowBytes;
    t.strides[0] = kPageStride;
    t.strides[1] = kRowBytes;
    t.strides[2] = 1;
    t.device = KPOOL_DEVICE_CPU;
    return t;
}

// Flat slots whose pages straddle the interesting byte offsets.
std::vector<int64_t> boundary_slots() {
    const int64_t slots = kNumBlocks * kBlockSize;
    std::vector<int64_t> out = {0, 5, kBlockSize - 1, slots - 1, slots - kBlockSize, slots - 7};
    for (int64_t boundary : {int64_t(1) << 31, int64_t(1) << 32}) {
        const int64_t page = boundary / kPageStride;  // the page holding the boundary byte
        out.push_back(page * kBlockSize + 1);
        out.push_back((page + 1) * kBlockSize + kBlockSize - 2);
    }
    return out;
}

float scale_at(const LargeMapping &m, int64_t loc) {
    const int64_t at = (loc / kBlockSize) * kPageStride + kBlockSize * kD + (loc % kBlockSize) * 4;
    float s;
    std::memcpy(&s, m.data() + at, 4);
    return s;
}

TEST(LargeCache, CompressWritesAbove4GiB) {
    ASSERT_GT(kCacheBytes, (int64_t(1) << 32) + (int64_t(1) << 28));
    LargeMapping api(kCacheBytes), ref(kCacheBytes);
    if (!api.ok() || !ref.ok()) GTEST_SKIP() << "cannot map 2 x " << kCacheBytes << " bytes";
    std::mt19937 rng(123);
    const std::vector<int64_t> locs = boundary_slots();
    const int64_t n = static_cast<int64_t>(locs.size()) + 1, P = 4;
    HostTensor slot_k(KPOOL_DTYPE_BFLOAT16, {n, P, kD}), score(KPOOL_DTYPE_BFLOAT16, {n, P, kD}),
        ape(KPOOL_DTYPE_FLOAT32, {P, kD}), loc(KPOOL_DTYPE_INT64, {n});
    fill_normal(slot_k, rng);
    fill_normal(score, rng);
    fill_normal(ape, rng);
    for (int64_t i = 0; i + 1 < n; ++i) loc.set<int64_t>({i}, locs[i]);
    loc.set<int64_t>({n - 1}, -1);
    const kpool_tensor k = slot_k.desc(), s = score.desc(), a = ape.desc(), l = loc.desc();
    const kpool_tensor cache_api = large_kv_cache(api), cache_ref = large_kv_cache(ref);
    kpool_ref::compress_and_write_cache(&cache_ref, &k, &s, &a, &l, nullptr, nullptr, nullptr, P, kD, 1, 1);
    kpool_status st{};
    const kpool_exec ex{nullptr};
    ASSERT_EQ(kpool_compress_and_write_cache(&cache_api, &k, &s, &a, &l, nullptr, nullptr, nullptr, P, kD,
                                             1, 1, &ex, &st),
              KPOOL_OK)
        << st.message;
    for (int64_t x : locs) {
        EXPECT_GT(scale_at(api, x), 0.0f) << "no scale written at loc " << x << " (byte offset "
                                          << (x / kBlockSize) * kPageStride << " of its page)";
        EXPECT_EQ(scale_at(api, x), scale_at(ref, x)) << "loc " << x;
    }
    std::string first;
    size_t pages = 0;
    const int64_t diff = compare_resident(ref, api, &first, &pages);
    EXPECT_EQ(diff, 0) << diff << " bytes differ from the reference: " << first;
    // mincore must have seen the written pages (else the comparison is empty).
    EXPECT_GE(pages, 5u);
    EXPECT_LT(pages, 4096u) << "the call touched far more of the cache than the rows it writes";
}

// A tail ring over 4 GiB, so that even element offsets (bf16) pass 2^31:
// seed three requests (block 0, one past 2^31 elements, the last block),
// then decode a step that completes their pools into the >4 GiB K cache.
TEST(LargeCache, SeedAndDecodeAbove4GiB) {
    constexpr int64_t P = 16, ring = 16;
    constexpr int64_t half = ring * kD + 32, block = 2 * half;  // elements
    constexpr int64_t tail_blocks = ((int64_t(9) << 29) / 2 + block - 1) / block;
    constexpr int64_t tail_bytes = tail_blocks * block * 2;
    static_assert(tail_blocks * block > (int64_t(1) << 31), "element offsets pass 2^31");
    LargeMapping tail_api(tail_bytes), tail_ref(tail_bytes), kv_api(kCacheBytes), kv_ref(kCacheBytes);
    if (!tail_api.ok() || !tail_ref.ok() || !kv_api.ok() || !kv_ref.ok()) {
        GTEST_SKIP() << "cannot map the large caches";
    }
    auto tail_desc = [&](const LargeMapping &m) {
        kpool_tensor t{};
        t.data = m.data();
        t.dtype = KPOOL_DTYPE_BFLOAT16;
        t.ndim = 4;
        t.shape[0] = tail_blocks;
        t.shape[1] = 2;
        t.shape[2] = ring;
        t.shape[3] = kD;
        t.strides[0] = block;
        t.strides[1] = half;
        t.strides[2] = kD;
        t.strides[3] = 1;
        t.device = KPOOL_DEVICE_CPU;
        return t;
    };
    const kpool_tensor t_api = tail_desc(tail_api), t_ref = tail_desc(tail_ref);
    const kpool_tensor c_api = large_kv_cache(kv_api), c_ref = large_kv_cache(kv_ref);
    const int64_t blocks[] = {0, (int64_t(1) << 31) / block + 1, tail_blocks - 1};
    const int64_t R = 3, prefill = P + 5;  // each request: P + 5 prefill tokens, positions 0..P+4
    std::mt19937 rng(321);

    // Seed.
    HostTensor key(KPOOL_DTYPE_BFLOAT16, {R * prefill, kD}), gate(KPOOL_DTYPE_BFLOAT16, {R * prefill, kD}),
        tslot(KPOOL_DTYPE_INT32, {R * prefill});
    fill_normal(key, rng);
    fill_normal(gate, rng);
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t t = 0; t < prefill; ++t) tslot.set<int32_t>({r * prefill + t}, int32_t(blocks[r] * ring + t % ring));
    }
    {
        const kpool_tensor k = key.desc(), g = gate.desc(), ts = tslot.desc();
        kpool_ref::seed_tail_cache(&t_ref, &k, &g, &ts, P, kD);
        kpool_status st{};
        const kpool_exec ex{nullptr};
        ASSERT_EQ(kpool_seed_tail_cache(&t_api, &k, &g, &ts, P, kD, &ex, &st), KPOOL_OK) << st.message;
    }
    std::string first;
    size_t pages = 0;
    int64_t diff = compare_resident(tail_ref, tail_api, &first, &pages);
    ASSERT_EQ(diff, 0) << "seed: " << diff << " tail bytes differ: " << first;
    EXPECT_GE(pages, 3u);

    // Decode N tokens per request: positions prefill .. prefill+N-1, one of
    // which (position 2P-1) completes a pool, written to a boundary slot.
    const int64_t N = P;
    HostTensor tsm(KPOOL_DTYPE_INT32, {R, N}), sm(KPOOL_DTYPE_INT32, {R, N}), pos(KPOOL_DTYPE_INT32, {R, N}),
        dkey(KPOOL_DTYPE_BFLOAT16, {R, N, kD}), dscore(KPOOL_DTYPE_BFLOAT16, {R, N, kD}),
        ape(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(dkey, rng);
    fill_normal(dscore, rng);
    fill_normal(ape, rng);
    const std::vector<int64_t> targets = boundary_slots();
    const int64_t target_for[] = {targets[0], targets[6], targets[3]};  // first, past 2^31 bytes, last
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t t = 0; t < N; ++t) {
            const int64_t p = prefill + t;
            pos.set<int32_t>({r, t}, int32_t(p));
            tsm.set<int32_t>({r, t}, int32_t(blocks[r] * ring + p % ring));
            sm.set<int32_t>({r, t}, p % P == P - 1 ? int32_t(target_for[r]) : -1);
        }
    }
    {
        const kpool_tensor a = tsm.desc(), k = dkey.desc(), s = dscore.desc(), ap = ape.desc(), m = sm.desc(),
                           p = pos.desc();
        const int64_t skipped =
            kpool_ref::decode_update_and_maybe_write_cache_batched(&c_ref, &t_ref, &a, &k, &s, &ap, &m, &p, P, kD, 1);
        ASSERT_EQ(skipped, 0);
        kpool_status st{};
        const kpool_exec ex{nullptr};
        ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(&c_api, &t_api, &a, &k, &s, &ap, &m, &p, P, kD, 1,
                                                                    &ex, &st),
                  KPOOL_OK)
            << st.message;
    }
    for (int64_t x : target_for) {
        EXPECT_GT(scale_at(kv_api, x), 0.0f) << "decode wrote no scale at loc " << x;
    }
    diff = compare_resident(tail_ref, tail_api, &first);
    EXPECT_EQ(diff, 0) << "decode: " << diff << " tail bytes differ: " << first;
    diff = compare_resident(kv_ref, kv_api, &first, &pages);
    EXPECT_EQ(diff, 0) << "decode: " << diff << " cache bytes differ: " << first;
    EXPECT_GE(pages, 3u);
    EXPECT_LT(pages, 4096u);
}

// 2^24 + 1024 rows of 128: element offsets of q pass 2^31 (SPEC: the
// reference's 32-bit offsets overflow at 16.7M rows). The input is a lazily
// mapped zero buffer with a few random rows on both sides of row 2^24.
TEST(LargeCache, FwhtPast2To31Elements) {
    const int64_t rows = (int64_t(1) << 24) + 1024;
    LargeMapping q(size_t(rows) * kD * 2), fp8(size_t(rows) * kD), scale(size_t(rows) * 4);
    if (!q.ok() || !fp8.ok() || !scale.ok()) GTEST_SKIP() << "cannot map the fwht buffers";
    std::mt19937 rng(99);
    const int64_t special[] = {0, 1, (int64_t(1) << 24) - 1, int64_t(1) << 24, (int64_t(1) << 24) + 1,
                               rows - 2, rows - 1};
    const int64_t n_special = sizeof(special) / sizeof(special[0]);
    HostTensor small_q(KPOOL_DTYPE_BFLOAT16, {n_special, kD});
    fill_normal(small_q, rng, 4.0f);
    for (int64_t i = 0; i < n_special; ++i) {
        std::memcpy(q.data() + special[i] * kD * 2, small_q.raw() + i * kD * 2, kD * 2);
    }
    auto desc = [](const LargeMapping &m, kpool_dtype dtype, int ndim, int64_t r) {
        kpool_tensor t{};
        t.data = m.data();
        t.dtype = dtype;
        t.ndim = ndim;
        t.shape[0] = r;
        t.shape[1] = ndim == 2 ? (dtype == KPOOL_DTYPE_FLOAT32 ? 1 : kD) : 0;
        t.strides[0] = ndim == 2 ? t.shape[1] : 1;
        t.strides[1] = 1;
        t.device = KPOOL_DEVICE_CPU;
        return t;
    };
    const kpool_tensor qd = desc(q, KPOOL_DTYPE_BFLOAT16, 2, rows), fd = desc(fp8, KPOOL_DTYPE_UINT8, 2, rows),
                       sd = desc(scale, KPOOL_DTYPE_FLOAT32, 2, rows);
    kpool_status st{};
    const kpool_exec ex{nullptr};
    ASSERT_EQ(kpool_fwht128_quant_fp8(&qd, &fd, &sd, &ex, &st), KPOOL_OK) << st.message;

    HostTensor small_fp8(KPOOL_DTYPE_UINT8, {n_special, kD}), small_scale(KPOOL_DTYPE_FLOAT32, {n_special, 1});
    {
        const kpool_tensor a = small_q.desc(), b = small_fp8.desc(), c = small_scale.desc();
        kpool_ref::fwht128_quant_fp8(&a, &b, &c);
    }
    for (int64_t i = 0; i < n_special; ++i) {
        const int64_t r = special[i];
        EXPECT_EQ(std::memcmp(fp8.data() + r * kD, small_fp8.raw() + i * kD, kD), 0) << "codes of row " << r;
        EXPECT_EQ(std::memcmp(scale.data() + r * 4, small_scale.raw() + i * 4, 4), 0) << "scale of row " << r;
    }
    // Every other row is zero: codes 0 and the floor scale, all the way to the end.
    kpool_ref::Row zero{};
    const float floor_scale = kpool_ref::fp8_scale(zero, true);
    int64_t bad_rows = 0, first_bad = -1;
    size_t next_special = 0;
    for (int64_t r = 0; r < rows; ++r) {
        if (next_special < size_t(n_special) && special[next_special] == r) {
            ++next_special;
            continue;
        }
        float s;
        std::memcpy(&s, scale.data() + r * 4, 4);
        const uint64_t *codes = reinterpret_cast<const uint64_t *>(fp8.data() + r * kD);
        bool ok = s == floor_scale;
        for (int w = 0; w < kD / 8; ++w) ok = ok && codes[w] == 0;
        if (!ok) {
            if (first_bad < 0) first_bad = r;
            ++bad_rows;
        }
    }
    EXPECT_EQ(bad_rows, 0) << "zero rows with a wrong result, first " << first_bad;
}

}  // namespace
}  // namespace kpool_test
