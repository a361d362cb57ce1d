#include "support/cuda_driver.h"

#include <dlfcn.h>

#include <stdexcept>

namespace kpool_support::cuda {
namespace {

template <typename F>
bool bind(void *library, const char *name, F *function) {
    *function = reinterpret_cast<F>(dlsym(library, name));
    return *function != nullptr;
}

// "<what> failed: <driver's text> (<code>)"
std::string failure_text(const Driver &d, CUresult result, const char *what) {
    const char *text = nullptr;
    if (d.cuGetErrorString(result, &text) != kSuccess || text == nullptr) text = "?";
    return std::string(what) + " failed: " + text + " (" + std::to_string(result) + ")";
}

struct Loaded {
    Driver driver;
    std::string failure;  // empty: loaded
};

Loaded load() {
    Loaded loaded;
    void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
        loaded.failure = "no CUDA driver (libcuda.so.1 not found)";
        return loaded;
    }
    Driver &d = loaded.driver;
    const char *missing = nullptr;
    auto need = [&](const char *name, auto *function) {
        if (!bind(library, name, function) && missing == nullptr) missing = name;
    };
    need("cuInit", &d.cuInit);
    need("cuGetErrorString", &d.cuGetErrorString);
    need("cuDeviceGetCount", &d.cuDeviceGetCount);
    need("cuDeviceGet", &d.cuDeviceGet);
    need("cuDeviceGetName", &d.cuDeviceGetName);
    need("cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain);
    need("cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease);
    need("cuCtxSetCurrent", &d.cuCtxSetCurrent);
    need("cuCtxPushCurrent_v2", &d.cuCtxPushCurrent);
    need("cuCtxPopCurrent_v2", &d.cuCtxPopCurrent);
    need("cuCtxSynchronize", &d.cuCtxSynchronize);
    need("cuMemAlloc_v2", &d.cuMemAlloc);
    need("cuMemFree_v2", &d.cuMemFree);
    need("cuMemcpyHtoD_v2", &d.cuMemcpyHtoD);
    need("cuMemcpyDtoH_v2", &d.cuMemcpyDtoH);
    need("cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync);
    need("cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync);
    need("cuStreamCreate", &d.cuStreamCreate);
    need("cuStreamDestroy_v2", &d.cuStreamDestroy);
    need("cuStreamSynchronize", &d.cuStreamSynchronize);
    need("cuStreamBeginCapture_v2", &d.cuStreamBeginCapture);
    need("cuStreamEndCapture", &d.cuStreamEndCapture);
    need("cuGraphLaunch", &d.cuGraphLaunch);
    need("cuGraphExecDestroy", &d.cuGraphExecDestroy);
    need("cuGraphDestroy", &d.cuGraphDestroy);
    need("cuModuleLoadData", &d.cuModuleLoadData);
    need("cuModuleGetFunction", &d.cuModuleGetFunction);
    need("cuLaunchKernel", &d.cuLaunchKernel);
    if (!bind(library, "cuGraphInstantiateWithFlags", &d.cuGraphInstantiateWithFlags) &&
        !bind(library, "cuGraphInstantiate_v2", &d.cuGraphInstantiate) && missing == nullptr) {
        missing = "cuGraphInstantiateWithFlags";
    }
    if (missing != nullptr) {
        loaded.failure = std::string("the CUDA driver is too old (it lacks ") + missing + ")";
        return loaded;
    }
    const CUresult init = d.cuInit(0);
    if (init != kSuccess) loaded.failure = failure_text(d, init, "cuInit");
    return loaded;
}

}  // namespace

const Driver *load_driver(std::string *error) {
    static const Loaded loaded = load();
    if (!loaded.failure.empty()) {
        *error = loaded.failure;
        return nullptr;
    }
    return &loaded.driver;
}

const Driver &driver() {
    std::string error;
    const Driver *d = load_driver(&error);
    if (d == nullptr) throw std::runtime_error(error);
    return *d;
}

void check(CUresult result, const char *what) {
    if (result != kSuccess) throw std::runtime_error(failure_text(driver(), result, what));
}

Stream::Stream() { check(driver().cuStreamCreate(&stream_, kStreamNonBlocking), "cuStreamCreate"); }
Stream::~Stream() { driver().cuStreamDestroy(stream_); }
void Stream::synchronize() const { check(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize"); }

Graph::~Graph() {
    if (exec_ != nullptr) driver().cuGraphExecDestroy(exec_);
    if (graph_ != nullptr) driver().cuGraphDestroy(graph_);
}

void Graph::begin_capture(const Stream &stream) {
    check(driver().cuStreamBeginCapture(stream.get(), kCaptureModeGlobal), "cuStreamBeginCapture");
}

void Graph::end_capture(const Stream &stream) {
    check(driver().cuStreamEndCapture(stream.get(), &graph_), "cuStreamEndCapture");
}

void Graph::instantiate() {
    const Driver &d = driver();
    if (d.cuGraphInstantiateWithFlags != nullptr) {
        check(d.cuGraphInstantiateWithFlags(&exec_, graph_, 0), "cuGraphInstantiateWithFlags");
    } else {
        check(d.cuGraphInstantiate(&exec_, graph_, nullptr, nullptr, 0), "cuGraphInstantiate");
    }
}

void Graph::launch(const Stream &stream) { check(driver().cuGraphLaunch(exec_, stream.get()), "cuGraphLaunch"); }

}  // namespace kpool_support::cuda
