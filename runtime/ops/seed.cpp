// seed_tail_cache: each request's last P prefill tokens (keys and gate
// scores) into its block of the tail ring.
#include "ops.h"

namespace kpool::rt {

void seed_tail_cache(const kpool_tensor *tail_kv_cache_, const kpool_tensor *key_, const kpool_tensor *gate_score_,
                     const kpool_tensor *tslot_, int32_t pool_size, int32_t head_dim, const kpool_exec *exec) {
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
        return;  // nothing to seed, or no block to seed into (every tslot is a sentinel)
    }
    HalideBuffer k = wrap(key), g = wrap(gate), ts = wrap(tslot), t = wrap_tail(tail);
    where.launch<Kernel::SEED_TAIL>("kpool_seed_tail_cache", 0, index_type(tslot), where.attach(k).raw_buffer(),
                                    where.attach(g).raw_buffer(), where.attach(ts).raw_buffer(), int32_t(pool_size),
                                    where.attach(t).raw_buffer());
}

}  // namespace kpool::rt
