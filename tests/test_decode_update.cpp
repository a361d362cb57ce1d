// The GPUs' one-kernel decode (kpool_decode_update: a request's completions,
// then the stashes of its tokens that no later one overwrites) built for the
// CPU (kpool_cpu_decode_update_p*, CMakeLists.txt; _as_<family>: with that
// GPU family's row layout, the algorithm both of its CUDA decode layouts
// run, by shifts where ring and page are powers of two) and checked byte for byte
// against the CPU's two kernels through the C API, past next_n = P and at
// RING = P, 2P, 3P; _as_sm90_block: the block-per-request layout's rows (a
// dim a thread of four warps, each warp's absmax before the block's);
// _as_sm90_request: the warp per request's, which reads the ring as the
// call's earlier tokens stashed it (a request's tokens in order). A
// schedule cannot change what an algorithm computes:
// this holds the algorithm every GPU family runs to the contract here, where
// CI runs; its CUDA schedule is checked on the GPU (GpuDecode).
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "HalideBuffer.h"
#include "kpool_cpu_decode_update_as_sm80_p16.h"
#include "kpool_cpu_decode_update_as_sm80_p4.h"
#include "kpool_cpu_decode_update_as_sm90_p16.h"
#include "kpool_cpu_decode_update_as_sm90_p4.h"
#include "kpool_cpu_decode_update_as_sm90_block_p16.h"
#include "kpool_cpu_decode_update_as_sm90_block_p4.h"
#include "kpool_cpu_decode_update_as_sm90_request_p16.h"
#include "kpool_cpu_decode_update_as_sm90_request_p4.h"
#include "kpool_cpu_decode_update_p16.h"
#include "kpool_cpu_decode_update_p4.h"
#include "test_inputs.h"
#include "test_util.h"

namespace kpool_test {
namespace {

using Halide::Runtime::Buffer;
using ::testing::Combine;
using ::testing::Values;

using DecodeUpdateKernel = int (*)(halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, halide_buffer_t *,
                                   halide_buffer_t *, halide_buffer_t *, halide_buffer_t *, bool, halide_buffer_t *,
                                   halide_buffer_t *, halide_buffer_t *);

// A Halide view of `t`'s bytes from `offset`: dims innermost first, strides
// in elements of T.
template <typename T>
Buffer<T> view(const HostTensor &t, int64_t offset, std::vector<halide_dimension_t> dims) {
    auto *base = static_cast<uint8_t *>(t.desc().data) + offset;
    return Buffer<T>(reinterpret_cast<T *>(base), static_cast<int>(dims.size()), dims.data());
}

int i32(int64_t x) { return static_cast<int>(x); }

// [B, N] per-token maps as (token, request); [B, N, 128] rows as (d, token, request).
Buffer<int32_t> per_token(const HostTensor &t) {
    return view<int32_t>(t, 0, {{0, i32(t.shape(1)), i32(t.strides()[1])}, {0, i32(t.shape(0)), i32(t.strides()[0])}});
}
Buffer<uint16_t> rows(const HostTensor &t) {
    return view<uint16_t>(t, 0, {{0, kD, 1}, {0, i32(t.shape(1)), i32(t.strides()[1])},
                                 {0, i32(t.shape(0)), i32(t.strides()[0])}});
}
// The ring [blocks, 2, RING, 128] as (d, ring_pos, half, block).
Buffer<uint16_t> ring_view(const HostTensor &tail) {
    return view<uint16_t>(tail, 0, {{0, kD, 1}, {0, i32(tail.shape(2)), kD}, {0, 2, i32(tail.strides()[1])},
                                    {0, i32(tail.shape(0)), i32(tail.strides()[0])}});
}

using DecodeUpdateParam = std::tuple<std::string, int, int, int>;  // layout of, P, RING / P, next_n
class DecodeUpdateOnCpu : public ::testing::TestWithParam<DecodeUpdateParam> {};

DecodeUpdateKernel decode_update_kernel(const std::string &layout_of, int P) {
    if (layout_of == "sm80") {
        return P == 4 ? kpool_cpu_decode_update_as_sm80_p4 : kpool_cpu_decode_update_as_sm80_p16;
    }
    if (layout_of == "sm90") {
        return P == 4 ? kpool_cpu_decode_update_as_sm90_p4 : kpool_cpu_decode_update_as_sm90_p16;
    }
    if (layout_of == "sm90_block") {
        return P == 4 ? kpool_cpu_decode_update_as_sm90_block_p4 : kpool_cpu_decode_update_as_sm90_block_p16;
    }
    if (layout_of == "sm90_request") {
        return P == 4 ? kpool_cpu_decode_update_as_sm90_request_p4 : kpool_cpu_decode_update_as_sm90_request_p16;
    }
    return P == 4 ? kpool_cpu_decode_update_p4 : kpool_cpu_decode_update_p16;
}

TEST_P(DecodeUpdateOnCpu, MatchesTheTwoKernels) {
    const auto [layout_of, P, ring_mult, N] = GetParam();
    const DecodeUpdateKernel kernel = decode_update_kernel(layout_of, P);
    const int64_t ring = int64_t(P) * ring_mult, B = 11, tail_blocks = B + 3, block_size = 16;
    const int64_t num_blocks = (B * N) / block_size + 2;
    const bool round_scale = N % 2 == 1;
    std::mt19937 rng(6100 + P * 31 + ring_mult * 7 + N);
    HostTensor cache = make_kv_cache(num_blocks, block_size, /*padded=*/true);
    cache.fill_random_bytes(rng);
    HostTensor tail = make_tail_cache(tail_blocks, ring, /*padded=*/true);
    fill_normal(tail, rng, 1.5f);
    const DecodeInputs in = make_decode_inputs(rng, B, N, P, ring, tail_blocks, num_blocks * block_size);
    const std::vector<uint8_t> cache0 = cache.bytes(), tail0 = tail.bytes();

    // Expected: the C API on the CPU, which runs the two kernels.
    HostTensor cache_two = cache, tail_two = tail;
    const kpool_tensor c = cache_two.desc(), t = tail_two.desc(), ts = in.tail_slot_mapping.desc(),
                       k = in.key.desc(), s = in.slot_score.desc(), a = in.ape.desc(), sm = in.slot_mapping.desc(),
                       pos = in.positions.desc();
    const kpool_exec exact{nullptr, KPOOL_ARITHMETIC_EXACT};
    kpool_status st{};
    ASSERT_EQ(kpool_decode_update_and_maybe_write_cache_batched(&c, &t, &ts, &k, &s, &a, &sm, &pos, P, kD,
                                                                round_scale, &exact, &st),
              KPOOL_OK)
        << st.message;

    // The one kernel, on the cache's (codes, scales) views and the ring in place.
    const int64_t page = cache.strides()[0];
    Buffer<uint8_t> codes = view<uint8_t>(cache, 0, {{0, kD, 1}, {0, i32(block_size), kD}, {0, i32(num_blocks), i32(page)}});
    Buffer<float> scales = view<float>(cache, block_size * kD,
                                       {{0, kD, 0}, {0, i32(block_size), 1}, {0, i32(num_blocks), i32(page / 4)}});
    Buffer<uint16_t> ring_in = ring_view(tail), ring_out = ring_view(tail);
    Buffer<int32_t> tail_slots = per_token(in.tail_slot_mapping), slots = per_token(in.slot_mapping),
                    positions = per_token(in.positions);
    Buffer<uint16_t> key = rows(in.key), score = rows(in.slot_score);
    Buffer<float> ape = view<float>(in.ape, 0, {{0, kD, 1}, {0, P, kD}});
    ASSERT_EQ(kernel(ring_in, tail_slots, key, score, ape, slots, positions, round_scale, codes, scales, ring_out), 0);

    EXPECT_BYTES_EQ(cache_two, cache);
    EXPECT_BYTES_EQ(tail_two, tail);
    EXPECT_TRUE(tail.bytes() != tail0) << "the test stashed nothing";
    if (N >= P) {
        EXPECT_TRUE(cache.bytes() != cache0) << "the test completed no pool";
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, DecodeUpdateOnCpu,
                         Combine(Values("cpu", "sm80", "sm90", "sm90_block", "sm90_request"), Values(4, 16),
                                 Values(1, 2, 3), Values(1, 2, 3, 4, 5, 6, 7, 8, 20)),
                         [](const auto &info) {
                             return std::get<0>(info.param) + "_P" + std::to_string(std::get<1>(info.param)) +
                                    "_ring" + std::to_string(std::get<2>(info.param)) + "P_n" +
                                    std::to_string(std::get<3>(info.param));
                         });

}  // namespace
}  // namespace kpool_test
