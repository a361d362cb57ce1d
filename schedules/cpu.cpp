// Host-CPU schedules: rows (pools, tokens) split into chunks across threads;
// every per-row stage computed at its row, in registers and stack buffers,
// vectorized over d; no heap intermediates. Vector width comes from the
// target (8 f32 lanes on the AVX2 baseline the libraries are built for).
// On 2 shared EPYC cores (kpool demo): fwht 10626 rows 4.1 ms, compress 2654
// pools of 4 in 5.5 ms, decode of 9 x 2 tokens 13 us per call.
#include "cpu.h"

#include "knobs.h"

namespace kpool::cpu {

RowLayout row_layout(const BuildPlan &, const KernelAsked &) { return RowLayout{1}; }

using namespace Halide;

namespace {

// The CPU family's parameters (schedules/cpu.knobs): rows, pools and tokens
// per task of Halide's thread pool.
struct CpuPlan : KnobReader {
    explicit CpuPlan(const BuildPlan &build) : KnobReader(build) {}
    int fwht_rows_per_task = knob("fwht.rows_per_task");
    int compress_pools_per_task = knob("compress.pools_per_task");
    int seed_tokens_per_task = knob("seed.tokens_per_task");
};

// Every stage of one row's compute, placed at `at` and vectorized over its
// lanes (the CPU layout has one value per lane: lanes are elements; a GPU
// family's layout, tested here, is left scalar: lanes = 1).
void compute_row_at(RotateQuant &r, const Var &lane, LoopLevel at, int lanes) {
    auto place = [&](Func f) {
        f.compute_at(at);
        if (lanes > 1) {
            f.vectorize(lane, lanes);
        }
    };
    for (Func &stage : r.rotation.stages) {
        place(stage);
    }
    place(r.rotated);
    place(r.quant.lane_absmax);
    for (Func &stage : r.quant.absmax_stages) {
        place(stage);
    }
    place(r.quant.lane_scale);
}

void compute_pool_at(CompressPool &c, const Var &d, const Var &j, const Var &lane, LoopLevel at, int lanes) {
    SoftmaxPool &p = c.pool;
    p.logit.compute_at(at).vectorize(d, lanes).unroll(j);
    p.max_logit.compute_at(at).vectorize(d, lanes);
    if (p.max_logit.has_update_definition()) {
        p.max_logit.update(0).reorder(d, p.later_slot).vectorize(d, lanes);
    }
    p.weight.compute_at(at).vectorize(d, lanes).unroll(j);
    p.weighted_sum.compute_at(at).vectorize(d, lanes);
    p.weighted_sum.update(0).reorder(d, p.slot).vectorize(d, lanes);
    c.pooled_bf16.compute_at(at).vectorize(d, lanes);
    compute_row_at(c.rotate, lane, at, lanes);
}

}  // namespace

void schedule_fwht(FwhtStages &s, const BuildPlan &plan) {
    Var ro{"row_chunk"}, ri{"row_in_chunk"};
    s.out.split(s.row, ro, ri, CpuPlan(plan).fwht_rows_per_task, TailStrategy::GuardWithIf).parallel(ro);
#ifdef KPOOL_TEST_GENERATORS
    if (s.layout.values_per_lane > 1 || s.codes_per_word > 1) {
        // A GPU family's layout (or words) on the CPU, only to test its
        // algorithm: every stage at its row, scalar.
        s.rotate.input.compute_at(s.out, ri);
        compute_row_at(s.rotate, s.lane, LoopLevel(s.out, ri), 1);
        return;
    }
#endif
    const int lanes = plan.target.natural_vector_size<float>();
    s.out.vectorize(s.d, lanes);
    s.rotate.input.compute_at(s.out, ri).vectorize(s.d, lanes);
    compute_row_at(s.rotate, s.lane, LoopLevel(s.out, ri), lanes);
}

void schedule_compress_to_cache(CompressToCacheStages &s, const BuildPlan &plan) {
    const int lanes = plan.target.natural_vector_size<float>();
    RVar po{"pool_chunk"}, pi{"pool_in_chunk"};
    // Duplicate locs are the caller's race, as in the reference (docs/).
    s.cache.update(0)
        .allow_race_conditions()
        .split(s.write.y, po, pi, CpuPlan(plan).compress_pools_per_task, TailStrategy::GuardWithIf)
        .parallel(po)
        .vectorize(s.write.x, lanes)
        .specialize(s.compress.rotate.quant.round_scale);
    compute_pool_at(s.compress, s.d, s.j, s.lane, LoopLevel(s.cache, pi), lanes);
}

// The seed after the pools, a loop of its own (one kernel call either way
// on the host): chunks of tokens in parallel, a token's two halves
// together, as schedule_seed_tail.
void schedule_compress_and_seed(CompressAndSeedStages &s, const BuildPlan &plan) {
    cpu::schedule_compress_to_cache(s, plan);
    RVar to{"token_chunk"}, ti{"token_in_chunk"};
    s.tail.update(0)
        .allow_race_conditions()
        .split(s.copy.y, to, ti, CpuPlan(plan).seed_tokens_per_task, TailStrategy::GuardWithIf)
        .reorder(s.copy.x, s.copy.z, ti, to)
        .parallel(to)
        .vectorize(s.copy.x, plan.target.natural_vector_size<uint16_t>());
}

void schedule_compress_to_rows(CompressToRowsStages &s, const BuildPlan &plan) {
    const int lanes = plan.target.natural_vector_size<float>();
    Var po{"pool_chunk"}, pi{"pool_in_chunk"};
    s.out.split(s.pool, po, pi, CpuPlan(plan).compress_pools_per_task, TailStrategy::GuardWithIf)
        .parallel(po)
        .vectorize(s.d, lanes);
    s.out.specialize(s.compress.rotate.quant.round_scale);
    compute_pool_at(s.compress, s.d, s.j, s.lane, LoopLevel(s.out, pi), lanes);
}

void schedule_seed_tail(SeedTailStages &s, const BuildPlan &plan) {
    RVar to{"token_chunk"}, ti{"token_in_chunk"};
    // Token groups are single tokens here (seed_group_size: 1).
    s.tail.update(0)
        .allow_race_conditions()
        .split(s.copy[3], to, ti, CpuPlan(plan).seed_tokens_per_task, TailStrategy::GuardWithIf)
        .parallel(to)
        .vectorize(s.copy.x, plan.target.natural_vector_size<uint16_t>());
}

void schedule_decode_write(DecodeWriteStages &s, const BuildPlan &plan) {
    const int lanes = plan.target.natural_vector_size<float>();
    RVar token = s.write.y, request = s.write.z;
    s.cache.update(0)
        .allow_race_conditions()
        .parallel(request)
        .vectorize(s.write.x, lanes)
        .specialize(s.compress.rotate.quant.round_scale);
    s.ring_writer.compute_at(s.cache, token);
    compute_pool_at(s.compress, s.d, s.j, s.lane, LoopLevel(s.cache, token), lanes);
}

void schedule_decode_stash(DecodeStashStages &s, const BuildPlan &plan) {
    // Requests in parallel; a request's tokens in order (the algorithm's
    // `overwritten` already leaves one stash per ring slot).
    s.tail.update(0)
        .allow_race_conditions()
        .reorder(s.stash.x, s.stash[3], s.stash.y, s.stash.z)
        .parallel(s.stash.z)
        .vectorize(s.stash.x, plan.target.natural_vector_size<uint16_t>());
    s.overwritten.compute_at(s.tail, s.stash.z);
}

// The CPU runs decode as its two kernels (each has requests in parallel
// already; a fused kernel would only save a launch, which the CPU does not
// pay). This schedule is the tests' (kpool_cpu_decode_update_p*): the one
// GPU kernel's algorithm, a request's completions then its stashes, checked
// byte for byte against the two kernels. The product's generators refuse it.
void schedule_decode_update(DecodeUpdateStages &s, const BuildPlan &plan) {
#ifdef KPOOL_TEST_GENERATORS
    DecodeWriteStages &w = s.write;
    const int lanes = plan.target.natural_vector_size<float>();
    RVar request = w.write.z;
    Stage completions = w.cache.update(0);
    completions.allow_race_conditions().parallel(request).vectorize(w.write.x, lanes);
    compute_pool_at(w.compress, w.d, w.j, w.lane, LoopLevel(w.cache, w.write.y), lanes);
    DecodeStashStages &st = s.stashes;
    // A warp per request's algorithm reads the ring as its earlier tokens
    // stashed it (ring_in_order): each token's completion, then its stash,
    // a token at a time (the GPU's warp stashes first: a token's completion
    // takes its own slot from its input, so both orders read the same ring).
    const bool in_order = s.layout == DecodeLayout::WarpPerRequest;
    st.tail.update(0)
        .allow_race_conditions()
        .reorder(st.stash.x, st.stash[3], st.stash.y, st.stash.z)
        .parallel(st.stash.z)
        .vectorize(st.stash.x, plan.target.natural_vector_size<uint16_t>())
        .compute_with(completions, in_order ? RVar(w.write.y) : request);
    if (!in_order) {
        w.ring_writer.compute_at(w.cache, w.write.y);
        st.overwritten.compute_at(st.tail, st.stash.y);
    }
#else
    throw CompileError("the CPU runs decode as its two kernels: the one-kernel decode on the CPU is the tests' "
                       "(kpool_test_generators)");
#endif
}

void schedule_expand(ExpandStages &s, const BuildPlan &plan) {
    Var co{"col_chunk"}, ci{"col_in_chunk"};
    s.out.split(s.col, co, ci, plan.target.natural_vector_size<int32_t>(), TailStrategy::GuardWithIf)
        .vectorize(ci)
        .parallel(s.row);
}

// A serial scan: the CPU path rejects out-of-range indices before it runs,
// so only the tests call this variant.
void schedule_index_check(IndexCheckStages &s, const BuildPlan &) {}

}  // namespace kpool::cpu
