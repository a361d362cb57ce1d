/* kpool — ahead-of-time Halide kernels for the key-pooling sparse-attention
 * indexer. Plain C API; kpool.hpp is the C++ wrapper, and the kpool
 * repository's README.md and docs/behaviour.md describe the behaviour.
 *
 * Every entry point takes tensor descriptors that the caller owns (data
 * pointer, dtype, shape, strides in elements, device), validates all of them
 * before any byte is written, and returns a status code. When `status` is not
 * NULL it receives the code and a message that names the offending argument
 * and value, e.g. "loc[17] = 8192 is outside the cache (4096 slots)".
 *
 * Outputs are preallocated by the caller; nothing is allocated or copied.
 */
#ifndef KPOOL_KPOOL_H
#define KPOOL_KPOOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KPOOL_HEAD_DIM 128
/* Pool sizes are powers of two up to this; every one has a variant on the
 * CPU and on every CUDA family built. */
#define KPOOL_MAX_POOL_SIZE 64
/* Bytes of one slot of the paged K cache, uint8 [num_blocks, block_size,
 * KPOOL_CACHE_ROW_BYTES]: a page holds its slots' e4m3 codes (KPOOL_HEAD_DIM
 * bytes each), then their f32 scales (4 bytes each). */
#define KPOOL_CACHE_ROW_BYTES (KPOOL_HEAD_DIM + 4)
#define KPOOL_MAX_DIMS 4
#define KPOOL_MESSAGE_SIZE 512

typedef enum kpool_status_code {
    KPOOL_OK = 0,
    KPOOL_ERROR_INVALID_ARGUMENT = 1, /* shape, dtype, stride or parameter */
    KPOOL_ERROR_OUT_OF_RANGE = 2,     /* an index input addresses outside its cache */
    KPOOL_ERROR_UNSUPPORTED = 3,      /* valid, but no kernel variant was built for it */
    KPOOL_ERROR_DEVICE = 4,           /* the device or its driver failed */
    KPOOL_ERROR_INTERNAL = 5
} kpool_status_code;

typedef enum kpool_dtype {
    KPOOL_DTYPE_UINT8 = 0,
    KPOOL_DTYPE_BOOL = 1, /* one byte, 0 or 1 */
    KPOOL_DTYPE_INT32 = 2,
    KPOOL_DTYPE_INT64 = 3,
    KPOOL_DTYPE_BFLOAT16 = 4,
    KPOOL_DTYPE_FLOAT32 = 5,
    KPOOL_DTYPE_FLOAT8_E4M3FN = 6
} kpool_dtype;

typedef enum kpool_device_type {
    KPOOL_DEVICE_CPU = 0,
    KPOOL_DEVICE_CUDA = 1
} kpool_device_type;

typedef struct kpool_tensor {
    void *data;               /* host pointer, or CUDA device pointer */
    kpool_dtype dtype;
    int32_t ndim;
    int64_t shape[KPOOL_MAX_DIMS];
    int64_t strides[KPOOL_MAX_DIMS]; /* in elements, outermost first */
    kpool_device_type device;
    int32_t device_index;
} kpool_tensor;

typedef struct kpool_status {
    kpool_status_code code;
    /* decode only: pool completions that had slot_mapping >= 0 but no tail
     * block (tail_slot < 0); they write nothing (the reference would read
     * another request's tail block 0). */
    int64_t skipped_completions;
    char message[KPOOL_MESSAGE_SIZE];
} kpool_status;

/* The arithmetic of the softmax pool's approximate steps (compress and
 * decode: its exp, its weighted sums and its division). Every other step is
 * exact in all of them.
 * - KPOOL_ARITHMETIC_DEFAULT (0, what a zeroed or NULL exec asks for): TRITON
 *   on CUDA tensors, EXACT on the CPU. Engines get the reference's bytes on
 *   the GPU, and the CPU (which has no such instructions) the contract's.
 * - KPOOL_ARITHMETIC_EXACT: the contract, a correctly rounded exp and IEEE
 *   division; CPU and GPU kernels agree bit for bit.
 * - KPOOL_ARITHMETIC_TRITON: the instructions of the Triton reference's PTX
 *   (exp as ex2.approx.f32 of x * log2(e), fma-accumulated weighted sums,
 *   div.full.f32), CUDA tensors only: bit for bit with the reference on the
 *   same GPU, and faster. It differs from EXACT in about 0.1-0.2% of pools,
 *   in a few of their codes. */
typedef enum kpool_arithmetic {
    KPOOL_ARITHMETIC_DEFAULT = 0,
    KPOOL_ARITHMETIC_EXACT = 1,
    KPOOL_ARITHMETIC_TRITON = 2
} kpool_arithmetic;

/* The write-index arguments a device call checks in its kernels, each the
 * index of its word in kpool_exec.index_errors. */
typedef enum kpool_index_arg {
    KPOOL_INDEX_LOC = 0,               /* compress: loc (write-masked-out pools aside) */
    KPOOL_INDEX_TSLOT = 1,             /* seed: tslot */
    KPOOL_INDEX_SLOT_MAPPING = 2,      /* decode, compress_tokens: slot_mapping */
    KPOOL_INDEX_TAIL_SLOT_MAPPING = 3, /* decode, compress_tokens: tail_slot_mapping */
    KPOOL_INDEX_ARGS = 4
} kpool_index_arg;

/* Per-call execution options. `stream` is a CUstream / cudaStream_t for CUDA
 * tensors (NULL = the legacy default stream) and ignored on the CPU. A NULL
 * exec means the legacy default stream, KPOOL_ARITHMETIC_DEFAULT and no
 * index_errors.
 *
 * index_errors (optional): KPOOL_INDEX_ARGS int32 words in device memory on
 * the tensors' device, zeroed by the caller (or kpool_check_index_errors).
 * Host calls reject an out-of-range index before anything runs. A device
 * call cannot (its indices are in device memory): its kernels skip every
 * write whose index lies outside the tensor, and with index_errors set the
 * call also sets word kpool_index_arg to 1 for each argument that had such
 * an index (a non-negative loc, tslot, slot_mapping or tail_slot_mapping
 * outside its cache), on the call's stream: no copy and no synchronization,
 * so calls stay CUDA-graph capturable. Words are only ever set, so calls on
 * several streams may share them. Read them with kpool_check_index_errors,
 * or directly. */
typedef struct kpool_exec {
    void *stream;
    int32_t arithmetic; /* a kpool_arithmetic; other values are rejected */
    int32_t *index_errors;
} kpool_exec;

/* Names of codes and dtypes, for messages. */
const char *kpool_status_name(kpool_status_code code);
const char *kpool_dtype_name(kpool_dtype dtype);
/* Bytes per element of a dtype (bool and e4m3 take one); 0 for an unknown one. */
int32_t kpool_dtype_size(kpool_dtype dtype);
/* "kpool 0.1.0 (cpu[, cuda])": what this build can run. */
const char *kpool_version(void);

/* Builds a row-major (C-contiguous) descriptor. */
kpool_tensor kpool_tensor_contiguous(void *data, kpool_dtype dtype, int32_t ndim,
                                     const int64_t *shape);

/* 1. q: bf16 [rows, 128] -> q_fp8: e4m3 (or uint8) [rows, 128],
 *    q_scale: f32 [rows, 1] or [rows]. */
kpool_status_code kpool_fwht128_quant_fp8(const kpool_tensor *q, const kpool_tensor *q_fp8,
                                          const kpool_tensor *q_scale, const kpool_exec *exec,
                                          kpool_status *status);

/* 2. Softmax-pool P tokens, rotate, quantize, and write one cache row per pool.
 *    kv_cache: uint8 [num_blocks, block_size, 132] as planar pages: page p
 *    holds its block_size slots' 128 e4m3 codes (slot s at byte
 *    p * stride0 + s * 128), then their f32 scales (slot s at byte
 *    p * stride0 + block_size * 128 + s * 4); cache slot (loc) s of the
 *    whole cache is page s / block_size, slot s % block_size. The page
 *    stride is free, a multiple of 4 bytes. May be NULL when write_cache == 0. slot_k: bf16 [n, P, 128];
 *    slot_score: bf16 or f32 [n, P, 128]; ape: f32 [P, 128]; loc: int64 [n];
 *    write_mask: bool/uint8 [n] or NULL. compressed_k (e4m3/uint8 [n, 128]) and
 *    compressed_scale (f32 [n]) are both given for return_compressed, or both
 *    NULL; write_mask together with them is rejected. */
kpool_status_code kpool_compress_and_write_cache(
    const kpool_tensor *kv_cache, const kpool_tensor *slot_k, const kpool_tensor *slot_score,
    const kpool_tensor *ape, const kpool_tensor *loc, const kpool_tensor *write_mask,
    const kpool_tensor *compressed_k, const kpool_tensor *compressed_scale, int32_t pool_size,
    int32_t head_dim, int32_t round_scale, int32_t write_cache, const kpool_exec *exec,
    kpool_status *status);

/* 2b. The prefill insert on the tokens as an engine holds them: every pool a
 *    token completes, compressed from the tokens in place, in one launch.
 *    key: bf16 [n, 128], gate_score: bf16 or f32 [n, 128] (rows of any
 *    stride, e.g. column slices of a fused projection); slot_mapping: int32
 *    or int64 [n], pool-granular: token i >= P-1 with slot_mapping[i] >= 0
 *    compresses tokens i-P+1 .. i (the rows before it, whatever request
 *    they belong to: the engine marks only a pool's last token) into cache
 *    slot slot_mapping[i]; other tokens write nothing. kv_cache and ape as
 *    in 2. With tail_kv_cache and tail_slot_mapping (both or neither) the
 *    call also seeds the tail ring from the same tokens, exactly as
 *    kpool_seed_tail_cache(tail_kv_cache, key, gate_score,
 *    tail_slot_mapping) would (gate_score then bf16), in the same launch
 *    where the call is one launch (on CUDA: rows of 16-byte-aligned data
 *    and strides, slot_mapping of tail_slot_mapping's dtype, buffers below
 *    the 32-bit offsets; else a second launch). The same bytes as the
 *    engine's sequence: write_mask = (slot_mapping >= 0) & (i >= P-1),
 *    key / gate_score gathered into [n, P, 128] pools, compress, seed.
 *    With positions ([n], the dtype of slot_mapping and tail_slot_mapping,
 *    which it needs), a chunk may start inside a pool: token i completes the
 *    pool of positions p-P+1 .. p (p = positions[i], p % P == P-1,
 *    slot_mapping[i] >= 0, a tail block), each member from the row holding
 *    that position in the same tail block, else from the tail ring (an
 *    earlier chunk's seed), as decode reads it; then the seed. */
kpool_status_code kpool_compress_tokens_and_write_cache(
    const kpool_tensor *kv_cache, const kpool_tensor *key, const kpool_tensor *gate_score,
    const kpool_tensor *ape, const kpool_tensor *slot_mapping, const kpool_tensor *tail_kv_cache,
    const kpool_tensor *tail_slot_mapping, const kpool_tensor *positions, int32_t pool_size,
    int32_t head_dim, int32_t round_scale, const kpool_exec *exec, kpool_status *status);

/* 3. Copy each request's last P prefill tokens into its tail ring.
 *    tail_kv_cache: bf16 [num_blocks, 2, RING, 128] with strides
 *    (block, half, 128, 1): half 0 the keys, half 1 the gate scores, RING a
 *    multiple of P; key, gate_score: bf16 [n, 128]; tslot: int32 or int64
 *    [n], tslot = block * RING + position % RING, negative = padding. Token i
 *    is seeded when it is among its request's last P (tslot[i + P] is in
 *    another block, negative, or past n). */
kpool_status_code kpool_seed_tail_cache(const kpool_tensor *tail_kv_cache, const kpool_tensor *key,
                                        const kpool_tensor *gate_score, const kpool_tensor *tslot,
                                        int32_t pool_size, int32_t head_dim,
                                        const kpool_exec *exec, kpool_status *status);

/* 4. One decode step of B requests x N tokens, in token order per request.
 *    kv_cache: uint8 [num_blocks, block_size, 132], the planar pages of 2;
 *    tail_kv_cache: bf16 [num_tail_blocks, 2, RING, 128] as in 3 (half 0
 *    the keys, half 1 the scores; RING a multiple of P);
 *    tail_slot_mapping, slot_mapping, positions: int32 or int64 [B, N], all
 *    three of one dtype; key, slot_score: bf16 [B, N, 128]; ape: f32 [P, 128].
 *    Token (b, i) with position >= 0 and tail slot t >= 0 is stashed in
 *    ring position position % RING of tail block t / RING; one that
 *    completes a pool (position % P == P - 1) with slot_mapping >= 0
 *    compresses the pool (its P - 1 predecessors from the ring, itself from
 *    key / slot_score) into cache slot slot_mapping. Negative values write
 *    nothing. */
kpool_status_code kpool_decode_update_and_maybe_write_cache_batched(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache,
    const kpool_tensor *tail_slot_mapping, const kpool_tensor *key, const kpool_tensor *slot_score,
    const kpool_tensor *ape, const kpool_tensor *slot_mapping, const kpool_tensor *positions,
    int32_t pool_size, int32_t head_dim, int32_t round_scale, const kpool_exec *exec,
    kpool_status *status);

/* 4b. The same step on the tokens as an engine holds them for a ragged batch
 *    (plain decode mixed with speculative verify): T tokens flat, request r's
 *    at query_start_loc[r] .. query_start_loc[r + 1] - 1 in position order,
 *    one launch, no host synchronization on a device.
 *    key, slot_score: bf16 [T, 128]; tail_slot_mapping, slot_mapping,
 *    positions: [T], query_start_loc: [B + 1], all four int32 or int64 of one
 *    dtype; kv_cache, tail_kv_cache, ape as in 4. Tokens outside every
 *    request do nothing. max_query_len bounds every request's token count
 *    (the device kernels run a grid of max_query_len tokens per request);
 *    0 means T. The bytes of the batched call on the engine's padded
 *    [B, max] grid (key and score 0, every index -1 past a request's count).
 *    Host calls reject offsets that decrease, are negative or pass T, and a
 *    request longer than max_query_len; a device call cannot see them (they
 *    are in device memory): there an offset outside [0, T] is clamped into
 *    it, a request whose offsets decrease is empty, and a request runs its
 *    first max_query_len tokens. */
kpool_status_code kpool_decode_update_and_maybe_write_cache_ragged(
    const kpool_tensor *kv_cache, const kpool_tensor *tail_kv_cache,
    const kpool_tensor *tail_slot_mapping, const kpool_tensor *key, const kpool_tensor *slot_score,
    const kpool_tensor *ape, const kpool_tensor *slot_mapping, const kpool_tensor *positions,
    const kpool_tensor *query_start_loc, int32_t max_query_len, int32_t pool_size, int32_t head_dim,
    int32_t round_scale, const kpool_exec *exec, kpool_status *status);

/* 5. pool_ids: int32/int64 [rows, G]; seq_lens: int32 [rows];
 *    out: int32 [rows, G*P + P-1]. With bound_pool_ids != 0, ids >=
 *    seq_len / P are treated as -1 (off in the reference). A negative
 *    seq_len has no tail (-1), as in the reference. */
kpool_status_code kpool_expand_pools_and_append_tail(const kpool_tensor *pool_ids,
                                                     const kpool_tensor *seq_lens,
                                                     const kpool_tensor *out, int32_t pool_size,
                                                     int32_t bound_pool_ids,
                                                     const kpool_exec *exec,
                                                     kpool_status *status);

/* 6. group_ids: int32/int64 [rows, topk/P]; group_valid: bool [rows, topk/P];
 *    page_table: int32 [R >= rows, W] (rows past `rows` are not read) or
 *    NULL; topk_offsets: int64 [rows] or
 *    [rows, 1] or NULL (not both); out: int32 [rows, topk]. */
kpool_status_code kpool_expand_pools_to_tokens(const kpool_tensor *group_ids,
                                               const kpool_tensor *group_valid,
                                               const kpool_tensor *page_table,
                                               const kpool_tensor *topk_offsets,
                                               const kpool_tensor *out, int32_t topk,
                                               int32_t pool_size, const kpool_exec *exec,
                                               kpool_status *status);

/* 7. topk_result: int32 [rows, C]; seq_lens, pool_lens: int32 [rows];
 *    page_table / topk_offsets as in 6; out: int32 [rows, C + P-1]
 *    (with P == 1 out is a copy of topk_result). */
kpool_status_code kpool_append_tail_to_topk(const kpool_tensor *topk_result,
                                            const kpool_tensor *seq_lens,
                                            const kpool_tensor *pool_lens,
                                            const kpool_tensor *page_table,
                                            const kpool_tensor *topk_offsets,
                                            const kpool_tensor *out, int32_t pool_size,
                                            const kpool_exec *exec, kpool_status *status);

/* Loads every CUDA kernel variant of this build into device `device_index`
 * (its primary context) and runs each once on tiny inputs in kpool's own
 * scratch memory, on exec->stream (NULL exec: the legacy default stream),
 * then synchronizes that stream. Without it the first call of each variant
 * loads its module, and the driver JIT-compiles its PTX (milliseconds): call
 * it once per device before serving and before capturing CUDA graphs: a
 * call that would load a module (or initialize the device) while its stream
 * is capturing returns KPOOL_ERROR_DEVICE naming kpool_cuda_warm_up instead
 * of breaking the capture. Thread-safe, each device on its own (devices
 * warm up side by side); after its first success on a device it returns at
 * once. exec->arithmetic and exec->index_errors are ignored (every
 * arithmetic is warmed up). In a process forked after CUDA was initialized,
 * this and every CUDA call return KPOOL_ERROR_DEVICE naming the fork. */
kpool_status_code kpool_cuda_warm_up(int32_t device_index, const kpool_exec *exec,
                                     kpool_status *status);

/* Which image of kpool's CUDA kernels device `device_index` has loaded: the
 * GPU family whose kernels it runs, and how many kernel modules it loaded so
 * far as the SASS embedded in the build (assembled for the family's PTX
 * target: no JIT) and how many it JIT-compiled from their PTX (a GPU the SASS
 * does not fit, a driver older than the build's ptxas, or, in a build with
 * KPOOL_MEASUREMENT_HOOKS, $KPOOL_CUDA_IMAGE=ptx). Modules load at a variant's first call, or all at
 * once in kpool_cuda_warm_up. */
typedef struct kpool_cuda_images {
    char family[16];
    int32_t sass_fits; /* 1: the family's SASS is of this GPU's architecture */
    int32_t sass_modules;
    int32_t ptx_jit_modules;
} kpool_cuda_images;
kpool_status_code kpool_cuda_loaded_images(int32_t device_index, kpool_cuda_images *images,
                                           kpool_status *status);

/* Reads exec->index_errors back from CUDA device `device_index` (on
 * exec->stream, which it synchronizes), zeroes the words, and returns KPOOL_OK
 * when none was set, else KPOOL_ERROR_OUT_OF_RANGE with a message naming
 * every argument that had an out-of-range index since the last check. */
kpool_status_code kpool_check_index_errors(int32_t device_index, const kpool_exec *exec,
                                           kpool_status *status);

/* topk / P, the number of pools to select: any pool_size >= 1 (arithmetic,
 * no kernel); rejects topk % P != 0. */
kpool_status_code kpool_history_group_budget_for_topk(int64_t topk, int32_t pool_size,
                                                      int64_t *groups, kpool_status *status);

#ifdef __cplusplus
}
#endif

#endif /* KPOOL_KPOOL_H */
