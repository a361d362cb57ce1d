// The decode kernels' schedules: each completion (a token that fills its
// pool) compressed as compress does, and each token stashed in its
// request's ring, requests in grid x. A decode call is latency-bound and
// small: the choices below favour loads in flight together over
// instructions.
#include "block_barriers.h"
#include "cuda.h"
#include "decode_block.h"
#include "plan.h"
#include "unconditional_producers.h"
#include "warp_helpers.h"

#include <algorithm>
#include <vector>

namespace kpool::cuda {

namespace {

// Up to this many members a completion's ring walk keeps its P writers in
// registers (unrolled); past it (pools of 32 and 64) in shared memory, each
// thread its own P words, a loop over the members: unrolled in registers
// they spilled (sm_90, ptxas --maxrregcount 128: a warp per token P=32
// 8-272 B, P=64 650-830 B; a warp per request P=64 190-380 B); in shared
// memory, none. At most kRingWalkSharedBytes a block (the rest of the 48
// KiB a launch may ask is the kernel's other shared stages': the pooled
// row, the index table); a block of more threads than that allows (the
// knobs' decode.tokens_per_block 8 at P = 64: 64 KiB) keeps the registers.
constexpr int kRingWalkRegisterMembers = 16;
constexpr int64_t kRingWalkSharedBytes = 32 * 1024;

// The walk over earlier tokens (ring_writer) at `at`, each earlier token
// read once for all P members, in a block of `block_threads`.
void compute_ring_walk_at(DecodeWriteStages &s, LoopLevel at, int block_threads) {
    s.ring_writer.compute_at(at);
    s.ring_writer.update(0).reorder(s.j, s.earlier);
    const int P = pool_size_of(s.compress.pool);
    const int64_t shared_bytes = int64_t(P) * s.ring_writer.type().bytes() * block_threads;
    if (P > kRingWalkRegisterMembers && shared_bytes <= kRingWalkSharedBytes) {
        s.ring_writer.store_in(MemoryType::GPUShared);
        return;
    }
    s.ring_writer.unroll(s.j);
    s.ring_writer.update(0).unroll(s.j);
}

// A completion's pool, each element on a thread of its own: the exact
// arithmetic's pool is the longest chain of a completion (P slots of loads
// and f64 exps per element), so every element of it is a thread (128, a
// warp per 32 elements), pooling into shared memory; then the token's lanes
// (a warp at V = 4) rotate and quantize the row as in compress. Halide skips
// both for a token whose write condition is false: a token that completes
// nothing reads its indices and passes the block barriers in its way (one,
// under BlockUniformBarriers). The slot folds are unrolled whole up to
// decode_unrolled_exact_slots, past it in unrolled groups of
// decode_exact_slot_group (P=16 in fours: 4 + 4 rounds of member loads,
// where slot loops took 15 + 16).
void pool_per_element(DecodeWriteStages &s, const CudaPlan &plan, const RVar &token) {
    CompressPool &c = s.compress;
    Var dw{"d_warp"}, dl{"d_lane"}, warp{"pool_warp"};
    c.pooled_bf16.compute_at(s.cache, token)
        .store_in(MemoryType::GPUShared)
        .split(s.d, dw, dl, kWarpSize)
        .fuse(dw, s.token, warp)
        .gpu_threads(dl, warp);
    SoftmaxPool &p = c.pool;
    p.max_logit.compute_at(c.pooled_bf16, dl).store_in(MemoryType::Register);
    p.weighted_sum.compute_at(c.pooled_bf16, dl).store_in(MemoryType::Register);
    unrolled_folds(p, plan.decode_unrolled_exact_slots, plan.decode_exact_slot_group);
    p.weight.store_in(MemoryType::Register);
    // (The block: the pool's 128 threads, or the stashes' warps.)
    compute_ring_walk_at(s, LoopLevel(c.pooled_bf16, dl),
                         std::max(kHeadDim, kWarpSize * plan.decode_tokens_per_block));
    compute_row_in_warp(c.rotate, s.v, s.lane, LoopLevel(s.cache, token));
}

// A completion's pool in its token's lanes (a warp at V = 4), each lane
// pooling its V elements, slot folds unrolled where registers allow (a
// decode call is latency-bound: every member's loads in flight at once).
void pool_in_lanes(DecodeWriteStages &s, const CudaPlan &plan, const RVar &token, bool vector_values,
                   int block_threads) {
    if (s.ring_writer.defined()) {
        compute_ring_walk_at(s, LoopLevel(s.compress.pooled_bf16, s.lane), block_threads);
    }
    SoftmaxPool &p = s.compress.pool;
    const bool triton = p.arithmetic == Arithmetic::Triton;
    const int unrolled = !vector_values ? plan.decode_token_unrolled_slots
                         : triton       ? plan.decode_lane_unrolled_slots
                                        : plan.decode_lane_unrolled_exact_slots;
    const int group = vector_values && triton ? plan.decode_lane_slot_group : unrolled;
    const bool unroll_slots = pool_size_of(s.compress.pool) <= unrolled;
    compute_pool_in_warp(s.compress, s.layout, s.d, s.v, s.lane, LoopLevel(s.cache, token), unroll_slots,
                         vector_values);
    if (!vector_values) {
        return;  // element by element (any strides): past `unrolled`, slot loops
    }
    if (unroll_slots && triton) {
        // Every member's loads first, all in flight at once: each slot's
        // logits (its score member + ape, 8 + 16 bytes a lane) and its key
        // member (8 bytes), in the lane's registers for both folds. (The
        // exact arithmetic's exps need those registers: there the loads
        // stay inside the unrolled folds.)
        for (Func f : {p.logit, s.member_key_bits}) {
            f.compute_at(s.compress.pooled_bf16, s.lane).store_in(MemoryType::Register).unroll(s.j).vectorize(s.d);
        }
    } else if (!unroll_slots) {
        folds_in_groups(p, group);
    }
}

// The lowering pass of block_barriers.h, on the generator's pipeline.
void add_block_uniform_barriers(DecodeWriteStages &s, const CudaPlan &plan) {
    if (!s.pipeline.defined()) {
        throw CompileError("decode's CUDA schedule adds a lowering pass: the generator sets "
                           "DecodeWriteStages::pipeline (get_pipeline()) before scheduling");
    }
    s.pipeline.add_custom_lowering_pass(new BlockUniformBarriers(plan.decode_drop_private_barriers));
}

// The completions of a decode kernel, in either layout: requests in grid x
// (RVar "request_block", where the stashes fuse), their pools in the lanes
// of a warp (or, exact arithmetic per token, an element per thread).
Stage schedule_completions(DecodeWriteStages &w, const CudaPlan &plan, bool per_request, bool aligned_rows) {
    const bool per_element =
        !per_request && plan.decode_exact_pool_per_element && w.compress.pool.arithmetic == Arithmetic::Exact;
    const int requests = plan.decode_block_requests(per_request);
    RVar lane{"write_lane"}, v{"write_v"}, chunk{"token_chunk"}, token{"write_token"};
    RVar request_block{"request_block"}, request{"request"};
    pure_stage_on_gpu(w.cache);
    Stage completions = w.cache.update(0);
    completions.allow_race_conditions()
        .split(w.write.x, lane, v, w.layout.values_per_lane)
        .split(w.write.z, request_block, request, requests, TailStrategy::GuardWithIf);
    if (per_request) {
        completions.reorder(v, lane, w.write.y, request, request_block)
            .gpu_blocks(request_block)
            .gpu_threads(request)
            .gpu_lanes(lane);
        if (aligned_rows) {
            completions.vectorize(v);  // a lane's 4 codes: one 4-byte store
        } else {
            completions.unroll(v);
        }
        pool_in_lanes(w, plan, w.write.y, aligned_rows, w.layout.lanes() * requests);
    } else {
        completions
            .split(w.write.y, chunk, token, per_element ? 1 : plan.decode_tokens_per_block, TailStrategy::GuardWithIf)
            .reorder(v, lane, token, chunk, request, request_block)
            .gpu_blocks(request_block)
            .gpu_lanes(lane)
            .unroll(v);
        if (per_element) {
            pool_per_element(w, plan, token);
        } else {
            completions.gpu_threads(token);
            pool_in_lanes(w, plan, token, false, w.layout.lanes() * plan.decode_tokens_per_block);
        }
    }
    return completions;
}

}  // namespace

// Completions only: a K cache past the kernels' 32-bit offsets is launched
// in windows of pages (runtime/ops/decode.cpp), each window's completions a
// launch of this kernel, then the stashes once (kpool_decode_stash_tail):
// the warp-per-token layout's completions.
void schedule_decode_write(DecodeWriteStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    schedule_completions(s, plan, false, false).specialize(s.pow2_ring_and_page);
    add_block_uniform_barriers(s, plan);
}

// CUDA runs decode as one kernel, kpool_decode_update, except where the K
// cache is launched in windows: then as the CPU does, completions
// (kpool_decode_write_cache, a launch per window) and stashes.
//
// One launch per decode call, in one of two layouts (DecodeLayout; the
// runtime picks per call, runtime/ops/decode.cpp):
// - WarpPerToken: a block per request. First its completions: in the exact
//   arithmetic the tokens in a serial loop, each completion's pool an
//   element per thread (pool_per_element); in the triton arithmetic, whose
//   pool is short, a warp per token, decode_tokens_per_block tokens at a
//   time (pool_in_lanes). Then, after the block barrier that Halide puts
//   between the two loop nests, the stashes: a warp per token. Halide puts
//   a barrier after every block-level stage of the token loop, inside each
//   stage's skip condition, so every token would pass them all, completing
//   or not; BlockUniformBarriers (block_barriers.h) lifts the token's
//   block-uniform condition over them, so a token that completes nothing
//   passes one (the iteration's last), and with
//   decode_drop_private_barriers drops those between stages in their
//   threads' own memory (the budgets' `loop_barriers` hold the counts).
//   Each stash lane moves 4 bf16 of both halves; a token that a later one
//   overwrites stashes nothing (the algorithm), so stashes need no order.
//   The completions read the ring as it was before the call (the
//   algorithm's ring_writer), so nothing a stash writes is read after it.
//   Fused at the block loop (compute_with, both RDoms named alike).
// - WarpPerRequest: decode_requests_per_block requests per block, a warp
//   each, walking its tokens in order as the reference does (no barrier, no
//   shared memory): per token its indices and stash row, its stash, then
//   its completion, if any, pooled in the lanes. The two are fused at the
//   token (compute_with, the stash first: it writes the one ring slot its
//   token's completion takes from the token's own input), each lane storing
//   and loading the same 4 elements of every row, so a completion reads the
//   ring as the call's earlier tokens stashed it (the generator's
//   ring_in_order: no walk over earlier tokens, a member is the ring's or
//   the token's own). Completions are rare (one token in P): with few tokens
//   per request, a block per request leaves most of its warps idle.
// Specialized on a power-of-two ring and cache page (one kernel each way,
// the runtime's launch picks): shifts and masks, no integer division.
// The figures behind these choices: docs/measured/cuda_schedules.md.
void schedule_decode_update(DecodeUpdateStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    DecodeWriteStages &w = s.write;
    DecodeStashStages &st = s.stashes;
    const bool per_request = s.layout == DecodeLayout::WarpPerRequest;
    const bool per_block = s.layout == DecodeLayout::BlockPerRequest;
    const int requests = plan.decode_block_requests(per_request);
    RVar request_block{"request_block"};
    const bool exact = w.compress.pool.arithmetic == Arithmetic::Exact;
    Stage completions =
        per_block ? schedule_block_completions(
                        w, exact ? BlockSlotFolds{plan.decode_unrolled_exact_slots, plan.decode_exact_slot_group}
                                 : BlockSlotFolds{plan.decode_block_unrolled_slots, plan.decode_block_unrolled_slots})
                  : schedule_completions(w, plan, per_request, s.aligned_rows);
    // A block per request stashes a token a warp (the completions' threads).
    const int stash_tokens = per_block ? kBlockWarps : plan.decode_tokens_per_block;
    RVar stash_lane{"stash_lane"}, stash_v{"stash_v"}, stash_chunk{"stash_chunk"}, stash_token{"stash_token"};
    // (Fused at the token, a warp per request's loops outside it are named as the completions'.)
    RVar stash_request{per_request ? "request" : "stash_request"};
    pure_stage_on_gpu(st.tail);
    Stage stashes = st.tail.update(0);
    stashes.allow_race_conditions()
        .split(st.stash.x, stash_lane, stash_v, kValuesPerLane)
        .split(st.stash.z, request_block, stash_request, requests, TailStrategy::GuardWithIf);
    if (per_request) {
        // The warp's loop over its tokens, in order, each lane storing the
        // 4 elements of both halves its completions load: a later token's
        // stash into the same slot lands last (the stash is defined without
        // `overwritten`), and the completions (fused below) read what the
        // earlier ones stashed. The row in registers, loaded ahead of the
        // stash's condition (UnconditionalProducers, below): a token's
        // indices and row in one round of loads.
        stashes.reorder(stash_v, st.stash[3], stash_lane, st.stash.y, stash_request, request_block)
            .gpu_threads(stash_request)
            .gpu_lanes(stash_lane);
        const std::vector<Var> row = st.stash_row.args();  // (d, half, token, request)
        Var row_lane{"stash_row_lane"}, row_v{"stash_row_v"};
        st.stash_row.compute_at(st.tail, st.stash.y)
            .store_in(MemoryType::Register)
            .split(row[0], row_lane, row_v, kValuesPerLane)
            .gpu_lanes(row_lane)
            .vectorize(row_v)
            .unroll(row[1]);
    } else {
        stashes
            .split(st.stash.y, stash_chunk, stash_token, stash_tokens, TailStrategy::GuardWithIf)
            .reorder(stash_v, st.stash[3], stash_lane, stash_token, stash_chunk, stash_request, request_block)
            .gpu_threads(stash_lane, stash_token);
        st.overwritten.compute_at(st.tail, stash_lane);  // each thread its token's
    }
    stashes.gpu_blocks(request_block).unroll(st.stash[3]).vectorize(stash_v);
    // A token's stages run under their shared skip condition, barriers
    // included, and no barrier between stages that share no memory across
    // threads (schedules/block_barriers.h): Halide puts one between every two.
    add_block_uniform_barriers(w, plan);
    if (per_request) {
        // Each token's completion after its stash, in the same iteration;
        // the stash, the parent, carries the specialization (Halide 21
        // fails to lower a fused child's specializations). The row's loads
        // are in bounds for every token (the generator clamps a token past
        // next_n, a request past the call's).
        completions.compute_with(stashes, st.stash.y);
        stashes.specialize(w.pow2_ring_and_page);
        w.pipeline.add_custom_lowering_pass(new UnconditionalProducers({st.stash_row.name()}));
    } else {
        stashes.compute_with(completions, request_block);
        completions.specialize(w.pow2_ring_and_page);
    }
}

// Every token of a request's block of tokens is a warp, each lane moving 4
// bf16 of both halves (unrolled: each half reads only its own input): a
// token that a later one overwrites stashes nothing (the algorithm), so
// tokens need no order.
void schedule_decode_stash(DecodeStashStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    RVar lane{"stash_lane"}, v{"stash_v"}, tb{"stash_token_block"}, ti{"stash_token"}, block{"stash_request_tokens"};
    pure_stage_on_gpu(s.tail);
    s.tail.update(0)
        .allow_race_conditions()
        .split(s.stash.x, lane, v, kValuesPerLane)
        .split(s.stash.y, tb, ti, plan.decode_tokens_per_block, TailStrategy::GuardWithIf)
        .reorder(v, s.stash[3], lane, ti, tb, s.stash.z)
        .fuse(tb, s.stash.z, block)
        .gpu_blocks(block)
        .gpu_threads(lane, ti)
        .unroll(s.stash[3])
        .vectorize(v)
        .specialize(s.ring_is_pow2);
    s.overwritten.compute_at(s.tail, lane);  // each thread its token's
}

}  // namespace kpool::cuda
