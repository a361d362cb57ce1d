// The CUDA schedule family, tuned per GPU (plans in cuda.cpp).
#pragma once

#include "kpool_schedules.h"

namespace kpool::cuda {

RowLayout row_layout();

void schedule_fwht(FwhtStages &s, const BuildPlan &plan);
void schedule_compress_to_cache(CompressToCacheStages &s, const BuildPlan &plan);
void schedule_compress_to_rows(CompressToRowsStages &s, const BuildPlan &plan);
void schedule_seed_tail(SeedTailStages &s, const BuildPlan &plan);
void schedule_decode_write(DecodeWriteStages &s, const BuildPlan &plan);
void schedule_decode_stash(DecodeStashStages &s, const BuildPlan &plan);
void schedule_expand(ExpandStages &s, const BuildPlan &plan);

}  // namespace kpool::cuda
