// kpool_ref: a plain, slow, scalar C++17 reference of every operation in
// SPEC.md, written from SPEC.md alone. It is the oracle that the generated
// kernels and the numerics tests are checked against, so it favours being
// obviously right over being fast: one element at a time, every stride
// honoured, every rounding point spelled out.
//
// The operations take the same tensor descriptors, in the same order, as the
// matching kpool_* C functions (minus exec/status). They expect host memory
// and valid input: nothing is validated here (that is the runtime's job).
//
// Build note: the .cpp must be compiled with -ffp-contract=off so that no
// multiply-add is fused; SPEC's sums round once per operation.
#ifndef KPOOL_TESTS_REFERENCE_KPOOL_REFERENCE_H
#define KPOOL_TESTS_REFERENCE_KPOOL_REFERENCE_H

#include <array>
#include <cstdint>

#include "kpool/kpool.h"

namespace kpool_ref {

// One head vector, D = 128 values.
using Row = std::array<float, KPOOL_HEAD_DIM>;

// ---- Scalar numerics (SPEC "Shared numerics") ------------------------------

// bf16 bits -> f32, exact.
float bf16_to_f32(uint16_t bits);
// f32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
uint16_t f32_to_bf16(float value);
// f32 -> bf16 -> f32: the bf16 materialisation points of the pipeline.
float round_to_bf16(float value);

// The value of an e4m3fn code (NaN for 0x7F / 0xFF).
float e4m3_to_f32(uint8_t code);
// f32 -> e4m3fn code, round to nearest even, subnormals included. Found by
// searching the table of all finite e4m3fn magnitudes, not by bit tricks, so
// that it can serve as the oracle for the kernels' bit-level encoder.
// Magnitudes above 448 saturate to +-448 (like the hardware's satfinite
// conversion; the pipeline clamps before encoding, so only direct callers see
// this); NaN gives 0x7F with the sign of the input.
uint8_t e4m3_encode(float value);

// 2^ceil(log2(m)) for a positive normal f32 m, exactly, from its bits
// (inf for m = inf).
float ue8m0_scale(float m);
// The per-row fp8 scale of SPEC item 3: absmax clamped to 1e-4, times 1/448,
// then ue8m0_scale when round_scale. Both maxes ignore NaN (SPEC step 4): a
// NaN element never raises the absmax, a row of NaN only has absmax 1e-4.
float fp8_scale(const Row &x, bool round_scale);
// SPEC item 4: min(max(x / scale, -448), 448), then e4m3_encode; the max and
// min ignore NaN, so a NaN quotient becomes -448 (code 0xFE).
uint8_t fp8_quantize(float x, float scale);

// Correctly rounded f32 exp.
float exp_f32(float x);

// SPEC item 2: seven butterfly stages (strides 1, 2, ..., 64), then * 1/sqrt(128).
Row hadamard128(const Row &x);

// ---- Operations (SPEC "Operations"), argument order as in kpool.h ----------

// 1. q: bf16 [rows, 128] -> q_fp8: e4m3/uint8 [rows, 128], q_scale: f32 [rows, 1] or [rows].
void fwht128_quant_fp8(const kpool_tensor *q, const kpool_tensor *q_fp8,
                       const kpool_tensor *q_scale);

// 2. write_mask, compressed_k / compressed_scale may be NULL; kv_cache may be
//    NULL when write_cache == 0. A negative loc is a "no write" sentinel: the
//    pool is still returned through compressed_k when asked for.
void compress_and_write_cache(const kpool_tensor *kv_cache, const kpool_tensor *slot_k,
                              const kpool_tensor *slot_score, const kpool_tensor *ape,
                              const kpool_tensor *loc, const kpool_tensor *write_mask,
                              const kpool_tensor *compressed_k,
                              const kpool_tensor *compressed_scale, int32_t pool_size,
                              int32_t head_dim, int32_t round_scale, int32_t write_cache);

// 3. tslot: int32 or int64 [n].
void seed_tail_cache(const kpool_tensor *tail_kv_cache, const kpool_tensor *key,
                     const kpool_tensor *gate_score, const kpool_tensor *tslot, int32_t pool_size,
                     int32_t head_dim);

// 4. Returns the number of skipped completions: tokens with slot_mapping >= 0,
//    pos >= 0 and pos % P == P-1 but tail_slot < 0, for which nothing is
//    written (SPEC "Reference defects").
int64_t decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache,
    const kpool_tensor *tail_slot_mapping, const kpool_tensor *key, const kpool_tensor *slot_score,
    const kpool_tensor *ape, const kpool_tensor *slot_mapping, const kpool_tensor *positions,
    int32_t pool_size, int32_t head_dim, int32_t round_scale);

// 5. pool_ids: int32/int64 [rows, G]; with bound_pool_ids, ids >= seq_len / P
//    are treated as -1.
void expand_pools_and_append_tail(const kpool_tensor *pool_ids, const kpool_tensor *seq_lens,
                                  const kpool_tensor *out, int32_t pool_size,
                                  int32_t bound_pool_ids);

// 6. page_table and topk_offsets ([rows] or [rows, 1]) may each be NULL.
void expand_pools_to_tokens(const kpool_tensor *group_ids, const kpool_tensor *group_valid,
                            const kpool_tensor *page_table, const kpool_tensor *topk_offsets,
                            const kpool_tensor *out, int32_t topk, int32_t pool_size);

// 7. page_table and topk_offsets ([rows] or [rows, 1]) apply to the tail
//    tokens only: the history columns were mapped by expand_pools_to_tokens.
void append_tail_to_topk(const kpool_tensor *topk_result, const kpool_tensor *seq_lens,
                         const kpool_tensor *pool_lens, const kpool_tensor *page_table,
                         const kpool_tensor *topk_offsets, const kpool_tensor *out,
                         int32_t pool_size);

// topk / P, the number of pools to select (topk % P == 0).
int64_t history_group_budget_for_topk(int64_t topk, int32_t pool_size);

}  // namespace kpool_ref

#endif  // KPOOL_TESTS_REFERENCE_KPOOL_REFERENCE_H
