#include "unconditional_producers.h"

namespace kpool::cuda {

using namespace Halide;
using namespace Halide::Internal;

Stmt UnconditionalProducers::visit(const For *op) {
    const bool threads = op->for_type == ForType::GPUThread || op->for_type == ForType::GPULane;
    const bool outer = in_threads_;
    in_threads_ = in_threads_ || threads;
    Stmt s = IRMutator::visit(op);
    in_threads_ = outer;
    return s;
}

Stmt UnconditionalProducers::visit(const IfThenElse *op) {
    const ProducerConsumer *produce = op->then_case.as<ProducerConsumer>();
    if (in_threads_ && !op->else_case.defined() && produce && produce->is_producer &&
        producers_.count(produce->name)) {
        return mutate(op->then_case);
    }
    return IRMutator::visit(op);
}

}  // namespace kpool::cuda
