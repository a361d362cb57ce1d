// What the GPU tests (tests/test_gpu_*.cpp) share: the GPU or why there is
// none, tensors mirrored on the CPU and the GPU, a call made on both sides
// and compared byte for byte, and engine-shaped inputs.
//
// The CUDA kernel variants are checked against the CPU ones, bit for bit.
// Every GPU test is in a Gpu* suite and skips (GTEST_SKIP, "no CUDA device:
// ...") when this build has no CUDA kernels or the machine has no CUDA driver
// or device, so `kpool_tests --gtest_filter='Gpu*'` runs them alone.
//
//   test_gpu_dump.cpp      GpuDump: every case of tests/data/dump_seed0 on the
//                          GPU, against the dump (decode: SPEC's
//                          reference-defect ranges keep their input bytes) and
//                          against the same call on the CPU.
//   test_gpu_fwht.cpp      GpuFwht
//   test_gpu_compress.cpp  GpuCompress, GpuTritonArithmetic
//   test_gpu_seed.cpp      GpuSeed
//   test_gpu_decode.cpp    GpuDecode, GpuDecodeManyRequests,
//                          GpuDecodeSharedTailBlock, GpuDecodeByBlock (the
//                          block-per-request layout forced)
//   test_gpu_expand.cpp    GpuExpandAndAppend, GpuExpandToTokens, GpuAppendTail,
//                          GpuExpandManyRows
//                          engine-shaped random inputs for every op and the
//                          axes an engine varies (pool sizes 4, 8, 16, the
//                          engines' own; decode runs as one kernel for
//                          every next_n); *Many*: 70000 requests / rows,
//                          past grid y's 65535.
//   test_gpu_engine_sequences.cpp
//                          GpuPrefillInsert, GpuRaggedDecode: the entry points
//                          on the engine's token layouts, against the CPU and
//                          against the engine's own sequences on the GPU.
//   test_gpu_streams.cpp   GpuWarmUp: kpool_cuda_warm_up, then a first call
//                          captured in a graph. GpuGraph: a decode and a
//                          compress call captured on a non-default stream into
//                          a CUDA graph, replayed on fresh inputs. GpuThreads:
//                          two threads (and, as a stress, eight), one stream
//                          each, mixed ops on their own buffers.
//   test_gpu_edge_inputs.cpp
//                          GpuEmpty: empty batches write nothing. GpuBadIndex:
//                          out-of-range indices in device tensors: the call
//                          succeeds, the bad entries write nothing, and
//                          exec->index_errors marks the argument
//                          (kpool_check_index_errors names it).
//                          GpuMixedDevices: a call with tensors on two devices
//                          is rejected, naming one.
//   test_gpu_nonfinite.cpp GpuNonFinite*: rows with NaN, infinities and
//                          overflowing sums, exact against the CPU byte for
//                          byte, Triton on the rows the NaN rules fix.
//   test_gpu_fuzz_replay.cpp
//                          GpuFuzzReplay: every committed fuzz input through
//                          device memory, checked as the fuzz targets check.
//
// Device memory, streams and graphs come from the test-support library
// (support/device.h, support/cuda_driver.h: the driver is loaded at run time,
// so the suite builds without a CUDA toolkit).
#ifndef KPOOL_TESTS_GPU_FIXTURES_H
#define KPOOL_TESTS_GPU_FIXTURES_H

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/cuda_driver.h"
#include "support/device.h"
#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {

using kpool_support::Device;
using kpool_support::DeviceBuffer;
namespace cu = kpool_support::cuda;

// The pool sizes with a CUDA compress / decode variant (KPOOL_CUDA_POOL_SIZES):
// every one of the contract, 1 to 64 (PoolSizes checks the build's table).
inline constexpr int kGpuPoolSizes[] = {KPOOL_CUDA_POOL_SIZE_LIST};
// Those with a block-per-request decode kernel (KPOOL_CUDA_BLOCK_POOL_SIZES:
// a layout the runtime takes only when forced, not part of the contract).
inline constexpr int kGpuBlockPoolSizes[] = {KPOOL_CUDA_BLOCK_POOL_SIZE_LIST};
// The expand ops take P at run time, specialized for those on CUDA.
inline constexpr int kGpuExpandPoolSizes[] = {1, 2, 4, 8, 16, 32, 64};

// ---------------------------------------------------------------------------
// The GPU, or why not
// ---------------------------------------------------------------------------

struct GpuEnv {
    std::unique_ptr<Device> device;  // null: no GPU here
    std::string why;
};

// cuda:0, opened once per process and never closed: device memory and the
// context outlive every test.
const GpuEnv &gpu_env();

// Skips without a GPU; makes its context current on the test's thread.
class GpuTest : public ::testing::Test {
protected:
    void SetUp() override;
    Device &gpu() { return *gpu_; }

private:
    Device *gpu_ = nullptr;
};

template <typename Param>
class GpuParamTest : public GpuTest, public ::testing::WithParamInterface<Param> {};

// ---------------------------------------------------------------------------
// One tensor on both sides
// ---------------------------------------------------------------------------

enum class Side { Cpu, Gpu };

// `what`'s bytes against the expected ones: how many differ, and the first.
::testing::AssertionResult same_bytes(const std::string &what, const std::vector<uint8_t> &expected,
                                      const std::vector<uint8_t> &got);

// "<what>: KPOOL_ERROR_...: <message>", or "" when the call succeeded.
std::string call_failure(const std::string &what, kpool_status_code rc, const kpool_status &st);

// A tensor of a call made on both devices: the CPU call's host tensor, and
// a device copy with the same layout (strides, padding, slack) whose bytes
// come back into gpu_host(). Both start as the same bytes.
class Mirrored {
public:
    Mirrored(Device &gpu, const HostTensor &t);
    Mirrored(const Mirrored &) = delete;
    Mirrored &operator=(const Mirrored &) = delete;

    const kpool_tensor *on(Side s) const { return s == Side::Cpu ? &cpu_desc_ : &gpu_desc_; }
    HostTensor &cpu() { return cpu_; }
    const std::vector<uint8_t> &gpu_host() const { return gpu_->host(); }
    int64_t bytes() const { return gpu_->size(); }

    // New contents (same shape) for both sides; upload() or upload_async()
    // moves them to the device.
    void assign(const HostTensor &t);
    // New contents for the CPU side only (what the CPU call is to see).
    void assign_cpu(const HostTensor &t);
    // Synchronous copies on the legacy default stream.
    void upload() { gpu_->upload(); }
    void download() { gpu_->download(); }
    // Copies ordered on `stream`; the host bytes must stay put until it syncs.
    void upload_async(const cu::Stream &stream);
    void download_async(const cu::Stream &stream);

    // The GPU's bytes (as last downloaded) against the CPU call's.
    ::testing::AssertionResult matches_cpu(const std::string &name) const {
        return same_bytes(name + " (GPU vs CPU)", cpu_.bytes(), gpu_->host());
    }

private:
    HostTensor cpu_;
    std::unique_ptr<DeviceBuffer> gpu_;
    kpool_tensor cpu_desc_{}, gpu_desc_{};
};

using MirroredPtr = std::unique_ptr<Mirrored>;

// One op call, made on the side asked for.
using Call = std::function<kpool_status_code(Side, const kpool_exec *, kpool_status *)>;

// Runs `call` on the CPU, then on the GPU (legacy default stream), and
// compares the named outputs byte for byte. Returns the GPU status.
kpool_status run_both(const Call &call, const std::vector<std::pair<const char *, Mirrored *>> &outputs);

// The count a device decode reports: -1 (not counted on a device), or the
// CPU's count should the runtime ever count there.
void expect_device_skipped(int64_t gpu, int64_t cpu);

// ---------------------------------------------------------------------------
// Engine-shaped inputs (as test_ops builds them)
// ---------------------------------------------------------------------------

HostTensor random_bytes_like(std::mt19937 &rng, HostTensor t);

// q [rows, 128] bf16, its first rows at the edges of the scale (zero, tiny,
// huge).
HostTensor make_fwht_q(std::mt19937 &rng, int64_t rows);

// A compress call's tensors on both sides: a paged cache of random bytes
// (cache0: its bytes before any call) and engine-shaped inputs for n pools.
// The returned rows, where a test asks for them, are its own.
struct CompressCase {
    CompressCase(Device &gpu, std::mt19937 &rng, int64_t n, int P, kpool_dtype score_dtype, int64_t num_blocks,
                 int64_t block_size, bool padded);
    const HostTensor cache0;
    const CompressInputs in;
    Mirrored cache, slot_k, slot_score, ape, loc, write_mask;
};

// A decode call's tensors on both sides: a paged cache of random bytes, a
// tail ring of earlier steps' stashes (finite bf16), and engine-shaped inputs
// for B requests of N tokens; cache0 and tail0 are their bytes before any call.
struct DecodeCase {
    DecodeCase(Device &gpu, std::mt19937 &rng, int64_t B, int64_t N, int P, int64_t ring, int64_t tail_blocks,
               int64_t num_blocks, int64_t block_size, bool padded);
    // The same with inputs of the test's own.
    DecodeCase(Device &gpu, std::mt19937 &rng, DecodeInputs inputs, int64_t ring, int64_t tail_blocks,
               int64_t num_blocks, int64_t block_size, bool padded);
    // kpool_decode_update_and_maybe_write_cache_batched on side `s`.
    kpool_status_code call(Side s, int P, bool round_scale, const kpool_exec *exec, kpool_status *status) const;

    const HostTensor cache0, tail0;
    const DecodeInputs in;
    Mirrored cache, tail, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions;
};

struct ExpandInputs {
    HostTensor pool_ids, seq_lens;
};

ExpandInputs make_expand_inputs(std::mt19937 &rng, int P, kpool_dtype ids_dtype, int64_t rows, int64_t G);

struct AppendInputs {
    HostTensor topk, seq_lens, pool_lens;
};

AppendInputs make_append_inputs(std::mt19937 &rng, int P, int64_t rows, int64_t C);

// ---------------------------------------------------------------------------
// Calls on a stream, index error words
// ---------------------------------------------------------------------------

// The tensors of one call on a stream. Each step: the inputs get fresh
// contents and go up on the stream; after the call the outputs come back on
// it; the caches stay on the device between steps (as an engine's do) and
// the CPU copies follow the same sequence of calls.
struct StreamCall {
    std::vector<Mirrored *> inputs;                            // refreshed every step
    std::vector<std::pair<const char *, Mirrored *>> outputs;  // downloaded every step
};

void upload_all(const std::vector<Mirrored *> &ts, const cu::Stream &s);
void download_all(const std::vector<std::pair<const char *, Mirrored *>> &ts, const cu::Stream &s);

// KPOOL_INDEX_ARGS zeroed words of device memory for exec->index_errors.
class IndexWords {
public:
    explicit IndexWords(Device &gpu) : words_(gpu, std::vector<uint8_t>(4 * KPOOL_INDEX_ARGS, 0)) {}
    int32_t *data() const {
        return static_cast<int32_t *>(words_.contiguous(KPOOL_DTYPE_INT32, {KPOOL_INDEX_ARGS}).data);
    }
    kpool_exec exec(void *stream = nullptr) const { return kpool_exec{stream, KPOOL_ARITHMETIC_EXACT, data()}; }
    // The words as the device holds them (synchronous, legacy stream).
    std::vector<int32_t> read();
    // kpool_check_index_errors reports exactly `marked` (none: OK), naming
    // each, and zeroes the words: a second check finds none.
    void expect_check_reports(std::vector<std::string> marked);

private:
    DeviceBuffer words_;
};

// Words with only `arg`'s set.
std::vector<int32_t> marked_only(kpool_index_arg arg);

}  // namespace kpool_test

#endif  // KPOOL_TESTS_GPU_FIXTURES_H
