// Shared helpers of the kpool test suite: host tensors with explicit strides,
// engine-shaped random data, byte comparisons that say where and how much.
#ifndef KPOOL_TESTS_TEST_UTIL_H
#define KPOOL_TESTS_TEST_UTIL_H

#include <gmock/gmock.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <random>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "kpool/kpool.h"
#include "reference/kpool_reference.h"

namespace kpool_test {

constexpr int kD = KPOOL_HEAD_DIM;
constexpr int kRowBytes = KPOOL_CACHE_ROW_BYTES;  // one pool in a cache page: 128 codes + f32 scale

inline size_t dtype_size(kpool_dtype dtype) {
    switch (dtype) {
        case KPOOL_DTYPE_UINT8:
        case KPOOL_DTYPE_BOOL:
        case KPOOL_DTYPE_FLOAT8_E4M3FN: return 1;
        case KPOOL_DTYPE_BFLOAT16: return 2;
        case KPOOL_DTYPE_INT32:
        case KPOOL_DTYPE_FLOAT32: return 4;
        case KPOOL_DTYPE_INT64: return 8;
    }
    return 1;
}

// A host tensor that owns its bytes. Strides are in elements, outermost
// first; when not given they are row-major. The storage covers exactly the
// elements the strides reach (plus slack so empty tensors still have a
// non-NULL pointer), so padding between rows is real memory that a stray
// write would change.
class HostTensor {
public:
    HostTensor() = default;
    HostTensor(kpool_dtype dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {})
        : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
        if (strides_.empty()) {
            strides_.assign(shape_.size(), 1);
            // As torch does: an empty dim counts as 1, so strides stay positive.
            for (int i = static_cast<int>(shape_.size()) - 2; i >= 0; --i) {
                strides_[i] = strides_[i + 1] * std::max<int64_t>(shape_[i + 1], 1);
            }
        }
        int64_t span = 1;  // elements from the first to one past the last
        bool empty = false;
        for (size_t i = 0; i < shape_.size(); ++i) {
            if (shape_[i] == 0) empty = true;
            span += (shape_[i] - 1) * strides_[i];
        }
        // A padded outer stride means the allocation holds whole outer rows
        // (an engine's view of a larger buffer): include the last one's padding.
        if (!shape_.empty()) span = std::max(span, shape_[0] * strides_[0]);
        if (empty) span = 0;
        bytes_.assign(static_cast<size_t>(span) * dtype_size(dtype_) + 64, 0);
        span_elems_ = span;
    }

    kpool_tensor desc() const {
        kpool_tensor t{};
        t.data = const_cast<uint8_t *>(bytes_.data());
        t.dtype = dtype_;
        t.ndim = static_cast<int32_t>(shape_.size());
        for (size_t i = 0; i < shape_.size(); ++i) {
            t.shape[i] = shape_[i];
            t.strides[i] = strides_[i];
        }
        t.device = KPOOL_DEVICE_CPU;
        t.device_index = 0;
        return t;
    }

    kpool_dtype dtype() const { return dtype_; }
    const std::vector<int64_t> &shape() const { return shape_; }
    const std::vector<int64_t> &strides() const { return strides_; }
    int64_t shape(int i) const { return shape_[i]; }
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape_) n *= s;
        return n;
    }
    // Elements from the first to one past the last addressable (padding included).
    int64_t span_elems() const { return span_elems_; }
    std::vector<uint8_t> &bytes() { return bytes_; }
    const std::vector<uint8_t> &bytes() const { return bytes_; }
    uint8_t *raw() { return bytes_.data(); }

    int64_t offset(std::initializer_list<int64_t> index) const {
        int64_t o = 0;
        int d = 0;
        for (int64_t i : index) o += i * strides_[d++];
        return o;
    }
    template <typename T>
    T get(std::initializer_list<int64_t> index) const {
        T v;
        std::memcpy(&v, bytes_.data() + offset(index) * dtype_size(dtype_), sizeof(T));
        return v;
    }
    template <typename T>
    void set(std::initializer_list<int64_t> index, T v) {
        std::memcpy(bytes_.data() + offset(index) * dtype_size(dtype_), &v, sizeof(T));
    }
    // An integer element of any integer dtype, as int64 (write: narrowed).
    int64_t get_int(std::initializer_list<int64_t> index) const {
        switch (dtype_) {
            case KPOOL_DTYPE_INT32: return get<int32_t>(index);
            case KPOOL_DTYPE_INT64: return get<int64_t>(index);
            default: return get<uint8_t>(index);
        }
    }
    void set_int(std::initializer_list<int64_t> index, int64_t v) {
        switch (dtype_) {
            case KPOOL_DTYPE_INT32: set<int32_t>(index, static_cast<int32_t>(v)); break;
            case KPOOL_DTYPE_INT64: set<int64_t>(index, v); break;
            default: set<uint8_t>(index, static_cast<uint8_t>(v)); break;
        }
    }

    void fill_byte(uint8_t b) { std::fill(bytes_.begin(), bytes_.end(), b); }
    void fill_random_bytes(std::mt19937 &rng) {
        for (auto &b : bytes_) b = static_cast<uint8_t>(rng());
    }

private:
    kpool_dtype dtype_ = KPOOL_DTYPE_UINT8;
    std::vector<int64_t> shape_;
    std::vector<int64_t> strides_;
    std::vector<uint8_t> bytes_;
    int64_t span_elems_ = 0;
};

inline uint16_t bf16_of(float v) { return kpool_ref::f32_to_bf16(v); }

// Random values as an engine has them: bf16 of a normal with the given sigma.
inline uint16_t random_bf16(std::mt19937 &rng, float sigma = 1.0f) {
    if (sigma == 0.0f) return 0;
    std::normal_distribution<float> normal(0.0f, sigma);
    return bf16_of(normal(rng));
}

// Fills every addressable element of a bf16 or f32 tensor (padding too) with
// normal values: padding holds finite numbers so only a real misread shows.
inline void fill_normal(HostTensor &t, std::mt19937 &rng, float sigma = 1.0f) {
    std::normal_distribution<float> normal(0.0f, sigma > 0.0f ? sigma : 1.0f);
    if (sigma == 0.0f) {
        t.fill_byte(0);
        return;
    }
    const int64_t n = t.span_elems();
    if (t.dtype() == KPOOL_DTYPE_BFLOAT16) {
        auto *p = reinterpret_cast<uint16_t *>(t.raw());
        for (int64_t i = 0; i < n; ++i) p[i] = bf16_of(normal(rng));
    } else {
        auto *p = reinterpret_cast<float *>(t.raw());
        for (int64_t i = 0; i < n; ++i) p[i] = normal(rng);
    }
}

// `count` distinct values of [0, range), in random order. More than the
// range holds is the caller's mistake (resizing would repeat slot 0: two
// pools racing for one cache row on a GPU).
inline std::vector<int64_t> distinct_slots(std::mt19937 &rng, int64_t range, int64_t count) {
    if (count > range) {
        throw std::invalid_argument("distinct_slots: " + std::to_string(count) + " distinct values of a range of " +
                                    std::to_string(range));
    }
    std::vector<int64_t> all(range);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(count);
    return all;
}

// Byte-exact comparison that reports how many bytes differ and the first few.
inline ::testing::AssertionResult BytesEqual(const char *expected_expr, const char *actual_expr,
                                             const std::vector<uint8_t> &e, const std::vector<uint8_t> &a) {
    if (e.size() != a.size()) {
        return ::testing::AssertionFailure()
               << actual_expr << " has " << a.size() << " bytes, " << expected_expr << " "
               << e.size();
    }
    int64_t mismatches = 0;
    std::ostringstream first;
    for (size_t i = 0; i < e.size(); ++i) {
        if (e[i] != a[i]) {
            if (mismatches < 8) {
                first << "\n  byte " << i << ": expected 0x" << std::hex << int(e[i]) << " got 0x"
                      << int(a[i]) << std::dec;
            }
            ++mismatches;
        }
    }
    if (mismatches == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << actual_expr << " differs from " << expected_expr << " in " << mismatches << " of "
           << e.size() << " bytes:" << first.str();
}

inline ::testing::AssertionResult BytesEqual(const char *expected_expr, const char *actual_expr,
                                             const HostTensor &expected, const HostTensor &actual) {
    return BytesEqual(expected_expr, actual_expr, expected.bytes(), actual.bytes());
}

#define EXPECT_BYTES_EQ(expected, actual) EXPECT_PRED_FORMAT2(::kpool_test::BytesEqual, expected, actual)
#define ASSERT_BYTES_EQ(expected, actual) ASSERT_PRED_FORMAT2(::kpool_test::BytesEqual, expected, actual)

// A C API call that must succeed: its code and status.code, with the message.
#define ASSERT_KPOOL_OK(expr, status)                                                   \
    do {                                                                                \
        const kpool_status_code rc_ = (expr);                                           \
        ASSERT_EQ(rc_, KPOOL_OK) << kpool_status_name(rc_) << ": " << (status).message; \
        ASSERT_EQ((status).code, KPOOL_OK) << (status).message;                         \
    } while (0)

// A copy of `src` laid out with other strides (a view into a padded
// allocation, as an engine's tensors often are). Padding bytes are `pad`:
// 0xFF makes a misread float a NaN and a misread index -1.
inline HostTensor restride(const HostTensor &src, std::vector<int64_t> strides, uint8_t pad = 0xFF) {
    HostTensor dst(src.dtype(), src.shape(), strides);
    dst.fill_byte(pad);
    if (src.numel() == 0) return dst;
    const size_t es = dtype_size(src.dtype());
    const int nd = static_cast<int>(src.shape().size());
    std::vector<int64_t> idx(nd, 0);
    for (;;) {
        int64_t from = 0, to = 0;
        for (int d = 0; d < nd; ++d) {
            from += idx[d] * src.strides()[d];
            to += idx[d] * strides[d];
        }
        std::memcpy(dst.raw() + to * es, src.bytes().data() + from * es, es);
        int d = nd - 1;
        while (d >= 0 && ++idx[d] == src.shape(d)) idx[d--] = 0;
        if (d < 0) break;
    }
    return dst;
}

// A kpool_tensor pointer for an optional argument.
inline const kpool_tensor *opt(const kpool_tensor &t, bool present) {
    return present ? &t : nullptr;
}

inline bool build_has_cuda() {
    return std::string(kpool_version()).find("cuda") != std::string::npos;
}

// Whether this machine has an NVIDIA driver (its control device) at all.
inline bool cuda_driver_present() { return access("/dev/nvidiactl", F_OK) == 0; }

}  // namespace kpool_test

#endif  // KPOOL_TESTS_TEST_UTIL_H
