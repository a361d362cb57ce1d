// compress_and_write_cache: each pool of P tokens softmax-pooled,
// rotated and quantized into one cache row and/or returned as codes and
// scales.
#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "ops.h"

namespace kpool::rt {

namespace {

void require_pool_size_matches(int32_t pool_size, const TensorArg &a, int dim) {
    require_pool_size(pool_size);
    if (a.dim(dim) != pool_size) {
        throw invalid() << "pool_size = " << pool_size << " does not match " << a.name << " dim " << dim
                        << " = " << a.dim(dim);
    }
}

// The pools of one validated compress call, as run_compress launches them.
struct Pools {
    TensorArg slot_k, slot_score;  // [n, P, 128]
    TensorArg loc;                 // [n]: int64, or int32 on a device (the _I32 kinds)
    const TensorArg *mask = nullptr;
    const TensorArg *kv_cache = nullptr;  // the K cache written, or NULL
    const TensorArg *compressed_k = nullptr, *compressed_scale = nullptr;  // the rows returned, or NULL

    // Per pool: on a device, tensors past the kernels' 32-bit offsets run
    // in ranges of pools, one launch each; a K cache past them, in windows
    // of its pages, each range's pools launched once per window (a pool
    // writes in the window that holds its loc).
    std::vector<const TensorArg *> per_pool() const {
        std::vector<const TensorArg *> v{&slot_k, &slot_score, &loc};
        for (const TensorArg *a : {mask, compressed_k, compressed_scale}) {
            if (a != nullptr) {
                v.push_back(a);
            }
        }
        return v;
    }
    std::vector<const TensorArg *> split() const {
        std::vector<const TensorArg *> v = per_pool();
        if (kv_cache != nullptr) {
            v.push_back(kv_cache);
        }
        return v;
    }
    // Every tensor of the call, in the order a mismatch is reported in.
    std::vector<const TensorArg *> args(const TensorArg &ape) const {
        std::vector<const TensorArg *> v{&slot_k, &slot_score, &ape, &loc};
        for (const TensorArg *a : {kv_cache, mask, compressed_k, compressed_scale}) {
            if (a != nullptr) {
                v.push_back(a);
            }
        }
        return v;
    }
};

// Whether every input row's data starts 16-byte aligned (the kernels'
// aligned_data: they then load 4 f32 at once, checking the strides too).
bool data_aligned(const TensorArg &slot_k, const TensorArg &slot_score, const TensorArg &ape) {
    return rows_aligned(slot_k, 16, {}) && rows_aligned(slot_score, 16, {}) && rows_aligned(ape, 16, {});
}

// Whether the inputs' rows, data and strides, fit the words kernels' 16-byte
// loads.
bool rows_fit_words(const TensorArg &slot_k, const TensorArg &slot_score, const TensorArg &ape) {
    return rows_aligned(slot_k, 16, {0, 1}) && rows_aligned(slot_score, 16, {0, 1}) && rows_aligned(ape, 16, {0});
}

// One launch of a to-cache kind (all four take the same arguments).
template <Kernel K>
void launch_to_cache(const Placement &where, const char *op, int pool_size, ElementType score, Buf key, Buf score_b,
                     Buf ape, bool round_scale, bool aligned_data, Buf locs, Buf flags, Buf codes, Buf scales) {
    where.launch<K>(op, pool_size, score, key, score_b, ape, round_scale, aligned_data, locs, flags, codes, scales);
}

// Every launch of a validated call: after the argument checks, the host's
// loc check and the index-error marks, which the callers make.
void run_compress(const Placement &where, const Pools &p, const TensorArg &ape, int32_t pool_size,
                  int32_t round_scale, const char *op) {
    const int64_t n = p.slot_k.dim(0);
    if (n == 0) {
        return;
    }
    const TensorArg &slot_k = p.slot_k, &slot_score = p.slot_score;
    const bool write_cache = p.kv_cache != nullptr, return_compressed = p.compressed_k != nullptr;
    const bool loc32 = p.loc.t->dtype == KPOOL_DTYPE_INT32;
    const Kernel to_cache_words = loc32 ? Kernel::COMPRESS_TO_CACHE_WORDS_I32 : Kernel::COMPRESS_TO_CACHE_WORDS;
    const std::vector<const TensorArg *> per_pool = p.per_pool();
    const ElementType score_type = slot_score.t->dtype == KPOOL_DTYPE_FLOAT32 ? ElementType::f32 : ElementType::bf16;
    HalideBuffer ape_b = wrap(ape);
    where.attach(ape_b);
    // With the strides (the kernel checks them), whether rows start 16-byte
    // aligned: the CUDA kernels then load 4 f32 at once. (A range's slices
    // start at whole pools: aligned where the whole tensor is and its pool
    // stride keeps it so, which the kernel's stride check covers.)
    const bool aligned_data = data_aligned(slot_k, slot_score, ape);
    const std::vector<RowRange> windows = write_cache ? where.cache_windows(*p.kv_cache) : std::vector<RowRange>{};
    for (RowRange r : where.row_ranges(n, per_pool)) {
        // The range's pools (views of the same memory).
        auto pools = [r](const TensorArg &a, kpool_tensor &slice) {
            slice = row_slice(a, r);
            return TensorArg{a.name, &slice};
        };
        kpool_tensor k_rows, s_rows, loc_rows, mask_rows, codes_rows, scale_rows;
        const TensorArg k_range = pools(slot_k, k_rows), s_range = pools(slot_score, s_rows);
        HalideBuffer key = wrap(k_range), score = wrap(s_range);
        // Rows whose data and strides are all 16-byte aligned take the words
        // kernels where the build has them (CUDA, either arithmetic):
        // bf16 as 64-bit words of 4, so each lane's 4 keys (and bf16 scores) of
        // a slot are one load. The words kernels check the strides too. The
        // word views are made before attach, from the host fields.
        // They store a lane's codes as 4-byte words: the rows of codes (cache
        // pages, compressed_k) start 4-byte aligned too.
        const bool words_fit = !where.on_host() && rows_fit_words(k_range, s_range, ape);
        auto words_kernel = [&](Kernel kind) {
            const bool codes_fit = kind == to_cache_words ? write_cache && rows_aligned(*p.kv_cache, 4, {0})
                                                          : return_compressed && rows_aligned(*p.compressed_k, 4, {0});
            return words_fit && codes_fit && where.has_kernel(kind, pool_size, score_type);
        };
        const bool words = words_kernel(to_cache_words) || words_kernel(Kernel::COMPRESS_TO_ROWS_WORDS);
        HalideBuffer key_words, score_words;
        if (words) {
            key_words = where.attach(as_words(key, halide_type_of<uint64_t>()));
            if (score_type == ElementType::bf16) {
                score_words = where.attach(as_words(score, halide_type_of<uint64_t>()));
            }
        }
        where.attach(key), where.attach(score);
        if (words && score_type != ElementType::bf16) {
            score_words = score;  // f32 scores: one f32 an item
        }
        // A cache without slots takes no write (every loc is a sentinel; on a
        // device the kernel would skip them): no kernel on empty views.
        if (write_cache && p.kv_cache->numel() > 0) {
            HalideBuffer locs = wrap(pools(p.loc, loc_rows)),
                         flags = p.mask ? wrap(pools(*p.mask, mask_rows)) : where.all_true(r.count);
            if (p.mask) {
                where.attach(flags);
            }
            where.attach(locs);
            const bool to_words = words_kernel(to_cache_words);
            Buf k = to_words ? key_words.raw_buffer() : key.raw_buffer(),
                s = to_words ? score_words.raw_buffer() : score.raw_buffer();
            for (RowRange window : windows) {
                CacheViews cache = wrap_kv_cache(*p.kv_cache, window);
                where.attach(cache.codes), where.attach(cache.scales);
                auto launch = to_words ? (loc32 ? launch_to_cache<Kernel::COMPRESS_TO_CACHE_WORDS_I32>
                                                : launch_to_cache<Kernel::COMPRESS_TO_CACHE_WORDS>)
                                       : (loc32 ? launch_to_cache<Kernel::COMPRESS_TO_CACHE_I32>
                                                : launch_to_cache<Kernel::COMPRESS_TO_CACHE>);
                launch(where, op, pool_size, score_type, k, s, ape_b.raw_buffer(), round_scale != 0, aligned_data,
                       locs.raw_buffer(), flags.raw_buffer(), cache.codes.raw_buffer(), cache.scales.raw_buffer());
            }
        }
        if (return_compressed) {
            HalideBuffer codes = wrap(pools(*p.compressed_k, codes_rows)),
                         scales = wrap_row_scales(pools(*p.compressed_scale, scale_rows));
            where.attach(codes), where.attach(scales);
            if (words_kernel(Kernel::COMPRESS_TO_ROWS_WORDS)) {
                where.launch<Kernel::COMPRESS_TO_ROWS_WORDS>(op, pool_size, score_type, key_words.raw_buffer(),
                                                             score_words.raw_buffer(), ape_b.raw_buffer(),
                                                             round_scale != 0, aligned_data, codes.raw_buffer(),
                                                             scales.raw_buffer());
            } else {
                where.launch<Kernel::COMPRESS_TO_ROWS>(op, pool_size, score_type, key.raw_buffer(), score.raw_buffer(),
                                                       ape_b.raw_buffer(), round_scale != 0, aligned_data,
                                                       codes.raw_buffer(), scales.raw_buffer());
            }
        }
    }
}

// The prefill insert's pools and its seed in one launch
// (COMPRESS_TOKENS_AND_SEED*), where the call is one launch of each (one
// range of pools and one window of the cache: below a device's 32-bit
// offsets), there are pools, and the device has the kind for the rows:
// the host's element kernel (int64 locs), CUDA's words kernel (rows as
// compress's words kernels take them, slot_mapping read in place of
// tail_slot_mapping's type). Returns false, having launched nothing, where
// not: the caller then launches the compress and the seed.
bool run_compress_and_seed(const Placement &where, const Pools &p, const SeedArgs &seed, const TensorArg &ape,
                           int32_t pool_size, int32_t round_scale, const char *op) {
    const int64_t n = p.slot_k.dim(0);
    const TensorArg &kv_cache = *p.kv_cache;
    const std::vector<RowRange> windows = where.cache_windows(kv_cache);
    if (n == 0 || kv_cache.numel() == 0 || seed.tail.numel() == 0 || where.row_ranges(n, p.per_pool()).size() != 1 ||
        windows.size() != 1) {
        return false;
    }
    const ElementType index = index_type(seed.tslot);
    const bool words = !where.on_host();
    const Kernel kind = words ? Kernel::COMPRESS_TOKENS_AND_SEED_WORDS : Kernel::COMPRESS_TOKENS_AND_SEED;
    const bool rows_fit = !words || (rows_fit_words(p.slot_k, p.slot_score, ape) && rows_aligned(kv_cache, 4, {0}) &&
                                     p.loc.t->dtype == seed.tslot.t->dtype);
    if (!rows_fit || !where.has_kernel(kind, pool_size, index)) {
        return false;
    }
    mark_index_errors(where, KPOOL_INDEX_TAIL_SLOT_MAPPING, seed.tslot, tail_slot_count(seed.tail), nullptr);
    HalideBuffer key = wrap(p.slot_k), score = wrap(p.slot_score);
    if (words) {  // made before attach, from the host fields
        key = as_words(key, halide_type_of<uint64_t>());
        score = as_words(score, halide_type_of<uint64_t>());
    }
    HalideBuffer ape_b = wrap(ape), locs = wrap(p.loc), rows = wrap(seed.key), gate = wrap(seed.gate),
                 tslot = wrap(seed.tslot), tail = wrap_tail(seed.tail);
    CacheViews cache = wrap_kv_cache(kv_cache, windows[0]);
    for (HalideBuffer *b : {&key, &score, &ape_b, &locs, &rows, &gate, &tslot, &tail, &cache.codes, &cache.scales}) {
        where.attach(*b);
    }
    const bool aligned_data = data_aligned(p.slot_k, p.slot_score, ape);
    auto launch = [&](auto kind_constant) {
        where.launch<decltype(kind_constant)::value>(op, pool_size, index, key.raw_buffer(), score.raw_buffer(),
                                                     ape_b.raw_buffer(), round_scale != 0, aligned_data,
                                                     locs.raw_buffer(), rows.raw_buffer(), gate.raw_buffer(),
                                                     tslot.raw_buffer(), cache.codes.raw_buffer(),
                                                     cache.scales.raw_buffer(), tail.raw_buffer());
    };
    if (words) {
        launch(std::integral_constant<Kernel, Kernel::COMPRESS_TOKENS_AND_SEED_WORDS>{});
    } else {
        launch(std::integral_constant<Kernel, Kernel::COMPRESS_TOKENS_AND_SEED>{});
    }
    return true;
}

// The pools the tokens of `rows` [n, 128] complete: pool p holds tokens
// p .. p + P-1, as a view [pools, P, 128] of the same memory whose pool and
// member strides are both one token (the pools overlap: a token is a member
// of up to P of them).
kpool_tensor token_pools(const TensorArg &rows, int32_t pool_size, int64_t pools) {
    kpool_tensor v = *rows.t;
    v.ndim = 3;
    v.shape[0] = pools;
    v.shape[1] = pool_size;
    v.shape[2] = rows.dim(1);
    v.strides[0] = v.strides[1] = rows.stride(0);
    v.strides[2] = rows.stride(1);
    return v;
}

// slot_mapping[P-1 ..]: the slot of pool p is its last token's.
kpool_tensor pool_slots(const TensorArg &slots, int32_t pool_size, int64_t pools) {
    kpool_tensor v = *slots.t;
    v.shape[0] = pools;
    if (pools > 0) {
        v.data = static_cast<char *>(v.data) + (pool_size - 1) * slots.stride(0) * element_bytes(v.dtype);
    }
    return v;
}

}  // namespace

void compress_and_write_cache(const kpool_tensor *kv_cache_, const kpool_tensor *slot_k_,
                              const kpool_tensor *slot_score_, const kpool_tensor *ape_, const kpool_tensor *loc_,
                              const kpool_tensor *write_mask_, const kpool_tensor *compressed_k_,
                              const kpool_tensor *compressed_scale_, int32_t pool_size, int32_t head_dim,
                              int32_t round_scale, int32_t write_cache, const kpool_exec *exec) {
    require_head_dim(head_dim);
    TensorArg slot_k = require_keys("slot_k", slot_k_);
    require_pool_size_matches(pool_size, slot_k, 1);
    TensorArg slot_score =
        require_scores("slot_score", slot_score_, {KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32}, slot_k);
    TensorArg ape = require_ape(ape_, pool_size);
    const int64_t n = slot_k.dim(0);
    TensorArg loc = require_tensor("loc", loc_, {KPOOL_DTYPE_INT64}, 1);
    require_dim(loc, 0, n, "one loc per pool");
    require_int32_strides(loc);

    const bool return_compressed = compressed_k_ != nullptr || compressed_scale_ != nullptr;
    if (return_compressed && (compressed_k_ == nullptr || compressed_scale_ == nullptr)) {
        throw invalid() << (compressed_k_ == nullptr ? "compressed_k" : "compressed_scale")
                        << " is NULL: return_compressed needs both compressed_k and compressed_scale";
    }
    if (!write_cache && !return_compressed) {
        throw invalid() << "write_cache = 0 and no compressed_k / compressed_scale: nothing to compute";
    }
    TensorArg *mask = nullptr;
    TensorArg write_mask{};
    if (write_mask_ != nullptr) {
        if (return_compressed) {
            throw invalid() << "write_mask cannot be combined with return_compressed (compressed_k / compressed_scale)";
        }
        write_mask = require_tensor("write_mask", write_mask_, {KPOOL_DTYPE_BOOL, KPOOL_DTYPE_UINT8}, 1);
        require_dim(write_mask, 0, n, "one flag per pool");
        require_int32_strides(write_mask);
        mask = &write_mask;
    }
    TensorArg compressed_k{}, compressed_scale{};
    if (return_compressed) {
        compressed_k = require_tensor("compressed_k", compressed_k_,
                                      {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8}, 2);
        require_dim(compressed_k, 0, n, "pools");
        require_dim(compressed_k, 1, KPOOL_HEAD_DIM, "head_dim");
        require_inner_contiguous(compressed_k);
        require_disjoint_rows(compressed_k);
        compressed_scale = require_tensor_ranks("compressed_scale", compressed_scale_, {KPOOL_DTYPE_FLOAT32}, {1, 2});
        require_dim(compressed_scale, 0, n, "pools");
        require_row_scales_shape(compressed_scale);
    }
    TensorArg kv_cache{};
    Pools pools{slot_k, slot_score, loc};
    if (write_cache) {
        kv_cache = require_kv_cache(kv_cache_);
        pools.kv_cache = &kv_cache;
    }
    pools.mask = mask;
    if (return_compressed) {
        pools.compressed_k = &compressed_k;
        pools.compressed_scale = &compressed_scale;
    }
    Placement where(pools.args(ape), exec, pools.split());
    where.require_pool_arithmetic();
    if (write_cache && where.on_host()) {
        require_locs_in_cache(loc, kv_cache, mask);
    }
    if (write_cache) {
        mark_index_errors(where, KPOOL_INDEX_LOC, loc, cache_slot_count(kv_cache), mask);
    }
    run_compress(where, pools, ape, pool_size, round_scale, "kpool_compress_and_write_cache");
}

void compress_tokens_and_write_cache(const kpool_tensor *kv_cache_, const kpool_tensor *key_,
                                     const kpool_tensor *gate_score_, const kpool_tensor *ape_,
                                     const kpool_tensor *slot_mapping_, const kpool_tensor *tail_kv_cache_,
                                     const kpool_tensor *tail_slot_mapping_, const kpool_tensor *positions_,
                                     int32_t pool_size, int32_t head_dim, int32_t round_scale,
                                     const kpool_exec *exec) {
    const char *op = "kpool_compress_tokens_and_write_cache";
    require_head_dim(head_dim);
    require_pool_size(pool_size);
    TensorArg kv_cache = require_kv_cache(kv_cache_);
    TensorArg key = require_tensor("key", key_, {KPOOL_DTYPE_BFLOAT16}, 2);
    require_dim(key, 1, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(key);
    TensorArg gate = require_tensor("gate_score", gate_score_, {KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32}, 2);
    require_same_dim(gate, 0, key, 0);
    require_same_dim(gate, 1, key, 1);
    require_inner_contiguous(gate);
    TensorArg ape = require_ape(ape_, pool_size);
    TensorArg slots = require_tensor("slot_mapping", slot_mapping_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 1);
    require_same_dim(slots, 0, key, 0);
    require_int32_strides(slots);
    if ((tail_kv_cache_ == nullptr) != (tail_slot_mapping_ == nullptr)) {
        throw invalid() << (tail_kv_cache_ == nullptr ? "tail_kv_cache" : "tail_slot_mapping")
                        << " is NULL: seeding the tail needs both tail_kv_cache and tail_slot_mapping";
    }
    if (positions_ != nullptr && tail_kv_cache_ == nullptr) {
        throw invalid() << "positions without tail_kv_cache and tail_slot_mapping: a pool that began in an earlier "
                           "chunk completes from the tail ring";
    }
    std::optional<SeedArgs> seed;
    if (tail_kv_cache_ != nullptr) {
        seed = require_seed_args(tail_kv_cache_, key_, gate_score_, tail_slot_mapping_, pool_size,
                                 "tail_slot_mapping");
    }
    TensorArg positions{};
    if (positions_ != nullptr) {
        positions = require_tensor("positions", positions_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 1);
        require_same_dim(positions, 0, key, 0);
        require_int32_strides(positions);
        for (const TensorArg *a : {&slots, &seed->tslot}) {
            require_index_dtype_of(*a, positions, "slot_mapping, tail_slot_mapping and positions");
        }
    }

    if (positions_ != nullptr) {
        // Members by position: each completing token's pool from its chunk's
        // rows or its tail ring, one kernel (a launch per window of a large
        // cache), then the seed.
        Placement where({&key, &gate, &ape, &slots, &positions, &seed->tslot, &seed->tail, &kv_cache}, exec,
                        {&kv_cache});
        where.require_pool_arithmetic();
        if (where.on_host()) {
            require_locs_in_cache(slots, kv_cache, nullptr);
            require_tslots_in_tail(seed->tslot, seed->tail);
            require_int32_positions(positions);
        }
        mark_index_errors(where, KPOOL_INDEX_SLOT_MAPPING, slots, cache_slot_count(kv_cache), nullptr);
        if (key.dim(0) > 0 && kv_cache.numel() > 0 && seed->tail.numel() > 0) {
            HalideBuffer k = wrap(key), g = wrap(gate), a = wrap(ape), sm = wrap(slots), pos = wrap(positions),
                         ts = wrap(seed->tslot), t = wrap_tail(seed->tail);
            for (HalideBuffer *b : {&k, &g, &a, &sm, &pos, &ts, &t}) {
                where.attach(*b);
            }
            for (RowRange window : where.cache_windows(kv_cache)) {
                CacheViews cache = wrap_kv_cache(kv_cache, window);
                where.attach(cache.codes), where.attach(cache.scales);
                where.launch<Kernel::COMPRESS_TOKENS_FROM_RING>(
                    op, pool_size, index_type(slots), k.raw_buffer(), g.raw_buffer(), a.raw_buffer(),
                    round_scale != 0, rows_aligned(ape, 16, {0}), sm.raw_buffer(), pos.raw_buffer(), ts.raw_buffer(),
                    t.raw_buffer(), cache.codes.raw_buffer(), cache.scales.raw_buffer());
            }
        }
        run_seed(where, *seed, pool_size, KPOOL_INDEX_TAIL_SLOT_MAPPING, op);
        return;
    }

    // Token i >= P-1 with slot_mapping[i] >= 0 ends pool i-P+1 .. i: the
    // pools of the tokens in place, each with its last token's slot.
    const int64_t n = key.dim(0), pools = std::max<int64_t>(n - (pool_size - 1), 0);
    kpool_tensor key_pools = token_pools(key, pool_size, pools), gate_pools = token_pools(gate, pool_size, pools),
                 slot_view = pool_slots(slots, pool_size, pools);
    Pools p{{"key", &key_pools}, {"gate_score", &gate_pools}, {"slot_mapping", &slot_view}};
    p.kv_cache = &kv_cache;
    Placement where(p.args(ape), exec, p.split());
    where.require_pool_arithmetic();
    std::optional<Placement> seed_where;
    if (seed) {
        seed_where.emplace(seed->all(), exec);
    }
    // The CPU's kernels take int64 slots: an int32 slot_mapping is widened
    // on the host (the CUDA kernels read it in place: the _I32 kinds).
    std::vector<int64_t> wide_slots;
    kpool_tensor wide_view;
    if (where.on_host()) {
        const int64_t cache_slots = cache_slot_count(kv_cache);
        for (int64_t i = pool_size - 1; i < n; i++) {
            const int64_t slot = index_at(slots, i);
            if (slot >= cache_slots) {
                throw out_of_range() << element_name(slots, i) << " = " << slot << " is outside the cache ("
                                     << cache_slots << " slots)";
            }
            if (slots.t->dtype == KPOOL_DTYPE_INT32) {
                wide_slots.push_back(slot);
            }
        }
        if (slots.t->dtype == KPOOL_DTYPE_INT32) {
            wide_view = contiguous_tensor(wide_slots.data(), KPOOL_DTYPE_INT64, 1, &pools);
            p.loc = {"slot_mapping", &wide_view};
        }
    }
    if (seed && seed_where->on_host()) {
        require_tslots_in_tail(seed->tslot, seed->tail);  // before the compress writes anything
    }
    mark_index_errors(where, KPOOL_INDEX_SLOT_MAPPING, p.loc, cache_slot_count(kv_cache), nullptr);
    if (seed && run_compress_and_seed(where, p, *seed, ape, pool_size, round_scale, op)) {
        return;
    }
    run_compress(where, p, ape, pool_size, round_scale, op);
    if (seed) {
        run_seed(*seed_where, *seed, pool_size, KPOOL_INDEX_TAIL_SLOT_MAPPING, op);
    }
}

}  // namespace kpool::rt
