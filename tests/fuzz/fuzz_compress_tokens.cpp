// kpool_compress_tokens_and_write_cache: the prefill insert on token rows
// as an engine holds them (any row strides, bf16 / f32 gate scores, int32 /
// int64 pool-granular slot_mapping with hostile values and duplicates), with
// and without the tail seed, with and without positions (chunks that start
// inside a pool, members before the chunk from the ring); hostile
// descriptors, a missing half of the seed pair, positions without a tail.
//
// The oracle: every completing token's pool gathered here, by the rule
// kpool.h states (without positions rows i-P+1 .. i; with positions the row
// holding each member's position in the same tail block, else the ring as
// before the call), compressed by the scalar reference into its slot, then
// the seed by the reference. A slot several completions write holds bytes
// of those completions only; so does a ring slot several seeded tokens aim
// at. On a device an index outside its cache writes nothing (the reference
// without it) and marks its argument.
#include "fuzz_common.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_compress_tokens_and_write_cache";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int32_t head_dim = head_dim_value(in);
    hostile = hostile || head_dim != kD;
    const int32_t round_scale = flag_value(in, in.flag());
    const bool with_tail = in.flag();
    const bool with_positions = with_tail && in.flag();
    // The hostile pairings: half of the seed pair, positions without a tail.
    const bool tail_without_slots = with_tail && in.chance(8), slots_without_tail = !with_tail && in.chance(8);
    const bool positions_without_tail = !with_tail && in.chance(8);
    const bool f32_gate = in.chance(with_tail ? 16 : 96);  // (with the seed: rejected)
    hostile = hostile || tail_without_slots || slots_without_tail || positions_without_tail || (with_tail && f32_gate);
    const kpool_dtype slot_dtype = in.flag() ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;
    const kpool_dtype tail_dtype = with_positions || in.flag() ? slot_dtype : KPOOL_DTYPE_INT64;
    const int64_t ring = P * in.range<int64_t>(1, P >= 32 ? 2 : 3);
    const int64_t tail_blocks = count_value(in, 6, 8);
    const int64_t pages = count_value(in, 4, 8);
    const int64_t block_size = block_size_value(in);
    const int64_t slots = pages * block_size;
    const int64_t most_tokens = P >= 32 ? 2 * P + 4 : 3 * P + 8;

    // Requests one after another, each in its own tail block (a shared one
    // now and then), consecutive positions from a start that is a pool
    // boundary without positions and anywhere with them; the last token of
    // each pool carries a cache slot.
    std::vector<int64_t> sm, tsm, pos, locs;
    while (int64_t(sm.size()) < most_tokens && in.remaining() > 0 && !in.chance(24)) {
        const int64_t request = int64_t(tsm.size()) % std::max<int64_t>(tail_blocks, 1);
        const int64_t block = in.chance(32) ? in.range<int64_t>(0, std::max<int64_t>(tail_blocks - 1, 0)) : request;
        const int64_t start = with_positions ? in.range<int64_t>(0, 3 * P) : P * in.range<int64_t>(0, 3);
        const int64_t length = in.range<int64_t>(1, 2 * P + 2);
        for (int64_t t = 0; t < length && int64_t(sm.size()) < most_tokens; t++) {
            const int64_t p = start + t;
            pos.push_back(p);
            tsm.push_back(tail_blocks > 0 ? block * ring + p % ring : -1);
            const int64_t slot = p % P == P - 1 || in.chance(8) ? index_value(in, slots, locs, false) : -1;
            sm.push_back(slot);
            if (slot >= 0) locs.push_back(slot);
        }
    }
    const int64_t n = int64_t(sm.size());
    const int64_t i32min = std::numeric_limits<int32_t>::min(), i32max = std::numeric_limits<int32_t>::max();
    for (int64_t i = 0; i < n; i++) {
        if (in.chance(16)) sm[i] = index_value(in, slots, sm, slot_dtype == KPOOL_DTYPE_INT64);
        if (in.chance(16)) tsm[i] = index_value(in, tail_blocks * ring, tsm, tail_dtype == KPOOL_DTYPE_INT64);
        if (in.chance(16)) {
            const int64_t v[] = {-1, i32min, i32max, -in.range<int64_t>(2, 99), in.range<int64_t>(0, 4 * P)};
            pos[i] = v[in.pick(5)];
        }
    }

    Tensor cache = cache_layout(in, pages, block_size);
    Tensor key = plan(in, "key", KPOOL_DTYPE_BFLOAT16, {n, kD});
    Tensor gate = plan(in, "gate_score", f32_gate ? KPOOL_DTYPE_FLOAT32 : KPOOL_DTYPE_BFLOAT16, {n, kD});
    Tensor ape = plan(in, "ape", KPOOL_DTYPE_FLOAT32, {P, kD});
    Tensor sm_t = plan(in, "slot_mapping", slot_dtype, {n});
    Tensor tail = tail_layout(in, tail_blocks, ring);
    Tensor tsm_t = plan(in, "tail_slot_mapping", tail_dtype, {n});
    Tensor pos_t = plan(in, "positions", slot_dtype, {n});
    tail.absent = !with_tail && !tail_without_slots;
    tsm_t.absent = !with_tail && !slots_without_tail;
    if (tail_without_slots) tsm_t.absent = true;
    pos_t.absent = !with_positions && !positions_without_tail;
    std::vector<Tensor *> present{&cache, &key, &gate, &ape, &sm_t};
    for (Tensor *t : {&tail, &tsm_t, &pos_t}) {
        if (!t->absent) present.push_back(t);
    }
    const bool tampered = maybe_tamper(in, present);
    if (!allocate_all(in, {&cache, &key, &gate, &ape, &sm_t, &tail, &tsm_t, &pos_t})) return 0;
    const bool specials = in.chance(24);
    fill_values(in, key, 1.0f, specials);
    fill_values(in, gate, in.flag() ? 2.0f : 60.0f, specials);
    fill_values(in, ape, 0.5f, specials);
    fill_values(in, tail, 1.0f, specials);
    write_ints(sm_t, sm);
    write_ints(tsm_t, tsm);
    write_ints(pos_t, pos);
    CallOptions opts(in, PoolOp::kYes);
    note("P %d pool_size %d head_dim %d round_scale %d tail %d positions %d ring %lld tail_blocks %lld pages %lld "
         "block_size %lld",
         P, pool_size, head_dim, round_scale, int(!tail.absent), int(!pos_t.absent), (long long)ring,
         (long long)tail_blocks, (long long)pages, (long long)block_size);

    // Out-of-range indices: slots past the cache (without positions only
    // those of tokens that can end a pool, i >= P-1), tail slots past the
    // ring's blocks.
    const bool seeding = !tail.absent && !tsm_t.absent;
    bool bad_slot = false, bad_tail_slot = false;
    for (int64_t i = 0; i < n; i++) {
        bad_slot = bad_slot || ((with_positions || i >= P - 1) && sm[i] >= slots);
        bad_tail_slot = bad_tail_slot || (seeding && tsm[i] >= 0 && tsm[i] / ring >= tail_blocks);
    }
    const bool out_of_range = bad_slot || bad_tail_slot;
    const bool bad_layout = (cache.shape[0] > 1 && cache.strides[0] % 4 != 0) ||
                            (seeding && tail_blocks_overlap(tail.shape[0], tail, ring));
    const char *must_fail = first_reason({
        invalid_alone(cache, {KPOOL_DTYPE_UINT8}),
        !cache.null_data && cache.misalign % 4 ? "a kv_cache not 4-byte aligned" : nullptr,
        invalid_alone(key, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(gate, {KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32}),
        invalid_alone(ape, {KPOOL_DTYPE_FLOAT32}),
        invalid_alone(sm_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        tail.absent != tsm_t.absent ? "one of tail_kv_cache and tail_slot_mapping" : nullptr,
        !pos_t.absent && tail.absent ? "positions without the tail" : nullptr,
        seeding ? invalid_alone(tail, {KPOOL_DTYPE_BFLOAT16}) : nullptr,
        seeding ? invalid_alone(tsm_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) : nullptr,
        seeding && gate.dtype == KPOOL_DTYPE_FLOAT32 ? "an f32 gate_score with the tail seed" : nullptr,
        seeding && !pos_t.absent ? invalid_alone(pos_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}) : nullptr,
        head_dim != kD ? "head_dim != 128" : nullptr,
        !tampered && pool_size != P ? "pool_size != ape.shape[0]" : nullptr,
        !tampered && out_of_range && !on_device() ? "an index outside its cache" : nullptr,
        !tampered && bad_layout ? "a page stride not a multiple of 4, or overlapping tail blocks" : nullptr,
    });

    const Snapshot before({&cache, &key, &gate, &ape, &sm_t, &tail, &tsm_t, &pos_t});
    kpool_status st = poisoned_status();
    CallMemory mem({&cache, &key, &gate, &ape, &sm_t, &tail, &tsm_t, &pos_t});
    const kpool_status_code rc = kpool_compress_tokens_and_write_cache(
        mem(cache), mem(key), mem(gate), mem(ape), mem(sm_t), mem(tail), mem(tsm_t), mem(pos_t), pool_size, head_dim,
        round_scale, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    const bool clean = !tampered && !hostile && !bad_layout;
    if (clean && out_of_range && !opts.rejection && rc != KPOOL_OK && !on_device()) {
        KFUZZ_CHECK(rc == KPOOL_ERROR_OUT_OF_RANGE, "%s: an index outside its cache gave %s", op, kpool_status_name(rc));
    }
    if (!settle(rc, st, opts, op, before, must_fail, clean && (!out_of_range || on_device()))) return 0;
    if (clean) opts.check_marks(op, {{KPOOL_INDEX_SLOT_MAPPING, bad_slot}, {KPOOL_INDEX_TAIL_SLOT_MAPPING, bad_tail_slot}});
    for (Tensor *t : {&key, &gate, &ape, &sm_t, &tsm_t, &pos_t}) check_bytes(*t, before.of(*t), op, "an input changed");

    // The completing tokens and their pools' rows (what the call saw: the
    // tensors as passed, a tampered one included).
    const int64_t count = key.shape[0];
    const int64_t r = seeding ? tail.shape[2] : 1, blocks = seeding ? tail.shape[0] : 0;
    auto block_of = [&](int64_t i) {
        const int64_t s = tsm_t.get_int(i);
        return s >= 0 ? s / r : -1;
    };
    std::vector<std::pair<int64_t, int64_t>> completions;  // (token, slot)
    for (int64_t i = 0; i < count; i++) {
        const int64_t slot = sm_t.get_int(i);
        if (slot < 0 || past_passed(slot, passed_cache_slots(cache))) continue;  // (a device skips it)
        if (pos_t.absent) {
            if (i >= pool_size - 1) completions.push_back({i, slot});
        } else {
            const int64_t p = pos_t.get_int(i), b = block_of(i);
            if (p >= 0 && p % pool_size == pool_size - 1 && b >= 0 && b < blocks) completions.push_back({i, slot});
        }
    }
    const int64_t m = int64_t(completions.size());
    Tensor pool_k = explicit_layout("pool_k", KPOOL_DTYPE_BFLOAT16, {m, pool_size, kD}, {pool_size * kD, kD, 1});
    Tensor pool_g = explicit_layout("pool_g", gate.dtype, {m, pool_size, kD}, {pool_size * kD, kD, 1});
    Tensor loc = explicit_layout("loc", KPOOL_DTYPE_INT64, {m}, {1});
    Tensor rows_k = explicit_layout("rows_k", KPOOL_DTYPE_UINT8, {m, kD}, {kD, 1});
    Tensor rows_s = explicit_layout("rows_s", KPOOL_DTYPE_FLOAT32, {m}, {1});
    if (!allocate_all(in, {&pool_k, &pool_g, &loc, &rows_k, &rows_s})) return 0;
    for (int64_t c = 0; c < m; c++) {
        const auto [i, slot] = completions[c];
        loc.set_int(c, slot);
        for (int64_t j = 0; j < pool_size; j++) {
            const int64_t back = pool_size - 1 - j, row = i - back;
            const uint8_t *k_src = key.data() + (row >= 0 ? key.byte_offset({row, 0}) : 0);
            const uint8_t *g_src = gate.data() + (row >= 0 ? gate.byte_offset({row, 0}) : 0);
            if (!pos_t.absent) {
                const int64_t member = pos_t.get_int(i) - back, b = block_of(i);
                const bool in_chunk = row >= 0 && pos_t.get_int(row) == member && block_of(row) == b;
                if (!in_chunk) {
                    const std::vector<uint8_t> &ring = before.of(tail);
                    k_src = ring.data() + tail.origin + tail.byte_offset({b, 0, member % r, 0});
                    g_src = ring.data() + tail.origin + tail.byte_offset({b, 1, member % r, 0});
                }
            }
            std::memcpy(pool_k.data() + pool_k.byte_offset({c, j, 0}), k_src, 2 * kD);
            std::memcpy(pool_g.data() + pool_g.byte_offset({c, j, 0}), g_src, kD * gate.esize());
        }
    }
    Tensor want_cache = cache;
    want_cache.storage = before.of(cache);
    std::map<int64_t, std::vector<int64_t>> writers;  // slot -> completions
    if (m > 0) {
        const kpool_tensor c = want_cache.desc(), k = pool_k.desc(), g = pool_g.desc(), a = ape.desc(), l = loc.desc(),
                           rk = rows_k.desc(), rs = rows_s.desc();
        kpool_ref::compress_and_write_cache(&c, &k, &g, &a, &l, nullptr, &rk, &rs, pool_size, kD, round_scale, 1);
        for (int64_t c = 0; c < m; c++) writers[completions[c].second].push_back(c);
    }
    Contested contested_cache;
    for (auto &[slot, pools] : writers) {
        if (pools.size() < 2) continue;
        const CacheSlotBytes at = cache_slot_bytes(cache, slot);
        for (int64_t c : pools) {
            contested_cache.add(cache, at.codes, rows_k.data() + rows_k.byte_offset({c, 0}), kD);
            contested_cache.add(cache, at.scale, rows_s.data() + rows_s.byte_offset({c}), 4);
        }
    }
    check_bytes_contested(cache, want_cache.storage, contested_cache, op, "kv_cache vs the reference");
    if (seeding) {
        Tensor want_tail = tail;
        want_tail.storage = before.of(tail);
        Contested contested_tail;
        seed_by_reference(want_tail, key, gate, tsm_t, pool_size, contested_tail);
        check_bytes_contested(tail, want_tail.storage, contested_tail, op, "tail_kv_cache vs the reference's seed");
    } else {
        check_bytes(tail, before.of(tail), op, "tail_kv_cache without the seed");
    }
    return 0;
}
