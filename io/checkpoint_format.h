/* io/checkpoint_format.h: what the checkpoint writer (io/checkpoint_write.c), reader
 * (io/checkpoint_read.c) and pruner (io/checkpoint_prune.c) share, for those three only:
 * the format's fixed names, the layout checks both sides run, and the list of a run's
 * step directories. The format itself is described in io/checkpoint.h. */
#ifndef STRATA_CHECKPOINT_FORMAT_H
#define STRATA_CHECKPOINT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "io/checkpoint.h"

/* The data files are raw little-endian fp32, written and read by memcpy. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/checkpoint_*.c assume a little-endian host"
#endif

/* The `format:` of manifest.yaml and of every rank index: 1 for fp32 optimizer state (as
 * Strata always wrote it), 2 for state stored otherwise (io/checkpoint.h). A reader takes
 * both. */
#define CKPT_FORMAT "strata-checkpoint-1"
#define CKPT_FORMAT_2 "strata-checkpoint-2"
/* manifest.yaml's first line: the CRC-32C of every byte after that line */
#define MANIFEST_CRC_PREFIX "manifest_crc32c: "
#define CKPT_PATH_MAX 4096

/* "param", "m", "v", "m_absmax", "v_absmax": the kinds as the rank indices name them */
extern const char *const strata_ckpt_kind_name[STRATA_CKPT_MAX_KINDS];

/* The dtype name of kind (m or v) of tensor t under state, as segments name it: float32,
 * bfloat16, q8_signed (m) or q8_unsigned (v); and the tensors' `moments` in the manifest:
 * float32, bfloat16 or q8. */
const char *strata_ckpt_moment_dtype(strata_optim_state state, int kind, const strata_param_tensor *t);
const char *strata_ckpt_tensor_moments(strata_optim_state state, const strata_param_tensor *t);

/* Blocks of a unit of numel elements (int8 state's absmax kinds). */
size_t strata_ckpt_unit_blocks(size_t numel);

/* snprintf into a path buffer; -1 + error when the path does not fit. */
int strata_ckpt_fmt_path(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "[4, 3]" */
void strata_ckpt_shape_str(char *buf, size_t len, const strata_param_tensor *t);

/* Checks the invariants checkpoint.h states for a layout and returns tensor indices
 * sorted by (unit, offset), with unit u's tensors at order[first[u] .. first[u+1]).
 * `what` names the layout in messages (the caller frees both arrays). */
int strata_ckpt_layout_index(const strata_param_layout *L, const char *what, int **order_out, int **first_out);

/* One "step_<digits><suffix>" directory of a run's ckpt/. */
typedef struct strata_ckpt_step {
    int64_t step;
    int complete; /* has manifest.yaml */
    char name[64];
} strata_ckpt_step;

/* The "step_<digits><suffix>" directories in ckpt_dir, newest first (*out freed by the
 * caller). */
int strata_ckpt_list_steps(const char *ckpt_dir, const char *suffix, strata_ckpt_step **out, int *n_out);

#endif
