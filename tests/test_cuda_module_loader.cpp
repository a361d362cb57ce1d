// kpool's CUDA module loader (runtime/cuda_module_loader.cpp) against a
// stand-in for the driver's cuModuleLoadDataEx, on the CPU: a kpool module's
// SASS first, its PTX under kpool's register cap where the driver refuses
// the SASS (the path every GPU the SASS does not fit takes: on a GPU,
// KPOOL_CUDA_FAMILY=<an older family> runs it), and other libraries' modules
// untouched.
#include <cstring>
#include <string>
#include <vector>

#include "cuda_module_loader.h"
#include "gtest/gtest.h"

namespace {

using namespace kpool::rt;

struct Load {
    const void *image;
    std::vector<int> options;
    std::vector<void *> values;
};
std::vector<Load> loads;  // what the stand-in driver was asked, in order
bool refuse_sass = false;
const unsigned char kCubin[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0};

int stand_in_driver(void **module, const void *image, unsigned n, int *options, void **values) {
    loads.push_back({image, std::vector<int>(options, options + n), std::vector<void *>(values, values + n)});
    if (refuse_sass && image == kCubin) {
        return 209;  // CUDA_ERROR_NO_BINARY_FOR_GPU
    }
    *module = const_cast<void *>(image);
    return 0;
}

class CudaModuleLoader : public ::testing::Test {
protected:
    void SetUp() override {
        loads.clear();
        refuse_sass = false;
    }
    const std::string ptx = "//\n.version 7.8\n.target sm_90\n.address_size 64\n";
    const SassImage images[1] = {{fnv1a64(ptx.data(), ptx.size()), ptx.size(), kCubin, sizeof(kCubin)}};

    int load(const void *image, bool sass_allowed, LoadedImage *loaded, unsigned n = 0, int *options = nullptr,
             void **values = nullptr) {
        void *module = nullptr;
        return load_module(images, 1, &stand_in_driver, sass_allowed, &module, image, n, options, values, loaded);
    }
};

TEST_F(CudaModuleLoader, LoadsTheSassOfKpoolsPtx) {
    LoadedImage loaded = LoadedImage::None;
    ASSERT_EQ(0, load(ptx.c_str(), true, &loaded));
    ASSERT_EQ(1u, loads.size());
    EXPECT_EQ(static_cast<const void *>(kCubin), loads[0].image);
    EXPECT_TRUE(loads[0].options.empty());  // SASS: nothing to JIT
    EXPECT_EQ(LoadedImage::Sass, loaded);
}

TEST_F(CudaModuleLoader, JitCompilesThePtxUnderTheCapWhereTheDriverRefusesTheSass) {
    refuse_sass = true;
    int halide_options[] = {0};
    void *halide_values[] = {reinterpret_cast<void *>(uintptr_t{64})};  // Halide's own cap
    LoadedImage loaded = LoadedImage::None;
    ASSERT_EQ(0, load(ptx.c_str(), true, &loaded, 1, halide_options, halide_values));
    ASSERT_EQ(2u, loads.size());
    EXPECT_EQ(static_cast<const void *>(kCubin), loads[0].image);
    EXPECT_EQ(static_cast<const void *>(ptx.c_str()), loads[1].image);
    ASSERT_EQ(std::vector<int>{0}, loads[1].options);  // CU_JIT_MAX_REGISTERS
    EXPECT_EQ(reinterpret_cast<void *>(uintptr_t{KPOOL_CUDA_MAX_REGISTERS}), loads[1].values[0]);
    EXPECT_EQ(LoadedImage::PtxJit, loaded);
}

TEST_F(CudaModuleLoader, PtxOnlyWhenSassIsNotAllowed) {
    LoadedImage loaded = LoadedImage::None;
    ASSERT_EQ(0, load(ptx.c_str(), false, &loaded));
    ASSERT_EQ(1u, loads.size());
    EXPECT_EQ(static_cast<const void *>(ptx.c_str()), loads[0].image);
    EXPECT_EQ(LoadedImage::PtxJit, loaded);
}

TEST_F(CudaModuleLoader, OtherModulesLoadAsAsked) {
    const std::string other = ptx + "// another library's\n";
    int options[] = {0};
    void *values[] = {reinterpret_cast<void *>(uintptr_t{32})};
    LoadedImage loaded = LoadedImage::None;
    ASSERT_EQ(0, load(other.c_str(), true, &loaded, 1, options, values));
    ASSERT_EQ(1u, loads.size());
    EXPECT_EQ(static_cast<const void *>(other.c_str()), loads[0].image);
    EXPECT_EQ(values[0], loads[0].values[0]);
    EXPECT_EQ(LoadedImage::None, loaded);
}

// The hash the build keys the SASS by (cmake/ptx_for_family.py): FNV-1a 64.
TEST_F(CudaModuleLoader, KeysByFnv1a64) {
    EXPECT_EQ(0xcbf29ce484222325ull, fnv1a64("", 0));
    EXPECT_EQ(0xaf63dc4c8601ec8cull, fnv1a64("a", 1));
}

}  // namespace
