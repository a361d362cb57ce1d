// schedules/unconditional_producers.h on kernels built by hand in the form
// skip_stages leaves them: a producer's `produce` under its consumer's
// condition, inside the fused thread loop's serial token loop. The pass
// drops that condition for the producers it names, inside thread loops only,
// and leaves every other condition where it was.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "unconditional_producers.h"

namespace {

using namespace Halide;
using namespace Halide::Internal;
using kpool::cuda::UnconditionalProducers;

Expr token() { return Variable::make(Int(32), "t"); }

Stmt store(const std::string &buffer, Expr value) {
    return Store::make(buffer, value, token(), Parameter(), const_true(), ModulusRemainder());
}

Expr load(const std::string &buffer) {
    return Load::make(Int(32), buffer, token(), Buffer<>(), Parameter(), const_true(), ModulusRemainder());
}

// `name` produced from the input `in` under `used`, then consumed (stored
// into `out`) under the same condition, as skip_stages writes them.
Stmt skipped_stage(const std::string &name, Expr used) {
    Stmt produce = ProducerConsumer::make_produce(name, store(name, load("in")));
    Stmt consume = ProducerConsumer::make_consume(name, IfThenElse::make(used, store("out", load(name))));
    return Block::make(IfThenElse::make(used, produce), consume);
}

// A token loop over `body`, inside the fused thread loop where `in_threads`
// (else at the block level), inside the block loop.
Stmt kernel(Stmt body, bool in_threads) {
    Stmt s = For::make("t", 0, 4, ForType::Serial, Partition::Auto, DeviceAPI::None, body);
    if (in_threads) {
        s = For::make(".thread_id_x", 0, 32, ForType::GPUThread, Partition::Never, DeviceAPI::CUDA, s);
    }
    return For::make("block_id_x", 0, 8, ForType::GPUBlock, Partition::Never, DeviceAPI::CUDA, s);
}

// Each `produce` of the Stmt with whether a condition encloses it.
struct Produces : public IRVisitor {
    std::vector<std::pair<std::string, bool>> found;  // (name, conditional)
    int conditions = 0;
    using IRVisitor::visit;
    void visit(const IfThenElse *op) override {
        ++conditions;
        IRVisitor::visit(op);
        --conditions;
    }
    void visit(const ProducerConsumer *op) override {
        if (op->is_producer) {
            found.emplace_back(op->name, conditions > 0);
        }
        IRVisitor::visit(op);
    }
};

std::vector<std::pair<std::string, bool>> produces_after_pass(const Stmt &s, std::set<std::string> names) {
    UnconditionalProducers pass(std::move(names));
    Produces p;
    pass.mutate(s).accept(&p);
    return p.found;
}

Expr used(const std::string &name) { return Variable::make(Bool(), name + ".used"); }

TEST(UnconditionalProducers, ANamedProducerInAThreadLoopRunsWhateverItsConsumersCondition) {
    const Stmt body = Block::make(skipped_stage("row", used("row")), skipped_stage("pool", used("pool")));
    const auto found = produces_after_pass(kernel(body, true), {"row"});
    ASSERT_EQ(found.size(), 2u);
    EXPECT_EQ(found[0], std::make_pair(std::string("row"), false));
    EXPECT_EQ(found[1], std::make_pair(std::string("pool"), true));  // not named: kept under its condition
}

TEST(UnconditionalProducers, TheConsumersOwnConditionStays) {
    struct Conditions : public IRVisitor {
        int count = 0;
        using IRVisitor::visit;
        void visit(const IfThenElse *op) override {
            ++count;
            IRVisitor::visit(op);
        }
    } conditions;
    UnconditionalProducers pass({"row"});
    pass.mutate(kernel(skipped_stage("row", used("row")), true)).accept(&conditions);
    EXPECT_EQ(conditions.count, 1);  // the store into `out`
}

TEST(UnconditionalProducers, AProducerAtTheBlockLevelKeepsItsCondition) {
    const auto found = produces_after_pass(kernel(skipped_stage("row", used("row")), false), {"row"});
    ASSERT_EQ(found.size(), 1u);
    EXPECT_TRUE(found[0].second);
}

TEST(UnconditionalProducers, AConditionWithAnElseBranchStays) {
    Stmt produce = ProducerConsumer::make_produce("row", store("row", load("in")));
    Stmt s = Block::make(IfThenElse::make(used("row"), produce, store("row", 0)),
                         ProducerConsumer::make_consume("row", store("out", load("row"))));
    const auto found = produces_after_pass(kernel(s, true), {"row"});
    ASSERT_EQ(found.size(), 1u);
    EXPECT_TRUE(found[0].second);
}

}  // namespace
