// The C entry points: validate every argument, wrap the caller's memory, run
// the kernel variant. Nothing is written before validation has passed.
#include <cstdio>
#include <string>
#include <vector>

#include "kpool/kpool.h"
#include "placement.h"
#include "warm_up.h"

namespace kpool::rt {

namespace {

constexpr int64_t kCacheRowBytes = KPOOL_CACHE_ROW_BYTES;

template <typename Body>
kpool_status_code run(kpool_status *status, Body &&body) {
    kpool_status result{};
    try {
        result.skipped_completions = body();
        result.code = KPOOL_OK;
    } catch (const ArgumentError &e) {
        result.code = e.code();
        std::snprintf(result.message, sizeof(result.message), "%s", e.what());
    } catch (const std::exception &e) {
        result.code = KPOOL_ERROR_INTERNAL;
        std::snprintf(result.message, sizeof(result.message), "internal error: %s", e.what());
    }
    if (status != nullptr) {
        *status = result;
    }
    return result.code;
}

// The paged K cache: uint8 [num_blocks, block_size, 132], planar pages whose
// stride (bytes) is a multiple of 4 so the f32 scales stay aligned.
TensorArg require_kv_cache(const kpool_tensor *t) {
    TensorArg c = require_tensor("kv_cache", t, {KPOOL_DTYPE_UINT8}, 3);
    require_dim(c, 2, kCacheRowBytes, "head_dim + 4 bytes per slot");
    if (reinterpret_cast<uintptr_t>(c.t->data) % 4 != 0) {
        invalid() << "kv_cache has data at " << c.t->data << ": it must be 4-byte aligned (its f32 scales)";
    }
    if (c.dim(1) < 1) {
        invalid() << "kv_cache has block_size " << c.dim(1) << " (must be >= 1)";
    }
    require_stride(c, 2, 1);
    require_stride(c, 1, kCacheRowBytes);
    if (c.dim(0) > 1 && (c.stride(0) < c.dim(1) * kCacheRowBytes || c.stride(0) % 4 != 0)) {
        invalid() << "kv_cache has page stride " << c.stride(0) << " bytes: it must be a multiple of 4 and at least block_size * 132 = "
                  << c.dim(1) * kCacheRowBytes;
    }
    require_int32_strides(c);
    return c;
}

// The tail ring: bf16 [num_blocks, 2, RING, 128], strides (block, half, 128, 1),
// RING a multiple of P; halves and blocks may be padded, never overlap.
TensorArg require_tail(const kpool_tensor *t, int32_t pool_size) {
    TensorArg tail = require_tensor("tail_kv_cache", t, {KPOOL_DTYPE_BFLOAT16}, 4);
    require_dim(tail, 1, 2, "K half and score half");
    require_dim(tail, 3, KPOOL_HEAD_DIM, "head_dim");
    int64_t ring = tail.dim(2);
    if (ring < 1 || ring % pool_size != 0) {
        invalid() << "tail_kv_cache has RING = " << ring << ", which is not a positive multiple of pool_size = " << pool_size;
    }
    require_stride(tail, 3, 1);
    require_stride(tail, 2, KPOOL_HEAD_DIM);
    int64_t half_elems = ring * KPOOL_HEAD_DIM;
    if (tail.stride(1) < half_elems || (tail.dim(0) > 1 && tail.stride(0) < tail.stride(1) + half_elems)) {
        invalid() << "tail_kv_cache strides (" << tail.stride(0) << ", " << tail.stride(1)
                  << ", 128, 1) overlap its halves or blocks (RING * 128 = " << half_elems << ")";
    }
    require_int32_strides(tail);
    return tail;
}

void require_inner_contiguous(const TensorArg &a) {
    require_stride(a, a.t->ndim - 1, 1);
    require_int32_strides(a);
}

// A 2-D output [rows, cols] with dense rows: the rows must not overlap, or
// two elements would share memory (and the result depend on write order).
void require_disjoint_rows(const TensorArg &a) {
    if (a.numel() > 0 && a.dim(0) > 1 && a.stride(0) < a.dim(1)) {
        invalid() << a.name << " has stride " << a.stride(0) << " in dim 0 for rows of " << a.dim(1)
                  << " elements: its rows overlap";
    }
}

// bf16 keys [..., 128] and their scores of the same shape (bf16, or f32
// where `score_dtypes` allows it).
TensorArg require_keys(const char *name, const kpool_tensor *t) {
    TensorArg keys = require_tensor(name, t, {KPOOL_DTYPE_BFLOAT16}, 3);
    require_dim(keys, 2, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(keys);
    return keys;
}

TensorArg require_scores(const char *name, const kpool_tensor *t, std::initializer_list<kpool_dtype> score_dtypes,
                         const TensorArg &keys) {
    TensorArg scores = require_tensor(name, t, score_dtypes, 3);
    for (int i = 0; i < 3; i++) {
        require_same_dim(scores, i, keys, i);
    }
    require_inner_contiguous(scores);
    return scores;
}

// The position bias: f32 [P, 128].
TensorArg require_ape(const kpool_tensor *t, int32_t pool_size) {
    TensorArg ape = require_tensor("ape", t, {KPOOL_DTYPE_FLOAT32}, 2);
    require_dim(ape, 0, pool_size, "pool_size");
    require_dim(ape, 1, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(ape);
    return ape;
}

// The slots a loc / slot_mapping addresses: pages x block_size.
int64_t cache_slot_count(const TensorArg &kv_cache) { return kv_cache.dim(0) * kv_cache.dim(1); }
// The slots a tail slot addresses: blocks x RING.
int64_t tail_slot_count(const TensorArg &tail) { return tail.dim(0) * tail.dim(2); }

// Every non-negative loc addresses a slot of the cache.
void require_locs_in_cache(const TensorArg &locs, const TensorArg &kv_cache, const TensorArg *mask) {
    int64_t slots = cache_slot_count(kv_cache);
    for (int64_t i = 0; i < locs.numel(); i++) {
        if (mask != nullptr && static_cast<const uint8_t *>(mask->t->data)[i * mask->stride(0)] == 0) {
            continue;
        }
        int64_t loc = index_at(locs, i);
        if (loc >= slots) {
            out_of_range() << element_name(locs, i) << " = " << loc << " is outside the cache (" << slots << " slots)";
        }
    }
}

// Every non-negative tail slot addresses a block of the tail cache.
void require_tslots_in_tail(const TensorArg &tslots, const TensorArg &tail) {
    int64_t ring = tail.dim(2), blocks = tail.dim(0);
    for (int64_t i = 0; i < tslots.numel(); i++) {
        int64_t tslot = index_at(tslots, i);
        if (tslot >= 0 && tslot / ring >= blocks) {
            out_of_range() << element_name(tslots, i) << " = " << tslot << " is outside the tail cache ("
                           << blocks << " blocks of RING = " << ring << ")";
        }
    }
}

void require_pool_size_matches(int32_t pool_size, const TensorArg &a, int dim) {
    require_pool_size(pool_size);
    if (a.dim(dim) != pool_size) {
        invalid() << "pool_size = " << pool_size << " does not match " << a.name << " dim " << dim
                  << " = " << a.dim(dim);
    }
}

// [n] or [n, 1] as a 1-D buffer over n.
HalideBuffer wrap_vector(const TensorArg &a) {
    HalideBuffer b = wrap(a);
    return a.t->ndim == 2 ? b.sliced(0, 0) : b;
}

const char *index_type(const TensorArg &a) { return a.t->dtype == KPOOL_DTYPE_INT64 ? "int64" : "int32"; }

// A device call's kernels skip every write whose index is >= limit; when the
// caller passed exec->index_errors, this marks `arg`'s word if any entry of
// `index` (those `mask` enables, or all) is. One small kernel on the call's
// stream, before the op's own.
void mark_index_errors(const Placement &where, kpool_index_arg arg, const TensorArg &index, int64_t limit,
                       const TensorArg *mask) {
    if (where.index_errors() == nullptr || index.numel() == 0) {
        return;
    }
    HalideBuffer entries = wrap(index);
    if (entries.dimensions() == 1) {
        entries = entries.embedded(1, 0);
    }
    HalideBuffer enabled = mask ? where.attach(wrap(*mask)) : where.all_true(entries.dim(0).extent());
    HalideBuffer word = where.words(where.index_errors() + arg, 1);
    where.launch(Kernel::INDEX_CHECK, index.name, 0, index_type(index), where.attach(entries).raw_buffer(),
                 enabled.raw_buffer(), limit, word.raw_buffer());
}

// Optional page table [rows, W >= 1] or offsets [rows] / [rows, 1], not both.
// The optional tensors, validated; the buffers are made by bind().
struct TokenMapArgs {
    int mode = 0;  // 0 identity, 1 page table, 2 offsets (kpool_expand.cpp)
    TensorArg page_table{}, offsets{};
    std::vector<const TensorArg *> present() const {
        if (mode == 1) return {&page_table};
        if (mode == 2) return {&offsets};
        return {};
    }
    void bind(const Placement &where, int64_t rows, HalideBuffer &table, HalideBuffer &offs) const {
        table = mode == 1 ? wrap(page_table) : where.no_page_table(rows);
        offs = mode == 2 ? wrap_vector(offsets) : where.no_offsets(rows);
        if (mode == 1) where.attach(table);
        if (mode == 2) where.attach(offs);
    }
};

TokenMapArgs token_map(const kpool_tensor *page_table, const kpool_tensor *topk_offsets, int64_t rows) {
    TokenMapArgs m;
    if (page_table != nullptr && topk_offsets != nullptr) {
        invalid() << "page_table and topk_offsets are both given; pass at most one";
    }
    if (page_table != nullptr) {
        TensorArg pt = require_tensor("page_table", page_table, {KPOOL_DTYPE_INT32}, 2);
        if (pt.dim(0) != rows || pt.dim(1) < 1) {
            invalid() << "page_table has shape [" << pt.dim(0) << ", " << pt.dim(1) << "], expected [" << rows
                      << ", W >= 1]";
        }
        require_int32_strides(pt);
        m.mode = 1;
        m.page_table = pt;
    } else if (topk_offsets != nullptr) {
        TensorArg off = require_tensor_ranks("topk_offsets", topk_offsets, {KPOOL_DTYPE_INT64}, {1, 2});
        require_dim(off, 0, rows, "rows");
        if (off.t->ndim == 2) {
            require_dim(off, 1, 1, "[rows, 1]");
        }
        require_int32_strides(off);
        m.mode = 2;
        m.offsets = off;
    }
    return m;
}

TensorArg require_int32_vector(const char *name, const kpool_tensor *t, int64_t rows) {
    TensorArg v = require_tensor(name, t, {KPOOL_DTYPE_INT32}, 1);
    require_dim(v, 0, rows, "rows");
    require_int32_strides(v);
    return v;
}

void require_non_negative(const TensorArg &v) {
    for (int64_t i = 0; i < v.numel(); i++) {
        if (index_at(v, i) < 0) {
            invalid() << element_name(v, i) << " = " << index_at(v, i) << " is negative";
        }
    }
}

TensorArg require_out(const kpool_tensor *t, int64_t rows, int64_t cols) {
    TensorArg out = require_tensor("out", t, {KPOOL_DTYPE_INT32}, 2);
    require_dim(out, 0, rows, "rows");
    require_dim(out, 1, cols, "output columns");
    require_inner_contiguous(out);
    require_disjoint_rows(out);
    return out;
}

}  // namespace

}  // namespace kpool::rt

using namespace kpool::rt;

extern "C" {

const char *kpool_status_name(kpool_status_code code) {
    switch (code) {
    case KPOOL_OK: return "ok";
    case KPOOL_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case KPOOL_ERROR_OUT_OF_RANGE: return "index out of range";
    case KPOOL_ERROR_UNSUPPORTED: return "unsupported";
    case KPOOL_ERROR_DEVICE: return "device error";
    case KPOOL_ERROR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *kpool_dtype_name(kpool_dtype dtype) {
    switch (dtype) {
    case KPOOL_DTYPE_UINT8: return "uint8";
    case KPOOL_DTYPE_BOOL: return "bool";
    case KPOOL_DTYPE_INT32: return "int32";
    case KPOOL_DTYPE_INT64: return "int64";
    case KPOOL_DTYPE_BFLOAT16: return "bfloat16";
    case KPOOL_DTYPE_FLOAT32: return "float32";
    case KPOOL_DTYPE_FLOAT8_E4M3FN: return "float8_e4m3fn";
    }
    return "unknown dtype";
}

int32_t kpool_dtype_size(kpool_dtype dtype) { return static_cast<int32_t>(element_bytes(dtype)); }

const char *kpool_version(void) {
#ifdef KPOOL_WITH_CUDA
    return "kpool " KPOOL_VERSION_STRING " (cpu, cuda)";
#else
    return "kpool " KPOOL_VERSION_STRING " (cpu)";
#endif
}

kpool_tensor kpool_tensor_contiguous(void *data, kpool_dtype dtype, int32_t ndim, const int64_t *shape) {
    kpool_tensor t{};
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0 && i < KPOOL_MAX_DIMS; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i];
    }
    t.device = KPOOL_DEVICE_CPU;
    return t;
}

kpool_status_code kpool_fwht128_quant_fp8(const kpool_tensor *q_, const kpool_tensor *q_fp8_,
                                          const kpool_tensor *q_scale_, const kpool_exec *exec,
                                          kpool_status *status) {
    return run(status, [&]() -> int64_t {
        TensorArg q = require_tensor("q", q_, {KPOOL_DTYPE_BFLOAT16}, 2);
        require_dim(q, 1, KPOOL_HEAD_DIM, "head_dim");
        require_inner_contiguous(q);
        TensorArg q_fp8 = require_tensor("q_fp8", q_fp8_, {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8}, 2);
        require_same_dim(q_fp8, 0, q, 0);
        require_dim(q_fp8, 1, KPOOL_HEAD_DIM, "head_dim");
        require_inner_contiguous(q_fp8);
        require_disjoint_rows(q_fp8);
        TensorArg q_scale = require_tensor_ranks("q_scale", q_scale_, {KPOOL_DTYPE_FLOAT32}, {1, 2});
        require_same_dim(q_scale, 0, q, 0);
        if (q_scale.t->ndim == 2) {
            require_dim(q_scale, 1, 1, "[rows, 1]");
        }
        require_int32_strides(q_scale);
        Placement where({&q, &q_fp8, &q_scale}, exec);
        if (q.dim(0) == 0) {
            return 0;
        }
        HalideBuffer in = wrap(q), codes = wrap(q_fp8), scales = wrap_row_scales(q_scale);
        where.launch(Kernel::FWHT, "fwht128_quant_fp8", 0, "none", where.attach(in).raw_buffer(),
                     where.attach(codes).raw_buffer(), where.attach(scales).raw_buffer());
        return 0;
    });
}

kpool_status_code kpool_compress_and_write_cache(
    const kpool_tensor *kv_cache_, const kpool_tensor *slot_k_, const kpool_tensor *slot_score_,
    const kpool_tensor *ape_, const kpool_tensor *loc_, const kpool_tensor *write_mask_,
    const kpool_tensor *compressed_k_, const kpool_tensor *compressed_scale_, int32_t pool_size,
    int32_t head_dim, int32_t round_scale, int32_t write_cache, const kpool_exec *exec, kpool_status *status) {
    return run(status, [&]() -> int64_t {
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
            invalid() << (compressed_k_ == nullptr ? "compressed_k" : "compressed_scale")
                      << " is NULL: return_compressed needs both compressed_k and compressed_scale";
        }
        if (!write_cache && !return_compressed) {
            invalid() << "write_cache = 0 and no compressed_k / compressed_scale: nothing to compute";
        }
        TensorArg *mask = nullptr;
        TensorArg write_mask{};
        if (write_mask_ != nullptr) {
            if (return_compressed) {
                invalid() << "write_mask cannot be combined with return_compressed (compressed_k / compressed_scale)";
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
            require_int32_strides(compressed_scale);
        }
        TensorArg kv_cache{};
        std::vector<const TensorArg *> args{&slot_k, &slot_score, &ape, &loc};
        if (write_cache) {
            kv_cache = require_kv_cache(kv_cache_);
            args.push_back(&kv_cache);
        }
        if (mask) {
            args.push_back(mask);
        }
        if (return_compressed) {
            args.insert(args.end(), {&compressed_k, &compressed_scale});
        }
        Placement where(args, exec);
        where.require_pool_arithmetic();
        if (write_cache && where.on_host()) {
            require_locs_in_cache(loc, kv_cache, mask);
        }
        if (write_cache) {
            mark_index_errors(where, KPOOL_INDEX_LOC, loc, cache_slot_count(kv_cache), mask);
        }
        if (n == 0) {
            return 0;
        }

        const char *op = "kpool_compress_and_write_cache";
        const char *score_type = slot_score.t->dtype == KPOOL_DTYPE_FLOAT32 ? "f32" : "bf16";
        HalideBuffer key = wrap(slot_k), score = wrap(slot_score), ape_b = wrap(ape);
        where.attach(key), where.attach(score), where.attach(ape_b);
        // A cache without slots takes no write (every loc is a sentinel; on a
        // device the kernel would skip them): no kernel on empty views.
        if (write_cache && kv_cache.numel() > 0) {
            HalideBuffer locs = wrap(loc), flags = mask ? wrap(*mask) : where.all_true(n);
            if (mask) {
                where.attach(flags);
            }
            CacheViews cache = wrap_kv_cache(kv_cache);
            where.launch(Kernel::COMPRESS_TO_CACHE, op, pool_size, score_type, key.raw_buffer(), score.raw_buffer(),
                         ape_b.raw_buffer(), round_scale != 0, where.attach(locs).raw_buffer(), flags.raw_buffer(),
                         where.attach(cache.codes).raw_buffer(), where.attach(cache.scales).raw_buffer());
        }
        if (return_compressed) {
            HalideBuffer codes = wrap(compressed_k), scales = wrap_row_scales(compressed_scale);
            where.launch(Kernel::COMPRESS_TO_ROWS, op, pool_size, score_type, key.raw_buffer(), score.raw_buffer(),
                         ape_b.raw_buffer(), round_scale != 0, where.attach(codes).raw_buffer(),
                         where.attach(scales).raw_buffer());
        }
        return 0;
    });
}

kpool_status_code kpool_seed_tail_cache(const kpool_tensor *tail_kv_cache_, const kpool_tensor *key_,
                                        const kpool_tensor *gate_score_, const kpool_tensor *tslot_,
                                        int32_t pool_size, int32_t head_dim, const kpool_exec *exec,
                                        kpool_status *status) {
    return run(status, [&]() -> int64_t {
        require_head_dim(head_dim);
        require_pool_size(pool_size);
        TensorArg tail = require_tail(tail_kv_cache_, pool_size);
        TensorArg key = require_tensor("key", key_, {KPOOL_DTYPE_BFLOAT16}, 2);
        require_dim(key, 1, KPOOL_HEAD_DIM, "head_dim");
        require_inner_contiguous(key);
        TensorArg gate = require_tensor("gate_score", gate_score_, {KPOOL_DTYPE_BFLOAT16}, 2);
        require_same_dim(gate, 0, key, 0);
        require_same_dim(gate, 1, key, 1);
        require_inner_contiguous(gate);
        TensorArg tslot = require_tensor("tslot", tslot_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 1);
        require_same_dim(tslot, 0, key, 0);
        require_int32_strides(tslot);
        Placement where({&tail, &key, &gate, &tslot}, exec);
        if (where.on_host()) {
            require_tslots_in_tail(tslot, tail);
        }
        mark_index_errors(where, KPOOL_INDEX_TSLOT, tslot, tail_slot_count(tail), nullptr);
        if (key.dim(0) == 0 || tail.numel() == 0) {
            return 0;  // nothing to seed, or no block to seed into (every tslot is a sentinel)
        }
        HalideBuffer k = wrap(key), g = wrap(gate), ts = wrap(tslot), t = wrap_tail(tail);
        where.launch(Kernel::SEED_TAIL, "kpool_seed_tail_cache", 0, index_type(tslot), where.attach(k).raw_buffer(),
                     where.attach(g).raw_buffer(), where.attach(ts).raw_buffer(), int32_t(pool_size),
                     where.attach(t).raw_buffer());
        return 0;
    });
}

kpool_status_code kpool_decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache_, const kpool_tensor *tail_kv_cache_, const kpool_tensor *tail_slot_mapping_,
    const kpool_tensor *key_, const kpool_tensor *slot_score_, const kpool_tensor *ape_,
    const kpool_tensor *slot_mapping_, const kpool_tensor *positions_, int32_t pool_size, int32_t head_dim,
    int32_t round_scale, const kpool_exec *exec, kpool_status *status) {
    return run(status, [&]() -> int64_t {
        require_head_dim(head_dim);
        require_pool_size(pool_size);
        TensorArg kv_cache = require_kv_cache(kv_cache_);
        TensorArg tail = require_tail(tail_kv_cache_, pool_size);
        TensorArg key = require_keys("key", key_);
        TensorArg score = require_scores("slot_score", slot_score_, {KPOOL_DTYPE_BFLOAT16}, key);
        TensorArg ape = require_ape(ape_, pool_size);
        auto per_token = [&](const char *name, const kpool_tensor *t) {
            TensorArg a = require_tensor(name, t, {KPOOL_DTYPE_INT32}, 2);
            require_same_dim(a, 0, key, 0);
            require_same_dim(a, 1, key, 1);
            require_int32_strides(a);
            return a;
        };
        TensorArg tail_slots = per_token("tail_slot_mapping", tail_slot_mapping_);
        TensorArg slots = per_token("slot_mapping", slot_mapping_);
        TensorArg positions = per_token("positions", positions_);
        Placement where({&kv_cache, &tail, &key, &score, &ape, &tail_slots, &slots, &positions}, exec);
        where.require_pool_arithmetic();
        // Completions without a tail block write nothing (SPEC, reference
        // defects); on the host they are counted, on a device the count
        // would need a copy back, so it is reported as -1.
        int64_t skipped = where.on_host() ? 0 : -1;
        if (where.on_host()) {
            require_locs_in_cache(slots, kv_cache, nullptr);
            require_tslots_in_tail(tail_slots, tail);
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
        CacheViews cache = wrap_kv_cache(kv_cache);
        for (HalideBuffer *b : {&t, &ts, &k, &s, &a, &sm, &pos, &cache.codes, &cache.scales}) {
            where.attach(*b);
        }
        // Completions read the ring as it was before this call's stashes.
        // One token per request: one kernel does both where the device has
        // it (a token's stash is never a slot of its own pool).
        if (key.dim(1) == 1 && kv_cache.numel() > 0 && where.has_kernel(Kernel::DECODE_UPDATE, pool_size, "bf16")) {
            HalideBuffer t_out = wrap_tail(tail);
            where.launch(Kernel::DECODE_UPDATE, op, pool_size, "bf16", t.raw_buffer(), ts.raw_buffer(),
                         k.raw_buffer(), s.raw_buffer(), a.raw_buffer(), sm.raw_buffer(), pos.raw_buffer(),
                         round_scale != 0, cache.codes.raw_buffer(), cache.scales.raw_buffer(),
                         where.attach(t_out).raw_buffer());
            return skipped;
        }
        // Otherwise two kernels, in this order on the caller's stream.
        if (kv_cache.numel() > 0) {
            where.launch(Kernel::DECODE_WRITE_CACHE, op, pool_size, "bf16", t.raw_buffer(), ts.raw_buffer(),
                         k.raw_buffer(), s.raw_buffer(), a.raw_buffer(), sm.raw_buffer(), pos.raw_buffer(),
                         round_scale != 0, cache.codes.raw_buffer(), cache.scales.raw_buffer());
        }
        where.launch(Kernel::DECODE_STASH_TAIL, op, 0, "none", ts.raw_buffer(), k.raw_buffer(), s.raw_buffer(),
                     pos.raw_buffer(), t.raw_buffer());
        return skipped;
    });
}

kpool_status_code kpool_expand_pools_and_append_tail(const kpool_tensor *pool_ids_, const kpool_tensor *seq_lens_,
                                                     const kpool_tensor *out_, int32_t pool_size,
                                                     int32_t bound_pool_ids, const kpool_exec *exec,
                                                     kpool_status *status) {
    return run(status, [&]() -> int64_t {
        require_pool_size(pool_size);
        TensorArg ids = require_tensor("pool_ids", pool_ids_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 2);
        require_inner_contiguous(ids);
        const int64_t rows = ids.dim(0);
        TensorArg seq_lens = require_int32_vector("seq_lens", seq_lens_, rows);
        TensorArg out = require_out(out_, rows, ids.dim(1) * pool_size + pool_size - 1);
        Placement where({&ids, &seq_lens, &out}, exec);
        if (where.on_host()) {
            require_non_negative(seq_lens);
        }
        if (rows == 0 || out.dim(1) == 0) {
            return 0;
        }
        const int32_t groups = static_cast<int32_t>(ids.dim(1));
        HalideBuffer i = groups > 0 ? where.attach(wrap(ids)) : where.no_columns(ids.t->dtype, rows);
        HalideBuffer s = wrap(seq_lens), o = wrap(out);
        where.launch(Kernel::EXPAND_POOLS_AND_APPEND_TAIL, "expand_pools_and_append_tail", 0, index_type(ids),
                     i.raw_buffer(), groups, where.attach(s).raw_buffer(), int32_t(pool_size), bound_pool_ids != 0,
                     where.attach(o).raw_buffer());
        return 0;
    });
}

kpool_status_code kpool_expand_pools_to_tokens(const kpool_tensor *group_ids_, const kpool_tensor *group_valid_,
                                               const kpool_tensor *page_table_, const kpool_tensor *topk_offsets_,
                                               const kpool_tensor *out_, int32_t topk, int32_t pool_size,
                                               const kpool_exec *exec, kpool_status *status) {
    return run(status, [&]() -> int64_t {
        require_pool_size(pool_size);
        if (topk < 0 || topk % pool_size != 0) {
            invalid() << "topk = " << topk << " is not a non-negative multiple of pool_size = " << pool_size;
        }
        TensorArg ids = require_tensor("group_ids", group_ids_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 2);
        require_dim(ids, 1, topk / pool_size, "topk / pool_size groups");
        require_inner_contiguous(ids);
        const int64_t rows = ids.dim(0);
        TensorArg valid = require_tensor("group_valid", group_valid_, {KPOOL_DTYPE_BOOL, KPOOL_DTYPE_UINT8}, 2);
        require_same_dim(valid, 0, ids, 0);
        require_same_dim(valid, 1, ids, 1);
        require_inner_contiguous(valid);
        TokenMapArgs map = token_map(page_table_, topk_offsets_, rows);
        TensorArg out = require_out(out_, rows, topk);
        std::vector<const TensorArg *> args{&ids, &valid, &out};
        for (const TensorArg *a : map.present()) {
            args.push_back(a);
        }
        Placement where(args, exec);
        if (rows == 0 || topk == 0) {
            return 0;
        }
        HalideBuffer g = wrap(ids), v = wrap(valid), o = wrap(out), table, offsets;
        map.bind(where, rows, table, offsets);
        where.launch(Kernel::EXPAND_POOLS_TO_TOKENS, "expand_pools_to_tokens", 0, index_type(ids),
                     where.attach(g).raw_buffer(), where.attach(v).raw_buffer(), table.raw_buffer(),
                     offsets.raw_buffer(), int32_t(map.mode), int32_t(pool_size), where.attach(o).raw_buffer());
        return 0;
    });
}

kpool_status_code kpool_append_tail_to_topk(const kpool_tensor *topk_result_, const kpool_tensor *seq_lens_,
                                            const kpool_tensor *pool_lens_, const kpool_tensor *page_table_,
                                            const kpool_tensor *topk_offsets_, const kpool_tensor *out_,
                                            int32_t pool_size, const kpool_exec *exec, kpool_status *status) {
    return run(status, [&]() -> int64_t {
        require_pool_size(pool_size);
        TensorArg topk = require_tensor("topk_result", topk_result_, {KPOOL_DTYPE_INT32}, 2);
        require_inner_contiguous(topk);
        const int64_t rows = topk.dim(0);
        TensorArg seq_lens = require_int32_vector("seq_lens", seq_lens_, rows);
        TensorArg pool_lens = require_int32_vector("pool_lens", pool_lens_, rows);
        TokenMapArgs map = token_map(page_table_, topk_offsets_, rows);
        TensorArg out = require_out(out_, rows, topk.dim(1) + pool_size - 1);
        std::vector<const TensorArg *> args{&topk, &seq_lens, &pool_lens, &out};
        for (const TensorArg *a : map.present()) {
            args.push_back(a);
        }
        Placement where(args, exec);
        if (rows == 0 || out.dim(1) == 0) {
            return 0;
        }
        const int32_t history_cols = static_cast<int32_t>(topk.dim(1));
        HalideBuffer t = history_cols > 0 ? where.attach(wrap(topk)) : where.no_columns(KPOOL_DTYPE_INT32, rows);
        HalideBuffer s = wrap(seq_lens), p = wrap(pool_lens), o = wrap(out), table, offsets;
        map.bind(where, rows, table, offsets);
        where.launch(Kernel::APPEND_TAIL_TO_TOPK, "append_tail_to_topk", 0, "none", t.raw_buffer(), history_cols,
                     where.attach(s).raw_buffer(), where.attach(p).raw_buffer(), table.raw_buffer(),
                     offsets.raw_buffer(), int32_t(map.mode), int32_t(pool_size), where.attach(o).raw_buffer());
        return 0;
    });
}

kpool_status_code kpool_cuda_warm_up(int32_t device_index, const kpool_exec *exec, kpool_status *status) {
    return run(status, [&]() -> int64_t {
        warm_up_cuda(device_index, exec != nullptr ? exec->stream : nullptr);
        return 0;
    });
}

kpool_status_code kpool_check_index_errors(int32_t device_index, const kpool_exec *exec, kpool_status *status) {
    return run(status, [&]() -> int64_t {
        if (exec == nullptr || exec->index_errors == nullptr) {
            invalid() << (exec == nullptr ? "exec" : "exec->index_errors") << " is NULL: there are no words to read";
        }
        require_index_errors_aligned(exec->index_errors);
        int32_t words[KPOOL_INDEX_ARGS] = {};
        take_index_errors(cuda_device(device_index, "exec->index_errors"), exec->stream, exec->index_errors, words,
                          KPOOL_INDEX_ARGS);
        static const char *const kNames[KPOOL_INDEX_ARGS] = {"loc", "tslot", "slot_mapping", "tail_slot_mapping"};
        std::string marked;
        for (int i = 0; i < KPOOL_INDEX_ARGS; i++) {
            if (words[i] != 0) {
                marked += (marked.empty() ? "" : ", ") + std::string(kNames[i]);
            }
        }
        if (!marked.empty()) {
            out_of_range() << "device calls since the last check skipped writes at out-of-range indices of: " << marked;
        }
        return 0;
    });
}

kpool_status_code kpool_history_group_budget_for_topk(int64_t topk, int32_t pool_size, int64_t *groups,
                                                      kpool_status *status) {
    return run(status, [&]() -> int64_t {
        require_pool_size(pool_size);
        if (groups == nullptr) {
            invalid() << "groups is NULL";
        }
        if (topk < 0 || topk % pool_size != 0) {
            invalid() << "topk = " << topk << " is not a non-negative multiple of pool_size = " << pool_size;
        }
        *groups = topk / pool_size;
        return 0;
    });
}

}  // extern "C"
