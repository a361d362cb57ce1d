// kpool's CUDA module loader: the Halide runtime loads every kernel's module
// through cuModuleLoadDataEx, handing it the kernel's PTX; kpool answers that
// call (Halide's runtime asks kpool for the driver's entry point) and loads
// the SASS the build assembled for the same PTX (cmake/embed_sass.py), or,
// where the driver cannot take it (a GPU of another architecture, or a
// driver older than the build's ptxas), JIT-compiles the PTX under the
// register cap the SASS was assembled with. Modules that are not kpool's
// load as their caller asked.
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
// is one of kpool's PTX modules, SASS is allowed and the driver takes it; else that PTX
// under kpool's register cap; else (another library's module) the image
// and options as asked. `loaded` says which kpool image loaded (untouched
// for another library's module).
enum class LoadedImage { None, Sass, PtxJit };
// `images`: the build's (kSassImages), or a test's.
int load_module(const SassImage *images, size_t count, ModuleLoadDataEx driver_load, bool sass_allowed, void **module,
                const void *image, unsigned num_options, int *options, void **option_values, LoadedImage *loaded);

}  // namespace kpool::rt
