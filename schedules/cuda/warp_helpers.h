// The placements every CUDA schedule builds from. A row (fwht row, pool,
// decode token) is a group of lanes of one warp, each lane holding V
// consecutive elements (RowLayout: 32 lanes x 4 up to 8 lanes x 16), so the
// Hadamard's strides below V stay in a thread's registers and larger
// strides and the absmax are warp shuffles within the row's lanes. Internal
// to schedules/cuda/.
#pragma once

#include "kpool_stages.h"

namespace kpool::cuda {

using namespace Halide;

// An in-place output's pure definition is undef: nothing runs, but placed on
// the GPU so Halide does not ask for a host pointer for it.
void pure_stage_on_gpu(Func out);

// A row's rotation and quantization (every stage over (v, lane, rows...))
// in the registers of its lanes at `at`.
void compute_row_in_warp(RotateQuant &r, const Var &v, const Var &lane, LoopLevel at);

// A (codes, scale) output over (x, row), x an element or (codes_per_word
// > 1) a word of consecutive elements: row_threads / lanes rows per block,
// each lane storing its V elements, run by run (RowLayout::element:
// x = (run_index * lanes + lane) * run + in_run, in units of x).
void rows_in_lanes(Func out, const Var &x, const Var &row, const Var &lane, const RowLayout &layout, int row_threads,
                   Var &row_in_block, int codes_per_word = 1, bool vector_runs = false);

// A softmax pool in the lanes of its row: each lane pools its own V elements
// (elementwise in d) into the pooled row, then rotates and quantizes it
// (compute_row_in_warp). The two slot folds are loops unless `unroll_slots`;
// with `vector_values` a lane's V elements are vectors (aligned inputs: one
// wide load per slot and input) rather than unrolled.
void compute_pool_in_warp(CompressPool &c, const RowLayout &layout, const Var &d, const Var &v, const Var &lane,
                          LoopLevel at, bool unroll_slots, bool vector_values = false);

// The weighted sum's slot fold in groups of `group` slots, each group
// unrolled (its loads in flight together) with its slots' weights computed
// inside it: returns the loop over the groups.
RVar weighted_sum_in_groups(SoftmaxPool &p, int group);

// Both slot folds over groups of `group` slots, each group unrolled: a
// group's member loads are in flight together (a latency per group and
// fold, not per slot).
void folds_in_groups(SoftmaxPool &p, int group);

// Both slot folds unrolled whole up to `unrolled_slots` slots (each slot's
// weight computed inside the sum), past it in unrolled groups of `group`.
void unrolled_folds(SoftmaxPool &p, int unrolled_slots, int group);

// P: the slot RDom's extent, a constant of every compress and decode kernel.
int pool_size_of(const SoftmaxPool &p);

}  // namespace kpool::cuda
