// replay_case: one case of a reference dump (support/dump.h) through the C
// API on a device, the way the reference made its calls, and the bytes each
// call left behind. `kpool check` and the GPU dump test compare those bytes
// with the dump's outputs (expected_output) and with another device's.
#ifndef KPOOL_TESTS_SUPPORT_REPLAY_H
#define KPOOL_TESTS_SUPPORT_REPLAY_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/device.h"
#include "support/dump.h"

namespace kpool_dump {

// Output buffers start as this byte, so an element the op forgot shows up.
constexpr uint8_t kUnwrittenByte = 0xA5;

struct Replay {
    // By the dump's output name: the bytes of the buffer behind it after the
    // call that writes it (a fresh output buffer, or the updated input of
    // the same name: the caches). A failed call's outputs are absent.
    std::map<std::string, std::vector<uint8_t>> outputs;
    // "kpool_fwht128_quant_fp8: KPOOL_ERROR_...: <message>" for each call that
    // did not return KPOOL_OK, or what stopped the replay (a missing input).
    std::vector<std::string> failures;
    // Decode: the call's status.skipped_completions (-1 from a device call,
    // whose indices are not read on the host).
    int64_t skipped_completions = 0;
};

// The case's call on `device`: its inputs uploaded in the views the reference
// was given, fresh outputs of kUnwrittenByte. ExpandPools makes every call
// its outputs name: expand_pools_and_append_tail (`fused`), and for each
// token map (identity, offsets, page_table) expand_pools_to_tokens
// (expand_<map>) and append_tail_to_topk of the dump's expand_<map>
// (append_<map>).
Replay replay_case(Case &c, kpool_support::Device &device);

}  // namespace kpool_dump

#endif  // KPOOL_TESTS_SUPPORT_REPLAY_H
