// The CUDA warm-up (kpool_cuda_warm_up), and what it loaded (kpool_cuda_loaded_images).
#pragma once

#include "kpool/kpool.h"

namespace kpool::rt {

// Runs every CUDA variant of the build once on device `device_index`, on
// `stream`, then waits for it; at most once per device (thread-safe).
void warm_up_cuda(int device_index, void *stream);

// The family device `device_index` runs and the images of its kernel modules
// loaded so far (runtime/cuda_module_loader.cpp).
void cuda_loaded_images(int device_index, kpool_cuda_images *images);

}  // namespace kpool::rt
