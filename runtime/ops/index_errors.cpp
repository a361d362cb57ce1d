// Index tensors on a device: a kernel of their own marks exec->index_errors
// where an index is out of range (the op's kernels skip those writes), and
// the caller's check reads the marks back.
#include <string>

#include "ops.h"

namespace kpool::rt {

ElementType index_type(const TensorArg &a) {
    return a.t->dtype == KPOOL_DTYPE_INT64 ? ElementType::int64 : ElementType::int32;
}

void mark_index_errors(const Placement &where, kpool_index_arg arg, const TensorArg &index, int64_t limit,
                       const TensorArg *mask) {
    if (where.index_errors() == nullptr || index.numel() == 0) {
        return;
    }
    HalideBuffer entries = wrap(index);
    if (entries.dimensions() == 1) {
        entries = entries.embedded(1, 0);
    }
    HalideBuffer enabled = mask ? where.attach(wrap(*mask)) : where.all_true(entries.dim(0).extent());
    HalideBuffer word = where.words(where.index_errors() + arg, 1);
    where.launch<Kernel::INDEX_CHECK>(index.name, 0, index_type(index), where.attach(entries).raw_buffer(),
                                      enabled.raw_buffer(), limit, word.raw_buffer());
}

void check_index_errors(int32_t device_index, const kpool_exec *exec) {
    if (exec == nullptr || exec->index_errors == nullptr) {
        throw invalid() << (exec == nullptr ? "exec" : "exec->index_errors") << " is NULL: there are no words to read";
    }
    require_index_errors_aligned(exec->index_errors);
    int32_t words[KPOOL_INDEX_ARGS] = {};
    take_index_errors(cuda_device(device_index, "exec->index_errors"), exec->stream, exec->index_errors, words,
                      KPOOL_INDEX_ARGS);
    static const char *const kNames[KPOOL_INDEX_ARGS] = {"loc", "tslot", "slot_mapping", "tail_slot_mapping"};
    std::string marked;
    for (int i = 0; i < KPOOL_INDEX_ARGS; i++) {
        if (words[i] != 0) {
            marked += (marked.empty() ? "" : ", ") + std::string(kNames[i]);
        }
    }
    if (!marked.empty()) {
        throw out_of_range() << "device calls since the last check skipped writes at out-of-range indices of: "
                             << marked;
    }
}

}  // namespace kpool::rt
