// A lowering pass that runs named producers ahead of their consumers' skip
// conditions (Pipeline::add_custom_lowering_pass, as block_barriers.h).
//
// Halide (skip_stages) computes a producer only where a consumer uses it,
// under the consumer's condition. Where that condition reads memory (a
// decode token's indices) and the producer only loads (the token's stash
// row, at addresses the condition does not change), the producer's loads
// wait for the condition's: two round trips where one would do. For the
// producers it names, whose every load must be in bounds in every
// iteration (the generator clamps their indices), this pass drops the
// condition around their `produce`, so their loads go out beside the
// condition's. Inside a kernel's thread loops only: there a producer has no
// barrier that a condition must keep uniform.
#pragma once

#include "Halide.h"

#include <set>
#include <string>

namespace kpool::cuda {

class UnconditionalProducers : public Halide::Internal::IRMutator {
public:
    explicit UnconditionalProducers(std::set<std::string> producers) : producers_(std::move(producers)) {}

protected:
    using IRMutator::visit;
    Halide::Internal::Stmt visit(const Halide::Internal::For *op) override;
    Halide::Internal::Stmt visit(const Halide::Internal::IfThenElse *op) override;

private:
    std::set<std::string> producers_;
    bool in_threads_ = false;
};

}  // namespace kpool::cuda
