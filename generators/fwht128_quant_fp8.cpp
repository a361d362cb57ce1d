// fwht128_quant_fp8: per row of q, bf16 -> f32 -> Hadamard-128 -> bf16 ->
// ue8m0 scale -> e4m3 codes. Two generators: one over elements (any
// strides), and one over words (CUDA: rows aligned to 8-byte words of 4 bf16
// in and 4-byte words of 4 codes out, one load and one store per 4 values).
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

namespace {

// The rotation and quantization of the rows of x(d, row), f32 of bf16. The
// scale is always ue8m0, so the quotient is the same in both arithmetics
// (kpool_numerics.h): one kernel serves both.
void define_rotation(FwhtStages &s, Func x, const BuildPlan &plan) {
    const ScheduleDecisions decided = schedule_decisions(plan, {KernelAsked::Kind::Fwht});
    s.layout = decided.layout;
    s.rotate = rotate_quantize(x, s.d, s.v, s.lane, {s.row}, s.layout, Expr(true),
                               PoolArithmetic{Arithmetic::Exact, {}, false, max_min_rule(plan.target)}, decided.e4m3);
}

// Both views of a (codes, scale) output share the first's bounds; the
// scales' first stride is 0 (the caller's [rows, 1] scales).
void constrain_views(Func out, int extent) {
    std::vector<OutputImageParam> views = out.output_buffers();
    views[0].dim(0).set_bounds(0, extent);
    views[0].dim(1).set_min(0);
    views[1].dim(0).set_stride(0);
}

}  // namespace

class Fwht128QuantFp8 : public KpoolGenerator<Fwht128QuantFp8> {
public:
    Input<Buffer<uint16_t, 2>> q{"q"};  // (d, row) bf16 bits
    // (d, row): e4m3 codes, and the row's f32 scale through a buffer whose
    // d stride is 0: one pass writes both.
    Output<Func> quantized{"quantized", {UInt(8), Float(32)}, 2};

    void generate() {
        FwhtStages &s = stages;
        Func x{"q_f32"};
        x(s.d, s.row) = bf16_to_f32(q(s.d, s.row));
        define_rotation(s, x, build_plan());
        quantized(s.d, s.row) = Tuple(s.rotate.quant.codes(s.d, s.row), s.rotate.quant.scale(s.d, s.row));
        q.dim(0).set_bounds(0, kHeadDim);
        constrain_views(quantized, kHeadDim);
    }

    void schedule() {
        q.set_estimates({{0, kHeadDim}, {0, estimate::kRows}});
        quantized.set_estimates({{0, kHeadDim}, {0, estimate::kRows}});
        if (using_autoscheduler()) {
            return;
        }
        stages.out = quantized;
        schedule_fwht(stages, build_plan());
    }

private:
    FwhtStages stages;
};

class Fwht128QuantFp8Words : public KpoolGenerator<Fwht128QuantFp8Words> {
public:
    static constexpr int kWordValues = 4;
    static constexpr int kWords = kHeadDim / kWordValues;

    Input<Buffer<uint64_t, 2>> q{"q"};  // (word, row): 4 bf16, the first in the low bits
    // (word, row): 4 e4m3 codes, the first in the low byte, and the row's
    // scale through a buffer whose word stride is 0.
    Output<Func> quantized{"quantized", {UInt(32), Float(32)}, 2};

    void generate() {
        FwhtStages &s = stages;
        Func x{"q_f32"};
        Expr word = q(s.d / kWordValues, s.row);
        x(s.d, s.row) = bf16_to_f32(cast<uint16_t>(word >> (cast<uint64_t>(s.d % kWordValues) * 16)));
        define_rotation(s, x, build_plan());
        const Fp8Row &quant = s.rotate.quant;
        const Var &w = s.word;
        Expr values[kWordValues];
        for (int i = 0; i < kWordValues; i++) {
            values[i] = quant.quotient(w * kWordValues + i, s.row);
        }
        quantized(w, s.row) = Tuple(e4m3_word_saturated(values, quant.encoder), quant.scale(w * kWordValues, s.row));
        q.dim(0).set_bounds(0, kWords);
        constrain_views(quantized, kWords);
        s.codes_per_word = kWordValues;
    }

    void schedule() {
        q.set_estimates({{0, kWords}, {0, estimate::kRows}});
        quantized.set_estimates({{0, kWords}, {0, estimate::kRows}});
        if (using_autoscheduler()) {
            return;
        }
        stages.out = quantized;
        schedule_fwht(stages, build_plan());
    }

private:
    FwhtStages stages;
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::Fwht128QuantFp8, fwht128_quant_fp8)
HALIDE_REGISTER_GENERATOR(kpool::Fwht128QuantFp8Words, fwht128_quant_fp8_words)
