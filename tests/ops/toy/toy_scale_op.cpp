// The toy op (tests/ops/toy/toy_scale.toml): validated like every op, then
// its one CPU kernel.
#include "halide_buffers.h"
#include "ops/ops.h"
#include "validate.h"

namespace kpool::rt {

void toy_scale(const kpool_tensor *x_, const kpool_tensor *out_, int32_t factor, const kpool_exec *exec) {
    TensorArg x = require_tensor("x", x_, {KPOOL_DTYPE_INT32}, 2);
    require_inner_contiguous(x);
    TensorArg out = require_tensor("out", out_, {KPOOL_DTYPE_INT32}, 2);
    require_same_dim(out, 0, x, 0);
    require_same_dim(out, 1, x, 1);
    require_disjoint_rows(out);
    const std::vector<const TensorArg *> tensors{&x, &out};
    Placement where(tensors, exec, tensors);
    if (!where.on_host()) {
        throw unsupported() << "toy_scale: a CPU op";
    }
    HalideBuffer in = wrap(x), result = wrap(out);
    where.launch<Kernel::TOY_SCALE>("toy_scale", 0, ElementType::none, where.attach(in).raw_buffer(), factor,
                                    where.attach(result).raw_buffer());
}

}  // namespace kpool::rt
