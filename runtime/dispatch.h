// The kernel variants this build holds, looked up by kind, pool size and
// element type (cmake/KpoolKernels.cmake writes the table).
#pragma once

#include <cstring>
#include <vector>

#include "HalideRuntime.h"
#include "errors.h"

namespace kpool::rt {

enum class Kernel {
    FWHT,
    FWHT_WORDS,  // CUDA: rows of 8-byte words in, 4-byte words out
    COMPRESS_TO_CACHE,
    COMPRESS_TO_ROWS,
    SEED_TAIL,
    DECODE_WRITE_CACHE,
    DECODE_STASH_TAIL,
    DECODE_UPDATE,
    EXPAND_POOLS_AND_APPEND_TAIL,
    EXPAND_POOLS_TO_TOKENS,
    APPEND_TAIL_TO_TOPK,
    INDEX_CHECK,
};

using AnyKernel = void (*)();
// The variant's function for `device` ("cpu", "sm80", "sm90") and
// `arithmetic` ("exact", "triton"; kernels without an approximate step serve
// both), or NULL when none was built for (pool_size, type, arithmetic).
AnyKernel find_kernel(const char *device, Kernel kind, int pool_size, const char *type, const char *arithmetic);

// What a built variant is for (the dispatch table's keys).
struct VariantKey {
    Kernel kind;
    int pool_size;
    const char *type;
    const char *arithmetic;
};
// Every variant built for `device`.
std::vector<VariantKey> variants_of(const char *device);

template <typename Fn>
Fn *kernel(const char *device, Kernel kind, const char *op, int pool_size, const char *type,
           const char *arithmetic) {
    AnyKernel k = find_kernel(device, kind, pool_size, type, arithmetic);
    if (k == nullptr) {
        throw unsupported() << op << ": no " << device << " kernel variant was built for pool_size = " << pool_size
                            << ", type " << type << ", arithmetic " << arithmetic
                            << " (see KPOOL_POOL_SIZES / KPOOL_CUDA_POOL_SIZES / KPOOL_CUDA_ARITHMETICS)";
    }
    return reinterpret_cast<Fn *>(k);
}

// Turns a Halide error return into an error status.
void check_halide(int result, const char *op);

}  // namespace kpool::rt
