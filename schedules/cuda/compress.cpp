// The compress kernels' schedule: a pool in the lanes of a warp (its
// values per lane by arithmetic and kernel: compress.*_values),
// compress.row_threads / lanes pools a block, the pools in grid x. Each
// lane pools its own elements (the softmax pool is elementwise in d), so
// the pooled row is in the registers the Hadamard reads, and the row's
// rotation and absmax are shuffles within its lanes.
#include "cuda.h"
#include "plan.h"
#include "warp_helpers.h"

#include <algorithm>
#include <string>

namespace kpool::cuda {

namespace {

// A lane's V consecutive logits (score + ape) of a slot computed together
// in the lane's own registers (a vector load of a Func striped over the
// lanes fails the warp shuffle pass): where the rows are aligned
// (CompressConditions::aligned) as vectors of 4, so 4 ape f32 are one 16-byte
// load (Halide's PTX backend loads 4 aligned 32-bit lanes as one 128-bit
// value); elsewhere element by element. With the slots unrolled, every
// slot's logits are computed once per lane for both folds, so each score is
// read once; with slot loops (the exact arithmetic), the sum's fold reads
// them anew (P x V logits do not fit the registers). bf16 keys and scores
// stay 2-byte loads: LLVM (VectorCombine) scalarizes a 4 x 16-bit vector
// load whose lanes are used one by one; only the 128-bit form survives.
void load_lane_logits(CompressPool &c, const CompressConditions &conditions, const Var &d, const Var &lane,
                      bool unroll_slots) {
    SoftmaxPool &p = c.pool;
    constexpr int kVectorLanes = 4;  // 16 bytes of f32
    Var di{"d_in_vector"};
    Func logits = unroll_slots ? p.logit : p.logit.in(p.weight);
    if (unroll_slots) {
        logits.compute_at(c.pooled_bf16, lane).unroll(p.logit.args()[1]);
    } else {
        logits.compute_at(p.weighted_sum, p.slot);
    }
    logits.store_in(MemoryType::Register).split(d, d, di, kVectorLanes).unroll(d);
    logits.specialize(conditions.aligned).vectorize(di);
    logits.unroll(di);
}

// Compress's pool unrolls at most this many slots (the triton arithmetic's
// whole pool, its exp one instruction; the words kernels' loads of every
// slot up front). Past it, P x V logits and their loads pass the 128
// registers (sm_90, P = 64 unrolled: 3.5-5.8 KB spilled a thread), so the
// larger pools of the contract (32, 64) loop over their slots: the element
// kernels slot by slot, as the exact arithmetic's do; the words kernels in
// groups of slots with their logits in shared memory (pool_words_in_warp).
constexpr int64_t kCompressUnrolledSlots = 16;

// The element kernels' pool (any strides): compute_pool_in_warp, its slot
// folds unrolled in the triton arithmetic only (compute_pool_in_warp says
// why) and up to kCompressUnrolledSlots, each lane's logits loaded as
// load_lane_logits places them.
void pool_elements_in_warp(CompressPool &c, const CompressConditions &conditions, const RowLayout &layout,
                           const Var &d, const Var &v, const Var &lane, LoopLevel at) {
    const bool unroll_slots =
        c.pool.arithmetic == Arithmetic::Triton && pool_size_of(c.pool) <= kCompressUnrolledSlots;
    compute_pool_in_warp(c, layout, d, v, lane, at, unroll_slots);
    load_lane_logits(c, conditions, d, lane, unroll_slots);
}

// One of a lane's item Funcs (key, score or ape) at `at`: its items of
// the slots there in registers, 4 items of 32 bits a load.
void lane_items_at(Func f, int items, LoopLevel at, const CompressLaneLoads &l, const Var &lane) {
    constexpr int kLoadItems = 4;  // 16 bytes of 32-bit items
    f.compute_at(at).store_in(MemoryType::Register);
    if (items > 1) {
        // Past one load, the loads unrolled too: a loop over them would keep
        // the items in a stack array, which Halide 21 declares 4-byte
        // aligned (.local .align 4) while storing them as 16-byte vectors
        // (st.local.v2.b64): a misaligned address on the GPU (values per
        // lane 8: ape's 8 f32 are two loads).
        f.vectorize(l.item, std::min(kLoadItems, items)).unroll(l.item);
    }
    for (const Var &arg : f.args()) {
        if (arg.name() != l.item.name() && arg.name() != lane.name()) {
            f.unroll(arg);
        }
    }
}

// The words kernels' loads: each lane's items of every slot (bf16 pairs as
// 32-bit words, or f32) in its own registers, 4 items of 32 bits per load
// (Halide's PTX backend emits a dense, 16-byte-aligned ramp of 4 as one
// 128-bit load; 2 as one 64-bit load), with the slots unrolled: every
// slot's keys, scores and ape are read once, all in flight together. The
// logits are then one add each, unrolled. (A 2-lane 32-bit vector load came
// out as two 4-byte loads: a lane's 4 bf16 are one uint64 item instead.)
void load_lane_items(CompressPool &c, CompressLaneLoads &l, const Var &lane) {
    Func pooled = c.pooled_bf16;
    for (auto [f, items] : {std::pair{l.key, l.key_items}, {l.score, l.score_items}, {l.ape, l.ape_items}}) {
        lane_items_at(f, items, LoopLevel(pooled, lane), l, lane);
    }
    SoftmaxPool &p = c.pool;
    p.logit.compute_at(pooled, lane).store_in(MemoryType::Register).unroll(p.logit.args()[0]).unroll(p.logit.args()[1]);
}

// Halide 21's CUDA runtime launches a kernel with its shared memory as the
// launch's dynamic size and never raises the function's limit on it
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), so a block asking for
// more than the default 48 KiB fails at cuLaunchKernel
// (CUDA_ERROR_INVALID_VALUE) on every GPU: such a plan is not built.
constexpr int64_t kMaxDynamicSharedBytes = 48 * 1024;

// The logits' shared memory: P slots x V values x a logit's bytes a thread,
// for every thread of the block.
void check_logits_fit_shared_memory(const SoftmaxPool &p, const RowLayout &layout, int64_t P, int block_threads,
                                    int unrolled_slots) {
    const int64_t bytes = P * layout.values_per_lane * p.logit.type().bytes() * block_threads;
    if (bytes > kMaxDynamicSharedBytes) {
        throw CompileError("compress's logits in shared memory (P = " + std::to_string(P) +
                           " past compress.exact_words_unrolled_slots = " + std::to_string(unrolled_slots) +
                           "): " + std::to_string(P) + " slots x " + std::to_string(layout.values_per_lane) +
                           " values (compress.exact_words_values) x " +
                           std::to_string(p.logit.type().bytes()) + " bytes x " +
                           std::to_string(block_threads) + " threads (compress.row_threads) = " +
                           std::to_string(bytes) + " bytes a block, over the " +
                           std::to_string(kMaxDynamicSharedBytes) + " a Halide kernel can launch with");
    }
}

// A words kernel's threads a block: compress.row_threads, but past
// kCompressUnrolledSlots slots (logits in shared memory, P x V f32 a
// thread) halved until a block's logits fit kMaxDynamicSharedBytes (one
// row at least: 128 x P f32, 32 KiB at P = 64), so the pools of 32 and 64
// build with every legal knob (sm90, 128 threads at V = 4: 64 at P = 32,
// 32 at P = 64). Up to kCompressUnrolledSlots a block is the knobs' own,
// and a plan over the limit is refused (check_logits_fit_shared_memory).
int words_block_threads(const CudaPlan &plan, const RowLayout &layout, const SoftmaxPool &p) {
    const int64_t P = pool_size_of(p);
    int threads = plan.compress_row_threads;
    if (P <= kCompressUnrolledSlots) {
        return threads;
    }
    const int64_t thread_bytes = P * layout.values_per_lane * p.logit.type().bytes();
    while (threads > layout.lanes() && thread_bytes * threads > kMaxDynamicSharedBytes) {
        threads /= 2;
    }
    return threads;
}

// A words kernel's pool: every slot unrolled, its items loaded up front
// (load_lane_items), unless the exact arithmetic's pool has more than
// `unrolled_slots` slots, or any pool more than kCompressUnrolledSlots (the
// triton arithmetic's then in groups of kCompressUnrolledSlots): there P x (8 bytes of key and of score, 16 of
// ape) in flight at once and P x V logits beside the f64 exps pass the 128
// registers (ptxas hoists every slot's loads in straight-line code, so
// reading the keys in groups alone does not help).
// Then the logits are computed in groups of `unrolled_slots` slots (a
// loop, each group's loads in flight together) into shared memory, each
// lane its own, and the weighted sum loops over the same groups, reading a
// group's keys at once; the max reads the logits back unrolled. Shared
// memory holds them thread index innermost (Halide's layout for a
// thread's own allocation), so a warp's access is 128 contiguous bytes.
void pool_words_in_warp(CompressPool &c, CompressLaneLoads &l, const RowLayout &layout, const Var &d, const Var &v,
                        const Var &lane, LoopLevel at, int unrolled_slots, int block_threads) {
    SoftmaxPool &p = c.pool;
    const int64_t P = pool_size_of(p);
    const bool in_groups = (p.arithmetic == Arithmetic::Exact && P > unrolled_slots) || P > kCompressUnrolledSlots;
    compute_pool_in_warp(c, layout, d, v, lane, at, !in_groups);
    if (!in_groups) {
        load_lane_items(c, l, lane);
        return;
    }
    if (p.arithmetic == Arithmetic::Triton) {
        unrolled_slots = static_cast<int>(kCompressUnrolledSlots);
    }
    check_logits_fit_shared_memory(p, layout, P, block_threads, unrolled_slots);
    const Var j = p.logit.args()[1];
    Var slot_group{"logit_slot_group"}, slot_in{"logit_slot_in_group"};
    p.logit.compute_at(c.pooled_bf16, lane)
        .store_in(MemoryType::GPUShared)
        .split(j, slot_group, slot_in, unrolled_slots)
        .unroll(slot_in)
        .unroll(d);
    if (p.max_logit.has_update_definition()) {
        p.max_logit.update(0).unroll(p.later_slot);
    }
    const RVar sum_group = weighted_sum_in_groups(p, unrolled_slots);
    lane_items_at(l.key, l.key_items, LoopLevel(p.weighted_sum, sum_group), l, lane);
    lane_items_at(l.score, l.score_items, LoopLevel(p.logit, slot_group), l, lane);
    lane_items_at(l.ape, l.ape_items, LoopLevel(p.logit, slot_group), l, lane);
}

}  // namespace

// Compress as three kernels: aligned rows with and without round_scale
// (wide loads; under round_scale the quotient multiplies by the scale's
// exact reciprocal, no division and no select), and any rows (element loads,
// round_scale selected).
// A compress kernel's threads a block: a words kernel's (its lane loads
// defined) words_block_threads, an element kernel's compress.row_threads.
template <typename Stages>
int compress_block_threads(const CudaPlan &plan, const Stages &s) {
    return s.lane_loads.key.defined() ? words_block_threads(plan, s.layout, s.compress.pool)
                                      : plan.compress_row_threads;
}

template <typename StageOrFunc>
void specialize_compress(StageOrFunc stage, const CompressConditions &conditions) {
    stage.specialize(conditions.aligned && conditions.round_scale);
    stage.specialize(conditions.aligned);
}

void schedule_compress_to_cache(CompressToCacheStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    RVar lane{"write_lane"}, v{"write_v"}, pb{"pool_block"}, pi{"pool_in_block"};
    const bool words = s.lane_loads.key.defined();
    const int block_threads = compress_block_threads(plan, s);
    pure_stage_on_gpu(s.cache);
    // Duplicate locs are the caller's race, as in the reference (docs/).
    s.cache.update(0)
        .allow_race_conditions()
        .split(s.write.x, lane, v, s.layout.values_per_lane)
        .split(s.write.y, pb, pi, block_threads / s.layout.lanes(), TailStrategy::GuardWithIf)
        .reorder(v, lane, pi, pb)
        .gpu_blocks(pb)
        .gpu_threads(pi)
        .gpu_lanes(lane);
    if (words) {
        // The words kernels' codes rows start at 4-byte words (the
        // generator's constraint): a lane's V codes are V / 4 word stores.
        s.cache.update(0).vectorize(v);
        pool_words_in_warp(s.compress, s.lane_loads, s.layout, s.d, s.v, s.lane, LoopLevel(s.cache, pi),
                           plan.compress_exact_words_unrolled_slots, block_threads);
        s.cache.update(0).specialize(s.conditions.round_scale);
        return;
    }
    s.cache.update(0).unroll(v);
    pool_elements_in_warp(s.compress, s.conditions, s.layout, s.d, s.v, s.lane, LoopLevel(s.cache, pi));
    specialize_compress(s.cache.update(0), s.conditions);
}

// The prefill insert with its seed, one kernel: compress's blocks of
// pools (above), and the seed fused at their block loop (compute_with, the
// RDoms named alike). Block b seeds tokens b * 32G .. b * 32G + 32G - 1
// (G: the pools of a compress block, so the same threads): first one
// thread per token decides whether it is seeded (the 64-bit divisions by
// the ring: most tokens are not), into shared memory, then warp w copies
// member w of each of the 32 groups of G that is, each lane 4 bf16 of both
// halves, as schedule_seed_tail does (its group loop in one part: the
// guard per group costs less than Halide's three copies of the loop). The
// seed runs in the first n / 32G blocks (16K tokens at G = 4: 128 of the
// compress's 4096); the others pass its two barriers.
void schedule_compress_and_seed(CompressAndSeedStages &s, const BuildPlan &build) {
    cuda::schedule_compress_to_cache(s, build);
    const int G = compress_block_threads(plan_for(build), s) / s.layout.lanes();
    RVar pb{"pool_block"}, in_block{"seed_in_block"}, group{"seed_group"}, member{"seed_member"},
        lane{"seed_lane"}, v{"seed_v"};
    RVar half = s.copy.z;
    pure_stage_on_gpu(s.tail);
    s.tail.update(0)
        .allow_race_conditions()
        .split(s.copy.x, lane, v, kValuesPerLane)
        .split(s.copy.y, pb, in_block, kWarpSize * G, TailStrategy::GuardWithIf)
        .split(in_block, group, member, G)
        .reorder(v, half, lane, member, group, pb)
        .gpu_blocks(pb)
        .gpu_threads(lane, member)
        .unroll(half)
        .vectorize(v)
        .partition(group, Partition::Never)
        .compute_with(s.cache.update(0), pb);
    Var ta{"seeded_warp"}, tl{"seeded_lane"};
    s.seeded.compute_at(s.tail, pb).split(s.token, ta, tl, kWarpSize).gpu_threads(tl, ta);
}

void schedule_compress_to_rows(CompressToRowsStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    Var pi{"pool_in_block"};
    const bool words = s.lane_loads.key.defined();  // codes rows of 4-byte words: vector stores
    const int block_threads = compress_block_threads(plan, s);
    rows_in_lanes(s.out, s.d, s.pool, s.lane, s.layout, block_threads, pi, 1, words);
    if (words) {
        pool_words_in_warp(s.compress, s.lane_loads, s.layout, s.d, s.v, s.lane, LoopLevel(s.out, pi),
                           plan.compress_exact_words_unrolled_slots, block_threads);
        s.out.specialize(s.conditions.round_scale);
        return;
    }
    pool_elements_in_warp(s.compress, s.conditions, s.layout, s.d, s.v, s.lane, LoopLevel(s.out, pi));
    specialize_compress(s.out, s.conditions);
}

}  // namespace kpool::cuda
