// The C entry points: each runs its op (runtime/ops/) and reports how it
// ended as a kpool_status; the small utilities (names, version, tensors)
// answer directly.
#include <cstdio>

#include "kpool/kpool.h"
#include "ops/ops.h"
#include "warm_up.h"

namespace kpool::rt {

namespace {

// Runs `body` (which returns the skipped completions) and fills *status
// (when given) with its outcome; returns the status code.
template <typename Body>
kpool_status_code run(kpool_status *status, Body &&body) {
    kpool_status result{};
    try {
        result.skipped_completions = body();
        result.code = KPOOL_OK;
    } catch (const std::exception &e) {
        const StatusError error = as_status_error(e);
        result.code = error.code();
        std::snprintf(result.message, sizeof(result.message), "%s", error.what());
    }
    if (status != nullptr) {
        *status = result;
    }
    return result.code;
}

// For the ops that count nothing skipped.
template <typename Body>
kpool_status_code run_op(kpool_status *status, Body &&body) {
    return run(status, [&]() -> int64_t {
        body();
        return 0;
    });
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
    return contiguous_tensor(data, dtype, ndim, shape);
}

kpool_status_code kpool_fwht128_quant_fp8(const kpool_tensor *q, const kpool_tensor *q_fp8, const kpool_tensor *q_scale,
                                          const kpool_exec *exec, kpool_status *status) {
    return run_op(status, [&] { fwht128_quant_fp8(q, q_fp8, q_scale, exec); });
}

kpool_status_code kpool_compress_and_write_cache(
    const kpool_tensor *kv_cache, const kpool_tensor *slot_k, const kpool_tensor *slot_score,
    const kpool_tensor *ape, const kpool_tensor *loc, const kpool_tensor *write_mask,
    const kpool_tensor *compressed_k, const kpool_tensor *compressed_scale, int32_t pool_size,
    int32_t head_dim, int32_t round_scale, int32_t write_cache, const kpool_exec *exec, kpool_status *status) {
    return run_op(status, [&] {
        compress_and_write_cache(kv_cache, slot_k, slot_score, ape, loc, write_mask, compressed_k, compressed_scale,
                                 pool_size, head_dim, round_scale, write_cache, exec);
    });
}

kpool_status_code kpool_compress_tokens_and_write_cache(
    const kpool_tensor *kv_cache, const kpool_tensor *key, const kpool_tensor *gate_score, const kpool_tensor *ape,
    const kpool_tensor *slot_mapping, const kpool_tensor *tail_kv_cache, const kpool_tensor *tail_slot_mapping,
    const kpool_tensor *positions, int32_t pool_size, int32_t head_dim, int32_t round_scale, const kpool_exec *exec,
    kpool_status *status) {
    return run_op(status, [&] {
        compress_tokens_and_write_cache(kv_cache, key, gate_score, ape, slot_mapping, tail_kv_cache,
                                        tail_slot_mapping, positions, pool_size, head_dim, round_scale, exec);
    });
}

kpool_status_code kpool_seed_tail_cache(const kpool_tensor *tail_kv_cache, const kpool_tensor *key,
                                        const kpool_tensor *gate_score, const kpool_tensor *tslot,
                                        int32_t pool_size, int32_t head_dim, const kpool_exec *exec,
                                        kpool_status *status) {
    return run_op(status, [&] { seed_tail_cache(tail_kv_cache, key, gate_score, tslot, pool_size, head_dim, exec); });
}

kpool_status_code kpool_decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache, const kpool_tensor *tail_slot_mapping,
    const kpool_tensor *key, const kpool_tensor *slot_score, const kpool_tensor *ape,
    const kpool_tensor *slot_mapping, const kpool_tensor *positions, int32_t pool_size, int32_t head_dim,
    int32_t round_scale, const kpool_exec *exec, kpool_status *status) {
    return run(status, [&] {
        return decode_update_and_maybe_write_cache_batched(kv_cache, tail_kv_cache, tail_slot_mapping, key,
                                                           slot_score, ape, slot_mapping, positions, pool_size,
                                                           head_dim, round_scale, exec);
    });
}

kpool_status_code kpool_decode_update_and_maybe_write_cache_ragged(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache, const kpool_tensor *tail_slot_mapping,
    const kpool_tensor *key, const kpool_tensor *slot_score, const kpool_tensor *ape,
    const kpool_tensor *slot_mapping, const kpool_tensor *positions, const kpool_tensor *query_start_loc,
    int32_t max_query_len, int32_t pool_size, int32_t head_dim, int32_t round_scale, const kpool_exec *exec,
    kpool_status *status) {
    return run(status, [&] {
        return decode_update_and_maybe_write_cache_ragged(kv_cache, tail_kv_cache, tail_slot_mapping, key,
                                                          slot_score, ape, slot_mapping, positions, query_start_loc,
                                                          max_query_len, pool_size, head_dim, round_scale, exec);
    });
}

kpool_status_code kpool_expand_pools_and_append_tail(const kpool_tensor *pool_ids, const kpool_tensor *seq_lens,
                                                     const kpool_tensor *out, int32_t pool_size,
                                                     int32_t bound_pool_ids, const kpool_exec *exec,
                                                     kpool_status *status) {
    return run_op(status,
                  [&] { expand_pools_and_append_tail(pool_ids, seq_lens, out, pool_size, bound_pool_ids, exec); });
}

kpool_status_code kpool_expand_pools_to_tokens(const kpool_tensor *group_ids, const kpool_tensor *group_valid,
                                               const kpool_tensor *page_table, const kpool_tensor *topk_offsets,
                                               const kpool_tensor *out, int32_t topk, int32_t pool_size,
                                               const kpool_exec *exec, kpool_status *status) {
    return run_op(status, [&] {
        expand_pools_to_tokens(group_ids, group_valid, page_table, topk_offsets, out, topk, pool_size, exec);
    });
}

kpool_status_code kpool_append_tail_to_topk(const kpool_tensor *topk_result, const kpool_tensor *seq_lens,
                                            const kpool_tensor *pool_lens, const kpool_tensor *page_table,
                                            const kpool_tensor *topk_offsets, const kpool_tensor *out,
                                            int32_t pool_size, const kpool_exec *exec, kpool_status *status) {
    return run_op(status, [&] {
        append_tail_to_topk(topk_result, seq_lens, pool_lens, page_table, topk_offsets, out, pool_size, exec);
    });
}

kpool_status_code kpool_cuda_warm_up(int32_t device_index, const kpool_exec *exec, kpool_status *status) {
    return run_op(status, [&] { warm_up_cuda(device_index, exec != nullptr ? exec->stream : nullptr); });
}

kpool_status_code kpool_cuda_loaded_images(int32_t device_index, kpool_cuda_images *images, kpool_status *status) {
    return run_op(status, [&] { cuda_loaded_images(device_index, images); });
}

kpool_status_code kpool_check_index_errors(int32_t device_index, const kpool_exec *exec, kpool_status *status) {
    return run_op(status, [&] { check_index_errors(device_index, exec); });
}

kpool_status_code kpool_history_group_budget_for_topk(int64_t topk, int32_t pool_size, int64_t *groups,
                                                      kpool_status *status) {
    return run_op(status, [&] { history_group_budget_for_topk(topk, pool_size, groups); });
}

}  // extern "C"
