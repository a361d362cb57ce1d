// The CUDA driver API as the tests, the kpool tool and the fuzz targets use
// it: libcuda.so.1 loaded at run time (building needs no CUDA toolkit, and
// the binaries run where there is no GPU), every entry point they call bound
// once, here. Device memory, copies, the primary context, streams and graphs.
//
// The kpool runtime loads the driver on its own (runtime/cuda_device.cpp):
// the product must not depend on test code, and it needs other entry points.
#ifndef KPOOL_TESTS_SUPPORT_CUDA_DRIVER_H
#define KPOOL_TESTS_SUPPORT_CUDA_DRIVER_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "kpool/kpool.h"

namespace kpool_support::cuda {

// The driver API's types (cuda.h, CUDA >= 11).
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st *;
using CUstream = struct CUstream_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUgraph = struct CUgraph_st *;
using CUgraphExec = struct CUgraphExec_st *;
using CUgraphNode = struct CUgraphNode_st *;
using CUdeviceptr = unsigned long long;

constexpr CUresult kSuccess = 0;
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr int kCaptureModeGlobal = 0;       // CU_STREAM_CAPTURE_MODE_GLOBAL

struct Driver {
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuGetErrorString)(CUresult, const char **) = nullptr;
    // Devices and their primary contexts (the ones kpool and PyTorch use).
    CUresult (*cuDeviceGetCount)(int *) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;  // what Halide's runtime brackets its calls with
    CUresult (*cuCtxPopCurrent)(CUcontext *) = nullptr;
    CUresult (*cuCtxSynchronize)() = nullptr;
    // Device memory and copies: synchronous ones on the legacy default
    // stream, asynchronous ones ordered on a stream.
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = nullptr;
    CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = nullptr;
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = nullptr;
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream) = nullptr;
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream) = nullptr;
    // Streams and the graphs captured on them.
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
    CUresult (*cuStreamDestroy)(CUstream) = nullptr;
    CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
    CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *) = nullptr;
    // CUDA >= 11.4 has the flags form; older drivers only the _v2 one (the
    // other is null).
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long) = nullptr;
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t) = nullptr;
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
    CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
    CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
    // Kernels of our own (the tool's empty kernel, to time a bare launch).
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = nullptr;
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = nullptr;
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **) = nullptr;
};

// Loads the driver once (and calls cuInit); null with the reason in *error
// when there is none or it lacks an entry point.
const Driver *load_driver(std::string *error);
// The loaded driver; throws std::runtime_error with the reason otherwise.
const Driver &driver();

// Throws "<what> failed: <driver's text> (<code>)" unless `result` is success.
void check(CUresult result, const char *what);

inline CUdeviceptr device_pointer(const void *data) {
    return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(data));
}

// A non-blocking stream: no implicit ordering with the legacy default stream,
// so everything on it is ordered by the stream alone. Made in the context
// current on the calling thread.
class Stream {
public:
    Stream();
    ~Stream();
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    CUstream get() const { return stream_; }
    // Calls on this stream, in the exact arithmetic.
    kpool_exec exec() const { return kpool_exec{stream_, KPOOL_ARITHMETIC_EXACT}; }
    void synchronize() const;

private:
    CUstream stream_ = nullptr;
};

// A graph captured on a stream, and its executable instance.
class Graph {
public:
    Graph() = default;
    ~Graph();
    Graph(const Graph &) = delete;
    Graph &operator=(const Graph &) = delete;

    void begin_capture(const Stream &stream);
    // Ends the capture (also after a failed call, so the stream is usable).
    void end_capture(const Stream &stream);
    void instantiate();
    void launch(const Stream &stream);

private:
    CUgraph graph_ = nullptr;
    CUgraphExec exec_ = nullptr;
};

}  // namespace kpool_support::cuda

#endif  // KPOOL_TESTS_SUPPORT_CUDA_DRIVER_H
