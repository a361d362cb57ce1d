// kpool_dump: loads a reference dump directory (manifest.json plus one raw
// .bin per tensor, written by shared/anchors/bench_triton.py --dump) and
// describes where the reference's output is deliberately not ours. Used by
// the tests and by `kpool check DIR` (with support/replay.h); it depends on
// nothing but the C API header and the standard library. Errors are thrown as std::runtime_error
// naming the file and the field.
#ifndef KPOOL_TESTS_SUPPORT_DUMP_H
#define KPOOL_TESTS_SUPPORT_DUMP_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kpool/kpool.h"

namespace kpool_dump {

// A parsed JSON value. Numbers written without fraction or exponent that fit
// in int64 are kept exactly as integers.
struct Json {
    enum class Kind { Null, Bool, Integer, Real, String, Array, Object };
    Kind kind = Kind::Null;
    bool boolean = false;
    int64_t integer = 0;
    double real = 0.0;
    std::string string;
    std::vector<Json> array;
    std::vector<std::pair<std::string, Json>> object;  // in file order

    // The member named `key`, or nullptr (also when this is not an object).
    const Json *find(const std::string &key) const;
    // Typed access; throws when the value has another kind.
    bool as_bool() const;
    int64_t as_int() const;
    const std::string &as_string() const;
    std::vector<int64_t> as_int_list() const;
};

// Parses one JSON document; throws with the byte offset of the first error.
Json parse_json(const std::string &text);

// The elements an op saw of a saved buffer: as_strided(buffer, shape, strides,
// storage_offset), all in elements.
struct View {
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    int64_t storage_offset = 0;
};

// One saved tensor: the C-contiguous buffer's bytes, and the view of it that
// the op was given when that was not the buffer itself (tail caches).
struct Array {
    std::string file;
    std::string dtype;  // torch's name: "uint8", "bool", "int32", "bfloat16", ...
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    std::optional<View> view;
};

// A descriptor of the saved buffer itself (C-contiguous, host).
kpool_tensor storage_tensor(Array &array);
// A descriptor of what the op saw: the view when one was recorded, else the buffer.
kpool_tensor view_tensor(Array &array);

// The kpool dtype of a torch dtype name, and its size in bytes.
kpool_dtype dtype_from_name(const std::string &name);
int64_t dtype_size(kpool_dtype dtype);

enum class Op {
    Fwht128QuantFp8,        // "fwht128_quant_fp8"
    CompressAndWriteCache,  // "kpool_compress_and_write_cache"
    SeedTailCache,          // "kpool_seed_tail_cache"
    DecodeUpdateBatched,    // "kpool_decode_update_and_maybe_write_cache_batched"
    // "expand_pools_and_append_tail (+ torch twins)": outputs `fused` and, for
    // each of identity / offsets / page_table, expand_* (expand_pools_to_tokens)
    // and append_* (append_tail_to_topk on that expand_* with seq_lens, pool_lens).
    ExpandPools,
};

struct Case {
    std::string name;
    std::string op_name;
    Op op;
    std::map<std::string, Json> args;
    std::map<std::string, Array> inputs;
    std::map<std::string, Array> outputs;
    Json checks;

    // Throw, naming the case and the key, when it is missing.
    int64_t int_arg(const std::string &key) const;
    std::vector<int64_t> int_list_arg(const std::string &key) const;
    // Older cases leave out arguments that had their default value.
    bool bool_arg(const std::string &key, bool default_value) const;
    const Array &input(const std::string &key) const;
    const Array &output(const std::string &key) const;
    bool has_input(const std::string &key) const;
    bool has_output(const std::string &key) const;
};

struct Dump {
    std::string directory;
    std::vector<Case> cases;
};

// Reads DIR/manifest.json and every .bin it names, checking each file's size
// against its dtype and shape, and each view against its buffer.
Dump load_dump(const std::string &directory);

// A half-open range [offset, offset + size) of a buffer's bytes.
struct ByteRange {
    int64_t offset = 0;
    int64_t size = 0;
};

// A decode token that completes a pool (slot_mapping >= 0, pos >= 0,
// pos % P == P-1) but has no tail block (tail_slot < 0). The reference
// compresses it from tail block 0, which may belong to another request, and
// writes the result; we write nothing (SPEC "Reference defects").
struct SkippedCompletion {
    int64_t request = 0;
    int64_t token = 0;
    int64_t cache_slot = 0;  // slot_mapping[request, token]
    ByteRange k_bytes;       // of the kv_cache buffer: the pool's 128 fp8 K bytes
    ByteRange scale_bytes;   // and its 4 f32 scale bytes
};

// The skipped completions of a decode case, in request then token order;
// empty for every other op.
std::vector<SkippedCompletion> skipped_completions(const Case &decode_case);

// The kv_cache bytes a correct decode must leave: the dump's output, except
// that the ranges of skipped completions keep the input's bytes. For other
// ops with a kv_cache output it is that output unchanged.
std::vector<uint8_t> expected_kv_cache(const Case &c);

// The bytes a correct call must leave in output `key`: expected_kv_cache for
// a decode's kv_cache, else the dump's output.
std::vector<uint8_t> expected_output(const Case &c, const std::string &key);

}  // namespace kpool_dump

#endif  // KPOOL_TESTS_SUPPORT_DUMP_H
