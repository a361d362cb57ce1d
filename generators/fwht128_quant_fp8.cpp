// fwht128_quant_fp8: per row of q, bf16 -> f32 -> Hadamard-128 -> bf16 ->
// ue8m0 scale -> e4m3 codes.
#include "kpool_schedules.h"

namespace kpool {

using namespace Halide;

class Fwht128QuantFp8 : public Generator<Fwht128QuantFp8> {
public:
    GeneratorParam<std::string> gpu{"gpu", ""};

    Input<Buffer<uint16_t, 2>> q{"q"};  // (d, row) bf16 bits
    // (d, row): e4m3 codes, and the row's f32 scale through a buffer whose
    // d stride is 0 (the caller's [rows, 1] scales): one pass writes both.
    Output<Func> quantized{"quantized", {UInt(8), Float(32)}, 2};

    void generate() {
        FwhtStages &s = stages;
        Func x{"q_f32"};
        x(s.d, s.row) = bf16_to_f32(q(s.d, s.row));
        // Always a ue8m0 scale, so the quotient is the same in both
        // arithmetics (kpool_numerics.h): one kernel serves both.
        s.layout = row_layout({get_target(), gpu}, {RowKernel::Kind::Fwht});
        s.rotate = rotate_quantize(x, s.d, s.v, s.lane, {s.row}, s.layout, Expr(true),
                                   PoolArithmetic{});
        quantized(s.d, s.row) = Tuple(s.rotate.quant.codes(s.d, s.row), s.rotate.quant.scale(s.d, s.row));

        q.dim(0).set_bounds(0, kHeadDim);
        // Both views share the first's bounds; the scales' d stride is 0.
        std::vector<OutputImageParam> views = Func(quantized).output_buffers();
        views[0].dim(0).set_bounds(0, kHeadDim);
        views[0].dim(1).set_min(0);
        views[1].dim(0).set_stride(0);
    }

    void schedule() {
        stages.out = quantized;
        schedule_fwht(stages, {get_target(), gpu});
    }

private:
    FwhtStages stages;
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::Fwht128QuantFp8, fwht128_quant_fp8)
