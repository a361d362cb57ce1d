// kpool for engines built with torch's C++ API (header-only, over kpool.h):
// at::Tensor as kpool_tensor, the current CUDA stream, kpool's errors as
// torch's, the warm-up before graph capture, and every op registered as a
// custom operator in a namespace the engine names:
//
//   #include <kpool/torch.hpp>
//   TORCH_LIBRARY(my_engine_kpool, m) { kpool::torch::register_ops(m); }
//   ...
//   torch.ops.my_engine_kpool.compress_and_write_cache(kv_cache, ...)   # Python
//   kpool::torch::compress_and_write_cache(kv_cache, ...);              // C++
//
// The ops are those of the Python package's torch.ops.kpool, with its
// schemas (writes marked Tensor(a!)), plus an `.out` overload of each op
// that returns new tensors: the same call into the caller's tensors
// (keyword arguments named as the outputs), returning nothing. Each has one kernel for CPU and CUDA tensors
// (kpool picks the device from the tensors) and a Meta kernel (shapes,
// dtypes, no data), which fake tensors run: torch.compile traces the ops
// and CUDA graphs capture them.
//
// No CUDA header is needed: the current stream is read through c10's device
// guard of the tensors' device (torch's CUDA library registers it), so the
// same source builds against a CPU-only or a CUDA torch.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "kpool/kpool.h"

namespace kpool::torch {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

// What a call runs with beyond its arguments (kpool_exec): the arithmetic
// of compress and decode, the device words of out-of-range indices, and
// where decode adds its skipped completions. The ops read the options of
// the innermost ScopedOptions on this thread (none: the defaults).
struct Options {
    kpool_arithmetic arithmetic = KPOOL_ARITHMETIC_DEFAULT;  // kpool.h: triton on CUDA, exact on the CPU
    int32_t *index_errors = nullptr;  // KPOOL_INDEX_ARGS words on the tensors' device, or none
    int64_t *skipped_completions = nullptr;  // decode adds its count here (host memory)
};

namespace detail {
inline thread_local const Options *current_options = nullptr;
}  // namespace detail

// Options for the kpool calls this thread makes while it lives:
//   kpool::torch::ScopedOptions exact({KPOOL_ARITHMETIC_EXACT});
class ScopedOptions {
public:
    explicit ScopedOptions(const Options &options) : options_(options), outer_(detail::current_options) {
        detail::current_options = &options_;
    }
    ~ScopedOptions() { detail::current_options = outer_; }
    ScopedOptions(const ScopedOptions &) = delete;
    ScopedOptions &operator=(const ScopedOptions &) = delete;

private:
    Options options_;
    const Options *outer_;
};

inline const Options &current_options() {
    static const Options defaults;
    return detail::current_options != nullptr ? *detail::current_options : defaults;
}

// --- tensors ---------------------------------------------------------------------

inline kpool_dtype dtype_of(const Tensor &t, const char *name) {
    switch (t.scalar_type()) {
        case at::kByte: return KPOOL_DTYPE_UINT8;
        case at::kBool: return KPOOL_DTYPE_BOOL;
        case at::kInt: return KPOOL_DTYPE_INT32;
        case at::kLong: return KPOOL_DTYPE_INT64;
        case at::kBFloat16: return KPOOL_DTYPE_BFLOAT16;
        case at::kFloat: return KPOOL_DTYPE_FLOAT32;
        case at::kFloat8_e4m3fn: return KPOOL_DTYPE_FLOAT8_E4M3FN;
        default: break;
    }
    TORCH_CHECK_TYPE(false, "kpool: ", name, " has dtype ", t.scalar_type(),
                     ", which no kpool op takes (uint8, bool, int32, int64, bfloat16, float32, float8_e4m3fn)");
}

// The descriptor of a tensor as it lies: its data pointer (storage offset
// included), sizes and strides in elements, and device. kpool checks the
// rest (which dtype, shape and layout each argument takes) and names the
// argument.
inline kpool_tensor tensor(const Tensor &t, const char *name) {
    TORCH_CHECK_VALUE(t.defined(), "kpool: ", name, " is an undefined tensor");
    TORCH_CHECK_VALUE(t.dim() <= KPOOL_MAX_DIMS, "kpool: ", name, " has ", t.dim(), " dims; kpool's tensors have at most ",
                      KPOOL_MAX_DIMS);
    kpool_tensor d{};
    d.data = t.data_ptr();
    d.dtype = dtype_of(t, name);
    d.ndim = static_cast<int32_t>(t.dim());
    for (int64_t i = 0; i < t.dim(); ++i) {
        d.shape[i] = t.size(i);
        d.strides[i] = t.stride(i);
    }
    if (t.is_cuda()) {
        d.device = KPOOL_DEVICE_CUDA;
        d.device_index = t.get_device();
    } else {
        TORCH_CHECK_VALUE(t.is_cpu(), "kpool: ", name, " is on ", t.device(), "; kpool runs on CPU and CUDA tensors");
        d.device = KPOOL_DEVICE_CPU;
        d.device_index = 0;
    }
    return d;
}

// An optional argument: its descriptor, which `pointer()` hands to the C API
// (NULL where absent).
struct OptionalDescriptor {
    std::optional<kpool_tensor> d;
    const kpool_tensor *pointer() const { return d ? &*d : nullptr; }
};
inline OptionalDescriptor tensor(const OptionalTensor &t, const char *name) {
    return t && t->defined() ? OptionalDescriptor{tensor(*t, name)} : OptionalDescriptor{};
}

// The stream kpool launches on for tensors on `device`: torch's current
// stream there (a cudaStream_t), NULL on the CPU.
inline void *current_stream(const at::Device &device) {
    if (!device.is_cuda()) {
        return nullptr;
    }
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
}

inline kpool_exec exec_for(const Tensor &t) {
    const Options &o = current_options();
    return kpool_exec{current_stream(t.device()), o.arithmetic, o.index_errors};
}

// --- errors ----------------------------------------------------------------------

// A rejected call as torch's error of the Python package's kind (in Python:
// TypeError for a dtype, ValueError for another bad argument or an index
// outside its cache, RuntimeError for an unsupported variant or device and
// a device failure), with kpool's message, which names the argument.
inline void check(kpool_status_code code, const kpool_status &s, const char *op) {
    if (code == KPOOL_OK) {
        return;
    }
    if (code == KPOOL_ERROR_INVALID_ARGUMENT && std::strstr(s.message, "dtype") != nullptr) {
        TORCH_CHECK_TYPE(false, "kpool::", op, ": ", s.message);
    }
    TORCH_CHECK_VALUE(code != KPOOL_ERROR_INVALID_ARGUMENT && code != KPOOL_ERROR_OUT_OF_RANGE, "kpool::", op, ": ",
                      s.message);
    TORCH_CHECK(false, "kpool::", op, ": ", s.message, " [", kpool_status_name(code), "]");
}

// A schema's int (int64) as the C API's int32.
inline int32_t int32_arg(int64_t v, const char *name) {
    TORCH_CHECK_VALUE(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(), "kpool: ",
                      name, " = ", v, " is outside int32");
    return static_cast<int32_t>(v);
}

// Loads every CUDA kernel of kpool into `device` and runs each once, on its
// current stream, then synchronizes it (kpool_cuda_warm_up): once per device
// before serving, and before capturing CUDA graphs. Nothing on the CPU.
inline void warm_up(const at::Device &device) {
    if (!device.is_cuda()) {
        return;
    }
    kpool_status s{};
    const kpool_exec e{current_stream(device), KPOOL_ARITHMETIC_DEFAULT, nullptr};
    check(kpool_cuda_warm_up(device.has_index() ? device.index() : 0, &e, &s), s, "warm_up");
}

// --- the ops (the C API's, kpool.h: arguments and layouts) ------------------------
// Out variants (NAME_out) write into the caller's tensors and return
// nothing, as a custom op that writes its arguments must for torch.compile;
// the others allocate their outputs on the inputs' device.

inline void fwht128_quant_fp8_out(const Tensor &q, const Tensor &q_fp8, const Tensor &q_scale) {
    const kpool_tensor tq = tensor(q, "q"), tf = tensor(q_fp8, "q_fp8"), ts = tensor(q_scale, "q_scale");
    const kpool_exec e = exec_for(q);
    kpool_status s{};
    check(kpool_fwht128_quant_fp8(&tq, &tf, &ts, &e, &s), s, "fwht128_quant_fp8");
}

inline std::tuple<Tensor, Tensor> fwht128_quant_fp8_outputs(const Tensor &q) {
    TORCH_CHECK_VALUE(q.dim() == 2, "kpool: q has ", q.dim(), " dims, expected [rows, 128]");
    return {at::empty_symint({q.sym_size(0), KPOOL_HEAD_DIM}, q.options().dtype(at::kFloat8_e4m3fn)),
            at::empty_symint({q.sym_size(0), 1}, q.options().dtype(at::kFloat))};
}

inline std::tuple<Tensor, Tensor> fwht128_quant_fp8(const Tensor &q) {
    auto [q_fp8, q_scale] = fwht128_quant_fp8_outputs(q);
    fwht128_quant_fp8_out(q, q_fp8, q_scale);
    return {q_fp8, q_scale};
}

// compress with return_compressed: rows into compressed_k / compressed_scale
// (and the cache written when write_cache).
inline void compress_to_rows_out(const OptionalTensor &kv_cache, const Tensor &slot_k, const Tensor &slot_score,
                                 const Tensor &ape, const Tensor &loc, const OptionalTensor &write_mask,
                                 int64_t pool_size, int64_t head_dim, bool round_scale, bool write_cache,
                                 const Tensor &compressed_k, const Tensor &compressed_scale) {
    const OptionalDescriptor kv = tensor(write_cache ? kv_cache : OptionalTensor{}, "kv_cache");
    const OptionalDescriptor mask = tensor(write_mask, "write_mask");
    const kpool_tensor k = tensor(slot_k, "slot_k"), sc = tensor(slot_score, "slot_score"), a = tensor(ape, "ape"),
                       l = tensor(loc, "loc"), ck = tensor(compressed_k, "compressed_k"),
                       cs = tensor(compressed_scale, "compressed_scale");
    const kpool_exec e = exec_for(slot_k);
    kpool_status s{};
    check(kpool_compress_and_write_cache(kv.pointer(), &k, &sc, &a, &l, mask.pointer(), &ck, &cs,
                                         int32_arg(pool_size, "pool_size"), int32_arg(head_dim, "head_dim"),
                                         round_scale, write_cache, &e, &s),
          s, "compress_to_rows");
}

inline std::tuple<Tensor, Tensor> compress_to_rows_outputs(const Tensor &slot_k) {
    TORCH_CHECK_VALUE(slot_k.dim() == 3, "kpool: slot_k has ", slot_k.dim(), " dims, expected [n_pools, pool_size, 128]");
    return {at::empty_symint({slot_k.sym_size(0), KPOOL_HEAD_DIM}, slot_k.options().dtype(at::kFloat8_e4m3fn)),
            at::empty_symint({slot_k.sym_size(0)}, slot_k.options().dtype(at::kFloat))};
}

inline std::tuple<Tensor, Tensor> compress_to_rows(const OptionalTensor &kv_cache, const Tensor &slot_k,
                                                   const Tensor &slot_score, const Tensor &ape, const Tensor &loc,
                                                   const OptionalTensor &write_mask, int64_t pool_size,
                                                   int64_t head_dim, bool round_scale, bool write_cache) {
    auto [k, scale] = compress_to_rows_outputs(slot_k);
    compress_to_rows_out(kv_cache, slot_k, slot_score, ape, loc, write_mask, pool_size, head_dim, round_scale,
                         write_cache, k, scale);
    return {k, scale};
}

inline void compress_and_write_cache(const OptionalTensor &kv_cache, const Tensor &slot_k, const Tensor &slot_score,
                                     const Tensor &ape, const Tensor &loc, const OptionalTensor &write_mask,
                                     int64_t pool_size, int64_t head_dim, bool round_scale, bool write_cache) {
    const OptionalDescriptor kv = tensor(write_cache ? kv_cache : OptionalTensor{}, "kv_cache");
    const OptionalDescriptor mask = tensor(write_mask, "write_mask");
    const kpool_tensor k = tensor(slot_k, "slot_k"), sc = tensor(slot_score, "slot_score"), a = tensor(ape, "ape"),
                       l = tensor(loc, "loc");
    const kpool_exec e = exec_for(slot_k);
    kpool_status s{};
    check(kpool_compress_and_write_cache(kv.pointer(), &k, &sc, &a, &l, mask.pointer(), nullptr, nullptr,
                                         int32_arg(pool_size, "pool_size"), int32_arg(head_dim, "head_dim"),
                                         round_scale, write_cache, &e, &s),
          s, "compress_and_write_cache");
}

inline void seed_tail_cache(const Tensor &tail_kv_cache, const Tensor &key, const Tensor &gate_score,
                            const Tensor &tslot, int64_t pool_size, int64_t head_dim) {
    const kpool_tensor t = tensor(tail_kv_cache, "tail_kv_cache"), k = tensor(key, "key"),
                       g = tensor(gate_score, "gate_score"), ts = tensor(tslot, "tslot");
    const kpool_exec e = exec_for(key);
    kpool_status s{};
    check(kpool_seed_tail_cache(&t, &k, &g, &ts, int32_arg(pool_size, "pool_size"), int32_arg(head_dim, "head_dim"),
                                &e, &s),
          s, "seed_tail_cache");
}

inline void decode_update_and_maybe_write_cache_batched(const Tensor &kv_cache, const Tensor &tail_kv_cache,
                                                        const Tensor &tail_slot_mapping, const Tensor &key,
                                                        const Tensor &slot_score, const Tensor &ape,
                                                        const Tensor &slot_mapping, const Tensor &positions,
                                                        int64_t pool_size, int64_t head_dim, bool round_scale) {
    const kpool_tensor kv = tensor(kv_cache, "kv_cache"), t = tensor(tail_kv_cache, "tail_kv_cache"),
                       tsm = tensor(tail_slot_mapping, "tail_slot_mapping"), k = tensor(key, "key"),
                       sc = tensor(slot_score, "slot_score"), a = tensor(ape, "ape"),
                       sm = tensor(slot_mapping, "slot_mapping"), p = tensor(positions, "positions");
    const kpool_exec e = exec_for(key);
    kpool_status s{};
    check(kpool_decode_update_and_maybe_write_cache_batched(&kv, &t, &tsm, &k, &sc, &a, &sm, &p,
                                                            int32_arg(pool_size, "pool_size"),
                                                            int32_arg(head_dim, "head_dim"), round_scale, &e, &s),
          s, "decode_update_and_maybe_write_cache_batched");
    if (int64_t *skipped = current_options().skipped_completions) {
        *skipped += s.skipped_completions;
    }
}

// The engine-native entry points (kpool.h 2b and 4b; docs/engines.md).
inline void compress_tokens_and_write_cache(const Tensor &kv_cache, const Tensor &key, const Tensor &gate_score,
                                            const Tensor &ape, const Tensor &slot_mapping,
                                            const OptionalTensor &tail_kv_cache,
                                            const OptionalTensor &tail_slot_mapping, const OptionalTensor &positions,
                                            int64_t pool_size, int64_t head_dim, bool round_scale) {
    const kpool_tensor kv = tensor(kv_cache, "kv_cache"), k = tensor(key, "key"), g = tensor(gate_score, "gate_score"),
                       a = tensor(ape, "ape"), sm = tensor(slot_mapping, "slot_mapping");
    const OptionalDescriptor t = tensor(tail_kv_cache, "tail_kv_cache"),
                             tsm = tensor(tail_slot_mapping, "tail_slot_mapping"), p = tensor(positions, "positions");
    const kpool_exec e = exec_for(key);
    kpool_status s{};
    check(kpool_compress_tokens_and_write_cache(&kv, &k, &g, &a, &sm, t.pointer(), tsm.pointer(), p.pointer(),
                                                int32_arg(pool_size, "pool_size"), int32_arg(head_dim, "head_dim"),
                                                round_scale, &e, &s),
          s, "compress_tokens_and_write_cache");
}

inline void decode_update_and_maybe_write_cache_ragged(const Tensor &kv_cache, const Tensor &tail_kv_cache,
                                                       const Tensor &tail_slot_mapping, const Tensor &key,
                                                       const Tensor &slot_score, const Tensor &ape,
                                                       const Tensor &slot_mapping, const Tensor &positions,
                                                       const Tensor &query_start_loc, int64_t max_query_len,
                                                       int64_t pool_size, int64_t head_dim, bool round_scale) {
    const kpool_tensor kv = tensor(kv_cache, "kv_cache"), t = tensor(tail_kv_cache, "tail_kv_cache"),
                       tsm = tensor(tail_slot_mapping, "tail_slot_mapping"), k = tensor(key, "key"),
                       sc = tensor(slot_score, "slot_score"), a = tensor(ape, "ape"),
                       sm = tensor(slot_mapping, "slot_mapping"), p = tensor(positions, "positions"),
                       q = tensor(query_start_loc, "query_start_loc");
    const kpool_exec e = exec_for(key);
    kpool_status s{};
    check(kpool_decode_update_and_maybe_write_cache_ragged(
              &kv, &t, &tsm, &k, &sc, &a, &sm, &p, &q, int32_arg(max_query_len, "max_query_len"),
              int32_arg(pool_size, "pool_size"), int32_arg(head_dim, "head_dim"), round_scale, &e, &s),
          s, "decode_update_and_maybe_write_cache_ragged");
    if (int64_t *skipped = current_options().skipped_completions) {
        *skipped += s.skipped_completions;
    }
}

inline void expand_pools_and_append_tail_out(const Tensor &pool_ids, const Tensor &seq_lens, int64_t pool_size,
                                             bool bound_pool_ids, const Tensor &out) {
    const kpool_tensor ids = tensor(pool_ids, "pool_ids"), lens = tensor(seq_lens, "seq_lens"), o = tensor(out, "out");
    const kpool_exec e = exec_for(pool_ids);
    kpool_status s{};
    check(kpool_expand_pools_and_append_tail(&ids, &lens, &o, int32_arg(pool_size, "pool_size"), bound_pool_ids, &e,
                                             &s),
          s, "expand_pools_and_append_tail");
}

// An output's size from pool_size: checked first (as kpool would) so that a
// wild value does not allocate.
inline void check_pool_size(int64_t pool_size) {
    TORCH_CHECK_VALUE(pool_size >= 1 && pool_size <= KPOOL_MAX_POOL_SIZE && (pool_size & (pool_size - 1)) == 0,
                      "kpool: pool_size = ", pool_size, " is not a power of two in [1, ", KPOOL_MAX_POOL_SIZE, "]");
}

// [rows, G * P + P - 1]
inline Tensor expand_pools_and_append_tail_output(const Tensor &pool_ids, int64_t pool_size) {
    TORCH_CHECK_VALUE(pool_ids.dim() == 2, "kpool: pool_ids has ", pool_ids.dim(), " dims, expected [rows, n_groups]");
    check_pool_size(pool_size);
    return at::empty_symint({pool_ids.sym_size(0), pool_ids.sym_size(1) * pool_size + (pool_size - 1)},
                            pool_ids.options().dtype(at::kInt));
}

inline Tensor expand_pools_and_append_tail(const Tensor &pool_ids, const Tensor &seq_lens, int64_t pool_size,
                                           bool bound_pool_ids) {
    Tensor out = expand_pools_and_append_tail_output(pool_ids, pool_size);
    expand_pools_and_append_tail_out(pool_ids, seq_lens, pool_size, bound_pool_ids, out);
    return out;
}

inline void expand_pools_to_tokens_out(const Tensor &group_ids, const Tensor &group_valid,
                                       const OptionalTensor &page_table, const OptionalTensor &topk_offsets,
                                       int64_t topk, int64_t pool_size, const Tensor &out) {
    const kpool_tensor ids = tensor(group_ids, "group_ids"), valid = tensor(group_valid, "group_valid"),
                       o = tensor(out, "out");
    const OptionalDescriptor table = tensor(page_table, "page_table"), offsets = tensor(topk_offsets, "topk_offsets");
    const kpool_exec e = exec_for(group_ids);
    kpool_status s{};
    check(kpool_expand_pools_to_tokens(&ids, &valid, table.pointer(), offsets.pointer(), &o, int32_arg(topk, "topk"),
                                       int32_arg(pool_size, "pool_size"), &e, &s),
          s, "expand_pools_to_tokens");
}

// [rows, topk]
inline Tensor expand_pools_to_tokens_output(const Tensor &group_ids, int64_t topk) {
    TORCH_CHECK_VALUE(group_ids.dim() == 2, "kpool: group_ids has ", group_ids.dim(),
                      " dims, expected [rows, topk / pool_size]");
    TORCH_CHECK_VALUE(topk >= 0, "kpool: topk = ", topk, " is negative");
    return at::empty_symint({group_ids.sym_size(0), c10::SymInt(topk)}, group_ids.options().dtype(at::kInt));
}

inline Tensor expand_pools_to_tokens(const Tensor &group_ids, const Tensor &group_valid,
                                     const OptionalTensor &page_table, const OptionalTensor &topk_offsets, int64_t topk,
                                     int64_t pool_size) {
    Tensor out = expand_pools_to_tokens_output(group_ids, topk);
    expand_pools_to_tokens_out(group_ids, group_valid, page_table, topk_offsets, topk, pool_size, out);
    return out;
}

inline void append_tail_to_topk_out(const Tensor &topk_result, const Tensor &seq_lens, const Tensor &pool_lens,
                                    const OptionalTensor &page_table, const OptionalTensor &topk_offsets,
                                    int64_t pool_size, const Tensor &out) {
    const kpool_tensor r = tensor(topk_result, "topk_result"), lens = tensor(seq_lens, "seq_lens"),
                       plens = tensor(pool_lens, "pool_lens"), o = tensor(out, "out");
    const OptionalDescriptor table = tensor(page_table, "page_table"), offsets = tensor(topk_offsets, "topk_offsets");
    const kpool_exec e = exec_for(topk_result);
    kpool_status s{};
    check(kpool_append_tail_to_topk(&r, &lens, &plens, table.pointer(), offsets.pointer(), &o,
                                    int32_arg(pool_size, "pool_size"), &e, &s),
          s, "append_tail_to_topk");
}

// [rows, C + P - 1]
inline Tensor append_tail_to_topk_output(const Tensor &topk_result, int64_t pool_size) {
    TORCH_CHECK_VALUE(topk_result.dim() == 2, "kpool: topk_result has ", topk_result.dim(), " dims, expected [rows, C]");
    check_pool_size(pool_size);
    return at::empty_symint({topk_result.sym_size(0), topk_result.sym_size(1) + (pool_size - 1)},
                            topk_result.options().dtype(at::kInt));
}

inline Tensor append_tail_to_topk(const Tensor &topk_result, const Tensor &seq_lens, const Tensor &pool_lens,
                                  const OptionalTensor &page_table, const OptionalTensor &topk_offsets,
                                  int64_t pool_size) {
    Tensor out = append_tail_to_topk_output(topk_result, pool_size);
    append_tail_to_topk_out(topk_result, seq_lens, pool_lens, page_table, topk_offsets, pool_size, out);
    return out;
}

// --- registration ----------------------------------------------------------------

namespace meta {
// The Meta kernels: what each op returns, without data. Ops that only write
// their arguments (the out variants among them) return nothing.
inline void writes_only(const OptionalTensor &, const Tensor &, const Tensor &, const Tensor &, const Tensor &,
                        const OptionalTensor &, int64_t, int64_t, bool, bool) {}
inline void seed(const Tensor &, const Tensor &, const Tensor &, const Tensor &, int64_t, int64_t) {}
inline void decode(const Tensor &, const Tensor &, const Tensor &, const Tensor &, const Tensor &, const Tensor &,
                   const Tensor &, const Tensor &, int64_t, int64_t, bool) {}
inline void fwht_out(const Tensor &, const Tensor &, const Tensor &) {}
inline void compress_tokens(const Tensor &, const Tensor &, const Tensor &, const Tensor &, const Tensor &,
                            const OptionalTensor &, const OptionalTensor &, const OptionalTensor &, int64_t, int64_t,
                            bool) {}
inline void ragged_decode(const Tensor &, const Tensor &, const Tensor &, const Tensor &, const Tensor &,
                          const Tensor &, const Tensor &, const Tensor &, const Tensor &, int64_t, int64_t, int64_t,
                          bool) {}
inline std::tuple<Tensor, Tensor> compress_to_rows(const OptionalTensor &, const Tensor &slot_k, const Tensor &,
                                                   const Tensor &, const Tensor &, const OptionalTensor &, int64_t,
                                                   int64_t, bool, bool) {
    return compress_to_rows_outputs(slot_k);
}
inline void compress_to_rows_out(const OptionalTensor &, const Tensor &, const Tensor &, const Tensor &,
                                 const Tensor &, const OptionalTensor &, int64_t, int64_t, bool, bool, const Tensor &,
                                 const Tensor &) {}
inline Tensor expand_and_append(const Tensor &pool_ids, const Tensor &, int64_t pool_size, bool) {
    return expand_pools_and_append_tail_output(pool_ids, pool_size);
}
inline void expand_and_append_out(const Tensor &, const Tensor &, int64_t, bool, const Tensor &) {}
inline Tensor expand_to_tokens(const Tensor &group_ids, const Tensor &, const OptionalTensor &, const OptionalTensor &,
                               int64_t topk, int64_t) {
    return expand_pools_to_tokens_output(group_ids, topk);
}
inline void expand_to_tokens_out(const Tensor &, const Tensor &, const OptionalTensor &, const OptionalTensor &,
                                 int64_t, int64_t, const Tensor &) {}
inline Tensor append_tail(const Tensor &topk_result, const Tensor &, const Tensor &, const OptionalTensor &,
                          const OptionalTensor &, int64_t pool_size) {
    return append_tail_to_topk_output(topk_result, pool_size);
}
inline void append_tail_out(const Tensor &, const Tensor &, const Tensor &, const OptionalTensor &,
                            const OptionalTensor &, int64_t, const Tensor &) {}
}  // namespace meta

// One op: its schema (name, overload and arguments, as torch writes them),
// its kernel for CPU and CUDA tensors, and its Meta kernel.
template <typename Kernel, typename Meta>
void define_op(::torch::Library &m, const char *schema, Kernel *kernel, Meta *meta_kernel) {
    const std::string text(schema);
    const std::string name = text.substr(0, text.find('('));
    m.def(schema);
    m.impl(name.c_str(), ::torch::dispatch(c10::DispatchKey::CPU, kernel));
    m.impl(name.c_str(), ::torch::dispatch(c10::DispatchKey::CUDA, kernel));
    m.impl(name.c_str(), ::torch::dispatch(c10::DispatchKey::Meta, meta_kernel));
}

// Every op, and its out variant where it returns tensors: one line each.
inline void register_ops(::torch::Library &m) {
    define_op(m, "fwht128_quant_fp8(Tensor q) -> (Tensor q_fp8, Tensor q_scale)", &fwht128_quant_fp8,
              &fwht128_quant_fp8_outputs);
    define_op(m,
              "fwht128_quant_fp8.out(Tensor q, *, Tensor(a!) q_fp8, Tensor(b!) q_scale) -> ()",
              &fwht128_quant_fp8_out, &meta::fwht_out);
    define_op(m,
              "compress_and_write_cache(Tensor(a!)? kv_cache, Tensor slot_k, Tensor slot_score, Tensor ape, "
              "Tensor loc, Tensor? write_mask, int pool_size, int head_dim, bool round_scale, bool write_cache) -> ()",
              &compress_and_write_cache, &meta::writes_only);
    define_op(m,
              "compress_to_rows(Tensor(a!)? kv_cache, Tensor slot_k, Tensor slot_score, Tensor ape, Tensor loc, "
              "Tensor? write_mask, int pool_size, int head_dim, bool round_scale, bool write_cache) "
              "-> (Tensor compressed_k, Tensor compressed_scale)",
              &compress_to_rows, &meta::compress_to_rows);
    define_op(m,
              "compress_to_rows.out(Tensor(a!)? kv_cache, Tensor slot_k, Tensor slot_score, Tensor ape, Tensor loc, "
              "Tensor? write_mask, int pool_size, int head_dim, bool round_scale, bool write_cache, *, "
              "Tensor(b!) compressed_k, Tensor(c!) compressed_scale) -> ()",
              &compress_to_rows_out, &meta::compress_to_rows_out);
    define_op(m,
              "seed_tail_cache(Tensor(a!) tail_kv_cache, Tensor key, Tensor gate_score, Tensor tslot, int pool_size, "
              "int head_dim) -> ()",
              &seed_tail_cache, &meta::seed);
    define_op(m,
              "decode_update_and_maybe_write_cache_batched(Tensor(a!) kv_cache, Tensor(b!) tail_kv_cache, "
              "Tensor tail_slot_mapping, Tensor key, Tensor slot_score, Tensor ape, Tensor slot_mapping, "
              "Tensor positions, int pool_size, int head_dim, bool round_scale) -> ()",
              &decode_update_and_maybe_write_cache_batched, &meta::decode);
    define_op(m,
              "compress_tokens_and_write_cache(Tensor(a!) kv_cache, Tensor key, Tensor gate_score, Tensor ape, "
              "Tensor slot_mapping, Tensor(b!)? tail_kv_cache, Tensor? tail_slot_mapping, Tensor? positions, "
              "int pool_size, int head_dim, bool round_scale) -> ()",
              &compress_tokens_and_write_cache, &meta::compress_tokens);
    define_op(m,
              "decode_update_and_maybe_write_cache_ragged(Tensor(a!) kv_cache, Tensor(b!) tail_kv_cache, "
              "Tensor tail_slot_mapping, Tensor key, Tensor slot_score, Tensor ape, Tensor slot_mapping, "
              "Tensor positions, Tensor query_start_loc, int max_query_len, int pool_size, int head_dim, "
              "bool round_scale) -> ()",
              &decode_update_and_maybe_write_cache_ragged, &meta::ragged_decode);
    define_op(m, "expand_pools_and_append_tail(Tensor pool_ids, Tensor seq_lens, int pool_size, bool bound_pool_ids) "
                 "-> Tensor",
              &expand_pools_and_append_tail, &meta::expand_and_append);
    define_op(m,
              "expand_pools_and_append_tail.out(Tensor pool_ids, Tensor seq_lens, int pool_size, bool bound_pool_ids, "
              "*, Tensor(a!) out) -> ()",
              &expand_pools_and_append_tail_out, &meta::expand_and_append_out);
    define_op(m,
              "expand_pools_to_tokens(Tensor group_ids, Tensor group_valid, Tensor? page_table, Tensor? topk_offsets, "
              "int topk, int pool_size) -> Tensor",
              &expand_pools_to_tokens, &meta::expand_to_tokens);
    define_op(m,
              "expand_pools_to_tokens.out(Tensor group_ids, Tensor group_valid, Tensor? page_table, "
              "Tensor? topk_offsets, int topk, int pool_size, *, Tensor(a!) out) -> ()",
              &expand_pools_to_tokens_out, &meta::expand_to_tokens_out);
    define_op(m,
              "append_tail_to_topk(Tensor topk_result, Tensor seq_lens, Tensor pool_lens, Tensor? page_table, "
              "Tensor? topk_offsets, int pool_size) -> Tensor",
              &append_tail_to_topk, &meta::append_tail);
    define_op(m,
              "append_tail_to_topk.out(Tensor topk_result, Tensor seq_lens, Tensor pool_lens, Tensor? page_table, "
              "Tensor? topk_offsets, int pool_size, *, Tensor(a!) out) -> ()",
              &append_tail_to_topk_out, &meta::append_tail_out);
}

}  // namespace kpool::torch
