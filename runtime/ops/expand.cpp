// The index ops: pools to the token ids the sparse attention reads
// (expand_pools_and_append_tail, expand_pools_to_tokens, append_tail_to_topk)
// and the history budget they are sized by.
#include <vector>

#include "ops.h"

namespace kpool::rt {

namespace {

// [n] or [n, 1] as a 1-D buffer over n.
HalideBuffer wrap_vector(const TensorArg &a) {
    HalideBuffer b = wrap(a);
    return a.t->ndim == 2 ? b.sliced(0, 0) : b;
}

// Optional page table [R >= rows, W >= 1] (an engine's persistent block
// table: rows past the batch are not read) or offsets [rows] / [rows, 1],
// not both.
// The optional tensors, validated; the buffers are made by bind().
struct TokenMapArgs {
    int mode = 0;  // 0 identity, 1 page table, 2 offsets (kpool_expand.cpp)
    TensorArg page_table{}, offsets{};
    // `args` and the optional tensor given, for the call's placement.
    std::vector<const TensorArg *> with(std::vector<const TensorArg *> args) const {
        if (mode == 1) args.push_back(&page_table);
        if (mode == 2) args.push_back(&offsets);
        return args;
    }
    void bind(const Placement &where, int64_t rows, HalideBuffer &table, HalideBuffer &offs) const {
        table = mode == 1 ? wrap(page_table) : where.no_page_table(rows);
        offs = mode == 2 ? wrap_vector(offsets) : where.no_offsets(rows);
        if (mode == 1) where.attach(table);
        if (mode == 2) where.attach(offs);
    }
};

TokenMapArgs token_map(const kpool_tensor *page_table, const kpool_tensor *topk_offsets, int64_t rows) {
    TokenMapArgs m;
    if (page_table != nullptr && topk_offsets != nullptr) {
        throw invalid() << "page_table and topk_offsets are both given; pass at most one";
    }
    if (page_table != nullptr) {
        TensorArg pt = require_tensor("page_table", page_table, {KPOOL_DTYPE_INT32}, 2);
        if (pt.dim(0) < rows || pt.dim(1) < 1) {
            throw invalid() << "page_table has shape [" << pt.dim(0) << ", " << pt.dim(1) << "], expected [R >= "
                            << rows << ", W >= 1]";
        }
        require_int32_strides(pt);
        m.mode = 1;
        m.page_table = pt;
    } else if (topk_offsets != nullptr) {
        TensorArg off = require_tensor_ranks("topk_offsets", topk_offsets, {KPOOL_DTYPE_INT64}, {1, 2});
        require_dim(off, 0, rows, "rows");
        if (off.t->ndim == 2) {
            require_dim(off, 1, 1, "[rows, 1]");
        }
        require_int32_strides(off);
        m.mode = 2;
        m.offsets = off;
    }
    return m;
}

TensorArg require_int32_vector(const char *name, const kpool_tensor *t, int64_t rows) {
    TensorArg v = require_tensor(name, t, {KPOOL_DTYPE_INT32}, 1);
    require_dim(v, 0, rows, "rows");
    require_int32_strides(v);
    return v;
}

TensorArg require_out(const kpool_tensor *t, int64_t rows, int64_t cols) {
    TensorArg out = require_tensor("out", t, {KPOOL_DTYPE_INT32}, 2);
    require_dim(out, 0, rows, "rows");
    require_dim(out, 1, cols, "output columns");
    require_inner_contiguous(out);
    require_disjoint_rows(out);
    return out;
}

void require_topk_multiple(int64_t topk, int32_t pool_size) {
    if (topk < 0 || topk % pool_size != 0) {
        throw invalid() << "topk = " << topk << " is not a non-negative multiple of pool_size = " << pool_size;
    }
}

}  // namespace

void expand_pools_and_append_tail(const kpool_tensor *pool_ids_, const kpool_tensor *seq_lens_,
                                  const kpool_tensor *out_, int32_t pool_size, int32_t bound_pool_ids,
                                  const kpool_exec *exec) {
    require_pool_size(pool_size);
    TensorArg ids = require_tensor("pool_ids", pool_ids_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 2);
    require_inner_contiguous(ids);
    const int64_t rows = ids.dim(0);
    TensorArg seq_lens = require_int32_vector("seq_lens", seq_lens_, rows);
    TensorArg out = require_out(out_, rows, ids.dim(1) * pool_size + pool_size - 1);
    // A negative seq_len is computed as the reference does (no tail, and
    // with bound_pool_ids no history): it addresses no memory.
    Placement where({&ids, &seq_lens, &out}, exec);
    if (rows == 0 || out.dim(1) == 0) {
        return;
    }
    const int32_t groups = static_cast<int32_t>(ids.dim(1));
    HalideBuffer i = groups > 0 ? where.attach(wrap(ids)) : where.no_columns(ids.t->dtype, rows);
    HalideBuffer s = wrap(seq_lens), o = wrap(out);
    where.launch<Kernel::EXPAND_POOLS_AND_APPEND_TAIL>("expand_pools_and_append_tail", 0, index_type(ids),
                                                       i.raw_buffer(), groups, where.attach(s).raw_buffer(),
                                                       int32_t(pool_size), bound_pool_ids != 0,
                                                       where.attach(o).raw_buffer());
}

void expand_pools_to_tokens(const kpool_tensor *group_ids_, const kpool_tensor *group_valid_,
                            const kpool_tensor *page_table_, const kpool_tensor *topk_offsets_,
                            const kpool_tensor *out_, int32_t topk, int32_t pool_size, const kpool_exec *exec) {
    require_pool_size(pool_size);
    require_topk_multiple(topk, pool_size);
    TensorArg ids = require_tensor("group_ids", group_ids_, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}, 2);
    require_dim(ids, 1, topk / pool_size, "topk / pool_size groups");
    require_inner_contiguous(ids);
    const int64_t rows = ids.dim(0);
    TensorArg valid = require_tensor("group_valid", group_valid_, {KPOOL_DTYPE_BOOL, KPOOL_DTYPE_UINT8}, 2);
    require_same_dim(valid, 0, ids, 0);
    require_same_dim(valid, 1, ids, 1);
    require_inner_contiguous(valid);
    TokenMapArgs map = token_map(page_table_, topk_offsets_, rows);
    TensorArg out = require_out(out_, rows, topk);
    Placement where(map.with({&ids, &valid, &out}), exec);
    if (rows == 0 || topk == 0) {
        return;
    }
    HalideBuffer g = wrap(ids), v = wrap(valid), o = wrap(out), table, offsets;
    map.bind(where, rows, table, offsets);
    where.launch<Kernel::EXPAND_POOLS_TO_TOKENS>("expand_pools_to_tokens", 0, index_type(ids),
                                                 where.attach(g).raw_buffer(), where.attach(v).raw_buffer(),
                                                 table.raw_buffer(), offsets.raw_buffer(), int32_t(map.mode),
                                                 int32_t(pool_size), where.attach(o).raw_buffer());
}

void append_tail_to_topk(const kpool_tensor *topk_result_, const kpool_tensor *seq_lens_,
                         const kpool_tensor *pool_lens_, const kpool_tensor *page_table_,
                         const kpool_tensor *topk_offsets_, const kpool_tensor *out_, int32_t pool_size,
                         const kpool_exec *exec) {
    require_pool_size(pool_size);
    TensorArg topk = require_tensor("topk_result", topk_result_, {KPOOL_DTYPE_INT32}, 2);
    require_inner_contiguous(topk);
    const int64_t rows = topk.dim(0);
    TensorArg seq_lens = require_int32_vector("seq_lens", seq_lens_, rows);
    TensorArg pool_lens = require_int32_vector("pool_lens", pool_lens_, rows);
    TokenMapArgs map = token_map(page_table_, topk_offsets_, rows);
    TensorArg out = require_out(out_, rows, topk.dim(1) + pool_size - 1);
    Placement where(map.with({&topk, &seq_lens, &pool_lens, &out}), exec);
    if (rows == 0 || out.dim(1) == 0) {
        return;
    }
    const int32_t history_cols = static_cast<int32_t>(topk.dim(1));
    HalideBuffer t = history_cols > 0 ? where.attach(wrap(topk)) : where.no_columns(KPOOL_DTYPE_INT32, rows);
    HalideBuffer s = wrap(seq_lens), p = wrap(pool_lens), o = wrap(out), table, offsets;
    map.bind(where, rows, table, offsets);
    where.launch<Kernel::APPEND_TAIL_TO_TOPK>("append_tail_to_topk", 0, ElementType::none, t.raw_buffer(), history_cols,
                                              where.attach(s).raw_buffer(), where.attach(p).raw_buffer(),
                                              table.raw_buffer(), offsets.raw_buffer(), int32_t(map.mode),
                                              int32_t(pool_size), where.attach(o).raw_buffer());
}

// Arithmetic only, so the reference's rule: any positive pool_size (not just
// the kernels' powers of two) and any topk it divides.
void history_group_budget_for_topk(int64_t topk, int32_t pool_size, int64_t *groups) {
    if (pool_size < 1) {
        throw invalid() << "pool_size = " << pool_size << " is not positive";
    }
    if (groups == nullptr) {
        throw invalid() << "groups is NULL";
    }
    if (topk % pool_size != 0) {
        throw invalid() << "topk = " << topk << " is not a multiple of pool_size = " << pool_size;
    }
    *groups = topk / pool_size;
}

}  // namespace kpool::rt
