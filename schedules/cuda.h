// The CUDA schedule family (schedules/cuda/, a file per op family over the
// shared warp placements of warp_helpers.h), tuned per GPU family (its
// parameters in schedules/<family>.knobs).
#pragma once

#include "kpool_stages.h"

namespace kpool::cuda {

KPOOL_SCHEDULE_FAMILY
int seed_group_size(const BuildPlan &plan);  // warps per block of the seed copy
E4m3Encoder e4m3_encoder(const BuildPlan &plan);

}  // namespace kpool::cuda
