// The libFuzzer harness shared by the kpool fuzz targets (tests/fuzz/).
//
// Each target decodes its input into one call of a kpool C entry point:
// shapes, strides (with padding), dtypes, pool / page / ring sizes, index
// values (negatives other than -1, values past the cache, INT32 / INT64
// extremes, duplicates) and, now and then, one hostile change to a
// descriptor (dtype, rank, a dim, a stride, NULL data, a misaligned pointer,
// another device, a missing tensor). Every tensor lives in its own
// allocation with random canary bytes before and after it and random bytes
// in the padding of strided layouts. After the call:
//   - an error: the status carries the same code and a non-empty message,
//     and no byte of any tensor (canaries and padding included) changed;
//   - success: every byte of every output equals the scalar reference
//     (tests/reference) run on a copy of the same memory, where several
//     writers aim at one slot the slot holds bytes of those writers only
//     (docs/behaviour.md), and no input byte changed.
// Any other outcome prints what differs and aborts, which libFuzzer reports.
//
// Bulk values (keys, scores) come from a PRNG seeded by the input, so that
// the fuzzer spends its bytes on the structure.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kpool/kpool.h"
#include "reference/kpool_reference.h"
#include "support/device.h"

namespace kfuzz {

constexpr int kD = KPOOL_HEAD_DIM;
constexpr int kRowBytes = KPOOL_CACHE_ROW_BYTES;
// Canary bytes before and after the memory of every tensor.
constexpr int64_t kGuard = 64;
// The most bytes a tensor's layout may span (larger inputs are skipped).
constexpr int64_t kMaxSpanBytes = int64_t(1) << 21;

// What the current input decoded to, printed with a violation (and after
// every call when KPOOL_FUZZ_VERBOSE is set).
inline std::string &notes() {
    static std::string text;
    return text;
}
inline void note(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    notes() += line;
    notes() += "\n";
}

// The CUDA replay (tests/test_gpu_fuzz_replay.cpp) runs the targets outside
// libFuzzer, through a GPU: with a device set here every tensor of a call
// lives in device memory (CallMemory), and a violation throws instead of
// aborting, so the replay names the input and goes on. What changes on the
// device (docs/behaviour.md): an out-of-range index is not rejected but
// writes nothing and marks its argument in exec->index_errors (device words);
// the pool ops run in the exact arithmetic (the Triton one is compared with
// it in test_gpu_compress.cpp), so every result is the reference's.
inline kpool_support::Device *&replay_device() {
    static kpool_support::Device *device = nullptr;
    return device;
}
inline bool on_device() { return replay_device() != nullptr; }

struct Violation {
    std::string what;  // the call, then what differs
};

[[noreturn]] inline void violation(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (on_device()) throw Violation{"the call:\n" + notes() + "VIOLATION: " + line};
    std::fprintf(stderr, "\n==== kpool fuzz: the call:\n%s", notes().c_str());
    std::fprintf(stderr, "==== kpool fuzz: VIOLATION: %s\n", line);
    std::fflush(stderr);
    std::abort();
}

#define KFUZZ_CHECK(cond, ...)                  \
    do {                                        \
        if (!(cond)) ::kfuzz::violation(__VA_ARGS__); \
    } while (0)

inline int64_t element_size(int32_t dtype) {
    switch (dtype) {
        case KPOOL_DTYPE_INT64: return 8;
        case KPOOL_DTYPE_INT32:
        case KPOOL_DTYPE_FLOAT32: return 4;
        case KPOOL_DTYPE_BFLOAT16: return 2;
        default: return 1;
    }
}

// Integer arithmetic on values an input controls (shapes, strides, offsets,
// counts: a hostile descriptor puts them at the int64 limits). Every
// operation checks for overflow (__builtin_*_overflow) and an overflowed
// result stays overflowed, so a harness asks once, at the end: a layout
// whose extent int64 cannot hold is one the runtime must reject (or one the
// harness cannot allocate, and skips). value() of an overflowed result is a
// harness bug.
class Checked {
public:
    Checked(int64_t v) : value_(v) {}
    bool overflowed() const { return overflowed_; }
    int64_t value() const {
        if (overflowed_) violation("harness: int64 overflow in a value the harness uses");
        return value_;
    }
    friend Checked operator+(Checked a, Checked b) {
        return a.then(b, __builtin_add_overflow(a.value_, b.value_, &a.value_));
    }
    friend Checked operator-(Checked a, Checked b) {
        return a.then(b, __builtin_sub_overflow(a.value_, b.value_, &a.value_));
    }
    friend Checked operator*(Checked a, Checked b) {
        return a.then(b, __builtin_mul_overflow(a.value_, b.value_, &a.value_));
    }
    Checked &operator+=(Checked b) { return *this = *this + b; }

private:
    Checked then(Checked b, bool overflow) {
        overflowed_ = overflowed_ || b.overflowed_ || overflow;
        return *this;
    }
    int64_t value_;
    bool overflowed_ = false;
};

// The fuzz input: structure from its bytes (FuzzedDataProvider; an
// exhausted input reads as zeros, which every target maps to the benign
// choice), bulk values from a splitmix64 stream seeded by its first bytes.
class Input {
public:
    Input(const uint8_t *data, size_t size) : fdp_(data, size) {
        state_ = fdp_.ConsumeIntegral<uint64_t>() ^ 0x9E3779B97F4A7C15ull;
        notes().clear();
    }
    template <typename T>
    T range(T lo, T hi) {
        return fdp_.ConsumeIntegralInRange<T>(lo, hi);
    }
    int pick(int n) { return range<int>(0, n - 1); }
    // True with probability about per256 / 256 (false on an exhausted input).
    bool chance(int per256) { return int(fdp_.ConsumeIntegral<uint8_t>()) >= 256 - per256; }
    template <typename T>
    T any() {
        return fdp_.ConsumeIntegral<T>();
    }
    bool flag() { return fdp_.ConsumeBool(); }
    size_t remaining() { return fdp_.remaining_bytes(); }

    uint64_t next() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return double(next() >> 11) * 0x1.0p-53; }
    float normal() {
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }

private:
    FuzzedDataProvider fdp_;
    uint64_t state_;
};

// A tensor argument: its descriptor and its own memory, [guard | layout
// span | guard], filled with random bytes.
struct Tensor {
    std::string name;
    int32_t dtype = KPOOL_DTYPE_UINT8;  // raw: may hold an unknown value
    int32_t ndim = 0;
    int64_t shape[KPOOL_MAX_DIMS] = {};
    int64_t strides[KPOOL_MAX_DIMS] = {};
    int32_t device = KPOOL_DEVICE_CPU, device_index = 0;
    bool absent = false;     // passed as a NULL descriptor
    bool null_data = false;  // data = NULL
    int misalign = 0;        // bytes added to the data pointer
    bool tampered = false;   // a hostile change was made to the descriptor

    std::vector<uint8_t> storage;
    int64_t origin = 0;  // byte offset of element 0 in storage

    bool has_dims() const { return ndim >= 0 && ndim <= KPOOL_MAX_DIMS; }
    bool empty() const {
        if (!has_dims()) return false;
        for (int i = 0; i < ndim; i++) {
            if (shape[i] == 0) return true;
        }
        return false;
    }
    bool negative_dim() const {
        if (!has_dims()) return false;
        for (int i = 0; i < ndim; i++) {
            if (shape[i] < 0) return true;
        }
        return false;
    }
    // Elements, saturated (a broadcast dim may be huge).
    int64_t numel() const {
        if (!has_dims() || negative_dim() || empty()) return 0;
        Checked n = 1;
        for (int i = 0; i < ndim; i++) n = n * shape[i];
        return n.overflowed() ? std::numeric_limits<int64_t>::max() : n.value();
    }
    int64_t esize() const { return element_size(dtype); }
    uint8_t *data() { return storage.data() + origin; }
    const uint8_t *data() const { return storage.data() + origin; }

    // Lays out the memory: false when the layout spans too many bytes (or
    // more than int64 can count).
    bool allocate(Input &in) {
        Checked lo = 0, hi = 0;  // element offsets reached
        if (has_dims() && !empty() && !negative_dim()) {
            for (int i = 0; i < ndim; i++) {
                const Checked reach = (Checked(shape[i]) - 1) * strides[i];
                if (reach.overflowed()) return false;
                (reach.value() < 0 ? lo : hi) += reach;
            }
        }
        const Checked span = (hi - lo + 1) * esize();
        if (span.overflowed() || span.value() > kMaxSpanBytes) return false;
        origin = kGuard - lo.value() * esize() + misalign;
        storage.resize(size_t(origin + (hi.value() + 1) * esize() + kGuard));
        for (auto &b : storage) b = uint8_t(in.next());
        return true;
    }

    kpool_tensor desc() const {
        kpool_tensor t;
        std::memset(&t, 0, sizeof t);
        t.data = null_data ? nullptr : const_cast<uint8_t *>(data());
        std::memcpy(&t.dtype, &dtype, sizeof dtype);  // any value, as a C caller may store
        t.ndim = ndim;
        for (int i = 0; i < KPOOL_MAX_DIMS; i++) {
            t.shape[i] = shape[i];
            t.strides[i] = strides[i];
        }
        std::memcpy(&t.device, &device, sizeof device);
        t.device_index = device_index;
        return t;
    }

    // Byte offset (from element 0) of the element at `index` (inside the
    // shape, hence inside the allocated span: no overflow).
    int64_t byte_offset(std::initializer_list<int64_t> index) const {
        Checked o = 0;
        int d = 0;
        for (int64_t i : index) o += Checked(i) * strides[d++];
        return (o * esize()).value();
    }
    // Element `flat` in row-major order of the shape.
    int64_t flat_offset(int64_t flat) const {
        Checked o = 0;
        for (int d = ndim - 1; d >= 0; d--) {
            o += Checked(flat % shape[d]) * strides[d];
            flat /= shape[d];
        }
        return (o * esize()).value();
    }
    template <typename T>
    T load_at(int64_t byte_off) const {
        T v;
        std::memcpy(&v, data() + byte_off, sizeof v);
        return v;
    }
    template <typename T>
    void store_at(int64_t byte_off, T v) {
        std::memcpy(data() + byte_off, &v, sizeof v);
    }
    int64_t get_int(int64_t flat) const {
        const int64_t o = flat_offset(flat);
        switch (dtype) {
            case KPOOL_DTYPE_INT64: return load_at<int64_t>(o);
            case KPOOL_DTYPE_INT32: return load_at<int32_t>(o);
            default: return load_at<uint8_t>(o);
        }
    }
    void set_int(int64_t flat, int64_t v) {
        const int64_t o = flat_offset(flat);
        switch (dtype) {
            case KPOOL_DTYPE_INT64: store_at<int64_t>(o, v); break;
            case KPOOL_DTYPE_INT32: store_at<int32_t>(o, int32_t(v)); break;
            default: store_at<uint8_t>(o, uint8_t(v)); break;
        }
    }
};

// "loc: int64 [3] strides (1) values 5 -1 7" into the notes.
inline void note_tensor(const Tensor &t, bool values = false) {
    std::string s = t.name + ": ";
    if (t.absent) {
        note("%s: NULL", t.name.c_str());
        return;
    }
    s += "dtype " + std::to_string(t.dtype) + " shape [";
    for (int i = 0; i < std::min(std::max(t.ndim, 0), KPOOL_MAX_DIMS); i++) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    s += "] strides (";
    for (int i = 0; i < std::min(std::max(t.ndim, 0), KPOOL_MAX_DIMS); i++) s += (i ? ", " : "") + std::to_string(t.strides[i]);
    s += ")";
    if (t.ndim < 0 || t.ndim > KPOOL_MAX_DIMS) s += " ndim " + std::to_string(t.ndim);
    if (t.device || t.device_index) s += " device " + std::to_string(t.device) + ":" + std::to_string(t.device_index);
    if (t.null_data) s += " data NULL";
    if (t.misalign) s += " misaligned by " + std::to_string(t.misalign);
    if (t.tampered) s += " (tampered)";
    const bool integers = t.dtype == KPOOL_DTYPE_INT32 || t.dtype == KPOOL_DTYPE_INT64 ||
                          t.dtype == KPOOL_DTYPE_BOOL || (t.dtype == KPOOL_DTYPE_UINT8 && t.ndim < 3);
    if (values && integers && t.has_dims() && !t.negative_dim() && !t.storage.empty()) {
        s += " values";
        bool broadcast = false;
        for (int d = 0; d < t.ndim; d++) broadcast = broadcast || (t.strides[d] == 0 && t.shape[d] > 1);
        for (int64_t i = 0; i < std::min<int64_t>(t.numel(), broadcast ? 1 : 64); i++) s += " " + std::to_string(t.get_int(i));
    }
    note("%s", s.c_str());
}

// A descriptor as the op expects it: row-major strides, every outer stride
// padded now and then (a view into a larger allocation).
inline Tensor plan(Input &in, const char *name, int32_t dtype, std::vector<int64_t> shape,
                   bool pad = true) {
    Tensor t;
    t.name = name;
    t.dtype = dtype;
    t.ndim = int32_t(shape.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        int64_t extent = std::max<int64_t>(shape[i], 1);
        int64_t next = stride * extent;
        if (pad && i > 0 && in.chance(64)) next += in.range<int64_t>(1, 40);
        if (i > 0) stride = next;
    }
    // A size-1 dim's stride is arbitrary (torch): any value must do.
    for (int i = 0; i < t.ndim; i++) {
        if (t.shape[i] == 1 && in.chance(32)) t.strides[i] = in.range<int64_t>(-3, 1 << 20);
    }
    return t;
}

// a + b * c modulo 2^64 (hostile fields may already sit at the int64 limits).
inline int64_t wrapping(int64_t a, int64_t b, int64_t c = 1) {
    return int64_t(uint64_t(a) + uint64_t(b) * uint64_t(c));
}

// One hostile change to one field of `t` (which one, from the input).
inline void tamper(Input &in, Tensor &t) {
    t.tampered = true;
    const int what = in.pick(12);
    const int dim = t.ndim > 0 ? in.pick(std::min(t.ndim, KPOOL_MAX_DIMS)) : 0;
    switch (what) {
        case 0: {  // another dtype, known or not
            const int32_t choices[] = {KPOOL_DTYPE_UINT8, KPOOL_DTYPE_BOOL,    KPOOL_DTYPE_INT32,
                                       KPOOL_DTYPE_INT64, KPOOL_DTYPE_BFLOAT16, KPOOL_DTYPE_FLOAT32,
                                       KPOOL_DTYPE_FLOAT8_E4M3FN, -1, 7, 0x7FFFFFFF};
            t.dtype = choices[in.pick(10)];
            break;
        }
        case 1: {  // another rank (new dims of size 1), or a nonsense one
            const int32_t ranks[] = {0, 1, 2, 3, 4, 5, -1, 1000, std::numeric_limits<int32_t>::min()};
            const int32_t r = ranks[in.pick(9)];
            for (int i = std::max(t.ndim, 0); i < KPOOL_MAX_DIMS && i < r; i++) {
                t.shape[i] = 1;
                t.strides[i] = 1;
            }
            t.ndim = r;
            break;
        }
        case 2:  // one dim off by one
            if (t.ndim > 0) t.shape[dim] = wrapping(t.shape[dim], in.flag() ? 1 : -1);
            break;
        case 3:  // an empty dim
            if (t.ndim > 0) t.shape[dim] = 0;
            break;
        case 4: {  // a negative dim
            const int64_t v[] = {-1, -2, std::numeric_limits<int64_t>::min(), -(int64_t(1) << 32)};
            if (t.ndim > 0) t.shape[dim] = v[in.pick(4)];
            break;
        }
        case 5: {  // a huge broadcast dim (stride 0: the memory stays small)
            const int64_t v[] = {int64_t(1) << 31, (int64_t(1) << 32) + 1, int64_t(1) << 40,
                                 std::numeric_limits<int64_t>::max(), int64_t(1) << 62, 3};
            if (t.ndim > 0) {
                t.shape[dim] = v[in.pick(6)];
                t.strides[dim] = 0;
            }
            break;
        }
        case 6: {  // another stride
            if (t.ndim > 0) {
                const int64_t s = t.strides[dim];
                const int64_t v[] = {0, wrapping(0, s, -1), wrapping(s, -1), wrapping(s, 1), s / 2, 1, -1,
                                     wrapping(wrapping(s, s), 3)};
                t.strides[dim] = v[in.pick(8)];
            }
            break;
        }
        case 7: {  // a stride past int32 on a dim of size 1 (ignored) or 0 (empty)
            if (t.ndim > 0) {
                const int64_t v[] = {int64_t(1) << 31, std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
                t.strides[dim] = v[in.pick(3)];
                t.shape[dim] = in.flag() ? 1 : 0;
            }
            break;
        }
        case 8:
            t.null_data = true;
            break;
        case 9:
            t.misalign = in.range<int>(1, 7);
            break;
        case 10: {
            const int32_t dev[] = {KPOOL_DEVICE_CUDA, 2, -1};
            if (in.flag()) {
                t.device = dev[in.pick(3)];
            } else {
                t.device_index = in.flag() ? 1 : -1;
            }
            t.device_index = in.flag() ? t.device_index : in.any<int32_t>();
            break;
        }
        case 11:
            t.absent = true;
            break;
    }
}

// Tampers with one of `ts` when the input asks for it (about 1 call in 6).
inline bool maybe_tamper(Input &in, std::vector<Tensor *> ts) {
    if (ts.empty() || !in.chance(40)) return false;
    tamper(in, *ts[in.pick(int(ts.size()))]);
    if (in.chance(24)) tamper(in, *ts[in.pick(int(ts.size()))]);
    return true;
}

// ---- decoding shared by the targets -------------------------------------

// A count in [1, most], one less now and then (about per256 / 256: an empty
// batch, no pages...).
inline int64_t count_value(Input &in, int64_t most, int per256_one_less) {
    const int64_t n = in.range<int64_t>(1, most);
    return n - (in.chance(per256_one_less) ? 1 : 0);
}

// Allocates every tensor: false (skip the input) when one spans too much.
inline bool allocate_all(Input &in, std::initializer_list<Tensor *> ts) {
    for (Tensor *t : ts) {
        if (!t->allocate(in)) return false;
    }
    return true;
}

// An out [rows, width] of the index ops whose rows overlap now and then (a
// row stride below the width); whether they do.
inline bool overlapping_out_rows(Input &in, Tensor &out) {
    if (in.chance(16) && out.shape[0] > 1) out.strides[0] = in.range<int64_t>(1, std::max<int64_t>(out.shape[1], 1));
    return out.shape[0] > 1 && out.shape[1] > 1 && out.strides[0] < out.shape[1];
}

// Whether the blocks of a tail ring [blocks, 2, ring, 128] overlap as the
// runtime checks it: block stride < half stride + ring * 128. A hostile half
// stride may put that end past int64: such blocks overlap too (no layout
// reaches there), so the call must be rejected.
inline bool tail_blocks_overlap(int64_t blocks, const Tensor &tail, int64_t ring) {
    const Checked block_end = Checked(tail.strides[1]) + Checked(ring) * kD;
    return blocks > 1 && (block_end.overflowed() || tail.strides[0] < block_end.value());
}

// A status the call must fill: poisoned, so a field it leaves shows.
inline kpool_status poisoned_status() {
    kpool_status st;
    std::memset(&st, 0x5A, sizeof st);
    return st;
}

// ---- values -------------------------------------------------------------

inline uint16_t bf16(float v) { return kpool_ref::f32_to_bf16(v); }

// A value for a float element: mostly normal of `sigma`, with non-finite
// and extreme values when `specials`.
inline float random_value(Input &in, float sigma, bool specials) {
    if (specials) {
        const uint64_t r = in.next() % 64;
        const float v[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), -0.0f, 1e-40f, 3e38f, -3e38f, 1e-30f};
        if (r < 8) return v[r];
    }
    return in.normal() * sigma;
}

// Fills every element position of a bf16 / f32 / fp8 tensor's span (the
// padding between rows too) with values; guards stay random bytes.
inline void fill_values(Input &in, Tensor &t, float sigma, bool specials) {
    if (!t.has_dims() || t.empty() || t.negative_dim()) return;
    const int64_t es = t.esize();
    const int64_t first = kGuard + t.misalign, last = int64_t(t.storage.size()) - kGuard;
    for (int64_t o = first; o + es <= last; o += es) {
        const float v = random_value(in, sigma, specials);
        if (t.dtype == KPOOL_DTYPE_BFLOAT16) {
            const uint16_t b = bf16(v);
            std::memcpy(&t.storage[o], &b, 2);
        } else if (t.dtype == KPOOL_DTYPE_FLOAT32) {
            std::memcpy(&t.storage[o], &v, 4);
        }
    }
}

// Whether an index lies past the slots (or blocks) of its cache as the call
// passed it: `passed` counts them from that tensor's shape, a tampered one
// included, where the harness's own plan may count more. A device call
// skips such an entry, and the scalar reference, which writes wherever an
// index says, must not see it. A count past int64 holds every index.
inline bool past_passed(int64_t index, Checked passed) { return !passed.overflowed() && index >= passed.value(); }

// A cache's slots as the call passed it (pages x block size).
inline Checked passed_cache_slots(const Tensor &cache) { return Checked(cache.shape[0]) * cache.shape[1]; }

// Whether tail slot `tslot` lies past the blocks of the tail ring as passed
// (ring = its dim 2; a ring of none holds no slot).
inline bool past_passed_tail(int64_t tslot, const Tensor &tail) {
    const int64_t ring = tail.shape[2];
    return tslot >= 0 && (ring <= 0 || past_passed(tslot / ring, tail.shape[0]));
}

// What a decode call's harness must expect from its indices and layouts:
// slot_mapping entries past the cache's slots, tail slots past the ring's
// blocks (a host call rejects both, a device skips and marks them), as
// planned or as the call passed the caches (a tampered shape), and a page
// stride not a multiple of 4 or overlapping tail blocks (rejected).
struct DecodeFaults {
    bool bad_slot = false, bad_tail_slot = false, bad_layout = false;
    bool out_of_range() const { return bad_slot || bad_tail_slot; }
};
inline DecodeFaults decode_faults(const std::vector<int64_t> &slot_mapping, const std::vector<int64_t> &tail_slots,
                                  int64_t cache_slots, int64_t ring, int64_t tail_blocks, const Tensor &cache,
                                  const Tensor &tail) {
    DecodeFaults f;
    for (int64_t s : slot_mapping) {
        f.bad_slot = f.bad_slot || s >= cache_slots || past_passed(s, passed_cache_slots(cache));
    }
    for (int64_t t : tail_slots) {
        f.bad_tail_slot = f.bad_tail_slot || (t >= 0 && t / ring >= tail_blocks) || past_passed_tail(t, tail);
    }
    f.bad_layout = (cache.shape[0] > 1 && cache.strides[0] % 4 != 0) || tail_blocks_overlap(tail.shape[0], tail, ring);
    return f;
}

// A decode step's float inputs: the tail ring (what earlier stashes wrote:
// non-finite values too), the keys, the scores and ape.
inline void fill_decode_values(Input &in, Tensor &tail, Tensor &key, Tensor &score, Tensor &ape) {
    const bool specials = in.chance(24);
    fill_values(in, tail, 1.0f, specials);
    fill_values(in, key, 1.0f, specials);
    fill_values(in, score, in.flag() ? 2.0f : 60.0f, specials);
    fill_values(in, ape, 0.5f, specials);
}

// An index value for a slot space of `slots` entries (the cache's slots, a
// ring's blocks...): in range mostly, else a hostile one; `prev` are the
// values chosen so far (for duplicates). `wide` allows values past int32.
inline int64_t index_value(Input &in, int64_t slots, const std::vector<int64_t> &prev, bool wide) {
    const int64_t lo32 = std::numeric_limits<int32_t>::min(), hi32 = std::numeric_limits<int32_t>::max();
    switch (in.pick(16)) {
        case 1: return -1;
        case 2: return -in.range<int64_t>(2, 1000);
        case 3: return wide && in.flag() ? std::numeric_limits<int64_t>::min() : lo32;
        case 4: return slots;
        case 5: return slots + in.range<int64_t>(1, 100);
        case 6: return wide && in.flag() ? std::numeric_limits<int64_t>::max() : hi32;
        case 7:
        case 8: return prev.empty() ? 0 : prev[in.range<size_t>(0, prev.size() - 1)];
        case 9: return wide ? (int64_t(1) << 32) + in.range<int64_t>(0, 3) : hi32 - in.range<int64_t>(0, 3);
        case 10: return slots - 1;
        default: return slots > 0 ? int64_t(in.next() % uint64_t(slots)) : -1;
    }
}

// ---- checks ---------------------------------------------------------------

inline void check_status(kpool_status_code rc, const kpool_status &st, bool status_given, const char *op) {
    KFUZZ_CHECK(rc >= KPOOL_OK && rc <= KPOOL_ERROR_INTERNAL, "%s returned an unknown code %d", op, int(rc));
    if (!status_given) return;
    KFUZZ_CHECK(st.code == rc, "%s returned %d but status.code is %d", op, int(rc), int(st.code));
    KFUZZ_CHECK(std::memchr(st.message, 0, sizeof st.message) != nullptr, "%s: message not terminated", op);
    if (rc != KPOOL_OK) {
        KFUZZ_CHECK(st.message[0] != 0, "%s failed (%s) with an empty message", op, kpool_status_name(rc));
    }
    // A host-only build never has device trouble, and an internal error is a
    // validation gap: every bad input must be named before a kernel runs.
    KFUZZ_CHECK(rc != KPOOL_ERROR_INTERNAL && rc != KPOOL_ERROR_DEVICE, "%s: %s: %s", op, kpool_status_name(rc),
                st.message);
}

// The bytes of every tensor before a call.
struct Snapshot {
    std::vector<std::pair<const Tensor *, std::vector<uint8_t>>> saved;
    explicit Snapshot(std::vector<const Tensor *> ts) {
        for (const Tensor *t : ts) saved.emplace_back(t, t->storage);
    }
    const std::vector<uint8_t> &of(const Tensor &t) const {
        for (auto &s : saved) {
            if (s.first == &t) return s.second;
        }
        violation("harness: no snapshot of %s", t.name.c_str());
    }
};

// "byte 300 from element 0 (inside its span)" for storage index b.
inline std::string where(const Tensor &t, size_t b) {
    const int64_t rel = int64_t(b) - t.origin;
    const char *part = int64_t(b) < kGuard                    ? "in the canary before it"
                       : b >= t.storage.size() - size_t(kGuard) ? "in the canary after it"
                                                                : "inside its span";
    return "byte " + std::to_string(rel) + " from element 0 (" + part + ")";
}

// Every byte of `t` equals `want` (canaries and padding included).
inline void check_bytes(const Tensor &t, const std::vector<uint8_t> &want, const char *op, const char *what) {
    KFUZZ_CHECK(t.storage.size() == want.size(), "harness: %s size", t.name.c_str());
    size_t diff = 0, first = 0;
    for (size_t b = 0; b < want.size(); b++) {
        if (t.storage[b] != want[b]) {
            if (diff++ == 0) first = b;
        }
    }
    if (diff) {
        violation("%s: %s: %zu bytes of %s differ, first at %s: expected 0x%02x, got 0x%02x", op, what, diff,
                  t.name.c_str(), where(t, first).c_str(), want[first], t.storage[first]);
    }
}

// Bytes that several writers aim at: each must hold one of the candidates'
// bytes (the writers' rows, as docs/behaviour.md defines).
struct Contested {
    std::map<size_t, std::vector<uint8_t>> bytes;  // storage index -> candidate values
    std::set<size_t> any;                           // bytes whose value is not compared
    // Candidate bytes [byte_off, byte_off + count) from element 0 of `t`.
    void add(const Tensor &t, int64_t byte_off, const uint8_t *candidate, int64_t count) {
        for (int64_t i = 0; i < count; i++) bytes[size_t(t.origin + byte_off + i)].push_back(candidate[i]);
    }
    // Bytes [byte_off, byte_off + count) may hold any value: a slot that an
    // in-range entry of a device call with out-of-range entries writes (the
    // device skips the bad entries; which values the good ones then write is
    // checked by the calls without bad entries), or a decode completion that
    // reads another request's stash of the call on a device. No other byte
    // may move.
    void anything(const Tensor &t, int64_t byte_off, int64_t count) {
        for (int64_t i = 0; i < count; i++) any.insert(size_t(t.origin + byte_off + i));
    }
    bool empty() const { return bytes.empty() && any.empty(); }
};

// Every byte of `t` equals `want`, except contested bytes, which hold one of
// their candidates.
inline void check_bytes_contested(const Tensor &t, const std::vector<uint8_t> &want, const Contested &c,
                                  const char *op, const char *what) {
    size_t diff = 0, first = 0;
    for (size_t b = 0; b < want.size(); b++) {
        if (t.storage[b] != want[b] && c.bytes.count(b) == 0 && c.any.count(b) == 0 && diff++ == 0) first = b;
    }
    if (diff) {
        violation("%s: %s: %zu bytes of %s differ, first at %s: expected 0x%02x, got 0x%02x", op, what, diff,
                  t.name.c_str(), where(t, first).c_str(), want[first], t.storage[first]);
    }
    for (auto &p : c.bytes) {
        if (c.any.count(p.first)) continue;
        const uint8_t got = t.storage[p.first];
        if (std::find(p.second.begin(), p.second.end(), got) == p.second.end()) {
            violation("%s: %s: %s %s holds 0x%02x, which none of the %zu writers aimed at it wrote", op, what,
                      t.name.c_str(), where(t, p.first).c_str(), got, p.second.size());
        }
    }
}

// The tail ring after the seed of `key` / `gate` by `tslot`
// (kpool_seed_tail_cache's rule, by the reference) into `want`; ring slots
// that several seeded tokens aim at go into `contested` (any one of those
// tokens' bytes per byte). tslots outside the ring's blocks are skipped.
inline void seed_by_reference(Tensor &want, const Tensor &key, const Tensor &gate, const Tensor &tslot,
                              int32_t pool_size, Contested &contested) {
    const int64_t count = tslot.shape[0], r = want.shape[2], blocks = want.shape[0];
    Tensor seeded = tslot;
    for (int64_t i = 0; i < count; i++) {
        const int64_t s = tslot.get_int(i);
        if (s >= 0 && s / r >= blocks) seeded.set_int(i, -1);
    }
    {
        const kpool_tensor w = want.desc(), k = key.desc(), g = gate.desc(), ts = seeded.desc();
        kpool_ref::seed_tail_cache(&w, &k, &g, &ts, pool_size, kD);
    }
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> writers;
    for (int64_t i = 0; i < count; i++) {
        const int64_t s = seeded.get_int(i);
        if (s < 0) continue;
        if (i + pool_size < count) {
            const int64_t ahead = seeded.get_int(i + pool_size);
            if (ahead >= 0 && ahead / r == s / r) continue;  // not among its request's last P
        }
        writers[{s / r, s % r}].push_back(i);
    }
    for (auto &[at, tokens] : writers) {
        if (tokens.size() < 2) continue;
        for (int64_t i : tokens) {
            contested.add(want, want.byte_offset({at.first, 0, at.second, 0}), key.data() + key.byte_offset({i, 0}),
                          2 * kD);
            contested.add(want, want.byte_offset({at.first, 1, at.second, 0}), gate.data() + gate.byte_offset({i, 0}),
                          2 * kD);
        }
    }
}

// The pointer or nullptr the reference takes for `t`.
struct Desc {
    kpool_tensor d;
    const kpool_tensor *p;
    explicit Desc(const Tensor &t) : d(t.desc()), p(t.absent ? nullptr : &d) {}
    const kpool_tensor *operator()() const { return p; }
};

// The memory of one call's tensors: their host storage, or on the replay's
// device a copy of each one's whole storage (canaries and padding included)
// that the descriptors point into, the CPU and CUDA device types swapped (a
// tensor left on the host there is the hostile one); finish() brings the
// device bytes back into the storage, where the checks read them.
class CallMemory {
public:
    explicit CallMemory(std::initializer_list<Tensor *> ts) {
        for (Tensor *t : ts) {
            Entry e{t, t->desc(), nullptr};
            if (on_device()) {
                e.buffer = std::make_unique<kpool_support::DeviceBuffer>(*replay_device(), t->storage);
                const kpool_tensor all = e.buffer->contiguous(KPOOL_DTYPE_UINT8, {int64_t(t->storage.size())});
                if (!t->null_data) e.desc.data = static_cast<uint8_t *>(all.data) + t->origin;
                const int32_t device = t->device == KPOOL_DEVICE_CPU    ? KPOOL_DEVICE_CUDA
                                       : t->device == KPOOL_DEVICE_CUDA ? KPOOL_DEVICE_CPU
                                                                        : t->device;
                std::memcpy(&e.desc.device, &device, sizeof device);
            }
            entries_.push_back(std::move(e));
        }
    }
    // The pointer or nullptr the call takes for `t`.
    const kpool_tensor *operator()(const Tensor &t) const {
        for (const Entry &e : entries_) {
            if (e.tensor == &t) return t.absent ? nullptr : &e.desc;
        }
        violation("harness: %s is not in the call's memory", t.name.c_str());
    }
    void finish() {
        for (Entry &e : entries_) {
            if (!e.buffer) continue;
            e.buffer->download();
            e.tensor->storage = e.buffer->host();
        }
    }

private:
    struct Entry {
        Tensor *tensor;
        kpool_tensor desc;
        std::unique_ptr<kpool_support::DeviceBuffer> buffer;
    };
    std::vector<Entry> entries_;
};

// Whether the input wants a status (and an exec) passed, and the exec's
// arithmetic: now and then KPOOL_ARITHMETIC_TRITON, which a CPU call of an op
// with a softmax pool refuses (the others run as in exact), or any int32
// (KPOOL_ARITHMETIC_DEFAULT is exact on the CPU).
enum class PoolOp { kNo, kYes };
// Now and then exec->index_errors too: host words here, which a CPU call
// (it rejects out-of-range indices instead) must never write; misaligned
// ones are rejected. On the replay's device: device words, zeroed, and a
// pool op always gets an exec in the exact arithmetic (a NULL one, or
// DEFAULT, would be the Triton arithmetic there). Not copyable: exec points
// into it.
struct CallOptions {
    bool with_status = true;
    kpool_exec exec{nullptr, KPOOL_ARITHMETIC_EXACT};
    bool with_exec = true;
    const char *rejection = nullptr;  // why the exec alone makes the call fail
    alignas(8) uint8_t words[4 * KPOOL_INDEX_ARGS + 4] = {};
    uint8_t words_before[sizeof(words)] = {};
    std::unique_ptr<kpool_support::DeviceBuffer> device_words;  // on the replay's device
    CallOptions(Input &in, PoolOp pool_op) {
        with_status = !in.chance(16);
        with_exec = !in.chance(16);
        if (in.chance(16) && !on_device()) exec.stream = reinterpret_cast<void *>(uintptr_t(0xdeadbeef));  // ignored on the CPU
        if (in.chance(24)) exec.arithmetic = in.flag() ? KPOOL_ARITHMETIC_TRITON : in.any<int32_t>();
        size_t offset = 0;
        if (in.chance(8)) {
            for (uint8_t &b : words) b = in.any<uint8_t>();
            offset = in.chance(8) ? 1 + in.pick(3) : 0;
            exec.index_errors = reinterpret_cast<int32_t *>(words + offset);
        }
        if (on_device()) {
            if (pool_op == PoolOp::kYes) {
                with_exec = true;
                if (exec.arithmetic == KPOOL_ARITHMETIC_TRITON || exec.arithmetic == KPOOL_ARITHMETIC_DEFAULT) {
                    exec.arithmetic = KPOOL_ARITHMETIC_EXACT;
                }
            }
            std::memset(words, 0, sizeof(words));
            if (exec.index_errors) {
                device_words = std::make_unique<kpool_support::DeviceBuffer>(
                    *replay_device(), std::vector<uint8_t>(words, words + sizeof(words)));
                const kpool_tensor all = device_words->contiguous(KPOOL_DTYPE_UINT8, {int64_t(sizeof(words))});
                exec.index_errors = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(all.data) + offset);
            }
        }
        std::memcpy(words_before, words, sizeof(words));
        if (!with_exec) return;
        if (exec.arithmetic != KPOOL_ARITHMETIC_DEFAULT && exec.arithmetic != KPOOL_ARITHMETIC_EXACT &&
            exec.arithmetic != KPOOL_ARITHMETIC_TRITON) {
            rejection = "an unknown exec->arithmetic";
        } else if (exec.arithmetic == KPOOL_ARITHMETIC_TRITON && pool_op == PoolOp::kYes) {
            rejection = "exec->arithmetic = KPOOL_ARITHMETIC_TRITON on the CPU";
        } else if (reinterpret_cast<uintptr_t>(exec.index_errors) % 4 != 0) {
            rejection = "a misaligned exec->index_errors";
        }
    }
    CallOptions(const CallOptions &) = delete;
    CallOptions &operator=(const CallOptions &) = delete;
    const kpool_exec *ex() const { return with_exec ? &exec : nullptr; }
    // The words as the call left them (read back from the device there).
    bool words_untouched() {
        if (device_words) {
            device_words->download();
            std::memcpy(words, device_words->host().data(), sizeof(words));
        }
        return std::memcmp(words, words_before, sizeof(words)) == 0;
    }
    // On the device, after a call that succeeded: each argument's word is 1
    // exactly where that argument had an out-of-range entry.
    void check_marks(const char *op, std::initializer_list<std::pair<kpool_index_arg, bool>> marked) {
        if (!device_words || !with_exec) return;
        device_words->download();
        int32_t got[KPOOL_INDEX_ARGS];
        std::memcpy(got, device_words->host().data(), sizeof(got));
        for (int a = 0; a < KPOOL_INDEX_ARGS; a++) {
            bool want = false;
            for (auto &[arg, bad] : marked) want = want || (arg == a && bad);
            KFUZZ_CHECK(got[a] == (want ? 1 : 0), "%s: exec->index_errors[%d] = %d, expected %d", op, a, got[a],
                        want ? 1 : 0);
        }
    }
};

inline const int kPoolSizes[] = {1, 2, 4, 8, 16, 32, 64};

// The pool size the shapes are built for (P) and the one passed to the
// call: now and then another value, valid or not, which makes it hostile.
struct PoolSizeChoice {
    int P;
    int32_t pool_size;
    bool hostile;
};
inline PoolSizeChoice pool_size_choice(Input &in) {
    const int P = kPoolSizes[in.pick(7)];
    if (!in.chance(12)) return {P, P, false};
    if (in.chance(12)) {
        const int32_t bad[] = {0, 3, 128, -4, 6, std::numeric_limits<int32_t>::min(), 96};
        return {P, bad[in.pick(7)], true};
    }
    return {P, kPoolSizes[in.pick(7)], true};
}

// Flags passed as int32: mostly 0 / 1, any value now and then (nonzero = on).
inline int32_t flag_value(Input &in, bool usual) {
    if (in.chance(16)) return in.any<int32_t>();
    return usual ? 1 : 0;
}

// Why a descriptor is invalid whatever the call (nullptr if it is not):
// every entry point must reject it.
inline const char *invalid_alone(const Tensor &t, std::initializer_list<int32_t> dtypes) {
    if (t.absent) return "a required tensor is NULL";
    if (!t.has_dims()) return "rank out of range";
    if (t.negative_dim()) return "a negative dim";
    if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) return "a dtype the argument does not take";
    // (On the replay's device the descriptor says CUDA for CPU here, and CPU
    // for CUDA: see CallMemory.)
    if (t.device != KPOOL_DEVICE_CPU) return on_device() ? "another device than the call's" : "a device this build does not run";
    if (on_device() && t.device_index != 0) return "another device index than the call's";
    if (t.null_data && !t.empty()) return "NULL data";
    if (!t.null_data && t.misalign % t.esize() != 0) return "data not aligned to its elements";
    return nullptr;
}

// One call's outcome, checked: a consistent status; when rejected, nothing
// changed; `must_fail` (a reason) forbids success, `must_succeed` failure.
inline bool settle(kpool_status_code rc, const kpool_status &st, CallOptions &o, const char *op,
                   const Snapshot &before, const char *must_fail, bool must_succeed) {
    for (auto &s : before.saved) note_tensor(*s.first, true);
    note("-> %s: %s", kpool_status_name(rc), o.with_status ? st.message : "(no status)");
    if (std::getenv("KPOOL_FUZZ_VERBOSE")) std::fprintf(stderr, "%s\n", notes().c_str());
    check_status(rc, st, o.with_status, op);
    KFUZZ_CHECK(on_device() || o.words_untouched(), "%s wrote exec->index_errors on the CPU", op);
    if (o.rejection) {
        must_fail = must_fail ? must_fail : o.rejection;
        must_succeed = false;
    }
    const char *message = o.with_status ? st.message : "(no status asked for)";
    // A device build has every pool size of the contract, but a development
    // build configured with fewer KPOOL_CUDA_POOL_SIZES refuses the others
    // as unsupported, moving no byte (tests/test_pool_sizes.cpp fails it).
    if (on_device() && rc == KPOOL_ERROR_UNSUPPORTED) must_succeed = false;
    if (rc != KPOOL_OK) {
        KFUZZ_CHECK(!must_succeed, "%s rejected a valid call: %s: %s", op, kpool_status_name(rc), message);
        KFUZZ_CHECK(o.words_untouched(), "%s: a rejected call wrote exec->index_errors", op);
        for (auto &s : before.saved) check_bytes(*s.first, s.second, op, "a rejected call changed memory");
        return false;
    }
    KFUZZ_CHECK(must_fail == nullptr, "%s accepted a call with %s", op, must_fail);
    return true;
}

// The first reason in `reasons` that is not NULL.
inline const char *first_reason(std::initializer_list<const char *> reasons) {
    for (const char *r : reasons) {
        if (r) return r;
    }
    return nullptr;
}

// Writes index values into an integer tensor's elements (as many as both
// have; a tampered shape keeps its random bytes elsewhere).
inline void write_ints(Tensor &t, const std::vector<int64_t> &values) {
    if (!t.has_dims() || t.empty() || t.negative_dim()) return;
    if (t.dtype != KPOOL_DTYPE_INT32 && t.dtype != KPOOL_DTYPE_INT64 && t.dtype != KPOOL_DTYPE_BOOL &&
        t.dtype != KPOOL_DTYPE_UINT8)
        return;
    for (int d = 0; d < t.ndim; d++) {
        if (t.strides[d] == 0 && t.shape[d] > 1) return;  // a broadcast: one element seen many times
    }
    const int64_t n = std::min<int64_t>(t.numel(), int64_t(values.size()));
    for (int64_t i = 0; i < n; i++) t.set_int(i, values[i]);
}

// A descriptor with explicit strides (layouts with fixed inner strides).
inline Tensor explicit_layout(const char *name, int32_t dtype, std::vector<int64_t> shape,
                              std::vector<int64_t> strides) {
    Tensor t;
    t.name = name;
    t.dtype = dtype;
    t.ndim = int32_t(shape.size());
    for (int i = 0; i < t.ndim; i++) {
        t.shape[i] = shape[i];
        t.strides[i] = strides[i];
    }
    return t;
}

// The paged K cache [pages, block_size, 132] uint8, pages padded now and
// then (by a multiple of 4 bytes, or, rarely, by any amount).
inline Tensor cache_layout(Input &in, int64_t pages, int64_t block_size) {
    int64_t page = block_size * kRowBytes;
    if (in.chance(64)) page += 4 * in.range<int64_t>(1, 9);
    if (in.chance(8)) page += in.range<int64_t>(1, 3);
    return explicit_layout("kv_cache", KPOOL_DTYPE_UINT8, {pages, block_size, kRowBytes}, {page, kRowBytes, 1});
}

// The tail ring [blocks, 2, ring, 128] bf16, halves and blocks padded now and then.
inline Tensor tail_layout(Input &in, int64_t blocks, int64_t ring) {
    int64_t half = ring * kD;
    if (in.chance(64)) half += in.range<int64_t>(1, 200);
    int64_t block = 2 * half;
    if (in.chance(64)) block += in.range<int64_t>(1, 300);
    if (in.chance(8)) block = half + ring * kD - in.range<int64_t>(1, 64);  // overlapping blocks
    return explicit_layout("tail_kv_cache", KPOOL_DTYPE_BFLOAT16, {blocks, 2, ring, kD}, {block, half, kD, 1});
}

inline int64_t block_size_value(Input &in) {
    const int64_t v[] = {16, 64, 1, 2, 3, 5, 8, 32};
    return in.chance(32) ? in.range<int64_t>(1, 80) : v[in.pick(8)];
}

// head_dim: 128, or now and then something else.
inline int32_t head_dim_value(Input &in) {
    if (!in.chance(8)) return kD;
    const int32_t v[] = {64, 129, 0, -128, 256};
    return v[in.pick(5)];
}

// The byte offsets of cache slot `loc`'s 128 codes and 4-byte scale.
struct CacheSlotBytes {
    int64_t codes, scale;
};
inline CacheSlotBytes cache_slot_bytes(const Tensor &cache, int64_t loc) {
    const int64_t bs = cache.shape[1], page = loc / bs, slot = loc % bs;
    const Checked page_start = Checked(page) * (cache.shape[0] > 1 ? Checked(cache.strides[0]) : Checked(bs) * kRowBytes);
    return {(page_start + slot * kD).value(), (page_start + Checked(bs) * kD + slot * 4).value()};
}

}  // namespace kfuzz
