// kpool_seed_tail_cache: requests of any length in any tail block (shared
// ones too), int32 / int64 tslot with hostile values, padded rings.
#include "fuzz_common.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_seed_tail_cache";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int32_t head_dim = head_dim_value(in);
    hostile = hostile || head_dim != kD;
    int64_t ring = P * in.range<int64_t>(1, P >= 32 ? 2 : 4);
    if (in.chance(8)) ring += in.flag() ? 1 : -1, hostile = true;  // not a multiple of P (or 0)
    const int64_t blocks = count_value(in, 8, 8);
    const kpool_dtype tslot_dtype = in.flag() ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;

    // Requests: consecutive ring slots of one block (distinct blocks mostly,
    // a shared one now and then), padding between them.
    std::vector<int64_t> slots;
    const int requests = in.range<int>(1, 6);
    for (int r = 0; r < requests && slots.size() < 64; r++) {
        const int64_t block = blocks > 0 && !in.chance(24) ? (r + in.range<int64_t>(0, 1)) % blocks
                                                           : in.range<int64_t>(0, std::max<int64_t>(blocks, 1));
        const int64_t length = in.range<int64_t>(1, 3 * P + 2);
        const int64_t start = in.range<int64_t>(0, 4 * P);
        for (int64_t t = 0; t < length && slots.size() < 64; t++) {
            slots.push_back(ring > 0 ? block * ring + (start + t) % ring : -1);
        }
        for (int pad = in.range<int>(0, 2); pad > 0; pad--) slots.push_back(in.flag() ? -1 : -in.range<int64_t>(2, 9));
    }
    for (auto &s : slots) {
        if (in.chance(20)) s = index_value(in, blocks * std::max<int64_t>(ring, 1), slots, tslot_dtype == KPOOL_DTYPE_INT64);
    }
    const int64_t n = in.chance(8) ? 0 : int64_t(slots.size());

    Tensor tail = tail_layout(in, blocks, ring);
    Tensor key = plan(in, "key", KPOOL_DTYPE_BFLOAT16, {n, kD});
    Tensor gate = plan(in, "gate_score", KPOOL_DTYPE_BFLOAT16, {n, kD});
    Tensor tslot = plan(in, "tslot", tslot_dtype, {n});
    const bool tampered = maybe_tamper(in, {&tail, &key, &gate, &tslot});
    if (!allocate_all(in, {&tail, &key, &gate, &tslot})) return 0;
    fill_values(in, key, 1.0f, in.chance(24));
    fill_values(in, gate, 2.0f, false);
    write_ints(tslot, slots);
    CallOptions opts(in, PoolOp::kNo);
    note("P %d pool_size %d head_dim %d ring %lld blocks %lld", P, pool_size, head_dim, (long long)ring, (long long)blocks);

    bool out_of_range = false;
    for (int64_t i = 0; i < n; i++) {
        // As planned, or as the call passed the tail (a tampered shape).
        out_of_range = out_of_range || (slots[i] >= 0 && ring > 0 && slots[i] / ring >= blocks) ||
                       past_passed_tail(slots[i], tail);
    }
    const bool overlapping = tail_blocks_overlap(blocks, tail, ring);
    const char *must_fail = first_reason({
        invalid_alone(tail, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(key, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(gate, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(tslot, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        head_dim != kD ? "head_dim != 128" : nullptr,
        !tampered && (ring < 1 || ring % std::max(pool_size, 1) != 0) ? "RING not a multiple of pool_size" : nullptr,
        !tampered && overlapping ? "overlapping tail blocks" : nullptr,
        !tampered && out_of_range && !on_device() ? "a tslot outside the tail cache" : nullptr,
    });

    const Snapshot before({&tail, &key, &gate, &tslot});
    Tensor want = tail;
    kpool_status st = poisoned_status();
    CallMemory mem({&tail, &key, &gate, &tslot});
    const kpool_status_code rc = kpool_seed_tail_cache(mem(tail), mem(key), mem(gate), mem(tslot),
                                                       pool_size, head_dim, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    if (!tampered && !hostile && !overlapping && out_of_range && !opts.rejection && rc != KPOOL_OK && !on_device()) {
        KFUZZ_CHECK(rc == KPOOL_ERROR_OUT_OF_RANGE, "%s: a tslot outside the tail gave %s", op, kpool_status_name(rc));
    }
    const bool valid = !tampered && !hostile && !overlapping;
    if (!settle(rc, st, opts, op, before, must_fail, valid && (!out_of_range || on_device()))) return 0;

    for (Tensor *t : {&key, &gate, &tslot}) check_bytes(*t, before.of(*t), op, "an input changed");
    const int64_t count = tslot.shape[0], r = tail.shape[2];
    if (on_device() && out_of_range) {
        // The device skips the tslots outside the tail (and marks tslot):
        // the ring slots the others aim at may change, no other byte.
        if (valid) opts.check_marks(op, {{KPOOL_INDEX_TSLOT, true}});
        Contested reached;
        for (int64_t i = 0; i < count; i++) {
            const int64_t s = tslot.get_int(i);
            if (s < 0 || past_passed_tail(s, tail)) continue;
            for (int64_t half = 0; half < 2; half++) reached.anything(tail, tail.byte_offset({s / r, half, s % r, 0}), 2 * kD);
        }
        check_bytes_contested(tail, before.of(tail), reached, op, "tail_kv_cache with out-of-range tslots");
        return 0;
    }
    if (valid) opts.check_marks(op, {{KPOOL_INDEX_TSLOT, false}});
    Contested contested;
    seed_by_reference(want, key, gate, tslot, pool_size, contested);
    check_bytes_contested(tail, want.storage, contested, op, "tail_kv_cache vs the reference");
    return 0;
}
