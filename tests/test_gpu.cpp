// The CUDA kernel variants against the CPU ones, bit for bit. Every test here
// is in a Gpu* suite and skips (GTEST_SKIP, "no CUDA device: ...") when this
// build has no CUDA kernels or the machine has no CUDA driver or device, so
// `kpool_tests --gtest_filter='Gpu*'` runs them alone.
//
//   GpuDump      every case of tests/data/dump_seed0 on the GPU, against the
//                dump (decode: SPEC's reference-defect ranges keep their
//                input bytes) and against the same call on the CPU.
//   GpuFwht, GpuCompress, GpuSeed, GpuDecode, GpuExpandAndAppend,
//   GpuExpandToTokens, GpuAppendTail, GpuEmpty
//                engine-shaped random inputs for every op and the axes an
//                engine varies (pool sizes 4, 8, 16: the CUDA variants built;
//                decode at next_n = 1 runs its one-kernel variant).
//   GpuDecodeManyRequests, GpuExpandManyRows
//                70000 requests / rows: past grid y's 65535.
//   GpuWarmUp    kpool_cuda_warm_up, then a first call captured in a graph.
//   GpuGraph     a decode and a compress call captured on a non-default
//                stream into a CUDA graph, replayed on fresh inputs.
//   GpuThreads   two threads (and, as a stress, eight), one stream each, mixed
//                ops on their own buffers.
//   GpuBadIndex  out-of-range indices in device tensors: the call succeeds,
//                the bad entries write nothing, and exec->index_errors marks
//                the argument (kpool_check_index_errors names it).
//   GpuMixedDevices  a call with tensors on two devices is rejected, naming one.
//
// Device memory comes from the kpool tool's device layer (tools/device.h);
// streams, async copies and graphs from a few more driver entry points loaded
// here (libcuda.so.1 at run time, so the suite builds without a CUDA toolkit).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "device.h"
#include "support/dump.h"
#include "test_inputs.h"
#include "test_util.h"

#ifndef KPOOL_TEST_DATA_DIR
#define KPOOL_TEST_DATA_DIR "tests/data"
#endif

namespace kpool_test {
namespace {

using kpool_tool::Device;
using kpool_tool::DeviceBuffer;
using ::testing::Combine;
using ::testing::HasSubstr;
using ::testing::Values;
using ::testing::ValuesIn;

// The pool sizes with a CUDA compress / decode variant (KPOOL_CUDA_POOL_SIZES).
const int kGpuPoolSizes[] = {4, 8, 16};
// The expand ops take P at run time, specialized for 4, 8 and 16 on CUDA:
// both the specializations and the general kernel.
const int kGpuExpandPoolSizes[] = {1, 2, 4, 8, 16, 32};

#define ASSERT_KPOOL_OK(expr, status)                                                   \
    do {                                                                                \
        const kpool_status_code rc_ = (expr);                                           \
        ASSERT_EQ(rc_, KPOOL_OK) << kpool_status_name(rc_) << ": " << (status).message; \
        ASSERT_EQ((status).code, KPOOL_OK) << (status).message;                         \
    } while (0)

// ---------------------------------------------------------------------------
// The driver entry points the tool's device layer does not need
// ---------------------------------------------------------------------------

namespace cu {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st *;
using CUstream = struct CUstream_st *;
using CUgraph = struct CUgraph_st *;
using CUgraphExec = struct CUgraphExec_st *;
using CUgraphNode = struct CUgraphNode_st *;
using CUdeviceptr = unsigned long long;

constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr int kCaptureModeGlobal = 0;       // CU_STREAM_CAPTURE_MODE_GLOBAL

struct Api {
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
    CUresult (*cuStreamDestroy)(CUstream) = nullptr;
    CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
    CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *) = nullptr;
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long) = nullptr;
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t) = nullptr;
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
    CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
    CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream) = nullptr;
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream) = nullptr;
    CUresult (*cuGetErrorString)(CUresult, const char **) = nullptr;
    CUcontext context = nullptr;  // device 0's primary context (the one kpool uses)
};

template <typename F>
bool bind(void *library, const char *name, F *function) {
    *function = reinterpret_cast<F>(dlsym(library, name));
    return *function != nullptr;
}

// Loads the entry points once and retains device 0's primary context; on
// failure *error says what is missing and the result is null.
const Api *load(std::string *error) {
    static std::string failure;
    static const Api *api = []() -> const Api * {
        void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) {
            failure = "libcuda.so.1 not found";
            return nullptr;
        }
        auto *a = new Api;  // process lifetime
        const char *missing = nullptr;
        auto need = [&](const char *name, auto *fn) {
            if (!bind(library, name, fn) && missing == nullptr) missing = name;
        };
        need("cuInit", &a->cuInit);
        need("cuDeviceGet", &a->cuDeviceGet);
        need("cuDevicePrimaryCtxRetain", &a->cuDevicePrimaryCtxRetain);
        need("cuCtxSetCurrent", &a->cuCtxSetCurrent);
        need("cuStreamCreate", &a->cuStreamCreate);
        need("cuStreamDestroy_v2", &a->cuStreamDestroy);
        need("cuStreamSynchronize", &a->cuStreamSynchronize);
        need("cuStreamBeginCapture_v2", &a->cuStreamBeginCapture);
        need("cuStreamEndCapture", &a->cuStreamEndCapture);
        need("cuGraphLaunch", &a->cuGraphLaunch);
        need("cuGraphExecDestroy", &a->cuGraphExecDestroy);
        need("cuGraphDestroy", &a->cuGraphDestroy);
        need("cuMemcpyHtoDAsync_v2", &a->cuMemcpyHtoDAsync);
        need("cuMemcpyDtoHAsync_v2", &a->cuMemcpyDtoHAsync);
        need("cuGetErrorString", &a->cuGetErrorString);
        // CUDA >= 11.4 has the flags form; older drivers only the _v2 one.
        if (!bind(library, "cuGraphInstantiateWithFlags", &a->cuGraphInstantiateWithFlags) &&
            !bind(library, "cuGraphInstantiate_v2", &a->cuGraphInstantiate) && missing == nullptr) {
            missing = "cuGraphInstantiateWithFlags";
        }
        if (missing != nullptr) {
            failure = std::string("the CUDA driver lacks ") + missing;
            return nullptr;
        }
        CUdevice device = 0;
        if (a->cuInit(0) != 0 || a->cuDeviceGet(&device, 0) != 0 ||
            a->cuDevicePrimaryCtxRetain(&a->context, device) != 0) {
            failure = "cannot retain the primary context of cuda:0";
            return nullptr;
        }
        return a;
    }();
    if (api == nullptr) *error = failure;
    return api;
}

const Api &api() {
    std::string error;
    const Api *a = load(&error);
    if (a == nullptr) throw std::runtime_error(error);
    return *a;
}

void check(CUresult result, const char *what) {
    if (result == 0) return;
    const char *text = nullptr;
    if (api().cuGetErrorString(result, &text) != 0 || text == nullptr) text = "?";
    throw std::runtime_error(std::string(what) + " failed: " + text + " (" + std::to_string(result) + ")");
}

// Makes kpool's context current on the calling thread (for the copies and
// streams made here; kpool's own calls need no current context).
void make_current() { check(api().cuCtxSetCurrent(api().context), "cuCtxSetCurrent"); }

CUdeviceptr device_pointer(const void *p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

// A non-blocking stream: no implicit ordering with the legacy default stream,
// so everything on it is ordered by the stream alone.
class Stream {
public:
    Stream() { check(api().cuStreamCreate(&stream_, kStreamNonBlocking), "cuStreamCreate"); }
    ~Stream() { api().cuStreamDestroy(stream_); }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    CUstream get() const { return stream_; }
    kpool_exec exec() const { return kpool_exec{stream_, KPOOL_ARITHMETIC_EXACT}; }
    void synchronize() const { check(api().cuStreamSynchronize(stream_), "cuStreamSynchronize"); }

private:
    CUstream stream_ = nullptr;
};

// A captured graph and its executable instance.
class Graph {
public:
    Graph() = default;
    ~Graph() {
        if (exec_ != nullptr) api().cuGraphExecDestroy(exec_);
        if (graph_ != nullptr) api().cuGraphDestroy(graph_);
    }
    Graph(const Graph &) = delete;
    Graph &operator=(const Graph &) = delete;

    void begin_capture(const Stream &s) {
        check(api().cuStreamBeginCapture(s.get(), kCaptureModeGlobal), "cuStreamBeginCapture");
    }
    // Ends the capture (also after a failed call, so the stream is usable).
    void end_capture(const Stream &s) {
        check(api().cuStreamEndCapture(s.get(), &graph_), "cuStreamEndCapture");
    }
    void instantiate() {
        if (api().cuGraphInstantiateWithFlags != nullptr) {
            check(api().cuGraphInstantiateWithFlags(&exec_, graph_, 0), "cuGraphInstantiateWithFlags");
        } else {
            check(api().cuGraphInstantiate(&exec_, graph_, nullptr, nullptr, 0), "cuGraphInstantiate");
        }
    }
    void launch(const Stream &s) { check(api().cuGraphLaunch(exec_, s.get()), "cuGraphLaunch"); }

private:
    CUgraph graph_ = nullptr;
    CUgraphExec exec_ = nullptr;
};

}  // namespace cu

// ---------------------------------------------------------------------------
// The GPU, or why not
// ---------------------------------------------------------------------------

struct GpuEnv {
    std::unique_ptr<Device> device;  // null: no GPU here
    std::string why;
};

const GpuEnv &gpu_env() {
    // Never destroyed: device memory and the context outlive every test.
    static const GpuEnv *env = [] {
        auto *e = new GpuEnv;
        if (!kpool_tool::library_has_cuda()) {
            e->why = std::string("this build has no CUDA kernels (") + kpool_version() + ")";
            return e;
        }
        e->device = kpool_tool::open_cuda_device(0, &e->why);
        if (!e->device) return e;
        if (cu::load(&e->why) == nullptr) {
            e->device.reset();
            return e;
        }
        // A GPU kpool has no kernels for (compute capability below 8.0) is
        // "no device" too; any other failure is left to fail the tests.
        {
            DeviceBuffer probe(*e->device, std::vector<uint8_t>(64, 0));
            const kpool_tensor ids = probe.contiguous(KPOOL_DTYPE_INT32, {0, 1});
            const kpool_tensor seq = probe.contiguous(KPOOL_DTYPE_INT32, {0});
            const kpool_tensor out = probe.contiguous(KPOOL_DTYPE_INT32, {0, 7});
            kpool_status st{};
            const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
            if (kpool_expand_pools_and_append_tail(&ids, &seq, &out, 4, 0, &ex, &st) ==
                KPOOL_ERROR_UNSUPPORTED) {
                e->why = std::string("kpool cannot use ") + e->device->name() + ": " + st.message;
            }
        }
        if (!e->why.empty()) {
            e->device.reset();
            return e;
        }
        std::printf("[ GPU      ] %s on %s\n", kpool_version(), e->device->name().c_str());
        return e;
    }();
    return *env;
}

class GpuTest : public ::testing::Test {
protected:
    void SetUp() override {
        const GpuEnv &env = gpu_env();
        if (!env.device) GTEST_SKIP() << "no CUDA device: " << env.why;
        gpu_ = env.device.get();
        cu::make_current();
    }
    Device &gpu() { return *gpu_; }

private:
    Device *gpu_ = nullptr;
};

template <typename Param>
class GpuParamTest : public GpuTest, public ::testing::WithParamInterface<Param> {};

// ---------------------------------------------------------------------------
// One tensor on both sides
// ---------------------------------------------------------------------------

enum class Side { Cpu, Gpu };

::testing::AssertionResult same_bytes(const std::string &what, const std::vector<uint8_t> &expected,
                                      const std::vector<uint8_t> &got) {
    if (expected.size() != got.size()) {
        return ::testing::AssertionFailure()
               << what << ": " << got.size() << " bytes, expected " << expected.size();
    }
    int64_t differing = 0;
    std::ostringstream first;
    for (size_t i = 0; i < expected.size(); ++i) {
        if (expected[i] == got[i]) continue;
        if (differing < 8) {
            first << "\n  byte " << i << ": expected 0x" << std::hex << int(expected[i]) << " got 0x"
                  << int(got[i]) << std::dec;
        }
        ++differing;
    }
    if (differing == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": " << differing << " of " << expected.size() << " bytes differ" << first.str();
}

std::string call_failure(const std::string &what, kpool_status_code rc, const kpool_status &st) {
    if (rc == KPOOL_OK && st.code == KPOOL_OK) return "";
    return what + ": " + kpool_status_name(rc) + ": " + st.message;
}

// A tensor of a call made on both devices: the CPU call's host tensor, and
// a device copy with the same layout (strides, padding, slack) whose bytes
// come back into gpu_host(). Both start as the same bytes.
class Mirrored {
public:
    Mirrored(Device &gpu, const HostTensor &t)
        : cpu_(t), gpu_(std::make_unique<DeviceBuffer>(gpu, t.bytes())) {
        cpu_desc_ = cpu_.desc();
        kpool_tensor view = t.desc();
        view.data = gpu_->host().data();
        gpu_desc_ = gpu_->on_device(view);
    }
    Mirrored(const Mirrored &) = delete;
    Mirrored &operator=(const Mirrored &) = delete;

    const kpool_tensor *on(Side s) const { return s == Side::Cpu ? &cpu_desc_ : &gpu_desc_; }
    HostTensor &cpu() { return cpu_; }
    const std::vector<uint8_t> &gpu_host() const { return gpu_->host(); }
    int64_t bytes() const { return gpu_->size(); }

    // New contents (same shape) for both sides; upload() or upload_async()
    // moves them to the device.
    void assign(const HostTensor &t) {
        if (t.bytes().size() != cpu_.bytes().size()) {
            throw std::logic_error("Mirrored::assign: " + std::to_string(t.bytes().size()) +
                                   " bytes into a tensor of " + std::to_string(cpu_.bytes().size()));
        }
        std::copy(t.bytes().begin(), t.bytes().end(), cpu_.bytes().begin());
        std::copy(t.bytes().begin(), t.bytes().end(), gpu_->host().begin());
    }
    // New contents for the CPU side only (what the CPU call is to see).
    void assign_cpu(const HostTensor &t) {
        if (t.bytes().size() != cpu_.bytes().size())
            throw std::logic_error("Mirrored::assign_cpu: size differs");
        std::copy(t.bytes().begin(), t.bytes().end(), cpu_.bytes().begin());
    }
    // Synchronous copies on the legacy default stream.
    void upload() { gpu_->upload(); }
    void download() { gpu_->download(); }
    // Copies ordered on `stream`; the host bytes must stay put until it syncs.
    void upload_async(const cu::Stream &stream) {
        cu::check(cu::api().cuMemcpyHtoDAsync(cu::device_pointer(gpu_desc_.data), gpu_->host().data(),
                                              static_cast<size_t>(bytes()), stream.get()),
                  "cuMemcpyHtoDAsync");
    }
    void download_async(const cu::Stream &stream) {
        cu::check(cu::api().cuMemcpyDtoHAsync(gpu_->host().data(), cu::device_pointer(gpu_desc_.data),
                                              static_cast<size_t>(bytes()), stream.get()),
                  "cuMemcpyDtoHAsync");
    }

    // The GPU's bytes (as last downloaded) against the CPU call's.
    ::testing::AssertionResult matches_cpu(const std::string &name) const {
        return same_bytes(name + " (GPU vs CPU)", cpu_.bytes(), gpu_->host());
    }

private:
    HostTensor cpu_;
    std::unique_ptr<DeviceBuffer> gpu_;
    kpool_tensor cpu_desc_{}, gpu_desc_{};
};

using MirroredPtr = std::unique_ptr<Mirrored>;

// One op call, made on the side asked for.
using Call = std::function<kpool_status_code(Side, const kpool_exec *, kpool_status *)>;

// Runs `call` on the CPU, then on the GPU (legacy default stream), and
// compares the named outputs byte for byte. Returns the GPU status.
kpool_status run_both(const Call &call, const std::vector<std::pair<const char *, Mirrored *>> &outputs) {
    kpool_status cpu_status{}, gpu_status{};
    const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT}, gpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
    const kpool_status_code cpu_rc = call(Side::Cpu, &cpu_exec, &cpu_status);
    EXPECT_EQ(cpu_rc, KPOOL_OK) << "CPU: " << kpool_status_name(cpu_rc) << ": " << cpu_status.message;
    const kpool_status_code gpu_rc = call(Side::Gpu, &gpu_exec, &gpu_status);
    EXPECT_EQ(gpu_rc, KPOOL_OK) << "GPU: " << kpool_status_name(gpu_rc) << ": " << gpu_status.message;
    if (cpu_rc != KPOOL_OK || gpu_rc != KPOOL_OK) return gpu_status;
    for (const auto &[name, m] : outputs) {
        m->download();
        EXPECT_TRUE(m->matches_cpu(name));
    }
    return gpu_status;
}

// The count a device decode reports: -1 (not counted on a device), or the
// CPU's count should the runtime ever count there.
void expect_device_skipped(int64_t gpu, int64_t cpu) {
    EXPECT_TRUE(gpu == -1 || gpu == cpu) << "GPU skipped_completions = " << gpu << ", CPU " << cpu;
}

// ---------------------------------------------------------------------------
// Engine-shaped inputs (as test_ops builds them)
// ---------------------------------------------------------------------------

HostTensor make_fwht_q(std::mt19937 &rng, int64_t rows) {
    HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
    fill_normal(q, rng, 2.0f);
    const float edge_sigma[] = {0.0f, 1e-7f, 1e30f, 1e-30f};
    for (int64_t r = 0; r < rows && r < 4; ++r) {
        for (int d = 0; d < kD; ++d) q.set<uint16_t>({r, d}, random_bf16(rng, edge_sigma[r]));
    }
    return q;
}

struct ExpandInputs {
    HostTensor pool_ids, seq_lens;
};

ExpandInputs make_expand_inputs(std::mt19937 &rng, int P, kpool_dtype ids_dtype, int64_t rows, int64_t G) {
    ExpandInputs in;
    in.pool_ids = HostTensor(ids_dtype, {rows, G});
    in.seq_lens = HostTensor(KPOOL_DTYPE_INT32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t seq = r == 0   ? 0
                            : r == 1 ? P - 1
                                     : std::uniform_int_distribution<int64_t>(0, 5000)(rng);
        in.seq_lens.set<int32_t>({r}, static_cast<int32_t>(seq));
        for (int64_t g = 0; g < G; ++g) {
            int64_t id = std::uniform_int_distribution<int64_t>(-2, seq / P + 2)(rng);
            if (g % 5 == 3) id = -1;
            if (g == 7) {
                id = ids_dtype == KPOOL_DTYPE_INT32 ? int64_t(std::numeric_limits<int32_t>::min())
                                                    : std::numeric_limits<int64_t>::min();
            }
            in.pool_ids.set_int({r, g}, id);
        }
    }
    return in;
}

struct GroupInputs {
    HostTensor ids, valid;
};

GroupInputs make_group_inputs(std::mt19937 &rng, int P, kpool_dtype ids_dtype, int64_t rows, int64_t G) {
    GroupInputs in;
    in.ids = HostTensor(ids_dtype, {rows, G});
    in.valid = HostTensor(KPOOL_DTYPE_BOOL, {rows, G});
    std::bernoulli_distribution coin(0.8);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < G; ++g) {
            int64_t id = std::uniform_int_distribution<int64_t>(-3, 4000 / P)(rng);
            if (g % 4 == 1) id = -1;
            if (g == 5 && ids_dtype == KPOOL_DTYPE_INT64) id = (int64_t(1) << 34) + g;
            in.ids.set_int({r, g}, id);
            in.valid.set<uint8_t>({r, g}, coin(rng) ? 1 : 0);
        }
    }
    return in;
}

struct AppendInputs {
    HostTensor topk, seq_lens, pool_lens;
};

AppendInputs make_append_inputs(std::mt19937 &rng, int P, int64_t rows, int64_t C) {
    AppendInputs in;
    in.topk = HostTensor(KPOOL_DTYPE_INT32, {rows, C});
    in.seq_lens = HostTensor(KPOOL_DTYPE_INT32, {rows});
    in.pool_lens = HostTensor(KPOOL_DTYPE_INT32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < C; ++c) {
            in.topk.set<int32_t>({r, c}, std::uniform_int_distribution<int32_t>(-1, 1 << 20)(rng));
        }
        const int32_t seq = r == 0 ? 0 : std::uniform_int_distribution<int32_t>(0, 5000)(rng);
        int32_t pools = seq / P;
        if (r % 7 == 3 && pools > 0) pools -= 1;
        if (r % 7 == 5) pools += 1;
        in.seq_lens.set<int32_t>({r}, seq);
        in.pool_lens.set<int32_t>({r}, pools);
    }
    return in;
}

HostTensor random_bytes_like(std::mt19937 &rng, HostTensor t) {
    t.fill_random_bytes(rng);
    return t;
}

// ---------------------------------------------------------------------------
// 1. The golden dump on the GPU
// ---------------------------------------------------------------------------

using kpool_dump::Array;
using kpool_dump::Case;
using kpool_dump::Op;

constexpr uint8_t kUnwrittenByte = 0xA5;

// One case's buffers on one device, as `kpool check` builds them
// (tools/check.cpp): the dump's inputs (in their recorded views), fresh
// outputs full of kUnwrittenByte, and expand_* outputs as append_* inputs.
class DumpCaseBuffers {
public:
    DumpCaseBuffers(Device &device, Case &c) : device_(device), case_(c) {}

    const kpool_tensor *input(const std::string &key) {
        auto it = case_.inputs.find(key);
        if (it == case_.inputs.end()) return nullptr;
        Array &array = it->second;
        DeviceBuffer &buffer = buffer_for(key, array.bytes);
        kpool_tensor view = kpool_dump::view_tensor(array);
        view.data = buffer.host().data() + (static_cast<uint8_t *>(view.data) - array.bytes.data());
        return keep(buffer.on_device(view));
    }
    const kpool_tensor *output(const std::string &key) {
        Array &expected = case_.outputs.at(key);
        DeviceBuffer &buffer =
            buffer_for("output:" + key, std::vector<uint8_t>(expected.bytes.size(), kUnwrittenByte));
        return keep(buffer.contiguous(kpool_dump::dtype_from_name(expected.dtype), expected.shape));
    }
    const kpool_tensor *output_as_input(const std::string &key) {
        Array &array = case_.outputs.at(key);
        DeviceBuffer &buffer = buffer_for("from-output:" + key, array.bytes);
        return keep(buffer.contiguous(kpool_dump::dtype_from_name(array.dtype), array.shape));
    }
    // The bytes behind output `key` now: its output buffer, or the updated
    // input buffer of the same name (caches).
    std::vector<uint8_t> result(const std::string &key) {
        auto it = buffers_.find("output:" + key);
        if (it == buffers_.end()) it = buffers_.find(key);
        if (it == buffers_.end()) throw std::runtime_error("output \"" + key + "\" was not produced");
        it->second->download();
        return it->second->host();
    }

private:
    DeviceBuffer &buffer_for(const std::string &key, std::vector<uint8_t> bytes) {
        auto it = buffers_.find(key);
        if (it == buffers_.end()) {
            it = buffers_.emplace(key, std::make_unique<DeviceBuffer>(device_, std::move(bytes))).first;
        }
        return *it->second;
    }
    const kpool_tensor *keep(const kpool_tensor &t) {
        tensors_.push_back(std::make_unique<kpool_tensor>(t));
        return tensors_.back().get();
    }

    Device &device_;
    Case &case_;
    std::map<std::string, std::unique_ptr<DeviceBuffer>> buffers_;
    std::vector<std::unique_ptr<kpool_tensor>> tensors_;
};

struct DumpRun {
    std::map<std::string, std::vector<uint8_t>> outputs;  // by the dump's output name
    std::vector<std::string> failures;                    // calls that did not return KPOOL_OK
    int64_t skipped = 0;                                  // decode: status.skipped_completions
};

int32_t arg32(const Case &c, const std::string &key) { return static_cast<int32_t>(c.int_arg(key)); }

DumpRun run_dump_case(Case &c, Device &device) {
    DumpRun run;
    DumpCaseBuffers b(device, c);
    const kpool_exec exec = device.exec();
    auto record = [&](const std::string &what, kpool_status_code rc, const kpool_status &st,
                      const std::vector<std::string> &keys) {
        const std::string failure = call_failure(what, rc, st);
        if (!failure.empty()) {
            run.failures.push_back(failure);
            return;
        }
        for (const std::string &key : keys) run.outputs[key] = b.result(key);
    };
    auto all_outputs = [&] {
        std::vector<std::string> keys;
        for (const auto &entry : c.outputs) keys.push_back(entry.first);
        return keys;
    };
    kpool_status st{};
    switch (c.op) {
        case Op::Fwht128QuantFp8: {
            const kpool_status_code rc =
                kpool_fwht128_quant_fp8(b.input("q"), b.output("q_fp8"), b.output("q_scale"), &exec, &st);
            record("kpool_fwht128_quant_fp8", rc, st, all_outputs());
            break;
        }
        case Op::CompressAndWriteCache: {
            const bool ret = c.bool_arg("return_compressed", false);
            const kpool_status_code rc = kpool_compress_and_write_cache(
                b.input("kv_cache"), b.input("slot_k"), b.input("slot_score"), b.input("ape"), b.input("loc"),
                b.input("write_mask"), ret ? b.output("compressed_k") : nullptr,
                ret ? b.output("compressed_scale") : nullptr, arg32(c, "pool_size"), arg32(c, "head_dim"),
                c.bool_arg("round_scale", true) ? 1 : 0, c.bool_arg("write_cache", true) ? 1 : 0, &exec, &st);
            record("kpool_compress_and_write_cache", rc, st, all_outputs());
            break;
        }
        case Op::SeedTailCache: {
            const kpool_status_code rc =
                kpool_seed_tail_cache(b.input("tail_kv_cache"), b.input("key"), b.input("gate_score"),
                                      b.input("tslot"), arg32(c, "kpool"), arg32(c, "head_dim"), &exec, &st);
            record("kpool_seed_tail_cache", rc, st, all_outputs());
            break;
        }
        case Op::DecodeUpdateBatched: {
            const kpool_status_code rc = kpool_decode_update_and_maybe_write_cache_batched(
                b.input("kv_cache"), b.input("tail_kv_cache"), b.input("tail_slot_mapping"), b.input("key"),
                b.input("slot_score"), b.input("ape"), b.input("slot_mapping"), b.input("positions"),
                arg32(c, "pool_size"), arg32(c, "head_dim"), c.bool_arg("round_scale", true) ? 1 : 0, &exec,
                &st);
            record("kpool_decode_update_and_maybe_write_cache_batched", rc, st, all_outputs());
            run.skipped = st.skipped_completions;
            break;
        }
        case Op::ExpandPools: {
            const int32_t P = arg32(c, "pool_size"), topk = arg32(c, "topk");
            if (c.has_output("fused")) {
                kpool_status s{};
                const kpool_status_code rc = kpool_expand_pools_and_append_tail(
                    b.input("pool_ids"), b.input("seq_lens"), b.output("fused"), P, 0, &exec, &s);
                record("kpool_expand_pools_and_append_tail", rc, s, {"fused"});
            }
            struct Variant {
                const char *tag;
                bool page_table, topk_offsets;
            };
            for (const Variant &v : {Variant{"identity", false, false}, Variant{"offsets", false, true},
                                     Variant{"page_table", true, false}}) {
                const kpool_tensor *table = v.page_table ? b.input("page_table") : nullptr;
                const kpool_tensor *offsets = v.topk_offsets ? b.input("topk_offsets") : nullptr;
                const std::string expand_key = std::string("expand_") + v.tag;
                const std::string append_key = std::string("append_") + v.tag;
                if (!c.has_output(expand_key)) continue;
                kpool_status s{};
                kpool_status_code rc =
                    kpool_expand_pools_to_tokens(b.input("pool_ids"), b.input("group_valid"), table, offsets,
                                                 b.output(expand_key), topk, P, &exec, &s);
                record("kpool_expand_pools_to_tokens (" + expand_key + ")", rc, s, {expand_key});
                if (!c.has_output(append_key)) continue;
                s = kpool_status{};
                rc = kpool_append_tail_to_topk(b.output_as_input(expand_key), b.input("seq_lens"),
                                               b.input("pool_lens"), table, offsets, b.output(append_key), P,
                                               &exec, &s);
                record("kpool_append_tail_to_topk (" + append_key + ")", rc, s, {append_key});
            }
            break;
        }
    }
    return run;
}

kpool_dump::Dump &seed0_dump() {
    static kpool_dump::Dump dump = kpool_dump::load_dump(std::string(KPOOL_TEST_DATA_DIR) + "/dump_seed0");
    return dump;
}

class GpuDump : public GpuTest {};

TEST_F(GpuDump, EveryCaseMatchesTheDumpAndTheCpu) {
    kpool_tool::OpenedDevice cpu = kpool_tool::open_device(kpool_tool::DeviceChoice::Cpu);
    ASSERT_TRUE(cpu.device) << cpu.error;
    kpool_dump::Dump &dump = seed0_dump();
    ASSERT_FALSE(dump.cases.empty());
    for (Case &c : dump.cases) {
        SCOPED_TRACE("case " + c.name + " (" + c.op_name + ")");
        const DumpRun on_gpu = run_dump_case(c, gpu());
        const DumpRun on_cpu = run_dump_case(c, *cpu.device);
        for (const std::string &f : on_gpu.failures) ADD_FAILURE() << "GPU: " << f;
        for (const std::string &f : on_cpu.failures) ADD_FAILURE() << "CPU: " << f;
        if (!on_gpu.failures.empty() || !on_cpu.failures.empty()) continue;
        for (const auto &[key, array] : c.outputs) {
            const auto gpu_it = on_gpu.outputs.find(key);
            const auto cpu_it = on_cpu.outputs.find(key);
            if (gpu_it == on_gpu.outputs.end() || cpu_it == on_cpu.outputs.end()) {
                ADD_FAILURE() << "output " << key << " was not produced";
                continue;
            }
            // Decode: where the reference compressed a completion without a
            // tail block (SPEC "Reference defects"), the input bytes stay.
            const std::vector<uint8_t> expected = c.op == Op::DecodeUpdateBatched && key == "kv_cache"
                                                      ? kpool_dump::expected_kv_cache(c)
                                                      : array.bytes;
            EXPECT_TRUE(same_bytes(key + " (GPU vs dump)", expected, gpu_it->second));
            EXPECT_TRUE(same_bytes(key + " (GPU vs CPU)", cpu_it->second, gpu_it->second));
        }
        if (c.op == Op::DecodeUpdateBatched) {
            const int64_t skipped = static_cast<int64_t>(kpool_dump::skipped_completions(c).size());
            EXPECT_EQ(on_cpu.skipped, skipped);
            expect_device_skipped(on_gpu.skipped, skipped);
        }
    }
}

// ---------------------------------------------------------------------------
// 2. Random engine-shaped inputs, every op: GPU == CPU
// ---------------------------------------------------------------------------

// fwht128_quant_fp8: rows, q_scale [rows, 1] or [rows], e4m3 or uint8 codes.
using GpuFwhtParam = std::tuple<int, bool, kpool_dtype>;
class GpuFwht : public GpuParamTest<GpuFwhtParam> {};

TEST_P(GpuFwht, MatchesCpu) {
    const auto [rows, scale_2d, fp8_dtype] = GetParam();
    std::mt19937 rng(100 + rows * 3 + scale_2d);
    Mirrored q(gpu(), make_fwht_q(rng, rows));
    Mirrored fp8(gpu(), random_bytes_like(rng, HostTensor(fp8_dtype, {rows, kD})));
    Mirrored scale(gpu(), random_bytes_like(
                              rng, HostTensor(KPOOL_DTYPE_FLOAT32, scale_2d ? std::vector<int64_t>{rows, 1}
                                                                            : std::vector<int64_t>{rows})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_fwht128_quant_fp8(q.on(s), fp8.on(s), scale.on(s), ex, st);
        },
        {{"q_fp8", &fp8}, {"q_scale", &scale}});
}

// The same rows starting one element into their buffers (q 2 bytes, the
// codes 1 byte past a 16-byte boundary, every row off alignment): views a
// caller may pass, unlike the fresh allocations of the test above.
TEST_P(GpuFwht, RowsNotStarting16ByteAlignedMatchCpu) {
    const auto [rows, scale_2d, fp8_dtype] = GetParam();
    std::mt19937 rng(200 + rows * 3 + scale_2d);
    Mirrored q(gpu(), make_fwht_q(rng, rows + 1));
    Mirrored fp8(gpu(), random_bytes_like(rng, HostTensor(fp8_dtype, {rows + 1, kD})));
    Mirrored scale(gpu(), random_bytes_like(
                              rng, HostTensor(KPOOL_DTYPE_FLOAT32, scale_2d ? std::vector<int64_t>{rows, 1}
                                                                            : std::vector<int64_t>{rows})));
    const int64_t view_rows = rows;  // (a structured binding cannot be captured in C++17)
    auto one_element_in = [&](const Mirrored &t, Side s, int64_t element_bytes) {
        kpool_tensor view = *t.on(s);
        view.data = static_cast<uint8_t *>(view.data) + element_bytes;
        view.shape[0] = view_rows;
        return view;
    };
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            const kpool_tensor q_view = one_element_in(q, s, 2), fp8_view = one_element_in(fp8, s, 1);
            return kpool_fwht128_quant_fp8(&q_view, &fp8_view, scale.on(s), ex, st);
        },
        {{"q_fp8", &fp8}, {"q_scale", &scale}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuFwht,
                         Combine(Values(1, 7, 300), Values(false, true),
                                 Values(KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8)),
                         [](const auto &info) {
                             return "rows" + std::to_string(std::get<0>(info.param)) +
                                    (std::get<1>(info.param) ? "_scale2d_" : "_scale1d_") +
                                    dtype_tag(std::get<2>(info.param));
                         });

// compress_and_write_cache: P x score dtype x mode; the page size (16 / 64),
// the padded page stride and round_scale vary with the mode.
using GpuCompressParam = std::tuple<int, kpool_dtype, CompressMode>;
class GpuCompress : public GpuParamTest<GpuCompressParam> {};

TEST_P(GpuCompress, MatchesCpu) {
    const auto [P, score_dtype, mode] = GetParam();
    const int m = static_cast<int>(mode);
    const int block_size = m % 2 ? 64 : 16;
    const bool padded = m % 3 != 0;
    const bool round_scale = (m + P) % 2 == 0;
    std::mt19937 rng(2000 + P * 17 + m * 3 + (score_dtype == KPOOL_DTYPE_FLOAT32));
    const int64_t n = 37;
    const int64_t num_blocks = (3 * n) / block_size + 2;
    const bool masked = mode == CompressMode::kWriteMasked;
    const bool write_cache = mode == CompressMode::kWrite || masked || mode == CompressMode::kWriteAndReturn;
    const bool ret = !write_cache || mode == CompressMode::kWriteAndReturn;
    const bool cache_given = mode != CompressMode::kReturnOnlyNoCache;

    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, padded));
    CompressInputs in = make_compress_inputs(rng, n, P, score_dtype, num_blocks * block_size);
    Mirrored cache(gpu(), cache0), k(gpu(), in.slot_k), score(gpu(), in.slot_score), ape(gpu(), in.ape),
        loc(gpu(), in.loc), mask(gpu(), in.write_mask);
    const kpool_dtype ck_dtype = block_size == 16 ? KPOOL_DTYPE_FLOAT8_E4M3FN : KPOOL_DTYPE_UINT8;
    Mirrored ck(gpu(), random_bytes_like(rng, HostTensor(ck_dtype, {n, kD}))),
        cs(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_FLOAT32, {n})));
    auto opt_on = [](Mirrored &t, bool present, Side s) { return present ? t.on(s) : nullptr; };
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(opt_on(cache, cache_given, s), k.on(s), score.on(s),
                                                  ape.on(s), loc.on(s), opt_on(mask, masked, s),
                                                  opt_on(ck, ret, s), opt_on(cs, ret, s), P, kD, round_scale,
                                                  write_cache, ex, st);
        },
        {{"kv_cache", &cache}, {"compressed_k", &ck}, {"compressed_scale", &cs}});
    if (write_cache) {
        EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes()) << "the test wrote nothing";
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuCompress,
                         Combine(ValuesIn(kGpuPoolSizes), Values(KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32),
                                 Values(CompressMode::kWrite, CompressMode::kWriteMasked,
                                        CompressMode::kWriteAndReturn, CompressMode::kReturnOnly,
                                        CompressMode::kReturnOnlyNoCache)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) + "_" +
                                    mode_tag(std::get<2>(info.param));
                         });

// KPOOL_ARITHMETIC_TRITON: the reference's own instructions, checked bit
// for bit against the reference itself by the Python side-by-side test
// (python/tests/test_gpu_side_by_side.py). Here, against the exact CPU
// kernels: the same slots written and nothing else, the same scales but
// where a ue8m0 boundary moved, and codes that differ only where an
// approximate exp or division moved the pooled values by an ulp: in few rows
// (0.1-0.2% on the H200), a few codes each (a wrong row would differ in most
// of its 128). At least one row must differ, or the triton variant did not
// run.
class GpuTritonArithmetic : public GpuParamTest<int> {};

TEST_P(GpuTritonArithmetic, CompressDiffersFromExactInFewCodesOfFewRows) {
    const int P = GetParam();
    const int64_t n = 16384, block_size = 64, num_blocks = n / block_size + 1;
    std::mt19937 rng(5000 + P);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    CompressInputs in = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, num_blocks * block_size);
    Mirrored cache(gpu(), cache0), k(gpu(), in.slot_k), score(gpu(), in.slot_score), ape(gpu(), in.ape),
        loc(gpu(), in.loc), ck(gpu(), HostTensor(KPOOL_DTYPE_UINT8, {n, kD})),
        cs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {n}));
    const kpool_exec exact{nullptr, KPOOL_ARITHMETIC_EXACT}, triton{nullptr, KPOOL_ARITHMETIC_TRITON};
    for (Side s : {Side::Cpu, Side::Gpu}) {
        kpool_status st{};
        const kpool_status_code rc = kpool_compress_and_write_cache(
            cache.on(s), k.on(s), score.on(s), ape.on(s), loc.on(s), nullptr, ck.on(s), cs.on(s), P, kD, 1, 1,
            s == Side::Cpu ? &exact : &triton, &st);
        ASSERT_EQ(rc, KPOOL_OK) << st.message;
    }
    cache.download(), ck.download(), cs.download();
    // A row's scale moves only if its absmax crosses a power of two: by 2x.
    int64_t rows_differing = 0, scales_differing = 0, most_codes = 0;
    for (int64_t r = 0; r < n; ++r) {
        const float a_scale = cs.cpu().get<float>({r});
        float b_scale;
        std::memcpy(&b_scale, cs.gpu_host().data() + 4 * r, 4);
        if (a_scale != b_scale) {
            EXPECT_TRUE(b_scale == 2 * a_scale || a_scale == 2 * b_scale) << "row " << r << ": scale " << b_scale
                                                                          << ", exact " << a_scale;
            ++scales_differing, ++rows_differing;
            continue;
        }
        int64_t codes = 0;
        for (int d = 0; d < kD; ++d) {
            const size_t at = static_cast<size_t>(r * kD + d);
            codes += ck.cpu().bytes()[at] != ck.gpu_host()[at];
        }
        rows_differing += codes > 0;
        most_codes = std::max(most_codes, codes);
    }
    std::printf("P=%d: %lld of %lld rows differ from exact (%lld by their scale), at most %lld codes of a row\n",
                P, static_cast<long long>(rows_differing), static_cast<long long>(n),
                static_cast<long long>(scales_differing), static_cast<long long>(most_codes));
    EXPECT_GT(rows_differing, 0) << "no row differs: did the triton variant run?";
    EXPECT_LT(rows_differing, n / 100);
    EXPECT_LE(most_codes, 32);
    EXPECT_LE(scales_differing, 2);
    // The cache holds the same rows: patch the returned rows' codes into the
    // CPU's cache image, then every byte must agree.
    std::vector<uint8_t> expected = cache.cpu().bytes();
    const int64_t page_stride = cache.cpu().strides()[0];
    for (int64_t r = 0; r < n; ++r) {
        const int64_t slot = in.loc.get<int64_t>({r});
        if (slot < 0) continue;
        const int64_t at = (slot / block_size) * page_stride + (slot % block_size) * kD;
        std::copy_n(ck.gpu_host().begin() + r * kD, kD, expected.begin() + at);
    }
    EXPECT_TRUE(same_bytes("kv_cache (GPU triton vs CPU exact, returned rows patched in)", expected,
                           std::vector<uint8_t>(cache.gpu_host())));
    // KPOOL_ARITHMETIC_DEFAULT on CUDA tensors is the reference's arithmetic:
    // the same call again with it leaves every byte as triton wrote it (the
    // exact arithmetic would rewrite the rows counted above).
    const std::vector<uint8_t> triton_cache = cache.gpu_host(), triton_codes = ck.gpu_host(),
                               triton_scales = cs.gpu_host();
    const kpool_exec by_default{nullptr, KPOOL_ARITHMETIC_DEFAULT};
    kpool_status st{};
    ASSERT_EQ(kpool_compress_and_write_cache(cache.on(Side::Gpu), k.on(Side::Gpu), score.on(Side::Gpu),
                                             ape.on(Side::Gpu), loc.on(Side::Gpu), nullptr, ck.on(Side::Gpu),
                                             cs.on(Side::Gpu), P, kD, 1, 1, &by_default, &st),
              KPOOL_OK)
        << st.message;
    cache.download(), ck.download(), cs.download();
    EXPECT_TRUE(same_bytes("kv_cache (GPU default vs triton)", triton_cache, cache.gpu_host()));
    EXPECT_TRUE(same_bytes("compressed_k (GPU default vs triton)", triton_codes, ck.gpu_host()));
    EXPECT_TRUE(same_bytes("compressed_scale (GPU default vs triton)", triton_scales, cs.gpu_host()));
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuTritonArithmetic, ValuesIn(kGpuPoolSizes),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

// seed_tail_cache: P x RING (P, 2P) x tslot dtype x padded tail strides.
using GpuSeedParam = std::tuple<int, int, kpool_dtype, bool>;
class GpuSeed : public GpuParamTest<GpuSeedParam> {};

TEST_P(GpuSeed, MatchesCpu) {
    const auto [P, ring_mult, tslot_dtype, padded] = GetParam();
    const int64_t ring = int64_t(P) * ring_mult, num_blocks = 11;
    std::mt19937 rng(3000 + P * 13 + ring_mult * 5 + padded + 2 * (tslot_dtype == KPOOL_DTYPE_INT64));
    const HostTensor tail0 = random_bytes_like(rng, make_tail_cache(num_blocks, ring, padded));
    SeedInputs in = make_seed_inputs(rng, P, ring, tslot_dtype, num_blocks);
    Mirrored tail(gpu(), tail0), key(gpu(), in.key), gate(gpu(), in.gate_score), tslot(gpu(), in.tslot);
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_seed_tail_cache(tail.on(s), key.on(s), gate.on(s), tslot.on(s), P, kD, ex, st);
        },
        {{"tail_kv_cache", &tail}});
    EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes()) << "the test wrote nothing";
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuSeed,
                         Combine(ValuesIn(kGpuPoolSizes), Values(1, 2),
                                 Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64), Values(false, true)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_ring" +
                                    std::to_string(std::get<1>(info.param)) + "P_" +
                                    dtype_tag(std::get<2>(info.param)) +
                                    (std::get<3>(info.param) ? "_padded" : "_dense");
                         });

// decode: P x RING (P, 2P) x next_n 1..6; page size, padding and
// round_scale vary with next_n.
using GpuDecodeParam = std::tuple<int, int, int>;
class GpuDecode : public GpuParamTest<GpuDecodeParam> {};

TEST_P(GpuDecode, MatchesCpu) {
    const auto [P, ring_mult, N] = GetParam();
    // One token per request runs decode's one-kernel variant on CUDA: more
    // requests there, so that several complete a pool.
    const int64_t ring = int64_t(P) * ring_mult, B = N == 1 ? 64 : 5, tail_blocks = B + 4;
    const bool padded = N % 2 == 0;
    const bool round_scale = N % 3 != 0;
    const int block_size = padded ? 64 : 16;
    const int64_t num_blocks = std::max<int64_t>(4, (2 * B * N) / block_size + 2);
    std::mt19937 rng(4000 + P * 31 + ring_mult * 7 + N);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, padded));
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, padded);
    fill_normal(tail0, rng, 1.5f);  // earlier steps' stashes: finite bf16
    DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0), tsm(gpu(), in.tail_slot_mapping), key(gpu(), in.key),
        score(gpu(), in.slot_score), ape(gpu(), in.ape), sm(gpu(), in.slot_mapping), pos(gpu(), in.positions);
    int64_t cpu_skipped = 0;
    const kpool_status gs = run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            const kpool_status_code rc = kpool_decode_update_and_maybe_write_cache_batched(
                cache.on(s), tail.on(s), tsm.on(s), key.on(s), score.on(s), ape.on(s), sm.on(s), pos.on(s), P,
                kD, round_scale, ex, st);
            if (s == Side::Cpu) cpu_skipped = st->skipped_completions;
            return rc;
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
    expect_device_skipped(gs.skipped_completions, cpu_skipped);
    EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes()) << "the test stashed nothing";
    if (N >= P || N == 1) {
        EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes()) << "the test completed no pool";
    }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuDecode,
                         Combine(ValuesIn(kGpuPoolSizes), Values(1, 2, 3), Values(1, 2, 3, 4, 5, 6)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_ring" +
                                    std::to_string(std::get<1>(info.param)) + "P_n" +
                                    std::to_string(std::get<2>(info.param));
                         });

// More requests than CUDA's grid y holds (65535): the decode kernels put
// blocks of all requests' tokens in grid x, so this launches and matches.
class GpuDecodeManyRequests : public GpuTest {};

TEST_F(GpuDecodeManyRequests, MoreRequestsThanGridYHolds) {
    for (const int N : {1, 2}) {  // the one-kernel variant, and the pair
        SCOPED_TRACE("next_n " + std::to_string(N));
        const int P = kGpuPoolSizes[0], block_size = 64;
        const int64_t ring = 2 * P, B = 70000, tail_blocks = B + 4;
        const int64_t num_blocks = (2 * B * N) / block_size + 2;
        std::mt19937 rng(4242);
        const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false));
        HostTensor tail0 = make_tail_cache(tail_blocks, ring, false);
        fill_normal(tail0, rng, 1.5f);
        DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
        Mirrored cache(gpu(), cache0), tail(gpu(), tail0), tsm(gpu(), in.tail_slot_mapping), key(gpu(), in.key),
            score(gpu(), in.slot_score), ape(gpu(), in.ape), sm(gpu(), in.slot_mapping), pos(gpu(), in.positions);
        run_both(
            [&](Side s, const kpool_exec *ex, kpool_status *st) {
                return kpool_decode_update_and_maybe_write_cache_batched(cache.on(s), tail.on(s), tsm.on(s), key.on(s),
                                                                         score.on(s), ape.on(s), sm.on(s), pos.on(s), P,
                                                                         kD, true, ex, st);
            },
            {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
        EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes()) << "the test stashed nothing";
        EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes()) << "the test completed no pool";
    }
}

// expand_pools_and_append_tail: P x pool id dtype x bound_pool_ids.
using GpuExpandParam = std::tuple<int, kpool_dtype, bool>;
class GpuExpandAndAppend : public GpuParamTest<GpuExpandParam> {};

TEST_P(GpuExpandAndAppend, MatchesCpu) {
    const auto [P, ids_dtype, bound] = GetParam();
    std::mt19937 rng(6000 + P * 3 + bound + 7 * (ids_dtype == KPOOL_DTYPE_INT64));
    const int64_t rows = 23, G = 9;
    ExpandInputs in = make_expand_inputs(rng, P, ids_dtype, rows, G);
    Mirrored ids(gpu(), in.pool_ids), seq(gpu(), in.seq_lens),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, G * P + P - 1})));
    run_both(
        [&, P = P, bound = bound](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_expand_pools_and_append_tail(ids.on(s), seq.on(s), out.on(s), P, bound, ex, st);
        },
        {{"out", &out}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuExpandAndAppend,
                         Combine(ValuesIn(kGpuExpandPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(false, true)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) +
                                    (std::get<2>(info.param) ? "_bounded" : "_unbounded");
                         });

// expand_pools_to_tokens: P x group id dtype x token map.
using GpuToTokensParam = std::tuple<int, kpool_dtype, TokenMap>;
class GpuExpandToTokens : public GpuParamTest<GpuToTokensParam> {};

TEST_P(GpuExpandToTokens, MatchesCpu) {
    const auto [P, ids_dtype, map] = GetParam();
    std::mt19937 rng(7000 + P * 5 + int(map) + 11 * (ids_dtype == KPOOL_DTYPE_INT64));
    const int64_t rows = 17, G = 12, topk = G * P;
    GroupInputs g = make_group_inputs(rng, P, ids_dtype, rows, G);
    TokenMapInputs tm = make_token_map(rng, map, rows, 3000);
    Mirrored ids(gpu(), g.ids), valid(gpu(), g.valid), table(gpu(), tm.page_table),
        offsets(gpu(), tm.topk_offsets),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, topk})));
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_expand_pools_to_tokens(ids.on(s), valid.on(s), tm.has_table ? table.on(s) : nullptr,
                                                tm.has_offsets ? offsets.on(s) : nullptr, out.on(s),
                                                static_cast<int32_t>(topk), P, ex, st);
        },
        {{"out", &out}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuExpandToTokens,
                         Combine(ValuesIn(kGpuExpandPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(TokenMap::kNone, TokenMap::kPageTable, TokenMap::kOffsets1d,
                                        TokenMap::kOffsets2d)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                    dtype_tag(std::get<1>(info.param)) + "_" +
                                    map_tag(std::get<2>(info.param));
                         });

// append_tail_to_topk: P x token map.
using GpuAppendParam = std::tuple<int, TokenMap>;
class GpuAppendTail : public GpuParamTest<GpuAppendParam> {};

TEST_P(GpuAppendTail, MatchesCpu) {
    const auto [P, map] = GetParam();
    std::mt19937 rng(8000 + P * 11 + int(map));
    const int64_t rows = 21, C = 40;
    AppendInputs in = make_append_inputs(rng, P, rows, C);
    TokenMapInputs tm = make_token_map(rng, map, rows, 3000);
    Mirrored topk(gpu(), in.topk), seq(gpu(), in.seq_lens), pools(gpu(), in.pool_lens),
        table(gpu(), tm.page_table), offsets(gpu(), tm.topk_offsets),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, C + P - 1})));
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_append_tail_to_topk(topk.on(s), seq.on(s), pools.on(s),
                                             tm.has_table ? table.on(s) : nullptr,
                                             tm.has_offsets ? offsets.on(s) : nullptr, out.on(s), P, ex, st);
        },
        {{"out", &out}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuAppendTail,
                         Combine(ValuesIn(kGpuExpandPoolSizes), Values(TokenMap::kNone, TokenMap::kPageTable,
                                                                 TokenMap::kOffsets1d, TokenMap::kOffsets2d)),
                         [](const auto &info) {
                             return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                    map_tag(std::get<1>(info.param));
                         });

// More rows than grid y holds (65535; a prefill's query rows): rows are in
// grid x, every row is written.
class GpuExpandManyRows : public GpuTest {};

TEST_F(GpuExpandManyRows, MoreRowsThanGridYHolds) {
    const int P = 4;
    const int64_t rows = 70000, G = 3;
    std::mt19937 rng(8500);
    ExpandInputs in = make_expand_inputs(rng, P, KPOOL_DTYPE_INT32, rows, G);
    Mirrored ids(gpu(), in.pool_ids), seq(gpu(), in.seq_lens),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, G * P + P - 1})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_expand_pools_and_append_tail(ids.on(s), seq.on(s), out.on(s), P, 0, ex, st);
        },
        {{"out", &out}});
    AppendInputs a = make_append_inputs(rng, P, rows, 2 * P);
    Mirrored topk(gpu(), a.topk), aseq(gpu(), a.seq_lens), pools(gpu(), a.pool_lens),
        aout(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, 3 * P - 1})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_append_tail_to_topk(topk.on(s), aseq.on(s), pools.on(s), nullptr, nullptr, aout.on(s), P,
                                             ex, st);
        },
        {{"out", &aout}});
}

// Empty batches on the device: nothing is launched, nothing written.
class GpuEmpty : public GpuTest {};

TEST_F(GpuEmpty, EmptyBatchesWriteNothing) {
    std::mt19937 rng(9);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(4, 16, false));
    const HostTensor tail0 = random_bytes_like(rng, make_tail_cache(4, 4, false));
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0);
    CompressInputs c = make_compress_inputs(rng, 0, 4, KPOOL_DTYPE_BFLOAT16, 64);
    Mirrored k(gpu(), c.slot_k), s(gpu(), c.slot_score), a(gpu(), c.ape), l(gpu(), c.loc);
    DecodeInputs d = make_decode_inputs(rng, 0, 1, 4, 4, 4, 64);
    Mirrored tsm(gpu(), d.tail_slot_mapping), dk(gpu(), d.key), ds(gpu(), d.slot_score), da(gpu(), d.ape),
        sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(cache.on(side), k.on(side), s.on(side), a.on(side),
                                                  l.on(side), nullptr, nullptr, nullptr, 4, kD, 1, 1, ex, st);
        },
        {{"kv_cache", &cache}});
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_decode_update_and_maybe_write_cache_batched(
                cache.on(side), tail.on(side), tsm.on(side), dk.on(side), ds.on(side), da.on(side),
                sm.on(side), pos.on(side), 4, kD, 1, ex, st);
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
    EXPECT_TRUE(same_bytes("kv_cache", cache0.bytes(), cache.gpu_host()));
    EXPECT_TRUE(same_bytes("tail_kv_cache", tail0.bytes(), tail.gpu_host()));
}

// ---------------------------------------------------------------------------
// 3. CUDA graphs: capture on a non-default stream, replay on fresh inputs
// ---------------------------------------------------------------------------

// The tensors of one call on a stream. Each step: the inputs get fresh
// contents and go up on the stream; after the call the outputs come back on
// it; the caches stay on the device between steps (as an engine's do) and
// the CPU copies follow the same sequence of calls.
struct StreamCall {
    std::vector<Mirrored *> inputs;                            // refreshed every step
    std::vector<std::pair<const char *, Mirrored *>> outputs;  // downloaded every step
};

void upload_all(const std::vector<Mirrored *> &ts, const cu::Stream &s) {
    for (Mirrored *t : ts) t->upload_async(s);
}

void download_all(const std::vector<std::pair<const char *, Mirrored *>> &ts, const cu::Stream &s) {
    for (const auto &entry : ts) entry.second->download_async(s);
}

// KPOOL_INDEX_ARGS zeroed words of device memory for exec->index_errors.
class IndexWords {
public:
    explicit IndexWords(Device &gpu) : words_(gpu, std::vector<uint8_t>(4 * KPOOL_INDEX_ARGS, 0)) {}
    int32_t *data() const {
        return static_cast<int32_t *>(words_.contiguous(KPOOL_DTYPE_INT32, {KPOOL_INDEX_ARGS}).data);
    }
    kpool_exec exec(void *stream = nullptr) const { return kpool_exec{stream, KPOOL_ARITHMETIC_EXACT, data()}; }
    // The words as the device holds them (synchronous, legacy stream).
    std::vector<int32_t> read() {
        words_.download();
        std::vector<int32_t> w(KPOOL_INDEX_ARGS);
        std::memcpy(w.data(), words_.host().data(), sizeof(int32_t) * KPOOL_INDEX_ARGS);
        return w;
    }
    // kpool_check_index_errors reports exactly `marked` (none: OK), naming
    // each, and zeroes the words: a second check finds none.
    void expect_check_reports(std::vector<std::string> marked) {
        const kpool_exec ex = exec();
        kpool_status st{};
        const kpool_status_code rc = kpool_check_index_errors(0, &ex, &st);
        if (marked.empty()) {
            EXPECT_EQ(rc, KPOOL_OK) << st.message;
        } else {
            EXPECT_EQ(rc, KPOOL_ERROR_OUT_OF_RANGE) << st.message;
            for (const std::string &name : marked) EXPECT_THAT(std::string(st.message), HasSubstr(name));
        }
        EXPECT_EQ(read(), std::vector<int32_t>(KPOOL_INDEX_ARGS, 0)) << "the check zeroes the words";
        kpool_status again{};
        EXPECT_EQ(kpool_check_index_errors(0, &ex, &again), KPOOL_OK) << again.message;
    }

private:
    DeviceBuffer words_;
};

std::vector<int32_t> marked_only(kpool_index_arg arg) {
    std::vector<int32_t> w(KPOOL_INDEX_ARGS, 0);
    w[arg] = 1;
    return w;
}

// The warm-up runs every variant of the build (each through a C API call
// that must succeed), once per process; afterwards a call captured on a
// fresh stream as the first call of its variant in a graph replays.
class GpuWarmUp : public GpuTest {};

TEST_F(GpuWarmUp, RunsEveryVariantOnceThenGraphsCapture) {
    cu::Stream stream;
    const kpool_exec exec = stream.exec();
    kpool_status st{};
    ASSERT_KPOOL_OK(kpool_cuda_warm_up(0, &exec, &st), st);
    ASSERT_KPOOL_OK(kpool_cuda_warm_up(0, nullptr, &st), st);  // at once: already warm
    std::mt19937 rng(77);
    const int64_t rows = 5;
    Mirrored q(gpu(), make_fwht_q(rng, rows)), codes(gpu(), HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD})),
        scale(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {rows, 1}));
    gpu().synchronize();
    cu::Graph graph;
    graph.begin_capture(stream);
    const kpool_status_code rc = kpool_fwht128_quant_fp8(q.on(Side::Gpu), codes.on(Side::Gpu), scale.on(Side::Gpu),
                                                         &exec, &st);
    graph.end_capture(stream);
    ASSERT_KPOOL_OK(rc, st);
    graph.instantiate();
    graph.launch(stream);
    codes.download_async(stream);
    scale.download_async(stream);
    stream.synchronize();
    const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
    ASSERT_KPOOL_OK(kpool_fwht128_quant_fp8(q.on(Side::Cpu), codes.on(Side::Cpu), scale.on(Side::Cpu), &cpu_exec, &st),
                    st);
    EXPECT_TRUE(codes.matches_cpu("q_fp8"));
    EXPECT_TRUE(scale.matches_cpu("q_scale"));
}

class GpuGraph : public GpuTest {
protected:
    // Warm-up call (loads the kernels: CUDA graphs capture launches, not
    // module loads), capture, a check that capturing ran nothing, then three
    // replays on fresh inputs against the CPU.
    void capture_and_replay(const Call &call, StreamCall &t,
                            const std::function<void(std::mt19937 &)> &refresh, std::mt19937 &rng) {
        cu::Stream stream;
        const kpool_exec exec = stream.exec();
        const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
        // Settle the initial synchronous uploads made on the legacy stream.
        gpu().synchronize();
        {
            SCOPED_TRACE("warm-up call on the stream");
            refresh(rng);
            upload_all(t.inputs, stream);
            kpool_status gs{}, cs{};
            ASSERT_KPOOL_OK(call(Side::Gpu, &exec, &gs), gs);
            download_all(t.outputs, stream);
            stream.synchronize();
            ASSERT_KPOOL_OK(call(Side::Cpu, &cpu_exec, &cs), cs);
            for (const auto &[name, m] : t.outputs) ASSERT_TRUE(m->matches_cpu(name));
        }
        // Inputs for the capture: the capture must read and write nothing.
        refresh(rng);
        upload_all(t.inputs, stream);
        stream.synchronize();
        std::vector<std::vector<uint8_t>> before;
        for (const auto &entry : t.outputs) before.push_back(entry.second->gpu_host());
        cu::Graph graph;
        graph.begin_capture(stream);
        kpool_status capture_status{};
        const kpool_status_code capture_rc = call(Side::Gpu, &exec, &capture_status);
        try {
            graph.end_capture(stream);
        } catch (const std::exception &e) {
            FAIL() << e.what() << " (the captured call returned " << kpool_status_name(capture_rc) << ": "
                   << capture_status.message << ")";
        }
        ASSERT_KPOOL_OK(capture_rc, capture_status);
        graph.instantiate();
        download_all(t.outputs, stream);
        stream.synchronize();
        for (size_t i = 0; i < t.outputs.size(); ++i) {
            ASSERT_TRUE(same_bytes(std::string(t.outputs[i].first) + " after capture (nothing may run)",
                                   before[i], t.outputs[i].second->gpu_host()));
        }
        for (int replay = 0; replay < 3; ++replay) {
            SCOPED_TRACE("replay " + std::to_string(replay));
            refresh(rng);
            upload_all(t.inputs, stream);
            graph.launch(stream);
            download_all(t.outputs, stream);
            stream.synchronize();
            kpool_status cs{};
            ASSERT_KPOOL_OK(call(Side::Cpu, &cpu_exec, &cs), cs);
            for (const auto &[name, m] : t.outputs) EXPECT_TRUE(m->matches_cpu(name));
        }
    }
};

TEST_F(GpuGraph, DecodeReplaysOnFreshInputs) {
    const int P = 8;
    const int64_t ring = 2 * P, B = 4, N = 3, tail_blocks = 8, block_size = 16, num_blocks = 8;
    std::mt19937 rng(11);
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng, 1.5f);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true))),
        tail(gpu(), tail0);
    DecodeInputs shape = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
    Mirrored tsm(gpu(), shape.tail_slot_mapping), key(gpu(), shape.key), score(gpu(), shape.slot_score),
        ape(gpu(), shape.ape), sm(gpu(), shape.slot_mapping), pos(gpu(), shape.positions);
    StreamCall t{{&tsm, &key, &score, &ape, &sm, &pos}, {{"kv_cache", &cache}, {"tail_kv_cache", &tail}}};
    auto refresh = [&](std::mt19937 &r) {
        DecodeInputs in = make_decode_inputs(r, B, N, P, ring, tail_blocks, num_blocks * block_size);
        tsm.assign(in.tail_slot_mapping), key.assign(in.key), score.assign(in.slot_score), ape.assign(in.ape),
            sm.assign(in.slot_mapping), pos.assign(in.positions);
    };
    // With index_errors: the index checks are captured too (and, the
    // inputs being valid, mark nothing).
    IndexWords words(gpu());
    capture_and_replay(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            kpool_exec checked = *ex;
            checked.index_errors = words.data();
            return kpool_decode_update_and_maybe_write_cache_batched(cache.on(s), tail.on(s), tsm.on(s),
                                                                     key.on(s), score.on(s), ape.on(s),
                                                                     sm.on(s), pos.on(s), P, kD, 1, &checked, st);
        },
        t, refresh, rng);
    EXPECT_EQ(words.read(), std::vector<int32_t>(KPOOL_INDEX_ARGS, 0));
}

TEST_F(GpuGraph, CompressReplaysOnFreshInputs) {
    const int P = 16;
    const int64_t n = 20, block_size = 64, num_blocks = 3;
    std::mt19937 rng(12);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false)));
    CompressInputs shape = make_compress_inputs(rng, n, P, KPOOL_DTYPE_FLOAT32, num_blocks * block_size);
    Mirrored k(gpu(), shape.slot_k), score(gpu(), shape.slot_score), ape(gpu(), shape.ape),
        loc(gpu(), shape.loc), ck(gpu(), HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {n, kD})),
        cs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {n}));
    StreamCall t{{&k, &score, &ape, &loc},
                 {{"kv_cache", &cache}, {"compressed_k", &ck}, {"compressed_scale", &cs}}};
    auto refresh = [&](std::mt19937 &r) {
        CompressInputs in = make_compress_inputs(r, n, P, KPOOL_DTYPE_FLOAT32, num_blocks * block_size);
        k.assign(in.slot_k), score.assign(in.slot_score), ape.assign(in.ape), loc.assign(in.loc);
    };
    capture_and_replay(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(cache.on(s), k.on(s), score.on(s), ape.on(s), loc.on(s),
                                                  nullptr, ck.on(s), cs.on(s), P, kD, 1, 1, ex, st);
        },
        t, refresh, rng);
}

// ---------------------------------------------------------------------------
// 4. Two threads, a stream each, mixed ops
// ---------------------------------------------------------------------------

// One thread's engine: a kv cache and a tail ring shared by its seed,
// compress and decode calls, plus expand / fwht buffers; every call's
// outputs are compared with the same call on the CPU right after it.
class ThreadEngine {
public:
    ThreadEngine(Device &gpu, int P, uint32_t seed) : gpu_(gpu), P_(P), rng_(seed), ring_(2 * P) {
        HostTensor tail0 = make_tail_cache(kTailBlocks, ring_, true);
        fill_normal(tail0, rng_, 1.0f);
        cache_ = std::make_unique<Mirrored>(
            gpu_, random_bytes_like(rng_, make_kv_cache(kBlocks, kBlockSize, true)));
        tail_ = std::make_unique<Mirrored>(gpu_, tail0);
        // Shapes are fixed per engine: every later step refills these buffers.
        CompressInputs c = make_compress_inputs(rng_, kPools, P_, KPOOL_DTYPE_BFLOAT16, slots());
        slot_k_ = mirror(c.slot_k), slot_score_ = mirror(c.slot_score), ape_ = mirror(c.ape),
        loc_ = mirror(c.loc);
        ck_ = mirror(HostTensor(KPOOL_DTYPE_UINT8, {kPools, kD}));
        cs_ = mirror(HostTensor(KPOOL_DTYPE_FLOAT32, {kPools}));
        SeedInputs s = make_seed_inputs(rng_, P_, ring_, KPOOL_DTYPE_INT64, kTailBlocks);
        seed_key_ = mirror(s.key), seed_gate_ = mirror(s.gate_score), tslot_ = mirror(s.tslot);
        DecodeInputs d = make_decode_inputs(rng_, kB, kN, P_, ring_, kTailBlocks, slots());
        tsm_ = mirror(d.tail_slot_mapping), dkey_ = mirror(d.key), dscore_ = mirror(d.slot_score);
        dape_ = mirror(d.ape), sm_ = mirror(d.slot_mapping), pos_ = mirror(d.positions);
        GroupInputs g = make_group_inputs(rng_, P_, KPOOL_DTYPE_INT32, kRows, kGroups);
        TokenMapInputs tm = make_token_map(rng_, TokenMap::kPageTable, kRows, 500);
        gids_ = mirror(g.ids), gvalid_ = mirror(g.valid), table_ = mirror(tm.page_table);
        tokens_ = mirror(HostTensor(KPOOL_DTYPE_INT32, {kRows, kGroups * P_}));
        AppendInputs a = make_append_inputs(rng_, P_, kRows, kGroups * P_);
        seq_ = mirror(a.seq_lens), pools_ = mirror(a.pool_lens);
        appended_ = mirror(HostTensor(KPOOL_DTYPE_INT32, {kRows, kGroups * P_ + P_ - 1}));
        q_ = mirror(make_fwht_q(rng_, kRows));
        q_fp8_ = mirror(HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {kRows, kD}));
        q_scale_ = mirror(HostTensor(KPOOL_DTYPE_FLOAT32, {kRows, 1}));
    }

    // Runs `iterations` steps on `stream`, the op mix starting at `first`;
    // returns the first failure, or "".
    std::string run(const cu::Stream &stream, int iterations, int first) {
        for (int i = first; i < first + iterations; ++i) {
            const std::string failure = step(stream, i);
            if (!failure.empty())
                return "P = " + std::to_string(P_) + ", step " + std::to_string(i) + ": " + failure;
        }
        return "";
    }

private:
    static constexpr int64_t kBlocks = 8, kBlockSize = 16, kTailBlocks = 8, kPools = 12, kB = 3, kN = 4,
                             kRows = 9, kGroups = 6;
    int64_t slots() const { return kBlocks * kBlockSize; }
    MirroredPtr mirror(const HostTensor &t) { return std::make_unique<Mirrored>(gpu_, t); }

    std::string step(const cu::Stream &stream, int i) {
        std::vector<Mirrored *> inputs;
        std::vector<std::pair<const char *, Mirrored *>> outputs;
        Call call;
        const int P = P_;
        switch (i % 4) {
            case 0: {  // compress: write the cache and return the rows
                CompressInputs c = make_compress_inputs(rng_, kPools, P, KPOOL_DTYPE_BFLOAT16, slots());
                slot_k_->assign(c.slot_k), slot_score_->assign(c.slot_score), ape_->assign(c.ape),
                    loc_->assign(c.loc);
                inputs = {slot_k_.get(), slot_score_.get(), ape_.get(), loc_.get()};
                outputs = {
                    {"kv_cache", cache_.get()}, {"compressed_k", ck_.get()}, {"compressed_scale", cs_.get()}};
                call = [this, P](Side s, const kpool_exec *ex, kpool_status *st) {
                    return kpool_compress_and_write_cache(cache_->on(s), slot_k_->on(s), slot_score_->on(s),
                                                          ape_->on(s), loc_->on(s), nullptr, ck_->on(s),
                                                          cs_->on(s), P, kD, 1, 1, ex, st);
                };
                break;
            }
            case 1: {  // seed the tail ring
                SeedInputs s = make_seed_inputs(rng_, P, ring_, KPOOL_DTYPE_INT64, kTailBlocks);
                seed_key_->assign(s.key), seed_gate_->assign(s.gate_score), tslot_->assign(s.tslot);
                inputs = {seed_key_.get(), seed_gate_.get(), tslot_.get()};
                outputs = {{"tail_kv_cache", tail_.get()}};
                call = [this, P](Side s, const kpool_exec *ex, kpool_status *st) {
                    return kpool_seed_tail_cache(tail_->on(s), seed_key_->on(s), seed_gate_->on(s),
                                                 tslot_->on(s), P, kD, ex, st);
                };
                break;
            }
            case 2: {  // decode on the same caches
                DecodeInputs d = make_decode_inputs(rng_, kB, kN, P, ring_, kTailBlocks, slots());
                tsm_->assign(d.tail_slot_mapping), dkey_->assign(d.key), dscore_->assign(d.slot_score),
                    dape_->assign(d.ape), sm_->assign(d.slot_mapping), pos_->assign(d.positions);
                inputs = {tsm_.get(), dkey_.get(), dscore_.get(), dape_.get(), sm_.get(), pos_.get()};
                outputs = {{"kv_cache", cache_.get()}, {"tail_kv_cache", tail_.get()}};
                const int round_scale = round_scale_;
                round_scale_ ^= 1;
                call = [this, P, round_scale](Side s, const kpool_exec *ex, kpool_status *st) {
                    return kpool_decode_update_and_maybe_write_cache_batched(
                        cache_->on(s), tail_->on(s), tsm_->on(s), dkey_->on(s), dscore_->on(s), dape_->on(s),
                        sm_->on(s), pos_->on(s), P, kD, round_scale, ex, st);
                };
                break;
            }
            default: {  // fwht, then expand to tokens, then append the tail
                GroupInputs g = make_group_inputs(rng_, P, KPOOL_DTYPE_INT32, kRows, kGroups);
                AppendInputs a = make_append_inputs(rng_, P, kRows, kGroups * P);
                q_->assign(make_fwht_q(rng_, kRows));
                gids_->assign(g.ids), gvalid_->assign(g.valid), seq_->assign(a.seq_lens),
                    pools_->assign(a.pool_lens);
                inputs = {q_.get(), gids_.get(), gvalid_.get(), seq_.get(), pools_.get()};
                outputs = {{"q_fp8", q_fp8_.get()},
                           {"q_scale", q_scale_.get()},
                           {"tokens", tokens_.get()},
                           {"appended", appended_.get()}};
                call = [this, P](Side s, const kpool_exec *ex, kpool_status *st) {
                    kpool_status_code rc =
                        kpool_fwht128_quant_fp8(q_->on(s), q_fp8_->on(s), q_scale_->on(s), ex, st);
                    if (rc != KPOOL_OK) return rc;
                    rc = kpool_expand_pools_to_tokens(gids_->on(s), gvalid_->on(s), table_->on(s), nullptr,
                                                      tokens_->on(s), static_cast<int32_t>(kGroups * P), P,
                                                      ex, st);
                    if (rc != KPOOL_OK) return rc;
                    // Reads the tokens the previous call wrote, in stream order.
                    return kpool_append_tail_to_topk(tokens_->on(s), seq_->on(s), pools_->on(s),
                                                     table_->on(s), nullptr, appended_->on(s), P, ex, st);
                };
                break;
            }
        }
        const kpool_exec gpu_exec = stream.exec(), cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
        upload_all(inputs, stream);
        kpool_status gs{}, cs{};
        const kpool_status_code grc = call(Side::Gpu, &gpu_exec, &gs);
        download_all(outputs, stream);
        stream.synchronize();
        std::string failure = call_failure("GPU", grc, gs);
        if (!failure.empty()) return failure;
        failure = call_failure("CPU", call(Side::Cpu, &cpu_exec, &cs), cs);
        if (!failure.empty()) return failure;
        for (const auto &[name, m] : outputs) {
            const ::testing::AssertionResult same = m->matches_cpu(name);
            if (!same) return same.message();
        }
        return "";
    }

    Device &gpu_;
    const int P_;
    std::mt19937 rng_;
    const int64_t ring_;
    int round_scale_ = 1;
    MirroredPtr cache_, tail_, slot_k_, slot_score_, ape_, loc_, ck_, cs_, seed_key_, seed_gate_, tslot_,
        tsm_, dkey_, dscore_, dape_, sm_, pos_, gids_, gvalid_, table_, tokens_, seq_, pools_, appended_, q_,
        q_fp8_, q_scale_;
};

class GpuThreads : public GpuTest {
protected:
    // `threads` threads, one stream each, `iterations` mixed ops each on their
    // own buffers (pool sizes cycling through `pool_sizes`), every result
    // checked against the CPU.
    void run_streams(int threads, int iterations, const std::vector<int> &pool_sizes) {
        std::vector<std::string> failures(threads);
        std::atomic<int> ready{0};
        auto worker = [&](int id) {
            try {
                cu::make_current();
                ThreadEngine engine(gpu(), pool_sizes[id % pool_sizes.size()], 500 + id);
                cu::Stream stream;
                // Settle the engine's synchronous initial uploads (legacy stream).
                cu::check(cu::api().cuStreamSynchronize(nullptr), "cuStreamSynchronize(legacy)");
                // Start together, so the streams' work overlaps.
                ready.fetch_add(1);
                while (ready.load() < threads) std::this_thread::yield();
                failures[id] = engine.run(stream, iterations, id);  // different ops at a time
            } catch (const std::exception &e) {
                ready.fetch_add(threads);  // never leave the others waiting
                failures[id] = std::string("exception: ") + e.what();
            }
        };
        std::vector<std::thread> pool;
        for (int id = 0; id < threads; ++id) pool.emplace_back(worker, id);
        for (std::thread &t : pool) t.join();
        for (int id = 0; id < threads; ++id) {
            EXPECT_TRUE(failures[id].empty()) << "thread " << id << ": " << failures[id];
        }
    }
};

TEST_F(GpuThreads, TwoStreamsMixedOpsMatchCpu) { run_streams(2, 50, {4, 16}); }

// Stress: eight threads on eight streams, 200 mixed ops each (1600 calls),
// every pool size built for CUDA.
TEST_F(GpuThreads, EightStreamsStressMatchesCpu) { run_streams(8, 200, {4, 8, 16}); }

// ---------------------------------------------------------------------------
// 5. Out-of-range indices in device tensors write nothing
// ---------------------------------------------------------------------------

// Device tensors are not read on the host, so the call succeeds; the kernels
// skip every write whose loc / slot / tail block lies outside its cache. The
// expected bytes: the CPU run of the same inputs with each bad entry replaced
// by -1 ("no write"). The CPU run of the bad inputs themselves must be
// rejected: that is what makes them out of range.
class GpuBadIndex : public GpuParamTest<int> {};


TEST_P(GpuBadIndex, CompressLocPastTheCacheWritesNothing) {
    const int P = GetParam();
    std::mt19937 rng(1300 + P);
    const int64_t n = 37, block_size = 16, num_blocks = 8, slots = num_blocks * block_size;
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    CompressInputs in = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, slots);
    // Just past the end, further, past int32, and values whose low 32 bits
    // are valid slots (a kernel that truncates would write slot 0 / 5).
    const std::pair<int64_t, int64_t> bad[] = {{3, slots},
                                               {8, slots + 1},
                                               {15, std::numeric_limits<int32_t>::max()},
                                               {21, int64_t(1) << 32},
                                               {24, (int64_t(1) << 32) + 5},
                                               {30, std::numeric_limits<int64_t>::max()}};
    HostTensor good_loc = in.loc;
    std::ostringstream trace;
    for (const auto &[i, v] : bad) {
        in.loc.set<int64_t>({i}, v);
        good_loc.set<int64_t>({i}, -1);
        trace << " loc[" << i << "] = " << v;
    }
    SCOPED_TRACE("bad entries:" + trace.str());
    for (const bool ret : {false, true}) {
        SCOPED_TRACE(ret ? "write_cache + return_compressed" : "write_cache");
        HostTensor ck0(KPOOL_DTYPE_FLOAT8_E4M3FN, {n, kD}), cs0(KPOOL_DTYPE_FLOAT32, {n});
        Mirrored cache(gpu(), cache0), k(gpu(), in.slot_k), score(gpu(), in.slot_score), ape(gpu(), in.ape),
            loc(gpu(), in.loc), ck(gpu(), ck0), cs(gpu(), cs0);
        // The CPU rejects the bad inputs, naming the first bad element.
        {
            HostTensor cache_copy = cache0;
            const kpool_tensor c = cache_copy.desc();
            kpool_status st{};
            const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
            EXPECT_EQ(
                kpool_compress_and_write_cache(&c, k.on(Side::Cpu), score.on(Side::Cpu), ape.on(Side::Cpu),
                                               loc.on(Side::Cpu), nullptr, ret ? ck.on(Side::Cpu) : nullptr,
                                               ret ? cs.on(Side::Cpu) : nullptr, P, kD, 1, 1, &ex, &st),
                KPOOL_ERROR_OUT_OF_RANGE);
            EXPECT_THAT(std::string(st.message), HasSubstr("loc[3]"));
        }
        kpool_status gs{};
        IndexWords words(gpu());
        const kpool_exec gex = words.exec();
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(
                            cache.on(Side::Gpu), k.on(Side::Gpu), score.on(Side::Gpu), ape.on(Side::Gpu),
                            loc.on(Side::Gpu), nullptr, ret ? ck.on(Side::Gpu) : nullptr,
                            ret ? cs.on(Side::Gpu) : nullptr, P, kD, 1, 1, &gex, &gs),
                        gs);
        EXPECT_EQ(words.read(), marked_only(KPOOL_INDEX_LOC));
        words.expect_check_reports({"loc"});
        // Expected: the same call with the bad pools as "no write".
        loc.assign_cpu(good_loc);
        kpool_status st{};
        const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(
                            cache.on(Side::Cpu), k.on(Side::Cpu), score.on(Side::Cpu), ape.on(Side::Cpu),
                            loc.on(Side::Cpu), nullptr, ret ? ck.on(Side::Cpu) : nullptr,
                            ret ? cs.on(Side::Cpu) : nullptr, P, kD, 1, 1, &ex, &st),
                        st);
        cache.download(), ck.download(), cs.download();
        EXPECT_TRUE(cache.matches_cpu("kv_cache"));
        if (ret) {
            EXPECT_TRUE(ck.matches_cpu("compressed_k"));
            EXPECT_TRUE(cs.matches_cpu("compressed_scale"));
        }
    }
}

TEST_P(GpuBadIndex, SeedTslotPastTheTailWritesNothing) {
    const int P = GetParam();
    for (const kpool_dtype dtype : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
        SCOPED_TRACE("tslot " + dtype_tag(dtype));
        std::mt19937 rng(1400 + P);
        const int64_t ring = P, num_blocks = 7, end = num_blocks * ring;
        const HostTensor tail0 = random_bytes_like(rng, make_tail_cache(num_blocks, ring, true));
        SeedInputs in = make_seed_inputs(rng, P, ring, dtype, num_blocks);
        const int64_t n = in.tslot.shape(0);
        std::vector<int64_t> bad_values = {end, end + ring - 1, std::numeric_limits<int32_t>::max()};
        if (dtype == KPOOL_DTYPE_INT64) {
            bad_values.push_back((int64_t(1) << 32) + 3);  // low 32 bits: block 0
            bad_values.push_back(std::numeric_limits<int64_t>::max());
        }
        HostTensor good_tslot = in.tslot;
        std::ostringstream trace;
        int64_t first_bad = -1;
        for (size_t j = 0; j < bad_values.size(); ++j) {
            // Spread over the batch: inside requests and on padding rows.
            const int64_t i = (static_cast<int64_t>(j) * 7 + 2) % n;
            if (first_bad < 0 || i < first_bad) first_bad = i;
            in.tslot.set_int({i}, bad_values[j]);
            good_tslot.set_int({i}, -1);
            trace << " tslot[" << i << "] = " << bad_values[j];
        }
        SCOPED_TRACE("bad entries:" + trace.str());
        Mirrored tail(gpu(), tail0), key(gpu(), in.key), gate(gpu(), in.gate_score), tslot(gpu(), in.tslot);
        {
            HostTensor tail_copy = tail0;
            const kpool_tensor t = tail_copy.desc();
            kpool_status st{};
            const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
            EXPECT_EQ(kpool_seed_tail_cache(&t, key.on(Side::Cpu), gate.on(Side::Cpu), tslot.on(Side::Cpu), P,
                                            kD, &ex, &st),
                      KPOOL_ERROR_OUT_OF_RANGE);
            EXPECT_THAT(std::string(st.message), HasSubstr("tslot[" + std::to_string(first_bad) + "]"));
        }
        kpool_status gs{};
        IndexWords words(gpu());
        const kpool_exec gex = words.exec();
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(tail.on(Side::Gpu), key.on(Side::Gpu), gate.on(Side::Gpu),
                                              tslot.on(Side::Gpu), P, kD, &gex, &gs),
                        gs);
        EXPECT_EQ(words.read(), marked_only(KPOOL_INDEX_TSLOT));
        words.expect_check_reports({"tslot"});
        tslot.assign_cpu(good_tslot);
        kpool_status st{};
        const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(tail.on(Side::Cpu), key.on(Side::Cpu), gate.on(Side::Cpu),
                                              tslot.on(Side::Cpu), P, kD, &ex, &st),
                        st);
        tail.download();
        EXPECT_TRUE(tail.matches_cpu("tail_kv_cache"));
    }
}

TEST_P(GpuBadIndex, DecodeSlotPastTheCacheAndTailPastTheRingWriteNothing) {
    const int P = GetParam();
    std::mt19937 rng(1500 + P);
    const int64_t ring = P, B = 5, N = P + 1, tail_blocks = 7, block_size = 16, num_blocks = 8;
    const int64_t slots = num_blocks * block_size, tail_end = tail_blocks * ring;
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng, 1.5f);
    // Every request is real: positions from a random start, its own block,
    // a cache slot on every completion (N = P + 1 tokens: at least one).
    DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, slots);
    const std::vector<int64_t> blocks = distinct_slots(rng, tail_blocks, B);
    const std::vector<int64_t> locs = distinct_slots(rng, slots, B * N);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t start = std::uniform_int_distribution<int64_t>(0, 3 * P)(rng);
        for (int64_t t = 0; t < N; ++t) {
            const int64_t pos = start + t;
            in.positions.set<int32_t>({b, t}, static_cast<int32_t>(pos));
            in.tail_slot_mapping.set<int32_t>({b, t}, static_cast<int32_t>(blocks[b] * ring + pos % ring));
            in.slot_mapping.set<int32_t>({b, t},
                                         pos % P == P - 1 ? static_cast<int32_t>(locs[b * N + t]) : -1);
        }
    }
    HostTensor good_tsm = in.tail_slot_mapping, good_sm = in.slot_mapping;
    std::ostringstream trace;
    int bad_slots = 0;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < N; ++t) {
            // Requests 1, 2: a completion's cache slot just past the end / INT32_MAX.
            if ((b == 1 || b == 2) && in.slot_mapping.get<int32_t>({b, t}) >= 0) {
                const int32_t v = b == 1 ? static_cast<int32_t>(slots) : std::numeric_limits<int32_t>::max();
                in.slot_mapping.set<int32_t>({b, t}, v);
                good_sm.set<int32_t>({b, t}, -1);
                trace << " slot_mapping[" << b << ", " << t << "] = " << v;
                ++bad_slots;
            }
            // Requests 3, 4: every tail slot in a block past the ring / INT32_MAX.
            if (b == 3 || b == 4) {
                const int32_t pos = in.positions.get<int32_t>({b, t});
                const int32_t v = b == 3 ? static_cast<int32_t>(tail_end + pos % ring)
                                         : std::numeric_limits<int32_t>::max();
                in.tail_slot_mapping.set<int32_t>({b, t}, v);
                good_tsm.set<int32_t>({b, t}, -1);
                trace << " tail_slot_mapping[" << b << ", " << t << "] = " << v;
            }
        }
    }
    ASSERT_GE(bad_slots, 2) << "requests 1 and 2 each complete a pool";
    SCOPED_TRACE("bad entries:" + trace.str());
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0), tsm(gpu(), in.tail_slot_mapping), key(gpu(), in.key),
        score(gpu(), in.slot_score), ape(gpu(), in.ape), sm(gpu(), in.slot_mapping), pos(gpu(), in.positions);
    IndexWords words(gpu());
    auto call = [&](Side s, kpool_tensor *cache_override, kpool_tensor *tail_override, kpool_status *st) {
        const kpool_exec ex = words.exec();
        return kpool_decode_update_and_maybe_write_cache_batched(
            cache_override ? cache_override : cache.on(s), tail_override ? tail_override : tail.on(s),
            tsm.on(s), key.on(s), score.on(s), ape.on(s), sm.on(s), pos.on(s), P, kD, 1, &ex, st);
    };
    {
        HostTensor cache_copy = cache0, tail_copy = tail0;
        kpool_tensor c = cache_copy.desc(), t = tail_copy.desc();
        kpool_status st{};
        EXPECT_EQ(call(Side::Cpu, &c, &t, &st), KPOOL_ERROR_OUT_OF_RANGE);
        EXPECT_THAT(std::string(st.message), HasSubstr("slot_mapping[")) << st.message;
    }
    kpool_status gs{};
    ASSERT_KPOOL_OK(call(Side::Gpu, nullptr, nullptr, &gs), gs);
    std::vector<int32_t> both = marked_only(KPOOL_INDEX_SLOT_MAPPING);
    both[KPOOL_INDEX_TAIL_SLOT_MAPPING] = 1;
    EXPECT_EQ(words.read(), both);
    words.expect_check_reports({"slot_mapping", "tail_slot_mapping"});
    tsm.assign_cpu(good_tsm);
    sm.assign_cpu(good_sm);
    kpool_status st{};
    ASSERT_KPOOL_OK(call(Side::Cpu, nullptr, nullptr, &st), st);
    cache.download(), tail.download();
    EXPECT_TRUE(cache.matches_cpu("kv_cache"));
    EXPECT_TRUE(tail.matches_cpu("tail_kv_cache"));
    // The good requests did write: the comparison is not of two no-ops.
    EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes());
    EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes());
}

// Valid calls of every checked op mark nothing.
TEST_P(GpuBadIndex, InRangeCallsMarkNothing) {
    const int P = GetParam();
    std::mt19937 rng(1600 + P);
    const int64_t ring = P, tail_blocks = 6, block_size = 16, num_blocks = 8, slots = num_blocks * block_size;
    IndexWords words(gpu());
    const kpool_exec ex = words.exec();
    CompressInputs c = make_compress_inputs(rng, 12, P, KPOOL_DTYPE_BFLOAT16, slots);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true))),
        k(gpu(), c.slot_k), score(gpu(), c.slot_score), ape(gpu(), c.ape), loc(gpu(), c.loc);
    kpool_status st{};
    ASSERT_KPOOL_OK(kpool_compress_and_write_cache(cache.on(Side::Gpu), k.on(Side::Gpu), score.on(Side::Gpu),
                                                   ape.on(Side::Gpu), loc.on(Side::Gpu), nullptr, nullptr,
                                                   nullptr, P, kD, 1, 1, &ex, &st),
                    st);
    SeedInputs seed = make_seed_inputs(rng, P, ring, KPOOL_DTYPE_INT64, tail_blocks);
    Mirrored tail(gpu(), make_tail_cache(tail_blocks, ring, true)), skey(gpu(), seed.key),
        gate(gpu(), seed.gate_score), tslot(gpu(), seed.tslot);
    ASSERT_KPOOL_OK(kpool_seed_tail_cache(tail.on(Side::Gpu), skey.on(Side::Gpu), gate.on(Side::Gpu),
                                          tslot.on(Side::Gpu), P, kD, &ex, &st),
                    st);
    DecodeInputs d = make_decode_inputs(rng, 3, 2, P, ring, tail_blocks, slots);
    Mirrored tsm(gpu(), d.tail_slot_mapping), dkey(gpu(), d.key), dscore(gpu(), d.slot_score),
        dape(gpu(), d.ape), sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(
                        cache.on(Side::Gpu), tail.on(Side::Gpu), tsm.on(Side::Gpu), dkey.on(Side::Gpu),
                        dscore.on(Side::Gpu), dape.on(Side::Gpu), sm.on(Side::Gpu), pos.on(Side::Gpu), P, kD, 1,
                        &ex, &st),
                    st);
    EXPECT_EQ(words.read(), std::vector<int32_t>(KPOOL_INDEX_ARGS, 0));
    words.expect_check_reports({});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuBadIndex, ValuesIn(kGpuPoolSizes),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

// ---------------------------------------------------------------------------
// 6. Tensors of one call on two devices
// ---------------------------------------------------------------------------

// The call is rejected before anything runs, with a message naming the
// argument on the other device; the device's buffers keep their bytes.
class GpuMixedDevices : public GpuTest {
protected:
    // `code` of the call with the tensors as given; checks the message names
    // `argument` and `where` ("cpu:0", "cuda:1").
    void expect_rejected(kpool_status_code rc, const kpool_status &st, const std::string &argument,
                         const std::string &where) {
        EXPECT_EQ(rc, KPOOL_ERROR_INVALID_ARGUMENT) << kpool_status_name(rc) << ": " << st.message;
        EXPECT_EQ(st.code, rc);
        EXPECT_THAT(std::string(st.message), HasSubstr(argument));
        EXPECT_THAT(std::string(st.message), HasSubstr(where));
    }
};

TEST_F(GpuMixedDevices, OneTensorOnTheCpuIsRejectedByName) {
    std::mt19937 rng(21);
    const int P = 4;
    const int64_t n = 6, num_blocks = 4, block_size = 16;
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false));
    CompressInputs c = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, num_blocks * block_size);
    Mirrored cache(gpu(), cache0), k(gpu(), c.slot_k), score(gpu(), c.slot_score), ape(gpu(), c.ape),
        loc(gpu(), c.loc);
    const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
    {
        SCOPED_TRACE("compress, loc on the CPU");
        kpool_status st{};
        const kpool_status_code rc = kpool_compress_and_write_cache(
            cache.on(Side::Gpu), k.on(Side::Gpu), score.on(Side::Gpu), ape.on(Side::Gpu), loc.on(Side::Cpu),
            nullptr, nullptr, nullptr, P, kD, 1, 1, &ex, &st);
        expect_rejected(rc, st, "loc", "cpu:0");
    }
    {
        SCOPED_TRACE("compress, kv_cache on the CPU");
        kpool_status st{};
        HostTensor host_cache = cache0;
        const kpool_tensor hc = host_cache.desc();
        const kpool_status_code rc = kpool_compress_and_write_cache(
            &hc, k.on(Side::Gpu), score.on(Side::Gpu), ape.on(Side::Gpu), loc.on(Side::Gpu), nullptr, nullptr,
            nullptr, P, kD, 1, 1, &ex, &st);
        expect_rejected(rc, st, "kv_cache", "cpu:0");
        EXPECT_TRUE(same_bytes("host kv_cache", cache0.bytes(), host_cache.bytes()));
    }
    {
        SCOPED_TRACE("compress, slot_k (the first tensor checked) on the CPU");
        kpool_status st{};
        const kpool_status_code rc = kpool_compress_and_write_cache(
            cache.on(Side::Gpu), k.on(Side::Cpu), score.on(Side::Gpu), ape.on(Side::Gpu), loc.on(Side::Gpu),
            nullptr, nullptr, nullptr, P, kD, 1, 1, &ex, &st);
        expect_rejected(rc, st, "slot_k", "cpu:0");
    }
    {
        SCOPED_TRACE("compress, kv_cache on cuda:1, the rest on cuda:0");
        kpool_tensor other = *cache.on(Side::Gpu);
        other.device_index = 1;
        kpool_status st{};
        const kpool_status_code rc = kpool_compress_and_write_cache(
            &other, k.on(Side::Gpu), score.on(Side::Gpu), ape.on(Side::Gpu), loc.on(Side::Gpu), nullptr,
            nullptr, nullptr, P, kD, 1, 1, &ex, &st);
        expect_rejected(rc, st, "kv_cache", "cuda:1");
    }
    cache.download();
    EXPECT_TRUE(same_bytes("device kv_cache after rejected calls", cache0.bytes(), cache.gpu_host()));

    // Decode with the tail ring on the host.
    const int64_t ring = P;
    HostTensor tail0 = make_tail_cache(3, ring, false);
    fill_normal(tail0, rng);
    DecodeInputs d = make_decode_inputs(rng, 2, 2, P, ring, 3, num_blocks * block_size);
    Mirrored tail(gpu(), tail0), tsm(gpu(), d.tail_slot_mapping), dk(gpu(), d.key), ds(gpu(), d.slot_score),
        da(gpu(), d.ape), sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    {
        SCOPED_TRACE("decode, tail_kv_cache on the CPU");
        kpool_status st{};
        const kpool_status_code rc = kpool_decode_update_and_maybe_write_cache_batched(
            cache.on(Side::Gpu), tail.on(Side::Cpu), tsm.on(Side::Gpu), dk.on(Side::Gpu), ds.on(Side::Gpu),
            da.on(Side::Gpu), sm.on(Side::Gpu), pos.on(Side::Gpu), P, kD, 1, &ex, &st);
        expect_rejected(rc, st, "tail_kv_cache", "cpu:0");
        EXPECT_TRUE(same_bytes("host tail_kv_cache", tail0.bytes(), tail.cpu().bytes()));
    }
    {
        SCOPED_TRACE("decode, positions on the CPU");
        kpool_status st{};
        const kpool_status_code rc = kpool_decode_update_and_maybe_write_cache_batched(
            cache.on(Side::Gpu), tail.on(Side::Gpu), tsm.on(Side::Gpu), dk.on(Side::Gpu), ds.on(Side::Gpu),
            da.on(Side::Gpu), sm.on(Side::Gpu), pos.on(Side::Cpu), P, kD, 1, &ex, &st);
        expect_rejected(rc, st, "positions", "cpu:0");
    }
    cache.download(), tail.download();
    EXPECT_TRUE(same_bytes("device kv_cache after rejected decodes", cache0.bytes(), cache.gpu_host()));
    EXPECT_TRUE(same_bytes("device tail_kv_cache after rejected decodes", tail0.bytes(), tail.gpu_host()));

    // Seed with the keys on the host; fwht with the scale on the host; an
    // optional page table on the host.
    SeedInputs s = make_seed_inputs(rng, P, ring, KPOOL_DTYPE_INT32, 3);
    Mirrored skey(gpu(), s.key), sgate(gpu(), s.gate_score), tslot(gpu(), s.tslot);
    {
        SCOPED_TRACE("seed, key on the CPU");
        kpool_status st{};
        const kpool_status_code rc =
            kpool_seed_tail_cache(tail.on(Side::Gpu), skey.on(Side::Cpu), sgate.on(Side::Gpu),
                                  tslot.on(Side::Gpu), P, kD, &ex, &st);
        expect_rejected(rc, st, "key", "cpu:0");
    }
    Mirrored q(gpu(), make_fwht_q(rng, 3)), fp8(gpu(), HostTensor(KPOOL_DTYPE_UINT8, {3, kD})),
        qs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {3}));
    {
        SCOPED_TRACE("fwht, q_scale on the CPU");
        kpool_status st{};
        const kpool_status_code rc =
            kpool_fwht128_quant_fp8(q.on(Side::Gpu), fp8.on(Side::Gpu), qs.on(Side::Cpu), &ex, &st);
        expect_rejected(rc, st, "q_scale", "cpu:0");
    }
    GroupInputs g = make_group_inputs(rng, P, KPOOL_DTYPE_INT32, 3, 2);
    TokenMapInputs tm = make_token_map(rng, TokenMap::kPageTable, 3, 16);
    Mirrored gids(gpu(), g.ids), gvalid(gpu(), g.valid), table(gpu(), tm.page_table),
        out(gpu(), HostTensor(KPOOL_DTYPE_INT32, {3, 2 * P}));
    {
        SCOPED_TRACE("expand_pools_to_tokens, page_table on the CPU");
        kpool_status st{};
        const kpool_status_code rc =
            kpool_expand_pools_to_tokens(gids.on(Side::Gpu), gvalid.on(Side::Gpu), table.on(Side::Cpu),
                                         nullptr, out.on(Side::Gpu), 2 * P, P, &ex, &st);
        expect_rejected(rc, st, "page_table", "cpu:0");
    }
}

}  // namespace
}  // namespace kpool_test
