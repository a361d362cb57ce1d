// Picks the schedule family for the target a generator is built for.
#include "kpool_schedules.h"

#include "cpu.h"

namespace kpool {

namespace {

void require_cpu(const BuildPlan &plan, const char *kernel) {
    if (plan.target.has_gpu_feature()) {
        throw Halide::CompileError(std::string(kernel) + ": no GPU schedule for target " +
                                   plan.target.to_string() + " (gpu=" + plan.gpu + ")");
    }
}

}  // namespace

RowLayout row_layout(const BuildPlan &plan) {
    require_cpu(plan, "row_layout");
    return cpu::row_layout();
}

#define KPOOL_DISPATCH(name, Stages)                        \
    void name(Stages &s, const BuildPlan &plan) {           \
        require_cpu(plan, #name);                           \
        cpu::name(s, plan);                                 \
    }

KPOOL_DISPATCH(schedule_fwht, FwhtStages)
KPOOL_DISPATCH(schedule_compress_to_cache, CompressToCacheStages)
KPOOL_DISPATCH(schedule_compress_to_rows, CompressToRowsStages)
KPOOL_DISPATCH(schedule_seed_tail, SeedTailStages)
KPOOL_DISPATCH(schedule_decode_write, DecodeWriteStages)
KPOOL_DISPATCH(schedule_decode_stash, DecodeStashStages)
KPOOL_DISPATCH(schedule_expand, ExpandStages)
KPOOL_DISPATCH(schedule_numerics_probe, NumericsProbeStages)

#undef KPOOL_DISPATCH

}  // namespace kpool
