/* core/quant.h: 8-bit block-wise quantization of Adam's moments (optim.state: int8), after
 * Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2022).
 *
 * A moment tensor is cut into blocks of STRATA_Q8_BLOCK elements; each block keeps one fp32
 * absmax (the largest |value| in it) and one 8-bit code per element, an index into a map of
 * 256 fp32 values in [-1, 1] (dynamic quantization: an exponent, a power of ten from 1e-6 to
 * 1, and a linear fraction whose bits shrink as the exponent grows):
 *
 *   value = map[code] * absmax
 *
 * The first moment (signed) uses the signed map, the second (never negative) the unsigned
 * one, which spends the sign bit on one more fraction bit. The maps, built here from the
 * paper's definition and nothing else (tests/q8_reference.py builds the same 256 floats in
 * NumPy):
 *
 *   for j = 0..6 (the exponent 10^(j-6)), with F = 2^j intervals (signed) or 2^(j+1)
 *   (unsigned) splitting [0.1, 1] evenly, b_k = 0.1 + 0.9 * k / F (k = 0..F, in double):
 *     10^(j-6) * (b_k + b_{k+1}) / 2   for k = 0..F-1 (and its negative when signed)
 *   and the two values 0 and 1; each rounded once to fp32 and sorted ascending.
 *
 * That is 127 negative values, 0 (code STRATA_Q8_ZERO_SIGNED = 127), 127 positive ones below
 * 1 and 1 itself for the signed map (its most negative value is -0.99297, not -1); 0 (code 0),
 * 254 values in (0, 1) and 1 for the unsigned one. Every value is distinct.
 *
 * Quantizing x = value / absmax (one fp32 division; x = 0 when absmax is 0) picks the nearest
 * map entry, with the boundary between neighbours k and k+1 at their fp32 midpoint
 * mid[k] = (map[k] + map[k+1]) * 0.5f, and a value exactly on a midpoint going to the LOWER
 * code: code = the number of midpoints strictly below x, found by a branchless binary search
 * over the 255 sorted midpoints (8 comparisons). Nothing random, nothing that depends on the
 * backend: the CPU oracle, the offload tier's AdamW and the CUDA kernel all compute it this
 * way, and so does the NumPy reference (np.searchsorted(mid, x, side='left')). A NaN x (no
 * midpoint is below it) gets code 0.
 *
 * One exception to "nearest": a positive x never gets code 0. Only the unsigned map has a
 * value (0) below every positive x, so the rule touches the second moment alone: a positive
 * x below mid[0] (1.6e-7) gets code 1, the smallest positive value. Adam divides the first
 * moment by the square root of the second; a second moment stored as 0 under a first moment
 * that is not (a value 10^7 below its block's largest, as an untied embedding's row whose
 * token a batch lacks soon is, its gradient 0) turns the next step into lr x m / eps, a
 * jump of a whole unit where the step is 1e-3. Rounded up instead, v stays at least the
 * map's smallest step of its block, and m / sqrt(v) stays bounded as with fp32 moments.
 *
 * Tensors of fewer than STRATA_Q8_MIN_NUMEL elements keep fp32 moments (the paper's rule:
 * their state costs little and 8 bits hurt them most). Blocks are cut on each unit's flat
 * buffer (block b holds elements [b * 2048, (b + 1) * 2048)), not per tensor, so every rank's
 * optimizer range, which starts on a block boundary (shard/engine.c pads units to world x
 * 2048 for int8 state), holds whole blocks: a block never straddles two ranks and a
 * checkpoint's blocks mean the same at every world size. A block's absmax is taken over its
 * quantized elements only. */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_Q8_BLOCK 2048    /* elements per absmax */
#define STRATA_Q8_MIN_NUMEL 4096 /* smaller tensors keep fp32 moments */
#define STRATA_Q8_ZERO_SIGNED 127  /* the signed map's code of 0 (the first moment's initial code) */
#define STRATA_Q8_ZERO_UNSIGNED 0  /* the unsigned map's code of 0 */

typedef struct strata_q8_map {
    float value[256]; /* sorted ascending */
    float mid[255];   /* mid[k] = (value[k] + value[k+1]) * 0.5f */
} strata_q8_map;

/* The two maps, built once (thread-safe). */
const strata_q8_map *strata_q8_signed(void);
const strata_q8_map *strata_q8_unsigned(void);

/* The code of x (already divided by its block's absmax), as described above: the nearest,
 * a positive x never code 0. Written without a branch (a comparison's 0 or 1 times the
 * step): a data-dependent branch here mispredicts about half the time and made the CPU
 * oracle ten times slower. */
static inline uint8_t strata_q8_code(const strata_q8_map *q, float x) {
    unsigned lo = 0;
    for (unsigned step = 128; step; step >>= 1) lo += step * (unsigned)(q->mid[lo + step - 1] < x);
    return (uint8_t)(lo + ((unsigned)(lo == 0) & (unsigned)(x > 0.0f)));
}

/* max |x[i]| over n values, NaN ignored, 0 for none. */
float strata_q8_absmax(const float *x, size_t n);

/* Quantizes n values (n <= STRATA_Q8_BLOCK: one block) with the given absmax (normally
 * strata_q8_absmax of them). */
void strata_q8_quantize(const strata_q8_map *q, const float *x, size_t n, float absmax, uint8_t *code);
/* value = map[code] * absmax, n values. */
void strata_q8_dequantize(const strata_q8_map *q, const uint8_t *code, size_t n, float absmax, float *x);

/* Blocks of a range of n elements that starts on a block boundary. */
static inline size_t strata_q8_blocks(size_t n) { return (n + STRATA_Q8_BLOCK - 1) / STRATA_Q8_BLOCK; }

#endif
