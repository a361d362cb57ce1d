// The tests' own kernels' schedules, in kpool_test_generators only: the
// numerics probe (tests/test_numerics.cpp), the shared numerics elementwise
// over a long input, in chunks across threads, vectorized.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

void schedule_numerics_probe(NumericsProbeStages &s, const BuildPlan &plan) {
    for (Func &f : s.outputs) {
        Var io{"i_chunk"}, ii{"i_in_chunk"};
        f.split(s.i, io, ii, 1 << 14, TailStrategy::GuardWithIf).parallel(io).vectorize(ii, plan.target.natural_vector_size<float>());
    }
}

}  // namespace kpool
