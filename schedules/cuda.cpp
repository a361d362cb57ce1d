// CUDA schedules. A row (fwht row, pool, decode token) is one warp: 32 lanes
// x 4 consecutive elements, so the Hadamard's strides 1 and 2 stay in a
// thread's registers and strides 4..64 and the absmax are warp shuffles;
// nothing touches shared or heap memory, so every kernel is one launch and
// CUDA-graph capturable. Large dimensions (rows, pools, tokens) go to grid x.
#include "cuda.h"

#include <cstring>

namespace kpool::cuda {

using namespace Halide;

namespace {

// An in-place output's pure definition is undef: nothing runs, but placed on
// the GPU so Halide does not ask for a host pointer for it.
void pure_stage_on_gpu(Func out) {
    out.gpu_single_thread();
}

// Tuned parameters per GPU family: data, not code.
struct CudaPlan {
    const char *gpu;
    int rows_per_block;     // warps per block in the row kernels
    int seed_warps_per_block;  // seed: warps per block (32 tokens each)
    int decode_tokens_per_block;  // decode: tokens of a request per block (one warp each)
    int expand_cols;        // expand: output columns per thread block
};

// sm80: A100-class, not measured here. sm90: H100/H200; on an H200
// (docs/benchmarks.md, bench/run_on_gpu.sh, graph replay): fwht 1M rows
// 340 us (reference 285), compress 262144 pools P=4 644 us (357), P=16
// 1.96 ms (910), seed 262144 tokens 7.8 us (159), decode 512 x 4 tokens P=4
// 23 us (3.3), expand+tail 4096 rows 23.6 us (43).
constexpr CudaPlan kPlans[] = {
    {"sm80", 4, 8, 4, 256},
    {"sm90", 4, 8, 4, 256},
};

const CudaPlan &plan_for(const BuildPlan &build) {
    for (const CudaPlan &p : kPlans) {
        if (build.gpu == p.gpu) {
            return p;
        }
    }
    throw CompileError("no CUDA plan for gpu=" + build.gpu + " (known: sm80, sm90)");
}

constexpr int kValuesPerLane = 4;
constexpr int kWarpSize = 32;

// A per-row Func over (v, lane, rows...): one warp's registers.
void in_warp_registers(Func f, const Var &v, const Var &lane, LoopLevel at) {
    f.compute_at(at).gpu_lanes(lane).unroll(v).store_in(MemoryType::Register);
}

void in_warp_registers(Func f, const Var &lane, LoopLevel at) {
    f.compute_at(at).gpu_lanes(lane).store_in(MemoryType::Register);
}

void compute_row_in_warp(RotateQuant &r, const Var &v, const Var &lane, LoopLevel at) {
    for (Func &stage : r.rotation.stages) {
        in_warp_registers(stage, v, lane, at);
    }
    in_warp_registers(r.rotation.output, v, lane, at);
    in_warp_registers(r.rotated, v, lane, at);
    in_warp_registers(r.quant.lane_absmax, lane, at);
    for (Func &stage : r.quant.absmax_stages) {
        in_warp_registers(stage, lane, at);
    }
    in_warp_registers(r.quant.lane_scale, lane, at);
}

// A (codes, scale) output over (d, row): rows_per_block warps per block,
// one row per warp, each lane storing its 4 elements.
void rows_as_warps(Func out, const Var &d, const Var &row, const Var &v, const Var &lane, const CudaPlan &plan,
                   Var &row_in_block) {
    Var rb{"row_block"};
    out.split(d, lane, v, kValuesPerLane)
        .split(row, rb, row_in_block, plan.rows_per_block, TailStrategy::GuardWithIf)
        .reorder(v, lane, row_in_block, rb)
        .gpu_blocks(rb)
        .gpu_threads(row_in_block)
        .gpu_lanes(lane)
        .unroll(v);
}

}  // namespace

RowLayout row_layout() { return RowLayout{kValuesPerLane, /*partner_by_index=*/true}; }

void schedule_fwht(FwhtStages &s, const BuildPlan &build) {
    Var ri{"row_in_block"};
    rows_as_warps(s.out, s.d, s.row, s.v, s.lane, plan_for(build), ri);
    compute_row_in_warp(s.rotate, s.v, s.lane, LoopLevel(s.out, ri));
}

// The softmax pool is elementwise in d: each lane pools its own 4 elements
// into the pooled row that feeds the Hadamard input in registers. In the
// exact arithmetic the two folds over the slots stay loops (the 4 elements
// unrolled inside): fully unrolled, P x 4 exps, each with its branch to the
// exact path, overflow the instruction cache at P = 16 (H200, ncu: most
// stalls were instruction fetch, compress of 262144 pools of 16 took 5.2 ms;
// 2.1 ms as loops). The triton arithmetic's exp is one instruction: unrolled,
// every slot's loads are in flight at once.
void compute_pool_in_warp(CompressPool &c, const Var &d, const Var &v, const Var &lane, LoopLevel at) {
    c.pooled_bf16.compute_at(at)
        .split(d, lane, v, kValuesPerLane)
        .gpu_lanes(lane)
        .unroll(v)
        .store_in(MemoryType::Register);
    SoftmaxPool &p = c.pool;
    p.max_logit.compute_at(c.pooled_bf16, lane).unroll(d).store_in(MemoryType::Register);
    const bool unroll_slots = p.arithmetic == Arithmetic::Triton;
    if (p.max_logit.has_update_definition()) {
        p.max_logit.update(0).reorder(d, p.later_slot).unroll(d);
        if (unroll_slots) {
            p.max_logit.update(0).unroll(p.later_slot);
        }
    }
    p.weighted_sum.compute_at(c.pooled_bf16, lane).unroll(d).store_in(MemoryType::Register);
    p.weighted_sum.update(0).reorder(d, p.slot).unroll(d);
    if (unroll_slots) {
        p.weighted_sum.update(0).unroll(p.slot);
    }
    // Both sums use the slot's weight: computed once per slot, not inlined
    // into each (an exp's branch is not merged by common-subexpression passes).
    p.weight.compute_at(p.weighted_sum, p.slot).unroll(d).store_in(MemoryType::Register);
    compute_row_in_warp(c.rotate, v, lane, at);
}

void schedule_compress_to_cache(CompressToCacheStages &s, const BuildPlan &build) {
    const CudaPlan &plan = plan_for(build);
    RVar lane{"write_lane"}, v{"write_v"}, pb{"pool_block"}, pi{"pool_in_block"};
    pure_stage_on_gpu(s.cache);
    // Duplicate locs are the caller's race, as in the reference (docs/).
    s.cache.update(0)
        .allow_race_conditions()
        .split(s.write.x, lane, v, kValuesPerLane)
        .split(s.write.y, pb, pi, plan.rows_per_block, TailStrategy::GuardWithIf)
        .reorder(v, lane, pi, pb)
        .gpu_blocks(pb)
        .gpu_threads(pi)
        .gpu_lanes(lane)
        .unroll(v);
    compute_pool_in_warp(s.compress, s.d, s.v, s.lane, LoopLevel(s.cache, pi));
}

void schedule_compress_to_rows(CompressToRowsStages &s, const BuildPlan &build) {
    Var pi{"pool_in_block"};
    rows_as_warps(s.out, s.d, s.pool, s.v, s.lane, plan_for(build), pi);
    compute_pool_in_warp(s.compress, s.d, s.v, s.lane, LoopLevel(s.out, pi));
}

int seed_group_size(const BuildPlan &build) { return plan_for(build).seed_warps_per_block; }

// Most prefill tokens are not seeded: one thread per token of a block of
// 32 token groups decides whether it is (64-bit divisions by the ring), into
// shared memory; then warp w copies member w of each group that is seeded,
// so a request's last P tokens (consecutive) spread over the warps; each lane
// moves 4 consecutive bf16 (8 bytes) of each half. H200, 262144 tokens:
// 9.6 us graph replay (one warp per token, every lane deciding: 36 us).
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

// One warp per token, a few tokens of one request per block (all next_n of
// them would not launch past ~16 tokens at this kernel's register count);
// completions read the ring as it was before the call (ring_writer), so
// tokens need no ordering here.
void schedule_decode_write(DecodeWriteStages &s, const BuildPlan &build) {
    const CudaPlan &plan = plan_for(build);
    RVar lane{"write_lane"}, v{"write_v"}, tb{"token_block"}, ti{"token_in_block"};
    RVar token = s.write.y, request = s.write.z;
    pure_stage_on_gpu(s.cache);
    s.cache.update(0)
        .allow_race_conditions()
        .split(s.write.x, lane, v, kValuesPerLane)
        .split(token, tb, ti, plan.decode_tokens_per_block, TailStrategy::GuardWithIf)
        .reorder(v, lane, ti, tb, request)
        .gpu_blocks(request, tb)
        .gpu_threads(ti)
        .gpu_lanes(lane)
        .unroll(v)
        .specialize(s.ring_is_pow2);  // the ring walk by shifts and masks
    s.ring_writer.compute_at(s.compress.pooled_bf16, s.lane).unroll(s.j);
    compute_pool_in_warp(s.compress, s.d, s.v, s.lane, LoopLevel(s.cache, ti));
}

// Every token of a request's block of tokens is a warp, each lane moving 4
// bf16 of both halves (unrolled: each half reads only its own input): a
// token that a later one overwrites stashes nothing (the algorithm), so
// tokens need no order.
void schedule_decode_stash(DecodeStashStages &s, const BuildPlan &build) {
    const CudaPlan &plan = plan_for(build);
    RVar lane{"stash_lane"}, v{"stash_v"}, tb{"stash_token_block"}, ti{"stash_token"};
    pure_stage_on_gpu(s.tail);
    s.tail.update(0)
        .allow_race_conditions()
        .split(s.stash.x, lane, v, kValuesPerLane)
        .split(s.stash.z, tb, ti, plan.decode_tokens_per_block, TailStrategy::GuardWithIf)
        .reorder(v, s.stash.y, lane, ti, tb, s.stash[3])
        .gpu_blocks(tb, s.stash[3])
        .gpu_threads(lane, ti)
        .unroll(s.stash.y)
        .vectorize(v)
        .specialize(s.ring_is_pow2);
    s.overwritten.compute_at(s.tail, lane);  // each thread its token's
}

// Rows in grid x; each thread writes 4 consecutive int32 (16 bytes).
void schedule_expand(ExpandStages &s, const BuildPlan &build) {
    const CudaPlan &plan = plan_for(build);
    Var cb{"col_block"}, ci{"col_in_block"}, ct{"col_thread"}, cv{"col_v"};
    s.out.split(s.col, cb, ci, plan.expand_cols, TailStrategy::GuardWithIf)
        .split(ci, ct, cv, 4, TailStrategy::GuardWithIf)
        .reorder(cv, ct, cb, s.row)
        .gpu_blocks(s.row, cb)
        .gpu_threads(ct)
        .vectorize(cv);
}

}  // namespace kpool::cuda
