// The index-only kernels' schedules: expand (selected pools to token ids)
// and the index check (the device's marks of out-of-range indices).
#include "cuda.h"
#include "plan.h"
#include "warp_helpers.h"

namespace kpool::cuda {

// Rows in grid x (a prefill's rows pass grid y's 65535), column blocks in
// y; each thread writes 4 consecutive int32 (16 bytes). Specialized for the
// engines' pool sizes: the column's pool and offset by constant shifts.
void schedule_expand(ExpandStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    const int cols = s.kind == ExpandStages::Kind::PoolsAndAppendTail ? plan.expand_and_append_cols : plan.expand_cols;
    Var cb{"col_block"}, ci{"col_in_block"}, ct{"col_thread"}, cv{"col_v"};
    s.out.split(s.col, cb, ci, cols, TailStrategy::GuardWithIf)
        .split(ci, ct, cv, 4, TailStrategy::GuardWithIf)
        .reorder(cv, ct, s.row, cb)
        .gpu_blocks(s.row, cb)
        .gpu_threads(ct)
        .vectorize(cv);
    for (int P : {KPOOL_CUDA_POOL_SIZE_LIST}) {  // the pool sizes with CUDA compress variants (CMakeLists.txt)
        s.out.specialize(s.pool_size == P);
    }
}
// One thread per entry, blocks of 256 over the flattened entries in grid x:
// the writers all store the same word (the algorithm), so they race freely.
void schedule_index_check(IndexCheckStages &s, const BuildPlan &) {
    RVar entry{"entry"}, block{"entry_block"}, thread{"entry_thread"};
    pure_stage_on_gpu(s.mark);
    s.mark.update(0)
        .allow_race_conditions()
        .fuse(s.entry.x, s.entry.y, entry)
        .split(entry, block, thread, 256, TailStrategy::GuardWithIf)
        .gpu_blocks(block)
        .gpu_threads(thread);
}

}  // namespace kpool::cuda
