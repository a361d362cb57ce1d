// GpuLarge: row-wise ops over tensors past 2 GiB on the GPU. The CUDA
// kernels address with 32-bit offsets, so the runtime launches such tensors
// in ranges of rows (runtime/placement.h, split_rows: unit-tested in
// test_split_rows.cpp); the bytes must be the CPU's, which addresses the
// whole tensors at once. fwht past the reference's 16.7M-row limit would
// need 4.3 GB of q alone; 9M rows (q 2.3 GB) take two launches, as would any
// larger count. A K cache over 2 GiB is launched in windows of its pages
// (Placement::cache_windows; CPU-tested in test_split_launches.cpp).
// Needs about 10 GB of host and 5 GB of GPU memory.
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "gpu_fixtures.h"
#include "placement.h"

namespace kpool_test {
namespace {

// Finite bf16 values of mixed sign and magnitude, fast (a 64-bit
// xorshift): the tensors here hold billions of elements.
void fill_bf16(HostTensor &t, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *bytes = t.raw();
    const size_t elements = (t.bytes().size() - 64) / 2;
    for (size_t i = 0; i < elements; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint16_t sign = (x & 1) << 15, exponent = 112 + (x >> 1) % 24, mantissa = (x >> 8) & 0x7F;
        const uint16_t bits = sign | exponent << 7 | mantissa;
        bytes[2 * i] = static_cast<uint8_t>(bits), bytes[2 * i + 1] = static_cast<uint8_t>(bits >> 8);
    }
}

class GpuLarge : public GpuTest {};

TEST_F(GpuLarge, FwhtPast2GiB) {
    const int64_t rows = 9'000'000;  // q: 2.3 GB, over 2^31 bytes
    HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
    fill_bf16(q, 1);
    ASSERT_GT(q.numel() * 2, int64_t(1) << 31);
    Mirrored in(gpu(), q), codes(gpu(), HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD})),
        scales(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {rows, 1}));
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_fwht128_quant_fp8(in.on(side), codes.on(side), scales.on(side), ex, st);
        },
        {{"q_fp8", &codes}, {"q_scale", &scales}});
}

TEST_F(GpuLarge, CompressInputsPast2GiB) {
    const int P = 16;
    const int64_t pools = 600'000;  // slot_k and slot_score: 2.5 GB each
    std::mt19937 rng(2);
    HostTensor k(KPOOL_DTYPE_BFLOAT16, {pools, P, kD}), s(KPOOL_DTYPE_BFLOAT16, {pools, P, kD});
    fill_bf16(k, 3);
    fill_bf16(s, 4);
    HostTensor ape(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(ape, rng, 0.5f);
    const int64_t block_size = 64, blocks = pools / block_size + 2;  // cache: 80 MB
    HostTensor loc(KPOOL_DTYPE_INT64, {pools});
    const std::vector<int64_t> slots = distinct_slots(rng, blocks * block_size, pools);
    for (int64_t i = 0; i < pools; i++) loc.set<int64_t>({i}, slots[i]);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(blocks, block_size, false))), key(gpu(), k),
        score(gpu(), s), bias(gpu(), ape), locs(gpu(), loc);
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(cache.on(side), key.on(side), score.on(side), bias.on(side),
                                                  locs.on(side), nullptr, nullptr, nullptr, P, kD, 1, 1, ex, st);
        },
        {{"kv_cache", &cache}});
}

// A K cache over 2 GiB: 260,000 pages of 64 slots, 2.2 GB (an engine's
// layer of 20M slots is 2.64 GB), which the runtime launches in two windows
// of pages. Compress and decode write the CPU's bytes into both windows and
// at their edges, and no other byte of the cache moves (all of it is
// compared). In the reference's arithmetic (CUDA only; the words kernel for
// compress), the rows written into the large cache are those written into
// a small one. Decode runs captured in a CUDA graph. Skips without 2.3 GB
// of free GPU memory.
TEST_F(GpuLarge, KCacheOver2GiB) {
    const int P = 16;
    const int64_t block_size = 64, blocks = 260'000, slots = blocks * block_size, page_bytes = block_size * kRowBytes;
    HostTensor cache0 = make_kv_cache(blocks, block_size, false);
    ASSERT_GT(blocks * page_bytes, int64_t(1) << 31);
    fill_bf16(cache0, 5);  // any bytes
    std::unique_ptr<Mirrored> cache;
    try {
        cache = std::make_unique<Mirrored>(gpu(), cache0);
    } catch (const std::runtime_error &e) {
        GTEST_SKIP() << "no room for a " << cache0.bytes().size() << "-byte K cache on the GPU: " << e.what();
    }
    // The first window ends where its pages would pass 2^31 bytes.
    const int64_t boundary = kpool::rt::kCudaMaxSpanBytes / page_bytes * block_size;
    const std::vector<int64_t> edges = {0, 1, boundary - 1, boundary, boundary + block_size, slots - 1};
    std::mt19937 rng(6);
    auto random_slots = [&](int64_t count) {
        std::vector<int64_t> out;
        const std::set<int64_t> taken(edges.begin(), edges.end());
        for (int64_t slot : distinct_slots(rng, slots, count + static_cast<int64_t>(edges.size()))) {
            if (!taken.count(slot) && static_cast<int64_t>(out.size()) < count) out.push_back(slot);
        }
        return out;
    };

    // Compress: the edges, then random slots of both windows, and a sentinel.
    const int64_t n = 64;
    CompressInputs in = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, slots);
    std::vector<int64_t> locs = edges;
    const std::vector<int64_t> more = random_slots(n - 1 - static_cast<int64_t>(edges.size()));
    locs.insert(locs.end(), more.begin(), more.end());
    locs.push_back(-1);
    for (int64_t i = 0; i < n; i++) in.loc.set<int64_t>({i}, locs[i]);
    Mirrored slot_k(gpu(), in.slot_k), slot_score(gpu(), in.slot_score), ape(gpu(), in.ape), loc(gpu(), in.loc);
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(cache->on(side), slot_k.on(side), slot_score.on(side),
                                                  ape.on(side), loc.on(side), nullptr, nullptr, nullptr, P, kD, 1, 1,
                                                  ex, st);
        },
        {{"kv_cache", cache.get()}});

    // Decode: requests of 2P tokens, the completions of two requests at the
    // edges (no other token of the call writes an edge slot).
    const int64_t B = 8, N = 2 * P, ring = 2 * P, tail_blocks = 8;
    DecodeInputs d = make_decode_inputs(rng, B, N, P, ring, tail_blocks, slots);
    const std::set<int64_t> edge_set(edges.begin(), edges.end());
    size_t next_edge = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < N; t++) {
            const int64_t slot = d.slot_mapping.get_int({b, t}), pos = d.positions.get_int({b, t});
            const bool completes = slot >= 0 && pos >= 0 && pos % P == P - 1;
            if ((b == 0 || b == 5) && completes && next_edge < edges.size()) {
                d.slot_mapping.set<int32_t>({b, t}, static_cast<int32_t>(edges[next_edge++]));
            } else if (edge_set.count(slot)) {
                d.slot_mapping.set<int32_t>({b, t}, -1);
            }
        }
    }
    ASSERT_GE(next_edge, 3u) << "too few completions at the edges";
    std::mt19937 tail_rng(7);
    HostTensor tail0(KPOOL_DTYPE_BFLOAT16, {tail_blocks, 2, ring, kD});
    fill_normal(tail0, tail_rng);
    Mirrored tail(gpu(), tail0), tsm(gpu(), d.tail_slot_mapping), key(gpu(), d.key), score(gpu(), d.slot_score),
        dape(gpu(), d.ape), sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    auto decode = [&](Side side, const kpool_exec *ex, kpool_status *st) {
        return kpool_decode_update_and_maybe_write_cache_batched(cache->on(side), tail.on(side), tsm.on(side),
                                                                 key.on(side), score.on(side), dape.on(side),
                                                                 sm.on(side), pos.on(side), P, kD, 1, ex, st);
    };
    // On the GPU captured in a CUDA graph (the warm-up loaded the modules
    // of every kernel, the completions of a cache in windows too): its
    // launches, a completions kernel per window then the stashes, neither
    // sync nor allocate.
    kpool_status st{};
    cu::Stream stream;
    const kpool_exec exec = stream.exec();  // the exact arithmetic, as the CPU's
    ASSERT_KPOOL_OK(kpool_cuda_warm_up(0, &exec, &st), st);
    stream.synchronize();
    cu::Graph graph;
    graph.begin_capture(stream);
    const kpool_status_code rc = decode(Side::Gpu, &exec, &st);
    graph.end_capture(stream);
    ASSERT_KPOOL_OK(rc, st);
    graph.instantiate();
    graph.launch(stream);
    cache->download_async(stream);
    tail.download_async(stream);
    stream.synchronize();
    const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
    ASSERT_KPOOL_OK(decode(Side::Cpu, &cpu_exec, &st), st);
    EXPECT_TRUE(cache->matches_cpu("kv_cache (decode)"));
    EXPECT_TRUE(tail.matches_cpu("tail_kv_cache"));

    // The reference's arithmetic: the large cache's rows against a small
    // cache's (one window), pool i at slot i there.
    HostTensor small_loc(KPOOL_DTYPE_INT64, {n});
    for (int64_t i = 0; i < n; i++) small_loc.set<int64_t>({i}, locs[i] < 0 ? -1 : i);
    const int64_t small_blocks = (n + block_size - 1) / block_size;
    Mirrored small(gpu(), make_kv_cache(small_blocks, block_size, false)), small_locs(gpu(), small_loc);
    const kpool_exec triton{nullptr, KPOOL_ARITHMETIC_TRITON};
    ASSERT_EQ(kpool_compress_and_write_cache(cache->on(Side::Gpu), slot_k.on(Side::Gpu), slot_score.on(Side::Gpu),
                                             ape.on(Side::Gpu), loc.on(Side::Gpu), nullptr, nullptr, nullptr, P, kD,
                                             1, 1, &triton, &st),
              KPOOL_OK)
        << st.message;
    ASSERT_EQ(kpool_compress_and_write_cache(small.on(Side::Gpu), slot_k.on(Side::Gpu), slot_score.on(Side::Gpu),
                                             ape.on(Side::Gpu), small_locs.on(Side::Gpu), nullptr, nullptr, nullptr,
                                             P, kD, 1, 1, &triton, &st),
              KPOOL_OK)
        << st.message;
    cache->download();
    small.download();
    auto row = [&](const std::vector<uint8_t> &bytes, int64_t slot) {  // 128 codes, then the 4 scale bytes
        const int64_t page = (slot / block_size) * page_bytes, token = slot % block_size;
        std::vector<uint8_t> out(kRowBytes);
        for (int64_t i = 0; i < kD; i++) out[i] = bytes.at(page + token * kD + i);
        for (int64_t i = 0; i < 4; i++) out[kD + i] = bytes.at(page + block_size * kD + token * 4 + i);
        return out;
    };
    for (int64_t i = 0; i + 1 < n; i++) {
        EXPECT_TRUE(same_bytes("triton row of pool " + std::to_string(i) + " at slot " + std::to_string(locs[i]),
                               row(small.gpu_host(), i), row(cache->gpu_host(), locs[i])));
    }
}

}  // namespace
}  // namespace kpool_test
