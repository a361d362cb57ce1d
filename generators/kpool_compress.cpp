// kpool_compress_and_write_cache: softmax-pool P tokens per pool, rotate,
// quantize; one generator writes the rows into the paged K cache at `loc`,
// the other returns them (return_compressed). The runtime calls one or both.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

namespace {

// Key and score as f32 over (d, j, pool): bf16 bits widen exactly, f32 scores
// pass through.
Func as_f32(Func bits, const Type &type, const std::string &name, Var d, Var j, Var pool) {
    Func f{name};
    if (type == Float(32)) {
        f(d, j, pool) = bits(d, j, pool);
    } else {
        f(d, j, pool) = bf16_to_f32(bits(d, j, pool));
    }
    return f;
}

// bf16 values per item of a lane: an item is a 32- or 64-bit word of
// bf16 (the first in the low half), or one f32.
int values_per_item(const Type &t) { return t.is_uint() && t.bits() > 16 ? t.bits() / 16 : 1; }

// Element `index_in_lane` of a lane's items as f32.
Expr item_value_f32(Func items, const Type &item_type, Expr index_in_lane, std::vector<Expr> item_args) {
    const int per_item = values_per_item(item_type);
    item_args.insert(item_args.begin(), index_in_lane / per_item);
    Expr item = items(item_args);
    if (per_item == 1) {
        return item;
    }
    return bf16_to_f32(cast<uint16_t>(item >> cast(item_type, (index_in_lane % per_item) * 16)));
}

}  // namespace

template <typename T, typename Stages>
class CompressBase : public KpoolGenerator<T, Stages> {
public:
    GeneratorParam<int> pool_size{"pool_size", 4, 1, KPOOL_MAX_POOL_SIZE};
    GeneratorParam<Arithmetic> arithmetic{"arithmetic", Arithmetic::Exact, kArithmeticNames};

    // The inputs' types are chosen per variant: the element kernels read
    // slot_k as uint16 (bf16 bits, (d, j, pool)) and slot_score as uint16 or
    // float32; the words kernels (CUDA, aligned rows) read bf16 as uint32 or
    // uint64 words of 2 or 4, (d / 2 or d / 4, j, pool), the first in the low bits.
    GeneratorInput<Buffer<void, 3>> slot_k{"slot_k"};
    GeneratorInput<Buffer<void, 3>> slot_score{"slot_score"};
    GeneratorInput<Buffer<float, 2>> ape{"ape"};  // (d, j)
    GeneratorInput<bool> round_scale{"round_scale"};
    // The runtime found every tensor's data 16-byte aligned (CompressLoads::aligned).
    GeneratorInput<bool> aligned_data{"aligned_data"};

protected:
    // The inputs' estimates (every kernel of the base takes them).
    void estimate_inputs() {
        using namespace estimate;
        slot_k.set_estimates({{0, kHeadDim / values_per_item(slot_k.type())}, {0, pool_size}, {0, kPools}});
        slot_score.set_estimates({{0, kHeadDim / values_per_item(slot_score.type())}, {0, pool_size}, {0, kPools}});
        ape.set_estimates({{0, kHeadDim}, {0, pool_size}});
        round_scale.set_estimate(true);
        aligned_data.set_estimate(true);
    }

    // What the schedules specialize on: whether every row of the inputs
    // starts 16-byte aligned (aligned_data: the runtime checked the data).
    CompressConditions conditions() {
        auto rows_of_16_bytes = [](const Expr &stride, const Type &t) { return stride % (16 / t.bytes()) == 0; };
        Expr aligned = aligned_data && rows_of_16_bytes(slot_k.dim(1).stride(), slot_k.type()) &&
                       rows_of_16_bytes(slot_k.dim(2).stride(), slot_k.type()) &&
                       rows_of_16_bytes(slot_score.dim(1).stride(), slot_score.type()) &&
                       rows_of_16_bytes(slot_score.dim(2).stride(), slot_score.type()) &&
                       rows_of_16_bytes(ape.dim(1).stride(), Float(32));
        return {aligned, round_scale};
    }

    // Whether this is a words kernel (slot_k as words of bf16).
    bool words() { return values_per_item(slot_k.type()) > 1; }

    // The kernel's pool: what its schedule specializes on (s.conditions) and
    // the compress stages (s.compress). `clamp_pools`: the words kernels
    // read pools past the batch as its last (a grid shared with another
    // stage may have more blocks than the batch has pools; their writes are
    // guarded, their reads must stay inside the inputs).
    void define_compress(Stages &s, bool clamp_pools = false) {
        s.conditions = conditions();
        Var d = s.d, j = s.j, pool = s.pool;
        const BuildPlan plan = this->build_plan();
        const Arithmetic arith = arithmetic_for(arithmetic, plan.target);
        const ScheduleDecisions decided = schedule_decisions(plan, {KernelAsked::Kind::Compress, arith, words()});
        s.layout = decided.layout;
        Func key{"key_f32"}, score{"score_f32"}, ape_f32{"ape_f32"};
        if (words()) {
            define_lane_loads(s.lane_loads, s.layout, key, score, ape_f32, d, j, pool, s.lane, clamp_pools);
        } else {
            if (slot_k.type() != UInt(16)) {
                throw CompileError("slot_k.type must be uint16 (bf16 bits), or uint32 or uint64 (words of bf16)");
            }
            key = as_f32(slot_k, UInt(16), "key_f32", d, j, pool);
            score = as_f32(slot_score, slot_score.type(), "score_f32", d, j, pool);
            ape_f32 = ape;
        }
        slot_k.dim(0).set_bounds(0, kHeadDim / values_per_item(slot_k.type())).dim(1).set_bounds(0, pool_size);
        slot_score.dim(0).set_bounds(0, kHeadDim / values_per_item(slot_score.type())).dim(1).set_bounds(0, pool_size);
        ape.dim(0).set_bounds(0, kHeadDim).dim(1).set_bounds(0, pool_size);
        s.compress = compress_pool(key, score, ape_f32, pool_size, d, j, s.v, s.lane, {pool}, s.layout, round_scale,
                                   pool_arithmetic(arith, plan.target,
                                                   rounding_barrier(plan.barrier_operand(slot_k.dim(2))),
                                                   decided.exp_branches, decided.exp_fma_fast_path),
                                   decided.e4m3);
    }

    // The pools' rows into the K cache in place (only the targeted rows
    // change), pool p's row at flat slot locs(p) where writes(p) != 0.
    void write_pools_to_cache(Stages &s, Func cache, Func locs, Func writes) {
        Var d{"d"}, token{"token"}, page{"page"};
        cache(d, token, page) = Tuple(undef<uint8_t>(), undef<float>());
        s.write = RDom(0, kHeadDim, 0, slot_k.dim(2).extent(), "write");
        Expr pool = s.write.y;
        Divisor page_size(cache.output_buffers()[0].dim(1).extent(), Divisor::Kind::Any);
        write_cache_rows(cache, s.write, {pool}, locs(pool), writes(pool) != 0, s.compress.rotate.quant, page_size,
                         !this->get_target().has_feature(Target::LargeBuffers));
        if (words()) {
            align_rows(cache.output_buffers()[0], {2}, kCodeWord);  // (d, token, page): tokens 128 apart
        }
        s.cache = cache;
    }

    // The words kernels: each lane reads its V values of every slot itself
    // (lane l holds values l * V .. l * V + V - 1: compress's runs are its
    // values), as items at l * items + item; the rows are 16-byte aligned
    // (the runtime takes these kernels only for such data), so a schedule
    // may load 4 items of 32 bits at once.
    void define_lane_loads(CompressLaneLoads &l, const RowLayout &layout, Func &key, Func &score, Func &ape_f32,
                           Var d, Var j, Var pool, Var lane, bool clamp_pools) {
        const int V = layout.values_per_lane;
        if (layout.run != V || (values_per_item(slot_score.type()) == 1 && slot_score.type() != Float(32)) ||
            V % values_per_item(slot_k.type()) != 0 || V % values_per_item(slot_score.type()) != 0) {
            throw CompileError("the compress words kernels need runs of a lane's values, and slot_score as words of "
                               "bf16 or float32, each lane's values whole words");
        }
        const Var &item = l.item;
        l.key_items = V / values_per_item(slot_k.type());
        l.score_items = V / values_per_item(slot_score.type());
        l.ape_items = V;
        l.key = Func{"key_lane_words"};
        auto read_pool = [&](const GeneratorInput<Buffer<void, 3>> &in) -> Expr {
            return clamp_pools ? min(pool, in.dim(2).max()) : Expr(pool);
        };
        l.key(item, j, lane, pool) = slot_k(lane * l.key_items + item, j, read_pool(slot_k));
        l.score = Func{"score_lane_items"};
        l.score(item, j, lane, pool) = slot_score(lane * l.score_items + item, j, read_pool(slot_score));
        l.ape = Func{"ape_lane_items"};
        l.ape(item, j, lane) = ape(lane * l.ape_items + item, j);
        Expr in_lane = d % V, of_lane = d / V;
        key(d, j, pool) = item_value_f32(l.key, slot_k.type(), in_lane, {j, of_lane, pool});
        score(d, j, pool) = item_value_f32(l.score, slot_score.type(), in_lane, {j, of_lane, pool});
        ape_f32(d, j) = l.ape(in_lane, j, of_lane);
        // Rows of whole 16-byte loads: strides in items multiples of 16 bytes.
        for (GeneratorInput<Buffer<void, 3>> *in : {&slot_k, &slot_score}) {
            const int per_load = 16 / in->type().bytes();
            in->dim(1).set_stride((in->dim(1).stride() / per_load) * per_load);
            in->dim(2).set_stride((in->dim(2).stride() / per_load) * per_load);
        }
        ape.dim(1).set_stride((ape.dim(1).stride() / 4) * 4);
    }
};

class CompressToCache : public CompressBase<CompressToCache, CompressToCacheStages> {
public:
    // (pool): int64 (the contract's loc), or int32 (an engine's slot_mapping
    // read in place, kpool_compress_tokens_and_write_cache).
    Input<Buffer<void, 1>> loc{"loc"};
    Input<Buffer<uint8_t, 1>> write_mask{"write_mask"};  // (pool); stride 0 when absent
    // The K cache in place, as (codes, scales) views (kpool_algorithms.h).
    Output<Func> cache{"cache", {UInt(8), Float(32)}, 3};

    void generate() {
        define_compress(stages);
        // Pools past the batch read as "no write", so schedules may split freely.
        write_pools_to_cache(stages, cache, BoundaryConditions::constant_exterior(loc, cast(loc.type(), -1)),
                             BoundaryConditions::constant_exterior(write_mask, cast<uint8_t>(0)));
        loc.dim(0).set_stride(Expr());
        write_mask.dim(0).set_stride(Expr());  // 0 when absent
    }

    void schedule() {
        using namespace estimate;
        loc.set_estimates({{0, kPools}});
        write_mask.set_estimates({{0, kPools}});
        cache.set_estimates(estimate::in_place_cache());
        estimate_inputs();
        schedule_with(schedule_compress_to_cache);
    }
};

// The prefill insert on the engine's token rows with its tail seed, in
// one kernel (kpool_compress_tokens_and_write_cache given the tail): the
// pools of the rows (slot_k and slot_score: pool p is tokens p .. p+P-1,
// views of the same memory as key and gate_score) into the cache at
// loc(p) (the slot_mapping of token p+P-1), and every token the seed rule
// picks into its ring.
class CompressTokensAndSeed : public CompressBase<CompressTokensAndSeed, CompressAndSeedStages> {
public:
    Input<Buffer<void, 1>> loc{"loc"};                    // (pool): int32 or int64
    Input<Buffer<uint16_t, 2>> key{"key"};                // (d, token) bf16 bits
    Input<Buffer<uint16_t, 2>> gate_score{"gate_score"};  // (d, token)
    Input<Buffer<void, 1>> tslot{"tslot"};                // (token): int32 or int64
    Output<Func> cache{"cache", {UInt(8), Float(32)}, 3};
    Output<Buffer<uint16_t, 4>> tail{"tail"};  // (d, ring_pos, half, block), in place

    void generate() {
        CompressAndSeedStages &s = stages;
        // The seed's blocks of 32 G tokens outnumber the compress's blocks
        // of G pools where the batch has few pools of many tokens (P = 64:
        // 64 tokens, one pool, two blocks of a warp each).
        define_compress(s, /*clamp_pools=*/true);
        Func every_pool{"every_pool"};
        every_pool(s.pool) = cast<uint8_t>(1);
        write_pools_to_cache(s, cache, BoundaryConditions::constant_exterior(loc, cast(loc.type(), -1)), every_pool);

        Var d{"d"}, ring_pos{"ring_pos"}, half{"half"}, block{"block"};
        tail(d, ring_pos, half, block) = undef<uint16_t>();
        Expr n = key.dim(1).extent();
        TailSeed seed(BoundaryConditions::constant_exterior(tslot, cast(tslot.type(), -1)), int(pool_size),
                      tail.dim(1).extent(), tail.dim(3).extent(), s.token);
        s.seeded = seed.seeded;
        s.copy = RDom(0, kHeadDim, 0, n, 0, 2, "write");
        seed.write(tail, s.copy, s.copy.x, s.copy.z, s.copy.y, key, gate_score, n);
        s.tail = tail;

        for (auto *index : {&loc, &tslot}) {
            index->dim(0).set_stride(Expr());
        }
        key.dim(0).set_bounds(0, kHeadDim);
        gate_score.dim(0).set_bounds(0, kHeadDim);
        tail.dim(0).set_bounds(0, kHeadDim).dim(1).set_stride(kHeadDim).dim(2).set_bounds(0, 2);
    }

    void schedule() {
        using namespace estimate;
        loc.set_estimates({{0, kTokens}});
        tslot.set_estimates({{0, kTokens}});
        key.set_estimates({{0, kHeadDim}, {0, kTokens}});
        gate_score.set_estimates({{0, kHeadDim}, {0, kTokens}});
        cache.set_estimates(in_place_cache());
        tail.set_estimates(in_place_tail());
        estimate_inputs();
        schedule_with(schedule_compress_and_seed);
    }
};

class CompressToRows : public CompressBase<CompressToRows, CompressToRowsStages> {
public:
    // (d, pool): e4m3 codes and the pool's scale (d stride 0), as in fwht.
    Output<Func> compressed{"compressed", {UInt(8), Float(32)}, 2};

    void generate() {
        CompressToRowsStages &s = stages;
        define_compress(s);
        const Fp8Row &quant = s.compress.rotate.quant;
        compressed(s.d, s.pool) = Tuple(quant.codes(s.d, s.pool), quant.scale(s.d, s.pool));
        constrain_row_views(Func(compressed).output_buffers(), kHeadDim);
        if (words()) {
            align_rows(Func(compressed).output_buffers()[0], {1}, kCodeWord);  // (d, pool)
        }
        s.out = compressed;
    }

    void schedule() {
        compressed.set_estimates({{0, kHeadDim}, {0, estimate::kPools}});
        estimate_inputs();
        schedule_with(schedule_compress_to_rows);
    }
};

// The prefill insert with positions (kpool_compress_tokens_and_write_cache
// given `positions`): a chunk may start inside a pool. Token t completes the
// pool of positions p-P+1 .. p (p = positions[t], p % P == P-1,
// slot_mapping[t] >= 0) in its tail block; member j (position p-P+1+j) is
// row t-(P-1-j) where that row holds that position in the same tail block,
// else the ring's row of that position in t's block (an earlier chunk
// seeded it). Like decode, a completion needs a tail block: without one it
// writes nothing.
class CompressTokensFromRing : public KpoolGenerator<CompressTokensFromRing, CompressToCacheStages> {
public:
    GeneratorParam<int> pool_size{"pool_size", 4, 1, KPOOL_MAX_POOL_SIZE};
    GeneratorParam<Arithmetic> arithmetic{"arithmetic", Arithmetic::Exact, kArithmeticNames};

    Input<Buffer<uint16_t, 2>> key{"key"};                // (d, t), bf16 bits
    Input<Buffer<uint16_t, 2>> gate_score{"gate_score"};  // (d, t), bf16: the ring holds bf16 scores
    Input<Buffer<float, 2>> ape{"ape"};                   // (d, j)
    Input<bool> round_scale{"round_scale"};
    Input<bool> aligned_data{"aligned_data"};  // ape's rows 16-byte aligned (the runtime checked)
    Input<Buffer<void, 1>> slot_mapping{"slot_mapping"};            // (t), int32 or int64
    Input<Buffer<void, 1>> positions{"positions"};                  // (t), of its type
    Input<Buffer<void, 1>> tail_slot_mapping{"tail_slot_mapping"};  // (t), of its type
    Input<Buffer<uint16_t, 4>> tail{"tail"};  // (d, ring_pos, half, block): the ring as before the call
    Output<Func> cache{"cache", {UInt(8), Float(32)}, 3};

    void generate() {
        CompressToCacheStages &s = stages;
        Var d = s.d, j = s.j, t = s.pool;
        const int P = pool_size;
        const BuildPlan plan = build_plan();
        const Arithmetic arith = arithmetic_for(arithmetic, plan.target);
        const ScheduleDecisions decided = schedule_decisions(plan, {KernelAsked::Kind::Compress, arith, false});
        s.layout = decided.layout;
        s.conditions = {aligned_data && ape.dim(1).stride() % 4 == 0, round_scale};

        Expr tokens = key.dim(1).extent(), ring = tail.dim(1).extent(), blocks = tail.dim(3).extent();
        Divisor ring_math(ring, Divisor::Kind::MaybePow2);
        // Every per-token read clamped into the tokens: a schedule may round
        // a loop over them up (those rows write nothing).
        auto row = [&](Expr i) { return clamp(i, 0, tokens - 1); };
        Func position{"position"}, block{"tail_block"};
        position(t) = saturating_cast<int32_t>(positions(row(t)));
        Expr tail_slot = saturating_cast<int32_t>(tail_slot_mapping(row(t)));
        block(t) = select(tail_slot >= 0, ring_math.div(max(tail_slot, 0)), -1);

        // Member j of the pool t completes (position p - back): its row in
        // the chunk, and whether that row holds it. Positions run up to
        // int32's limit, and Halide may reassociate p - back into
        // (p + j) - (P-1), which passes it: so no sum of a position here,
        // only the difference of two non-negative ones.
        Expr back = P - 1 - j, p = position(t), from = row(t - back);
        Func in_chunk{"member_in_chunk"};
        in_chunk(j, t) = t - back >= 0 && position(from) >= 0 && p - position(from) == back && block(from) == block(t);
        // Else the ring: as RING % P == 0 and p % P == P-1, member j sits at
        // ring position p % RING - (P-1) + j, no wrap (decode's rule).
        // (Clamped: a token that completes nothing reads in bounds, and
        // bounds inference cannot bound the shift-or-modulo.)
        Expr ring_pos = clamp(ring_math.mod(max(p, 0)) - (P - 1), 0, ring - P) + j,
             ring_block = clamp(block(t), 0, blocks - 1);
        Func member_key{"member_key"}, member_score{"member_score"};
        member_key(d, j, t) = bf16_to_f32(select(in_chunk(j, t), key(d, from), tail(d, ring_pos, 0, ring_block)));
        member_score(d, j, t) =
            bf16_to_f32(select(in_chunk(j, t), gate_score(d, from), tail(d, ring_pos, 1, ring_block)));
        s.compress = compress_pool(member_key, member_score, ape, P, d, j, s.v, s.lane, {t}, s.layout, round_scale,
                                   pool_arithmetic(arith, plan.target, rounding_barrier(plan.barrier_operand(key.dim(1))),
                                                   decided.exp_branches, decided.exp_fma_fast_path),
                                   decided.e4m3);

        Var cd{"d"}, token{"token"}, page{"page"};
        cache(cd, token, page) = Tuple(undef<uint8_t>(), undef<float>());
        s.write = RDom(0, kHeadDim, 0, tokens, "write");
        Expr w = s.write.y, wp = position(w);
        Expr completes = wp >= 0 && wp % P == P - 1 && block(w) >= 0 && block(w) < blocks;
        Divisor page_size(Func(cache).output_buffers()[0].dim(1).extent(), Divisor::Kind::Any);
        write_cache_rows(cache, s.write, {w}, saturating_cast<int32_t>(slot_mapping(row(w))), completes,
                         s.compress.rotate.quant, page_size, !get_target().has_feature(Target::LargeBuffers));

        key.dim(0).set_bounds(0, kHeadDim);
        gate_score.dim(0).set_bounds(0, kHeadDim);
        ape.dim(0).set_bounds(0, kHeadDim).dim(1).set_bounds(0, P);
        tail.dim(0).set_bounds(0, kHeadDim).dim(1).set_stride(kHeadDim).dim(2).set_bounds(0, 2);
        for (auto *per_token : {&slot_mapping, &positions, &tail_slot_mapping}) {
            per_token->dim(0).set_stride(Expr());
        }
        s.cache = cache;
    }

    void schedule() {
        using namespace estimate;
        key.set_estimates({{0, kHeadDim}, {0, kTokens}});
        gate_score.set_estimates({{0, kHeadDim}, {0, kTokens}});
        ape.set_estimates({{0, kHeadDim}, {0, pool_size}});
        round_scale.set_estimate(true);
        aligned_data.set_estimate(true);
        for (auto *per_token : {&slot_mapping, &positions, &tail_slot_mapping}) {
            per_token->set_estimates({{0, kTokens}});
        }
        tail.set_estimates(tail_ring(pool_size));
        cache.set_estimates(kv_cache());
        schedule_with(schedule_compress_to_cache);
    }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::CompressToCache, kpool_compress_to_cache)
HALIDE_REGISTER_GENERATOR(kpool::CompressTokensFromRing, kpool_compress_tokens_from_ring)
HALIDE_REGISTER_GENERATOR(kpool::CompressToRows, kpool_compress_to_rows)
HALIDE_REGISTER_GENERATOR(kpool::CompressTokensAndSeed, kpool_compress_tokens_and_seed)
