#include "gpu_fixtures.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

namespace kpool_test {

// ---------------------------------------------------------------------------
// The GPU, or why not
// ---------------------------------------------------------------------------

const GpuEnv &gpu_env() {
    // Never destroyed: device memory and the context outlive every test.
    static const GpuEnv *env = [] {
        auto *e = new GpuEnv;
        if (!kpool_support::library_has_cuda()) {
            e->why = std::string("this build has no CUDA kernels (") + kpool_version() + ")";
            return e;
        }
        e->device = kpool_support::open_cuda_device(0, &e->why);
        if (!e->device) return e;
        // A GPU kpool has no kernels for (compute capability below 8.0) is
        // "no device" too; any other failure is left to fail the tests.
        {
            DeviceBuffer probe(*e->device, std::vector<uint8_t>(64, 0));
            const kpool_tensor ids = probe.contiguous(KPOOL_DTYPE_INT32, {0, 1});
            const kpool_tensor seq = probe.contiguous(KPOOL_DTYPE_INT32, {0});
            const kpool_tensor out = probe.contiguous(KPOOL_DTYPE_INT32, {0, 7});
            kpool_status st{};
            const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
            if (kpool_expand_pools_and_append_tail(&ids, &seq, &out, 4, 0, &ex, &st) ==
                KPOOL_ERROR_UNSUPPORTED) {
                e->why = std::string("kpool cannot use ") + e->device->name() + ": " + st.message;
            }
        }
        if (!e->why.empty()) {
            e->device.reset();
            return e;
        }
        std::printf("[ GPU      ] %s on %s\n", kpool_version(), e->device->name().c_str());
        return e;
    }();
    return *env;
}

void GpuTest::SetUp() {
    const GpuEnv &env = gpu_env();
    if (!env.device) GTEST_SKIP() << "no CUDA device: " << env.why;
    gpu_ = env.device.get();
    gpu_->make_current();
}

// ---------------------------------------------------------------------------
// One tensor on both sides
// ---------------------------------------------------------------------------

::testing::AssertionResult same_bytes(const std::string &what, const std::vector<uint8_t> &expected,
                                      const std::vector<uint8_t> &got) {
    return BytesEqual("the expected bytes", what.c_str(), expected, got);
}

std::string call_failure(const std::string &what, kpool_status_code rc, const kpool_status &st) {
    if (rc == KPOOL_OK && st.code == KPOOL_OK) return "";
    return what + ": " + kpool_status_name(rc) + ": " + st.message;
}

Mirrored::Mirrored(Device &gpu, const HostTensor &t)
    : cpu_(t), gpu_(std::make_unique<DeviceBuffer>(gpu, t.bytes())) {
    cpu_desc_ = cpu_.desc();
    kpool_tensor view = t.desc();
    view.data = gpu_->host().data();
    gpu_desc_ = gpu_->on_device(view);
}

void Mirrored::assign(const HostTensor &t) {
    if (t.bytes().size() != cpu_.bytes().size()) {
        throw std::logic_error("Mirrored::assign: " + std::to_string(t.bytes().size()) +
                               " bytes into a tensor of " + std::to_string(cpu_.bytes().size()));
    }
    std::copy(t.bytes().begin(), t.bytes().end(), cpu_.bytes().begin());
    std::copy(t.bytes().begin(), t.bytes().end(), gpu_->host().begin());
}

void Mirrored::assign_cpu(const HostTensor &t) {
    if (t.bytes().size() != cpu_.bytes().size()) throw std::logic_error("Mirrored::assign_cpu: size differs");
    std::copy(t.bytes().begin(), t.bytes().end(), cpu_.bytes().begin());
}

void Mirrored::upload_async(const cu::Stream &stream) {
    cu::check(cu::driver().cuMemcpyHtoDAsync(cu::device_pointer(gpu_desc_.data), gpu_->host().data(),
                                             static_cast<size_t>(bytes()), stream.get()),
              "cuMemcpyHtoDAsync");
}

void Mirrored::download_async(const cu::Stream &stream) {
    cu::check(cu::driver().cuMemcpyDtoHAsync(gpu_->host().data(), cu::device_pointer(gpu_desc_.data),
                                             static_cast<size_t>(bytes()), stream.get()),
              "cuMemcpyDtoHAsync");
}

kpool_status run_both(const Call &call, const std::vector<std::pair<const char *, Mirrored *>> &outputs) {
    kpool_status cpu_status{}, gpu_status{};
    const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT}, gpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
    const kpool_status_code cpu_rc = call(Side::Cpu, &cpu_exec, &cpu_status);
    EXPECT_EQ(cpu_rc, KPOOL_OK) << "CPU: " << kpool_status_name(cpu_rc) << ": " << cpu_status.message;
    const kpool_status_code gpu_rc = call(Side::Gpu, &gpu_exec, &gpu_status);
    EXPECT_EQ(gpu_rc, KPOOL_OK) << "GPU: " << kpool_status_name(gpu_rc) << ": " << gpu_status.message;
    if (cpu_rc != KPOOL_OK || gpu_rc != KPOOL_OK) return gpu_status;
    for (const auto &[name, m] : outputs) {
        m->download();
        EXPECT_TRUE(m->matches_cpu(name));
    }
    return gpu_status;
}

void expect_device_skipped(int64_t gpu, int64_t cpu) {
    EXPECT_TRUE(gpu == -1 || gpu == cpu) << "GPU skipped_completions = " << gpu << ", CPU " << cpu;
}

// ---------------------------------------------------------------------------
// Engine-shaped inputs
// ---------------------------------------------------------------------------

HostTensor random_bytes_like(std::mt19937 &rng, HostTensor t) {
    t.fill_random_bytes(rng);
    return t;
}

HostTensor make_fwht_q(std::mt19937 &rng, int64_t rows) {
    HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
    fill_normal(q, rng, 2.0f);
    const float edge_sigma[] = {0.0f, 1e-7f, 1e30f, 1e-30f};
    for (int64_t r = 0; r < rows && r < 4; ++r) {
        for (int d = 0; d < kD; ++d) q.set<uint16_t>({r, d}, random_bf16(rng, edge_sigma[r]));
    }
    return q;
}

CompressCase::CompressCase(Device &gpu, std::mt19937 &rng, int64_t n, int P, kpool_dtype score_dtype,
                           int64_t num_blocks, int64_t block_size, bool padded)
    : cache0(random_bytes_like(rng, make_kv_cache(num_blocks, block_size, padded))),
      in(make_compress_inputs(rng, n, P, score_dtype, num_blocks * block_size)),
      cache(gpu, cache0),
      slot_k(gpu, in.slot_k),
      slot_score(gpu, in.slot_score),
      ape(gpu, in.ape),
      loc(gpu, in.loc),
      write_mask(gpu, in.write_mask) {}

namespace {

// Earlier steps' stashes: finite bf16.
HostTensor normal_tail(std::mt19937 &rng, int64_t tail_blocks, int64_t ring, bool padded) {
    HostTensor tail = make_tail_cache(tail_blocks, ring, padded);
    fill_normal(tail, rng, 1.5f);
    return tail;
}

}  // namespace

DecodeCase::DecodeCase(Device &gpu, std::mt19937 &rng, int64_t B, int64_t N, int P, int64_t ring,
                       int64_t tail_blocks, int64_t num_blocks, int64_t block_size, bool padded)
    : DecodeCase(gpu, rng, make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size), ring,
                 tail_blocks, num_blocks, block_size, padded) {}

DecodeCase::DecodeCase(Device &gpu, std::mt19937 &rng, DecodeInputs inputs, int64_t ring, int64_t tail_blocks,
                       int64_t num_blocks, int64_t block_size, bool padded)
    : cache0(random_bytes_like(rng, make_kv_cache(num_blocks, block_size, padded))),
      tail0(normal_tail(rng, tail_blocks, ring, padded)),
      in(std::move(inputs)),
      cache(gpu, cache0),
      tail(gpu, tail0),
      tail_slot_mapping(gpu, in.tail_slot_mapping),
      key(gpu, in.key),
      slot_score(gpu, in.slot_score),
      ape(gpu, in.ape),
      slot_mapping(gpu, in.slot_mapping),
      positions(gpu, in.positions) {}

kpool_status_code DecodeCase::call(Side s, int P, bool round_scale, const kpool_exec *exec,
                                   kpool_status *status) const {
    return kpool_decode_update_and_maybe_write_cache_batched(
        cache.on(s), tail.on(s), tail_slot_mapping.on(s), key.on(s), slot_score.on(s), ape.on(s),
        slot_mapping.on(s), positions.on(s), P, kD, round_scale, exec, status);
}

ExpandInputs make_expand_inputs(std::mt19937 &rng, int P, kpool_dtype ids_dtype, int64_t rows, int64_t G) {
    ExpandInputs in;
    in.pool_ids = HostTensor(ids_dtype, {rows, G});
    in.seq_lens = HostTensor(KPOOL_DTYPE_INT32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t seq = r == 0   ? 0
                            : r == 1 ? P - 1
                                     : std::uniform_int_distribution<int64_t>(0, 5000)(rng);
        in.seq_lens.set<int32_t>({r}, static_cast<int32_t>(seq));
        for (int64_t g = 0; g < G; ++g) {
            int64_t id = std::uniform_int_distribution<int64_t>(-2, seq / P + 2)(rng);
            if (g % 5 == 3) id = -1;
            if (g == 7) {
                id = ids_dtype == KPOOL_DTYPE_INT32 ? int64_t(std::numeric_limits<int32_t>::min())
                                                    : std::numeric_limits<int64_t>::min();
            }
            in.pool_ids.set_int({r, g}, id);
        }
    }
    return in;
}

AppendInputs make_append_inputs(std::mt19937 &rng, int P, int64_t rows, int64_t C) {
    AppendInputs in;
    in.topk = HostTensor(KPOOL_DTYPE_INT32, {rows, C});
    in.seq_lens = HostTensor(KPOOL_DTYPE_INT32, {rows});
    in.pool_lens = HostTensor(KPOOL_DTYPE_INT32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < C; ++c) {
            in.topk.set<int32_t>({r, c}, std::uniform_int_distribution<int32_t>(-1, 1 << 20)(rng));
        }
        const int32_t seq = r == 0 ? 0 : std::uniform_int_distribution<int32_t>(0, 5000)(rng);
        int32_t pools = seq / P;
        if (r % 7 == 3 && pools > 0) pools -= 1;
        if (r % 7 == 5) pools += 1;
        in.seq_lens.set<int32_t>({r}, seq);
        in.pool_lens.set<int32_t>({r}, pools);
    }
    return in;
}

// ---------------------------------------------------------------------------
// Calls on a stream, index error words
// ---------------------------------------------------------------------------

void upload_all(const std::vector<Mirrored *> &ts, const cu::Stream &s) {
    for (Mirrored *t : ts) t->upload_async(s);
}

void download_all(const std::vector<std::pair<const char *, Mirrored *>> &ts, const cu::Stream &s) {
    for (const auto &entry : ts) entry.second->download_async(s);
}

std::vector<int32_t> IndexWords::read() {
    words_.download();
    std::vector<int32_t> w(KPOOL_INDEX_ARGS);
    std::memcpy(w.data(), words_.host().data(), sizeof(int32_t) * KPOOL_INDEX_ARGS);
    return w;
}

void IndexWords::expect_check_reports(std::vector<std::string> marked) {
    const kpool_exec ex = exec();
    kpool_status st{};
    const kpool_status_code rc = kpool_check_index_errors(0, &ex, &st);
    if (marked.empty()) {
        EXPECT_EQ(rc, KPOOL_OK) << st.message;
    } else {
        EXPECT_EQ(rc, KPOOL_ERROR_OUT_OF_RANGE) << st.message;
        for (const std::string &name : marked) EXPECT_THAT(std::string(st.message), ::testing::HasSubstr(name));
    }
    EXPECT_EQ(read(), std::vector<int32_t>(KPOOL_INDEX_ARGS, 0)) << "the check zeroes the words";
    kpool_status again{};
    EXPECT_EQ(kpool_check_index_errors(0, &ex, &again), KPOOL_OK) << again.message;
}

std::vector<int32_t> marked_only(kpool_index_arg arg) {
    std::vector<int32_t> w(KPOOL_INDEX_ARGS, 0);
    w[arg] = 1;
    return w;
}

}  // namespace kpool_test
