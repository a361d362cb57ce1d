// fwht128_quant_fp8: per row of q, bf16 -> f32 -> Hadamard-128 -> bf16 ->
// ue8m0 scale -> e4m3 codes. Two generators: one over elements (any
// strides), and one over words (CUDA: rows aligned to 16 bytes in and 8
// bytes out; each lane's run of 8 bf16 is one 16-byte load, its 8 codes one
// 8-byte store).
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

namespace {

// The rotation and quantization's decisions: the scale is always ue8m0, so
// the quotient is the same in both arithmetics (kpool_numerics.h): one
// kernel serves both.
ScheduleDecisions fwht_decisions(const BuildPlan &plan) {
    return schedule_decisions(plan, {KernelAsked::Kind::Fwht});
}

}  // namespace

class Fwht128QuantFp8 : public KpoolGenerator<Fwht128QuantFp8, FwhtStages> {
public:
    Input<Buffer<uint16_t, 2>> q{"q"};  // (d, row) bf16 bits
    // (d, row): e4m3 codes, and the row's f32 scale through a buffer whose
    // d stride is 0: one pass writes both.
    Output<Func> quantized{"quantized", {UInt(8), Float(32)}, 2};

    void generate() {
        FwhtStages &s = stages;
        Func x{"q_f32"};
        x(s.d, s.row) = bf16_to_f32(q(s.d, s.row));
        const ScheduleDecisions decided = fwht_decisions(build_plan());
        s.layout = decided.layout;
        s.rotate = rotate_quantize(x, s.d, s.v, s.lane, {s.row}, s.layout, Expr(true),
                                   pool_arithmetic(Arithmetic::Exact, build_plan().target), decided.e4m3);
        quantized(s.d, s.row) = Tuple(s.rotate.quant.codes(s.d, s.row), s.rotate.quant.scale(s.d, s.row));
        q.dim(0).set_bounds(0, kHeadDim);
        constrain_row_views(Func(quantized).output_buffers(), kHeadDim);
        s.out = quantized;
    }

    void schedule() {
        q.set_estimates({{0, kHeadDim}, {0, estimate::kRows}});
        quantized.set_estimates({{0, kHeadDim}, {0, estimate::kRows}});
        schedule_with(schedule_fwht);
    }
};

class Fwht128QuantFp8Words : public KpoolGenerator<Fwht128QuantFp8Words, FwhtStages> {
public:
    static constexpr int kPairValues = 2;   // bf16 per input word
    static constexpr int kWordCodes = 8;    // e4m3 codes per output word
    static constexpr int kLoadPairs = 4;    // input words per 16-byte load
    static constexpr int kPairs = kHeadDim / kPairValues;
    static constexpr int kWords = kHeadDim / kWordCodes;

    Input<Buffer<uint32_t, 2>> q{"q"};  // (pair, row): 2 bf16, the first in the low half
    // (word, row): 8 e4m3 codes, the first in the low byte, and the row's
    // scale through a buffer whose word stride is 0.
    Output<Func> quantized{"quantized", {UInt(64), Float(32)}, 2};

    void generate() {
        FwhtStages &s = stages;
        const ScheduleDecisions decided = fwht_decisions(build_plan());
        s.layout = decided.layout;
        const RowLayout &layout = s.layout;
        if (layout.run % kWordCodes != 0) {
            throw CompileError("the words kernel stores a lane's runs as words of " + std::to_string(kWordCodes) +
                               " codes: runs of " + std::to_string(layout.run) + " elements do not fill them");
        }
        const int run_pairs = layout.run / kPairValues;
        // A lane's runs in its own order (RowLayout::element): its
        // run_index-th run starts at element (run_index * lanes + lane) * run.
        s.lane_pairs(s.pair, s.run_index, s.lane, s.row) =
            q((s.run_index * layout.lanes() + s.lane) * run_pairs + s.pair, s.row);
        Func x{"q_lanes_f32"};
        Expr v_in_run = s.v % layout.run;
        Expr pair = s.lane_pairs(v_in_run / kPairValues, s.v / layout.run, s.lane, s.row);
        x(s.v, s.lane, s.row) = bf16_to_f32(cast<uint16_t>(pair >> cast<uint32_t>((v_in_run % kPairValues) * 16)));
        s.rotate = rotate_quantize_lanes(x, s.d, s.v, s.lane, {s.row}, layout, Expr(true),
                                         pool_arithmetic(Arithmetic::Exact, build_plan().target), decided.e4m3);
        const Fp8Row &quant = s.rotate.quant;
        const Var &w = s.word;
        Expr halves[2];
        for (int h = 0; h < 2; h++) {
            Expr values[4];
            for (int i = 0; i < 4; i++) {
                values[i] = quant.quotient(w * kWordCodes + h * 4 + i, s.row);
            }
            halves[h] = cast<uint64_t>(e4m3_word_saturated(values, quant.encoder));
        }
        quantized(w, s.row) = Tuple(halves[0] | (halves[1] << 32), quant.scale(w * kWordCodes, s.row));
        q.dim(0).set_bounds(0, kPairs);
        // Rows of whole 16-byte loads (the runtime takes this kernel only
        // for rows so aligned): the stride in 4-byte words is a multiple of 4.
        q.dim(1).set_stride((q.dim(1).stride() / kLoadPairs) * kLoadPairs);
        constrain_row_views(Func(quantized).output_buffers(), kWords);
        s.codes_per_word = kWordCodes;
        s.out = quantized;
    }

    void schedule() {
        q.set_estimates({{0, kPairs}, {0, estimate::kRows}});
        quantized.set_estimates({{0, kWords}, {0, estimate::kRows}});
        schedule_with(schedule_fwht);
    }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::Fwht128QuantFp8, fwht128_quant_fp8)
HALIDE_REGISTER_GENERATOR(kpool::Fwht128QuantFp8Words, fwht128_quant_fp8_words)
