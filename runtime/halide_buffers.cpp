#include "halide_buffers.h"

#include <algorithm>
#include <cstdint>

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
    int64_t contiguous = 1;  // the stride of a dense dimension here
    for (int i = a.t->ndim - 1; i >= 0; i--) {
        // A size-1 dimension's stride is arbitrary in torch: it takes the
        // dense one, so rows that are aligned stay so for the kernels that
        // specialize on aligned strides (compress).
        int64_t stride = a.dim(i) > 1 ? a.stride(i) : contiguous <= INT32_MAX ? contiguous : 1;
        dims.push_back(halide_dimension_t(0, i32(a.dim(i)), i32(stride)));
        contiguous = stride * std::max<int64_t>(a.dim(i), 1);
    }
    return make(element_type(a.t->dtype), a.t->data, dims);
}

CacheViews wrap_kv_cache(const TensorArg &kv_cache, RowRange pages) {
    const int32_t block_size = i32(kv_cache.dim(1));
    const int32_t page_stride = i32(kv_cache.dim(0) > 1 ? kv_cache.stride(0) : kv_cache.dim(1) * KPOOL_CACHE_ROW_BYTES);
    // Both views start at the window's first page, whose index is their
    // min: the kernels' offsets are relative to it.
    uint8_t *first = static_cast<uint8_t *>(kv_cache.t->data) + pages.begin * page_stride;
    const halide_dimension_t window(i32(pages.begin), i32(pages.count), page_stride);
    CacheViews v;
    v.codes = make(halide_type_of<uint8_t>(), first,
                   {halide_dimension_t(0, KPOOL_HEAD_DIM, 1), halide_dimension_t(0, block_size, KPOOL_HEAD_DIM),
                    window});
    v.scales = make(halide_type_of<float>(), first + int64_t(block_size) * KPOOL_HEAD_DIM,
                    {halide_dimension_t(0, KPOOL_HEAD_DIM, 0), halide_dimension_t(0, block_size, 1),
                     halide_dimension_t(window.min, window.extent, page_stride / 4)});
    return v;
}

CacheViews wrap_kv_cache(const TensorArg &kv_cache) { return wrap_kv_cache(kv_cache, {0, kv_cache.dim(0)}); }

bool rows_aligned(const TensorArg &a, int64_t bytes, std::initializer_list<int> row_dims) {
    bool aligned = reinterpret_cast<uintptr_t>(a.t->data) % bytes == 0;
    for (int i : row_dims) {
        aligned = aligned && (a.dim(i) <= 1 || (a.stride(i) * element_bytes(a.t->dtype)) % bytes == 0);
    }
    return aligned;
}

HalideBuffer wrap_row_words(const TensorArg &a, int64_t word_bytes) {
    const int64_t per_word = word_bytes / element_bytes(a.t->dtype);
    const halide_type_t word = word_bytes == 8 ? halide_type_of<uint64_t>() : halide_type_of<uint32_t>();
    return make(word, a.t->data,
                {halide_dimension_t(0, i32(KPOOL_HEAD_DIM / per_word), 1),
                 // One row: a row's words, which any alignment of rows the
                 // kernel asks of the stride divides.
                 halide_dimension_t(0, i32(a.dim(0)),
                                    i32(a.dim(0) > 1 ? a.stride(0) / per_word : KPOOL_HEAD_DIM / per_word))});
}

HalideBuffer as_words(const HalideBuffer &b, halide_type_t word) {
    const int per_word = word.bytes() / b.type().bytes();
    std::vector<halide_dimension_t> dims(b.raw_buffer()->dim, b.raw_buffer()->dim + b.dimensions());
    dims[0].extent /= per_word;
    for (size_t i = 1; i < dims.size(); i++) {
        dims[i].stride /= per_word;
    }
    return make(word, b.raw_buffer()->host, dims);
}

HalideBuffer wrap_row_scales(const TensorArg &scales, int32_t per_row) {
    return make(halide_type_of<float>(), scales.t->data,
                {halide_dimension_t(0, per_row, 0),
                 halide_dimension_t(0, i32(scales.dim(0)), i32(scales.dim(0) > 1 ? scales.stride(0) : 1))});
}

HalideBuffer wrap_tail(const TensorArg &tail) {
    return make(halide_type_of<uint16_t>(), tail.t->data,
                {halide_dimension_t(0, KPOOL_HEAD_DIM, 1),
                 halide_dimension_t(0, i32(tail.dim(2)), KPOOL_HEAD_DIM),
                 halide_dimension_t(0, 2, i32(tail.stride(1))),
                 halide_dimension_t(0, i32(tail.dim(0)), i32(tail.stride(0)))});
}

}  // namespace kpool::rt
