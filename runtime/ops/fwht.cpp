// fwht128_quant_fp8: each bf16 row of q through the 128-point Hadamard
// transform, quantized to e4m3 codes and a per-row scale.
#include "ops.h"

namespace kpool::rt {

namespace {

void launch_fwht(const Placement &where, const TensorArg &q, const TensorArg &q_fp8, const TensorArg &q_scale) {
    if (q.dim(0) == 0) {
        return;
    }
    // Rows of 16-byte-aligned bf16 and 8-byte-aligned codes (torch's are)
    // take the words kernel: bf16 pairs as 4-byte words, a lane's run of 8 in
    // one 16-byte load; 8 codes to an 8-byte word, one store.
    if (!where.on_host() && rows_aligned(q, 16, {0}) && rows_aligned(q_fp8, 8, {0})) {
        HalideBuffer in = wrap_row_words(q, 4), codes = wrap_row_words(q_fp8, 8),
                     scales = wrap_row_scales(q_scale, KPOOL_HEAD_DIM / 8);
        where.launch<Kernel::FWHT_WORDS>("fwht128_quant_fp8", 0, ElementType::none, where.attach(in).raw_buffer(),
                                         where.attach(codes).raw_buffer(), where.attach(scales).raw_buffer());
        return;
    }
    HalideBuffer in = wrap(q), codes = wrap(q_fp8), scales = wrap_row_scales(q_scale);
    where.launch<Kernel::FWHT>("fwht128_quant_fp8", 0, ElementType::none, where.attach(in).raw_buffer(),
                               where.attach(codes).raw_buffer(), where.attach(scales).raw_buffer());
}

}  // namespace

void fwht128_quant_fp8(const kpool_tensor *q_, const kpool_tensor *q_fp8_, const kpool_tensor *q_scale_,
                       const kpool_exec *exec) {
    TensorArg q = require_tensor("q", q_, {KPOOL_DTYPE_BFLOAT16}, 2);
    require_dim(q, 1, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(q);
    TensorArg q_fp8 = require_tensor("q_fp8", q_fp8_, {KPOOL_DTYPE_FLOAT8_E4M3FN, KPOOL_DTYPE_UINT8}, 2);
    require_same_dim(q_fp8, 0, q, 0);
    require_dim(q_fp8, 1, KPOOL_HEAD_DIM, "head_dim");
    require_inner_contiguous(q_fp8);
    require_disjoint_rows(q_fp8);
    TensorArg q_scale = require_tensor_ranks("q_scale", q_scale_, {KPOOL_DTYPE_FLOAT32}, {1, 2});
    require_same_dim(q_scale, 0, q, 0);
    require_row_scales_shape(q_scale);
    // Rows are independent: on a device, tensors past the kernels' 32-bit
    // offsets run in ranges of rows, one launch each.
    const std::vector<const TensorArg *> rows{&q, &q_fp8, &q_scale};
    Placement where(rows, exec, rows);
    for (RowRange r : where.row_ranges(q.dim(0), rows)) {
        const kpool_tensor q_rows = row_slice(q, r), fp8_rows = row_slice(q_fp8, r), scale_rows = row_slice(q_scale, r);
        launch_fwht(where, {q.name, &q_rows}, {q_fp8.name, &fp8_rows}, {q_scale.name, &scale_rows});
    }
}

}  // namespace kpool::rt
