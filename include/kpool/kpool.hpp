// kpool C++ API: the C API with exceptions and references instead of
// status codes and pointers. Tensors stay caller-owned `kpool_tensor`s.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "kpool/kpool.h"

namespace kpool {

using Tensor = kpool_tensor;

// A rejected call: the status code and the message naming the argument.
class Error : public std::runtime_error {
public:
    explicit Error(const kpool_status &s) : std::runtime_error(s.message), code_(s.code) {}
    kpool_status_code code() const { return code_; }

private:
    kpool_status_code code_;
};

struct Exec {
    void *stream = nullptr;  // CUstream for CUDA tensors
    kpool_arithmetic arithmetic = KPOOL_ARITHMETIC_DEFAULT;  // kpool.h: triton on CUDA, exact on the CPU
    int32_t *index_errors = nullptr;  // KPOOL_INDEX_ARGS device words, or none (kpool.h)
};

namespace detail {

inline const kpool_tensor *ptr(const std::optional<Tensor> &t) { return t ? &*t : nullptr; }

inline kpool_exec c_exec(const Exec &e) { return kpool_exec{e.stream, e.arithmetic, e.index_errors}; }

inline kpool_status check(kpool_status_code code, const kpool_status &s) {
    if (code != KPOOL_OK) {
        throw Error(s);
    }
    return s;
}

}  // namespace detail

inline void fwht128_quant_fp8(const Tensor &q, const Tensor &q_fp8, const Tensor &q_scale, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_fwht128_quant_fp8(&q, &q_fp8, &q_scale, &e, &s), s);
}

struct CompressOptions {
    std::optional<Tensor> write_mask;
    std::optional<Tensor> compressed_k, compressed_scale;  // return_compressed
    bool round_scale = true;
    bool write_cache = true;
};

inline void compress_and_write_cache(const std::optional<Tensor> &kv_cache, const Tensor &slot_k,
                                     const Tensor &slot_score, const Tensor &ape, const Tensor &loc,
                                     int pool_size, const CompressOptions &opt = {}, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_compress_and_write_cache(detail::ptr(kv_cache), &slot_k, &slot_score, &ape, &loc,
                                                 detail::ptr(opt.write_mask), detail::ptr(opt.compressed_k),
                                                 detail::ptr(opt.compressed_scale), pool_size, KPOOL_HEAD_DIM,
                                                 opt.round_scale, opt.write_cache, &e, &s),
                  s);
}

// The prefill insert on the engine's token rows (kpool.h, 2b); `tail`, when
// given, seeds the tail ring in the same call: {tail_kv_cache,
// tail_slot_mapping[, positions: members before the chunk from the ring]}.
struct TailSeed {
    Tensor tail_kv_cache, tail_slot_mapping;
    std::optional<Tensor> positions;
};
inline void compress_tokens_and_write_cache(const Tensor &kv_cache, const Tensor &key, const Tensor &gate_score,
                                            const Tensor &ape, const Tensor &slot_mapping, int pool_size,
                                            const std::optional<TailSeed> &tail = {}, bool round_scale = true,
                                            Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_compress_tokens_and_write_cache(
                      &kv_cache, &key, &gate_score, &ape, &slot_mapping, tail ? &tail->tail_kv_cache : nullptr,
                      tail ? &tail->tail_slot_mapping : nullptr, tail ? detail::ptr(tail->positions) : nullptr,
                      pool_size, KPOOL_HEAD_DIM, round_scale, &e, &s),
                  s);
}

inline void seed_tail_cache(const Tensor &tail_kv_cache, const Tensor &key, const Tensor &gate_score,
                            const Tensor &tslot, int pool_size, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_seed_tail_cache(&tail_kv_cache, &key, &gate_score, &tslot, pool_size, KPOOL_HEAD_DIM,
                                        &e, &s),
                  s);
}

// Returns the number of completions skipped for want of a tail block.
inline int64_t decode_update_and_maybe_write_cache_batched(const Tensor &kv_cache, const Tensor &tail_kv_cache,
                                                           const Tensor &tail_slot_mapping, const Tensor &key,
                                                           const Tensor &slot_score, const Tensor &ape,
                                                           const Tensor &slot_mapping, const Tensor &positions,
                                                           int pool_size, bool round_scale = true,
                                                           Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    return detail::check(kpool_decode_update_and_maybe_write_cache_batched(
                             &kv_cache, &tail_kv_cache, &tail_slot_mapping, &key, &slot_score, &ape,
                             &slot_mapping, &positions, pool_size, KPOOL_HEAD_DIM, round_scale, &e, &s),
                         s)
        .skipped_completions;
}

// The ragged step (kpool.h, 4b); max_query_len 0: bounded by the token count.
inline int64_t decode_update_and_maybe_write_cache_ragged(
    const Tensor &kv_cache, const Tensor &tail_kv_cache, const Tensor &tail_slot_mapping, const Tensor &key,
    const Tensor &slot_score, const Tensor &ape, const Tensor &slot_mapping, const Tensor &positions,
    const Tensor &query_start_loc, int pool_size, int max_query_len = 0, bool round_scale = true, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    return detail::check(kpool_decode_update_and_maybe_write_cache_ragged(
                             &kv_cache, &tail_kv_cache, &tail_slot_mapping, &key, &slot_score, &ape, &slot_mapping,
                             &positions, &query_start_loc, max_query_len, pool_size, KPOOL_HEAD_DIM, round_scale,
                             &e, &s),
                         s)
        .skipped_completions;
}

inline void expand_pools_and_append_tail(const Tensor &pool_ids, const Tensor &seq_lens, const Tensor &out,
                                         int pool_size, bool bound_pool_ids = false, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_expand_pools_and_append_tail(&pool_ids, &seq_lens, &out, pool_size, bound_pool_ids, &e, &s),
                  s);
}

inline void expand_pools_to_tokens(const Tensor &group_ids, const Tensor &group_valid, const Tensor &out, int topk,
                                   int pool_size, const std::optional<Tensor> &page_table = {},
                                   const std::optional<Tensor> &topk_offsets = {}, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_expand_pools_to_tokens(&group_ids, &group_valid, detail::ptr(page_table),
                                               detail::ptr(topk_offsets), &out, topk, pool_size, &e, &s),
                  s);
}

inline void append_tail_to_topk(const Tensor &topk_result, const Tensor &seq_lens, const Tensor &pool_lens,
                                const Tensor &out, int pool_size, const std::optional<Tensor> &page_table = {},
                                const std::optional<Tensor> &topk_offsets = {}, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_append_tail_to_topk(&topk_result, &seq_lens, &pool_lens, detail::ptr(page_table),
                                            detail::ptr(topk_offsets), &out, pool_size, &e, &s),
                  s);
}

// Loads and runs every CUDA variant once on `device_index` (kpool.h); call
// before serving or capturing graphs.
inline void cuda_warm_up(int device_index, Exec exec = {}) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_cuda_warm_up(device_index, &e, &s), s);
}

// Throws (code KPOOL_ERROR_OUT_OF_RANGE, naming the arguments) when a device
// call since the last check marked exec.index_errors; zeroes the words.
inline void check_index_errors(int device_index, Exec exec) {
    kpool_status s;
    const kpool_exec e = detail::c_exec(exec);
    detail::check(kpool_check_index_errors(device_index, &e, &s), s);
}

inline int64_t history_group_budget_for_topk(int64_t topk, int pool_size) {
    kpool_status s;
    int64_t groups = 0;
    detail::check(kpool_history_group_budget_for_topk(topk, pool_size, &groups, &s), s);
    return groups;
}

}  // namespace kpool
