// What bad input gets (SPEC): every entry point validates shapes, dtypes,
// strides, D == 128, RING % P == 0, topk % P == 0 and every index it will
// touch, before any byte is written, and answers with an error whose message
// names the argument as kpool.h spells it. Each test below starts from a
// valid call (checked by the *BaseCallIsValid tests), breaks one thing, and
// checks the code, the message, and that every output buffer, filled with a
// canary byte, is exactly as it was.
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace kpool_test {
namespace {

using ::testing::AnyOf;
using ::testing::AnyOfArray;
using ::testing::HasSubstr;
using ::testing::Matcher;

constexpr uint8_t kCanary = 0xA5;

const kpool_exec kExec{nullptr};

HostTensor canary_cache(int64_t num_blocks, int64_t block_size, int64_t page_stride) {
    HostTensor t(KPOOL_DTYPE_UINT8, {num_blocks, block_size, kRowBytes}, {page_stride, kRowBytes, 1});
    t.fill_byte(kCanary);
    return t;
}

HostTensor canary_tail(int64_t num_blocks, int64_t ring, int64_t half_stride, int64_t block_stride) {
    HostTensor t(KPOOL_DTYPE_BFLOAT16, {num_blocks, 2, ring, kD}, {block_stride, half_stride, kD, 1});
    t.fill_byte(kCanary);
    return t;
}

HostTensor canary_tensor(kpool_dtype dtype, std::vector<int64_t> shape) {
    HostTensor t(dtype, std::move(shape));
    t.fill_byte(kCanary);
    return t;
}

::testing::AssertionResult AllCanary(const char *expr, const HostTensor &t) {
    int64_t changed = 0, first = -1;
    for (size_t i = 0; i < t.bytes().size(); ++i) {
        if (t.bytes()[i] != kCanary) {
            if (first < 0) first = static_cast<int64_t>(i);
            ++changed;
        }
    }
    if (changed == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << expr << ": " << changed << " bytes changed, first at byte "
                                         << first << " (a rejected call must write nothing)";
}
#define EXPECT_UNTOUCHED(t) EXPECT_PRED_FORMAT1(AllCanary, t)

// The call was rejected, with `code` when given, and its message names one
// of `names` (several where the argument at fault is a matter of phrasing,
// e.g. RING % P names the tail cache or the pool size).
void expect_rejected(kpool_status_code rc, const kpool_status &st,
                     std::initializer_list<const char *> names, int expected_code = -1) {
    EXPECT_NE(rc, KPOOL_OK) << "accepted; message: " << st.message;
    EXPECT_EQ(st.code, rc) << "status.code differs from the returned code";
    if (expected_code >= 0) {
        EXPECT_EQ(int(rc), expected_code)
            << "got " << kpool_status_name(rc) << ", want "
            << kpool_status_name(static_cast<kpool_status_code>(expected_code)) << ": " << st.message;
    }
    std::vector<Matcher<std::string>> matchers;
    for (const char *n : names) matchers.push_back(HasSubstr(n));
    EXPECT_THAT(std::string(st.message), AnyOfArray(matchers));
}

// ---------------------------------------------------------------------------
// fwht128_quant_fp8
// ---------------------------------------------------------------------------

struct FwhtCall {
    HostTensor q, fp8, scale;
    kpool_tensor qd, fd, sd;
    bool q_null = false, fp8_null = false, scale_null = false;
    kpool_exec exec = kExec;
    explicit FwhtCall(int64_t rows = 6) {
        std::mt19937 rng(1);
        q = HostTensor(KPOOL_DTYPE_BFLOAT16, {rows, kD});
        fill_normal(q, rng);
        fp8 = canary_tensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD});
        scale = canary_tensor(KPOOL_DTYPE_FLOAT32, {rows, 1});
        qd = q.desc();
        fd = fp8.desc();
        sd = scale.desc();
    }
    kpool_status_code run(kpool_status *st) {
        return kpool_fwht128_quant_fp8(q_null ? nullptr : &qd, fp8_null ? nullptr : &fd,
                                       scale_null ? nullptr : &sd, &exec, st);
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        const kpool_status_code rc = run(&st);
        expect_rejected(rc, st, names, code);
        EXPECT_UNTOUCHED(fp8);
        EXPECT_UNTOUCHED(scale);
    }
};

TEST(BadInputFwht, BaseCallIsValid) {
    FwhtCall c;
    kpool_status st{};
    ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    EXPECT_FALSE(AllCanary("q_scale", c.scale));
}

// fwht has no approximate step (its scale is always a power of two), so
// both arithmetics run the same kernel, on the CPU too; unknown values are
// refused.
TEST(BadInputFwht, Arithmetic) {
    FwhtCall exact, triton;
    triton.exec.arithmetic = KPOOL_ARITHMETIC_TRITON;
    kpool_status st{};
    ASSERT_EQ(exact.run(&st), KPOOL_OK) << st.message;
    ASSERT_EQ(triton.run(&st), KPOOL_OK) << st.message;
    EXPECT_BYTES_EQ(exact.fp8, triton.fp8);
    EXPECT_BYTES_EQ(exact.scale, triton.scale);
    FwhtCall bad;
    bad.exec.arithmetic = 9;
    bad.check({"exec->arithmetic"}, KPOOL_ERROR_INVALID_ARGUMENT);
}

TEST(BadInputFwht, Dtypes) {
    { FwhtCall c; c.qd.dtype = KPOOL_DTYPE_FLOAT32; c.check({"q"}, KPOOL_ERROR_INVALID_ARGUMENT); }
    { FwhtCall c; c.fd.dtype = KPOOL_DTYPE_BFLOAT16; c.check({"q_fp8"}, KPOOL_ERROR_INVALID_ARGUMENT); }
    { FwhtCall c; c.sd.dtype = KPOOL_DTYPE_BFLOAT16; c.check({"q_scale"}, KPOOL_ERROR_INVALID_ARGUMENT); }
}

TEST(BadInputFwht, Shapes) {
    { FwhtCall c; c.qd.shape[1] = 64; c.check({"q"}); }
    { FwhtCall c; c.qd.ndim = 3; c.check({"q"}); }
    { FwhtCall c; c.qd.ndim = 5; c.check({"q"}); }
    { FwhtCall c; c.qd.ndim = -1; c.check({"q"}); }
    { FwhtCall c; c.qd.shape[0] = -3; c.check({"q"}); }
    { FwhtCall c; c.fd.shape[0] = 5; c.check({"q_fp8"}); }
    { FwhtCall c; c.sd.shape[1] = 2; c.check({"q_scale"}); }
    { FwhtCall c; c.sd.shape[1] = 0; c.check({"q_scale"}); }
    { FwhtCall c; c.sd.shape[0] = 7; c.check({"q_scale"}); }
}

TEST(BadInputFwht, NonUnitInnermostStride) {
    FwhtCall c;
    c.qd.strides[1] = 2;
    c.qd.strides[0] = 2 * kD;
    c.qd.shape[0] = 3;  // stays inside the allocation
    c.fd.shape[0] = 3;
    c.sd.shape[0] = 3;
    c.check({"q"});
}

TEST(BadInputFwht, NullPointers) {
    { FwhtCall c; c.q_null = true; c.check({"q"}); }
    { FwhtCall c; c.fp8_null = true; c.check({"q_fp8"}); }
    { FwhtCall c; c.scale_null = true; c.check({"q_scale"}); }
    { FwhtCall c; c.qd.data = nullptr; c.check({"q"}); }
    { FwhtCall c; c.fd.data = nullptr; c.check({"q_fp8"}); }
}

TEST(BadInputFwht, NullStatusStillReturnsTheError) {
    FwhtCall c;
    c.qd.dtype = KPOOL_DTYPE_FLOAT32;
    EXPECT_NE(c.run(nullptr), KPOOL_OK);
    EXPECT_UNTOUCHED(c.fp8);
}

// One tensor on another device than the rest: rejected in every build (a
// CPU-only build names the CUDA tensor; a CUDA build, the mismatch).
TEST(BadInputFwht, MixedOrUnknownDevices) {
    { FwhtCall c; c.qd.device = KPOOL_DEVICE_CUDA; c.check({"q"}); }
    { FwhtCall c; c.fd.device = KPOOL_DEVICE_CUDA; c.check({"q_fp8"}); }
    { FwhtCall c; c.sd.device = KPOOL_DEVICE_CUDA; c.check({"q_scale"}); }
    { FwhtCall c; c.qd.device = static_cast<kpool_device_type>(7); c.check({"q"}); }
    if (build_has_cuda()) {
        FwhtCall c;
        c.qd.device = c.fd.device = c.sd.device = KPOOL_DEVICE_CUDA;
        c.fd.device_index = 1;
        c.check({"q_fp8"});
    }
}

// Every tensor on CUDA. Without CUDA in the build, or without a driver on
// the machine, that is an error, never a crash (nor a write).
TEST(BadInputFwht, AllOnCudaWithoutCuda) {
    if (build_has_cuda() && cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
    FwhtCall c;
    c.qd.device = c.fd.device = c.sd.device = KPOOL_DEVICE_CUDA;
    if (build_has_cuda()) {
        c.check({""});
    } else {
        c.check({"q"});
    }
}

// ---------------------------------------------------------------------------
// compress_and_write_cache
// ---------------------------------------------------------------------------

struct CompressCall {
    static constexpr int64_t kBlocks = 6, kBlockSize = 16, kPageStride = kBlockSize * kRowBytes + 64;
    int64_t n;
    int32_t P, head_dim = kD, round_scale = 1, write_cache = 1;
    HostTensor cache, slot_k, slot_score, ape, loc, mask, ck, cs;
    kpool_tensor c, k, s, a, l, m, kd, sd;
    bool cache_null = false, k_null = false, s_null = false, a_null = false, l_null = false;
    bool use_mask = false, use_ret = false, use_ck = false, use_cs = false;
    kpool_exec exec = kExec;

    explicit CompressCall(int32_t pool_size = 4, int64_t pools = 9) : n(pools), P(pool_size) {
        std::mt19937 rng(2);
        cache = canary_cache(kBlocks, kBlockSize, kPageStride);
        slot_k = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, P, kD});
        slot_score = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, P, kD});
        ape = HostTensor(KPOOL_DTYPE_FLOAT32, {P, kD});
        fill_normal(slot_k, rng);
        fill_normal(slot_score, rng);
        fill_normal(ape, rng);
        loc = HostTensor(KPOOL_DTYPE_INT64, {n});
        const std::vector<int64_t> slots = distinct_slots(rng, kBlocks * kBlockSize, n);
        for (int64_t i = 0; i < n; ++i) loc.set<int64_t>({i}, slots[i]);
        loc.set<int64_t>({1}, -1);
        mask = HostTensor(KPOOL_DTYPE_BOOL, {n});
        for (int64_t i = 0; i < n; ++i) mask.set<uint8_t>({i}, 1);
        ck = canary_tensor(KPOOL_DTYPE_FLOAT8_E4M3FN, {n, kD});
        cs = canary_tensor(KPOOL_DTYPE_FLOAT32, {n});
        c = cache.desc();
        k = slot_k.desc();
        s = slot_score.desc();
        a = ape.desc();
        l = loc.desc();
        m = mask.desc();
        kd = ck.desc();
        sd = cs.desc();
    }
    void set_return(bool on) { use_ret = use_ck = use_cs = on; }
    int64_t slots() const { return kBlocks * kBlockSize; }
    kpool_status_code run(kpool_status *st) {
        return kpool_compress_and_write_cache(
            cache_null ? nullptr : &c, k_null ? nullptr : &k, s_null ? nullptr : &s,
            a_null ? nullptr : &a, l_null ? nullptr : &l, use_mask ? &m : nullptr,
            use_ck ? &kd : nullptr, use_cs ? &sd : nullptr, P, head_dim, round_scale, write_cache,
            &exec, st);
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        const kpool_status_code rc = run(&st);
        expect_rejected(rc, st, names, code);
        EXPECT_UNTOUCHED(cache);
        EXPECT_UNTOUCHED(ck);
        EXPECT_UNTOUCHED(cs);
    }
};

TEST(BadInputCompress, BaseCallIsValid) {
    for (bool ret : {false, true}) {
        CompressCall c;
        c.set_return(ret);
        kpool_status st{};
        ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
        EXPECT_FALSE(AllCanary("kv_cache", c.cache));
        if (ret) {
            EXPECT_FALSE(AllCanary("compressed_scale", c.cs));
        }
    }
    CompressCall masked;
    masked.use_mask = true;
    kpool_status st{};
    ASSERT_EQ(masked.run(&st), KPOOL_OK) << st.message;
}

TEST(BadInputCompress, CacheLayout) {
    { CompressCall c; c.c.dtype = KPOOL_DTYPE_FLOAT32; c.check({"kv_cache"}, KPOOL_ERROR_INVALID_ARGUMENT); }
    { CompressCall c; c.c.ndim = 2; c.check({"kv_cache"}); }
    { CompressCall c; c.c.shape[2] = 130; c.check({"kv_cache"}); }
    { CompressCall c; c.c.strides[2] = 2; c.check({"kv_cache"}); }
    // Page stride not a multiple of 4 (the f32 scales would be misaligned).
    { CompressCall c; c.c.strides[0] = CompressCall::kBlockSize * kRowBytes + 2; c.check({"kv_cache"}); }
    { CompressCall c; c.c.strides[0] = CompressCall::kBlockSize * kRowBytes + 1; c.check({"kv_cache"}); }
    // Pages that overlap.
    { CompressCall c; c.c.strides[0] = CompressCall::kBlockSize * kRowBytes - 4; c.check({"kv_cache"}); }
    { CompressCall c; c.c.shape[0] = -1; c.check({"kv_cache"}); }
}

TEST(BadInputCompress, InputShapesAndDtypes) {
    { CompressCall c; c.k.dtype = KPOOL_DTYPE_FLOAT32; c.check({"slot_k"}, KPOOL_ERROR_INVALID_ARGUMENT); }
    { CompressCall c; c.k.ndim = 2; c.check({"slot_k"}); }
    { CompressCall c; c.k.shape[2] = 64; c.k.strides[1] = 64; c.k.strides[0] = 64 * 4; c.check({"slot_k", "head_dim"}); }
    { CompressCall c; c.s.shape[0] = c.n - 1; c.check({"slot_score"}); }
    { CompressCall c; c.s.dtype = KPOOL_DTYPE_INT32; c.check({"slot_score"}); }
    { CompressCall c; c.a.shape[0] = 5; c.check({"ape", "pool_size"}); }
    { CompressCall c; c.a.dtype = KPOOL_DTYPE_BFLOAT16; c.check({"ape"}); }
    { CompressCall c; c.a.shape[1] = 64; c.check({"ape"}); }
    { CompressCall c; c.l.dtype = KPOOL_DTYPE_INT32; c.check({"loc"}); }
    { CompressCall c; c.l.shape[0] = c.n + 1; c.check({"loc"}); }
    { CompressCall c; c.l.ndim = 2; c.l.shape[1] = 1; c.l.strides[1] = 1; c.check({"loc"}); }
    { CompressCall c; c.use_mask = true; c.m.shape[0] = c.n - 2; c.check({"write_mask"}); }
    { CompressCall c; c.use_mask = true; c.m.dtype = KPOOL_DTYPE_FLOAT32; c.check({"write_mask"}); }
}

TEST(BadInputCompress, NonUnitInnermostStride) {
    { CompressCall c; c.k.strides[2] = 2; c.k.shape[0] = 2; c.s.shape[0] = 2; c.l.shape[0] = 2; c.check({"slot_k"}); }
    { CompressCall c; c.s.strides[2] = 2; c.s.shape[0] = 2; c.k.shape[0] = 2; c.l.shape[0] = 2; c.check({"slot_score"}); }
    {
        // ape [4, 128] as every other element of a [4, 256] allocation.
        CompressCall c;
        c.ape = HostTensor(KPOOL_DTYPE_FLOAT32, {4, 2 * kD});
        c.a = c.ape.desc();
        c.a.shape[1] = kD;
        c.a.strides[1] = 2;
        c.check({"ape"});
    }
}

TEST(BadInputCompress, Parameters) {
    { CompressCall c; c.head_dim = 64; c.check({"head_dim"}); }
    { CompressCall c; c.head_dim = 256; c.check({"head_dim"}); }
    // pool_size must match slot_k.shape[1] (the reference never checks).
    { CompressCall c(4); c.P = 8; c.check({"pool_size", "slot_k"}); }
    { CompressCall c(4); c.P = 2; c.check({"pool_size", "slot_k"}); }
    { CompressCall c(4); c.P = 0; c.check({"pool_size", "slot_k"}); }
    { CompressCall c(4); c.P = -4; c.check({"pool_size", "slot_k"}); }
    // Consistent shapes but a pool size with no kernel (not a power of two, or too large).
    { CompressCall c(3); c.check({"pool_size"}); }
    { CompressCall c(128, 2); c.check({"pool_size"}); }
}

// The reference's GPU instructions exist on CUDA only: a CPU call asking for
// them is refused, whichever outputs it would write.
TEST(BadInputCompress, Arithmetic) {
    for (bool ret : {false, true}) {
        CompressCall c;
        c.set_return(ret);
        c.exec.arithmetic = KPOOL_ARITHMETIC_TRITON;
        c.check({"exec->arithmetic"}, KPOOL_ERROR_UNSUPPORTED);
    }
    { CompressCall c; c.exec.arithmetic = 3; c.check({"exec->arithmetic"}, KPOOL_ERROR_INVALID_ARGUMENT); }
}

// KPOOL_ARITHMETIC_DEFAULT (0, what a zeroed exec holds) is the exact
// arithmetic on the CPU: the same bytes as asking for it.
TEST(BadInputCompress, DefaultArithmeticIsExactOnTheCpu) {
    CompressCall by_default, exact;
    by_default.exec.arithmetic = KPOOL_ARITHMETIC_DEFAULT;
    exact.exec.arithmetic = KPOOL_ARITHMETIC_EXACT;
    by_default.set_return(true);
    exact.set_return(true);
    kpool_status st{};
    ASSERT_EQ(by_default.run(&st), KPOOL_OK) << st.message;
    ASSERT_EQ(exact.run(&st), KPOOL_OK) << st.message;
    EXPECT_BYTES_EQ(by_default.cache, exact.cache);
    EXPECT_BYTES_EQ(by_default.ck, exact.ck);
    EXPECT_BYTES_EQ(by_default.cs, exact.cs);
    { CompressCall c; c.exec.arithmetic = -1; c.check({"exec->arithmetic"}, KPOOL_ERROR_INVALID_ARGUMENT); }
}

TEST(BadInputCompress, WriteMaskWithReturnCompressed) {
    CompressCall c;
    c.use_mask = true;
    c.set_return(true);
    c.check({"write_mask"}, KPOOL_ERROR_INVALID_ARGUMENT);
}

TEST(BadInputCompress, CompressedOutputs) {
    { CompressCall c; c.set_return(true); c.use_cs = false; c.check({"compressed_scale", "compressed_k"}); }
    { CompressCall c; c.set_return(true); c.use_ck = false; c.check({"compressed_k", "compressed_scale"}); }
    { CompressCall c; c.set_return(true); c.kd.shape[1] = 64; c.check({"compressed_k"}); }
    { CompressCall c; c.set_return(true); c.kd.shape[0] = c.n - 1; c.check({"compressed_k"}); }
    { CompressCall c; c.set_return(true); c.kd.dtype = KPOOL_DTYPE_BFLOAT16; c.check({"compressed_k"}); }
    { CompressCall c; c.set_return(true); c.sd.shape[0] = c.n - 1; c.check({"compressed_scale"}); }
    { CompressCall c; c.set_return(true); c.sd.dtype = KPOOL_DTYPE_INT32; c.check({"compressed_scale"}); }
    // [pools, k] with k != 1, k = 0 too (no element, yet every pool's scale
    // would be written: the fuzzer found it).
    for (const int64_t k : {0, 2}) {
        CompressCall c;
        c.set_return(true);
        c.sd.ndim = 2;
        c.sd.shape[1] = k;
        c.sd.strides[1] = 1;
        c.check({"compressed_scale"});
    }
}

TEST(BadInputCompress, NullPointers) {
    { CompressCall c; c.cache_null = true; c.check({"kv_cache"}); }  // write_cache = 1
    { CompressCall c; c.k_null = true; c.check({"slot_k"}); }
    { CompressCall c; c.s_null = true; c.check({"slot_score"}); }
    { CompressCall c; c.a_null = true; c.check({"ape"}); }
    { CompressCall c; c.l_null = true; c.check({"loc"}); }
    { CompressCall c; c.c.data = nullptr; c.check({"kv_cache"}); }
    { CompressCall c; c.k.data = nullptr; c.check({"slot_k"}); }
    { CompressCall c; c.l.data = nullptr; c.check({"loc"}); }
}

// Every out-of-range non-negative loc, of every magnitude: an error naming
// the element, OUT_OF_RANGE, and no write at all (not even the valid pools').
TEST(BadInputCompress, LocOutsideTheCache) {
    const int64_t slots = CompressCall::kBlocks * CompressCall::kBlockSize;
    const int64_t bad_values[] = {slots,
                                  slots + 1,
                                  slots + CompressCall::kBlockSize,
                                  int64_t(1) << 31,
                                  int64_t(1) << 32,
                                  (int64_t(1) << 62) + 5,
                                  std::numeric_limits<int64_t>::max() - CompressCall::kBlockSize + 1,
                                  std::numeric_limits<int64_t>::max()};
    for (int64_t bad : bad_values) {
        for (int64_t index : {int64_t(0), int64_t(5), int64_t(8)}) {
            for (bool ret : {false, true}) {
                SCOPED_TRACE("loc[" + std::to_string(index) + "] = " + std::to_string(bad) +
                             (ret ? ", return_compressed" : ""));
                CompressCall c;
                c.set_return(ret);
                c.loc.set<int64_t>({index}, bad);
                c.check({("loc[" + std::to_string(index) + "]").c_str()}, KPOOL_ERROR_OUT_OF_RANGE);
            }
        }
    }
}

TEST(BadInputCompress, MixedOrUnknownDevices) {
    { CompressCall c; c.c.device = KPOOL_DEVICE_CUDA; c.check({"kv_cache"}); }
    { CompressCall c; c.k.device = KPOOL_DEVICE_CUDA; c.check({"slot_k"}); }
    { CompressCall c; c.s.device = KPOOL_DEVICE_CUDA; c.check({"slot_score"}); }
    { CompressCall c; c.a.device = KPOOL_DEVICE_CUDA; c.check({"ape"}); }
    { CompressCall c; c.l.device = KPOOL_DEVICE_CUDA; c.check({"loc"}); }
    { CompressCall c; c.use_mask = true; c.m.device = KPOOL_DEVICE_CUDA; c.check({"write_mask"}); }
    { CompressCall c; c.set_return(true); c.kd.device = KPOOL_DEVICE_CUDA; c.check({"compressed_k"}); }
    { CompressCall c; c.set_return(true); c.sd.device = KPOOL_DEVICE_CUDA; c.check({"compressed_scale"}); }
    { CompressCall c; c.l.device = static_cast<kpool_device_type>(-1); c.check({"loc"}); }
}

TEST(BadInputCompress, AllOnCudaWithoutCuda) {
    if (build_has_cuda() && cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
    for (bool ret : {false, true}) {
        CompressCall c;
        c.set_return(ret);
        for (kpool_tensor *t : {&c.c, &c.k, &c.s, &c.a, &c.l, &c.kd, &c.sd}) t->device = KPOOL_DEVICE_CUDA;
        if (build_has_cuda()) {
            c.check({""});
        } else {
            c.check({"kv_cache", "slot_k", "slot_score", "ape", "loc", "compressed_k", "compressed_scale"});
        }
    }
}

// ---------------------------------------------------------------------------
// seed_tail_cache
// ---------------------------------------------------------------------------

struct SeedCall {
    static constexpr int64_t kBlocks = 5;
    int64_t n, ring;
    int32_t P, head_dim = kD;
    HostTensor tail, key, gate, tslot;
    kpool_tensor t, k, g, ts;
    bool tail_null = false, key_null = false, gate_null = false, tslot_null = false;

    explicit SeedCall(int32_t pool_size = 4, int64_t ring_size = 8, kpool_dtype tslot_dtype = KPOOL_DTYPE_INT64)
        : n(11), ring(ring_size), P(pool_size) {
        std::mt19937 rng(3);
        const int64_t half = ring * kD + 32;
        tail = canary_tail(kBlocks, ring, half, 2 * half + 128);
        key = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD});
        gate = HostTensor(KPOOL_DTYPE_BFLOAT16, {n, kD});
        fill_normal(key, rng);
        fill_normal(gate, rng);
        tslot = HostTensor(tslot_dtype, {n});
        // Two requests, in blocks 3 and 1, then padding.
        for (int64_t i = 0; i < n; ++i) {
            tslot.set_int({i}, i < 6 ? 3 * ring + i % ring : i < 10 ? 1 * ring + (i + 2) % ring : -1);
        }
        t = tail.desc();
        k = key.desc();
        g = gate.desc();
        ts = tslot.desc();
    }
    kpool_status_code run(kpool_status *st) {
        return kpool_seed_tail_cache(tail_null ? nullptr : &t, key_null ? nullptr : &k,
                                     gate_null ? nullptr : &g, tslot_null ? nullptr : &ts, P,
                                     head_dim, &kExec, st);
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        const kpool_status_code rc = run(&st);
        expect_rejected(rc, st, names, code);
        EXPECT_UNTOUCHED(tail);
    }
};

TEST(BadInputSeed, BaseCallIsValid) {
    for (kpool_dtype dt : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
        SeedCall c(4, 8, dt);
        kpool_status st{};
        ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
        EXPECT_FALSE(AllCanary("tail_kv_cache", c.tail));
    }
}

TEST(BadInputSeed, TailLayout) {
    { SeedCall c; c.t.dtype = KPOOL_DTYPE_FLOAT32; c.check({"tail_kv_cache"}, KPOOL_ERROR_INVALID_ARGUMENT); }
    { SeedCall c; c.t.ndim = 3; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.t.shape[1] = 3; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.t.shape[1] = 1; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.t.shape[3] = 64; c.check({"tail_kv_cache", "head_dim"}); }
    { SeedCall c; c.t.strides[3] = 2; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.t.strides[2] = 2 * kD; c.t.shape[2] = 4; c.check({"tail_kv_cache"}); }
}

TEST(BadInputSeed, RingNotAMultipleOfPoolSize) {
    // RING % P != 0 and RING < P; the reference never checks either in the seed op.
    { SeedCall c(4, 6); c.check({"tail_kv_cache", "pool_size"}); }
    { SeedCall c(8, 4); c.check({"tail_kv_cache", "pool_size"}); }
    { SeedCall c(16, 24); c.check({"tail_kv_cache", "pool_size"}); }
}

TEST(BadInputSeed, KeyAndScoreShapes) {
    { SeedCall c; c.k.dtype = KPOOL_DTYPE_FLOAT32; c.check({"key"}); }
    { SeedCall c; c.k.shape[1] = 64; c.k.strides[0] = 64; c.check({"key", "head_dim"}); }
    { SeedCall c; c.k.shape[0] = c.n - 1; c.check({"key", "tslot"}); }
    { SeedCall c; c.k.ndim = 3; c.k.shape[2] = 1; c.k.strides[2] = 1; c.check({"key"}); }
    { SeedCall c; c.k.strides[1] = 2; c.k.shape[0] = 5; c.g.shape[0] = 5; c.ts.shape[0] = 5; c.check({"key"}); }
    { SeedCall c; c.g.dtype = KPOOL_DTYPE_FLOAT32; c.check({"gate_score"}); }
    { SeedCall c; c.g.shape[0] = c.n - 1; c.check({"gate_score", "tslot"}); }
    { SeedCall c; c.g.shape[1] = 64; c.g.strides[0] = 64; c.check({"gate_score", "head_dim"}); }
    { SeedCall c; c.ts.dtype = KPOOL_DTYPE_FLOAT32; c.check({"tslot"}); }
    { SeedCall c; c.ts.dtype = KPOOL_DTYPE_BOOL; c.check({"tslot"}); }
    { SeedCall c; c.ts.ndim = 2; c.ts.shape[1] = 1; c.ts.strides[1] = 1; c.check({"tslot"}); }
}

TEST(BadInputSeed, Parameters) {
    { SeedCall c; c.head_dim = 64; c.check({"head_dim"}); }
    { SeedCall c; c.P = 0; c.check({"pool_size"}); }
    { SeedCall c; c.P = -8; c.check({"pool_size"}); }
}

TEST(BadInputSeed, NullPointers) {
    { SeedCall c; c.tail_null = true; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.key_null = true; c.check({"key"}); }
    { SeedCall c; c.gate_null = true; c.check({"gate_score"}); }
    { SeedCall c; c.tslot_null = true; c.check({"tslot"}); }
    { SeedCall c; c.t.data = nullptr; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.k.data = nullptr; c.check({"key"}); }
}

// A written token (the request's last) whose tail block is past the cache.
TEST(BadInputSeed, TslotOutsideTheTailCache) {
    for (kpool_dtype dt : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
        const int64_t ring = 8, limit = SeedCall::kBlocks * ring;
        std::vector<int64_t> bad = {limit, limit + 3, limit + ring, std::numeric_limits<int32_t>::max()};
        if (dt == KPOOL_DTYPE_INT64) {
            bad.push_back(int64_t(1) << 32);
            bad.push_back((int64_t(1) << 62) + 1);
            bad.push_back(std::numeric_limits<int64_t>::max());
        }
        for (int64_t value : bad) {
            for (int64_t index : {int64_t(5), int64_t(9)}) {  // the last token of each request
                SCOPED_TRACE("tslot[" + std::to_string(index) + "] = " + std::to_string(value) + " " +
                             kpool_dtype_name(dt));
                SeedCall c(4, ring, dt);
                c.tslot.set_int({index}, value);
                c.check({("tslot[" + std::to_string(index) + "]").c_str()}, KPOOL_ERROR_OUT_OF_RANGE);
            }
        }
    }
}

TEST(BadInputSeed, MixedOrUnknownDevices) {
    { SeedCall c; c.t.device = KPOOL_DEVICE_CUDA; c.check({"tail_kv_cache"}); }
    { SeedCall c; c.k.device = KPOOL_DEVICE_CUDA; c.check({"key"}); }
    { SeedCall c; c.g.device = KPOOL_DEVICE_CUDA; c.check({"gate_score"}); }
    { SeedCall c; c.ts.device = KPOOL_DEVICE_CUDA; c.check({"tslot"}); }
}

TEST(BadInputSeed, AllOnCudaWithoutCuda) {
    if (build_has_cuda() && cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
    SeedCall c;
    c.t.device = c.k.device = c.g.device = c.ts.device = KPOOL_DEVICE_CUDA;
    if (build_has_cuda()) {
        c.check({""});
    } else {
        c.check({"tail_kv_cache", "key", "gate_score", "tslot"});
    }
}

// ---------------------------------------------------------------------------
// decode_update_and_maybe_write_cache_batched
// ---------------------------------------------------------------------------

struct DecodeCall {
    static constexpr int64_t kBlocks = 4, kBlockSize = 16, kTailBlocks = 5;
    int64_t B = 3, N = 5, ring;
    int32_t P, head_dim = kD, round_scale = 1;
    HostTensor cache, tail, tsm, key, score, ape, sm, pos;
    kpool_tensor c, t, tsmd, k, s, a, smd, pd;
    bool cache_null = false, tail_null = false, tsm_null = false, key_null = false, score_null = false,
         ape_null = false, sm_null = false, pos_null = false;
    kpool_exec exec = kExec;

    explicit DecodeCall(int32_t pool_size = 4, int64_t ring_size = 8) : ring(ring_size), P(pool_size) {
        std::mt19937 rng(4);
        cache = canary_cache(kBlocks, kBlockSize, kBlockSize * kRowBytes + 128);
        const int64_t half = ring * kD + 64;
        tail = canary_tail(kTailBlocks, ring, half, 2 * half + 64);
        // The ring as read back must be finite numbers: the valid base call
        // reads it. Rejected calls never get that far; a canary check below
        // compares against this fill.
        tsm = HostTensor(KPOOL_DTYPE_INT32, {B, N});
        sm = HostTensor(KPOOL_DTYPE_INT32, {B, N});
        pos = HostTensor(KPOOL_DTYPE_INT32, {B, N});
        key = HostTensor(KPOOL_DTYPE_BFLOAT16, {B, N, kD});
        score = HostTensor(KPOOL_DTYPE_BFLOAT16, {B, N, kD});
        ape = HostTensor(KPOOL_DTYPE_FLOAT32, {P, kD});
        fill_normal(key, rng);
        fill_normal(score, rng);
        fill_normal(ape, rng);
        const int64_t blocks[] = {2, 0, 4};
        const std::vector<int64_t> locs = distinct_slots(rng, kBlocks * kBlockSize, B * N);
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t i = 0; i < N; ++i) {
                const int64_t p = 10 * b + 1 + i;
                pos.set<int32_t>({b, i}, static_cast<int32_t>(p));
                tsm.set<int32_t>({b, i}, static_cast<int32_t>(blocks[b] * ring + p % ring));
                sm.set<int32_t>({b, i}, p % P == P - 1 ? static_cast<int32_t>(locs[b * N + i]) : -1);
            }
        }
        c = cache.desc();
        t = tail.desc();
        tsmd = tsm.desc();
        k = key.desc();
        s = score.desc();
        a = ape.desc();
        smd = sm.desc();
        pd = pos.desc();
    }
    kpool_status_code run(kpool_status *st) {
        return kpool_decode_update_and_maybe_write_cache_batched(
            cache_null ? nullptr : &c, tail_null ? nullptr : &t, tsm_null ? nullptr : &tsmd,
            key_null ? nullptr : &k, score_null ? nullptr : &s, ape_null ? nullptr : &a,
            sm_null ? nullptr : &smd, pos_null ? nullptr : &pd, P, head_dim, round_scale, &exec, st);
    }
    // Index of a token that completes a pool in request b.
    int64_t completing_token(int64_t b) const {
        for (int64_t i = 0; i < N; ++i) {
            if (sm.get<int32_t>({b, i}) >= 0) return i;
        }
        return -1;
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        const kpool_status_code rc = run(&st);
        expect_rejected(rc, st, names, code);
        EXPECT_UNTOUCHED(cache);
        EXPECT_UNTOUCHED(tail);
    }
};

TEST(BadInputDecode, BaseCallIsValid) {
    DecodeCall c;
    // The canary bf16 0xA5A5 is a finite number (-2.87e-16), so the ring reads fine.
    kpool_status st{};
    ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    EXPECT_EQ(st.skipped_completions, 0);
    EXPECT_FALSE(AllCanary("kv_cache", c.cache));
    EXPECT_FALSE(AllCanary("tail_kv_cache", c.tail));
    ASSERT_GE(c.completing_token(0), 0);
}

TEST(BadInputDecode, Arithmetic) {
    { DecodeCall c; c.exec.arithmetic = KPOOL_ARITHMETIC_TRITON; c.check({"exec->arithmetic"}, KPOOL_ERROR_UNSUPPORTED); }
    { DecodeCall c; c.exec.arithmetic = 5; c.check({"exec->arithmetic"}, KPOOL_ERROR_INVALID_ARGUMENT); }
}

TEST(BadInputDecode, CacheAndTailLayout) {
    { DecodeCall c; c.c.dtype = KPOOL_DTYPE_INT32; c.check({"kv_cache"}); }
    { DecodeCall c; c.c.strides[0] = DecodeCall::kBlockSize * kRowBytes + 6; c.check({"kv_cache"}); }
    { DecodeCall c; c.c.shape[2] = 128; c.check({"kv_cache"}); }
    { DecodeCall c; c.c.strides[2] = 4; c.check({"kv_cache"}); }
    { DecodeCall c; c.t.dtype = KPOOL_DTYPE_FLOAT32; c.check({"tail_kv_cache"}); }
    { DecodeCall c; c.t.shape[1] = 1; c.check({"tail_kv_cache"}); }
    { DecodeCall c; c.t.shape[3] = 64; c.check({"tail_kv_cache", "head_dim"}); }
    { DecodeCall c; c.t.strides[3] = 2; c.check({"tail_kv_cache"}); }
    { DecodeCall c; c.t.strides[2] = 64; c.check({"tail_kv_cache"}); }
}

TEST(BadInputDecode, RingNotAMultipleOfPoolSize) {
    { DecodeCall c(4, 6); c.check({"tail_kv_cache", "pool_size"}); }
    { DecodeCall c(8, 4); c.check({"tail_kv_cache", "pool_size"}); }
    { DecodeCall c(4, 10); c.check({"tail_kv_cache", "pool_size"}); }
}

TEST(BadInputDecode, InputShapesAndDtypes) {
    { DecodeCall c; c.tsmd.shape[1] = c.N - 1; c.check({"tail_slot_mapping"}); }
    { DecodeCall c; c.tsmd.dtype = KPOOL_DTYPE_FLOAT32; c.check({"tail_slot_mapping"}); }
    { DecodeCall c; c.smd.shape[0] = c.B - 1; c.check({"slot_mapping"}); }
    { DecodeCall c; c.smd.dtype = KPOOL_DTYPE_FLOAT32; c.check({"slot_mapping"}); }
    { DecodeCall c; c.pd.shape[1] = c.N - 2; c.check({"positions"}); }
    { DecodeCall c; c.pd.dtype = KPOOL_DTYPE_BOOL; c.check({"positions"}); }
    // int32 or int64, but one dtype for the three (a kernel variant per dtype).
    { DecodeCall c; c.pd.dtype = KPOOL_DTYPE_INT64; c.check({"positions", "tail_slot_mapping", "int32"}); }
    { DecodeCall c; c.smd.dtype = KPOOL_DTYPE_INT64; c.check({"slot_mapping", "tail_slot_mapping", "int64"}); }
    { DecodeCall c; c.k.dtype = KPOOL_DTYPE_FLOAT32; c.check({"key"}); }
    { DecodeCall c; c.k.shape[2] = 64; c.check({"key", "head_dim"}); }
    { DecodeCall c; c.k.ndim = 2; c.check({"key"}); }
    { DecodeCall c; c.k.strides[2] = 2; c.k.shape[1] = 2; c.check({"key"}); }
    { DecodeCall c; c.s.shape[1] = c.N - 1; c.check({"slot_score"}); }
    { DecodeCall c; c.s.dtype = KPOOL_DTYPE_INT32; c.check({"slot_score"}); }
    { DecodeCall c; c.a.shape[0] = 8; c.check({"ape", "pool_size"}); }
    { DecodeCall c; c.a.dtype = KPOOL_DTYPE_BFLOAT16; c.check({"ape"}); }
}

TEST(BadInputDecode, Parameters) {
    { DecodeCall c; c.head_dim = 127; c.check({"head_dim"}); }
    { DecodeCall c; c.P = 0; c.check({"pool_size", "ape"}); }
    { DecodeCall c; c.P = 2; c.check({"pool_size", "ape"}); }  // ape is [4, 128]
}

TEST(BadInputDecode, NullPointers) {
    { DecodeCall c; c.cache_null = true; c.check({"kv_cache"}); }
    { DecodeCall c; c.tail_null = true; c.check({"tail_kv_cache"}); }
    { DecodeCall c; c.tsm_null = true; c.check({"tail_slot_mapping"}); }
    { DecodeCall c; c.key_null = true; c.check({"key"}); }
    { DecodeCall c; c.score_null = true; c.check({"slot_score"}); }
    { DecodeCall c; c.ape_null = true; c.check({"ape"}); }
    { DecodeCall c; c.sm_null = true; c.check({"slot_mapping"}); }
    { DecodeCall c; c.pos_null = true; c.check({"positions"}); }
    { DecodeCall c; c.c.data = nullptr; c.check({"kv_cache"}); }
    { DecodeCall c; c.t.data = nullptr; c.check({"tail_kv_cache"}); }
}

// A stashed token whose tail block is past the tail cache.
TEST(BadInputDecode, TailSlotOutsideTheTailCache) {
    const int64_t ring = 8, limit = DecodeCall::kTailBlocks * ring;
    for (int64_t value : {limit, limit + 1, limit + 7 * ring, int64_t(std::numeric_limits<int32_t>::max())}) {
        for (auto [b, i] : {std::pair<int64_t, int64_t>{0, 0}, {1, 3}, {2, 4}}) {
            SCOPED_TRACE("tail_slot_mapping[" + std::to_string(b) + "][" + std::to_string(i) +
                         "] = " + std::to_string(value));
            DecodeCall c(4, ring);
            c.tsm.set<int32_t>({b, i}, static_cast<int32_t>(value));
            c.check({"tail_slot_mapping["}, KPOOL_ERROR_OUT_OF_RANGE);
        }
    }
}

// A completing token whose slot_mapping is past the indexer cache.
TEST(BadInputDecode, SlotMappingOutsideTheCache) {
    const int64_t limit = DecodeCall::kBlocks * DecodeCall::kBlockSize;
    for (int64_t value : {limit, limit + 1, limit + DecodeCall::kBlockSize,
                          int64_t(std::numeric_limits<int32_t>::max())}) {
        for (int64_t b : {0, 2}) {
            DecodeCall c;
            const int64_t i = c.completing_token(b);
            ASSERT_GE(i, 0);
            SCOPED_TRACE("slot_mapping[" + std::to_string(b) + "][" + std::to_string(i) +
                         "] = " + std::to_string(value));
            c.sm.set<int32_t>({b, i}, static_cast<int32_t>(value));
            c.check({"slot_mapping["}, KPOOL_ERROR_OUT_OF_RANGE);
        }
    }
}

TEST(BadInputDecode, MixedOrUnknownDevices) {
    { DecodeCall c; c.c.device = KPOOL_DEVICE_CUDA; c.check({"kv_cache"}); }
    { DecodeCall c; c.t.device = KPOOL_DEVICE_CUDA; c.check({"tail_kv_cache"}); }
    { DecodeCall c; c.tsmd.device = KPOOL_DEVICE_CUDA; c.check({"tail_slot_mapping"}); }
    { DecodeCall c; c.k.device = KPOOL_DEVICE_CUDA; c.check({"key"}); }
    { DecodeCall c; c.s.device = KPOOL_DEVICE_CUDA; c.check({"slot_score"}); }
    { DecodeCall c; c.a.device = KPOOL_DEVICE_CUDA; c.check({"ape"}); }
    { DecodeCall c; c.smd.device = KPOOL_DEVICE_CUDA; c.check({"slot_mapping"}); }
    { DecodeCall c; c.pd.device = KPOOL_DEVICE_CUDA; c.check({"positions"}); }
}

TEST(BadInputDecode, AllOnCudaWithoutCuda) {
    if (build_has_cuda() && cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
    DecodeCall c;
    for (kpool_tensor *t : {&c.c, &c.t, &c.tsmd, &c.k, &c.s, &c.a, &c.smd, &c.pd}) t->device = KPOOL_DEVICE_CUDA;
    if (build_has_cuda()) {
        c.check({""});
    } else {
        c.check({"kv_cache", "tail_kv_cache", "tail_slot_mapping", "key", "slot_score", "ape", "slot_mapping", "positions"});
    }
}

// ---------------------------------------------------------------------------
// The expand family
// ---------------------------------------------------------------------------

struct ExpandTailCall {
    int64_t rows = 4, G = 3;
    int32_t P = 4, bound = 0;
    HostTensor ids, seq, out;
    kpool_tensor i, s, o;
    bool ids_null = false, seq_null = false, out_null = false;
    ExpandTailCall() {
        ids = HostTensor(KPOOL_DTYPE_INT32, {rows, G});
        seq = HostTensor(KPOOL_DTYPE_INT32, {rows});
        for (int64_t r = 0; r < rows; ++r) {
            seq.set<int32_t>({r}, 50 + int32_t(r));
            for (int64_t g = 0; g < G; ++g) ids.set<int32_t>({r, g}, int32_t(g));
        }
        out = canary_tensor(KPOOL_DTYPE_INT32, {rows, G * P + P - 1});
        i = ids.desc();
        s = seq.desc();
        o = out.desc();
    }
    kpool_status_code run(kpool_status *st) {
        return kpool_expand_pools_and_append_tail(ids_null ? nullptr : &i, seq_null ? nullptr : &s,
                                                  out_null ? nullptr : &o, P, bound, &kExec, st);
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        expect_rejected(run(&st), st, names, code);
        EXPECT_UNTOUCHED(out);
    }
};

TEST(BadInputExpand, AndAppendTail) {
    {
        ExpandTailCall c;
        kpool_status st{};
        ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    }
    { ExpandTailCall c; c.i.dtype = KPOOL_DTYPE_FLOAT32; c.check({"pool_ids"}); }
    { ExpandTailCall c; c.i.ndim = 1; c.check({"pool_ids"}); }
    { ExpandTailCall c; c.s.shape[0] = c.rows + 1; c.check({"seq_lens"}); }
    { ExpandTailCall c; c.s.dtype = KPOOL_DTYPE_FLOAT32; c.check({"seq_lens"}); }
    { ExpandTailCall c; c.o.shape[1] = c.G * c.P; c.check({"out"}); }
    { ExpandTailCall c; c.o.shape[0] = c.rows - 1; c.check({"out"}); }
    { ExpandTailCall c; c.o.dtype = KPOOL_DTYPE_INT64; c.o.shape[1] = 7; c.o.strides[0] = 7; c.check({"out"}); }
    { ExpandTailCall c; c.P = 0; c.check({"pool_size"}); }
    { ExpandTailCall c; c.P = 3; c.o.shape[1] = c.o.strides[0] = c.G * 3 + 2; c.check({"pool_size"}); }
    { ExpandTailCall c; c.ids_null = true; c.check({"pool_ids"}); }
    { ExpandTailCall c; c.seq_null = true; c.check({"seq_lens"}); }
    { ExpandTailCall c; c.out_null = true; c.check({"out"}); }
    { ExpandTailCall c; c.o.device = KPOOL_DEVICE_CUDA; c.check({"out"}); }
    { ExpandTailCall c; c.s.device = KPOOL_DEVICE_CUDA; c.check({"seq_lens"}); }
}

struct ToTokensCall {
    int64_t rows = 3, G = 4;
    int32_t P = 4, topk = 16;
    HostTensor ids, valid, table, offsets, out;
    kpool_tensor i, v, pt, to, o;
    bool use_table = false, use_offsets = false, ids_null = false, valid_null = false, out_null = false;
    ToTokensCall() {
        ids = HostTensor(KPOOL_DTYPE_INT64, {rows, G});
        valid = HostTensor(KPOOL_DTYPE_BOOL, {rows, G});
        table = HostTensor(KPOOL_DTYPE_INT32, {rows, 40});
        offsets = HostTensor(KPOOL_DTYPE_INT64, {rows});
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t g = 0; g < G; ++g) {
                ids.set<int64_t>({r, g}, g);
                valid.set<uint8_t>({r, g}, 1);
            }
        }
        out = canary_tensor(KPOOL_DTYPE_INT32, {rows, topk});
        i = ids.desc();
        v = valid.desc();
        pt = table.desc();
        to = offsets.desc();
        o = out.desc();
    }
    kpool_status_code run(kpool_status *st) {
        return kpool_expand_pools_to_tokens(ids_null ? nullptr : &i, valid_null ? nullptr : &v,
                                            use_table ? &pt : nullptr, use_offsets ? &to : nullptr,
                                            out_null ? nullptr : &o, topk, P, &kExec, st);
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        expect_rejected(run(&st), st, names, code);
        EXPECT_UNTOUCHED(out);
    }
};

TEST(BadInputExpand, PoolsToTokens) {
    for (int mode = 0; mode < 3; ++mode) {
        ToTokensCall c;
        c.use_table = mode == 1;
        c.use_offsets = mode == 2;
        kpool_status st{};
        ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    }
    { ToTokensCall c; c.topk = 18; c.o.shape[1] = c.o.strides[0] = 18; c.check({"topk"}); }  // topk % P != 0
    { ToTokensCall c; c.topk = 12; c.o.shape[1] = c.o.strides[0] = 12; c.check({"topk", "group_ids"}); }  // G != topk / P
    { ToTokensCall c; c.i.dtype = KPOOL_DTYPE_FLOAT32; c.check({"group_ids"}); }
    { ToTokensCall c; c.v.shape[1] = c.G - 1; c.check({"group_valid"}); }
    { ToTokensCall c; c.v.dtype = KPOOL_DTYPE_FLOAT32; c.check({"group_valid"}); }
    { ToTokensCall c; c.use_table = c.use_offsets = true; c.check({"page_table", "topk_offsets"}); }
    { ToTokensCall c; c.use_table = true; c.pt.shape[1] = 0; c.check({"page_table"}); }
    // Fewer rows than the batch (more are an engine's persistent block table: test_ops.cpp).
    { ToTokensCall c; c.use_table = true; c.pt.shape[0] = c.rows - 1; c.check({"page_table"}); }
    { ToTokensCall c; c.use_table = true; c.pt.dtype = KPOOL_DTYPE_FLOAT32; c.check({"page_table"}); }
    { ToTokensCall c; c.use_table = true; c.pt.ndim = 1; c.check({"page_table"}); }
    {
        ToTokensCall c;
        c.use_offsets = true;
        c.offsets = HostTensor(KPOOL_DTYPE_INT64, {c.rows, 2});
        c.to = c.offsets.desc();
        c.check({"topk_offsets"});
    }
    { ToTokensCall c; c.use_offsets = true; c.to.shape[0] = c.rows + 1; c.check({"topk_offsets"}); }
    { ToTokensCall c; c.use_offsets = true; c.to.dtype = KPOOL_DTYPE_FLOAT32; c.check({"topk_offsets"}); }
    { ToTokensCall c; c.o.shape[1] = c.topk + 1; c.check({"out"}); }
    { ToTokensCall c; c.o.dtype = KPOOL_DTYPE_INT64; c.o.shape[1] = 8; c.o.strides[0] = 8; c.check({"out"}); }
    { ToTokensCall c; c.P = 0; c.check({"pool_size"}); }
    { ToTokensCall c; c.ids_null = true; c.check({"group_ids"}); }
    { ToTokensCall c; c.valid_null = true; c.check({"group_valid"}); }
    { ToTokensCall c; c.out_null = true; c.check({"out"}); }
    { ToTokensCall c; c.use_table = true; c.pt.device = KPOOL_DEVICE_CUDA; c.check({"page_table"}); }
    { ToTokensCall c; c.use_offsets = true; c.to.device = KPOOL_DEVICE_CUDA; c.check({"topk_offsets"}); }
}

struct AppendCall {
    int64_t rows = 3, C = 8;
    int32_t P = 4;
    HostTensor topk, seq, pools, table, offsets, out;
    kpool_tensor t, s, pl, pt, to, o;
    bool use_table = false, use_offsets = false, topk_null = false, seq_null = false,
         pools_null = false, out_null = false;
    AppendCall() {
        topk = HostTensor(KPOOL_DTYPE_INT32, {rows, C});
        seq = HostTensor(KPOOL_DTYPE_INT32, {rows});
        pools = HostTensor(KPOOL_DTYPE_INT32, {rows});
        table = HostTensor(KPOOL_DTYPE_INT32, {rows, 40});
        offsets = HostTensor(KPOOL_DTYPE_INT64, {rows, 1});
        for (int64_t r = 0; r < rows; ++r) {
            seq.set<int32_t>({r}, 30 + int32_t(r));
            pools.set<int32_t>({r}, (30 + int32_t(r)) / P);
        }
        out = canary_tensor(KPOOL_DTYPE_INT32, {rows, C + P - 1});
        t = topk.desc();
        s = seq.desc();
        pl = pools.desc();
        pt = table.desc();
        to = offsets.desc();
        o = out.desc();
    }
    kpool_status_code run(kpool_status *st) {
        return kpool_append_tail_to_topk(topk_null ? nullptr : &t, seq_null ? nullptr : &s,
                                         pools_null ? nullptr : &pl, use_table ? &pt : nullptr,
                                         use_offsets ? &to : nullptr, out_null ? nullptr : &o, P,
                                         &kExec, st);
    }
    void check(std::initializer_list<const char *> names, int code = -1) {
        kpool_status st{};
        expect_rejected(run(&st), st, names, code);
        EXPECT_UNTOUCHED(out);
    }
};

TEST(BadInputExpand, AppendTailToTopk) {
    for (int mode = 0; mode < 3; ++mode) {
        AppendCall c;
        c.use_table = mode == 1;
        c.use_offsets = mode == 2;
        kpool_status st{};
        ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    }
    {
        AppendCall c;
        c.t.dtype = KPOOL_DTYPE_INT64;
        c.t.shape[1] = c.t.strides[0] = 4;
        c.o.shape[1] = c.o.strides[0] = 4 + 3;
        c.check({"topk_result"});
    }
    { AppendCall c; c.t.ndim = 1; c.check({"topk_result"}); }
    { AppendCall c; c.s.ndim = 2; c.s.shape[1] = 1; c.s.strides[1] = 1; c.check({"seq_lens"}); }
    { AppendCall c; c.s.shape[0] = c.rows - 1; c.check({"seq_lens"}); }
    { AppendCall c; c.pl.shape[0] = c.rows + 1; c.check({"pool_lens"}); }
    { AppendCall c; c.pl.dtype = KPOOL_DTYPE_FLOAT32; c.check({"pool_lens"}); }
    { AppendCall c; c.o.shape[1] = c.C + c.P; c.check({"out"}); }
    { AppendCall c; c.o.shape[0] = c.rows + 1; c.check({"out"}); }
    { AppendCall c; c.use_table = c.use_offsets = true; c.check({"page_table", "topk_offsets"}); }
    { AppendCall c; c.use_table = true; c.pt.shape[1] = 0; c.check({"page_table"}); }
    {
        AppendCall c;
        c.use_offsets = true;
        c.offsets = HostTensor(KPOOL_DTYPE_INT64, {c.rows, 2});
        c.to = c.offsets.desc();
        c.check({"topk_offsets"});
    }
    { AppendCall c; c.P = -1; c.check({"pool_size"}); }
    { AppendCall c; c.topk_null = true; c.check({"topk_result"}); }
    { AppendCall c; c.seq_null = true; c.check({"seq_lens"}); }
    { AppendCall c; c.pools_null = true; c.check({"pool_lens"}); }
    { AppendCall c; c.out_null = true; c.check({"out"}); }
    { AppendCall c; c.pl.device = KPOOL_DEVICE_CUDA; c.check({"pool_lens"}); }
}

TEST(BadInputExpand, GroupBudget) {
    int64_t groups = -7;
    kpool_status st{};
    expect_rejected(kpool_history_group_budget_for_topk(18, 4, &groups, &st), st, {"topk"});
    EXPECT_EQ(groups, -7);
    st = kpool_status{};
    expect_rejected(kpool_history_group_budget_for_topk(16, 0, &groups, &st), st, {"pool_size"});
    st = kpool_status{};
    expect_rejected(kpool_history_group_budget_for_topk(16, -4, &groups, &st), st, {"pool_size"});
    st = kpool_status{};
    expect_rejected(kpool_history_group_budget_for_topk(12, 8, &groups, &st), st, {"topk", "pool_size = 8"});
    st = kpool_status{};
    expect_rejected(kpool_history_group_budget_for_topk(16, 4, nullptr, &st), st, {"groups"});
    EXPECT_EQ(groups, -7);
}

// ---------------------------------------------------------------------------
// A valid call writes exactly the targeted slots: everything else of the
// canary-filled caches, page padding included, is unchanged.
// ---------------------------------------------------------------------------

// Whether byte `b` of a planar cache lies in the K row or scale of a slot in `locs`.
std::vector<bool> targeted_cache_bytes(const HostTensor &cache, const std::vector<int64_t> &locs) {
    std::vector<bool> targeted(cache.bytes().size(), false);
    const int64_t bs = cache.shape(1), stride = cache.strides()[0];
    for (int64_t loc : locs) {
        const int64_t base = (loc / bs) * stride;
        for (int64_t b = 0; b < kD; ++b) targeted[base + (loc % bs) * kD + b] = true;
        for (int64_t b = 0; b < 4; ++b) targeted[base + bs * kD + (loc % bs) * 4 + b] = true;
    }
    return targeted;
}

::testing::AssertionResult only_targets_changed(const HostTensor &t, const std::vector<bool> &targeted) {
    int64_t stray = 0, first = -1;
    for (size_t b = 0; b < t.bytes().size(); ++b) {
        if (!targeted[b] && t.bytes()[b] != kCanary) {
            if (first < 0) first = static_cast<int64_t>(b);
            ++stray;
        }
    }
    if (stray == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << stray << " bytes outside the targeted slots changed, first at "
                                         << first;
}

TEST(WritesOnlyTargets, Compress) {
    for (bool masked : {false, true}) {
        CompressCall c(4, 9);
        c.use_mask = masked;
        c.mask.set<uint8_t>({3}, 0);
        c.mask.set<uint8_t>({7}, 0);
        std::vector<int64_t> targets;
        for (int64_t i = 0; i < c.n; ++i) {
            const int64_t loc = c.loc.get<int64_t>({i});
            if (loc >= 0 && (!masked || c.mask.get<uint8_t>({i}))) targets.push_back(loc);
        }
        kpool_status st{};
        ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
        EXPECT_TRUE(only_targets_changed(c.cache, targeted_cache_bytes(c.cache, targets)));
        for (int64_t loc : targets) {
            const int64_t scale_at = (loc / c.kBlockSize) * c.kPageStride + c.kBlockSize * kD + (loc % c.kBlockSize) * 4;
            float scale;
            std::memcpy(&scale, &c.cache.bytes()[scale_at], 4);
            EXPECT_GT(scale, 0.0f) << "the scale of loc " << loc << " was not written";
        }
    }
}

TEST(WritesOnlyTargets, Seed) {
    SeedCall c(4, 8);
    std::vector<bool> targeted(c.tail.bytes().size(), false);
    int64_t written = 0;
    for (int64_t i = 0; i < c.n; ++i) {
        const int64_t slot = c.tslot.get_int({i});
        if (slot < 0) continue;
        const int64_t block = slot / c.ring;
        if (i + c.P < c.n) {
            const int64_t ahead = c.tslot.get_int({i + c.P});
            if (ahead >= 0 && ahead / c.ring == block) continue;
        }
        ++written;
        for (int half = 0; half < 2; ++half) {
            const int64_t at = c.tail.offset({block, half, slot % c.ring, 0}) * 2;
            for (int64_t b = 0; b < 2 * kD; ++b) targeted[at + b] = true;
        }
    }
    ASSERT_EQ(written, 2 * c.P);
    kpool_status st{};
    ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    EXPECT_TRUE(only_targets_changed(c.tail, targeted));
}

// ---------------------------------------------------------------------------
// exec->index_errors (device calls mark out-of-range indices there; the
// kernel itself: test_index_check.cpp, on the GPU: GpuBadIndex)
// ---------------------------------------------------------------------------

// On the host an out-of-range index is rejected before anything runs, as
// without the words, and the words (host memory here) are never touched.
TEST(BadInputIndexErrors, HostCallsStillRejectAndLeaveTheWordsAlone) {
    CompressCall c;
    int32_t words[KPOOL_INDEX_ARGS] = {7, 7, 7, 7};
    c.exec.index_errors = words;
    c.loc.set<int64_t>({4}, c.slots());
    c.check({"loc[4]"}, KPOOL_ERROR_OUT_OF_RANGE);
    for (int i = 0; i < KPOOL_INDEX_ARGS; ++i) EXPECT_EQ(words[i], 7) << "word " << i;
}

TEST(BadInputIndexErrors, MisalignedWordsAreRejected) {
    alignas(8) uint8_t raw[4 * KPOOL_INDEX_ARGS + 8] = {};
    CompressCall c;
    c.exec.index_errors = reinterpret_cast<int32_t *>(raw + 2);
    c.check({"exec->index_errors"}, KPOOL_ERROR_INVALID_ARGUMENT);
}

TEST(BadInputIndexErrors, CheckNeedsWordsAndADevice) {
    kpool_status st{};
    expect_rejected(kpool_check_index_errors(0, nullptr, &st), st, {"exec"}, KPOOL_ERROR_INVALID_ARGUMENT);
    kpool_exec ex{nullptr};
    expect_rejected(kpool_check_index_errors(0, &ex, &st), st, {"exec->index_errors"}, KPOOL_ERROR_INVALID_ARGUMENT);
    alignas(8) int32_t words[KPOOL_INDEX_ARGS + 1] = {};
    ex.index_errors = reinterpret_cast<int32_t *>(reinterpret_cast<uint8_t *>(words) + 1);
    expect_rejected(kpool_check_index_errors(0, &ex, &st), st, {"exec->index_errors"}, KPOOL_ERROR_INVALID_ARGUMENT);
    // No such device (no driver here, or not device -1 there): named, and
    // nothing is read.
    ex.index_errors = words;
    const kpool_status_code rc = kpool_check_index_errors(-1, &ex, &st);
    expect_rejected(rc, st, {"exec->index_errors"});
    EXPECT_THAT(int(rc), AnyOf(int(KPOOL_ERROR_DEVICE), int(KPOOL_ERROR_INVALID_ARGUMENT)));
}

// Without the device (no driver here; no device 99 on a GPU machine) the
// warm-up names its argument.
TEST(BadInputWarmUp, NoSuchDeviceIsNamed) {
    kpool_status st{};
    const kpool_status_code rc = kpool_cuda_warm_up(99, nullptr, &st);
    expect_rejected(rc, st, {"device_index"});
    EXPECT_THAT(int(rc), AnyOf(int(KPOOL_ERROR_DEVICE), int(KPOOL_ERROR_INVALID_ARGUMENT)));
}

// The loaded-images query names its arguments too: a NULL output first,
// then the device as the warm-up does.
TEST(BadInputWarmUp, LoadedImagesNamesItsArguments) {
    kpool_status st{};
    expect_rejected(kpool_cuda_loaded_images(0, nullptr, &st), st, {"images"});
    kpool_cuda_images images{};
    const kpool_status_code rc = kpool_cuda_loaded_images(99, &images, &st);
    expect_rejected(rc, st, {"device_index"});
    EXPECT_THAT(int(rc), AnyOf(int(KPOOL_ERROR_DEVICE), int(KPOOL_ERROR_INVALID_ARGUMENT)));
}

TEST(WritesOnlyTargets, Decode) {
    DecodeCall c;
    std::vector<int64_t> locs;
    std::vector<bool> tail_targets(c.tail.bytes().size(), false);
    for (int64_t b = 0; b < c.B; ++b) {
        for (int64_t i = 0; i < c.N; ++i) {
            const int64_t p = c.pos.get<int32_t>({b, i}), ts = c.tsm.get<int32_t>({b, i});
            if (c.sm.get<int32_t>({b, i}) >= 0 && p % c.P == c.P - 1) locs.push_back(c.sm.get<int32_t>({b, i}));
            for (int half = 0; half < 2; ++half) {
                const int64_t at = c.tail.offset({ts / c.ring, half, p % c.ring, 0}) * 2;
                for (int64_t x = 0; x < 2 * kD; ++x) tail_targets[at + x] = true;
            }
        }
    }
    ASSERT_FALSE(locs.empty());
    kpool_status st{};
    ASSERT_EQ(c.run(&st), KPOOL_OK) << st.message;
    EXPECT_TRUE(only_targets_changed(c.cache, targeted_cache_bytes(c.cache, locs)));
    EXPECT_TRUE(only_targets_changed(c.tail, tail_targets));
}

}  // namespace
}  // namespace kpool_test
