/* offload/cpu_adam.h: AdamW on the host for optimizer state that lives off the GPU.
 *
 * strata_cpu_adamw performs exactly the update of strata_kernels.adamw (core/kernels.h),
 * in the same operation order, so its fp32 results are bitwise equal to the CPU
 * reference kernel for any n, any pointer alignment and any thread count:
 *   g = grad * grad_scale
 *   m = beta1 * m + (1 - beta1) * g
 *   v = beta2 * v + (1 - beta2) * g * g
 *   master -= lr * ((m / bc1) / (sqrtf(v / bc2) + eps) + weight_decay * master)
 * It is multi-threaded (OpenMP, static chunks) and vectorised with AVX-512 or AVX2,
 * picked at run time from what the CPU supports; every lane does one IEEE operation per
 * step of the formula (no fused multiply-add), which is why the results agree.
 *
 * param_out, when not NULL, receives the updated master in out_dtype: fp32 (a copy) or
 * bf16 rounded to nearest, ties to even (NaN stays a quiet NaN), matching the
 * reference's convert kernel. Arrays must not overlap, except param_out == master with
 * out_dtype fp32.
 *
 * Safe to call from any thread, including a HOST stream worker; it starts its own
 * OpenMP team there. STRATA_CPU_ADAM_ISA=scalar|avx2|avx512 in the environment caps the
 * automatic choice (read once), for benchmarks and for tracking down a suspected SIMD
 * issue in a run. */
#ifndef STRATA_CPU_ADAM_H
#define STRATA_CPU_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/kernels.h"
#include "core/optim.h"

typedef enum strata_cpu_isa {
    STRATA_ISA_AUTO = 0, /* the widest the CPU supports, capped by STRATA_CPU_ADAM_ISA */
    STRATA_ISA_SCALAR = 1,
    STRATA_ISA_AVX2 = 2,
    STRATA_ISA_AVX512 = 3,
} strata_cpu_isa;

/* One AdamW update of n elements (see above). Uses the automatic ISA and all OpenMP
 * threads once n is large enough to pay for a team. */
void strata_cpu_adamw(float *master, void *param_out, strata_dtype out_dtype, const float *grad,
                      float *m, float *v, size_t n, const strata_adamw_args *a);

/* The same with the path and thread count chosen by the caller (tests and benchmarks):
 * isa STRATA_ISA_AUTO means the automatic choice; n_threads 0 means OpenMP's default,
 * 1 runs on the calling thread alone. Returns -1 with an error naming the ISA when this
 * CPU cannot run it; nothing is touched then. */
int strata_cpu_adamw_ex(strata_cpu_isa isa, int n_threads, float *master, void *param_out,
                        strata_dtype out_dtype, const float *grad, float *m, float *v, size_t n,
                        const strata_adamw_args *a);

/* The same update with bf16 moments (optim.state: bf16): strata_kernels.adamw_bf16 bit for bit
 * (m and v widened, the fp32 step above, rounded back to nearest even). */
void strata_cpu_adamw_bf16(float *master, void *param_out, strata_dtype out_dtype, const float *grad, uint16_t *m,
                           uint16_t *v, size_t n, const strata_adamw_args *a);
int strata_cpu_adamw_bf16_ex(strata_cpu_isa isa, int n_threads, float *master, void *param_out, strata_dtype out_dtype,
                             const float *grad, uint16_t *m, uint16_t *v, size_t n, const strata_adamw_args *a);

/* The same update with 8-bit moments (optim.state: int8; core/quant.h): strata_kernels.adamw_q8
 * bit for bit, over elements [0, n) of a range that starts on a block boundary, touching
 * only the segments with `quant` set. Each block is dequantized into fp32, stepped by the
 * vectorised kernel above, and quantized back; the nearest code comes from a table keyed by
 * the value's top 16 bits (at most two midpoints fall in one key's interval, checked when
 * the table is built), which gives exactly core/quant.h's binary search. */
void strata_cpu_adamw_q8(float *master, void *param_out, strata_dtype out_dtype, const float *grad, uint8_t *m1,
                         uint8_t *m2, float *absmax1, float *absmax2, size_t n, const strata_adamw_segment *seg,
                         int n_seg, const strata_adamw_args *a);
int strata_cpu_adamw_q8_ex(strata_cpu_isa isa, int n_threads, float *master, void *param_out, strata_dtype out_dtype,
                           const float *grad, uint8_t *m1, uint8_t *m2, float *absmax1, float *absmax2, size_t n,
                           const strata_adamw_segment *seg, int n_seg, const strata_adamw_args *a);

/* The code strata_cpu_adamw_q8 gives x (already divided by its absmax) under the signed map
 * (first moment) or the unsigned one, from its table: tests hold it to core/quant.h's
 * strata_q8_code. */
uint8_t strata_cpu_q8_code(int is_signed, float x);
/* The codes of x[0, n) divided by absmax as the 8-bit update quantizes a block with the ISA
 * (the SIMD lanes and their scalar tail; tests hold every ISA to core/quant.h). 0, or -1
 * when the ISA is not supported here. */
int strata_cpu_q8_quantize_ex(strata_cpu_isa isa, int is_signed, const float *x, size_t n, float absmax, uint8_t *code);

/* 1 when this CPU (and this build) can run the path. */
int strata_cpu_isa_supported(strata_cpu_isa isa);
/* What STRATA_ISA_AUTO resolves to in this process. */
strata_cpu_isa strata_cpu_isa_auto(void);
const char *strata_cpu_isa_name(strata_cpu_isa isa); /* "auto", "scalar", "avx2", "avx512" */

#endif
