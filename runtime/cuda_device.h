// The CUDA side of the runtime: the driver (loaded at first use, so a
// machine without one runs the CPU path), each device's primary context (the
// one cudart and PyTorch use), its GPU family, and the per-call state the
// kernels receive as user_context.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dispatch.h"

namespace kpool::rt {

// What a CUDA kernel call carries to the Halide runtime: the caller's
// context and stream (kpool_exec.stream; NULL is the legacy default stream).
struct CudaCall {
    void *context;
    void *stream;
};

// Constants standing in for absent optional inputs (read with stride 0):
// the write mask's 1, the page table's and the offsets' 0.
struct KernelConstants {
    uint8_t one = 1, pad[7] = {};
    int32_t zero32 = 0, pad32 = 0;
    int64_t zero64 = 0;
};

struct CudaDevice {
    int index;
    void *primary_context;
    int major, minor;  // compute capability
    Family family;     // the newest built GPU family the device meets
    void *constants;   // a KernelConstants in device memory
};

// True when a CUDA driver with at least one device is present.
bool cuda_available();
// The device, initialized once per process (thread-safe). Throws a
// StatusError naming `arg` when there is no such device.
const CudaDevice &cuda_device(int index, const char *arg);

// `bytes` of zeroed device memory on `device`, kpool's own, allocated at the
// first request and kept (the warm-up's tensors); one size per device.
void *device_scratch(const CudaDevice &device, size_t bytes);
// Zeroes `bytes` (a multiple of 4) of device memory at `data`, on `stream`.
void zero_device_memory(const CudaDevice &device, void *data, size_t bytes, void *stream);
// Waits for the work queued on `stream` (a CUstream of `device`'s context).
void synchronize_stream(const CudaDevice &device, void *stream);

// Copies `count` index-error words from device memory into `out` and zeroes
// them, on `stream`, and waits for both.
void take_index_errors(const CudaDevice &device, void *stream, int32_t *words, int32_t *out, int count);

}  // namespace kpool::rt
