// The tail seed's schedule (prefill: each request's last P tokens into its
// ring): blocks of 32 groups of seed.warps_per_block tokens, a warp per
// member of a group (seed_group_size, the generator's G).
#include "cuda.h"
#include "plan.h"
#include "warp_helpers.h"

namespace kpool::cuda {

int seed_group_size(const BuildPlan &build) { return plan_for(build).seed_warps_per_block; }

// Most prefill tokens are not seeded: one thread per token of a block of
// 32 token groups decides whether it is (64-bit divisions by the ring), into
// shared memory; then warp w copies member w of each group that is seeded,
// so a request's last P tokens (consecutive) spread over the warps; each lane
// moves 4 consecutive bf16 (8 bytes) of each half. (Every lane deciding
// for its token costs the divisions 32 times over: docs/measured.)
void schedule_seed_tail(SeedTailStages &s, const BuildPlan &build) {
    RVar lane{"copy_lane"}, v{"copy_v"}, gb{"group_block"}, gi{"group_in_block"};
    RVar member = s.copy.z, group = s.copy[3];
    pure_stage_on_gpu(s.tail);
    s.tail.update(0)
        .allow_race_conditions()
        .split(s.copy.x, lane, v, kValuesPerLane)
        .split(group, gb, gi, kWarpSize, TailStrategy::GuardWithIf)
        .reorder(v, lane, s.copy.y, member, gi, gb)
        .gpu_blocks(gb)
        .gpu_threads(lane, member)
        .unroll(s.copy.y)
        .vectorize(v);
    Var ta{"seeded_warp"}, tl{"seeded_lane"};
    s.seeded.compute_at(s.tail, gb).split(s.token, ta, tl, kWarpSize).gpu_threads(tl, ta);
}

}  // namespace kpool::cuda
