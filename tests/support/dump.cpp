#include "support/dump.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kpool_dump {
namespace {

[[noreturn]] void fail(const std::string &message) { throw std::runtime_error(message); }

const char *kind_name(Json::Kind kind) {
    switch (kind) {
        case Json::Kind::Null: return "null";
        case Json::Kind::Bool: return "a bool";
        case Json::Kind::Integer: return "an integer";
        case Json::Kind::Real: return "a real number";
        case Json::Kind::String: return "a string";
        case Json::Kind::Array: return "an array";
        case Json::Kind::Object: return "an object";
    }
    return "?";
}

void expect_kind(const Json &value, Json::Kind kind) {
    if (value.kind != kind) {
        fail(std::string("JSON: expected ") + kind_name(kind) + ", found " + kind_name(value.kind));
    }
}

// A recursive-descent parser for RFC 8259 JSON.
class JsonParser {
public:
    explicit JsonParser(const std::string &text) : text_(text) {}

    Json parse_document() {
        Json value = parse_value(0);
        skip_whitespace();
        if (pos_ != text_.size()) error("unexpected text after the document");
        return value;
    }

private:
    // Deep enough for any manifest, shallow enough that hostile input cannot
    // exhaust the stack.
    static constexpr int kMaxDepth = 256;

    [[noreturn]] void error(const std::string &what) const {
        fail("JSON: " + what + " at byte " + std::to_string(pos_));
    }

    bool at_end() const { return pos_ >= text_.size(); }
    char peek() const { return at_end() ? '\0' : text_[pos_]; }

    void skip_whitespace() {
        while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) {
            ++pos_;
        }
    }

    void expect(char c) {
        if (peek() != c) error(std::string("expected '") + c + "'");
        ++pos_;
    }

    Json parse_value(int depth) {
        if (depth > kMaxDepth) error("nesting too deep");
        skip_whitespace();
        switch (peek()) {
            case '{': return parse_object(depth);
            case '[': return parse_array(depth);
            case '"': {
                Json value;
                value.kind = Json::Kind::String;
                value.string = parse_string();
                return value;
            }
            case 't': return parse_literal("true", Json::Kind::Bool, true);
            case 'f': return parse_literal("false", Json::Kind::Bool, false);
            case 'n': return parse_literal("null", Json::Kind::Null, false);
            default: return parse_number();
        }
    }

    Json parse_literal(const char *word, Json::Kind kind, bool boolean) {
        const size_t length = std::strlen(word);
        if (text_.compare(pos_, length, word) != 0) error("invalid literal");
        pos_ += length;
        Json value;
        value.kind = kind;
        value.boolean = boolean;
        return value;
    }

    Json parse_object(int depth) {
        expect('{');
        Json value;
        value.kind = Json::Kind::Object;
        skip_whitespace();
        if (peek() == '}') {
            ++pos_;
            return value;
        }
        for (;;) {
            skip_whitespace();
            std::string key = parse_string();
            skip_whitespace();
            expect(':');
            value.object.emplace_back(std::move(key), parse_value(depth + 1));
            skip_whitespace();
            if (peek() == '}') {
                ++pos_;
                return value;
            }
            expect(',');
        }
    }

    Json parse_array(int depth) {
        expect('[');
        Json value;
        value.kind = Json::Kind::Array;
        skip_whitespace();
        if (peek() == ']') {
            ++pos_;
            return value;
        }
        for (;;) {
            value.array.push_back(parse_value(depth + 1));
            skip_whitespace();
            if (peek() == ']') {
                ++pos_;
                return value;
            }
            expect(',');
        }
    }

    static int hex_digit_value(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    unsigned parse_hex4() {
        if (pos_ + 4 > text_.size()) error("truncated \\u escape");
        unsigned code = 0;
        for (int i = 0; i < 4; ++i) {
            const int digit = hex_digit_value(text_[pos_++]);
            if (digit < 0) error("invalid hex digit in \\u escape");
            code = (code << 4) | unsigned(digit);
        }
        return code;
    }

    static void append_utf8(std::string &out, unsigned code_point) {
        if (code_point < 0x80) {
            out += char(code_point);
        } else if (code_point < 0x800) {
            out += char(0xC0 | (code_point >> 6));
            out += char(0x80 | (code_point & 0x3F));
        } else if (code_point < 0x10000) {
            out += char(0xE0 | (code_point >> 12));
            out += char(0x80 | ((code_point >> 6) & 0x3F));
            out += char(0x80 | (code_point & 0x3F));
        } else {
            out += char(0xF0 | (code_point >> 18));
            out += char(0x80 | ((code_point >> 12) & 0x3F));
            out += char(0x80 | ((code_point >> 6) & 0x3F));
            out += char(0x80 | (code_point & 0x3F));
        }
    }

    std::string parse_string() {
        expect('"');
        std::string out;
        for (;;) {
            if (at_end()) error("unterminated string");
            const char c = text_[pos_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (at_end()) error("unterminated escape");
            switch (text_[pos_++]) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned code_point = parse_hex4();
                    if (code_point >= 0xD800 && code_point <= 0xDBFF) {
                        // A high surrogate must be followed by an escaped low one.
                        if (text_.compare(pos_, 2, "\\u") != 0) error("lone high surrogate");
                        pos_ += 2;
                        const unsigned low = parse_hex4();
                        if (low < 0xDC00 || low > 0xDFFF) error("invalid low surrogate");
                        code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
                    } else if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
                        error("lone low surrogate");
                    }
                    append_utf8(out, code_point);
                    break;
                }
                default: error("invalid escape");
            }
        }
    }

    bool consume_digits() {
        const size_t start = pos_;
        while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
        return pos_ > start;
    }

    Json parse_number() {
        const size_t start = pos_;
        if (peek() == '-') ++pos_;
        if (peek() == '0') {
            ++pos_;
        } else if (!consume_digits()) {
            error("invalid value");
        }
        bool integral = true;
        if (peek() == '.') {
            ++pos_;
            integral = false;
            if (!consume_digits()) error("digits expected after '.'");
        }
        if (peek() == 'e' || peek() == 'E') {
            ++pos_;
            integral = false;
            if (peek() == '+' || peek() == '-') ++pos_;
            if (!consume_digits()) error("digits expected in exponent");
        }
        const std::string literal = text_.substr(start, pos_ - start);
        Json value;
        if (integral) {
            errno = 0;
            const long long integer = std::strtoll(literal.c_str(), nullptr, 10);
            if (errno == 0) {
                value.kind = Json::Kind::Integer;
                value.integer = integer;
                return value;
            }
        }
        // Fractions, exponents and integers beyond int64.
        value.kind = Json::Kind::Real;
        value.real = std::strtod(literal.c_str(), nullptr);
        return value;
    }

    const std::string &text_;
    size_t pos_ = 0;
};

std::string read_text_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open " + path);
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
}

std::vector<uint8_t> read_binary_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) fail("cannot open " + path);
    const std::streamsize size = in.tellg();
    in.seekg(0);
    std::vector<uint8_t> bytes(static_cast<size_t>(size));
    if (size > 0 && !in.read(reinterpret_cast<char *>(bytes.data()), size)) {
        fail("cannot read " + path);
    }
    return bytes;
}

const Json &member(const Json &object, const std::string &key, const std::string &context) {
    const Json *value = object.find(key);
    if (!value) fail(context + ": missing \"" + key + "\"");
    return *value;
}

int64_t element_count(const std::vector<int64_t> &shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return count;
}

std::vector<int64_t> checked_shape(const Json &value, const std::string &context) {
    std::vector<int64_t> shape = value.as_int_list();
    if (shape.size() > KPOOL_MAX_DIMS) {
        fail(context + ": " + std::to_string(shape.size()) + " dimensions (at most " +
             std::to_string(KPOOL_MAX_DIMS) + ")");
    }
    for (int64_t extent : shape) {
        if (extent < 0) fail(context + ": negative extent " + std::to_string(extent));
    }
    return shape;
}

// The view must address only elements of the saved buffer.
void check_view(const View &view, int64_t buffer_elements, const std::string &context) {
    if (view.strides.size() != view.shape.size())
        fail(context + ": view strides and shape differ in rank");
    if (view.storage_offset < 0) fail(context + ": negative view storage_offset");
    if (element_count(view.shape) == 0) return;
    int64_t last = view.storage_offset;
    for (size_t d = 0; d < view.shape.size(); ++d) {
        if (view.strides[d] < 0) fail(context + ": negative view stride");
        last += (view.shape[d] - 1) * view.strides[d];
    }
    if (last >= buffer_elements) {
        fail(context + ": view reaches element " + std::to_string(last) + " of a buffer of " +
             std::to_string(buffer_elements));
    }
}

Array load_array(const std::string &directory, const Json &entry, const std::string &context) {
    Array array;
    array.file = member(entry, "file", context).as_string();
    array.dtype = member(entry, "dtype", context).as_string();
    array.shape = checked_shape(member(entry, "shape", context), context + " shape");
    array.bytes = read_binary_file(directory + "/" + array.file);
    const int64_t elements = element_count(array.shape);
    const int64_t expected_bytes = elements * dtype_size(dtype_from_name(array.dtype));
    const int64_t stated_bytes = member(entry, "nbytes", context).as_int();
    if (int64_t(array.bytes.size()) != expected_bytes || stated_bytes != expected_bytes) {
        fail(context + ": " + array.file + " has " + std::to_string(array.bytes.size()) +
             " bytes, manifest says " + std::to_string(stated_bytes) + ", " + array.dtype +
             " shape needs " + std::to_string(expected_bytes));
    }
    if (const Json *view = entry.find("view")) {
        View v;
        v.shape = checked_shape(member(*view, "shape", context + " view"), context + " view shape");
        v.strides = member(*view, "strides", context + " view").as_int_list();
        v.storage_offset = member(*view, "storage_offset", context + " view").as_int();
        check_view(v, elements, context);
        array.view = std::move(v);
    }
    return array;
}

std::map<std::string, Array> load_arrays(const std::string &directory, const Json &entries,
                                         const std::string &context) {
    expect_kind(entries, Json::Kind::Object);
    std::map<std::string, Array> arrays;
    for (const auto &[key, entry] : entries.object) {
        arrays.emplace(key, load_array(directory, entry, context + " " + key));
    }
    return arrays;
}

Op op_from_name(const std::string &name, const std::string &context) {
    if (name == "fwht128_quant_fp8") return Op::Fwht128QuantFp8;
    if (name == "kpool_compress_and_write_cache") return Op::CompressAndWriteCache;
    if (name == "kpool_seed_tail_cache") return Op::SeedTailCache;
    if (name == "kpool_decode_update_and_maybe_write_cache_batched") return Op::DecodeUpdateBatched;
    if (name == "expand_pools_and_append_tail (+ torch twins)") return Op::ExpandPools;
    fail(context + ": unknown op \"" + name + "\"");
}

kpool_tensor tensor_of(Array &array, const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &strides, int64_t storage_offset) {
    kpool_tensor tensor{};
    tensor.dtype = dtype_from_name(array.dtype);
    tensor.data = array.bytes.data() + storage_offset * dtype_size(tensor.dtype);
    tensor.ndim = static_cast<int32_t>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
        tensor.shape[d] = shape[d];
        tensor.strides[d] = strides[d];
    }
    tensor.device = KPOOL_DEVICE_CPU;
    tensor.device_index = 0;
    return tensor;
}

// Element `index` of a saved int32 or int64 array.
int64_t int_element(const Array &array, int64_t index) {
    if (array.dtype == "int32") {
        int32_t value;
        std::memcpy(&value, array.bytes.data() + index * 4, 4);
        return value;
    }
    if (array.dtype == "int64") {
        int64_t value;
        std::memcpy(&value, array.bytes.data() + index * 8, 8);
        return value;
    }
    fail(array.file + ": expected int32 or int64, found " + array.dtype);
}

}  // namespace

// ---- Json ----------------------------------------------------------------------

const Json *Json::find(const std::string &key) const {
    for (const auto &[name, value] : object) {
        if (name == key) return &value;
    }
    return nullptr;
}

bool Json::as_bool() const {
    expect_kind(*this, Kind::Bool);
    return boolean;
}

int64_t Json::as_int() const {
    expect_kind(*this, Kind::Integer);
    return integer;
}

const std::string &Json::as_string() const {
    expect_kind(*this, Kind::String);
    return string;
}

std::vector<int64_t> Json::as_int_list() const {
    expect_kind(*this, Kind::Array);
    std::vector<int64_t> values;
    for (const Json &element : array) values.push_back(element.as_int());
    return values;
}

Json parse_json(const std::string &text) { return JsonParser(text).parse_document(); }

// ---- Arrays --------------------------------------------------------------------

kpool_dtype dtype_from_name(const std::string &name) {
    if (name == "uint8") return KPOOL_DTYPE_UINT8;
    if (name == "bool") return KPOOL_DTYPE_BOOL;
    if (name == "int32") return KPOOL_DTYPE_INT32;
    if (name == "int64") return KPOOL_DTYPE_INT64;
    if (name == "bfloat16") return KPOOL_DTYPE_BFLOAT16;
    if (name == "float32") return KPOOL_DTYPE_FLOAT32;
    if (name == "float8_e4m3fn") return KPOOL_DTYPE_FLOAT8_E4M3FN;
    fail("unknown dtype \"" + name + "\"");
}

int64_t dtype_size(kpool_dtype dtype) {
    switch (dtype) {
        case KPOOL_DTYPE_UINT8:
        case KPOOL_DTYPE_BOOL:
        case KPOOL_DTYPE_FLOAT8_E4M3FN: return 1;
        case KPOOL_DTYPE_BFLOAT16: return 2;
        case KPOOL_DTYPE_INT32:
        case KPOOL_DTYPE_FLOAT32: return 4;
        case KPOOL_DTYPE_INT64: return 8;
    }
    fail("unknown dtype code " + std::to_string(int(dtype)));
}

kpool_tensor storage_tensor(Array &array) {
    std::vector<int64_t> strides(array.shape.size());
    int64_t stride = 1;
    for (size_t d = array.shape.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= array.shape[d];
    }
    return tensor_of(array, array.shape, strides, 0);
}

kpool_tensor view_tensor(Array &array) {
    if (!array.view) return storage_tensor(array);
    return tensor_of(array, array.view->shape, array.view->strides, array.view->storage_offset);
}

// ---- Cases ---------------------------------------------------------------------

int64_t Case::int_arg(const std::string &key) const {
    const auto it = args.find(key);
    if (it == args.end()) fail(name + ": no argument \"" + key + "\"");
    return it->second.as_int();
}

std::vector<int64_t> Case::int_list_arg(const std::string &key) const {
    const auto it = args.find(key);
    if (it == args.end()) fail(name + ": no argument \"" + key + "\"");
    return it->second.as_int_list();
}

bool Case::bool_arg(const std::string &key, bool default_value) const {
    const auto it = args.find(key);
    return it == args.end() ? default_value : it->second.as_bool();
}

const Array &Case::input(const std::string &key) const {
    const auto it = inputs.find(key);
    if (it == inputs.end()) fail(name + ": no input \"" + key + "\"");
    return it->second;
}

const Array &Case::output(const std::string &key) const {
    const auto it = outputs.find(key);
    if (it == outputs.end()) fail(name + ": no output \"" + key + "\"");
    return it->second;
}

bool Case::has_input(const std::string &key) const { return inputs.count(key) != 0; }
bool Case::has_output(const std::string &key) const { return outputs.count(key) != 0; }

Dump load_dump(const std::string &directory) {
    const std::string manifest_path = directory + "/manifest.json";
    Json manifest;
    try {
        manifest = parse_json(read_text_file(manifest_path));
    } catch (const std::runtime_error &e) {
        fail(manifest_path + ": " + e.what());
    }
    Dump dump;
    dump.directory = directory;
    const Json &cases = member(manifest, "cases", manifest_path);
    expect_kind(cases, Json::Kind::Array);
    for (const Json &entry : cases.array) {
        Case c;
        c.name = member(entry, "name", manifest_path).as_string();
        const std::string context = manifest_path + " case " + c.name;
        c.op_name = member(entry, "op", context).as_string();
        c.op = op_from_name(c.op_name, context);
        const Json &args = member(entry, "args", context);
        expect_kind(args, Json::Kind::Object);
        for (const auto &[key, value] : args.object) c.args.emplace(key, value);
        c.inputs = load_arrays(directory, member(entry, "inputs", context), context + " input");
        c.outputs = load_arrays(directory, member(entry, "outputs", context), context + " output");
        if (const Json *checks = entry.find("checks")) c.checks = *checks;
        dump.cases.push_back(std::move(c));
    }
    return dump;
}

// ---- Where the reference is not the contract ---------------------------------

std::vector<SkippedCompletion> skipped_completions(const Case &decode_case) {
    std::vector<SkippedCompletion> skipped;
    if (decode_case.op != Op::DecodeUpdateBatched) return skipped;
    const int64_t pool_size = decode_case.int_arg("pool_size");
    const Array &positions = decode_case.input("positions");
    const Array &tail_slots = decode_case.input("tail_slot_mapping");
    const Array &cache_slots = decode_case.input("slot_mapping");
    const Array &kv_cache = decode_case.input("kv_cache");
    if (positions.shape.size() != 2 || tail_slots.shape != positions.shape ||
        cache_slots.shape != positions.shape || kv_cache.shape.size() != 3) {
        fail(decode_case.name + ": unexpected decode input shapes");
    }
    // The saved kv_cache is C-contiguous [num_blocks, block_size, row_bytes].
    const int64_t block_size = kv_cache.shape[1];
    const int64_t page_stride = block_size * kv_cache.shape[2];
    const int64_t tokens_per_request = positions.shape[1];
    for (int64_t r = 0; r < positions.shape[0]; ++r) {
        for (int64_t t = 0; t < tokens_per_request; ++t) {
            const int64_t index = r * tokens_per_request + t;
            const int64_t pos = int_element(positions, index);
            const int64_t cache_slot = int_element(cache_slots, index);
            const bool completes_pool =
                cache_slot >= 0 && pos >= 0 && pos % pool_size == pool_size - 1;
            if (!completes_pool || int_element(tail_slots, index) >= 0) continue;
            const int64_t page_offset = cache_slot / block_size * page_stride;
            const int64_t slot_in_page = cache_slot % block_size;
            SkippedCompletion completion;
            completion.request = r;
            completion.token = t;
            completion.cache_slot = cache_slot;
            completion.k_bytes = {page_offset + slot_in_page * KPOOL_HEAD_DIM, KPOOL_HEAD_DIM};
            completion.scale_bytes = {page_offset + block_size * KPOOL_HEAD_DIM + slot_in_page * 4,
                                      4};
            skipped.push_back(completion);
        }
    }
    return skipped;
}

std::vector<uint8_t> expected_kv_cache(const Case &c) {
    std::vector<uint8_t> expected = c.output("kv_cache").bytes;
    const std::vector<uint8_t> &input = c.input("kv_cache").bytes;
    if (input.size() != expected.size()) fail(c.name + ": kv_cache input and output sizes differ");
    for (const SkippedCompletion &completion : skipped_completions(c)) {
        for (const ByteRange &range : {completion.k_bytes, completion.scale_bytes}) {
            if (range.offset + range.size > int64_t(input.size())) {
                fail(c.name + ": cache slot " + std::to_string(completion.cache_slot) +
                     " is outside kv_cache");
            }
            std::memcpy(expected.data() + range.offset, input.data() + range.offset, range.size);
        }
    }
    return expected;
}

std::vector<uint8_t> expected_output(const Case &c, const std::string &key) {
    if (c.op == Op::DecodeUpdateBatched && key == "kv_cache") return expected_kv_cache(c);
    return c.output(key).bytes;
}

}  // namespace kpool_dump
