// schedules/block_barriers.h on kernels built by hand in the form Halide's
// thread-loop fusion leaves them (a block loop, the fused thread loop, a
// serial loop whose statements Halide separated with barriers): which
// barriers it drops, which runs it wraps in one condition, and which
// conditions it takes for uniform over the block.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "block_barriers.h"

namespace {

using namespace Halide;
using namespace Halide::Internal;

Stmt barrier() {
    return Evaluate::make(Call::make(Int(32), Call::gpu_thread_barrier, {0}, Call::Intrinsic));
}

Expr thread() { return Variable::make(Int(32), ".thread_id_x"); }
Expr token() { return Variable::make(Int(32), "t"); }

// A stage of the token loop: a store into `buffer` under `condition`.
Stmt stage(const std::string &buffer, Expr condition, Expr value = 1.0f) {
    return IfThenElse::make(condition,
                            Store::make(buffer, value, thread(), Parameter(), const_true(), ModulusRemainder()));
}

Expr load(const std::string &buffer, Type t, Expr index) {
    return Load::make(t, buffer, index, Buffer<>(), Parameter(), const_true(), ModulusRemainder());
}

// The kernel: registers a and b (each thread's own), shared memory s, the
// global output out; the token loop's body is `stages` separated by
// barriers, and one at the end of the iteration.
Stmt kernel(const std::vector<Stmt> &stages, const std::vector<std::pair<std::string, Expr>> &lets = {}) {
    std::vector<Stmt> body;
    for (const Stmt &s : stages) {
        body.push_back(s);
        body.push_back(barrier());
    }
    Stmt loop_body = Block::make(body);
    for (auto l = lets.rbegin(); l != lets.rend(); ++l) {
        loop_body = LetStmt::make(l->first, l->second, loop_body);
    }
    Stmt s = For::make("t", 0, 16, ForType::Serial, Partition::Auto, DeviceAPI::None, loop_body);
    s = For::make(".thread_id_x", 0, 128, ForType::GPUThread, Partition::Never, DeviceAPI::CUDA, s);
    for (const char *name : {"a", "b"}) {
        s = Allocate::make(name, Float(32), MemoryType::Register, {1}, const_true(), s);
    }
    s = Allocate::make("s", Float(32), MemoryType::GPUShared, {128}, const_true(), s);
    return For::make("block_id_x", 0, 8, ForType::GPUBlock, Partition::Never, DeviceAPI::CUDA, s);
}

// The token loop's body after the pass: its statements at its own level.
struct TokenLoop : public IRVisitor {
    std::vector<Stmt> top;
    using IRVisitor::visit;
    void visit(const For *op) override {
        if (op->name != "t") {
            return IRVisitor::visit(op);
        }
        Stmt s = op->body;
        while (const LetStmt *l = s.as<LetStmt>()) {
            s = l->body;
        }
        flatten(s);
    }
    void flatten(const Stmt &s) {
        if (const Block *b = s.as<Block>()) {
            flatten(b->first);
            flatten(b->rest);
        } else {
            top.push_back(s);
        }
    }
};

struct CountBarriers : public IRVisitor {
    int n = 0;
    using IRVisitor::visit;
    void visit(const Call *op) override {
        n += op->is_intrinsic(Call::gpu_thread_barrier);
        IRVisitor::visit(op);
    }
};

int barriers_in(const Stmt &s) {
    CountBarriers count;
    s.accept(&count);
    return count.n;
}

std::vector<Stmt> token_loop(const Stmt &kernel, bool drop_private) {
    kpool::cuda::BlockUniformBarriers pass(drop_private);
    TokenLoop loop;
    pass.mutate(kernel).accept(&loop);
    return loop.top;
}

bool is_barrier(const Stmt &s) { return barriers_in(s) == 1 && s.as<Evaluate>(); }

// flags(t) != 0: a load of an input the kernel never stores, uniform.
Expr completes() { return load("flags", Int(32), token()) != 0; }

TEST(BlockUniformBarriers, WrapsARunUnderOneUniformGuardAndGuardsTheIterationsLastBarrier) {
    const Expr g = Variable::make(Bool(), "completes");
    const Stmt k = kernel({stage("a", g), stage("b", g && thread() < 32), stage("s", g),
                           stage("out", g, load("s", Float(32), thread()))},
                          {{"completes", completes()}});
    const std::vector<Stmt> top = token_loop(k, false);
    ASSERT_EQ(top.size(), 2u);
    const IfThenElse *run = top[0].as<IfThenElse>();
    ASSERT_NE(run, nullptr);
    EXPECT_TRUE(equal(run->condition, g));
    EXPECT_EQ(barriers_in(run->then_case), 3);  // all kept: drop_private false
    // The iteration's last: under the run's guard (an iteration that skips
    // the run did nothing to order).
    const IfThenElse *last = top[1].as<IfThenElse>();
    ASSERT_NE(last, nullptr);
    EXPECT_TRUE(equal(last->condition, g));
    EXPECT_TRUE(is_barrier(last->then_case));
}

// Two runs under different uniform guards: the iteration's last barrier
// under either (the first may run without the second); a statement under
// no uniform guard leaves it as it is.
TEST(BlockUniformBarriers, GuardsTheIterationsLastBarrierOnlyWhereEveryStatementIsGuarded) {
    const Expr g = Variable::make(Bool(), "completes"), h = Variable::make(Bool(), "writes");
    const std::vector<std::pair<std::string, Expr>> lets = {{"completes", completes()},
                                                            {"writes", load("flags", Int(32), token() + 1) > 0}};
    const Stmt k = kernel({stage("s", g), stage("a", g, load("s", Float(32), thread())), stage("s", h),
                           stage("out", h, load("s", Float(32), thread()))},
                          lets);
    const std::vector<Stmt> top = token_loop(k, false);
    ASSERT_EQ(top.size(), 3u);
    const IfThenElse *last = top[2].as<IfThenElse>();
    ASSERT_NE(last, nullptr);
    EXPECT_TRUE(equal(last->condition, g || h));
    EXPECT_TRUE(is_barrier(last->then_case));

    const Stmt unguarded = kernel({stage("s", g), stage("a", g, load("s", Float(32), thread())),
                                   stage("b", thread() < 32)},
                                  lets);
    const std::vector<Stmt> top2 = token_loop(unguarded, false);
    EXPECT_TRUE(is_barrier(top2.back()));
}

TEST(BlockUniformBarriers, DropsOnlyBarriersBetweenRunsInTheirThreadsOwnMemory) {
    const Expr g = Variable::make(Bool(), "completes");
    // a, b: registers; then s (shared store), out (shared load, global store).
    const Stmt k = kernel(
        {stage("a", g), stage("b", g), stage("s", g), stage("out", g, load("s", Float(32), thread()))},
        {{"completes", completes()}});
    const std::vector<Stmt> top = token_loop(k, true);
    ASSERT_EQ(top.size(), 2u);
    const IfThenElse *run = top[0].as<IfThenElse>();
    ASSERT_NE(run, nullptr);
    // a | b dropped; b | s kept (s stores shared memory); s | out kept.
    EXPECT_EQ(barriers_in(run->then_case), 2);
    ASSERT_NE(top[1].as<IfThenElse>(), nullptr);  // the iteration's last, under g
    EXPECT_TRUE(is_barrier(top[1].as<IfThenElse>()->then_case));
}

TEST(BlockUniformBarriers, LeavesConditionsThatVaryOverTheBlock) {
    // On a thread: a barrier under it would be divergent.
    const Stmt k = kernel({stage("a", thread() < 32), stage("b", thread() < 32)});
    const std::vector<Stmt> top = token_loop(k, false);
    EXPECT_EQ(top.size(), 4u);
    EXPECT_TRUE(is_barrier(top[1]));
    EXPECT_TRUE(is_barrier(top[3]));
}

TEST(BlockUniformBarriers, LeavesAGuardThatLoadsWhatTheKernelStores) {
    // `out` is stored by the kernel: another block may change it between reads.
    const Expr g = load("out", Float(32), token()) > 0.0f;
    const Stmt k = kernel({stage("a", g), stage("b", g), stage("out", g)});
    const std::vector<Stmt> top = token_loop(k, false);
    EXPECT_EQ(top.size(), 6u);
    // Nor through a let whose value varies.
    const Expr l = Variable::make(Bool(), "mine");
    const Stmt k2 = kernel({stage("a", l), stage("b", l)}, {{"mine", thread() < 64}});
    EXPECT_EQ(token_loop(k2, false).size(), 4u);
}

TEST(BlockUniformBarriers, TakesABarrierBeforeARunIntoItsCondition) {
    const Expr g = Variable::make(Bool(), "completes"), h = Variable::make(Bool(), "writes");
    // a under g, then s (shared) and out under h: the barrier between a and
    // s is h's run's to skip with it.
    const Stmt k = kernel({stage("a", g), stage("s", h), stage("out", h, load("s", Float(32), thread()))},
                          {{"completes", completes()}, {"writes", load("flags", Int(32), token() + 1) > 0}});
    const std::vector<Stmt> top = token_loop(k, false);
    // a (no barrier inside its run: as it was), then if (h) {barrier; s; barrier; out}, then the
    // iteration's barrier under g || h.
    ASSERT_EQ(top.size(), 3u);
    const IfThenElse *run = top[1].as<IfThenElse>();
    ASSERT_NE(run, nullptr);
    EXPECT_TRUE(equal(run->condition, h));
    EXPECT_EQ(barriers_in(run->then_case), 2);
    const IfThenElse *last = top[2].as<IfThenElse>();
    ASSERT_NE(last, nullptr);
    EXPECT_TRUE(equal(last->condition, g || h));
}

}  // namespace
