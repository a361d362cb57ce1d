// kpool_seed_tail_cache: copy each request's last P prefill tokens (raw K and
// gate score) into its tail ring.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

class SeedTail : public KpoolGenerator<SeedTail, SeedTailStages> {
public:
    Input<Buffer<uint16_t, 2>> key{"key"};                // (d, token) bf16 bits
    Input<Buffer<uint16_t, 2>> gate_score{"gate_score"};  // (d, token)
    Input<Buffer<void, 1>> tslot{"tslot"};                // (token) int32 or int64
    Input<int> pool_size{"pool_size"};
    Output<Buffer<uint16_t, 4>> tail{"tail"};  // (d, ring_pos, half, block), in place

    void generate() {
        Expr n = tslot.dim(0).extent();
        Var d{"d"}, ring_pos{"ring_pos"}, half{"half"}, block{"block"};
        tail(d, ring_pos, half, block) = undef<uint16_t>();
        Func slots = BoundaryConditions::constant_exterior(tslot, cast(tslot.type(), -1));
        TailSeed seed(slots, pool_size, tail.dim(1).extent(), tail.dim(3).extent(), stages.token);
        stages.seeded = seed.seeded;

        // Token i = group * G + member: consecutive tokens in different
        // members, which a schedule may run side by side (a request's last P
        // tokens are consecutive). Tokens past n are not seeded.
        const int G = schedule_decisions(build_plan(), {KernelAsked::Kind::SeedTail}).seed_group_size;
        RDom &r = stages.copy;
        r = RDom(0, kHeadDim, 0, 2, 0, G, 0, (n + G - 1) / G, "copy");
        seed.write(tail, r, r.x, r.y, r[3] * G + r.z, key, gate_score, n);

        tslot.dim(0).set_stride(Expr());
        key.dim(0).set_bounds(0, kHeadDim);
        gate_score.dim(0).set_bounds(0, kHeadDim);
        tail.dim(0).set_bounds(0, kHeadDim);
        tail.dim(1).set_stride(kHeadDim);
        tail.dim(2).set_bounds(0, 2);
        stages.tail = tail;
    }

    void schedule() {
        using namespace estimate;
        key.set_estimates({{0, kHeadDim}, {0, kTokens}});
        gate_score.set_estimates({{0, kHeadDim}, {0, kTokens}});
        tslot.set_estimates({{0, kTokens}});
        pool_size.set_estimate(kMaxPoolSize);
        tail.set_estimates(in_place_tail());
        schedule_with(schedule_seed_tail);
    }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::SeedTail, kpool_seed_tail)
