// The shared numerics of every kernel (SPEC "Shared numerics"), checked
// exhaustively or densely through the test-only probe kernel, which applies
// the very Halide expressions the kernels are built from, element by element.
// The oracle is the scalar reference (tests/reference), and where a property
// can be stated independently of it (NaN codes, powers of two, ties) it is
// checked from first principles too.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "HalideBuffer.h"
#include "kpool_cpu_exp_exact_probe.h"
#include "kpool_cpu_exp_probe.h"
#include "kpool_cpu_numerics_probe.h"
#include "test_util.h"

namespace {

using Halide::Runtime::Buffer;

uint32_t bits_of(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
}
float float_of(uint32_t b) {
    float v;
    std::memcpy(&v, &b, 4);
    return v;
}

// The probe's five outputs for a vector of inputs.
struct ProbeResult {
    std::vector<uint8_t> e4m3;
    std::vector<uint16_t> bf16;
    std::vector<float> ue8m0, linear, exp_f32;
};

ProbeResult run_probe(const std::vector<float> &x) {
    const int n = static_cast<int>(x.size());
    ProbeResult r;
    r.e4m3.resize(n);
    r.bf16.resize(n);
    r.ue8m0.resize(n);
    r.linear.resize(n);
    r.exp_f32.resize(n);
    if (n == 0) return r;
    Buffer<float> in(const_cast<float *>(x.data()), n);
    Buffer<uint8_t> e4m3(r.e4m3.data(), n);
    Buffer<uint16_t> bf16(r.bf16.data(), n);
    Buffer<float> ue8m0(r.ue8m0.data(), n), linear(r.linear.data(), n), exp_f32(r.exp_f32.data(), n);
    const int rc = kpool_cpu_numerics_probe(in, e4m3, bf16, ue8m0, linear, exp_f32);
    EXPECT_EQ(rc, 0) << "numerics probe failed";
    return r;
}

// Runs `check(x, probe, i)` over the inputs produced by `generate` in chunks
// of 2^20, so that tens of millions of values need little memory.
void sweep(const std::function<bool(std::vector<float> &)> &generate,
           const std::function<void(const std::vector<float> &, const ProbeResult &)> &check) {
    std::vector<float> chunk;
    chunk.reserve(1 << 20);
    for (;;) {
        chunk.clear();
        const bool more = generate(chunk);
        if (!chunk.empty()) check(chunk, run_probe(chunk));
        if (!more) break;
    }
}

// The encoder's inputs: clamped to [-448, 448] (infinities saturate), NaN
// kept to check the encoder's own NaN code (the kernels' clamp ignores NaN
// and gives -448 first: test_nonfinite.cpp).
float clamp_like_kernels(float v) {
    if (std::isnan(v)) return v;
    return std::min(std::max(v, -448.0f), 448.0f);
}

// A mismatch collector that stops printing after a few.
struct Mismatches {
    int64_t count = 0;
    std::ostringstream first;
    template <typename Fn>
    void add(Fn describe) {
        if (count < 10) {
            first << "\n  ";
            describe(first);
        }
        ++count;
    }
};

std::string hex(uint32_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << v;
    return s.str();
}

void expect_e4m3_matches_reference(const std::vector<float> &x, const ProbeResult &p,
                                   Mismatches &m) {
    for (size_t i = 0; i < x.size(); ++i) {
        const uint8_t want = kpool_ref::e4m3_encode(x[i]);
        if (p.e4m3[i] != want) {
            m.add([&](std::ostream &o) {
                o << "x = " << x[i] << " (bits " << hex(bits_of(x[i])) << "): probe "
                  << hex(p.e4m3[i]) << ", reference " << hex(want);
            });
        }
    }
}

// (a) Every bf16 bit pattern, as f32, clamped as the kernels clamp.
TEST(NumericsE4m3, ExhaustiveOverEveryBf16Pattern) {
    std::vector<float> x(65536);
    for (uint32_t h = 0; h < 65536; ++h) x[h] = clamp_like_kernels(float_of(h << 16));
    const ProbeResult p = run_probe(x);
    Mismatches m;
    expect_e4m3_matches_reference(x, p, m);
    EXPECT_EQ(m.count, 0) << m.count << " of 65536 bf16 patterns encode differently:"
                          << m.first.str();
    // NaN -> 0x7F with the input's sign, independently of the reference.
    int64_t nans = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        if (!std::isnan(x[h])) continue;
        ++nans;
        const uint8_t want = (h & 0x8000) ? 0xFF : 0x7F;
        ASSERT_EQ(p.e4m3[h], want) << "bf16 NaN " << hex(h);
    }
    EXPECT_EQ(nans, 2 * 127);  // 2 signs x (2^7 - 1) non-zero mantissas
}

// Known codes, from the format's definition alone.
TEST(NumericsE4m3, KnownCodes) {
    struct Case {
        float x;
        uint8_t code;
    } cases[] = {
        {0.0f, 0x00},          {-0.0f, 0x80},
        {448.0f, 0x7E},        {-448.0f, 0xFE},
        {416.0f, 0x7D},        {432.0f, 0x7E},            // tie 416|448 -> even mantissa (448 = 0x7E)
        {424.0f, 0x7D},        {440.0f, 0x7E},
        {1.0f, 0x38},          {-1.0f, 0xB8},
        {1.0625f, 0x38},       {1.1875f, 0x3A},           // ties -> even
        {0x1p-6f, 0x08},       {0x1p-9f, 0x01},           // smallest normal, smallest subnormal
        {0x1p-10f, 0x00},      {0x3p-10f, 0x02},          // ties between subnormals -> even
        {0x5p-10f, 0x02},      {std::nextafter(0x1p-10f, 1.0f), 0x01},
        {0x7p-9f, 0x07},       {0xFp-10f, 0x08},          // 7.5 * 2^-9: tie 7|8 -> even (0x08)
        {1e-30f, 0x00},        {-1e-30f, 0x80},
        {std::numeric_limits<float>::denorm_min(), 0x00},
        {std::numeric_limits<float>::quiet_NaN(), 0x7F},  {-std::numeric_limits<float>::quiet_NaN(), 0xFF},
    };
    std::vector<float> x;
    for (const Case &c : cases) x.push_back(c.x);
    const ProbeResult p = run_probe(x);
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(int(p.e4m3[i]), int(cases[i].code)) << "probe e4m3(" << x[i] << ")";
        EXPECT_EQ(int(kpool_ref::e4m3_encode(x[i])), int(cases[i].code))
            << "reference e4m3(" << x[i] << ")";
    }
}

// (b) A dense sweep: every 7th f32 from 2^-12 to 448 of both signs (~2^25.7
// values; below 2^-12 everything is 0 and a sparser stride suffices).
TEST(NumericsE4m3, DenseF32Sweep) {
    const uint32_t lo = bits_of(0x1p-12f), hi = bits_of(448.0f);
    Mismatches m;
    int64_t total = 0;
    for (uint32_t sign : {0u, 0x80000000u}) {
        uint64_t next = 0;
        sweep(
            [&](std::vector<float> &chunk) {
                while (chunk.size() < (1u << 20) && next <= hi) {
                    chunk.push_back(float_of(static_cast<uint32_t>(next) | sign));
                    next += next < lo ? 4099 : 7;
                }
                return next <= hi;
            },
            [&](const std::vector<float> &x, const ProbeResult &p) {
                total += x.size();
                expect_e4m3_matches_reference(x, p, m);
            });
    }
    EXPECT_GT(total, int64_t(1) << 25);
    EXPECT_EQ(m.count, 0) << m.count << " of " << total << " f32 values encode differently:"
                          << m.first.str();
}

// (b) Every e4m3 value and every midpoint between neighbours, and the f32
// values one and two ulps either side: where round-to-nearest-even decides.
TEST(NumericsE4m3, RoundingBoundaries) {
    std::vector<float> magnitudes;
    for (int code = 0; code <= 0x7E; ++code) magnitudes.push_back(kpool_ref::e4m3_to_f32(code));
    std::vector<float> points;
    for (size_t c = 0; c < magnitudes.size(); ++c) {
        points.push_back(magnitudes[c]);
        if (c + 1 < magnitudes.size()) {
            const double mid = (double(magnitudes[c]) + double(magnitudes[c + 1])) / 2;
            ASSERT_EQ(double(float(mid)), mid) << "midpoints of e4m3 values are exact in f32";
            points.push_back(float(mid));
        }
    }
    std::vector<float> x;
    int64_t ties = 0;
    for (float v : points) {
        for (float s : {1.0f, -1.0f}) {
            float down = v, up = v;
            x.push_back(s * v);
            for (int k = 0; k < 2; ++k) {
                down = std::nextafter(down, -1.0f);
                up = std::nextafter(up, 1000.0f);
                if (down >= 0.0f) x.push_back(s * down);
                if (up <= 448.0f) x.push_back(s * up);
            }
        }
    }
    const ProbeResult p = run_probe(x);
    Mismatches m;
    expect_e4m3_matches_reference(x, p, m);
    EXPECT_EQ(m.count, 0) << m.count << " of " << x.size() << " boundary values differ:"
                          << m.first.str();
    // Ties, from the definition: a midpoint goes to the neighbour with an even code.
    for (size_t c = 0; c + 1 < magnitudes.size(); ++c) {
        const float mid = float((double(magnitudes[c]) + double(magnitudes[c + 1])) / 2);
        const uint8_t even = (c % 2 == 0) ? c : c + 1;
        const ProbeResult q = run_probe({mid, -mid});
        EXPECT_EQ(int(q.e4m3[0]), int(even)) << "tie at " << mid;
        EXPECT_EQ(int(q.e4m3[1]), int(even | 0x80)) << "tie at " << -mid;
        ++ties;
    }
    EXPECT_EQ(ties, 126);
}

// (c) ue8m0 = 2^ceil(log2(m)), m = max(absmax, 1e-4) * f32(1/448), computed
// here from frexp, at and around every power of two of m in the range the
// floor allows up to the largest finite absmax.
float ue8m0_via_frexp(float m) {
    int e = 0;
    const double fraction = std::frexp(double(m), &e);  // m = fraction * 2^e, fraction in [0.5, 1)
    return fraction == 0.5 ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

TEST(NumericsScale, Ue8m0AroundEveryPowerOfTwo) {
    const float inv448 = static_cast<float>(1.0 / 448.0);
    std::vector<float> absmax;
    for (int k = -30; k <= 128; ++k) {
        // absmax near 448 * 2^k makes m near 2^k; walk 40 f32 steps either side.
        const float centre = std::ldexp(448.0f, k);
        if (!std::isfinite(centre)) break;
        float down = centre, up = centre;
        absmax.push_back(centre);
        for (int s = 0; s < 40; ++s) {
            down = std::nextafter(down, 0.0f);
            up = std::nextafter(up, std::numeric_limits<float>::infinity());
            absmax.push_back(down);
            if (std::isfinite(up)) absmax.push_back(up);
        }
    }
    // The floor and below it, and the largest finite absmax.
    for (float v : {0.0f, 1e-30f, std::numeric_limits<float>::denorm_min(), 1e-5f,
                    std::nextafter(1e-4f, 0.0f), 1e-4f, std::nextafter(1e-4f, 1.0f),
                    std::numeric_limits<float>::max()}) {
        absmax.push_back(v);
    }
    const ProbeResult p = run_probe(absmax);
    Mismatches m;
    int64_t exact_powers = 0, just_above = 0, just_below = 0;
    for (size_t i = 0; i < absmax.size(); ++i) {
        const float mm = std::max(absmax[i], 1e-4f) * inv448;
        const float want = ue8m0_via_frexp(mm);
        int e = 0;
        const double fraction = std::frexp(double(mm), &e);
        if (fraction == 0.5) ++exact_powers;
        // Within 4 f32 ulps below a power of two, or above one.
        if (bits_of(want) - bits_of(mm) <= 4 && mm < want) ++just_below;
        if (bits_of(mm) - bits_of(want * 0.5f) <= 4 && mm > want * 0.5f) ++just_above;
        if (bits_of(p.ue8m0[i]) != bits_of(want) || bits_of(kpool_ref::ue8m0_scale(mm)) != bits_of(want)) {
            m.add([&](std::ostream &o) {
                o << "absmax " << absmax[i] << " m " << mm << " (" << hex(bits_of(mm))
                  << "): probe " << p.ue8m0[i] << ", reference " << kpool_ref::ue8m0_scale(mm)
                  << ", 2^ceil(log2 m) = " << want;
            });
        }
        // ue8m0 keeps every value within +-448: m <= scale < 2m.
        EXPECT_GE(p.ue8m0[i], mm);
        EXPECT_LT(p.ue8m0[i], 2.0f * mm);
    }
    EXPECT_EQ(m.count, 0) << m.count << " of " << absmax.size() << " scales differ:" << m.first.str();
    // The walk must actually land on powers of two and their neighbours.
    EXPECT_GT(exact_powers, 100);
    EXPECT_GT(just_below, 100);
    EXPECT_GT(just_above, 100);
}

TEST(NumericsScale, LinearIsAbsmaxTimesInverse448WithFloor) {
    const float inv448 = static_cast<float>(1.0 / 448.0);
    std::vector<float> absmax;
    for (uint32_t b = 0; b < bits_of(std::numeric_limits<float>::max()); b += 9973) {
        absmax.push_back(float_of(b));
    }
    absmax.push_back(1e-4f);
    absmax.push_back(std::nextafter(1e-4f, 0.0f));
    absmax.push_back(std::numeric_limits<float>::max());
    const ProbeResult p = run_probe(absmax);
    Mismatches m;
    for (size_t i = 0; i < absmax.size(); ++i) {
        const float want = std::max(absmax[i], 1e-4f) * inv448;
        if (bits_of(p.linear[i]) != bits_of(want)) {
            m.add([&](std::ostream &o) {
                o << "absmax " << absmax[i] << ": probe " << p.linear[i] << ", want " << want;
            });
        }
    }
    EXPECT_EQ(m.count, 0) << m.count << " of " << absmax.size() << " differ:" << m.first.str();
    EXPECT_EQ(bits_of(run_probe({0.0f}).linear[0]), bits_of(1e-4f * inv448));
}

// (d) f32 -> bf16 round to nearest even: for every upper half, the lower
// halves below, at and above the tie; NaN stays NaN with its sign.
TEST(NumericsBf16, RoundToNearestEvenTiesAndNaN) {
    std::vector<float> x;
    const uint32_t lowers[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
    for (uint32_t h = 0; h < 65536; ++h) {
        for (uint32_t l : lowers) x.push_back(float_of(h << 16 | l));
    }
    const ProbeResult p = run_probe(x);
    Mismatches m;
    int64_t nan_inputs = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t b = bits_of(x[i]);
        const uint32_t h = b >> 16, l = b & 0xFFFF;
        uint16_t want;
        bool ok;
        if (std::isnan(x[i])) {
            ++nan_inputs;
            // Any NaN, same sign; and the reference's quiet NaN exactly.
            const uint16_t got = p.bf16[i];
            ok = (got & 0x7F80) == 0x7F80 && (got & 0x7F) != 0 && (got >> 15) == (h >> 15) &&
                 got == kpool_ref::f32_to_bf16(x[i]);
            want = kpool_ref::f32_to_bf16(x[i]);
        } else {
            want = static_cast<uint16_t>(l < 0x8000 ? h : l > 0x8000 ? h + 1 : h + (h & 1));
            ok = p.bf16[i] == want && kpool_ref::f32_to_bf16(x[i]) == want;
        }
        if (!ok) {
            m.add([&](std::ostream &o) {
                o << "f32 " << hex(b) << ": probe " << hex(p.bf16[i]) << ", want " << hex(want)
                  << ", reference " << hex(kpool_ref::f32_to_bf16(x[i]));
            });
        }
    }
    EXPECT_EQ(m.count, 0) << m.count << " of " << x.size() << " differ:" << m.first.str();
    EXPECT_GT(nan_inputs, 1000);
    // Rounding up past the largest finite bf16 overflows to infinity.
    EXPECT_EQ(run_probe({float_of(0x7F7F8000)}).bf16[0], 0x7F80);
    EXPECT_EQ(run_probe({float_of(0x7F7F7FFF)}).bf16[0], 0x7F7F);
}

TEST(NumericsBf16, DenseF32SweepMatchesReference) {
    Mismatches m;
    uint64_t next = 0;
    int64_t total = 0;
    sweep(
        [&](std::vector<float> &chunk) {
            while (chunk.size() < (1u << 20) && next <= 0xFFFFFFFFull) {
                chunk.push_back(float_of(static_cast<uint32_t>(next)));
                next += 257;
            }
            return next <= 0xFFFFFFFFull;
        },
        [&](const std::vector<float> &x, const ProbeResult &p) {
            total += x.size();
            for (size_t i = 0; i < x.size(); ++i) {
                if (p.bf16[i] != kpool_ref::f32_to_bf16(x[i])) {
                    m.add([&](std::ostream &o) {
                        o << "f32 " << hex(bits_of(x[i])) << ": probe " << hex(p.bf16[i])
                          << ", reference " << hex(kpool_ref::f32_to_bf16(x[i]));
                    });
                }
            }
        });
    EXPECT_EQ(m.count, 0) << m.count << " of " << total << " differ:" << m.first.str();
}

// (e) exp over the range softmax uses (s - max <= 0): every 17th f32 from
// -0 to -110 (KPOOL_EXP_SWEEP_STRIDE=1: every one, about 1.1e9, minutes),
// against exp in f64 rounded once to f32. This covers both of exp's paths:
// the fast one wherever its rounding is certain, the exact one elsewhere.
TEST(NumericsExp, CorrectlyRoundedOnDenseSweepOfMinus110To0) {
    const uint32_t lo = bits_of(-0.0f), hi = bits_of(-110.0f);
    const char *stride_env = std::getenv("KPOOL_EXP_SWEEP_STRIDE");
    const uint64_t stride = stride_env ? std::max(1L, std::atol(stride_env)) : 17;
    Mismatches m;
    int64_t total = 0, max_ulps = 0;
    uint64_t next = lo;
    sweep(
        [&](std::vector<float> &chunk) {
            while (chunk.size() < (1u << 20) && next <= hi) {
                chunk.push_back(float_of(static_cast<uint32_t>(next)));
                next += stride;
            }
            return next <= hi;
        },
        [&](const std::vector<float> &x, const ProbeResult &p) {
            total += x.size();
            for (size_t i = 0; i < x.size(); ++i) {
                const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
                if (bits_of(p.exp_f32[i]) != bits_of(want)) {
                    const int64_t ulps =
                        std::llabs(int64_t(bits_of(p.exp_f32[i])) - int64_t(bits_of(want)));
                    max_ulps = std::max(max_ulps, ulps);
                    m.add([&](std::ostream &o) {
                        o.precision(9);
                        o << "exp(" << x[i] << " = " << hex(bits_of(x[i])) << "): probe "
                          << p.exp_f32[i] << " (" << hex(bits_of(p.exp_f32[i])) << "), want "
                          << want << " (" << hex(bits_of(want)) << ")";
                    });
                }
            }
        });
    EXPECT_GT(total, int64_t(60'000'000 * 17 / stride));
    EXPECT_EQ(m.count, 0) << m.count << " of " << total << " exp values differ (max " << max_ulps
                          << " ulp):" << m.first.str();
}

TEST(NumericsExp, SpecialValues) {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x = {0.0f, -0.0f, -inf, -103.9f, -103.97f, -104.0f, -104.1f,
                                  -87.3f, -87.4f, -88.0f, -1e-30f, -1e-45f, 1.0f, 88.0f};
    const ProbeResult p = run_probe(x);
    for (size_t i = 0; i < x.size(); ++i) {
        const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
        EXPECT_EQ(bits_of(p.exp_f32[i]), bits_of(want)) << "exp(" << x[i] << ")";
    }
    EXPECT_TRUE(std::isnan(run_probe({std::numeric_limits<float>::quiet_NaN()}).exp_f32[0]));
}

}  // namespace

namespace {

// exp(x) correctly rounded to f32, for -104 < x < 0: exp in f64 (glibc's,
// error < 1 f64 ulp), and where that lands within 2^-45 (relative) of the
// midpoint between two f32s, exp in long double; one still within 2^-60
// is `ambiguous` (the reference cannot tell the rounding: the test fails).
float correctly_rounded_exp(float x, bool &ambiguous) {
    auto from_midpoint = [](long double y) {  // relative distance to the nearest f32 midpoint
        const float nearest = static_cast<float>(y);
        const float other = std::nextafter(nearest, static_cast<long double>(nearest) < y ? INFINITY : 0.0f);
        const long double mid = (static_cast<long double>(nearest) + other) / 2;
        return std::fabs(y - mid) / y;
    };
    const double y = std::exp(static_cast<double>(x));
    if (from_midpoint(y) > 0x1p-45L) return static_cast<float>(y);
    const long double yl = std::exp(static_cast<long double>(x));
    ambiguous = from_midpoint(yl) < 0x1p-60L;
    return static_cast<float>(yl);
}

struct ExpProbeResult {
    std::vector<float> value;
    std::vector<uint8_t> certain;
};

// One of the exp probes (the GPU's fast path, or its exact path alone).
using ExpProbe = int (*)(halide_buffer_t *, halide_buffer_t *, halide_buffer_t *);
ExpProbeResult run_exp_probe(const std::vector<float> &x, ExpProbe probe = kpool_cpu_exp_probe) {
    const int n = static_cast<int>(x.size());
    ExpProbeResult r{std::vector<float>(n), std::vector<uint8_t>(n)};
    if (n == 0) return r;
    Buffer<float> in(const_cast<float *>(x.data()), n), value(r.value.data(), n);
    Buffer<uint8_t> certain(r.certain.data(), n);
    EXPECT_EQ(probe(in, value, certain), 0) << "exp probe failed";
    return r;
}

// (f) The GPU's exp on every f32 the softmax pool gives it (x = s - max s
// <= 0: every pattern with the sign bit set, -0 to -inf and the NaNs). Its
// fast path, wherever it says certain, is exp(x) correctly rounded; the
// exact path is too, on every input of (-86.5, 0] the fast path leaves to it
// and on all of [-104, -86.5] (below, exp rounds to 0, which the exact path
// returns by a comparison; (e) samples it). Both paths' bits are the same on
// every target (explicit fmas, rounding barriers), so this is the GPU's exp.
TEST(NumericsExp, GpuExpCorrectlyRoundedOnEveryNegativeFloat) {
    constexpr uint64_t kChunk = 1 << 22;
    const unsigned workers = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    Mismatches m;
    int64_t certain = 0, uncertain_in_range = 0, ambiguous_references = 0;
    std::vector<float> x(kChunk), to_exact_path;
    for (uint64_t start = 0x80000000u; start <= 0xffffffffu; start += kChunk) {
        for (uint64_t i = 0; i < kChunk; ++i) x[i] = float_of(static_cast<uint32_t>(start + i));
        const ExpProbeResult p = run_exp_probe(x);
        // The reference check of the chunk, split over threads.
        std::vector<Mismatches> found(workers);
        std::vector<int64_t> n_certain(workers), n_uncertain(workers), n_ambiguous(workers);
        std::vector<std::thread> threads;
        for (unsigned w = 0; w < workers; ++w) {
            threads.emplace_back([&, w] {
                for (uint64_t i = w; i < kChunk; i += workers) {
                    const float xi = x[i];
                    const bool normal_result = xi > -86.5f;  // false for NaN and -inf
                    if (!p.certain[i]) {
                        n_uncertain[w] += normal_result;
                        continue;
                    }
                    ++n_certain[w];
                    bool ambiguous = false;
                    float want;
                    if (!normal_result) {
                        want = NAN;  // never certain: any value is a mismatch
                    } else if (xi > -0x1p-25f) {
                        want = 1.0f;  // exp(x) in (1 - 2^-25, 1]
                    } else {
                        want = correctly_rounded_exp(xi, ambiguous);
                    }
                    n_ambiguous[w] += ambiguous;
                    if (bits_of(p.value[i]) != bits_of(want)) {
                        found[w].add([&](std::ostream &o) {
                            o.precision(9);
                            o << "exp(" << xi << " = " << hex(bits_of(xi)) << "): fast path " << p.value[i] << " ("
                              << hex(bits_of(p.value[i])) << ", certain), want " << want << " (" << hex(bits_of(want))
                              << ")";
                        });
                    }
                }
            });
        }
        for (std::thread &t : threads) t.join();
        for (uint64_t i = 0; i < kChunk; ++i) {
            if (!p.certain[i] && x[i] > -86.5f) to_exact_path.push_back(x[i]);
        }
        for (unsigned w = 0; w < workers; ++w) {
            certain += n_certain[w];
            uncertain_in_range += n_uncertain[w];
            ambiguous_references += n_ambiguous[w];
            m.count += found[w].count;
            if (m.count < 10) m.first << found[w].first.str();
        }
    }
    EXPECT_EQ(ambiguous_references, 0);
    EXPECT_EQ(m.count, 0) << m.count << " certain fast-path values are not exp correctly rounded:" << m.first.str();
    // Every x in (-86.5, 0] (the patterns 0x80000000 to 0xc2acffff) is either
    // certain or left to the exact path; few are left.
    EXPECT_EQ(certain + uncertain_in_range, int64_t(0xc2ad0000u - 0x80000000u));
    const double uncertain_rate = double(uncertain_in_range) / double(certain + uncertain_in_range);
    std::cout << "exp fast path: " << uncertain_in_range << " of " << certain + uncertain_in_range
              << " inputs in (-86.5, 0] left to the exact path (" << uncertain_rate << ")\n";
    EXPECT_LT(uncertain_rate, 0x1p-12);

    // The exact path: where the fast path is not certain, and [-104, -86.5].
    for (uint32_t b = bits_of(-86.5f); b <= bits_of(-104.0f); ++b) to_exact_path.push_back(float_of(b));
    const ExpProbeResult e = run_exp_probe(to_exact_path, kpool_cpu_exp_exact_probe);
    Mismatches exact;
    for (size_t i = 0; i < to_exact_path.size(); ++i) {
        const float xi = to_exact_path[i];
        bool ambiguous = false;
        const float want = xi > -0x1p-25f ? 1.0f : correctly_rounded_exp(xi, ambiguous);
        EXPECT_FALSE(ambiguous) << "exp(" << xi << ")";
        if (bits_of(e.value[i]) != bits_of(want)) {
            exact.add([&](std::ostream &o) {
                o.precision(9);
                o << "exp(" << xi << " = " << hex(bits_of(xi)) << "): exact path " << e.value[i] << " ("
                  << hex(bits_of(e.value[i])) << "), want " << want << " (" << hex(bits_of(want)) << ")";
            });
        }
    }
    EXPECT_EQ(exact.count, 0) << exact.count << " of " << to_exact_path.size()
                              << " exact-path values are not exp correctly rounded:" << exact.first.str();
}

// The fast path's rate of exact-path branches on the softmax pool's own
// inputs: pools as the benchmarks draw them (scores N(0, 1) in bf16, ape
// N(0, 0.5) in f32), x = s_j - max s; a warp branches when any of its 32
// lanes (32 dims of a pool) does.
TEST(NumericsExp, FastPathRarelyUncertainOnRandomPools) {
    for (int P : {4, 16}) {
        std::mt19937 rng(1234 + P);
        std::normal_distribution<float> score(0.0f, 1.0f), ape(0.0f, 0.5f);
        constexpr int kPools = 1 << 13, kDims = 128;
        std::vector<float> ape_rows(P * kDims), x;
        for (float &a : ape_rows) a = ape(rng);
        x.reserve(size_t(kPools) * P * kDims);
        for (int pool = 0; pool < kPools; ++pool) {
            std::vector<float> s(P * kDims);
            for (int j = 0; j < P; ++j) {
                for (int d = 0; d < kDims; ++d) {
                    const uint32_t b = bits_of(score(rng));  // to bf16, round to nearest even
                    const float bf16_score = float_of((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
                    s[j * kDims + d] = bf16_score + ape_rows[j * kDims + d];
                }
            }
            for (int j = 0; j < P; ++j) {
                for (int d = 0; d < kDims; ++d) {
                    float max_s = s[d];
                    for (int k = 1; k < P; ++k) max_s = std::max(max_s, s[k * kDims + d]);
                    x.push_back(s[j * kDims + d] - max_s);
                }
            }
        }
        const ExpProbeResult p = run_exp_probe(x);
        int64_t uncertain = 0, warps_branching = 0;
        for (size_t w = 0; w < x.size(); w += 32) {
            int64_t in_warp = 0;
            for (size_t i = w; i < w + 32; ++i) in_warp += !p.certain[i];
            uncertain += in_warp;
            warps_branching += in_warp > 0;
        }
        const double rate = double(uncertain) / double(x.size()), warp_rate = double(warps_branching) * 32 / double(x.size());
        std::cout << "exp fast path, random pools of " << P << ": " << uncertain << " of " << x.size()
                  << " exps uncertain (" << rate << "), " << warp_rate << " of warp exps branch\n";
        EXPECT_LT(rate, 0x1p-12);
        EXPECT_LT(warp_rate, 0x1p-7);
    }
}

}  // namespace
