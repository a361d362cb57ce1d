// A family's schedule parameters ("knobs") as typed fields: each family's
// plan (CpuPlan in cpu.cpp, CudaPlan in cuda/plan.h) derives from KnobReader
// and reads each knob in its field's initializer,
//
//     int fwht_values = knob("fwht.values");
//
// so a knob is one line in schedules/<family>.knobs (its value and legal
// values, which schedules/knobs.py checks at configure time with the file's
// `require` lines) and one typed field of the plan.
#pragma once

#include <string>

#include "kpool_stages.h"

namespace kpool {

class KnobReader {
protected:
    // Reads the build's values while the plan's fields are initialized (the
    // plan is made from, and used within, one hook call of its BuildPlan).
    explicit KnobReader(const BuildPlan &build) : values_(&build.knobs), family_(build.family()) {}

    // The knob's value; a CompileError naming the knob and the family's file
    // when the build passed none.
    int knob(const char *name) const;
    // A knob whose legal values are 0 and 1.
    bool flag(const char *name) const;

private:
    const KnobValues *values_;
    std::string family_;
};

}  // namespace kpool
