// The CUDA warm-up (kpool_cuda_warm_up).
#pragma once

namespace kpool::rt {

// Runs every CUDA variant of the build once on device `device_index`, on
// `stream`, then waits for it; at most once per device (thread-safe).
void warm_up_cuda(int device_index, void *stream);

}  // namespace kpool::rt
