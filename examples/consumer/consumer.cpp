// An engine's use of an installed kpool through the C++ API (kpool.hpp), on
// the CPU: pools of keys compressed into a paged fp8 cache, checked against
// what the math says they must be, and an out-of-range write rejected.
// Exits non-zero on any difference.
//
// In each pool, per dim, one slot scores 0 and the others -200: the softmax
// weights are exp(0) = 1 and exp(-200) = 0 (below f32's range), so pooling
// selects that slot's key exactly, and the row written to the cache must be
// the Hadamard op's row for the selected keys, code for code and the same
// scale.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kpool/kpool.hpp"

namespace {

constexpr int D = KPOOL_HEAD_DIM;
constexpr int P = 4;         // tokens per pool
constexpr int PAGE = 64;     // pool slots per cache page
constexpr int PAGES = 2;
constexpr int POOLS = 3;
constexpr int ROW_BYTES = D + 4;  // a slot: 128 e4m3 codes, and an f32 scale after the page's codes
constexpr uint8_t CANARY = 0xA5;

int failures = 0;

void expect(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "consumer: FAIL: %s\n", what);
        failures++;
    }
}

// The bf16 bits of x, which must have at most 8 significant bits (bf16's
// precision: the low half of its f32 bits is zero).
uint16_t bf16_bits(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return uint16_t(bits >> 16);
}

kpool::Tensor tensor(void *data, kpool_dtype dtype, std::vector<int64_t> shape) {
    return kpool_tensor_contiguous(data, dtype, int32_t(shape.size()), shape.data());
}

}  // namespace

int main() {
    // Keys: a fixed pseudo-random sequence of m / 64, m in [-127, 128].
    std::vector<uint16_t> slot_k(POOLS * P * D), slot_score(POOLS * P * D);
    uint32_t state = 12345;
    for (uint16_t &k : slot_k) {
        state = state * 1664525u + 1013904223u;
        k = bf16_bits(float(int(state >> 24) - 127) / 64.0f);
    }
    // Pool n, dim d: slot (n + d) % P wins.
    std::vector<uint16_t> selected(POOLS * D);
    for (int n = 0; n < POOLS; n++) {
        for (int d = 0; d < D; d++) {
            const int winner = (n + d) % P;
            for (int s = 0; s < P; s++) {
                slot_score[(n * P + s) * D + d] = bf16_bits(s == winner ? 0.0f : -200.0f);
            }
            selected[n * D + d] = slot_k[(n * P + winner) * D + d];
        }
    }
    std::vector<float> ape(P * D, 0.0f);
    std::vector<int64_t> loc = {5, PAGE + 17, 2 * PAGE - 1};  // page 0 slot 5, page 1 slots 17 and 63
    std::vector<uint8_t> cache(PAGES * PAGE * ROW_BYTES, CANARY);

    const kpool::Tensor cache_t = tensor(cache.data(), KPOOL_DTYPE_UINT8, {PAGES, PAGE, ROW_BYTES});
    const kpool::Tensor k_t = tensor(slot_k.data(), KPOOL_DTYPE_BFLOAT16, {POOLS, P, D});
    const kpool::Tensor score_t = tensor(slot_score.data(), KPOOL_DTYPE_BFLOAT16, {POOLS, P, D});
    const kpool::Tensor ape_t = tensor(ape.data(), KPOOL_DTYPE_FLOAT32, {P, D});
    const kpool::Tensor loc_t = tensor(loc.data(), KPOOL_DTYPE_INT64, {POOLS});

    // What the cache rows must be: the selected keys through the Hadamard op.
    std::vector<uint8_t> codes(POOLS * D);
    std::vector<float> scales(POOLS);
    std::vector<uint8_t> cache_before;
    try {
        kpool::fwht128_quant_fp8(tensor(selected.data(), KPOOL_DTYPE_BFLOAT16, {POOLS, D}),
                                 tensor(codes.data(), KPOOL_DTYPE_FLOAT8_E4M3FN, {POOLS, D}),
                                 tensor(scales.data(), KPOOL_DTYPE_FLOAT32, {POOLS}));
        kpool::compress_and_write_cache(cache_t, k_t, score_t, ape_t, loc_t, P);

        std::vector<uint8_t> expected(cache.size(), CANARY);
        for (int n = 0; n < POOLS; n++) {
            uint8_t *page = expected.data() + loc[n] / PAGE * PAGE * ROW_BYTES;
            const int slot = int(loc[n] % PAGE);
            std::memcpy(page + slot * D, codes.data() + n * D, D);
            std::memcpy(page + PAGE * D + slot * 4, &scales[n], 4);
        }
        expect(cache == expected, "each pool's cache slot holds the Hadamard row of its selected keys, "
                                  "and no other byte changed");
        cache_before = cache;
    } catch (const kpool::Error &e) {
        std::fprintf(stderr, "consumer: %s: %s\n", kpool_status_name(e.code()), e.what());
        return 1;
    }

    // One slot past the cache: the call is rejected and writes nothing.
    loc[1] = PAGES * PAGE;
    try {
        kpool::compress_and_write_cache(cache_t, k_t, score_t, ape_t, loc_t, P);
        expect(false, "a loc past the cache is rejected");
    } catch (const kpool::Error &e) {
        expect(e.code() == KPOOL_ERROR_OUT_OF_RANGE, "a loc past the cache is KPOOL_ERROR_OUT_OF_RANGE");
        expect(std::string(e.what()).find("loc[1] = 128") != std::string::npos, "the message names loc[1]");
    }
    expect(cache == cache_before, "a rejected call writes nothing");

    if (failures) {
        return 1;
    }
    std::printf("consumer: ok (%d pools compressed, %s)\n", POOLS, kpool_version());
    return 0;
}
