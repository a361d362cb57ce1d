// GPU calls at and past the edges of their inputs: GpuEmpty (empty batches
// write nothing), GpuBadIndex (out-of-range indices in device tensors write
// nothing and are marked in exec->index_errors), GpuMixedDevices (tensors of
// one call on two devices are rejected by name).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::HasSubstr;
using ::testing::ValuesIn;

// ---------------------------------------------------------------------------
// Empty batches
// ---------------------------------------------------------------------------

// Empty batches on the device: nothing is launched, nothing written.
class GpuEmpty : public GpuTest {};

TEST_F(GpuEmpty, EmptyBatchesWriteNothing) {
    std::mt19937 rng(9);
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(4, 16, false));
    const HostTensor tail0 = random_bytes_like(rng, make_tail_cache(4, 4, false));
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0);
    CompressInputs c = make_compress_inputs(rng, 0, 4, KPOOL_DTYPE_BFLOAT16, 64);
    Mirrored k(gpu(), c.slot_k), s(gpu(), c.slot_score), a(gpu(), c.ape), l(gpu(), c.loc);
    DecodeInputs d = make_decode_inputs(rng, 0, 1, 4, 4, 4, 64);
    Mirrored tsm(gpu(), d.tail_slot_mapping), dk(gpu(), d.key), ds(gpu(), d.slot_score), da(gpu(), d.ape),
        sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_compress_and_write_cache(cache.on(side), k.on(side), s.on(side), a.on(side),
                                                  l.on(side), nullptr, nullptr, nullptr, 4, kD, 1, 1, ex, st);
        },
        {{"kv_cache", &cache}});
    run_both(
        [&](Side side, const kpool_exec *ex, kpool_status *st) {
            return kpool_decode_update_and_maybe_write_cache_batched(
                cache.on(side), tail.on(side), tsm.on(side), dk.on(side), ds.on(side), da.on(side),
                sm.on(side), pos.on(side), 4, kD, 1, ex, st);
        },
        {{"kv_cache", &cache}, {"tail_kv_cache", &tail}});
    EXPECT_TRUE(same_bytes("kv_cache", cache0.bytes(), cache.gpu_host()));
    EXPECT_TRUE(same_bytes("tail_kv_cache", tail0.bytes(), tail.gpu_host()));
}

// ---------------------------------------------------------------------------
// Out-of-range indices in device tensors write nothing
// ---------------------------------------------------------------------------

// Device tensors are not read on the host, so the call succeeds; the kernels
// skip every write whose loc / slot / tail block lies outside its cache. The
// expected bytes: the CPU run of the same inputs with each bad entry replaced
// by -1 ("no write"). The CPU run of the bad inputs themselves must be
// rejected: that is what makes them out of range.
class GpuBadIndex : public GpuParamTest<int> {};


TEST_P(GpuBadIndex, CompressLocPastTheCacheWritesNothing) {
    const int P = GetParam();
    std::mt19937 rng(1300 + P);
    const int64_t n = 37, block_size = 16, num_blocks = 8, slots = num_blocks * block_size;
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    CompressInputs in = make_compress_inputs(rng, n, P, KPOOL_DTYPE_BFLOAT16, slots);
    // Just past the end, further, past int32, and values whose low 32 bits
    // are valid slots (a kernel that truncates would write slot 0 / 5).
    const std::pair<int64_t, int64_t> bad[] = {{3, slots},
                                               {8, slots + 1},
                                               {15, std::numeric_limits<int32_t>::max()},
                                               {21, int64_t(1) << 32},
                                               {24, (int64_t(1) << 32) + 5},
                                               {30, std::numeric_limits<int64_t>::max()}};
    HostTensor good_loc = in.loc;
    std::ostringstream trace;
    for (const auto &[i, v] : bad) {
        in.loc.set<int64_t>({i}, v);
        good_loc.set<int64_t>({i}, -1);
        trace << " loc[" << i << "] = " << v;
    }
    SCOPED_TRACE("bad entries:" + trace.str());
    for (const bool ret : {false, true}) {
        SCOPED_TRACE(ret ? "write_cache + return_compressed" : "write_cache");
        HostTensor ck0(KPOOL_DTYPE_FLOAT8_E4M3FN, {n, kD}), cs0(KPOOL_DTYPE_FLOAT32, {n});
        Mirrored cache(gpu(), cache0), k(gpu(), in.slot_k), score(gpu(), in.slot_score), ape(gpu(), in.ape),
            loc(gpu(), in.loc), ck(gpu(), ck0), cs(gpu(), cs0);
        // The CPU rejects the bad inputs, naming the first bad element.
        {
            HostTensor cache_copy = cache0;
            const kpool_tensor c = cache_copy.desc();
            kpool_status st{};
            const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
            EXPECT_EQ(
                kpool_compress_and_write_cache(&c, k.on(Side::Cpu), score.on(Side::Cpu), ape.on(Side::Cpu),
                                               loc.on(Side::Cpu), nullptr, ret ? ck.on(Side::Cpu) : nullptr,
                                               ret ? cs.on(Side::Cpu) : nullptr, P, kD, 1, 1, &ex, &st),
                KPOOL_ERROR_OUT_OF_RANGE);
            EXPECT_THAT(std::string(st.message), HasSubstr("loc[3]"));
        }
        kpool_status gs{};
        IndexWords words(gpu());
        const kpool_exec gex = words.exec();
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(
                            cache.on(Side::Gpu), k.on(Side::Gpu), score.on(Side::Gpu), ape.on(Side::Gpu),
                            loc.on(Side::Gpu), nullptr, ret ? ck.on(Side::Gpu) : nullptr,
                            ret ? cs.on(Side::Gpu) : nullptr, P, kD, 1, 1, &gex, &gs),
                        gs);
        EXPECT_EQ(words.read(), marked_only(KPOOL_INDEX_LOC));
        words.expect_check_reports({"loc"});
        // Expected: the same call with the bad pools as "no write".
        loc.assign_cpu(good_loc);
        kpool_status st{};
        const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
        ASSERT_KPOOL_OK(kpool_compress_and_write_cache(
                            cache.on(Side::Cpu), k.on(Side::Cpu), score.on(Side::Cpu), ape.on(Side::Cpu),
                            loc.on(Side::Cpu), nullptr, ret ? ck.on(Side::Cpu) : nullptr,
                            ret ? cs.on(Side::Cpu) : nullptr, P, kD, 1, 1, &ex, &st),
                        st);
        cache.download(), ck.download(), cs.download();
        EXPECT_TRUE(cache.matches_cpu("kv_cache"));
        if (ret) {
            EXPECT_TRUE(ck.matches_cpu("compressed_k"));
            EXPECT_TRUE(cs.matches_cpu("compressed_scale"));
        }
    }
}

// The tokens the seed rule (SPEC, seed_tail_cache) copies into each tail
// slot, over `tslot` with -1 where an entry is bad. A bad entry inside a
// request ends the run before it, so the token P before it is seeded too,
// and its slot may be another seeded token's: the GPU's threads race there
// (as the reference's do), the CPU's loop keeps the last.
std::map<int64_t, std::vector<int64_t>> seed_writers(const HostTensor &tslot, int P, int64_t ring) {
    std::map<int64_t, std::vector<int64_t>> writers;
    const int64_t n = tslot.shape(0);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t own = tslot.get_int({i}), ahead = i + P < n ? tslot.get_int({i + P}) : -1;
        if (own >= 0 && (ahead < 0 || ahead / ring != own / ring)) writers[own].push_back(i);
    }
    return writers;
}

TEST_P(GpuBadIndex, SeedTslotPastTheTailWritesNothing) {
    const int P = GetParam();
    for (const kpool_dtype dtype : {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) {
        SCOPED_TRACE("tslot " + dtype_tag(dtype));
        std::mt19937 rng(1400 + P);
        const int64_t ring = P, num_blocks = 7, end = num_blocks * ring;
        const HostTensor tail0 = random_bytes_like(rng, make_tail_cache(num_blocks, ring, true));
        SeedInputs in = make_seed_inputs(rng, P, ring, dtype, num_blocks);
        const int64_t n = in.tslot.shape(0);
        std::vector<int64_t> bad_values = {end, end + ring - 1, std::numeric_limits<int32_t>::max()};
        if (dtype == KPOOL_DTYPE_INT64) {
            bad_values.push_back((int64_t(1) << 32) + 3);  // low 32 bits: block 0
            bad_values.push_back(std::numeric_limits<int64_t>::max());
        }
        HostTensor good_tslot = in.tslot;
        std::ostringstream trace;
        int64_t first_bad = -1;
        for (size_t j = 0; j < bad_values.size(); ++j) {
            // Spread over the batch: inside requests and on padding rows.
            const int64_t i = (static_cast<int64_t>(j) * 7 + 2) % n;
            if (first_bad < 0 || i < first_bad) first_bad = i;
            in.tslot.set_int({i}, bad_values[j]);
            good_tslot.set_int({i}, -1);
            trace << " tslot[" << i << "] = " << bad_values[j];
        }
        SCOPED_TRACE("bad entries:" + trace.str());
        Mirrored tail(gpu(), tail0), key(gpu(), in.key), gate(gpu(), in.gate_score), tslot(gpu(), in.tslot);
        {
            HostTensor tail_copy = tail0;
            const kpool_tensor t = tail_copy.desc();
            kpool_status st{};
            const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
            EXPECT_EQ(kpool_seed_tail_cache(&t, key.on(Side::Cpu), gate.on(Side::Cpu), tslot.on(Side::Cpu), P,
                                            kD, &ex, &st),
                      KPOOL_ERROR_OUT_OF_RANGE);
            EXPECT_THAT(std::string(st.message), HasSubstr("tslot[" + std::to_string(first_bad) + "]"));
        }
        kpool_status gs{};
        IndexWords words(gpu());
        const kpool_exec gex = words.exec();
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(tail.on(Side::Gpu), key.on(Side::Gpu), gate.on(Side::Gpu),
                                              tslot.on(Side::Gpu), P, kD, &gex, &gs),
                        gs);
        EXPECT_EQ(words.read(), marked_only(KPOOL_INDEX_TSLOT));
        words.expect_check_reports({"tslot"});
        tslot.assign_cpu(good_tslot);
        kpool_status st{};
        const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
        ASSERT_KPOOL_OK(kpool_seed_tail_cache(tail.on(Side::Cpu), key.on(Side::Cpu), gate.on(Side::Cpu),
                                              tslot.on(Side::Cpu), P, kD, &ex, &st),
                        st);
        tail.download();
        // A slot of two seeded tokens holds, element by element, one of
        // theirs; every other byte is the CPU's.
        std::vector<uint8_t> expected = tail.cpu().bytes();
        const std::vector<uint8_t> &got = tail.gpu_host();
        for (const auto &[slot, tokens] : seed_writers(good_tslot, P, ring)) {
            if (tokens.size() < 2) continue;
            for (int half = 0; half < 2; ++half) {
                const HostTensor &rows = half == 0 ? in.key : in.gate_score;
                const int64_t at = tail.cpu().offset({slot / ring, half, slot % ring, 0}) * 2;
                for (int d = 0; d < kD; ++d) {
                    bool from_a_writer = false;
                    for (int64_t t : tokens) {
                        from_a_writer |= std::memcmp(got.data() + at + 2 * d,
                                                     rows.bytes().data() + rows.offset({t, d}) * 2, 2) == 0;
                    }
                    EXPECT_TRUE(from_a_writer) << "tail slot " << slot << " half " << half << " element " << d;
                }
                std::copy_n(got.begin() + at, 2 * kD, expected.begin() + at);
            }
        }
        EXPECT_TRUE(same_bytes("tail_kv_cache outside slots of two seeded tokens (GPU vs CPU)", expected, got));
    }
}

TEST_P(GpuBadIndex, DecodeSlotPastTheCacheAndTailPastTheRingWriteNothing) {
    const int P = GetParam();
    std::mt19937 rng(1500 + P);
    const int64_t ring = P, B = 5, N = P + 1, tail_blocks = 7, block_size = 16;
    const int64_t num_blocks = std::max<int64_t>(8, (B * N) / block_size + 1);  // a slot for every token
    const int64_t slots = num_blocks * block_size, tail_end = tail_blocks * ring;
    const HostTensor cache0 = random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true));
    HostTensor tail0 = make_tail_cache(tail_blocks, ring, true);
    fill_normal(tail0, rng, 1.5f);
    // Every request is real: positions from a random start, its own block,
    // a cache slot on every completion (N = P + 1 tokens: at least one).
    DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, slots);
    const std::vector<int64_t> blocks = distinct_slots(rng, tail_blocks, B);
    const std::vector<int64_t> locs = distinct_slots(rng, slots, B * N);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t start = std::uniform_int_distribution<int64_t>(0, 3 * P)(rng);
        for (int64_t t = 0; t < N; ++t) {
            const int64_t pos = start + t;
            in.positions.set<int32_t>({b, t}, static_cast<int32_t>(pos));
            in.tail_slot_mapping.set<int32_t>({b, t}, static_cast<int32_t>(blocks[b] * ring + pos % ring));
            in.slot_mapping.set<int32_t>({b, t},
                                         pos % P == P - 1 ? static_cast<int32_t>(locs[b * N + t]) : -1);
        }
    }
    HostTensor good_tsm = in.tail_slot_mapping, good_sm = in.slot_mapping;
    std::ostringstream trace;
    int bad_slots = 0;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < N; ++t) {
            // Requests 1, 2: a completion's cache slot just past the end / INT32_MAX.
            if ((b == 1 || b == 2) && in.slot_mapping.get<int32_t>({b, t}) >= 0) {
                const int32_t v = b == 1 ? static_cast<int32_t>(slots) : std::numeric_limits<int32_t>::max();
                in.slot_mapping.set<int32_t>({b, t}, v);
                good_sm.set<int32_t>({b, t}, -1);
                trace << " slot_mapping[" << b << ", " << t << "] = " << v;
                ++bad_slots;
            }
            // Requests 3, 4: every tail slot in a block past the ring / INT32_MAX.
            if (b == 3 || b == 4) {
                const int32_t pos = in.positions.get<int32_t>({b, t});
                const int32_t v = b == 3 ? static_cast<int32_t>(tail_end + pos % ring)
                                         : std::numeric_limits<int32_t>::max();
                in.tail_slot_mapping.set<int32_t>({b, t}, v);
                good_tsm.set<int32_t>({b, t}, -1);
                trace << " tail_slot_mapping[" << b << ", " << t << "] = " << v;
            }
        }
    }
    ASSERT_GE(bad_slots, 2) << "requests 1 and 2 each complete a pool";
    SCOPED_TRACE("bad entries:" + trace.str());
    Mirrored cache(gpu(), cache0), tail(gpu(), tail0), tsm(gpu(), in.tail_slot_mapping), key(gpu(), in.key),
        score(gpu(), in.slot_score), ape(gpu(), in.ape), sm(gpu(), in.slot_mapping), pos(gpu(), in.positions);
    IndexWords words(gpu());
    auto call = [&](Side s, kpool_tensor *cache_override, kpool_tensor *tail_override, kpool_status *st) {
        const kpool_exec ex = words.exec();
        return kpool_decode_update_and_maybe_write_cache_batched(
            cache_override ? cache_override : cache.on(s), tail_override ? tail_override : tail.on(s),
            tsm.on(s), key.on(s), score.on(s), ape.on(s), sm.on(s), pos.on(s), P, kD, 1, &ex, st);
    };
    {
        HostTensor cache_copy = cache0, tail_copy = tail0;
        kpool_tensor c = cache_copy.desc(), t = tail_copy.desc();
        kpool_status st{};
        EXPECT_EQ(call(Side::Cpu, &c, &t, &st), KPOOL_ERROR_OUT_OF_RANGE);
        EXPECT_THAT(std::string(st.message), HasSubstr("slot_mapping[")) << st.message;
    }
    kpool_status gs{};
    ASSERT_KPOOL_OK(call(Side::Gpu, nullptr, nullptr, &gs), gs);
    std::vector<int32_t> both = marked_only(KPOOL_INDEX_SLOT_MAPPING);
    both[KPOOL_INDEX_TAIL_SLOT_MAPPING] = 1;
    EXPECT_EQ(words.read(), both);
    words.expect_check_reports({"slot_mapping", "tail_slot_mapping"});
    tsm.assign_cpu(good_tsm);
    sm.assign_cpu(good_sm);
    kpool_status st{};
    ASSERT_KPOOL_OK(call(Side::Cpu, nullptr, nullptr, &st), st);
    cache.download(), tail.download();
    EXPECT_TRUE(cache.matches_cpu("kv_cache"));
    EXPECT_TRUE(tail.matches_cpu("tail_kv_cache"));
    // The good requests did write: the comparison is not of two no-ops.
    EXPECT_TRUE(cache.cpu().bytes() != cache0.bytes());
    EXPECT_TRUE(tail.cpu().bytes() != tail0.bytes());
}

// Valid calls of every checked op mark nothing.
TEST_P(GpuBadIndex, InRangeCallsMarkNothing) {
    const int P = GetParam();
    std::mt19937 rng(1600 + P);
    const int64_t ring = P, tail_blocks = 6, block_size = 16, num_blocks = 8, slots = num_blocks * block_size;
    IndexWords words(gpu());
    const kpool_exec ex = words.exec();
    CompressInputs c = make_compress_inputs(rng, 12, P, KPOOL_DTYPE_BFLOAT16, slots);
    Mirrored cache(gpu(), random_bytes_like(rng, make_kv_cache(num_blocks, block_size, true))),
        k(gpu(), c.slot_k), score(gpu(), c.slot_score), ape(gpu(), c.ape), loc(gpu(), c.loc);
    kpool_status st{};
    ASSERT_KPOOL_OK(kpool_compress_and_write_cache(cache.on(Side::Gpu), k.on(Side::Gpu), score.on(Side::Gpu),
                                                   ape.on(Side::Gpu), loc.on(Side::Gpu), nullptr, nullptr,
                                                   nullptr, P, kD, 1, 1, &ex, &st),
                    st);
    SeedInputs seed = make_seed_inputs(rng, P, ring, KPOOL_DTYPE_INT64, tail_blocks);
    Mirrored tail(gpu(), make_tail_cache(tail_blocks, ring, true)), skey(gpu(), seed.key),
        gate(gpu(), seed.gate_score), tslot(gpu(), seed.tslot);
    ASSERT_KPOOL_OK(kpool_seed_tail_cache(tail.on(Side::Gpu), skey.on(Side::Gpu), gate.on(Side::Gpu),
                                          tslot.on(Side::Gpu), P, kD, &ex, &st),
                    st);
    DecodeInputs d = make_decode_inputs(rng, 3, 2, P, ring, tail_blocks, slots);
    Mirrored tsm(gpu(), d.tail_slot_mapping), dkey(gpu(), d.key), dscore(gpu(), d.slot_score),
        dape(gpu(), d.ape), sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    ASSERT_KPOOL_OK(kpool_decode_update_and_maybe_write_cache_batched(
                        cache.on(Side::Gpu), tail.on(Side::Gpu), tsm.on(Side::Gpu), dkey.on(Side::Gpu),
                        dscore.on(Side::Gpu), dape.on(Side::Gpu), sm.on(Side::Gpu), pos.on(Side::Gpu), P, kD, 1,
                        &ex, &st),
                    st);
    EXPECT_EQ(words.read(), std::vector<int32_t>(KPOOL_INDEX_ARGS, 0));
    words.expect_check_reports({});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuBadIndex, ValuesIn(kGpuPoolSizes),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

// ---------------------------------------------------------------------------
// Tensors of one call on two devices
// ---------------------------------------------------------------------------

// The call is rejected before anything runs, with a message naming the
// argument on the other device; the device's buffers keep their bytes.
class GpuMixedDevices : public GpuTest {
protected:
    // `code` of the call with the tensors as given; checks the message names
    // `argument` and `where` ("cpu:0", "cuda:1").
    void expect_rejected(kpool_status_code rc, const kpool_status &st, const std::string &argument,
                         const std::string &where) {
        EXPECT_EQ(rc, KPOOL_ERROR_INVALID_ARGUMENT) << kpool_status_name(rc) << ": " << st.message;
        EXPECT_EQ(st.code, rc);
        EXPECT_THAT(std::string(st.message), HasSubstr(argument));
        EXPECT_THAT(std::string(st.message), HasSubstr(where));
    }
};

TEST_F(GpuMixedDevices, OneTensorOnTheCpuIsRejectedByName) {
    std::mt19937 rng(21);
    const int P = 4;
    const int64_t n = 6, num_blocks = 4, block_size = 16;
    CompressCase c(gpu(), rng, n, P, KPOOL_DTYPE_BFLOAT16, num_blocks, block_size, /*padded=*/false);
    Mirrored &cache = c.cache;
    const kpool_exec ex{nullptr, KPOOL_ARITHMETIC_EXACT};
    // The compress call with kv_cache, slot_k and loc as given, the rest on the GPU.
    auto compress = [&](const kpool_tensor *kv_cache, const kpool_tensor *slot_k, const kpool_tensor *loc,
                        kpool_status *st) {
        return kpool_compress_and_write_cache(kv_cache, slot_k, c.slot_score.on(Side::Gpu), c.ape.on(Side::Gpu), loc,
                                              nullptr, nullptr, nullptr, P, kD, 1, 1, &ex, st);
    };
    {
        SCOPED_TRACE("compress, loc on the CPU");
        kpool_status st{};
        const kpool_status_code rc = compress(cache.on(Side::Gpu), c.slot_k.on(Side::Gpu), c.loc.on(Side::Cpu), &st);
        expect_rejected(rc, st, "loc", "cpu:0");
    }
    {
        SCOPED_TRACE("compress, kv_cache on the CPU");
        kpool_status st{};
        HostTensor host_cache = c.cache0;
        const kpool_tensor hc = host_cache.desc();
        const kpool_status_code rc = compress(&hc, c.slot_k.on(Side::Gpu), c.loc.on(Side::Gpu), &st);
        expect_rejected(rc, st, "kv_cache", "cpu:0");
        EXPECT_TRUE(same_bytes("host kv_cache", c.cache0.bytes(), host_cache.bytes()));
    }
    {
        SCOPED_TRACE("compress, slot_k (the first tensor checked) on the CPU");
        kpool_status st{};
        const kpool_status_code rc = compress(cache.on(Side::Gpu), c.slot_k.on(Side::Cpu), c.loc.on(Side::Gpu), &st);
        expect_rejected(rc, st, "slot_k", "cpu:0");
    }
    {
        SCOPED_TRACE("compress, kv_cache on cuda:1, the rest on cuda:0");
        kpool_tensor other = *cache.on(Side::Gpu);
        other.device_index = 1;
        kpool_status st{};
        const kpool_status_code rc = compress(&other, c.slot_k.on(Side::Gpu), c.loc.on(Side::Gpu), &st);
        expect_rejected(rc, st, "kv_cache", "cuda:1");
    }
    cache.download();
    EXPECT_TRUE(same_bytes("device kv_cache after rejected calls", c.cache0.bytes(), cache.gpu_host()));

    // Decode with the tail ring on the host.
    const int64_t ring = P;
    HostTensor tail0 = make_tail_cache(3, ring, false);
    fill_normal(tail0, rng);
    DecodeInputs d = make_decode_inputs(rng, 2, 2, P, ring, 3, num_blocks * block_size);
    Mirrored tail(gpu(), tail0), tsm(gpu(), d.tail_slot_mapping), dk(gpu(), d.key), ds(gpu(), d.slot_score),
        da(gpu(), d.ape), sm(gpu(), d.slot_mapping), pos(gpu(), d.positions);
    // The decode call with tail_kv_cache and positions on the sides given, the rest on the GPU.
    auto decode = [&](Side tail_side, Side positions_side, kpool_status *st) {
        return kpool_decode_update_and_maybe_write_cache_batched(
            cache.on(Side::Gpu), tail.on(tail_side), tsm.on(Side::Gpu), dk.on(Side::Gpu), ds.on(Side::Gpu),
            da.on(Side::Gpu), sm.on(Side::Gpu), pos.on(positions_side), P, kD, 1, &ex, st);
    };
    {
        SCOPED_TRACE("decode, tail_kv_cache on the CPU");
        kpool_status st{};
        expect_rejected(decode(Side::Cpu, Side::Gpu, &st), st, "tail_kv_cache", "cpu:0");
        EXPECT_TRUE(same_bytes("host tail_kv_cache", tail0.bytes(), tail.cpu().bytes()));
    }
    {
        SCOPED_TRACE("decode, positions on the CPU");
        kpool_status st{};
        expect_rejected(decode(Side::Gpu, Side::Cpu, &st), st, "positions", "cpu:0");
    }
    cache.download(), tail.download();
    EXPECT_TRUE(same_bytes("device kv_cache after rejected decodes", c.cache0.bytes(), cache.gpu_host()));
    EXPECT_TRUE(same_bytes("device tail_kv_cache after rejected decodes", tail0.bytes(), tail.gpu_host()));

    // Seed with the keys on the host; fwht with the scale on the host; an
    // optional page table on the host.
    SeedInputs s = make_seed_inputs(rng, P, ring, KPOOL_DTYPE_INT32, 3);
    Mirrored skey(gpu(), s.key), sgate(gpu(), s.gate_score), tslot(gpu(), s.tslot);
    {
        SCOPED_TRACE("seed, key on the CPU");
        kpool_status st{};
        const kpool_status_code rc =
            kpool_seed_tail_cache(tail.on(Side::Gpu), skey.on(Side::Cpu), sgate.on(Side::Gpu),
                                  tslot.on(Side::Gpu), P, kD, &ex, &st);
        expect_rejected(rc, st, "key", "cpu:0");
    }
    Mirrored q(gpu(), make_fwht_q(rng, 3)), fp8(gpu(), HostTensor(KPOOL_DTYPE_UINT8, {3, kD})),
        qs(gpu(), HostTensor(KPOOL_DTYPE_FLOAT32, {3}));
    {
        SCOPED_TRACE("fwht, q_scale on the CPU");
        kpool_status st{};
        const kpool_status_code rc =
            kpool_fwht128_quant_fp8(q.on(Side::Gpu), fp8.on(Side::Gpu), qs.on(Side::Cpu), &ex, &st);
        expect_rejected(rc, st, "q_scale", "cpu:0");
    }
    GroupInputs g = make_group_inputs(rng, P, KPOOL_DTYPE_INT32, 3, 2);
    TokenMapInputs tm = make_token_map(rng, TokenMap::kPageTable, 3, 16);
    Mirrored gids(gpu(), g.ids), gvalid(gpu(), g.valid), table(gpu(), tm.page_table),
        out(gpu(), HostTensor(KPOOL_DTYPE_INT32, {3, 2 * P}));
    {
        SCOPED_TRACE("expand_pools_to_tokens, page_table on the CPU");
        kpool_status st{};
        const kpool_status_code rc =
            kpool_expand_pools_to_tokens(gids.on(Side::Gpu), gvalid.on(Side::Gpu), table.on(Side::Cpu),
                                         nullptr, out.on(Side::Gpu), 2 * P, P, &ex, &st);
        expect_rejected(rc, st, "page_table", "cpu:0");
    }
}

}  // namespace
}  // namespace kpool_test
