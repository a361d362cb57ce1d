#include "halide_buffers.h"

namespace kpool::rt {

namespace {

halide_type_t element_type(kpool_dtype dtype) {
    switch (dtype) {
    case KPOOL_DTYPE_INT32: return halide_type_of<int32_t>();
    case KPOOL_DTYPE_INT64: return halide_type_of<int64_t>();
    case KPOOL_DTYPE_BFLOAT16: return halide_type_of<uint16_t>();
    case KPOOL_DTYPE_FLOAT32: return halide_type_of<float>();
    case KPOOL_DTYPE_UINT8:
    case KPOOL_DTYPE_BOOL:
    case KPOOL_DTYPE_FLOAT8_E4M3FN: return halide_type_of<uint8_t>();
    }
    return halide_type_of<uint8_t>();
}

HalideBuffer make(halide_type_t type, void *data, std::vector<halide_dimension_t> dims) {
    return HalideBuffer(type, data, static_cast<int>(dims.size()), dims.data());
}

int32_t i32(int64_t v) { return static_cast<int32_t>(v); }

}  // namespace

HalideBuffer wrap(const TensorArg &a) {
    std::vector<halide_dimension_t> dims;
    for (int i = a.t->ndim - 1; i >= 0; i--) {
        // A size-1 dimension's stride is arbitrary in torch; any value that
        // fits is as good.
        int64_t stride = a.dim(i) > 1 ? a.stride(i) : 1;
        dims.push_back(halide_dimension_t(0, i32(a.dim(i)), i32(stride)));
    }
    return make(element_type(a.t->dtype), a.t->data, dims);
}

HalideBuffer wrap_kv_cache(const TensorArg &kv_cache) {
    int64_t page_bytes = kv_cache.dim(1) * (KPOOL_HEAD_DIM + 4);
    return make(halide_type_of<uint8_t>(), kv_cache.t->data,
                {halide_dimension_t(0, i32(page_bytes), 1),
                 halide_dimension_t(0, i32(kv_cache.dim(0)), i32(kv_cache.stride(0)))});
}

HalideBuffer wrap_tail(const TensorArg &tail) {
    return make(halide_type_of<uint16_t>(), tail.t->data,
                {halide_dimension_t(0, KPOOL_HEAD_DIM, 1),
                 halide_dimension_t(0, i32(tail.dim(2)), KPOOL_HEAD_DIM),
                 halide_dimension_t(0, 2, i32(tail.stride(1))),
                 halide_dimension_t(0, i32(tail.dim(0)), i32(tail.stride(0)))});
}

HalideBuffer broadcast_u8(const uint8_t *value, int64_t extent) {
    return make(halide_type_of<uint8_t>(), const_cast<uint8_t *>(value),
                {halide_dimension_t(0, i32(extent), 0)});
}

HalideBuffer broadcast_i32(const int32_t *value, int64_t cols, int64_t rows) {
    return make(halide_type_of<int32_t>(), const_cast<int32_t *>(value),
                {halide_dimension_t(0, i32(cols), 0), halide_dimension_t(0, i32(rows), 0)});
}

HalideBuffer broadcast_i64(const int64_t *value, int64_t extent) {
    return make(halide_type_of<int64_t>(), const_cast<int64_t *>(value),
                {halide_dimension_t(0, i32(extent), 0)});
}

}  // namespace kpool::rt
