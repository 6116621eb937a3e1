/* io/config.c: the run configuration: one schema table, a strict YAML reader (libyaml),
 * `--set section.key=value` overrides, cross-key rules, and printing.
 *
 * Every key is one row of `schema` below; defaults are YAML text parsed by the same code
 * that parses files and overrides, so a value is accepted or rejected the same way
 * everywhere. Loading works on a copy and only writes the caller's struct on success.
 *
 * Error messages (returned through strata_fail; the CLI prints them and exits 2). WHERE is
 * `FILE:LINE` for a key in a file, `FILE` for whole-file problems and cross-key rules, and
 * `--set` for an override. LINE and COL count from 1.
 *   FILE: cannot read: STRERROR
 *   FILE: empty config; expected a mapping of sections (model, data, train, ...)
 *   FILE:LINE:COL: invalid YAML: PROBLEM[ (CONTEXT)]
 *   FILE: invalid YAML: PROBLEM at byte N        (bad UTF-8 / UTF-16 input)
 *   FILE:LINE: expected a mapping of sections at the top level, got a KIND
 *   FILE:LINE: a second YAML document starts here; a config is one document
 *   FILE:LINE: keys must be scalars, got a KIND
 *   WHERE: unknown section 'S'[ (did you mean 'N'?)]
 *   WHERE: unknown key 'S.K'[ (did you mean 'N'?)]
 *   WHERE: section 'S' must be a mapping of keys, got a KIND
 *   FILE:LINE: duplicate section 'S' (first at line N)
 *   FILE:LINE: duplicate key 'S.K' (first at line N)
 *   WHERE: key 'S.K': expected a scalar value, got a KIND
 *   WHERE: key 'S.K': expected an integer, got 'V'
 *   WHERE: key 'S.K': expected a number, got 'V'
 *   WHERE: key 'S.K': expected true or false, got 'V'
 *   WHERE: key 'S.K': expected one of A, B, C; got 'V'
 *   WHERE: key 'S.K': expected none, blocks or every:K with K between 1 and 1024, got 'V'
 *   WHERE: key 'S.K': must be between MIN and MAX, got V
 *           (or "must be greater than MIN and at most MAX", "must be at least MIN and less
 *           than MAX" where a bound is exclusive)
 *   WHERE: key 'S.K': must not be empty
 *   WHERE: key 'S.K': longer than 1023 bytes
 *   --set: expected section.key=value, got 'TEXT'
 *   FILE: missing required key 'S.K'
 *   FILE: model.n_head (H) must be at least 1      (only for a struct never loaded)
 *   FILE: model.n_embd (E) must be divisible by model.n_head (H)
 *   FILE: train.seq_len (T) must not exceed model.seq_len (M)
 *   FILE: model.padded_vocab_size (P) must be 0 or at least model.vocab_size (V)
 *   FILE: optim.min_lr (A) must not exceed optim.lr (B)
 *   FILE: offload.S is nvme, which needs offload.nvme_path
 *   FILE: offload.block_kb (N) must be a multiple of 4 (O_DIRECT needs 4 KiB alignment)
 *   FILE: model.S is N, but model.init_from's PATH has K M (leave model.S out to take it
 *           from there)                      (a shape key that disagrees with config.json)
 *   FILE: missing required key 'model.S' (model.init_from PATH does not give K)
 *   FILE: model.init_from's PATH has K N, but model.S must be between MIN and MAX
 *   WHERE: key 'S.K': V becomes F as the float (32-bit) the kernels compute with, which must
 *           be between MIN and MAX[ and not 0]     (keys the kernels take as floats: optim.*)
 *   FILE: model.init_from 'PATH': ...        (no such path, or its config.json is refused)
 * FILE is "<built-in>" for the compiled-in quickstart config. */
#include "io/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/common.h"
#include "io/files.h"
#include "io/hf_config.h"
#include "io/text.h"
#include "io/yaml.h"

/* configs/quickstart.yaml, byte for byte: the build turns the file into this array
 * (CMakeLists.txt), so the built-in default cannot drift from the file. */
#include "quickstart_yaml.h"

#define BUILTIN_NAME "<built-in>"

const char *strata_config_builtin_yaml(void) { return builtin_yaml; }

/* ---- the schema ---- */

typedef enum { K_INT, K_INT64, K_UINT64, K_DOUBLE, K_BOOL, K_STRING, K_ENUM, K_CKPT } key_type;

enum {
    F_REQUIRED = 1,
    F_MIN_EXCL = 2, /* value must be > min */
    F_MAX_EXCL = 4, /* value must be < max */
    F_NONEMPTY = 8, /* strings */
    F_AUTO = 16,    /* K_DOUBLE: also "auto", stored as STRATA_AUTO (the launcher resolves it) */
    F_FLOAT = 32,   /* K_DOUBLE used as a float: the float too is within the bounds, and not 0
                       unless the value is */
};

typedef struct key_spec {
    const char *section; /* "" for top-level keys */
    const char *key;
    key_type type;
    size_t offset;
    double min, max; /* K_INT, K_INT64, K_DOUBLE; integer bounds are exact below 2^53 */
    const char *const *names; /* K_ENUM: NULL-terminated; value = index */
    const char *def;          /* default as YAML scalar text; NULL when required */
    unsigned flags;
    const char *help;
} key_spec;

static const char *const sections[] = {"model", "data",    "train", "optim", "run",
                                       "zero",  "comm",    "offload", "memory"};
static const char *const section_help[] = {
    "the model: its family and shape",
    "token shards in llm.c's format (uint16 tokens)",
    "the training loop",
    "AdamW and the learning-rate schedule",
    "where results go",
    "ZeRO sharding across ranks",
    "collectives between ranks",
    "optimizer state and parameters outside GPU memory",
    "the memory plan",
};
#define N_SECTIONS ((int)(sizeof sections / sizeof sections[0]))

static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const dtype_names[] = {"auto", "fp32", "bf16", NULL};
static const char *const schedule_names[] = {"cosine", "linear", "constant", NULL};
static const char *const optim_state_names[] = {"fp32", "bf16", "int8", NULL};
static const char *const comm_names[] = {"auto", "mpi", "nccl", NULL};
static const char *const offload_names[] = {"none", "cpu", "nvme", NULL};
static const char *const grad_home_names[] = {"none", "cpu", NULL}; /* a prefix of offload_names */
static const char *const arch_names[] = {"gpt2", "llama", NULL};
static const char *const rope_names[] = {"none", "llama3", NULL};
static const char *const eval_start_names[] = {"auto", "true", "false", NULL};
static const char *const export_names[] = {"auto", "latest", "best", NULL};
static const char *const hf_type_names[] = {"auto", "gpt2", "llama", "mistral", "qwen2", "qwen3", NULL};

#define OFF(field) offsetof(strata_config, field)
#define ROW(sec, key, type, field, lo, hi, names, def, flags, help) \
    {sec, key, type, OFF(field), lo, hi, names, def, flags, help}
#define INT_(s, k, f, lo, hi, def, help) ROW(s, k, K_INT, f, lo, hi, NULL, def, 0, help)
#define REQ_INT(s, k, f, lo, hi, help) ROW(s, k, K_INT, f, lo, hi, NULL, NULL, F_REQUIRED, help)
#define DBL(s, k, f, lo, hi, def, flags, help) ROW(s, k, K_DOUBLE, f, lo, hi, NULL, def, flags, help)
#define BOOL_(s, k, f, def, help) ROW(s, k, K_BOOL, f, 0, 1, NULL, def, 0, help)
#define STR(s, k, f, def, flags, help) ROW(s, k, K_STRING, f, 0, 0, NULL, def, flags, help)
#define ENUM_(s, k, f, names, def, help) ROW(s, k, K_ENUM, f, 0, 0, names, def, 0, help)

#define BIG 2147483647.0 /* INT_MAX */

static const key_spec schema[] = {
    ENUM_("", "device", device, backend_names, "auto", "where kernels run; auto = cuda if a GPU is found"),

    ENUM_("model", "arch", model.arch, arch_names, "gpt2",
          "the model family: gpt2, or llama (Llama 2/3, Mistral, Qwen2/2.5, Qwen3)"),
    REQ_INT("model", "n_layer", model.n_layer, 1, 1024, "transformer blocks"),
    REQ_INT("model", "n_head", model.n_head, 1, 1024, "attention (query) heads; must divide n_embd unless head_dim is set"),
    REQ_INT("model", "n_embd", model.n_embd, 1, 65536, "channels C"),
    REQ_INT("model", "seq_len", model.seq_len, 1, 1048576,
            "maximum context T (gpt2: rows of wpe; llama: up to max_position_embeddings)"),
    REQ_INT("model", "vocab_size", model.vocab_size, 1, 1048576,
            "V (256 byte-level, 50257 GPT-2 BPE); token shards hold uint16 tokens, so training data needs V <= 65536"),
    INT_("model", "padded_vocab_size", model.padded_vocab_size, 0, 1048576, "0",
         "Vp >= V; 0 = V rounded up to a multiple of 128"),
    DBL("model", "init_std", model.init_std, 0, 1, "0.02", F_FLOAT, "std of the normal weight init"),
    STR("model", "init_from", model.init_from, "", 0,
        "Hugging Face model directory (GPT-2 or the Llama family) or .safetensors file to start from; the model keys "
        "left out come from its config.json"),
    INT_("model", "n_kv_head", model.n_kv_head, 0, 1024, "0",
         "llama: key/value heads (grouped-query attention), dividing n_head; 0 = n_head"),
    INT_("model", "head_dim", model.head_dim, 0, 65536, "0", "llama: head size, even; 0 = n_embd / n_head"),
    INT_("model", "intermediate_size", model.intermediate_size, 0, 1048576, "0",
         "llama: the SwiGLU MLP's width [required for llama]; gpt2's is 4 * n_embd"),
    DBL("model", "rope_theta", model.rope_theta, 0, 1e12, "10000", F_MIN_EXCL, "llama: RoPE's base"),
    ENUM_("model", "rope_scaling", model.rope_scaling, rope_names, "none",
          "llama: none, or llama3 (Llama 3.1's rescaled frequencies: the four keys below)"),
    DBL("model", "rope_factor", model.rope_factor, 0, 1e6, "8", F_MIN_EXCL, "llama3 RoPE: factor"),
    DBL("model", "rope_low_freq_factor", model.rope_low_freq_factor, 0, 1e6, "1", F_MIN_EXCL,
        "llama3 RoPE: low_freq_factor"),
    DBL("model", "rope_high_freq_factor", model.rope_high_freq_factor, 0, 1e6, "4", F_MIN_EXCL,
        "llama3 RoPE: high_freq_factor (greater than low_freq_factor)"),
    INT_("model", "rope_original_context", model.rope_original_context, 1, 16777216, "8192",
         "llama3 RoPE: original_max_position_embeddings"),
    DBL("model", "rms_norm_eps", model.rms_norm_eps, 0, 1, "1e-6", F_MIN_EXCL | F_MAX_EXCL | F_FLOAT,
        "llama: RMSNorm's epsilon"),
    BOOL_("model", "tie_embeddings", model.tie_embeddings, "true",
          "the LM head reads the token embedding (gpt2: always); false: lm_head.weight of its own"),
    BOOL_("model", "qkv_bias", model.qkv_bias, "false", "llama: biases on q, k and v (Qwen2)"),
    BOOL_("model", "qk_norm", model.qk_norm, "false", "llama: per-head RMSNorm of q and k before RoPE (Qwen3)"),
    INT_("model", "max_position_embeddings", model.max_position_embeddings, 0, 16777216, "0",
         "llama: the context the weights were made for (export's config.json says it); 0 = seq_len"),
    ENUM_("model", "hf_model_type", model.hf_model_type, hf_type_names, "auto",
          "the Hugging Face model_type export writes; auto = gpt2, or for llama qwen3 with qk_norm, qwen2 with qkv_bias, "
          "llama otherwise"),

    STR("data", "train", data.train, NULL, F_REQUIRED | F_NONEMPTY, "glob of training token shards"),
    STR("data", "val", data.val, "", 0, "glob of validation shards; empty = no validation"),
    BOOL_("data", "shuffle", data.shuffle, "true", "shuffle shard order and sequences each epoch"),
    BOOL_("data", "document_mask", data.document_mask, "true",
          "keep the examples `strata prepare --jsonl` packed into one sequence apart: each attends only within "
          "itself, its positions counted from 0, as if alone; false: each sees the ones packed before it"),
    STR("data", "tokenizer", data.tokenizer, "", 0,
        "tokenizer.json (or a Hugging Face model directory) the shards were made with; empty = the tokenizer.json "
        "`strata prepare` wrote beside them"),

    ROW("train", "steps", K_INT64, train.steps, 0, 1e12, NULL, "0", 0,
        "optimizer steps (required unless train.epochs is set)"),
    DBL("train", "epochs", train.epochs, 0, 1e6, "0", F_FLOAT,
        "passes over data.train's sequences: when set, a run takes train.steps from it at its start (what it came "
        "to is recorded with the run)"),
    INT_("train", "micro_batch", train.micro_batch, 1, 65536, "8", "B, sequences per rank per micro-step"),
    INT_("train", "seq_len", train.seq_len, 0, 1048576, "0", "T per sequence; 0 = model.seq_len"),
    INT_("train", "grad_accum", train.grad_accum, 1, 65536, "1", "micro-steps per optimizer step"),
    INT_("train", "global_batch", train.global_batch, 0, BIG, "0",
         "sequences per optimizer step over all ranks: when set, grad_accum is global_batch / (micro_batch x ranks), "
         "which must be whole, so a resume at another world size keeps the batch (and the losses) by itself; 0 = "
         "micro_batch x grad_accum x ranks"),
    ROW("train", "seed", K_UINT64, train.seed, 0, 0, NULL, "1337", 0, "seed for init, data order, sampling"),
    INT_("train", "eval_every", train.eval_every, 0, BIG, "100", "steps between validation passes; 0 = never"),
    INT_("train", "eval_batches", train.eval_batches, 0, 1000000, "8",
         "micro-batches per validation pass; 0 = the whole validation set (its sequences that fill whole micro-batches "
         "on every rank, at least one micro-batch)"),
    ENUM_("train", "eval_at_start", train.eval_at_start, eval_start_names, "auto",
          "a validation pass before the first step, so the curve starts where the weights did (metrics.jsonl's step "
          "0); auto = when the run starts from model.init_from (a resume never does)"),
    INT_("train", "early_stop_patience", train.early_stop_patience, 0, BIG, "0",
         "end the run once this many validations in a row have not lowered the lowest validation loss (the "
         "checkpoint of the lowest is kept, as run.keep_best keeps it); 0 = never"),
    DBL("train", "early_stop_min_delta", train.early_stop_min_delta, 0, 1e6, "0", 0,
        "how far below the lowest validation loss so far a validation must come to count as lower"),
    INT_("train", "log_every", train.log_every, 1, BIG, "1", "steps between log lines"),
    INT_("train", "sample_every", train.sample_every, 0, BIG, "0",
         "steps between text samples; 0 = only at the end"),
    INT_("train", "sample_tokens", train.sample_tokens, 0, 1048576, "200", "tokens per sample; 0 = no samples"),
    ROW("train", "activation_checkpointing", K_CKPT, train.activation_checkpointing, 0, 0, NULL, "none", 0,
        "none | blocks | every:K: keep every K-th block's activations, recompute the rest"),
    INT_("train", "logits_chunk_mb", train.logits_chunk_mb, 0, 1048576, "0",
         "the classifier and loss run over chunks of rows whose logits take at most this many MiB (a 128k "
         "vocabulary's are 1 GiB per 4096 tokens); 0 = every row at once"),
    INT_("train", "mlp_chunk_mb", train.mlp_chunk_mb, 0, 1048576, "0",
         "each block's MLP runs over chunks of rows whose widest activation takes at most this many MiB "
         "(Llama 3 8B's gate|up: 56 KiB a token in bf16); 0 = every row at once"),
    ENUM_("train", "dtype", train.dtype, dtype_names, "auto", "compute dtype; auto = bf16 on cuda, fp32 on cpu"),
    ENUM_("train", "grad_reduce_dtype", train.grad_reduce_dtype, dtype_names, "auto",
          "dtype of gradient reduction between ranks; auto = the compute dtype"),
    INT_("train", "threads", train.threads, 0, 4096, "0", "OpenMP threads for CPU kernels; 0 = runtime default"),

    DBL("optim", "lr", optim.lr, 0, 10, "3e-4", F_FLOAT, "peak learning rate"),
    DBL("optim", "min_lr", optim.min_lr, 0, 10, "3e-5", F_FLOAT, "learning rate at the end of the decay"),
    INT_("optim", "warmup_steps", optim.warmup_steps, 0, BIG, "0", "linear warmup from 0 to lr"),
    DBL("optim", "warmup_ratio", optim.warmup_ratio, 0, 1, "0", F_MAX_EXCL,
        "the warmup as a share of train.steps (Hugging Face's warmup_ratio): a run takes warmup_steps = "
        "round(ratio x steps) at its start, after train.epochs; 0 = warmup_steps decides"),
    ENUM_("optim", "schedule", optim.schedule, schedule_names, "cosine", "decay from lr to min_lr after warmup"),
    DBL("optim", "beta1", optim.beta1, 0, 1, "0.9", F_MAX_EXCL | F_FLOAT, "AdamW first-moment decay"),
    DBL("optim", "beta2", optim.beta2, 0, 1, "0.95", F_MAX_EXCL | F_FLOAT, "AdamW second-moment decay"),
    DBL("optim", "eps", optim.eps, 0, 1, "1e-8", F_MIN_EXCL | F_FLOAT, "AdamW denominator epsilon"),
    DBL("optim", "weight_decay", optim.weight_decay, 0, 10, "0.1", F_FLOAT, "decoupled decay on matrices only"),
    DBL("optim", "grad_clip", optim.grad_clip, 0, 1e6, "1.0", F_FLOAT, "global gradient-norm clip; 0 = off"),
    ENUM_("optim", "state", optim.state, optim_state_names, "fp32",
          "how Adam's moments are stored (the master weights stay fp32): fp32 (12 bytes a parameter with the master), bf16 "
          "(8), or int8 (about 6: 8-bit block-wise codes, 8-bit Adam; tensors under 4096 elements keep fp32)"),

    STR("run", "dir", run.dir, "runs/default", F_NONEMPTY, "run directory: metrics, checkpoints, plots"),
    INT_("run", "checkpoint_every", run.checkpoint_every, 0, BIG, "0",
         "steps between checkpoints; 0 = only at the end and on a stop"),
    INT_("run", "keep", run.keep, 0, 1000000, "3", "checkpoints kept; 0 = all"),
    STR("run", "export_dir", run.export_dir, "", 0,
        "after the last step, rank 0 writes a Hugging Face directory here (as `strata export CKPT --out DIR`) of "
        "run.export_checkpoint; empty = none"),
    ENUM_("run", "export_checkpoint", run.export_checkpoint, export_names, "auto",
          "which checkpoint run.export_dir gets: best (ckpt/best), latest, or auto: the best when there is one, else "
          "the latest"),
    BOOL_("run", "keep_best", run.keep_best, "false",
          "also keep the checkpoint of the lowest validation loss (ckpt/best names it; export or sample RUN/ckpt/best) "
          "whatever run.keep removes; a step that validates and checkpoints can be it"),
    BOOL_("run", "checkpoint_at_end", run.checkpoint_at_end, "true",
          "write a checkpoint after the last step (benchmarks turn it off)"),
    BOOL_("run", "tensorboard", run.tensorboard, "true",
          "rank 0 writes TensorBoard event files beside metrics.jsonl (`tensorboard --logdir runs`)"),
    STR("run", "tensorboard_dir", run.tensorboard_dir, "", 0,
        "directory of the run's TensorBoard events (one run's: a fresh run replaces them); empty = run.dir"),
    DBL("run", "hang_timeout_s", run.hang_timeout_s, 0, 1e7, "0", 0,
        "a training step or validation that makes no progress this long ends the run (exit 5; the last checkpoint "
        "is intact); 0 = auto: 20 x the longest one so far, at least 20 minutes (an hour before the first); "
        "checkpoint saves always get auto's limit"),

    INT_("zero", "stage", zero.stage, 0, 3, "0", "0 none, 1 optimizer state, 2 + gradients, 3 + parameters"),
    DBL("zero", "reduce_bucket_mb", zero.reduce_bucket_mb, 0, 1e6, "25", F_MIN_EXCL,
        "gradient bucket size for reduce-scatter"),
    BOOL_("zero", "overlap_comm", zero.overlap_comm, "true", "overlap gradient reduction with backward"),
    INT_("zero", "prefetch_units", zero.prefetch_units, 0, 1024, "1", "stage 3: blocks gathered ahead"),

    ENUM_("comm", "backend", comm.backend, comm_names, "auto", "auto = nccl on GPUs (mpi when ranks share one), mpi on cpu"),
    DBL("comm", "timeout_s", comm.timeout_s, 0, 604800, "300", F_MIN_EXCL,
        "a collective that takes longer ends the job"),

    ENUM_("offload", "optimizer", offload.optimizer, offload_names, "none", "where optimizer state lives"),
    ENUM_("offload", "params", offload.params, offload_names, "none", "where stage-3 parameter shards live"),
    ENUM_("offload", "gradients", offload.gradients, grad_home_names, "none",
          "cpu: one rank's fp32 gradients of the offloaded units in pinned memory, streamed from the device as the backward goes"),
    ENUM_("offload", "activations", offload.activations, grad_home_names, "none",
          "cpu: the blocks' inputs (the residual streams, what activation checkpointing keeps) in pinned memory, the "
          "device holding 3; copied out after the forward writes them, back in a block ahead of the backward"),
    DBL("offload", "optimizer_ratio", offload.optimizer_ratio, 0, 1, "1", F_MIN_EXCL | F_AUTO,
        "share of the optimizer state offloaded, the rest on the device (the first units); auto = what the device cannot hold"),
    DBL("offload", "nvme_ratio", offload.nvme_ratio, 0, 1, "1", F_MIN_EXCL | F_AUTO,
        "optimizer: nvme: share of the offloaded state on NVMe, the rest pinned (the first units); auto = what the host cannot hold"),
    STR("offload", "nvme_path", offload.nvme_path, "", 0, "directory for nvme offload files"),
    DBL("offload", "pinned_budget_gb", offload.pinned_budget_gb, 0, 1e6, "0", 0,
        "pinned host memory; 0 = what the plan needs"),
    INT_("offload", "buffer_count", offload.buffer_count, 1, 1024, "4", "pinned staging buffers per direction for offloaded updates"),
    INT_("offload", "cpu_threads", offload.cpu_threads, 0, 4096, "0",
         "threads of the CPU's optimizer update; 0 = auto: every core but 2 with a GPU (its kernel launches and "
         "copies keep theirs), OpenMP's default on the CPU backend"),
    INT_("offload", "chunk_kb", offload.chunk_kb, 16, 4194304, "65536",
         "KiB of fp32 gradient a staging buffer holds; a larger unit's update streams through the buffers in chunks of it"),
    INT_("offload", "block_kb", offload.block_kb, 4, 1048576, "1024", "nvme I/O size; a multiple of 4"),
    INT_("offload", "queue_depth", offload.queue_depth, 1, 4096, "32", "io_uring submission queue depth"),

    BOOL_("memory", "auto", memory.auto_fit, "false",
          "pick micro_batch, checkpointing and offload to fit the budgets"),
    BOOL_("memory", "allow_int8_state", memory.allow_int8_state, "false",
          "memory.auto may choose optim.state: int8 (it changes the optimizer's numerics, so only when allowed)"),
    DBL("memory", "gpu_gb", memory.gpu_gb, 0, 1e6, "0", 0, "GPU memory budget; 0 = query the device"),
    DBL("memory", "host_gb", memory.host_gb, 0, 1e6, "0", 0, "host memory budget; 0 = query the machine"),
    DBL("memory", "nvme_gb", memory.nvme_gb, 0, 1e6, "0", 0, "nvme budget; 0 = query nvme_path's file system"),
};
#define N_KEYS ((int)(sizeof schema / sizeof schema[0]))

#define CKPT_MAX 1024

/* Per-load bookkeeping: the line where each key and section was first set (0 = not yet;
 * -1 = set by --set), for duplicate and missing-key errors. */
typedef struct load_state {
    int key_line[N_KEYS];
    int section_line[N_SECTIONS];
    int from_base[N_KEYS]; /* set by a `base:` file this one builds on */
    int depth;             /* of `base:` nesting */
} load_state;

#define MAX_BASE_DEPTH 8

static void full_name(const key_spec *k, char *buf, size_t n) {
    if (k->section[0]) snprintf(buf, n, "%s.%s", k->section, k->key);
    else snprintf(buf, n, "%s", k->key);
}

static int find_section(const char *name) {
    for (int i = 0; i < N_SECTIONS; i++)
        if (!strcmp(sections[i], name)) return i;
    return -1;
}

static int find_key(const char *section, const char *key) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(schema[i].section, section) && !strcmp(schema[i].key, key)) return i;
    return -1;
}

/* ---- did you mean ---- */

/* Optimal-string-alignment distance: Levenshtein plus adjacent transpositions, so
 * "trian" is one edit from "train". */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return 1000;
    int d[65][65];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[n][m];
}

static int close_enough(int dist, const char *query) {
    int limit = (int)strlen(query) / 3;
    if (limit < 2) limit = 2;
    return dist <= limit;
}

/* Writes " (did you mean 'X'?)" into out, or "" when nothing is close. `query` is the
 * full dotted name; a key that exists verbatim in another section is the best guess. */
static void suggest_key(const char *query, const char *bare_key, char *out, size_t n) {
    int best = 1000;
    char best_name[96] = "";
    for (int i = 0; i < N_KEYS; i++) {
        char name[96];
        full_name(&schema[i], name, sizeof name);
        int d = edit_distance(query, name);
        if (bare_key && !strcmp(schema[i].key, bare_key)) d = 1;
        if (d < best) {
            best = d;
            snprintf(best_name, sizeof best_name, "%s", name);
        }
    }
    out[0] = 0;
    if (best_name[0] && close_enough(best, query)) snprintf(out, n, " (did you mean '%s'?)", best_name);
}

static void suggest_section(const char *query, char *out, size_t n) {
    int best = 1000;
    const char *best_name = NULL;
    for (int i = 0; i < N_SECTIONS; i++) {
        int d = edit_distance(query, sections[i]);
        if (d < best) best = d, best_name = sections[i];
    }
    out[0] = 0;
    if (best_name && close_enough(best, query)) {
        snprintf(out, n, " (did you mean '%s'?)", best_name);
        return;
    }
    /* A key written at the top level instead of inside its section, or a misspelt
     * top-level key. */
    suggest_key(query, query, out, n);
}

/* ---- values ---- */

/* "1e-08" -> "1e-8", "1e+20" -> "1e20". */
static void tidy_exponent(char *buf) {
    char *e = strchr(buf, 'e');
    if (!e) return;
    char *src = e + 1, *dst = e + 1;
    if (*src == '+') src++;
    else if (*src == '-') *dst++ = *src++;
    while (*src == '0' && src[1]) src++;
    memmove(dst, src, strlen(src) + 1);
}

/* The shortest %g form that reads back to the same double, with a tidy exponent
 * ("1e-08" -> "1e-8"), so printed configs round-trip exactly and stay readable. */
static void format_double(double v, char *buf, size_t n) {
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    tidy_exponent(buf);
}

/* The shortest %g form that reads back to the same float ("1", "0.99999988"). */
static void format_float(float v, char *buf, size_t n) {
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, n, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    tidy_exponent(buf);
}

static int is_integer_text(const char *s) {
    if (*s == '+' || *s == '-') s++;
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static int is_number_text(const char *s) {
    int digits = 0;
    for (const char *p = s; *p; p++) {
        if (*p >= '0' && *p <= '9') digits++;
        else if (!strchr("+-.eE", *p)) return 0;
    }
    if (!digits) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    return *end == 0 && !isnan(v);
}

/* Key k's bounds as words: "between 1 and 1024", "greater than 0 and at most 1", ... */
static void range_text(const key_spec *k, char *buf, size_t n) {
    char lo[64], hi[64];
    format_double(k->min, lo, sizeof lo);
    format_double(k->max, hi, sizeof hi);
    if (k->flags & F_MIN_EXCL)
        snprintf(buf, n, "greater than %s and at most %s%s", lo, hi, k->flags & F_AUTO ? ", or auto" : "");
    else if (k->flags & F_MAX_EXCL) snprintf(buf, n, "at least %s and less than %s", lo, hi);
    else snprintf(buf, n, "between %s and %s", lo, hi);
}

static int range_error(const char *where, const char *name, const key_spec *k, const char *text) {
    char range[192];
    range_text(k, range, sizeof range);
    return strata_fail("%s: key '%s': must be %s, got %s", where, name, range, text);
}

static int in_range(const key_spec *k, double v) {
    if (k->flags & F_MIN_EXCL ? !(v > k->min) : !(v >= k->min)) return 0;
    if (k->flags & F_MAX_EXCL ? !(v < k->max) : !(v <= k->max)) return 0;
    return 1;
}

/* One parser per key type: `text` into `field` (key k, called `name`), or the message
 * "WHERE: key 'NAME': ..." that says what was expected. */

/* K_INT, K_INT64: a decimal integer within the key's bounds. */
static int set_int(const key_spec *k, const char *text, const char *where, const char *name, void *field) {
    if (!is_integer_text(text)) return strata_fail("%s: key '%s': expected an integer, got '%s'", where, name, text);
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || !in_range(k, (double)v)) return range_error(where, name, k, text);
    if (k->type == K_INT) *(int *)field = (int)v;
    else *(int64_t *)field = (int64_t)v;
    return 0;
}

/* K_UINT64: any decimal integer from 0 to UINT64_MAX. */
static int set_uint64(const char *text, const char *where, const char *name, void *field) {
    if (!is_integer_text(text)) return strata_fail("%s: key '%s': expected an integer, got '%s'", where, name, text);
    errno = 0;
    unsigned long long v = strtoull(text, NULL, 10);
    /* strtoull wraps negative input around; reject it instead. */
    if (errno == ERANGE || text[0] == '-')
        return strata_fail("%s: key '%s': must be between 0 and %llu, got %s", where, name,
                           (unsigned long long)UINT64_MAX, text);
    *(uint64_t *)field = (uint64_t)v;
    return 0;
}

/* K_DOUBLE: a number within the key's bounds, or "auto" where the key allows it. */
static int set_double(const key_spec *k, const char *text, const char *where, const char *name, void *field) {
    if ((k->flags & F_AUTO) && !strcmp(text, "auto")) {
        *(double *)field = STRATA_AUTO;
        return 0;
    }
    if (!is_number_text(text))
        return strata_fail("%s: key '%s': expected a number%s, got '%s'", where, name,
                           k->flags & F_AUTO ? " or auto" : "", text);
    double v = strtod(text, NULL);
    if (!in_range(k, v)) return range_error(where, name, k, text);
    if (k->flags & F_FLOAT) {
        /* the kernels compute with the float: 0.99999999 passes "< 1" as a double and is
         * 1.0f there, 1e-50 is 0.0f */
        float f = (float)v;
        int out = !isfinite(f) || !in_range(k, (double)f), underflow = v != 0 && f == 0;
        if (out || underflow) {
            char range[192], ftext[64];
            range_text(k, range, sizeof range);
            format_float(f, ftext, sizeof ftext);
            return strata_fail("%s: key '%s': %s becomes %s as the float (32-bit) the kernels compute with, which must "
                               "be %s%s", where, name, text, ftext, range, out ? "" : " and not 0");
        }
    }
    *(double *)field = v;
    return 0;
}

/* K_BOOL: true or false. */
static int set_bool(const char *text, const char *where, const char *name, void *field) {
    if (!strcmp(text, "true")) *(int *)field = 1;
    else if (!strcmp(text, "false")) *(int *)field = 0;
    else return strata_fail("%s: key '%s': expected true or false, got '%s'", where, name, text);
    return 0;
}

/* K_STRING: UTF-8 text shorter than STRATA_PATH_MAX, not empty where the key says so. */
static int set_string(const key_spec *k, const char *text, const char *where, const char *name, void *field) {
    size_t len = strlen(text);
    if (len >= STRATA_PATH_MAX)
        return strata_fail("%s: key '%s': longer than %d bytes", where, name, STRATA_PATH_MAX - 1);
    if (len == 0 && (k->flags & F_NONEMPTY)) return strata_fail("%s: key '%s': must not be empty", where, name);
    /* a config is YAML text, recorded in every checkpoint: a value YAML cannot hold
     * would fail the first save, after the training it was meant to keep */
    size_t bad = strata_utf8_invalid_at(text, len);
    if (bad < len)
        return strata_fail("%s: key '%s': byte %zu is not valid UTF-8; a config holds UTF-8 text only", where, name,
                           bad);
    memcpy(field, text, len + 1);
    return 0;
}

/* K_ENUM: one of the key's names, stored as its index. */
static int set_enum(const key_spec *k, const char *text, const char *where, const char *name, void *field) {
    for (int i = 0; k->names[i]; i++) {
        if (!strcmp(text, k->names[i])) {
            *(int *)field = i;
            return 0;
        }
    }
    char allowed[256] = "";
    for (int i = 0; k->names[i]; i++) {
        if (i) strncat(allowed, ", ", sizeof allowed - strlen(allowed) - 1);
        strncat(allowed, k->names[i], sizeof allowed - strlen(allowed) - 1);
    }
    return strata_fail("%s: key '%s': expected one of %s; got '%s'", where, name, allowed, text);
}

/* K_CKPT: none (0), blocks (1) or every:K (K, 1 to CKPT_MAX). */
static int set_ckpt(const char *text, const char *where, const char *name, void *field) {
    int v = -1;
    if (!strcmp(text, "none")) v = 0;
    else if (!strcmp(text, "blocks")) v = 1;
    else if (!strncmp(text, "every:", 6)) {
        const char *num = text + 6;
        if (num[0] >= '1' && num[0] <= '9' && strlen(num) <= 4 && is_integer_text(num)) {
            long k_every = strtol(num, NULL, 10);
            if (k_every >= 1 && k_every <= CKPT_MAX) v = (int)k_every;
        }
    }
    if (v < 0)
        return strata_fail("%s: key '%s': expected none, blocks or every:K with K between 1 and %d, got '%s'", where,
                           name, CKPT_MAX, text);
    *(int *)field = v;
    return 0;
}

/* Parses `text` as key k's type and stores it in c. `where` prefixes messages. */
static int set_value(strata_config *c, const key_spec *k, const char *text, const char *where) {
    char name[96];
    full_name(k, name, sizeof name);
    void *field = (char *)c + k->offset;
    switch (k->type) {
    case K_INT:
    case K_INT64: return set_int(k, text, where, name, field);
    case K_UINT64: return set_uint64(text, where, name, field);
    case K_DOUBLE: return set_double(k, text, where, name, field);
    case K_BOOL: return set_bool(text, where, name, field);
    case K_STRING: return set_string(k, text, where, name, field);
    case K_ENUM: return set_enum(k, text, where, name, field);
    case K_CKPT: return set_ckpt(text, where, name, field);
    }
    return strata_fail("%s: key '%s': unhandled type", where, name);
}

/* The text that set_value() would read back to the same value. */
static void value_text(const strata_config *c, const key_spec *k, char *buf, size_t n) {
    const void *field = (const char *)c + k->offset;
    switch (k->type) {
    case K_INT: snprintf(buf, n, "%d", *(const int *)field); return;
    case K_INT64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)field); return;
    case K_UINT64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)field); return;
    case K_DOUBLE:
        if ((k->flags & F_AUTO) && *(const double *)field == STRATA_AUTO) {
            snprintf(buf, n, "auto");
            return;
        }
        /* "1.0" rather than "1", so a printed config shows which keys take fractions. */
        format_double(*(const double *)field, buf, n);
        if (!strpbrk(buf, ".en")) strncat(buf, ".0", n - strlen(buf) - 1);
        return;
    case K_BOOL: snprintf(buf, n, "%s", *(const int *)field ? "true" : "false"); return;
    case K_STRING: snprintf(buf, n, "%s", (const char *)field); return;
    case K_ENUM: {
        int v = *(const int *)field, count = 0;
        while (k->names[count]) count++;
        snprintf(buf, n, "%s", v >= 0 && v < count ? k->names[v] : "?");
        return;
    }
    case K_CKPT: {
        int v = *(const int *)field;
        if (v == 0) snprintf(buf, n, "none");
        else if (v == 1) snprintf(buf, n, "blocks");
        else snprintf(buf, n, "every:%d", v);
        return;
    }
    }
}

void strata_config_defaults(strata_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++) {
        if (!schema[i].def) continue;
        if (set_value(c, &schema[i], schema[i].def, "default"))
            strata_panic(__FILE__, __LINE__, "schema default rejected: %s", strata_error());
    }
}

/* ---- YAML ---- */

static const char *node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return "scalar";
    case YAML_SEQUENCE_NODE: return "sequence";
    case YAML_MAPPING_NODE: return "mapping";
    default: return "empty node";
    }
}

/* A plain `key:` with nothing after it, `~` or `null`. */
static int is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = (const char *)n->data.scalar.value;
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null");
}

static const char *scalar_text(const yaml_node_t *n) {
    return is_null_scalar(n) ? "" : (const char *)n->data.scalar.value;
}

static int apply_key(strata_config *c, load_state *st, const char *name, int idx, const yaml_node_t *key,
                     const yaml_node_t *value) {
    char full[96], where[STRATA_PATH_MAX + 32];
    full_name(&schema[idx], full, sizeof full);
    int line = strata_yaml_line(key);
    if (st->key_line[idx] > 0)
        return strata_fail("%s:%d: duplicate key '%s' (first at line %d)", name, line, full, st->key_line[idx]);
    st->key_line[idx] = line;
    snprintf(where, sizeof where, "%s:%d", name, line);
    if (value->type != YAML_SCALAR_NODE)
        return strata_fail("%s: key '%s': expected a scalar value, got a %s", where, full, node_kind(value));
    return set_value(c, &schema[idx], scalar_text(value), where);
}

static int apply_section(strata_config *c, load_state *st, const char *name, int sec, yaml_document_t *doc,
                         const yaml_node_t *key, const yaml_node_t *value) {
    int line = strata_yaml_line(key);
    if (st->section_line[sec] > 0)
        return strata_fail("%s:%d: duplicate section '%s' (first at line %d)", name, line, sections[sec],
                           st->section_line[sec]);
    st->section_line[sec] = line;
    if (is_null_scalar(value)) return 0; /* every key commented out */
    if (value->type != YAML_MAPPING_NODE)
        return strata_fail("%s:%d: section '%s' must be a mapping of keys, got a %s", name, line, sections[sec],
                           node_kind(value));
    for (yaml_node_pair_t *p = value->data.mapping.pairs.start; p < value->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return strata_fail("%s:%d: keys must be scalars, got a %s", name, strata_yaml_line(k), node_kind(k));
        const char *kname = (const char *)k->data.scalar.value;
        int idx = find_key(sections[sec], kname);
        if (idx < 0) {
            char full[256], hint[160];
            snprintf(full, sizeof full, "%s.%s", sections[sec], kname);
            suggest_key(full, kname, hint, sizeof hint);
            return strata_fail("%s:%d: unknown key '%s'%s", name, strata_yaml_line(k), full, hint);
        }
        if (apply_key(c, st, name, idx, k, v)) return -1;
    }
    return 0;
}

/* A config is a page of YAML; anything larger (or /dev/zero, a directory, a FIFO) is a
 * wrong path, refused before it is read. */
#define MAX_CONFIG_BYTES ((size_t)1 << 20)


static int parse_yaml(strata_config *c, load_state *st, const char *name, const char *text, size_t len);

/* `base: FILE` (relative to the including file's folder): FILE is loaded first and this
 * file's keys override it, so a variant names only what it changes. */
static int apply_base(strata_config *c, load_state *st, const char *name, const yaml_node_t *key,
                      const yaml_node_t *value) {
    int line = strata_yaml_line(key);
    if (value->type != YAML_SCALAR_NODE || !scalar_text(value)[0])
        return strata_fail("%s:%d: key 'base': expected the path of a config file to build on", name, line);
    if (st->depth >= MAX_BASE_DEPTH)
        return strata_fail("%s:%d: key 'base': more than %d files deep (does a file build on itself?)", name, line,
                           MAX_BASE_DEPTH);
    const char *rel = scalar_text(value);
    char path[STRATA_PATH_MAX];
    const char *slash = strrchr(name, '/');
    int n = rel[0] == '/' || !slash ? snprintf(path, sizeof path, "%s", rel)
                                    : snprintf(path, sizeof path, "%.*s/%s", (int)(slash - name), name, rel);
    if (n < 0 || (size_t)n >= sizeof path) return strata_fail("%s:%d: key 'base': path too long", name, line);
    char *text = NULL;
    size_t len = 0;
    if (strata_read_file_bounded(path, MAX_CONFIG_BYTES, &text, &len)) return strata_fail_wrap("%s:%d: key 'base'", name, line);
    load_state sub;
    memset(&sub, 0, sizeof sub);
    sub.depth = st->depth + 1;
    int rc = parse_yaml(c, &sub, path, text, len);
    free(text);
    if (rc) return -1;
    for (int i = 0; i < N_KEYS; i++) st->from_base[i] |= sub.key_line[i] > 0 || sub.from_base[i];
    return 0;
}

static int apply_document(strata_config *c, load_state *st, const char *name, yaml_document_t *doc) {
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root) return strata_fail("%s: empty config; expected a mapping of sections (model, data, train, ...)", name);
    if (root->type != YAML_MAPPING_NODE)
        return strata_fail("%s:%d: expected a mapping of sections at the top level, got a %s", name,
                           strata_yaml_line(root), node_kind(root));
    /* the base goes first wherever `base:` is written, so this file always overrides it */
    yaml_node_pair_t *base = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (k->type != YAML_SCALAR_NODE || strcmp((const char *)k->data.scalar.value, "base")) continue;
        if (base)
            return strata_fail("%s:%d: duplicate key 'base' (first at line %d)", name, strata_yaml_line(k),
                               strata_yaml_line(yaml_document_get_node(doc, base->key)));
        base = p;
    }
    if (base && apply_base(c, st, name, yaml_document_get_node(doc, base->key), yaml_document_get_node(doc, base->value)))
        return -1;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return strata_fail("%s:%d: keys must be scalars, got a %s", name, strata_yaml_line(k), node_kind(k));
        const char *kname = (const char *)k->data.scalar.value;
        if (!strcmp(kname, "base")) continue;
        int idx = find_key("", kname);
        int sec = find_section(kname);
        if (idx >= 0) {
            if (apply_key(c, st, name, idx, k, v)) return -1;
        } else if (sec >= 0) {
            if (apply_section(c, st, name, sec, doc, k, v)) return -1;
        } else {
            char hint[160];
            suggest_section(kname, hint, sizeof hint);
            return strata_fail("%s:%d: unknown section '%s'%s", name, strata_yaml_line(k), kname, hint);
        }
    }
    return 0;
}

static int parse_yaml(strata_config *c, load_state *st, const char *name, const char *text, size_t len) {
    yaml_document_t doc;
    if (strata_yaml_load(&doc, name, text, len, "a config")) return -1;
    int rc = apply_document(c, st, name, &doc);
    yaml_document_delete(&doc);
    return rc;
}

/* ---- overrides ---- */

static void trim(char *s) {
    size_t n = strlen(s), start = 0;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
    while (s[start] == ' ' || s[start] == '\t') start++;
    memmove(s, s + start, n - start + 1);
}

static int apply_set(strata_config *c, load_state *st, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq) return strata_fail("--set: expected section.key=value, got '%s'", assignment);
    size_t klen = (size_t)(eq - assignment);
    char name[256];
    if (klen >= sizeof name) klen = sizeof name - 1;
    memcpy(name, assignment, klen);
    name[klen] = 0;
    trim(name);
    char *value = strata_xstrdup(eq + 1);
    trim(value);

    int rc;
    char *dot = strchr(name, '.');
    if (!name[0]) {
        rc = strata_fail("--set: expected section.key=value, got '%s'", assignment);
    } else if (!dot) {
        int idx = find_key("", name);
        if (idx >= 0) {
            rc = set_value(c, &schema[idx], value, "--set");
            if (rc == 0 && st) st->key_line[idx] = -1;
        } else if (find_section(name) >= 0) {
            rc = strata_fail("--set: section '%s' must be a mapping of keys, got a scalar", name);
        } else {
            char hint[160];
            suggest_section(name, hint, sizeof hint);
            rc = strata_fail("--set: unknown section '%s'%s", name, hint);
        }
    } else {
        *dot = 0;
        const char *sec = name, *key = dot + 1;
        char hint[160];
        if (find_section(sec) < 0) {
            suggest_section(sec, hint, sizeof hint);
            rc = strata_fail("--set: unknown section '%s'%s", sec, hint);
        } else {
            int idx = find_key(sec, key);
            if (idx < 0) {
                char full[sizeof name + 2];
                snprintf(full, sizeof full, "%s.%s", sec, key);
                suggest_key(full, key, hint, sizeof hint);
                rc = strata_fail("--set: unknown key '%s'%s", full, hint);
            } else {
                rc = set_value(c, &schema[idx], value, "--set");
                if (rc == 0 && st) st->key_line[idx] = -1;
            }
        }
    }
    free(value);
    return rc;
}

int strata_config_set(strata_config *c, const char *assignment) {
    /* Work on a copy so a rejected override leaves c as it was. */
    strata_config tmp = *c;
    if (apply_set(&tmp, NULL, assignment)) return -1;
    *c = tmp;
    return 0;
}

/* ---- cross-key rules ---- */

/* The Llama family's keys a GPT-2 config must leave as they are (or say GPT-2's own
 * value where it has one). */
static const char *const llama_only_keys[] = {
    "model.rope_theta", "model.rope_scaling", "model.rope_factor", "model.rope_low_freq_factor",
    "model.rope_high_freq_factor", "model.rope_original_context", "model.rms_norm_eps", "model.qkv_bias",
    "model.qk_norm",
};

static int key_named(const char *full);

static int check_gpt2(const strata_config *c, const char *name) {
    const int C = c->model.n_embd, NH = c->model.n_head;
    if (c->model.n_kv_head != 0 && c->model.n_kv_head != NH)
        return strata_fail("%s: model.n_kv_head (%d) must be 0 or model.n_head (%d): GPT-2 has one key/value head per "
                           "query head (grouped-query attention is model.arch llama's)", name, c->model.n_kv_head, NH);
    if (c->model.head_dim != 0 && c->model.head_dim != C / NH)
        return strata_fail("%s: model.head_dim (%d) must be 0 or model.n_embd / model.n_head (%d) for model.arch gpt2",
                           name, c->model.head_dim, C / NH);
    if (c->model.intermediate_size != 0 && c->model.intermediate_size != 4 * C)
        return strata_fail("%s: model.intermediate_size (%d) must be 0 or 4 * model.n_embd (%d): GPT-2's MLP is 4 * "
                           "n_embd wide", name, c->model.intermediate_size, 4 * C);
    if (!c->model.tie_embeddings)
        return strata_fail("%s: model.tie_embeddings is false, but GPT-2's LM head is tied to the token embedding", name);
    if (c->model.hf_model_type != STRATA_HF_AUTO && c->model.hf_model_type != STRATA_HF_GPT2)
        return strata_fail("%s: model.hf_model_type is %s, but model.arch is gpt2 (auto or gpt2)", name,
                           hf_type_names[c->model.hf_model_type]);
    if (c->model.max_position_embeddings != 0 && c->model.max_position_embeddings != c->model.seq_len)
        return strata_fail("%s: model.max_position_embeddings (%d) must be 0 for model.arch gpt2 (model.seq_len is its "
                           "wpe's rows)", name, c->model.max_position_embeddings);
    strata_config d;
    strata_config_defaults(&d);
    for (size_t i = 0; i < sizeof llama_only_keys / sizeof llama_only_keys[0]; i++) {
        const key_spec *k = &schema[key_named(llama_only_keys[i])];
        char a[128], b[128];
        value_text(c, k, a, sizeof a);
        value_text(&d, k, b, sizeof b);
        if (strcmp(a, b))
            return strata_fail("%s: %s is %s, but it applies to model.arch llama only (this model is gpt2)", name,
                               llama_only_keys[i], a);
    }
    return 0;
}

static int check_llama(const strata_config *c, const char *name) {
    const int NH = c->model.n_head, NKV = c->model.n_kv_head ? c->model.n_kv_head : NH;
    if (!c->model.head_dim && c->model.n_embd % NH)
        return strata_fail("%s: model.n_embd (%d) must be divisible by model.n_head (%d), or model.head_dim set", name,
                           c->model.n_embd, NH);
    const int hd = c->model.head_dim ? c->model.head_dim : c->model.n_embd / NH;
    if (NH % NKV)
        return strata_fail("%s: model.n_head (%d) must be a multiple of model.n_kv_head (%d): each key/value head serves "
                           "a group of query heads", name, NH, NKV);
    if (hd % 2)
        return strata_fail("%s: model.head_dim (%d) must be even: RoPE turns the two halves of a head together", name, hd);
    if (c->model.intermediate_size < 1)
        return strata_fail("%s: model.intermediate_size is required for model.arch llama (the SwiGLU MLP's width)", name);
    if (c->model.rope_scaling == STRATA_ROPE_LLAMA3 && !(c->model.rope_high_freq_factor > c->model.rope_low_freq_factor)) {
        char lo[64], hi[64];
        format_double(c->model.rope_low_freq_factor, lo, sizeof lo);
        format_double(c->model.rope_high_freq_factor, hi, sizeof hi);
        return strata_fail("%s: model.rope_high_freq_factor (%s) must be greater than model.rope_low_freq_factor (%s)",
                           name, hi, lo);
    }
    if (c->model.max_position_embeddings > 0 && c->model.seq_len > c->model.max_position_embeddings)
        return strata_fail("%s: model.seq_len (%d) must not exceed model.max_position_embeddings (%d), the context the "
                           "weights were made for", name, c->model.seq_len, c->model.max_position_embeddings);
    int t = c->model.hf_model_type, bias = c->model.qkv_bias, norm = c->model.qk_norm;
    if (t == STRATA_HF_GPT2) return strata_fail("%s: model.hf_model_type is gpt2, but model.arch is llama", name);
    if ((t == STRATA_HF_LLAMA || t == STRATA_HF_MISTRAL) && (bias || norm))
        return strata_fail("%s: model.hf_model_type %s has neither q/k/v biases nor q/k norms, but model.%s is true "
                           "(qwen2 has the biases, qwen3 the norms)", name, hf_type_names[t], bias ? "qkv_bias" : "qk_norm");
    if (t == STRATA_HF_QWEN2 && (!bias || norm))
        return strata_fail("%s: model.hf_model_type qwen2 has q/k/v biases and no q/k norms: model.qkv_bias must be true "
                           "and model.qk_norm false", name);
    if (t == STRATA_HF_QWEN3 && (bias || !norm))
        return strata_fail("%s: model.hf_model_type qwen3 has q/k norms and no q/k/v biases: model.qk_norm must be true "
                           "and model.qkv_bias false", name);
    return 0;
}

int strata_config_check(const strata_config *c, const char *name) {
    if (c->run.export_dir[0] && !c->run.checkpoint_at_end)
        return strata_fail("%s: run.export_dir exports the run's last checkpoint, which run.checkpoint_at_end: false "
                           "would not write: set it true, or export by hand (strata export)", name);
    if (c->train.early_stop_patience > 0 && (!c->data.val[0] || c->train.eval_every < 1))
        return strata_fail("%s: train.early_stop_patience %d counts validations, and this run has none: it needs "
                           "data.val%s and train.eval_every > 0%s", name, c->train.early_stop_patience,
                           c->data.val[0] ? "" : " (empty)", c->train.eval_every < 1 ? " (it is 0)" : "");
    if (c->optim.warmup_ratio > 0 && c->optim.warmup_steps > 0)
        return strata_fail("%s: optim.warmup_steps %d and optim.warmup_ratio %g both say how long the warmup is: set one",
                           name, c->optim.warmup_steps, c->optim.warmup_ratio);
    if (c->train.steps < 1 && !(c->train.epochs > 0))
        return strata_fail("%s: missing required key 'train.steps' (optimizer steps), or train.epochs (passes over "
                           "data.train)", name);
    if (c->model.n_head < 1) return strata_fail("%s: model.n_head (%d) must be at least 1", name, c->model.n_head);
    if (c->model.arch == STRATA_ARCH_GPT2 && c->model.n_embd % c->model.n_head)
        return strata_fail("%s: model.n_embd (%d) must be divisible by model.n_head (%d)", name, c->model.n_embd,
                           c->model.n_head);
    if (c->model.arch == STRATA_ARCH_GPT2 ? check_gpt2(c, name) : check_llama(c, name)) return -1;
    if (c->train.seq_len > c->model.seq_len)
        return strata_fail("%s: train.seq_len (%d) must not exceed model.seq_len (%d)", name, c->train.seq_len,
                           c->model.seq_len);
    if (c->model.padded_vocab_size != 0 && c->model.padded_vocab_size < c->model.vocab_size)
        return strata_fail("%s: model.padded_vocab_size (%d) must be 0 or at least model.vocab_size (%d)", name,
                           c->model.padded_vocab_size, c->model.vocab_size);
    if (c->optim.min_lr > c->optim.lr) {
        char a[64], b[64];
        format_double(c->optim.min_lr, a, sizeof a);
        format_double(c->optim.lr, b, sizeof b);
        return strata_fail("%s: optim.min_lr (%s) must not exceed optim.lr (%s)", name, a, b);
    }
    if (!c->offload.nvme_path[0]) {
        if (c->offload.optimizer == STRATA_OFFLOAD_NVME)
            return strata_fail("%s: offload.optimizer is nvme, which needs offload.nvme_path", name);
        if (c->offload.params == STRATA_OFFLOAD_NVME)
            return strata_fail("%s: offload.params is nvme, which needs offload.nvme_path", name);
    }
    if (c->offload.params != STRATA_OFFLOAD_NONE && c->zero.stage != 3)
        return strata_fail("%s: offload.params is %s, which needs zero.stage 3 (stages 0-2 keep full parameters on "
                           "every rank)", name, strata_offload_name(c->offload.params));
    if (c->offload.params == STRATA_OFFLOAD_NVME && c->offload.optimizer == STRATA_OFFLOAD_NONE)
        return strata_fail("%s: offload.params is nvme, which needs offload.optimizer cpu or nvme (the CPU update "
                           "writes the parameters to disk)", name);
    if (c->offload.gradients != STRATA_OFFLOAD_NONE && c->offload.optimizer == STRATA_OFFLOAD_NONE)
        return strata_fail("%s: offload.gradients is cpu, which needs offload.optimizer cpu or nvme (the CPU update "
                           "reads the gradients there; an update on the device reads them on the device)", name);
    if (c->offload.optimizer_ratio < 1) {
        char r[64];
        if (c->offload.optimizer_ratio == STRATA_AUTO) snprintf(r, sizeof r, "auto");
        else format_double(c->offload.optimizer_ratio, r, sizeof r);
        if (c->offload.optimizer == STRATA_OFFLOAD_NONE)
            return strata_fail("%s: offload.optimizer_ratio (%s) is the share of the optimizer state offloaded, but "
                               "offload.optimizer is none (set it to cpu or nvme, or the ratio to 1)", name, r);
        if (c->offload.params != STRATA_OFFLOAD_NONE)
            return strata_fail("%s: offload.optimizer_ratio (%s) %s offload.params none (a unit whose optimizer state "
                               "stays on the device updates its parameters there)", name, r,
                               c->offload.optimizer_ratio == STRATA_AUTO ? "needs" : "below 1 needs");
    }
    if (c->offload.nvme_ratio < 1 && c->offload.optimizer != STRATA_OFFLOAD_NVME) {
        char r[64];
        if (c->offload.nvme_ratio == STRATA_AUTO) snprintf(r, sizeof r, "auto");
        else format_double(c->offload.nvme_ratio, r, sizeof r);
        return strata_fail("%s: offload.nvme_ratio (%s) is the share of the offloaded optimizer state on NVMe, but "
                           "offload.optimizer is %s (set it to nvme, or the ratio to 1)", name, r,
                           strata_offload_name(c->offload.optimizer));
    }
    if (c->offload.block_kb % 4)
        return strata_fail("%s: offload.block_kb (%d) must be a multiple of 4 (O_DIRECT needs 4 KiB alignment)",
                           name, c->offload.block_kb);
    return 0;
}

int strata_config_set_world(strata_config *c, const char *name, int world) {
    if (c->train.global_batch > 0) {
        long long per = (long long)c->train.micro_batch * world, g = c->train.global_batch;
        if (g % per)
            return strata_fail("%s: train.global_batch %lld is not a multiple of train.micro_batch %d x %d rank%s = %lld "
                               "sequences a micro-step", name, g, c->train.micro_batch, world, world == 1 ? "" : "s", per);
        if (g / per > 65536)
            return strata_fail("%s: train.global_batch %lld takes %lld micro-steps of %lld sequences (train.micro_batch "
                               "%d x %d rank%s), more than 65536", name, g, g / per, per, c->train.micro_batch, world,
                               world == 1 ? "" : "s");
        if (c->train.grad_accum != 1 && c->train.grad_accum != g / per)
            return strata_fail("%s: train.grad_accum %d and train.global_batch %lld disagree (at %d rank%s with "
                               "micro_batch %d, global_batch asks for grad_accum %lld): set one of them", name,
                               c->train.grad_accum, g, world, world == 1 ? "" : "s", c->train.micro_batch, g / per);
        c->train.grad_accum = (int)(g / per);
    }
    return strata_config_check_world(c, name, world);
}

int strata_config_check_world(const strata_config *c, const char *name, int world) {
    /* several ranks reduce the full gradient on the device (stages 0-1), or keep only their
     * shard of it there (stages 2-3: 1/world of it) */
    if (c->offload.gradients != STRATA_OFFLOAD_NONE && world > 1)
        return strata_fail("%s: offload.gradients is cpu, which is for one rank (this run has %d): with several, "
                           "zero.stage 2 or 3 keeps 1/%d of the gradient on each device instead", name, world, world);
    return 0;
}

/* ---- comparing configs ---- */

/* The keys the weights' meaning depends on: a checkpoint trained under one value means
 * something else under another. Most change a tensor's shape (the checkpoint's layout
 * check would catch those, less plainly); the head counts, RoPE's frequencies and the
 * norms' epsilon change none. model.seq_len is GPT-2's wpe; with rotary positions the
 * Llama family may run at any context. */
static const char *const model_meaning_keys[] = {
    "model.arch", "model.n_layer", "model.n_head", "model.n_embd", "model.seq_len", "model.vocab_size",
    "model.n_kv_head", "model.head_dim", "model.intermediate_size", "model.rope_theta", "model.rope_scaling",
    "model.rope_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_context",
    "model.rms_norm_eps", "model.tie_embeddings", "model.qkv_bias", "model.qk_norm",
};

static int key_named(const char *full) {
    const char *dot = strchr(full, '.');
    if (!dot) return find_key("", full);
    char sec[32];
    snprintf(sec, sizeof sec, "%.*s", (int)(dot - full), full);
    return find_key(sec, dot + 1);
}

static int in_list(const char *name, const char *const *list) {
    for (int i = 0; list && list[i]; i++)
        if (!strcmp(list[i], name)) return 1;
    return 0;
}

int strata_config_check_same_model(const strata_config *saved, const char *saved_name, const strata_config *now) {
    for (size_t i = 0; i < sizeof model_meaning_keys / sizeof model_meaning_keys[0]; i++) {
        if (!strcmp(model_meaning_keys[i], "model.seq_len") && saved->model.arch == STRATA_ARCH_LLAMA &&
            now->model.arch == STRATA_ARCH_LLAMA)
            continue;
        int idx = key_named(model_meaning_keys[i]);
        STRATA_ASSERT(idx >= 0);
        char a[STRATA_PATH_MAX + 64], b[STRATA_PATH_MAX + 64];
        value_text(saved, &schema[idx], a, sizeof a);
        value_text(now, &schema[idx], b, sizeof b);
        if (strcmp(a, b))
            return strata_fail("%s is %s, but %s was trained with %s %s: the weights mean something else under "
                               "another value (keep %s, or start a new run)", model_meaning_keys[i], b, saved_name,
                               model_meaning_keys[i], a, a);
    }
    return 0;
}

int strata_config_diff(const strata_config *a, const strata_config *b, const char *const *skip, char *out,
                       size_t n) {
    int count = 0;
    size_t o = 0;
    if (n) out[0] = 0;
    for (int i = 0; i < N_KEYS; i++) {
        char name[96], va[STRATA_PATH_MAX + 64], vb[STRATA_PATH_MAX + 64];
        full_name(&schema[i], name, sizeof name);
        if (in_list(name, skip)) continue;
        value_text(a, &schema[i], va, sizeof va);
        value_text(b, &schema[i], vb, sizeof vb);
        if (!strcmp(va, vb)) continue;
        if (o < n) {
            int w = snprintf(out + o, n - o, "%s%s %s vs %s", count ? ", " : "", name, va, vb);
            o = w < 0 ? n : o + (size_t)w;
        }
        count++;
    }
    return count;
}

uint32_t strata_config_digest(const strata_config *c, const char *const *skip) {
    uint32_t crc = 0;
    for (int i = 0; i < N_KEYS; i++) {
        char name[96], v[STRATA_PATH_MAX + 64];
        full_name(&schema[i], name, sizeof name);
        if (in_list(name, skip)) continue;
        value_text(c, &schema[i], v, sizeof v);
        crc = strata_crc32c(crc, name, strlen(name) + 1); /* with its NUL: no key runs into its value */
        crc = strata_crc32c(crc, v, strlen(v) + 1);
    }
    return crc;
}

/* ---- loading ---- */

/* One model key that model.init_from's config.json gives: the key, the config.json key it
 * comes from (for messages), its value as YAML text ("" when the file does not say). */
typedef struct hf_key {
    const char *key, *hf_key;
    char text[64];
} hf_key;

/* The model keys init_from's config.json gives, in schema order. */
static int hf_keys_of(const strata_hf_shape *s, hf_key *k) {
    int n = 0, llama = s->arch == STRATA_ARCH_LLAMA;
#define KEY(key_, hf_, ...) (k[n] = (hf_key){key_, hf_, ""}, snprintf(k[n].text, sizeof k[n].text, __VA_ARGS__), n++)
#define INT_KEY(key_, hf_, v) ((v) > 0 ? KEY(key_, hf_, "%d", v) : KEY(key_, hf_, "%s", ""))
    KEY("arch", "model_type", "%s", llama ? "llama" : "gpt2");
    INT_KEY("n_layer", llama ? "num_hidden_layers" : "n_layer", s->n_layer);
    INT_KEY("n_head", llama ? "num_attention_heads" : "n_head", s->n_head);
    INT_KEY("n_embd", llama ? "hidden_size" : "n_embd", s->n_embd);
    if (!llama) INT_KEY("seq_len", "n_positions", s->n_positions); /* wpe's rows: exactly */
    INT_KEY("vocab_size", "vocab_size", s->vocab_size);
    if (llama) {
        INT_KEY("n_kv_head", "num_key_value_heads", s->n_kv_head);
        INT_KEY("head_dim", "head_dim", s->head_dim);
        INT_KEY("intermediate_size", "intermediate_size", s->intermediate_size);
        KEY("rope_theta", "rope_theta", "%.17g", s->rope_theta);
        KEY("rope_scaling", "rope_type", "%s", s->rope_type == STRATA_ROPE_LLAMA3 ? "llama3" : "none");
        if (s->rope_type == STRATA_ROPE_LLAMA3) {
            KEY("rope_factor", "factor", "%.17g", s->rope_factor);
            KEY("rope_low_freq_factor", "low_freq_factor", "%.17g", s->rope_low_freq_factor);
            KEY("rope_high_freq_factor", "high_freq_factor", "%.17g", s->rope_high_freq_factor);
            INT_KEY("rope_original_context", "original_max_position_embeddings", s->rope_original_context);
        }
        KEY("rms_norm_eps", "rms_norm_eps", "%.17g", s->rms_norm_eps);
        KEY("tie_embeddings", "tie_word_embeddings", "%s", s->tie_embeddings ? "true" : "false");
        KEY("qkv_bias", "model_type", "%s", s->qkv_bias ? "true" : "false");
        KEY("qk_norm", "model_type", "%s", s->qk_norm ? "true" : "false");
        INT_KEY("max_position_embeddings", "max_position_embeddings", s->n_positions);
        KEY("hf_model_type", "model_type", "%s", s->model_type);
    }
#undef INT_KEY
#undef KEY
    return n;
}

/* The model keys from c->model.init_from's config.json: keys the YAML left out (neither
 * in the file, a base, nor --set) are filled in, within the schema's bounds as if the YAML
 * had said them; a key the YAML set must agree, or the error names both values and where
 * they came from. The Llama family's model.seq_len, left out, is the checkpoint's
 * max_position_embeddings; set, it may be anything up to it. A sliding window shorter than
 * model.seq_len is refused. `name` is the config file. */
static int shape_from_init_from(strata_config *c, load_state *st, const char *name) {
    strata_hf_shape s;
    if (strata_hf_shape_read(c->model.init_from, &s)) return strata_fail_wrap("%s", name);
    hf_key keys[32];
    int n = hf_keys_of(&s, keys);
    for (int i = 0; i < n; i++) {
        int idx = find_key("model", keys[i].key);
        STRATA_ASSERT(idx >= 0);
        const key_spec *k = &schema[idx];
        int set = st->key_line[idx] != 0 || st->from_base[idx];
        st->from_base[idx] = 1; /* given from here on, one way or the other */
        if (!keys[i].text[0]) {
            if (!set && (k->flags & F_REQUIRED))
                return strata_fail("%s: missing required key 'model.%s' (model.init_from %s does not give %s)", name,
                                   keys[i].key, s.source, keys[i].hf_key);
            continue;
        }
        char where[STRATA_PATH_MAX + 64];
        snprintf(where, sizeof where, "model.init_from's %s", s.source);
        if (!set) {
            if ((k->type == K_INT || k->type == K_DOUBLE) && !in_range(k, strtod(keys[i].text, NULL))) {
                char range[192];
                range_text(k, range, sizeof range);
                return strata_fail("%s: model.init_from's %s has %s %s, but model.%s must be %s", name, s.source,
                                   keys[i].hf_key, keys[i].text, keys[i].key, range);
            }
            if (set_value(c, k, keys[i].text, where)) return strata_fail_wrap("%s", name);
            continue;
        }
        /* as the key would print (10000 -> 10000.0), or as the file says when out of bounds */
        strata_config hf = *c;
        char a[128], b[128];
        value_text(c, k, a, sizeof a);
        if (set_value(&hf, k, keys[i].text, where) == 0) value_text(&hf, k, b, sizeof b);
        else snprintf(b, sizeof b, "%s", keys[i].text);
        if (strcmp(a, b))
            return strata_fail("%s: model.%s is %s, but model.init_from's %s has %s %s (leave model.%s out to take it "
                               "from there)", name, keys[i].key, a, s.source, keys[i].hf_key, b, keys[i].key);
    }
    if (s.arch == STRATA_ARCH_LLAMA) {
        int idx = find_key("model", "seq_len");
        if (!(st->key_line[idx] != 0 || st->from_base[idx])) {
            const key_spec *k = &schema[idx];
            if (!in_range(k, s.n_positions)) {
                char range[192];
                range_text(k, range, sizeof range);
                return strata_fail("%s: model.init_from's %s has max_position_embeddings %d, but model.seq_len must be %s "
                                   "(set model.seq_len, the context to train at)", name, s.source, s.n_positions, range);
            }
            c->model.seq_len = s.n_positions;
        }
        st->from_base[idx] = 1;
        if (s.sliding_window > 0 && s.sliding_window < c->model.seq_len)
            return strata_fail("%s: model.init_from's %s has sliding_window %d, shorter than model.seq_len %d: Strata's "
                               "attention sees the whole causal context, the same as the window only up to its length "
                               "(set model.seq_len to at most %d)", name, s.source, s.sliding_window, c->model.seq_len,
                               s.sliding_window);
    }
    return 0;
}

/* The Llama family's keys whose 0 means "as the other keys say", resolved so that the
 * config a run records says them. */
static void resolve_llama(strata_config *c) {
    if (c->model.arch != STRATA_ARCH_LLAMA) return;
    if (!c->model.n_kv_head) c->model.n_kv_head = c->model.n_head;
    if (!c->model.head_dim && c->model.n_head > 0 && c->model.n_embd % c->model.n_head == 0)
        c->model.head_dim = c->model.n_embd / c->model.n_head;
    if (!c->model.max_position_embeddings) c->model.max_position_embeddings = c->model.seq_len;
}

static int load_text(strata_config *c, const char *name, const char *path_field, const char *text, size_t len,
                     const char *const *sets, int n_sets) {
    strata_config tmp;
    strata_config_defaults(&tmp);
    snprintf(tmp.path, sizeof tmp.path, "%s", path_field);
    load_state st;
    memset(&st, 0, sizeof st);
    if (parse_yaml(&tmp, &st, name, text, len)) return -1;
    for (int i = 0; i < n_sets; i++)
        if (apply_set(&tmp, &st, sets[i])) return -1;
    /* pretrained weights: the model keys the YAML leaves out come from their config.json */
    if (tmp.model.init_from[0] && shape_from_init_from(&tmp, &st, name)) return -1;
    for (int i = 0; i < N_KEYS; i++) {
        if ((schema[i].flags & F_REQUIRED) && st.key_line[i] == 0 && !st.from_base[i]) {
            char full[96];
            full_name(&schema[i], full, sizeof full);
            return strata_fail("%s: missing required key '%s'", name, full);
        }
    }
    resolve_llama(&tmp);
    if (strata_config_check(&tmp, name)) return -1;
    *c = tmp;
    return 0;
}

int strata_config_load_string(strata_config *c, const char *name, const char *yaml, const char *const *sets,
                              int n_sets) {
    return load_text(c, name, name, yaml, strlen(yaml), sets, n_sets);
}

int strata_config_load(strata_config *c, const char *path, const char *const *sets, int n_sets) {
    if (!path) return load_text(c, BUILTIN_NAME, "", builtin_yaml, sizeof builtin_yaml - 1, sets, n_sets);
    char *buf = NULL;
    size_t len = 0;
    if (strata_read_file_bounded(path, MAX_CONFIG_BYTES, &buf, &len)) return -1;
    int rc = load_text(c, path, path, buf, len, sets, n_sets);
    free(buf);
    return rc;
}

/* ---- printing ---- */

#define COMMENT_COLUMN 34

/* One key's line. Strings are always double-quoted so globs, "" and look-alikes of
 * numbers survive. */
static int write_key(strata_sbuf *b, const strata_config *c, const key_spec *k, int with_comments) {
    char text[STRATA_PATH_MAX + 64], name[96];
    value_text(c, k, text, sizeof text);
    full_name(k, name, sizeof name);
    size_t start = b->len;
    strata_sbuf_printf(b, "%s%s: ", k->section[0] ? "  " : "", k->key);
    if (k->type != K_STRING) strata_sbuf_puts(b, text);
    else if (strata_yaml_quoted(b, text, strlen(text), name)) return -1;
    if (with_comments) {
        int width = (int)(b->len - start);
        int pad = width < COMMENT_COLUMN ? COMMENT_COLUMN - width : 2;
        strata_sbuf_printf(b, "%*s# %s", pad, "", k->help);
        if (k->type == K_ENUM) {
            strata_sbuf_puts(b, " (");
            for (int i = 0; k->names[i]; i++) strata_sbuf_printf(b, "%s%s", i ? "|" : "", k->names[i]);
            strata_sbuf_puts(b, ")");
        }
        if (k->flags & F_REQUIRED) strata_sbuf_puts(b, " [required]");
    }
    strata_sbuf_puts(b, "\n");
    return 0;
}

char *strata_config_yaml(const strata_config *c, int with_comments) {
    strata_sbuf b = {0};
    int rc = 0;
    if (with_comments)
        strata_sbuf_printf(&b, "# Strata config%s%s: every key, defaults filled in.\n",
                           c->path[0] ? " from " : " (built-in)", c->path);
    for (int i = 0; i < N_KEYS && !rc; i++)
        if (!schema[i].section[0]) rc = write_key(&b, c, &schema[i], with_comments);
    for (int s = 0; s < N_SECTIONS && !rc; s++) {
        strata_sbuf_puts(&b, "\n");
        if (with_comments)
            strata_sbuf_printf(&b, "%s:%*s# %s\n", sections[s], COMMENT_COLUMN - 1 - (int)strlen(sections[s]), "",
                               section_help[s]);
        else strata_sbuf_printf(&b, "%s:\n", sections[s]);
        for (int i = 0; i < N_KEYS && !rc; i++)
            if (!strcmp(schema[i].section, sections[s])) rc = write_key(&b, c, &schema[i], with_comments);
    }
    if (rc) {
        strata_sbuf_free(&b);
        return NULL;
    }
    return b.p;
}

int strata_config_write(const strata_config *c, FILE *f, int with_comments) {
    char *text = strata_config_yaml(c, with_comments);
    if (!text) return -1;
    /* flushed, so that a full disk or a closed pipe is this call's failure */
    int rc = 0;
    if (fputs(text, f) == EOF || fflush(f) != 0) rc = strata_fail("cannot write the config: %s", strerror(errno));
    free(text);
    return rc;
}

/* ---- derived values and names ---- */

int strata_config_seq_len(const strata_config *c) { return c->train.seq_len > 0 ? c->train.seq_len : c->model.seq_len; }

strata_model_shape strata_config_model_shape(const strata_config *c) {
    const int llama = c->model.arch == STRATA_ARCH_LLAMA;
    return (strata_model_shape){
        .n_layer = c->model.n_layer,
        .n_head = c->model.n_head,
        .n_embd = c->model.n_embd,
        .max_seq_len = c->model.seq_len,
        .vocab_size = c->model.vocab_size,
        .padded_vocab_size = strata_config_padded_vocab(c),
        .init_std = (float)c->model.init_std,
        .arch = c->model.arch,
        .n_kv_head = llama ? c->model.n_kv_head : 0,
        .head_dim = llama ? c->model.head_dim : 0,
        .intermediate_size = llama ? c->model.intermediate_size : 0,
        .rope_theta = c->model.rope_theta,
        .rope_type = c->model.rope_scaling,
        .rope_factor = c->model.rope_factor,
        .rope_low_freq_factor = c->model.rope_low_freq_factor,
        .rope_high_freq_factor = c->model.rope_high_freq_factor,
        .rope_original_context = c->model.rope_original_context,
        .rms_norm_eps = (float)c->model.rms_norm_eps,
        .tie_embeddings = c->model.tie_embeddings,
        .qkv_bias = c->model.qkv_bias,
        .qk_norm = c->model.qk_norm,
    };
}

void strata_config_model_describe(const strata_config *c, char *out, size_t n) {
    if (c->model.arch == STRATA_ARCH_GPT2) {
        snprintf(out, n, "%d layers, %d heads, %d channels, vocab %d", c->model.n_layer, c->model.n_head, c->model.n_embd,
                 c->model.vocab_size);
        return;
    }
    char theta[64];
    format_double(c->model.rope_theta, theta, sizeof theta);
    snprintf(out, n, "%s: %d layers, %d heads (%d key/value) of %d, %d channels, MLP %d, vocab %d, RoPE %stheta %s%s%s%s",
             strata_config_hf_model_type(c), c->model.n_layer, c->model.n_head, c->model.n_kv_head, c->model.head_dim,
             c->model.n_embd, c->model.intermediate_size, c->model.vocab_size,
             c->model.rope_scaling == STRATA_ROPE_LLAMA3 ? "llama3 " : "", theta, c->model.qkv_bias ? ", q/k/v biases" : "",
             c->model.qk_norm ? ", q/k norms" : "", c->model.tie_embeddings ? ", tied" : "");
}

const char *strata_config_hf_model_type(const strata_config *c) {
    if (c->model.hf_model_type != STRATA_HF_AUTO) return hf_type_names[c->model.hf_model_type];
    if (c->model.arch == STRATA_ARCH_GPT2) return "gpt2";
    return c->model.qk_norm ? "qwen3" : c->model.qkv_bias ? "qwen2" : "llama";
}

int strata_config_padded_vocab(const strata_config *c) {
    if (c->model.padded_vocab_size > 0) return c->model.padded_vocab_size;
    return (c->model.vocab_size + 127) / 128 * 128;
}

int strata_config_keeps_best(const strata_config *c) { return c->run.keep_best || c->train.early_stop_patience > 0; }

const char *strata_schedule_name(strata_schedule s) {
    return (unsigned)s < 3 ? schedule_names[s] : "?";
}
const char *strata_offload_name(strata_offload_choice o) { return (unsigned)o < 3 ? offload_names[o] : "?"; }
const char *strata_dtype_choice_name(strata_dtype_choice d) { return (unsigned)d < 3 ? dtype_names[d] : "?"; }
