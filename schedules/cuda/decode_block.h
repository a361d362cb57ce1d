// The one-kernel decode's block-per-request layout on CUDA
// (DecodeLayout::BlockPerRequest): a block of four warps per request, each
// thread one of a completion's 128 dims (schedules/cuda/decode_block.cpp).
#pragma once

#include "kpool_stages.h"

namespace kpool::cuda {

// Warps of a block-per-request block: 128 dims, one a thread.
constexpr int kBlockWarps = 4;

// The layout's rows (RowLayout::values_are_warps): value v of lane l is
// dim v * 32 + l, each value in a warp of its own.
RowLayout block_row_layout();

// How a completion's slot folds run: unrolled whole up to `unrolled_slots`,
// past it in unrolled groups of `slot_group` (a group's member loads in
// flight together).
struct BlockSlotFolds {
    int unrolled_slots = 16;
    int slot_group = 4;
};

// The completions of the block-per-request kernel: requests in grid x
// (RVar "request_block", where the stashes fuse), the request's tokens in
// a serial loop, every completion over the block's four warps. Returns the
// completions' stage.
Halide::Stage schedule_block_completions(DecodeWriteStages &w, const BlockSlotFolds &folds);

}  // namespace kpool::cuda
