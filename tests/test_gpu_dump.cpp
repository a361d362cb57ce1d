// GpuDump: every case of the golden dump (tests/data/dump_seed0) replayed on
// the GPU as `kpool check` replays it (support/replay.h), against the dump
// and against the same replay on the CPU.
#include <string>
#include <vector>

#include "gpu_fixtures.h"
#include "support/dump.h"
#include "support/replay.h"

#ifndef KPOOL_TEST_DATA_DIR
#define KPOOL_TEST_DATA_DIR "tests/data"
#endif

namespace kpool_test {
namespace {

using kpool_dump::Case;
using kpool_dump::Op;

kpool_dump::Dump &seed0_dump() {
    static kpool_dump::Dump dump = kpool_dump::load_dump(std::string(KPOOL_TEST_DATA_DIR) + "/dump_seed0");
    return dump;
}

class GpuDump : public GpuTest {};

TEST_F(GpuDump, EveryCaseMatchesTheDumpAndTheCpu) {
    kpool_support::OpenedDevice cpu = kpool_support::open_device(kpool_support::DeviceChoice::Cpu);
    ASSERT_TRUE(cpu.device) << cpu.error;
    kpool_dump::Dump &dump = seed0_dump();
    ASSERT_FALSE(dump.cases.empty());
    for (Case &c : dump.cases) {
        SCOPED_TRACE("case " + c.name + " (" + c.op_name + ")");
        const kpool_dump::Replay on_gpu = kpool_dump::replay_case(c, gpu());
        const kpool_dump::Replay on_cpu = kpool_dump::replay_case(c, *cpu.device);
        for (const std::string &f : on_gpu.failures) ADD_FAILURE() << "GPU: " << f;
        for (const std::string &f : on_cpu.failures) ADD_FAILURE() << "CPU: " << f;
        if (!on_gpu.failures.empty() || !on_cpu.failures.empty()) continue;
        for (const auto &entry : c.outputs) {
            const std::string &key = entry.first;
            const auto gpu_it = on_gpu.outputs.find(key);
            const auto cpu_it = on_cpu.outputs.find(key);
            if (gpu_it == on_gpu.outputs.end() || cpu_it == on_cpu.outputs.end()) {
                ADD_FAILURE() << "output " << key << " was not produced";
                continue;
            }
            // Decode: where the reference compressed a completion without a
            // tail block (SPEC "Reference defects"), the input bytes stay.
            EXPECT_TRUE(same_bytes(key + " (GPU vs dump)", kpool_dump::expected_output(c, key), gpu_it->second));
            EXPECT_TRUE(same_bytes(key + " (GPU vs CPU)", cpu_it->second, gpu_it->second));
        }
        if (c.op == Op::DecodeUpdateBatched) {
            const int64_t skipped = static_cast<int64_t>(kpool_dump::skipped_completions(c).size());
            EXPECT_EQ(on_cpu.skipped_completions, skipped);
            expect_device_skipped(on_gpu.skipped_completions, skipped);
        }
    }
}

}  // namespace
}  // namespace kpool_test
