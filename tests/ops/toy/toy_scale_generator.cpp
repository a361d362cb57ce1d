// The toy op's kernel (tests/ops/toy/toy_scale.toml): each int32 of x times
// factor. Halide's default schedule: the test is of the plumbing, not speed.
#include "Halide.h"

namespace {

class ToyScale : public Halide::Generator<ToyScale> {
public:
    Input<Buffer<int32_t, 2>> x{"x"};  // (col, row)
    Input<int32_t> factor{"factor"};
    Output<Buffer<int32_t, 2>> out{"out"};

    void generate() {
        Var col{"col"}, row{"row"};
        out(col, row) = x(col, row) * factor;
    }
};

}  // namespace

HALIDE_REGISTER_GENERATOR(ToyScale, toy_scale)
