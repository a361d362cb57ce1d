// kpool_decode_update_and_maybe_write_cache_ragged: B requests of 0..N
// tokens flat, int32 / int64 indices, tokens after the last request,
// hostile query_start_loc (decreasing, negative, past the tokens, at the
// integer limits), max_query_len below, at and above the longest request,
// and the batched decode's hostile indices and descriptors.
//
// The oracle (kpool.h): the bytes of the batched call on the engine's
// padded [B, longest] grid (key and score 0, every index -1 past a
// request's count), by the scalar reference. A host call rejects bad
// offsets naming query_start_loc and a request past max_query_len; a device
// call cannot see them: there a request runs its first max_query_len tokens
// (modelled), and with bad offsets only the bytes some token's indices aim
// at may change. Where requests share a tail block or several completions
// share a cache slot, the batched decode's rules for those (the decode
// target checks them) leave the bytes those tokens aim at open here.
#include "fuzz_common.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_decode_update_and_maybe_write_cache_ragged";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int32_t head_dim = head_dim_value(in);
    hostile = hostile || head_dim != kD;
    const int32_t round_scale = flag_value(in, in.flag());
    const kpool_dtype index_dtype = in.flag() ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;
    const bool wide = index_dtype == KPOOL_DTYPE_INT64;
    const int64_t ring = P * in.range<int64_t>(1, P >= 32 ? 2 : 3);
    const int64_t tail_blocks = count_value(in, 6, 8);
    const int64_t pages = count_value(in, 4, 8);
    const int64_t block_size = block_size_value(in);
    const int64_t B = count_value(in, 6, 16);
    const int64_t most = P >= 32 ? 3 : 5;
    const int64_t slots = pages * block_size;
    const int64_t i32max = std::numeric_limits<int32_t>::max(), i32min = std::numeric_limits<int32_t>::min();

    // Requests in their own tail blocks (a shared one now and then),
    // consecutive positions, a cache slot on each completion; tokens after
    // the last request; then hostile values.
    std::vector<int64_t> tsm, sm, pos, locs, offsets{0};
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t count = in.range<int64_t>(0, most);
        const int64_t block = in.chance(32) ? in.range<int64_t>(0, tail_blocks) : b % std::max<int64_t>(tail_blocks, 1);
        int64_t start = in.range<int64_t>(0, 3 * P);
        if (in.chance(24)) start = i32max - count + 1 - in.range<int64_t>(0, 2);
        for (int64_t t = 0; t < count; t++) {
            const int64_t p = start + t;
            pos.push_back(p);
            tsm.push_back(tail_blocks > 0 ? block * ring + p % ring : -1);
            sm.push_back(p % P == P - 1 || in.chance(24) ? index_value(in, slots, locs, false) : -1);
            if (sm.back() >= 0) locs.push_back(sm.back());
        }
        offsets.push_back(offsets.back() + count);
        longest = std::max(longest, count);
    }
    for (int64_t extra = in.chance(32) ? in.range<int64_t>(1, 2) : 0; extra > 0; extra--) {
        pos.push_back(in.range<int64_t>(0, 3 * P));
        tsm.push_back(tail_blocks > 0 ? int64_t(in.next() % uint64_t(tail_blocks * ring)) : -1);
        sm.push_back(slots > 0 && in.flag() ? int64_t(in.next() % uint64_t(slots)) : -1);
    }
    const int64_t T = int64_t(pos.size());
    for (int64_t i = 0; i < T; i++) {
        if (in.chance(16)) {
            const int64_t v[] = {-1, i32min, i32max, -in.range<int64_t>(2, 99), in.range<int64_t>(0, 2 * ring)};
            pos[i] = v[in.pick(5)];
        }
        if (in.chance(16)) tsm[i] = index_value(in, tail_blocks * ring, tsm, wide);
        if (in.chance(16)) sm[i] = index_value(in, slots, sm, wide);
        pos[i] = std::clamp<int64_t>(pos[i], i32min, i32max);
    }
    // Hostile offsets: one entry spoiled.
    if (in.chance(24)) {
        const int64_t r = in.range<int64_t>(0, B);
        const int64_t v[] = {r > 0 ? offsets[r - 1] - 1 : -1, -in.range<int64_t>(1, 3), T + in.range<int64_t>(1, 3),
                             i32max, wide ? std::numeric_limits<int64_t>::min() : i32min};
        offsets[r] = v[in.pick(5)];
    }
    int32_t max_query_len = 0;
    switch (in.pick(8)) {
        case 1: max_query_len = int32_t(longest); break;
        case 2: max_query_len = int32_t(longest + in.range<int64_t>(1, 4)); break;
        case 3: max_query_len = int32_t(std::max<int64_t>(longest - 1, 1)); break;
        case 4: max_query_len = in.flag() ? -1 : i32min; break;
        case 5: max_query_len = in.chance(64) ? in.any<int32_t>() : int32_t(in.range<int64_t>(1, most)); break;
        default: break;
    }

    Tensor cache = cache_layout(in, pages, block_size);
    Tensor tail = tail_layout(in, tail_blocks, ring);
    Tensor tsm_t = plan(in, "tail_slot_mapping", index_dtype, {T});
    Tensor key = plan(in, "key", KPOOL_DTYPE_BFLOAT16, {T, kD});
    Tensor score = plan(in, "slot_score", KPOOL_DTYPE_BFLOAT16, {T, kD});
    Tensor ape = plan(in, "ape", KPOOL_DTYPE_FLOAT32, {P, kD});
    Tensor sm_t = plan(in, "slot_mapping", index_dtype, {T});
    Tensor pos_t = plan(in, "positions", index_dtype, {T});
    Tensor qsl_t = plan(in, "query_start_loc", index_dtype, {B + 1});
    std::vector<Tensor *> all{&cache, &tail, &tsm_t, &key, &score, &ape, &sm_t, &pos_t, &qsl_t};
    const bool tampered = maybe_tamper(in, all);
    for (Tensor *t : all) {
        if (!t->allocate(in)) return 0;
    }
    fill_decode_values(in, tail, key, score, ape);
    write_ints(tsm_t, tsm);
    write_ints(sm_t, sm);
    write_ints(pos_t, pos);
    write_ints(qsl_t, offsets);
    CallOptions opts(in, PoolOp::kYes);
    note("P %d pool_size %d head_dim %d round_scale %d ring %lld tail_blocks %lld pages %lld block_size %lld "
         "max_query_len %d",
         P, pool_size, head_dim, round_scale, (long long)ring, (long long)tail_blocks, (long long)pages,
         (long long)block_size, max_query_len);

    bool bad_offsets = false, past_bound = false;
    for (int64_t r = 0; r <= B; r++) {
        const int64_t before = r > 0 ? offsets[r - 1] : 0;
        bad_offsets = bad_offsets || offsets[r] < before || offsets[r] > T;
        const Checked count = Checked(offsets[r]) - before;  // (hostile offsets sit at the integer limits)
        past_bound = past_bound || (r > 0 && max_query_len > 0 && offsets[r] >= before && !count.overflowed() &&
                                    count.value() > max_query_len);
    }
    const DecodeFaults faults = decode_faults(sm, tsm, slots, ring, tail_blocks, cache, tail);
    const bool bad_slot = faults.bad_slot, bad_tail_slot = faults.bad_tail_slot, bad_layout = faults.bad_layout;
    const bool out_of_range = faults.out_of_range();
    const char *must_fail = first_reason({
        invalid_alone(cache, {KPOOL_DTYPE_UINT8}),
        !cache.null_data && cache.misalign % 4 ? "a kv_cache not 4-byte aligned" : nullptr,
        invalid_alone(tail, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(tsm_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        invalid_alone(key, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(score, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(ape, {KPOOL_DTYPE_FLOAT32}),
        invalid_alone(sm_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        invalid_alone(pos_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        invalid_alone(qsl_t, {KPOOL_DTYPE_INT32, KPOOL_DTYPE_INT64}),
        head_dim != kD ? "head_dim != 128" : nullptr,
        max_query_len < 0 ? "a negative max_query_len" : nullptr,
        !tampered && pool_size != P ? "pool_size != ape.shape[0]" : nullptr,
        !tampered && bad_offsets && !on_device() ? "query_start_loc out of order or outside the tokens" : nullptr,
        !tampered && past_bound && !on_device() ? "a request longer than max_query_len" : nullptr,
        !tampered && out_of_range && !on_device() ? "an index outside its cache" : nullptr,
        !tampered && bad_layout ? "a page stride not a multiple of 4, or overlapping tail blocks" : nullptr,
    });

    const Snapshot before({&cache, &tail, &tsm_t, &key, &score, &ape, &sm_t, &pos_t, &qsl_t});
    kpool_status st = poisoned_status();
    CallMemory mem({&cache, &tail, &tsm_t, &key, &score, &ape, &sm_t, &pos_t, &qsl_t});
    const kpool_status_code rc = kpool_decode_update_and_maybe_write_cache_ragged(
        mem(cache), mem(tail), mem(tsm_t), mem(key), mem(score), mem(ape), mem(sm_t), mem(pos_t), mem(qsl_t),
        max_query_len, pool_size, head_dim, round_scale, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    const bool clean = !tampered && !hostile && !bad_layout;
    if (clean && !bad_offsets && !past_bound && max_query_len >= 0 && out_of_range && !opts.rejection &&
        rc != KPOOL_OK && !on_device()) {
        KFUZZ_CHECK(rc == KPOOL_ERROR_OUT_OF_RANGE, "%s: an index outside its cache gave %s", op, kpool_status_name(rc));
    }
    if (clean && bad_offsets && !past_bound && max_query_len >= 0 && !opts.rejection && !on_device() &&
        opts.with_status) {
        KFUZZ_CHECK(std::strstr(st.message, "query_start_loc[") != nullptr,
                    "%s: bad offsets rejected without naming the entry: %s", op, st.message);
    }
    const bool must_succeed = clean && max_query_len >= 0 && (on_device() || (!out_of_range && !bad_offsets && !past_bound));
    if (!settle(rc, st, opts, op, before, must_fail, must_succeed)) return 0;
    if (clean) opts.check_marks(op, {{KPOOL_INDEX_SLOT_MAPPING, bad_slot}, {KPOOL_INDEX_TAIL_SLOT_MAPPING, bad_tail_slot}});
    for (Tensor *t : {&tsm_t, &key, &score, &ape, &sm_t, &pos_t, &qsl_t}) {
        check_bytes(*t, before.of(*t), op, "an input changed");
    }

    // The bytes a token's indices aim at (its ring slot, and its cache slot
    // where it completes a pool), from the tensors as passed.
    const int64_t tokens = key.shape[0], requests = qsl_t.shape[0] - 1, r = tail.shape[2];
    const int64_t members = pool_size;  // (a lambda may not capture a structured binding before C++20)
    struct Aimed {
        Contested cache, tail;
    };
    auto aim = [&](int64_t i, Aimed &at) {
        const int64_t p = pos_t.get_int(i), ts = tsm_t.get_int(i), l = sm_t.get_int(i);
        if (p < 0 || ts < 0 || past_passed_tail(ts, tail)) return;
        for (int64_t half = 0; half < 2; half++) {
            at.tail.anything(tail, tail.byte_offset({ts / r, half, p % r, 0}), 2 * kD);
        }
        if (l >= 0 && !past_passed(l, passed_cache_slots(cache)) && p % members == members - 1) {
            const CacheSlotBytes slot = cache_slot_bytes(cache, l);
            at.cache.anything(cache, slot.codes, kD);
            at.cache.anything(cache, slot.scale, 4);
        }
    };
    if (on_device() && (bad_offsets || out_of_range)) {
        Aimed reached;
        for (int64_t i = 0; i < tokens; i++) aim(i, reached);
        check_bytes_contested(cache, before.of(cache), reached.cache, op, "kv_cache with hostile offsets or indices");
        check_bytes_contested(tail, before.of(tail), reached.tail, op, "tail_kv_cache with hostile offsets or indices");
        return 0;
    }

    // The engine's padded grid of the requests (on a device each request's
    // first max_query_len tokens), by the reference.
    std::vector<int64_t> first(requests), count(requests);
    int64_t grid = 1;
    for (int64_t b = 0; b < requests; b++) {
        first[b] = qsl_t.get_int(b);
        count[b] = qsl_t.get_int(b + 1) - first[b];
        if (max_query_len > 0) count[b] = std::min<int64_t>(count[b], max_query_len);
        grid = std::max(grid, count[b]);
    }
    Tensor g_key = explicit_layout("grid_key", KPOOL_DTYPE_BFLOAT16, {requests, grid, kD}, {grid * kD, kD, 1});
    Tensor g_score = explicit_layout("grid_score", KPOOL_DTYPE_BFLOAT16, {requests, grid, kD}, {grid * kD, kD, 1});
    Tensor g_tsm = explicit_layout("grid_tail_slot_mapping", index_dtype, {requests, grid}, {grid, 1});
    Tensor g_sm = explicit_layout("grid_slot_mapping", index_dtype, {requests, grid}, {grid, 1});
    Tensor g_pos = explicit_layout("grid_positions", index_dtype, {requests, grid}, {grid, 1});
    if (!allocate_all(in, {&g_key, &g_score, &g_tsm, &g_sm, &g_pos})) return 0;
    for (Tensor *t : {&g_key, &g_score}) std::fill(t->storage.begin(), t->storage.end(), 0);
    Aimed open_bytes;
    std::map<int64_t, int64_t> block_owner, slot_writers;
    bool shared = false;
    for (int64_t b = 0; b < requests; b++) {
        for (int64_t t = 0; t < grid; t++) {
            const bool real = t < count[b];
            const int64_t i = first[b] + t;
            g_tsm.set_int(b * grid + t, real ? tsm_t.get_int(i) : -1);
            g_sm.set_int(b * grid + t, real ? sm_t.get_int(i) : -1);
            g_pos.set_int(b * grid + t, real ? pos_t.get_int(i) : -1);
            if (!real) continue;
            std::memcpy(g_key.data() + g_key.byte_offset({b, t, 0}), key.data() + key.byte_offset({i, 0}), 2 * kD);
            std::memcpy(g_score.data() + g_score.byte_offset({b, t, 0}), score.data() + score.byte_offset({i, 0}),
                        2 * kD);
            const int64_t ts = tsm_t.get_int(i), l = sm_t.get_int(i), p = pos_t.get_int(i);
            if (ts >= 0 && p >= 0) {
                auto [owner, fresh] = block_owner.emplace(ts / r, b);
                shared = shared || (!fresh && owner->second != b);
                if (l >= 0 && p % pool_size == pool_size - 1) shared = shared || ++slot_writers[l] > 1;
            }
            aim(i, open_bytes);
        }
    }
    Tensor want_cache = cache, want_tail = tail;
    want_cache.storage = before.of(cache);
    want_tail.storage = before.of(tail);
    int64_t skipped = 0;
    if (requests > 0) {
        const kpool_tensor c = want_cache.desc(), tl = want_tail.desc(), ts = g_tsm.desc(), k = g_key.desc(),
                           s = g_score.desc(), a = ape.desc(), m = g_sm.desc(), p = g_pos.desc();
        skipped = kpool_ref::decode_update_and_maybe_write_cache_batched(&c, &tl, &ts, &k, &s, &a, &m, &p, pool_size,
                                                                         kD, round_scale);
    }
    if (opts.with_status && !on_device()) {
        KFUZZ_CHECK(st.skipped_completions == skipped, "%s: skipped_completions = %lld, the reference counts %lld", op,
                    (long long)st.skipped_completions, (long long)skipped);
    }
    if (!shared) open_bytes = Aimed();
    check_bytes_contested(cache, want_cache.storage, open_bytes.cache, op, "kv_cache vs the batched call on the padded grid");
    check_bytes_contested(tail, want_tail.storage, open_bytes.tail, op,
                          "tail_kv_cache vs the batched call on the padded grid");
    return 0;
}
