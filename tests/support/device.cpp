#include "support/device.h"

#include <cstring>
#include <stdexcept>

namespace kpool_support {
namespace {

// The C API's kernels read and write the caller's host buffers in place.
class CpuDevice final : public Device {
public:
    kpool_device_type type() const override { return KPOOL_DEVICE_CPU; }
    int32_t index() const override { return 0; }
    std::string name() const override { return "cpu"; }
    bool uses_host_memory() const override { return true; }
    void *allocate(int64_t) override { return nullptr; }
    void release(void *) override {}
    void upload(void *, const void *, int64_t) override {}
    void download(void *, const void *, int64_t) override {}
    void synchronize() override {}
    kpool_exec exec() const override { return kpool_exec{nullptr}; }
};

}  // namespace

bool parse_device_choice(const std::string &text, DeviceChoice *choice) {
    if (text == "auto") *choice = DeviceChoice::Auto;
    else if (text == "cpu") *choice = DeviceChoice::Cpu;
    else if (text == "cuda") *choice = DeviceChoice::Cuda;
    else return false;
    return true;
}

bool library_has_cuda() { return std::strstr(kpool_version(), "cuda") != nullptr; }

OpenedDevice open_device(DeviceChoice choice) {
    OpenedDevice opened;
    if (choice == DeviceChoice::Cpu) {
        opened.device = std::make_unique<CpuDevice>();
        opened.line = "device: cpu";
        return opened;
    }
    if (!library_has_cuda()) {
        if (choice == DeviceChoice::Cuda) {
            opened.error = std::string("--device cuda: no CUDA support in this build (") +
                           kpool_version() + ")";
        } else {
            opened.device = std::make_unique<CpuDevice>();
            opened.line = "device: cpu (no CUDA support in this build)";
        }
        return opened;
    }
    std::string why;
    opened.device = open_cuda_device(0, &why);
    if (opened.device) {
        opened.line = "device: " + opened.device->name();
    } else if (choice == DeviceChoice::Cuda) {
        opened.error = "--device cuda: " + why;
    } else {
        opened.device = std::make_unique<CpuDevice>();
        opened.line = "device: cpu (no usable GPU: " + why + ")";
    }
    return opened;
}

DeviceBuffer::DeviceBuffer(Device &device, std::vector<uint8_t> host_bytes)
    : device_(device), host_(std::move(host_bytes)) {
    if (!device_.uses_host_memory()) device_data_ = device_.allocate(size());
    upload();
}

DeviceBuffer::~DeviceBuffer() {
    if (device_data_ != nullptr) device_.release(device_data_);
}

void DeviceBuffer::upload() {
    if (!device_.uses_host_memory()) device_.upload(device_data_, host_.data(), size());
}

void DeviceBuffer::download() {
    if (!device_.uses_host_memory()) device_.download(host_.data(), device_data_, size());
}

kpool_tensor DeviceBuffer::on_device(const kpool_tensor &host_view) const {
    kpool_tensor t = host_view;
    t.device = device_.type();
    t.device_index = device_.index();
    if (!device_.uses_host_memory()) {
        const auto offset = static_cast<const uint8_t *>(host_view.data) - host_.data();
        t.data = static_cast<uint8_t *>(device_data_) + offset;
    }
    return t;
}

kpool_tensor DeviceBuffer::contiguous(kpool_dtype dtype, const std::vector<int64_t> &shape) const {
    void *data = device_.uses_host_memory() ? const_cast<uint8_t *>(host_.data()) : device_data_;
    kpool_tensor t = kpool_tensor_contiguous(data, dtype, static_cast<int32_t>(shape.size()),
                                             shape.data());
    t.device = device_.type();
    t.device_index = device_.index();
    return t;
}

}  // namespace kpool_support
