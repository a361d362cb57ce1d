// The C entry points: each runs its op (runtime/ops/) and reports how it
// ended as a kpool_status (generated from the op table, ops/*.toml); the
// small utilities (names, version, tensors) answer directly.
#include <cstdio>

#include "kpool/kpool.h"
#include "ops/ops.h"

namespace kpool::rt {

namespace {

// Runs `body` (which returns the skipped completions) and fills *status
// (when given) with its outcome; returns the status code.
template <typename Body>
kpool_status_code run(kpool_status *status, Body &&body) {
    kpool_status result{};
    try {
        result.skipped_completions = body();
        result.code = KPOOL_OK;
    } catch (const std::exception &e) {
        const StatusError error = as_status_error(e);
        result.code = error.code();
        std::snprintf(result.message, sizeof(result.message), "%s", error.what());
    }
    if (status != nullptr) {
        *status = result;
    }
    return result.code;
}

// For the ops that count nothing skipped.
template <typename Body>
kpool_status_code run_op(kpool_status *status, Body &&body) {
    return run(status, [&]() -> int64_t {
        body();
        return 0;
    });
}

}  // namespace

}  // namespace kpool::rt

using namespace kpool::rt;

extern "C" {

const char *kpool_status_name(kpool_status_code code) {
    switch (code) {
    case KPOOL_OK: return "ok";
    case KPOOL_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case KPOOL_ERROR_OUT_OF_RANGE: return "index out of range";
    case KPOOL_ERROR_UNSUPPORTED: return "unsupported";
    case KPOOL_ERROR_DEVICE: return "device error";
    case KPOOL_ERROR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *kpool_dtype_name(kpool_dtype dtype) {
    switch (dtype) {
    case KPOOL_DTYPE_UINT8: return "uint8";
    case KPOOL_DTYPE_BOOL: return "bool";
    case KPOOL_DTYPE_INT32: return "int32";
    case KPOOL_DTYPE_INT64: return "int64";
    case KPOOL_DTYPE_BFLOAT16: return "bfloat16";
    case KPOOL_DTYPE_FLOAT32: return "float32";
    case KPOOL_DTYPE_FLOAT8_E4M3FN: return "float8_e4m3fn";
    }
    return "unknown dtype";
}

int32_t kpool_dtype_size(kpool_dtype dtype) { return static_cast<int32_t>(element_bytes(dtype)); }

const char *kpool_version(void) {
#ifdef KPOOL_WITH_CUDA
    return "kpool " KPOOL_VERSION_STRING " (cpu, cuda)";
#else
    return "kpool " KPOOL_VERSION_STRING " (cpu)";
#endif
}

kpool_tensor kpool_tensor_contiguous(void *data, kpool_dtype dtype, int32_t ndim, const int64_t *shape) {
    return contiguous_tensor(data, dtype, ndim, shape);
}

// The entry points that run an op, one each, from the op table (ops/*.toml):
// the op's function (kpool_op_functions.h) under run / run_op.
#include "kpool_entry_points.inc"

}  // extern "C"
