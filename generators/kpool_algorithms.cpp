#include "kpool_algorithms.h"

#include <functional>

using namespace Halide;

namespace kpool {

namespace {

std::vector<Expr> with_first(Expr first, const std::vector<Var> &rows) {
    std::vector<Expr> args{first};
    args.insert(args.end(), rows.begin(), rows.end());
    return args;
}

// (v, lane, rows...) as the left-hand side of a definition.
std::vector<Var> lane_args(const Var &v, const Var &lane, const std::vector<Var> &rows) {
    std::vector<Var> args{v, lane};
    args.insert(args.end(), rows.begin(), rows.end());
    return args;
}

std::vector<Var> lane_args(const Var &lane, const std::vector<Var> &rows) {
    std::vector<Var> args{lane};
    args.insert(args.end(), rows.begin(), rows.end());
    return args;
}

std::vector<Expr> with_two(Expr first, Expr second, const std::vector<Var> &rows) {
    std::vector<Expr> args{first, second};
    args.insert(args.end(), rows.begin(), rows.end());
    return args;
}

}  // namespace

std::vector<Var> with_d(const Var &d, const std::vector<Var> &rows) {
    std::vector<Var> args{d};
    args.insert(args.end(), rows.begin(), rows.end());
    return args;
}

namespace {

// The other element of a butterfly pair, f(i ^ bit), for a lane-local or a
// lane index `i` whose bit `bit` says which side of the pair it is: read at
// i +- bit, or both candidates i + bit and i - bit read and one selected (see
// RowLayout::partner_by_index). The clamps only keep bounds at [0, extent)
// (bounds inference cannot see through xor, and the simplifier drops a clamp
// around one); no clamped index is used.
struct Partner {
    Expr i, low_side;
    int bit, extent;
    bool by_index;

    Expr read(const std::function<Expr(Expr)> &f) const {
        if (by_index) {
            return f(clamp(i + select(low_side, bit, -bit), 0, extent - 1));
        }
        return select(low_side, f(min(i + bit, extent - 1)), f(max(i - bit, 0)));
    }
};
Partner partner(Expr i, int bit, int extent, bool by_index) {
    return {i, (i & bit) == 0, bit, extent, by_index};
}

}  // namespace

Hadamard128 hadamard128(Func x, const Var &v, const Var &lane, const std::vector<Var> &rows,
                        const RowLayout &layout) {
    Func input{"hadamard_input"};
    input(lane_args(v, lane, rows)) = x(with_first(layout.element(v, lane), rows));
    return hadamard128_of_lanes(input, v, lane, rows, layout);
}

Hadamard128 hadamard128_of_lanes(Func input, const Var &v, const Var &lane, const std::vector<Var> &rows,
                                 const RowLayout &layout) {
    const int V = layout.values_per_lane, L = layout.lanes();
    Hadamard128 h;
    h.stages.push_back(input);
    for (int stride = 1; stride < kHeadDim; stride *= 2) {
        Func prev = h.stages.back();
        Func stage{"hadamard_stride" + std::to_string(stride)};
        // Element i with bit `stride` clear: x[i] + x[i+stride]; set:
        // x[i-stride] - x[i]. Both are other + sign * self, the product exact
        // (sign is +-1), so an fma gives the same bits as the two operations.
        Expr self = prev(with_two(v, lane, rows));
        Expr other;
        Partner p;
        // Which index holds bit `stride` of d: from the lowest, v % run,
        // then lane, then v / run (RowLayout::element).
        const int run = layout.run;
        const bool in_lane = stride < run || stride >= run * L;
        const int bit = stride < run ? stride : stride < run * L ? stride / run : stride / L;
        if (in_lane) {
            p = partner(v, bit, V, layout.partner_by_index);
            other = p.read([&](Expr i) { return prev(with_two(i, lane, rows)); });
        } else {
            p = partner(lane, bit, L, layout.partner_by_index);
            other = p.read([&](Expr i) { return prev(with_two(v, i, rows)); });
        }
        stage(lane_args(v, lane, rows)) = other + select(p.low_side, 1.0f, -1.0f) * self;
        h.stages.push_back(stage);
    }
    h.output = Func{"hadamard128"};
    h.output(lane_args(v, lane, rows)) = h.stages.back()(with_two(v, lane, rows)) * kHadamardNorm;
    return h;
}

Fp8Row quantize_fp8_row(Func x, const Var &d, const Var &v, const Var &lane, const std::vector<Var> &rows,
                        const RowLayout &layout, Expr round_scale, const PoolArithmetic &arith,
                        E4m3Encoder encoder) {
    const int V = layout.values_per_lane, L = layout.lanes();
    Fp8Row q;
    q.round_scale = round_scale;
    // max is exact and, ignoring NaN, commutative and associative, so its
    // order is free: per lane first, then across lanes; or, where the values
    // are warps, across each warp's lanes first, then across the warps.
    Expr row_max;
    if (layout.values_are_warps) {
        q.lane_absmax = Func{"element_absmax"};
        q.lane_absmax(lane_args(v, lane, rows)) = abs_f32(x(with_two(v, lane, rows)));
        Func prev = q.lane_absmax;
        for (int bit = 1; bit < L; bit *= 2) {
            Partner p = partner(lane, bit, L, layout.partner_by_index);
            Func stage{"absmax_warp_lanes" + std::to_string(bit)};
            Expr other = p.read([&](Expr i) { return prev(with_two(v, i, rows)); });
            stage(lane_args(v, lane, rows)) = arith.max_min.max(prev(with_two(v, lane, rows)), other);
            q.absmax_stages.push_back(stage);
            prev = stage;
        }
        row_max = prev(with_two(0, lane, rows));
        for (int w = 1; w < V; w++) {
            row_max = arith.max_min.max(row_max, prev(with_two(w, lane, rows)));
        }
    } else {
        Expr lane_max = abs_f32(x(with_two(0, lane, rows)));
        for (int i = 1; i < V; i++) {
            lane_max = arith.max_min.max(lane_max, abs_f32(x(with_two(i, lane, rows))));
        }
        q.lane_absmax = Func{"lane_absmax"};
        q.lane_absmax(lane_args(lane, rows)) = lane_max;
        Func prev = q.lane_absmax;
        for (int bit = 1; bit < L; bit *= 2) {
            Partner p = partner(lane, bit, L, layout.partner_by_index);
            Func stage{"absmax_lanes" + std::to_string(bit)};
            Expr other = p.read([&](Expr i) { return prev(with_first(i, rows)); });
            stage(lane_args(lane, rows)) = arith.max_min.max(prev(with_first(lane, rows)), other);
            q.absmax_stages.push_back(stage);
            prev = stage;
        }
        row_max = prev(with_first(lane, rows));
    }
    q.lane_scale = Func{"lane_fp8_scale"};
    q.lane_scale(lane_args(lane, rows)) = fp8_scale(row_max, round_scale, arith.max_min);
    q.scale = Func{"fp8_scale"};
    q.scale(with_d(d, rows)) = q.lane_scale(with_first(layout.lane_of(d), rows));
    q.codes = Func{"e4m3_codes"};
    // x / scale is a true division: without round_scale the scale is no
    // power of two and the reference divides, it does not multiply. A
    // ue8m0 scale's exact reciprocal gives the same quotient (as it does
    // div.full.f32's: its reciprocal of a power of two is exact too).
    Expr x_d = x(with_two(layout.value_of(d), layout.lane_of(d), rows));
    Expr scale = q.lane_scale(with_first(layout.lane_of(d), rows));
    q.quotient = Func{"fp8_quotient"};
    q.quotient(with_d(d, rows)) = select(round_scale, x_d * ue8m0_reciprocal(scale), arith.divide(x_d, scale));
    q.encoder = encoder;
    q.codes(with_d(d, rows)) = e4m3_encode_saturated(q.quotient(with_d(d, rows)), encoder);
    return q;
}

namespace {

RotateQuant rotate_quantize_rotation(Func input, Hadamard128 rotation, const Var &d, const Var &v, const Var &lane,
                                     const std::vector<Var> &rows, const RowLayout &layout, Expr round_scale,
                                     const PoolArithmetic &arith, E4m3Encoder encoder) {
    RotateQuant r;
    r.input = input;
    r.rotation = std::move(rotation);
    r.rotated = Func{"rotated_bf16"};
    r.rotated(lane_args(v, lane, rows)) = arith.round_to_bf16(r.rotation.output(with_two(v, lane, rows)));
    r.quant = quantize_fp8_row(r.rotated, d, v, lane, rows, layout, round_scale, arith, encoder);
    return r;
}

}  // namespace

RotateQuant rotate_quantize(Func x_f32, const Var &d, const Var &v, const Var &lane,
                            const std::vector<Var> &rows, const RowLayout &layout, Expr round_scale,
                            const PoolArithmetic &arith, E4m3Encoder encoder) {
    return rotate_quantize_rotation(x_f32, hadamard128(x_f32, v, lane, rows, layout), d, v, lane, rows, layout,
                                    round_scale, arith, encoder);
}

RotateQuant rotate_quantize_lanes(Func x_lanes, const Var &d, const Var &v, const Var &lane,
                                  const std::vector<Var> &rows, const RowLayout &layout, Expr round_scale,
                                  const PoolArithmetic &arith, E4m3Encoder encoder) {
    return rotate_quantize_rotation(x_lanes, hadamard128_of_lanes(x_lanes, v, lane, rows, layout), d, v, lane, rows,
                                    layout, round_scale, arith, encoder);
}

SoftmaxPool softmax_pool(Func key, Func score, Func ape, int pool_size, const Var &d,
                         const Var &j, const std::vector<Var> &rows, const PoolArithmetic &arith) {
    SoftmaxPool s;
    s.arithmetic = arith.kind;
    s.logit = Func{"logit"};
    s.logit(lane_args(d, j, rows)) = score(with_two(d, j, rows)) + ape(d, j);

    // Folds in slot order (reductions over the slots, so a schedule may keep
    // them loops): the order of the f32 operations is part of the contract.
    // Both sums start from +0.0f as the reference's do, so the sign of an
    // all-zero sum matches too (strict_float keeps 0 + x).
    // The max ignores NaN (SPEC step 4): starting from s_0 rather than the
    // reference's -inf changes m only where every s_j is NaN, and there
    // every s_j - m is NaN either way.
    s.max_logit = Func{"max_logit"};
    s.max_logit(with_d(d, rows)) = s.logit(with_two(d, 0, rows));
    if (pool_size > 1) {
        s.later_slot = RDom(1, pool_size - 1, "later_slot");
        s.max_logit(with_d(d, rows)) =
            arith.max_min.max(s.max_logit(with_d(d, rows)), s.logit(with_two(d, s.later_slot, rows)));
    }

    s.weight = Func{"softmax_weight"};
    s.weight(lane_args(d, j, rows)) =
        arith.exp(s.logit(with_two(d, j, rows)) - s.max_logit(with_first(d, rows)));

    s.slot = RDom(0, pool_size, "slot");
    s.weighted_sum = Func{"weighted_sum"};
    s.weighted_sum(with_d(d, rows)) = Tuple(0.0f, 0.0f);
    Expr p = s.weight(with_two(d, s.slot, rows));
    Expr numerator = s.weighted_sum(with_d(d, rows))[0], denominator = s.weighted_sum(with_d(d, rows))[1];
    s.weighted_sum(with_d(d, rows)) =
        Tuple(arith.accumulate(numerator, key(with_two(d, s.slot, rows)), p), denominator + p);
    s.pooled = Func{"pooled"};
    s.pooled(with_d(d, rows)) =
        arith.divide(s.weighted_sum(with_first(d, rows))[0], s.weighted_sum(with_first(d, rows))[1]);
    return s;
}

CompressPool compress_pool(Func key, Func score, Func ape, int pool_size, const Var &d, const Var &j,
                           const Var &v, const Var &lane, const std::vector<Var> &rows,
                           const RowLayout &layout, Expr round_scale, const PoolArithmetic &arith,
                           E4m3Encoder encoder) {
    CompressPool c;
    c.pool = softmax_pool(key, score, ape, pool_size, d, j, rows, arith);
    c.pooled_bf16 = Func{"pooled_bf16"};
    c.pooled_bf16(with_d(d, rows)) = arith.round_to_bf16(c.pool.pooled(with_d(d, rows)));
    c.rotate = rotate_quantize(c.pooled_bf16, d, v, lane, rows, layout, round_scale, arith, encoder);
    return c;
}

Divisor::Divisor(Expr n_, Kind kind) : n(n_) {
    is_pow2 = kind == Kind::Pow2        ? Internal::const_true()
              : kind == Kind::MaybePow2 ? is_power_of_two(n)
                                        : Internal::const_false();
    log2 = count_trailing_zeros(n);
}

Expr Divisor::div(Expr x) const {
    if (Internal::is_const_one(is_pow2)) {
        // An arithmetic shift is floor division by a power of two for any x;
        // unsigned amount: no negative-shift case.
        return x >> cast<uint32_t>(log2);
    }
    if (x.type().bits() > 32) {
        Expr n64 = cast(x.type(), n);
        return select(is_pow2, x >> cast(x.type(), log2), x / n64);
    }
    // Unsigned: no negative-shift or negative-operand case to select.
    Expr u = cast<uint32_t>(max(x, 0));
    return cast<int32_t>(select(is_pow2, u >> cast<uint32_t>(log2), u / cast<uint32_t>(n)));
}

Expr Divisor::mod(Expr x) const {
    if (Internal::is_const_one(is_pow2)) {
        return x & (cast(x.type(), n) - 1);
    }
    if (x.type().bits() > 32) {
        Expr n64 = cast(x.type(), n);
        return select(is_pow2, x & (n64 - 1), x % n64);
    }
    Expr u = cast<uint32_t>(max(x, 0));
    return cast<int32_t>(select(is_pow2, u & (cast<uint32_t>(n) - 1), u % cast<uint32_t>(n)));
}

CacheSlot cache_slot(Expr slot_in_window, const Divisor &page, Expr first_page, Expr num_pages) {
    Expr p = page.div(slot_in_window), t = page.mod(slot_in_window);
    // The page is written as the views' first page plus a clamped offset:
    // Halide then folds the views' base offset into it, and every offset the
    // kernel computes stays inside the window.
    Expr page_in_window = clamp(p, 0, cast(p.type(), num_pages) - 1);
    Expr page_index = first_page + cast<int32_t>(page_in_window);
    Expr token = cast<int32_t>(clamp(t, 0, cast(t.type(), page.n) - 1));
    return {page_index, token};
}

void write_cache_rows(Func cache, RDom &write, const std::vector<Expr> &row, Expr loc, Expr writes,
                      const Fp8Row &quant, const Divisor &page, bool offsets_32bit) {
    std::vector<OutputImageParam> views = cache.output_buffers();
    // The views hold pages [first_page, first_page + num_pages): the whole
    // cache, or one window of it where the runtime launches a cache larger
    // than the kernels' 32-bit offsets in windows (a slot outside is
    // another launch's).
    // The window's slots, [first_slot, last_slot]: loop invariants, so the
    // check costs two comparisons (no division where the pages are no power
    // of two), in loc's width (an int32 loc compares with the bounds
    // saturated to int32: the same answer).
    Expr first_page = views[0].dim(2).min(), num_pages = views[0].dim(2).extent();
    Expr first_slot = cast<int64_t>(page.n) * cast<int64_t>(first_page);
    Expr last_slot = first_slot + cast<int64_t>(page.n) * cast<int64_t>(num_pages) - 1;
    if (loc.type().bits() <= 32) {
        loc = cast<int32_t>(loc);
        first_slot = saturating_cast<int32_t>(first_slot);
        last_slot = saturating_cast<int32_t>(last_slot);
    }
    write.where(writes && loc >= first_slot && loc <= last_slot);  // first_slot >= 0: no sentinel passes
    // A window of 32-bit offsets holds fewer than 2^31 bytes, so fewer slots:
    // there a slot's place in it divides in 32 bits (a 64-bit division is a
    // software routine three times as long).
    Expr slot_in_window = loc - first_slot;
    if (offsets_32bit) {
        // The low words' difference, wrapping: exact below 2^31.
        slot_in_window = cast<int32_t>(cast<uint32_t>(loc) - cast<uint32_t>(first_slot));
    }
    CacheSlot slot = cache_slot(slot_in_window, page, first_page, num_pages);
    Expr d = write.x;
    std::vector<Expr> at{d};
    at.insert(at.end(), row.begin(), row.end());
    cache(d, slot.token, slot.page) = Tuple(quant.codes(at), quant.scale(at));
    constrain_cache_views(views);
}

void constrain_cache_views(std::vector<OutputImageParam> &views) {
    // The scales view shares the codes view's bounds (Halide makes it so);
    // the pages' min is the window's first page (write_cache_rows).
    views[0].dim(0).set_bounds(0, kHeadDim);
    views[0].dim(1).set_min(0).set_stride(kHeadDim);
    views[1].dim(0).set_stride(0);
    views[1].dim(1).set_stride(1);
}

void constrain_row_views(std::vector<OutputImageParam> views, int extent) {
    views[0].dim(0).set_bounds(0, extent);
    views[0].dim(1).set_min(0);
    views[1].dim(0).set_stride(0);
}

TailSlot tail_slot(Expr tslot, const Divisor &ring, Expr num_blocks) {
    tslot = cast<int64_t>(tslot);
    Expr block = cast<int32_t>(clamp(ring.div(tslot), 0, cast<int64_t>(num_blocks) - 1));
    Expr ring_pos = cast<int32_t>(clamp(ring.mod(tslot), 0, cast<int64_t>(ring.n) - 1));
    return {block, ring_pos};
}

TailSlot clamp_tail_slot(Expr block, Expr ring_pos, Expr ring, Expr num_blocks) {
    return {clamp(block, 0, num_blocks - 1), clamp(ring_pos, 0, ring - 1)};
}

TailSeed::TailSeed(Func slots_, Expr pool_size, Expr ring_, Expr num_blocks_, Var token)
    : slots(std::move(slots_)), ring(ring_, Divisor::Kind::Any), num_blocks(std::move(num_blocks_)),
      seeded("seeded") {
    // Only non-negative slots are divided (64-bit slots as they are).
    Expr own = cast<int64_t>(slots(token)), ahead = cast<int64_t>(slots(token + pool_size));
    Expr same_block = ahead >= 0 && ring.div(ahead) == ring.div(own);
    Expr in_tail = ring.div(own) < cast<int64_t>(num_blocks);
    seeded(token) = own >= 0 && in_tail && !same_block;
}

void TailSeed::write(Func tail, RDom &r, Expr d, Expr half, Expr token, Func key, Func gate_score, Expr n) const {
    r.where(seeded(token));
    TailSlot at = tail_slot(cast<int64_t>(slots(token)), ring, num_blocks);
    // Tokens past n are never seeded; the clamp keeps the reads' bounds
    // inside the batch.
    Expr row = min(token, n - 1);
    tail(d, at.ring_pos, half, at.block) = select(half == 0, key(d, row), gate_score(d, row));
}

}  // namespace kpool
