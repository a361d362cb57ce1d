// The C signatures of the generated kernels (inputs in declaration order,
// then outputs), as the runtime calls them through the variant table.
#pragma once

#include "HalideRuntime.h"

namespace kpool::rt {

using buf = halide_buffer_t *;
using FwhtFn = int(buf q, buf q_fp8, buf q_scale);
using CompressToCacheFn = int(buf slot_k, buf slot_score, buf ape, bool round_scale, buf loc, buf write_mask,
                              buf cache);
using CompressToRowsFn = int(buf slot_k, buf slot_score, buf ape, bool round_scale, buf compressed_k,
                             buf compressed_scale);
using SeedTailFn = int(buf key, buf gate_score, buf tslot, int32_t pool_size, buf tail);
using DecodeWriteCacheFn = int(buf tail, buf tail_slot_mapping, buf key, buf slot_score, buf ape,
                               buf slot_mapping, buf positions, bool round_scale, buf cache);
using DecodeStashTailFn = int(buf tail_slot_mapping, buf key, buf slot_score, buf positions, buf tail);
using ExpandPoolsAndAppendTailFn = int(buf pool_ids, buf seq_lens, int32_t pool_size, bool bound_pool_ids, buf out);
using ExpandPoolsToTokensFn = int(buf group_ids, buf group_valid, buf page_table, buf topk_offsets,
                                  int32_t token_map, int32_t pool_size, buf out);
using AppendTailToTopkFn = int(buf topk_result, buf seq_lens, buf pool_lens, buf page_table, buf topk_offsets,
                               int32_t token_map, int32_t pool_size, buf out);

}  // namespace kpool::rt
