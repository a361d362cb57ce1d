// GpuFuzzReplay: every committed fuzz input (tests/fuzz/corpus/<target>/)
// replayed through the GPU, by the fuzz targets' own code
// (tests/fuzz/fuzz_<target>.cpp, compiled into this binary as
// kfuzz_replay_<target>) with its tensors in device memory
// (kfuzz::CallMemory): the same hostile calls as on the host, checked as the
// host run checks them — a rejection names the argument and moves no byte
// (canaries and padding included), a success matches the scalar reference,
// an out-of-range index writes nothing and marks its argument in the device
// words of exec->index_errors. Run under compute-sanitizer's memcheck by
// bench/run_on_gpu.sh. One failure per input, naming the target and the file.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <dirent.h>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "gpu_fixtures.h"

#ifdef KPOOL_FUZZ_REPLAY
#include "fuzz/fuzz_common.h"
#include "kpool_fuzz_targets.inc"  // (generated from tests/CMakeLists.txt's KPOOL_FUZZ_TARGETS)

#define KPOOL_FUZZ_TARGET(name) extern "C" int kfuzz_replay_##name(const uint8_t *data, size_t size);
KPOOL_FOR_EACH_FUZZ_TARGET(KPOOL_FUZZ_TARGET)
#undef KPOOL_FUZZ_TARGET
#endif

namespace kpool_test {
namespace {

struct FuzzTarget {
    const char *name;
    int (*one_input)(const uint8_t *, size_t);
};

#ifdef KPOOL_FUZZ_REPLAY
#define KPOOL_FUZZ_TARGET(name) {#name, kfuzz_replay_##name},
const FuzzTarget kTargets[] = {KPOOL_FOR_EACH_FUZZ_TARGET(KPOOL_FUZZ_TARGET)};
#undef KPOOL_FUZZ_TARGET
#else
const FuzzTarget kTargets[] = {{"none", nullptr}};
#endif

bool is_directory(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// KPOOL_FUZZ_CORPUS, else the source tree's corpus, else tests/fuzz/corpus
// under the working directory (a copy of the tree on a GPU machine).
std::string corpus_root() {
    if (const char *dir = std::getenv("KPOOL_FUZZ_CORPUS")) return dir;
#ifdef KPOOL_FUZZ_CORPUS_DIR
    if (is_directory(KPOOL_FUZZ_CORPUS_DIR)) return KPOOL_FUZZ_CORPUS_DIR;
#endif
    return "tests/fuzz/corpus";
}

std::vector<std::string> files_in(const std::string &dir) {
    std::vector<std::string> files;
    if (DIR *d = opendir(dir.c_str())) {
        while (const dirent *e = readdir(d)) {
            const std::string path = dir + "/" + e->d_name;
            struct stat st;
            if (e->d_name[0] != '.' && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
        }
        closedir(d);
    }
    std::sort(files.begin(), files.end());
    return files;
}

class GpuFuzzReplay : public GpuParamTest<FuzzTarget> {};

TEST_P(GpuFuzzReplay, EveryCommittedInputThroughDeviceMemory) {
#ifndef KPOOL_FUZZ_REPLAY
    GTEST_SKIP() << "built without LLVM's FuzzedDataProvider.h (clang): no fuzz targets to replay";
#else
    const FuzzTarget target = GetParam();
    const std::string dir = corpus_root() + "/" + target.name;
    std::vector<std::string> files = files_in(dir);
    ASSERT_FALSE(files.empty()) << "no corpus in " << dir << " (set KPOOL_FUZZ_CORPUS to tests/fuzz/corpus)";
    // KPOOL_FUZZ_REPLAY_LIMIT (under compute-sanitizer): that many inputs,
    // spread evenly over the corpus, and every regression input.
    const long limit = std::getenv("KPOOL_FUZZ_REPLAY_LIMIT") ? std::atol(std::getenv("KPOOL_FUZZ_REPLAY_LIMIT")) : 0;
    if (limit > 0 && files.size() > size_t(limit)) {
        std::vector<std::string> sample;
        for (size_t i = 0; i < files.size(); i++) {
            const bool regression = files[i].find("/regress-") != std::string::npos;
            if (regression || (i * size_t(limit)) / files.size() != ((i + 1) * size_t(limit)) / files.size()) {
                sample.push_back(files[i]);
            }
        }
        files.swap(sample);
    }
    kfuzz::replay_device() = &gpu();
    int failures = 0;
    for (const std::string &file : files) {
        std::ifstream in(file, std::ios::binary);
        const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        try {
            target.one_input(bytes.data(), bytes.size());
        } catch (const kfuzz::Violation &v) {
            ADD_FAILURE() << "fuzz target " << target.name << ", input " << file << ":\n" << v.what;
            ++failures;
        } catch (const std::exception &e) {
            ADD_FAILURE() << "fuzz target " << target.name << ", input " << file << ": " << e.what();
            ++failures;
        }
        if (failures >= 5) {
            ADD_FAILURE() << "stopping " << target.name << " after 5 failing inputs";
            break;
        }
    }
    kfuzz::replay_device() = nullptr;
    std::printf("%s: %zu committed inputs replayed on %s\n", target.name, files.size(), gpu().name().c_str());
#endif
}

INSTANTIATE_TEST_SUITE_P(Corpus, GpuFuzzReplay, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<FuzzTarget> &info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kpool_test
