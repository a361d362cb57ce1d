// How the runtime reports a failure: whatever stops a call (a bad argument,
// an index out of range, a variant not built, a device that fails) throws a
// StatusError with its kpool_status_code and message; the C entry points
// turn it into a kpool_status.
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "kpool/kpool.h"

namespace kpool::rt {

// Built where it is thrown, the message streamed in:
//   throw invalid() << "q has " << q.dim(0) << " rows";
// One left unthrown would not stop the call: discarding it is a compile
// error (nodiscard, with -Werror=unused-result on the runtime).
class [[nodiscard]] StatusError : public std::exception {
public:
    explicit StatusError(kpool_status_code code, std::string message = {})
        : code_(code), message_(std::move(message)) {}
    kpool_status_code code() const { return code_; }
    const char *what() const noexcept override { return message_.c_str(); }

    template <typename T>
    [[nodiscard]] StatusError &&operator<<(const T &value) && {
        std::ostringstream text;
        text << value;
        message_ += text.str();
        return std::move(*this);
    }

private:
    kpool_status_code code_;
    std::string message_;
};

inline StatusError invalid() { return StatusError(KPOOL_ERROR_INVALID_ARGUMENT); }
inline StatusError out_of_range() { return StatusError(KPOOL_ERROR_OUT_OF_RANGE); }
inline StatusError unsupported() { return StatusError(KPOOL_ERROR_UNSUPPORTED); }
inline StatusError device_error() { return StatusError(KPOOL_ERROR_DEVICE); }
inline StatusError internal_error() { return StatusError(KPOOL_ERROR_INTERNAL); }

// The failure a caught exception stands for: a StatusError as it is, any
// other exception (from the standard library) an internal error.
inline StatusError as_status_error(const std::exception &e) {
    if (const auto *status = dynamic_cast<const StatusError *>(&e)) {
        return *status;
    }
    return internal_error() << "internal error: " << e.what();
}

}  // namespace kpool::rt
