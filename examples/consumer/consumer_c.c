/* An engine's use of an installed kpool through the C API (kpool.h), on the
 * CPU. It checks what follows from the math alone, and exits non-zero on any
 * difference:
 *
 * - The 128-point Hadamard transform takes a one-hot row to a flat one and a
 *   flat row to a one-hot one. Row e0 becomes 128 times 1/sqrt(128) =
 *   0.0883883..., bf16 0.08837890625; its ue8m0 scale is the power of two
 *   above absmax / 448 = 1.97e-4, 2^-12, and 0.08837890625 * 2^12 = 362,
 *   whose nearest e4m3 value is 352 = 1.375 * 2^8: code 0x7B. The all-ones
 *   row becomes sqrt(128) = 11.3137..., bf16 11.3125, then zeros; its scale
 *   is 2^-5 and 11.3125 * 2^5 = 362 again: 0x7B, then 0x00.
 * - A row of the wrong width is rejected with a message, its outputs
 *   untouched.
 * - kpool_version() names the release the package was found as
 *   (KPOOL_EXPECTED_VERSION, given by the build). */
#include <stdio.h>
#include <string.h>

#include "kpool/kpool.h"

#ifndef KPOOL_EXPECTED_VERSION
#error "build with -DKPOOL_EXPECTED_VERSION=\"<the package's version>\""
#endif

enum { D = KPOOL_HEAD_DIM, ROWS = 2 };

static int failures = 0;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "consumer_c: FAIL: %s\n", what);
        failures++;
    }
}

int main(void) {
    const char *expected_prefix = "kpool " KPOOL_EXPECTED_VERSION;
    const char *version = kpool_version();
    const size_t n = strlen(expected_prefix);
    expect(strncmp(version, expected_prefix, n) == 0 && (version[n] == ' ' || version[n] == '\0'),
           "kpool_version() names the package's version");

    static uint16_t q[ROWS * D]; /* bf16 bits */
    static uint8_t q_fp8[ROWS * D];
    static float q_scale[ROWS];
    const uint16_t bf16_one = 0x3F80;
    q[0] = bf16_one; /* row 0: e0 */
    for (int d = 0; d < D; d++) {
        q[D + d] = bf16_one; /* row 1: all ones */
    }
    const int64_t shape[2] = {ROWS, D};
    const int64_t scale_shape[1] = {ROWS};
    const kpool_tensor tq = kpool_tensor_contiguous(q, KPOOL_DTYPE_BFLOAT16, 2, shape);
    const kpool_tensor tq8 = kpool_tensor_contiguous(q_fp8, KPOOL_DTYPE_FLOAT8_E4M3FN, 2, shape);
    const kpool_tensor tqs = kpool_tensor_contiguous(q_scale, KPOOL_DTYPE_FLOAT32, 1, scale_shape);
    kpool_status status;
    if (kpool_fwht128_quant_fp8(&tq, &tq8, &tqs, NULL, &status) != KPOOL_OK) {
        fprintf(stderr, "consumer_c: fwht128_quant_fp8: %s: %s\n", kpool_status_name(status.code), status.message);
        return 1;
    }
    int flat = 1, one_hot = q_fp8[D] == 0x7B;
    for (int d = 0; d < D; d++) {
        flat = flat && q_fp8[d] == 0x7B;
        one_hot = one_hot && (d == 0 || q_fp8[D + d] == 0x00);
    }
    expect(flat, "e0 becomes a flat row of code 0x7B");
    expect(q_scale[0] == 1.0f / 4096, "e0's scale is 2^-12");
    expect(one_hot, "the all-ones row becomes 0x7B, then zeros");
    expect(q_scale[1] == 1.0f / 32, "the all-ones row's scale is 2^-5");

    /* 127 wide instead of 128: rejected before anything is written. */
    memset(q_fp8, 0xA5, sizeof q_fp8);
    const int64_t narrow[2] = {ROWS, D - 1};
    const kpool_tensor tq_narrow = kpool_tensor_contiguous(q, KPOOL_DTYPE_BFLOAT16, 2, narrow);
    const kpool_status_code code = kpool_fwht128_quant_fp8(&tq_narrow, &tq8, &tqs, NULL, &status);
    expect(code == KPOOL_ERROR_INVALID_ARGUMENT && status.code == code, "a 127-wide row is an invalid argument");
    expect(strncmp(status.message, "q has shape [2, 127]", 20) == 0, "the message names q and its shape");
    int untouched = 1;
    for (int i = 0; i < ROWS * D; i++) {
        untouched = untouched && q_fp8[i] == 0xA5;
    }
    expect(untouched, "a rejected call writes nothing");

    if (failures) {
        return 1;
    }
    printf("consumer_c: ok (%s)\n", version);
    return 0;
}
