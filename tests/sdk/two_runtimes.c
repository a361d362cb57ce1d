/* An engine's program that links kpool's archive (libkpool.a, with its own
 * Halide runtime) beside another Halide AOT library with its own runtime
 * (other_halide.cpp): both link, and both run correctly, each on its own
 * runtime. Built and run by install_and_consume.cmake. */
#include <stdio.h>
#include <string.h>

#include "HalideRuntime.h"
#include "kpool/kpool.h"
#include "kpool_test_other_halide.h"

enum { ROWS = 4, N = 1000 };

int main(void) {
    /* The other library: 3x + 1 on its own runtime's thread pool. */
    static int32_t in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = i - 500;
    halide_dimension_t dim = {0, N, 1, 0};
    halide_buffer_t in_buf, out_buf;
    memset(&in_buf, 0, sizeof in_buf);
    in_buf.host = (uint8_t *)in;
    in_buf.type.code = halide_type_int;
    in_buf.type.bits = 32;
    in_buf.type.lanes = 1;
    in_buf.dimensions = 1;
    in_buf.dim = &dim;
    out_buf = in_buf;
    out_buf.host = (uint8_t *)out;
    if (kpool_test_other_halide(&in_buf, &out_buf) != 0) {
        fprintf(stderr, "the other Halide library failed\n");
        return 1;
    }
    for (int i = 0; i < N; i++) {
        if (out[i] != 3 * in[i] + 1) {
            fprintf(stderr, "the other Halide library: out[%d] = %d, expected %d\n", i, out[i], 3 * in[i] + 1);
            return 1;
        }
    }

    /* kpool: a valid call succeeds, a bad one fails with kpool's message. */
    static uint16_t q[ROWS * KPOOL_HEAD_DIM];
    static uint8_t q_fp8[ROWS * KPOOL_HEAD_DIM];
    static float q_scale[ROWS];
    for (int i = 0; i < ROWS * KPOOL_HEAD_DIM; i++) q[i] = (uint16_t)(0x3f80 + (i % 7)); /* bf16 ~1.0 */
    const int64_t shape[2] = {ROWS, KPOOL_HEAD_DIM}, scale_shape[1] = {ROWS};
    kpool_tensor tq = kpool_tensor_contiguous(q, KPOOL_DTYPE_BFLOAT16, 2, shape);
    kpool_tensor t8 = kpool_tensor_contiguous(q_fp8, KPOOL_DTYPE_FLOAT8_E4M3FN, 2, shape);
    kpool_tensor ts = kpool_tensor_contiguous(q_scale, KPOOL_DTYPE_FLOAT32, 1, scale_shape);
    kpool_status st;
    if (kpool_fwht128_quant_fp8(&tq, &t8, &ts, NULL, &st) != KPOOL_OK) {
        fprintf(stderr, "kpool: %s\n", st.message);
        return 1;
    }
    if (!(q_scale[0] > 0.0f)) {
        fprintf(stderr, "kpool wrote no scale\n");
        return 1;
    }
    ts.shape[0] = ROWS - 1;
    if (kpool_fwht128_quant_fp8(&tq, &t8, &ts, NULL, &st) != KPOOL_ERROR_INVALID_ARGUMENT ||
        strstr(st.message, "q_scale") == NULL) {
        fprintf(stderr, "kpool accepted a bad q_scale: %s\n", st.message);
        return 1;
    }
    printf("kpool and another Halide library: both ran on their own runtimes\n");
    return 0;
}
