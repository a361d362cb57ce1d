// kpool_expand_pools_and_append_tail: int32 / int64 pool ids of any value,
// hostile seq_lens, bound_pool_ids on and off, padded rows.
#include "fuzz_common.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_expand_pools_and_append_tail";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int64_t rows = count_value(in, 8, 12);
    const int64_t groups = in.range<int64_t>(0, 12);
    const bool wide = in.flag();
    const int32_t bound = flag_value(in, in.flag());

    std::vector<int64_t> seq_lens, ids;
    for (int64_t r = 0; r < rows; r++) {
        int64_t len = in.range<int64_t>(0, 4000);
        if (in.chance(24)) {
            const int64_t v[] = {0, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                                 int64_t(P) - 1, int64_t(P)};
            len = v[in.pick(6)];
        }
        seq_lens.push_back(len);
        for (int64_t g = 0; g < groups; g++) {
            ids.push_back(in.chance(64) ? index_value(in, std::max<int64_t>(len / P, 0), ids, wide)
                                        : int64_t(in.next() % uint64_t(std::max<int64_t>(len / P, 1))));
        }
    }
    Tensor pool_ids = plan(in, "pool_ids", wide ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32, {rows, groups});
    Tensor lens = plan(in, "seq_lens", KPOOL_DTYPE_INT32, {rows});
    Tensor out = plan(in, "out", KPOOL_DTYPE_INT32, {rows, groups * P + P - 1});
    const bool overlapping = overlapping_out_rows(in, out);
    const bool tampered = maybe_tamper(in, {&pool_ids, &lens, &out});
    if (!allocate_all(in, {&pool_ids, &lens, &out})) return 0;
    write_ints(pool_ids, ids);
    write_ints(lens, seq_lens);
    CallOptions opts(in, PoolOp::kNo);
    note("P %d pool_size %d bound %d", P, pool_size, bound);

    // A negative seq_len is computed as the reference does (no tail), not rejected.
    const char *must_fail = first_reason({
        invalid_alone(pool_ids, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        invalid_alone(lens, {KPOOL_DTYPE_INT32}),
        invalid_alone(out, {KPOOL_DTYPE_INT32}),
        !tampered && pool_size != P ? "pool_size inconsistent with out" : nullptr,
        !tampered && overlapping ? "out rows that overlap" : nullptr,
    });

    const Snapshot before({&pool_ids, &lens, &out});
    Tensor want = out;
    kpool_status st = poisoned_status();
    CallMemory mem({&pool_ids, &lens, &out});
    const kpool_status_code rc = kpool_expand_pools_and_append_tail(mem(pool_ids), mem(lens), mem(out), pool_size,
                                                                    bound, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    if (!settle(rc, st, opts, op, before, must_fail, !tampered && !hostile && !overlapping)) return 0;

    check_bytes(pool_ids, before.of(pool_ids), op, "an input changed");
    check_bytes(lens, before.of(lens), op, "an input changed");
    const kpool_tensor i = pool_ids.desc(), l = lens.desc(), o = want.desc();
    kpool_ref::expand_pools_and_append_tail(&i, &l, &o, pool_size, bound);
    check_bytes(out, want.storage, op, "out vs the reference");
    return 0;
}
