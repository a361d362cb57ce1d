// decode_update_and_maybe_write_cache_batched: one decode step; each token
// is stashed in its request's tail ring, and a token completing a pool
// writes that pool's cache row.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "ops.h"

#include "kpool_decode_layouts.inc"  // KPOOL_FOR_EACH_DECODE_LAYOUT_RULE(X): X(family, max pool, min next_n, the same exact)

namespace kpool::rt {
namespace {

// The one-kernel decode's layout for a call (schedules/cuda.cpp, DecodeLayout):
// a warp per token (a block per request) for pools up to a bound and at
// least so many tokens per request, else a warp per request; the family's
// knobs set both bounds per arithmetic (the exact arithmetic pools each
// element of a completion on a thread of its own in the warp-per-token
// kernel, which wins it most shapes).
// $KPOOL_DECODE_LAYOUT (warp_per_token or warp_per_request, read once)
// runs every call in one layout: the knobs' measurements take both.
Kernel decode_update_layout(Family family, Arithmetic arithmetic, int pool_size, int64_t next_n) {
    static const char *const asked = std::getenv("KPOOL_DECODE_LAYOUT");
    if (asked != nullptr && std::strcmp(asked, "warp_per_token") == 0) {
        return Kernel::DECODE_UPDATE;
    }
    if (asked != nullptr && std::strcmp(asked, "warp_per_request") == 0) {
        return Kernel::DECODE_UPDATE_BY_REQUEST;
    }
    auto per_token = [&](int max_pool, int min_next_n) { return pool_size <= max_pool && next_n >= min_next_n; };
#define KPOOL_DECODE_LAYOUT_RULE(name, max_pool, min_next_n, exact_max_pool, exact_min_next_n)            \
    if (family == Family::name) {                                                                         \
        const bool exact = arithmetic == Arithmetic::exact;                                               \
        return per_token(exact ? (exact_max_pool) : (max_pool), exact ? (exact_min_next_n) : (min_next_n)) \
                   ? Kernel::DECODE_UPDATE                                                                \
                   : Kernel::DECODE_UPDATE_BY_REQUEST;                                                    \
    }
    KPOOL_FOR_EACH_DECODE_LAYOUT_RULE(KPOOL_DECODE_LAYOUT_RULE)
#undef KPOOL_DECODE_LAYOUT_RULE
    return Kernel::DECODE_UPDATE;
}

// The warp-per-request kernel holds a call's per-token indices in shared
// memory (12 bytes a token, schedules/cuda.cpp): requests longer than this
// (no engine's decode step) take the warp-per-token kernel.
constexpr int64_t kMaxTokensPerRequestLayout = 2048;

// The kernels compute positions in 32 bits (an int64 one is read saturated):
// a position past 2^31 - 1, which no context reaches, is rejected on the host.
void require_int32_positions(const TensorArg &positions) {
    for (int64_t i = 0; positions.t->dtype == KPOOL_DTYPE_INT64 && i < positions.numel(); i++) {
        if (index_at(positions, i) > std::numeric_limits<int32_t>::max()) {
            throw invalid() << element_name(positions, i) << " = " << index_at(positions, i)
                            << " is past 2^31 - 1, the kernels' position range";
        }
    }
}

}  // namespace

int64_t decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache_, const kpool_tensor *tail_kv_cache_, const kpool_tensor *tail_slot_mapping_,
    const kpool_tensor *key_, const kpool_tensor *slot_score_, const kpool_tensor *ape_,
    const kpool_tensor *slot_mapping_, const kpool_tensor *positions_, int32_t pool_size, int32_t head_dim,
    int32_t round_scale, const kpool_exec *exec) {
    require_head_dim(head_dim);
    require_pool_size(pool_size);
    require_pool_size_with_variants(pool_size);
    TensorArg kv_cache = require_kv_cache(kv_cache_);
    TensorArg tail = require_tail(tail_kv_cache_, pool_size);
    TensorArg key = require_keys("key", key_);
    TensorArg score = require_scores("slot_score", slot_score_, {KPOOL_DTYPE_BFLOAT16}, key);
    TensorArg ape = require_ape(ape_, pool_size);
    // int32 or int64, all three of one type (a kernel variant per type).
    auto per_token = [&](const char *name, const kpool_tensor *t, const TensorArg *first) {
        TensorArg a = require_tensor(name, t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 2);
        if (first != nullptr && a.t->dtype != first->t->dtype) {
            throw invalid() << name << " has dtype " << kpool_dtype_name(a.t->dtype) << " but " << first->name
                            << " has " << kpool_dtype_name(first->t->dtype)
                            << ": tail_slot_mapping, slot_mapping and positions must share one integer dtype";
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

}  // namespace kpool::rt
