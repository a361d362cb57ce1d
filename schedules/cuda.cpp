// CUDA schedules. A row (fwht row, pool, decode token) is a group of lanes
// of one warp, each holding V consecutive elements (the plan's V per kernel:
// 32 lanes x 4 up to 8 lanes x 16), so the Hadamard's strides below V stay in
// a thread's registers and larger strides and the absmax are warp shuffles
// (within the row's lanes). Only decode's exact pool goes through shared
// memory (an element per thread, then the row in one warp). Nothing touches
// heap memory, so every kernel is one launch and CUDA-graph capturable.
// Large dimensions (rows, pools, tokens, decode's requests x token blocks fused)
// go to grid x: grid y and z stop at 65535.
#include "cuda.h"

#include "block_barriers.h"
#include "knobs.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

namespace kpool::cuda {

using namespace Halide;

namespace {

// An in-place output's pure definition is undef: nothing runs, but placed on
// the GPU so Halide does not ask for a host pointer for it.
void pure_stage_on_gpu(Func out) {
    out.gpu_single_thread();
}

// A family's schedule parameters, read from its schedules/<family>.knobs
// (the values; their legal values and the measurements behind them are
// there too): what each one decides. A knob is a line there and a field
// here that reads it by name (KnobReader, knobs.h).
struct CudaPlan : KnobReader {
    explicit CudaPlan(const BuildPlan &build) : KnobReader(build) {}

    // Values per lane of a row (4 to 32). More values per lane, fewer
    // instructions per element (in-lane butterflies instead of shuffles, one
    // index computation for more elements), more registers per lane.
    int fwht_values = knob("fwht.values");
    // fwht's lanes hold runs of this many consecutive elements (RowLayout):
    // 8 or more, each 8 of a run one 16-byte load of bf16 and one 8-byte
    // store of codes in the words kernel. (The softmax kernels keep a lane's
    // elements consecutive: their pool's per-d stages are bounded per lane.)
    int fwht_run = knob("fwht.run");
    int fwht_row_threads = knob("fwht.row_threads");              // threads per block of the fwht kernels
    int compress_row_threads = knob("compress.row_threads");      // threads per block of the compress kernels
    int compress_values = knob("compress.exact_values");          // exact arithmetic (slot loops kept)
    int compress_triton_values = knob("compress.triton_values");  // slot loops unrolled: P x V weights live
    // The exact arithmetic's words kernels (aligned rows, slots unrolled as
    // the triton ones'): values per lane (4: a lane's keys and bf16 scores of
    // a slot are one 8-byte word).
    int compress_exact_words_values = knob("compress.exact_words_values");
    // ... and the slots they unroll: past this many, the logits go to shared
    // memory, computed and summed in groups of this many slots, each group
    // unrolled (pool_words_in_warp).
    int compress_exact_words_unrolled_slots = knob("compress.exact_words_unrolled_slots");
    int decode_values = knob("decode.values");                    // latency-bound: more lanes per token
    // Decode in the exact arithmetic pools each element of a completion on a
    // thread of its own rather than V per lane: the f64 exps make the pool
    // the longest chain. (The triton arithmetic's pool is short: there the
    // barriers and the idle threads cost more than they save. H100, P=16:
    // a block per token 6.8 -> 7.9 us; a block of four warps per request,
    // warp 0 rotating, 64 x 2 5.09 -> 6.19: each lane stage of the rotation
    // ends in a block barrier the pooling warps must reach.)
    bool decode_exact_pool_per_element = flag("decode.exact_pool_per_element");
    // Decode's barriers between block-level stages that keep to their
    // threads' own memory are dropped (block_barriers.h): fewer barriers
    // per completion, but ptxas then schedules across the stages.
    bool decode_drop_private_barriers = flag("decode.drop_private_barriers");
    // Decode's exact pool per element unrolls its slot folds (a call is
    // latency-bound) up to this many slots, past it in unrolled groups of
    // decode_exact_slot_group (pools in lanes: decode_lane_unrolled_slots).
    int decode_unrolled_exact_slots = knob("decode.unrolled_exact_slots");
    int decode_exact_slot_group = knob("decode.exact_slot_group");
    // decode: tokens of a request run side by side (triton), stashed per block
    int decode_tokens_per_block = knob("decode.tokens_per_block");
    // Decode's warp-per-request layout: requests (warps) per block.
    int decode_requests_per_block = knob("decode.requests_per_block");
    // A decode block's requests: that knob's in the warp-per-request layout, one otherwise.
    int decode_block_requests(bool per_request) const { return per_request ? decode_requests_per_block : 1; }
    // A warp per request stashes its tokens in chunks of this many: a
    // chunk's stash rows (both halves) are loaded together, before its
    // first store (one latency per chunk, not two per token).
    int decode_request_token_chunk = knob("decode.request_token_chunk");
    // A completion pooled in its token's lanes (V elements per lane), in
    // the triton arithmetic, unrolls its slot folds up to this many slots;
    // past it each fold runs in groups of this many slots, each group
    // unrolled (all P x V members at once spill under the 128-register cap).
    int decode_lane_unrolled_slots = knob("decode.lane_unrolled_slots");
    // The same for the exact arithmetic, whose exps take more registers.
    int decode_lane_unrolled_exact_slots = knob("decode.lane_unrolled_exact_slots");
    // A warp per token (any strides, element by element) unrolls its slot
    // folds up to this many slots, past it loops over the slots.
    int decode_token_unrolled_slots = knob("decode.token_unrolled_slots");
    int seed_warps_per_block = knob("seed.warps_per_block");    // seed: warps per block (32 tokens each)
    int expand_cols = knob("expand.cols");                      // expand: output columns per thread block
    int expand_and_append_cols = knob("expand.append_cols");    // the same for expand_pools_and_append_tail
};

CudaPlan plan_for(const BuildPlan &build) { return CudaPlan(build); }

}  // namespace

// e4m3 codes from the family's conversion instruction where its row has one
// (cvt.rn.satfinite.e4m3x2.f32: one instruction per pair, the clamp
// included), else from integer bit arithmetic.
E4m3Encoder e4m3_encoder(const BuildPlan &build) {
    return build.has_gpu_feature("e4m3") ? E4m3Encoder::Sm90 : E4m3Encoder::Integer;
}

namespace {

constexpr int kValuesPerLane = 4;  // of the seed and stash copies: 8 bytes per lane
constexpr int kWarpSize = 32;

// A per-row Func over (v, lane, rows...): registers of the row's lanes.
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

// A (codes, scale) output over (x, row), x an element or (codes_per_word
// > 1) a word of consecutive elements: row_threads / lanes rows per block,
// each lane storing its V elements, run by run (RowLayout::element:
// x = (run_index * lanes + lane) * run + in_run, in units of x).
void rows_in_lanes(Func out, const Var &x, const Var &row, const Var &lane, const RowLayout &layout, int row_threads,
                   Var &row_in_block, int codes_per_word = 1, bool vector_runs = false) {
    if (layout.run % codes_per_word != 0) {
        throw CompileError("a lane's run of " + std::to_string(layout.run) + " elements cannot be stored in words of " +
                           std::to_string(codes_per_word));
    }
    Var rb{"row_block"}, run_index{"run_index"}, in_run{"in_run"};
    out.split(x, x, in_run, layout.run / codes_per_word)
        .split(x, run_index, lane, layout.lanes())
        .split(row, rb, row_in_block, row_threads / layout.lanes(), TailStrategy::GuardWithIf)
        .reorder(in_run, run_index, lane, row_in_block, rb)
        .gpu_blocks(rb)
        .gpu_threads(row_in_block)
        .gpu_lanes(lane)
        .unroll(run_index);
    if (vector_runs) {
        out.vectorize(in_run);  // a run's codes: one store
    } else {
        out.unroll(in_run);
    }
}

}  // namespace

RowLayout row_layout(const BuildPlan &build, const KernelAsked &kernel) {
    const CudaPlan plan = plan_for(build);
    int values = 0;
    switch (kernel.kind) {
    case KernelAsked::Kind::Fwht:
        values = plan.fwht_values;
        break;
    case KernelAsked::Kind::Compress:
        values = kernel.arithmetic == Arithmetic::Triton ? plan.compress_triton_values
                 : kernel.words                          ? plan.compress_exact_words_values
                                                         : plan.compress_values;
        break;
    case KernelAsked::Kind::Decode:
        values = plan.decode_values;
        break;
    case KernelAsked::Kind::SeedTail:  // not a row kernel
        break;
    }
    if (values != 4 && values != 8 && values != 16 && values != 32) {
        throw CompileError("CUDA plan " + build.gpu + ": values per lane must be 4, 8, 16 or 32");
    }
    const int run = kernel.kind == KernelAsked::Kind::Fwht ? plan.fwht_run : values;
    return RowLayout{values, /*partner_by_index=*/true, run};
}

// The words kernel loads a lane's runs itself (lane_pairs, per lane, inside
// the lane loop of the rotation's input): each run of 8 bf16 is 4 words at a
// 16-byte-aligned index, which Halide's PTX backend emits as one 128-bit
// load (ld.global.v2.u64) when the index is known to be a multiple of 4
// words (the generator's stride constraint); its 8 codes are one 64-bit
// store. (A vector load of a Func striped over the lanes themselves fails
// the warp shuffle pass: lane_pairs is the lane's own registers.) sm_90 SASS
// per thread (ptxas --maxrregcount 128), 4 lanes x 32 values, runs of 8:
// 936 instructions, loads 16 B x 4, stores 8 B x 4 and 4 B x 1 (the scale),
// 63 registers; with runs of 4 words it was 936, 8 B x 8, 4 B x 9, 60 (the
// hand kernel: 832, 16 B x 4, 8 B x 4 and 4 B x 1).
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
// sm_90 SASS per thread (ptxas --maxrregcount 128), bf16 scores, before ->
// the aligned round_scale kernel: P=4 triton 952 -> 920 instructions, ape
// 4 B x 16 -> 16 B x 4, 64 registers; P=16 triton 1800 -> 1808, 4 B x 64 ->
// 16 B x 16, 110 -> 128 registers (no spills); exact P=4 2336 -> 1840, P=16
// 2352 -> 1856 (the weights' ape 16 B x 2 per slot loop, the max's 4 B).
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

// The softmax pool is elementwise in d: each lane pools its own V elements
// into the pooled row that feeds the Hadamard input in registers. The two
// folds over the slots are loops (the V elements unrolled inside) unless
// `unroll_slots`: unrolled, every slot's loads are in flight at once, but
// in compress's exact arithmetic P x V exps, each with its branch to the
// exact path, overflow the instruction cache at P = 16 (H200, ncu: most
// stalls were instruction fetch, compress of 262144 pools of 16 took 5.2 ms;
// 2.1 ms as loops). The triton arithmetic's exp is one instruction.
// With `vector_values` a lane's V elements are vectors (its inputs aligned
// runs: one wide load per slot and input) rather than unrolled.
void compute_pool_in_warp(CompressPool &c, const RowLayout &layout, const Var &d, const Var &v, const Var &lane,
                          LoopLevel at, bool unroll_slots, const CompressConditions *conditions = nullptr,
                          bool vector_values = false) {
    auto values = [&](auto &&stage) {
        if (vector_values) {
            stage.vectorize(d);
        } else {
            stage.unroll(d);
        }
    };
    c.pooled_bf16.compute_at(at)
        .split(d, lane, v, layout.values_per_lane)
        .gpu_lanes(lane)
        .unroll(v)
        .store_in(MemoryType::Register);
    SoftmaxPool &p = c.pool;
    p.max_logit.compute_at(c.pooled_bf16, lane).store_in(MemoryType::Register);
    values(p.max_logit);
    if (p.max_logit.has_update_definition()) {
        values(p.max_logit.update(0).reorder(d, p.later_slot));
        if (unroll_slots) {
            p.max_logit.update(0).unroll(p.later_slot);
        }
    }
    p.weighted_sum.compute_at(c.pooled_bf16, lane).store_in(MemoryType::Register);
    values(p.weighted_sum);
    values(p.weighted_sum.update(0).reorder(d, p.slot));
    if (unroll_slots) {
        p.weighted_sum.update(0).unroll(p.slot);
    }
    // Both sums use the slot's weight: computed once per slot, not inlined
    // into each (an exp's branch is not merged by common-subexpression passes).
    p.weight.compute_at(p.weighted_sum, p.slot).store_in(MemoryType::Register);
    values(p.weight);
    compute_row_in_warp(c.rotate, v, lane, at);
    if (conditions) {
        load_lane_logits(c, *conditions, d, lane, unroll_slots);
    }
}

// The weighted sum's slot fold in groups of `group` slots, each group
// unrolled (its loads in flight together) with its slots' weights computed
// inside it: returns the loop over the groups.
RVar weighted_sum_in_groups(SoftmaxPool &p, int group) {
    RVar slot_group{"slot_group"}, slot_in{"slot_in_group"};
    p.weighted_sum.update(0).split(p.slot.x, slot_group, slot_in, group).unroll(slot_in);
    p.weight.compute_at(p.weighted_sum, slot_in);
    return slot_group;
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
// sm_90 SASS per thread (ptxas --maxrregcount 128), bf16 scores, 4 values
// per lane, the element kernel's aligned -> words kernels, round_scale and
// not: P=4 920 / 952 -> 880 / 832 instructions, loads 2 B x 32 + 16 B x 4
// -> 8 B x 9 + 16 B x 4 (the hand kernel's), 64 -> 48 registers; P=16
// 1808 / 1840 -> 1648 / 1600, 2 B x 128 + 16 B x 16 -> 8 B x 33 + 16 B x
// 16, 128 -> 106 registers; no spills.
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

// A words kernel's pool: every slot unrolled, its items loaded up front
// (load_lane_items), unless the exact arithmetic's pool has more than
// `unrolled_slots` slots: there P x (8 bytes of key and of score, 16 of
// ape) in flight at once and P x V logits beside the f64 exps pass the 128
// registers (sm_90, P=16: 208 B spilled; with only the logits in shared
// memory, 232 B; with the keys read in groups of 4 slots, 192 B: ptxas
// hoists every slot's loads in straight-line code).
// Then the logits are computed in groups of `unrolled_slots` slots (a
// loop, each group's loads in flight together) into shared memory, each
// lane its own, and the weighted sum loops over the same groups, reading a
// group's keys at once; the max reads the logits back unrolled. Shared
// memory holds them thread index innermost (Halide's layout for a
// thread's own allocation), so a warp's access is 128 contiguous bytes.
// sm_90 SASS (ptxas --maxrregcount 128), bf16 scores, groups of 4: P=16
// 99 registers, no spills, 3040 instructions (a group's 16 exps in the
// loop body), loads 16 B x 4 + 8 B x 9, 16 shared stores and 80 loads.
// On the path that runs (exp's exact-path branches left out, loops counted
// by their trips), per pool against the exact element kernel (16 values a
// lane, 2-byte loads, slot loops; ncu: 61.7 % of its stalls on L1TEX at
// P=16): P=4 43.5k thread instructions against 35.9k, 448 load
// instructions against 2448 (8-16 B each against 2-4 B); P=16 116k against
// 109k, 1600 loads against 8976; the same f64 fmas (10 an exp).
void pool_words_in_warp(CompressPool &c, CompressLaneLoads &l, const RowLayout &layout, const Var &d, const Var &v,
                        const Var &lane, LoopLevel at, int unrolled_slots, int block_threads) {
    SoftmaxPool &p = c.pool;
    const std::optional<int64_t> P = as_const_int(p.slot.x.extent());
    if (!P) {
        throw CompileError("compress's pool size must be a constant of the kernel");
    }
    const bool in_groups = p.arithmetic == Arithmetic::Exact && *P > unrolled_slots;
    compute_pool_in_warp(c, layout, d, v, lane, at, !in_groups);
    if (!in_groups) {
        load_lane_items(c, l, lane);
        return;
    }
    check_logits_fit_shared_memory(p, layout, *P, block_threads, unrolled_slots);
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

// Compress as three kernels: aligned rows with and without round_scale
// (wide loads; under round_scale the quotient multiplies by the scale's
// exact reciprocal, no division and no select), and any rows (element loads,
// round_scale selected).
template <typename StageOrFunc>
void specialize_compress(StageOrFunc stage, const CompressConditions &conditions) {
    stage.specialize(conditions.aligned && conditions.round_scale);
    stage.specialize(conditions.aligned);
}

void schedule_compress_to_cache(CompressToCacheStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    RVar lane{"write_lane"}, v{"write_v"}, pb{"pool_block"}, pi{"pool_in_block"};
    pure_stage_on_gpu(s.cache);
    // Duplicate locs are the caller's race, as in the reference (docs/).
    s.cache.update(0)
        .allow_race_conditions()
        .split(s.write.x, lane, v, s.layout.values_per_lane)
        .split(s.write.y, pb, pi, plan.compress_row_threads / s.layout.lanes(), TailStrategy::GuardWithIf)
        .reorder(v, lane, pi, pb)
        .gpu_blocks(pb)
        .gpu_threads(pi)
        .gpu_lanes(lane);
    if (s.lane_loads.key.defined()) {
        // The words kernels' codes rows start at 4-byte words (the
        // generator's constraint): a lane's V codes are V / 4 word stores.
        s.cache.update(0).vectorize(v);
        pool_words_in_warp(s.compress, s.lane_loads, s.layout, s.d, s.v, s.lane, LoopLevel(s.cache, pi),
                           plan.compress_exact_words_unrolled_slots, plan.compress_row_threads);
        s.cache.update(0).specialize(s.conditions.round_scale);
        return;
    }
    s.cache.update(0).unroll(v);
    compute_pool_in_warp(s.compress, s.layout, s.d, s.v, s.lane, LoopLevel(s.cache, pi),
                         s.compress.pool.arithmetic == Arithmetic::Triton, &s.conditions);
    specialize_compress(s.cache.update(0), s.conditions);
}

void schedule_compress_to_rows(CompressToRowsStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    Var pi{"pool_in_block"};
    const bool words = s.lane_loads.key.defined();  // codes rows of 4-byte words: vector stores
    rows_in_lanes(s.out, s.d, s.pool, s.lane, s.layout, plan.compress_row_threads, pi, 1, words);
    if (words) {
        pool_words_in_warp(s.compress, s.lane_loads, s.layout, s.d, s.v, s.lane, LoopLevel(s.out, pi),
                           plan.compress_exact_words_unrolled_slots, plan.compress_row_threads);
        s.out.specialize(s.conditions.round_scale);
        return;
    }
    compute_pool_in_warp(s.compress, s.layout, s.d, s.v, s.lane, LoopLevel(s.out, pi),
                         s.compress.pool.arithmetic == Arithmetic::Triton, &s.conditions);
    specialize_compress(s.out, s.conditions);
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

// P: the slot RDom's extent, a constant of every decode kernel.
int pool_size(const DecodeWriteStages &s) {
    const std::optional<int64_t> P = as_const_int(s.compress.pool.slot.x.extent());
    if (!P) {
        throw CompileError("decode's pool size must be a constant of the kernel");
    }
    return static_cast<int>(*P);
}

// The walk over earlier tokens (ring_writer) at `at`, each earlier token
// read once for all P members.
void compute_ring_walk_at(DecodeWriteStages &s, LoopLevel at) {
    s.ring_writer.compute_at(at).unroll(s.j);
    s.ring_writer.update(0).reorder(s.j, s.earlier).unroll(s.j);
}

// Both slot folds over groups of `group` slots, each group unrolled: a
// group's member loads are in flight together (a latency per group and
// fold, not per slot).
void folds_in_groups(SoftmaxPool &p, int group) {
    RVar later_group{"later_slot_group"}, later_in{"later_slot_in_group"};
    if (p.max_logit.has_update_definition()) {
        p.max_logit.update(0)
            .split(p.later_slot.x, later_group, later_in, group, TailStrategy::GuardWithIf)
            .unroll(later_in);
    }
    weighted_sum_in_groups(p, group);
}

// A completion's pool, each element on a thread of its own: the exact
// arithmetic's pool is the longest chain of a completion (P slots of loads
// and f64 exps per element), so every element of it is a thread (128, a
// warp per 32 elements), pooling into shared memory; then the token's lanes
// (a warp at V = 4) rotate and quantize the row as in compress. Halide skips
// both for a token whose write condition is false, so the many tokens that
// complete nothing cost a few loads. The slot folds are unrolled whole up to
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
    if (pool_size(s) <= plan.decode_unrolled_exact_slots) {
        if (p.max_logit.has_update_definition()) {
            p.max_logit.update(0).unroll(p.later_slot);
        }
        p.weighted_sum.update(0).unroll(p.slot);
        p.weight.compute_at(p.weighted_sum, p.slot);
    } else {
        folds_in_groups(p, plan.decode_exact_slot_group);
    }
    p.weight.store_in(MemoryType::Register);
    compute_ring_walk_at(s, LoopLevel(c.pooled_bf16, dl));
    compute_row_in_warp(c.rotate, s.v, s.lane, LoopLevel(s.cache, token));
}

// A completion's pool in its token's lanes (a warp at V = 4), each lane
// pooling its V elements, slot folds unrolled where registers allow (a
// decode call is latency-bound: every member's loads in flight at once).
void pool_in_lanes(DecodeWriteStages &s, const CudaPlan &plan, const RVar &token, bool vector_values) {
    compute_ring_walk_at(s, LoopLevel(s.compress.pooled_bf16, s.lane));
    SoftmaxPool &p = s.compress.pool;
    const bool triton = p.arithmetic == Arithmetic::Triton;
    const int group = !vector_values ? plan.decode_token_unrolled_slots
                      : triton       ? plan.decode_lane_unrolled_slots
                                     : plan.decode_lane_unrolled_exact_slots;
    const bool unroll_slots = pool_size(s) <= group;
    compute_pool_in_warp(s.compress, s.layout, s.d, s.v, s.lane, LoopLevel(s.cache, token), unroll_slots,
                         /*conditions=*/nullptr, vector_values);
    if (!vector_values) {
        return;  // element by element (any strides): past `group`, slot loops
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

namespace {

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
        pool_in_lanes(w, plan, w.write.y, aligned_rows);
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
            pool_in_lanes(w, plan, token, false);
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

// CUDA runs decode as one kernel, kpool_decode_update (below), except where
// the K cache is launched in windows: then as the CPU does, completions
// (kpool_decode_write_cache, a launch per window) and stashes.

// One launch per decode call, in one of two layouts (DecodeLayout; the
// runtime picks per call, runtime/ops/decode.cpp):
// - WarpPerToken: a block per request. First its completions: in the exact
//   arithmetic the tokens in a serial loop, each completion's pool an
//   element per thread (pool_per_element); in the triton arithmetic, whose
//   pool is short, a warp per token, decode_tokens_per_block tokens at a
//   time (pool_in_lanes). Then, after the block barrier that Halide puts
//   between the two loop nests, the stashes: a warp per token. The exact
//   arithmetic's token loop passes 3 barriers per completing token (after
//   the pool's shared stores, after the rotating warp's shared loads, the
//   iteration's last) with decode_drop_private_barriers, 19 without, and 1
//   per token that completes nothing either way, where Halide's 19 are
//   passed by every token (BlockUniformBarriers, block_barriers.h).
// - WarpPerRequest: decode_requests_per_block requests per block, a warp
//   each: first every token's indices into shared memory (a lane per token,
//   one round of loads, then a barrier), then the warp walks its tokens in
//   a loop (completions pooled in the lanes), then, after the barrier, its
//   stashes, decode_request_token_chunk tokens at a time. Completions are
//   rare (one token in P): with few tokens per request, a block per request
//   leaves most of its warps idle.
// Each stash lane moves 4 bf16 of both halves; a token that a later one
// overwrites stashes nothing (the algorithm), so stashes need no order. The
// completions read the ring as it was before the call (the algorithm's
// ring_writer), so within a request nothing a stash writes is read after
// it. Fused at the block loop (compute_with, both RDoms named alike). A
// token that completes nothing skips its pool: a few loads.
// Specialized on a power-of-two ring and cache page (one kernel each way,
// the runtime's launch picks): shifts and masks, no integer division.
//
// Static figures, sm90 (ptxas -arch=sm_90 --maxrregcount 128, the runtime's
// JIT cap; cuobjdump -sass): registers, spilled bytes and SASS instructions
// of the power-of-two / general kernel; global memory instructions by bytes
// (power-of-two kernel; 4-byte loads are the per-token indices and the
// unrolled walks over earlier tokens; shared: the index table, 4-byte
// stores 24 and loads 80 in every warp-per-request variant). The knobs of
// sm90.knobs: a request per block, triton slot groups of 8, exact groups
// of 4, stash chunks of 4.
//   warp per request (aligned rows)   regs     spill  SASS       loads               stores
//   P=4  exact                        112/100  0/0    4050/4302  16Bx4 8Bx19 4Bx43   8Bx8 4Bx2
//   P=4  triton                        80/90   0/0    1949/1646  16Bx4 8Bx16 4Bx43   8Bx8 4Bx2
//   P=8  exact                        123/109  0/0    4286/4303  16Bx12 8Bx24 4Bx29  8Bx8 4Bx2
//   P=8  triton                       114/128  0/0    2475/2062  16Bx8 8Bx24 4Bx43   8Bx8 4Bx2
//   P=16 exact                        122/114  0/0    4330/4320  16Bx12 8Bx24 4Bx29  8Bx8 4Bx2
//   P=16 triton                       123/128  0/0    2764/2692  16Bx24 8Bx40 4Bx29  8Bx8 4Bx2
// The exact rows take the exp's fma fast path (kpool_schedules.cpp): the
// code outside the exps' exact branches, what a call runs, P=4 1843 -> 1334
// and P=16 2151 -> 1590 SASS; each exact branch 78 -> 123-159 (it no
// longer shares the degree-10 path's range reduction), so the whole grows.
// (Before the index table and the stash chunks: P=4 exact/triton 3332/1257,
// P=16 3350/2077 SASS, the same registers; stores 8Bx2: one stash loop.
// The growth is the stash chunk's four unrolled tokens, each with its walk
// over the later ones, and the table's loop; a token runs fewer: no global
// load before it knows it completes nothing.)
//   warp per token (any strides)
//   P=4  exact                        124/128  0/0    1686/1482  4Bx43 2Bx22         4Bx1 2Bx8 1Bx4
//   P=4  triton                       122/106  0/0    1465/1287  4Bx55 2Bx64         4Bx1 2Bx8 1Bx4
//   P=16 exact                        124/128  0/8    1277/1290  4Bx28 2Bx16         4Bx1 2Bx8 1Bx4
//   P=16 triton                       126/128  0/0    1289/1298  4Bx37 2Bx40         4Bx1 2Bx8 1Bx4
// A warp per request's members: 8 bytes of key and of score (one load each,
// from this call's inputs or the ring, a uniform branch), 16 of ape, per
// slot; at P=16 two groups of 8 slots (triton) or four of 4 (exact), each
// group's loads in flight together, per fold (before: 15 + 16 iterations of
// one slot each, every member read from both sources, 106-128 registers,
// 1334-1370 (triton) and 1928-1995 (exact) SASS, 16Bx1 8Bx12 4Bx19-33; four
// requests per block). Triton groups of 4 and exact groups of 2 (the knobs'
// other values): P=16 1550/1620 and 2188/2199 SASS, no spills.
// The one kernel before both layouts (block per request, no specialization):
// P=4 exact/triton 128/120 registers, 4/0 B spilled, 1912/1712 SASS; P=16
// 128/128 registers, 204/452 B spilled, 4096/3280 SASS; loads 2Bx22-256,
// stores 2Bx8 1Bx4.
void schedule_decode_update(DecodeUpdateStages &s, const BuildPlan &build) {
    const CudaPlan plan = plan_for(build);
    DecodeWriteStages &w = s.write;
    DecodeStashStages &st = s.stashes;
    const bool per_request = s.layout == DecodeLayout::WarpPerRequest;
    const int requests = plan.decode_block_requests(per_request);
    RVar request_block{"request_block"};
    Stage completions = schedule_completions(w, plan, per_request, s.aligned_rows);
    RVar stash_lane{"stash_lane"}, stash_v{"stash_v"}, stash_chunk{"stash_chunk"}, stash_token{"stash_token"};
    RVar stash_request{"stash_request"};
    pure_stage_on_gpu(st.tail);
    Stage stashes = st.tail.update(0);
    stashes.allow_race_conditions()
        .split(st.stash.x, stash_lane, stash_v, kValuesPerLane)
        .split(st.stash.z, request_block, stash_request, requests, TailStrategy::GuardWithIf);
    if (per_request) {
        // A chunk of tokens at a time: their stash rows (both halves) all
        // loaded before the chunk's first store (a store may alias a later
        // load, so loads after it wait for it), then each token's walk over
        // the later ones (in the shared index table) while they arrive.
        stashes
            .split(st.stash.y, stash_chunk, stash_token, plan.decode_request_token_chunk, TailStrategy::GuardWithIf)
            .reorder(stash_v, st.stash[3], stash_token, stash_chunk, stash_lane, stash_request, request_block)
            .gpu_threads(stash_lane, stash_request)
            .unroll(stash_token)
            .partition(stash_chunk, Partition::Never);
        const std::vector<Var> row = st.stash_row.args();  // (d, half, token, request)
        st.stash_row.compute_at(st.tail, stash_chunk)
            .store_in(MemoryType::Register)
            .vectorize(row[0])
            .unroll(row[1])
            .unroll(row[2]);
        st.overwritten.compute_at(st.tail, stash_token);
    } else {
        stashes
            .split(st.stash.y, stash_chunk, stash_token, plan.decode_tokens_per_block, TailStrategy::GuardWithIf)
            .reorder(stash_v, st.stash[3], stash_lane, stash_token, stash_chunk, stash_request, request_block)
            .gpu_threads(stash_lane, stash_token);
        st.overwritten.compute_at(st.tail, stash_lane);  // each thread its token's
    }
    stashes.gpu_blocks(request_block)
        .unroll(st.stash[3])
        .vectorize(stash_v)
        .compute_with(completions, request_block);
    if (per_request) {
        // Before the completions, every token's indices (a lane per token,
        // 32 at a time) into shared memory, all in flight at once: the
        // stashes read them there, and the completions' own reads of the
        // same words (which decide whether a token completes) then hit L1,
        // so no token waits on a global load to learn that it completes
        // nothing. (The completions do not read the table itself: Halide's
        // skipping of a pool whose token completes nothing then stops.)
        const Var t = s.token_indices.args()[0], b = s.token_indices.args()[1];
        Var chunk{"index_chunk"}, lane{"index_lane"};
        s.token_indices.compute_at(w.cache, request_block)
            .store_in(MemoryType::GPUShared)
            .split(t, chunk, lane, kWarpSize, TailStrategy::GuardWithIf)
            .reorder(lane, b, chunk)
            .gpu_threads(lane, b)
            .partition(chunk, Partition::Never);
    }
    completions.specialize(w.pow2_ring_and_page);
    // A token's stages run under their shared skip condition, barriers
    // included, and no barrier between stages that share no memory across
    // threads (schedules/block_barriers.h): Halide puts one between every two.
    add_block_uniform_barriers(w, plan);
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
