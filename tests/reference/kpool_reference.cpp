// Compile with -ffp-contract=off: SPEC's softmax sums and butterflies round
// once per operation, and a fused multiply-add (which GCC may form from
// `a + b * c` when the target has FMA, e.g. with -march=native) would round
// once for two. Each operation below is a separate f32 expression.
#include "reference/kpool_reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

namespace kpool_ref {
namespace {

constexpr int kHeadDim = KPOOL_HEAD_DIM;
constexpr float kFp8Max = 448.0f;
// The reference writes these as Python float literals, which Triton narrows
// to f32; the casts below round the same double the same way.
const float kInvSqrt128 = static_cast<float>(0.08838834764831845);
const float kInvFp8Max = static_cast<float>(1.0 / 448.0);
const float kAbsmaxFloor = static_cast<float>(1e-4);

uint32_t bits_of(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

float float_of(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// ---- Strided element access ------------------------------------------------

// Element offset of `index` (outermost first) through the descriptor's strides.
int64_t offset_of(const kpool_tensor *t, std::initializer_list<int64_t> index) {
    int64_t offset = 0;
    int dim = 0;
    for (int64_t i : index) offset += i * t->strides[dim++];
    return offset;
}

template <typename T>
T load(const kpool_tensor *t, int64_t offset) {
    T value;
    std::memcpy(&value, static_cast<const char *>(t->data) + offset * int64_t(sizeof(T)),
                sizeof(T));
    return value;
}

template <typename T>
void store(const kpool_tensor *t, int64_t offset, T value) {
    std::memcpy(static_cast<char *>(t->data) + offset * int64_t(sizeof(T)), &value, sizeof(T));
}

// A bf16 or f32 element as f32.
float load_f32(const kpool_tensor *t, int64_t offset) {
    if (t->dtype == KPOOL_DTYPE_BFLOAT16) return bf16_to_f32(load<uint16_t>(t, offset));
    return load<float>(t, offset);
}

// An int32, int64, bool or uint8 element as int64.
int64_t load_int(const kpool_tensor *t, int64_t offset) {
    switch (t->dtype) {
        case KPOOL_DTYPE_INT32: return load<int32_t>(t, offset);
        case KPOOL_DTYPE_INT64: return load<int64_t>(t, offset);
        default: return load<uint8_t>(t, offset);
    }
}

// torch's .to(int32): keep the low 32 bits (modular in GCC, and in C++20).
int32_t wrap_to_int32(int64_t value) { return static_cast<int32_t>(value); }

// a * b + c in int64 as torch and Triton compute it: modulo 2^64 (hostile
// ids near INT64_MAX wrap instead of overflowing).
int64_t wrapping_mul_add(int64_t a, int64_t b, int64_t c) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b) + static_cast<uint64_t>(c));
}

// ---- The shared pipeline ----------------------------------------------------

struct QuantizedRow {
    std::array<uint8_t, kHeadDim> codes;
    float scale;
};

// Hadamard-128, bf16 materialisation, per-row scale, e4m3 quantisation: the
// tail that fwht128_quant_fp8 and every pool compression share.
QuantizedRow rotate_and_quantize(const Row &x, bool round_scale) {
    Row rotated = hadamard128(x);
    for (float &v : rotated) v = round_to_bf16(v);
    QuantizedRow out;
    out.scale = fp8_scale(rotated, round_scale);
    for (int d = 0; d < kHeadDim; ++d) out.codes[d] = fp8_quantize(rotated[d], out.scale);
    return out;
}

// SPEC step 4, "Non-finite values": the reference's max and min (PTX
// max.f32 / min.f32) give the other operand when one is NaN. (std::max and
// std::min do not: they return their first operand when either is NaN.)
float max_ignoring_nan(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b); }
float min_ignoring_nan(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : std::min(a, b); }

// SPEC item 5 over the P slots of one pool; k[j], score[j] are slot j's f32
// values, ape is f32 [P, 128].
Row softmax_pool(const std::vector<Row> &k, const std::vector<Row> &score,
                 const kpool_tensor *ape) {
    const int pool_size = static_cast<int>(k.size());
    Row pooled;
    std::vector<float> biased(pool_size);
    for (int d = 0; d < kHeadDim; ++d) {
        float max_biased = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < pool_size; ++j) {
            biased[j] = score[j][d] + load<float>(ape, offset_of(ape, {j, d}));
            max_biased = max_ignoring_nan(max_biased, biased[j]);
        }
        float weighted_sum = 0.0f;
        float weight_sum = 0.0f;
        for (int j = 0; j < pool_size; ++j) {
            const float weight = exp_f32(biased[j] - max_biased);
            weight_sum = weight_sum + weight;
            const float weighted = k[j][d] * weight;
            weighted_sum = weighted_sum + weighted;
        }
        pooled[d] = weighted_sum / weight_sum;
    }
    return pooled;
}

// Softmax pooling, bf16 materialisation, then rotate_and_quantize.
QuantizedRow compress_pool(const std::vector<Row> &k, const std::vector<Row> &score,
                           const kpool_tensor *ape, bool round_scale) {
    Row pooled = softmax_pool(k, score, ape);
    for (float &v : pooled) v = round_to_bf16(v);
    return rotate_and_quantize(pooled, round_scale);
}

// Writes a pool's K codes and scale at flat cache slot `loc` (>= 0) of the
// planar indexer cache: page loc / block_size holds block_size K rows, then
// block_size f32 scales at byte block_size * 128; pages are strides[0] bytes apart.
void write_cache_slot(const kpool_tensor *kv_cache, int64_t loc, const QuantizedRow &row) {
    const int64_t block_size = kv_cache->shape[1];
    const int64_t page_stride = kv_cache->strides[0];
    const int64_t page = loc / block_size;
    const int64_t slot_in_page = loc % block_size;
    uint8_t *page_base = static_cast<uint8_t *>(kv_cache->data) + page * page_stride;
    std::memcpy(page_base + slot_in_page * kHeadDim, row.codes.data(), kHeadDim);
    std::memcpy(page_base + block_size * kHeadDim + slot_in_page * 4, &row.scale, 4);
}

// Element offset of tail_kv_cache[block, half, ring_slot, d].
int64_t tail_offset(const kpool_tensor *tail, int64_t block, int half, int64_t ring_slot, int d) {
    return offset_of(tail, {block, half, ring_slot, d});
}

constexpr int kTailKeyHalf = 0;
constexpr int kTailScoreHalf = 1;

// The 127 finite non-negative e4m3fn magnitudes, codes 0x00..0x7E in order
// (0x7F is NaN), from the format's definition: code = eeee.mmm, subnormal
// m/8 * 2^-6 when eeee == 0, else (1 + m/8) * 2^(eeee - 7). Every value is
// exact in double, and the table increases with the code.
const std::array<double, 127> &e4m3_magnitudes() {
    static const std::array<double, 127> table = [] {
        std::array<double, 127> magnitudes{};
        for (int code = 0; code < 127; ++code) {
            const int exponent_field = code >> 3;
            const int mantissa = code & 7;
            magnitudes[code] = exponent_field == 0 ? std::ldexp(mantissa, -9)
                                                   : std::ldexp(8 + mantissa, exponent_field - 10);
        }
        return magnitudes;
    }();
    return table;
}

// A token id as emitted for row r: gathered through page_table (index clamped
// to the table width), shifted by topk_offsets[r], or as is.
int32_t map_token(int64_t token, int64_t r, const kpool_tensor *page_table,
                  const kpool_tensor *topk_offsets) {
    if (page_table) {
        const int64_t column = std::min(std::max<int64_t>(token, 0), page_table->shape[1] - 1);
        return wrap_to_int32(load_int(page_table, offset_of(page_table, {r, column})));
    }
    if (topk_offsets) {
        // [rows] and [rows, 1] alike: only the outer stride matters.
        return wrap_to_int32(wrapping_mul_add(token, 1, load_int(topk_offsets, offset_of(topk_offsets, {r}))));
    }
    return wrap_to_int32(token);
}

}  // namespace

// ---- Scalar numerics ---------------------------------------------------------

float bf16_to_f32(uint16_t bits) { return float_of(uint32_t(bits) << 16); }

uint16_t f32_to_bf16(float value) {
    const uint32_t bits = bits_of(value);
    if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
    // Adding 0x7FFF (+1 when the kept lsb is odd) carries into the kept bits
    // exactly when the dropped half is above one half, or equal with odd lsb.
    const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
    return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float round_to_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

float e4m3_to_f32(uint8_t code) {
    const float sign = (code & 0x80) ? -1.0f : 1.0f;
    const int magnitude_code = code & 0x7F;
    if (magnitude_code == 0x7F) return std::numeric_limits<float>::quiet_NaN();
    return sign * static_cast<float>(e4m3_magnitudes()[magnitude_code]);
}

uint8_t e4m3_encode(float value) {
    const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
    if (std::isnan(value)) return sign | 0x7F;
    const std::array<double, 127> &magnitudes = e4m3_magnitudes();
    const double magnitude = std::fabs(static_cast<double>(value));
    if (magnitude >= magnitudes.back()) return sign | 0x7E;
    // magnitude lies in [magnitudes[below], magnitudes[below + 1]).
    const size_t above =
        std::upper_bound(magnitudes.begin(), magnitudes.end(), magnitude) - magnitudes.begin();
    const size_t below = above - 1;
    // The midpoint of two neighbouring codes is exact in double, so the
    // comparison is exact; a tie goes to the even code (mantissa lsb 0).
    const double midpoint = (magnitudes[below] + magnitudes[above]) / 2;
    size_t code;
    if (magnitude < midpoint) {
        code = below;
    } else if (magnitude > midpoint) {
        code = above;
    } else {
        code = (below % 2 == 0) ? below : above;
    }
    return static_cast<uint8_t>(sign | code);
}

float ue8m0_scale(float m) {
    // An infinite absmax gives m = inf, and its scale is inf (exponent 255).
    assert(m > 0.0f && (std::isnormal(m) || std::isinf(m)));
    const uint32_t bits = bits_of(m);
    uint32_t exponent_field = bits >> 23;
    // Any mantissa bit set means m is above 2^exponent: round up to the next power.
    if (bits & 0x7FFFFF) exponent_field += 1;
    return float_of(exponent_field << 23);
}

float fp8_scale(const Row &x, bool round_scale) {
    float absmax = 0.0f;
    for (float v : x) absmax = max_ignoring_nan(absmax, std::fabs(v));
    absmax = max_ignoring_nan(absmax, kAbsmaxFloor);
    const float m = absmax * kInvFp8Max;
    return round_scale ? ue8m0_scale(m) : m;
}

uint8_t fp8_quantize(float x, float scale) {
    const float scaled = x / scale;
    return e4m3_encode(min_ignoring_nan(max_ignoring_nan(scaled, -kFp8Max), kFp8Max));
}

// glibc's double exp is accurate to under one double ulp (2^-29 of an f32
// spacing), so rounding it to f32 is correctly rounded unless exp(x) lies
// within about one double ulp of a midpoint between two floats. Checked for
// every f32 input against expl (long double) on glibc 2.36 / x86-64: no
// mismatch; the closest input, x = -0x1.d2259ap+3, is one double ulp from a
// midpoint, so a less accurate libm could miss there.
float exp_f32(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

Row hadamard128(const Row &x) {
    Row current = x;
    for (int stride = 1; stride < kHeadDim; stride *= 2) {
        Row next;
        for (int i = 0; i < kHeadDim; ++i) {
            next[i] =
                (i & stride) ? current[i - stride] - current[i] : current[i] + current[i + stride];
        }
        current = next;
    }
    for (float &v : current) v = v * kInvSqrt128;
    return current;
}

// ---- Operations ----------------------------------------------------------------

void fwht128_quant_fp8(const kpool_tensor *q, const kpool_tensor *q_fp8,
                       const kpool_tensor *q_scale) {
    const int64_t rows = q->shape[0];
    for (int64_t r = 0; r < rows; ++r) {
        Row x;
        for (int d = 0; d < kHeadDim; ++d) x[d] = load_f32(q, offset_of(q, {r, d}));
        const QuantizedRow out = rotate_and_quantize(x, /*round_scale=*/true);
        for (int d = 0; d < kHeadDim; ++d) store(q_fp8, offset_of(q_fp8, {r, d}), out.codes[d]);
        // [rows, 1] and [rows] alike: only the outer stride matters.
        store(q_scale, offset_of(q_scale, {r}), out.scale);
    }
}

void compress_and_write_cache(const kpool_tensor *kv_cache, const kpool_tensor *slot_k,
                              const kpool_tensor *slot_score, const kpool_tensor *ape,
                              const kpool_tensor *loc, const kpool_tensor *write_mask,
                              const kpool_tensor *compressed_k,
                              const kpool_tensor *compressed_scale, int32_t pool_size,
                              int32_t head_dim, int32_t round_scale, int32_t write_cache) {
    assert(head_dim == kHeadDim);
    const int64_t pools = slot_k->shape[0];
    for (int64_t i = 0; i < pools; ++i) {
        if (write_mask && load_int(write_mask, offset_of(write_mask, {i})) == 0) continue;
        std::vector<Row> k(pool_size), score(pool_size);
        for (int j = 0; j < pool_size; ++j) {
            for (int d = 0; d < kHeadDim; ++d) {
                k[j][d] = load_f32(slot_k, offset_of(slot_k, {i, j, d}));
                score[j][d] = load_f32(slot_score, offset_of(slot_score, {i, j, d}));
            }
        }
        const QuantizedRow row = compress_pool(k, score, ape, round_scale != 0);
        const int64_t cache_slot = load_int(loc, offset_of(loc, {i}));
        if (write_cache && cache_slot >= 0) write_cache_slot(kv_cache, cache_slot, row);
        if (compressed_k) {
            for (int d = 0; d < kHeadDim; ++d) {
                store(compressed_k, offset_of(compressed_k, {i, d}), row.codes[d]);
            }
            store(compressed_scale, offset_of(compressed_scale, {i}), row.scale);
        }
    }
}

void seed_tail_cache(const kpool_tensor *tail_kv_cache, const kpool_tensor *key,
                     const kpool_tensor *gate_score, const kpool_tensor *tslot, int32_t pool_size,
                     int32_t head_dim) {
    assert(head_dim == kHeadDim);
    const int64_t ring = tail_kv_cache->shape[2];
    const int64_t tokens = tslot->shape[0];
    for (int64_t i = 0; i < tokens; ++i) {
        const int64_t slot = load_int(tslot, offset_of(tslot, {i}));
        if (slot < 0) continue;
        const int64_t block = slot / ring;
        // Token i is among its request's last P tokens unless the token P
        // ahead exists, is real, and writes the same tail block.
        if (i + pool_size < tokens) {
            const int64_t slot_ahead = load_int(tslot, offset_of(tslot, {i + pool_size}));
            if (slot_ahead >= 0 && slot_ahead / ring == block) continue;
        }
        for (int d = 0; d < kHeadDim; ++d) {
            store(tail_kv_cache, tail_offset(tail_kv_cache, block, kTailKeyHalf, slot % ring, d),
                  load<uint16_t>(key, offset_of(key, {i, d})));
            store(tail_kv_cache, tail_offset(tail_kv_cache, block, kTailScoreHalf, slot % ring, d),
                  load<uint16_t>(gate_score, offset_of(gate_score, {i, d})));
        }
    }
}

int64_t decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache,
    const kpool_tensor *tail_slot_mapping, const kpool_tensor *key, const kpool_tensor *slot_score,
    const kpool_tensor *ape, const kpool_tensor *slot_mapping, const kpool_tensor *positions,
    int32_t pool_size, int32_t head_dim, int32_t round_scale) {
    assert(head_dim == kHeadDim);
    const int64_t ring = tail_kv_cache->shape[2];
    const int64_t requests = key->shape[0];
    const int64_t tokens_per_request = key->shape[1];
    int64_t skipped_completions = 0;
    for (int64_t b = 0; b < requests; ++b) {
        // In token order: a completion reads the stashes of the earlier tokens.
        for (int64_t t = 0; t < tokens_per_request; ++t) {
            const int64_t pos = load_int(positions, offset_of(positions, {b, t}));
            const int64_t tail_slot =
                load_int(tail_slot_mapping, offset_of(tail_slot_mapping, {b, t}));
            const int64_t cache_slot = load_int(slot_mapping, offset_of(slot_mapping, {b, t}));
            const bool completes_pool =
                cache_slot >= 0 && pos >= 0 && pos % pool_size == pool_size - 1;
            if (completes_pool && tail_slot < 0) {
                ++skipped_completions;  // no tail block to read the other P-1 tokens from
            } else if (completes_pool) {
                const int64_t block = tail_slot / ring;
                const int64_t pool_start = pos - (pool_size - 1);
                std::vector<Row> k(pool_size), score(pool_size);
                for (int j = 0; j < pool_size - 1; ++j) {
                    const int64_t ring_slot = (pool_start + j) % ring;
                    for (int d = 0; d < kHeadDim; ++d) {
                        k[j][d] = load_f32(tail_kv_cache, tail_offset(tail_kv_cache, block,
                                                                      kTailKeyHalf, ring_slot, d));
                        score[j][d] = load_f32(
                            tail_kv_cache,
                            tail_offset(tail_kv_cache, block, kTailScoreHalf, ring_slot, d));
                    }
                }
                for (int d = 0; d < kHeadDim; ++d) {
                    k[pool_size - 1][d] = load_f32(key, offset_of(key, {b, t, d}));
                    score[pool_size - 1][d] =
                        load_f32(slot_score, offset_of(slot_score, {b, t, d}));
                }
                write_cache_slot(kv_cache, cache_slot,
                                 compress_pool(k, score, ape, round_scale != 0));
            }
            if (pos >= 0 && tail_slot >= 0) {
                const int64_t block = tail_slot / ring;
                for (int d = 0; d < kHeadDim; ++d) {
                    store(tail_kv_cache,
                          tail_offset(tail_kv_cache, block, kTailKeyHalf, pos % ring, d),
                          load<uint16_t>(key, offset_of(key, {b, t, d})));
                    store(tail_kv_cache,
                          tail_offset(tail_kv_cache, block, kTailScoreHalf, pos % ring, d),
                          load<uint16_t>(slot_score, offset_of(slot_score, {b, t, d})));
                }
            }
        }
    }
    return skipped_completions;
}

void expand_pools_and_append_tail(const kpool_tensor *pool_ids, const kpool_tensor *seq_lens,
                                  const kpool_tensor *out, int32_t pool_size,
                                  int32_t bound_pool_ids) {
    const int64_t rows = pool_ids->shape[0];
    const int64_t history_cols = pool_ids->shape[1] * pool_size;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t seq_len = load_int(seq_lens, offset_of(seq_lens, {r}));
        const int64_t complete_pools = seq_len / pool_size;
        const int64_t tail_start = complete_pools * pool_size;
        const int64_t tail_count = seq_len - tail_start;
        for (int64_t c = 0; c < history_cols; ++c) {
            const int64_t pool_id = load_int(pool_ids, offset_of(pool_ids, {r, c / pool_size}));
            const bool valid = pool_id >= 0 && !(bound_pool_ids && pool_id >= complete_pools);
            store(out, offset_of(out, {r, c}),
                  valid ? wrap_to_int32(wrapping_mul_add(pool_id, pool_size, c % pool_size)) : int32_t(-1));
        }
        for (int64_t tail_col = 0; tail_col < pool_size - 1; ++tail_col) {
            store(out, offset_of(out, {r, history_cols + tail_col}),
                  tail_col < tail_count ? wrap_to_int32(tail_start + tail_col) : int32_t(-1));
        }
    }
}

void expand_pools_to_tokens(const kpool_tensor *group_ids, const kpool_tensor *group_valid,
                            const kpool_tensor *page_table, const kpool_tensor *topk_offsets,
                            const kpool_tensor *out, int32_t topk, int32_t pool_size) {
    const int64_t rows = group_ids->shape[0];
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < topk; ++c) {
            const int64_t group = c / pool_size;
            const bool valid = load_int(group_valid, offset_of(group_valid, {r, group})) != 0;
            const int64_t token = wrapping_mul_add(load_int(group_ids, offset_of(group_ids, {r, group})),
                                                   pool_size, c % pool_size);
            store(out, offset_of(out, {r, c}),
                  valid ? map_token(token, r, page_table, topk_offsets) : int32_t(-1));
        }
    }
}

void append_tail_to_topk(const kpool_tensor *topk_result, const kpool_tensor *seq_lens,
                         const kpool_tensor *pool_lens, const kpool_tensor *page_table,
                         const kpool_tensor *topk_offsets, const kpool_tensor *out,
                         int32_t pool_size) {
    const int64_t rows = topk_result->shape[0];
    const int64_t history_cols = topk_result->shape[1];
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < history_cols; ++c) {
            store(out, offset_of(out, {r, c}),
                  load<int32_t>(topk_result, offset_of(topk_result, {r, c})));
        }
        const int64_t tail_start = load_int(pool_lens, offset_of(pool_lens, {r})) * pool_size;
        const int64_t tail_count = load_int(seq_lens, offset_of(seq_lens, {r})) - tail_start;
        for (int64_t tail_col = 0; tail_col < pool_size - 1; ++tail_col) {
            store(out, offset_of(out, {r, history_cols + tail_col}),
                  tail_col < tail_count
                      ? map_token(tail_start + tail_col, r, page_table, topk_offsets)
                      : int32_t(-1));
        }
    }
}

int64_t history_group_budget_for_topk(int64_t topk, int32_t pool_size) { return topk / pool_size; }

}  // namespace kpool_ref
