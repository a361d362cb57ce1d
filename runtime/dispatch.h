// The kernel variants this build holds, looked up by kind, device family,
// pool size, element type and arithmetic (cmake/KpoolKernels.cmake writes
// the table), and each kind's signature: a caller's arguments and every
// generated function of the kind are checked against it at compile time.
#pragma once

#include <type_traits>
#include <vector>

#include "HalideRuntime.h"
#include "errors.h"

namespace kpool::rt {

enum class Kernel {
    FWHT,
    FWHT_WORDS,  // CUDA: 16-byte-aligned rows of bf16 pairs in, 8-byte words of codes out
    COMPRESS_TO_CACHE,
    COMPRESS_TO_ROWS,
    // CUDA: rows of 16-byte-aligned data and strides, bf16 as 64-bit words of 4
    COMPRESS_TO_CACHE_WORDS,
    COMPRESS_TO_ROWS_WORDS,
    // CUDA: the two to-cache kinds with an int32 loc (an engine's
    // slot_mapping read in place: kpool_compress_tokens_and_write_cache)
    COMPRESS_TO_CACHE_I32,
    COMPRESS_TO_CACHE_WORDS_I32,
    // The prefill insert with positions: members before the chunk from the
    // tail ring (keyed by its indices' type)
    COMPRESS_TOKENS_FROM_RING,
    SEED_TAIL,
    DECODE_WRITE_CACHE,  // the CPU's decode: completions, then DECODE_STASH_TAIL
    DECODE_STASH_TAIL,
    DECODE_UPDATE,             // CUDA's decode: both in one kernel, a warp per token
    DECODE_UPDATE_BY_REQUEST,  // the same, a warp per request (few tokens per request)
    // CUDA's ragged decode: the same two layouts on flat tokens and query_start_loc
    DECODE_UPDATE_RAGGED,
    DECODE_UPDATE_RAGGED_BY_REQUEST,
    EXPAND_POOLS_AND_APPEND_TAIL,
    EXPAND_POOLS_TO_TOKENS,
    APPEND_TAIL_TO_TOPK,
    INDEX_CHECK,
};

// The table's keys. Enumerators are spelled as the build spells them (the
// table's lines name them as tokens: `sm90, DECODE_UPDATE, 4, bf16, triton`).
#include "kpool_families.inc"  // KPOOL_FOR_EACH_CUDA_FAMILY(X): X(name, lowest capability)
#define KPOOL_FAMILY_ENUMERATOR(family, capability) family,
enum class Family { cpu, KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_FAMILY_ENUMERATOR) };
#undef KPOOL_FAMILY_ENUMERATOR
#define KPOOL_ELEMENT_TYPES(X) X(none) X(bf16) X(f32) X(int32) X(int64)
// A variant's arithmetic; `any`: the kernel has no approximate step and
// serves both.
#define KPOOL_ARITHMETICS(X) X(any) X(exact) X(triton)
#define KPOOL_ENUMERATOR(e) e,
enum class ElementType { KPOOL_ELEMENT_TYPES(KPOOL_ENUMERATOR) };
enum class Arithmetic { KPOOL_ARITHMETICS(KPOOL_ENUMERATOR) };
#undef KPOOL_ENUMERATOR

const char *name(Family f);
const char *name(ElementType t);
const char *name(Arithmetic a);

// Each kind's arguments, in its generator's order: CPU variants take them
// as they are, CUDA variants after the user context (the call's context and
// stream).
template <typename... Args>
struct Signature {
    using Host = int(Args...);
    using Cuda = int(const void *, Args...);
};
template <Kernel K>
struct KernelSignature;

using Buf = halide_buffer_t *;
#define KPOOL_SIGNATURE(kind, ...) \
    template <>                    \
    struct KernelSignature<Kernel::kind> : Signature<__VA_ARGS__> {};
// (q, codes, scales)
KPOOL_SIGNATURE(FWHT, Buf, Buf, Buf)
KPOOL_SIGNATURE(FWHT_WORDS, Buf, Buf, Buf)
// (slot_k, slot_score, ape, round_scale, loc, write_mask, cache codes, cache scales)
KPOOL_SIGNATURE(COMPRESS_TO_CACHE, Buf, Buf, Buf, bool, bool, Buf, Buf, Buf, Buf)
KPOOL_SIGNATURE(COMPRESS_TO_CACHE_WORDS, Buf, Buf, Buf, bool, bool, Buf, Buf, Buf, Buf)
KPOOL_SIGNATURE(COMPRESS_TO_CACHE_I32, Buf, Buf, Buf, bool, bool, Buf, Buf, Buf, Buf)
KPOOL_SIGNATURE(COMPRESS_TO_CACHE_WORDS_I32, Buf, Buf, Buf, bool, bool, Buf, Buf, Buf, Buf)
// (key, gate_score, ape, round_scale, aligned_data, slot_mapping, positions,
// tail_slot_mapping, tail, cache codes, cache scales)
KPOOL_SIGNATURE(COMPRESS_TOKENS_FROM_RING, Buf, Buf, Buf, bool, bool, Buf, Buf, Buf, Buf, Buf, Buf)
// (slot_k, slot_score, ape, round_scale, codes, scales)
KPOOL_SIGNATURE(COMPRESS_TO_ROWS, Buf, Buf, Buf, bool, bool, Buf, Buf)
KPOOL_SIGNATURE(COMPRESS_TO_ROWS_WORDS, Buf, Buf, Buf, bool, bool, Buf, Buf)
// (key, gate_score, tslot, pool_size, tail)
KPOOL_SIGNATURE(SEED_TAIL, Buf, Buf, Buf, int32_t, Buf)
// (tail, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions,
// round_scale, cache codes, cache scales[, tail out])
KPOOL_SIGNATURE(DECODE_WRITE_CACHE, Buf, Buf, Buf, Buf, Buf, Buf, Buf, bool, Buf, Buf)
KPOOL_SIGNATURE(DECODE_UPDATE, Buf, Buf, Buf, Buf, Buf, Buf, Buf, bool, Buf, Buf, Buf)
KPOOL_SIGNATURE(DECODE_UPDATE_BY_REQUEST, Buf, Buf, Buf, Buf, Buf, Buf, Buf, bool, Buf, Buf, Buf)
// (tail, tail_slot_mapping, key, slot_score, ape, slot_mapping, positions,
// query_start_loc, max_query_len, round_scale, cache codes, cache scales, tail out)
KPOOL_SIGNATURE(DECODE_UPDATE_RAGGED, Buf, Buf, Buf, Buf, Buf, Buf, Buf, Buf, int32_t, bool, Buf, Buf, Buf)
KPOOL_SIGNATURE(DECODE_UPDATE_RAGGED_BY_REQUEST, Buf, Buf, Buf, Buf, Buf, Buf, Buf, Buf, int32_t, bool, Buf, Buf, Buf)
// (tail_slot_mapping, key, slot_score, positions, tail)
KPOOL_SIGNATURE(DECODE_STASH_TAIL, Buf, Buf, Buf, Buf, Buf)
// (pool_ids, groups, seq_lens, pool_size, bound_pool_ids, out)
KPOOL_SIGNATURE(EXPAND_POOLS_AND_APPEND_TAIL, Buf, int32_t, Buf, int32_t, bool, Buf)
// (group_ids, group_valid, page_table, topk_offsets, token_map, pool_size, out)
KPOOL_SIGNATURE(EXPAND_POOLS_TO_TOKENS, Buf, Buf, Buf, Buf, int32_t, int32_t, Buf)
// (topk_result, history_cols, seq_lens, pool_lens, page_table, topk_offsets, token_map, pool_size, out)
KPOOL_SIGNATURE(APPEND_TAIL_TO_TOPK, Buf, int32_t, Buf, Buf, Buf, Buf, int32_t, int32_t, Buf)
// (index, enabled, limit, mark)
KPOOL_SIGNATURE(INDEX_CHECK, Buf, Buf, int64_t, Buf)
#undef KPOOL_SIGNATURE

// What a built variant is for (the dispatch table's keys).
struct VariantKey {
    Family family;
    Kernel kind;
    int pool_size;
    ElementType type;
    Arithmetic arithmetic;
};

using AnyKernel = void (*)();
// The variant's function for the key (an `any` variant serves either
// arithmetic asked for), or NULL when none was built.
AnyKernel find_kernel(const VariantKey &key);
// Every variant built for `family`.
std::vector<VariantKey> variants_of(Family family);

// find_kernel, or `unsupported` naming `op` when this build has no such
// variant.
AnyKernel require_kernel(const VariantKey &key, const char *op);

// Turns a Halide error return into an error status (with the message the
// Halide runtime reported on this thread during the call, and only then).
void check_halide(int result, const char *op);

// While one lives, its thread runs a CPU kernel on Halide's thread pool. A
// fork waits for the running ones and shuts the pool down first (a child
// inherits the pool's state but not its worker threads, and would run every
// kernel on one thread): parent and child each start a new pool at their
// next CPU kernel (the handlers are installed when the library loads).
class HostPoolUse {
public:
    HostPoolUse();
    ~HostPoolUse();
    HostPoolUse(const HostPoolUse &) = delete;
    HostPoolUse &operator=(const HostPoolUse &) = delete;
};

}  // namespace kpool::rt
