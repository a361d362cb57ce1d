#include "support/replay.h"

#include <exception>
#include <memory>
#include <stdexcept>

namespace kpool_dump {
namespace {

using kpool_support::Device;
using kpool_support::DeviceBuffer;

// One case's buffers on the device: inputs (caches are updated in place and
// are also outputs) and freshly allocated outputs.
class CaseBuffers {
public:
    CaseBuffers(Device &device, Case &c) : device_(device), case_(c) {}

    // The tensor the op saw of input `key` (its view when one was recorded),
    // on the device; nullptr when the case has no such input.
    const kpool_tensor *input(const std::string &key) {
        auto it = case_.inputs.find(key);
        if (it == case_.inputs.end()) return nullptr;
        Array &array = it->second;
        DeviceBuffer &buffer = buffer_for(key, array.bytes);
        kpool_tensor view = view_tensor(array);
        view.data = buffer.host().data() + (static_cast<uint8_t *>(view.data) - array.bytes.data());
        return keep(buffer.on_device(view));
    }

    // A new output buffer shaped like the dump's output `key`.
    const kpool_tensor *output(const std::string &key) {
        const Array &expected = case_.output(key);
        DeviceBuffer &buffer =
            buffer_for("output:" + key, std::vector<uint8_t>(expected.bytes.size(), kUnwrittenByte));
        return keep(buffer.contiguous(dtype_from_name(expected.dtype), expected.shape));
    }

    // A new input holding the dump's output `key` (append_* reads expand_*).
    const kpool_tensor *output_as_input(const std::string &key) {
        const Array &array = case_.output(key);
        DeviceBuffer &buffer = buffer_for("from-output:" + key, array.bytes);
        return keep(buffer.contiguous(dtype_from_name(array.dtype), array.shape));
    }

    // The bytes now in the buffer behind output `key`: its output buffer, or
    // the updated input buffer of the same name (caches).
    const std::vector<uint8_t> &result(const std::string &key) {
        auto it = buffers_.find("output:" + key);
        if (it == buffers_.end()) it = buffers_.find(key);
        if (it == buffers_.end()) throw std::runtime_error("output \"" + key + "\" was not produced by this op");
        it->second->download();
        return it->second->host();
    }

private:
    DeviceBuffer &buffer_for(const std::string &key, std::vector<uint8_t> bytes) {
        auto it = buffers_.find(key);
        if (it == buffers_.end()) {
            it = buffers_.emplace(key, std::make_unique<DeviceBuffer>(device_, std::move(bytes))).first;
        }
        return *it->second;
    }

    const kpool_tensor *keep(const kpool_tensor &t) {
        tensors_.push_back(std::make_unique<kpool_tensor>(t));
        return tensors_.back().get();
    }

    Device &device_;
    Case &case_;
    std::map<std::string, std::unique_ptr<DeviceBuffer>> buffers_;
    std::vector<std::unique_ptr<kpool_tensor>> tensors_;
};

// One call's failure, or the bytes of the outputs it wrote.
void record(const std::string &function, kpool_status_code code, const kpool_status &status,
            const std::vector<std::string> &outputs, CaseBuffers &b, Replay &replay) {
    if (code != KPOOL_OK || status.code != KPOOL_OK) {
        replay.failures.push_back(function + ": " + kpool_status_name(code) + ": " + status.message);
        return;
    }
    for (const std::string &key : outputs) replay.outputs[key] = b.result(key);
}

int32_t int_arg32(const Case &c, const std::string &key) { return static_cast<int32_t>(c.int_arg(key)); }

std::vector<std::string> output_names(const Case &c) {
    std::vector<std::string> names;
    for (const auto &entry : c.outputs) names.push_back(entry.first);
    return names;
}

void replay_expand(Case &c, CaseBuffers &b, const kpool_exec &exec, Replay &replay) {
    const int32_t pool_size = int_arg32(c, "pool_size");
    const int32_t topk = int_arg32(c, "topk");
    if (c.has_output("fused")) {
        kpool_status status{};
        const kpool_status_code code = kpool_expand_pools_and_append_tail(
            b.input("pool_ids"), b.input("seq_lens"), b.output("fused"), pool_size, /*bound_pool_ids=*/0, &exec,
            &status);
        record("kpool_expand_pools_and_append_tail", code, status, {"fused"}, b, replay);
    }
    struct TokenMap {
        const char *tag;
        bool page_table;
        bool topk_offsets;
    };
    for (const TokenMap &map : {TokenMap{"identity", false, false}, TokenMap{"offsets", false, true},
                                TokenMap{"page_table", true, false}}) {
        const kpool_tensor *page_table = map.page_table ? b.input("page_table") : nullptr;
        const kpool_tensor *topk_offsets = map.topk_offsets ? b.input("topk_offsets") : nullptr;
        const std::string expand_key = std::string("expand_") + map.tag;
        const std::string append_key = std::string("append_") + map.tag;
        if (!c.has_output(expand_key)) continue;
        kpool_status status{};
        kpool_status_code code =
            kpool_expand_pools_to_tokens(b.input("pool_ids"), b.input("group_valid"), page_table, topk_offsets,
                                         b.output(expand_key), topk, pool_size, &exec, &status);
        record("kpool_expand_pools_to_tokens (" + expand_key + ")", code, status, {expand_key}, b, replay);
        if (!c.has_output(append_key)) continue;
        status = kpool_status{};
        code = kpool_append_tail_to_topk(b.output_as_input(expand_key), b.input("seq_lens"), b.input("pool_lens"),
                                         page_table, topk_offsets, b.output(append_key), pool_size, &exec, &status);
        record("kpool_append_tail_to_topk (" + append_key + ")", code, status, {append_key}, b, replay);
    }
}

void replay_call(Case &c, CaseBuffers &b, const kpool_exec &exec, Replay &replay) {
    kpool_status status{};
    switch (c.op) {
        case Op::Fwht128QuantFp8: {
            const kpool_status_code code =
                kpool_fwht128_quant_fp8(b.input("q"), b.output("q_fp8"), b.output("q_scale"), &exec, &status);
            record("kpool_fwht128_quant_fp8", code, status, output_names(c), b, replay);
            break;
        }
        case Op::CompressAndWriteCache: {
            const bool return_compressed = c.bool_arg("return_compressed", false);
            const kpool_status_code code = kpool_compress_and_write_cache(
                b.input("kv_cache"), b.input("slot_k"), b.input("slot_score"), b.input("ape"), b.input("loc"),
                b.input("write_mask"), return_compressed ? b.output("compressed_k") : nullptr,
                return_compressed ? b.output("compressed_scale") : nullptr, int_arg32(c, "pool_size"),
                int_arg32(c, "head_dim"), c.bool_arg("round_scale", true) ? 1 : 0,
                c.bool_arg("write_cache", true) ? 1 : 0, &exec, &status);
            record("kpool_compress_and_write_cache", code, status, output_names(c), b, replay);
            break;
        }
        case Op::SeedTailCache: {
            const kpool_status_code code =
                kpool_seed_tail_cache(b.input("tail_kv_cache"), b.input("key"), b.input("gate_score"),
                                      b.input("tslot"), int_arg32(c, "kpool"), int_arg32(c, "head_dim"), &exec,
                                      &status);
            record("kpool_seed_tail_cache", code, status, output_names(c), b, replay);
            break;
        }
        case Op::DecodeUpdateBatched: {
            const kpool_status_code code = kpool_decode_update_and_maybe_write_cache_batched(
                b.input("kv_cache"), b.input("tail_kv_cache"), b.input("tail_slot_mapping"), b.input("key"),
                b.input("slot_score"), b.input("ape"), b.input("slot_mapping"), b.input("positions"),
                int_arg32(c, "pool_size"), int_arg32(c, "head_dim"), c.bool_arg("round_scale", true) ? 1 : 0,
                &exec, &status);
            replay.skipped_completions = status.skipped_completions;
            record("kpool_decode_update_and_maybe_write_cache_batched", code, status, output_names(c), b, replay);
            break;
        }
        case Op::ExpandPools: replay_expand(c, b, exec, replay); break;
    }
}

}  // namespace

Replay replay_case(Case &c, Device &device) {
    Replay replay;
    CaseBuffers buffers(device, c);
    try {
        replay_call(c, buffers, device.exec(), replay);
    } catch (const std::exception &e) {
        replay.failures.push_back(e.what());
    }
    return replay;
}

}  // namespace kpool_dump
