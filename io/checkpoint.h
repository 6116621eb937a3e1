/* io/checkpoint.h: checkpoints that survive kills and load on any world size.
 *
 * On disk, a run directory holds
 *   ckpt/step_00000120/manifest.yaml   first line: manifest_crc32c, the CRC-32C of the rest;
 *                                      global facts: format version, step, world and stage at
 *                                      save, seed, RNG state, the config as YAML text, every
 *                                      unit (numel, padded numel) and every tensor (HF name,
 *                                      unit, element offset in the unit's flat buffer, shape,
 *                                      dtype)
 *   ckpt/step_00000120/rank00003.yaml  that rank's index: one segment per (kind, tensor part)
 *                                      with file offset, element range, crc32c
 *   ckpt/step_00000120/rank00003.bin   that rank's data: fp32 (and, below, the moments as stored)
 *   ckpt/latest                        text file naming the newest complete step directory
 *
 * Each rank's file holds the standard shard r of every unit's padded flat buffer, i.e.
 * elements [r*S, (r+1)*S) with S = padded/world (clipped to numel), for each of the kinds
 * param (fp32 master), m, v, in the order unit, kind. The segment boundaries are the
 * tensor boundaries, so a checksum failure names the tensor. Any later world size reads
 * any element range by visiting the rank files that overlap it: no offline conversion.
 *
 * Optimizer state other than fp32 (optim.state: bf16 | int8) is saved as it is stored,
 * in format 2 (fp32 state keeps format 1, byte for byte): the manifest says `optim_state`
 * (and for int8 `optim_block: 2048`) and gives each tensor its `moments` dtype; the m and v
 * segments of the rank indexes carry their dtype: bfloat16, or for int8 q8_signed (m) and
 * q8_unsigned (v), one byte a code into core/quant.h's maps, float32 for tensors under 4096
 * elements. int8 adds two kinds after v, m_absmax and v_absmax: per unit the fp32 absmax of
 * each 2048-element block of its flat buffer, with lo and hi counted in blocks (the rank's
 * blocks [a / 2048, ceil(b / 2048)) of its elements [a, b)); its units are padded to
 * world x 2048, so a rank's shard starts on a block. Blocks are cut on the flat buffer, the
 * same at any world size, so these too load at any world size and stage.
 *
 * Writing is crash-safe: every rank writes into step_NNNNNNNN.tmp/, fsyncs its files;
 * rank 0 then writes manifest.yaml, fsyncs, renames the directory, fsyncs the parent and
 * updates `latest` atomically. A kill at any moment leaves the previous checkpoint
 * loadable; stale .tmp directories are removed by the next commit. */
#ifndef STRATA_CHECKPOINT_H
#define STRATA_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"
#include "core/optim.h"

enum {
    STRATA_CKPT_PARAM = 0,
    STRATA_CKPT_M = 1,
    STRATA_CKPT_V = 2,
    STRATA_CKPT_KINDS = 3,     /* the kinds of fp32 and bf16 state */
    STRATA_CKPT_M_ABSMAX = 3,  /* int8 state: per block of m, then of v */
    STRATA_CKPT_V_ABSMAX = 4,
    STRATA_CKPT_MAX_KINDS = 5
};

/* Bytes of one stored element of `kind` of tensor t (whose unit it is) under `state`: 4
 * for param and absmax; m and v as core/optim.h's state stores them (an int8 checkpoint's
 * small tensors 4). */
size_t strata_ckpt_elem_bytes(strata_optim_state state, int kind, const strata_param_tensor *t);
/* The kinds a checkpoint of `state` holds: 3, or 5 with int8. */
int strata_ckpt_kinds(strata_optim_state state);

/* What the trainer needs to continue exactly where it stopped. */
typedef struct strata_ckpt_meta {
    int64_t step;       /* optimizer steps completed */
    int world, stage;   /* at save (informational: loading works at any) */
    uint64_t seed;
    uint64_t rng_state; /* the sampler's strata_rng */
    double tokens_seen;
    double last_loss;
    int validated;      /* a validation ran at this step, measuring val_loss (0: none did) */
    double val_loss;
    const char *config_yaml; /* the effective config; on read, owned by strata_ckpt */
    strata_optim_state state; /* how the moments are stored (optim.state at save) */
} strata_ckpt_meta;

/* ---- writing (every rank calls write_rank; rank 0 then calls commit) ---- */

/* "<run_dir>/ckpt/step_%08lld.tmp": creates it (mkdir -p; every rank may: EEXIST is fine). */
int strata_ckpt_tmp_dir(char *out, size_t outlen, const char *run_dir, int64_t step);

/* The elements of unit u that rank `rank` of `world` writes: its standard shard [r*S,
 * (r+1)*S), S = unit_padded[u] / world, clipped to the unit's numel ([lo, lo) when the
 * shard is all padding). */
void strata_ckpt_rank_range(const strata_param_layout *L, int u, int rank, int world, size_t *lo, size_t *hi);

/* A rank's data file and index, written piece by piece, so that no more of the data need
 * be in memory at once than the caller chooses (shard/engine.c streams it through one
 * planned staging buffer). Opened, fed in file order (unit by unit, for each unit with a
 * non-empty range the kinds param, m, v (and m_absmax, v_absmax with int8 state), each as
 * its whole range in chunks of any size; every segment's CRC-32C is computed as its bytes
 * pass), then closed: the data file fsynced, the index written and fsynced. The files are
 * byte for byte those strata_ckpt_write_rank writes. L must outlive the writer. */
typedef struct strata_ckpt_writer strata_ckpt_writer;
/* Creates rankNNNNN.bin in tmp_dir for fp32 state; NULL + error (a layout whose padded
 * sizes do not divide by world, a file that cannot be created). */
strata_ckpt_writer *strata_ckpt_writer_open(const char *tmp_dir, const strata_param_layout *L, int rank, int world);
/* The same for optimizer state stored as `state` says (int8: padded sizes must divide by
 * world x 2048 too). */
strata_ckpt_writer *strata_ckpt_writer_open_state(const char *tmp_dir, const strata_param_layout *L, int rank, int world,
                                                  strata_optim_state state);
/* The next n elements of unit u's range (strata_ckpt_rank_range), kind `kind`, as stored
 * (strata_ckpt_elem_bytes each, tensor by tensor; absmax kinds: n blocks): fails naming the
 * part expected when (u, kind) is not the one the file is at, or n runs past its end. */
int strata_ckpt_writer_put(strata_ckpt_writer *w, int u, int kind, const void *src, size_t n);
/* Fails if any part was not fed whole; else fsyncs the data file, writes and fsyncs
 * rankNNNNN.yaml and the directory. Frees w either way. */
int strata_ckpt_writer_close(strata_ckpt_writer *w);
/* After a failure: closes the file (the .tmp directory will not be committed) and frees w. */
void strata_ckpt_writer_abort(strata_ckpt_writer *w);

/* Writes rankNNNNN.bin and rankNNNNN.yaml for `rank` of `world` into tmp_dir and fsyncs
 * both, from whole shards in memory: shards[u][kind] points at that rank's standard
 * shard of unit u for that kind (only its strata_ckpt_rank_range part is written). */
int strata_ckpt_write_rank(const char *tmp_dir, const strata_param_layout *L, int rank, int world,
                           const float *const (*shards)[STRATA_CKPT_KINDS]);

/* Rank 0, after every rank's write_rank finished: writes manifest.yaml, fsyncs, renames
 * tmp_dir to its final name, fsyncs ckpt/, updates `latest`; updates `best`
 * (strata_ckpt_best) when the step validated and its val_loss is lower than the one `best`
 * records, or `best` is of a later step (a resume from before it: another history); then
 * deletes all but the newest `keep` complete checkpoints (0 keeps all) and, with
 * keep_best, the one `best` names, and any stale *.tmp directories. final_dir (may be
 * NULL) receives the final path. */
int strata_ckpt_commit(const char *run_dir, const char *tmp_dir, const strata_param_layout *L,
                       const strata_ckpt_meta *meta, int keep, int keep_best, char *final_dir, size_t final_len);

/* At the start of a run (rank 0, holding the run directory, before any save): removes
 * what killed saves left in run_dir/ckpt: every step_N.tmp directory, a step_N.old whose
 * finished step_N is present, and latest.tmp. A finished step_N is never touched. The
 * names removed go to `removed` (", "-separated, cut to removed_len); returns how many
 * were removed (0 when run_dir has no ckpt/ yet), or -1 + error naming the directory. */
int strata_ckpt_clean_stale(const char *run_dir, char *removed, size_t removed_len);

/* ---- reading ---- */

/* Resolves what --resume or `strata sample` was given: "latest" or "best" (with run_dir), a
 * run directory (its latest), a checkpoint directory, or a run's ckpt/latest or ckpt/best
 * file (the checkpoint it names). Errors say what was looked for. */
int strata_ckpt_resolve(const char *what, const char *run_dir, char *out, size_t outlen);

/* ckpt_dir/best: the checkpoint of the lowest validation loss a run measured at a step it
 * saved ("step_N" on its first line, "val_loss: X" on its second). 1 and *name (a plain
 * step directory name, which may have been removed since) and *val_loss when there is
 * one, 0 when there is none, -1 + error when it cannot be read. */
int strata_ckpt_best(const char *ckpt_dir, char *name, size_t name_len, double *val_loss);

typedef struct strata_ckpt strata_ckpt; /* an opened, structurally validated checkpoint */

/* Parses manifest.yaml and every rank index; checks that files exist with the sizes the
 * indices promise (a truncated file is refused here, naming file and tensor). */
strata_ckpt *strata_ckpt_open(const char *dir);
/* The same, and when it fails, *bad_manifest says whether manifest.yaml itself was at
 * fault: its CRC-32C (its first line, over every byte after it) does not match, or it has
 * a key this version never writes (a manifest names no files: nothing in it can point
 * outside the directory). That is bad input (exit 2), where a damaged data file is a
 * run-time failure (exit 1). A manifest without the checksum line (written by an older
 * Strata) loads, with a warning that it is unverified. */
strata_ckpt *strata_ckpt_open_checked(const char *dir, int *bad_manifest);
void strata_ckpt_close(strata_ckpt *ck);
const strata_ckpt_meta *strata_ckpt_get_meta(const strata_ckpt *ck);
/* The saved layout (for checking against the model: same tensors, names, shapes). */
const strata_param_layout *strata_ckpt_get_layout(const strata_ckpt *ck);
/* Fails naming the first tensor whose name, shape or offset differs from L. */
int strata_ckpt_check_layout(const strata_ckpt *ck, const strata_param_layout *L);

/* Reads elements [lo, hi) of unit `unit`, kind `kind` (param, m or v), into dst (hi - lo
 * floats), from whichever rank files hold them; every segment touched is checksummed
 * first, and a mismatch fails with "file ...: tensor ... (m): checksum mismatch". Elements
 * beyond the unit's numel (padding) read as 0. Moments stored otherwise come back as fp32:
 * bf16 widened, 8-bit codes dequantized with their block's absmax. */
int strata_ckpt_read_range(strata_ckpt *ck, int unit, int kind, size_t lo, size_t hi, float *dst);
/* The stored bytes of elements [lo, hi) of unit `unit`, kind `kind` (hi at most the unit's
 * numel; for the absmax kinds lo and hi count blocks, hi at most ceil(numel / 2048)), every
 * segment checksummed as above. Elements of m and v are strata_ckpt_elem_bytes of their
 * tensor each, tensor after tensor. */
int strata_ckpt_read_raw(strata_ckpt *ck, int unit, int kind, size_t lo, size_t hi, void *dst);

#endif
