#include "cuda_module_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "HalideRuntime.h"

namespace kpool::rt {

namespace {

constexpr int kJitMaxRegisters = 0;  // CU_JIT_MAX_REGISTERS

using CtxGetDevice = int (*)(int *device);

// The driver's entry points the loader calls, from the library Halide's
// runtime opened (`lib`), looked up with the lookup kpool replaced.
struct DriverEntries {
    ModuleLoadDataEx load = nullptr;
    CtxGetDevice ctx_get_device = nullptr;
};

// The lookup beneath kpool's (Halide's default dlsym, or a test's stand-in).
halide_get_library_symbol_t halide_lookup = nullptr;
DriverEntries driver_entries;
std::mutex counts_mutex;
std::map<int, LoadedImages> counts;  // by device ordinal

void count(LoadedImage image) {
    int ordinal = -1;
    if (driver_entries.ctx_get_device == nullptr || driver_entries.ctx_get_device(&ordinal) != 0) {
        ordinal = -1;
    }
    std::lock_guard<std::mutex> lock(counts_mutex);
    LoadedImages &c = counts[ordinal];
    (image == LoadedImage::Sass ? c.sass : c.ptx_jit) += 1;
}

// cuModuleLoadDataEx as the Halide runtime sees it (Halide runs every
// kernel's module load through it, in the context of the call's device).
int kpool_module_load_data_ex(void **module, const void *image, unsigned num_options, int *options,
                              void **option_values) {
    // A measurement hook (KPOOL_MEASUREMENT_HOOKS builds only):
    // $KPOOL_CUDA_IMAGE=ptx JIT-compiles every module from its PTX (the
    // fallback's path on a GPU the SASS fits; the first call's time without SASS).
#ifdef KPOOL_MEASUREMENT_HOOKS
    static const bool ptx_only = [] {
        const char *asked = std::getenv("KPOOL_CUDA_IMAGE");
        return asked != nullptr && std::strcmp(asked, "ptx") == 0;
    }();
#else
    constexpr bool ptx_only = false;
#endif
    LoadedImage loaded = LoadedImage::None;
    const int result =
        load_module(kSassImages, kSassImageCount, driver_entries.load, !ptx_only, module, image, num_options, options,
                    option_values, &loaded);
    if (result == 0 && loaded != LoadedImage::None) {
        count(loaded);
    }
    return result;
}

// The Halide runtime's symbol lookup, as kpool replaces it: the driver's
// module load is kpool's; everything else is looked up as before. Halide 21
// resolves every driver entry point through it (load_libcuda ->
// halide_cuda_get_symbol -> halide_get_library_symbol), once per process, at
// its first CUDA call.
void *lookup_with_kpool_loader(void *lib, const char *name) {
    void *symbol = halide_lookup(lib, name);
    if (symbol == nullptr || std::strcmp(name, "cuModuleLoadDataEx") != 0) {
        return symbol;
    }
    // (Bound on every ask, not once: the entry points are the library's
    // that this lookup found.)
    driver_entries.load = reinterpret_cast<ModuleLoadDataEx>(symbol);
    driver_entries.ctx_get_device = reinterpret_cast<CtxGetDevice>(halide_lookup(lib, "cuCtxGetDevice"));
    return reinterpret_cast<void *>(&kpool_module_load_data_ex);
}

// Installed when the library loads, before any kernel can run. The lookup
// belongs to the Halide runtime linked into kpool (kept inside libkpool.so),
// so this changes no other library's loads.
[[maybe_unused]] const bool installed = [] {
    halide_lookup = halide_set_custom_get_library_symbol(&lookup_with_kpool_loader);
    return true;
}();

}  // namespace

uint64_t fnv1a64(const char *bytes, size_t size) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; ++i) {
        h = (h ^ static_cast<unsigned char>(bytes[i])) * 0x100000001b3ull;
    }
    return h;
}

const SassImage *sass_for_ptx(const char *image, const SassImage *images, size_t count) {
    // The key covers the module from its .version line on: the comment lines
    // before it are the build's to rewrite (cmake/ptx_for_family.py).
    const char *ptx = std::strstr(image, ".version ");
    if (ptx == nullptr) {
        return nullptr;
    }
    const size_t size = std::strlen(ptx);
    const uint64_t hash = fnv1a64(ptx, size);
    for (size_t i = 0; i < count; ++i) {
        if (images[i].ptx_hash == hash && images[i].ptx_size == size) {
            return &images[i];
        }
    }
    return nullptr;
}

int load_module(const SassImage *images, size_t count, ModuleLoadDataEx driver_load, bool sass_allowed, void **module,
                const void *image, unsigned num_options, int *options, void **option_values, LoadedImage *loaded) {
    // Halide hands over its kernels' PTX text (NUL-terminated); a cubin or
    // fatbin starts with a binary magic: it loads as asked.
    const char *text = static_cast<const char *>(image);
    if (std::strncmp(text, "//", 2) != 0 && std::strncmp(text, ".version ", 9) != 0) {
        return driver_load(module, image, num_options, options, option_values);
    }
    const SassImage *sass = sass_for_ptx(text, images, count);
    if (sass != nullptr && sass_allowed && driver_load(module, sass->cubin, 0, nullptr, nullptr) == 0) {
        *loaded = LoadedImage::Sass;
        return 0;
    }
    // The PTX (no SASS for it, SASS not allowed, or the driver cannot take
    // the SASS), JIT-compiled under the cap the SASS was assembled with, never
    // Halide's own request (64 registers; the large kernels run 3x slower).
    int option = kJitMaxRegisters;
    void *cap = reinterpret_cast<void *>(static_cast<uintptr_t>(KPOOL_CUDA_MAX_REGISTERS));
    const int result = driver_load(module, image, 1, &option, &cap);
    if (result == 0) {
        *loaded = LoadedImage::PtxJit;
    }
    return result;
}

LibrarySymbolLookup lookup_beneath_module_loader(LibrarySymbolLookup lookup) {
    LibrarySymbolLookup before = halide_lookup;
    halide_lookup = lookup;
    return before;
}

LoadedImages loaded_images(int device_ordinal) {
    std::lock_guard<std::mutex> lock(counts_mutex);
    auto it = counts.find(device_ordinal);
    return it == counts.end() ? LoadedImages{} : it->second;
}

}  // namespace kpool::rt
