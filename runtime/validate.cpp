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

kpool_tensor contiguous_tensor(void *data, kpool_dtype dtype, int32_t ndim, const int64_t *shape) {
    kpool_tensor t{};
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0 && i < KPOOL_MAX_DIMS; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i];
    }
    t.device = KPOOL_DEVICE_CPU;
    return t;
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

// "a or b or c": each item as `show` gives it.
template <typename Item, typename Show>
std::string alternatives(std::initializer_list<Item> items, Show show) {
    std::ostringstream s;
    const char *sep = "";
    for (Item item : items) {
        s << sep << show(item);
        sep = " or ";
    }
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
        throw invalid() << name << " is NULL";
    }
    const int32_t dtype = raw_value(t->dtype);
    bool dtype_ok = false;
    for (kpool_dtype d : dtypes) {
        dtype_ok = dtype_ok || dtype == d;
    }
    if (!dtype_ok) {
        const bool known = dtype >= KPOOL_DTYPE_UINT8 && dtype <= KPOOL_DTYPE_FLOAT8_E4M3FN;
        // By name; only a value without one is shown as the caller's number.
        const std::string have = known ? std::string(kpool_dtype_name(static_cast<kpool_dtype>(dtype)))
                                       : "unknown (" + std::to_string(dtype) + ")";
        throw invalid() << name << " has dtype " << have << ", expected " << alternatives(dtypes, kpool_dtype_name);
    }
    const int32_t device = raw_value(t->device);
#ifdef KPOOL_WITH_CUDA
    const bool device_ok = device == KPOOL_DEVICE_CPU || device == KPOOL_DEVICE_CUDA;
#else
    const bool device_ok = device == KPOOL_DEVICE_CPU;
#endif
    if (!device_ok) {
        throw unsupported() << name << " is on device " << (device == KPOOL_DEVICE_CUDA ? "cuda" : "unknown") << " ("
                            << device << "):" << t->device_index << ", which this build of kpool does not run on";
    }
}

void require_data(const char *name, const kpool_tensor *t) {
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) {
            throw invalid() << name << " has a negative size " << t->shape[i] << " in dim " << i;
        }
    }
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) {
            return;  // empty: no data needed
        }
    }
    if (t->data == nullptr) {
        throw invalid() << name << " has no data (NULL pointer) for shape " << shape_string(t);
    }
}

// Elements are read and written whole (on a GPU a misaligned address faults):
// the data pointer must be aligned to the element size.
void require_aligned(const char *name, const kpool_tensor *t) {
    const uintptr_t element = t->dtype == KPOOL_DTYPE_INT64 ? 8
                              : (t->dtype == KPOOL_DTYPE_INT32 || t->dtype == KPOOL_DTYPE_FLOAT32) ? 4
                              : t->dtype == KPOOL_DTYPE_BFLOAT16 ? 2 : 1;
    if (reinterpret_cast<uintptr_t>(t->data) % element != 0) {
        throw invalid() << name << " has data at " << t->data << ", which is not aligned to its " << element
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
        throw invalid() << name << " has " << t->ndim << " dims, expected "
                        << alternatives(ndims, [](int n) { return n; });
    }
    require_data(name, t);
    require_aligned(name, t);
    return {name, t};
}

void require_dim(const TensorArg &a, int i, int64_t expected, const char *what) {
    if (a.dim(i) != expected) {
        throw invalid() << a.name << " has shape " << shape_string(a.t) << ": dim " << i << " must be "
                        << expected << " (" << what << ")";
    }
}

void require_same_dim(const TensorArg &a, int i, const TensorArg &b, int j) {
    if (a.dim(i) != b.dim(j)) {
        throw invalid() << a.name << " has shape " << shape_string(a.t) << ", which does not match "
                        << b.name << " " << shape_string(b.t) << " (dim " << i << " vs dim " << j << ")";
    }
}

void require_stride(const TensorArg &a, int i, int64_t expected) {
    if (a.numel() > 0 && a.dim(i) > 1 && a.stride(i) != expected) {
        throw invalid() << a.name << " has stride " << a.stride(i) << " in dim " << i << ", expected " << expected;
    }
}

void require_row_scales_shape(const TensorArg &scales) {
    if (scales.t->ndim == 2) {
        require_dim(scales, 1, 1, "[rows, 1]");
    }
    require_int32_strides(scales);
}

void require_int32_strides(const TensorArg &a) {
    // Every dim, even of an empty tensor (sizes are computed with them).
    for (int i = 0; i < a.t->ndim; i++) {
        if (a.dim(i) > std::numeric_limits<int32_t>::max()) {
            throw invalid() << a.name << " has " << a.dim(i) << " elements in dim " << i
                            << " (at most 2^31 - 1 per dim)";
        }
    }
    if (a.numel() == 0) {
        return;  // no element is addressed: strides do not matter
    }
    for (int i = 0; i < a.t->ndim; i++) {
        if (a.dim(i) > 1 && (a.stride(i) <= 0 || a.stride(i) > std::numeric_limits<int32_t>::max())) {
            throw invalid() << a.name << " has stride " << a.stride(i) << " in dim " << i
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
            throw invalid() << a->name << " is on " << where(a->t) << " but " << first->name << " is on "
                            << where(first->t) << ": all tensors of a call must be on one device";
        }
    }
}

void require_pool_size(int32_t pool_size) {
    if (pool_size < 1 || pool_size > KPOOL_MAX_POOL_SIZE || (pool_size & (pool_size - 1)) != 0) {
        throw invalid() << "pool_size = " << pool_size << " is not a power of two in [1, " << KPOOL_MAX_POOL_SIZE << "]";
    }
}

void require_head_dim(int32_t head_dim) {
    if (head_dim != KPOOL_HEAD_DIM) {
        throw invalid() << "head_dim = " << head_dim << ", but kpool kernels are built for " << KPOOL_HEAD_DIM;
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

namespace {

constexpr int64_t kCacheRowBytes = KPOOL_CACHE_ROW_BYTES;

}  // namespace

TensorArg require_kv_cache(const kpool_tensor *t) {
    TensorArg c = require_tensor("kv_cache", t, {KPOOL_DTYPE_UINT8}, 3);
    require_dim(c, 2, kCacheRowBytes, "head_dim + 4 bytes per slot");
    if (reinterpret_cast<uintptr_t>(c.t->data) % 4 != 0) {
        throw invalid() << "kv_cache has data at " << c.t->data << ": it must be 4-byte aligned (its f32 scales)";
    }
    if (c.dim(1) < 1) {
        throw invalid() << "kv_cache has block_size " << c.dim(1) << " (must be >= 1)";
    }
    require_stride(c, 2, 1);
    require_stride(c, 1, kCacheRowBytes);
    // int32 dims and strides first: block_size * 132 cannot overflow then.
    require_int32_strides(c);
    if (c.dim(0) > 1 && (c.stride(0) < c.dim(1) * kCacheRowBytes || c.stride(0) % 4 != 0)) {
        throw invalid() << "kv_cache has page stride " << c.stride(0)
                        << " bytes: it must be a multiple of 4 and at least block_size * 132 = "
                        << c.dim(1) * kCacheRowBytes;
    }
    return c;
}

TensorArg require_tail(const kpool_tensor *t, int32_t pool_size) {
    TensorArg tail = require_tensor("tail_kv_cache", t, {KPOOL_DTYPE_BFLOAT16}, 4);
    require_dim(tail, 1, 2, "K half and score half");
    require_dim(tail, 3, KPOOL_HEAD_DIM, "head_dim");
    int64_t ring = tail.dim(2);
    if (ring < 1 || ring % pool_size != 0) {
        throw invalid() << "tail_kv_cache has RING = " << ring
                        << ", which is not a positive multiple of pool_size = " << pool_size;
    }
    require_stride(tail, 3, 1);
    require_stride(tail, 2, KPOOL_HEAD_DIM);
    // int32 dims and strides first: the sums below cannot overflow then.
    require_int32_strides(tail);
    int64_t half_elems = ring * KPOOL_HEAD_DIM;
    if (tail.stride(1) < half_elems || (tail.dim(0) > 1 && tail.stride(0) < tail.stride(1) + half_elems)) {
        throw invalid() << "tail_kv_cache strides (" << tail.stride(0) << ", " << tail.stride(1)
                        << ", 128, 1) overlap its halves or blocks (RING * 128 = " << half_elems << ")";
    }
    return tail;
}

void require_inner_contiguous(const TensorArg &a) {
    require_stride(a, a.t->ndim - 1, 1);
    require_int32_strides(a);
}

void require_disjoint_rows(const TensorArg &a) {
    if (a.numel() > 0 && a.dim(0) > 1 && a.stride(0) < a.dim(1)) {
        throw invalid() << a.name << " has stride " << a.stride(0) << " in dim 0 for rows of " << a.dim(1)
                        << " elements: its rows overlap";
    }
}

TensorArg require_keys(const char *name, const kpool_tensor *t) {
    TensorArg keys = require_tensor(name, t, {KPOOL_DTYPE_BFLOAT16}, 3);
    require_dim(keys, 2, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(keys);
    return keys;
}

TensorArg require_scores(const char *name, const kpool_tensor *t, std::initializer_list<kpool_dtype> score_dtypes,
                         const TensorArg &keys) {
    TensorArg scores = require_tensor(name, t, score_dtypes, 3);
    for (int i = 0; i < 3; i++) {
        require_same_dim(scores, i, keys, i);
    }
    require_inner_contiguous(scores);
    return scores;
}

TensorArg require_ape(const kpool_tensor *t, int32_t pool_size) {
    TensorArg ape = require_tensor("ape", t, {KPOOL_DTYPE_FLOAT32}, 2);
    require_dim(ape, 0, pool_size, "pool_size");
    require_dim(ape, 1, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(ape);
    return ape;
}

int64_t cache_slot_count(const TensorArg &kv_cache) { return kv_cache.dim(0) * kv_cache.dim(1); }
int64_t tail_slot_count(const TensorArg &tail) { return tail.dim(0) * tail.dim(2); }

void require_locs_in_cache(const TensorArg &locs, const TensorArg &kv_cache, const TensorArg *mask) {
    int64_t slots = cache_slot_count(kv_cache);
    for (int64_t i = 0; i < locs.numel(); i++) {
        if (mask != nullptr && static_cast<const uint8_t *>(mask->t->data)[i * mask->stride(0)] == 0) {
            continue;
        }
        int64_t loc = index_at(locs, i);
        if (loc >= slots) {
            throw out_of_range() << element_name(locs, i) << " = " << loc << " is outside the cache (" << slots
                                 << " slots)";
        }
    }
}

void require_tslots_in_tail(const TensorArg &tslots, const TensorArg &tail) {
    int64_t ring = tail.dim(2), blocks = tail.dim(0);
    for (int64_t i = 0; i < tslots.numel(); i++) {
        int64_t tslot = index_at(tslots, i);
        if (tslot >= 0 && tslot / ring >= blocks) {
            throw out_of_range() << element_name(tslots, i) << " = " << tslot << " is outside the tail cache ("
                                 << blocks << " blocks of RING = " << ring << ")";
        }
    }
}

}  // namespace kpool::rt
