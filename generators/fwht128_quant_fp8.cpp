// fwht128_quant_fp8: per row of q, bf16 -> f32 -> Hadamard-128 -> bf16 ->
// ue8m0 scale -> e4m3 codes.
#include "kpool_schedules.h"

namespace kpool {

using namespace Halide;

class Fwht128QuantFp8 : public Generator<Fwht128QuantFp8> {
public:
    GeneratorParam<std::string> gpu{"gpu", ""};

    Input<Buffer<uint16_t, 2>> q{"q"};            // (d, row) bf16 bits
    Output<Buffer<uint8_t, 2>> q_fp8{"q_fp8"};    // (d, row) e4m3 bits
    Output<Buffer<float, 1>> q_scale{"q_scale"};  // (row)

    void generate() {
        FwhtStages &s = stages;
        Func x{"q_f32"};
        x(s.d, s.row) = bf16_to_f32(q(s.d, s.row));
        s.rotate = rotate_quantize(x, s.d, s.v, s.lane, {s.row}, row_layout({get_target(), gpu}), Expr(true));
        q_fp8(s.d, s.row) = s.rotate.quant.codes(s.d, s.row);
        q_scale(s.row) = s.rotate.quant.scale(s.row);

        q.dim(0).set_bounds(0, kHeadDim);
        q_fp8.dim(0).set_bounds(0, kHeadDim);
        q_fp8.dim(1).set_min(0);
        q_scale.dim(0).set_bounds(0, q_fp8.dim(1).extent()).set_stride(Expr());
    }

    void schedule() {
        stages.codes = q_fp8;
        stages.scale = q_scale;
        schedule_fwht(stages, {get_target(), gpu});
    }

private:
    FwhtStages stages;
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::Fwht128QuantFp8, fwht128_quant_fp8)
