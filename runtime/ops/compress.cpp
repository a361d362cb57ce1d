// compress_and_write_cache: each pool of P tokens softmax-pooled,
// rotated and quantized into one cache row and/or returned as codes and
// scales.
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

}  // namespace

void compress_and_write_cache(const kpool_tensor *kv_cache_, const kpool_tensor *slot_k_,
                              const kpool_tensor *slot_score_, const kpool_tensor *ape_, const kpool_tensor *loc_,
                              const kpool_tensor *write_mask_, const kpool_tensor *compressed_k_,
                              const kpool_tensor *compressed_scale_, int32_t pool_size, int32_t head_dim,
                              int32_t round_scale, int32_t write_cache, const kpool_exec *exec) {
    require_head_dim(head_dim);
    TensorArg slot_k = require_keys("slot_k", slot_k_);
    require_pool_size_matches(pool_size, slot_k, 1);
    require_pool_size_with_variants(pool_size);
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
    // Per pool: on a device, tensors past the kernels' 32-bit offsets run
    // in ranges of pools, one launch each; a K cache past them, in windows
    // of its pages, each range's pools launched once per window (a pool
    // writes in the window that holds its loc).
    std::vector<const TensorArg *> per_pool{&slot_k, &slot_score, &loc};
    std::vector<const TensorArg *> args{&slot_k, &slot_score, &ape, &loc};
    if (write_cache) {
        kv_cache = require_kv_cache(kv_cache_);
        args.push_back(&kv_cache);
    }
    if (mask) {
        args.push_back(mask);
        per_pool.push_back(mask);
    }
    if (return_compressed) {
        args.insert(args.end(), {&compressed_k, &compressed_scale});
        per_pool.insert(per_pool.end(), {&compressed_k, &compressed_scale});
    }
    std::vector<const TensorArg *> split = per_pool;
    if (write_cache) {
        split.push_back(&kv_cache);
    }
    Placement where(args, exec, split);
    where.require_pool_arithmetic();
    if (write_cache && where.on_host()) {
        require_locs_in_cache(loc, kv_cache, mask);
    }
    if (write_cache) {
        mark_index_errors(where, KPOOL_INDEX_LOC, loc, cache_slot_count(kv_cache), mask);
    }
    if (n == 0) {
        return;
    }

    const char *op = "kpool_compress_and_write_cache";
    const ElementType score_type = slot_score.t->dtype == KPOOL_DTYPE_FLOAT32 ? ElementType::f32 : ElementType::bf16;
    HalideBuffer ape_b = wrap(ape);
    where.attach(ape_b);
    // With the strides (the kernel checks them), whether rows start 16-byte
    // aligned: the CUDA kernels then load 4 f32 at once. (A range's slices
    // start at whole pools: aligned where the whole tensor is and its pool
    // stride keeps it so, which the kernel's stride check covers.)
    const bool aligned_data =
        rows_aligned(slot_k, 16, {}) && rows_aligned(slot_score, 16, {}) && rows_aligned(ape, 16, {});
    const std::vector<RowRange> windows = write_cache ? where.cache_windows(kv_cache) : std::vector<RowRange>{};
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
        const bool words_fit = !where.on_host() && rows_aligned(k_range, 16, {0, 1}) &&
                               rows_aligned(s_range, 16, {0, 1}) && rows_aligned(ape, 16, {0});
        auto words_kernel = [&](Kernel kind) {
            const bool codes_fit = kind == Kernel::COMPRESS_TO_CACHE_WORDS
                                       ? write_cache && rows_aligned(kv_cache, 4, {0})
                                       : return_compressed && rows_aligned(compressed_k, 4, {0});
            return words_fit && codes_fit && where.has_kernel(kind, pool_size, score_type);
        };
        const bool words = words_kernel(Kernel::COMPRESS_TO_CACHE_WORDS) || words_kernel(Kernel::COMPRESS_TO_ROWS_WORDS);
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
        if (write_cache && kv_cache.numel() > 0) {
            HalideBuffer locs = wrap(pools(loc, loc_rows)),
                         flags = mask ? wrap(pools(*mask, mask_rows)) : where.all_true(r.count);
            if (mask) {
                where.attach(flags);
            }
            where.attach(locs);
            for (RowRange window : windows) {
                CacheViews cache = wrap_kv_cache(kv_cache, window);
                where.attach(cache.codes), where.attach(cache.scales);
                if (words_kernel(Kernel::COMPRESS_TO_CACHE_WORDS)) {
                    where.launch<Kernel::COMPRESS_TO_CACHE_WORDS>(
                        op, pool_size, score_type, key_words.raw_buffer(), score_words.raw_buffer(),
                        ape_b.raw_buffer(), round_scale != 0, aligned_data, locs.raw_buffer(), flags.raw_buffer(),
                        cache.codes.raw_buffer(), cache.scales.raw_buffer());
                } else {
                    where.launch<Kernel::COMPRESS_TO_CACHE>(op, pool_size, score_type, key.raw_buffer(),
                                                            score.raw_buffer(), ape_b.raw_buffer(), round_scale != 0,
                                                            aligned_data, locs.raw_buffer(), flags.raw_buffer(),
                                                            cache.codes.raw_buffer(), cache.scales.raw_buffer());
                }
            }
        }
        if (return_compressed) {
            HalideBuffer codes = wrap(pools(compressed_k, codes_rows)),
                         scales = wrap_row_scales(pools(compressed_scale, scale_rows));
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

}  // namespace kpool::rt
