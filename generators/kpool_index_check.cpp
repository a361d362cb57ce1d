// kpool_index_check: whether any write index of a device call lies outside
// the tensor it addresses. A device call cannot reject such an index before
// it runs (the indices are in device memory, and reading them back would
// synchronize): its kernels skip those writes, and, when the caller asks for
// it (kpool_exec.index_errors), this kernel marks the argument in a word of
// device memory the caller reads when it chooses to.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

class IndexCheck : public KpoolGenerator<IndexCheck, IndexCheckStages> {
public:
    Input<Buffer<void, 2>> index{"index"};         // (i, row) int32 or int64, any strides
    Input<Buffer<uint8_t, 1>> enabled{"enabled"};  // (i): 0 = not a write (a write mask); stride 0 when absent
    Input<int64_t> limit{"limit"};                 // the first index past the tensor
    Output<Buffer<int32_t, 1>> mark{"mark"};       // one word, in place: set to 1, never cleared here

    void generate() {
        Var x{"x"};
        mark(x) = undef<int32_t>();
        // Negative indices are "no write" sentinels, never out of range.
        RDom &r = stages.entry;
        r = RDom(index.dim(0).min(), index.dim(0).extent(), index.dim(1).min(), index.dim(1).extent(), "entry");
        Expr out_of_range = cast<int64_t>(index(r.x, r.y)) >= limit;
        r.where(enabled(r.x) != 0 && out_of_range);
        // Only entries out of range write, and each stores 1 (the update
        // names the entry so that it runs over them): the order of racing
        // writers, or of calls on other streams sharing the word, cannot
        // lose a mark.
        mark(0) = cast<int32_t>(out_of_range);

        index.dim(0).set_stride(Expr());
        enabled.dim(0).set_stride(Expr());
        mark.dim(0).set_bounds(0, 1);
        stages.mark = mark;
    }

    void schedule() {
        using namespace estimate;
        index.set_estimates({{0, kNextN}, {0, kRequests}});
        enabled.set_estimates({{0, kNextN}});
        limit.set_estimate(int64_t(kCacheBlocks) * kBlockSize);
        mark.set_estimates({{0, 1}});
        schedule_with(schedule_index_check);
    }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::IndexCheck, kpool_index_check)
