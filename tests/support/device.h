// Where the kpool tool and the tests run kernels: the memory the C API is
// handed, the copies to and from it, and the stream. The CPU device hands the
// C API host memory; the CUDA device owns device memory and copies to and
// from it (through support/cuda_driver.h). Everything above this interface
// (kpool demo, kpool check, the dump replay, the GPU tests) is written once
// for both.
#ifndef KPOOL_TESTS_SUPPORT_DEVICE_H
#define KPOOL_TESTS_SUPPORT_DEVICE_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kpool/kpool.h"

namespace kpool_support {

class Device {
public:
    virtual ~Device() = default;

    virtual kpool_device_type type() const = 0;
    virtual int32_t index() const = 0;
    // "cpu", "cuda:0 (NVIDIA H200)".
    virtual std::string name() const = 0;
    // True when the C API reads host memory directly: no device allocation,
    // uploads and downloads are no-ops.
    virtual bool uses_host_memory() const = 0;

    virtual void *allocate(int64_t bytes) = 0;
    virtual void release(void *data) = 0;
    virtual void upload(void *device_data, const void *host_data, int64_t bytes) = 0;
    virtual void download(void *host_data, const void *device_data, int64_t bytes) = 0;
    // Waits until every call issued on exec() has finished (for timing).
    virtual void synchronize() = 0;
    // Makes the device's context current on the calling thread, for the
    // caller's own driver calls (streams, async copies) and for allocations
    // made from other threads; nothing to do on the CPU.
    virtual void make_current() {}
    virtual kpool_exec exec() const = 0;
    // The driver calls under every kernel launch through Halide's CUDA
    // runtime, host µs per call of `calls` back to back (false where the
    // device launches no kernels: the CPU).
    struct DriverFloor {
        double launch_us;        // cuLaunchKernel of an empty kernel on exec()'s stream
        double push_pop_us;      // a cuCtxPushCurrent + cuCtxPopCurrent pair
        double get_function_us;  // cuModuleGetFunction of that kernel by name
    };
    virtual bool time_driver_floor(int calls, DriverFloor *floor) {
        (void)calls, (void)floor;
        return false;
    }
};

// Which device a command asked for: --device auto|cpu|cuda.
enum class DeviceChoice { Auto, Cpu, Cuda };

// Parses "auto", "cpu" or "cuda"; false for anything else.
bool parse_device_choice(const std::string &text, DeviceChoice *choice);

struct OpenedDevice {
    std::unique_ptr<Device> device;  // null when the choice cannot be honoured
    std::string line;                // "device: cpu (no CUDA support in this build)"
    std::string error;               // why `device` is null
};

// Auto picks the GPU when this build can drive one and one is present, else
// the CPU (and says why in `line`).
OpenedDevice open_device(DeviceChoice choice);

// Whether the kpool library was built with CUDA kernels (kpool_version()).
bool library_has_cuda();

// GPU `index` through the CUDA driver (device_cuda.cpp), its context made
// current on the calling thread; or null with the reason in *error (no
// driver, no such GPU).
std::unique_ptr<Device> open_cuda_device(int index, std::string *error);

// Bytes owned for one tensor: a host copy (what the reference and the
// comparisons read) and, on a device that needs it, device memory that the
// C API is handed. On the CPU both are the same bytes.
class DeviceBuffer {
public:
    DeviceBuffer(Device &device, std::vector<uint8_t> host_bytes);
    ~DeviceBuffer();
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;

    std::vector<uint8_t> &host() { return host_; }
    const std::vector<uint8_t> &host() const { return host_; }
    int64_t size() const { return static_cast<int64_t>(host_.size()); }

    // Host -> device and device -> host (no-ops on the CPU).
    void upload();
    void download();

    // `host_view` describes some of host()'s bytes (data points into it);
    // the result describes the same elements of the device copy.
    kpool_tensor on_device(const kpool_tensor &host_view) const;
    // A C-contiguous descriptor of the whole buffer as `dtype` [shape].
    kpool_tensor contiguous(kpool_dtype dtype, const std::vector<int64_t> &shape) const;

private:
    Device &device_;
    std::vector<uint8_t> host_;
    void *device_data_ = nullptr;
};

}  // namespace kpool_support

#endif  // KPOOL_TESTS_SUPPORT_DEVICE_H
