// kpool_append_tail_to_topk: any topk_result, hostile seq_lens / pool_lens
// (negative, past each other, INT32 extremes), identity / page table /
// offsets.
#include "token_map.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_append_tail_to_topk";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int64_t rows = count_value(in, 8, 12);
    const int64_t cols = in.range<int64_t>(0, 40);

    std::vector<int64_t> topk, seq_lens, pool_lens;
    for (int64_t i = 0; i < rows * cols; i++) topk.push_back(int32_t(in.next()));
    const int32_t i32max = std::numeric_limits<int32_t>::max(), i32min = std::numeric_limits<int32_t>::min();
    for (int64_t r = 0; r < rows; r++) {
        int64_t len = in.range<int64_t>(0, 4000), pools = len / P;
        if (in.chance(32)) {
            const int64_t v[] = {-1, i32min, i32max, 0, int64_t(P) - 1};
            len = v[in.pick(5)];
        }
        if (in.chance(32)) {
            const int64_t v[] = {-1, i32min, i32max, pools + 1, pools - 1, i32max / P};
            pools = v[in.pick(6)];
        }
        seq_lens.push_back(len);
        pool_lens.push_back(pools);
    }
    Tensor topk_t = plan(in, "topk_result", KPOOL_DTYPE_INT32, {rows, cols});
    Tensor lens = plan(in, "seq_lens", KPOOL_DTYPE_INT32, {rows});
    Tensor plens = plan(in, "pool_lens", KPOOL_DTYPE_INT32, {rows});
    TokenMap map(in, rows);
    Tensor out = plan(in, "out", KPOOL_DTYPE_INT32, {rows, cols + P - 1});
    const bool overlapping = overlapping_out_rows(in, out);
    std::vector<Tensor *> tamperable{&topk_t, &lens, &plens, &out};
    for (Tensor *t : map.present()) tamperable.push_back(t);
    const bool tampered = maybe_tamper(in, tamperable);
    if (!allocate_all(in, {&topk_t, &lens, &plens, &map.page_table, &map.offsets, &out})) return 0;
    write_ints(topk_t, topk);
    write_ints(lens, seq_lens);
    write_ints(plens, pool_lens);
    map.fill(in);
    CallOptions opts(in, PoolOp::kNo);
    note("P %d pool_size %d", P, pool_size);

    const char *must_fail = first_reason({
        invalid_alone(topk_t, {KPOOL_DTYPE_INT32}),
        invalid_alone(lens, {KPOOL_DTYPE_INT32}),
        invalid_alone(plens, {KPOOL_DTYPE_INT32}),
        invalid_alone(out, {KPOOL_DTYPE_INT32}),
        map.invalid(rows),
        !tampered && pool_size != P ? "pool_size inconsistent with out" : nullptr,
        !tampered && overlapping ? "out rows that overlap" : nullptr,
    });

    const Snapshot before({&topk_t, &lens, &plens, &map.page_table, &map.offsets, &out});
    Tensor want = out;
    kpool_status st = poisoned_status();
    CallMemory mem({&topk_t, &lens, &plens, &map.page_table, &map.offsets, &out});
    const kpool_status_code rc = kpool_append_tail_to_topk(mem(topk_t), mem(lens), mem(plens), mem(map.page_table),
                                  mem(map.offsets), mem(out), pool_size, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    const bool clean = !tampered && !hostile && !overlapping && !(map.has_table && map.has_offsets) &&
                       !(map.has_table && map.page_table.shape[1] == 0);
    if (!settle(rc, st, opts, op, before, must_fail, clean)) return 0;

    for (Tensor *t : {&topk_t, &lens, &plens, &map.page_table, &map.offsets}) {
        check_bytes(*t, before.of(*t), op, "an input changed");
    }
    const Desc t(topk_t), l(lens), p(plens), pt(map.page_table), of(map.offsets), o(want);
    kpool_ref::append_tail_to_topk(t(), l(), p(), pt(), of(), o(), pool_size);
    check_bytes(out, want.storage, op, "out vs the reference");
    return 0;
}
