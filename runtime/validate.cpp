#include "validate.h"

#include <cstring>
#include <limits>

namespace kpool::rt {

int64_t TensorArg::numel() const {
    // Any dim may still be huge here (a broadcast dim of stride 0 is only
    // rejected later): saturate instead of overflowing.
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) {
            return 0;
        }
    }
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (__builtin_mul_overflow(n, t->shape[i], &n)) {
            return std::numeric_limits<int64_t>::max();
        }
    }
    return n;
}

int64_t element_bytes(kpool_dtype dtype) {
    switch (dtype) {
    case KPOOL_DTYPE_INT64: return 8;
    case KPOOL_DTYPE_INT32:
    case KPOOL_DTYPE_FLOAT32: return 4;
    case KPOOL_DTYPE_BFLOAT16: return 2;
    case KPOOL_DTYPE_UINT8:
    case KPOOL_DTYPE_BOOL:
    case KPOOL_DTYPE_FLOAT8_E4M3FN: return 1;
    }
    return 0;
}

int64_t TensorArg::span_bytes() const {
    if (numel() == 0) {
        return 0;
    }
    const int64_t element = element_bytes(t->dtype);
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        last += (t->shape[i] - 1) * t->strides[i];
    }
    return (last + 1) * element;
}

namespace {

std::string shape_string(const kpool_tensor *t) {
    std::ostringstream s;
    s << "[";
    for (int i = 0; i < t->ndim; i++) {
        s << (i ? ", " : "") << t->shape[i];
    }
    s << "]";
    return s.str();
}

// A caller's enum field as the integer it holds: a C caller may store any
// value there, and loading an out-of-range enum is undefined in C++.
template <typename Enum>
int32_t raw_value(const Enum &field) {
    int32_t value;
    static_assert(sizeof(field) == sizeof(value), "kpool enums are 32-bit");
    std::memcpy(&value, &field, sizeof value);
    return value;
}

void require_common(const char *name, const kpool_tensor *t, std::initializer_list<kpool_dtype> dtypes) {
    if (t == nullptr) {
        invalid() << name << " is NULL";
    }
    const int32_t dtype = raw_value(t->dtype);
    bool dtype_ok = false;
    for (kpool_dtype d : dtypes) {
        dtype_ok = dtype_ok || dtype == d;
    }
    if (!dtype_ok) {
        auto f = invalid();
        const bool known = dtype >= KPOOL_DTYPE_UINT8 && dtype <= KPOOL_DTYPE_FLOAT8_E4M3FN;
        f << name << " has dtype " << (known ? kpool_dtype_name(static_cast<kpool_dtype>(dtype)) : "unknown")
          << " (" << dtype << "), expected ";
        const char *sep = "";
        for (kpool_dtype d : dtypes) {
            f << sep << kpool_dtype_name(d);
            sep = " or ";
        }
    }
    const int32_t device = raw_value(t->device);
#ifdef KPOOL_WITH_CUDA
    const bool device_ok = device == KPOOL_DEVICE_CPU || device == KPOOL_DEVICE_CUDA;
#else
    const bool device_ok = device == KPOOL_DEVICE_CPU;
#endif
    if (!device_ok) {
        unsupported() << name << " is on device " << (device == KPOOL_DEVICE_CUDA ? "cuda" : "unknown") << " ("
                      << device << "):" << t->device_index << ", which this build of kpool does not run on";
    }
}

void require_data(const char *name, const kpool_tensor *t) {
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) {
            invalid() << name << " has a negative size " << t->shape[i] << " in dim " << i;
        }
    }
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) {
            return;  // empty: no data needed
        }
    }
    if (t->data == nullptr) {
        invalid() << name << " has no data (NULL pointer) for shape " << shape_string(t);
    }
}

// Elements are read and written whole (on a GPU a misaligned address faults):
// the data pointer must be aligned to the element size.
void require_aligned(const char *name, const kpool_tensor *t) {
    const uintptr_t element = t->dtype == KPOOL_DTYPE_INT64 ? 8
                              : (t->dtype == KPOOL_DTYPE_INT32 || t->dtype == KPOOL_DTYPE_FLOAT32) ? 4
                              : t->dtype == KPOOL_DTYPE_BFLOAT16 ? 2 : 1;
    if (reinterpret_cast<uintptr_t>(t->data) % element != 0) {
        invalid() << name << " has data at " << t->data << ", which is not aligned to its " << element
                  << "-byte elements";
    }
}

}  // namespace

TensorArg require_tensor(const char *name, const kpool_tensor *t,
                         std::initializer_list<kpool_dtype> dtypes, int ndim) {
    return require_tensor_ranks(name, t, dtypes, {ndim});
}

TensorArg require_tensor_ranks(const char *name, const kpool_tensor *t,
                               std::initializer_list<kpool_dtype> dtypes,
                               std::initializer_list<int> ndims) {
    require_common(name, t, dtypes);
    bool rank_ok = false;
    for (int n : ndims) {
        rank_ok = rank_ok || t->ndim == n;
    }
    if (!rank_ok || t->ndim < 0 || t->ndim > KPOOL_MAX_DIMS) {
        auto f = invalid();
        f << name << " has " << t->ndim << " dims, expected ";
        const char *sep = "";
        for (int n : ndims) {
            f << sep << n;
            sep = " or ";
        }
    }
    require_data(name, t);
    require_aligned(name, t);
    return {name, t};
}

void require_dim(const TensorArg &a, int i, int64_t expected, const char *what) {
    if (a.dim(i) != expected) {
        invalid() << a.name << " has shape " << shape_string(a.t) << ": dim " << i << " must be "
                  << expected << " (" << what << ")";
    }
}

void require_same_dim(const TensorArg &a, int i, const TensorArg &b, int j) {
    if (a.dim(i) != b.dim(j)) {
        invalid() << a.name << " has shape " << shape_string(a.t) << ", which does not match "
                  << b.name << " " << shape_string(b.t) << " (dim " << i << " vs dim " << j << ")";
    }
}

void require_stride(const TensorArg &a, int i, int64_t expected) {
    if (a.numel() > 0 && a.dim(i) > 1 && a.stride(i) != expected) {
        invalid() << a.name << " has stride " << a.stride(i) << " in dim " << i << ", expected "
                  << expected;
    }
}

void require_int32_strides(const TensorArg &a) {
    // Every dim, even of an empty tensor (sizes are computed with them).
    for (int i = 0; i < a.t->ndim; i++) {
        if (a.dim(i) > std::numeric_limits<int32_t>::max()) {
            invalid() << a.name << " has " << a.dim(i) << " elements in dim " << i
                      << " (at most 2^31 - 1 per dim)";
        }
    }
    if (a.numel() == 0) {
        return;  // no element is addressed: strides do not matter
    }
    for (int i = 0; i < a.t->ndim; i++) {
        if (a.dim(i) > 1 && (a.stride(i) <= 0 || a.stride(i) > std::numeric_limits<int32_t>::max())) {
            invalid() << a.name << " has stride " << a.stride(i) << " in dim " << i
                      << " (strides must be positive and below 2^31 elements)";
        }
    }
}

void require_same_device(const std::vector<const TensorArg *> &args) {
    const TensorArg *first = nullptr;
    for (const TensorArg *a : args) {
        if (first == nullptr) {
            first = a;
        } else if (a->t->device != first->t->device || a->t->device_index != first->t->device_index) {
            auto where = [](const kpool_tensor *t) {
                return std::string(t->device == KPOOL_DEVICE_CUDA ? "cuda:" : "cpu:") + std::to_string(t->device_index);
            };
            invalid() << a->name << " is on " << where(a->t) << " but " << first->name << " is on "
                      << where(first->t) << ": all tensors of a call must be on one device";
        }
    }
}

void require_pool_size(int32_t pool_size) {
    if (pool_size < 1 || pool_size > 64 || (pool_size & (pool_size - 1)) != 0) {
        invalid() << "pool_size = " << pool_size << " is not a power of two in [1, 64]";
    }
}

void require_head_dim(int32_t head_dim) {
    if (head_dim != KPOOL_HEAD_DIM) {
        invalid() << "head_dim = " << head_dim << ", but kpool kernels are built for " << KPOOL_HEAD_DIM;
    }
}

int64_t index_at(const TensorArg &a, int64_t i) {
    int64_t offset = 0;
    for (int d = a.t->ndim - 1; d >= 0; d--) {
        offset += (i % a.dim(d)) * a.stride(d);
        i /= a.dim(d);
    }
    if (a.t->dtype == KPOOL_DTYPE_INT64) {
        return static_cast<const int64_t *>(a.t->data)[offset];
    }
    return static_cast<const int32_t *>(a.t->data)[offset];
}

std::string element_name(const TensorArg &a, int64_t flat_index) {
    std::vector<int64_t> coords(a.t->ndim);
    for (int d = a.t->ndim - 1; d >= 0; d--) {
        coords[d] = flat_index % a.dim(d);
        flat_index /= a.dim(d);
    }
    std::ostringstream s;
    s << a.name << "[";
    for (size_t d = 0; d < coords.size(); d++) {
        s << (d ? ", " : "") << coords[d];
    }
    s << "]";
    return s.str();
}

}  // namespace kpool::rt
