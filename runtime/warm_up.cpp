// Every CUDA variant of the build, run once through its op on tiny
// tensors in kpool's own scratch memory: the first call of a Halide pipeline
// on a context loads its module (the build's SASS, or its PTX JIT-compiled by
// the driver: runtime/cuda_module_loader.cpp), which costs milliseconds and must not happen inside a CUDA-graph capture.
// Each kernel kind of the op table names its call here (ops/*.toml: warm_up).
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_device.h"
#include "cuda_module_loader.h"
#include "dispatch.h"
#include "errors.h"
#include "ops/decode_layouts.h"
#include "ops/ops.h"
#include "validate.h"

namespace kpool::rt {

namespace {

constexpr size_t kScratchBytes = 256 << 10;
constexpr int64_t kAlign = 256;

// Contiguous device tensors carved one after another out of the scratch
// memory, all zero bytes: every index is 0 and addresses a slot of its
// tensor, every position 0, so each kernel runs its real path on one row.
class ScratchTensors {
public:
    ScratchTensors(const CudaDevice &device, uint8_t *base) : device_(device), base_(base) {}

    kpool_tensor operator()(kpool_dtype dtype, std::vector<int64_t> shape) {
        int64_t bytes = element_bytes(dtype);
        for (int64_t n : shape) bytes *= n;
        if (used_ + bytes > static_cast<int64_t>(kScratchBytes) - kAlign) {  // the last kAlign: the words
            throw internal_error() << "warm-up: scratch memory too small";
        }
        kpool_tensor t = contiguous_tensor(base_ + used_, dtype, static_cast<int32_t>(shape.size()), shape.data());
        t.device = KPOOL_DEVICE_CUDA;
        t.device_index = device_.index;
        used_ += (bytes + kAlign - 1) / kAlign * kAlign;
        return t;
    }

private:
    const CudaDevice &device_;
    uint8_t *base_;
    int64_t used_ = 0;
};

kpool_dtype index_dtype(ElementType type) {
    return type == ElementType::int64 ? KPOOL_DTYPE_INT64 : KPOOL_DTYPE_INT32;
}

// One op call per kind of kernel that runs a variant `v` of it (and whatever
// else the op launches with it: the CPU's decode pair, the index checks with
// `exec`'s words), each named by its kinds' warm_up in the op table.
#define KPOOL_WARM_UP(call) \
    void call([[maybe_unused]] const VariantKey &v, ScratchTensors &tensor, const kpool_exec &exec)
constexpr int32_t D = KPOOL_HEAD_DIM;
int pool_size_of(const VariantKey &v) { return v.pool_size > 0 ? v.pool_size : 4; }

KPOOL_WARM_UP(warm_up_fwht) {
    // Scratch tensors are word-aligned (the words kernel); one element
    // in, they are not (the element kernel).
    kpool_tensor q = tensor(KPOOL_DTYPE_BFLOAT16, {1, D + 1});
    const kpool_tensor codes = tensor(KPOOL_DTYPE_UINT8, {1, D}), scale = tensor(KPOOL_DTYPE_FLOAT32, {1});
    q.shape[1] = D;
    if (v.kind == Kernel::FWHT) {
        q.data = static_cast<uint16_t *>(q.data) + 1;
    }
    fwht128_quant_fp8(&q, &codes, &scale, &exec);
}

KPOOL_WARM_UP(warm_up_compress) {
    const int P = pool_size_of(v);
    const bool to_cache = v.kind == Kernel::COMPRESS_TO_CACHE || v.kind == Kernel::COMPRESS_TO_CACHE_WORDS;
    const bool words = v.kind == Kernel::COMPRESS_TO_CACHE_WORDS || v.kind == Kernel::COMPRESS_TO_ROWS_WORDS;
    const kpool_dtype score_dtype = v.type == ElementType::f32 ? KPOOL_DTYPE_FLOAT32 : KPOOL_DTYPE_BFLOAT16;
    const kpool_tensor cache = tensor(KPOOL_DTYPE_UINT8, {1, 1, KPOOL_CACHE_ROW_BYTES}),
                       s = tensor(score_dtype, {1, P, D}),
                       ape = tensor(KPOOL_DTYPE_FLOAT32, {P, D}), loc = tensor(KPOOL_DTYPE_INT64, {1}),
                       codes = tensor(KPOOL_DTYPE_UINT8, {1, D}), scale = tensor(KPOOL_DTYPE_FLOAT32, {1});
    // Scratch tensors are 16-byte aligned (the words kernels); keys one
    // element in, with odd rows, are not (the element kernels).
    kpool_tensor keys = tensor(KPOOL_DTYPE_BFLOAT16, {1, P, words ? D : D + 1});
    if (!words) {
        keys.shape[2] = D;
        keys.data = static_cast<uint16_t *>(keys.data) + 1;
    }
    compress_and_write_cache(&cache, &keys, &s, &ape, &loc, nullptr, to_cache ? nullptr : &codes,
                             to_cache ? nullptr : &scale, P, D, 1, to_cache, &exec);
}

KPOOL_WARM_UP(warm_up_compress_tokens) {
    const int P = pool_size_of(v);
    // The prefill insert on P tokens with an int32 slot_mapping: one pool.
    const bool words = v.kind == Kernel::COMPRESS_TO_CACHE_WORDS_I32;
    const kpool_dtype score_dtype = v.type == ElementType::f32 ? KPOOL_DTYPE_FLOAT32 : KPOOL_DTYPE_BFLOAT16;
    const kpool_tensor cache = tensor(KPOOL_DTYPE_UINT8, {1, 1, KPOOL_CACHE_ROW_BYTES}),
                       gate = tensor(score_dtype, {P, D}), ape = tensor(KPOOL_DTYPE_FLOAT32, {P, D}),
                       slots = tensor(KPOOL_DTYPE_INT32, {P});
    kpool_tensor keys = tensor(KPOOL_DTYPE_BFLOAT16, {P, words ? D : D + 1});
    if (!words) {  // rows one element in, of odd stride: not word-aligned
        keys.shape[1] = D;
        keys.data = static_cast<uint16_t *>(keys.data) + 1;
    }
    compress_tokens_and_write_cache(&cache, &keys, &gate, &ape, &slots, nullptr, nullptr, nullptr, P, D, 1, &exec);
}

KPOOL_WARM_UP(warm_up_compress_tokens_with_seed) {
    const int P = pool_size_of(v);
    // The prefill insert with the seed on P word-aligned tokens, indices of
    // the kind's type: the pools and the seed in one launch, or with
    // positions the completions from the ring, then the seed.
    const kpool_dtype index = index_dtype(v.type);
    const kpool_tensor cache = tensor(KPOOL_DTYPE_UINT8, {1, 1, KPOOL_CACHE_ROW_BYTES}),
                       keys = tensor(KPOOL_DTYPE_BFLOAT16, {P, D}), gate = tensor(KPOOL_DTYPE_BFLOAT16, {P, D}),
                       ape = tensor(KPOOL_DTYPE_FLOAT32, {P, D}), tail = tensor(KPOOL_DTYPE_BFLOAT16, {1, 2, P, D}),
                       slots = tensor(index, {P}), tail_slots = tensor(index, {P}), positions = tensor(index, {P});
    const bool from_ring = v.kind == Kernel::COMPRESS_TOKENS_FROM_RING;
    compress_tokens_and_write_cache(&cache, &keys, &gate, &ape, &slots, &tail, &tail_slots,
                                    from_ring ? &positions : nullptr, P, D, 1, &exec);
}

// The layout a decode kind's warm-up call is run in (the rule's, for the
// kinds that have none of their own).
DecodeLayoutChoice decode_layout_of(Kernel kind) {
    switch (kind) {
    case Kernel::DECODE_UPDATE:
    case Kernel::DECODE_UPDATE_RAGGED:
        return DecodeLayoutChoice::warp_per_token;
    case Kernel::DECODE_UPDATE_BY_REQUEST:
    case Kernel::DECODE_UPDATE_RAGGED_BY_REQUEST:
        return DecodeLayoutChoice::warp_per_request;
    case Kernel::DECODE_UPDATE_BY_BLOCK:
    case Kernel::DECODE_UPDATE_RAGGED_BY_BLOCK:
        return DecodeLayoutChoice::block_per_request;
    default:
        return DecodeLayoutChoice::rule;
    }
}

KPOOL_WARM_UP(warm_up_decode) {
    const int P = pool_size_of(v);
    // At least two tokens, so every token loop runs; 64 tokens of one
    // request take the warp-per-token layout where the family runs it
    // (decode.cpp); without a K cache a call only stashes (decode_stash_tail);
    // a cache of two pages launched a page at a time takes the
    // completions kernel of a cache in windows (decode_write_cache).
    const int64_t N = v.kind == Kernel::DECODE_UPDATE ? 64 : 2;
    const int64_t blocks = v.kind == Kernel::DECODE_STASH_TAIL ? 0 : v.kind == Kernel::DECODE_WRITE_CACHE ? 2 : 1;
    const ScopedDecodeLayout layout(decode_layout_of(v.kind));
    const ScopedLaunchSpan span(v.kind == Kernel::DECODE_WRITE_CACHE ? KPOOL_CACHE_ROW_BYTES : 0);
    const kpool_dtype index = index_dtype(v.type);
    const kpool_tensor cache = tensor(KPOOL_DTYPE_UINT8, {blocks, 1, KPOOL_CACHE_ROW_BYTES}),
                       tail = tensor(KPOOL_DTYPE_BFLOAT16, {1, 2, P, D}), tsm = tensor(index, {1, N}),
                       key = tensor(KPOOL_DTYPE_BFLOAT16, {1, N, D}), score = tensor(KPOOL_DTYPE_BFLOAT16, {1, N, D}),
                       ape = tensor(KPOOL_DTYPE_FLOAT32, {P, D}), sm = tensor(index, {1, N}),
                       pos = tensor(index, {1, N});
    decode_update_and_maybe_write_cache_batched(&cache, &tail, &tsm, &key, &score, &ape, &sm, &pos, P, D, 1,
                                                &exec);
}

KPOOL_WARM_UP(warm_up_ragged_decode) {
    const int P = pool_size_of(v);
    // One request of two tokens; 64 take the warp-per-token layout
    // where the family runs it (decode.cpp).
    const int64_t T = v.kind == Kernel::DECODE_UPDATE_RAGGED ? 64 : 2;
    const ScopedDecodeLayout layout(decode_layout_of(v.kind));
    const kpool_dtype index = index_dtype(v.type);
    const kpool_tensor cache = tensor(KPOOL_DTYPE_UINT8, {1, 1, KPOOL_CACHE_ROW_BYTES}),
                       tail = tensor(KPOOL_DTYPE_BFLOAT16, {1, 2, P, D}), tsm = tensor(index, {T}),
                       key = tensor(KPOOL_DTYPE_BFLOAT16, {T, D}), score = tensor(KPOOL_DTYPE_BFLOAT16, {T, D}),
                       ape = tensor(KPOOL_DTYPE_FLOAT32, {P, D}), sm = tensor(index, {T}),
                       pos = tensor(index, {T}), offsets = tensor(index, {2});
    decode_update_and_maybe_write_cache_ragged(&cache, &tail, &tsm, &key, &score, &ape, &sm, &pos, &offsets,
                                               static_cast<int32_t>(T), P, D, 1, &exec);
}

// The index check runs inside a call with an index of its type: seed's tslot
KPOOL_WARM_UP(warm_up_seed) {
    const int P = pool_size_of(v);
    const kpool_tensor tail = tensor(KPOOL_DTYPE_BFLOAT16, {1, 2, P, D}), key = tensor(KPOOL_DTYPE_BFLOAT16, {1, D}),
                       gate = tensor(KPOOL_DTYPE_BFLOAT16, {1, D}), tslot = tensor(index_dtype(v.type), {1});
    seed_tail_cache(&tail, &key, &gate, &tslot, P, D, &exec);
}

KPOOL_WARM_UP(warm_up_expand_and_append) {
    const int P = pool_size_of(v);
    const kpool_tensor ids = tensor(index_dtype(v.type), {1, 1}), seq = tensor(KPOOL_DTYPE_INT32, {1}),
                       out = tensor(KPOOL_DTYPE_INT32, {1, 2 * P - 1});
    expand_pools_and_append_tail(&ids, &seq, &out, P, 0, &exec);
}

KPOOL_WARM_UP(warm_up_expand_to_tokens) {
    const int P = pool_size_of(v);
    const kpool_tensor ids = tensor(index_dtype(v.type), {1, 1}), valid = tensor(KPOOL_DTYPE_BOOL, {1, 1}),
                       out = tensor(KPOOL_DTYPE_INT32, {1, P});
    expand_pools_to_tokens(&ids, &valid, nullptr, nullptr, &out, P, P, &exec);
}

KPOOL_WARM_UP(warm_up_append_tail) {
    const int P = pool_size_of(v);
    const kpool_tensor topk = tensor(KPOOL_DTYPE_INT32, {1, 1}), seq = tensor(KPOOL_DTYPE_INT32, {1}),
                       pools = tensor(KPOOL_DTYPE_INT32, {1}), out = tensor(KPOOL_DTYPE_INT32, {1, P});
    append_tail_to_topk(&topk, &seq, &pools, nullptr, nullptr, &out, P, &exec);
}
#undef KPOOL_WARM_UP

void run_variant(const VariantKey &v, ScratchTensors &tensor, const kpool_exec &exec) {
#define KPOOL_WARM_UP_CASE(kind, call) \
    case Kernel::kind: return call(v, tensor, exec);
    switch (v.kind) {
        KPOOL_FOR_EACH_WARM_UP(KPOOL_WARM_UP_CASE)
    default: break;  // (kinds the CPU alone runs)
    }
#undef KPOOL_WARM_UP_CASE
    throw internal_error() << "warm-up: no call runs kernel kind " << static_cast<int>(v.kind);
}

}  // namespace

void cuda_warm_up(int32_t device_index, const kpool_exec *call) {
    void *const stream = call != nullptr ? call->stream : nullptr;
    const CudaDevice &device = cuda_device(device_index, "kpool_cuda_warm_up: device_index", stream);
    if (device.loaded.all()) {
        return;
    }
    // Devices warm up side by side; one device's callers wait for its first.
    std::lock_guard<std::mutex> lock(device.warm_up_lock);
    if (device.loaded.all()) {
        return;
    }
    if (stream_is_capturing(device, stream)) {
        throw device_error() << "kpool_cuda_warm_up: the stream is capturing a CUDA graph on cuda:" << device_index
                             << "; the warm-up loads modules, allocates and synchronizes: call it before capturing";
    }
    auto *base = static_cast<uint8_t *>(device_scratch(device, kScratchBytes));
    for (const VariantKey &v : variants_of(device.family)) {
        zero_device_memory(device, base, kScratchBytes, stream);  // the last call's outputs
        ScratchTensors tensor(device, base);
        // Index checks too: the words are scratch, and every index is valid.
        int32_t *words = reinterpret_cast<int32_t *>(base + kScratchBytes - kAlign);
        const kpool_exec exec{
            stream, v.arithmetic == Arithmetic::triton ? KPOOL_ARITHMETIC_TRITON : KPOOL_ARITHMETIC_EXACT, words};
        try {
            run_variant(v, tensor, exec);
        } catch (const std::exception &e) {
            const StatusError error = as_status_error(e);
            throw StatusError(error.code()) << "kpool_cuda_warm_up: the " << name(device.family) << " variant (kind "
                                            << static_cast<int>(v.kind) << ", pool_size " << v.pool_size << ", "
                                            << name(v.type) << ", " << name(v.arithmetic) << ") failed: " << error.what();
        }
    }
    synchronize_stream(device, stream);
    device.loaded.insert_all();
}

void cuda_loaded_images(int32_t device_index, kpool_cuda_images *images) {
    if (images == nullptr) {
        throw invalid() << "images is NULL";
    }
    const CudaDevice &device = cuda_device(device_index, "kpool_cuda_loaded_images: device_index");
    const LoadedImages loaded = loaded_images(device_index);
    *images = kpool_cuda_images{};
    std::snprintf(images->family, sizeof(images->family), "%s", name(device.family));
    // A family's SASS is assembled for its lowest capability (its row's PTX
    // target): it loads on GPUs of that major version from that minor on.
    int lowest = 0;
#define KPOOL_FAMILY_CAPABILITY(name, capability) \
    if (device.family == Family::name) lowest = capability;
    KPOOL_FOR_EACH_CUDA_FAMILY(KPOOL_FAMILY_CAPABILITY)
#undef KPOOL_FAMILY_CAPABILITY
    images->sass_fits = device.major == lowest / 10 && device.minor >= lowest % 10;
    images->sass_modules = loaded.sass;
    images->ptx_jit_modules = loaded.ptx_jit;
}

}  // namespace kpool::rt
