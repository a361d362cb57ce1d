// The CUDA side of the runtime: the driver (loaded at first use, so a
// machine without one runs the CPU path), each device's primary context (the
// one cudart and PyTorch use), its GPU family, and the per-call state the
// kernels receive as user_context.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>

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

// The kernels whose modules a device's context has loaded. A kernel's first
// launch on a context loads its module (a synchronous load, or a JIT
// compile of its PTX), which no CUDA-graph capture may contain.
class LoadedKernels {
public:
    bool contains(AnyKernel kernel) const;
    void insert(AnyKernel kernel);
    // The warm-up launched every variant of the device's family.
    void insert_all() { all_.store(true, std::memory_order_release); }
    bool all() const { return all_.load(std::memory_order_acquire); }

private:
    std::atomic<bool> all_{false};
    mutable std::mutex mutex_;
    std::set<AnyKernel> kernels_;
};

struct CudaDevice {
    int index = -1;
    void *primary_context = nullptr;
    int major = 0, minor = 0;         // compute capability
    Family family = Family::cpu;      // the newest built GPU family the device meets
    void *constants = nullptr;        // a KernelConstants in device memory
    mutable LoadedKernels loaded;     // what launches on it would not load
    mutable std::mutex warm_up_lock;  // one warm-up of this device at a time
};

// True when a CUDA driver with at least one device is present.
bool cuda_available();
// The device, initialized once per process (thread-safe, each device under
// a lock of its own). Throws a StatusError naming `arg` when there is no
// such device; a DEVICE one when this process is a fork of the one that
// initialized CUDA, or when the device is not yet initialized and `stream`
// is capturing a CUDA graph (initializing allocates and copies).
const CudaDevice &cuda_device(int index, const char *arg, void *stream = nullptr);

// Whether `stream` (of `device`'s context) is capturing a CUDA graph.
bool stream_is_capturing(const CudaDevice &device, void *stream);
// Before the first launch of a kernel on `device` (not in device.loaded):
// throws a DEVICE StatusError naming `what` when `stream` is capturing, as
// loading the kernel's module would break the capture.
void require_not_capturing_to_load(const CudaDevice &device, void *stream, const char *what);

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
