#include "knobs.h"

#include <cstdlib>

namespace kpool {

KnobValues split_knobs(const std::string &family, const std::string &wire) {
    KnobValues values;
    size_t start = 0;
    while (start < wire.size()) {
        size_t end = wire.find(',', start);
        if (end == std::string::npos) {
            end = wire.size();
        }
        const std::string item = wire.substr(start, end - start);
        const size_t colon = item.find(':');
        char *rest = nullptr;
        const long value = colon == std::string::npos ? 0 : std::strtol(item.c_str() + colon + 1, &rest, 10);
        if (colon == std::string::npos || colon == 0 || rest == item.c_str() + colon + 1 || *rest != '\0') {
            throw Halide::CompileError("knobs of " + family + ": \"" + item + "\" is not name:integer");
        }
        if (!values.emplace(item.substr(0, colon), static_cast<int>(value)).second) {
            throw Halide::CompileError("knobs of " + family + ": " + item.substr(0, colon) + " given twice");
        }
        start = end + 1;
    }
    return values;
}

int KnobReader::knob(const char *name) const {
    const auto it = values_->find(name);
    if (it == values_->end()) {
        throw Halide::CompileError("knobs of " + family_ + ": no value for " + name + " (schedules/" + family_ +
                                   ".knobs)");
    }
    return it->second;
}

bool KnobReader::flag(const char *name) const {
    const int value = knob(name);
    if (value != 0 && value != 1) {
        throw Halide::CompileError("knobs of " + family_ + ": " + name + " is " + std::to_string(value) +
                                   ", not 0 or 1");
    }
    return value == 1;
}

}  // namespace kpool
