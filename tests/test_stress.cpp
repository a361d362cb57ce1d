// Stress: many threads issuing a random mix of every op at once on the CPU,
// each on its own caches and tail rings (an engine's workers), for a bounded
// number of iterations. Caches carry over from call to call, and after every
// call each thread compares the whole cache / ring / output, padding
// included, with the scalar reference run on its own copy.
//
// KPOOL_STRESS_ITERATIONS overrides the iterations per thread (default 96).
#include <atomic>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

int iterations_per_thread() {
    const char *env = std::getenv("KPOOL_STRESS_ITERATIONS");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 96;
}

// The first difference between two tensors' bytes, or "".
std::string first_difference(const char *what, const HostTensor &want, const HostTensor &got) {
    if (want.bytes().size() != got.bytes().size()) return std::string(what) + ": sizes differ";
    for (size_t b = 0; b < want.bytes().size(); ++b) {
        if (want.bytes()[b] != got.bytes()[b]) {
            std::ostringstream s;
            s << what << " byte " << b << ": reference 0x" << std::hex << int(want.bytes()[b]) << ", kpool 0x"
              << int(got.bytes()[b]);
            return s.str();
        }
    }
    return "";
}

enum Op { kFwht, kCompress, kSeed, kDecode, kExpandAppend, kExpandTokens, kAppendTail, kOps };
const char *const kOpNames[] = {"fwht",        "compress",      "seed",       "decode",
                                "expand_append", "expand_tokens", "append_tail"};

// One engine worker: its own cache and ring, a random op per iteration.
class Worker {
public:
    explicit Worker(int id)
        : id_(id),
          rng_(7000 + id),
          P_(kPoolSizesByWorker[id % 8]),
          ring_(int64_t(P_) * (1 + id % 2)),
          block_size_(id % 3 == 0 ? 64 : 16) {
        cache_ref_ = make_kv_cache(kPages, block_size_, id % 2 == 1);
        cache_ref_.fill_random_bytes(rng_);
        cache_api_ = cache_ref_;
        tail_ref_ = make_tail_cache(kTailBlocks, ring_, id % 2 == 0);
        fill_normal(tail_ref_, rng_, 1.5f);
        tail_api_ = tail_ref_;
    }

    void run(int iterations, const std::atomic<bool> &stop) {
        for (int it = 0; it < iterations && !stop && failure.empty(); ++it) {
            const Op op = Op(rng_() % kOps);
            std::string error;
            switch (op) {
                case kFwht: error = fwht(); break;
                case kCompress: error = compress(); break;
                case kSeed: error = seed(); break;
                case kDecode: error = decode(); break;
                case kExpandAppend: error = expand_append(); break;
                case kExpandTokens: error = expand_tokens(); break;
                case kAppendTail: error = append_tail(); break;
                default: break;
            }
            ++calls[op];
            if (!error.empty()) {
                failure = "worker " + std::to_string(id_) + " (P = " + std::to_string(P_) + "), iteration " +
                          std::to_string(it) + ", " + kOpNames[op] + ": " + error;
            }
        }
    }

    std::string failure;
    int64_t calls[kOps] = {};

private:
    static constexpr int kPoolSizesByWorker[8] = {4, 16, 1, 8, 2, 32, 64, 4};
    static constexpr int64_t kPages = 8, kTailBlocks = 8;

    int64_t slots() const { return kPages * block_size_; }
    int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

    static std::string status_error(kpool_status_code rc, const kpool_status &st) {
        return rc == KPOOL_OK ? "" : std::string(kpool_status_name(rc)) + ": " + st.message;
    }

    std::string fwht() {
        const int64_t rows = uniform(1, 64);
        HostTensor q(KPOOL_DTYPE_BFLOAT16, {rows, kD});
        fill_normal(q, rng_);
        HostTensor fp8_ref(KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD}), scale_ref(KPOOL_DTYPE_FLOAT32, {rows, 1});
        fp8_ref.fill_random_bytes(rng_);
        scale_ref.fill_random_bytes(rng_);
        HostTensor fp8_api = fp8_ref, scale_api = scale_ref;
        const kpool_tensor qd = q.desc(), fr = fp8_ref.desc(), sr = scale_ref.desc(), fa = fp8_api.desc(),
                           sa = scale_api.desc();
        kpool_ref::fwht128_quant_fp8(&qd, &fr, &sr);
        kpool_status st{};
        const std::string e = status_error(kpool_fwht128_quant_fp8(&qd, &fa, &sa, &exec_, &st), st);
        if (!e.empty()) return e;
        const std::string d = first_difference("q_fp8", fp8_ref, fp8_api);
        return d.empty() ? first_difference("q_scale", scale_ref, scale_api) : d;
    }

    std::string compress() {
        const int64_t n = uniform(1, P_ >= 32 ? 8 : 24);
        const kpool_dtype score = rng_() % 2 ? KPOOL_DTYPE_FLOAT32 : KPOOL_DTYPE_BFLOAT16;
        const CompressInputs in = make_compress_inputs(rng_, n, P_, score, slots());
        const bool masked = rng_() % 2, round_scale = rng_() % 2;
        const kpool_tensor k = in.slot_k.desc(), s = in.slot_score.desc(), a = in.ape.desc(), l = in.loc.desc(),
                           m = in.write_mask.desc(), cr = cache_ref_.desc(), ca = cache_api_.desc();
        kpool_ref::compress_and_write_cache(&cr, &k, &s, &a, &l, opt(m, masked), nullptr, nullptr, P_, kD,
                                            round_scale, 1);
        kpool_status st{};
        const std::string e = status_error(
            kpool_compress_and_write_cache(&ca, &k, &s, &a, &l, opt(m, masked), nullptr, nullptr, P_, kD,
                                           round_scale, 1, &exec_, &st),
            st);
        return e.empty() ? first_difference("kv_cache", cache_ref_, cache_api_) : e;
    }

    std::string seed() {
        const kpool_dtype dtype = rng_() % 2 ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;
        const SeedInputs in = make_seed_inputs(rng_, P_, ring_, dtype, kTailBlocks);
        const kpool_tensor k = in.key.desc(), g = in.gate_score.desc(), t = in.tslot.desc(), tr = tail_ref_.desc(),
                           ta = tail_api_.desc();
        kpool_ref::seed_tail_cache(&tr, &k, &g, &t, P_, kD);
        kpool_status st{};
        const std::string e = status_error(kpool_seed_tail_cache(&ta, &k, &g, &t, P_, kD, &exec_, &st), st);
        return e.empty() ? first_difference("tail_kv_cache", tail_ref_, tail_api_) : e;
    }

    std::string decode() {
        const int64_t B = uniform(1, 5), N = uniform(1, std::min(P_ + 2, 8));
        const DecodeInputs in = make_decode_inputs(rng_, B, N, P_, ring_, kTailBlocks, slots());
        const bool round_scale = rng_() % 2;
        const kpool_tensor ts = in.tail_slot_mapping.desc(), k = in.key.desc(), s = in.slot_score.desc(),
                           a = in.ape.desc(), sm = in.slot_mapping.desc(), p = in.positions.desc(),
                           cr = cache_ref_.desc(), tr = tail_ref_.desc(), ca = cache_api_.desc(),
                           ta = tail_api_.desc();
        const int64_t skipped =
            kpool_ref::decode_update_and_maybe_write_cache_batched(&cr, &tr, &ts, &k, &s, &a, &sm, &p, P_, kD, round_scale);
        kpool_status st{};
        const std::string e = status_error(kpool_decode_update_and_maybe_write_cache_batched(
                                               &ca, &ta, &ts, &k, &s, &a, &sm, &p, P_, kD, round_scale, &exec_, &st),
                                           st);
        if (!e.empty()) return e;
        if (st.skipped_completions != skipped) {
            return "skipped_completions " + std::to_string(st.skipped_completions) + ", reference " +
                   std::to_string(skipped);
        }
        const std::string d = first_difference("kv_cache", cache_ref_, cache_api_);
        return d.empty() ? first_difference("tail_kv_cache", tail_ref_, tail_api_) : d;
    }

    std::string expand_append() {
        const int64_t rows = uniform(1, 16), G = uniform(0, 12);
        const kpool_dtype dtype = rng_() % 2 ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;
        HostTensor ids(dtype, {rows, G}), seq_lens(KPOOL_DTYPE_INT32, {rows});
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t seq = uniform(0, 5000);
            seq_lens.set<int32_t>({r}, int32_t(seq));
            for (int64_t g = 0; g < G; ++g) ids.set_int({r, g}, uniform(-2, seq / P_ + 2));
        }
        HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, G * P_ + P_ - 1});
        out_ref.fill_random_bytes(rng_);
        HostTensor out_api = out_ref;
        const bool bound = rng_() % 2;
        const kpool_tensor i = ids.desc(), s = seq_lens.desc(), o_ref = out_ref.desc(), o_api = out_api.desc();
        kpool_ref::expand_pools_and_append_tail(&i, &s, &o_ref, P_, bound);
        kpool_status st{};
        const std::string e =
            status_error(kpool_expand_pools_and_append_tail(&i, &s, &o_api, P_, bound, &exec_, &st), st);
        return e.empty() ? first_difference("out", out_ref, out_api) : e;
    }

    std::string expand_tokens() {
        const int64_t rows = uniform(1, 16), G = uniform(0, 12), topk = G * P_;
        const kpool_dtype dtype = rng_() % 2 ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;
        HostTensor ids(dtype, {rows, G}), valid(KPOOL_DTYPE_BOOL, {rows, G});
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t g = 0; g < G; ++g) {
                ids.set_int({r, g}, uniform(-3, 4000 / P_));
                valid.set<uint8_t>({r, g}, rng_() % 5 != 0);
            }
        }
        const TokenMap map = TokenMap(rng_() % 4);
        TokenMapInputs tm = make_token_map(rng_, map, rows, 3000);
        HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, topk});
        out_ref.fill_random_bytes(rng_);
        HostTensor out_api = out_ref;
        const kpool_tensor i = ids.desc(), v = valid.desc(), pt = tm.page_table.desc(), to = tm.topk_offsets.desc(),
                           o_ref = out_ref.desc(), o_api = out_api.desc();
        kpool_ref::expand_pools_to_tokens(&i, &v, opt(pt, tm.has_table), opt(to, tm.has_offsets), &o_ref,
                                          int32_t(topk), P_);
        kpool_status st{};
        const std::string e = status_error(kpool_expand_pools_to_tokens(&i, &v, opt(pt, tm.has_table),
                                                                        opt(to, tm.has_offsets), &o_api,
                                                                        int32_t(topk), P_, &exec_, &st),
                                           st);
        return e.empty() ? first_difference("out", out_ref, out_api) : e;
    }

    std::string append_tail() {
        const int64_t rows = uniform(1, 16), C = uniform(0, 40);
        HostTensor topk(KPOOL_DTYPE_INT32, {rows, C}), seq_lens(KPOOL_DTYPE_INT32, {rows}),
            pool_lens(KPOOL_DTYPE_INT32, {rows});
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < C; ++c) topk.set<int32_t>({r, c}, int32_t(uniform(-1, 1 << 20)));
            const int32_t seq = int32_t(uniform(0, 5000));
            seq_lens.set<int32_t>({r}, seq);
            pool_lens.set<int32_t>({r}, seq / P_ + int32_t(uniform(-1, 1)));
        }
        const TokenMap map = TokenMap(rng_() % 4);
        TokenMapInputs tm = make_token_map(rng_, map, rows, 3000);
        HostTensor out_ref(KPOOL_DTYPE_INT32, {rows, C + P_ - 1});
        out_ref.fill_random_bytes(rng_);
        HostTensor out_api = out_ref;
        const kpool_tensor t = topk.desc(), s = seq_lens.desc(), pl = pool_lens.desc(), pt = tm.page_table.desc(),
                           to = tm.topk_offsets.desc(), o_ref = out_ref.desc(), o_api = out_api.desc();
        kpool_ref::append_tail_to_topk(&t, &s, &pl, opt(pt, tm.has_table), opt(to, tm.has_offsets), &o_ref, P_);
        kpool_status st{};
        const std::string e = status_error(kpool_append_tail_to_topk(&t, &s, &pl, opt(pt, tm.has_table),
                                                                     opt(to, tm.has_offsets), &o_api, P_, &exec_, &st),
                                           st);
        return e.empty() ? first_difference("out", out_ref, out_api) : e;
    }

    const int id_;
    std::mt19937 rng_;
    const int P_;
    const int64_t ring_;
    const int64_t block_size_;
    const kpool_exec exec_{nullptr};
    HostTensor cache_ref_, cache_api_, tail_ref_, tail_api_;
};

TEST(Stress, MixedOpsFromManyThreadsMatchTheReference) {
    const int kThreads = 8;
    const int iterations = iterations_per_thread();
    std::vector<Worker> workers;
    for (int i = 0; i < kThreads; ++i) workers.emplace_back(i);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (Worker &w : workers) {
        threads.emplace_back([&w, &stop, iterations] {
            w.run(iterations, stop);
            if (!w.failure.empty()) stop = true;
        });
    }
    for (std::thread &t : threads) t.join();

    int64_t per_op[kOps] = {}, total = 0;
    for (const Worker &w : workers) {
        EXPECT_EQ(w.failure, "");
        for (int op = 0; op < kOps; ++op) {
            per_op[op] += w.calls[op];
            total += w.calls[op];
        }
    }
    std::ostringstream summary;
    summary << kThreads << " threads x " << iterations << " iterations: " << total << " calls (";
    for (int op = 0; op < kOps; ++op) summary << (op ? ", " : "") << kOpNames[op] << " " << per_op[op];
    summary << "), each checked against the reference";
    RecordProperty("summary", summary.str());
    std::printf("%s\n", summary.str().c_str());
    EXPECT_EQ(total, int64_t(kThreads) * iterations);
}

}  // namespace
}  // namespace kpool_test
