// The bit-exact numerics every kpool kernel shares (SPEC.md, "Shared
// numerics"). Rounding and encoding are done on integer bits, not with float
// casts: GPU code is built with flush-to-zero and unsafe float math, and the
// e4m3 subnormals and bf16 ties must come out the same on every target. Where
// a GPU has an instruction that rounds exactly so, it is called instead
// (cvt.rn.bf16.f32: kPtxRoundBf16; sm_90's cvt.rn.satfinite.e4m3x2.f32).
#pragma once

#include <map>
#include <string>

#include "Halide.h"
#include "kpool/kpool.h"  // KPOOL_HEAD_DIM, KPOOL_MAX_POOL_SIZE: the contract's, defined once

namespace kpool {

constexpr int kHeadDim = KPOOL_HEAD_DIM;
constexpr float kFp8Max = 448.0f;
constexpr float kFp8MaxInv = float(1.0 / 448.0);
constexpr float kAbsmaxFloor = 1e-4f;
constexpr float kHadamardNorm = 0.08838834764831845f;  // 1/sqrt(128), exact in f32

// bf16 bits (uint16) -> f32: exact.
Halide::Expr bf16_to_f32(Halide::Expr bits);
// f32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet bit set).
Halide::Expr f32_to_bf16(Halide::Expr x);
// f32 -> nearest bf16, as f32 (the reference's `.to(bf16).to(f32)`).
Halide::Expr round_to_bf16(Halide::Expr x);

// |x| by clearing the sign bit: one instruction on every target.
Halide::Expr abs_f32(Halide::Expr x);

// max and min as the reference's (SPEC step 4, "Non-finite values"): a NaN
// operand gives the other operand, two NaNs give NaN. On CUDA, PTX's
// max.f32 / min.f32 are that rule: called as the LLVM intrinsics the PTX
// backend lowers them to (Halide's own float max / min under strict_float
// become setp.gt + selp there, as a > b ? a : b does on x86, NaN whenever b
// is). Elsewhere the rule is written out. The choice is made when the
// kernel is built (a select on the target inside the IR would leave the
// written-out form's lets in GPU code, which Halide's warp-shuffle lowering
// rejects).
struct MaxMinRule {
    bool ptx = false;  // max.f32 / min.f32: a CUDA kernel
    Halide::Expr max(Halide::Expr a, Halide::Expr b) const;
    Halide::Expr min(Halide::Expr a, Halide::Expr b) const;
};
MaxMinRule max_min_rule(const Halide::Target &target);

// f32 -> float8_e4m3fn bits, round to nearest even, subnormals included.
// Expects |x| <= 448 or NaN (callers clamp first, as the reference does,
// which turns NaN into -448).
Halide::Expr e4m3_encode(Halide::Expr x);

// How f32 values become e4m3 codes:
//  - Integer: e4m3_encode on the clamped value, on integer bits (every target);
//  - Sm90: sm_90's cvt.rn.satfinite.e4m3x2.f32, two values per instruction,
//    round to nearest even, saturating at +-448 (the clamp's upper half, in
//    hardware; its NaN to 0x7f is not the clamp's -448, so the lower half,
//    max.f32 with -448, stays): sm_89 and later, a family whose row in the
//    family table lists e4m3. Halide 21 names capability 8.6 at most: the
//    build raises the PTX header to the family's target (cmake/ptx_for_family.py).
// The Integer encoder clamps with the rule written out (it may run on CUDA
// too: correct there, a few instructions more than max.f32 / min.f32).
enum class E4m3Encoder { Integer, Sm90 };
// x clamped to [-448, 448] as the reference clamps, min(max(x, -448), 448)
// with NaN-ignoring max and min (NaN becomes -448), then its e4m3 code.
Halide::Expr e4m3_encode_saturated(Halide::Expr x, E4m3Encoder encoder);
// The codes of four values, first in the low byte (little-endian memory
// order): one 32-bit store.
Halide::Expr e4m3_word_saturated(const Halide::Expr (&x)[4], E4m3Encoder encoder);

// ue8m0 scale of a row: 2^ceil(log2(m)) for m = max(absmax, 1e-4) / 448
// (NaN-ignoring max: a NaN absmax floors to 1e-4),
// exact from the bits of m; without round_scale, m itself.
Halide::Expr fp8_scale(Halide::Expr absmax, Halide::Expr round_scale, const MaxMinRule &rule);
Halide::Expr ue8m0_scale(Halide::Expr m);
// 1 / scale for a ue8m0 scale (a power of two), exact from its bits: x times
// it rounds exactly as x / scale does, at the cost of one multiply.
Halide::Expr ue8m0_reciprocal(Halide::Expr scale);

// GPU code is compiled with floating-point contraction on, so a*b + c may
// become one fma, whatever strict_float says. The contract rounds every
// product. A barrier ORs the product's bits with an integer the compiler
// cannot prove is 0 (`opaque_zero`: whether a buffer's outer stride is
// INT32_MIN, which no buffer kpool passes has), so the product is rounded on
// its own. The sentinel must stay undecidable under every fact a schedule
// specializes on (alignment of that same stride included).
struct RoundingBarrier {
    Halide::Expr opaque_zero;  // uint32 0 at run time
    Halide::Expr operator()(Halide::Expr product) const;
};
RoundingBarrier rounding_barrier(Halide::Expr buffer_stride);

// exp(x) for f32 x, correctly rounded: a fast path wherever its rounding
// is certain, else the exact path, identical on every target (the
// degree-13 polynomial with every product rounded on its own: rounding
// barriers). With `branch` (GPU threads) the exact path is a branch taken
// where the fast one is not certain; otherwise (vector CPU code) both are
// computed and selected. The fast path:
//  - fma_fast_path (GPU threads only: vector code would scalarize the
//    fmas): exp_f32_fast_certified, certain for all but ~2^-14 of inputs;
//  - otherwise f64 with a degree-10 Taylor polynomial on |r| <= ln2/2, free
//    for the compiler to contract into fmas; relative error < 2^-40, so
//    whenever the f64 result is further than that from an f32 rounding
//    midpoint (all but ~2^-15 of inputs) its rounding to f32 is the
//    correctly rounded one, whatever fmas a target used.
// Platform expf and Halide's own exp are not correctly rounded.
Halide::Expr exp_f32_correctly_rounded(Halide::Expr x, const RoundingBarrier &round, bool branch,
                                       bool fma_fast_path = false);

// The GPU's fast path of exp: x = n ln2 + r reduced in f64 (one fma: n ln2
// exact inside it), exp(r) by a degree-8 fit (eight fmas, relative error
// < 2^-39.5 in all), rounded to f32 and scaled by 2^n on the exponent bits
// (both conversions, f32 -> f64 and f64 -> f32, on integer bits).
// Every f64 operation is an explicit fma (llvm.fma.f64) or exact, so the
// value and `certain` have the same bits on every target: the test of every
// f32 input on the CPU (test_numerics.cpp, the exp probe) holds for the GPU.
// `certain`: -86.5 < x < 88 (a normal result) and the f64 value at least 2^14
// f64 ulps from the midpoint between two f32s, where `value` is exp(x)
// correctly rounded.
// The exact path alone: every product rounded on its own (barriers), so
// every target computes the same f64 bits; 0 below -104, +inf above 89.
Halide::Expr exp_f32_exact(Halide::Expr x, const RoundingBarrier &round);

struct ExpFastPath {
    Halide::Expr value, certain;
};
ExpFastPath exp_f32_fast_certified(Halide::Expr x);

// The two arithmetics of the steps where the Triton reference is
// approximate (SPEC, shared numerics 5; include/kpool/kpool.h):
//  - Exact, the contract: correctly rounded exp, every product rounded on its
//    own, IEEE division; every target, CPU and GPU agree bit for bit;
//  - Triton, the instructions of the reference's PTX (Triton's defaults):
//    exp(t) = ex2.approx.f32(t * log2(e)), the weighted sum accumulated with
//    fma.rn.f32, div.full.f32 for both divisions; CUDA only, where it matches
//    the reference bit for bit.
// The ue8m0 scale needs no second form: m = absmax * (1/448) of a bf16
// absmax is never within an ulp above a power of two unless it is one, so
// the reference's ceil(log2(m)) is the exact one.
enum class Arithmetic { Exact, Triton };
// The names the build passes (arithmetic=exact|triton): a
// GeneratorParam<Arithmetic> of the generators that have both, which
// Halide checks against these.
inline const std::map<std::string, Arithmetic> kArithmeticNames = {{"exact", Arithmetic::Exact},
                                                                   {"triton", Arithmetic::Triton}};
// `arithmetic` for `target`: Triton uses PTX instructions, CUDA only (a
// CompileError elsewhere).
Arithmetic arithmetic_for(Arithmetic arithmetic, const Halide::Target &target);

// The steps that differ, for one kernel build.
struct PoolArithmetic {
    Arithmetic kind = Arithmetic::Exact;
    RoundingBarrier round;      // Exact: products rounded on their own
    bool exp_branches = false;  // Exact: exp's exact path as a branch (GPU threads)
    MaxMinRule max_min;         // the softmax max and the row's absmax ignore NaN; ptx: on CUDA
    bool exp_fma_fast_path = false;  // Exact, branching: exp_f32_fast_certified as the fast path
    bool ptx_round_bf16 = false;     // bf16 rounding as cvt.rn.bf16.f32 (kPtxRoundBf16): a CUDA kernel

    Halide::Expr exp(Halide::Expr t) const;
    // sum + k * p, in the order the reference accumulates.
    Halide::Expr accumulate(Halide::Expr sum, Halide::Expr k, Halide::Expr p) const;
    Halide::Expr divide(Halide::Expr a, Halide::Expr b) const;
    // f32 -> nearest bf16, as f32: round_to_bf16, on CUDA as one
    // instruction (kPtxRoundBf16).
    Halide::Expr round_to_bf16(Halide::Expr x) const;
};
// The steps of a kernel built for `target` in `kind`: max and min by
// max_min_rule(target), bf16 rounding by instruction on CUDA; the exp as
// the schedule decided (PoolArithmetic's fields).
PoolArithmetic pool_arithmetic(Arithmetic kind, const Halide::Target &target, RoundingBarrier round = {},
                               bool exp_branches = false, bool exp_fma_fast_path = false);

// On CUDA, bf16 rounding is PTX's cvt.rn.bf16.f32 (sm_80 and later), one
// instruction where the integer form takes about nine. Halide 21 can neither
// cast to bf16 in PTX (its LLVM type for bf16 is i16) nor declare LLVM's bf16
// intrinsics (they return bfloat), so a kernel calls an extern device
// function of this name, and the build replaces every call with the
// instruction (cmake/ptx_for_family.py; a call left over fails the build).
// The instruction's result differs from round_to_bf16's only in a NaN's bits
// (it gives the canonical 0x7fff), which no output carries: the absmax and
// the softmax max skip a NaN whatever its bits, and the e4m3 clamp maps every
// NaN to -448.
constexpr const char *kPtxRoundBf16 = "kpool_cvt_rn_bf16_f32";

}  // namespace kpool
