#include <cstring>
#include <string>

#include "dispatch.h"
#include "kpool_variants.inc"

namespace kpool::rt {

namespace {

struct Variant {
    const char *device;
    Kernel kind;
    int pool_size;
    const char *type;
    const char *arithmetic;
    AnyKernel function;
};

#define KPOOL_VARIANT_ENTRY(device, kind, pool_size, type, arithmetic, function) \
    {#device, Kernel::kind, pool_size, #type, #arithmetic, reinterpret_cast<AnyKernel>(&function)},
const Variant kVariants[] = {KPOOL_FOR_EACH_VARIANT(KPOOL_VARIANT_ENTRY)};
#undef KPOOL_VARIANT_ENTRY

}  // namespace

AnyKernel find_kernel(const char *device, Kernel kind, int pool_size, const char *type, const char *arithmetic) {
    for (const Variant &v : kVariants) {
        // Every call looks its variant up: integers first, strings only for
        // the few entries of the right kind and pool size.
        if (v.kind == kind && v.pool_size == pool_size && std::strcmp(v.device, device) == 0 &&
            std::strcmp(v.type, type) == 0 &&
            (std::strcmp(v.arithmetic, "any") == 0 || std::strcmp(v.arithmetic, arithmetic) == 0)) {
            return v.function;
        }
    }
    return nullptr;
}

std::vector<VariantKey> variants_of(const char *device) {
    std::vector<VariantKey> keys;
    for (const Variant &v : kVariants) {
        if (std::strcmp(v.device, device) == 0) {
            keys.push_back({v.kind, v.pool_size, v.type, v.arithmetic});
        }
    }
    return keys;
}

namespace {
// The last message the Halide runtime reported on this thread.
thread_local std::string halide_message;
}  // namespace

void check_halide(int result, const char *op) {
    if (result != 0) {
        throw internal_error() << op << ": the kernel failed with Halide error " << result << ": " << halide_message;
    }
}

}  // namespace kpool::rt

// Halide's runtime reports errors here; keep the text for the status message
// instead of printing it to stderr.
extern "C" void halide_error(void *, const char *message) {
    kpool::rt::halide_message = message;
}
