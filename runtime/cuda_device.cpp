#include "cuda_device.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "HalideRuntimeCuda.h"
#include "errors.h"

namespace kpool::rt {

namespace {

using CUresult = int;
using CUdevice = int;

// The few driver entry points kpool itself needs (Halide loads its own).
// The tests and the tool load the driver through their own shim
// (tests/support/cuda_driver.h); the library keeps this one so that the
// product depends on no test code.
struct Driver {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(void **, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxPushCurrent)(void *);
    CUresult (*cuCtxPopCurrent)(void **);
    CUresult (*cuMemAlloc)(uint64_t *, size_t);
    CUresult (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
    CUresult (*cuMemcpyDtoHAsync)(void *, uint64_t, size_t, void *);
    CUresult (*cuMemsetD32Async)(uint64_t, unsigned, size_t, void *);
    CUresult (*cuStreamSynchronize)(void *);
    CUresult (*cuStreamIsCapturing)(void *, int *);  // CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated
    bool loaded = false;
};

// The process whose cuInit the driver's state belongs to, and whether this
// process is a fork of it: a child inherits kpool's devices and Halide's
// modules but not the driver's contexts or threads, so nothing it queued
// would run (CUDA does not support a fork after cuInit).
pid_t cuda_initialized_in = 0;
std::atomic<bool> inherited_cuda{false};

void mark_fork_child() { inherited_cuda.store(true, std::memory_order_relaxed); }

constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

template <typename F>
bool bind(void *lib, const char *name, F &f) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    return f != nullptr;
}

const Driver &driver() {
    static Driver d = [] {
        Driver r{};
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            return r;
        }
        r.loaded = bind(lib, "cuInit", r.cuInit) && bind(lib, "cuDeviceGetCount", r.cuDeviceGetCount) &&
                   bind(lib, "cuDeviceGet", r.cuDeviceGet) &&
                   bind(lib, "cuDeviceGetAttribute", r.cuDeviceGetAttribute) &&
                   bind(lib, "cuDevicePrimaryCtxRetain", r.cuDevicePrimaryCtxRetain) &&
                   bind(lib, "cuCtxPushCurrent_v2", r.cuCtxPushCurrent) &&
                   bind(lib, "cuCtxPopCurrent_v2", r.cuCtxPopCurrent) && bind(lib, "cuMemAlloc_v2", r.cuMemAlloc) &&
                   bind(lib, "cuMemcpyHtoD_v2", r.cuMemcpyHtoD) &&
                   bind(lib, "cuMemcpyDtoHAsync_v2", r.cuMemcpyDtoHAsync) &&
                   bind(lib, "cuMemsetD32Async", r.cuMemsetD32Async) &&
                   bind(lib, "cuStreamSynchronize", r.cuStreamSynchronize) &&
                   bind(lib, "cuDevicePrimaryCtxRelease_v2", r.cuDevicePrimaryCtxRelease) &&
                   bind(lib, "cuStreamIsCapturing", r.cuStreamIsCapturing) && r.cuInit(0) == 0;
        if (r.loaded) {
            cuda_initialized_in = getpid();
            pthread_atfork(nullptr, nullptr, &mark_fork_child);
        }
        return r;
    }();
    return d;
}

// A context current on this thread for a scope; the thread's own is
// current again after it.
class CurrentContext {
public:
    explicit CurrentContext(void *context) { driver().cuCtxPushCurrent(context); }
    ~CurrentContext() {
        void *popped = nullptr;
        driver().cuCtxPopCurrent(&popped);
    }
    CurrentContext(const CurrentContext &) = delete;
    CurrentContext &operator=(const CurrentContext &) = delete;
};

// New device memory in `context` holding a copy of `bytes` host bytes; 0
// when the driver refuses.
uint64_t device_copy_of(void *context, const void *host, size_t bytes) {
    const Driver &d = driver();
    CurrentContext current(context);
    uint64_t dptr = 0;
    return d.cuMemAlloc(&dptr, bytes) == 0 && d.cuMemcpyHtoD(dptr, host, bytes) == 0 ? dptr : 0;
}

// The Halide runtime asks these for the context and stream of every CUDA
// kernel call: the caller's, carried in user_context, never one of its own.
int acquire_context(void *user_context, void **ctx, bool) {
    if (user_context == nullptr) {
        return -1;
    }
    *ctx = static_cast<CudaCall *>(user_context)->context;
    return 0;
}

int release_context(void *) { return 0; }

int get_stream(void *user_context, void *, void **stream) {
    if (user_context == nullptr) {
        return -1;
    }
    *stream = static_cast<CudaCall *>(user_context)->stream;
    return 0;
}

void install_context_hooks() {
    halide_set_cuda_acquire_context(reinterpret_cast<halide_cuda_acquire_context_t>(&acquire_context));
    halide_set_cuda_release_context(&release_context);
    halide_set_cuda_get_stream(reinterpret_cast<halide_cuda_get_stream_t>(&get_stream));
}

// The newest family built whose lowest capability the device meets (the
// family table, CMakeLists.txt). A family's PTX runs on every newer GPU
// (JIT-compiled where its SASS does not fit, runtime/cuda_module_loader.cpp);
// a family that uses newer instructions never loads below its capability.
// $KPOOL_CUDA_FAMILY=<name> runs that family instead, if it is built and the
// device meets it (an older family on a newer GPU: one GPU tests both; a
// fallback should a newer family's kernel misbehave).
Family family_of(const char *arg, int index, int major, int minor) {
    struct Row {
        Family family;
        int capability;
    };
#define KPOOL_FAMILY_ROW(family, capability) {Family::family, capability},
    const std::vector<Row> built = {KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_FAMILY_ROW)};
#undef KPOOL_FAMILY_ROW
    const int capability = major * 10 + minor;
    const char *asked = std::getenv("KPOOL_CUDA_FAMILY");
    const Row *newest = nullptr;
    for (const Row &row : built) {
        if (row.capability > capability) {
            continue;
        }
        if (asked != nullptr && std::strcmp(asked, name(row.family)) == 0) {
            return row.family;
        }
        if (newest == nullptr || row.capability > newest->capability) {
            newest = &row;
        }
    }
    if (newest == nullptr) {
        throw unsupported() << arg << " is on cuda:" << index << " (compute capability " << major << "." << minor
                            << "); this build's CUDA kernels (KPOOL_CUDA_FAMILIES) need a newer GPU";
    }
    return newest->family;
}

// Opens device `index` into `c`; on failure releases the primary context
// it retained (a retry retains it again).
void init_device(CudaDevice &c, int index, const char *arg) {
    const Driver &d = driver();
    CUdevice dev = 0;
    c.index = index;
    if (d.cuDeviceGet(&dev, index) != 0 || d.cuDevicePrimaryCtxRetain(&c.primary_context, dev) != 0) {
        throw device_error() << arg << " is on cuda:" << index << ", which the driver cannot open";
    }
    try {
        d.cuDeviceGetAttribute(&c.major, kAttrComputeCapabilityMajor, dev);
        d.cuDeviceGetAttribute(&c.minor, kAttrComputeCapabilityMinor, dev);
        c.family = family_of(arg, index, c.major, c.minor);
        const KernelConstants host;
        const uint64_t dptr = device_copy_of(c.primary_context, &host, sizeof(host));
        if (dptr == 0) {
            throw device_error() << "cuda:" << index << ": could not allocate kpool's constants";
        }
        c.constants = reinterpret_cast<void *>(dptr);
    } catch (...) {
        d.cuDevicePrimaryCtxRelease(dev);
        c.primary_context = nullptr;
        throw;
    }
}

// One device's state: initialized once, under a lock of its own (a slow
// device's first call holds up no other's).
struct DeviceSlot {
    std::mutex init;
    std::atomic<const CudaDevice *> ready{nullptr};
    std::unique_ptr<CudaDevice> device;
};

// Read once: the devices a process sees are fixed when the driver starts
// (CUDA_VISIBLE_DEVICES), and every device call asks.
int device_count() {
    static const int count = [] {
        const Driver &d = driver();
        int n = 0;
        return d.loaded && d.cuDeviceGetCount(&n) == 0 ? n : 0;
    }();
    return count;
}

}  // namespace

bool cuda_available() { return device_count() > 0; }

const CudaDevice &cuda_device(int index, const char *arg, void *stream) {
    static std::once_flag hooks;
    if (!cuda_available()) {
        throw device_error() << arg << " is on cuda:" << index << ", but no CUDA driver or device is present";
    }
    if (inherited_cuda.load(std::memory_order_relaxed)) {
        throw device_error() << arg << " is on cuda:" << index << ", but this process (" << getpid()
                             << ") is a fork of process " << cuda_initialized_in
                             << ", which had initialized CUDA: a child cannot use its parent's CUDA state (start "
                                "workers with the 'spawn' method, or fork before the first CUDA call)";
    }
    const int count = device_count();
    if (index < 0 || index >= count) {
        throw invalid() << arg << " is on cuda:" << index << ", but there are " << count << " CUDA devices";
    }
    static std::vector<DeviceSlot> slots(count);
    DeviceSlot &slot = slots[index];
    if (const CudaDevice *ready = slot.ready.load(std::memory_order_acquire)) {
        return *ready;
    }
    std::call_once(hooks, install_context_hooks);
    std::lock_guard<std::mutex> lock(slot.init);
    if (!slot.device) {
        int capture = 0;
        if (stream != nullptr && driver().cuStreamIsCapturing(stream, &capture) == 0 && capture != 0) {
            throw device_error() << arg << " is on cuda:" << index << ", whose first kpool call allocates and "
                                 << "copies kpool's constants, but its stream is capturing a CUDA graph: call "
                                 << "kpool_cuda_warm_up (Python: kpool.cuda_warm_up) on the device before capturing";
        }
        auto device = std::make_unique<CudaDevice>();
        init_device(*device, index, arg);
        slot.device = std::move(device);
        slot.ready.store(slot.device.get(), std::memory_order_release);
    }
    return *slot.device;
}

bool LoadedKernels::contains(AnyKernel kernel) const {
    if (all()) {
        return true;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return kernels_.count(kernel) != 0;
}

void LoadedKernels::insert(AnyKernel kernel) {
    std::lock_guard<std::mutex> lock(mutex_);
    kernels_.insert(kernel);
}

bool stream_is_capturing(const CudaDevice &device, void *stream) {
    // The legacy default stream (NULL) cannot capture.
    if (stream == nullptr) {
        return false;
    }
    CurrentContext current(device.primary_context);
    int capture = 0;
    return driver().cuStreamIsCapturing(stream, &capture) == 0 && capture != 0;
}

void require_not_capturing_to_load(const CudaDevice &device, void *stream, const char *what) {
    if (stream_is_capturing(device, stream)) {
        throw device_error() << what << ": the kernel's first launch on cuda:" << device.index
                             << " loads its module, which a CUDA-graph capture cannot contain, and the stream "
                             << "is capturing: call kpool_cuda_warm_up (Python: kpool.cuda_warm_up) on the device "
                             << "before capturing";
    }
}

void *device_scratch(const CudaDevice &device, size_t bytes) {
    static std::mutex mutex;
    static std::vector<void *> scratch;
    std::lock_guard<std::mutex> lock(mutex);
    if (scratch.size() <= static_cast<size_t>(device.index)) {
        scratch.resize(device.index + 1, nullptr);
    }
    if (scratch[device.index] == nullptr) {
        const std::vector<uint8_t> zeros(bytes, 0);
        const uint64_t dptr = device_copy_of(device.primary_context, zeros.data(), bytes);
        if (dptr == 0) {
            throw device_error() << "cuda:" << device.index << ": could not allocate " << bytes
                                 << " bytes of scratch memory";
        }
        scratch[device.index] = reinterpret_cast<void *>(dptr);
    }
    return scratch[device.index];
}

void zero_device_memory(const CudaDevice &device, void *data, size_t bytes, void *stream) {
    CurrentContext current(device.primary_context);
    const CUresult r = driver().cuMemsetD32Async(reinterpret_cast<uint64_t>(data), 0, bytes / 4, stream);
    if (r != 0) {
        throw device_error() << "cuda:" << device.index << ": zeroing scratch memory failed (CUDA error " << r << ")";
    }
}

void synchronize_stream(const CudaDevice &device, void *stream) {
    CurrentContext current(device.primary_context);
    const CUresult r = driver().cuStreamSynchronize(stream);
    if (r != 0) {
        throw device_error() << "cuda:" << device.index << ": synchronizing the stream failed (CUDA error " << r << ")";
    }
}

void take_index_errors(const CudaDevice &device, void *stream, int32_t *words, int32_t *out, int count) {
    const Driver &d = driver();
    const uint64_t dptr = reinterpret_cast<uint64_t>(words);
    const size_t bytes = sizeof(int32_t) * static_cast<size_t>(count);
    CurrentContext current(device.primary_context);
    const CUresult copied = d.cuMemcpyDtoHAsync(out, dptr, bytes, stream);
    const CUresult cleared = copied == 0 ? d.cuMemsetD32Async(dptr, 0, static_cast<size_t>(count), stream) : copied;
    const CUresult synced = cleared == 0 ? d.cuStreamSynchronize(stream) : cleared;
    if (synced != 0) {
        throw device_error() << "exec->index_errors = " << static_cast<const void *>(words)
                             << " could not be read on cuda:" << device.index << " (CUDA error " << synced
                             << ")";
    }
}

}  // namespace kpool::rt
