// Where a call runs: the host CPU, or the CUDA device its tensors are on,
// with the caller's stream. Buffers wrap caller memory on either side.
#pragma once

#include <limits>
#include <vector>

#include "cuda_device.h"
#include "dispatch.h"
#include "halide_buffers.h"

namespace kpool::rt {

// exec->index_errors, when given, points to int32 words.
void require_index_errors_aligned(const int32_t *index_errors);

// The CUDA kernels address memory with 32-bit offsets (Halide's
// large_buffers breaks its warp-shuffle lowering): every buffer of a launch
// spans at most this many bytes.
constexpr int64_t kCudaMaxSpanBytes = std::numeric_limits<int32_t>::max();

// Consecutive ranges covering `rows` rows, in order, such that each of
// `tensors` (whose dim 0 is those rows) spans at most `max_span` bytes over
// every range: as few launches as the widest tensor allows (one when all
// fit). Rejects a tensor whose one row already spans more.
std::vector<RowRange> split_rows(int64_t rows, const std::vector<const TensorArg *> &tensors, int64_t max_span);

// `a`'s rows [r.begin, r.begin + r.count) of dim 0: the same memory and strides.
kpool_tensor row_slice(const TensorArg &a, RowRange r);

// While one lives, the calls of its thread split their launches as a
// device does past its 32-bit offsets, at `max_span` bytes a buffer (or the
// device's limit where that is lower), on the host too: the tests compare
// split launches with one on the CPU, and the CUDA warm-up runs the kernels
// that only split calls launch. Without one: the device's limit, and one
// launch on the host.
class ScopedLaunchSpan {
public:
    explicit ScopedLaunchSpan(int64_t max_span);
    ~ScopedLaunchSpan();
    ScopedLaunchSpan(const ScopedLaunchSpan &) = delete;
    ScopedLaunchSpan &operator=(const ScopedLaunchSpan &) = delete;

private:
    int64_t previous_;
};

class Placement {
public:
    // All tensors on one device; exec's stream for CUDA and its arithmetic.
    // On CUDA each must span at most kCudaMaxSpanBytes, except those in
    // `split`: the op launches them in row_ranges() of dim 0 (a K cache's
    // pages: cache_windows()).
    Placement(const std::vector<const TensorArg *> &args, const kpool_exec *exec,
              const std::vector<const TensorArg *> &split = {});

    bool on_host() const { return cuda_ == nullptr; }
    // The launches of a row-wise op over `rows` rows of `split` (as given to
    // the constructor): all rows at once on the host (64-bit offsets), and
    // split_rows' ranges on a device. Launched in order on one stream, the
    // ranges give the bytes of one launch: rows are independent.
    std::vector<RowRange> row_ranges(int64_t rows, const std::vector<const TensorArg *> &split) const;
    // The windows of pages a K cache (given in `split`) is launched in: the
    // kernels write the slots of their window's pages (wrap_kv_cache), so
    // a call launches once per window, each slot in exactly one.
    std::vector<RowRange> cache_windows(const TensorArg &kv_cache) const {
        return row_ranges(kv_cache.dim(0), {&kv_cache});
    }
    // For the ops with a softmax pool: the triton arithmetic's instructions
    // exist on CUDA only (checked before anything runs, empty calls too).
    void require_pool_arithmetic() const;
    Family family() const { return cuda_ ? cuda_->family : Family::cpu; }
    Arithmetic arithmetic() const { return arithmetic_; }
    // exec->index_errors on a device call: where out-of-range indices are
    // marked; NULL on the host (which rejects them) or when not asked for.
    int32_t *index_errors() const { return index_errors_; }

    // A buffer wrapping caller memory, moved to the device side on CUDA
    // (the pointer is a device pointer: wrapped, never copied).
    HalideBuffer &attach(HalideBuffer &buffer) const;
    HalideBuffer attach(HalideBuffer &&buffer) const { return attach(buffer); }

    // `count` int32 words at `data` (device memory on a device).
    HalideBuffer words(int32_t *data, int count) const;

    // Stride-0 constants standing in for absent optional inputs, in memory
    // the kernel can read: 1 (uint8), 0 (int32, 2-D), 0 (int64).
    HalideBuffer all_true(int64_t extent) const;
    HalideBuffer no_page_table(int64_t rows) const;
    HalideBuffer no_offsets(int64_t rows) const;
    // A one-column stand-in (stride 0) for an index input with no columns.
    HalideBuffer no_columns(kpool_dtype dtype, int64_t rows) const;

    // Whether this device has a variant of `kind` for (pool_size, type) in
    // the call's arithmetic.
    bool has_kernel(Kernel kind, int pool_size, ElementType type) const {
        return find_kernel({family(), kind, pool_size, type, arithmetic_}) != nullptr;
    }

    // Runs this device's variant of kind K for (pool_size, type) in the
    // call's arithmetic; the arguments are K's (KernelSignature), and CUDA
    // kernels take the call's context and stream as user_context.
    template <Kernel K, typename... Args>
    void launch(const char *op, int pool_size, ElementType type, Args... args) const {
        AnyKernel k = require_kernel({family(), K, pool_size, type, arithmetic_}, op);
        if (cuda_ != nullptr) {
            const bool loaded = cuda_->loaded.contains(k);
            if (!loaded) {
                require_not_capturing_to_load(*cuda_, call_.stream, op);
            }
            CudaCall call = call_;
            check_halide(reinterpret_cast<typename KernelSignature<K>::Cuda *>(k)(&call, args...), op);
            if (!loaded) {
                cuda_->loaded.insert(k);
            }
        } else {
            const HostPoolUse pool;
            check_halide(reinterpret_cast<typename KernelSignature<K>::Host *>(k)(args...), op);
        }
    }

private:
    HalideBuffer constant(size_t offset, halide_type_t type, std::vector<halide_dimension_t> dims) const;

    const CudaDevice *cuda_ = nullptr;
    CudaCall call_{};
    Arithmetic arithmetic_ = Arithmetic::exact;
    int32_t *index_errors_ = nullptr;  // set for device calls only
};

}  // namespace kpool::rt
