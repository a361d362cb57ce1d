// kpool_decode_update_and_maybe_write_cache_batched: B requests x N tokens
// with hostile positions, tail slots and slot mappings (requests sharing a
// tail block, duplicate cache slots, completions without a tail block,
// positions near INT32_MAX, values past the caches).
//
// The oracle (docs/behaviour.md): each request behaves as the scalar
// reference run on that request alone, from the caches as they were before
// the call (a completion reads its own request's earlier tokens, never
// another request's stashes of this call); a cache slot or ring slot that
// several writers aim at holds bytes of those writers only; within one
// request the last stash of a ring slot wins. When no two requests share a
// tail block and no slot is written twice, that is byte for byte the
// reference's sequential run of the whole batch, which is checked too. On a
// device, a completion reading a ring slot that another request's stash of
// the call writes may see the old or the new bytes: its cache row is open.
#include "fuzz_common.h"

using namespace kfuzz;

namespace {

// Request b of a [B, ...] descriptor, as a [1, ...] one.
kpool_tensor request(const Tensor &t, int64_t b) {
    kpool_tensor d = t.desc();
    d.data = static_cast<uint8_t *>(d.data) + t.byte_offset({b});
    d.shape[0] = 1;
    return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_decode_update_and_maybe_write_cache_batched";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int32_t head_dim = head_dim_value(in);
    hostile = hostile || head_dim != kD;
    const int32_t round_scale = flag_value(in, in.flag());
    const int64_t ring = P * in.range<int64_t>(1, P >= 32 ? 2 : 3);
    const int64_t tail_blocks = count_value(in, 6, 8);
    const int64_t pages = count_value(in, 4, 8);
    const int64_t block_size = block_size_value(in);
    const int64_t B = count_value(in, 4, 8);
    const int64_t N = count_value(in, P >= 32 ? 3 : 5, 8);
    const int64_t slots = pages * block_size;
    const int32_t i32max = std::numeric_limits<int32_t>::max(), i32min = std::numeric_limits<int32_t>::min();

    // Requests with their own tail block (or a shared one), consecutive
    // positions, a cache slot on each completion; then hostile values.
    std::vector<int64_t> tsm(B * N), sm(B * N), pos(B * N), locs;
    for (int64_t b = 0; b < B; b++) {
        const int64_t block = in.chance(32) ? in.range<int64_t>(0, tail_blocks) : b % std::max<int64_t>(tail_blocks, 1);
        int64_t start = in.range<int64_t>(0, 3 * P);
        if (in.chance(24)) start = int64_t(i32max) - N + 1 - in.range<int64_t>(0, 2);
        for (int64_t t = 0; t < N; t++) {
            const int64_t p = start + t, i = b * N + t;
            const bool completes = p % P == P - 1;
            pos[i] = p;
            tsm[i] = tail_blocks > 0 ? block * ring + p % ring : -1;
            sm[i] = completes || in.chance(24) ? index_value(in, slots, locs, false) : -1;
            if (sm[i] >= 0) locs.push_back(sm[i]);
        }
    }
    std::vector<int64_t> prev;
    for (int64_t i = 0; i < B * N; i++) {
        if (in.chance(16)) {
            const int64_t v[] = {-1, i32min, i32max, -in.range<int64_t>(2, 99), in.range<int64_t>(0, 2 * ring)};
            pos[i] = v[in.pick(5)];
        }
        if (in.chance(16)) tsm[i] = index_value(in, tail_blocks * ring, tsm, false);
        if (in.chance(16)) sm[i] = index_value(in, slots, sm, false);
        for (auto *v : {&pos[i], &tsm[i], &sm[i]}) *v = int32_t(std::clamp<int64_t>(*v, i32min, i32max));
    }

    Tensor cache = cache_layout(in, pages, block_size);
    Tensor tail = tail_layout(in, tail_blocks, ring);
    Tensor tsm_t = plan(in, "tail_slot_mapping", KPOOL_DTYPE_INT32, {B, N});
    Tensor key = plan(in, "key", KPOOL_DTYPE_BFLOAT16, {B, N, kD});
    Tensor score = plan(in, "slot_score", KPOOL_DTYPE_BFLOAT16, {B, N, kD});
    Tensor ape = plan(in, "ape", KPOOL_DTYPE_FLOAT32, {P, kD});
    Tensor sm_t = plan(in, "slot_mapping", KPOOL_DTYPE_INT32, {B, N});
    Tensor pos_t = plan(in, "positions", KPOOL_DTYPE_INT32, {B, N});
    std::vector<Tensor *> all{&cache, &tail, &tsm_t, &key, &score, &ape, &sm_t, &pos_t};
    const bool tampered = maybe_tamper(in, all);
    for (Tensor *t : all) {
        if (!t->allocate(in)) return 0;
    }
    fill_decode_values(in, tail, key, score, ape);
    write_ints(tsm_t, tsm);
    write_ints(sm_t, sm);
    write_ints(pos_t, pos);
    CallOptions opts(in, PoolOp::kYes);
    note("P %d pool_size %d head_dim %d round_scale %d ring %lld tail_blocks %lld pages %lld block_size %lld", P, pool_size, head_dim, round_scale, (long long)ring, (long long)tail_blocks, (long long)pages, (long long)block_size);

    const DecodeFaults faults = decode_faults(sm, tsm, slots, ring, tail_blocks, cache, tail);
    const bool bad_slot = faults.bad_slot, bad_tail_slot = faults.bad_tail_slot, bad_layout = faults.bad_layout;
    const bool out_of_range = faults.out_of_range();
    const char *must_fail = first_reason({
        invalid_alone(cache, {KPOOL_DTYPE_UINT8}),
        !cache.null_data && cache.misalign % 4 ? "a kv_cache not 4-byte aligned" : nullptr,
        invalid_alone(tail, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(tsm_t, {KPOOL_DTYPE_INT32}),
        invalid_alone(key, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(score, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(ape, {KPOOL_DTYPE_FLOAT32}),
        invalid_alone(sm_t, {KPOOL_DTYPE_INT32}),
        invalid_alone(pos_t, {KPOOL_DTYPE_INT32}),
        head_dim != kD ? "head_dim != 128" : nullptr,
        !tampered && pool_size != P ? "pool_size != ape.shape[0]" : nullptr,
        !tampered && out_of_range && !on_device() ? "an index outside its cache" : nullptr,
        !tampered && bad_layout ? "a page stride not a multiple of 4, or overlapping tail blocks" : nullptr,
    });

    const Snapshot before({&cache, &tail, &tsm_t, &key, &score, &ape, &sm_t, &pos_t});
    Tensor want_cache = cache, want_tail = tail;
    kpool_status st = poisoned_status();
    CallMemory mem({&cache, &tail, &tsm_t, &key, &score, &ape, &sm_t, &pos_t});
    const kpool_status_code rc = kpool_decode_update_and_maybe_write_cache_batched(
        mem(cache), mem(tail), mem(tsm_t), mem(key), mem(score), mem(ape), mem(sm_t),
        mem(pos_t), pool_size, head_dim, round_scale, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    const bool clean = !tampered && !hostile && !bad_layout;
    if (clean && out_of_range && !opts.rejection && rc != KPOOL_OK && !on_device()) {
        KFUZZ_CHECK(rc == KPOOL_ERROR_OUT_OF_RANGE, "%s: an index outside its cache gave %s", op, kpool_status_name(rc));
    }
    if (!settle(rc, st, opts, op, before, must_fail, clean && (!out_of_range || on_device()))) return 0;
    if (clean) opts.check_marks(op, {{KPOOL_INDEX_SLOT_MAPPING, bad_slot}, {KPOOL_INDEX_TAIL_SLOT_MAPPING, bad_tail_slot}});

    for (Tensor *t : {&tsm_t, &key, &score, &ape, &sm_t, &pos_t}) {
        check_bytes(*t, before.of(*t), op, "an input changed");
    }
    const int64_t requests = key.shape[0], tokens = key.shape[1], r = tail.shape[2];
    if (on_device() && out_of_range) {
        // The device skips the entries outside their caches: the cache rows
        // and ring slots the others aim at may change, no other byte.
        Contested reached_cache, reached_tail;
        for (int64_t i = 0; i < requests * tokens; i++) {
            const int64_t p = pos_t.get_int(i), ts = tsm_t.get_int(i), l = sm_t.get_int(i);
            if (p >= 0 && ts >= 0 && !past_passed_tail(ts, tail)) {
                for (int64_t half = 0; half < 2; half++) {
                    reached_tail.anything(tail, tail.byte_offset({ts / r, half, p % r, 0}), 2 * kD);
                }
            }
            if (l >= 0 && !past_passed(l, passed_cache_slots(cache))) {
                const CacheSlotBytes at = cache_slot_bytes(cache, l);
                reached_cache.anything(cache, at.codes, kD);
                reached_cache.anything(cache, at.scale, 4);
            }
        }
        check_bytes_contested(cache, before.of(cache), reached_cache, op, "kv_cache with out-of-range indices");
        check_bytes_contested(tail, before.of(tail), reached_tail, op, "tail_kv_cache with out-of-range indices");
        return 0;
    }
    // The reference's sequential run of the whole batch.
    int64_t skipped;
    {
        const kpool_tensor c = want_cache.desc(), tl = want_tail.desc(), ts = tsm_t.desc(), k = key.desc(),
                           s = score.desc(), a = ape.desc(), m = sm_t.desc(), p = pos_t.desc();
        skipped = kpool_ref::decode_update_and_maybe_write_cache_batched(&c, &tl, &ts, &k, &s, &a, &m, &p, pool_size,
                                                                         head_dim, round_scale);
    }
    if (opts.with_status && !(on_device() && st.skipped_completions == -1)) {  // -1: not counted on a device
        KFUZZ_CHECK(st.skipped_completions == skipped, "%s: skipped_completions = %lld, the reference counts %lld",
                    op, (long long)st.skipped_completions, (long long)skipped);
    }

    // The per-request model.
    std::vector<uint8_t> model_cache = cache.storage, model_tail = tail.storage;
    model_cache = before.of(cache);
    model_tail = before.of(tail);
    Contested contested_cache, contested_tail;
    std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> completions;  // loc -> (b, t)
    std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> stashes;  // (block, ring pos)
    std::map<int64_t, std::set<int64_t>> block_users;
    for (int64_t b = 0; b < requests; b++) {
        std::map<std::pair<int64_t, int64_t>, int64_t> last;  // this request's last stash per ring slot
        for (int64_t t = 0; t < tokens; t++) {
            const int64_t p = pos_t.get_int(b * tokens + t), ts = tsm_t.get_int(b * tokens + t),
                          l = sm_t.get_int(b * tokens + t);
            if (p < 0 || ts < 0) continue;
            block_users[ts / r].insert(b);
            if (l >= 0 && p % pool_size == pool_size - 1) completions[l].push_back({b, t});
            last[{ts / r, p % r}] = t;
        }
        for (auto &[at, t] : last) stashes[at].push_back({b, t});
    }
    bool shared_block = false;
    for (auto &[block, users] : block_users) shared_block = shared_block || users.size() > 1;
    bool written_twice = false;

    // On a device a completion that reads a ring slot another request of
    // the call stashes into (a shared tail block) may read the old or the
    // new value of each element (docs/behaviour.md): its cache row is open.
    const int64_t members = pool_size;  // (a lambda may not capture a structured binding before C++20)
    auto reads_another_requests_stash = [&](int64_t b, int64_t t) {
        const int64_t p = pos_t.get_int(b * tokens + t), block = tsm_t.get_int(b * tokens + t) / r;
        for (int64_t j = 0; j < members; j++) {
            auto it = stashes.find({block, (p - (members - 1) + j) % r});
            if (it == stashes.end()) continue;
            for (const auto &writer : it->second) {
                if (writer.first != b) return true;
            }
        }
        return false;
    };
    // Each completion alone: its request's reference run with only its slot.
    for (auto &[l, writers] : completions) {
        written_twice = written_twice || writers.size() > 1;
        const CacheSlotBytes at = cache_slot_bytes(cache, l);
        for (auto [b, t] : writers) {
            if (on_device() && reads_another_requests_stash(b, t)) {
                contested_cache.anything(cache, at.codes, kD);
                contested_cache.anything(cache, at.scale, 4);
                continue;
            }
            Tensor c = cache, tl = tail, m = sm_t;
            c.storage = before.of(cache);
            tl.storage = before.of(tail);
            for (int64_t j = 0; j < tokens; j++) {
                if (j != t) m.store_at<int32_t>(m.byte_offset({b, j}), -1);
            }
            const kpool_tensor cd = c.desc(), td = tl.desc(), ts = request(tsm_t, b), k = request(key, b),
                               s = request(score, b), a = ape.desc(), md = request(m, b), p = request(pos_t, b);
            kpool_ref::decode_update_and_maybe_write_cache_batched(&cd, &td, &ts, &k, &s, &a, &md, &p, pool_size,
                                                                   head_dim, round_scale);
            if (writers.size() == 1) {
                std::memcpy(&model_cache[cache.origin + at.codes], c.data() + at.codes, kD);
                std::memcpy(&model_cache[cache.origin + at.scale], c.data() + at.scale, 4);
            } else {
                contested_cache.add(cache, at.codes, c.data() + at.codes, kD);
                contested_cache.add(cache, at.scale, c.data() + at.scale, 4);
            }
        }
    }
    for (auto &[at, writers] : stashes) {
        written_twice = written_twice || writers.size() > 1;
        for (int half = 0; half < 2; half++) {
            const int64_t to = tail.byte_offset({at.first, half, at.second, 0});
            for (auto [b, t] : writers) {
                const Tensor &src = half == 0 ? key : score;
                const uint8_t *row = src.data() + src.byte_offset({b, t, 0});
                if (writers.size() == 1) {
                    std::memcpy(&model_tail[tail.origin + to], row, 2 * kD);
                } else {
                    contested_tail.add(tail, to, row, 2 * kD);
                }
            }
        }
    }
    if (!shared_block && !written_twice) {
        KFUZZ_CHECK(model_cache == want_cache.storage && model_tail == want_tail.storage,
                    "harness: the per-request model differs from the reference's run of the batch");
    }
    check_bytes_contested(cache, model_cache, contested_cache, op, "kv_cache vs the reference");
    check_bytes_contested(tail, model_tail, contested_tail, op, "tail_kv_cache vs the reference");
    return 0;
}
