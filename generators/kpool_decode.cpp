// kpool_decode_update_and_maybe_write_cache_batched. On CUDA one kernel,
// kpool_decode_update (schedules/cuda/decode.cpp); on the CPU, and on CUDA
// for a K cache launched in windows of pages, two, which the runtime runs
// in order (the first once per window):
//   kpool_decode_write_cache: every completing token's pool, compressed and
//     written at slot_mapping. A pool member stashed earlier in the same call
//     comes from that token's inputs, otherwise from the ring as it was
//     before the call: the same bytes the reference's sequential loop reads.
//   kpool_decode_stash_tail: every token stashed into its ring slot, in
//     token order per request (the last stash of a slot wins).
// Both definitions are free of token order: any schedule that runs a
// request's completions before its stashes gives the reference's bytes. The
// one kernel's warp per request is defined in token order instead
// (ring_in_order, tokens_in_order), which its schedule keeps.
#include "kpool_stages.h"

namespace kpool {

using namespace Halide;

namespace {

// The decode rule for one token (SPEC op 4): it stashes when its position
// and tail slot are both >= 0, into ring position `position % RING` of block
// `tail_slot / RING` (the reference recomputes both; it does not take the
// tail slot's low part).
struct DecodeToken {
    Expr position, stashes;
    Expr block, ring_pos;  // meaningful where `stashes`
};

DecodeToken decode_token(Func positions, Func tail_slots, Expr t, Expr b, const Divisor &ring) {
    Expr pos = positions(t, b), ts = tail_slots(t, b);
    return {pos, pos >= 0 && ts >= 0, ring.div(ts), ring.mod(pos)};
}

Expr pow2_ring_and_page(Expr ring, Expr page_size) {
    return Divisor::is_power_of_two(ring) && Divisor::is_power_of_two(page_size);
}

// A per-token index input (tail_slot_mapping, slot_mapping, positions), of
// the integer type the variant is built for (int32 or int64), as int32:
// saturated, so an int64 index past int32 stays out of every range the
// kernels check and a negative one stays a "no write" sentinel.
Func index_values(Func index) {
    Func f{index.name() + "_int32"};
    f(index.args()) = saturating_cast<int32_t>(index(index.args()));
    return f;
}

// Elements per aligned word: 4 bf16 in 8 bytes, 4 f32 in 16 (codes: kCodeWord).
constexpr int kBf16Word = 4, kF32Vector = 4;

// A schedule may round a token loop up past next_n, or a request loop past
// the requests (guarded: those never write, but Halide's bounds of the
// reads follow the rounded loop); every per-token input (..., token,
// request) is read through this clamp of its token and, where `requests`
// is defined (a layout that puts several requests in a block), its request,
// so bounds stay inside. A layout whose request loop is the grid itself
// passes none: the clamp would cost its kernel registers for nothing.
Func clamp_token_and_request(Func f, Expr next_n, Expr requests) {
    Func g{f.name() + "_clamped"};
    std::vector<Var> args = f.args();
    std::vector<Expr> at(args.begin(), args.end());
    at[at.size() - 2] = min(args[args.size() - 2], next_n - 1);
    if (requests.defined()) {
        at[at.size() - 1] = min(args[args.size() - 1], requests - 1);
    }
    g(args) = f(at);
    return g;
}

}  // namespace

// The inputs of the decode kernels that write completions, in their
// argument order (a member of each generator: Halide finds its Inputs there).
struct DecodeWriteArguments {
    GeneratorInput<Buffer<uint16_t, 4>> tail{"tail"};  // (d, ring_pos, half, block): the ring as before the call
    GeneratorInput<Buffer<void, 2>> tail_slot_mapping{"tail_slot_mapping"};  // (token, request), int32 or int64
    GeneratorInput<Buffer<uint16_t, 3>> key{"key"};                             // (d, token, request)
    GeneratorInput<Buffer<uint16_t, 3>> slot_score{"slot_score"};
    GeneratorInput<Buffer<float, 2>> ape{"ape"};  // (d, j)
    GeneratorInput<Buffer<void, 2>> slot_mapping{"slot_mapping"};  // of tail_slot_mapping's type
    GeneratorInput<Buffer<void, 2>> positions{"positions"};
    GeneratorInput<bool> round_scale{"round_scale"};

    void set_estimates(int P) {
        tail.set_estimates(estimate::tail_ring(P));
        for (auto *per_token : {&tail_slot_mapping, &slot_mapping, &positions}) {
            per_token->set_estimates(estimate::decode_tokens());
        }
        key.set_estimates(estimate::decode_rows());
        slot_score.set_estimates(estimate::decode_rows());
        ape.set_estimates({{0, kHeadDim}, {0, P}});
        round_scale.set_estimate(true);
    }
};

// A decode call's tokens as the completions and stashes read them: a grid of
// next_n tokens x `requests` requests, however the caller lays them out
// (DecodeWriteArguments: [B, N] tensors; the ragged decode: flat tokens and
// query_start_loc). A token past its request's count reads as padding
// (every index -1).
struct DecodeTokens {
    Func tail_slot_mapping, slot_mapping, positions;  // (token, request), int32 values
    Func key, slot_score;                             // (d, token, request), bf16 bits
    Expr next_n, requests;
    std::optional<Halide::Internal::Dimension> key_outer;  // key's outermost dim, for the rounding barrier
};

// The [B, N] layout: each input as it is (indices saturated to int32).
DecodeTokens batched_tokens(DecodeWriteArguments &in) {
    return {index_values(in.tail_slot_mapping), index_values(in.slot_mapping), index_values(in.positions),
            in.key, in.slot_score, in.key.dim(1).extent(), in.key.dim(2).extent(), in.key.dim(2)};
}

// Every completing token's pool, compressed and written into `cache` (the K
// cache in place, as (codes, scales) views) over s.write: (d, token, request).
// requests_in_blocks: the schedule may put several requests in a block
// (clamp_token_and_request).
// vector_rows: the kernel reads a lane's run of a row as one vector (its
// rows aligned), so a member chosen by a branch is one load.
// row_over_warps: a row over a block's warps (DecodeLayout::BlockPerRequest).
// ring_in_order: the schedule runs a request's tokens in order, each
// element's ring loads and stores on one thread, so the ring holds each
// earlier stash of the call: a member is the token's own input or the
// ring's, no walk over earlier tokens (s.ring_writer stays undefined).
template <typename Args>
void define_completions(DecodeWriteStages &s, Args &in, const DecodeTokens &tokens,
                        GeneratorOutput<Func> &cache, int P, const BuildPlan &plan, Arithmetic arithmetic,
                        bool requests_in_blocks = true, bool vector_rows = false, bool row_over_warps = false,
                        bool ring_in_order = false) {
    Expr ring = in.tail.dim(1).extent();
    // Ring and cache page both powers of two (the engines' case): every
    // division of the kernel by shifts, in the kernel a schedule specializes
    // on s.pow2_ring_and_page; otherwise every one by division.
    s.pow2_ring_and_page = pow2_ring_and_page(in.tail.dim(1).extent(), Func(cache).output_buffers()[0].dim(1).extent());
    Divisor ring_math(ring, s.pow2_ring_and_page);
    Expr next_n = tokens.next_n;
    Expr requests = tokens.requests;
    Var t = s.token, b = s.request;
    auto in_batch = [&](Func f) { return clamp_token_and_request(f, next_n, requests_in_blocks ? requests : Expr()); };
    Func positions_in = in_batch(tokens.positions), tail_slots_in = in_batch(tokens.tail_slot_mapping),
         slots_in = in_batch(tokens.slot_mapping), key_in = in_batch(tokens.key),
         score_in = in_batch(tokens.slot_score);

    // Member j of the pool [pos - (P-1), pos] that token t completes sits
    // at position pos - (P-1) + j: as RING % P == 0 (SPEC; the runtime
    // checks it) and pos % P == P-1, in ring position start + j of t's tail
    // block, start = pos % RING - (P-1) >= 0. The members are P consecutive
    // rows of the ring, no wrap. (start is clamped into the ring, so a
    // token that completes nothing reads in bounds too.)
    DecodeToken tok = decode_token(positions_in, tail_slots_in, t, b, ring_math);
    Expr pool_start = clamp(tok.ring_pos - (P - 1), 0, ring - P);
    Expr member_ring_pos = pool_start + s.j;
    Expr member_block = clamp(tok.block, 0, in.tail.dim(3).extent() - 1);
    Expr current = s.j == P - 1;
    // Whether a member comes from this call's inputs, and from which token's.
    Expr from_inputs = current, own_token = t;
    if (!ring_in_order) {
        // The latest earlier token of this request that stashed into the
        // same ring slot of the same block, or -1: what the ring holds now.
        // A walk over the earlier tokens in order, the last match kept.
        RDom &earlier = s.earlier;
        earlier = RDom(0, next_n, "earlier");
        earlier.where(earlier < t);
        DecodeToken e = decode_token(positions_in, tail_slots_in, earlier, b, ring_math);
        Expr same_slot = e.stashes && e.block == tok.block && e.ring_pos == member_ring_pos;
        s.ring_writer(s.j, t, b) = -1;
        s.ring_writer(s.j, t, b) = select(same_slot, earlier, s.ring_writer(s.j, t, b));
        Expr writer = s.ring_writer(s.j, t, b);
        from_inputs = current || writer >= 0;
        own_token = select(current, t, clamp(writer, 0, next_n - 1));
    }
    const Arithmetic arith = arithmetic_for(arithmetic, plan.target);
    const ScheduleDecisions decided = schedule_decisions(plan, {KernelAsked::Kind::Decode, arith, vector_rows, row_over_warps});
    // A member is this call's input of its token (the current one, or the
    // earlier one that stashed it) or else the ring's: where the family
    // branches (ScheduleDecisions), one load of the one source.
    auto member = [&](Func input, int half) {
        Expr own = input(s.d, own_token, b);
        Expr ring_member = in.tail(s.d, member_ring_pos, half, member_block);
        return decided.member_branches
                   ? Internal::Call::make(own.type(), Internal::Call::if_then_else, {from_inputs, own, ring_member},
                                          Internal::Call::PureIntrinsic)
                   : select(from_inputs, own, ring_member);
    };
    s.member_key_bits(s.d, s.j, t, b) = member(key_in, 0);
    s.member_score_bits(s.d, s.j, t, b) = member(score_in, 1);
    Func member_key{"member_key"}, member_score{"member_score"};
    member_key(s.d, s.j, t, b) = bf16_to_f32(s.member_key_bits(s.d, s.j, t, b));
    member_score(s.d, s.j, t, b) = bf16_to_f32(s.member_score_bits(s.d, s.j, t, b));
    s.layout = decided.layout;
    s.compress = compress_pool(member_key, member_score, in.ape, P, s.d, s.j, s.v, s.lane, {t, b}, s.layout,
                               in.round_scale,
                               pool_arithmetic(arith, plan.target,
                                               rounding_barrier(plan.barrier_operand(*tokens.key_outer)),
                                               decided.exp_branches, decided.exp_fma_fast_path),
                               decided.e4m3);

    // A completion needs a tail block: with tail_slot < 0 the reference
    // would read block 0 (another request's); we write nothing and the
    // runtime reports it.
    Var d{"d"}, token{"token"}, page{"page"};
    cache(d, token, page) = Tuple(undef<uint8_t>(), undef<float>());
    s.write = RDom(0, kHeadDim, 0, next_n, 0, requests, "write");
    Expr wt = s.write.y, wb = s.write.z;
    DecodeToken w = decode_token(positions_in, tail_slots_in, wt, wb, ring_math);
    Expr completes = w.stashes && w.position % P == P - 1 && w.block < in.tail.dim(3).extent();
    Divisor page_math(Func(cache).output_buffers()[0].dim(1).extent(), s.pow2_ring_and_page);
    // offsets_32bit false: the int64-index kernels keep the 64-bit division
    // of a completing slot (once per completion); the 32-bit form moved
    // decode_write_cache's P=8 kernels, at the register cap, into spills.
    write_cache_rows(cache, s.write, {wt, wb}, slots_in(wt, wb), completes, s.compress.rotate.quant, page_math,
                     /*offsets_32bit=*/false);

    in.tail.dim(0).set_bounds(0, kHeadDim);
    in.tail.dim(1).set_stride(kHeadDim);
    in.tail.dim(2).set_bounds(0, 2);
    in.ape.dim(0).set_bounds(0, kHeadDim).dim(1).set_bounds(0, P);
    s.cache = cache;
}

// The [B, N] inputs' own constraints (the ragged ones state theirs).
void constrain_batched_tokens(DecodeWriteArguments &in) {
    in.key.dim(0).set_bounds(0, kHeadDim);
    in.slot_score.dim(0).set_bounds(0, kHeadDim);
    for (auto *per_token : {&in.tail_slot_mapping, &in.slot_mapping, &in.positions}) {
        per_token->dim(0).set_stride(Expr());
    }
}

// Whether a later token of the same request stashes into the same ring slot
// as token (tv, bv): the reference stashes in token order, so the last stash
// into a slot wins; a token that a later one overwrites stashes nothing,
// which leaves the tokens free of order (and of races) for a schedule.
void define_overwritten(Func overwritten, Func positions, Func tail_slots, Expr next_n, const Divisor &ring) {
    Var tv{"tv"}, bv{"bv"};
    RDom later(0, next_n, "later");
    DecodeToken self = decode_token(positions, tail_slots, tv, bv, ring);
    DecodeToken l = decode_token(positions, tail_slots, later, bv, ring);
    overwritten(tv, bv) = Internal::const_false();
    overwritten(tv, bv) =
        overwritten(tv, bv) || (later > tv && l.stashes && l.block == self.block && l.ring_pos == self.ring_pos);
}

// The stash of every token of the call into its ring slot: `tail` in place
// over s.stash = (d, token, request, half), named and ordered as the
// completions' RDom `write` (then half), so a schedule can fuse the loops
// over requests. A token that a later one of its request overwrites stashes
// nothing (s.overwritten), unless `tokens_in_order` (a schedule storing each
// element of a request's rows from one thread, its tokens in order: the
// later store lands last, as the reference's; s.overwritten stays
// undefined). Out-of-range tail blocks write nothing.
// key and slot_score are (d, token, request) of next_n x requests tokens,
// tail_slot_mapping and positions (token, request).
// The ring divides by shifts where `shifts` (which implies a power-of-two
// ring: the condition the kernel is specialized on).
void define_stashes(DecodeStashStages &s, Func tail, Func tail_slot_mapping, Func key, Func slot_score,
                    Func positions, Expr next_n, Expr requests, Expr shifts, bool requests_in_blocks = true,
                    bool tokens_in_order = false) {
    Expr ring = tail.output_buffer().dim(1).extent();
    Divisor ring_math(ring, shifts);
    s.ring_is_pow2 = shifts;
    Var d{"d"}, ring_pos{"ring_pos"}, half{"half"}, block{"block"};
    tail(d, ring_pos, half, block) = undef<uint16_t>();
    RDom &r = s.stash;
    r = RDom(0, kHeadDim, 0, next_n, 0, requests, 0, 2, "write");
    Expr t = r.y, b = r.z, h = r[3];
    auto in_batch = [&](Func f) { return clamp_token_and_request(f, next_n, requests_in_blocks ? requests : Expr()); };
    Func positions_in = in_batch(positions), tail_slots_in = in_batch(tail_slot_mapping);
    DecodeToken tok = decode_token(positions_in, tail_slots_in, t, b, ring_math);
    Expr blocks = tail.output_buffer().dim(3).extent();
    if (tokens_in_order) {
        r.where(tok.stashes && tok.block < blocks);
    } else {
        define_overwritten(s.overwritten, positions_in, tail_slots_in, next_n, ring_math);
        r.where(tok.stashes && tok.block < blocks && !s.overwritten(t, b));
    }
    TailSlot at = clamp_tail_slot(tok.block, tok.ring_pos, ring, blocks);
    Var t_var{"t"}, b_var{"b"};
    s.stash_row(d, half, t_var, b_var) =
        select(half == 0, in_batch(key)(d, t_var, b_var), in_batch(slot_score)(d, t_var, b_var));
    tail(r.x, at.ring_pos, h, at.block) = s.stash_row(r.x, h, t, b);
    tail.output_buffer().dim(0).set_bounds(0, kHeadDim).dim(1).set_stride(kHeadDim).dim(2).set_bounds(0, 2);
    s.tail = tail;
}

class DecodeWriteCache : public KpoolGenerator<DecodeWriteCache, DecodeWriteStages> {
public:
    GeneratorParam<int> pool_size{"pool_size", 4, 1, KPOOL_MAX_POOL_SIZE};
    GeneratorParam<Arithmetic> arithmetic{"arithmetic", Arithmetic::Exact, kArithmeticNames};

    DecodeWriteArguments in;
    // The K cache in place, as (codes, scales) views (kpool_algorithms.h).
    Output<Func> cache{"cache", {UInt(8), Float(32)}, 3};

    void generate() {
        define_completions(stages, in, batched_tokens(in), cache, pool_size, build_plan(), arithmetic);
        constrain_batched_tokens(in);
    }

    void schedule() {
        in.set_estimates(pool_size);
        cache.set_estimates(estimate::kv_cache());
        if (!using_autoscheduler()) {
            stages.pipeline = get_pipeline();  // for the schedule's lowering pass
        }
        schedule_with(schedule_decode_write);
    }
};

// Both steps in one pipeline: the completions (which read the ring as it
// was before the call: the `tail` input, the same memory as the `tail_out`
// output), then the stashes of the tokens no later one overwrites. A
// schedule runs a request's stashes after all of its completions; only a
// tail block that two requests of the call share could see the other's
// stash (docs/behaviour.md). `Args` lays the tokens out: [B, N] tensors
// (DecodeWriteArguments), or flat tokens and query_start_loc
// (DecodeRaggedArguments).
template <typename T, typename Args>
class DecodeUpdateBase : public KpoolGenerator<T, DecodeUpdateStages> {
public:
    using KpoolGenerator<T, DecodeUpdateStages>::stages;
    GeneratorParam<int> pool_size{"pool_size", 4, 1, KPOOL_MAX_POOL_SIZE};
    GeneratorParam<Arithmetic> arithmetic{"arithmetic", Arithmetic::Exact, kArithmeticNames};
    GeneratorParam<DecodeLayout> layout{"layout", DecodeLayout::WarpPerToken,
                                        {{"warp_per_token", DecodeLayout::WarpPerToken},
                                         {"warp_per_request", DecodeLayout::WarpPerRequest},
                                         {"block_per_request", DecodeLayout::BlockPerRequest}}};
    // Every bf16 row (key, slot_score, the ring) starts 8-byte aligned,
    // ape is dense from a 16-byte-aligned base and every row of codes
    // 4-byte aligned (the runtime checks before it picks such a kernel): a
    // lane's 4 elements move as one 8-byte (16-byte for ape) load or 4-byte
    // store. Without it the kernel takes any strides.
    GeneratorParam<bool> aligned_rows{"aligned_rows", false};

    Args in;
    GeneratorOutput<Func> cache{"cache", {UInt(8), Float(32)}, 3};
    GeneratorOutput<Buffer<uint16_t, 4>> tail_out{"tail_out"};  // (d, ring_pos, half, block), in place

    void generate() {
        const DecodeTokens tokens = in.tokens();
        // A warp per token and a block per request run a block per request:
        // their request loop is the grid, never rounded up. A warp per
        // request walks its tokens in order (ring_in_order, tokens_in_order).
        const bool per_request = layout == DecodeLayout::WarpPerRequest;
        define_completions(stages.write, in, tokens, cache, pool_size, this->build_plan(), arithmetic,
                           /*requests_in_blocks=*/per_request, aligned_rows,
                           layout == DecodeLayout::BlockPerRequest, /*ring_in_order=*/per_request);
        define_stashes(stages.stashes, tail_out, tokens.tail_slot_mapping, tokens.key, tokens.slot_score,
                       tokens.positions, tokens.next_n, tokens.requests, stages.write.pow2_ring_and_page,
                       /*requests_in_blocks=*/per_request, /*tokens_in_order=*/per_request);
        in.constrain_tokens(aligned_rows);
        if (aligned_rows) {
            // Rows of 4 bf16 words: (d, ring_pos, half, block).
            align_rows(in.tail, {2, 3}, kBf16Word);
            align_rows(tail_out, {2, 3}, kBf16Word);
            align_rows(Func(cache).output_buffers()[0], {2}, kCodeWord);  // (d, token, page): token stride is 128
            // ape (d, j) dense: a lane's 4 f32 of a slot in one 16-byte load,
            // every slot's at a constant offset from the first's.
            align_rows(in.ape, {1}, kF32Vector);
            in.ape.dim(1).set_stride(kHeadDim);
        }
        stages.aligned_rows = aligned_rows;
        stages.layout = layout;
    }

    void schedule() {
        in.set_estimates(pool_size);
        cache.set_estimates(estimate::kv_cache());
        tail_out.set_estimates(estimate::tail_ring(pool_size));
        if (!this->using_autoscheduler()) {
            stages.write.pipeline = this->get_pipeline();  // for the schedule's lowering pass
        }
        this->schedule_with(schedule_decode_update);
    }
};

// The [B, N] layout's own constraints: each request's next_n tokens in
// place (with aligned_rows, rows of 4-bf16 words).
struct DecodeBatchedArguments : DecodeWriteArguments {
    DecodeTokens tokens() { return batched_tokens(*this); }
    void constrain_tokens(bool aligned_rows) {
        constrain_batched_tokens(*this);
        if (aligned_rows) {
            align_rows(key, {1, 2}, kBf16Word);  // (d, token, request)
            align_rows(slot_score, {1, 2}, kBf16Word);
        }
    }
};

class DecodeUpdate : public DecodeUpdateBase<DecodeUpdate, DecodeBatchedArguments> {};

// The ragged decode: T tokens flat, request r's at [query_start_loc[r],
// query_start_loc[r+1]) in position order, laid out as the grid of
// max_query_len tokens x B requests (a grid token past its request's count
// is padding). Offsets out of order or past T read as empty requests; a
// request of more than max_query_len tokens runs its first max_query_len
// (the runtime states both rules).
struct DecodeRaggedArguments {
    GeneratorInput<Buffer<uint16_t, 4>> tail{"tail"};  // (d, ring_pos, half, block): the ring as before the call
    GeneratorInput<Buffer<void, 1>> tail_slot_mapping{"tail_slot_mapping"};  // (t), int32 or int64
    GeneratorInput<Buffer<uint16_t, 2>> key{"key"};                             // (d, t)
    GeneratorInput<Buffer<uint16_t, 2>> slot_score{"slot_score"};
    GeneratorInput<Buffer<float, 2>> ape{"ape"};  // (d, j)
    GeneratorInput<Buffer<void, 1>> slot_mapping{"slot_mapping"};  // of tail_slot_mapping's type
    GeneratorInput<Buffer<void, 1>> positions{"positions"};
    GeneratorInput<Buffer<void, 1>> query_start_loc{"query_start_loc"};  // (request + 1), of the same type
    GeneratorInput<int32_t> max_query_len{"max_query_len"};  // >= 1 (the runtime passes it so)
    GeneratorInput<bool> round_scale{"round_scale"};

    DecodeTokens tokens() {
        Var d{"d"}, t{"t"}, b{"b"};
        Expr total = key.dim(1).extent();
        Func offsets = index_values(query_start_loc);
        Expr first = clamp(offsets(b), 0, total), end = clamp(offsets(b + 1), first, total);
        Func token_of{"token_of"}, real{"real_token"};
        token_of(t, b) = clamp(first + t, 0, total - 1);  // in bounds for padding too
        real(t, b) = t < end - first;
        auto per_token = [&](Func index, const char *name) {
            Func f{name};
            f(t, b) = select(real(t, b), index_values(index)(token_of(t, b)), -1);
            return f;
        };
        DecodeTokens g;
        g.tail_slot_mapping = per_token(tail_slot_mapping, "ragged_tail_slots");
        g.slot_mapping = per_token(slot_mapping, "ragged_slots");
        g.positions = per_token(positions, "ragged_positions");
        g.key = Func{"ragged_key"};
        g.key(d, t, b) = key(d, token_of(t, b));
        g.slot_score = Func{"ragged_score"};
        g.slot_score(d, t, b) = slot_score(d, token_of(t, b));
        g.next_n = max_query_len;
        g.requests = query_start_loc.dim(0).extent() - 1;
        g.key_outer = key.dim(1);
        return g;
    }
    void constrain_tokens(bool aligned_rows) {
        key.dim(0).set_bounds(0, kHeadDim);
        slot_score.dim(0).set_bounds(0, kHeadDim);
        for (auto *per_token : {&tail_slot_mapping, &slot_mapping, &positions, &query_start_loc}) {
            per_token->dim(0).set_stride(Expr());
        }
        if (aligned_rows) {
            align_rows(key, {1}, kBf16Word);  // (d, t)
            align_rows(slot_score, {1}, kBf16Word);
        }
    }
    void set_estimates(int P) {
        using namespace estimate;
        tail.set_estimates(tail_ring(P));
        for (auto *per_token : {&tail_slot_mapping, &slot_mapping, &positions}) {
            per_token->set_estimates({{0, kRequests * kNextN}});
        }
        query_start_loc.set_estimates({{0, kRequests + 1}});
        key.set_estimates({{0, kHeadDim}, {0, kRequests * kNextN}});
        slot_score.set_estimates({{0, kHeadDim}, {0, kRequests * kNextN}});
        ape.set_estimates({{0, kHeadDim}, {0, P}});
        max_query_len.set_estimate(kNextN);
        round_scale.set_estimate(true);
    }
};

class DecodeUpdateRagged : public DecodeUpdateBase<DecodeUpdateRagged, DecodeRaggedArguments> {};

class DecodeStashTail : public KpoolGenerator<DecodeStashTail, DecodeStashStages> {
public:
    Input<Buffer<void, 2>> tail_slot_mapping{"tail_slot_mapping"};  // (token, request), int32 or int64
    Input<Buffer<uint16_t, 3>> key{"key"};                          // (d, token, request)
    Input<Buffer<uint16_t, 3>> slot_score{"slot_score"};
    Input<Buffer<void, 2>> positions{"positions"};  // of tail_slot_mapping's type
    Output<Buffer<uint16_t, 4>> tail{"tail"};  // (d, ring_pos, half, block), in place

    void generate() {
        define_stashes(stages, tail, index_values(tail_slot_mapping), key, slot_score, index_values(positions),
                       key.dim(1).extent(), key.dim(2).extent(), Divisor::is_power_of_two(tail.dim(1).extent()));
        tail_slot_mapping.dim(0).set_stride(Expr());
        positions.dim(0).set_stride(Expr());
        key.dim(0).set_bounds(0, kHeadDim);
        slot_score.dim(0).set_bounds(0, kHeadDim);
    }

    void schedule() {
        for (auto *per_token : {&tail_slot_mapping, &positions}) {
            per_token->set_estimates(estimate::decode_tokens());
        }
        key.set_estimates(estimate::decode_rows());
        slot_score.set_estimates(estimate::decode_rows());
        tail.set_estimates(estimate::tail_ring(estimate::kPoolSize));
        schedule_with(schedule_decode_stash);
    }
};

}  // namespace kpool

HALIDE_REGISTER_GENERATOR(kpool::DecodeWriteCache, kpool_decode_write_cache)
HALIDE_REGISTER_GENERATOR(kpool::DecodeStashTail, kpool_decode_stash_tail)
HALIDE_REGISTER_GENERATOR(kpool::DecodeUpdate, kpool_decode_update)
HALIDE_REGISTER_GENERATOR(kpool::DecodeUpdateRagged, kpool_decode_update_ragged)
