// kpool_ref against the golden dump of the Triton reference (seed 0, H200):
// every output byte must match, except where SPEC's "Reference defects" says
// we deliberately differ (decode completions without a tail block).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "reference/kpool_reference.h"
#include "support/dump.h"

#ifndef KPOOL_TEST_DATA_DIR
#define KPOOL_TEST_DATA_DIR "tests/data"
#endif

namespace {

using kpool_dump::Array;
using kpool_dump::Case;
using kpool_dump::Op;
using kpool_dump::storage_tensor;
using kpool_dump::view_tensor;

const kpool_dump::Dump &seed0_dump() {
    static const kpool_dump::Dump dump =
        kpool_dump::load_dump(std::string(KPOOL_TEST_DATA_DIR) + "/dump_seed0");
    return dump;
}

std::vector<const Case *> cases_of(Op op) {
    std::vector<const Case *> cases;
    for (const Case &c : seed0_dump().cases) {
        if (c.op == op) cases.push_back(&c);
    }
    return cases;
}

// A buffer shaped like `like`, filled with a byte pattern, so that an element
// the reference fails to write shows up as a mismatch.
Array unwritten_like(const Array &like) {
    Array array = like;
    std::fill(array.bytes.begin(), array.bytes.end(), uint8_t(0xA5));
    return array;
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t> &expected,
                                      const std::vector<uint8_t> &actual) {
    if (expected.size() != actual.size()) {
        return ::testing::AssertionFailure()
               << "sizes differ: expected " << expected.size() << " bytes, got " << actual.size();
    }
    size_t differing = 0;
    std::ostringstream first_differences;
    for (size_t i = 0; i < expected.size(); ++i) {
        if (expected[i] == actual[i]) continue;
        if (differing < 8) {
            first_differences << " [" << i << "] expected 0x" << std::hex << int(expected[i])
                              << " got 0x" << int(actual[i]) << std::dec;
        }
        ++differing;
    }
    if (differing == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << differing << " of " << expected.size() << " bytes differ:" << first_differences.str();
}

TEST(ReferenceVsDump, ManifestHoldsEveryOp) {
    const kpool_dump::Dump &dump = seed0_dump();
    EXPECT_EQ(dump.cases.size(), 23u);
    EXPECT_EQ(cases_of(Op::Fwht128QuantFp8).size(), 1u);
    EXPECT_EQ(cases_of(Op::CompressAndWriteCache).size(), 9u);
    EXPECT_EQ(cases_of(Op::SeedTailCache).size(), 7u);
    EXPECT_EQ(cases_of(Op::DecodeUpdateBatched).size(), 4u);
    EXPECT_EQ(cases_of(Op::ExpandPools).size(), 2u);
}

TEST(ReferenceVsDump, Fwht128QuantFp8) {
    for (const Case *c : cases_of(Op::Fwht128QuantFp8)) {
        SCOPED_TRACE(c->name);
        Array q = c->input("q");
        Array q_fp8 = unwritten_like(c->output("q_fp8"));
        Array q_scale = unwritten_like(c->output("q_scale"));
        const kpool_tensor q_t = storage_tensor(q), q_fp8_t = storage_tensor(q_fp8),
                           q_scale_t = storage_tensor(q_scale);
        kpool_ref::fwht128_quant_fp8(&q_t, &q_fp8_t, &q_scale_t);
        EXPECT_TRUE(same_bytes(c->output("q_fp8").bytes, q_fp8.bytes)) << "q_fp8";
        EXPECT_TRUE(same_bytes(c->output("q_scale").bytes, q_scale.bytes)) << "q_scale";
    }
}

TEST(ReferenceVsDump, CompressAndWriteCache) {
    for (const Case *c : cases_of(Op::CompressAndWriteCache)) {
        SCOPED_TRACE(c->name);
        Array kv_cache = c->input("kv_cache");
        Array slot_k = c->input("slot_k"), slot_score = c->input("slot_score");
        Array ape = c->input("ape"), loc = c->input("loc");
        const bool return_compressed = c->bool_arg("return_compressed", false);
        const bool write_cache = c->bool_arg("write_cache", true);
        const kpool_tensor kv_t = storage_tensor(kv_cache), slot_k_t = storage_tensor(slot_k),
                           slot_score_t = storage_tensor(slot_score), ape_t = storage_tensor(ape),
                           loc_t = storage_tensor(loc);

        Array write_mask;
        kpool_tensor write_mask_t{};
        if (c->has_input("write_mask")) {
            write_mask = c->input("write_mask");
            write_mask_t = storage_tensor(write_mask);
        }
        Array compressed_k, compressed_scale;
        kpool_tensor compressed_k_t{}, compressed_scale_t{};
        if (return_compressed) {
            compressed_k = unwritten_like(c->output("compressed_k"));
            compressed_scale = unwritten_like(c->output("compressed_scale"));
            compressed_k_t = storage_tensor(compressed_k);
            compressed_scale_t = storage_tensor(compressed_scale);
        }
        kpool_ref::compress_and_write_cache(&kv_t, &slot_k_t, &slot_score_t, &ape_t, &loc_t,
                                            c->has_input("write_mask") ? &write_mask_t : nullptr,
                                            return_compressed ? &compressed_k_t : nullptr,
                                            return_compressed ? &compressed_scale_t : nullptr,
                                            static_cast<int32_t>(c->int_arg("pool_size")),
                                            static_cast<int32_t>(c->int_arg("head_dim")),
                                            c->bool_arg("round_scale", true), write_cache);

        EXPECT_TRUE(same_bytes(c->output("kv_cache").bytes, kv_cache.bytes)) << "kv_cache";
        if (return_compressed) {
            EXPECT_TRUE(same_bytes(c->output("compressed_k").bytes, compressed_k.bytes))
                << "compressed_k";
            EXPECT_TRUE(same_bytes(c->output("compressed_scale").bytes, compressed_scale.bytes))
                << "compressed_scale";
        }
    }
}

TEST(ReferenceVsDump, SeedTailCache) {
    for (const Case *c : cases_of(Op::SeedTailCache)) {
        SCOPED_TRACE(c->name);
        Array tail = c->input("tail_kv_cache");
        Array key = c->input("key"), gate_score = c->input("gate_score"), tslot = c->input("tslot");
        const kpool_tensor tail_t = view_tensor(tail), key_t = storage_tensor(key),
                           gate_score_t = storage_tensor(gate_score),
                           tslot_t = storage_tensor(tslot);
        kpool_ref::seed_tail_cache(&tail_t, &key_t, &gate_score_t, &tslot_t,
                                   static_cast<int32_t>(c->int_arg("kpool")),
                                   static_cast<int32_t>(c->int_arg("head_dim")));
        // The whole saved buffer, block padding included: nothing outside the
        // view may change.
        EXPECT_TRUE(same_bytes(c->output("tail_kv_cache").bytes, tail.bytes)) << "tail_kv_cache";
    }
}

TEST(ReferenceVsDump, DecodeUpdateBatched) {
    // bench_triton.py's dump_scenario adds, when edge rows are on, one request
    // at positions 3, 4, ... with slot_mapping on every pool end but no tail
    // block: next_n 6 and 8 reach pool ends 3 and 7, next_n 1 only 3. The
    // P=16 scenario has no edge rows.
    const std::map<std::string, int64_t> expected_skipped = {
        {"scen_p4_r4_n6_3decode", 2},
        {"scen_p4_r8_n8_strided_3decode", 2},
        {"scen_p16_r16_n4_linear_3decode", 0},
        {"scen_p4_r4_n1_3decode", 1},
    };
    const std::vector<const Case *> cases = cases_of(Op::DecodeUpdateBatched);
    ASSERT_EQ(cases.size(), expected_skipped.size());
    for (const Case *c : cases) {
        SCOPED_TRACE(c->name);
        ASSERT_EQ(expected_skipped.count(c->name), 1u);
        Array kv_cache = c->input("kv_cache"), tail = c->input("tail_kv_cache");
        Array tail_slot_mapping = c->input("tail_slot_mapping"), key = c->input("key");
        Array slot_score = c->input("slot_score"), ape = c->input("ape");
        Array slot_mapping = c->input("slot_mapping"), positions = c->input("positions");
        const kpool_tensor kv_t = storage_tensor(kv_cache), tail_t = view_tensor(tail),
                           tail_slot_mapping_t = storage_tensor(tail_slot_mapping),
                           key_t = storage_tensor(key), slot_score_t = storage_tensor(slot_score),
                           ape_t = storage_tensor(ape),
                           slot_mapping_t = storage_tensor(slot_mapping),
                           positions_t = storage_tensor(positions);
        const int64_t skipped = kpool_ref::decode_update_and_maybe_write_cache_batched(
            &kv_t, &tail_t, &tail_slot_mapping_t, &key_t, &slot_score_t, &ape_t, &slot_mapping_t,
            &positions_t, static_cast<int32_t>(c->int_arg("pool_size")),
            static_cast<int32_t>(c->int_arg("head_dim")), c->bool_arg("round_scale", true));

        const std::vector<kpool_dump::SkippedCompletion> excused =
            kpool_dump::skipped_completions(*c);
        EXPECT_EQ(skipped, expected_skipped.at(c->name));
        EXPECT_EQ(skipped, int64_t(excused.size()));
        // The excuse is needed: the reference did write a pool at each of them.
        const std::vector<uint8_t> &input_cache = c->input("kv_cache").bytes;
        const std::vector<uint8_t> &dumped_cache = c->output("kv_cache").bytes;
        for (const kpool_dump::SkippedCompletion &completion : excused) {
            const kpool_dump::ByteRange scale = completion.scale_bytes;
            EXPECT_NE(0, std::memcmp(input_cache.data() + scale.offset,
                                     dumped_cache.data() + scale.offset, scale.size))
                << "request " << completion.request << " token " << completion.token;
        }

        EXPECT_TRUE(same_bytes(kpool_dump::expected_kv_cache(*c), kv_cache.bytes)) << "kv_cache";
        EXPECT_TRUE(same_bytes(c->output("tail_kv_cache").bytes, tail.bytes)) << "tail_kv_cache";
    }
}

// The page-table or topk-offset mapping of expand_* / append_*, by output suffix.
struct TokenMapping {
    const kpool_tensor *page_table;
    const kpool_tensor *topk_offsets;
};

TEST(ReferenceVsDump, ExpandPoolsAndAppendTail) {
    for (const Case *c : cases_of(Op::ExpandPools)) {
        SCOPED_TRACE(c->name);
        const int32_t pool_size = static_cast<int32_t>(c->int_arg("pool_size"));
        const int32_t topk = static_cast<int32_t>(c->int_arg("topk"));
        Array pool_ids = c->input("pool_ids"), seq_lens = c->input("seq_lens");
        Array group_valid = c->input("group_valid"), pool_lens = c->input("pool_lens");
        Array page_table = c->input("page_table"), topk_offsets = c->input("topk_offsets");
        const kpool_tensor pool_ids_t = storage_tensor(pool_ids),
                           seq_lens_t = storage_tensor(seq_lens),
                           group_valid_t = storage_tensor(group_valid),
                           pool_lens_t = storage_tensor(pool_lens),
                           page_table_t = storage_tensor(page_table),
                           topk_offsets_t = storage_tensor(topk_offsets);

        Array fused = unwritten_like(c->output("fused"));
        const kpool_tensor fused_t = storage_tensor(fused);
        kpool_ref::expand_pools_and_append_tail(&pool_ids_t, &seq_lens_t, &fused_t, pool_size,
                                                /*bound_pool_ids=*/0);
        EXPECT_TRUE(same_bytes(c->output("fused").bytes, fused.bytes)) << "fused";

        const std::map<std::string, TokenMapping> mappings = {
            {"identity", {nullptr, nullptr}},
            {"offsets", {nullptr, &topk_offsets_t}},
            {"page_table", {&page_table_t, nullptr}},
        };
        for (const auto &[suffix, mapping] : mappings) {
            Array expanded = unwritten_like(c->output("expand_" + suffix));
            const kpool_tensor expanded_t = storage_tensor(expanded);
            kpool_ref::expand_pools_to_tokens(&pool_ids_t, &group_valid_t, mapping.page_table,
                                              mapping.topk_offsets, &expanded_t, topk, pool_size);
            EXPECT_TRUE(same_bytes(c->output("expand_" + suffix).bytes, expanded.bytes))
                << "expand_" << suffix;

            // As in the dump: append_tail_to_topk on the dumped expand_* output.
            Array topk_result = c->output("expand_" + suffix);
            Array appended = unwritten_like(c->output("append_" + suffix));
            const kpool_tensor topk_result_t = storage_tensor(topk_result),
                               appended_t = storage_tensor(appended);
            kpool_ref::append_tail_to_topk(&topk_result_t, &seq_lens_t, &pool_lens_t,
                                           mapping.page_table, mapping.topk_offsets, &appended_t,
                                           pool_size);
            EXPECT_TRUE(same_bytes(c->output("append_" + suffix).bytes, appended.bytes))
                << "append_" << suffix;
        }
    }
}

// SPEC "Reference defects": [rows, 1] topk offsets give what [rows] gives
// (the reference broadcasts them wrongly in append_tail_to_topk).
TEST(ReferenceVsDump, TopkOffsetsAsColumnMatchFlatOffsets) {
    for (const Case *c : cases_of(Op::ExpandPools)) {
        SCOPED_TRACE(c->name);
        const int32_t pool_size = static_cast<int32_t>(c->int_arg("pool_size"));
        Array topk_result = c->output("expand_offsets");
        Array seq_lens = c->input("seq_lens"), pool_lens = c->input("pool_lens");
        Array topk_offsets = c->input("topk_offsets");
        Array appended = unwritten_like(c->output("append_offsets"));
        const kpool_tensor topk_result_t = storage_tensor(topk_result),
                           seq_lens_t = storage_tensor(seq_lens),
                           pool_lens_t = storage_tensor(pool_lens),
                           appended_t = storage_tensor(appended);
        kpool_tensor offsets_column_t = storage_tensor(topk_offsets);
        offsets_column_t.ndim = 2;
        offsets_column_t.shape[1] = 1;
        offsets_column_t.strides[1] = 1;
        kpool_ref::append_tail_to_topk(&topk_result_t, &seq_lens_t, &pool_lens_t, nullptr,
                                       &offsets_column_t, &appended_t, pool_size);
        EXPECT_TRUE(same_bytes(c->output("append_offsets").bytes, appended.bytes));
    }
}

// The dump draws every pool id below seq_len / P, so bounding the ids (off
// in the reference) must not drop any of them.
TEST(ReferenceVsDump, BoundPoolIdsKeepsEveryDumpedId) {
    for (const Case *c : cases_of(Op::ExpandPools)) {
        SCOPED_TRACE(c->name);
        Array pool_ids = c->input("pool_ids"), seq_lens = c->input("seq_lens");
        Array fused = unwritten_like(c->output("fused"));
        const kpool_tensor pool_ids_t = storage_tensor(pool_ids),
                           seq_lens_t = storage_tensor(seq_lens), fused_t = storage_tensor(fused);
        kpool_ref::expand_pools_and_append_tail(&pool_ids_t, &seq_lens_t, &fused_t,
                                                static_cast<int32_t>(c->int_arg("pool_size")),
                                                /*bound_pool_ids=*/1);
        EXPECT_TRUE(same_bytes(c->output("fused").bytes, fused.bytes));
    }
}

}  // namespace
