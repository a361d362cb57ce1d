// The ops, one function each: validate every argument, wrap the caller's
// memory, run the kernel variant for the tensors' device. Arguments are the
// C API's (kpool.h documents them); a failure throws a StatusError, and
// nothing is written before validation has passed. The C entry points
// (kpool_api.cpp) and the CUDA warm-up call these.
#pragma once

#include <cstdint>
#include <vector>

#include "kpool/kpool.h"
#include "placement.h"

namespace kpool::rt {

// fwht.cpp
void fwht128_quant_fp8(const kpool_tensor *q, const kpool_tensor *q_fp8, const kpool_tensor *q_scale,
                       const kpool_exec *exec);

// compress.cpp
void compress_and_write_cache(const kpool_tensor *kv_cache, const kpool_tensor *slot_k,
                              const kpool_tensor *slot_score, const kpool_tensor *ape, const kpool_tensor *loc,
                              const kpool_tensor *write_mask, const kpool_tensor *compressed_k,
                              const kpool_tensor *compressed_scale, int32_t pool_size, int32_t head_dim,
                              int32_t round_scale, int32_t write_cache, const kpool_exec *exec);

// The engine's prefill insert: compress every pool a token of `key` /
// `gate_score` [n, 128] completes, read in place (with `positions`, members
// before the chunk from the tail ring), and (with the tail arguments) seed
// the tail ring from the same tokens.
void compress_tokens_and_write_cache(const kpool_tensor *kv_cache, const kpool_tensor *key,
                                     const kpool_tensor *gate_score, const kpool_tensor *ape,
                                     const kpool_tensor *slot_mapping, const kpool_tensor *tail_kv_cache,
                                     const kpool_tensor *tail_slot_mapping, const kpool_tensor *positions,
                                     int32_t pool_size, int32_t head_dim, int32_t round_scale,
                                     const kpool_exec *exec);

// seed.cpp
void seed_tail_cache(const kpool_tensor *tail_kv_cache, const kpool_tensor *key, const kpool_tensor *gate_score,
                     const kpool_tensor *tslot, int32_t pool_size, int32_t head_dim, const kpool_exec *exec);
// Its validated arguments, and its launch (the tail slots named `tslot_name`,
// marked in `index_word`), for the ops that seed as part of their call.
struct SeedArgs {
    TensorArg tail, key, gate, tslot;
    std::vector<const TensorArg *> all() const { return {&tail, &key, &gate, &tslot}; }
};
SeedArgs require_seed_args(const kpool_tensor *tail_kv_cache, const kpool_tensor *key, const kpool_tensor *gate_score,
                           const kpool_tensor *tslot, int32_t pool_size, const char *tslot_name);
void run_seed(const Placement &where, const SeedArgs &args, int32_t pool_size, kpool_index_arg index_word,
              const char *op);

// decode.cpp. Returns the completions skipped for want of a tail block
// (kpool_status.skipped_completions: -1 on a device, which does not count).
int64_t decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache, const kpool_tensor *tail_slot_mapping,
    const kpool_tensor *key, const kpool_tensor *slot_score, const kpool_tensor *ape, const kpool_tensor *slot_mapping,
    const kpool_tensor *positions, int32_t pool_size, int32_t head_dim, int32_t round_scale, const kpool_exec *exec);

// The same step on the tokens flat (key, slot_score [T, 128], indices [T]),
// request r's at query_start_loc[r] .. query_start_loc[r + 1], each request
// at most max_query_len tokens (0: T).
int64_t decode_update_and_maybe_write_cache_ragged(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache, const kpool_tensor *tail_slot_mapping,
    const kpool_tensor *key, const kpool_tensor *slot_score, const kpool_tensor *ape, const kpool_tensor *slot_mapping,
    const kpool_tensor *positions, const kpool_tensor *query_start_loc, int32_t max_query_len, int32_t pool_size,
    int32_t head_dim, int32_t round_scale, const kpool_exec *exec);

// expand.cpp
void expand_pools_and_append_tail(const kpool_tensor *pool_ids, const kpool_tensor *seq_lens, const kpool_tensor *out,
                                  int32_t pool_size, int32_t bound_pool_ids, const kpool_exec *exec);
void expand_pools_to_tokens(const kpool_tensor *group_ids, const kpool_tensor *group_valid,
                            const kpool_tensor *page_table, const kpool_tensor *topk_offsets, const kpool_tensor *out,
                            int32_t topk, int32_t pool_size, const kpool_exec *exec);
void append_tail_to_topk(const kpool_tensor *topk_result, const kpool_tensor *seq_lens, const kpool_tensor *pool_lens,
                         const kpool_tensor *page_table, const kpool_tensor *topk_offsets, const kpool_tensor *out,
                         int32_t pool_size, const kpool_exec *exec);
// Writes topk / pool_size to *groups.
void history_group_budget_for_topk(int64_t topk, int32_t pool_size, int64_t *groups);

// index_errors.cpp: exec->index_errors, marked on the device by the ops
// with indices, read back (and cleared) by the caller's check.
void check_index_errors(int32_t device_index, const kpool_exec *exec);

// For the ops' own files.

// The kernels compute positions in 32 bits (an int64 one is read saturated):
// a position past 2^31 - 1, which no context reaches, is rejected on the host.
void require_int32_positions(const TensorArg &positions);

// A kernel variant per index type: `a` must have `first`'s dtype (`together`
// names the tensors that share it, for the message).
void require_index_dtype_of(const TensorArg &a, const TensorArg &first, const char *together);

// The kernels' element type of an index tensor: int32 or int64.
ElementType index_type(const TensorArg &a);

// A device call's kernels skip every write whose index is >= limit; when the
// caller passed exec->index_errors, this marks `arg`'s word if any entry of
// `index` (those `mask` enables, or all) is. One small kernel on the call's
// stream, before the op's own.
void mark_index_errors(const Placement &where, kpool_index_arg arg, const TensorArg &index, int64_t limit,
                       const TensorArg *mask);

}  // namespace kpool::rt
