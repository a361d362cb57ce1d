// What a generator's algorithm and its schedule share: the stages each
// algorithm defines (one struct per kernel, the Funcs, Vars and RDoms a
// schedule places), what the algorithm asks of the schedule before it is
// written (ScheduleDecisions), and the schedule_*() hooks. The algorithms
// (generators/) state the math only and include nothing from schedules/;
// the schedule families (schedules/: cpu.cpp for the host CPU, cuda/ for
// CUDA, each family's parameters in <family>.knobs) implement the hooks, and
// schedules/kpool_schedules.cpp picks the family from the target.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "Halide.h"
#include "kpool_algorithms.h"

namespace kpool {

using Halide::RDom;
using Halide::Target;

// A family's schedule parameters by name, as the build passes them
// (knobs=name:value,...: the values of schedules/<family>.knobs, read and
// checked against their legal values and `require` lines by
// schedules/knobs.py at configure time). Split once per generator; each
// family's plan reads them into typed fields (KnobReader, schedules/knobs.h).
using KnobValues = std::map<std::string, int>;
KnobValues split_knobs(const std::string &family, const std::string &wire);  // schedules/knobs.cpp

// What the generator knows of its build: the target, for GPU targets which
// GPU family the schedule is tuned for (Halide 21 cannot name sm_90, so the
// capability alone does not say) and the hardware features of its row in
// the family table (CMakeLists.txt), and the family's schedule parameters.
struct BuildPlan {
    Target target;
    std::string gpu;           // "" (the CPU), or a family's name
    std::string gpu_features;  // "+"-separated, e.g. "e4m3"
    KnobValues knobs;
    bool autoscheduled = false;  // a twin: an autoscheduler schedules it, not schedules/
    std::string family() const { return gpu.empty() ? "cpu" : gpu; }

    // The integer a rounding barrier compares (kpool_numerics.h): a buffer's
    // outer stride, or in a twin its outer extent (an autoscheduler bounds
    // every expression from estimates, and Halide 21 takes none for a
    // stride; no extent is INT32_MIN either).
    Halide::Expr barrier_operand(const Halide::Internal::Dimension &outer) const {
        return autoscheduled ? outer.extent() : outer.stride();
    }

    // Whether the family's row lists `feature`.
    bool has_gpu_feature(const std::string &feature) const {
        return ("+" + gpu_features + "+").find("+" + feature + "+") != std::string::npos;
    }
};

// The base of every kpool generator: the parameters each kernel's build
// passes (cmake/KpoolKernels.cmake), read back as its BuildPlan, and the
// stages its algorithm defines for a family's schedule hook.
template <typename T, typename Stages>
class KpoolGenerator : public Halide::Generator<T> {
public:
    Halide::GeneratorParam<std::string> gpu{"gpu", ""};                    // BuildPlan::gpu
    Halide::GeneratorParam<std::string> gpu_features{"gpu_features", ""};  // BuildPlan::gpu_features
    Halide::GeneratorParam<std::string> knobs{"knobs", ""};                // BuildPlan::knobs

protected:
    // Made once: generate() and schedule() read the same plan.
    const BuildPlan &build_plan() {
        if (!plan_) {
            const std::string family = gpu.value().empty() ? "cpu" : gpu.value();
            plan_ = BuildPlan{this->get_target(), gpu, gpu_features, split_knobs(family, knobs),
                              this->using_autoscheduler()};
        }
        return *plan_;
    }

    // The family's schedule of this kernel's stages (a hook below), unless
    // an autoscheduler schedules it (a twin): every generator's schedule()
    // sets its estimates, then calls this.
    void schedule_with(void (*hook)(Stages &, const BuildPlan &)) {
        if (!this->using_autoscheduler()) {
            hook(stages, build_plan());
        }
    }

    Stages stages;

private:
    std::optional<BuildPlan> plan_;
};

// The kernel a generator asks its decisions for.
struct KernelAsked {
    enum class Kind { Fwht, Compress, Decode, SeedTail } kind;
    Arithmetic arithmetic = Arithmetic::Exact;
    // A words kernel: a lane's values of a row move as aligned words
    // (compress's CompressLaneLoads, decode's aligned_rows).
    bool words = false;
    // Decode's block per request: a completion's row over the warps of a
    // block, an element a thread (RowLayout::values_are_warps).
    bool row_over_warps = false;
    bool is_row_kernel() const { return kind != Kind::SeedTail; }
};

// What a family's schedule decides that an algorithm is written for, asked
// once per kernel before the algorithm is defined: the algorithm takes each
// as an explicit parameter.
struct ScheduleDecisions {
    // The row layout (lanes x values in runs) of a row kernel (fwht,
    // compress, decode; a row is a query row or a pool):
    // a family may spread rows over lanes differently per kernel (more
    // values per lane: fewer instructions per element, more registers).
    RowLayout layout;
    // Whether exp's exact path is a branch taken only where needed (GPU
    // threads) rather than computed for every element and selected (vector
    // CPU code).
    bool exp_branches = false;
    // Whether decode picks a pool member's source (this call's inputs or
    // the ring) with a branch, so a member is one load (GPU threads in a
    // words kernel: the source is the same for a whole warp, and a lane's
    // run is one vector), rather than a select of both loads (vector CPU
    // code; element by element, a branch per element costs more than the
    // load).
    bool member_branches = false;
    // Whether a branching exp's fast path is the fma one (exp_f32_fast_certified:
    // fewer instructions, more registers for its f64 coefficients) rather than
    // the degree-10 polynomial (kpool_numerics.h).
    bool exp_fma_fast_path = false;
    // How the family encodes e4m3 (sm_90's instruction, or integer bits).
    E4m3Encoder e4m3 = E4m3Encoder::Integer;
    // Tokens per group of the seed copy's RDom (the warps of a GPU block).
    int seed_group_size = 1;
};
ScheduleDecisions schedule_decisions(const BuildPlan &plan, const KernelAsked &kernel);

struct FwhtStages {
    Var d{"d"}, row{"row"}, v{"v"}, lane{"lane"}, word{"word"};
    RowLayout layout;
    RotateQuant rotate;
    Func out;  // Tuple(codes, scale) over (d, row), or (word, row) when codes_per_word > 1
    int codes_per_word = 1;
    // The words kernel: each lane's runs of the input row as 32-bit words of
    // two bf16, (pair, run_index, lane, row), that lane's pair-th word of its
    // run_index-th run; a schedule loads a lane's run in wide vector loads.
    Func lane_pairs;
    Var pair{"pair"}, run_index{"run_index"};
};

// What compress's schedules may specialize on.
struct CompressConditions {
    // Every input's rows start 16-byte aligned: the caller's
    // data (checked by the runtime, the aligned_data input) and the strides
    // (checked in the kernel). Wide vector accesses need it.
    Expr aligned;
    Expr round_scale;  // the quotient multiplies by the scale's exact reciprocal: no division
};

// Compress's words kernels (CUDA, rows of 16-byte-aligned data and
// strides): each lane reads its own V values of every slot, as items of
// (item, j, lane, pool) -- bf16 as 32-bit words of two (the first in the low
// half), f32 as itself; ape as (item, j, lane). A schedule loads a lane's
// items in wide vectors. Undefined in the element kernels.
struct CompressLaneLoads {
    Func key, score, ape;
    Var item{"item"};
    int key_items = 0, score_items = 0, ape_items = 0;  // per lane and slot
};

// Softmax-pool compress of n pools, written to the cache (the output's
// update over `write`: (d, pool)) or returned as rows.
struct CompressToCacheStages {
    Var d{"d"}, j{"j"}, pool{"pool"}, v{"v"}, lane{"lane"};
    RowLayout layout;
    CompressConditions conditions;
    CompressPool compress;
    CompressLaneLoads lane_loads;
    Func cache;
    RDom write;
};
struct CompressToRowsStages {
    Var d{"d"}, j{"j"}, pool{"pool"}, v{"v"}, lane{"lane"};
    RowLayout layout;
    CompressConditions conditions;
    CompressPool compress;
    CompressLaneLoads lane_loads;
    Func out;  // Tuple(codes, scale) over (d, pool)
};

struct SeedTailStages {
    Var token{"token"};
    Func seeded;  // (token): whether the token is among its request's last P
    Func tail;
    RDom copy;  // (d, half, member, group): token group * G + member
};

// The prefill insert on token rows with the tail seed in one kernel:
// compress's stages over the pools of the rows (`write`: (d, pool)), and
// the seed's copy over (d, token, half), an RDom named as `write` so that
// a schedule may fuse their loops (compute_with).
struct CompressAndSeedStages : CompressToCacheStages {
    Var token{"token"};
    Func seeded;  // (token): whether the token is among its request's last P
    Func tail;
    RDom copy;  // (d, token, half)
};

// Decode: completions written to the cache over `write`
// (d, token, request), then stashes into the ring.
struct DecodeWriteStages {
    Var d{"d"}, j{"j"}, token{"token"}, request{"request"}, v{"v"}, lane{"lane"};
    RowLayout layout;
    // (j, token, request): this call's token that last stashed member j's
    // slot (undefined where the completions are defined ring_in_order).
    Func ring_writer{"ring_writer"};
    RDom earlier;                     // ring_writer's walk over the request's earlier tokens
    // Pool member j of token t's completion, bf16 bits (d, j, token, request):
    // this call's key and slot_score of a token or the ring's.
    Func member_key_bits{"member_key_bits"}, member_score_bits{"member_score_bits"};
    CompressPool compress;
    Func cache;
    RDom write;
    // Ring and cache page both powers of two: a schedule that specializes
    // on it keeps only shifts and masks there (Divisor), no division.
    Expr pow2_ring_and_page;
    // The generator's pipeline, for a schedule's lowering passes.
    Halide::Pipeline pipeline;
};
struct DecodeStashStages {
    Func tail;
    RDom stash;                       // (d, token, request, half)
    Func overwritten{"overwritten"};  // (token, request): a later token stashes into the same ring slot
    Func stash_row{"stash_row"};      // (d, half, token, request): what a token stashes (its key, its score)
    Expr ring_is_pow2;
};

// How the one-kernel decode spreads a call over a GPU's warps (a schedule
// choice; the algorithm is the same): a block per request, a warp per token
// (every completion of a request at once: long calls), or a warp per
// request, its tokens in a loop (many requests with few tokens each, where
// a block per request would leave most warps idle), or a block per request
// whose four warps share each completion, a dim a thread, its tokens in a
// loop (the reference's shape: a completion's latency over 128 threads).
enum class DecodeLayout { WarpPerToken, WarpPerRequest, BlockPerRequest };

// Decode in one kernel: the completions (`write`) and the stashes (`tail`
// over `stash`: (d, token, request, half), named and ordered as `write`).
struct DecodeUpdateStages {
    DecodeLayout layout = DecodeLayout::WarpPerToken;
    bool aligned_rows = false;  // a lane's bf16 and code runs are aligned words (vector loads and stores)
    DecodeWriteStages write;
    DecodeStashStages stashes;
};

// The expand family: one int32 output over (col, row).
struct ExpandStages {
    enum class Kind { PoolsAndAppendTail, PoolsToTokens, AppendTail } kind;
    Var col{"col"}, row{"row"};
    Func out;
    Expr pool_size;  // P, a power of two: a schedule may specialize on the common ones

    void define(Kind k, Func f, Expr P) {
        kind = k;
        out = std::move(f);
        pool_size = std::move(P);
    }
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

// The sizes Halide's autoschedulers tune for (set_estimates, in every
// generator's schedule(), which steps aside under using_autoscheduler()):
// an engine's 16K-token prefill and a decode step of 512 requests x 2.
namespace estimate {
constexpr int kRows = 16384 * 64;  // fwht query rows: tokens x heads
constexpr int kPools = 4096, kPoolSize = 4, kTokens = 16384;
constexpr int kRequests = 512, kNextN = 2;
constexpr int kCacheBlocks = 1024, kBlockSize = 64, kTailBlocks = 1024;
constexpr int kExpandRows = 1024, kTopk = 2048, kSeqLen = 131072;
// A scalar Input that sizes a footprint (pool_size: a token and the one P
// ahead) is estimated at its largest legal value (runtime/validate.cpp):
// Anderson2021 sizes such footprints from the estimate (bound_extent), and
// Halide checks that bound inside a CUDA kernel with a trap, so an estimate
// below the value called faults the context.
constexpr int kMaxPoolSize = 64;
// The shapes more than one generator shares.
inline Halide::Region tail_ring(int ring) { return {{0, kHeadDim}, {0, ring}, {0, 2}, {0, kTailBlocks}}; }
inline Halide::Region kv_cache() { return {{0, kHeadDim}, {0, kBlockSize}, {0, kCacheBlocks}}; }
// An output written in place (a scatter over an RDom into the cache or the
// tail ring): an autoscheduler tiles its undef pure stage by the estimate
// (ShiftInwards), and the tiles become the region Halide checks the view
// holds; so it is estimated at the least a call passes, one token of one
// block (a tile of 8 pages over a smaller cache: "Output buffer cache.0 is
// accessed at -47, which is before the min (0) in dimension 2").
inline Halide::Region in_place_cache() { return {{0, kHeadDim}, {0, 1}, {0, 1}}; }
inline Halide::Region in_place_tail() { return {{0, kHeadDim}, {0, 1}, {0, 2}, {0, 1}}; }
inline Halide::Region decode_tokens() { return {{0, kNextN}, {0, kRequests}}; }         // (token, request)
inline Halide::Region decode_rows() { return {{0, kHeadDim}, {0, kNextN}, {0, kRequests}}; }  // (d, token, request)
}  // namespace estimate

// The schedule hooks, one line each: X(hook, its stages). Declared here
// (each picks the family from the plan's target), by each family (cpu.h,
// cuda.h) and dispatched (schedules/kpool_schedules.cpp) from this list.
#define KPOOL_SCHEDULE_HOOKS(X)                         \
    X(schedule_fwht, FwhtStages)                        \
    X(schedule_compress_to_cache, CompressToCacheStages) \
    X(schedule_compress_to_rows, CompressToRowsStages)   \
    X(schedule_compress_and_seed, CompressAndSeedStages) \
    X(schedule_seed_tail, SeedTailStages)               \
    X(schedule_decode_write, DecodeWriteStages)         \
    X(schedule_decode_stash, DecodeStashStages)         \
    X(schedule_decode_update, DecodeUpdateStages)       \
    X(schedule_expand, ExpandStages)                    \
    X(schedule_index_check, IndexCheckStages)
#define KPOOL_DECLARE_SCHEDULE_HOOK(hook, Stages) void hook(Stages &s, const BuildPlan &plan);
KPOOL_SCHEDULE_HOOKS(KPOOL_DECLARE_SCHEDULE_HOOK)
// What a family provides (inside its namespace: cpu.h, cuda.h): the hooks
// and the row layout its kernels ask for (ScheduleDecisions::layout).
#define KPOOL_SCHEDULE_FAMILY                                                  \
    RowLayout row_layout(const BuildPlan &plan, const KernelAsked &kernel); \
    KPOOL_SCHEDULE_HOOKS(KPOOL_DECLARE_SCHEDULE_HOOK)
void schedule_numerics_probe(NumericsProbeStages &s, const BuildPlan &plan);

}  // namespace kpool
