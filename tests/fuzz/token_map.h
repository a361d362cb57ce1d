// The optional page table / topk offsets of expand_pools_to_tokens and
// append_tail_to_topk, as the fuzz targets build them.
#pragma once

#include "fuzz_common.h"

namespace kfuzz {

struct TokenMap {
    Tensor page_table, offsets;
    bool has_table = false, has_offsets = false;

    TokenMap(Input &in, int64_t rows) {
        const int kind = in.pick(5);  // none, page table, [rows], [rows, 1], both (rejected)
        has_table = kind == 1 || kind == 4;
        has_offsets = kind == 2 || kind == 3 || kind == 4;
        const int64_t width = in.range<int64_t>(1, 40) - (in.chance(8) ? 1 : 0);
        page_table = plan(in, "page_table", KPOOL_DTYPE_INT32, {rows, width});
        offsets = kind == 3 ? plan(in, "topk_offsets", KPOOL_DTYPE_INT64, {rows, 1})
                            : plan(in, "topk_offsets", KPOOL_DTYPE_INT64, {rows});
        page_table.absent = !has_table;
        offsets.absent = !has_offsets;
    }
    std::vector<Tensor *> present() {
        std::vector<Tensor *> p;
        if (has_table) p.push_back(&page_table);
        if (has_offsets) p.push_back(&offsets);
        return p;
    }
    // Values, once allocated: any int32 entries, offsets of any int64.
    void fill(Input &in) {
        std::vector<int64_t> entries, offs;
        for (int64_t i = 0; i < 4096; i++) {
            entries.push_back(in.chance(16) ? index_value(in, 1 << 20, entries, false) : int64_t(in.next() % (1u << 30)));
        }
        for (int64_t i = 0; i < 64; i++) {
            const int64_t v[] = {int64_t(in.next() % (1u << 24)), -100, (int64_t(1) << 32) + 3,
                                 std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), 0};
            offs.push_back(v[in.chance(64) ? in.pick(6) : 0]);
        }
        write_ints(page_table, entries);
        write_ints(offsets, offs);
    }
    const char *invalid(int64_t rows) const {
        const bool table = !page_table.absent, offs = !offsets.absent;
        if (table && offs) return "page_table and topk_offsets both given";
        if (table) {
            if (const char *r = invalid_alone(page_table, {KPOOL_DTYPE_INT32})) return r;
            if (page_table.ndim == 2 && page_table.shape[0] == rows && page_table.shape[1] == 0) {
                return "an empty page table";
            }
        }
        if (offs) return invalid_alone(offsets, {KPOOL_DTYPE_INT64});
        return nullptr;
    }
};

}  // namespace kfuzz
