// Engine-shaped random inputs for the op tests, shared by the CPU tests
// (test_ops.cpp, against the scalar reference) and the GPU tests
// (test_gpu_*.cpp, against the CPU kernels), and the parameter axes and test
// names the two suites share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace kpool_test {

// The indexer cache [num_blocks, block_size, 132] uint8; with `padded` the
// page stride is larger than block_size * 132 (and a multiple of 4).
inline HostTensor make_kv_cache(int64_t num_blocks, int64_t block_size, bool padded) {
    const int64_t page = block_size * kRowBytes + (padded ? 4 * 37 : 0);
    return HostTensor(KPOOL_DTYPE_UINT8, {num_blocks, block_size, kRowBytes}, {page, kRowBytes, 1});
}

// The tail ring [num_blocks, 2, ring, 128] bf16; with `padded` both the half
// and the block stride carry padding (the ring aliases a larger allocation).
inline HostTensor make_tail_cache(int64_t num_blocks, int64_t ring, bool padded) {
    const int64_t half = ring * kD + (padded ? 64 : 0);
    const int64_t block = 2 * half + (padded ? 320 : 0);
    return HostTensor(KPOOL_DTYPE_BFLOAT16, {num_blocks, 2, ring, kD}, {block, half, kD, 1});
}

inline std::string dtype_tag(kpool_dtype t) {
    switch (t) {
        case KPOOL_DTYPE_INT32: return "i32";
        case KPOOL_DTYPE_INT64: return "i64";
        case KPOOL_DTYPE_BFLOAT16: return "bf16";
        case KPOOL_DTYPE_FLOAT32: return "f32";
        case KPOOL_DTYPE_UINT8: return "u8";
        case KPOOL_DTYPE_FLOAT8_E4M3FN: return "e4m3";
        default: return "other";
    }
}

enum class CompressMode {
    kWrite,            // write_cache only
    kWriteMasked,      // write_cache with a write_mask
    kWriteAndReturn,   // write_cache + return_compressed
    kReturnOnly,       // return_compressed, write_cache = 0, kv_cache given (untouched)
    kReturnOnlyNoCache // return_compressed, write_cache = 0, kv_cache NULL
};

inline std::string mode_tag(CompressMode m) {
    switch (m) {
        case CompressMode::kWrite: return "write";
        case CompressMode::kWriteMasked: return "masked";
        case CompressMode::kWriteAndReturn: return "writeReturn";
        case CompressMode::kReturnOnly: return "returnOnly";
        case CompressMode::kReturnOnlyNoCache: return "returnNoCache";
    }
    return "";
}

// Engine-shaped compress inputs for n pools of P tokens.
struct CompressInputs {
    HostTensor slot_k, slot_score, ape, loc, write_mask;
};

inline CompressInputs make_compress_inputs(std::mt19937 &rng, int64_t n, int P, kpool_dtype score_dtype,
                                    int64_t cache_slots) {
    CompressInputs in;
    in.slot_k = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, P, kD});
    in.slot_score = HostTensor(score_dtype, {n, P, kD});
    in.ape = HostTensor(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(in.slot_k, rng, 1.0f);
    fill_normal(in.slot_score, rng, 2.0f);
    fill_normal(in.ape, rng, 0.5f);
    // Edge pools: zero K (absmax floor), tiny K, huge K, scores so spread
    // that most weights underflow to subnormals or zero, and equal scores.
    for (int64_t i = 0; i < n && i < 5; ++i) {
        for (int j = 0; j < P; ++j) {
            for (int d = 0; d < kD; ++d) {
                const float k_sigma[] = {0.0f, 1e-7f, 1e25f, 1.0f, 3.0f};
                in.slot_k.set<uint16_t>({i, j, d}, random_bf16(rng, k_sigma[i]));
                if (i == 3) {
                    std::normal_distribution<float> wide(0.0f, 60.0f);
                    const float s = wide(rng);
                    if (score_dtype == KPOOL_DTYPE_BFLOAT16) {
                        in.slot_score.set<uint16_t>({i, j, d}, bf16_of(s));
                    } else {
                        in.slot_score.set<float>({i, j, d}, s);
                    }
                }
                if (i == 4) {
                    if (score_dtype == KPOOL_DTYPE_BFLOAT16) {
                        in.slot_score.set<uint16_t>({i, j, d}, bf16_of(0.25f));
                    } else {
                        in.slot_score.set<float>({i, j, d}, 0.25f);
                    }
                }
            }
        }
    }
    in.loc = HostTensor(KPOOL_DTYPE_INT64, {n});
    // Distinct slots; pool 12 gets slot 0 and the last pool the very last slot.
    std::vector<int64_t> slots = distinct_slots(rng, std::max<int64_t>(cache_slots - 2, 0), n);
    for (int64_t &slot : slots) slot += 1;
    if (n > 12) {
        slots[12] = 0;
        slots[n - 1] = cache_slots - 1;
    }
    for (int64_t i = 0; i < n; ++i) in.loc.set<int64_t>({i}, slots[i]);
    // Negative sentinels of several kinds: "no write" (pools 6, 13, 20, 27).
    const int64_t sentinels[] = {-1, std::numeric_limits<int64_t>::min(), -1234567, -2};
    for (int k = 0; k < 4; ++k) {
        const int64_t i = 6 + 7 * k;
        if (i < n) in.loc.set<int64_t>({i}, sentinels[k]);
    }
    in.write_mask = HostTensor(KPOOL_DTYPE_BOOL, {n});
    std::bernoulli_distribution keep(0.6);
    for (int64_t i = 0; i < n; ++i) in.write_mask.set<uint8_t>({i}, keep(rng) ? 1 : 0);
    return in;
}

// A prefill batch: requests of various lengths, contiguous, each with its own
// tail block, starting at random prefix positions, with padding between and
// after them.
// A prefill batch as an engine holds it (the prefill insert,
// kpool_compress_tokens_and_write_cache): requests' chunks back to back,
// key / gate_score [n, 128] rows of wider fused projections, slot_mapping
// pool-granular (a slot only on the token that ends a pool: position % P ==
// P-1; some pools -1, as prefix-cached ones), tail_slot_mapping
// block * RING + position % RING per token (a padding request -1). Chunks
// start at any position: a pool's first members may lie in the previous
// request's rows, which the engine's sequence pools as they are.
struct TokenBatch {
    HostTensor key, gate_score, slot_mapping, tail_slot_mapping;
};

inline TokenBatch make_token_batch(std::mt19937 &rng, int P, kpool_dtype score_dtype, kpool_dtype slot_dtype,
                                   int64_t cache_slots, int64_t ring, int64_t tail_blocks) {
    const int64_t lengths[] = {1, std::max(1, P - 1), P, P + 1, 2 * P + 3, 5 * P + 2, 3};
    const int num_requests = 7;
    const std::vector<int64_t> blocks = distinct_slots(rng, tail_blocks, num_requests);
    std::vector<int64_t> slots, tail_slots;
    for (int r = 0; r < num_requests; ++r) {
        const int64_t start = std::uniform_int_distribution<int64_t>(0, 3 * P)(rng);
        for (int64_t t = 0; t < lengths[r]; ++t) {
            const int64_t pos = start + t;
            slots.push_back(pos % P == P - 1 ? 0 : -1);  // slots assigned below
            tail_slots.push_back(r == 6 ? -1 : blocks[r] * ring + pos % ring);
        }
    }
    const int64_t n = static_cast<int64_t>(slots.size());
    int64_t pool_ends = 0;
    for (int64_t s : slots) pool_ends += s == 0;
    const std::vector<int64_t> free_slots = distinct_slots(rng, cache_slots, std::min(pool_ends, cache_slots));
    int64_t next = 0;
    for (int64_t &s : slots) {
        if (s == 0) {
            s = next < static_cast<int64_t>(free_slots.size()) && rng() % 5 != 0 ? free_slots[next++] : -1;
        }
    }
    TokenBatch b;
    // Column slices of fused projections: rows 320 and 136 elements apart.
    b.key = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD}, {320, 1});
    b.gate_score = HostTensor(score_dtype, {n, kD}, {136, 1});
    fill_normal(b.key, rng);
    fill_normal(b.gate_score, rng, 2.0f);
    b.slot_mapping = HostTensor(slot_dtype, {n});
    b.tail_slot_mapping = HostTensor(slot_dtype, {n});
    for (int64_t i = 0; i < n; ++i) {
        b.slot_mapping.set_int({i}, slots[i]);
        b.tail_slot_mapping.set_int({i}, tail_slots[i]);
    }
    return b;
}

// The engine's prefill insert as it calls the drop-in ops today: every
// token a row, its pool the rows i-P+1 .. i (clamped at 0) gathered into
// [n, P, 128], write_mask = slot_mapping >= 0 && i >= P-1, the slots as
// int64 locs; then compress over the n rows and seed over the n tokens.
// `compress` and `seed` take the C API's arguments (the scalar reference's).
struct GatheredPools {
    HostTensor slot_k, slot_score, loc, write_mask;
};
inline GatheredPools gather_engine_pools(const TokenBatch &b, int P) {
    const int64_t n = b.key.shape(0);
    GatheredPools g;
    g.slot_k = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, P, kD});
    g.slot_score = HostTensor(b.gate_score.dtype(), {n, P, kD});
    g.loc = HostTensor(KPOOL_DTYPE_INT64, {n});
    g.write_mask = HostTensor(KPOOL_DTYPE_BOOL, {n});
    const size_t score_bytes = dtype_size(b.gate_score.dtype());
    for (int64_t i = 0; i < n; ++i) {
        for (int j = 0; j < P; ++j) {
            const int64_t src = std::max<int64_t>(i - P + 1 + j, 0);
            std::memcpy(g.slot_k.raw() + g.slot_k.offset({i, j, 0}) * 2, b.key.bytes().data() + b.key.offset({src, 0}) * 2,
                        kD * 2);
            std::memcpy(g.slot_score.raw() + g.slot_score.offset({i, j, 0}) * score_bytes,
                        b.gate_score.bytes().data() + b.gate_score.offset({src, 0}) * score_bytes, kD * score_bytes);
        }
        const int64_t slot = b.slot_mapping.get_int({i});
        g.loc.set<int64_t>({i}, slot);
        g.write_mask.set<uint8_t>({i}, slot >= 0 && i >= P - 1);
    }
    return g;
}

struct SeedInputs {
    HostTensor key, gate_score, tslot;
};

inline SeedInputs make_seed_inputs(std::mt19937 &rng, int P, int64_t ring, kpool_dtype tslot_dtype,
                            int64_t num_blocks) {
    const int64_t lengths[] = {1, std::max(1, P - 1), P, P + 1, 2 * P + 3, 3 * P};
    const int num_requests = 6;
    const std::vector<int64_t> blocks = distinct_slots(rng, num_blocks, num_requests);
    std::vector<int64_t> slots;
    const int64_t min_sentinel = tslot_dtype == KPOOL_DTYPE_INT32
                                     ? int64_t(std::numeric_limits<int32_t>::min())
                                     : std::numeric_limits<int64_t>::min();
    for (int r = 0; r < num_requests; ++r) {
        const int64_t start = std::uniform_int_distribution<int64_t>(0, 4 * P)(rng);
        for (int64_t t = 0; t < lengths[r]; ++t) {
            slots.push_back(blocks[r] * ring + (start + t) % ring);
        }
        if (r == 2) {
            slots.push_back(-1);
            slots.push_back(-1);
        }
        if (r == 3) slots.push_back(-7);
    }
    slots.push_back(-1);
    slots.push_back(min_sentinel);
    slots.push_back(-1);
    const int64_t n = static_cast<int64_t>(slots.size());
    SeedInputs in;
    in.key = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD});
    in.gate_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD});
    fill_normal(in.key, rng);
    fill_normal(in.gate_score, rng, 2.0f);
    in.tslot = HostTensor(tslot_dtype, {n});
    for (int64_t i = 0; i < n; ++i) in.tslot.set_int({i}, slots[i]);
    return in;
}

struct DecodeInputs {
    HostTensor tail_slot_mapping, key, slot_score, ape, slot_mapping, positions;
};

// The tensors of a decode batch of B requests x N tokens: random key, score
// and ape, and every token padding (-1 in the three index maps).
inline DecodeInputs make_decode_tensors(std::mt19937 &rng, int64_t B, int64_t N, int P) {
    DecodeInputs in;
    in.tail_slot_mapping = HostTensor(KPOOL_DTYPE_INT32, {B, N});
    in.slot_mapping = HostTensor(KPOOL_DTYPE_INT32, {B, N});
    in.positions = HostTensor(KPOOL_DTYPE_INT32, {B, N});
    in.key = HostTensor(KPOOL_DTYPE_BFLOAT16, {B, N, kD});
    in.slot_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {B, N, kD});
    in.ape = HostTensor(KPOOL_DTYPE_FLOAT32, {P, kD});
    fill_normal(in.key, rng);
    fill_normal(in.slot_score, rng, 2.0f);
    fill_normal(in.ape, rng, 0.5f);
    for (HostTensor *map : {&in.tail_slot_mapping, &in.slot_mapping, &in.positions}) {
        for (int64_t i = 0; i < B * N; ++i) map->set<int32_t>({i / N, i % N}, -1);
    }
    return in;
}

// B requests x N tokens: each request has its own tail block and consecutive
// positions; slot_mapping is set on the tokens that complete a pool. Request
// 1 also carries slot_mapping on non-completing tokens (ignored) and -1 on a
// completing one (no write); request 2 ends in padding; request 3 is all
// padding (with stray non-negative slots that must be ignored); request 4
// runs up to position INT32_MAX.
inline DecodeInputs make_decode_inputs(std::mt19937 &rng, int64_t B, int64_t N, int P, int64_t ring,
                                int64_t tail_blocks, int64_t cache_slots) {
    DecodeInputs in = make_decode_tensors(rng, B, N, P);
    const std::vector<int64_t> blocks = distinct_slots(rng, tail_blocks, B);
    const std::vector<int64_t> locs = distinct_slots(rng, cache_slots, B * N);
    for (int64_t b = 0; b < B; ++b) {
        int64_t start = std::uniform_int_distribution<int64_t>(0, 3 * P)(rng);
        if (b % 5 == 4) start = int64_t(std::numeric_limits<int32_t>::max()) - N + 1;
        int completing_seen = 0;
        for (int64_t t = 0; t < N; ++t) {
            const int64_t pos = start + t;
            const bool completes = pos % P == P - 1;
            int64_t tail_slot = blocks[b] * ring + pos % ring;
            int64_t slot = completes ? locs[b * N + t] : -1;
            int64_t p = pos;
            if (b % 5 == 1) {
                if (!completes && t % 2 == 0) slot = locs[b * N + t];  // ignored: not a completion
                if (completes && completing_seen++ == 1) slot = -1;    // a completion with no write
            }
            if (b % 5 == 2 && t >= (N + 1) / 2) {
                p = -1;
                tail_slot = -1;
                slot = -1;
            }
            if (b % 5 == 3) {
                p = t % 2 ? -1 : std::numeric_limits<int32_t>::min();
                slot = t % 3 == 0 ? locs[b * N + t] : -1;  // pos < 0: never written
                tail_slot = t % 3 == 1 ? blocks[b] * ring : -1;
            }
            in.positions.set<int32_t>({b, t}, static_cast<int32_t>(p));
            in.tail_slot_mapping.set<int32_t>({b, t}, static_cast<int32_t>(tail_slot));
            in.slot_mapping.set<int32_t>({b, t}, static_cast<int32_t>(slot));
        }
    }
    return in;
}

// A ragged decode batch (kpool_decode_update_and_maybe_write_cache_ragged):
// the first counts[r] tokens of each request of a make_decode_inputs batch
// (0 to N: some requests empty), flat, with query_start_loc, then `trailing`
// tokens outside every request (an engine's graph padding: their indices
// must do nothing). Indices of `index_dtype`.
struct RaggedBatch {
    HostTensor tail_slot_mapping, key, slot_score, ape, slot_mapping, positions, query_start_loc;
    int64_t longest = 0;  // the engine's max_query_len
};

inline RaggedBatch make_ragged_batch(std::mt19937 &rng, int64_t B, int64_t N, int P, int64_t ring,
                                     int64_t tail_blocks, int64_t cache_slots, kpool_dtype index_dtype,
                                     int64_t trailing) {
    const DecodeInputs grid = make_decode_inputs(rng, B, N, P, ring, tail_blocks, cache_slots);
    std::vector<int64_t> counts(B), offsets{0};
    for (int64_t b = 0; b < B; ++b) {
        counts[b] = b % 7 == 5 ? 0 : std::uniform_int_distribution<int64_t>(1, N)(rng);
        offsets.push_back(offsets.back() + counts[b]);
    }
    const int64_t T = offsets.back() + trailing;
    RaggedBatch r;
    r.key = HostTensor(KPOOL_DTYPE_BFLOAT16, {T, kD});
    r.slot_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {T, kD});
    fill_normal(r.key, rng);
    fill_normal(r.slot_score, rng, 2.0f);
    r.ape = grid.ape;
    for (HostTensor *t : {&r.tail_slot_mapping, &r.slot_mapping, &r.positions}) *t = HostTensor(index_dtype, {T});
    r.query_start_loc = HostTensor(index_dtype, {B + 1});
    for (int64_t b = 0; b <= B; ++b) r.query_start_loc.set_int({b}, offsets[b]);
    for (int64_t b = 0; b < B; ++b) {
        r.longest = std::max(r.longest, counts[b]);
        for (int64_t t = 0; t < counts[b]; ++t) {
            const int64_t flat = offsets[b] + t;
            std::memcpy(r.key.raw() + r.key.offset({flat, 0}) * 2, grid.key.bytes().data() + grid.key.offset({b, t, 0}) * 2,
                        kD * 2);
            std::memcpy(r.slot_score.raw() + r.slot_score.offset({flat, 0}) * 2,
                        grid.slot_score.bytes().data() + grid.slot_score.offset({b, t, 0}) * 2, kD * 2);
            r.tail_slot_mapping.set_int({flat}, grid.tail_slot_mapping.get_int({b, t}));
            r.slot_mapping.set_int({flat}, grid.slot_mapping.get_int({b, t}));
            r.positions.set_int({flat}, grid.positions.get_int({b, t}));
        }
    }
    // Outside every request: indices that would complete and stash if read.
    for (int64_t flat = offsets.back(); flat < T; ++flat) {
        r.positions.set_int({flat}, P - 1);
        r.tail_slot_mapping.set_int({flat}, 0);
        r.slot_mapping.set_int({flat}, 0);
    }
    return r;
}

// The engine's sequence before the ragged entry point: the batch scattered
// into a padded [B, longest] grid (key and score 0, every index -1) for the
// batched op.
inline DecodeInputs pad_ragged_batch(const RaggedBatch &r) {
    const int64_t B = r.query_start_loc.shape(0) - 1, N = r.longest;
    const kpool_dtype index_dtype = r.positions.dtype();
    DecodeInputs g;
    g.key = HostTensor(KPOOL_DTYPE_BFLOAT16, {B, N, kD});
    g.slot_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {B, N, kD});
    g.ape = r.ape;
    for (HostTensor *t : {&g.tail_slot_mapping, &g.slot_mapping, &g.positions}) {
        *t = HostTensor(index_dtype, {B, N});
        for (int64_t i = 0; i < B * N; ++i) t->set_int({i / N, i % N}, -1);
    }
    for (int64_t b = 0; b < B; ++b) {
        const int64_t first = r.query_start_loc.get_int({b}), count = r.query_start_loc.get_int({b + 1}) - first;
        for (int64_t t = 0; t < count; ++t) {
            std::memcpy(g.key.raw() + g.key.offset({b, t, 0}) * 2, r.key.bytes().data() + r.key.offset({first + t, 0}) * 2,
                        kD * 2);
            std::memcpy(g.slot_score.raw() + g.slot_score.offset({b, t, 0}) * 2,
                        r.slot_score.bytes().data() + r.slot_score.offset({first + t, 0}) * 2, kD * 2);
            g.tail_slot_mapping.set_int({b, t}, r.tail_slot_mapping.get_int({first + t}));
            g.slot_mapping.set_int({b, t}, r.slot_mapping.get_int({first + t}));
            g.positions.set_int({b, t}, r.positions.get_int({first + t}));
        }
    }
    return g;
}

enum class TokenMap { kNone, kPageTable, kOffsets1d, kOffsets2d };

inline std::string map_tag(TokenMap m) {
    switch (m) {
        case TokenMap::kNone: return "identity";
        case TokenMap::kPageTable: return "pageTable";
        case TokenMap::kOffsets1d: return "offsets1d";
        case TokenMap::kOffsets2d: return "offsets2d";
    }
    return "";
}

// The optional page table [rows, W] (narrower than the token range, so the
// clamp matters) and per-row offsets [rows] or [rows, 1].
struct TokenMapInputs {
    HostTensor page_table, topk_offsets;
    bool has_table = false, has_offsets = false;
};

inline TokenMapInputs make_token_map(std::mt19937 &rng, TokenMap map, int64_t rows, int64_t width) {
    TokenMapInputs t;
    t.page_table = HostTensor(KPOOL_DTYPE_INT32, {rows, width});
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < width; ++c) {
            t.page_table.set<int32_t>({r, c}, std::uniform_int_distribution<int32_t>(-5, 1 << 30)(rng));
        }
    }
    const std::vector<int64_t> shape =
        map == TokenMap::kOffsets2d ? std::vector<int64_t>{rows, 1} : std::vector<int64_t>{rows};
    t.topk_offsets = HostTensor(KPOOL_DTYPE_INT64, shape);
    for (int64_t r = 0; r < rows; ++r) {
        int64_t off = std::uniform_int_distribution<int64_t>(0, 1 << 24)(rng);
        if (r == 1) off = (int64_t(1) << 32) + 3;  // wraps to int32 as the reference's .to(int32)
        if (r == 2) off = -100;                    // may take a token id below 0
        t.topk_offsets.set<int64_t>({r}, off);
    }
    t.has_table = map == TokenMap::kPageTable;
    t.has_offsets = map == TokenMap::kOffsets1d || map == TokenMap::kOffsets2d;
    return t;
}

// expand_pools_to_tokens' groups [rows, G]: ids up to 4000 / P, -1 in every
// fourth group, one past int32 (int64 ids), and a valid mask of 80% true.
struct GroupInputs {
    HostTensor ids, valid;
};

inline GroupInputs make_group_inputs(std::mt19937 &rng, int P, kpool_dtype ids_dtype, int64_t rows, int64_t G) {
    GroupInputs in;
    in.ids = HostTensor(ids_dtype, {rows, G});
    in.valid = HostTensor(KPOOL_DTYPE_BOOL, {rows, G});
    std::bernoulli_distribution coin(0.8);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < G; ++g) {
            int64_t id = std::uniform_int_distribution<int64_t>(-3, 4000 / P)(rng);
            if (g % 4 == 1) id = -1;
            if (g == 5 && ids_dtype == KPOOL_DTYPE_INT64) id = (int64_t(1) << 34) + g;
            in.ids.set_int({r, g}, id);
            in.valid.set<uint8_t>({r, g}, coin(rng) ? 1 : 0);
        }
    }
    return in;
}

// The parameter axes both suites run an op over, and the names of the
// tests: INSTANTIATE_TEST_SUITE_P(..., ParamName()).
using FwhtParam = std::tuple<int /*rows*/, bool /*scale [rows,1]*/, kpool_dtype /*q_fp8*/>;
using SeedParam = std::tuple<int /*P*/, int /*ring = P * this*/, kpool_dtype /*tslot*/, bool /*padded*/>;
using ExpandTailParam = std::tuple<int /*P*/, kpool_dtype /*pool_ids*/, bool /*bound*/>;
using ToTokensParam = std::tuple<int /*P*/, kpool_dtype /*group_ids*/, TokenMap>;
using AppendParam = std::tuple<int /*P*/, TokenMap>;

struct ParamName {
    // "rows7_scale2d_e4m3"
    std::string operator()(const ::testing::TestParamInfo<FwhtParam> &info) const {
        const auto &[rows, scale_2d, fp8_dtype] = info.param;
        return "rows" + std::to_string(rows) + (scale_2d ? "_scale2d_" : "_scale1d_") + dtype_tag(fp8_dtype);
    }
    // "P4_ring2P_i64_padded"
    std::string operator()(const ::testing::TestParamInfo<SeedParam> &info) const {
        const auto &[P, ring_mult, tslot_dtype, padded] = info.param;
        return "P" + std::to_string(P) + "_ring" + std::to_string(ring_mult) + "P_" + dtype_tag(tslot_dtype) +
               (padded ? "_padded" : "_dense");
    }
    // "P4_i32_bounded"
    std::string operator()(const ::testing::TestParamInfo<ExpandTailParam> &info) const {
        const auto &[P, ids_dtype, bound] = info.param;
        return "P" + std::to_string(P) + "_" + dtype_tag(ids_dtype) + (bound ? "_bounded" : "_unbounded");
    }
    // "P4_i64_pageTable"
    std::string operator()(const ::testing::TestParamInfo<ToTokensParam> &info) const {
        const auto &[P, ids_dtype, map] = info.param;
        return "P" + std::to_string(P) + "_" + dtype_tag(ids_dtype) + "_" + map_tag(map);
    }
    // "P4_offsets1d"
    std::string operator()(const ::testing::TestParamInfo<AppendParam> &info) const {
        const auto &[P, map] = info.param;
        return "P" + std::to_string(P) + "_" + map_tag(map);
    }
};

}  // namespace kpool_test
