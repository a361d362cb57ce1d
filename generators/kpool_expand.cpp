// The pool-level top-k helpers: selected pool ids -> token ids (optionally
// through a page table or plus per-row offsets), and the request's trailing
// incomplete pool appended after them.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

namespace {

// Where emitted token ids go (SPEC op 6).
enum TokenMap { kIdentity = 0, kPageTable = 1, kOffsets = 2 };

// A token id mapped through the page table (col, row) (index clamped to its
// width, as the reference's gather) or shifted by the row's offset (row).
// Either input is absent (stride 0) where `mode` does not use it.
template <typename PageTable, typename Offsets>
Expr map_token(Expr token, Expr row, Expr mode, PageTable &page_table, Offsets &offsets) {
    page_table.dim(0).set_stride(Expr());
    offsets.dim(0).set_stride(Expr());
    Func table = page_table, offset = offsets;
    Expr table_width = page_table.dim(0).extent();
    token = cast<int64_t>(token);
    Expr gathered = table(cast<int32_t>(clamp(token, 0, cast<int64_t>(table_width) - 1)), row);
    Expr shifted = cast<int32_t>(token + offset(row));
    return select(mode == kPageTable, gathered, mode == kOffsets, shifted, cast<int32_t>(token));
}

// The token map's estimates: identity, a page table of a long sequence.
template <typename PageTable, typename Offsets, typename Mode>
void estimate_token_map(PageTable &page_table, Offsets &offsets, Mode &mode) {
    using namespace estimate;
    page_table.set_estimates({{0, kSeqLen}, {0, kExpandRows}});
    offsets.set_estimates({{0, kExpandRows}});
    mode.set_estimate(0);
}

// Index inputs read with -1 past their first `extent` columns. The runtime
// passes a one-column stand-in when extent is 0 (an empty selection), since
// Halide needs a non-empty buffer to clamp into.
Func minus_one_outside(const Func &f, Expr extent) {
    return BoundaryConditions::constant_exterior(f, cast(f.type(), -1), {{0, max(extent, 1)}, {Expr(), Expr()}});
}

}  // namespace

class ExpandPoolsAndAppendTail : public KpoolGenerator<ExpandPoolsAndAppendTail, ExpandStages> {
public:
    Input<Buffer<void, 2>> pool_ids{"pool_ids"};      // (g, row) int32 or int64
    Input<int> groups{"groups"};                      // G: pool_ids columns in use
    Input<Buffer<int32_t, 1>> seq_lens{"seq_lens"};   // (row)
    Input<int> pool_size{"pool_size"};
    Input<bool> bound_pool_ids{"bound_pool_ids"};
    Output<Buffer<int32_t, 2>> out{"out"};            // (col, row)

    void generate() {
        Var c = stages.col, row = stages.row;
        Expr P = pool_size;
        // Column c's pool and place in it, for a power-of-two P (the runtime
        // checks): shifts and masks, not an integer division per element.
        Divisor pool(P, Divisor::Kind::Pow2);
        Expr topk = groups * P;
        Func ids = minus_one_outside(pool_ids, groups);
        Expr seq_len = seq_lens(row);
        Expr pool_len = pool.div(seq_len);
        Expr tail_start = pool_len * P;

        // An autoscheduler cannot bound a shift by a runtime amount: its twin
        // reads the group clamped to [0, G], which changes nothing (a column
        // past the pools, group G and on, reads -1 and takes the tail).
        Expr group = using_autoscheduler() ? clamp(pool.div(c), 0, groups) : pool.div(c);
        Expr id = cast<int64_t>(ids(group, row));
        Expr valid = id >= 0 && !(bound_pool_ids && id >= cast<int64_t>(pool_len));
        Expr history = select(valid, cast<int32_t>(id * P + pool.mod(c)), -1);
        Expr tail_off = c - topk;
        // A negative seq_len has no tail, as in the reference (whose integer
        // division truncates: its tail count is then <= 0).
        Expr tail = select(seq_len >= 0 && tail_off < seq_len - tail_start, tail_start + tail_off, -1);
        out(c, row) = select(c < topk, history, tail);
        seq_lens.dim(0).set_stride(Expr());
        stages.define(ExpandStages::Kind::PoolsAndAppendTail, out, pool_size);
    }

    void schedule() {
        using namespace estimate;
        pool_ids.set_estimates({{0, kTopk / kPoolSize}, {0, kExpandRows}});
        groups.set_estimate(kTopk / kPoolSize);
        seq_lens.set_estimates({{0, kExpandRows}});
        pool_size.set_estimate(kMaxPoolSize);
        bound_pool_ids.set_estimate(true);
        out.set_estimates({{0, kTopk + kPoolSize - 1}, {0, kExpandRows}});
        schedule_with(schedule_expand);
    }
};

class ExpandPoolsToTokens : public KpoolGenerator<ExpandPoolsToTokens, ExpandStages> {
public:
    Input<Buffer<void, 2>> group_ids{"group_ids"};         // (g, row) int32 or int64
    Input<Buffer<uint8_t, 2>> group_valid{"group_valid"};  // (g, row)
    Input<Buffer<int32_t, 2>> page_table{"page_table"};    // (col, row); stride 0 when absent
    Input<Buffer<int64_t, 1>> topk_offsets{"topk_offsets"};  // (row); stride 0 when absent
    Input<int> token_map{"token_map"};
    Input<int> pool_size{"pool_size"};
    Output<Buffer<int32_t, 2>> out{"out"};  // (col, row), topk columns

    void generate() {
        Var c = stages.col, row = stages.row;
        Expr P = pool_size;
        Divisor pool(P, Divisor::Kind::Pow2);  // a power of two (the runtime checks)
        // The output has G * P columns, so the group is < G; the clamp only
        // tells bounds inference so (it cannot bound a shift).
        Expr g = clamp(pool.div(c), 0, group_ids.dim(0).extent() - 1);
        Expr token = cast<int64_t>(group_ids(g, row)) * P + pool.mod(c);
        Expr mapped = map_token(token, row, token_map, page_table, topk_offsets);
        out(c, row) = select(group_valid(g, row) != 0, mapped, -1);
        stages.define(ExpandStages::Kind::PoolsToTokens, out, pool_size);
    }

    void schedule() {
        using namespace estimate;
        group_ids.set_estimates({{0, kTopk / kPoolSize}, {0, kExpandRows}});
        group_valid.set_estimates({{0, kTopk / kPoolSize}, {0, kExpandRows}});
        estimate_token_map(page_table, topk_offsets, token_map);
        pool_size.set_estimate(kMaxPoolSize);
        out.set_estimates({{0, kTopk}, {0, kExpandRows}});
        schedule_with(schedule_expand);
    }
};

class AppendTailToTopk : public KpoolGenerator<AppendTailToTopk, ExpandStages> {
public:
    Input<Buffer<int32_t, 2>> topk_result{"topk_result"};  // (col, row)
    Input<int> history_cols{"history_cols"};               // C: topk_result columns in use
    Input<Buffer<int32_t, 1>> seq_lens{"seq_lens"};        // (row)
    Input<Buffer<int32_t, 1>> pool_lens{"pool_lens"};      // (row)
    Input<Buffer<int32_t, 2>> page_table{"page_table"};    // (col, row); stride 0 when absent
    Input<Buffer<int64_t, 1>> topk_offsets{"topk_offsets"};  // (row); stride 0 when absent
    Input<int> token_map{"token_map"};
    Input<int> pool_size{"pool_size"};
    Output<Buffer<int32_t, 2>> out{"out"};  // (col, row), C + P-1 columns

    void generate() {
        Var c = stages.col, row = stages.row;
        Func history = minus_one_outside(topk_result, history_cols);
        // In int64: pool_len * P and seq_len - pool_len * P leave the int32
        // range for hostile lengths (and Halide assumes int32 never wraps).
        Expr tail_start = cast<int64_t>(pool_lens(row)) * pool_size;
        Expr tail_off = cast<int64_t>(c) - history_cols;
        Expr is_tail = tail_off >= 0 && tail_off < cast<int64_t>(seq_lens(row)) - tail_start;
        Expr tail = map_token(tail_start + tail_off, row, token_map, page_table, topk_offsets);
        out(c, row) = select(is_tail, tail, c < history_cols, history(c, row), -1);
        seq_lens.dim(0).set_stride(Expr());
        pool_lens.dim(0).set_stride(Expr());
        stages.define(ExpandStages::Kind::AppendTail, out, pool_size);
    }

    void schedule() {
        using namespace estimate;
        topk_result.set_estimates({{0, kTopk}, {0, kExpandRows}});
        history_cols.set_estimate(kTopk);
        seq_lens.set_estimates({{0, kExpandRows}});
        pool_lens.set_estimates({{0, kExpandRows}});
        estimate_token_map(page_table, topk_offsets, token_map);
        pool_size.set_estimate(kMaxPoolSize);
        out.set_estimates({{0, kTopk + kPoolSize - 1}, {0, kExpandRows}});
        schedule_with(schedule_expand);
    }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::ExpandPoolsAndAppendTail, kpool_expand_pools_and_append_tail)
HALIDE_REGISTER_GENERATOR(kpool::ExpandPoolsToTokens, kpool_expand_pools_to_tokens)
HALIDE_REGISTER_GENERATOR(kpool::AppendTailToTopk, kpool_append_tail_to_topk)
