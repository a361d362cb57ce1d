// kpool overhead: the host's cost of one C API call per op, on its smallest
// call (one row, one pool, one token), timed over many calls back to back
// on the device's stream. On a GPU the kernels are tiny, so the host is the
// bottleneck and the time per call is what the CPU spends: validation,
// wrapping the pointers, Halide's pipeline prologue and the launch. Next to
// it, the driver's floor under each launch: Halide's CUDA runtime brackets
// the kernel setup, the launch and the teardown of every pipeline call in a
// context push and pop each, looks the kernel up by name
// (cuModuleGetFunction) and launches it; those calls, timed bare, are the
// least a launch can cost, and `over` is what the call spends beyond them.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace kpool_tool {
namespace {

constexpr int kRepeats = 7;
constexpr int64_t kD = KPOOL_HEAD_DIM;

// Zeroed tensors on the device: every index 0 (a valid slot), every
// position 0.
class Tensors {
public:
    explicit Tensors(Device &device) : device_(device) {}
    kpool_tensor operator()(kpool_dtype dtype, const std::vector<int64_t> &shape) {
        int64_t bytes = kpool_dtype_size(dtype);
        for (int64_t n : shape) bytes *= n;
        buffers_.push_back(std::make_unique<DeviceBuffer>(device_, std::vector<uint8_t>(bytes, 0)));
        return buffers_.back()->contiguous(dtype, shape);
    }

private:
    Device &device_;
    std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

struct Case {
    std::string op;
    int kernels;  // launches per call on a GPU
    std::function<kpool_status_code(const kpool_exec *, kpool_status *)> call;
};

std::vector<Case> smallest_calls(Tensors &t, int32_t *index_errors) {
    const int P = 4;
    const kpool_tensor q = t(KPOOL_DTYPE_BFLOAT16, {1, kD}), q8 = t(KPOOL_DTYPE_UINT8, {1, kD}),
                       qs = t(KPOOL_DTYPE_FLOAT32, {1});
    const kpool_tensor cache = t(KPOOL_DTYPE_UINT8, {1, 64, KPOOL_CACHE_ROW_BYTES}),
                       tail = t(KPOOL_DTYPE_BFLOAT16, {1, 2, P, kD}), ape = t(KPOOL_DTYPE_FLOAT32, {P, kD});
    const kpool_tensor sk = t(KPOOL_DTYPE_BFLOAT16, {1, P, kD}), ss = t(KPOOL_DTYPE_BFLOAT16, {1, P, kD}),
                       loc = t(KPOOL_DTYPE_INT64, {1});
    const kpool_tensor key = t(KPOOL_DTYPE_BFLOAT16, {1, kD}), gate = t(KPOOL_DTYPE_BFLOAT16, {1, kD}),
                       tslot = t(KPOOL_DTYPE_INT32, {1});
    auto decode = [&t, tail, cache, ape](int64_t n) {
        const kpool_tensor tsm = t(KPOOL_DTYPE_INT32, {1, n}), k = t(KPOOL_DTYPE_BFLOAT16, {1, n, kD}),
                           s = t(KPOOL_DTYPE_BFLOAT16, {1, n, kD}), sm = t(KPOOL_DTYPE_INT32, {1, n}),
                           pos = t(KPOOL_DTYPE_INT32, {1, n});
        return [=](const kpool_exec *ex, kpool_status *st) {
            return kpool_decode_update_and_maybe_write_cache_batched(&cache, &tail, &tsm, &k, &s, &ape, &sm, &pos, P,
                                                                     kD, 1, ex, st);
        };
    };
    const kpool_tensor ids = t(KPOOL_DTYPE_INT32, {1, 1}), seq = t(KPOOL_DTYPE_INT32, {1}),
                       pools = t(KPOOL_DTYPE_INT32, {1}), valid = t(KPOOL_DTYPE_BOOL, {1, 1}),
                       out = t(KPOOL_DTYPE_INT32, {1, 2 * P - 1}), tokens = t(KPOOL_DTYPE_INT32, {1, P});
    auto decode_one = decode(1), decode_two = decode(2);
    std::vector<Case> cases = {
        {"fwht128_quant_fp8 (1 row)", 1,
         [=](const kpool_exec *ex, kpool_status *st) { return kpool_fwht128_quant_fp8(&q, &q8, &qs, ex, st); }},
        {"compress_and_write_cache (1 pool, P=4)", 1,
         [=](const kpool_exec *ex, kpool_status *st) {
             return kpool_compress_and_write_cache(&cache, &sk, &ss, &ape, &loc, nullptr, nullptr, nullptr, P, kD, 1,
                                                   1, ex, st);
         }},
        {"seed_tail_cache (1 token)", 1,
         [=](const kpool_exec *ex, kpool_status *st) {
             return kpool_seed_tail_cache(&tail, &key, &gate, &tslot, P, kD, ex, st);
         }},
        {"decode (1 request x 1 token)", 1, decode_one},
        {"decode (1 request x 2 tokens)", 1, decode_two},
        {"expand_pools_and_append_tail (1 row)", 1,
         [=](const kpool_exec *ex, kpool_status *st) {
             return kpool_expand_pools_and_append_tail(&ids, &seq, &out, P, 0, ex, st);
         }},
        {"expand_pools_to_tokens (1 row)", 1,
         [=](const kpool_exec *ex, kpool_status *st) {
             return kpool_expand_pools_to_tokens(&ids, &valid, nullptr, nullptr, &tokens, P, P, ex, st);
         }},
        {"append_tail_to_topk (1 row)", 1,
         [=](const kpool_exec *ex, kpool_status *st) {
             return kpool_append_tail_to_topk(&ids, &seq, &pools, nullptr, nullptr, &tokens, P, ex, st);
         }},
    };
    if (index_errors != nullptr) {
        // The same decode with exec->index_errors: two index checks more.
        cases.push_back({"decode (1 x 1, with index_errors)", 3,
                         [=](const kpool_exec *ex, kpool_status *st) {
                             kpool_exec checked = *ex;
                             checked.index_errors = index_errors;
                             return decode_one(&checked, st);
                         }});
    }
    return cases;
}

struct Timing {
    double min_us, median_us;
};

// µs per call of `calls` back-to-back calls, the best and the median of
// kRepeats runs, each ended by waiting for the device.
Timing time_calls(Device &device, int calls, const std::function<bool()> &call) {
    std::vector<double> per_call;
    for (int r = 0; r < kRepeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) {
            if (!call()) return {-1, -1};
        }
        const auto end = std::chrono::steady_clock::now();
        device.synchronize();
        per_call.push_back(std::chrono::duration<double, std::micro>(end - start).count() / calls);
    }
    std::sort(per_call.begin(), per_call.end());
    return {per_call.front(), per_call[per_call.size() / 2]};
}

}  // namespace

int run_overhead(DeviceChoice choice, int calls) {
    OpenedDevice opened = open_device(choice);
    if (!opened.device) {
        std::fprintf(stderr, "kpool overhead: %s\n", opened.error.c_str());
        return kExitUsage;
    }
    Device &device = *opened.device;
    std::printf("%s\n%s\n", kpool_version(), opened.line.c_str());
    kpool_exec exec = device.exec();
    int32_t *index_errors = exec.index_errors;
    exec.index_errors = nullptr;  // as an engine calls by default
    if (!device.uses_host_memory()) {
        kpool_status st{};
        if (kpool_cuda_warm_up(device.index(), &exec, &st) != KPOOL_OK) {
            std::fprintf(stderr, "kpool overhead: kpool_cuda_warm_up: %s\n", st.message);
            return kExitMismatch;
        }
    }
    // Each driver call's best of kRepeats runs.
    Device::DriverFloor floor{1e30, 1e30, 1e30}, one{};
    bool has_floor = false;
    for (int r = 0; r < kRepeats && device.time_driver_floor(calls, &one); ++r) {
        has_floor = true;
        floor = {std::min(floor.launch_us, one.launch_us), std::min(floor.push_pop_us, one.push_pop_us),
                 std::min(floor.get_function_us, one.get_function_us)};
    }
    const double per_launch = floor.launch_us + 3 * floor.push_pop_us + floor.get_function_us;
    Tensors tensors(device);
    std::printf("host µs per call, %d calls back to back, best and median of %d runs%s\n", calls, kRepeats,
                has_floor ? "; over = best minus the driver floor of the launches it makes" : "");
    std::printf("  %-44s %7s %9s %9s %9s\n", "op", "kernels", "best", "median", "over");
    int failures = 0;
    for (const Case &c : smallest_calls(tensors, device.uses_host_memory() ? nullptr : index_errors)) {
        kpool_status st{};
        const Timing t = time_calls(device, calls, [&] { return c.call(&exec, &st) == KPOOL_OK; });
        if (t.min_us < 0) {
            std::printf("  %-44s FAILED: %s\n", c.op.c_str(), st.message);
            ++failures;
            continue;
        }
        if (has_floor) {
            std::printf("  %-44s %7d %9.2f %9.2f %9.2f\n", c.op.c_str(), c.kernels, t.min_us, t.median_us,
                        t.min_us - c.kernels * per_launch);
        } else {
            std::printf("  %-44s %7s %9.2f %9.2f %9s\n", c.op.c_str(), "-", t.min_us, t.median_us, "-");
        }
    }
    if (has_floor) {
        // bench/host_overhead.py reads these lines (the words before the colon).
        std::printf("driver floor, µs per call (best of %d runs of %d):\n", kRepeats, calls);
        std::printf("  cuLaunchKernel of an empty kernel: %.3f\n", floor.launch_us);
        std::printf("  cuCtxPushCurrent + cuCtxPopCurrent: %.3f\n", floor.push_pop_us);
        std::printf("  cuModuleGetFunction: %.3f\n", floor.get_function_us);
        std::printf("  per launch through Halide's runtime (launch + 3 push/pop + lookup): %.3f\n", per_launch);
    }
    return failures == 0 ? kExitOk : kExitMismatch;
}

}  // namespace kpool_tool
