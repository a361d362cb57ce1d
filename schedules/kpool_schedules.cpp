// Picks the schedule family for the target a generator is built for.
#include "kpool_stages.h"

#include "cpu.h"
#include "cuda.h"

namespace kpool {

// In the tests' generators (KPOOL_TEST_GENERATORS) a CPU build that names a
// GPU family gets that family's layout: the tests run the GPU layouts'
// algorithms on the CPU (tests/test_layouts.cpp). The product's generators
// build no such kernel.
ScheduleDecisions schedule_decisions(const BuildPlan &plan, const KernelAsked &kernel) {
    const bool cuda = plan.target.has_feature(Target::CUDA);
#ifdef KPOOL_TEST_GENERATORS
    const bool gpu_layout = cuda || !plan.gpu.empty();
#else
    if (!cuda && !plan.gpu.empty()) {
        throw Halide::CompileError("a CPU kernel with GPU family " + plan.gpu + "'s layout is the tests' (kpool_test_generators)");
    }
    const bool gpu_layout = cuda;
#endif
    ScheduleDecisions d;
    if (kernel.is_row_kernel()) {
        d.layout = gpu_layout ? cuda::row_layout(plan, kernel) : cpu::row_layout(plan, kernel);
    }
    d.exp_branches = cuda;
    // (A block per request's thread loads one element of a member: a
    // branch on its source, the same for the block, is one load, not two.)
    d.member_branches = cuda && kernel.kind == KernelAsked::Kind::Decode && (kernel.words || kernel.row_over_warps);
    // The exps are most of the exact arithmetic's instructions. Decode takes
    // the fma path in its words kernels only: element by element, the
    // warp-per-token kernels sit at the 128-register cap, where its f64
    // coefficients spill (P=8: 8 bytes, sm90).
    // (A block per request pools one element a thread: registers to spare.)
    d.exp_fma_fast_path = cuda && (kernel.kind == KernelAsked::Kind::Compress ||
                                   (kernel.kind == KernelAsked::Kind::Decode && (kernel.words || kernel.row_over_warps)));
    d.e4m3 = cuda ? cuda::e4m3_encoder(plan) : E4m3Encoder::Integer;
    d.seed_group_size = cuda ? cuda::seed_group_size(plan) : 1;
    return d;
}

#define KPOOL_DISPATCH(name, Stages)                                    \
    void name(Stages &s, const BuildPlan &plan) {                       \
        if (plan.target.has_feature(Target::CUDA)) {                    \
            cuda::name(s, plan);                                        \
        } else {                                                        \
            cpu::name(s, plan);                                         \
        }                                                               \
    }

KPOOL_SCHEDULE_HOOKS(KPOOL_DISPATCH)

#undef KPOOL_DISPATCH

}  // namespace kpool
