// The expand ops on the GPU against the CPU, bit for bit: GpuExpandAndAppend
// (expand_pools_and_append_tail), GpuExpandToTokens (expand_pools_to_tokens),
// GpuAppendTail (append_tail_to_topk), and GpuExpandManyRows (past grid y).
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_fixtures.h"

namespace kpool_test {
namespace {

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

// expand_pools_and_append_tail: P x pool id dtype x bound_pool_ids.
class GpuExpandAndAppend : public GpuParamTest<ExpandTailParam> {};

TEST_P(GpuExpandAndAppend, MatchesCpu) {
    const auto [P, ids_dtype, bound] = GetParam();
    std::mt19937 rng(6000 + P * 3 + bound + 7 * (ids_dtype == KPOOL_DTYPE_INT64));
    const int64_t rows = 23, G = 9;
    ExpandInputs in = make_expand_inputs(rng, P, ids_dtype, rows, G);
    Mirrored ids(gpu(), in.pool_ids), seq(gpu(), in.seq_lens),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, G * P + P - 1})));
    run_both(
        [&, P = P, bound = bound](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_expand_pools_and_append_tail(ids.on(s), seq.on(s), out.on(s), P, bound, ex, st);
        },
        {{"out", &out}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuExpandAndAppend,
                         Combine(ValuesIn(kGpuExpandPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(false, true)),
                         ParamName());

// expand_pools_to_tokens: P x group id dtype x token map.
class GpuExpandToTokens : public GpuParamTest<ToTokensParam> {};

TEST_P(GpuExpandToTokens, MatchesCpu) {
    const auto [P, ids_dtype, map] = GetParam();
    std::mt19937 rng(7000 + P * 5 + int(map) + 11 * (ids_dtype == KPOOL_DTYPE_INT64));
    const int64_t rows = 17, G = 12, topk = G * P;
    GroupInputs g = make_group_inputs(rng, P, ids_dtype, rows, G);
    TokenMapInputs tm = make_token_map(rng, map, rows, 3000);
    Mirrored ids(gpu(), g.ids), valid(gpu(), g.valid), table(gpu(), tm.page_table),
        offsets(gpu(), tm.topk_offsets),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, topk})));
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_expand_pools_to_tokens(ids.on(s), valid.on(s), tm.has_table ? table.on(s) : nullptr,
                                                tm.has_offsets ? offsets.on(s) : nullptr, out.on(s),
                                                static_cast<int32_t>(topk), P, ex, st);
        },
        {{"out", &out}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuExpandToTokens,
                         Combine(ValuesIn(kGpuExpandPoolSizes), Values(KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64),
                                 Values(TokenMap::kNone, TokenMap::kPageTable, TokenMap::kOffsets1d,
                                        TokenMap::kOffsets2d)),
                         ParamName());

// append_tail_to_topk: P x token map.
class GpuAppendTail : public GpuParamTest<AppendParam> {};

TEST_P(GpuAppendTail, MatchesCpu) {
    const auto [P, map] = GetParam();
    std::mt19937 rng(8000 + P * 11 + int(map));
    const int64_t rows = 21, C = 40;
    AppendInputs in = make_append_inputs(rng, P, rows, C);
    TokenMapInputs tm = make_token_map(rng, map, rows, 3000);
    Mirrored topk(gpu(), in.topk), seq(gpu(), in.seq_lens), pools(gpu(), in.pool_lens),
        table(gpu(), tm.page_table), offsets(gpu(), tm.topk_offsets),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, C + P - 1})));
    run_both(
        [&, P = P](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_append_tail_to_topk(topk.on(s), seq.on(s), pools.on(s),
                                             tm.has_table ? table.on(s) : nullptr,
                                             tm.has_offsets ? offsets.on(s) : nullptr, out.on(s), P, ex, st);
        },
        {{"out", &out}});
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuAppendTail,
                         Combine(ValuesIn(kGpuExpandPoolSizes), Values(TokenMap::kNone, TokenMap::kPageTable,
                                                                 TokenMap::kOffsets1d, TokenMap::kOffsets2d)),
                         ParamName());

// More rows than grid y holds (65535; a prefill's query rows): rows are in
// grid x, every row is written.
class GpuExpandManyRows : public GpuTest {};

TEST_F(GpuExpandManyRows, MoreRowsThanGridYHolds) {
    const int P = 4;
    const int64_t rows = 70000, G = 3;
    std::mt19937 rng(8500);
    ExpandInputs in = make_expand_inputs(rng, P, KPOOL_DTYPE_INT32, rows, G);
    Mirrored ids(gpu(), in.pool_ids), seq(gpu(), in.seq_lens),
        out(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, G * P + P - 1})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_expand_pools_and_append_tail(ids.on(s), seq.on(s), out.on(s), P, 0, ex, st);
        },
        {{"out", &out}});
    AppendInputs a = make_append_inputs(rng, P, rows, 2 * P);
    Mirrored topk(gpu(), a.topk), aseq(gpu(), a.seq_lens), pools(gpu(), a.pool_lens),
        aout(gpu(), random_bytes_like(rng, HostTensor(KPOOL_DTYPE_INT32, {rows, 3 * P - 1})));
    run_both(
        [&](Side s, const kpool_exec *ex, kpool_status *st) {
            return kpool_append_tail_to_topk(topk.on(s), aseq.on(s), pools.on(s), nullptr, nullptr, aout.on(s), P,
                                             ex, st);
        },
        {{"out", &aout}});
}

}  // namespace
}  // namespace kpool_test
