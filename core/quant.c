/* core/quant.c: the two dynamic quantization maps of core/quant.h and block quantization. */
#include "core/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

static strata_q8_map maps[2]; /* signed, unsigned */
static pthread_once_t maps_once = PTHREAD_ONCE_INIT;

static int by_value(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* core/quant.h's construction: exponents 10^(j-6), j = 0..6, each with F evenly spaced
 * fraction intervals of [0.1, 1] whose midpoints are the values; then 0 and 1. */
static void build_map(strata_q8_map *q, int is_signed) {
    /* decimal literals, correctly rounded by the compiler: no pow() whose last bit a libm
     * may choose differently */
    static const double scale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    int n = 0;
    for (int j = 0; j < 7; j++) {
        int F = is_signed ? 1 << j : 1 << (j + 1);
        for (int k = 0; k < F; k++) {
            double lo = 0.1 + 0.9 * (double)k / (double)F, hi = 0.1 + 0.9 * (double)(k + 1) / (double)F;
            double v = scale[j] * ((lo + hi) / 2.0);
            q->value[n++] = (float)v;
            if (is_signed) q->value[n++] = (float)-v;
        }
    }
    q->value[n++] = 0.0f;
    q->value[n++] = 1.0f;
    /* n == 256 by construction: 2 * 127 + 2 signed, 254 + 2 unsigned */
    qsort(q->value, 256, sizeof(float), by_value);
    for (int k = 0; k < 255; k++) q->mid[k] = (q->value[k] + q->value[k + 1]) * 0.5f;
}

static void build_maps(void) {
    build_map(&maps[0], 1);
    build_map(&maps[1], 0);
}

const strata_q8_map *strata_q8_signed(void) {
    pthread_once(&maps_once, build_maps);
    return &maps[0];
}

const strata_q8_map *strata_q8_unsigned(void) {
    pthread_once(&maps_once, build_maps);
    return &maps[1];
}

float strata_q8_absmax(const float *x, size_t n) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float y = fabsf(x[i]);
        a = y > a ? y : a; /* a NaN compares false: ignored */
    }
    return a;
}

void strata_q8_quantize(const strata_q8_map *q, const float *x, size_t n, float absmax, uint8_t *code) {
    for (size_t i = 0; i < n; i++) code[i] = strata_q8_code(q, absmax > 0.0f ? x[i] / absmax : 0.0f);
}

void strata_q8_dequantize(const strata_q8_map *q, const uint8_t *code, size_t n, float absmax, float *x) {
    for (size_t i = 0; i < n; i++) x[i] = q->value[code[i]] * absmax;
}
