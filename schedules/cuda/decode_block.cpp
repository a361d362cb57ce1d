// Decode a block per request, a completion over four warps (the Triton
// reference's shape): each of the block's 128 threads owns one dim of the
// pooled row (d = warp * 32 + lane), and a completing token runs in three
// steps, each ending in a block barrier:
//   1. each thread pools its dim (the softmax and weighted sum over the P
//      members, in registers), rounds it to bf16, and each warp runs the
//      Hadamard's strides 1 to 16 over its 32 dims in lane shuffles; the
//      row after stride 16 goes to shared memory;
//   2. each thread finishes the rotation of its dim from shared memory
//      (strides 32 and 64 pair warps: the four values of its lane, one in
//      each warp's part of the row), rounds it to bf16, and each warp folds
//      its 32 absolute values in lane shuffles; each warp's maximum goes to
//      shared memory;
//   3. each thread takes the maximum of the four warps' maxima, the ue8m0
//      scale, finishes its dim again (step 2's few instructions, rather
//      than a store and a barrier more) and writes its e4m3 code and the
//      row's scale.
// Every warp works at every step. The f32 operations are the contract's in
// its order (the algorithm's; the layout changes where each runs, not what
// it computes). A token that completes nothing skips all three steps and
// their barriers (Halide's skip conditions, gathered by
// BlockUniformBarriers, block_barriers.h).
#include "decode_block.h"
#include "warp_helpers.h"

#include <string>

namespace kpool::cuda {

using namespace Halide;

namespace {

constexpr int kWarpLanes = 32;

// A lane stage of a warp's part of the row (v, lane, rows...), computed at
// the warp loop of the step that consumes it: each lane's value in a
// register, other lanes' through shuffles. Bounds inference keeps it to
// its warp: the warp loop fixes v.
void in_warp_lanes(Func f, const Var &v, const Var &lane, const LoopLevel &warp_loop) {
    f.compute_at(warp_loop).gpu_lanes(lane).unroll(v).store_in(MemoryType::Register);
}

// A step's result over (v, lane, rows...) in shared memory, at the token
// loop: a thread per (warp v, lane).
void in_block_shared(Func f, const Var &v, const Var &lane, const LoopLevel &token_loop) {
    f.compute_at(token_loop).store_in(MemoryType::GPUShared).reorder(lane, v).gpu_threads(v).gpu_lanes(lane);
}

// Step 1's pool: a thread's dim, its slot folds in registers.
void pool_one_dim_a_thread(DecodeWriteStages &w, const BlockSlotFolds &folds, const LoopLevel &warp_loop) {
    CompressPool &c = w.compress;
    Var dw{"d_warp"}, dl{"d_lane"};
    // The warp's 32 dims (v * 32 .. v * 32 + 31), a lane each.
    c.pooled_bf16.compute_at(warp_loop)
        .split(w.d, dw, dl, kWarpLanes)
        .gpu_lanes(dl)
        .unroll(dw)
        .store_in(MemoryType::Register);
    SoftmaxPool &p = c.pool;
    p.max_logit.compute_at(c.pooled_bf16, dl).store_in(MemoryType::Register);
    p.weighted_sum.compute_at(c.pooled_bf16, dl).store_in(MemoryType::Register);
    p.weight.store_in(MemoryType::Register);
    unrolled_folds(p, folds.unrolled_slots, folds.slot_group);
    // The walk over the request's earlier tokens (whose stash holds each
    // member), each earlier token read once for all P members.
    w.ring_writer.compute_at(c.pooled_bf16, dl).unroll(w.j);
    w.ring_writer.update(0).reorder(w.j, w.earlier).unroll(w.j);
}

}  // namespace

RowLayout block_row_layout() {
    RowLayout layout{kBlockWarps, /*partner_by_index=*/true, /*run=*/1};
    layout.values_are_warps = true;
    return layout;
}

Stage schedule_block_completions(DecodeWriteStages &w, const BlockSlotFolds &folds) {
    const RowLayout &layout = w.layout;
    if (!layout.values_are_warps || layout.run != 1 || layout.lanes() != kWarpLanes ||
        layout.values_per_lane != kBlockWarps) {
        throw CompileError("decode's block-per-request schedule takes block_row_layout(): " +
                           std::to_string(kBlockWarps) + " warps of " + std::to_string(kWarpLanes) + " lanes");
    }
    RVar lane{"write_lane"}, warp{"write_warp"}, request_block{"request_block"}, request{"request"};
    const RVar token = w.write.y;
    w.cache.gpu_single_thread();  // the in-place output's undef pure stage, on the GPU
    Stage completions = w.cache.update(0);
    // Duplicate slots are the caller's race, as in the reference (docs/).
    completions.allow_race_conditions()
        .split(w.write.x, warp, lane, kWarpLanes)
        .split(w.write.z, request_block, request, 1, TailStrategy::GuardWithIf)
        .reorder(lane, warp, token, request, request_block)
        .gpu_blocks(request_block)
        .gpu_threads(warp)
        .gpu_lanes(lane);
    const LoopLevel token_loop(w.cache, token);
    const Var &v = w.v, &l = w.lane;
    RotateQuant &r = w.compress.rotate;
    const std::vector<Func> &h = r.rotation.stages;  // h[k]: after stride 2^(k-1)
    constexpr int kInWarpStages = 6;                 // the input and strides 1-16: a warp's 32 dims
    static_assert(1 << (kInWarpStages - 2) == kWarpLanes / 2, "strides up to 16 pair a warp's own lanes");

    // Step 1: the row after stride 16 in shared memory.
    Func after_warp_strides = h[kInWarpStages - 1];
    in_block_shared(after_warp_strides, v, l, token_loop);
    const LoopLevel step1_warp(after_warp_strides, v);
    for (int k = 0; k < kInWarpStages - 1; ++k) {
        in_warp_lanes(h[k], v, l, step1_warp);
    }
    pool_one_dim_a_thread(w, folds, step1_warp);

    // Step 2: each warp's absmax in shared memory. Strides 32 and 64, the
    // normalization and the bf16 rounding stay inline: a thread reads the
    // four values of its lane from step 1's row, in step 2 and again in
    // step 3.
    const std::vector<Func> &absmax = r.quant.absmax_stages;
    Func warp_absmax = absmax.back();
    in_block_shared(warp_absmax, v, l, token_loop);
    const LoopLevel step2_warp(warp_absmax, v);
    in_warp_lanes(r.quant.lane_absmax, v, l, step2_warp);
    for (size_t k = 0; k + 1 < absmax.size(); ++k) {
        in_warp_lanes(absmax[k], v, l, step2_warp);
    }
    // Step 3 is the write itself: the scale (lane_fp8_scale, inline) reads
    // the four warps' maxima.
    return completions;
}

}  // namespace kpool::cuda
