// The ops, one function each: validate every argument, wrap the caller's
// memory, run the kernel variant for the tensors' device. Arguments are the
// C API's (kpool.h documents them); a failure throws a StatusError, and
// nothing is written before validation has passed. The C entry points
// (kpool_api.cpp) and the CUDA warm-up call these.
#pragma once

#include <cstdint>
#include <vector>

#include "kpool/kpool.h"
// The op functions, one per C entry point of the op table (ops/*.toml;
// kpool.h documents their arguments, runtime/ops/<op>.cpp and warm_up.cpp
// define them).
#include "kpool_op_functions.h"
#include "placement.h"

namespace kpool::rt {

// seed.cpp: the seed's validated arguments, and its launch (the tail slots
// named `tslot_name`, marked in `index_word`), for the ops that seed as part
// of their call.
struct SeedArgs {
    TensorArg tail, key, gate, tslot;
    std::vector<const TensorArg *> all() const { return {&tail, &key, &gate, &tslot}; }
};
SeedArgs require_seed_args(const kpool_tensor *tail_kv_cache, const kpool_tensor *key, const kpool_tensor *gate_score,
                           const kpool_tensor *tslot, int32_t pool_size, const char *tslot_name);
void run_seed(const Placement &where, const SeedArgs &args, int32_t pool_size, kpool_index_arg index_word,
              const char *op);

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
