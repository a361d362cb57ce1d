// kpool_fwht128_quant_fp8 under hostile shapes, strides, dtypes and values.
#include "fuzz_common.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_fwht128_quant_fp8";
    const int64_t rows = in.range<int64_t>(1, 24) - (in.chance(16) ? 1 : 0);
    const bool specials = in.chance(32);
    const float sigmas[] = {1.0f, 1e-7f, 1e25f, 100.0f};
    const float sigma = sigmas[in.pick(4)];

    Tensor q = plan(in, "q", KPOOL_DTYPE_BFLOAT16, {rows, kD});
    Tensor q8 = plan(in, "q_fp8", in.flag() ? KPOOL_DTYPE_UINT8 : KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD});
    Tensor qs = in.flag() ? plan(in, "q_scale", KPOOL_DTYPE_FLOAT32, {rows, 1})
                          : plan(in, "q_scale", KPOOL_DTYPE_FLOAT32, {rows});
    const bool tampered = maybe_tamper(in, {&q, &q8, &qs});
    for (Tensor *t : {&q, &q8, &qs}) {
        if (!t->allocate(in)) return 0;
    }
    fill_values(in, q, sigma, specials);
    const CallOptions opts(in, PoolOp::kNo);
    note("rows %lld", (long long)rows);

    const char *must_fail = first_reason({invalid_alone(q, {KPOOL_DTYPE_BFLOAT16}),
                                          invalid_alone(q8, {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8}),
                                          invalid_alone(qs, {KPOOL_DTYPE_FLOAT32})});
    const Snapshot before({&q, &q8, &qs});
    Tensor want8 = q8, wants = qs;
    kpool_status st;
    std::memset(&st, 0x5A, sizeof st);
    const kpool_status_code rc = kpool_fwht128_quant_fp8(Desc(q)(), Desc(q8)(), Desc(qs)(), opts.ex(),
                                                         opts.with_status ? &st : nullptr);
    if (!settle(rc, st, opts, op, before, must_fail, !tampered)) return 0;

    check_bytes(q, before.of(q), op, "the input changed");
    const kpool_tensor qd = q.desc(), w8 = want8.desc(), ws = wants.desc();
    kpool_ref::fwht128_quant_fp8(&qd, &w8, &ws);
    Contested nonfinite8, nonfinites;
    for (int64_t r = 0; r < q8.shape[0] && !strict_nonfinite(); r++) {
        const int64_t codes = q8.byte_offset({r, 0}), scale = qs.byte_offset({r});
        if (nonfinite_row(want8.data() + codes, wants.load_at<float>(scale))) {
            nonfinite8.anything(q8, codes, kD);
            nonfinites.anything(qs, scale, 4);
        }
    }
    check_bytes_contested(q8, want8.storage, nonfinite8, op, "q_fp8 vs the reference");
    check_bytes_contested(qs, wants.storage, nonfinites, op, "q_scale vs the reference");
    return 0;
}
