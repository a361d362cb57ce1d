// An engine's registration of kpool's ops: every op of kpool (and its out
// variants) in the engine's namespace, the warm-up its server calls once
// per GPU before it captures CUDA graphs, and one call with options of its
// own (kpool::torch::ScopedOptions): a decode step that also returns how
// many pool completions it skipped for want of a tail block (eager only: a
// host count).
#include <kpool/torch.hpp>

namespace {

int64_t decode_counting_skipped(const at::Tensor &kv_cache, const at::Tensor &tail_kv_cache,
                                const at::Tensor &tail_slot_mapping, const at::Tensor &key,
                                const at::Tensor &slot_score, const at::Tensor &ape, const at::Tensor &slot_mapping,
                                const at::Tensor &positions, int64_t pool_size, int64_t head_dim, bool round_scale) {
    int64_t skipped = 0;
    kpool::torch::ScopedOptions options({KPOOL_ARITHMETIC_DEFAULT, nullptr, &skipped});
    kpool::torch::decode_update_and_maybe_write_cache_batched(kv_cache, tail_kv_cache, tail_slot_mapping, key,
                                                              slot_score, ape, slot_mapping, positions, pool_size,
                                                              head_dim, round_scale);
    return skipped;
}

}  // namespace

TORCH_LIBRARY(KPOOL_ENGINE_NAMESPACE, m) {
    kpool::torch::register_ops(m);
    m.def("warm_up(Device device) -> ()", [](c10::Device device) { kpool::torch::warm_up(device); });
    m.def("decode_counting_skipped(Tensor(a!) kv_cache, Tensor(b!) tail_kv_cache, Tensor tail_slot_mapping, "
          "Tensor key, Tensor slot_score, Tensor ape, Tensor slot_mapping, Tensor positions, int pool_size, "
          "int head_dim, bool round_scale) -> int");
    m.impl("decode_counting_skipped", torch::dispatch(c10::DispatchKey::CPU, &decode_counting_skipped));
    m.impl("decode_counting_skipped", torch::dispatch(c10::DispatchKey::CUDA, &decode_counting_skipped));
}
