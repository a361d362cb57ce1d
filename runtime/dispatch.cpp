#include "dispatch.h"

#include <pthread.h>

#include <atomic>
#include <string>
#include <thread>
#include <type_traits>

#include "kpool_variants.inc"

namespace kpool::rt {

// Each key's name, from the list its enum is made of (dispatch.h), in order.
const char *name(Family f) {
#define KPOOL_FAMILY_NAME(family, capability) #family,
    const char *const names[] = {"cpu", KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_FAMILY_NAME)};
#undef KPOOL_FAMILY_NAME
    return names[static_cast<int>(f)];
}

const char *name(ElementType t) {
#define KPOOL_NAME(e) #e,
    const char *const names[] = {KPOOL_ELEMENT_TYPES(KPOOL_NAME)};
    return names[static_cast<int>(t)];
}

const char *name(Arithmetic a) {
    const char *const names[] = {KPOOL_ARITHMETICS(KPOOL_NAME)};
#undef KPOOL_NAME
    return names[static_cast<int>(a)];
}

namespace {

struct Variant {
    VariantKey key;
    AnyKernel function;
};

// A generated function as the table holds it, once the compiler has checked
// it against its kind's signature (dispatch.h) for its family.
template <Kernel K, Family F, typename Fn>
AnyKernel checked(Fn *function) {
    using Expected = std::conditional_t<F == Family::cpu, typename KernelSignature<K>::Host,
                                        typename KernelSignature<K>::Cuda>;
    static_assert(std::is_same_v<Fn, Expected>,
                  "a generated kernel's arguments differ from its kind's KernelSignature (dispatch.h)");
    return reinterpret_cast<AnyKernel>(function);
}

#define KPOOL_VARIANT_ENTRY(family, kind, pool_size, type, arithmetic, function)                     \
    {{Family::family, Kernel::kind, pool_size, ElementType::type, Arithmetic::arithmetic},          \
     checked<Kernel::kind, Family::family>(&function)},
const Variant kVariants[] = {KPOOL_FOR_EACH_VARIANT(KPOOL_VARIANT_ENTRY)};

bool serves(const VariantKey &k, const VariantKey &key) {
    return k.kind == key.kind && k.pool_size == key.pool_size && k.family == key.family && k.type == key.type &&
           (k.arithmetic == Arithmetic::any || k.arithmetic == key.arithmetic);
}

#ifdef KPOOL_TUNING
// A tuning build (tools/tune): every schedule candidate's kernels, and the
// candidate selected with kpool_tune_select serving its keys in place of the
// built variants (each candidate holds the kernels of the ops it tunes).
struct Candidate {
    int id;
    Variant variant;
};
#define KPOOL_CANDIDATE_ENTRY(id, family, kind, pool_size, type, arithmetic, function) \
    {id, KPOOL_VARIANT_ENTRY(family, kind, pool_size, type, arithmetic, function)},
const Candidate kCandidates[] = {KPOOL_FOR_EACH_CANDIDATE(KPOOL_CANDIDATE_ENTRY)};
#undef KPOOL_CANDIDATE_ENTRY
std::atomic<int> selected_candidate{-1};
#endif
#undef KPOOL_VARIANT_ENTRY

}  // namespace

AnyKernel find_kernel(const VariantKey &key) {
#ifdef KPOOL_TUNING
    for (const Candidate &c : kCandidates) {
        if (c.id == selected_candidate.load() && serves(c.variant.key, key)) {
            return c.variant.function;
        }
    }
#endif
    for (const Variant &v : kVariants) {
        if (serves(v.key, key)) {
            return v.function;
        }
    }
    return nullptr;
}

AnyKernel require_kernel(const VariantKey &key, const char *op) {
    AnyKernel k = find_kernel(key);
    if (k == nullptr) {
        throw unsupported() << op << ": no " << name(key.family) << " kernel variant was built for pool_size = "
                            << key.pool_size << ", type " << name(key.type) << ", arithmetic " << name(key.arithmetic)
                            << " (see KPOOL_MAX_POOL_SIZE / KPOOL_CUDA_POOL_SIZES / KPOOL_CUDA_ARITHMETICS)";
    }
    return k;
}

std::vector<VariantKey> variants_of(Family family) {
    std::vector<VariantKey> keys;
    for (const Variant &v : kVariants) {
        if (v.key.family == family) {
            keys.push_back(v.key);
        }
    }
    return keys;
}

namespace {
// The last message the Halide runtime reported on this thread.
thread_local std::string halide_message;

// Halide's runtime reports errors here; keep the text for the status message
// instead of printing it to stderr. Set through the runtime's own setter when
// the library loads: the handler belongs to the Halide runtime linked into
// kpool, not to every Halide pipeline of the process (a halide_error of
// kpool's own would replace theirs too).
void keep_halide_message(void *, const char *message) { halide_message = message; }
[[maybe_unused]] const halide_error_handler_t previous_error_handler = halide_set_error_handler(&keep_halide_message);
}  // namespace

void check_halide(int result, const char *op) {
    std::string message;
    message.swap(halide_message);  // a later call must not show this call's text
    if (result != 0) {
        throw internal_error() << op << ": the kernel failed with Halide error " << result << ": " << message;
    }
}

namespace {
// CPU kernels running now, and whether a fork is waiting for them to end.
std::atomic<int> host_kernels_running{0};
std::atomic<bool> forking{false};

void before_fork() {
    forking.store(true);
    while (host_kernels_running.load() != 0) {
        std::this_thread::yield();
    }
    halide_shutdown_thread_pool();
}

void after_fork() { forking.store(false); }

void after_fork_in_child() {
    host_kernels_running.store(0);  // (the threads that ran them are not in the child)
    forking.store(false);
}

[[maybe_unused]] const int fork_handlers = pthread_atfork(&before_fork, &after_fork, &after_fork_in_child);
}  // namespace

HostPoolUse::HostPoolUse() {
    for (;;) {
        host_kernels_running.fetch_add(1);
        if (!forking.load()) {
            return;
        }
        host_kernels_running.fetch_sub(1);
        while (forking.load()) {
            std::this_thread::yield();
        }
    }
}

HostPoolUse::~HostPoolUse() { host_kernels_running.fetch_sub(1); }

}  // namespace kpool::rt

#ifdef KPOOL_TUNING
// Selects tuning candidate `id` (-1: none, the built variants); returns how
// many kernels it serves, 0 for an id the build does not hold (nothing
// selected then).
extern "C" int kpool_tune_select(int id) {
    using namespace kpool::rt;
    int kernels = 0;
    for (const Candidate &c : kCandidates) {
        kernels += c.id == id;
    }
    selected_candidate.store(kernels > 0 ? id : -1);
    return kernels;
}
#endif
