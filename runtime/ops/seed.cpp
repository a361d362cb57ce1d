// seed_tail_cache: each request's last P prefill tokens (keys and gate
// scores) into its block of the tail ring.
#include "ops.h"

namespace kpool::rt {

SeedArgs require_seed_args(const kpool_tensor *tail_kv_cache, const kpool_tensor *key_, const kpool_tensor *gate_score_,
                           const kpool_tensor *tslot_, int32_t pool_size, const char *tslot_name) {
    require_pool_size(pool_size);
    TensorArg tail = require_tail(tail_kv_cache, pool_size);
    TensorArg key = require_tensor("key", key_, {KPOOL_DTYPE_BFLOAT16}, 2);
    require_dim(key, 1, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(key);
    TensorArg gate = require_tensor("gate_score", gate_score_, {KPOOL_DTYPE_BFLOAT16}, 2);
    require_same_dim(gate, 0, key, 0);
    require_same_dim(gate, 1, key, 1);
    require_inner_contiguous(gate);
    TensorArg tslot = require_tensor(tslot_name, tslot_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 1);
    require_same_dim(tslot, 0, key, 0);
    require_int32_strides(tslot);
    return {tail, key, gate, tslot};
}

void run_seed(const Placement &where, const SeedArgs &a, int32_t pool_size, kpool_index_arg index_word,
              const char *op) {
    if (where.on_host()) {
        require_tslots_in_tail(a.tslot, a.tail);
    }
    mark_index_errors(where, index_word, a.tslot, tail_slot_count(a.tail), nullptr);
    if (a.key.dim(0) == 0 || a.tail.numel() == 0) {
        return;  // nothing to seed, or no block to seed into (every tslot is a sentinel)
    }
    HalideBuffer k = wrap(a.key), g = wrap(a.gate), ts = wrap(a.tslot), t = wrap_tail(a.tail);
    where.launch<Kernel::SEED_TAIL>(op, 0, index_type(a.tslot), where.attach(k).raw_buffer(),
                                    where.attach(g).raw_buffer(), where.attach(ts).raw_buffer(), int32_t(pool_size),
                                    where.attach(t).raw_buffer());
}

void seed_tail_cache(const kpool_tensor *tail_kv_cache_, const kpool_tensor *key_, const kpool_tensor *gate_score_,
                     const kpool_tensor *tslot_, int32_t pool_size, int32_t head_dim, const kpool_exec *exec) {
    require_head_dim(head_dim);
    const SeedArgs a = require_seed_args(tail_kv_cache_, key_, gate_score_, tslot_, pool_size, "tslot");
    Placement where(a.all(), exec);
    run_seed(where, a, pool_size, KPOOL_INDEX_TSLOT, "kpool_seed_tail_cache");
}

}  // namespace kpool::rt
