// The tool's subcommands; each returns the process exit status.
#ifndef KPOOL_TOOLS_COMMANDS_H
#define KPOOL_TOOLS_COMMANDS_H

#include <cstdint>
#include <string>

#include "support/device.h"

namespace kpool_tool {

// Where the commands run their calls: the test-support library's device layer.
using kpool_support::Device;
using kpool_support::DeviceBuffer;
using kpool_support::DeviceChoice;
using kpool_support::OpenedDevice;
using kpool_support::open_device;
using kpool_support::parse_device_choice;

// Exit statuses shared by every command.
constexpr int kExitOk = 0;
constexpr int kExitMismatch = 1;  // an output differs, or a C API call failed
constexpr int kExitUsage = 2;     // bad command line, unreadable dump, no such device

struct DemoOptions {
    int64_t requests = 8;
    int64_t decode_steps = 16;
    int64_t next_n = 2;
    uint64_t seed = 0;
    DeviceChoice device = DeviceChoice::Auto;
};

// An engine-shaped workload (prefill, decode steps, pool expansion), every
// call checked bit for bit against kpool_ref; prints per-op timings.
int run_demo(const DemoOptions &options);

// Every case of a reference dump directory through the C API, compared byte
// for byte with the dump's outputs.
int run_check(const std::string &directory, DeviceChoice device);

// Host µs per C API call of every op on its smallest call, `calls` back to
// back, next to the driver's floor under each launch on a GPU.
int run_overhead(DeviceChoice device, int calls);

}  // namespace kpool_tool

#endif  // KPOOL_TOOLS_COMMANDS_H
