// kpool: the command-line face of the library.
//
//   kpool demo   an engine-shaped workload, verified against the reference
//   kpool check  replay a reference dump directory byte for byte
//   kpool overhead  host cost per C API call of each op
//   kpool version | help
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace {

using namespace kpool_tool;

const char kUsage[] =
    "usage: kpool <command> [options]\n"
    "\n"
    "commands:\n"
    "  demo [--requests N] [--decode-steps S] [--next-n T] [--seed X] [--device auto|cpu|cuda]\n"
    "      An engine-shaped workload: N requests (default 8) with prompts of 100..3000\n"
    "      tokens, P = 4, block_size 64, ring 4. Prefill (fwht128_quant_fp8 of the\n"
    "      query rows, every full pool compressed into a paged cache, tail rings\n"
    "      seeded), then S decode steps (default 16) of T tokens per request\n"
    "      (default 2), each followed by the expansion of randomly selected pools.\n"
    "      Every call is checked bit for bit against the scalar reference, and the\n"
    "      per-op timings are printed. Exit status 1 if anything differs.\n"
    "  check DIR [--device auto|cpu|cuda]\n"
    "      Runs every case of a reference dump directory (manifest.json + .bin,\n"
    "      from shared/anchors/bench_triton.py --dump) through the C API and compares\n"
    "      every output byte for byte. Prints 'ok <case>' or 'FAIL <case>: ...'.\n"
    "      Exit status 1 on any mismatch, 2 if the dump cannot be read.\n"
    "  overhead [--calls N] [--device auto|cpu|cuda]\n"
    "      Host microseconds per C API call of each op on its smallest call (N calls\n"
    "      back to back, default 2000, best and median of 7 runs), and on a GPU the\n"
    "      driver's floor under each launch through Halide's runtime (an empty\n"
    "      kernel's launch, context push/pop, the kernel's lookup by name).\n"
    "  version\n"
    "      The library's version and the devices it was built for; on a GPU, the\n"
    "      family it runs there and which image of its kernels the device loaded\n"
    "      (the build's SASS, or PTX JIT-compiled by the driver), with the time\n"
    "      loading and running every kernel once took (measurement builds: $KPOOL_CUDA_IMAGE=ptx, PTX).\n"
    "  help\n"
    "      This text.\n"
    "\n"
    "--device auto (the default) uses the GPU when the build and the machine have\n"
    "one, the CPU otherwise.\n";

int usage_error(const std::string &message) {
    std::fprintf(stderr, "kpool: %s\n\n%s", message.c_str(), kUsage);
    return kExitUsage;
}

// Reads "--name value" or "--name=value" at args[*i]; false when args[*i] is
// not --name. A missing value is reported through *error.
bool option_value(const std::vector<std::string> &args, size_t *i, const std::string &name,
                  std::string *value, std::string *error) {
    const std::string &arg = args[*i];
    if (arg == name) {
        if (*i + 1 >= args.size()) {
            *error = name + " needs a value";
            return true;
        }
        *value = args[++*i];
        return true;
    }
    if (arg.compare(0, name.size() + 1, name + "=") == 0) {
        *value = arg.substr(name.size() + 1);
        return true;
    }
    return false;
}

bool parse_count(const std::string &name, const std::string &text, int64_t lo, int64_t hi,
                 int64_t *out, std::string *error) {
    char *end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || value < lo || value > hi) {
        *error = name + " " + text + ": expected an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]";
        return false;
    }
    *out = value;
    return true;
}

bool parse_device(const std::string &text, DeviceChoice *choice, std::string *error) {
    if (parse_device_choice(text, choice)) return true;
    *error = "--device " + text + ": expected auto, cpu or cuda";
    return false;
}

int demo_command(const std::vector<std::string> &args) {
    DemoOptions options;
    for (size_t i = 0; i < args.size(); ++i) {
        std::string value, error;
        int64_t number = 0;
        if (option_value(args, &i, "--requests", &value, &error)) {
            if (!error.empty() || !parse_count("--requests", value, 1, 256, &options.requests, &error)) {
                return usage_error(error);
            }
        } else if (option_value(args, &i, "--decode-steps", &value, &error)) {
            if (!error.empty() ||
                !parse_count("--decode-steps", value, 0, 100000, &options.decode_steps, &error)) {
                return usage_error(error);
            }
        } else if (option_value(args, &i, "--next-n", &value, &error)) {
            if (!error.empty() || !parse_count("--next-n", value, 1, 16, &options.next_n, &error)) {
                return usage_error(error);
            }
        } else if (option_value(args, &i, "--seed", &value, &error)) {
            if (!error.empty() || !parse_count("--seed", value, 0, INT64_MAX, &number, &error)) {
                return usage_error(error);
            }
            options.seed = static_cast<uint64_t>(number);
        } else if (option_value(args, &i, "--device", &value, &error)) {
            if (!error.empty() || !parse_device(value, &options.device, &error)) {
                return usage_error(error);
            }
        } else {
            return usage_error("demo: unknown argument " + args[i]);
        }
    }
    return run_demo(options);
}

int check_command(const std::vector<std::string> &args) {
    std::string directory;
    DeviceChoice device = DeviceChoice::Auto;
    for (size_t i = 0; i < args.size(); ++i) {
        std::string value, error;
        if (option_value(args, &i, "--device", &value, &error)) {
            if (!error.empty() || !parse_device(value, &device, &error)) return usage_error(error);
        } else if (args[i].compare(0, 2, "--") == 0 || !directory.empty()) {
            return usage_error("check: unexpected argument " + args[i]);
        } else {
            directory = args[i];
        }
    }
    if (directory.empty()) return usage_error("check: which dump directory? (kpool check DIR)");
    return run_check(directory, device);
}

int overhead_command(const std::vector<std::string> &args) {
    DeviceChoice device = DeviceChoice::Auto;
    int64_t calls = 2000;
    for (size_t i = 0; i < args.size(); ++i) {
        std::string value, error;
        if (option_value(args, &i, "--device", &value, &error)) {
            if (!error.empty() || !parse_device(value, &device, &error)) return usage_error(error);
        } else if (option_value(args, &i, "--calls", &value, &error)) {
            if (!error.empty() || !parse_count("--calls", value, 1, 1000000, &calls, &error)) return usage_error(error);
        } else {
            return usage_error("overhead: unknown argument " + args[i]);
        }
    }
    return run_overhead(device, static_cast<int>(calls));
}

// The version, then per GPU: the family it runs, which image of kpool's
// kernels it loaded, and how long loading and running each variant once took
// (kpool_cuda_warm_up: a process's first calls).
int version_command() {
    std::printf("%s\n", kpool_version());
    if (!kpool_support::library_has_cuda()) return kExitOk;
    for (int index = 0;; ++index) {
        std::string error;
        std::unique_ptr<Device> device = kpool_support::open_cuda_device(index, &error);
        if (!device) break;  // no driver, or no GPU `index`
        const kpool_exec exec = device->exec();
        kpool_status st{};
        const auto start = std::chrono::steady_clock::now();
        if (kpool_cuda_warm_up(device->index(), &exec, &st) != KPOOL_OK) {
            std::fprintf(stderr, "kpool version: %s: kpool_cuda_warm_up: %s\n", device->name().c_str(), st.message);
            return kExitMismatch;
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        kpool_cuda_images images{};
        if (kpool_cuda_loaded_images(device->index(), &images, &st) != KPOOL_OK) {
            std::fprintf(stderr, "kpool version: %s: kpool_cuda_loaded_images: %s\n", device->name().c_str(),
                         st.message);
            return kExitMismatch;
        }
        std::printf("%s: family %s (its SASS %s this GPU), %d kernel modules loaded as SASS, %d JIT-compiled "
                    "from PTX; first call of every variant %.1f ms\n",
                    device->name().c_str(), images.family, images.sass_fits ? "fits" : "does not fit",
                    images.sass_modules, images.ptx_jit_modules, ms);
    }
    return kExitOk;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage_error("no command given");
    const std::string command = argv[1];
    const std::vector<std::string> args(argv + 2, argv + argc);
    if (command == "demo") return demo_command(args);
    if (command == "check") return check_command(args);
    if (command == "overhead") return overhead_command(args);
    if (command == "version" || command == "--version") return version_command();
    if (command == "help" || command == "--help" || command == "-h") {
        std::fputs(kUsage, stdout);
        return kExitOk;
    }
    return usage_error("unknown command " + command);
}
