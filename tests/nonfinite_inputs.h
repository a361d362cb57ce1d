// Rows holding NaN, infinities and values whose sums overflow (SPEC step 4,
// "Non-finite values"), shared by the CPU tests (test_nonfinite.cpp: kernels
// against the scalar reference) and the GPU ones (test_gpu_nonfinite.cpp:
// CUDA against the CPU, both arithmetics).
#ifndef KPOOL_TESTS_NONFINITE_INPUTS_H
#define KPOOL_TESTS_NONFINITE_INPUTS_H

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();
// The largest finite bf16: a few of them overflow any f32 sum.
inline constexpr float kBf16Max = 3.3895313892515355e38f;

// fwht rows, one kind per row: normal values, then the row's special ones.
enum class FwhtRow {
    kOneNaN,           // a NaN element: the rotation spreads it to every output
    kPlusInf,          // one +inf: every output +-inf, scale inf, inf / inf = NaN
    kMinusInf,         // one -inf
    kBothInfs,         // +inf and -inf: inf - inf = NaN in half the outputs
    kRotationOverflow, // elements of +-2^124: the later butterflies overflow,
                       // some outputs inf, some NaN, most finite
    kHalfHuge,         // half the elements huge: overflow in the later stages
    kAllNaN,           // NaN only: absmax 1e-4
    kFinite,           // a normal row between them
};
inline constexpr FwhtRow kFwhtRows[] = {FwhtRow::kOneNaN,    FwhtRow::kPlusInf,          FwhtRow::kMinusInf,
                                        FwhtRow::kBothInfs,  FwhtRow::kRotationOverflow, FwhtRow::kHalfHuge,
                                        FwhtRow::kAllNaN,    FwhtRow::kFinite};

// q [rows, 128] bf16, row r of kind kFwhtRows[r % 8].
inline HostTensor make_nonfinite_q(std::mt19937 &rng, int64_t rows) {
    HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
    fill_normal(q, rng, 2.0f);
    for (int64_t r = 0; r < rows; ++r) {
        auto put = [&](int d, float v) { q.set<uint16_t>({r, d}, bf16_of(v)); };
        switch (kFwhtRows[r % 8]) {
            case FwhtRow::kOneNaN: put(int(r % kD), kNaN); break;
            case FwhtRow::kPlusInf: put(5, kInf); break;
            case FwhtRow::kMinusInf: put(77, -kInf); break;
            case FwhtRow::kBothInfs: put(3, kInf), put(64 + 3, -kInf); break;
            case FwhtRow::kRotationOverflow:
                for (int d = 0; d < kD; ++d) put(d, (d % 3 ? 1.0f : -1.0f) * 0x1p124f);
                break;
            case FwhtRow::kHalfHuge:
                for (int d = 0; d < kD; d += 2) put(d, 3e37f);
                break;
            case FwhtRow::kAllNaN:
                for (int d = 0; d < kD; ++d) put(d, kNaN);
                break;
            case FwhtRow::kFinite: break;
        }
    }
    return q;
}

// Compress pools, one kind per pool (P >= 4): where the special value sits.
enum class PoolRow {
    kNaNKey,           // NaN in one slot's key, one dim
    kNaNScore,         // NaN in one slot's score, one dim
    kPlusInfScore,     // +inf score: s - m = inf - inf = NaN
    kMinusInfScore,    // -inf score in half the slots: their weight is exactly 0
    kAllMinusInfDim,   // every slot's score -inf in one dim: m = -inf, NaN
    kAllNaNScoreDim,   // every slot's score NaN in one dim: the max ignores them all
    kInfKey,           // +inf key and -inf key in two slots of one dim
    kScoreOverflow,    // score + ape overflows to +inf in one slot
    kSumOverflow,      // keys near the bf16 maximum: the weighted sum overflows
    kRotationOverflow, // pooled values of +-2^123 (exact in both arithmetics, every
                       // slot the same key): the rotation overflows
    kFinite,
};
inline constexpr int kPoolRowKinds = 11;
// Whether a pool kind's row is fixed by the rules alone (NaN or infinity
// reaches every rotated value): then the Triton arithmetic's approximate exp
// and division cannot change a byte of it.
inline bool pool_row_fixed_by_rules(PoolRow kind) {
    return kind != PoolRow::kMinusInfScore && kind != PoolRow::kScoreOverflow && kind != PoolRow::kFinite &&
           kind != PoolRow::kRotationOverflow;
}
// Dims the special values sit in: d and the ape-overflow dim differ.
inline constexpr int kSpecialDim = 9, kApeDim = 100;

// Engine-shaped compress inputs for n pools of P (>= 4) slots, pool i of
// kind i % kPoolRowKinds; ape holds one huge value (kApeDim, slot 1) that
// only the kScoreOverflow pool's huge score overflows with, and (with
// ape_nan) one NaN (slot 2, dim 40): then every pool's dim 40 is NaN.
inline CompressInputs make_nonfinite_compress(std::mt19937 &rng, int64_t n, int P, kpool_dtype score_dtype,
                                              int64_t cache_slots, bool ape_nan) {
    CompressInputs in = make_compress_inputs(rng, n, P, score_dtype, cache_slots);
    // No "no write" sentinels or masks: every row is compared.
    for (int64_t i = 0; i < n; ++i) {
        in.loc.set<int64_t>({i}, i % cache_slots);
        in.write_mask.set<uint8_t>({i}, 1);
    }
    auto score = [&](int64_t i, int j, int d, float v) {
        if (score_dtype == KPOOL_DTYPE_BFLOAT16) {
            in.slot_score.set<uint16_t>({i, j, d}, bf16_of(v));
        } else {
            in.slot_score.set<float>({i, j, d}, v);
        }
    };
    auto key = [&](int64_t i, int j, int d, float v) { in.slot_k.set<uint16_t>({i, j, d}, bf16_of(v)); };
    in.ape.set<float>({1, kApeDim}, 3e38f);
    if (ape_nan) in.ape.set<float>({2, 40}, kNaN);
    for (int64_t i = 0; i < n; ++i) {
        // Moderate scores in the pool's special dim so the sums stay finite but for the special value.
        for (int j = 0; j < P; ++j) score(i, j, kApeDim, -1.0f);
        switch (PoolRow(i % kPoolRowKinds)) {
            case PoolRow::kNaNKey: key(i, P - 1, kSpecialDim, kNaN); break;
            case PoolRow::kNaNScore: score(i, 0, kSpecialDim, kNaN); break;
            case PoolRow::kPlusInfScore: score(i, 1, kSpecialDim, kInf); break;
            case PoolRow::kMinusInfScore:
                for (int j = 0; j < P; j += 2) score(i, j, kSpecialDim, -kInf);
                break;
            case PoolRow::kAllMinusInfDim:
                for (int j = 0; j < P; ++j) score(i, j, kSpecialDim, -kInf);
                break;
            case PoolRow::kAllNaNScoreDim:
                for (int j = 0; j < P; ++j) score(i, j, kSpecialDim, kNaN);
                break;
            case PoolRow::kInfKey: key(i, 0, kSpecialDim, kInf), key(i, 2, kSpecialDim, -kInf); break;
            case PoolRow::kScoreOverflow: score(i, 1, kApeDim, 3e38f); break;
            case PoolRow::kSumOverflow:
                for (int j = 0; j < P; ++j) key(i, j, kSpecialDim, kBf16Max), score(i, j, kSpecialDim, 0.0f);
                break;
            case PoolRow::kRotationOverflow:  // P * 2^123 (P <= 16) does not overflow the sums; 128 * 2^123 does
                for (int j = 0; j < P; ++j) {
                    for (int d = 0; d < kD; ++d) key(i, j, d, (d % 5 ? 1.0f : -1.0f) * 0x1p123f);
                }
                break;
            case PoolRow::kFinite: break;
        }
    }
    return in;
}

// A decode batch whose every request completes one pool (positions 0..P-1
// in its own tail block, the last token writing cache slot b), request b
// carrying special values of kind b % kDecodeRowKinds in its tokens, the
// ring slots it reads (earlier steps' stashes) or ape.
inline constexpr int kDecodeRowKinds = 7;
// The decode kinds whose row the rules alone fix (as pool_row_fixed_by_rules).
inline bool decode_row_fixed_by_rules(int kind) { return kind != 2 && kind != 6; }
inline DecodeInputs make_nonfinite_decode(std::mt19937 &rng, int64_t B, int P, int64_t ring, bool ape_nan) {
    DecodeInputs in = make_decode_tensors(rng, B, P, P);
    for (int64_t b = 0; b < B; ++b) {
        const int kind = int(b % kDecodeRowKinds);
        for (int t = 0; t < P; ++t) {
            // Kind 5: only the completing token; the others are padding, so
            // the pool reads the ring (make_nonfinite_tail).
            const bool padding = kind == 5 && t < P - 1;
            in.positions.set<int32_t>({b, t}, padding ? -1 : t);
            in.tail_slot_mapping.set<int32_t>({b, t}, padding ? -1 : int32_t(b * ring + t));
            in.slot_mapping.set<int32_t>({b, t}, t == P - 1 ? int32_t(b) : -1);
        }
        auto key = [&](int t, int d, float v) { in.key.set<uint16_t>({b, t, d}, bf16_of(v)); };
        auto score = [&](int t, int d, float v) { in.slot_score.set<uint16_t>({b, t, d}, bf16_of(v)); };
        switch (kind) {
            case 0: key(P - 1, kSpecialDim, kNaN); break;  // NaN in the completing token's key
            case 1: score(0, kSpecialDim, kNaN); break;    // NaN in an earlier token's score
            case 2: score(1, kSpecialDim, -kInf), score(P - 1, kSpecialDim, -kInf); break;
            case 3: key(2, 7, kInf); break;                // +inf key: the row's scale is inf
            case 4:                                        // the weighted sum overflows
                for (int t = 0; t < P; ++t) key(t, kSpecialDim, kBf16Max), score(t, kSpecialDim, 0.0f);
                break;
            default: break;
        }
    }
    if (ape_nan) in.ape.set<float>({1, 60}, kNaN);
    return in;
}

// The tail ring for make_nonfinite_decode: a block of `ring` per request,
// earlier stashes of random values; in every block, ring slot 0 holds a NaN
// score (dim 9) and slot 1 a +inf key (dim 20), which only the requests of
// kind 5 read (the others overwrite them first).
inline HostTensor make_nonfinite_tail(std::mt19937 &rng, int64_t B, int64_t ring) {
    HostTensor tail = make_tail_cache(B, ring, false);
    fill_normal(tail, rng, 1.0f);
    for (int64_t b = 0; b < B; ++b) {
        tail.set<uint16_t>({b, 1, 0, kSpecialDim}, bf16_of(kNaN));
        tail.set<uint16_t>({b, 0, 1, 20}, bf16_of(kInf));
    }
    return tail;
}

}  // namespace kpool_test

#endif  // KPOOL_TESTS_NONFINITE_INPUTS_H
