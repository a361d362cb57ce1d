// A family's schedule parameters ("knobs"), as data: each family's values
// live in schedules/<family>.knobs with their legal values (the search
// space tools/tune explores); CMake passes the values to every generator
// as "name:value,..." (BuildPlan::knobs), and a schedule reads each by name.
#pragma once

#include <map>
#include <string>

#include "kpool_stages.h"

namespace kpool {

class Knobs {
public:
    // Parses "name:value,..." (the family named for errors). A knob named
    // twice, or a value that is not an integer, is a CompileError.
    Knobs(const std::string &family, const std::string &text);
    explicit Knobs(const BuildPlan &plan) : Knobs(plan.gpu.empty() ? "cpu" : plan.gpu, plan.knobs) {}

    // The knob's value; a CompileError naming the knob and the family when
    // the build passed none (a data file that lacks it).
    int operator[](const std::string &name) const;

private:
    std::string family_;
    std::map<std::string, int> values_;
};

}  // namespace kpool
