// A second, independent Halide AOT library for tests/sdk: an engine's own
// Halide kernel, with its own Halide runtime, linked into one program with
// kpool's archive (install_and_consume.cmake). out(x) = 3 * in(x) + 1 over
// int32, on as many threads as Halide's thread pool gives it.
#include "Halide.h"

namespace {

class OtherHalide : public Halide::Generator<OtherHalide> {
public:
    Input<Buffer<int32_t, 1>> in{"in"};
    Output<Buffer<int32_t, 1>> out{"out"};

    void generate() {
        Halide::Var x{"x"};
        out(x) = 3 * in(x) + 1;
        out.split(x, x, xi, 64, Halide::TailStrategy::GuardWithIf).parallel(x);
    }

private:
    Halide::Var xi{"xi"};
};

}  // namespace

HALIDE_REGISTER_GENERATOR(OtherHalide, kpool_test_other_halide)
