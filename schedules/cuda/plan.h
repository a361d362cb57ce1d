// The CUDA family's plan: its schedule parameters as typed fields, read from
// the family's knobs, and the constants every CUDA schedule shares. Internal
// to schedules/cuda/.
#pragma once

#include "kpool_stages.h"
#include "knobs.h"

namespace kpool::cuda {

constexpr int kWarpSize = 32;
constexpr int kValuesPerLane = 4;  // of the seed and stash copies: 8 bytes per lane
// Decode's values per lane of a token's row: a call is latency-bound, so
// more lanes per token. Not a knob: 8 and 16 do not compile in Halide 21
// ("Name not in Scope: lane_fp8_scale.16" in the one-kernel decode).
constexpr int kDecodeValues = 4;

// A family's schedule parameters, read from its knobs (the values, their
// legal values and the measurements behind them are there): what each one decides. A knob is a line there and a field
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
    // Decode's block-per-request layout (a dim a thread) unrolls its slot
    // folds up to this many slots in the triton arithmetic, past it in
    // unrolled groups of that many (the exact arithmetic: as the exact pool
    // per element, decode.unrolled_exact_slots and exact_slot_group).
    int decode_block_unrolled_slots = knob("decode.block_unrolled_slots");
    // A decode block's requests: that knob's in the warp-per-request layout, one otherwise.
    int decode_block_requests(bool per_request) const { return per_request ? decode_requests_per_block : 1; }
    // A completion pooled in its token's lanes (V elements per lane), in
    // the triton arithmetic, unrolls its slot folds up to this many slots;
    // past it each fold runs in groups of decode_lane_slot_group slots,
    // each group unrolled (all P x V members at once spill under the
    // 128-register cap).
    int decode_lane_unrolled_slots = knob("decode.lane_unrolled_slots");
    int decode_lane_slot_group = knob("decode.lane_slot_group");
    // The same for the exact arithmetic (its groups of this many too),
    // whose exps take more registers.
    int decode_lane_unrolled_exact_slots = knob("decode.lane_unrolled_exact_slots");
    // A warp per token (any strides, element by element) unrolls its slot
    // folds up to this many slots, past it loops over the slots.
    int decode_token_unrolled_slots = knob("decode.token_unrolled_slots");
    int seed_warps_per_block = knob("seed.warps_per_block");    // seed: warps per block (32 tokens each)
    int expand_cols = knob("expand.cols");                      // expand: output columns per thread block
    int expand_and_append_cols = knob("expand.append_cols");    // the same for expand_pools_and_append_tail
};

inline CudaPlan plan_for(const BuildPlan &build) { return CudaPlan(build); }

}  // namespace kpool::cuda
