// What the CUDA family decides before an algorithm is written
// (ScheduleDecisions, kpool_schedules.cpp): a row kernel's layout in the
// lanes of a warp, and how e4m3 codes are made.
#include "cuda.h"
#include "decode_block.h"
#include "plan.h"

#include <string>

namespace kpool::cuda {

using Halide::CompileError;

// e4m3 codes from the family's conversion instruction where its row has one
// (cvt.rn.satfinite.e4m3x2.f32: one instruction per pair, the clamp
// included), else from integer bit arithmetic.
E4m3Encoder e4m3_encoder(const BuildPlan &build) {
    return build.has_gpu_feature("e4m3") ? E4m3Encoder::Sm90 : E4m3Encoder::Integer;
}

RowLayout row_layout(const BuildPlan &build, const KernelAsked &kernel) {
    const CudaPlan plan = plan_for(build);
    int values = 0;
    switch (kernel.kind) {
    case KernelAsked::Kind::Fwht:
        values = plan.fwht_values;
        break;
    case KernelAsked::Kind::Compress:
        values = kernel.arithmetic == Arithmetic::Triton ? plan.compress_triton_values
                 : kernel.words                          ? plan.compress_exact_words_values
                                                         : plan.compress_values;
        break;
    case KernelAsked::Kind::Decode:
        if (kernel.row_over_warps) {
            return block_row_layout();  // decode_block.cpp
        }
        values = kDecodeValues;
        break;
    case KernelAsked::Kind::SeedTail:  // not a row kernel
        break;
    }
    if (values != 4 && values != 8 && values != 16 && values != 32) {
        throw CompileError("CUDA plan " + build.gpu + ": values per lane must be 4, 8, 16 or 32");
    }
    const int run = kernel.kind == KernelAsked::Kind::Fwht ? plan.fwht_run : values;
    return RowLayout{values, /*partner_by_index=*/true, run};
}

}  // namespace kpool::cuda
