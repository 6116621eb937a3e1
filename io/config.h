/* io/config.h: the run configuration, read from YAML by libyaml, strictly.
 *
 * Every key lives in one schema table (io/config.c): its section, name, type, range,
 * default and help. Parsing, `--set section.key=value` overrides, defaults and
 * `strata config` printing all go through that table, so a key cannot be accepted in one
 * place and rejected in another. A file may start from another with `base: FILE` (a path
 * relative to its own folder): the base is read first and the file's own keys override
 * it, so configs/gpt2-1.5b-zero3.yaml names only what differs from gpt2-1.5b.yaml. Errors name the file, the line and the key, and the
 * caller exits with STRATA_EXIT_USAGE (2) before any work starts. */
#ifndef STRATA_CONFIG_H
#define STRATA_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "core/common.h"
#include "core/model.h"
#include "core/optim.h"

typedef enum { STRATA_DTYPE_AUTO = 0, STRATA_DTYPE_FP32, STRATA_DTYPE_BF16 } strata_dtype_choice;
typedef enum { STRATA_BACKEND_AUTO = 0, STRATA_BACKEND_CPU, STRATA_BACKEND_CUDA } strata_backend_choice;
typedef enum { STRATA_COMM_AUTO = 0, STRATA_COMM_MPI, STRATA_COMM_NCCL } strata_comm_choice;
/* A number key set to "auto" (offload.optimizer_ratio, offload.nvme_ratio): resolved by the
 * launcher. */
#define STRATA_AUTO (-1.0)

typedef enum { STRATA_OFFLOAD_NONE = 0, STRATA_OFFLOAD_CPU, STRATA_OFFLOAD_NVME } strata_offload_choice;
/* run.export_checkpoint: auto = the best (ckpt/best) when there is one, else the latest */
typedef enum { STRATA_EXPORT_AUTO = 0, STRATA_EXPORT_LATEST, STRATA_EXPORT_BEST } strata_export_choice;
/* train.eval_at_start: auto = when the run starts from model.init_from (never on a resume) */
typedef enum { STRATA_EVAL_START_AUTO = 0, STRATA_EVAL_START_TRUE, STRATA_EVAL_START_FALSE } strata_eval_start;
/* model.hf_model_type: the Hugging Face model_type export writes (with its architecture);
 * auto = gpt2 for GPT-2, and for the Llama family qwen3 with qk_norm, qwen2 with qkv_bias,
 * llama otherwise */
typedef enum {
    STRATA_HF_AUTO = 0, STRATA_HF_GPT2, STRATA_HF_LLAMA, STRATA_HF_MISTRAL, STRATA_HF_QWEN2, STRATA_HF_QWEN3
} strata_hf_model_type;

typedef struct strata_config {
    char path[STRATA_PATH_MAX]; /* the YAML file it came from ("" for built-in) */

    strata_backend_choice device; /* top-level `device: auto|cpu|cuda` */

    struct {
        int arch;              /* strata_arch: gpt2 | llama */
        int n_layer, n_head, n_embd;
        int seq_len;           /* maximum context T (GPT-2: rows of wpe) */
        int vocab_size;        /* V: 256 for byte-level, 50257 for GPT-2 BPE */
        int padded_vocab_size; /* Vp >= V; 0 = V rounded up to a multiple of 128 */
        double init_std;
        char init_from[STRATA_PATH_MAX]; /* Hugging Face weights to start from; "" = random init */
        /* the Llama family's (GPT-2 keeps their defaults); a loaded llama config has
         * n_kv_head, head_dim and max_position_embeddings resolved (never 0) */
        int n_kv_head;         /* 0 = n_head */
        int head_dim;          /* 0 = n_embd / n_head */
        int intermediate_size; /* the SwiGLU MLP's width */
        double rope_theta;
        int rope_scaling;      /* strata_rope_type: none | llama3 */
        double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
        int rope_original_context;
        double rms_norm_eps;
        int tie_embeddings, qkv_bias, qk_norm;
        int max_position_embeddings; /* the context the weights were made for; 0 = seq_len */
        int hf_model_type;     /* strata_hf_model_type: what export names the model as */
    } model;

    struct {
        char train[STRATA_PATH_MAX]; /* glob of token shards (llm.c format) */
        char val[STRATA_PATH_MAX];   /* glob; "" = no validation */
        int shuffle;
        int document_mask; /* packed examples the shards mark attend only within themselves */
        char tokenizer[STRATA_PATH_MAX]; /* "" = tokenizer.json beside the train shards, if any */
    } data;

    struct {
        int64_t steps;   /* 0 = from epochs (a run sets it at its start) */
        double epochs;   /* passes over data.train; 0 = steps decides */
        int micro_batch; /* B, sequences per rank per micro-step */
        int seq_len;     /* T per sequence; 0 = model.seq_len */
        int grad_accum;  /* micro-steps per optimizer step */
        int global_batch; /* sequences per optimizer step over all ranks; 0 = as grad_accum makes it */
        uint64_t seed;
        int eval_every; /* steps between validation passes; 0 = never */
        int eval_batches; /* micro-batches a pass; 0 = the whole validation set */
        int eval_at_start; /* strata_eval_start: a pass before the first step */
        int early_stop_patience;     /* validations in a row without a new lowest loss that end the run; 0 = never */
        double early_stop_min_delta; /* how far below the lowest a validation must come to count */
        int log_every;
        int sample_every; /* steps between text samples; 0 = only at the end */
        int sample_tokens;
        int activation_checkpointing; /* 0 none, K: keep only every K-th block's activations
                                         ("blocks" = 1, "every:K" = K) */
        int logits_chunk_mb; /* the head holds at most this many MiB of logits at once; 0 = all rows */
        int mlp_chunk_mb;    /* the blocks' MLPs hold at most this many MiB of their widest activation; 0 = all rows */
        strata_dtype_choice dtype;
        strata_dtype_choice grad_reduce_dtype;
        int threads; /* OpenMP threads for CPU kernels; 0 = the runtime's default */
    } train;

    strata_optim_settings optim;

    struct {
        char dir[STRATA_PATH_MAX]; /* run directory: metrics, checkpoints, plots */
        int checkpoint_every;      /* steps; 0 = only at the end and on a stop */
        int keep;                  /* checkpoints kept; 0 = all */
        int keep_best;             /* also the one of the lowest validation loss (ckpt/best) */
        char export_dir[STRATA_PATH_MAX]; /* a Hugging Face directory written at the end; "" = none */
        int export_checkpoint;     /* strata_export_choice: which checkpoint export_dir gets */
        int checkpoint_at_end;     /* after the last step (a stop signal always writes one) */
        int tensorboard;           /* rank 0 writes TensorBoard events (io/tensorboard.h) */
        char tensorboard_dir[STRATA_PATH_MAX]; /* where; "" = run.dir */
        double hang_timeout_s; /* a step or validation without progress this long ends the run (saves:
                                * always auto); 0 = auto (launcher/watchdog.h) */
    } run;

    struct {
        int stage; /* 0..3 */
        double reduce_bucket_mb;
        int overlap_comm;
        int prefetch_units;
    } zero;

    struct {
        strata_comm_choice backend;
        double timeout_s; /* a collective that takes longer ends the job */
    } comm;

    struct {
        strata_offload_choice optimizer;
        strata_offload_choice params;
        /* cpu: one rank's fp32 gradients of the units the tier updates live in pinned host
         * memory; the device keeps a few units' worth, copied out after each backward
         * (STRATA_OFFLOAD_NVME is not a choice here) */
        strata_offload_choice gradients;
        /* cpu: the blocks' inputs (the L+1 residual streams) live in pinned host memory but
         * for 3 on the device, copied out in the forward and back in ahead of the backward
         * (shard/acts_home.h) */
        strata_offload_choice activations;
        /* share of the rank's optimizer state the offload tier holds (whole units, the last
         * in forward order); the rest stays on the device. 1 = all of it; STRATA_AUTO until
         * the launcher resolves it (strata_plan_resolve_ratio) */
        double optimizer_ratio;
        /* optimizer: nvme: share of the tier's state on NVMe (whole units, the last in
         * forward order); the rest in pinned memory. 1 = all of it; STRATA_AUTO until the
         * launcher resolves it */
        double nvme_ratio;
        char nvme_path[STRATA_PATH_MAX];
        double pinned_budget_gb; /* 0 = what the plan needs */
        int buffer_count;
        int cpu_threads; /* the CPU update's threads; 0 = auto (offload/pipeline.c) */
        int chunk_kb; /* fp32 gradient a staging buffer holds: larger ranges update in chunks */
        int block_kb;
        int queue_depth;
    } offload;

    struct {
        int auto_fit;   /* `memory.auto` */
        int allow_int8_state; /* memory.auto may choose optim.state: int8 */
        double gpu_gb;  /* 0 = query the device */
        double host_gb; /* 0 = query the machine */
        double nvme_gb; /* 0 = query nvme_path's file system */
    } memory;
} strata_config;

/* Fills every key with its default (required keys are left unset). */
void strata_config_defaults(strata_config *c);

/* Reads `path` over the defaults, then applies `n_sets` overrides "section.key=value",
 * then checks cross-key rules (n_embd divisible by n_head, ...). Returns 0, or -1 with a
 * message like "configs/x.yaml:12: key 'train.micro_batch': expected an integer, got 'abc'"
 * in strata_error(). path may be NULL for the built-in default (configs/quickstart.yaml's
 * contents compiled in). */
int strata_config_load(strata_config *c, const char *path, const char *const *sets, int n_sets);

/* Parses YAML text as if it were the file `name` (tests use this). */
int strata_config_load_string(strata_config *c, const char *name, const char *yaml,
                              const char *const *sets, int n_sets);

/* One override "section.key=value" with the same checks as the file. Cross-key rules
 * are not checked here (several overrides may be needed to reach a valid config); call
 * strata_config_check() after the last one. On error c is unchanged. */
int strata_config_set(strata_config *c, const char *assignment);

/* The cross-key rules (n_embd % n_head, train.seq_len <= model.seq_len, ...); `name`
 * is the file named in the message. strata_config_load() runs it. */
int strata_config_check(const strata_config *c, const char *name);

/* The rules that depend on the run's world size as well (offload.gradients: cpu is for one
 * rank): 0, or -1 + a message naming `name` and the key. */
int strata_config_check_world(const strata_config *c, const char *name, int world);
/* The same, after what the world decides: train.grad_accum from train.global_batch (0: as
 * given), refused naming both when it is not whole or disagrees with a grad_accum given. */
int strata_config_set_world(strata_config *c, const char *name, int world);

/* A checkpoint's weights against the config that would use them: every key the weights'
 * meaning depends on (the shape keys, and model.n_head, which changes no tensor's shape)
 * must be the same in `now` as in `saved`, the config they were trained with (named
 * `saved_name` in the message). 0, or -1 + "model.n_head is 4, but NAME was trained with
 * model.n_head 2: ..." for the first that differs. */
int strata_config_check_same_model(const strata_config *saved, const char *saved_name, const strata_config *now);

/* The keys whose values differ between a and b, every key of the schema but those named in
 * `skip` ("section.key", NULL-terminated; NULL skips none), written into out as
 * "train.steps 10 vs 12, optim.lr 0.001 vs 0.002" (a's value first; cut to n bytes).
 * Returns how many differ. */
int strata_config_diff(const strata_config *a, const strata_config *b, const char *const *skip, char *out,
                       size_t n);
/* A CRC-32C of every key's name and value but those in `skip` (as strata_config_diff):
 * equal for configs strata_config_diff finds no difference between. */
uint32_t strata_config_digest(const strata_config *c, const char *const *skip);

/* The built-in default config: configs/quickstart.yaml, byte for byte. */
const char *strata_config_builtin_yaml(void);

/* The effective config as YAML, every key, defaults filled in, optionally with a comment
 * per key: malloc'd text the caller frees. It parses back to the same config. NULL + error
 * naming the key when a string value is not UTF-8 (a loaded config never has one; a path
 * the launcher set from its command line might). */
char *strata_config_yaml(const strata_config *c, int with_comments);
/* The same, written to f: 0, or -1 + error. */
int strata_config_write(const strata_config *c, FILE *f, int with_comments);

/* The model a config describes (model.* keys, padded vocabulary resolved). */
strata_model_shape strata_config_model_shape(const strata_config *c);

/* Derived values. */
int strata_config_seq_len(const strata_config *c);     /* train.seq_len or model.seq_len */
int strata_config_padded_vocab(const strata_config *c); /* Vp */
/* Whether pruning spares the checkpoint of the lowest validation loss: run.keep_best, or
 * early stopping (train.early_stop_patience), whose point is that checkpoint. */
int strata_config_keeps_best(const strata_config *c);

/* The model in words: "12 layers, 12 heads, 768 channels, vocab 50257" for GPT-2;
 * "llama: 16 layers, 32 heads (8 key/value) of 64, 2048 channels, MLP 8192, vocab 128256,
 * RoPE llama3 theta 500000, tied" for the Llama family. */
void strata_config_model_describe(const strata_config *c, char *out, size_t n);
/* model.hf_model_type with auto resolved: "gpt2", "llama", "mistral", "qwen2", "qwen3". */
const char *strata_config_hf_model_type(const strata_config *c);

/* Names of enum values, for logs and printing. */
const char *strata_schedule_name(strata_schedule s);
const char *strata_offload_name(strata_offload_choice o);
const char *strata_dtype_choice_name(strata_dtype_choice d);

#endif
