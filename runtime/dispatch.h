// The kernel variants this build holds, looked up by kind, device family,
// pool size, element type and arithmetic (cmake/KpoolKernels.cmake writes
// the table from the op table, ops/*.toml), and each kind's signature: a caller's arguments and every
// generated function of the kind are checked against it at compile time.
#pragma once

#include <type_traits>
#include <vector>

#include "HalideRuntime.h"
#include "errors.h"

namespace kpool::rt {

// The kernel kinds of the op table (ops/*.toml: each [[kernel]]'s kind, what
// it is for, its generator) and each one's arguments.
#include "kpool_kernel_kinds.inc"  // KPOOL_FOR_EACH_KERNEL_KIND(X): X(kind, argument types...)
#define KPOOL_KIND_ENUMERATOR(kind, ...) kind,
enum class Kernel { KPOOL_FOR_EACH_KERNEL_KIND(KPOOL_KIND_ENUMERATOR) };
#undef KPOOL_KIND_ENUMERATOR

// The table's keys. Enumerators are spelled as the build spells them (the
// table's lines name them as tokens: `sm90, DECODE_UPDATE, 4, bf16, triton`).
#include "kpool_families.inc"  // KPOOL_FOR_EACH_CUDA_FAMILY(X): X(name, lowest capability)
#define KPOOL_FAMILY_ENUMERATOR(family, capability) family,
enum class Family { cpu, KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_FAMILY_ENUMERATOR) };
#undef KPOOL_FAMILY_ENUMERATOR
#define KPOOL_ELEMENT_TYPES(X) X(none) X(bf16) X(f32) X(int32) X(int64)
// A variant's arithmetic; `any`: the kernel has no approximate step and
// serves both.
#define KPOOL_ARITHMETICS(X) X(any) X(exact) X(triton)
#define KPOOL_ENUMERATOR(e) e,
enum class ElementType { KPOOL_ELEMENT_TYPES(KPOOL_ENUMERATOR) };
enum class Arithmetic { KPOOL_ARITHMETICS(KPOOL_ENUMERATOR) };
#undef KPOOL_ENUMERATOR

const char *name(Family f);
const char *name(ElementType t);
const char *name(Arithmetic a);

// Each kind's arguments, in its generator's order: CPU variants take them
// as they are, CUDA variants after the user context (the call's context and
// stream).
template <typename... Args>
struct Signature {
    using Host = int(Args...);
    using Cuda = int(const void *, Args...);
};
template <Kernel K>
struct KernelSignature;

using Buf = halide_buffer_t *;
#define KPOOL_SIGNATURE(kind, ...) \
    template <>                    \
    struct KernelSignature<Kernel::kind> : Signature<__VA_ARGS__> {};
KPOOL_FOR_EACH_KERNEL_KIND(KPOOL_SIGNATURE)
#undef KPOOL_SIGNATURE

// What a built variant is for (the dispatch table's keys).
struct VariantKey {
    Family family;
    Kernel kind;
    int pool_size;
    ElementType type;
    Arithmetic arithmetic;
};

using AnyKernel = void (*)();
// The variant's function for the key (an `any` variant serves either
// arithmetic asked for), or NULL when none was built.
AnyKernel find_kernel(const VariantKey &key);
// Every variant built for `family`.
std::vector<VariantKey> variants_of(Family family);

// find_kernel, or `unsupported` naming `op` when this build has no such
// variant.
AnyKernel require_kernel(const VariantKey &key, const char *op);

// Turns a Halide error return into an error status (with the message the
// Halide runtime reported on this thread during the call, and only then).
void check_halide(int result, const char *op);

// While one lives, its thread runs a CPU kernel on Halide's thread pool. A
// fork waits for the running ones and shuts the pool down first (a child
// inherits the pool's state but not its worker threads, and would run every
// kernel on one thread): parent and child each start a new pool at their
// next CPU kernel (the handlers are installed when the library loads).
class HostPoolUse {
public:
    HostPoolUse();
    ~HostPoolUse();
    HostPoolUse(const HostPoolUse &) = delete;
    HostPoolUse &operator=(const HostPoolUse &) = delete;
};

}  // namespace kpool::rt
