#include "tool_support.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>

namespace kpool_tool {

std::string ByteDiff::describe() const {
    char text[200];
    if (size_mismatch != 0 && differing == 0) {
        std::snprintf(text, sizeof text, "size differs by %" PRId64 " bytes", size_mismatch);
        return text;
    }
    std::snprintf(text, sizeof text,
                  "first differing byte at offset %" PRId64 ": expected 0x%02x got 0x%02x "
                  "(%" PRId64 " byte%s differ%s)",
                  first_offset, expected, got, differing, differing == 1 ? "" : "s",
                  differing == 1 ? "s" : "");
    std::string result = text;
    if (size_mismatch != 0) {
        std::snprintf(text, sizeof text, "; size differs by %" PRId64 " bytes", size_mismatch);
        result += text;
    }
    return result;
}

ByteDiff diff_bytes(const uint8_t *expected, const uint8_t *got, int64_t size) {
    ByteDiff diff;
    for (int64_t i = 0; i < size; ++i) {
        if (expected[i] == got[i]) continue;
        if (diff.differing++ == 0) {
            diff.first_offset = i;
            diff.expected = expected[i];
            diff.got = got[i];
        }
    }
    return diff;
}

ByteDiff diff_bytes(const std::vector<uint8_t> &expected, const std::vector<uint8_t> &got) {
    const int64_t common = static_cast<int64_t>(std::min(expected.size(), got.size()));
    ByteDiff diff = diff_bytes(expected.data(), got.data(), common);
    diff.size_mismatch = static_cast<int64_t>(got.size()) - static_cast<int64_t>(expected.size());
    return diff;
}

void OpTimes::add(const std::string &op, double milliseconds) {
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry &e) { return e.op == op; });
    if (it == entries_.end()) it = entries_.insert(entries_.end(), Entry{op});
    it->calls += 1;
    it->total_ms += milliseconds;
}

void OpTimes::print(std::FILE *out) const {
    size_t width = 2;
    for (const Entry &e : entries_) width = std::max(width, e.op.size());
    std::fprintf(out, "  %-*s %7s %11s %10s\n", static_cast<int>(width), "op", "calls",
                 "total ms", "mean ms");
    for (const Entry &e : entries_) {
        std::fprintf(out, "  %-*s %7" PRId64 " %11.3f %10.4f\n", static_cast<int>(width),
                     e.op.c_str(), e.calls, e.total_ms, e.total_ms / double(e.calls));
    }
}

Progress::Progress(std::FILE *out) : out_(out), tty_(isatty(fileno(out)) != 0) {}

void Progress::update(const std::string &line) {
    if (!tty_) {
        std::fprintf(out_, "%s\n", line.c_str());
        return;
    }
    // Pad with blanks over the rest of a longer previous line.
    const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
    std::fprintf(out_, "\r%s%*s", line.c_str(), static_cast<int>(pad), "");
    std::fflush(out_);
    last_width_ = line.size();
    open_ = true;
}

void Progress::finish() {
    if (open_) std::fprintf(out_, "\n");
    open_ = false;
    last_width_ = 0;
}

std::string status_failure(const char *function, kpool_status_code code,
                           const kpool_status &status) {
    if (code == KPOOL_OK) return {};
    return std::string(function) + ": " + kpool_status_name(code) + ": " + status.message;
}

}  // namespace kpool_tool
