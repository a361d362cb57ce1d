// The host-CPU schedule family.
#pragma once

#include "kpool_stages.h"

namespace kpool::cpu {

KPOOL_SCHEDULE_FAMILY

}  // namespace kpool::cpu
