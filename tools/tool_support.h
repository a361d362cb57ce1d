// Small pieces shared by the tool's commands: byte comparison with a message
// in one format, per-op timings, a progress line, and the status check of a
// C API call.
#ifndef KPOOL_TOOLS_TOOL_SUPPORT_H
#define KPOOL_TOOLS_TOOL_SUPPORT_H

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "kpool/kpool.h"

namespace kpool_tool {

// Where two byte strings differ.
struct ByteDiff {
    int64_t differing = 0;     // bytes that differ (0: equal)
    int64_t first_offset = -1; // of the first one
    uint8_t expected = 0;
    uint8_t got = 0;
    int64_t size_mismatch = 0; // got.size() - expected.size() when they differ in length

    bool equal() const { return differing == 0 && size_mismatch == 0; }
    // "first differing byte at offset X: expected 0x.. got 0x.. (N bytes differ)"
    std::string describe() const;
};

ByteDiff diff_bytes(const uint8_t *expected, const uint8_t *got, int64_t size);
ByteDiff diff_bytes(const std::vector<uint8_t> &expected, const std::vector<uint8_t> &got);

// Wall time and call count per op, in first-call order.
class OpTimes {
public:
    void add(const std::string &op, double milliseconds);
    // One line per op: name, calls, total ms, mean ms.
    void print(std::FILE *out) const;

private:
    struct Entry {
        std::string op;
        int64_t calls = 0;
        double total_ms = 0.0;
    };
    std::vector<Entry> entries_;
};

class Stopwatch {
public:
    Stopwatch() : start_(std::chrono::steady_clock::now()) {}
    double milliseconds() const {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                         start_)
            .count();
    }

private:
    std::chrono::steady_clock::time_point start_;
};

// "decode step 7/16": rewritten in place with \r on a terminal, one line per
// update otherwise (logs stay readable).
class Progress {
public:
    explicit Progress(std::FILE *out);
    void update(const std::string &line);
    // Ends a line rewritten in place; call before printing anything else.
    void finish();

private:
    std::FILE *out_;
    bool tty_;
    bool open_ = false;
    size_t last_width_ = 0;
};

// "kpool_fwht128_quant_fp8: KPOOL_ERROR_INVALID_ARGUMENT: <message>", or empty
// when the call succeeded.
std::string status_failure(const char *function, kpool_status_code code,
                           const kpool_status &status);

}  // namespace kpool_tool

#endif  // KPOOL_TOOLS_TOOL_SUPPORT_H
