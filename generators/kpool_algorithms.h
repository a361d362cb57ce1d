// The algorithms of the kpool kernels, as functions that build Halide Funcs
// and return the stages a schedule may touch. No scheduling here: schedules/
// places, tiles and vectorizes these stages per target.
//
// Every per-row stage is defined over (d, rows...) or, where lanes of a row
// interact, over (v, lane, rows...) (see RowLayout); `rows` are the
// generator's row dimensions (pool for compress, (token, request) for
// decode), so the same stages serve every kernel.
#pragma once

#include <vector>

#include "Halide.h"
#include "kpool_numerics.h"

namespace kpool {

using Halide::Expr;
using Halide::Func;
using Halide::Var;

// Argument lists (d, rows...) and (rows...).
std::vector<Var> with_d(const Var &d, const std::vector<Var> &rows);

// How a 128-wide row is spread over lanes of parallel hardware: each of
// lanes() lanes holds values_per_lane elements, in runs of `run` consecutive
// ones, the lanes' runs side by side:
//   d = ((v / run) * lanes() + lane) * run + v % run.
// run = values_per_lane: a lane holds one stretch of the row; run = 1: every
// lanes()-th element (a GPU warp's loads and stores of each v contiguous);
// run = 4 in between: a lane's run is one 8-byte load of bf16 and one 4-byte
// store of codes. Butterflies whose stride is a bit of v stay inside a lane,
// the others pair lanes (warp shuffles on a GPU, vector shifts on a CPU).
// The layout changes no arithmetic: every element sees the same operations
// in the same order. schedules/ chooses it per target.
struct RowLayout {
    int values_per_lane = 1;
    // How a lane reads its butterfly partner i ^ bit: at one computed index
    // (one warp shuffle on a GPU), or as two affine reads i + bit and i - bit
    // of which a select keeps one (contiguous vector loads on a CPU).
    bool partner_by_index = false;
    int run = 1;  // a power of two dividing values_per_lane
    // Each of a lane's values in a warp of its own: v is the warp of a block
    // of values_per_lane warps, a thread holds one element (with run = 1,
    // d = v * 32 + lane). The butterflies pairing values then pair warps
    // (shared memory on a GPU), and the absmax folds each warp's lanes
    // before the warps (max's order is free).
    bool values_are_warps = false;
    int lanes() const { return kHeadDim / values_per_lane; }
    Expr element(Expr v, Expr lane) const { return ((v / run) * lanes() + lane) * run + v % run; }
    Expr lane_of(Expr d) const { return (d / run) % lanes(); }
    Expr value_of(Expr d) const { return (d / (run * lanes())) * run + d % run; }
};

// Hadamard-128 over d of x(d, rows...): seven butterfly stages, stride 1 to
// 64 in that order, then the 1/sqrt(128) normalization, all in f32. Stages
// are defined over (v, lane, rows...).
struct Hadamard128 {
    std::vector<Func> stages;  // stages[0] is the input, stages[k] after stride 2^(k-1)
    Func output;               // (v, lane, rows...)
};
Hadamard128 hadamard128(Func x, const Var &v, const Var &lane, const std::vector<Var> &rows,
                        const RowLayout &layout);
// The same from an input already spread over lanes: input(v, lane, rows...)
// is element layout.element(v, lane) (it becomes stages[0]).
Hadamard128 hadamard128_of_lanes(Func input, const Var &v, const Var &lane, const std::vector<Var> &rows,
                                 const RowLayout &layout);

// Per-row fp8 quantization of x(v, lane, rows...) (already rounded to bf16).
// absmax is a max over each lane's values, then a butterfly over lanes after
// which every lane holds the row's absmax.
struct Fp8Row {
    Func lane_absmax;                // (lane, rows...); with values_are_warps each |x| (v, lane, rows...)
    std::vector<Func> absmax_stages;  // butterfly over lanes (with values_are_warps, each warp's)
    Func lane_scale;                 // (lane, rows...) f32, equal on every lane
    Func scale;                      // (d, rows...) f32: the row's scale, seen from element d
    Func quotient;                   // (d, rows...) f32: x / scale, before the e4m3 encoder clamps it
    Func codes;                      // (d, rows...) e4m3 bits
    E4m3Encoder encoder = E4m3Encoder::Integer;
    Expr round_scale;                // a schedule specializes on it (two kernels, no select)
};
// x / scale divides as `arith` does (one kernel of each arithmetic); codes
// come from `encoder` (the same bytes from each).
Fp8Row quantize_fp8_row(Func x, const Var &d, const Var &v, const Var &lane, const std::vector<Var> &rows,
                        const RowLayout &layout, Expr round_scale, const PoolArithmetic &arith,
                        E4m3Encoder encoder);

// bf16 row -> Hadamard-128 -> bf16 -> fp8: fwht128_quant_fp8 per row.
struct RotateQuant {
    Func input;  // f32 of the bf16 input row, (d, rows...), or (v, lane, rows...) from rotate_quantize_lanes
    Hadamard128 rotation;
    Func rotated;  // rounded to bf16, (v, lane, rows...)
    Fp8Row quant;
};
RotateQuant rotate_quantize(Func x_f32, const Var &d, const Var &v, const Var &lane,
                            const std::vector<Var> &rows, const RowLayout &layout, Expr round_scale,
                            const PoolArithmetic &arith, E4m3Encoder encoder);
// The same from x_lanes(v, lane, rows...), the f32 row already spread over
// lanes (a kernel that loads each lane's runs itself).
RotateQuant rotate_quantize_lanes(Func x_lanes, const Var &d, const Var &v, const Var &lane,
                                  const std::vector<Var> &rows, const RowLayout &layout, Expr round_scale,
                                  const PoolArithmetic &arith, E4m3Encoder encoder);

// Softmax pooling of P slots, per dim d:
//   s_j = score_j + ape_j, m = max_j s_j, p_j = exp(s_j - m),
//   pooled = (sum_j k_j p_j) / (sum_j p_j), sums in slot order from 0.
// key(d, j, rows...) and score(d, j, rows...) are f32; ape(d, j) f32.
struct SoftmaxPool {
    Func logit;         // s_j (d, j, rows...)
    Func max_logit;     // m   (d, rows...): s_0, then an update over later_slot
    Func weight;        // p_j (d, j, rows...)
    Func weighted_sum;  // Tuple(sum k_j p_j, sum p_j) (d, rows...): an update over slot
    Func pooled;        // (d, rows...)
    Halide::RDom later_slot;  // 1..P-1 (undefined when P == 1: no update)
    Halide::RDom slot;        // 0..P-1
    Arithmetic arithmetic = Arithmetic::Exact;  // of weight and the sums (schedules unroll the cheap one)
};
SoftmaxPool softmax_pool(Func key, Func score, Func ape, int pool_size, const Var &d,
                         const Var &j, const std::vector<Var> &rows, const PoolArithmetic &arith);

// The compress path: softmax pool -> bf16 -> Hadamard-128 -> bf16 -> fp8.
struct CompressPool {
    SoftmaxPool pool;
    Func pooled_bf16;
    RotateQuant rotate;
};
CompressPool compress_pool(Func key, Func score, Func ape, int pool_size, const Var &d, const Var &j,
                           const Var &v, const Var &lane, const std::vector<Var> &rows,
                           const RowLayout &layout, Expr round_scale, const PoolArithmetic &arith,
                           E4m3Encoder encoder);

// x / n and x % n of an x >= 0 by a positive n known only at run time (a
// ring, a cache page, a pool): floor division, as / and % are in Halide. A
// 32-bit x divides in unsigned 32-bit (an integer division is a software
// routine on a GPU, a 64-bit one three times the cost), a 64-bit x in
// 64-bit. Where n `may_be_pow2`, a select takes shift and mask when it is a
// power of two, as the engines' rings, pages and pools are: a schedule that
// specializes on `is_pow2` keeps only the shifts in that kernel (and only the
// division in the other); where n is known to be a power of two, shifts only.
struct Divisor {
    enum class Kind { Any, MaybePow2, Pow2 };
    Divisor(Expr n, Kind kind);
    // Shifts where `shifts` holds, which must imply that n is a power of two
    // (several divisors of one kernel may share one condition to specialize on).
    Divisor(Expr n, Expr shifts) : n(n), is_pow2(shifts), log2(Halide::count_trailing_zeros(n)) {}
    static Expr is_power_of_two(Expr n) { return (n & (n - 1)) == 0; }
    Expr n, is_pow2, log2;
    Expr div(Expr x) const;
    Expr mod(Expr x) const;
};

// Cache addressing (SPEC "Memory layouts"). The kernels see the planar K
// cache as two views of the same bytes, written together as one Tuple:
//   codes  (d, token, page): uint8 at page*stride + token*128 + d
//   scales (d, token, page): f32 at page*stride + page_size*128 + token*4,
//                            stride 0 along d (every d names the row's scale)
struct CacheSlot {
    Expr page;   // int32
    Expr token;  // int32, slot inside the page
};
// slot_in_window >= 0 is a flat slot counted from the first of pages
// [first_page, first_page + num_pages) where used; the clamps only bound
// the compiler's view.
CacheSlot cache_slot(Expr slot_in_window, const Divisor &page, Expr first_page, Expr num_pages);
// The views' shape: 128 codes per slot, one scale per slot broadcast over d.
void constrain_cache_views(std::vector<Halide::OutputImageParam> &views);
// A (codes, scale) row output's views (fwht's rows, compress's returned
// rows): the scales view shares the codes view's bounds, `extent` codes or
// words of codes per row from 0, and its first stride is 0 (the caller's
// [rows, 1] scales).
void constrain_row_views(std::vector<Halide::OutputImageParam> views, int extent);
// The cache-row write of compress and decode: over `write`, whose first
// variable is d and the rest a row's coordinates `row`, row `row` of `quant`
// is written to flat cache slot `loc` where `writes` holds. The views hold
// pages [min, min + extent) of dim 2: the whole cache (min 0), or a window
// of it (runtime/placement.h, cache_windows); a slot outside them writes
// nothing (device-side indices are not checked on the host; the index check
// marks the ones outside the cache). `cache` is the (codes, scales) Tuple output,
// its pure definition undef (only the written rows change); `page` divides
// loc by the page size (views[0].dim(1).extent()). `offsets_32bit`: the
// target addresses buffers with 32-bit offsets (no large_buffers: the GPU
// kernels, whose cache views are windows under 2 GiB).
void write_cache_rows(Func cache, Halide::RDom &write, const std::vector<Expr> &row, Expr loc, Expr writes,
                      const Fp8Row &quant, const Divisor &page, bool offsets_32bit);

// Rows of `param` start at multiples of `word` elements (strides of the
// `dims` given, the row dimension 0 starting at 0) of a base aligned to a
// word: Halide then proves a lane's run of a word aligned (the runtime
// checks both before it takes a words kernel).
template <typename Param>
void align_rows(Param &&param, std::initializer_list<int> dims, int word) {
    for (int d : dims) {
        param.dim(d).set_stride((param.dim(d).stride() / word) * word);
    }
    param.set_host_alignment(word * param.type().bytes());
}
// The words kernels store a lane's 4 codes as one 4-byte word.
constexpr int kCodeWord = 4;

// Tail ring addressing: tslot = block * ring + position in ring.
struct TailSlot {
    Expr block;
    Expr ring_pos;
};
TailSlot tail_slot(Expr tslot, const Divisor &ring, Expr num_blocks);
// The same from a block and ring position already split (>= 0 where used).
TailSlot clamp_tail_slot(Expr block, Expr ring_pos, Expr ring, Expr num_blocks);

// Prefill's tail seed (SPEC, seed_tail_cache) over tokens 0 .. n-1 whose tail
// slots are `slots` (int32 or int64; -1 past the batch, so the rule needs no
// case at its end): token t is among its request's last `pool_size` tokens,
// and copied into the ring, iff its slot is a tail slot (>= 0, inside the
// tail's blocks) and the slot pool_size tokens ahead is padding or in another
// tail block.
struct TailSeed {
    Func slots;
    Divisor ring;
    Expr num_blocks;
    Func seeded;  // (token): bool
    TailSeed(Func slots, Expr pool_size, Expr ring, Expr num_blocks, Var token);
    // The seed's copy over `r`, where `token` (in 0 .. n - 1 where seeded; a
    // schedule may round the loop up past n) is seeded: the token's key at
    // `half` 0, its gate score at 1, element `d` of its ring row.
    void write(Func tail, Halide::RDom &r, Expr d, Expr half, Expr token, Func key, Func gate_score, Expr n) const;
};

}  // namespace kpool
