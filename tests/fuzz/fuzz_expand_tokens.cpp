// kpool_expand_pools_to_tokens: int32 / int64 group ids of any value, any
// group_valid bytes, identity / page table / offsets ([rows] or [rows, 1]),
// hostile topk.
#include "token_map.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_expand_pools_to_tokens";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int64_t rows = count_value(in, 8, 12);
    const int64_t groups = in.range<int64_t>(0, 12);
    int32_t topk = int32_t(groups * P);
    if (in.chance(12)) {
        const int32_t v[] = {topk + 1, -P, topk - 1, std::numeric_limits<int32_t>::min(), topk + P};
        topk = v[in.pick(5)];
        hostile = true;
    }
    const bool wide = in.flag();

    std::vector<int64_t> ids, valid;
    for (int64_t i = 0; i < rows * groups; i++) {
        ids.push_back(in.chance(64) ? index_value(in, 1000, ids, wide) : int64_t(in.next() % 1000));
        valid.push_back(in.chance(64) ? (in.chance(64) ? in.range<int64_t>(2, 255) : 0) : 1);
    }
    Tensor group_ids = plan(in, "group_ids", wide ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32, {rows, groups});
    Tensor group_valid = plan(in, "group_valid", in.flag() ? KPOOL_DTYPE_BOOL : KPOOL_DTYPE_UINT8, {rows, groups});
    TokenMap map(in, rows);
    Tensor out = plan(in, "out", KPOOL_DTYPE_INT32, {rows, groups * P});
    const bool overlapping = overlapping_out_rows(in, out);
    std::vector<Tensor *> tamperable{&group_ids, &group_valid, &out};
    for (Tensor *t : map.present()) tamperable.push_back(t);
    const bool tampered = maybe_tamper(in, tamperable);
    if (!allocate_all(in, {&group_ids, &group_valid, &map.page_table, &map.offsets, &out})) return 0;
    write_ints(group_ids, ids);
    write_ints(group_valid, valid);
    map.fill(in);
    CallOptions opts(in, PoolOp::kNo);
    note("P %d pool_size %d topk %d", P, pool_size, topk);

    const char *must_fail = first_reason({
        invalid_alone(group_ids, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        invalid_alone(group_valid, {KPOOL_DTYPE_BOOL, KPOOL_DTYPE_UINT8}),
        invalid_alone(out, {KPOOL_DTYPE_INT32}),
        map.invalid(rows),
        topk < 0 || topk % std::max(pool_size, 1) != 0 ? "topk not a multiple of pool_size" : nullptr,
        !tampered && overlapping ? "out rows that overlap" : nullptr,
    });

    const Snapshot before({&group_ids, &group_valid, &map.page_table, &map.offsets, &out});
    Tensor want = out;
    kpool_status st = poisoned_status();
    CallMemory mem({&group_ids, &group_valid, &map.page_table, &map.offsets, &out});
    const kpool_status_code rc = kpool_expand_pools_to_tokens(mem(group_ids), mem(group_valid), mem(map.page_table), mem(map.offsets),
                                     mem(out), topk, pool_size, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    const bool clean = !tampered && !hostile && !overlapping && !(map.has_table && map.has_offsets) &&
                       !(map.has_table && map.page_table.shape[1] == 0);
    if (!settle(rc, st, opts, op, before, must_fail, clean)) return 0;

    for (Tensor *t : {&group_ids, &group_valid, &map.page_table, &map.offsets}) {
        check_bytes(*t, before.of(*t), op, "an input changed");
    }
    const Desc g(group_ids), v(group_valid), pt(map.page_table), of(map.offsets), o(want);
    kpool_ref::expand_pools_to_tokens(g(), v(), pt(), of(), o(), topk, pool_size);
    check_bytes(out, want.storage, op, "out vs the reference");
    return 0;
}
