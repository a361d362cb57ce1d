// kpool_compress_and_write_cache: bf16 / f32 scores, write_mask,
// return_compressed, write_cache = 0, any page layout, hostile locs
// (duplicates, past the cache, int64 extremes) and hostile descriptors.
#include "fuzz_common.h"

using namespace kfuzz;

namespace {

enum Mode { kWrite, kMasked, kWriteAndReturn, kReturnOnly, kReturnNoCache };

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_compress_and_write_cache";
    auto [P, pool_size, hostile] = pool_size_choice(in);
    const int32_t head_dim = head_dim_value(in);
    hostile = hostile || head_dim != kD;
    const Mode mode = Mode(in.pick(5));
    const int64_t n = count_value(in, P >= 32 ? 6 : 20, 12);
    const int64_t pages = count_value(in, 6, 8);
    const int64_t block_size = block_size_value(in);
    const bool f32_scores = in.flag();
    const bool specials = in.chance(24);
    const float k_sigmas[] = {1.0f, 1e-7f, 1e25f, 3.0f};
    const float k_sigma = k_sigmas[in.pick(4)];
    const float s_sigma = in.flag() ? 2.0f : 60.0f;

    const bool masked = mode == kMasked;
    const bool write = mode == kWrite || masked || mode == kWriteAndReturn;
    const bool ret = mode == kWriteAndReturn || mode == kReturnOnly || mode == kReturnNoCache;
    int32_t write_cache = flag_value(in, write);
    int32_t round_scale = flag_value(in, in.flag());
    hostile = hostile || (write_cache != 0) != write;

    Tensor cache = cache_layout(in, pages, block_size);
    cache.absent = mode == kReturnNoCache;
    Tensor slot_k = plan(in, "slot_k", KPOOL_DTYPE_BFLOAT16, {n, P, kD});
    Tensor slot_score = plan(in, "slot_score", f32_scores ? KPOOL_DTYPE_FLOAT32 : KPOOL_DTYPE_BFLOAT16, {n, P, kD});
    Tensor ape = plan(in, "ape", KPOOL_DTYPE_FLOAT32, {P, kD});
    Tensor loc = plan(in, "loc", KPOOL_DTYPE_INT64, {n});
    Tensor mask = plan(in, "write_mask", in.flag() ? KPOOL_DTYPE_BOOL : KPOOL_DTYPE_UINT8, {n});
    mask.absent = !masked;
    Tensor ck = plan(in, "compressed_k", in.flag() ? KPOOL_DTYPE_FLOAT8_E4M3FN : KPOOL_DTYPE_UINT8, {n, kD});
    Tensor cs = in.flag() ? plan(in, "compressed_scale", KPOOL_DTYPE_FLOAT32, {n})
                          : plan(in, "compressed_scale", KPOOL_DTYPE_FLOAT32, {n, 1});
    ck.absent = cs.absent = !ret;

    // Index values: mostly distinct slots, then hostile ones.
    const int64_t slots = pages * block_size;
    std::vector<int64_t> locs, flags;
    for (int64_t i = 0; i < n; i++) {
        locs.push_back(in.chance(128) ? index_value(in, slots, locs, true)
                                      : (slots > 0 ? int64_t(in.next() % uint64_t(slots)) : -1));
        flags.push_back(in.chance(64) ? (in.chance(32) ? in.range<int64_t>(2, 255) : 0) : 1);
    }

    std::vector<Tensor *> present{&slot_k, &slot_score, &ape, &loc};
    for (Tensor *t : {&cache, &mask, &ck, &cs}) {
        if (!t->absent) present.push_back(t);
    }
    const bool tampered = maybe_tamper(in, present);
    if (!allocate_all(in, {&cache, &slot_k, &slot_score, &ape, &loc, &mask, &ck, &cs})) return 0;
    fill_values(in, slot_k, k_sigma, specials);
    fill_values(in, slot_score, s_sigma, specials);
    fill_values(in, ape, 0.5f, specials);
    write_ints(loc, locs);
    write_ints(mask, flags);
    CallOptions opts(in, PoolOp::kYes);
    note("P %d pool_size %d head_dim %d mode %d write_cache %d round_scale %d slots %lld", P, pool_size, head_dim, int(mode), write_cache, round_scale, (long long)slots);

    // What must be rejected whatever else the call holds.
    const bool mask_given = !mask.absent, ret_given = !ck.absent || !cs.absent;
    bool out_of_range = false;
    if (write_cache != 0) {
        for (int64_t i = 0; i < n; i++) {
            out_of_range = out_of_range || ((!masked || flags[i] != 0) && locs[i] >= slots);
        }
    }
    const bool bad_layout = cache.shape[0] > 1 && cache.strides[0] % 4 != 0;
    const char *must_fail = first_reason({
        invalid_alone(slot_k, {KPOOL_DTYPE_BFLOAT16}),
        invalid_alone(slot_score, {KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32}),
        invalid_alone(ape, {KPOOL_DTYPE_FLOAT32}),
        invalid_alone(loc, {KPOOL_DTYPE_INT64}),
        write_cache != 0 ? invalid_alone(cache, {KPOOL_DTYPE_UINT8}) : nullptr,
        write_cache != 0 && !cache.null_data && cache.misalign % 4 ? "a kv_cache not 4-byte aligned" : nullptr,
        mask_given ? invalid_alone(mask, {KPOOL_DTYPE_BOOL, KPOOL_DTYPE_UINT8}) : nullptr,
        ret_given ? invalid_alone(ck, {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8}) : nullptr,
        ret_given ? invalid_alone(cs, {KPOOL_DTYPE_FLOAT32}) : nullptr,
        head_dim != kD ? "head_dim != 128" : nullptr,
        !tampered && pool_size != P ? "pool_size != slot_k.shape[1]" : nullptr,
        write_cache == 0 && !ret_given ? "nothing to compute" : nullptr,
        mask_given && ret_given ? "write_mask with return_compressed" : nullptr,
        !tampered && out_of_range && !on_device() ? "a loc outside the cache" : nullptr,
        !tampered && write_cache != 0 && bad_layout ? "a page stride not a multiple of 4" : nullptr,
    });

    const Snapshot before({&cache, &slot_k, &slot_score, &ape, &loc, &mask, &ck, &cs});
    Tensor want_cache = cache, want_ck = ck, want_cs = cs;
    kpool_status st = poisoned_status();
    CallMemory mem({&cache, &slot_k, &slot_score, &ape, &loc, &mask, &ck, &cs});
    const kpool_status_code rc = kpool_compress_and_write_cache(
        mem(cache), mem(slot_k), mem(slot_score), mem(ape), mem(loc), mem(mask), mem(ck),
        mem(cs), pool_size, head_dim, round_scale, write_cache, opts.ex(), opts.with_status ? &st : nullptr);
    mem.finish();
    if (!tampered && !hostile && !bad_layout && out_of_range && !opts.rejection && rc != KPOOL_OK && !on_device()) {
        KFUZZ_CHECK(rc == KPOOL_ERROR_OUT_OF_RANGE, "%s: a loc outside the cache gave %s", op, kpool_status_name(rc));
    }
    const bool valid = !tampered && !hostile && !bad_layout;
    if (!settle(rc, st, opts, op, before, must_fail, valid && (!out_of_range || on_device()))) return 0;
    if (valid) opts.check_marks(op, {{KPOOL_INDEX_LOC, out_of_range}});

    for (Tensor *t : {&slot_k, &slot_score, &ape, &loc, &mask}) check_bytes(*t, before.of(*t), op, "an input changed");
    // A device call skips the locs outside the cache as passed (a tampered
    // shape included): the reference without them.
    Tensor written_loc = loc;
    if (on_device()) {
        for (int64_t i = 0; i < loc.shape[0]; i++) {
            if (past_passed(loc.get_int(i), passed_cache_slots(cache))) written_loc.set_int(i, -1);
        }
    }
    {
        const Desc c(want_cache), k(slot_k), s(slot_score), a(ape), l(written_loc), m(mask), kd(want_ck), sd(want_cs);
        kpool_ref::compress_and_write_cache(c(), k(), s(), a(), l(), m(), kd(), sd(), pool_size, head_dim, round_scale,
                                            write_cache);
    }
    // Every pool's row, from the reference.
    Tensor rows_k = explicit_layout("rows_k", KPOOL_DTYPE_UINT8, {n, kD}, {kD, 1});
    Tensor rows_s = explicit_layout("rows_s", KPOOL_DTYPE_FLOAT32, {n}, {1});
    rows_k.allocate(in);
    rows_s.allocate(in);
    if (n > 0) {
        const kpool_tensor k = slot_k.desc(), s = slot_score.desc(), a = ape.desc(), lo = loc.desc(), rk = rows_k.desc(),
                           rs = rows_s.desc();
        kpool_ref::compress_and_write_cache(nullptr, &k, &s, &a, &lo, nullptr, &rk, &rs, pool_size, head_dim,
                                            round_scale, 0);
    }
    // Slots that several pools write: any one pool's bytes per byte.
    Contested contested;
    if (write_cache != 0) {
        std::map<int64_t, std::vector<int64_t>> writers;  // loc -> pools
        for (int64_t i = 0; i < n; i++) {
            const int64_t l = written_loc.get_int(i);
            if (l >= 0 && (!mask_given || mask.get_int(i) != 0)) writers[l].push_back(i);
        }
        for (auto &[l, pools] : writers) {
            const CacheSlotBytes at = cache_slot_bytes(cache, l);
            if (pools.size() < 2) continue;
            for (int64_t i : pools) {
                contested.add(cache, at.codes, rows_k.data() + rows_k.byte_offset({i, 0}), kD);
                contested.add(cache, at.scale, rows_s.data() + rows_s.byte_offset({i}), 4);
            }
        }
    }
    check_bytes_contested(cache, want_cache.storage, contested, op, "kv_cache vs the reference");
    check_bytes(ck, want_ck.storage, op, "compressed_k vs the reference");
    check_bytes(cs, want_cs.storage, op, "compressed_scale vs the reference");
    return 0;
}
