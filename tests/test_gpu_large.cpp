// GpuLarge: row-wise ops over tensors past 2 GiB on the GPU. The CUDA
// kernels address with 32-bit offsets, so the runtime launches such tensors
// in ranges of rows (runtime/placement.h, split_rows: unit-tested in
// test_split_rows.cpp); the bytes must be the CPU's, which addresses the
// whole tensors at once. fwht past the reference's 16.7M-row limit would
// need 4.3 GB of q alone; 9M rows (q 2.3 GB) take two launches, as would any
// larger count. Needs about 10 GB of host and 5 GB of GPU memory.
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_fixtures.h"

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

}  // namespace
}  // namespace kpool_test
