// kpool demo: an engine-shaped workload through the C API, every call checked
// bit for bit against the scalar reference (tests/reference, kpool_ref::).
//
// Prefill: the prompts' query rows through fwht128_quant_fp8, every full pool
// of every prompt compressed into a paged indexer cache (pages handed out in
// random order), the tail rings seeded with each prompt's last P tokens.
// Decode: steps of next_n tokens per request plus one padding row (all -1, as
// a CUDA-graph batch pads), slot_mapping set only on pool-completing tokens,
// new cache pages allocated as pools fill; after each step the selected pools
// of every decode token are expanded (fused, and through the two general ops
// with a token page table). After every call the whole indexer cache, the
// whole tail allocation (padding included) and every output are compared.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "reference/kpool_reference.h"
#include "tool_support.h"

namespace kpool_tool {
namespace {

constexpr int64_t kHeadDim = KPOOL_HEAD_DIM;
constexpr int32_t kPoolSize = 4;
constexpr int64_t kRing = kPoolSize;       // tail ring slots per request
constexpr int64_t kBlockSize = 64;         // pool slots per indexer cache page
constexpr int64_t kRowBytes = KPOOL_CACHE_ROW_BYTES; // fp8 K row + f32 scale
// The tail cache aliases the indexer allocation in an engine, so its blocks
// are padded: this many bf16 elements after each block's two halves.
constexpr int64_t kTailBlockPadding = 96;
constexpr int64_t kTopk = 512;             // tokens selected per decode row
constexpr int64_t kTokenPageSize = 64;     // the attention KV cache's page size
constexpr int64_t kMinPrompt = 100;
constexpr int64_t kMaxPrompt = 3000;

// Deterministic inputs: bf16 values from a normal distribution, integers.
class Rng {
public:
    explicit Rng(uint64_t seed) : engine_(seed) {}

    std::vector<uint16_t> bf16(int64_t count, float scale = 1.0f) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<uint16_t> values(static_cast<size_t>(count));
        for (uint16_t &v : values) v = kpool_ref::f32_to_bf16(normal(engine_) * scale);
        return values;
    }
    std::vector<float> f32(int64_t count, float scale) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> values(static_cast<size_t>(count));
        for (float &v : values) v = normal(engine_) * scale;
        return values;
    }
    std::vector<uint8_t> bytes(int64_t count) {
        std::uniform_int_distribution<int> byte(0, 255);
        std::vector<uint8_t> values(static_cast<size_t>(count));
        for (uint8_t &v : values) v = static_cast<uint8_t>(byte(engine_));
        return values;
    }
    // Uniform in [lo, hi].
    int64_t uniform(int64_t lo, int64_t hi) {
        return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
    }
    template <typename T>
    void shuffle(std::vector<T> &values) {
        std::shuffle(values.begin(), values.end(), engine_);
    }

private:
    std::mt19937_64 engine_;
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T> &values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
}

// A host descriptor of `bytes` as `dtype` [shape], for the reference.
kpool_tensor host_tensor(std::vector<uint8_t> &bytes, kpool_dtype dtype,
                         const std::vector<int64_t> &shape) {
    return kpool_tensor_contiguous(bytes.data(), dtype, static_cast<int32_t>(shape.size()),
                                   shape.data());
}

// The tail ring cache [blocks, 2, RING, D] inside a padded allocation.
kpool_tensor tail_view(void *data, int64_t blocks) {
    kpool_tensor t{};
    t.data = data;
    t.dtype = KPOOL_DTYPE_BFLOAT16;
    t.ndim = 4;
    const int64_t shape[4] = {blocks, 2, kRing, kHeadDim};
    const int64_t strides[4] = {2 * kRing * kHeadDim + kTailBlockPadding, kRing * kHeadDim,
                                kHeadDim, 1};
    std::copy(shape, shape + 4, t.shape);
    std::copy(strides, strides + 4, t.strides);
    t.device = KPOOL_DEVICE_CPU;
    return t;
}

int64_t tail_allocation_bytes(int64_t blocks) {
    return blocks * (2 * kRing * kHeadDim + kTailBlockPadding) * 2;
}

struct Request {
    int64_t prompt_length = 0;
    int64_t length = 0;      // tokens so far (prompt + decoded)
    int64_t tail_block = 0;  // its block of the tail ring cache
    std::vector<int64_t> pages;        // indexer cache pages, in pool order
    std::vector<int64_t> token_pages;  // attention KV cache pages, in token order
    std::vector<uint16_t> keys, scores, queries;  // the prompt's rows, [L, D] each
};

class Demo {
public:
    Demo(const DemoOptions &options, Device &device)
        : options_(options), device_(device), rng_(options.seed), progress_(stdout) {}

    int run();

private:
    void build_workload();
    void prefill();
    void decode_step(int64_t step);
    void expand_step(const std::vector<std::vector<int64_t>> &positions);

    // The cache slot of pool `pool` of request r, allocating a page when the
    // pool opens one.
    int64_t pool_slot(Request &r, int64_t pool);
    int64_t token_slot(Request &r, int64_t token);

    // Times one C API call; a failed call is reported and counted.
    bool call(const char *op, const std::function<kpool_status_code(kpool_status *)> &api,
              kpool_status *status_out = nullptr);
    void reference(const std::function<void()> &ref);
    // Compares an output with the reference's; reports and counts a mismatch.
    void verify(const std::string &where, const std::string &what,
                const std::vector<uint8_t> &expected, DeviceBuffer &got);
    void fail(const std::string &line);

    // fwht of `rows` query rows (prefill or one decode step).
    void fwht(const char *op, const std::string &where, const std::vector<uint16_t> &queries,
              int64_t rows);

    const DemoOptions &options_;
    Device &device_;
    Rng rng_;
    Progress progress_;
    OpTimes api_times_;
    double reference_ms_ = 0.0;
    int64_t calls_ = 0;
    int64_t failures_ = 0;

    std::vector<Request> requests_;
    std::vector<int64_t> free_pages_, free_token_pages_;
    int64_t num_pages_ = 0, num_token_pages_ = 0, tail_blocks_ = 0;
    std::vector<float> ape_;
    // The state the two implementations carry from call to call.
    std::unique_ptr<DeviceBuffer> kv_cache_, tail_cache_;
    std::vector<uint8_t> ref_kv_cache_, ref_tail_cache_;
    int64_t prompt_tokens_ = 0, prefill_pools_ = 0, decode_completions_ = 0;
};

int64_t Demo::pool_slot(Request &r, int64_t pool) {
    while (static_cast<int64_t>(r.pages.size()) <= pool / kBlockSize) {
        r.pages.push_back(free_pages_.back());
        free_pages_.pop_back();
    }
    return r.pages[pool / kBlockSize] * kBlockSize + pool % kBlockSize;
}

int64_t Demo::token_slot(Request &r, int64_t token) {
    while (static_cast<int64_t>(r.token_pages.size()) <= token / kTokenPageSize) {
        r.token_pages.push_back(free_token_pages_.back());
        free_token_pages_.pop_back();
    }
    return r.token_pages[token / kTokenPageSize] * kTokenPageSize + token % kTokenPageSize;
}

bool Demo::call(const char *op, const std::function<kpool_status_code(kpool_status *)> &api,
                kpool_status *status_out) {
    kpool_status status{};
    device_.synchronize();
    const Stopwatch clock;
    const kpool_status_code code = api(&status);
    device_.synchronize();
    api_times_.add(op, clock.milliseconds());
    ++calls_;
    if (status_out) *status_out = status;
    const std::string failure = status_failure(op, code, status);
    if (!failure.empty()) fail("FAIL " + failure);
    return failure.empty();
}

void Demo::reference(const std::function<void()> &ref) {
    const Stopwatch clock;
    ref();
    reference_ms_ += clock.milliseconds();
}

void Demo::verify(const std::string &where, const std::string &what,
                  const std::vector<uint8_t> &expected, DeviceBuffer &got) {
    got.download();
    const ByteDiff diff = diff_bytes(expected, got.host());
    if (diff.equal()) return;
    fail("FAIL " + where + ": " + what + " " + diff.describe());
    // Carry on from the reference's state, so one mismatch is reported once.
    got.host() = expected;
    got.upload();
}

void Demo::fail(const std::string &line) {
    progress_.finish();
    std::printf("%s\n", line.c_str());
    ++failures_;
}

void Demo::build_workload() {
    requests_.resize(static_cast<size_t>(options_.requests));
    const int64_t decoded = options_.decode_steps * options_.next_n;
    int64_t pages = 0, token_pages = 0;
    for (size_t i = 0; i < requests_.size(); ++i) {
        Request &r = requests_[i];
        // The first and last requests take the extremes of the range.
        r.prompt_length = i == 0 ? kMinPrompt
                          : i + 1 == requests_.size() ? kMaxPrompt
                                                      : rng_.uniform(kMinPrompt, kMaxPrompt);
        r.length = r.prompt_length;
        const int64_t final_length = r.prompt_length + decoded;
        pages += (final_length / kPoolSize + kBlockSize - 1) / kBlockSize;
        token_pages += (final_length + kTokenPageSize - 1) / kTokenPageSize;
        prompt_tokens_ += r.prompt_length;
        prefill_pools_ += r.prompt_length / kPoolSize;
    }
    // A few spare pages, so the assignment is a true scatter.
    num_pages_ = pages + 3;
    num_token_pages_ = token_pages + 3;
    for (int64_t p = 0; p < num_pages_; ++p) free_pages_.push_back(p);
    for (int64_t p = 0; p < num_token_pages_; ++p) free_token_pages_.push_back(p);
    rng_.shuffle(free_pages_);
    rng_.shuffle(free_token_pages_);

    // Tail block 0 stays unassigned, as in the reference's scenarios.
    tail_blocks_ = options_.requests + 3;
    std::vector<int64_t> blocks(static_cast<size_t>(tail_blocks_ - 1));
    std::iota(blocks.begin(), blocks.end(), 1);
    rng_.shuffle(blocks);
    for (size_t i = 0; i < requests_.size(); ++i) requests_[i].tail_block = blocks[i];

    for (Request &r : requests_) {
        r.keys = rng_.bf16(r.prompt_length * kHeadDim);
        r.scores = rng_.bf16(r.prompt_length * kHeadDim);
        r.queries = rng_.bf16(r.prompt_length * kHeadDim);
    }
    ape_ = rng_.f32(kPoolSize * kHeadDim, 0.5f);

    // Random bytes, not zeros: a stray write shows in the comparison.
    ref_kv_cache_ = rng_.bytes(num_pages_ * kBlockSize * kRowBytes);
    ref_tail_cache_ = rng_.bytes(tail_allocation_bytes(tail_blocks_));
    kv_cache_ = std::make_unique<DeviceBuffer>(device_, ref_kv_cache_);
    tail_cache_ = std::make_unique<DeviceBuffer>(device_, ref_tail_cache_);
}

void Demo::fwht(const char *op, const std::string &where, const std::vector<uint16_t> &queries,
                int64_t rows) {
    std::vector<uint8_t> q = bytes_of(queries);
    std::vector<uint8_t> ref_fp8(static_cast<size_t>(rows * kHeadDim));
    std::vector<uint8_t> ref_scale(static_cast<size_t>(rows * 4));
    DeviceBuffer api_q(device_, q), api_fp8(device_, ref_fp8), api_scale(device_, ref_scale);

    const kpool_tensor q_t = api_q.contiguous(KPOOL_DTYPE_BFLOAT16, {rows, kHeadDim});
    const kpool_tensor fp8_t = api_fp8.contiguous(KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kHeadDim});
    const kpool_tensor scale_t = api_scale.contiguous(KPOOL_DTYPE_FLOAT32, {rows, 1});
    const kpool_exec exec = device_.exec();
    if (!call(op, [&](kpool_status *s) {
            return kpool_fwht128_quant_fp8(&q_t, &fp8_t, &scale_t, &exec, s);
        })) {
        return;
    }
    reference([&] {
        const kpool_tensor rq = host_tensor(q, KPOOL_DTYPE_BFLOAT16, {rows, kHeadDim});
        const kpool_tensor rf = host_tensor(ref_fp8, KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kHeadDim});
        const kpool_tensor rs = host_tensor(ref_scale, KPOOL_DTYPE_FLOAT32, {rows, 1});
        kpool_ref::fwht128_quant_fp8(&rq, &rf, &rs);
    });
    verify(where, "q_fp8", ref_fp8, api_fp8);
    verify(where, "q_scale", ref_scale, api_scale);
}

void Demo::prefill() {
    const kpool_exec exec = device_.exec();
    const int64_t tokens = prompt_tokens_;

    progress_.update("prefill: fwht128_quant_fp8 of " + std::to_string(tokens) + " query rows");
    std::vector<uint16_t> queries;
    queries.reserve(static_cast<size_t>(tokens * kHeadDim));
    for (const Request &r : requests_) queries.insert(queries.end(), r.queries.begin(), r.queries.end());
    fwht("fwht128_quant_fp8 (prefill)", "prefill", queries, tokens);

    // Every full pool of every prompt: its P key rows and P score rows.
    progress_.update("prefill: compress " + std::to_string(prefill_pools_) + " pools");
    const int64_t n = prefill_pools_;
    std::vector<uint16_t> slot_k, slot_score;
    std::vector<int64_t> loc;
    slot_k.reserve(static_cast<size_t>(n * kPoolSize * kHeadDim));
    slot_score.reserve(slot_k.capacity());
    for (Request &r : requests_) {
        const int64_t pools = r.prompt_length / kPoolSize;
        const size_t pool_elems = static_cast<size_t>(pools * kPoolSize * kHeadDim);
        slot_k.insert(slot_k.end(), r.keys.begin(), r.keys.begin() + pool_elems);
        slot_score.insert(slot_score.end(), r.scores.begin(), r.scores.begin() + pool_elems);
        for (int64_t j = 0; j < pools; ++j) loc.push_back(pool_slot(r, j));
    }
    {
        std::vector<uint8_t> k = bytes_of(slot_k), s = bytes_of(slot_score), a = bytes_of(ape_),
                             l = bytes_of(loc);
        DeviceBuffer api_k(device_, k), api_s(device_, s), api_a(device_, a), api_l(device_, l);
        const kpool_tensor kv_t =
            kv_cache_->contiguous(KPOOL_DTYPE_UINT8, {num_pages_, kBlockSize, kRowBytes});
        const kpool_tensor k_t = api_k.contiguous(KPOOL_DTYPE_BFLOAT16, {n, kPoolSize, kHeadDim});
        const kpool_tensor s_t = api_s.contiguous(KPOOL_DTYPE_BFLOAT16, {n, kPoolSize, kHeadDim});
        const kpool_tensor a_t = api_a.contiguous(KPOOL_DTYPE_FLOAT32, {kPoolSize, kHeadDim});
        const kpool_tensor l_t = api_l.contiguous(KPOOL_DTYPE_INT64, {n});
        call("compress_and_write_cache", [&](kpool_status *st) {
            return kpool_compress_and_write_cache(&kv_t, &k_t, &s_t, &a_t, &l_t, nullptr, nullptr,
                                                  nullptr, kPoolSize, kHeadDim, 1, 1, &exec, st);
        });
        reference([&] {
            const kpool_tensor rkv =
                host_tensor(ref_kv_cache_, KPOOL_DTYPE_UINT8, {num_pages_, kBlockSize, kRowBytes});
            const kpool_tensor rk = host_tensor(k, KPOOL_DTYPE_BFLOAT16, {n, kPoolSize, kHeadDim});
            const kpool_tensor rs = host_tensor(s, KPOOL_DTYPE_BFLOAT16, {n, kPoolSize, kHeadDim});
            const kpool_tensor ra = host_tensor(a, KPOOL_DTYPE_FLOAT32, {kPoolSize, kHeadDim});
            const kpool_tensor rl = host_tensor(l, KPOOL_DTYPE_INT64, {n});
            kpool_ref::compress_and_write_cache(&rkv, &rk, &rs, &ra, &rl, nullptr, nullptr,
                                                nullptr, kPoolSize, kHeadDim, 1, 1);
        });
        verify("prefill compress", "kv_cache", ref_kv_cache_, *kv_cache_);
    }

    // Every prompt token offered to the seed op; it keeps each request's last P.
    progress_.update("prefill: seed the tail rings from " + std::to_string(tokens) + " tokens");
    std::vector<uint16_t> keys, scores;
    std::vector<int32_t> tslot;
    keys.reserve(static_cast<size_t>(tokens * kHeadDim));
    scores.reserve(keys.capacity());
    for (const Request &r : requests_) {
        keys.insert(keys.end(), r.keys.begin(), r.keys.end());
        scores.insert(scores.end(), r.scores.begin(), r.scores.end());
        for (int64_t pos = 0; pos < r.prompt_length; ++pos) {
            tslot.push_back(static_cast<int32_t>(r.tail_block * kRing + pos % kRing));
        }
    }
    std::vector<uint8_t> k = bytes_of(keys), s = bytes_of(scores), t = bytes_of(tslot);
    DeviceBuffer api_k(device_, k), api_s(device_, s), api_t(device_, t);
    const kpool_tensor tail_t = tail_cache_->on_device(tail_view(tail_cache_->host().data(), tail_blocks_));
    const kpool_tensor k_t = api_k.contiguous(KPOOL_DTYPE_BFLOAT16, {tokens, kHeadDim});
    const kpool_tensor s_t = api_s.contiguous(KPOOL_DTYPE_BFLOAT16, {tokens, kHeadDim});
    const kpool_tensor t_t = api_t.contiguous(KPOOL_DTYPE_INT32, {tokens});
    call("seed_tail_cache", [&](kpool_status *st) {
        return kpool_seed_tail_cache(&tail_t, &k_t, &s_t, &t_t, kPoolSize, kHeadDim, &exec, st);
    });
    reference([&] {
        const kpool_tensor rtail = tail_view(ref_tail_cache_.data(), tail_blocks_);
        const kpool_tensor rk = host_tensor(k, KPOOL_DTYPE_BFLOAT16, {tokens, kHeadDim});
        const kpool_tensor rs = host_tensor(s, KPOOL_DTYPE_BFLOAT16, {tokens, kHeadDim});
        const kpool_tensor rt = host_tensor(t, KPOOL_DTYPE_INT32, {tokens});
        kpool_ref::seed_tail_cache(&rtail, &rk, &rs, &rt, kPoolSize, kHeadDim);
    });
    verify("prefill seed", "tail_kv_cache", ref_tail_cache_, *tail_cache_);
}

void Demo::decode_step(int64_t step) {
    const kpool_exec exec = device_.exec();
    const int64_t n = options_.next_n;
    // The real requests, then one padding row.
    const int64_t batch = options_.requests + 1;
    std::vector<int32_t> positions(static_cast<size_t>(batch * n), -1);
    std::vector<int32_t> tail_slots(positions.size(), -1), slots(positions.size(), -1);
    std::vector<std::vector<int64_t>> request_positions;
    for (int64_t b = 0; b < options_.requests; ++b) {
        Request &r = requests_[static_cast<size_t>(b)];
        std::vector<int64_t> row;
        for (int64_t t = 0; t < n; ++t) {
            const int64_t pos = r.length + t;
            const size_t i = static_cast<size_t>(b * n + t);
            positions[i] = static_cast<int32_t>(pos);
            tail_slots[i] = static_cast<int32_t>(r.tail_block * kRing + pos % kRing);
            if (pos % kPoolSize == kPoolSize - 1) {
                slots[i] = static_cast<int32_t>(pool_slot(r, pos / kPoolSize));
                ++decode_completions_;
            }
            row.push_back(pos);
        }
        request_positions.push_back(row);
    }
    const std::vector<uint16_t> keys = rng_.bf16(batch * n * kHeadDim);
    const std::vector<uint16_t> scores = rng_.bf16(batch * n * kHeadDim);
    const std::vector<uint16_t> queries = rng_.bf16(batch * n * kHeadDim);
    const std::string where = "decode step " + std::to_string(step + 1);

    fwht("fwht128_quant_fp8 (decode)", where, queries, batch * n);

    std::vector<uint8_t> ts = bytes_of(tail_slots), k = bytes_of(keys), s = bytes_of(scores),
                         a = bytes_of(ape_), sm = bytes_of(slots), p = bytes_of(positions);
    DeviceBuffer api_ts(device_, ts), api_k(device_, k), api_s(device_, s), api_a(device_, a),
        api_sm(device_, sm), api_p(device_, p);
    const kpool_tensor kv_t = kv_cache_->contiguous(KPOOL_DTYPE_UINT8, {num_pages_, kBlockSize, kRowBytes});
    const kpool_tensor tail_t = tail_cache_->on_device(tail_view(tail_cache_->host().data(), tail_blocks_));
    const kpool_tensor ts_t = api_ts.contiguous(KPOOL_DTYPE_INT32, {batch, n});
    const kpool_tensor k_t = api_k.contiguous(KPOOL_DTYPE_BFLOAT16, {batch, n, kHeadDim});
    const kpool_tensor s_t = api_s.contiguous(KPOOL_DTYPE_BFLOAT16, {batch, n, kHeadDim});
    const kpool_tensor a_t = api_a.contiguous(KPOOL_DTYPE_FLOAT32, {kPoolSize, kHeadDim});
    const kpool_tensor sm_t = api_sm.contiguous(KPOOL_DTYPE_INT32, {batch, n});
    const kpool_tensor p_t = api_p.contiguous(KPOOL_DTYPE_INT32, {batch, n});
    kpool_status status{};
    const bool ok = call("decode_update_and_maybe_write_cache_batched", [&](kpool_status *st) {
        return kpool_decode_update_and_maybe_write_cache_batched(
            &kv_t, &tail_t, &ts_t, &k_t, &s_t, &a_t, &sm_t, &p_t, kPoolSize, kHeadDim, 1, &exec, st);
    }, &status);
    int64_t ref_skipped = 0;
    reference([&] {
        const kpool_tensor rkv =
            host_tensor(ref_kv_cache_, KPOOL_DTYPE_UINT8, {num_pages_, kBlockSize, kRowBytes});
        const kpool_tensor rtail = tail_view(ref_tail_cache_.data(), tail_blocks_);
        const kpool_tensor rts = host_tensor(ts, KPOOL_DTYPE_INT32, {batch, n});
        const kpool_tensor rk = host_tensor(k, KPOOL_DTYPE_BFLOAT16, {batch, n, kHeadDim});
        const kpool_tensor rs = host_tensor(s, KPOOL_DTYPE_BFLOAT16, {batch, n, kHeadDim});
        const kpool_tensor ra = host_tensor(a, KPOOL_DTYPE_FLOAT32, {kPoolSize, kHeadDim});
        const kpool_tensor rsm = host_tensor(sm, KPOOL_DTYPE_INT32, {batch, n});
        const kpool_tensor rp = host_tensor(p, KPOOL_DTYPE_INT32, {batch, n});
        ref_skipped = kpool_ref::decode_update_and_maybe_write_cache_batched(
            &rkv, &rtail, &rts, &rk, &rs, &ra, &rsm, &rp, kPoolSize, kHeadDim, 1);
    });
    verify(where, "kv_cache", ref_kv_cache_, *kv_cache_);
    verify(where, "tail_kv_cache", ref_tail_cache_, *tail_cache_);
    // A device call does not count its skipped completions (that would need
    // a copy back inside the call): it reports -1.
    const int64_t expected_skipped = device_.uses_host_memory() ? ref_skipped : -1;
    if (ok && status.skipped_completions != expected_skipped) {
        fail("FAIL " + where + ": status.skipped_completions = " +
             std::to_string(status.skipped_completions) + ", expected " + std::to_string(expected_skipped));
    }
    for (Request &r : requests_) r.length += n;
    expand_step(request_positions);
}

// Each decode token selects up to topk / P of the pools before it; they are
// expanded to token ids with the incomplete trailing pool appended, once by
// the fused op (logical ids) and once by the two general ops through the
// token page table (physical KV slots).
void Demo::expand_step(const std::vector<std::vector<int64_t>> &positions) {
    const kpool_exec exec = device_.exec();
    const std::string where = "expand after step";
    const int64_t groups = kTopk / kPoolSize;
    const int64_t rows = options_.requests * options_.next_n;
    int64_t width = 0;
    for (const Request &r : requests_) width = std::max(width, r.length + kPoolSize);

    std::vector<int32_t> ids(static_cast<size_t>(rows * groups), -1), seq_lens, pool_lens;
    std::vector<uint8_t> valid(ids.size(), 0);
    std::vector<int32_t> page_table(static_cast<size_t>(rows * width), 0);
    int64_t row = 0;
    for (size_t b = 0; b < requests_.size(); ++b) {
        Request &r = requests_[b];
        for (int64_t pos : positions[b]) {
            const int64_t seq_len = pos + 1;
            const int64_t pools = seq_len / kPoolSize;
            for (int64_t g = 0; g < std::min(groups, pools); ++g) {
                // 1% of the slots invalid, as a top-k over masked scores leaves.
                if (rng_.uniform(0, 99) == 0) continue;
                const size_t i = static_cast<size_t>(row * groups + g);
                ids[i] = static_cast<int32_t>(rng_.uniform(0, pools - 1));
                valid[i] = 1;
            }
            seq_lens.push_back(static_cast<int32_t>(seq_len));
            pool_lens.push_back(static_cast<int32_t>(pools));
            for (int64_t tok = 0; tok < seq_len; ++tok) {
                page_table[static_cast<size_t>(row * width + tok)] =
                    static_cast<int32_t>(token_slot(r, tok));
            }
            ++row;
        }
    }
    const int64_t fused_cols = groups * kPoolSize + kPoolSize - 1;
    std::vector<uint8_t> id_b = bytes_of(ids), sl_b = bytes_of(seq_lens), pl_b = bytes_of(pool_lens),
                         pt_b = bytes_of(page_table);
    std::vector<uint8_t> ref_fused(static_cast<size_t>(rows * fused_cols * 4));
    std::vector<uint8_t> ref_tokens(static_cast<size_t>(rows * kTopk * 4));
    std::vector<uint8_t> ref_appended(ref_fused.size());
    DeviceBuffer api_ids(device_, id_b), api_valid(device_, valid), api_sl(device_, sl_b),
        api_pl(device_, pl_b), api_pt(device_, pt_b), api_fused(device_, ref_fused),
        api_tokens(device_, ref_tokens), api_appended(device_, ref_appended);
    const kpool_tensor ids_t = api_ids.contiguous(KPOOL_DTYPE_INT32, {rows, groups});
    const kpool_tensor valid_t = api_valid.contiguous(KPOOL_DTYPE_BOOL, {rows, groups});
    const kpool_tensor sl_t = api_sl.contiguous(KPOOL_DTYPE_INT32, {rows});
    const kpool_tensor pl_t = api_pl.contiguous(KPOOL_DTYPE_INT32, {rows});
    const kpool_tensor pt_t = api_pt.contiguous(KPOOL_DTYPE_INT32, {rows, width});
    const kpool_tensor fused_t = api_fused.contiguous(KPOOL_DTYPE_INT32, {rows, fused_cols});
    const kpool_tensor tokens_t = api_tokens.contiguous(KPOOL_DTYPE_INT32, {rows, kTopk});
    const kpool_tensor appended_t = api_appended.contiguous(KPOOL_DTYPE_INT32, {rows, fused_cols});

    call("expand_pools_and_append_tail", [&](kpool_status *st) {
        return kpool_expand_pools_and_append_tail(&ids_t, &sl_t, &fused_t, kPoolSize, 0, &exec, st);
    });
    call("expand_pools_to_tokens", [&](kpool_status *st) {
        return kpool_expand_pools_to_tokens(&ids_t, &valid_t, &pt_t, nullptr, &tokens_t,
                                            static_cast<int32_t>(kTopk), kPoolSize, &exec, st);
    });
    call("append_tail_to_topk", [&](kpool_status *st) {
        return kpool_append_tail_to_topk(&tokens_t, &sl_t, &pl_t, &pt_t, nullptr, &appended_t,
                                         kPoolSize, &exec, st);
    });
    reference([&] {
        const kpool_tensor r_ids = host_tensor(id_b, KPOOL_DTYPE_INT32, {rows, groups});
        const kpool_tensor r_valid = host_tensor(valid, KPOOL_DTYPE_BOOL, {rows, groups});
        const kpool_tensor r_sl = host_tensor(sl_b, KPOOL_DTYPE_INT32, {rows});
        const kpool_tensor r_pl = host_tensor(pl_b, KPOOL_DTYPE_INT32, {rows});
        const kpool_tensor r_pt = host_tensor(pt_b, KPOOL_DTYPE_INT32, {rows, width});
        const kpool_tensor r_fused = host_tensor(ref_fused, KPOOL_DTYPE_INT32, {rows, fused_cols});
        const kpool_tensor r_tokens = host_tensor(ref_tokens, KPOOL_DTYPE_INT32, {rows, kTopk});
        const kpool_tensor r_app = host_tensor(ref_appended, KPOOL_DTYPE_INT32, {rows, fused_cols});
        kpool_ref::expand_pools_and_append_tail(&r_ids, &r_sl, &r_fused, kPoolSize, 0);
        kpool_ref::expand_pools_to_tokens(&r_ids, &r_valid, &r_pt, nullptr, &r_tokens,
                                          static_cast<int32_t>(kTopk), kPoolSize);
        kpool_ref::append_tail_to_topk(&r_tokens, &r_sl, &r_pl, &r_pt, nullptr, &r_app, kPoolSize);
    });
    verify(where, "expand_pools_and_append_tail out", ref_fused, api_fused);
    verify(where, "expand_pools_to_tokens out", ref_tokens, api_tokens);
    verify(where, "append_tail_to_topk out", ref_appended, api_appended);
}

int Demo::run() {
    build_workload();
    std::printf("workload: %" PRId64 " requests, prompts %" PRId64 "..%" PRId64
                " tokens (%" PRId64 " in all), P=%d, ring %" PRId64 ", block_size %" PRId64
                ", %" PRId64 " decode steps x next_n=%" PRId64 " (+1 padding row), topk %" PRId64
                "\n",
                options_.requests, kMinPrompt, options_.requests > 1 ? kMaxPrompt : kMinPrompt,
                prompt_tokens_, kPoolSize, kRing, kBlockSize, options_.decode_steps,
                options_.next_n, kTopk);
    std::printf("caches: indexer %" PRId64 " pages x %" PRId64 " slots (%" PRId64
                " bytes), tail %" PRId64 " blocks (%" PRId64 " bytes, padded blocks)\n",
                num_pages_, kBlockSize, num_pages_ * kBlockSize * kRowBytes, tail_blocks_,
                tail_allocation_bytes(tail_blocks_));

    if (!device_.uses_host_memory()) {
        // Every kernel's module loaded (and JIT-compiled) before the timed
        // calls, as an engine does at start-up.
        const Stopwatch warm;
        const kpool_exec exec = device_.exec();
        kpool_status st{};
        if (kpool_cuda_warm_up(device_.index(), &exec, &st) != KPOOL_OK) {
            fail(std::string("FAIL kpool_cuda_warm_up: ") + st.message);
        }
        std::printf("warm-up: every CUDA kernel loaded and run once in %.1f ms\n", warm.milliseconds());
    }
    const Stopwatch clock;
    prefill();
    progress_.finish();
    for (int64_t step = 0; step < options_.decode_steps; ++step) {
        progress_.update("decode step " + std::to_string(step + 1) + "/" +
                         std::to_string(options_.decode_steps));
        decode_step(step);
    }
    progress_.finish();
    const double total_ms = clock.milliseconds();

    std::printf("prefill: %" PRId64 " query rows, %" PRId64 " pools compressed, %" PRId64
                " tail rings seeded; decode: %" PRId64 " pools completed\n",
                prompt_tokens_, prefill_pools_, options_.requests, decode_completions_);
    std::printf("kpool C API (%s):\n", device_.name().c_str());
    api_times_.print(stdout);
    std::printf("reference (scalar kpool_ref): %.3f ms; demo total %.1f ms\n", reference_ms_,
                total_ms);
    if (!device_.uses_host_memory()) {
        // Device calls ran with exec.index_errors: an out-of-range index
        // would have been skipped by the kernels and marked there.
        const kpool_exec exec = device_.exec();
        kpool_status st{};
        if (kpool_check_index_errors(device_.index(), &exec, &st) != KPOOL_OK) {
            fail(std::string("FAIL index checks: ") + st.message);
        } else {
            std::printf("index checks: no out-of-range index in any device call\n");
        }
    }
    if (failures_ == 0) {
        std::printf("verified: %" PRId64 " calls bit-exact against kpool_ref (whole indexer cache "
                    "and tail allocation compared after every call)\n",
                    calls_);
        return kExitOk;
    }
    std::printf("FAILED: %" PRId64 " mismatches or errors in %" PRId64 " calls\n", failures_, calls_);
    return kExitMismatch;
}

}  // namespace

int run_demo(const DemoOptions &options) {
    OpenedDevice opened = open_device(options.device);
    if (!opened.device) {
        std::fprintf(stderr, "kpool demo: %s\n", opened.error.c_str());
        return kExitUsage;
    }
    std::printf("%s\n%s\n", kpool_version(), opened.line.c_str());
    try {
        Demo demo(options, *opened.device);
        return demo.run();
    } catch (const std::exception &e) {  // a device (driver) failure
        std::printf("\nFAIL kpool demo: %s\n", e.what());
        return kExitMismatch;
    }
}

}  // namespace kpool_tool
