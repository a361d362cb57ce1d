// The GPU on streams of the caller's: GpuWarmUp (kpool_cuda_warm_up, the
// images it loaded, then a first call captured in a graph), GpuGraph (calls captured on a non-default
// stream into a CUDA graph, replayed on fresh inputs), GpuThreads (threads
// with a stream each, mixed ops on their own buffers).
#include <atomic>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

// ---------------------------------------------------------------------------
// Warm-up, and CUDA graphs: capture on a non-default stream, replay on fresh
// inputs
// ---------------------------------------------------------------------------

// The warm-up runs every variant of the build (each through a C API call
// that must succeed), once per process; afterwards a call captured on a
// fresh stream as the first call of its variant in a graph replays.
class GpuWarmUp : public GpuTest {};

TEST_F(GpuWarmUp, RunsEveryVariantOnceThenGraphsCapture) {
    cu::Stream stream;
    const kpool_exec exec = stream.exec();
    kpool_status st{};
    ASSERT_KPOOL_OK(kpool_cuda_warm_up(0, &exec, &st), st);
    ASSERT_KPOOL_OK(kpool_cuda_warm_up(0, nullptr, &st), st);  // at once: already warm
    // Every module loaded, as the build's SASS or JIT-compiled from its PTX
    // (kpool version prints which; in a KPOOL_MEASUREMENT_HOOKS build,
    // $KPOOL_CUDA_IMAGE=ptx: the PTX alone).
    kpool_cuda_images images{};
    ASSERT_KPOOL_OK(kpool_cuda_loaded_images(0, &images, &st), st);
    EXPECT_GT(images.sass_modules + images.ptx_jit_modules, 0) << images.family;
#ifdef KPOOL_MEASUREMENT_HOOKS
    const char *image = std::getenv("KPOOL_CUDA_IMAGE");
    const bool ptx_forced = image != nullptr && std::string(image) == "ptx";
#else
    const bool ptx_forced = false;  // the library reads no $KPOOL_CUDA_IMAGE
#endif
    if (ptx_forced) {
        EXPECT_EQ(0, images.sass_modules) << images.family;
    } else if (images.sass_fits) {  // every module finds its SASS: no JIT
        EXPECT_EQ(0, images.ptx_jit_modules) << images.family;
        EXPECT_GT(images.sass_modules, 0) << images.family;
    } else {  // the driver JIT-compiles the PTX (an older family on a newer GPU)
        EXPECT_EQ(0, images.sass_modules) << images.family;
    }
    std::mt19937 rng(77);
    const int64_t rows = 5;
    Mirrored q(gpu(), make_fwht_q(rng, rows)), codes(gpu(), HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD})),
        scale(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {rows, 1}));
    gpu().synchronize();
    cu::Graph graph;
    graph.begin_capture(stream);
    const kpool_status_code rc = kpool_fwht128_quant_fp8(q.on(Side::Gpu), codes.on(Side::Gpu), scale.on(Side::Gpu),
                                                         &exec, &st);
    graph.end_capture(stream);
    ASSERT_KPOOL_OK(rc, st);
    graph.instantiate();
    graph.launch(stream);
    codes.download_async(stream);
    scale.download_async(stream);
    stream.synchronize();
    const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
    ASSERT_KPOOL_OK(kpool_fwht128_quant_fp8(q.on(Side::Cpu), codes.on(Side::Cpu), scale.on(Side::Cpu), &cpu_exec, &st),
                    st);
    EXPECT_TRUE(codes.matches_cpu("q_fp8"));
    EXPECT_TRUE(scale.matches_cpu("q_scale"));
}

class GpuGraph : public GpuTest {
protected:
    // Warm-up call (loads the kernels: CUDA graphs capture launches, not
    // module loads), capture, a check that capturing ran nothing, then three
    // replays on fresh inputs against the CPU.
    void capture_and_replay(const Call &call, StreamCall &t,
                            const std::function<void(std::mt19937 &)> &refresh, std::mt19937 &rng) {
        cu::Stream stream;
        const kpool_exec exec = stream.exec();
        const kpool_exec cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
        // Settle the initial synchronous uploads made on the legacy stream.
        gpu().synchronize();
        {
            SCOPED_TRACE("warm-up call on the stream");
            refresh(rng);
            upload_all(t.inputs, stream);
            kpool_status gs{}, cs{};
            ASSERT_KPOOL_OK(call(Side::Gpu, &exec, &gs), gs);
            download_all(t.outputs, stream);
            stream.synchronize();
            ASSERT_KPOOL_OK(call(Side::Cpu, &cpu_exec, &cs), cs);
            for (const auto &[name, m] : t.outputs) ASSERT_TRUE(m->matches_cpu(name));
        }
        // Inputs for the capture: the capture must read and write nothing.
        refresh(rng);
        upload_all(t.inputs, stream);
        stream.synchronize();
        std::vector<std::vector<uint8_t>> before;
        for (const auto &entry : t.outputs) before.push_back(entry.second->gpu_host());
        cu::Graph graph;
        graph.begin_capture(stream);
        kpool_status capture_status{};
        const kpool_status_code capture_rc = call(Side::Gpu, &exec, &capture_status);
        try {
            graph.end_capture(stream);
        } catch (const std::exception &e) {
            FAIL() << e.what() << " (the captured call returned " << kpool_status_name(capture_rc) << ": "
                   << capture_status.message << ")";
        }
        ASSERT_KPOOL_OK(capture_rc, capture_status);
        graph.instantiate();
        download_all(t.outputs, stream);
        stream.synchronize();
        for (size_t i = 0; i < t.outputs.size(); ++i) {
            ASSERT_TRUE(same_bytes(std::string(t.outputs[i].first) + " after capture (nothing may run)",
                                   before[i], t.outputs[i].second->gpu_host()));
        }
        for (int replay = 0; replay < 3; ++replay) {
            SCOPED_TRACE("replay " + std::to_string(replay));
            refresh(rng);
            upload_all(t.inputs, stream);
            graph.launch(stream);
            download_all(t.outputs, stream);
            stream.synchronize();
            kpool_status cs{};
            ASSERT_KPOOL_OK(call(Side::Cpu, &cpu_exec, &cs), cs);
            for (const auto &[name, m] : t.outputs) EXPECT_TRUE(m->matches_cpu(name));
        }
    }
};

TEST_F(GpuGraph, DecodeReplaysOnFreshInputs) {
    const int P = 8;
    const int64_t ring = 2 * P, B = 4, N = 3, tail_blocks = 8, block_size = 16, num_blocks = 8;
    std::mt19937 rng(11);
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng, 1.5f);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true))),
        tail(gpu(), tail0);
    DecodeInputs shape = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
    Mirrored tsm(gpu(), shape.tail_slot_mapping), key(gpu(), shape.key), score(gpu(), shape.slot_score),
        ape(gpu(), shape.ape), sm(gpu(), shape.slot_mapping), pos(gpu(), shape.positions);
    StreamCall t{{&tsm, &key, &score, &ape, &sm, &pos}, {{"kv_cache", &cache}, {"tail_kv_cache", &tail}}};
    auto refresh = [&](std::mt19937 &r) {
        DecodeInputs in = make_decode_inputs(r, B, N, P, ring, tail_blocks, num_blocks * block_size);
        tsm.assign(in.tail_slot_mapping), key.assign(in.key), score.assign(in.slot_score), ape.assign(in.ape),
            sm.assign(in.slot_mapping), pos.assign(in.positions);
    };
    // With index_errors: the index checks are captured too (and, the
    // inputs being valid, mark nothing).
    IndexWords words(gpu());
    capture_and_replay(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            kpool_exec checked = *ex;
            checked.index_errors = words.data();
            return kpool_decode_update_and_maybe_write_cache_batched(cache.on(s), tail.on(s), tsm.on(s),
                                                                     key.on(s), score.on(s), ape.on(s),
                                                                     sm.on(s), pos.on(s), P, kD, 1, &checked, st);
        },
        t, refresh, rng);
    EXPECT_EQ(words.read(), std::vector<int32_t>(KPOOL_INDEX_ARGS, 0));
}

TEST_F(GpuGraph, CompressReplaysOnFreshInputs) {
    const int P = 16;
    const int64_t n = 20, block_size = 64, num_blocks = 3;
    std::mt19937 rng(12);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, false)));
    CompressInputs shape = make_compress_inputs(rng, n, P, KPOOL_DTYPE_FLOAT32, num_blocks * block_size);
    Mirrored k(gpu(), shape.slot_k), score(gpu(), shape.slot_score), ape(gpu(), shape.ape),
        loc(gpu(), shape.loc), ck(gpu(), HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {n, kD})),
        cs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {n}));
    StreamCall t{{&k, &score, &ape, &loc},
                 {{"kv_cache", &cache}, {"compressed_k", &ck}, {"compressed_scale", &cs}}};
    auto refresh = [&](std::mt19937 &r) {
        CompressInputs in = make_compress_inputs(r, n, P, KPOOL_DTYPE_FLOAT32, num_blocks * block_size);
        k.assign(in.slot_k), score.assign(in.slot_score), ape.assign(in.ape), loc.assign(in.loc);
    };
    capture_and_replay(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(cache.on(s), k.on(s), score.on(s), ape.on(s), loc.on(s),
                                                  nullptr, ck.on(s), cs.on(s), P, kD, 1, 1, ex, st);
        },
        t, refresh, rng);
}

// ---------------------------------------------------------------------------
// Two threads, a stream each, mixed ops
// ---------------------------------------------------------------------------

// One thread's engine: a kv cache and a tail ring shared by its seed,
// compress and decode calls, plus expand / fwht buffers; every call's
// outputs are compared with the same call on the CPU right after it.
class ThreadEngine {
public:
    ThreadEngine(Device &gpu, int P, uint32_t seed) : gpu_(gpu), P_(P), rng_(seed), ring_(2 * P) {
        HostTensor tail0 = make_tail_cache(kTailBlocks, ring_, true);
        fill_normal(tail0, rng_, 1.0f);
        cache_ = std::make_unique<Mirrored>(
            gpu_, random_bytes_like(rng_, make_kv_cache(kBlocks, kBlockSize, true)));
        tail_ = std::make_unique<Mirrored>(gpu_, tail0);
        // Shapes are fixed per engine: every later step refills these buffers.
        CompressInputs c = make_compress_inputs(rng_, kPools, P_, KPOOL_DTYPE_BFLOAT16, slots());
        slot_k_ = mirror(c.slot_k), slot_score_ = mirror(c.slot_score), ape_ = mirror(c.ape),
        loc_ = mirror(c.loc);
        ck_ = mirror(HostTensor(KPOOL_DTYPE_UINT8, {kPools, kD}));
        cs_ = mirror(HostTensor(KPOOL_DTYPE_FLOAT32, {kPools}));
        SeedInputs s = make_seed_inputs(rng_, P_, ring_, KPOOL_DTYPE_INT64, kTailBlocks);
        seed_key_ = mirror(s.key), seed_gate_ = mirror(s.gate_score), tslot_ = mirror(s.tslot);
        DecodeInputs d = make_decode_inputs(rng_, kB, kN, P_, ring_, kTailBlocks, slots());
        tsm_ = mirror(d.tail_slot_mapping), dkey_ = mirror(d.key), dscore_ = mirror(d.slot_score);
        dape_ = mirror(d.ape), sm_ = mirror(d.slot_mapping), pos_ = mirror(d.positions);
        GroupInputs g = make_group_inputs(rng_, P_, KPOOL_DTYPE_INT32, kRows, kGroups);
        TokenMapInputs tm = make_token_map(rng_, TokenMap::kPageTable, kRows, 500);
        gids_ = mirror(g.ids), gvalid_ = mirror(g.valid), table_ = mirror(tm.page_table);
        tokens_ = mirror(HostTensor(KPOOL_DTYPE_INT32, {kRows, kGroups * P_}));
        AppendInputs a = make_append_inputs(rng_, P_, kRows, kGroups * P_);
        seq_ = mirror(a.seq_lens), pools_ = mirror(a.pool_lens);
        appended_ = mirror(HostTensor(KPOOL_DTYPE_INT32, {kRows, kGroups * P_ + P_ - 1}));
        q_ = mirror(make_fwht_q(rng_, kRows));
        q_fp8_ = mirror(HostTensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {kRows, kD}));
        q_scale_ = mirror(HostTensor(KPOOL_DTYPE_FLOAT32, {kRows, 1}));
    }

    // Runs `iterations` steps on `stream`, the op mix starting at `first`;
    // returns the first failure, or "".
    std::string run(const cu::Stream &stream, int iterations, int first) {
        for (int i = first; i < first + iterations; ++i) {
            const std::string failure = step(stream, i);
            if (!failure.empty())
                return "P = " + std::to_string(P_) + ", step " + std::to_string(i) + ": " + failure;
        }
        return "";
    }

private:
    static constexpr int64_t kBlocks = 8, kBlockSize = 16, kTailBlocks = 8, kPools = 12, kB = 3, kN = 4,
                             kRows = 9, kGroups = 6;
    int64_t slots() const { return kBlocks * kBlockSize; }
    MirroredPtr mirror(const HostTensor &t) { return std::make_unique<Mirrored>(gpu_, t); }

    std::string step(const cu::Stream &stream, int i) {
        std::vector<Mirrored *> inputs;
        std::vector<std::pair<const char *, Mirrored *>> outputs;
        Call call;
        const int P = P_;
        switch (i % 4) {
            case 0: {  // compress: write the cache and return the rows
                CompressInputs c = make_compress_inputs(rng_, kPools, P, KPOOL_DTYPE_BFLOAT16, slots());
                slot_k_->assign(c.slot_k), slot_score_->assign(c.slot_score), ape_->assign(c.ape),
                    loc_->assign(c.loc);
                inputs = {slot_k_.get(), slot_score_.get(), ape_.get(), loc_.get()};
                outputs = {
                    {"kv_cache", cache_.get()}, {"compressed_k", ck_.get()}, {"compressed_scale", cs_.get()}};
                call = [this, P](Side s, const kpool_exec *ex, kpool_status *st) {
                    return kpool_compress_and_write_cache(cache_->on(s), slot_k_->on(s), slot_score_->on(s),
                                                          ape_->on(s), loc_->on(s), nullptr, ck_->on(s),
                                                          cs_->on(s), P, kD, 1, 1, ex, st);
                };
                break;
            }
            case 1: {  // seed the tail ring
                SeedInputs s = make_seed_inputs(rng_, P, ring_, KPOOL_DTYPE_INT64, kTailBlocks);
                seed_key_->assign(s.key), seed_gate_->assign(s.gate_score), tslot_->assign(s.tslot);
                inputs = {seed_key_.get(), seed_gate_.get(), tslot_.get()};
                outputs = {{"tail_kv_cache", tail_.get()}};
                call = [this, P](Side s, const kpool_exec *ex, kpool_status *st) {
                    return kpool_seed_tail_cache(tail_->on(s), seed_key_->on(s), seed_gate_->on(s),
                                                 tslot_->on(s), P, kD, ex, st);
                };
                break;
            }
            case 2: {  // decode on the same caches
                DecodeInputs d = make_decode_inputs(rng_, kB, kN, P, ring_, kTailBlocks, slots());
                tsm_->assign(d.tail_slot_mapping), dkey_->assign(d.key), dscore_->assign(d.slot_score),
                    dape_->assign(d.ape), sm_->assign(d.slot_mapping), pos_->assign(d.positions);
                inputs = {tsm_.get(), dkey_.get(), dscore_.get(), dape_.get(), sm_.get(), pos_.get()};
                outputs = {{"kv_cache", cache_.get()}, {"tail_kv_cache", tail_.get()}};
                const int round_scale = round_scale_;
                round_scale_ ^= 1;
                call = [this, P, round_scale](Side s, const kpool_exec *ex, kpool_status *st) {
                    return kpool_decode_update_and_maybe_write_cache_batched(
                        cache_->on(s), tail_->on(s), tsm_->on(s), dkey_->on(s), dscore_->on(s), dape_->on(s),
                        sm_->on(s), pos_->on(s), P, kD, round_scale, ex, st);
                };
                break;
            }
            default: {  // fwht, then expand to tokens, then append the tail
                GroupInputs g = make_group_inputs(rng_, P, KPOOL_DTYPE_INT32, kRows, kGroups);
                AppendInputs a = make_append_inputs(rng_, P, kRows, kGroups * P);
                q_->assign(make_fwht_q(rng_, kRows));
                gids_->assign(g.ids), gvalid_->assign(g.valid), seq_->assign(a.seq_lens),
                    pools_->assign(a.pool_lens);
                inputs = {q_.get(), gids_.get(), gvalid_.get(), seq_.get(), pools_.get()};
                outputs = {{"q_fp8", q_fp8_.get()},
                           {"q_scale", q_scale_.get()},
                           {"tokens", tokens_.get()},
                           {"appended", appended_.get()}};
                call = [this, P](Side s, const kpool_exec *ex, kpool_status *st) {
                    kpool_status_code rc =
                        kpool_fwht128_quant_fp8(q_->on(s), q_fp8_->on(s), q_scale_->on(s), ex, st);
                    if (rc != KPOOL_OK) return rc;
                    rc = kpool_expand_pools_to_tokens(gids_->on(s), gvalid_->on(s), table_->on(s), nullptr,
                                                      tokens_->on(s), static_cast<int32_t>(kGroups * P), P,
                                                      ex, st);
                    if (rc != KPOOL_OK) return rc;
                    // Reads the tokens the previous call wrote, in stream order.
                    return kpool_append_tail_to_topk(tokens_->on(s), seq_->on(s), pools_->on(s),
                                                     table_->on(s), nullptr, appended_->on(s), P, ex, st);
                };
                break;
            }
        }
        const kpool_exec gpu_exec = stream.exec(), cpu_exec{nullptr, KPOOL_ARITHMETIC_EXACT};
        upload_all(inputs, stream);
        kpool_status gs{}, cs{};
        const kpool_status_code grc = call(Side::Gpu, &gpu_exec, &gs);
        download_all(outputs, stream);
        stream.synchronize();
        std::string failure = call_failure("GPU", grc, gs);
        if (!failure.empty()) return failure;
        failure = call_failure("CPU", call(Side::Cpu, &cpu_exec, &cs), cs);
        if (!failure.empty()) return failure;
        for (const auto &[name, m] : outputs) {
            const ::testing::AssertionResult same = m->matches_cpu(name);
            if (!same) return same.message();
        }
        return "";
    }

    Device &gpu_;
    const int P_;
    std::mt19937 rng_;
    const int64_t ring_;
    int round_scale_ = 1;
    MirroredPtr cache_, tail_, slot_k_, slot_score_, ape_, loc_, ck_, cs_, seed_key_, seed_gate_, tslot_,
        tsm_, dkey_, dscore_, dape_, sm_, pos_, gids_, gvalid_, table_, tokens_, seq_, pools_, appended_, q_,
        q_fp8_, q_scale_;
};

class GpuThreads : public GpuTest {
protected:
    // `threads` threads, one stream each, `iterations` mixed ops each on their
    // own buffers (pool sizes cycling through `pool_sizes`), every result
    // checked against the CPU.
    void run_streams(int threads, int iterations, const std::vector<int> &pool_sizes) {
        std::vector<std::string> failures(threads);
        std::atomic<int> ready{0};
        auto worker = [&](int id) {
            try {
                gpu().make_current();
                ThreadEngine engine(gpu(), pool_sizes[id % pool_sizes.size()], 500 + id);
                cu::Stream stream;
                // Settle the engine's synchronous initial uploads (legacy stream).
                cu::check(cu::driver().cuStreamSynchronize(nullptr), "cuStreamSynchronize(legacy)");
                // Start together, so the streams' work overlaps.
                ready.fetch_add(1);
                while (ready.load() < threads) std::this_thread::yield();
                failures[id] = engine.run(stream, iterations, id);  // different ops at a time
            } catch (const std::exception &e) {
                ready.fetch_add(threads);  // never leave the others waiting
                failures[id] = std::string("exception: ") + e.what();
            }
        };
        std::vector<std::thread> pool;
        for (int id = 0; id < threads; ++id) pool.emplace_back(worker, id);
        for (std::thread &t : pool) t.join();
        for (int id = 0; id < threads; ++id) {
            EXPECT_TRUE(failures[id].empty()) << "thread " << id << ": " << failures[id];
        }
    }
};

TEST_F(GpuThreads, TwoStreamsMixedOpsMatchCpu) { run_streams(2, 50, {4, 16}); }

// Stress: eight threads on eight streams, 200 mixed ops each (1600 calls),
// every pool size built for CUDA.
TEST_F(GpuThreads, EightStreamsStressMatchesCpu) { run_streams(8, 200, {4, 8, 16}); }

}  // namespace
}  // namespace kpool_test
