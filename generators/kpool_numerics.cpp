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

Expr shift_right_rne(Expr value, Expr shift) {
    value = cast<uint32_t>(value);
    shift = cast<uint32_t>(shift);
    Expr kept = value >> shift;
    Expr dropped = value & ((cast<uint32_t>(1) << shift) - 1);
    Expr half = cast<uint32_t>(1) << (shift - 1);
    Expr round_up = dropped > half || (dropped == half && (kept & 1) == 1);
    return kept + select(round_up, cast<uint32_t>(1), cast<uint32_t>(0));
}

Expr e4m3_encode(Expr x) {
    Expr u = reinterpret<uint32_t>(x);
    Expr sign = cast<uint8_t>((u >> 24) & 0x80);
    Expr mag = u & 0x7fffffff;
    Expr biased_exp = mag >> 23;  // f32 exponent, bias 127
    // e4m3 normals have exponent >= -6, i.e. f32 biased exponent >= 121.
    // Rebiasing to 7 and dropping 20 mantissa bits gives the code directly;
    // a rounding carry moves into the exponent field as it should.
    Expr normal = shift_right_rne(mag - (cast<uint32_t>(120) << 23), 20);
    // Subnormals count units of 2^-9: the 24-bit significand times
    // 2^(E - 150) / 2^-9 = significand >> (141 - E). Below 2^-11 it is 0.
    Expr significand = (mag & 0x7fffff) | 0x800000;
    Expr shift = 141 - cast<int32_t>(biased_exp);
    Expr subnormal = select(shift > 25, cast<uint32_t>(0),
                            shift_right_rne(significand, clamp(shift, 21, 25)));
    Expr code = select(biased_exp >= 121, normal, subnormal);
    Expr is_nan = mag > 0x7f800000;
    return select(is_nan, sign | cast<uint8_t>(0x7f), sign | cast<uint8_t>(code));
}

Expr ue8m0_scale(Expr m) {
    Expr u = reinterpret<uint32_t>(m);
    Expr exponent = (u >> 23) & 0xff;
    Expr inexact = (u & 0x7fffff) != 0;
    return reinterpret<float>((exponent + select(inexact, cast<uint32_t>(1), cast<uint32_t>(0)))
                              << 23);
}

Expr fp8_scale(Expr absmax, Expr round_scale) {
    Expr m = max(absmax, kAbsmaxFloor) * kFp8MaxInv;
    return select(round_scale, ue8m0_scale(m), m);
}

namespace {

Expr f64(double v) {
    return Internal::make_const(Float(64), v);
}

}  // namespace

RoundingBarrier rounding_barrier(Expr buffer_stride) {
    return {select(buffer_stride == -std::numeric_limits<int32_t>::max(), cast<uint32_t>(1), cast<uint32_t>(0))};
}

Expr RoundingBarrier::operator()(Expr product) const {
    if (product.type() == Float(64)) {
        return reinterpret<double>(reinterpret<uint64_t>(product) | cast<uint64_t>(opaque_zero));
    }
    return reinterpret<float>(reinterpret<uint32_t>(product) | opaque_zero);
}

Expr exp_f32_correctly_rounded(Expr x, const RoundingBarrier &round) {
    const double ln2_hi = 6.93147180369123816490e-01;  // high 32 bits of ln 2
    const double ln2_lo = 1.90821492927058770002e-10;
    Expr xd = cast<double>(x);
    // Beyond these, exp is 0 or +inf in f32 (and the polynomial's 2^n would
    // leave the f64 exponent range).
    Expr in_range = xd > f64(-104.0) && xd < f64(89.0);
    Expr xc = clamp(xd, f64(-104.0), f64(89.0));
    Expr n = floor(round(xc * f64(1.4426950408889634)) + f64(0.5));
    Expr r = (xc - round(n * f64(ln2_hi))) - round(n * f64(ln2_lo));
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
    Expr two_n = reinterpret<double>(cast<uint64_t>(cast<int64_t>(n) + 1023) << 52);
    Expr y = cast<float>(p * two_n);
    Expr inf = reinterpret<float>(cast<uint32_t>(0x7f800000));
    return select(is_nan(x), x, select(in_range, y, select(xd > f64(0.0), inf, 0.0f)));
}

}  // namespace kpool
