// decode_update_and_maybe_write_cache_batched: one decode step; each token
// is stashed in its request's tail ring, and a token completing a pool
// writes that pool's cache row.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>
#include <limits>
#include <vector>

#include "decode_layouts.h"
#include "ops.h"

namespace kpool::rt {
namespace {

thread_local DecodeLayoutChoice decode_layout_on_this_thread = DecodeLayoutChoice::rule;

#ifdef KPOOL_MEASUREMENT_HOOKS
DecodeLayoutChoice decode_layout_from_environment() {
    const char *asked = std::getenv("KPOOL_DECODE_LAYOUT");
    if (asked == nullptr) {
        return DecodeLayoutChoice::rule;
    }
    for (auto [name, layout] : {std::pair{"warp_per_token", DecodeLayoutChoice::warp_per_token},
                                {"warp_per_request", DecodeLayoutChoice::warp_per_request},
                                {"block_per_request", DecodeLayoutChoice::block_per_request}}) {
        if (std::strcmp(asked, name) == 0) {
            return layout;
        }
    }
    return DecodeLayoutChoice::rule;
}
#endif

// The one-kernel decode's layout for a call: a ScopedDecodeLayout's on this
// thread; in a build with KPOOL_MEASUREMENT_HOOKS, $KPOOL_DECODE_LAYOUT
// (warp_per_token, warp_per_request or block_per_request, read once), to
// time each; else the family's rule (decode_layouts.h). A release build
// reads no environment.
Kernel decode_update_layout(Family family, Arithmetic arithmetic, int pool_size, int64_t next_n) {
    DecodeLayoutChoice forced = decode_layout_on_this_thread;
#ifdef KPOOL_MEASUREMENT_HOOKS
    static const DecodeLayoutChoice from_environment = decode_layout_from_environment();
    if (forced == DecodeLayoutChoice::rule) {
        forced = from_environment;
    }
#endif
    switch (forced) {
    case DecodeLayoutChoice::warp_per_token:
        return Kernel::DECODE_UPDATE;
    case DecodeLayoutChoice::warp_per_request:
        return Kernel::DECODE_UPDATE_BY_REQUEST;
    case DecodeLayoutChoice::block_per_request:
        return Kernel::DECODE_UPDATE_BY_BLOCK;
    case DecodeLayoutChoice::rule:
        break;
    }
    const DecodeLayoutRule *rule = &kDecodeLayoutRules[std::size(kDecodeLayoutRules) - 1];
    for (const DecodeLayoutRule &r : kDecodeLayoutRules) {
        if (std::strcmp(r.family, name(family)) == 0) {
            rule = &r;
            break;
        }
    }
    const bool exact = arithmetic == Arithmetic::exact;
    const int block_min_pool = exact ? rule->exact_block_min_pool : rule->block_min_pool;
    if (block_min_pool > 0 && pool_size >= block_min_pool &&
        next_n >= (exact ? rule->exact_block_min_next_n : rule->block_min_next_n)) {
        return Kernel::DECODE_UPDATE_BY_BLOCK;
    }
    const bool per_token = pool_size <= (exact ? rule->exact_max_pool : rule->max_pool) &&
                           next_n >= (exact ? rule->exact_min_next_n : rule->min_next_n);
    return per_token ? Kernel::DECODE_UPDATE : Kernel::DECODE_UPDATE_BY_REQUEST;
}

// The warp-per-request kernel holds a call's per-token indices in shared
// memory (12 bytes a token, schedules/cuda/decode.cpp): requests longer than this
// (no engine's decode step) take the warp-per-token kernel.
constexpr int64_t kMaxTokensPerRequestLayout = 2048;

}  // namespace

ScopedDecodeLayout::ScopedDecodeLayout(DecodeLayoutChoice layout) : previous_(decode_layout_on_this_thread) {
    decode_layout_on_this_thread = layout;
}

ScopedDecodeLayout::~ScopedDecodeLayout() { decode_layout_on_this_thread = previous_; }

void require_int32_positions(const TensorArg &positions) {
    for (int64_t i = 0; positions.t->dtype == KPOOL_DTYPE_INT64 && i < positions.numel(); i++) {
        if (index_at(positions, i) > std::numeric_limits<int32_t>::max()) {
            throw invalid() << element_name(positions, i) << " = " << index_at(positions, i)
                            << " is past 2^31 - 1, the kernels' position range";
        }
    }
}

void require_index_dtype_of(const TensorArg &a, const TensorArg &first, const char *together) {
    if (a.t->dtype != first.t->dtype) {
        throw invalid() << a.name << " has dtype " << kpool_dtype_name(a.t->dtype) << " but " << first.name << " has "
                        << kpool_dtype_name(first.t->dtype) << ": " << together << " must share one integer dtype";
    }
}

int64_t decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache_, const kpool_tensor *tail_kv_cache_, const kpool_tensor *tail_slot_mapping_,
    const kpool_tensor *key_, const kpool_tensor *slot_score_, const kpool_tensor *ape_,
    const kpool_tensor *slot_mapping_, const kpool_tensor *positions_, int32_t pool_size, int32_t head_dim,
    int32_t round_scale, const kpool_exec *exec) {
    require_head_dim(head_dim);
    require_pool_size(pool_size);
    TensorArg kv_cache = require_kv_cache(kv_cache_);
    TensorArg tail = require_tail(tail_kv_cache_, pool_size);
    TensorArg key = require_keys("key", key_);
    TensorArg score = require_scores("slot_score", slot_score_, {KPOOL_DTYPE_BFLOAT16}, key);
    TensorArg ape = require_ape(ape_, pool_size);
    // int32 or int64, all three of one type (a kernel variant per type).
    auto per_token = [&](const char *name, const kpool_tensor *t, const TensorArg *first) {
        TensorArg a = require_tensor(name, t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 2);
        if (first != nullptr) {
            require_index_dtype_of(a, *first, "tail_slot_mapping, slot_mapping and positions");
        }
        require_same_dim(a, 0, key, 0);
        require_same_dim(a, 1, key, 1);
        require_int32_strides(a);
        return a;
    };
    TensorArg tail_slots = per_token("tail_slot_mapping", tail_slot_mapping_, nullptr);
    TensorArg slots = per_token("slot_mapping", slot_mapping_, &tail_slots);
    TensorArg positions = per_token("positions", positions_, &tail_slots);
    const ElementType indices = index_type(tail_slots);
    // A K cache past the kernels' 32-bit offsets is launched in windows of
    // its pages (Placement::cache_windows).
    Placement where({&kv_cache, &tail, &key, &score, &ape, &tail_slots, &slots, &positions}, exec, {&kv_cache});
    where.require_pool_arithmetic();
    // Completions without a tail block write nothing (README, reference
    // defects); on the host they are counted, on a device the count
    // would need a copy back, so it is reported as -1.
    int64_t skipped = where.on_host() ? 0 : -1;
    if (where.on_host()) {
        require_locs_in_cache(slots, kv_cache, nullptr);
        require_tslots_in_tail(tail_slots, tail);
        require_int32_positions(positions);
    }
    mark_index_errors(where, KPOOL_INDEX_SLOT_MAPPING, slots, cache_slot_count(kv_cache), nullptr);
    mark_index_errors(where, KPOOL_INDEX_TAIL_SLOT_MAPPING, tail_slots, tail_slot_count(tail), nullptr);
    for (int64_t i = 0; where.on_host() && i < key.dim(0) * key.dim(1); i++) {
        int64_t pos = index_at(positions, i);
        skipped += index_at(slots, i) >= 0 && pos >= 0 && pos % pool_size == pool_size - 1 &&
                   index_at(tail_slots, i) < 0;
    }
    // No tail block: nothing is stashed and no completion has a block to
    // read (all are skipped). No cache slot: no completion is written.
    if (key.dim(0) == 0 || key.dim(1) == 0 || tail.numel() == 0) {
        return skipped;
    }
    const char *op = "kpool_decode_update_and_maybe_write_cache_batched";
    HalideBuffer t = wrap_tail(tail), ts = wrap(tail_slots), k = wrap(key), s = wrap(score), a = wrap(ape),
                 sm = wrap(slots), pos = wrap(positions);
    for (HalideBuffer *b : {&t, &ts, &k, &s, &a, &sm, &pos}) {
        where.attach(*b);
    }
    const std::vector<RowRange> windows =
        kv_cache.numel() > 0 ? where.cache_windows(kv_cache) : std::vector<RowRange>{};
    // Completions read the ring as it was before this call's stashes. A
    // device runs both in one kernel (a request's completions, then its
    // stashes) where the cache is one window, otherwise, as the CPU does,
    // the completions (a launch per window), then the stashes.
    if (windows.size() == 1 && where.has_kernel(Kernel::DECODE_UPDATE, pool_size, indices)) {
        CacheViews cache = wrap_kv_cache(kv_cache, windows[0]);
        where.attach(cache.codes), where.attach(cache.scales);
        HalideBuffer t_out = wrap_tail(tail);
        auto launch = [&](auto layout) {
            where.launch<decltype(layout)::value>(op, pool_size, indices, t.raw_buffer(), ts.raw_buffer(),
                                                  k.raw_buffer(), s.raw_buffer(), a.raw_buffer(), sm.raw_buffer(),
                                                  pos.raw_buffer(), round_scale != 0, cache.codes.raw_buffer(),
                                                  cache.scales.raw_buffer(), where.attach(t_out).raw_buffer());
        };
        // The warp-per-request kernel is built for aligned rows (8-byte words
        // of bf16 and a dense, 16-byte-aligned ape in, 4-byte words of codes
        // out; torch's tensors are); the warp-per-token one takes any strides.
        const bool aligned = rows_aligned(key, 8, {0, 1}) && rows_aligned(score, 8, {0, 1}) &&
                             rows_aligned(tail, 8, {0, 1}) && rows_aligned(ape, 16, {0}) && ape.stride(0) == KPOOL_HEAD_DIM &&
                             rows_aligned(kv_cache, 4, {0});
        const Kernel layout = decode_update_layout(where.family(), where.arithmetic(), pool_size, key.dim(1));
        if (layout == Kernel::DECODE_UPDATE_BY_REQUEST && aligned && key.dim(1) <= kMaxTokensPerRequestLayout &&
            where.has_kernel(Kernel::DECODE_UPDATE_BY_REQUEST, pool_size, indices)) {
            launch(std::integral_constant<Kernel, Kernel::DECODE_UPDATE_BY_REQUEST>());
        } else if (layout == Kernel::DECODE_UPDATE_BY_BLOCK &&
                   where.has_kernel(Kernel::DECODE_UPDATE_BY_BLOCK, pool_size, indices)) {
            launch(std::integral_constant<Kernel, Kernel::DECODE_UPDATE_BY_BLOCK>());  // any strides
        } else {
            launch(std::integral_constant<Kernel, Kernel::DECODE_UPDATE>());
        }
        return skipped;
    }
    // Otherwise two kernels, in this order on the caller's stream (without
    // a K cache, only the stashes).
    for (RowRange window : windows) {
        CacheViews cache = wrap_kv_cache(kv_cache, window);
        where.attach(cache.codes), where.attach(cache.scales);
        where.launch<Kernel::DECODE_WRITE_CACHE>(op, pool_size, indices, t.raw_buffer(), ts.raw_buffer(),
                                                 k.raw_buffer(), s.raw_buffer(), a.raw_buffer(), sm.raw_buffer(),
                                                 pos.raw_buffer(), round_scale != 0, cache.codes.raw_buffer(),
                                                 cache.scales.raw_buffer());
    }
    where.launch<Kernel::DECODE_STASH_TAIL>(op, 0, indices, ts.raw_buffer(), k.raw_buffer(), s.raw_buffer(),
                                            pos.raw_buffer(), t.raw_buffer());
    return skipped;
}

namespace {

// A host tensor of the padded [B, N(, 128)] grid, the batched decode's
// layout: the ragged call's tokens copied in, padding as the engine pads
// (key and score 0, every index -1).
struct PaddedGrid {
    std::vector<uint8_t> bytes;
    kpool_tensor t;
    PaddedGrid(kpool_dtype dtype, int64_t B, int64_t N, int64_t row) {
        const int64_t shape[3] = {B, N, row};
        bytes.assign(static_cast<size_t>(B * N * row * element_bytes(dtype)), dtype == KPOOL_DTYPE_BFLOAT16 ? 0 : 0xFF);
        t = contiguous_tensor(bytes.data(), dtype, row > 1 ? 3 : 2, shape);
    }
    // Token `flat` of `from` (a row of `row` elements) into grid place (b, i).
    void copy(const TensorArg &from, int64_t flat, int64_t b, int64_t i) {
        const int64_t row = t.ndim == 3 ? t.shape[2] : 1, size = element_bytes(t.dtype);
        const auto *src = static_cast<const uint8_t *>(from.t->data) + flat * from.stride(0) * size;
        std::memcpy(bytes.data() + ((b * t.shape[1] + i) * row) * size, src, static_cast<size_t>(row * size));
    }
};

}  // namespace

int64_t decode_update_and_maybe_write_cache_ragged(
    const kpool_tensor *kv_cache_, const kpool_tensor *tail_kv_cache_, const kpool_tensor *tail_slot_mapping_,
    const kpool_tensor *key_, const kpool_tensor *slot_score_, const kpool_tensor *ape_,
    const kpool_tensor *slot_mapping_, const kpool_tensor *positions_, const kpool_tensor *query_start_loc_,
    int32_t max_query_len, int32_t pool_size, int32_t head_dim, int32_t round_scale, const kpool_exec *exec) {
    require_head_dim(head_dim);
    require_pool_size(pool_size);
    TensorArg kv_cache = require_kv_cache(kv_cache_);
    TensorArg tail = require_tail(tail_kv_cache_, pool_size);
    auto token_rows = [](const char *name, const kpool_tensor *t) {
        TensorArg a = require_tensor(name, t, {KPOOL_DTYPE_BFLOAT16}, 2);
        require_dim(a, 1, KPOOL_HEAD_DIM, "head_dim");
        require_inner_contiguous(a);
        return a;
    };
    TensorArg key = token_rows("key", key_), score = token_rows("slot_score", slot_score_);
    require_same_dim(score, 0, key, 0);
    TensorArg ape = require_ape(ape_, pool_size);
    // int32 or int64, all four of one type (a kernel variant per type).
    auto indices = [&](const char *name, const kpool_tensor *t, const TensorArg *first) {
        TensorArg a = require_tensor(name, t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 1);
        if (first != nullptr) {
            require_index_dtype_of(a, *first, "tail_slot_mapping, slot_mapping, positions and query_start_loc");
        }
        require_int32_strides(a);
        return a;
    };
    TensorArg tail_slots = indices("tail_slot_mapping", tail_slot_mapping_, nullptr);
    TensorArg slots = indices("slot_mapping", slot_mapping_, &tail_slots);
    TensorArg positions = indices("positions", positions_, &tail_slots);
    TensorArg offsets = indices("query_start_loc", query_start_loc_, &tail_slots);
    for (const TensorArg *a : {&tail_slots, &slots, &positions}) {
        require_same_dim(*a, 0, key, 0);
    }
    if (offsets.dim(0) < 1) {
        throw invalid() << "query_start_loc has shape [0], expected [B + 1] (request r's tokens at "
                           "query_start_loc[r] .. query_start_loc[r + 1])";
    }
    if (max_query_len < 0) {
        throw invalid() << "max_query_len = " << max_query_len
                        << " is negative (a bound on every request's tokens; 0: the token count)";
    }
    const int64_t tokens = key.dim(0), requests = offsets.dim(0) - 1;
    const int64_t bound = max_query_len > 0 ? std::min<int64_t>(max_query_len, tokens) : tokens;
    Placement where({&kv_cache, &tail, &key, &score, &ape, &tail_slots, &slots, &positions, &offsets}, exec,
                    {&kv_cache});
    where.require_pool_arithmetic();
    const ElementType index = index_type(tail_slots);

    if (where.on_host()) {
        // Offsets in order within the tokens, each request within the bound;
        // the tokens' indices as the batched call checks them.
        int64_t longest = 0;
        for (int64_t r = 0; r <= requests; r++) {
            const int64_t at = index_at(offsets, r), before = r > 0 ? index_at(offsets, r - 1) : 0;
            if (at < before || at > tokens) {
                const std::string why = at > tokens ? "past the " + std::to_string(tokens) + " tokens"
                                        : r == 0    ? std::string("negative")
                                                    : "below query_start_loc[" + std::to_string(r - 1) +
                                                       "] = " + std::to_string(before);
                throw out_of_range() << element_name(offsets, r) << " = " << at << " is " << why;
            }
            if (r > 0 && max_query_len > 0 && at - before > max_query_len) {
                throw invalid() << "request " << r - 1 << " has " << at - before << " tokens (query_start_loc["
                                << r - 1 << " .. " << r << "]), more than max_query_len = " << max_query_len;
            }
            longest = r > 0 ? std::max(longest, at - before) : longest;
        }
        require_locs_in_cache(slots, kv_cache, nullptr);
        require_tslots_in_tail(tail_slots, tail);
        require_int32_positions(positions);
        // The CPU runs the batched decode on the tokens padded into a grid:
        // the engine's own padding, in host memory.
        const kpool_dtype index_dtype = tail_slots.t->dtype;
        PaddedGrid pad_key(KPOOL_DTYPE_BFLOAT16, requests, longest, KPOOL_HEAD_DIM),
            pad_score(KPOOL_DTYPE_BFLOAT16, requests, longest, KPOOL_HEAD_DIM),
            pad_tail_slots(index_dtype, requests, longest, 1), pad_slots(index_dtype, requests, longest, 1),
            pad_positions(index_dtype, requests, longest, 1);
        for (int64_t r = 0; r < requests; r++) {
            const int64_t first = index_at(offsets, r), count = index_at(offsets, r + 1) - first;
            for (int64_t i = 0; i < count; i++) {
                pad_key.copy(key, first + i, r, i), pad_score.copy(score, first + i, r, i);
                pad_tail_slots.copy(tail_slots, first + i, r, i), pad_slots.copy(slots, first + i, r, i);
                pad_positions.copy(positions, first + i, r, i);
            }
        }
        return decode_update_and_maybe_write_cache_batched(kv_cache_, tail_kv_cache_, &pad_tail_slots.t, &pad_key.t,
                                                           &pad_score.t, ape_, &pad_slots.t, &pad_positions.t,
                                                           pool_size, head_dim, round_scale, exec);
    }
    mark_index_errors(where, KPOOL_INDEX_SLOT_MAPPING, slots, cache_slot_count(kv_cache), nullptr);
    mark_index_errors(where, KPOOL_INDEX_TAIL_SLOT_MAPPING, tail_slots, tail_slot_count(tail), nullptr);
    if (tokens == 0 || requests == 0 || tail.numel() == 0) {
        return -1;  // no token, or no tail block to stash into or complete from
    }
    const std::vector<RowRange> windows = where.cache_windows(kv_cache);
    if (windows.size() != 1) {
        throw unsupported() << "kpool_decode_update_and_maybe_write_cache_ragged: a K cache of "
                            << kv_cache.span_bytes() << " bytes needs one launch window (CUDA kernels address "
                            << "below 2 GiB in this build; kpool_decode_update_and_maybe_write_cache_batched "
                            << "launches larger caches in windows)";
    }
    const char *op = "kpool_decode_update_and_maybe_write_cache_ragged";
    HalideBuffer t = wrap_tail(tail), ts = wrap(tail_slots), k = wrap(key), s = wrap(score), a = wrap(ape),
                 sm = wrap(slots), pos = wrap(positions), qsl = wrap(offsets), t_out = wrap_tail(tail);
    for (HalideBuffer *b : {&t, &ts, &k, &s, &a, &sm, &pos, &qsl, &t_out}) {
        where.attach(*b);
    }
    CacheViews cache = wrap_kv_cache(kv_cache, windows[0]);
    where.attach(cache.codes), where.attach(cache.scales);
    auto launch = [&](auto layout) {
        where.launch<decltype(layout)::value>(op, pool_size, index, t.raw_buffer(), ts.raw_buffer(), k.raw_buffer(),
                                              s.raw_buffer(), a.raw_buffer(), sm.raw_buffer(), pos.raw_buffer(),
                                              qsl.raw_buffer(), static_cast<int32_t>(std::max<int64_t>(bound, 1)),
                                              round_scale != 0, cache.codes.raw_buffer(), cache.scales.raw_buffer(),
                                              t_out.raw_buffer());
    };
    // The layout rule and the aligned rows of the batched decode (above).
    const bool aligned = rows_aligned(key, 8, {0}) && rows_aligned(score, 8, {0}) && rows_aligned(tail, 8, {0, 1}) &&
                         rows_aligned(ape, 16, {0}) && ape.stride(0) == KPOOL_HEAD_DIM &&
                         rows_aligned(kv_cache, 4, {0});
    const Kernel layout = decode_update_layout(where.family(), where.arithmetic(), pool_size, bound);
    if (layout == Kernel::DECODE_UPDATE_BY_REQUEST && aligned && bound <= kMaxTokensPerRequestLayout &&
        where.has_kernel(Kernel::DECODE_UPDATE_RAGGED_BY_REQUEST, pool_size, index)) {
        launch(std::integral_constant<Kernel, Kernel::DECODE_UPDATE_RAGGED_BY_REQUEST>());
    } else if (layout == Kernel::DECODE_UPDATE_BY_BLOCK &&
               where.has_kernel(Kernel::DECODE_UPDATE_RAGGED_BY_BLOCK, pool_size, index)) {
        launch(std::integral_constant<Kernel, Kernel::DECODE_UPDATE_RAGGED_BY_BLOCK>());
    } else {
        launch(std::integral_constant<Kernel, Kernel::DECODE_UPDATE_RAGGED>());
    }
    return -1;
}

}  // namespace kpool::rt
