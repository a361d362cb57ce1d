// The CUDA device: device memory in the primary context of the GPU (the
// context the kpool runtime and PyTorch use), driven through the driver API
// of support/cuda_driver.h.
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "support/cuda_driver.h"
#include "support/device.h"

namespace kpool_support {
namespace {

using namespace cuda;

class CudaDevice final : public Device {
public:
    explicit CudaDevice(int index) : index_(index) {
        const Driver &d = driver();
        int count = 0;
        check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
        if (index >= count) {
            throw std::runtime_error("no CUDA device " + std::to_string(index) + " (" +
                                     std::to_string(count) + " found)");
        }
        check(d.cuDeviceGet(&device_, index), "cuDeviceGet");
        char name[256] = {};
        check(d.cuDeviceGetName(name, sizeof name - 1, device_), "cuDeviceGetName");
        name_ = name;
        check(d.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
        make_current();
        const int32_t zeros[KPOOL_INDEX_ARGS] = {};
        index_errors_ = static_cast<int32_t *>(allocate(sizeof zeros));
        upload(index_errors_, zeros, sizeof zeros);
    }
    ~CudaDevice() override {
        release(index_errors_);
        driver().cuDevicePrimaryCtxRelease(device_);
    }

    kpool_device_type type() const override { return KPOOL_DEVICE_CUDA; }
    int32_t index() const override { return index_; }
    std::string name() const override { return "cuda:" + std::to_string(index_) + " (" + name_ + ")"; }
    bool uses_host_memory() const override { return false; }

    void *allocate(int64_t bytes) override {
        if (bytes == 0) return nullptr;
        CUdeviceptr pointer = 0;
        check(driver().cuMemAlloc(&pointer, static_cast<size_t>(bytes)), "cuMemAlloc");
        return reinterpret_cast<void *>(static_cast<uintptr_t>(pointer));
    }
    void release(void *data) override {
        if (data != nullptr) driver().cuMemFree(device_pointer(data));
    }
    void upload(void *device_data, const void *host_data, int64_t bytes) override {
        if (bytes == 0) return;
        check(driver().cuMemcpyHtoD(device_pointer(device_data), host_data,
                                    static_cast<size_t>(bytes)),
              "cuMemcpyHtoD");
    }
    void download(void *host_data, const void *device_data, int64_t bytes) override {
        if (bytes == 0) return;
        check(driver().cuMemcpyDtoH(host_data, device_pointer(device_data),
                                    static_cast<size_t>(bytes)),
              "cuMemcpyDtoH");
    }
    void synchronize() override { check(driver().cuCtxSynchronize(), "cuCtxSynchronize"); }
    void make_current() override { check(driver().cuCtxSetCurrent(context_), "cuCtxSetCurrent"); }
    // The legacy default stream, which the synchronous copies above also use,
    // and words that mark out-of-range indices (kpool_check_index_errors).
    kpool_exec exec() const override { return kpool_exec{nullptr, KPOOL_ARITHMETIC_EXACT, index_errors_}; }

    bool time_driver_floor(int calls, DriverFloor *floor) override {
        const Driver &d = driver();
        static const char kEmptyName[] = "kpool_empty";
        if (empty_module_ == nullptr) {
            // PTX of a kernel that returns at once, JIT-compiled by the driver
            // when loaded (kept loaded, with the context), then run once.
            static const char kEmptyKernel[] =
                ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry kpool_empty() { ret; }\n";
            check(d.cuModuleLoadData(&empty_module_, kEmptyKernel), "cuModuleLoadData");
            check(d.cuModuleGetFunction(&empty_kernel_, empty_module_, kEmptyName), "cuModuleGetFunction");
            check(d.cuLaunchKernel(empty_kernel_, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
        }
        synchronize();
        floor->launch_us = us_per_call(calls, [&] {
            check(d.cuLaunchKernel(empty_kernel_, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
        });
        synchronize();
        floor->push_pop_us = us_per_call(calls, [&] {
            CUcontext popped = nullptr;
            check(d.cuCtxPushCurrent(context_), "cuCtxPushCurrent");
            check(d.cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
        });
        floor->get_function_us = us_per_call(calls, [&] {
            CUfunction f = nullptr;
            check(d.cuModuleGetFunction(&f, empty_module_, kEmptyName), "cuModuleGetFunction");
        });
        return true;
    }

private:
    int index_;
    CUdevice device_ = 0;
    CUcontext context_ = nullptr;
    std::string name_;
    int32_t *index_errors_ = nullptr;
    // time_driver_floor's empty kernel, loaded at its first call
    CUmodule empty_module_ = nullptr;
    CUfunction empty_kernel_ = nullptr;

    template <typename Call>
    static double us_per_call(int calls, Call &&call) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) call();
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
    }
};

}  // namespace

std::unique_ptr<Device> open_cuda_device(int index, std::string *error) {
    try {
        return std::make_unique<CudaDevice>(index);
    } catch (const std::exception &e) {
        *error = e.what();
        return nullptr;
    }
}

}  // namespace kpool_support
