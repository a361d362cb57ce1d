// The host-CPU schedule family.
#pragma once

#include "kpool_stages.h"

namespace kpool::cpu {

KPOOL_SCHEDULE_FAMILY

// The test-only numerics probe runs on the host only.
void schedule_numerics_probe(NumericsProbeStages &s, const BuildPlan &plan);

}  // namespace kpool::cpu
