// Picks the schedule family for the target a generator is built for.
#include "kpool_stages.h"

#include "cpu.h"
#include "cuda.h"

namespace kpool {

// A CPU build that names a GPU family gets that family's layout: the tests
// run the GPU layouts' algorithms on the CPU (tests/test_layouts.cpp).
ScheduleDecisions schedule_decisions(const BuildPlan &plan, const KernelAsked &kernel) {
    const bool cuda = plan.target.has_feature(Target::CUDA);
    ScheduleDecisions d;
    if (kernel.is_row_kernel()) {
        d.layout = cuda || !plan.gpu.empty() ? cuda::row_layout(plan, kernel) : cpu::row_layout(plan, kernel);
    }
    d.exp_branches = cuda;
    d.member_branches = cuda && kernel.kind == KernelAsked::Kind::Decode && kernel.words;
    // The exps are most of the exact arithmetic's instructions. Decode takes
    // the fma path in its words kernels only: element by element, the
    // warp-per-token kernels sit at the 128-register cap, where its f64
    // coefficients spill (P=8: 8 bytes, sm90).
    d.exp_fma_fast_path = cuda && (kernel.kind == KernelAsked::Kind::Compress ||
                                   (kernel.kind == KernelAsked::Kind::Decode && kernel.words));
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
KPOOL_FOR_EACH_SCHEDULE_HOOK(KPOOL_DISPATCH)
#undef KPOOL_DISPATCH

// The probe is a test of the shared numerics on the host only.
void schedule_numerics_probe(NumericsProbeStages &s, const BuildPlan &plan) {
    cpu::schedule_numerics_probe(s, plan);
}

}  // namespace kpool
