#include "knobs.h"

#include <cstdlib>

namespace kpool {

Knobs::Knobs(const std::string &family, const std::string &text) : family_(family) {
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find(',', start);
        if (end == std::string::npos) {
            end = text.size();
        }
        const std::string item = text.substr(start, end - start);
        const size_t colon = item.find(':');
        char *rest = nullptr;
        const long value = colon == std::string::npos ? 0 : std::strtol(item.c_str() + colon + 1, &rest, 10);
        if (colon == std::string::npos || colon == 0 || rest == item.c_str() + colon + 1 || *rest != '\0') {
            throw Halide::CompileError("knobs of " + family_ + ": \"" + item + "\" is not name:integer");
        }
        if (!values_.emplace(item.substr(0, colon), static_cast<int>(value)).second) {
            throw Halide::CompileError("knobs of " + family_ + ": " + item.substr(0, colon) + " given twice");
        }
        start = end + 1;
    }
}

int Knobs::operator[](const std::string &name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) {
        throw Halide::CompileError("knobs of " + family_ + ": no value for " + name + " (schedules/" + family_ +
                                   ".knobs)");
    }
    return it->second;
}

}  // namespace kpool
