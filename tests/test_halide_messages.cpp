// The Halide runtime's error text a failed kernel's status carries
// (runtime/dispatch.cpp, check_halide): the message reported on the
// calling thread during that call only; an earlier call's text, whether it
// failed or not, never shows in a later error.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "HalideRuntime.h"
#include "dispatch.h"
#include "errors.h"

namespace kpool_test {
namespace {

// The status message check_halide throws for `result` ("" when none).
std::string error_of(int result) {
    try {
        kpool::rt::check_halide(result, "probe");
    } catch (const kpool::rt::StatusError &e) {
        return e.what();
    }
    return "";
}

TEST(HalideMessages, AFailureCarriesItsOwnMessage) {
    halide_error(nullptr, "the first failure's text");
    EXPECT_NE(error_of(-1).find("the first failure's text"), std::string::npos);
    // The next failure reports nothing of the first one.
    const std::string second = error_of(-2);
    EXPECT_NE(second.find("Halide error -2"), std::string::npos);
    EXPECT_EQ(second.find("the first failure's text"), std::string::npos) << second;
}

TEST(HalideMessages, ASuccessClearsTextReportedDuringIt) {
    halide_error(nullptr, "a warning-like report of a call that succeeded");
    EXPECT_EQ(error_of(0), "");
    const std::string later = error_of(-1);
    EXPECT_EQ(later.find("succeeded"), std::string::npos) << later;
}

TEST(HalideMessages, EachThreadKeepsItsOwn) {
    halide_error(nullptr, "this thread's text");
    std::string other;
    std::thread([&] { other = error_of(-1); }).join();
    EXPECT_EQ(other.find("this thread's text"), std::string::npos) << other;
    EXPECT_NE(error_of(-1).find("this thread's text"), std::string::npos);
}

}  // namespace
}  // namespace kpool_test
