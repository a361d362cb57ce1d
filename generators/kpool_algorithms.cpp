#include "kpool_algorithms.h"

using namespace Halide;

namespace kpool {

namespace {

std::vector<Expr> exprs(const std::vector<Var> &vars) {
    return std::vector<Expr>(vars.begin(), vars.end());
}

std::vector<Expr> with_first(Expr first, const std::vector<Var> &rows) {
    std::vector<Expr> args{first};
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

Hadamard128 hadamard128(Func x, const Var &d, const std::vector<Var> &rows) {
    Hadamard128 h;
    h.stages.push_back(x);
    for (int stride = 1, k = 1; stride < kHeadDim; stride *= 2, k++) {
        Func prev = h.stages.back();
        Func stage{"hadamard_stride" + std::to_string(stride)};
        // The partner index is clamped only so bounds stay [0, 128): the
        // select never uses the clamped lane.
        Expr upper = prev(with_first(min(d + stride, kHeadDim - 1), rows));
        Expr lower = prev(with_first(max(d - stride, 0), rows));
        Expr self = prev(with_first(d, rows));
        stage(with_d(d, rows)) = select((d & stride) == 0, self + upper, lower - self);
        h.stages.push_back(stage);
    }
    h.output = Func{"hadamard128"};
    h.output(with_d(d, rows)) = h.stages.back()(with_first(d, rows)) * kHadamardNorm;
    return h;
}

Fp8Row quantize_fp8_row(Func x, const Var &d, const std::vector<Var> &rows, Expr round_scale) {
    Fp8Row q;
    RDom dims(0, kHeadDim, "absmax_d");
    q.absmax = Func{"absmax"};
    q.absmax(rows) = maximum(abs(x(with_first(dims.x, rows))));
    q.scale = Func{"fp8_scale"};
    q.scale(rows) = fp8_scale(q.absmax(exprs(rows)), round_scale);
    q.codes = Func{"e4m3_codes"};
    // x / scale is a true division: without round_scale the scale is no
    // power of two and the reference divides, it does not multiply.
    Expr y = clamp(x(with_d(d, rows)) / q.scale(exprs(rows)), -kFp8Max, kFp8Max);
    q.codes(with_d(d, rows)) = e4m3_encode(y);
    return q;
}

RotateQuant rotate_quantize(Func x_f32, const Var &d, const std::vector<Var> &rows,
                            Expr round_scale) {
    RotateQuant r;
    r.input = x_f32;
    r.rotation = hadamard128(x_f32, d, rows);
    r.rotated = Func{"rotated_bf16"};
    r.rotated(with_d(d, rows)) = round_to_bf16(r.rotation.output(with_d(d, rows)));
    r.quant = quantize_fp8_row(r.rotated, d, rows, round_scale);
    return r;
}

SoftmaxPool softmax_pool(Func key, Func score, Func ape, int pool_size, const Var &d,
                         const Var &j, const std::vector<Var> &rows) {
    SoftmaxPool s;
    s.logit = Func{"logit"};
    s.logit(with_two(d, j, rows)) = score(with_two(d, j, rows)) + ape(d, j);

    // Unrolled folds in slot order: the order of the f32 operations is part
    // of the contract. Both sums start from +0.0f as the reference's do, so
    // the sign of an all-zero sum matches too (strict_float keeps 0 + x).
    Expr m = s.logit(with_two(d, 0, rows));
    for (int slot = 1; slot < pool_size; slot++) {
        m = max(m, s.logit(with_two(d, slot, rows)));
    }
    s.max_logit = Func{"max_logit"};
    s.max_logit(with_d(d, rows)) = m;

    s.weight = Func{"softmax_weight"};
    s.weight(with_two(d, j, rows)) =
        exp_f32_correctly_rounded(s.logit(with_two(d, j, rows)) - s.max_logit(with_first(d, rows)));

    Expr numerator = 0.0f, denominator = 0.0f;
    for (int slot = 0; slot < pool_size; slot++) {
        Expr p = s.weight(with_two(d, slot, rows));
        denominator = denominator + p;
        numerator = numerator + key(with_two(d, slot, rows)) * p;
    }
    s.weighted_sum = Func{"weighted_sum"};
    s.weighted_sum(with_d(d, rows)) = Tuple(numerator, denominator);
    s.pooled = Func{"pooled"};
    s.pooled(with_d(d, rows)) =
        s.weighted_sum(with_first(d, rows))[0] / s.weighted_sum(with_first(d, rows))[1];
    return s;
}

CompressPool compress_pool(Func key, Func score, Func ape, int pool_size, const Var &d,
                           const Var &j, const std::vector<Var> &rows, Expr round_scale) {
    CompressPool c;
    c.pool = softmax_pool(key, score, ape, pool_size, d, j, rows);
    c.pooled_bf16 = Func{"pooled_bf16"};
    c.pooled_bf16(with_d(d, rows)) = round_to_bf16(c.pool.pooled(with_d(d, rows)));
    c.rotate = rotate_quantize(c.pooled_bf16, d, rows, round_scale);
    return c;
}

CacheSlot cache_slot(Expr loc, Expr page_size, Expr num_pages) {
    loc = cast<int64_t>(loc);
    Expr page = cast<int32_t>(clamp(loc / page_size, 0, cast<int64_t>(num_pages) - 1));
    Expr token = cast<int32_t>(clamp(loc % page_size, 0, cast<int64_t>(page_size) - 1));
    return {page, token};
}

Expr cache_word_offset(const CacheSlot &slot, Expr page_size, Expr word) {
    Expr codes_at = slot.token * kHeadDim + word * 4;
    Expr scale_at = page_size * kHeadDim + slot.token * 4;
    return select(word < kHeadDim / 4, codes_at, scale_at);
}

Expr cache_row_byte(const Fp8Row &quant, const std::vector<Expr> &row, Expr word, Expr byte) {
    std::vector<Expr> code_args{min(word * 4 + byte, kHeadDim - 1)};
    code_args.insert(code_args.end(), row.begin(), row.end());
    Expr scale_bits = reinterpret<uint32_t>(quant.scale(row));
    Expr scale_byte = cast<uint8_t>(scale_bits >> (cast<uint32_t>(byte) * 8));
    return select(word < kHeadDim / 4, quant.codes(code_args), scale_byte);
}

TailSlot tail_slot(Expr tslot, Expr ring, Expr num_blocks) {
    tslot = cast<int64_t>(tslot);
    Expr block = cast<int32_t>(clamp(tslot / ring, 0, cast<int64_t>(num_blocks) - 1));
    Expr ring_pos = cast<int32_t>(clamp(tslot % ring, 0, cast<int64_t>(ring) - 1));
    return {block, ring_pos};
}

}  // namespace kpool
