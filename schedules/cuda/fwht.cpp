// The fwht kernels' schedule: a query row in the lanes of a warp
// (fwht.values elements a lane, runs of fwht.run consecutive elements),
// fwht.row_threads / lanes rows a block, the rows in grid x. The rotation and
// the absmax never leave the row's registers and shuffles.
#include "cuda.h"
#include "plan.h"
#include "warp_helpers.h"

namespace kpool::cuda {

// The words kernel loads a lane's runs itself (lane_pairs, per lane, inside
// the lane loop of the rotation's input): each run of 8 bf16 is 4 words at a
// 16-byte-aligned index, which Halide's PTX backend emits as one 128-bit
// load (ld.global.v2.u64) when the index is known to be a multiple of 4
// words (the generator's stride constraint); its 8 codes are one 64-bit
// store. (A vector load of a Func striped over the lanes themselves fails
// the warp shuffle pass: lane_pairs is the lane's own registers.) Its
// figures against the hand-written kernel: docs/measured/cuda_schedules.md.
void schedule_fwht(FwhtStages &s, const BuildPlan &build) {
    Var ri{"row_in_block"};
    rows_in_lanes(s.out, s.codes_per_word > 1 ? s.word : s.d, s.row, s.lane, s.layout,
                  plan_for(build).fwht_row_threads, ri, s.codes_per_word);
    compute_row_in_warp(s.rotate, s.v, s.lane, LoopLevel(s.out, ri));
    if (s.lane_pairs.defined()) {
        constexpr int kLoadWords = 4;  // 16 bytes of 32-bit words
        // (Runs of 16 and more are more than one load: unrolled, as
        // compress's lane items are, not a stack array of 4-byte alignment
        // stored as 16-byte vectors.)
        s.lane_pairs.compute_at(s.rotate.rotation.stages[0], s.lane)
            .store_in(MemoryType::Register)
            .vectorize(s.pair, kLoadWords)
            .unroll(s.pair)
            .unroll(s.run_index);
    }
}

}  // namespace kpool::cuda
