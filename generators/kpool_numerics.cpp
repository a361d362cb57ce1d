#include "kpool_numerics.h"

#include <limits>

using namespace Halide;

namespace kpool {

Expr bf16_to_f32(Expr bits) {
    return reinterpret<float>(cast<uint32_t>(bits) << 16);
}

Expr f32_to_bf16(Expr x) {
    Expr u = reinterpret<uint32_t>(x);
    Expr is_nan = (u & 0x7fffffff) > 0x7f800000;
    Expr rounded = (u + (0x7fff + ((u >> 16) & 1))) >> 16;
    return cast<uint16_t>(select(is_nan, (u >> 16) | 0x40, rounded));
}

Expr round_to_bf16(Expr x) {
    return bf16_to_f32(f32_to_bf16(x));
}

Expr abs_f32(Expr x) {
    return reinterpret<float>(reinterpret<uint32_t>(x) & 0x7fffffff);
}

namespace {

// A call the PTX backend lowers to one instruction: an LLVM intrinsic,
// declared by name.
Expr ptx_instruction(const char *intrinsic, const std::vector<Expr> &args) {
    return Internal::Call::make(Float(32), intrinsic, args, Internal::Call::PureExtern);
}

}  // namespace

Expr MaxMinRule::max(Expr a, Expr b) const {
    return ptx ? ptx_instruction("llvm.maxnum.f32", {a, b}) : select(a > b || is_nan(b), a, b);
}

Expr MaxMinRule::min(Expr a, Expr b) const {
    return ptx ? ptx_instruction("llvm.minnum.f32", {a, b}) : select(a < b || is_nan(b), a, b);
}

MaxMinRule max_min_rule(const Target &target) {
    return {target.has_feature(Target::CUDA)};
}

Expr e4m3_encode(Expr x) {
    Expr u = reinterpret<uint32_t>(x);
    Expr sign = cast<uint8_t>((u >> 24) & 0x80);
    Expr mag = u & 0x7fffffff;
    // Normals (|x| >= 2^-6, f32 biased exponent >= 121): rebias the exponent
    // from 127 to 7 and drop 20 mantissa bits, rounding to nearest even; a
    // rounding carry moves into the exponent field as it should.
    Expr rebiased = mag - (cast<uint32_t>(120) << 23);
    Expr normal = (rebiased + (0x7ffff + ((rebiased >> 20) & 1))) >> 20;
    // Subnormals count units of 2^-9: |x| * 2^9 (exact) rounded to the
    // nearest integer, ties to even; 8 units is the smallest normal, code 8.
    Expr subnormal = cast<uint32_t>(round(abs_f32(x) * 512.0f));
    Expr code = select(mag >= (cast<uint32_t>(121) << 23), normal, subnormal);
    Expr is_nan = mag > 0x7f800000;
    return select(is_nan, sign | cast<uint8_t>(0x7f), sign | cast<uint8_t>(code));
}

namespace {

// cvt.rn.satfinite.e4m3x2.f32: the code of `high` in the high byte of the
// result, that of `low` in the low byte.
Expr e4m3x2_sm90(Expr high, Expr low) {
    return Internal::Call::make(UInt(16), "llvm.nvvm.ff.to.e4m3x2.rn", {high, low}, Internal::Call::PureExtern);
}

// The reference's clamp, min(max(x, -448), 448), the rule written out.
Expr clamp_fp8(Expr x) {
    const MaxMinRule written_out{false};
    return written_out.min(written_out.max(x, -kFp8Max), kFp8Max);
}

// The clamp's lower half, max.f32 (sm_90 is CUDA): cvt.rn.satfinite does
// the upper one, and its NaN code (0x7f) is never asked for.
Expr sm90_operand(Expr x) {
    return MaxMinRule{true}.max(x, -kFp8Max);
}

}  // namespace

Expr e4m3_encode_saturated(Expr x, E4m3Encoder encoder) {
    if (encoder == E4m3Encoder::Sm90) {
        return cast<uint8_t>(e4m3x2_sm90(0.0f, sm90_operand(x)));
    }
    return e4m3_encode(clamp_fp8(x));
}

Expr e4m3_word_saturated(const Expr (&x)[4], E4m3Encoder encoder) {
    if (encoder == E4m3Encoder::Sm90) {
        return cast<uint32_t>(e4m3x2_sm90(sm90_operand(x[1]), sm90_operand(x[0]))) |
               (cast<uint32_t>(e4m3x2_sm90(sm90_operand(x[3]), sm90_operand(x[2]))) << 16);
    }
    Expr word = cast<uint32_t>(0);
    for (int i = 0; i < 4; i++) {
        word = word | (cast<uint32_t>(e4m3_encode(clamp_fp8(x[i]))) << (8 * i));
    }
    return word;
}

Expr ue8m0_scale(Expr m) {
    Expr u = reinterpret<uint32_t>(m);
    Expr exponent = (u >> 23) & 0xff;
    Expr inexact = (u & 0x7fffff) != 0;
    return reinterpret<float>((exponent + select(inexact, cast<uint32_t>(1), cast<uint32_t>(0)))
                              << 23);
}

Expr ue8m0_reciprocal(Expr scale) {
    Expr exponent = (reinterpret<uint32_t>(scale) >> 23) & 0xff;
    // A finite ue8m0 scale is at most 2^120 (absmax <= FLT_MAX), so 2^-e is
    // normal; an infinite or NaN scale takes the division's value (0 or NaN).
    return select(exponent >= 254, 1.0f / scale, reinterpret<float>((254 - exponent) << 23));
}

Expr fp8_scale(Expr absmax, Expr round_scale, const MaxMinRule &rule) {
    Expr m = rule.max(absmax, kAbsmaxFloor) * kFp8MaxInv;
    return select(round_scale, ue8m0_scale(m), m);
}

namespace {

Expr f64(double v) {
    return Internal::make_const(Float(64), v);
}

}  // namespace

RoundingBarrier rounding_barrier(Expr buffer_stride) {
    // The sentinel is INT32_MIN, a multiple of every power of two, so no
    // alignment a schedule specializes on (stride % 8 == 0 for 16-byte rows)
    // lets the simplifier decide the comparison. An odd sentinel did: in the
    // aligned compress kernels it folded to 0, the OR went away and every
    // k*p product was contracted into the sum's fma (1-code differences).
    return {select(buffer_stride == std::numeric_limits<int32_t>::min(), cast<uint32_t>(1), cast<uint32_t>(0))};
}

Expr RoundingBarrier::operator()(Expr product) const {
    if (product.type() == Float(64)) {
        return reinterpret<double>(reinterpret<uint64_t>(product) | cast<uint64_t>(opaque_zero));
    }
    return reinterpret<float>(reinterpret<uint32_t>(product) | opaque_zero);
}

namespace {

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // high 32 bits of ln 2: n * kLn2Hi is exact
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kLog2E = 1.4426950408889634;

// 2^n for an integral f64 n inside the f64 exponent range.
Expr pow2(Expr n) {
    return reinterpret<double>(cast<uint64_t>(cast<int64_t>(n) + 1023) << 52);
}

}  // namespace

Expr exp_f32_exact(Expr x, const RoundingBarrier &round) {
    Expr xd = cast<double>(x);
    // Beyond these, exp is 0 or +inf in f32 (and the polynomial's 2^n would
    // leave the f64 exponent range).
    Expr in_range = xd > f64(-104.0) && xd < f64(89.0);
    Expr xc = clamp(xd, f64(-104.0), f64(89.0));
    Expr n = floor(round(xc * f64(kLog2E)) + f64(0.5));
    Expr r = (xc - round(n * f64(kLn2Hi))) - round(n * f64(kLn2Lo));
    // Horner form of sum_{k=0}^{13} r^k / k!.
    Expr p = f64(1.0 / 6227020800.0);
    const double inv_fact[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                               1.0 / 362880.0,    1.0 / 40320.0,    1.0 / 5040.0,
                               1.0 / 720.0,       1.0 / 120.0,      1.0 / 24.0,
                               1.0 / 6.0,         0.5,              1.0,
                               1.0};
    for (double c : inv_fact) {
        p = round(p * r) + f64(c);
    }
    Expr y = cast<float>(p * pow2(n));
    Expr inf = reinterpret<float>(cast<uint32_t>(0x7f800000));
    return select(is_nan(x), x, select(in_range, y, select(xd > f64(0.0), inf, 0.0f)));
}

namespace {

// The fast path's f64 value of exp(x), relative error < 2^-40 with or
// without fma: |r| <= ln2/2 + tiny, so the degree-10 remainder is at most
// 0.3466^11/11! * e^0.3466 / e^-0.3466 < 2^-41; the reduction (n * kLn2Hi
// is exact, so is x - n * kLn2Hi) and eleven f64 roundings add < 2^-50.
Expr exp_f64_fast(Expr x) {
    Expr xd = clamp(cast<double>(x), f64(-104.0), f64(89.0));
    Expr n = floor(xd * f64(kLog2E) + f64(0.5));
    Expr r = (xd - n * f64(kLn2Hi)) - n * f64(kLn2Lo);
    double fact = 3628800.0;  // 10!
    Expr p = f64(1.0 / fact);
    for (int k = 9; k >= 0; k--) {
        fact /= (k + 1);
        p = p * r + f64(1.0 / fact);
    }
    return p * pow2(n);
}

// Whether rounding y to f32 is certain to round exp(x) too: y is an f32
// normal and at least 2^-40 * y (2^13 f64 ulps) away from the midpoint
// between two f32s, where the 29 f64 mantissa bits below f32's read 2^28.
Expr rounds_like_exact(Expr y) {
    Expr bits = reinterpret<uint64_t>(y);
    Expr exponent = cast<int32_t>(bits >> 52);  // y > 0: no sign bit
    Expr below_f32 = cast<int32_t>(cast<uint32_t>(bits) & 0x1fffffff);
    Expr normal = exponent >= 1023 - 126 && exponent < 1023 + 128;
    return normal && abs(below_f32 - (1 << 28)) > (1 << 13);
}


// The GPU threads' fast path (see the header): every f64 operation an
// explicit fma or an exact add, so its bits are the same on every target and
// the CPU's exhaustive check of them is the GPU's.
Expr fma_f64(Expr a, Expr b, Expr c) {
    return Internal::Call::make(Float(64), "llvm.fma.f64", {a, b, c}, Internal::Call::PureExtern);
}

// exp on |r| <= ln2/2 + 1e-5 (r = x - n ln2 as rounded): the degree-8
// Chebyshev fit of exp on [-0.3466, 0.3466], coefficients rounded to f64;
// relative error < 2^-39.7 (mpmath, dense over the interval, exact
// arithmetic on the rounded coefficients), highest degree first.
constexpr double kExpFit[] = {0x1.a15a5c1c9c231p-16, 0x1.a1aa8ebb09119p-13, 0x1.6c164deb3edc9p-10,
                              0x1.111080a2be539p-7,  0x1.555555742c758p-5,  0x1.555555a276f61p-3,
                              0x1.fffffffff71b9p-2,  0x1.ffffffffd3852p-1,  0x1.0000000000000p+0};
// 1.5 * 2^52: x * log2(e) + this rounds to an integer n held in the low
// bits of the sum (two's complement for |n| < 2^31).
constexpr double kRoundToInteger = 0x1.8p52;
// The certain band: how far (in f64 ulps of p) p must lie from the midpoint
// between two f32s. p's error is < 2^-39.5 relative (the fit, the reduction
// x - n * RN(ln 2), whose error is < 150 * 2^-54, and nine f64 roundings),
// at most 2^13 ulps for p in [0.7, 1.42]; the band is 2^14.
constexpr int kFastBand = 1 << 14;

}  // namespace

namespace {

// f32 -> f64 and back on integer bits: a conversion is a quarter-rate
// instruction on sm_90 (F2F, on the f64 pipe beside the fmas); these are a
// few full-rate integer ones.
// x as f64, exact for a normal x: the exponent rebiased (127 -> 1023), the
// mantissa's 23 bits moved up 29. A zero or subnormal x becomes a tiny
// normal (2^-127 and up, its sign kept), whose exp is 1 as theirs is.
Expr f64_of_f32_bits(Expr x) {
    Expr u = reinterpret<uint32_t>(x);
    Expr sign = u & cast<uint32_t>(Expr(uint32_t{0x80000000}));
    Expr high = sign | (((u & 0x7fffffff) >> 3) + cast<uint32_t>((1023 - 127) << 20));
    return reinterpret<double>((cast<uint64_t>(high) << 32) | cast<uint64_t>(u << 29));
}

// The f32 bits of a normal f64 p in [2^-126, 2^127], rounded to nearest with
// ties away from zero (the caller never asks for a tie: `certain`).
Expr f32_bits_of_f64(Expr p) {
    Expr rounded = (reinterpret<uint64_t>(p) + cast<uint64_t>(1 << 28)) >> 29;
    return cast<uint32_t>(rounded - (cast<uint64_t>(1023 - 127) << 23));
}

}  // namespace

ExpFastPath exp_f32_fast_certified(Expr x) {
    Expr xd = f64_of_f32_bits(x);  // exact where it matters (a normal x)
    Expr shifted = fma_f64(xd, f64(kLog2E), f64(kRoundToInteger));
    Expr n = cast<int32_t>(reinterpret<uint64_t>(shifted));  // the low word: n
    Expr nd = shifted - f64(kRoundToInteger);                // exact
    // n * ln2 exact inside the fma; one rounding (< 2^-54 for |r| < 0.35);
    // n * (ln 2 - RN(ln 2)) < 150 * 2^-54 is left out.
    Expr r = fma_f64(nd, f64(-0.6931471805599453), xd);
    Expr p = f64(kExpFit[0]);
    for (size_t k = 1; k < sizeof(kExpFit) / sizeof(kExpFit[0]); k++) {
        p = fma_f64(p, r, f64(kExpFit[k]));
    }
    // p ~ exp(r) in [0.707, 1.415]: rounded to f32 there, then scaled by 2^n
    // on the exponent bits (exact while the result is normal: -86.5 < x < 88).
    Expr below_f32 = cast<uint32_t>(reinterpret<uint64_t>(p)) & 0x1fffffff;  // the 29 bits f32 drops
    // Unsigned: below_f32 outside [2^28 - band, 2^28 + band].
    Expr clear_of_midpoint = below_f32 - cast<uint32_t>((1 << 28) - kFastBand) > cast<uint32_t>(2 * kFastBand);
    Expr in_range = x > -86.5f && x < 88.0f;  // false for NaN
    Expr scaled = f32_bits_of_f64(p) + (cast<uint32_t>(n) << 23);
    return {reinterpret<float>(scaled), in_range && clear_of_midpoint};
}

Expr exp_f32_correctly_rounded(Expr x, const RoundingBarrier &round, bool branch, bool fma_fast_path) {
    Expr value, certain;
    if (branch && fma_fast_path) {
        ExpFastPath fast = exp_f32_fast_certified(x);
        value = fast.value;
        certain = fast.certain;
    } else {
        Expr y = exp_f64_fast(x);
        value = cast<float>(y);
        certain = rounds_like_exact(y) && !is_nan(x);
    }
    if (branch) {
        return Internal::Call::make(Float(32), Internal::Call::if_then_else, {certain, value, exp_f32_exact(x, round)},
                                    Internal::Call::PureIntrinsic);
    }
    return select(certain, value, exp_f32_exact(x, round));
}

Arithmetic arithmetic_for(Arithmetic arithmetic, const Target &target) {
    if (arithmetic == Arithmetic::Triton && !target.has_feature(Target::CUDA)) {
        throw CompileError("arithmetic=triton uses PTX instructions: CUDA targets only");
    }
    return arithmetic;
}

namespace {

constexpr float kLog2EF32 = 1.4426950408889634f;  // 0x3FB8AA3B, as in the reference's PTX

}  // namespace

Expr PoolArithmetic::exp(Expr t) const {
    if (kind == Arithmetic::Triton) {
        return ptx_instruction("llvm.nvvm.ex2.approx.f", {t * kLog2EF32});  // ex2.approx.f32
    }
    return exp_f32_correctly_rounded(t, round, exp_branches, exp_fma_fast_path);
}

Expr PoolArithmetic::accumulate(Expr sum, Expr k, Expr p) const {
    if (kind == Arithmetic::Triton) {
        return ptx_instruction("llvm.fma.f32", {k, p, sum});  // fma.rn.f32
    }
    return sum + round(k * p);
}

Expr PoolArithmetic::divide(Expr a, Expr b) const {
    if (kind == Arithmetic::Triton) {
        return ptx_instruction("llvm.nvvm.div.full", {a, b});  // div.full.f32
    }
    return a / b;
}

Expr PoolArithmetic::round_to_bf16(Expr x) const {
    if (ptx_round_bf16) {
        return Internal::Call::make(Float(32), kPtxRoundBf16, {x}, Internal::Call::PureExtern);
    }
    return kpool::round_to_bf16(x);
}

PoolArithmetic pool_arithmetic(Arithmetic kind, const Target &target, RoundingBarrier round, bool exp_branches,
                               bool exp_fma_fast_path) {
    const bool cuda = target.has_feature(Target::CUDA);
    return {kind, round, exp_branches, max_min_rule(target), exp_fma_fast_path, /*ptx_round_bf16=*/cuda};
}

}  // namespace kpool
