// kpool's CUDA module loader: the Halide runtime loads every kernel's module
// through cuModuleLoadDataEx, handing it the kernel's PTX; kpool answers that
// call (Halide's runtime asks kpool for the driver's entry point) and loads
// the SASS the build assembled for the same PTX (cmake/embed_sass.py), or,
// where the driver cannot take it (a GPU of another architecture, or a
// driver older than the build's ptxas), JIT-compiles the PTX under the
// register cap the SASS was assembled with, as it does any PTX the build has
// no SASS for (never Halide's 64-register request). Binary images (cubins,
// fatbins) load as their caller asked.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kpool::rt {

// One kernel module's SASS, keyed by the PTX Halide hands the driver.
struct SassImage {
    uint64_t ptx_hash;  // FNV-1a 64 of the PTX text from its .version line (without its NUL)
    uint64_t ptx_size;  // those bytes
    const unsigned char *cubin;
    uint64_t cubin_size;
};
extern const SassImage kSassImages[];  // generated: kpool_sass_images.cpp
extern const size_t kSassImageCount;

// The SASS in `images` of a kernel module's PTX (NUL-terminated), or
// nullptr: not one of their modules.
const SassImage *sass_for_ptx(const char *image, const SassImage *images, size_t count);

uint64_t fnv1a64(const char *bytes, size_t size);

// What a CUDA device (its ordinal) has loaded of kpool's kernel modules so far.
struct LoadedImages {
    int sass = 0;     // the build's SASS
    int ptx_jit = 0;  // the PTX, JIT-compiled by the driver
};
LoadedImages loaded_images(int device_ordinal);

// The driver's cuModuleLoadDataEx, as the loader calls it.
using ModuleLoadDataEx = int (*)(void **module, const void *image, unsigned num_options, int *options,
                                 void **option_values);

// The loader's decision for one module load, with the driver's entry point
// as a parameter (the tests give it a stand-in): kpool's SASS when `image`
// is PTX the build has SASS for, SASS is allowed and the driver takes it;
// else that PTX under kpool's register cap (never Halide's 64); else (a
// cubin or fatbin, not PTX text) the image and options as asked. `loaded`
// says which image loaded (untouched for a binary image).
enum class LoadedImage { None, Sass, PtxJit };
// `images`: the build's (kSassImages), or a test's.
int load_module(const SassImage *images, size_t count, ModuleLoadDataEx driver_load, bool sass_allowed, void **module,
                const void *image, unsigned num_options, int *options, void **option_values, LoadedImage *loaded);

// The symbol lookup kpool's loader sits on in the Halide runtime's chain
// (halide_set_custom_get_library_symbol: Halide's default, dlsym), replaced
// by `lookup`; returns the one before. The tests put a stand-in driver there.
using LibrarySymbolLookup = void *(*)(void *lib, const char *name);
LibrarySymbolLookup lookup_beneath_module_loader(LibrarySymbolLookup lookup);

}  // namespace kpool::rt
