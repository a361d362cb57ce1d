// The CUDA kernels' host-side bounds, checked where CI runs (no GPU): a
// Halide pipeline given buffers with neither host nor device memory runs in
// bounds-query mode, which computes the region of every input the kernel
// would read and returns before any launch (the kernels' loading is a no-op
// here: no_device.cpp). A launch whose required
// region leaves an input fails with Halide error -4 on the GPU; here every
// region is checked to lie inside its input, for batches that do and do not
// fill the schedule's blocks (the warp-per-request layout puts several
// requests in a block; its request loop is rounded up and every per-token
// read must clamp its request).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "HalideRuntime.h"

#include "kpool_sm90_compress_to_rows_p16_bf16.h"
#include "kpool_sm90_compress_to_rows_p4_bf16.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p1.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p16.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p2.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p32.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p4.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p64.h"
#include "kpool_sm90_compress_tokens_and_seed_words_p8.h"
#include "kpool_sm90_decode_update_by_request_p16.h"
#include "kpool_sm90_decode_update_by_request_p16_triton.h"
#include "kpool_sm90_decode_update_by_request_p4.h"
#include "kpool_sm90_decode_update_by_request_p4_triton.h"
#include "kpool_sm90_decode_update_p16.h"
#include "kpool_sm90_decode_update_p16_triton.h"
#include "kpool_sm90_decode_update_p4.h"
#include "kpool_sm90_decode_update_p4_triton.h"
#include "kpool_sm90_fwht128_quant_fp8.h"
#include "kpool_sm90_fwht128_quant_fp8_words.h"

namespace kpool_test {
namespace {


// A buffer of the given shape (dense, innermost first) and no memory: a
// bounds query. `given` keeps the shape the kernel was asked about; the
// query overwrites `dims` with the region it requires.
struct QueryBuffer {
    std::string name;
    std::vector<halide_dimension_t> given, dims;
    halide_buffer_t raw{};

    QueryBuffer(std::string n, halide_type_t type, std::vector<int32_t> extents) : name(std::move(n)) {
        int32_t stride = 1;
        for (int32_t e : extents) {
            given.emplace_back(0, e, stride);
            stride *= e;
        }
        dims = given;
        raw.type = type;
        raw.dimensions = static_cast<int32_t>(dims.size());
        raw.dim = dims.data();
    }
    QueryBuffer(const QueryBuffer &) = delete;

    // Every dimension's required region inside the given one.
    void expect_inside(const std::string &call) const {
        for (size_t i = 0; i < dims.size(); i++) {
            EXPECT_GE(dims[i].min, given[i].min) << call << ": " << name << " dimension " << i;
            EXPECT_LE(int64_t(dims[i].min) + dims[i].extent, int64_t(given[i].min) + given[i].extent)
                << call << ": " << name << " dimension " << i << " requires [" << dims[i].min << ", "
                << dims[i].min + dims[i].extent << ") of " << given[i].extent;
        }
    }
};

using DecodeUpdateKernel = int (*)(void const *, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *,
                                   halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, bool,
                                   halide_buffer_t *, halide_buffer_t *, halide_buffer_t *);

struct NamedDecodeKernel {
    const char *name;
    int pool_size;
    DecodeUpdateKernel run;
};

const NamedDecodeKernel kSm90DecodeKernels[] = {
    {"sm90 warp per token P=4", 4, kpool_sm90_decode_update_p4},
    {"sm90 warp per token P=4 triton", 4, kpool_sm90_decode_update_p4_triton},
    {"sm90 warp per token P=16", 16, kpool_sm90_decode_update_p16},
    {"sm90 warp per token P=16 triton", 16, kpool_sm90_decode_update_p16_triton},
    {"sm90 warp per request P=4", 4, kpool_sm90_decode_update_by_request_p4},
    {"sm90 warp per request P=4 triton", 4, kpool_sm90_decode_update_by_request_p4_triton},
    {"sm90 warp per request P=16", 16, kpool_sm90_decode_update_by_request_p16},
    {"sm90 warp per request P=16 triton", 16, kpool_sm90_decode_update_by_request_p16_triton},
};

TEST(CudaBounds, DecodeUpdateReadsInsideItsInputsForAnyBatch) {
    constexpr int32_t kHeadDim = 128, kPageTokens = 64, kPages = 8;
    for (const NamedDecodeKernel &k : kSm90DecodeKernels) {
        for (int32_t requests = 1; requests <= 9; requests++) {
            for (int32_t next_n = 1; next_n <= 3; next_n++) {
                const std::string call = std::string(k.name) + ", " + std::to_string(requests) + " requests of " +
                                         std::to_string(next_n) + " tokens";
                const int32_t ring = 2 * k.pool_size;
                QueryBuffer tail("tail", halide_type_of<uint16_t>(), {kHeadDim, ring, 2, requests});
                QueryBuffer tail_slots("tail_slot_mapping", halide_type_of<int32_t>(), {next_n, requests});
                QueryBuffer key("key", halide_type_of<uint16_t>(), {kHeadDim, next_n, requests});
                QueryBuffer score("slot_score", halide_type_of<uint16_t>(), {kHeadDim, next_n, requests});
                QueryBuffer ape("ape", halide_type_of<float>(), {kHeadDim, k.pool_size});
                QueryBuffer slots("slot_mapping", halide_type_of<int32_t>(), {next_n, requests});
                QueryBuffer positions("positions", halide_type_of<int32_t>(), {next_n, requests});
                QueryBuffer codes("cache codes", halide_type_of<uint8_t>(), {kHeadDim, kPageTokens, kPages});
                QueryBuffer scales("cache scales", halide_type_of<float>(), {kHeadDim, kPageTokens, kPages});
                QueryBuffer tail_out("tail_out", halide_type_of<uint16_t>(), {kHeadDim, ring, 2, requests});
                const int rc = k.run(nullptr, &tail.raw, &tail_slots.raw, &key.raw, &score.raw, &ape.raw, &slots.raw,
                                     &positions.raw, true, &codes.raw, &scales.raw, &tail_out.raw);
                ASSERT_EQ(rc, 0) << call;
                for (const QueryBuffer *in : {&tail, &tail_slots, &key, &score, &ape, &slots, &positions}) {
                    in->expect_inside(call);
                }
            }
        }
    }
}

// Pools and rows around and between the blocks of the schedules.
const int32_t kCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 31, 33, 63, 65, 127, 129, 1000};

TEST(CudaBounds, CompressReadsInsideItsInputsForAnyPoolCount) {
    constexpr int32_t kHeadDim = 128;
    // (user context, slot_k, slot_score, ape, round_scale, aligned_data, codes, scales)
    using CompressToRows = int (*)(void const *, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, bool, bool,
                                   halide_buffer_t *, halide_buffer_t *);
    const struct {
        const char *name;
        int pool_size;
        CompressToRows run;
    } kernels[] = {{"sm90 compress_to_rows P=4", 4, kpool_sm90_compress_to_rows_p4_bf16},
                   {"sm90 compress_to_rows P=16", 16, kpool_sm90_compress_to_rows_p16_bf16}};
    for (const auto &k : kernels) {
        for (int32_t pools : kCounts) {
            const std::string call = std::string(k.name) + ", " + std::to_string(pools) + " pools";
            QueryBuffer slot_k("slot_k", halide_type_of<uint16_t>(), {kHeadDim, k.pool_size, pools});
            QueryBuffer score("slot_score", halide_type_of<uint16_t>(), {kHeadDim, k.pool_size, pools});
            QueryBuffer ape("ape", halide_type_of<float>(), {kHeadDim, k.pool_size});
            QueryBuffer codes("codes", halide_type_of<uint8_t>(), {kHeadDim, pools});
            QueryBuffer scales("scales", halide_type_of<float>(), {kHeadDim, pools});
            for (bool aligned : {false, true}) {
                ASSERT_EQ(k.run(nullptr, &slot_k.raw, &score.raw, &ape.raw, true, aligned, &codes.raw, &scales.raw), 0)
                    << call;
                for (const QueryBuffer *in : {&slot_k, &score, &ape}) {
                    in->expect_inside(call);
                }
            }
        }
    }
}

// The prefill insert with its seed in one kernel (the compress's blocks of
// G pools and the seed's of 32 G tokens fused into one grid): the token
// rows and the overlapping pool views of them, at every pool size, for
// batches of one pool up to many (a batch of few pools has more seed
// blocks than compress blocks).
TEST(CudaBounds, CompressTokensAndSeedReadsInsideItsInputsForAnyTokenCount) {
    constexpr int32_t kHeadDim = 128, kWords = kHeadDim / 4, kPageTokens = 64, kPages = 4, kTailBlocks = 3;
    // (user context, slot_k, slot_score, ape, round_scale, aligned_data, loc, key, gate_score, tslot,
    // cache codes, cache scales, tail)
    using CompressTokensAndSeed = int (*)(void const *, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, bool,
                                          bool, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *,
                                          halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *);
    const struct {
        int pool_size;
        CompressTokensAndSeed run;
    } kernels[] = {{1, kpool_sm90_compress_tokens_and_seed_words_p1},   {2, kpool_sm90_compress_tokens_and_seed_words_p2},
                   {4, kpool_sm90_compress_tokens_and_seed_words_p4},   {8, kpool_sm90_compress_tokens_and_seed_words_p8},
                   {16, kpool_sm90_compress_tokens_and_seed_words_p16}, {32, kpool_sm90_compress_tokens_and_seed_words_p32},
                   {64, kpool_sm90_compress_tokens_and_seed_words_p64}};
    for (const auto &k : kernels) {
        const int32_t P = k.pool_size;
        for (int32_t extra : {0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 100, 1000}) {
            const int32_t tokens = P + extra, pools = tokens - P + 1;
            const std::string call = "sm90 compress_tokens_and_seed_words P=" + std::to_string(P) + ", " +
                                     std::to_string(tokens) + " tokens";
            // The pool views: pool p is tokens p .. p + P - 1 (what the runtime
            // passes: strides of one token row in both dimensions).
            QueryBuffer slot_k("slot_k", halide_type_of<uint64_t>(), {kWords, P, pools});
            QueryBuffer score("slot_score", halide_type_of<uint64_t>(), {kWords, P, pools});
            for (QueryBuffer *view : {&slot_k, &score}) {
                view->given[2].stride = kWords;
                view->dims = view->given;
            }
            QueryBuffer ape("ape", halide_type_of<float>(), {kHeadDim, P});
            QueryBuffer loc("loc", halide_type_of<int32_t>(), {pools});
            QueryBuffer key("key", halide_type_of<uint16_t>(), {kHeadDim, tokens});
            QueryBuffer gate("gate_score", halide_type_of<uint16_t>(), {kHeadDim, tokens});
            QueryBuffer tslot("tslot", halide_type_of<int32_t>(), {tokens});
            QueryBuffer codes("cache codes", halide_type_of<uint8_t>(), {kHeadDim, kPageTokens, kPages});
            QueryBuffer scales("cache scales", halide_type_of<float>(), {kHeadDim, kPageTokens, kPages});
            QueryBuffer tail("tail", halide_type_of<uint16_t>(), {kHeadDim, P, 2, kTailBlocks});
            ASSERT_EQ(k.run(nullptr, &slot_k.raw, &score.raw, &ape.raw, true, true, &loc.raw, &key.raw, &gate.raw,
                            &tslot.raw, &codes.raw, &scales.raw, &tail.raw),
                      0)
                << call;
            for (const QueryBuffer *in : {&slot_k, &score, &ape, &loc, &key, &gate, &tslot}) {
                in->expect_inside(call);
            }
        }
    }
}

TEST(CudaBounds, FwhtReadsInsideItsInputForAnyRowCount) {
    for (int32_t rows : kCounts) {
        const std::string call = "sm90 fwht128_quant_fp8, " + std::to_string(rows) + " rows";
        QueryBuffer q("q", halide_type_of<uint16_t>(), {128, rows});
        QueryBuffer codes("codes", halide_type_of<uint8_t>(), {128, rows});
        QueryBuffer scales("scales", halide_type_of<float>(), {128, rows});
        ASSERT_EQ(kpool_sm90_fwht128_quant_fp8(nullptr, &q.raw, &codes.raw, &scales.raw), 0) << call;
        q.expect_inside(call);

        // The words kernel: bf16 pairs (uint32) in, words of 8 codes (uint64) out.
        QueryBuffer words("q words", halide_type_of<uint32_t>(), {64, rows});
        QueryBuffer code_words("code words", halide_type_of<uint64_t>(), {16, rows});
        QueryBuffer word_scales("scales", halide_type_of<float>(), {16, rows});
        ASSERT_EQ(kpool_sm90_fwht128_quant_fp8_words(nullptr, &words.raw, &code_words.raw, &word_scales.raw), 0)
            << call << " (words)";
        words.expect_inside(call + " (words)");
    }
}

}  // namespace
}  // namespace kpool_test
