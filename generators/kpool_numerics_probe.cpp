// Test-only kernel: the shared numerics applied elementwise to f32 inputs,
// so the tests can check the Halide encoders exhaustively against the scalar
// reference. It is built from the same kpool_numerics.cpp as every kernel.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

class NumericsProbe : public KpoolGenerator<NumericsProbe, NumericsProbeStages> {
public:
    Input<Buffer<float, 1>> x{"x"};
    Output<Buffer<uint8_t, 1>> e4m3{"e4m3"};         // e4m3_encode(x)
    Output<Buffer<uint16_t, 1>> bf16{"bf16"};        // f32_to_bf16(x)
    Output<Buffer<float, 1>> ue8m0{"ue8m0"};         // fp8_scale(x, round_scale = true)
    Output<Buffer<float, 1>> linear{"linear"};       // fp8_scale(x, round_scale = false)
    Output<Buffer<float, 1>> exp_f32{"exp_f32"};     // exp_f32_correctly_rounded(x)

    void generate() {
        Var i = stages.i;
        e4m3(i) = e4m3_encode(x(i));
        bf16(i) = f32_to_bf16(x(i));
        ue8m0(i) = fp8_scale(x(i), Expr(true), max_min_rule(get_target()));
        linear(i) = fp8_scale(x(i), Expr(false), max_min_rule(get_target()));
        exp_f32(i) = exp_f32_correctly_rounded(x(i), rounding_barrier(x.dim(0).extent()), /*branch=*/false);
        stages.outputs = {e4m3, bf16, ue8m0, linear, exp_f32};
    }

    void schedule() { schedule_numerics_probe(stages, build_plan()); }
};

// Test-only kernel: the GPU's exp, one path at a time, so that a test can
// hold it to the correctly rounded exp on every f32 input the softmax pool
// gives it: the fast path (exp_f32_fast_certified: its value and whether it
// is certain), or with exact_path the exact path (certain is 1).
class ExpProbe : public KpoolGenerator<ExpProbe, NumericsProbeStages> {
public:
    GeneratorParam<bool> exact_path{"exact_path", false};
    Input<Buffer<float, 1>> x{"x"};
    Output<Buffer<float, 1>> value{"value"};
    Output<Buffer<uint8_t, 1>> certain{"certain"};

    void generate() {
        Var i = stages.i;
        if (exact_path) {
            value(i) = exp_f32_exact(x(i), rounding_barrier(x.dim(0).extent()));
            certain(i) = cast<uint8_t>(1);
        } else {
            ExpFastPath fast = exp_f32_fast_certified(x(i));
            value(i) = fast.value;
            certain(i) = cast<uint8_t>(fast.certain);
        }
        stages.outputs = {value, certain};
    }

    void schedule() { schedule_numerics_probe(stages, build_plan()); }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::NumericsProbe, kpool_numerics_probe)
HALIDE_REGISTER_GENERATOR(kpool::ExpProbe, kpool_exp_probe)
