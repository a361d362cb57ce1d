#include "block_barriers.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace kpool::cuda {

using namespace Halide;
using namespace Halide::Internal;

namespace {

bool is_barrier(const Stmt &s) {
    const Evaluate *e = s.as<Evaluate>();
    const Call *c = e ? e->value.as<Call>() : nullptr;
    return c && c->is_intrinsic(Call::gpu_thread_barrier);
}

// A thread's (or lane's) index in the fused kernel: .thread_id_x and kin.
bool is_thread_variable(const std::string &name) {
    return name.find("thread_id") != std::string::npos;
}

// What the kernel allocates (shared memory, or a thread's own) and stores.
struct KernelMemory : public IRGraphVisitor {
    std::set<std::string> shared, own, stored;

    using IRGraphVisitor::visit;
    void visit(const Allocate *op) override {
        (op->memory_type == MemoryType::GPUShared ? shared : own).insert(op->name);
        IRGraphVisitor::visit(op);
    }
    void visit(const Store *op) override {
        stored.insert(op->name);
        IRGraphVisitor::visit(op);
    }
};

// Whether a run of statements reaches memory that other threads reach
// too: shared memory, or a global store (all global memory counts as one: a
// kernel's input may be its output in place). A call that is not pure may
// store anything.
struct Accesses {
    bool shared = false, global_stores = false;
    bool private_to_threads() const { return !shared && !global_stores; }
};

class FindAccesses : public IRGraphVisitor {
public:
    FindAccesses(const KernelMemory &memory, Accesses &accesses) : memory_(memory), accesses_(accesses) {}

private:
    using IRGraphVisitor::visit;
    void visit(const Load *op) override {
        accesses_.shared |= memory_.shared.count(op->name) > 0;
        IRGraphVisitor::visit(op);
    }
    void visit(const Store *op) override {
        if (memory_.shared.count(op->name)) {
            accesses_.shared = true;
        } else if (!memory_.own.count(op->name)) {
            accesses_.global_stores = true;
        }
        IRGraphVisitor::visit(op);
    }
    void visit(const Call *op) override {
        if (!op->is_pure() && !op->is_intrinsic(Call::gpu_thread_barrier)) {
            accesses_.global_stores = true;
        }
        IRGraphVisitor::visit(op);
    }
    const KernelMemory &memory_;
    Accesses &accesses_;
};

Accesses accesses_of(const std::vector<Stmt> &run, const KernelMemory &memory) {
    Accesses a;
    FindAccesses find(memory, a);
    for (const Stmt &s : run) {
        s.accept(&find);
    }
    return a;
}

// Whether an expression has one value over the block: no thread variable,
// no let-bound variable that varies (`varying`), loads only from global
// buffers the kernel never stores, no call that is not pure.
class UniformOverBlock : public IRGraphVisitor {
public:
    UniformOverBlock(const KernelMemory &memory, const Scope<> &varying) : memory_(memory), varying_(varying) {}
    bool uniform = true;

private:
    using IRGraphVisitor::visit;
    void visit(const Variable *op) override {
        if (is_thread_variable(op->name) || varying_.contains(op->name)) {
            uniform = false;
        }
    }
    void visit(const Load *op) override {
        if (memory_.shared.count(op->name) || memory_.own.count(op->name) || memory_.stored.count(op->name)) {
            uniform = false;
        }
        IRGraphVisitor::visit(op);
    }
    void visit(const Call *op) override {
        if (!op->is_pure()) {
            uniform = false;
        }
        IRGraphVisitor::visit(op);
    }
    void visit(const Let *op) override {
        UniformOverBlock value(memory_, varying_);
        op->value.accept(&value);
        if (!value.uniform) {
            uniform = false;  // (conservative: the body might not use it)
        }
        op->body.accept(this);
    }
    const KernelMemory &memory_;
    const Scope<> &varying_;
};

void conjuncts(const Expr &e, std::vector<Expr> &out) {
    if (const And *a = e.as<And>()) {
        conjuncts(a->a, out);
        conjuncts(a->b, out);
    } else {
        out.push_back(e);
    }
}

// The serial loops of one kernel (the body of its block loops).
class KernelLoops : public IRMutator {
public:
    KernelLoops(const KernelMemory &memory, bool drop_private) : memory_(memory), drop_private_(drop_private) {}

private:
    using IRMutator::visit;

    bool uniform(const Expr &e) const {
        UniformOverBlock u(memory_, varying_);
        e.accept(&u);
        return u.uniform;
    }

    Stmt visit(const LetStmt *op) override {
        const bool varies = !uniform(op->value);
        ScopedBinding<> bind(varies, varying_, op->name);
        return IRMutator::visit(op);
    }

    Stmt visit(const IfThenElse *op) override {
        // Inside a condition on a thread (a thread loop Halide made an if),
        // statements are no longer at the block level.
        if (!uniform(op->condition)) {
            ScopedValue<int> inside(in_threads_, in_threads_ + 1);
            return IRMutator::visit(op);
        }
        return IRMutator::visit(op);
    }

    Stmt visit(const For *op) override {
        Stmt body = mutate(op->body);
        // (A loop whose bounds vary over the block is each thread's own.)
        if (op->for_type == ForType::Serial && in_threads_ == 0 && uniform(op->min) && uniform(op->extent)) {
            body = rewrite_sequence(body);
        }
        if (body.same_as(op->body)) {
            return op;
        }
        return For::make(op->name, op->min, op->extent, op->for_type, op->partition_policy, op->device_api, body);
    }

    // A loop body: lets, then a sequence of statements and barriers.
    Stmt rewrite_sequence(const Stmt &body) {
        // The lets that open the body, and those that open its first
        // statement where no later one names them (Halide appends the
        // iteration's barrier after the body's lets: hoisted over it).
        std::vector<const LetStmt *> lets;
        std::vector<Stmt> items;
        flatten(body, items);
        while (const LetStmt *l = items[0].as<LetStmt>()) {
            bool named_later = false;
            for (size_t i = 1; i < items.size(); ++i) {
                named_later = named_later || stmt_uses_var(items[i], l->name);
            }
            if (named_later) {
                break;
            }
            lets.push_back(l);
            std::vector<Stmt> rest(items.begin() + 1, items.end());
            items.clear();
            flatten(l->body, items);
            items.insert(items.end(), rest.begin(), rest.end());
        }
        bool any_barrier = false;
        for (const Stmt &i : items) {
            any_barrier |= is_barrier(i);
        }
        if (!any_barrier) {
            return body;
        }

        // The lets' names for the uniformity of the conditions below.
        std::vector<std::unique_ptr<ScopedBinding<>>> bindings;
        for (const LetStmt *l : lets) {
            bindings.push_back(std::make_unique<ScopedBinding<>>(!uniform(l->value), varying_, l->name));
        }
        std::vector<Stmt> kept = drop_private_ ? drop_barriers(items) : items;
        std::vector<Stmt> wrapped = guard_last_barrier(wrap_uniform_runs(kept));
        Stmt result = Block::make(wrapped);
        for (auto l = lets.rbegin(); l != lets.rend(); ++l) {
            result = LetStmt::make((*l)->name, (*l)->value, result);
        }
        return result;
    }

    static void flatten(const Stmt &s, std::vector<Stmt> &out) {
        if (const Block *b = s.as<Block>()) {
            flatten(b->first, out);
            flatten(b->rest, out);
        } else {
            out.push_back(s);
        }
    }

    // Drops every barrier between two runs of statements (the one since
    // the last barrier kept, the one up to the next barrier) that both keep
    // to their threads' own memory (registers, warp shuffles, global loads):
    // nothing either does can reach the other's threads. The last statement,
    // the barrier Halide puts at the end of an iteration (ordering this
    // iteration's run before the next one's), is kept.
    std::vector<Stmt> drop_barriers(const std::vector<Stmt> &items) const {
        std::vector<Stmt> out;
        auto next_run = [&](size_t from, size_t &end) {
            std::vector<Stmt> run;
            for (end = from; end < items.size() && !is_barrier(items[end]); ++end) {
                run.push_back(items[end]);
            }
            return run;
        };
        size_t end;
        std::vector<Stmt> run = next_run(0, end);
        bool since_kept_private = accesses_of(run, memory_).private_to_threads();
        out.insert(out.end(), run.begin(), run.end());
        size_t i = end;
        while (i < items.size()) {
            const Stmt &barrier = items[i];
            std::vector<Stmt> following = next_run(i + 1, end);
            const bool next_private = accesses_of(following, memory_).private_to_threads();
            const bool last = i + 1 == items.size();
            if (last || out.empty() || !since_kept_private || !next_private) {
                out.push_back(barrier);
            }
            since_kept_private = next_private;
            out.insert(out.end(), following.begin(), following.end());
            i = end;
        }
        return out;
    }

    // The block-uniform conjuncts of the conditions a statement runs under:
    // along its single path of lets, produce/consume markers and conditions
    // without an else (the shuffles Halide hoists out of a stage's
    // condition sit in lets before it), none of them naming a variable
    // bound on that path.
    std::vector<Expr> uniform_guards(const Stmt &item) const {
        std::vector<Expr> guards;
        std::vector<std::string> bound;
        Stmt s = item;
        while (s.defined()) {
            if (const LetStmt *l = s.as<LetStmt>()) {
                bound.push_back(l->name);
                s = l->body;
            } else if (const ProducerConsumer *pc = s.as<ProducerConsumer>()) {
                s = pc->body;
            } else if (const IfThenElse *c = s.as<IfThenElse>()) {
                if (c->else_case.defined()) {
                    break;
                }
                std::vector<Expr> parts;
                conjuncts(c->condition, parts);
                for (const Expr &p : parts) {
                    bool free = true;
                    for (const std::string &b : bound) {
                        free = free && !expr_uses_var(p, b);
                    }
                    if (free && uniform(p)) {
                        guards.push_back(p);
                    }
                }
                s = c->then_case;
            } else {
                break;
            }
        }
        return guards;
    }

    static std::vector<Expr> common(const std::vector<Expr> &a, const std::vector<Expr> &b) {
        std::vector<Expr> out;
        for (const Expr &x : a) {
            for (const Expr &y : b) {
                if (equal(x, y)) {
                    out.push_back(x);
                    break;
                }
            }
        }
        return out;
    }

    // Each run of statements (and the barriers between and before them)
    // whose guards share a block-uniform conjunct, with a barrier inside, in
    // one condition on the shared conjuncts. A barrier before a run only
    // orders what came before it against the run: where the run does
    // nothing, all threads skip it together.
    std::vector<Stmt> wrap_uniform_runs(const std::vector<Stmt> &items) const {
        std::vector<Stmt> out;
        size_t i = 0;
        while (i < items.size()) {
            size_t first = i;  // the run's first statement, past its leading barriers
            while (first < items.size() && is_barrier(items[first])) {
                ++first;
            }
            std::vector<Expr> shared = first < items.size() ? uniform_guards(items[first]) : std::vector<Expr>{};
            size_t end = first + 1;  // one past the run's last statement
            if (!shared.empty()) {
                for (size_t j = first + 1; j < items.size(); ++j) {
                    if (is_barrier(items[j])) {
                        continue;
                    }
                    std::vector<Expr> both = common(shared, uniform_guards(items[j]));
                    if (both.empty()) {
                        break;
                    }
                    shared = both;
                    end = j + 1;
                }
            }
            bool barrier_inside = false;
            for (size_t j = i; j < end && j < items.size(); ++j) {
                barrier_inside |= is_barrier(items[j]);
            }
            if (shared.empty() || !barrier_inside) {
                out.push_back(items[i]);
                ++i;
                continue;
            }
            Expr guard = shared[0];
            for (size_t k = 1; k < shared.size(); ++k) {
                guard = guard && shared[k];
            }
            std::vector<Stmt> run(items.begin() + i, items.begin() + end);
            out.push_back(IfThenElse::make(guard, Block::make(run)));
            i = end;
        }
        return out;
    }

    // The iteration's last barrier orders what this iteration did before
    // what the next one does. Where every other statement of the iteration
    // runs under block-uniform guards, an iteration in which none of them
    // holds did nothing to order: the barrier goes under the disjunction of
    // the statements' guards (each the conjunction of its own), uniform too.
    // So a decode token that completes nothing passes no barrier at all.
    std::vector<Stmt> guard_last_barrier(std::vector<Stmt> items) const {
        if (items.size() < 2 || !is_barrier(items.back())) {
            return items;
        }
        Expr any_ran;
        for (size_t i = 0; i + 1 < items.size(); ++i) {
            if (is_barrier(items[i])) {
                continue;  // (passed by every thread or by none: orders nothing by itself)
            }
            const std::vector<Expr> guards = uniform_guards(items[i]);
            if (guards.empty()) {
                return items;
            }
            Expr all = guards[0];
            for (size_t k = 1; k < guards.size(); ++k) {
                all = all && guards[k];
            }
            any_ran = any_ran.defined() ? (any_ran || all) : all;
        }
        if (any_ran.defined()) {
            items.back() = IfThenElse::make(any_ran, items.back());
        }
        return items;
    }

    const KernelMemory &memory_;
    const bool drop_private_;
    Scope<> varying_;
    int in_threads_ = 0;
};

}  // namespace

Stmt BlockUniformBarriers::visit(const For *op) {
    if (op->for_type != ForType::GPUBlock || op->device_api != DeviceAPI::CUDA) {
        return IRMutator::visit(op);
    }
    // The outermost block loop: the kernel's memory, then its serial loops.
    KernelMemory memory;
    op->accept(&memory);
    return KernelLoops(memory, drop_private_).mutate(Stmt(op));
}

}  // namespace kpool::cuda
