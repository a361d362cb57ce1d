// Schedules of every kpool kernel, one implementation file per target family:
// cpu.cpp for the host CPU, cuda.cpp for CUDA (one plan per GPU family, sm80
// and sm90; BuildPlan::gpu says which). A generator states its algorithm,
// gathers the stages below and hands them to schedule_*(), which picks the
// family from the target it is built for (kpool_schedules.cpp).
#pragma once

#include <string>

#include "Halide.h"
#include "kpool_algorithms.h"

namespace kpool {

using Halide::RDom;
using Halide::Target;

// What the generator knows of its build: the target, and for GPU targets
// which GPU family the schedule is tuned for (Halide 21 cannot name sm_90,
// so the capability alone does not say).
struct BuildPlan {
    Target target;
    std::string gpu;  // "", "sm80", "sm90"
};

// The row kernel a layout is asked for: a family may spread rows over lanes
// differently per kernel (more values per lane: fewer instructions per
// element, more registers per lane).
struct RowKernel {
    enum class Kind { Fwht, Compress, Decode } kind;
    Arithmetic arithmetic = Arithmetic::Exact;
};

// The row layout (lanes x values) a family's schedule of `kernel` is written
// for. A generator builds its algorithm for it and keeps it in its stages,
// where the schedule reads it back.
RowLayout row_layout(const BuildPlan &plan, const RowKernel &kernel);
// Whether exp's exact path is a branch taken only where needed (GPU threads)
// rather than computed for every element and selected (vector CPU code).
bool exp_branches(const BuildPlan &plan);
// How the family's kernels encode e4m3 (sm_90's instruction, or integer bits).
E4m3Encoder e4m3_encoder(const BuildPlan &plan);

struct FwhtStages {
    Var d{"d"}, row{"row"}, v{"v"}, lane{"lane"}, word{"word"};
    RowLayout layout;
    RotateQuant rotate;
    Func out;  // Tuple(codes, scale) over (d, row), or (word, row) when codes_per_word > 1
    int codes_per_word = 1;
};

// Softmax-pool compress of n pools, written to the cache (the output's
// update over `write`: (d, pool)) or returned as rows.
struct CompressToCacheStages {
    Var d{"d"}, j{"j"}, pool{"pool"}, v{"v"}, lane{"lane"};
    RowLayout layout;
    CompressPool compress;
    Func cache;
    RDom write;
};
struct CompressToRowsStages {
    Var d{"d"}, j{"j"}, pool{"pool"}, v{"v"}, lane{"lane"};
    RowLayout layout;
    CompressPool compress;
    Func out;  // Tuple(codes, scale) over (d, pool)
};

struct SeedTailStages {
    Var token{"token"};
    Func seeded;  // (token): whether the token is among its request's last P
    Func tail;
    RDom copy;  // (d, half, member, group): token group * G + member
};
// G of the seed copy's token groups (seed_tail's RDom).
int seed_group_size(const BuildPlan &plan);

// Decode: completions written to the cache over `write`
// (d, token, request), then stashes into the ring.
struct DecodeWriteStages {
    Var d{"d"}, j{"j"}, token{"token"}, request{"request"}, v{"v"}, lane{"lane"};
    RowLayout layout;
    Func ring_writer{"ring_writer"};  // (j, token, request): this call's token that last stashed member j's slot
    RDom earlier;                     // ring_writer's walk over the request's earlier tokens
    CompressPool compress;
    Func cache;
    RDom write;
    Expr ring_is_pow2;  // the ring arithmetic takes shifts and masks where a schedule specializes on it
};
struct DecodeStashStages {
    Func tail;
    RDom stash;        // (d, half, token, request)
    Func overwritten{"overwritten"};  // (token, request): a later token stashes into the same ring slot
    Expr ring_is_pow2;
};

// Decode in one kernel: the completions (`write`) and the stashes (`tail`
// over `stash`: (d, token, request, half), named and ordered as `write`).
struct DecodeUpdateStages {
    DecodeWriteStages write;
    Func tail;
    RDom stash;
    Func overwritten{"overwritten"};  // (token, request): a later token stashes into the same ring slot
};

// The expand family: one int32 output over (col, row).
struct ExpandStages {
    enum class Kind { PoolsAndAppendTail, PoolsToTokens, AppendTail } kind;
    Var col{"col"}, row{"row"};
    Func out;
    Expr pool_size;  // P, a power of two: a schedule may specialize on the common ones
};

// The index check: one word marked over the entries of an index input.
struct IndexCheckStages {
    Func mark;
    RDom entry;  // (i, row) of the index input
};

struct NumericsProbeStages {
    Var i{"i"};
    std::vector<Func> outputs;
};

// Each picks the family (cpu.h, cuda.h) from the plan's target.
void schedule_fwht(FwhtStages &s, const BuildPlan &plan);
void schedule_compress_to_cache(CompressToCacheStages &s, const BuildPlan &plan);
void schedule_compress_to_rows(CompressToRowsStages &s, const BuildPlan &plan);
void schedule_seed_tail(SeedTailStages &s, const BuildPlan &plan);
void schedule_decode_write(DecodeWriteStages &s, const BuildPlan &plan);
void schedule_decode_stash(DecodeStashStages &s, const BuildPlan &plan);
void schedule_decode_update(DecodeUpdateStages &s, const BuildPlan &plan);
void schedule_expand(ExpandStages &s, const BuildPlan &plan);
void schedule_index_check(IndexCheckStages &s, const BuildPlan &plan);
void schedule_numerics_probe(NumericsProbeStages &s, const BuildPlan &plan);

}  // namespace kpool
