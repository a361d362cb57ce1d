// The runtime's policy for the one-kernel decode's three layouts
// (DecodeLayout, schedules/cuda/decode.cpp): per call, a block per request
// whose four warps share each completion (schedules/cuda/decode_block.cpp)
// for pools of at least block_min_pool (0: never) and at least
// block_min_next_n tokens per request; else a warp per token (a block per
// request) for pools up to max_pool and at least min_next_n tokens per
// request, otherwise a warp per request; the exact_ values the same in the
// exact arithmetic. A policy of the runtime, not a schedule knob: no
// kernel is built from it, so the tuner cannot measure it; a build with
// KPOOL_MEASUREMENT_HOOKS runs every call in one layout
// ($KPOOL_DECODE_LAYOUT), which is how each is timed (docs/benchmarks.md).
#pragma once

namespace kpool::rt {

struct DecodeLayoutRule {
    const char *family;  // a GPU family's name; "" for every family without a row
    int max_pool, min_next_n;
    int exact_max_pool, exact_min_next_n;
    int block_min_pool, block_min_next_n;
    int exact_block_min_pool, exact_block_min_next_n;
};

// The first row naming the device's family, else the last ("").
// sm90, measured on an H100 (graph replay, both layouts in one run;
// docs/benchmarks.md): in the reference arithmetic a warp per token wins at
// P = 4 with next_n >= 4 (3.29-3.46 us against 3.92-4.08 at 1-64 requests),
// a warp per request elsewhere; in the exact arithmetic a warp per token
// (its pool an element per thread) nearly everywhere (P=16 64 x 1 5.68
// against 11.98 us, 512 x 4 9.98 against 14.04), a warp per request only
// where a lone request completes nothing (1 x 1: 1.87 against 2.34).
// Other families are unmeasured and take sm90's rule. These figures are
// the warp per request before it ran the reference's token loop (issue 40:
// its SASS per element halved); the rule waits for both layouts timed again.
// The block per request is never taken: run at P = 16 in the reference
// arithmetic on an H100 (graph replay; two runs of one day, the build with
// it as the rule's choice at P >= 16 against the build before, the
// reference's times within 3 % of each other) it was slower in every case
// of the sweep (64 x 1 5.71 against 4.75 us, 64 x 2 6.18 against 5.44,
// 512 x 4 8.18 against 6.62; the reference 4.72, 2.99, 3.98). Its kernels
// are built and tested; the GPU tests and a KPOOL_MEASUREMENT_HOOKS build
// ($KPOOL_DECODE_LAYOUT=block_per_request) run it, which is how to time it
// against the others in one run.
inline constexpr DecodeLayoutRule kDecodeLayoutRules[] = {
    {"sm90", 4, 4, 16, 1, 0, 0, 0, 0},
    {"", 4, 4, 16, 1, 0, 0, 0, 0},
};

// The layouts a call may be forced into; `rule`: the table's choice.
enum class DecodeLayoutChoice { rule, warp_per_token, warp_per_request, block_per_request };

// While one lives, the decode calls of its thread take `layout` (where its
// kernel is built and takes the call's rows; else the rule's): the GPU
// tests run each layout, the warm-up loads each (decode.cpp).
class ScopedDecodeLayout {
public:
    explicit ScopedDecodeLayout(DecodeLayoutChoice layout);
    ~ScopedDecodeLayout();
    ScopedDecodeLayout(const ScopedDecodeLayout &) = delete;
    ScopedDecodeLayout &operator=(const ScopedDecodeLayout &) = delete;

private:
    DecodeLayoutChoice previous_;
};

}  // namespace kpool::rt
