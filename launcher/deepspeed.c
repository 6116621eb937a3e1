/* launcher/deepspeed.c: `strata config --from-deepspeed`: a DeepSpeed JSON config turned
 * into the equivalent Strata YAML, with every key that cannot be carried over named and
 * explained (launcher/deepspeed.h). */
#include "launcher/deepspeed.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/config.h"
#include "io/json.h"

#define MAX_KEYS 64
#define MAX_NOTES 128

typedef struct out_key {
    const char *section, *key;
    char value[STRATA_PATH_MAX + 8];
    char from[200]; /* the DeepSpeed key(s) it came from, or why it is there */
} out_key;

typedef struct conv {
    const char *path;
    int world;
    out_key keys[MAX_KEYS];
    int n_keys;
    char notes[MAX_NOTES][400];
    int n_notes;
    /* gathered while walking, resolved at the end */
    const strata_json *micro, *accum, *tbs;
    const strata_json *optimizer, *scheduler, *clip;
    int bf16, fp16;
    int dtype_auto; /* bf16.enabled or fp16.enabled is "auto": the Trainer decides */
    char opt_nvme[STRATA_PATH_MAX], param_nvme[STRATA_PATH_MAX];
    int stage;
} conv;

static void put(conv *c, const char *section, const char *key, const char *from, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void put(conv *c, const char *section, const char *key, const char *from, const char *fmt, ...) {
    out_key *k = NULL;
    for (int i = 0; i < c->n_keys; i++)
        if (!strcmp(c->keys[i].section, section) && !strcmp(c->keys[i].key, key)) k = &c->keys[i];
    if (!k) {
        STRATA_ASSERT(c->n_keys < MAX_KEYS);
        k = &c->keys[c->n_keys++];
    }
    k->section = section;
    k->key = key;
    snprintf(k->from, sizeof k->from, "%s", from);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->value, sizeof k->value, fmt, ap);
    va_end(ap);
}

static const out_key *find_out(const conv *c, const char *section, const char *key) {
    for (int i = 0; i < c->n_keys; i++)
        if (!strcmp(c->keys[i].section, section) && !strcmp(c->keys[i].key, key)) return &c->keys[i];
    return NULL;
}

static void note(conv *c, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(conv *c, const char *key, const char *fmt, ...) {
    if (c->n_notes == MAX_NOTES) return;
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(c->notes[c->n_notes++], sizeof c->notes[0], "%s: %s", key, why);
}

/* The shortest text that reads back as the same double. */
static void fmt_num(char *buf, size_t n, double v) {
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* "auto" is the Hugging Face Trainer's placeholder, filled from its own arguments. */
static int is_auto(const strata_json *v) { return v && v->type == STRATA_JSON_STRING && !strcmp(v->str, "auto"); }

static int note_auto(conv *c, const char *key) {
    note(c, key, "\"auto\" is filled in by the Hugging Face Trainer from its own arguments; set the Strata key yourself");
    return 1;
}

/* Typed reads: 0 ok, 1 skipped ("auto", noted), -1 wrong type (exit 2). */
static int get_number(conv *c, const char *key, const strata_json *v, double *out) {
    if (is_auto(v)) return note_auto(c, key);
    if (!v || v->type != STRATA_JSON_NUMBER)
        return strata_fail("%s: key '%s': expected a number, got %s", c->path, key, strata_json_kind(v));
    *out = v->number;
    return 0;
}

static int get_int(conv *c, const char *key, const strata_json *v, long long lo, long long hi, long long *out) {
    if (is_auto(v)) return note_auto(c, key);
    if (!v || v->type != STRATA_JSON_NUMBER || v->number != floor(v->number))
        return strata_fail("%s: key '%s': expected an integer, got %s", c->path, key, strata_json_kind(v));
    if (v->number < (double)lo || v->number > (double)hi)
        return strata_fail("%s: key '%s': must be between %lld and %lld, got %.17g", c->path, key, lo, hi, v->number);
    *out = (long long)v->number;
    return 0;
}

static int get_bool(conv *c, const char *key, const strata_json *v, int *out) {
    if (is_auto(v)) return note_auto(c, key);
    if (!v || v->type != STRATA_JSON_BOOL)
        return strata_fail("%s: key '%s': expected true or false, got %s", c->path, key, strata_json_kind(v));
    *out = v->boolean;
    return 0;
}

static int get_string(conv *c, const char *key, const strata_json *v, const char **out) {
    if (is_auto(v)) return note_auto(c, key);
    if (!v || v->type != STRATA_JSON_STRING)
        return strata_fail("%s: key '%s': expected a string, got %s", c->path, key, strata_json_kind(v));
    *out = v->str;
    return 0;
}

static int get_object(conv *c, const char *key, const strata_json *v) {
    if (!v || v->type != STRATA_JSON_OBJECT)
        return strata_fail("%s: key '%s': expected an object, got %s", c->path, key, strata_json_kind(v));
    return 0;
}

/* Whether a value turns a feature on: true, a non-zero number, a non-empty string or
 * object (an object with "enabled": false is off). */
static int enabled(const strata_json *v) {
    if (!v) return 0;
    switch (v->type) {
    case STRATA_JSON_BOOL: return v->boolean;
    case STRATA_JSON_NUMBER: return v->number != 0;
    case STRATA_JSON_STRING: return v->len > 0;
    case STRATA_JSON_OBJECT: {
        const strata_json *e = strata_json_get(v, "enabled");
        return e ? enabled(e) : v->len > 0;
    }
    case STRATA_JSON_ARRAY: return v->len > 0;
    default: return 0;
    }
}

/* ---- sections ---- */

typedef enum { TUNE, FEATURE, OFF_IF_FALSE } kind;
typedef struct rule {
    const char *key;
    kind k;          /* TUNE: always named; FEATURE: named when on; OFF_IF_FALSE: named when false */
    const char *why;
} rule;

/* Keys Strata has no counterpart for, and why. */
static const rule zero_rules[] = {
    {"allgather_bucket_size", TUNE, "Strata all-gathers each unit (embedding, block, head) as one collective"},
    {"allgather_partitions", OFF_IF_FALSE, "Strata always all-gathers the updated shards"},
    {"reduce_scatter", OFF_IF_FALSE, "Strata always reduce-scatters gradients at stages 1-3"},
    {"contiguous_gradients", OFF_IF_FALSE, "each unit's gradients are one flat buffer in Strata, always"},
    {"stage3_prefetch_bucket_size", TUNE, "Strata prefetches whole units: zero.prefetch_units (default 1) units ahead"},
    {"stage3_param_persistence_threshold", TUNE, "Strata gathers every unit at stage 3 (the embedding is kept for the micro-step)"},
    {"stage3_max_live_parameters", TUNE, "Strata's gather ring holds zero.prefetch_units + 1 units, planned before step 1"},
    {"stage3_max_reuse_distance", TUNE, "Strata's gather ring holds zero.prefetch_units + 1 units, planned before step 1"},
    {"stage3_gather_16bit_weights_on_model_save", FEATURE, "`strata export` writes the fp32 weights at any stage"},
    {"stage3_gather_fp16_weights_on_model_save", FEATURE, "`strata export` writes the fp32 weights at any stage"},
    {"gather_16bit_weights_on_model_save", FEATURE, "`strata export` writes the fp32 weights at any stage"},
    {"round_robin_gradients", FEATURE, "Strata's offloaded update is already a pipeline per unit"},
    {"elastic_checkpoint", FEATURE, "not needed: Strata's checkpoints load at any world size and stage"},
    {"load_from_fp32_weights", OFF_IF_FALSE, "Strata always resumes from the fp32 master weights"},
    {"ignore_unused_parameters", FEATURE, "not needed: every parameter of Strata's GPT-2 is used"},
    {"zero_hpz_partition_size", TUNE, "Strata has no hierarchical (ZeRO++) partitioning"},
    {"zero_quantized_weights", FEATURE, "Strata has no quantized communication (ZeRO++)"},
    {"zero_quantized_nontrainable_weights", FEATURE, "Strata has no quantized communication (ZeRO++)"},
    {"zero_quantized_gradients", FEATURE, "Strata has no quantized communication (ZeRO++); train.grad_reduce_dtype: bf16 halves the bytes"},
    {"mics_shard_size", TUNE, "Strata has no MiCS sub-group sharding"},
    {"mics_hierarchical_params_gather", FEATURE, "Strata has no MiCS sub-group sharding"},
    {"memory_efficient_linear", TUNE, "DeepSpeed's own linear layer; Strata's kernels do not change"},
    {"use_multi_rank_bucket_allreduce", TUNE, "Strata reduces unit by unit"},
    {"legacy_stage1", FEATURE, "Strata has one stage 1"},
    {"cpu_offload_use_pin_memory", OFF_IF_FALSE, "Strata's host state is always pinned"},
    {"module_granularity_threshold", TUNE, "Strata's grain is always one unit (a block)"},
    {"stage3_module_granularity_threshold", TUNE, "Strata's grain is always one unit (a block)"},
    {"use_all_reduce_for_fetch_params", FEATURE, "Strata gathers parameters with all-gather"},
    {"pipeline_loading_checkpoint", FEATURE, "Strata has no pipeline parallelism"},
    {"override_module_apply", TUNE, "a hook of DeepSpeed's model wrapping; Strata has none"},
    {"log_trace_cache_warnings", TUNE, "DeepSpeed's own tracing; Strata has none"},
    {NULL, TUNE, NULL},
};

static const rule top_rules[] = {
    {"fp16", FEATURE, "Strata has no fp16 loss scaling; bf16 (train.dtype: bf16) trains in the same memory without it"},
    {"amp", FEATURE, "Strata has no Apex AMP; use train.dtype: bf16"},
    {"zero_allow_untested_optimizer", TUNE, "not needed: Strata's AdamW is built in"},
    {"zero_force_ds_cpu_optimizer", TUNE, "not needed: Strata's CPU AdamW is built in"},
    {"prescale_gradients", FEATURE, "Strata averages gradients in one reduction (no pre-scaling)"},
    {"gradient_predivide_factor", TUNE, "Strata averages gradients in one reduction (no pre-division)"},
    {"sparse_gradients", FEATURE, "Strata's gradients are dense"},
    {"activation_checkpointing", FEATURE, "DeepSpeed's is called from the model code; Strata's is train.activation_checkpointing (blocks | every:K)"},
    {"wall_clock_breakdown", FEATURE, "Strata writes step, compute, communication and offload times to metrics.jsonl"},
    {"memory_breakdown", FEATURE, "`strata plan` prints the memory plan; metrics.jsonl has memory per category"},
    {"flops_profiler", FEATURE, "metrics.jsonl has tflops per step"},
    {"wandb", FEATURE, "Strata writes metrics.jsonl and TensorBoard events (run.tensorboard); `strata plot` draws them"},
    {"csv_monitor", FEATURE, "Strata writes metrics.jsonl and TensorBoard events (run.tensorboard); `strata plot` draws them"},
    {"comet", FEATURE, "Strata writes metrics.jsonl and TensorBoard events (run.tensorboard); `strata plot` draws them"},
    {"comms_logger", FEATURE, "metrics.jsonl has the communication bytes of every step"},
    {"dump_state", FEATURE, "`strata config` prints the effective config"},
    {"timers", TUNE, "Strata times every step in metrics.jsonl"},
    {"checkpoint", TUNE, "Strata's checkpoints: run.checkpoint_every and run.keep (they load at any world size)"},
    {"sparse_attention", FEATURE, "Strata's attention is dense and causal"},
    {"pipeline", FEATURE, "Strata has no pipeline parallelism"},
    {"elasticity", FEATURE, "Strata fixes the world size per run (checkpoints load at any other)"},
    {"autotuning", FEATURE, "memory.auto: true measures the changes that fit and keeps the fastest"},
    {"data_efficiency", FEATURE, "Strata reads token shards in order or shuffled, without curricula"},
    {"curriculum_learning", FEATURE, "Strata reads token shards in order or shuffled, without curricula"},
    {"compression_training", FEATURE, "Strata has no compression training"},
    {"hybrid_engine", FEATURE, "Strata has no RLHF inference engine"},
    {"nebula", FEATURE, "Strata's checkpoints are written by every rank, atomically"},
    {"seq_parallel_communication_data_type", TUNE, "Strata has no sequence parallelism"},
    {"disable_allgather", FEATURE, "Strata always all-gathers the updated shards"},
    {"quantize_training", FEATURE, "Strata has no quantized training"},
    {"eigenvalue", FEATURE, "Strata has no eigenvalue computation"},
    {"progressive_layer_drop", FEATURE, "Strata has no layer drop"},
    {"weight_quantization", FEATURE, "Strata has no quantization"},
    {"zero_optimization_stage", TUNE, "use zero_optimization.stage"},
    {NULL, TUNE, NULL},
};

/* Returns 1 when `key` is in the table (noted if it must be). */
static int apply_rule(conv *c, const rule *rules, const char *prefix, const char *key, const strata_json *v) {
    for (const rule *r = rules; r->key; r++) {
        if (strcmp(r->key, key)) continue;
        char full[160];
        snprintf(full, sizeof full, "%s%s", prefix, key);
        if (r->k == TUNE || (r->k == FEATURE && enabled(v)) || (r->k == OFF_IF_FALSE && v && v->type == STRATA_JSON_BOOL && !v->boolean))
            note(c, full, "%s", r->why);
        return 1;
    }
    return 0;
}

static int offload_section(conv *c, const char *name, const strata_json *o, int is_param) {
    char key[160];
    if (get_object(c, name, o)) return -1;
    for (size_t i = 0; i < o->len; i++) {
        const strata_json_member *m = &o->members[i];
        const strata_json *v = &m->value;
        snprintf(key, sizeof key, "%s.%s", name, m->key);
        int r = 0;
        if (!strcmp(m->key, "device")) {
            const char *d = NULL;
            if ((r = get_string(c, key, v, &d))) { if (r < 0) return -1; continue; }
            if (strcmp(d, "cpu") && strcmp(d, "nvme") && strcmp(d, "none"))
                return strata_fail("%s: key '%s': expected cpu, nvme or none, got '%s'", c->path, key, d);
            put(c, "offload", is_param ? "params" : "optimizer", key, "%s", d);
        } else if (!strcmp(m->key, "nvme_path")) {
            const char *p = NULL;
            if ((r = get_string(c, key, v, &p))) { if (r < 0) return -1; continue; }
            snprintf(is_param ? c->param_nvme : c->opt_nvme, STRATA_PATH_MAX, "%s", p);
        } else if (!strcmp(m->key, "buffer_count")) {
            long long n;
            if ((r = get_int(c, key, v, 1, 1024, &n))) { if (r < 0) return -1; continue; }
            const out_key *prev = find_out(c, "offload", "buffer_count");
            if (prev && atoll(prev->value) != n)
                note(c, key, "Strata has one offload.buffer_count for both directions of every transfer; kept %s from %s",
                     prev->value, prev->from);
            else put(c, "offload", "buffer_count", key, "%lld", n);
        } else if (!strcmp(m->key, "pin_memory")) {
            int b = 1;
            if ((r = get_bool(c, key, v, &b))) { if (r < 0) return -1; continue; }
            if (!b) note(c, key, "Strata's offloaded state is always in pinned memory (offload.pinned_budget_gb bounds it)");
        } else if (!strcmp(m->key, "ratio")) {
            double x = 1.0;
            if ((r = get_number(c, key, v, &x))) { if (r < 0) return -1; continue; }
            if (is_param) note(c, key, "Strata's offload.optimizer_ratio splits the optimizer state only; ignored here");
            else if (x <= 0.0 || x > 1.0) note(c, key, "%g offloads nothing or is out of range; ignored", x);
            else if (x != 1.0) put(c, "offload", "optimizer_ratio", key, "%g", x);
        } else if (!strcmp(m->key, "buffer_size")) {
            note(c, key, "Strata's staging buffers hold offload.chunk_kb of gradient (zero_optimization.sub_group_size "
                 "sets it)");
        } else if (!strcmp(m->key, "max_in_cpu")) {
            note(c, key, "Strata keeps every parameter shard in the tier offload.params names");
        } else if (!strcmp(m->key, "pipeline_read") || !strcmp(m->key, "pipeline_write") || !strcmp(m->key, "pipeline")) {
            /* Strata's NVMe reads and writes always overlap the update: nothing to carry */
        } else if (!strcmp(m->key, "fast_init")) {
            note(c, key, "not needed: Strata initialises the NVMe state shard by shard");
        } else {
            note(c, key, "not an offload key Strata knows; ignored");
        }
    }
    return 0;
}

static int zero_section(conv *c, const strata_json *z) {
    if (get_object(c, "zero_optimization", z)) return -1;
    for (size_t i = 0; i < z->len; i++) {
        const strata_json_member *m = &z->members[i];
        const strata_json *v = &m->value;
        char key[160];
        snprintf(key, sizeof key, "zero_optimization.%s", m->key);
        int r = 0;
        long long n = 0;
        double x = 0;
        int b = 0;
        if (!strcmp(m->key, "stage")) {
            if ((r = get_int(c, key, v, 0, 3, &n))) { if (r < 0) return -1; continue; }
            put(c, "zero", "stage", key, "%lld", n);
            c->stage = (int)n;
        } else if (!strcmp(m->key, "overlap_comm")) {
            if ((r = get_bool(c, key, v, &b))) { if (r < 0) return -1; continue; }
            put(c, "zero", "overlap_comm", key, "%s", b ? "true" : "false");
        } else if (!strcmp(m->key, "reduce_bucket_size")) {
            if ((r = get_number(c, key, v, &x))) { if (r < 0) return -1; continue; }
            if (!(x > 0)) return strata_fail("%s: key '%s': must be positive, got %g", c->path, key, x);
            char mb[64];
            snprintf(mb, sizeof mb, "%.4g", x * 4.0 / (1 << 20));
            fmt_num(mb, sizeof mb, strtod(mb, NULL));
            put(c, "zero", "reduce_bucket_mb", "zero_optimization.reduce_bucket_size (elements) x 4 bytes, in MiB", "%s", mb);
            note(c, key, "carried over as zero.reduce_bucket_mb, but Strata's engine reduces each unit's gradient (a "
                 "block) as one collective as soon as its backward ends, whatever the bucket size");
        } else if (!strcmp(m->key, "sub_group_size")) {
            /* the elements the offloaded optimizer steps at a time: Strata's chunk, in KiB
             * of fp32 gradient, within offload.chunk_kb's range */
            if ((r = get_number(c, key, v, &x))) { if (r < 0) return -1; continue; }
            if (!(x > 0)) return strata_fail("%s: key '%s': must be positive, got %g", c->path, key, x);
            double kb = ceil(x * 4.0 / 1024.0);
            kb = kb < 16 ? 16 : kb > 4194304 ? 4194304 : kb;
            put(c, "offload", "chunk_kb", "zero_optimization.sub_group_size (elements) x 4 bytes, in KiB", "%.0f", kb);
        } else if (!strcmp(m->key, "offload_optimizer")) {
            if (offload_section(c, key, v, 0)) return -1;
        } else if (!strcmp(m->key, "offload_param")) {
            if (offload_section(c, key, v, 1)) return -1;
        } else if (!strcmp(m->key, "cpu_offload")) { /* deprecated spelling of offload_optimizer.device: cpu */
            if ((r = get_bool(c, key, v, &b))) { if (r < 0) return -1; continue; }
            if (b) put(c, "offload", "optimizer", key, "cpu");
        } else if (!strcmp(m->key, "cpu_offload_params")) {
            if ((r = get_bool(c, key, v, &b))) { if (r < 0) return -1; continue; }
            if (b) put(c, "offload", "params", key, "cpu");
        } else if (!apply_rule(c, zero_rules, "zero_optimization.", m->key, v)) {
            note(c, key, "not a zero_optimization key Strata knows; ignored");
        }
    }
    return 0;
}

static int aio_section(conv *c, const strata_json *a) {
    if (get_object(c, "aio", a)) return -1;
    for (size_t i = 0; i < a->len; i++) {
        const strata_json_member *m = &a->members[i];
        char key[160];
        snprintf(key, sizeof key, "aio.%s", m->key);
        long long n;
        int r = 0;
        if (!strcmp(m->key, "block_size")) {
            if ((r = get_int(c, key, &m->value, 4096, 1ll << 30, &n))) { if (r < 0) return -1; continue; }
            if (n % 4096) return strata_fail("%s: key '%s': %lld is not a multiple of 4096 (O_DIRECT)", c->path, key, n);
            put(c, "offload", "block_kb", "aio.block_size in KiB", "%lld", n / 1024);
        } else if (!strcmp(m->key, "queue_depth")) {
            if ((r = get_int(c, key, &m->value, 1, 4096, &n))) { if (r < 0) return -1; continue; }
            put(c, "offload", "queue_depth", key, "%lld", n);
        } else if (!strcmp(m->key, "thread_count")) {
            note(c, key, "Strata drives NVMe from one io_uring per rank, whose queue depth is offload.queue_depth");
        } else if (!strcmp(m->key, "single_submit") || !strcmp(m->key, "overlap_events")) {
            /* io_uring batches submissions and overlaps completions: nothing to carry */
        } else if (!strcmp(m->key, "use_gds")) {
            if (enabled(&m->value)) note(c, key, "Strata stages NVMe data through pinned host memory (no GPUDirect Storage)");
        } else {
            note(c, key, "not an aio key Strata knows; ignored");
        }
    }
    return 0;
}

/* DeepSpeed's TensorBoard monitor writes to os.path.join(output_path, job_name) (job_name
 * "DeepSpeedJobName" unless set; enabled false unless set): the same directory becomes
 * run.tensorboard_dir. With neither path key, Strata's default, run.dir beside
 * metrics.jsonl, stands, and the note says where DeepSpeed would have written. */
static int tensorboard_section(conv *c, const strata_json *t) {
    if (get_object(c, "tensorboard", t)) return -1;
    int on = 0, have_on = 0, r;
    const char *path = NULL, *job = NULL;
    for (size_t i = 0; i < t->len; i++) {
        const strata_json_member *m = &t->members[i];
        char key[160];
        snprintf(key, sizeof key, "tensorboard.%s", m->key);
        if (!strcmp(m->key, "enabled")) r = get_bool(c, key, &m->value, &on), have_on = r == 0;
        else if (!strcmp(m->key, "output_path")) r = get_string(c, key, &m->value, &path);
        else if (!strcmp(m->key, "job_name")) r = get_string(c, key, &m->value, &job);
        else r = 0, note(c, key, "not a tensorboard key Strata knows; ignored");
        if (r < 0) return -1;
    }
    put(c, "run", "tensorboard", have_on ? "tensorboard.enabled" : "tensorboard.enabled absent: DeepSpeed's default is off",
        "%s", on ? "true" : "false");
    if (!on) return 0;
    if (!path && !job) {
        note(c, "tensorboard.output_path", "absent: DeepSpeed writes to ./DeepSpeedJobName; Strata writes beside "
             "metrics.jsonl in run.dir (set run.tensorboard_dir for another directory)");
        return 0;
    }
    char dir[STRATA_PATH_MAX + 8];
    const char *name = job ? job : "DeepSpeedJobName";
    size_t n = path ? strlen(path) : 0;
    if (!n) snprintf(dir, sizeof dir, "%s", name);
    else snprintf(dir, sizeof dir, "%s%s%s", path, path[n - 1] == '/' ? "" : "/", name);
    put(c, "run", "tensorboard_dir", job ? "tensorboard.output_path/job_name, where DeepSpeed writes"
                                         : "tensorboard.output_path/DeepSpeedJobName (the default job_name), where DeepSpeed writes",
        "%s", dir);
    return 0;
}

/* params.betas: [beta1, beta2] */
static int optimizer_section(conv *c, const strata_json *o) {
    if (get_object(c, "optimizer", o)) return -1;
    const strata_json *type = strata_json_get(o, "type"), *params = strata_json_get(o, "params");
    const char *t = NULL;
    int r = get_string(c, "optimizer.type", type, &t);
    if (r < 0) return -1;
    if (r > 0) return 0;
    char lower[64];
    size_t k = 0;
    for (; t[k] && k + 1 < sizeof lower; k++) lower[k] = (char)(t[k] >= 'A' && t[k] <= 'Z' ? t[k] + 32 : t[k]);
    lower[k] = 0;
    int adam = !strcmp(lower, "adam"), adamw = !strcmp(lower, "adamw");
    if (!adam && !adamw) {
        note(c, "optimizer.type", "'%s': Strata trains with AdamW only (optim.*)", t);
        return 0;
    }
    if (params && get_object(c, "optimizer.params", params)) return -1;
    /* DeepSpeed's Adam and AdamW (FusedAdam, DeepSpeedCPUAdam) defaults, written out since
     * Strata's own defaults differ (beta2 0.95, weight decay 0.1) */
    double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.0;
    int have[5] = {0}, is_auto_[5] = {0}; /* lr, beta1, beta2, eps, weight_decay */
    int adam_w_mode = 1;
    for (size_t i = 0; params && i < params->len; i++) {
        const strata_json_member *m = &params->members[i];
        char key[160];
        snprintf(key, sizeof key, "optimizer.params.%s", m->key);
        if (!strcmp(m->key, "lr")) {
            if ((r = get_number(c, key, &m->value, &lr)) < 0) return -1;
            have[0] = !r, is_auto_[0] = r;
        } else if (!strcmp(m->key, "betas")) {
            if (is_auto(&m->value)) {
                note_auto(c, key);
                is_auto_[1] = is_auto_[2] = 1;
                continue;
            }
            if (m->value.type != STRATA_JSON_ARRAY || m->value.len != 2 || m->value.items[0].type != STRATA_JSON_NUMBER ||
                m->value.items[1].type != STRATA_JSON_NUMBER)
                return strata_fail("%s: key '%s': expected [beta1, beta2], two numbers", c->path, key);
            b1 = m->value.items[0].number;
            b2 = m->value.items[1].number;
            have[1] = have[2] = 1;
        } else if (!strcmp(m->key, "eps")) {
            if ((r = get_number(c, key, &m->value, &eps)) < 0) return -1;
            have[3] = !r, is_auto_[3] = r;
        } else if (!strcmp(m->key, "weight_decay")) {
            if ((r = get_number(c, key, &m->value, &wd)) < 0) return -1;
            have[4] = !r, is_auto_[4] = r;
        } else if (!strcmp(m->key, "adam_w_mode")) {
            if ((r = get_bool(c, key, &m->value, &adam_w_mode)) < 0) return -1;
        } else if (!strcmp(m->key, "torch_adam") || !strcmp(m->key, "fused")) {
            /* which implementation runs: the same math */
        } else if (!strcmp(m->key, "amsgrad")) {
            if (enabled(&m->value)) note(c, key, "Strata's AdamW has no AMSGrad variant");
        } else if (!strcmp(m->key, "bias_correction")) {
            if (m->value.type == STRATA_JSON_BOOL && !m->value.boolean) note(c, key, "Strata's AdamW always corrects the bias of its moments");
        } else {
            note(c, key, "not an Adam parameter Strata knows; ignored");
        }
    }
    if (adam && !adam_w_mode && wd != 0.0)
        note(c, "optimizer.params.adam_w_mode", "false makes weight decay an L2 term in the gradient (Adam), which "
             "Strata's AdamW does not compute; the decay below is decoupled");
    char v[64];
    const char *src = adam ? "optimizer (Adam, adam_w_mode)" : "optimizer (AdamW)";
    char from[200];
#define FROM(i, k) (snprintf(from, sizeof from, have[i] ? "optimizer.params.%s" : "DeepSpeed's default for %s", k), from)
    /* an "auto" value is the Trainer's to fill: named above, not written */
    fmt_num(v, sizeof v, lr);
    if (!is_auto_[0]) put(c, "optim", "lr", FROM(0, "lr"), "%s", v);
    fmt_num(v, sizeof v, b1);
    if (!is_auto_[1]) put(c, "optim", "beta1", have[1] ? "optimizer.params.betas[0]" : "DeepSpeed's default for betas[0]", "%s", v);
    fmt_num(v, sizeof v, b2);
    if (!is_auto_[2]) put(c, "optim", "beta2", have[2] ? "optimizer.params.betas[1]" : "DeepSpeed's default for betas[1]", "%s", v);
    fmt_num(v, sizeof v, eps);
    if (!is_auto_[3]) put(c, "optim", "eps", FROM(3, "eps"), "%s", v);
    fmt_num(v, sizeof v, wd);
    if (!is_auto_[4]) put(c, "optim", "weight_decay", FROM(4, "weight_decay"), "%s", v);
#undef FROM
    (void)src;
    if (wd != 0.0 || is_auto_[4])
        note(c, "optimizer.params.weight_decay", "Strata decays 2-D weights only (as Hugging Face's Trainer groups "
             "them); DeepSpeed decays whatever parameter groups the script hands it");
    return 0;
}

static int scheduler_section(conv *c, const strata_json *s) {
    if (get_object(c, "scheduler", s)) return -1;
    const strata_json *type = strata_json_get(s, "type"), *params = strata_json_get(s, "params");
    const char *t = NULL;
    int r = get_string(c, "scheduler.type", type, &t);
    if (r < 0) return -1;
    if (r > 0) return 0;
    int warmup_lr = !strcmp(t, "WarmupLR"), decay = !strcmp(t, "WarmupDecayLR"), cosine = !strcmp(t, "WarmupCosineLR");
    if (!warmup_lr && !decay && !cosine) {
        note(c, "scheduler.type", "'%s': Strata's schedules are warmup then cosine, linear or constant", t);
        return 0;
    }
    if (params && get_object(c, "scheduler.params", params)) return -1;
    /* DeepSpeed's defaults */
    double min_lr = 0, max_lr = 1e-3, warm_min_ratio = 0, cos_min_ratio = 1e-4;
    long long warm = 1000, total = 0;
    const char *warm_type = "log";
    int have_max = 0, have_total = 0, auto_max = 0, auto_warm = 0, auto_total = 0, auto_ratio = 0;
    for (size_t i = 0; params && i < params->len; i++) {
        const strata_json_member *m = &params->members[i];
        char key[160];
        snprintf(key, sizeof key, "scheduler.params.%s", m->key);
        if (!strcmp(m->key, "warmup_min_lr")) r = get_number(c, key, &m->value, &min_lr);
        else if (!strcmp(m->key, "warmup_max_lr")) r = get_number(c, key, &m->value, &max_lr), have_max = !r, auto_max = r > 0;
        else if (!strcmp(m->key, "warmup_num_steps")) r = get_int(c, key, &m->value, 0, 2147483647, &warm), auto_warm = r > 0;
        else if (!strcmp(m->key, "total_num_steps"))
            r = get_int(c, key, &m->value, 1, 1000000000000ll, &total), have_total = !r, auto_total = r > 0;
        else if (!strcmp(m->key, "warmup_type")) r = get_string(c, key, &m->value, &warm_type);
        else if (!strcmp(m->key, "warmup_min_ratio")) r = get_number(c, key, &m->value, &warm_min_ratio);
        else if (!strcmp(m->key, "cos_min_ratio")) r = get_number(c, key, &m->value, &cos_min_ratio), auto_ratio = r > 0;
        else if (!strcmp(m->key, "last_batch_iteration")) r = 0;
        else note(c, key, "not a %s parameter Strata knows; ignored", t), r = 0;
        if (r < 0) return -1;
    }
    char v[64];
    if (!auto_warm) put(c, "optim", "warmup_steps", "scheduler.params.warmup_num_steps", "%lld", warm);
    if (strcmp(warm_type, "linear"))
        note(c, "scheduler.params.warmup_type", "'%s' (DeepSpeed's default is log): Strata's warmup is linear, "
             "lr * (step + 1) / warmup_steps", warm_type);
    if (cosine) {
        if (warm_min_ratio != 0) note(c, "scheduler.params.warmup_min_ratio", "Strata's warmup starts from 0");
        put(c, "optim", "schedule", "scheduler.type WarmupCosineLR", "cosine");
        const out_key *lr = find_out(c, "optim", "lr");
        double base = lr ? strtod(lr->value, NULL) : 1e-3;
        fmt_num(v, sizeof v, base * cos_min_ratio);
        if (lr && !auto_ratio) put(c, "optim", "min_lr", "optimizer lr x scheduler.params.cos_min_ratio", "%s", v);
        else note(c, "scheduler.params.cos_min_ratio", "min_lr is lr x cos_min_ratio, and the lr is not known here");
    } else {
        if (min_lr != 0) note(c, "scheduler.params.warmup_min_lr", "Strata's warmup starts from 0");
        fmt_num(v, sizeof v, max_lr);
        if (!auto_max)
            put(c, "optim", "lr", have_max ? "scheduler.params.warmup_max_lr" : "DeepSpeed's default warmup_max_lr", "%s", v);
        put(c, "optim", "schedule", decay ? "scheduler.type WarmupDecayLR" : "scheduler.type WarmupLR (constant after warmup)",
            decay ? "linear" : "constant");
        put(c, "optim", "min_lr", decay ? "WarmupDecayLR decays to 0" : "unused by a constant schedule", "0");
    }
    if ((decay || cosine) && !auto_total) {
        if (!have_total) return strata_fail("%s: key 'scheduler.params.total_num_steps': %s needs it", c->path, t);
        put(c, "train", "steps", "scheduler.params.total_num_steps", "%lld", total);
    }
    return 0;
}

static int walk(conv *c, const strata_json *root) {
    if (root->type != STRATA_JSON_OBJECT)
        return strata_fail("%s: expected a DeepSpeed config (a JSON object), got %s", c->path, strata_json_kind(root));
    for (size_t i = 0; i < root->len; i++) {
        const strata_json_member *m = &root->members[i];
        const char *k = m->key;
        const strata_json *v = &m->value;
        int r = 0;
        if (!strcmp(k, "train_micro_batch_size_per_gpu")) c->micro = v;
        else if (!strcmp(k, "gradient_accumulation_steps")) c->accum = v;
        else if (!strcmp(k, "train_batch_size")) c->tbs = v;
        else if (!strcmp(k, "zero_optimization")) r = zero_section(c, v);
        else if (!strcmp(k, "optimizer")) c->optimizer = v;
        else if (!strcmp(k, "scheduler")) c->scheduler = v;
        else if (!strcmp(k, "gradient_clipping")) c->clip = v;
        else if (!strcmp(k, "aio")) r = aio_section(c, v);
        else if (!strcmp(k, "tensorboard")) r = tensorboard_section(c, v);
        else if (!strcmp(k, "bf16") || !strcmp(k, "bfloat16")) {
            if (get_object(c, k, v)) return -1;
            const strata_json *e = strata_json_get(v, "enabled");
            int b = 0;
            if (e && (r = get_bool(c, "bf16.enabled", e, &b)) < 0) return -1;
            if (r > 0) c->dtype_auto = 1;
            c->bf16 = b;
            for (size_t j = 0; j < v->len; j++)
                if (strcmp(v->members[j].key, "enabled")) {
                    char key[160];
                    snprintf(key, sizeof key, "%s.%s", k, v->members[j].key);
                    note(c, key, "Strata's bf16 keeps fp32 master weights and reduces gradients as train.grad_reduce_dtype says");
                }
            r = 0;
        } else if (!strcmp(k, "fp16")) {
            c->fp16 = enabled(v) && !is_auto(strata_json_get(v, "enabled"));
            if (is_auto(strata_json_get(v, "enabled"))) note_auto(c, "fp16.enabled"), c->dtype_auto = 1;
            else apply_rule(c, top_rules, "", k, v);
        } else if (!strcmp(k, "steps_per_print")) {
            long long n;
            if ((r = get_int(c, k, v, 1, 2147483647, &n)) < 0) return -1;
            if (!r) put(c, "train", "log_every", k, "%lld", n);
            r = 0;
        } else if (!strcmp(k, "communication_data_type")) {
            const char *d = NULL;
            if ((r = get_string(c, k, v, &d)) < 0) return -1;
            if (!r) {
                if (!strcmp(d, "fp32") || !strcmp(d, "bf16")) put(c, "train", "grad_reduce_dtype", k, "%s", d);
                else note(c, k, "'%s': Strata reduces gradients in fp32 or bf16", d);
            }
            r = 0;
        } else if (!strcmp(k, "data_types")) {
            if (get_object(c, k, v)) return -1;
            const strata_json *g = strata_json_get(v, "grad_accum_dtype");
            if (g && !(g->type == STRATA_JSON_STRING && !strcmp(g->str, "fp32")) && g->type != STRATA_JSON_NULL)
                note(c, "data_types.grad_accum_dtype", "Strata accumulates gradients in fp32");
        } else if (!apply_rule(c, top_rules, "", k, v)) {
            note(c, k, "not a DeepSpeed key Strata knows; ignored");
        }
        if (r < 0) return -1;
    }
    return 0;
}

/* Micro-batch and accumulation, from whichever of the three batch keys are given. */
static int resolve_batch(conv *c) {
    long long micro = 0, accum = 0, tbs = 0;
    int r;
    if (c->micro && (r = get_int(c, "train_micro_batch_size_per_gpu", c->micro, 1, 65536, &micro)) < 0) return -1;
    if (c->accum && (r = get_int(c, "gradient_accumulation_steps", c->accum, 1, 65536, &accum)) < 0) return -1;
    if (c->tbs && (r = get_int(c, "train_batch_size", c->tbs, 1, 1ll << 40, &tbs)) < 0) return -1;
    long long w = c->world;
    char from[200];
    if (tbs && micro && accum) {
        if (tbs != micro * accum * w)
            return strata_fail("%s: train_batch_size %lld is not train_micro_batch_size_per_gpu %lld x "
                               "gradient_accumulation_steps %lld x world %lld (--world N sets the world)", c->path, tbs,
                               micro, accum, w);
    } else if (tbs && micro) {
        if (tbs % (micro * w))
            return strata_fail("%s: train_batch_size %lld is not a multiple of train_micro_batch_size_per_gpu %lld x "
                               "world %lld (--world N sets the world)", c->path, tbs, micro, w);
        accum = tbs / (micro * w);
        snprintf(from, sizeof from, "train_batch_size / (micro-batch x world %lld)", w);
        put(c, "train", "grad_accum", from, "%lld", accum);
        accum = 0;
    } else if (tbs && accum) {
        if (tbs % (accum * w))
            return strata_fail("%s: train_batch_size %lld is not a multiple of gradient_accumulation_steps %lld x "
                               "world %lld (--world N sets the world)", c->path, tbs, accum, w);
        snprintf(from, sizeof from, "train_batch_size / (accumulation x world %lld)", w);
        put(c, "train", "micro_batch", from, "%lld", tbs / (accum * w));
    } else if (tbs) {
        if (tbs % w)
            return strata_fail("%s: train_batch_size %lld is not a multiple of the world %lld (--world N)", c->path, tbs, w);
        snprintf(from, sizeof from, "train_batch_size / world %lld (DeepSpeed accumulates 1 step)", w);
        put(c, "train", "micro_batch", from, "%lld", tbs / w);
        put(c, "train", "grad_accum", "DeepSpeed's default", "1");
    }
    if (micro) put(c, "train", "micro_batch", "train_micro_batch_size_per_gpu", "%lld", micro);
    if (accum) put(c, "train", "grad_accum", "gradient_accumulation_steps", "%lld", accum);
    return 0;
}

static int finish(conv *c) {
    if (resolve_batch(c)) return -1;
    if (c->bf16 && c->fp16) return strata_fail("%s: bf16 and fp16 are both enabled", c->path);
    if (!c->dtype_auto || c->bf16 || c->fp16)
        put(c, "train", "dtype", c->bf16 ? "bf16.enabled" : c->fp16 ? "fp16.enabled: Strata's nearest is bf16" :
            "neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32", "%s", c->bf16 || c->fp16 ? "bf16" : "fp32");
    if (c->optimizer && optimizer_section(c, c->optimizer)) return -1;
    if (!c->optimizer)
        note(c, "optimizer", "absent: the training script brought its own optimizer; Strata's AdamW and its optim.* "
             "defaults apply");
    if (c->scheduler) {
        if (scheduler_section(c, c->scheduler)) return -1;
    } else if (c->optimizer) {
        put(c, "optim", "schedule", "no scheduler: DeepSpeed keeps the optimizer's lr", "constant");
        put(c, "optim", "warmup_steps", "no scheduler", "0");
        put(c, "optim", "min_lr", "unused by a constant schedule", "0");
    }
    double clip = 0;
    int r = 0;
    if (c->clip && (r = get_number(c, "gradient_clipping", c->clip, &clip)) < 0) return -1;
    if (!r) {
        char v[64];
        fmt_num(v, sizeof v, clip);
        put(c, "optim", "grad_clip", c->clip ? "gradient_clipping" : "DeepSpeed's default: no clipping", "%s", v);
    }
    /* one nvme_path for both: Strata keeps a rank's offloaded state in one file */
    if (c->opt_nvme[0] || c->param_nvme[0]) {
        const char *p = c->opt_nvme[0] ? c->opt_nvme : c->param_nvme;
        if (c->opt_nvme[0] && c->param_nvme[0] && strcmp(c->opt_nvme, c->param_nvme))
            note(c, "zero_optimization.offload_param.nvme_path", "Strata keeps a rank's offloaded optimizer state and "
                 "parameters in one file under offload.nvme_path; kept the optimizer's (%s)", c->opt_nvme);
        put(c, "offload", "nvme_path", c->opt_nvme[0] ? "zero_optimization.offload_optimizer.nvme_path"
                                                      : "zero_optimization.offload_param.nvme_path", "%s", p);
    }
    const out_key *params = find_out(c, "offload", "params");
    if (params && strcmp(params->value, "none") && c->stage != 3) {
        note(c, "zero_optimization.offload_param", "applies at ZeRO stage 3 only (stages 0-2 keep full parameters on "
             "every rank), as in DeepSpeed");
        put(c, "offload", "params", "offload_param needs stage 3", "none");
    }
    /* a unit whose optimizer state stays on the GPU updates its parameters there */
    params = find_out(c, "offload", "params");
    const out_key *ratio = find_out(c, "offload", "optimizer_ratio");
    if (ratio && params && strcmp(params->value, "none")) {
        note(c, "zero_optimization.offload_optimizer.ratio", "Strata keeps part of the optimizer state on the GPU only "
             "with the parameters there, and offload_param moves them off: all of it is offloaded");
        put(c, "offload", "optimizer_ratio", "offload_param is set", "1");
    }
    return 0;
}

static void print_yaml(const conv *c, FILE *f, const char *base) {
    fprintf(f, "# Strata config equivalent to the DeepSpeed config %s\n", c->path);
    fprintf(f, "# (strata config --from-deepspeed). It has no model or data: %s.\n",
            base ? "they come from the base config" : "add them, or rerun with --base CONFIG");
    if (base) fprintf(f, "base: %s\n", base);
    static const char *const order[] = {"train", "optim", "zero", "offload", "run"};
    for (int s = 0; s < 5; s++) {
        int any = 0;
        for (int i = 0; i < c->n_keys; i++) {
            const out_key *k = &c->keys[i];
            if (strcmp(k->section, order[s])) continue;
            if (!any) fprintf(f, "\n%s:\n", order[s]);
            any = 1;
            char line[STRATA_PATH_MAX + 64];
            int quote = !strcmp(k->key, "nvme_path") || !strcmp(k->key, "tensorboard_dir");
            int w = snprintf(line, sizeof line, "  %s: %s%s%s", k->key, quote ? "\"" : "", k->value, quote ? "\"" : "");
            fprintf(f, "%s%*s# %s\n", line, w < 34 ? 34 - w : 2, "", k->from);
        }
    }
    if (c->n_notes) {
        fprintf(f, "\n# Not carried over from %s:\n", c->path);
        for (int i = 0; i < c->n_notes; i++) fprintf(f, "#   %s\n", c->notes[i]);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: strata config --from-deepspeed ds_config.json [--world N] [--base CONFIG]\n");
    return STRATA_EXIT_USAGE;
}

int strata_cmd_config_deepspeed(int argc, char **argv) {
    const char *path = NULL, *base = NULL;
    int world = 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--from-deepspeed") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--base") && i + 1 < argc) base = argv[++i];
        else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            char *end = NULL;
            long w = strtol(argv[++i], &end, 10);
            if (*end || w < 1 || w > 1 << 20) {
                fprintf(stderr, "strata config: --world expects a positive integer, got '%s'\n", argv[i]);
                return STRATA_EXIT_USAGE;
            }
            world = (int)w;
        } else {
            fprintf(stderr, "strata config: unexpected argument '%s'\n", argv[i]);
            return usage();
        }
    }
    if (!path) return usage();
    strata_json_doc doc;
    if (strata_json_parse_file(&doc, path, (size_t)1 << 20)) { /* a DeepSpeed config is a page of JSON */
        fprintf(stderr, "strata config: %s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    conv *c = strata_xcalloc(1, sizeof *c);
    c->path = path;
    c->world = world;
    c->stage = 0;
    int rc = walk(c, &doc.root) || finish(c) ? -1 : 0;
    strata_json_free(&doc);
    if (rc) {
        fprintf(stderr, "strata config: %s\n", strata_error());
        free(c);
        return STRATA_EXIT_USAGE;
    }
    /* the result must be a config Strata accepts: the keys as overrides on the base */
    const char *sets[MAX_KEYS];
    char (*buf)[STRATA_PATH_MAX + 64] = strata_xcalloc(MAX_KEYS, sizeof *buf);
    for (int i = 0; i < c->n_keys; i++) {
        snprintf(buf[i], sizeof buf[i], "%s.%s=%s", c->keys[i].section, c->keys[i].key, c->keys[i].value);
        sets[i] = buf[i];
    }
    strata_config check;
    if (strata_config_load(&check, base, sets, c->n_keys)) {
        fprintf(stderr, "strata config: the Strata config equivalent to %s would be refused: %s\n", path, strata_error());
        free(buf);
        free(c);
        return STRATA_EXIT_USAGE;
    }
    free(buf);
    print_yaml(c, stdout, base);
    for (int i = 0; i < c->n_notes; i++) fprintf(stderr, "strata config: not carried over: %s\n", c->notes[i]);
    free(c);
    return STRATA_EXIT_OK;
}
