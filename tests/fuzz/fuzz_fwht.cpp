// kpool_fwht128_quant_fp8 under hostile shapes, strides, dtypes and values.
#include "fuzz_common.h"

using namespace kfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const char *op = "kpool_fwht128_quant_fp8";
    const int64_t rows = count_value(in, 24, 16);
    const bool specials = in.chance(32);
    const float sigmas[] = {1.0f, 1e-7f, 1e25f, 100.0f};
    const float sigma = sigmas[in.pick(4)];

    Tensor q = plan(in, "q", KPOOL_DTYPE_BFLOAT16, {rows, kD});
    Tensor q8 = plan(in, "q_fp8", in.flag() ? KPOOL_DTYPE_UINT8 : KPOOL_DTYPE_FLOAT8_E4M3FN, {rows, kD});
    Tensor qs = in.flag() ? plan(in, "q_scale", KPOOL_DTYPE_FLOAT32, {rows, 1})
                          : plan(in, "q_scale", KPOOL_DTYPE_FLOAT32, {rows});
    const bool tampered = maybe_tamper(in, {&q, &q8, &qs});
    if (!allocate_all(in, {&q, &q8, &qs})) return 0;
    fill_values(in, q, sigma, specials);
    CallOptions opts(in, PoolOp::kNo);
    note("rows %lld", (long long)rows);

    const char *must_fail = first_reason({invalid_alone(q, {KPOOL_DTYPE_BFLOAT16}),
                                          invalid_alone(q8, {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8}),
                                          invalid_alone(qs, {KPOOL_DTYPE_FLOAT32})});
    const Snapshot before({&q, &q8, &qs});
    Tensor want8 = q8, wants = qs;
    kpool_status st = poisoned_status();
    CallMemory mem({&q, &q8, &qs});
    const kpool_status_code rc = kpool_fwht128_quant_fp8(mem(q), mem(q8), mem(qs), opts.ex(),
                                                         opts.with_status ? &st : nullptr);
    mem.finish();
    if (!settle(rc, st, opts, op, before, must_fail, !tampered)) return 0;

    check_bytes(q, before.of(q), op, "the input changed");
    const kpool_tensor qd = q.desc(), w8 = want8.desc(), ws = wants.desc();
    kpool_ref::fwht128_quant_fp8(&qd, &w8, &ws);
    check_bytes(q8, want8.storage, op, "q_fp8 vs the reference");
    check_bytes(qs, wants.storage, op, "q_scale vs the reference");
    return 0;
}
