#include "placement.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>

#include "HalideRuntimeCuda.h"

namespace kpool::rt {

namespace {

// The host copy of the constants (each device holds its own).
const KernelConstants kHostConstants;

}  // namespace

void require_index_errors_aligned(const int32_t *index_errors) {
    if (reinterpret_cast<uintptr_t>(index_errors) % alignof(int32_t) != 0) {
        throw invalid() << "exec->index_errors = " << static_cast<const void *>(index_errors)
                        << " is not 4-byte aligned (int32 words)";
    }
}

std::vector<RowRange> split_rows(int64_t rows, const std::vector<const TensorArg *> &tensors, int64_t max_span) {
    int64_t per_range = rows;
    for (const TensorArg *a : tensors) {
        if (rows <= 1 || a->dim(0) <= 1) {
            continue;
        }
        const kpool_tensor one = row_slice(*a, {0, 1});
        const int64_t row_span = TensorArg{a->name, &one}.span_bytes();
        const int64_t step = a->stride(0) * element_bytes(a->t->dtype);
        if (step <= 0) {
            continue;  // rows that share memory span one row
        }
        // The last row of a range ends at the larger of its span and the
        // step: Halide checks extent * stride of each dimension too.
        const int64_t last_row = std::max(row_span, step);
        if (last_row > max_span) {
            throw unsupported() << a->name << " has rows (dim 0) of " << last_row
                                << " bytes; a launch spans at most " << max_span;
        }
        // (count - 1) * step + last_row <= max_span
        per_range = std::min(per_range, (max_span - last_row) / step + 1);
    }
    std::vector<RowRange> ranges;
    for (int64_t begin = 0; begin < rows; begin += per_range) {
        ranges.push_back({begin, std::min(per_range, rows - begin)});
    }
    return ranges;
}

kpool_tensor row_slice(const TensorArg &a, RowRange r) {
    kpool_tensor t = *a.t;
    t.data = static_cast<uint8_t *>(t.data) + r.begin * a.stride(0) * element_bytes(a.t->dtype);
    t.shape[0] = r.count;
    return t;
}

namespace {

// 0: the device's limit, and one launch on the host (64-bit offsets).
thread_local int64_t launch_span_on_this_thread = 0;

}  // namespace

ScopedLaunchSpan::ScopedLaunchSpan(int64_t max_span) : previous_(launch_span_on_this_thread) {
    launch_span_on_this_thread = max_span;
}

ScopedLaunchSpan::~ScopedLaunchSpan() { launch_span_on_this_thread = previous_; }

std::vector<RowRange> Placement::row_ranges(int64_t rows, const std::vector<const TensorArg *> &split) const {
    const int64_t span = launch_span_on_this_thread;
    if (on_host()) {
        return span > 0 ? split_rows(rows, split, span) : std::vector<RowRange>{{0, rows}};
    }
    return split_rows(rows, split, span > 0 ? std::min(span, kCudaMaxSpanBytes) : kCudaMaxSpanBytes);
}

Placement::Placement(const std::vector<const TensorArg *> &args, const kpool_exec *exec,
                     const std::vector<const TensorArg *> &split) {
    const int32_t requested = exec != nullptr ? exec->arithmetic : KPOOL_ARITHMETIC_DEFAULT;
    if (requested != KPOOL_ARITHMETIC_DEFAULT && requested != KPOOL_ARITHMETIC_EXACT &&
        requested != KPOOL_ARITHMETIC_TRITON) {
        throw invalid() << "exec->arithmetic = " << requested
                        << " is not a kpool_arithmetic (KPOOL_ARITHMETIC_DEFAULT, _EXACT or _TRITON)";
    }
    if (exec != nullptr) {
        require_index_errors_aligned(exec->index_errors);
    }
    require_same_device(args);
    const TensorArg *first = *args.begin();
    if (first->t->device == KPOOL_DEVICE_CUDA) {
        // The CUDA kernels use 32-bit offsets (docs/behaviour.md, Limits);
        // tensors split by rows are launched in ranges that fit.
        for (const TensorArg *a : args) {
            const bool split_by_rows = std::find(split.begin(), split.end(), a) != split.end();
            if (!split_by_rows && a->span_bytes() > kCudaMaxSpanBytes) {
                throw unsupported() << a->name << " spans " << a->span_bytes()
                                    << " bytes; CUDA tensors must be below 2 GiB in this build";
            }
        }
        cuda_ = &cuda_device(first->t->device_index, first->name, exec != nullptr ? exec->stream : nullptr);
        call_ = {cuda_->primary_context, exec != nullptr ? exec->stream : nullptr};
        index_errors_ = exec != nullptr ? exec->index_errors : nullptr;
    }
    // The default is the reference's arithmetic where it exists (CUDA) and
    // the contract's everywhere else.
    const bool triton = requested == KPOOL_ARITHMETIC_TRITON || (requested == KPOOL_ARITHMETIC_DEFAULT && !on_host());
    arithmetic_ = triton ? Arithmetic::triton : Arithmetic::exact;
}

void Placement::require_pool_arithmetic() const {
    if (on_host() && arithmetic_ != Arithmetic::exact) {
        throw unsupported() << "exec->arithmetic = KPOOL_ARITHMETIC_TRITON (the reference's GPU instructions) "
                               "needs CUDA tensors; these are on the CPU";
    }
}

HalideBuffer &Placement::attach(HalideBuffer &buffer) const {
    if (cuda_ != nullptr) {
        void *device_ptr = buffer.data();
        buffer.raw_buffer()->host = nullptr;
        CudaCall call = call_;
        int result = buffer.device_wrap_native(halide_cuda_device_interface(),
                                               reinterpret_cast<uint64_t>(device_ptr), &call);
        check_halide(result, "wrapping a device pointer");
    }
    return buffer;
}

HalideBuffer Placement::constant(size_t offset, halide_type_t type, std::vector<halide_dimension_t> dims) const {
    const uint8_t *base = reinterpret_cast<const uint8_t *>(&kHostConstants);
    if (cuda_ != nullptr) {
        base = static_cast<const uint8_t *>(cuda_->constants);
    }
    HalideBuffer b(type, const_cast<uint8_t *>(base + offset), static_cast<int>(dims.size()), dims.data());
    return attach(b);
}

HalideBuffer Placement::words(int32_t *data, int count) const {
    halide_dimension_t dim(0, count, 1);
    HalideBuffer b(halide_type_of<int32_t>(), data, 1, &dim);
    return attach(b);
}

HalideBuffer Placement::all_true(int64_t extent) const {
    return constant(offsetof(KernelConstants, one), halide_type_of<uint8_t>(),
                    {halide_dimension_t(0, static_cast<int32_t>(extent), 0)});
}

HalideBuffer Placement::no_page_table(int64_t rows) const {
    return constant(offsetof(KernelConstants, zero32), halide_type_of<int32_t>(),
                    {halide_dimension_t(0, 1, 1), halide_dimension_t(0, static_cast<int32_t>(rows), 0)});
}

HalideBuffer Placement::no_columns(kpool_dtype dtype, int64_t rows) const {
    if (dtype == KPOOL_DTYPE_INT64) {
        return constant(offsetof(KernelConstants, zero64), halide_type_of<int64_t>(),
                        {halide_dimension_t(0, 1, 1), halide_dimension_t(0, static_cast<int32_t>(rows), 0)});
    }
    return no_page_table(rows);
}

HalideBuffer Placement::no_offsets(int64_t rows) const {
    return constant(offsetof(KernelConstants, zero64), halide_type_of<int64_t>(),
                    {halide_dimension_t(0, static_cast<int32_t>(rows), 0)});
}

}  // namespace kpool::rt
