// The CUDA schedule family, tuned per GPU (plans in cuda.cpp).
#pragma once

#include "kpool_schedules.h"

namespace kpool::cuda {

#include "family.inc"

}  // namespace kpool::cuda
