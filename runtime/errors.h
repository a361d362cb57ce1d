// How the runtime reports bad input: validation throws an ArgumentError
// naming the argument; the C entry points turn it into a kpool_status.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "kpool/kpool.h"

namespace kpool::rt {

class ArgumentError : public std::runtime_error {
public:
    ArgumentError(kpool_status_code code, const std::string &message)
        : std::runtime_error(message), code_(code) {}
    kpool_status_code code() const { return code_; }

private:
    kpool_status_code code_;
};

// invalid() << "loc[" << i << "] = ..." (or out_of_range(), unsupported()
// below) throws an ArgumentError with the streamed message when the statement
// ends.
class Failure {
public:
    explicit Failure(kpool_status_code code) : code_(code) {}
    ~Failure() noexcept(false) { throw ArgumentError(code_, text_.str()); }
    template <typename T>
    Failure &operator<<(const T &value) {
        text_ << value;
        return *this;
    }

private:
    kpool_status_code code_;
    std::ostringstream text_;
};

inline Failure invalid() { return Failure(KPOOL_ERROR_INVALID_ARGUMENT); }
inline Failure out_of_range() { return Failure(KPOOL_ERROR_OUT_OF_RANGE); }
inline Failure unsupported() { return Failure(KPOOL_ERROR_UNSUPPORTED); }

}  // namespace kpool::rt
