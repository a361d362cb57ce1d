// A lowering pass over the block barriers of a CUDA kernel's serial loops
// (Pipeline::add_custom_lowering_pass: it runs after Halide has fused the
// kernel's thread loops and put a barrier between every two block-level
// stages, before the kernel is split off for the device).
//
// Halide 21 (src/FuseGPUThreadLoops.cpp, InjectThreadBarriers) puts a
// barrier between every two statements at the block level of a kernel that
// has any thread loop, whether or not they share memory, and skip_stages'
// conditions sit inside them: a decode token that completes nothing still
// passes every stage's barrier (19 per token in the warp-per-token exact
// kernel). Within each serial loop at the block level this pass
// - (where asked) drops a barrier between two runs of statements that both keep to their
//   threads' own memory: no shared memory and no global store (registers
//   and warp shuffles are a thread's or a warp's own; all global buffers
//   count as one, since a kernel's input may be its output in place);
// - wraps each run of consecutive statements whose conditions share a
//   block-uniform conjunct (no thread variable, loads only from buffers the
//   kernel never stores) in one condition on it, barriers and the shuffles
//   Halide hoists out of each condition included: every thread of the block
//   takes the same branch, so a barrier inside is passed by all or by none.
#pragma once

#include "Halide.h"

namespace kpool::cuda {

class BlockUniformBarriers : public Halide::Internal::IRMutator {
public:
    // drop_private: whether to drop the barriers between runs that keep to
    // their threads' own memory (the first step above).
    explicit BlockUniformBarriers(bool drop_private) : drop_private_(drop_private) {}

protected:
    using IRMutator::visit;
    Halide::Internal::Stmt visit(const Halide::Internal::For *op) override;

private:
    bool drop_private_;
};

}  // namespace kpool::cuda
