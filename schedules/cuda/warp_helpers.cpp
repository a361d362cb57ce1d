// The shared warp placements (warp_helpers.h).
#include "warp_helpers.h"

#include <optional>
#include <string>

namespace kpool::cuda {

void pure_stage_on_gpu(Func out) {
    out.gpu_single_thread();
}

namespace {

// A per-row Func over (v, lane, rows...): registers of the row's lanes.
void in_warp_registers(Func f, const Var &v, const Var &lane, LoopLevel at) {
    f.compute_at(at).gpu_lanes(lane).unroll(v).store_in(MemoryType::Register);
}

void in_warp_registers(Func f, const Var &lane, LoopLevel at) {
    f.compute_at(at).gpu_lanes(lane).store_in(MemoryType::Register);
}

}  // namespace

void compute_row_in_warp(RotateQuant &r, const Var &v, const Var &lane, LoopLevel at) {
    for (Func &stage : r.rotation.stages) {
        in_warp_registers(stage, v, lane, at);
    }
    in_warp_registers(r.rotation.output, v, lane, at);
    in_warp_registers(r.rotated, v, lane, at);
    in_warp_registers(r.quant.lane_absmax, lane, at);
    for (Func &stage : r.quant.absmax_stages) {
        in_warp_registers(stage, lane, at);
    }
    in_warp_registers(r.quant.lane_scale, lane, at);
}

void rows_in_lanes(Func out, const Var &x, const Var &row, const Var &lane, const RowLayout &layout, int row_threads,
                   Var &row_in_block, int codes_per_word, bool vector_runs) {
    if (layout.run % codes_per_word != 0) {
        throw CompileError("a lane's run of " + std::to_string(layout.run) + " elements cannot be stored in words of " +
                           std::to_string(codes_per_word));
    }
    Var rb{"row_block"}, run_index{"run_index"}, in_run{"in_run"};
    out.split(x, x, in_run, layout.run / codes_per_word)
        .split(x, run_index, lane, layout.lanes())
        .split(row, rb, row_in_block, row_threads / layout.lanes(), TailStrategy::GuardWithIf)
        .reorder(in_run, run_index, lane, row_in_block, rb)
        .gpu_blocks(rb)
        .gpu_threads(row_in_block)
        .gpu_lanes(lane)
        .unroll(run_index);
    if (vector_runs) {
        out.vectorize(in_run);  // a run's codes: one store
    } else {
        out.unroll(in_run);
    }
}

// The softmax pool is elementwise in d: each lane pools its own V elements
// into the pooled row that feeds the Hadamard input in registers. The two
// folds over the slots are loops (the V elements unrolled inside) unless
// `unroll_slots`: unrolled, every slot's loads are in flight at once, but
// in compress's exact arithmetic P x V exps, each with its branch to the
// exact path, overflow the instruction cache at P = 16 (H200, ncu: most
// stalls were instruction fetch, compress of 262144 pools of 16 took 5.2 ms;
// 2.1 ms as loops). The triton arithmetic's exp is one instruction.
void compute_pool_in_warp(CompressPool &c, const RowLayout &layout, const Var &d, const Var &v, const Var &lane,
                          LoopLevel at, bool unroll_slots, bool vector_values) {
    auto values = [&](auto &&stage) {
        if (vector_values) {
            stage.vectorize(d);
        } else {
            stage.unroll(d);
        }
    };
    c.pooled_bf16.compute_at(at)
        .split(d, lane, v, layout.values_per_lane)
        .gpu_lanes(lane)
        .unroll(v)
        .store_in(MemoryType::Register);
    SoftmaxPool &p = c.pool;
    p.max_logit.compute_at(c.pooled_bf16, lane).store_in(MemoryType::Register);
    values(p.max_logit);
    if (p.max_logit.has_update_definition()) {
        values(p.max_logit.update(0).reorder(d, p.later_slot));
        if (unroll_slots) {
            p.max_logit.update(0).unroll(p.later_slot);
        }
    }
    p.weighted_sum.compute_at(c.pooled_bf16, lane).store_in(MemoryType::Register);
    values(p.weighted_sum);
    values(p.weighted_sum.update(0).reorder(d, p.slot));
    if (unroll_slots) {
        p.weighted_sum.update(0).unroll(p.slot);
    }
    // Both sums use the slot's weight: computed once per slot, not inlined
    // into each (an exp's branch is not merged by common-subexpression passes).
    p.weight.compute_at(p.weighted_sum, p.slot).store_in(MemoryType::Register);
    values(p.weight);
    compute_row_in_warp(c.rotate, v, lane, at);
}

RVar weighted_sum_in_groups(SoftmaxPool &p, int group) {
    RVar slot_group{"slot_group"}, slot_in{"slot_in_group"};
    p.weighted_sum.update(0).split(p.slot.x, slot_group, slot_in, group).unroll(slot_in);
    p.weight.compute_at(p.weighted_sum, slot_in);
    return slot_group;
}

void folds_in_groups(SoftmaxPool &p, int group) {
    RVar later_group{"later_slot_group"}, later_in{"later_slot_in_group"};
    if (p.max_logit.has_update_definition()) {
        p.max_logit.update(0)
            .split(p.later_slot.x, later_group, later_in, group, TailStrategy::GuardWithIf)
            .unroll(later_in);
    }
    weighted_sum_in_groups(p, group);
}

void unrolled_folds(SoftmaxPool &p, int unrolled_slots, int group) {
    if (pool_size_of(p) > unrolled_slots) {
        folds_in_groups(p, group);
        return;
    }
    if (p.max_logit.has_update_definition()) {
        p.max_logit.update(0).unroll(p.later_slot);
    }
    p.weighted_sum.update(0).unroll(p.slot);
    p.weight.compute_at(p.weighted_sum, p.slot);
}

int pool_size_of(const SoftmaxPool &p) {
    const std::optional<int64_t> P = as_const_int(p.slot.x.extent());
    if (!P) {
        throw CompileError("a pool's size must be a constant of the kernel");
    }
    return static_cast<int>(*P);
}

}  // namespace kpool::cuda
