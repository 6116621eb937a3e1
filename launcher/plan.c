/* launcher/plan.c: per-tier memory plan, capacity check, and the remedy ladder climbed
 * automatically: the cheapest combination of changes that fits. */
#include "launcher/plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/common.h"
#include "core/model.h"
#include "launcher/build.h"
#include "shard/acts_home.h"
#include "shard/engine.h"

static const char *tier_names[STRATA_TIERS] = {"device", "pinned host", "host", "nvme"};

void strata_plan_from_arena(strata_plan *p, const strata_arena *a, int world, int stage) {
    memset(p, 0, sizeof *p);
    p->world = world;
    p->stage = stage;
    static const int kind_of_tier[3] = {STRATA_MEM_DEVICE, STRATA_MEM_PINNED, STRATA_MEM_HOST};
    for (int t = 0; t < 3; t++)
        for (int c = 0; c < STRATA_CAT_COUNT; c++) {
            p->bytes[t][c] = strata_arena_bytes(a, kind_of_tier[t], c);
            p->need[t] += p->bytes[t][c];
        }
    /* what the device's activations are made of, by the model's names (core/model.c) */
    p->acts_resid = strata_arena_bytes_named(a, STRATA_MEM_DEVICE, STRATA_CAT_ACTIVATIONS, "resid.");
    p->acts_logits = strata_arena_bytes_named(a, STRATA_MEM_DEVICE, STRATA_CAT_ACTIVATIONS, "logits");
}

void strata_plan_set_model(strata_plan *p, const strata_config *cfg, const strata_model *m) {
    p->optim_state = cfg->optim.state;
    p->n_params = strata_model_num_params(m);
    p->grads_home = cfg->offload.gradients != STRATA_OFFLOAD_NONE; /* the config's checks: one rank, optimizer offloaded */
    p->head_rows = m->head_rows;
    p->mlp_rows = m->mlp_rows;
    p->resid_slots = m->resid_slots;
    p->rows = m->B * m->T;
    p->resid_streams = m->shape.n_layer + 1;
}

void strata_plan_add_nvme(strata_plan *p, size_t bytes, size_t param_bytes) {
    p->bytes[STRATA_TIER_NVME][STRATA_CAT_OPTIMIZER] = bytes - param_bytes;
    p->bytes[STRATA_TIER_NVME][STRATA_CAT_PARAMS] = param_bytes;
    p->need[STRATA_TIER_NVME] = bytes;
}

void strata_plan_add_pinned_buffers(strata_plan *p, size_t bytes) {
    p->bytes[STRATA_TIER_PINNED][STRATA_CAT_COMM] += bytes;
    p->need[STRATA_TIER_PINNED] += bytes;
}

void strata_plan_compute(strata_plan *p, const strata_config *cfg, int world) {
    strata_model m;
    strata_arena a;
    strata_engine *e = strata_build(cfg, NULL, NULL, 0, world, &m, &a);
    strata_plan_from_arena(p, &a, world, cfg->zero.stage);
    strata_plan_set_model(p, cfg, &m);
    strata_plan_add_nvme(p, strata_engine_nvme_bytes(e), strata_engine_nvme_param_bytes(e));
    int gpu = cfg->device == STRATA_BACKEND_CUDA || (cfg->device == STRATA_BACKEND_AUTO && strata_cuda_available());
    strata_plan_add_pinned_buffers(p, strata_comm_planned_pinned_bytes(cfg, world, gpu));
    strata_unbuild(e, &a, &m);
}

static size_t host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    size_t kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return kb * 1024;
    return (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

void strata_plan_check(strata_plan *p, const strata_config *cfg, strata_device *dev) {
    const double GB = 1024.0 * 1024.0 * 1024.0;
    int cuda = dev ? dev->caps.gpu : 0;
    p->cpu_backend = !cuda;
    size_t host = cfg->memory.host_gb > 0 ? (size_t)(cfg->memory.host_gb * GB) : host_available();
    /* a CUDA device's memory: free and total now, and what Strata itself holds of it */
    int measured = 0;
    int probe = !dev && cfg->device != STRATA_BACKEND_CPU && strata_cuda_available(); /* a GPU to ask */
    size_t free_b = 0, total = 0, live = 0;
    if (cuda) {
        measured = dev->ops->mem_info(dev, &free_b, &total) == 0;
        live = dev->mem[STRATA_MEM_DEVICE].live_bytes;
    } else if (probe) {
        strata_device *d = strata_device_open("cuda", 0); /* only to ask */
        if (d) {
            measured = d->ops->mem_info(d, &free_b, &total) == 0;
            strata_device_close(d);
        }
        p->cpu_backend = 0;
    }
    p->runtime_bytes = p->runtime_held = 0;
    p->runtime_estimated = 0;
    if (measured) {
        size_t others = total - free_b; /* everything in use on the GPU, Strata's allocations included */
        p->runtime_held = others > live ? others - live : 0;
        p->runtime_bytes = p->runtime_held + STRATA_PLAN_MODULE_ALLOWANCE_BYTES;
    } else if (!dev && (cfg->device == STRATA_BACKEND_CUDA || (cfg->device == STRATA_BACKEND_AUTO && cfg->memory.gpu_gb > 0))) {
        /* a GPU run planned on a machine without one */
        p->runtime_held = STRATA_PLAN_CONTEXT_ESTIMATE_BYTES + STRATA_PLAN_WORKSPACE_BYTES;
        p->runtime_bytes = p->runtime_held + STRATA_PLAN_MODULE_ALLOWANCE_BYTES;
        p->runtime_estimated = 1;
    }
    if (cfg->memory.gpu_gb > 0) {
        p->capacity[STRATA_TIER_DEVICE] = (size_t)(cfg->memory.gpu_gb * GB);
        p->cpu_backend = 0; /* an explicit device budget is checked on its own */
    } else if (measured) {
        p->capacity[STRATA_TIER_DEVICE] = total; /* the runtime row counts what is already in use */
    } else if (cuda || probe) {
        p->capacity[STRATA_TIER_DEVICE] = 0; /* the GPU did not answer: unknown */
        p->cpu_backend = 0;
    } else if (!dev && cfg->device == STRATA_BACKEND_CUDA) {
        p->capacity[STRATA_TIER_DEVICE] = 0; /* no GPU here: unknown unless memory.gpu_gb says */
        p->cpu_backend = 0;
    } else {
        p->capacity[STRATA_TIER_DEVICE] = host;
    }
    p->capacity[STRATA_TIER_PINNED] = cfg->offload.pinned_budget_gb > 0 ? (size_t)(cfg->offload.pinned_budget_gb * GB) : host;
    p->capacity[STRATA_TIER_HOST] = host;
    if (cfg->offload.nvme_path[0]) {
        struct statvfs vfs;
        if (cfg->memory.nvme_gb > 0) p->capacity[STRATA_TIER_NVME] = (size_t)(cfg->memory.nvme_gb * GB);
        else if (statvfs(cfg->offload.nvme_path, &vfs) == 0) p->capacity[STRATA_TIER_NVME] = (size_t)vfs.f_bavail * vfs.f_frsize;
        else if (p->need[STRATA_TIER_NVME])
            snprintf(p->nvme_error, sizeof p->nvme_error, "offload.nvme_path '%.1024s': %s", cfg->offload.nvme_path,
                     strerror(errno));
    }
    char b1[32], b2[32];
    p->why[0] = 0;
    /* host memory holds pinned + host, and on the CPU backend the "device" tier too */
    size_t host_need = p->need[STRATA_TIER_PINNED] + p->need[STRATA_TIER_HOST] +
                       (p->cpu_backend ? p->need[STRATA_TIER_DEVICE] : 0);
    size_t device_need = strata_plan_device_total(p);
    int pinned_over = cfg->offload.pinned_budget_gb > 0 && p->need[STRATA_TIER_PINNED] > p->capacity[STRATA_TIER_PINNED];
    /* each tier on its own (the remedy ladder moves state between them), then the first over */
    p->device_over = !p->cpu_backend && p->capacity[STRATA_TIER_DEVICE] && device_need > p->capacity[STRATA_TIER_DEVICE];
    p->host_over = pinned_over || host_need > host;
    p->nvme_over = p->nvme_error[0] || (p->need[STRATA_TIER_NVME] && p->need[STRATA_TIER_NVME] > p->capacity[STRATA_TIER_NVME]);
    p->fits = !p->device_over && !p->host_over && !p->nvme_over;
    if (p->device_over) {
        char b3[32], b4[32];
        if (p->runtime_bytes)
            snprintf(p->why, sizeof p->why, "device memory: needs %s (arena %s + CUDA runtime %s%s), %s available",
                     strata_fmt_bytes(b1, 32, (double)device_need),
                     strata_fmt_bytes(b3, 32, (double)p->need[STRATA_TIER_DEVICE]),
                     strata_fmt_bytes(b4, 32, (double)p->runtime_bytes), p->runtime_estimated ? ", estimated" : "",
                     strata_fmt_bytes(b2, 32, (double)p->capacity[STRATA_TIER_DEVICE]));
        else
            snprintf(p->why, sizeof p->why, "device memory: needs %s, %s available", strata_fmt_bytes(b1, 32, (double)device_need),
                     strata_fmt_bytes(b2, 32, (double)p->capacity[STRATA_TIER_DEVICE]));
    } else if (pinned_over) {
        snprintf(p->why, sizeof p->why, "pinned host memory: needs %s, offload.pinned_budget_gb allows %s",
                 strata_fmt_bytes(b1, 32, (double)p->need[STRATA_TIER_PINNED]),
                 strata_fmt_bytes(b2, 32, (double)p->capacity[STRATA_TIER_PINNED]));
    } else if (p->host_over) {
        snprintf(p->why, sizeof p->why, "host memory: needs %s, %s available", strata_fmt_bytes(b1, 32, (double)host_need),
                 strata_fmt_bytes(b2, 32, (double)host));
    } else if (p->nvme_error[0]) {
        snprintf(p->why, sizeof p->why, "%s", p->nvme_error);
    } else if (p->nvme_over) {
        snprintf(p->why, sizeof p->why, "nvme (%.1024s): needs %s, %s free", cfg->offload.nvme_path,
                 strata_fmt_bytes(b1, 32, (double)p->need[STRATA_TIER_NVME]),
                 strata_fmt_bytes(b2, 32, (double)p->capacity[STRATA_TIER_NVME]));
    }
}

int strata_plan_check_paths(const strata_config *cfg) {
    const char *path = cfg->offload.nvme_path;
    int wanted = cfg->offload.optimizer == STRATA_OFFLOAD_NVME || cfg->offload.params == STRATA_OFFLOAD_NVME ||
                 cfg->memory.auto_fit;
    if (!path[0] || !wanted) return 0;
    const char *file = cfg->path[0] ? cfg->path : "<built-in>";
    struct stat st;
    if (stat(path, &st) != 0)
        return strata_fail("%s: key 'offload.nvme_path': '%s': %s (create the directory on the NVMe drive first)",
                           file, path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return strata_fail("%s: key 'offload.nvme_path': '%s' is not a directory (it names the directory that holds "
                           "the offload files)", file, path);
    return 0;
}

void strata_plan_print(const strata_plan *p, FILE *f) {
    char b[8][32];
    fprintf(f, "memory plan per rank (world %d, zero stage %d):\n", p->world, p->stage);
    fprintf(f, "  %-12s %11s %11s %11s %11s %11s %11s %11s %11s\n", "tier", "parameters", "gradients", "optimizer",
            "activations", "buffers", "total", "capacity", "headroom");
    for (int t = 0; t < STRATA_TIERS; t++) {
        if (!p->need[t] && t != STRATA_TIER_DEVICE) continue;
        size_t buffers = 0; /* communication buckets, prefetch, staging and workspace, broken down below */
        for (int c = STRATA_CAT_COMM; c < STRATA_CAT_COUNT; c++) buffers += p->bytes[t][c];
        for (int c = 0; c < STRATA_CAT_COMM; c++) strata_fmt_bytes(b[c], 32, (double)p->bytes[t][c]);
        strata_fmt_bytes(b[4], 32, (double)buffers);
        strata_fmt_bytes(b[5], 32, (double)p->need[t]);
        if (p->capacity[t]) {
            size_t used = t == STRATA_TIER_DEVICE ? strata_plan_device_total(p) : p->need[t];
            strata_fmt_bytes(b[6], 32, (double)p->capacity[t]);
            strata_fmt_bytes(b[7], 32, (double)p->capacity[t] - (double)used);
        } else {
            snprintf(b[6], 32, "-");
            snprintf(b[7], 32, "-");
        }
        fprintf(f, "  %-12s %11s %11s %11s %11s %11s %11s %11s %11s\n", tier_names[t], b[0], b[1], b[2], b[3], b[4],
                b[5], b[6], b[7]);
        size_t acts = p->bytes[t][STRATA_CAT_ACTIVATIONS];
        if (t == STRATA_TIER_DEVICE && acts && p->acts_resid + p->acts_logits <= acts) {
            /* where a long context's memory goes, and so which setting takes it off */
            char r[3][32];
            fprintf(f, "    activations: residual streams %s, logits %s, the rest %s (the blocks' kept and "
                       "recomputed, their gradients, the batch)\n",
                    strata_fmt_bytes(r[0], 32, (double)p->acts_resid), strata_fmt_bytes(r[1], 32, (double)p->acts_logits),
                    strata_fmt_bytes(r[2], 32, (double)(acts - p->acts_resid - p->acts_logits)));
        }
        if (buffers) {
            static const char *const kinds[] = {"comm buckets", "prefetch", "staging", "workspace", "checkpoint I/O"};
            _Static_assert(sizeof kinds / sizeof *kinds == STRATA_CAT_COUNT - STRATA_CAT_COMM, "a name per buffer kind");
            char line[256], v[32];
            int o = snprintf(line, sizeof line, "    buffers:"), first = 1;
            for (int c = STRATA_CAT_COMM; c < STRATA_CAT_COUNT; c++)
                if (p->bytes[t][c] && o < (int)sizeof line) {
                    o += snprintf(line + o, sizeof line - o, "%s %s %s", first ? "" : ",", kinds[c - STRATA_CAT_COMM],
                                  strata_fmt_bytes(v, 32, (double)p->bytes[t][c]));
                    first = 0;
                }
            fprintf(f, "%s\n", line);
        }
        if (t == STRATA_TIER_DEVICE && p->runtime_bytes) {
            /* the runtime row: outside the arena, inside the device's headroom */
            char r[4][32];
            strata_fmt_bytes(r[0], 32, (double)p->runtime_held);
            strata_fmt_bytes(r[1], 32, (double)(p->runtime_bytes - p->runtime_held));
            strata_fmt_bytes(r[2], 32, (double)p->runtime_bytes);
            strata_fmt_bytes(r[3], 32, (double)strata_plan_device_total(p));
            fprintf(f, "  %-12s %59s %11s\n", "+ runtime", "", r[2]);
            if (p->runtime_estimated)
                fprintf(f, "    (no GPU here, so estimated: CUDA context %s + cuBLASLt workspace %s, + %s for kernel "
                           "modules loaded at first launch)\n",
                        strata_fmt_bytes(r[0], 32, (double)STRATA_PLAN_CONTEXT_ESTIMATE_BYTES),
                        strata_fmt_bytes(r[3], 32, (double)STRATA_PLAN_WORKSPACE_BYTES), r[1]);
            else
                fprintf(f, "    (measured on the GPU before allocating: %s for the CUDA context, cuBLASLt workspace "
                           "and any other process; + %s allowed for kernel modules loaded at first launch)\n",
                        r[0], r[1]);
            fprintf(f, "  %-12s %59s %11s   (what nvidia-smi should show at the peak)\n", "= device", "",
                    strata_fmt_bytes(r[3], 32, (double)strata_plan_device_total(p)));
        }
    }
    if (p->cpu_backend) {
        /* what the process's resident memory peaks at, its code and libraries aside
         * (docs/benchmarks.md measures them: tens of MiB) */
        char all[32];
        strata_fmt_bytes(all, sizeof all,
                         (double)(p->need[STRATA_TIER_DEVICE] + p->need[STRATA_TIER_PINNED] + p->need[STRATA_TIER_HOST]));
        fprintf(f, "  %-12s %59s %11s   (resident at the peak, the program's code and libraries aside)\n", "= host",
                "", all);
        fprintf(f, "  (CPU backend: device memory is host memory, checked against one budget)\n");
    }
    if (p->grads_home)
        fprintf(f, "  gradients: in pinned memory for the units the CPU updates (offload.gradients: cpu); the "
                   "device's buffers hold those in backward\n");
    if (p->head_rows && p->head_rows < p->rows)
        fprintf(f, "  logits: %d of the micro-batch's %d rows at a time (train.logits_chunk_mb)\n", p->head_rows, p->rows);
    if (p->resid_slots && p->resid_slots < p->resid_streams)
        fprintf(f, "  residual streams: %d of the %d on the device, the rest in pinned memory (offload.activations)\n",
                p->resid_slots, p->resid_streams);
    if (p->mlp_rows && p->mlp_rows < p->rows)
        fprintf(f, "  MLP: %d of the micro-batch's %d rows at a time (train.mlp_chunk_mb)\n", p->mlp_rows, p->rows);
    if (p->n_params) {
        /* the optimizer state of every rank, all tiers, by parameter: 12 bytes with fp32
         * moments, 8 with bf16, about 6 with 8-bit ones (padding and 4 KiB blocks included) */
        size_t opt = 0;
        for (int t = 0; t < STRATA_TIERS; t++) opt += p->bytes[t][STRATA_CAT_OPTIMIZER];
        double all = (double)opt * (p->stage > 0 ? p->world : 1);
        fprintf(f, "  optimizer state: %.2f bytes a parameter (fp32 master weights, %s Adam moments: optim.state)\n",
                all / (double)p->n_params, strata_optim_state_name(p->optim_state));
    }
    if (!p->cpu_backend && !p->capacity[STRATA_TIER_DEVICE])
        fprintf(f, "  (no GPU here: give its memory with --gpu-gb to check the device tier)\n");
    fprintf(f, "  verdict: %s%s%s\n", p->fits ? "fits" : "DOES NOT FIT (", p->why, p->fits ? "" : ")");
}

size_t strata_plan_device_total(const strata_plan *p) { return p->need[STRATA_TIER_DEVICE] + p->runtime_bytes; }

/* ---- the remedy ladder ---- */

typedef struct option {
    int ckpt;       /* activation checkpointing every K (0 none) */
    int halvings;   /* micro-batch halved this many times, accumulation doubled as often */
    int stage;
    int offload;    /* offload.optimizer: 0 none, 1 cpu, 2 nvme */
    int params;     /* offload.params (stage 3): 0 none, 1 cpu, 2 nvme */
    int grads;      /* offload.gradients (one rank, optimizer offloaded): 0 none, 1 cpu */
    int chunk;      /* train.logits_chunk_mb: 1 sets LADDER_CHUNK_MB (the head a chunk of rows at a time) */
    int mlp;        /* train.mlp_chunk_mb: 1 sets LADDER_CHUNK_MB (the blocks' MLPs a chunk of rows at a time) */
    int acts;       /* offload.activations: 1 cpu (the residual streams in pinned memory) */
    int q8;         /* optim.state: int8 (8-bit Adam moments: changes the optimizer's numerics) */
    double cost;    /* estimated extra fraction of step time */
    int order;      /* position in the enumeration, which breaks ties in cost */
    int ratio_pct;  /* offload.optimizer_ratio in percent, found by option_fits; 0: the config's */
    int nvme_pct;   /* offload.nvme_ratio in percent, likewise */
} option;

/* Estimated costs, as fractions of a step's time:
 *  - recomputing a block adds its forward again: 1/3 of its forward+backward, for the
 *    fraction of blocks recomputed;
 *  - halving the micro-batch keeps the FLOPs but runs smaller matrix products: about 5%
 *    per halving while rows stay >= 4096 tokens, 15% below (less reuse per weight read);
 *  - raising the ZeRO stage adds communication only with world > 1: stage 1 and 2 move the
 *    same bytes as stage 0 (2 psi), stage 3 half again as many (3 psi), so +50% of the
 *    communication time, which with overlap we count as 10% of the step;
 *  - 8-bit optimizer state: the update dequantizes and quantizes every block, about 2% of
 *    a step with the state on the device (the update is a few percent of a step); with the
 *    state offloaded 10%: the CPU's 8-bit update takes about four times the fp32 one's time
 *    per element (docs/benchmarks.md), behind the next forward, while the tier moves half
 *    the bytes. What it costs most is the optimizer's numerics, which is why only `strata
 *    plan` names it unasked. */
/* The head (or the MLPs) in chunks of rows holding this many MiB of logits (of the MLP's
 * widest activation), when the ladder chooses it. */
#define LADDER_CHUNK_MB 256

/* Bytes of a micro-batch's rows of `width` activations. */
static double rows_bytes(const strata_config *c, double width) {
    double es = c->device == STRATA_BACKEND_CPU || c->train.dtype == STRATA_DTYPE_FP32 ? 4 : 2;
    return (double)c->train.micro_batch * strata_config_seq_len(c) * width * es;
}

/* Bytes of a micro-batch's logits, as the head holds them without chunks. */
static double logits_bytes(const strata_config *c) {
    return rows_bytes(c, strata_config_model_shape(c).padded_vocab_size);
}

/* Bytes of the L+1 residual streams of a micro-batch. */
static double resid_bytes(const strata_config *c) {
    strata_model_shape s = strata_config_model_shape(c);
    return (s.n_layer + 1.0) * rows_bytes(c, s.n_embd);
}

/* Bytes of the MLP's widest activation over a micro-batch (the Llama family's gate|up,
 * GPT-2's c_fc output), as a block holds it without chunks. */
static double mlp_bytes(const strata_config *c) {
    strata_model_shape s = strata_config_model_shape(c);
    return rows_bytes(c, s.arch == STRATA_ARCH_LLAMA ? 2.0 * s.intermediate_size : 4.0 * s.n_embd);
}

static double option_cost(const strata_config *c, const option *o) {
    double cost = 0;
    /* the same FLOPs in smaller products, and the classifier's weight gradient summed a
     * chunk at a time */
    if (o->chunk) cost += 0.02;
    /* the same again for the MLPs' products (a recomputed block's rebuilds nothing more) */
    if (o->mlp) cost += 0.01;
    /* the residual streams cross PCIe out and back in (2 x C elements a token a block), on
     * streams of their own behind a block's compute */
    if (o->acts) cost += 0.03;
    if (o->q8) cost += o->offload ? 0.10 : 0.02;
    int L = c->model.n_layer, ck = c->train.activation_checkpointing;
    /* blocks recomputed beyond those the config recomputes already */
    int recomputed = o->ckpt > 0 ? (L + o->ckpt - 1) / o->ckpt : 0, before = ck > 0 ? (L + ck - 1) / ck : 0;
    if (recomputed > before) cost += (double)(recomputed - before) / L / 3.0;
    long rows = (long)c->train.micro_batch * (c->train.seq_len ? c->train.seq_len : c->model.seq_len);
    for (int h = 0; h < o->halvings; h++) {
        rows /= 2;
        cost += rows >= 4096 ? 0.05 : 0.15;
    }
    if (o->stage > c->zero.stage) cost += o->stage == 3 ? 0.10 : 0.01 * (o->stage - c->zero.stage);
    /* the optimizer on the CPU: its update no longer overlaps nothing on the device, and the
     * gradients and parameters cross PCIe; from NVMe the state also crosses the disk */
    if (o->offload > (int)c->offload.optimizer) cost += o->offload == 1 ? 0.30 : 1.00;
    /* parameter shards off the device: every gather (forward and backward) crosses PCIe,
     * or is read from disk first */
    if (o->params > (int)c->offload.params) cost += o->params == 1 ? 0.40 : 2.00;
    /* gradients in host memory: they cross PCIe in the backward (overlapped) instead of
     * after it, the same bytes; with accumulation they cross out and back in at every
     * micro-step, 8 bytes a parameter, twice what stage 3's gathers from host memory move */
    if (o->grads > (int)c->offload.gradients) cost += c->train.grad_accum << o->halvings > 1 ? 0.60 : 0.05;
    return cost;
}

static int apply_option(const strata_config *base, const option *o, strata_config *out, char sets[][96], int max_sets) {
    *out = *base;
    int n = 0;
    if (o->q8 && n < max_sets) {
        out->optim.state = STRATA_OPTIM_STATE_INT8;
        snprintf(sets[n++], 96, "optim.state=int8");
    }
    if (o->ckpt != base->train.activation_checkpointing && n < max_sets) {
        if (o->ckpt == 1) snprintf(sets[n++], 96, "train.activation_checkpointing=blocks");
        else snprintf(sets[n++], 96, "train.activation_checkpointing=every:%d", o->ckpt);
        out->train.activation_checkpointing = o->ckpt;
    }
    if (o->halvings && n + 1 < max_sets) {
        out->train.micro_batch = base->train.micro_batch >> o->halvings;
        out->train.grad_accum = base->train.grad_accum << o->halvings;
        snprintf(sets[n++], 96, "train.micro_batch=%d", out->train.micro_batch);
        snprintf(sets[n++], 96, "train.grad_accum=%d", out->train.grad_accum);
    }
    if (o->stage != base->zero.stage && n < max_sets) {
        out->zero.stage = o->stage;
        snprintf(sets[n++], 96, "zero.stage=%d", o->stage);
    }
    if (o->offload != (int)base->offload.optimizer && n < max_sets) {
        out->offload.optimizer = (strata_offload_choice)o->offload;
        snprintf(sets[n++], 96, "offload.optimizer=%s", o->offload == 1 ? "cpu" : "nvme");
    }
    if (o->params != (int)base->offload.params && n < max_sets) {
        out->offload.params = (strata_offload_choice)o->params;
        snprintf(sets[n++], 96, "offload.params=%s", o->params == 1 ? "cpu" : "nvme");
    }
    if (o->grads != (int)base->offload.gradients && n < max_sets) {
        out->offload.gradients = (strata_offload_choice)o->grads;
        snprintf(sets[n++], 96, "offload.gradients=cpu");
    }
    if (o->chunk && n < max_sets) {
        out->train.logits_chunk_mb = LADDER_CHUNK_MB;
        snprintf(sets[n++], 96, "train.logits_chunk_mb=%d", LADDER_CHUNK_MB);
    }
    if (o->mlp && n < max_sets) {
        out->train.mlp_chunk_mb = LADDER_CHUNK_MB;
        snprintf(sets[n++], 96, "train.mlp_chunk_mb=%d", LADDER_CHUNK_MB);
    }
    if (o->acts && n < max_sets) {
        out->offload.activations = STRATA_OFFLOAD_CPU;
        snprintf(sets[n++], 96, "offload.activations=cpu");
    }
    /* a partial optimizer offload keeps parameters on the device (io/config.c) */
    double ratio = o->ratio_pct ? o->ratio_pct / 100.0 : o->params ? 1.0 : base->offload.optimizer_ratio;
    if (ratio != base->offload.optimizer_ratio && n < max_sets) {
        out->offload.optimizer_ratio = ratio;
        snprintf(sets[n++], 96, "offload.optimizer_ratio=%g", ratio);
    }
    /* a pinned/NVMe split needs the optimizer on NVMe (io/config.c) */
    double nvme_ratio = o->nvme_pct ? o->nvme_pct / 100.0 : o->offload != 2 ? 1.0 : base->offload.nvme_ratio;
    if (nvme_ratio != base->offload.nvme_ratio && n < max_sets) {
        out->offload.nvme_ratio = nvme_ratio;
        snprintf(sets[n++], 96, "offload.nvme_ratio=%g", nvme_ratio);
    }
    return n;
}

/* Every change within reach of cfg, in a fixed order (the order breaks ties in cost), with
 * its estimated cost; returns how many (at most max). 8-bit optimizer state is among them
 * only when memory.allow_int8_state says so. */
static int enumerate_options(const strata_config *cfg, int world, option *out, int max) {
    int max_q8 = cfg->memory.allow_int8_state && cfg->optim.state != STRATA_OPTIM_STATE_INT8;
    int ckpts[3] = {cfg->train.activation_checkpointing, 2, 1};
    int max_halvings = 0;
    while ((cfg->train.micro_batch >> (max_halvings + 1)) >= 1 && ((cfg->train.micro_batch >> max_halvings) % 2) == 0)
        max_halvings++;
    int max_offload = cfg->offload.nvme_path[0] ? 2 : 1;
    /* chunking the head (the MLPs) is a rung when the whole micro-batch's logits (the MLP's
     * widest activation) are larger than a chunk */
    double chunk_bytes = (double)LADDER_CHUNK_MB * (1 << 20);
    int max_chunk = !cfg->train.logits_chunk_mb && logits_bytes(cfg) > chunk_bytes;
    int max_mlp = !cfg->train.mlp_chunk_mb && mlp_bytes(cfg) > chunk_bytes;
    /* and the residual streams in host memory, when they take more than a chunk */
    int max_acts = cfg->offload.activations == STRATA_OFFLOAD_NONE && cfg->model.n_layer + 1 > STRATA_ACTS_HOME_SLOTS &&
                   resid_bytes(cfg) > chunk_bytes;
    int n = 0;
    for (int acts = 0; acts <= max_acts; acts++)
    for (int mlp = 0; mlp <= max_mlp; mlp++)
    for (int chunk = 0; chunk <= max_chunk; chunk++)
    for (int q8 = 0; q8 <= max_q8; q8++)
    for (int ci = 0; ci < 3; ci++) {
        if (ci > 0 && cfg->train.activation_checkpointing && ckpts[ci] >= cfg->train.activation_checkpointing) continue;
        for (int h = 0; h <= max_halvings; h++)
            for (int st = cfg->zero.stage; st <= 3; st++)
            for (int off = (int)cfg->offload.optimizer; off <= max_offload; off++)
            for (int par = (int)cfg->offload.params; par <= (st == 3 ? max_offload : 0); par++)
            for (int gr = (int)cfg->offload.gradients; gr <= (world == 1 && off > 0); gr++) {
                /* one rank has nothing to partition: stage 3 helps it only by moving the
                 * parameter shards off the device */
                if (st != cfg->zero.stage && world == 1 && !(st == 3 && par > 0)) continue;
                if (par == 2 && off == 0) continue; /* the CPU update writes parameters to disk */
                if (n == max) return n;
                option o = {.ckpt = ckpts[ci], .halvings = h, .stage = st, .offload = off, .params = par, .grads = gr,
                            .chunk = chunk, .mlp = mlp, .acts = acts, .q8 = q8};
                o.cost = option_cost(cfg, &o);
                out[n++] = o;
            }
    }
    return n;
}

/* 2 residual-stream choices x 2 MLP choices x 2 head choices x 2 state types x 3
 * checkpointing choices x fewer than 32 halvings x 4 stages x 3 x 3 x 2 offloads: all */
#define MAX_OPTIONS (2 * 2 * 2 * 2 * 3 * 32 * 4 * 3 * 3 * 2)

/* o planned (with its ratios, found by option_fits, if any): each tier's verdict in p, and
 * whether the device's capacity is known (a GPU's, measured or from memory.gpu_gb). */
static int plan_option(const strata_config *cfg, const option *o, int world, strata_device *dev, strata_plan *p) {
    strata_config c2;
    char tmp[STRATA_PLAN_MAX_SETS][96];
    apply_option(cfg, o, &c2, tmp, STRATA_PLAN_MAX_SETS);
    strata_plan_compute(p, &c2, world);
    strata_plan_check(p, &c2, dev);
    return !p->cpu_backend && p->capacity[STRATA_TIER_DEVICE] > 0;
}

/* The share (percent, 1..99) that moves state from tier A to tier B, `pct` of o: A's
 * verdict improves as it grows, B's worsens. A fits from some a_min up, B up to some
 * b_max (both by bisection); o takes the middle of [a_min, b_max], splitting the slack
 * between the two tiers, or 0 when the interval is empty. */
static int split_share(const strata_config *cfg, option *o, int *pct, int world, strata_device *dev,
                       int (*a_over)(const strata_plan *), int (*b_over)(const strata_plan *)) {
    strata_plan p;
    int lo = 1, hi = 100; /* smallest share A fits (it fits none moved: 100 is "as before") */
    while (lo < hi) {
        *pct = (lo + hi) / 2;
        plan_option(cfg, o, world, dev, &p);
        if (!a_over(&p)) hi = *pct;
        else lo = *pct + 1;
    }
    int a_min = lo;
    lo = 0, hi = 99; /* largest share B fits (0: none) */
    while (lo < hi) {
        *pct = (lo + hi + 1) / 2;
        plan_option(cfg, o, world, dev, &p);
        if (!b_over(&p)) lo = *pct;
        else hi = *pct - 1;
    }
    int b_max = lo;
    *pct = 0;
    if (b_max < 1 || a_min > b_max) return 0;
    *pct = (a_min + b_max) / 2;
    plan_option(cfg, o, world, dev, &p);
    if (p.fits) return 1;
    *pct = 0;
    return 0;
}

static int over_device(const strata_plan *p) { return p->device_over; }
static int over_host(const strata_plan *p) { return p->host_over; }
static int over_nvme(const strata_plan *p) { return p->nvme_over; }
static int over_off_device(const strata_plan *p) { return p->host_over || p->nvme_over; }

/* Whether o fits. When it offloads the optimizer and a tier overflows while another has
 * room, part of the state moves: from NVMe to pinned memory (offload.nvme_ratio: the disk
 * over, the host with room), else (parameters on the device) from the host or disk to the
 * device (offload.optimizer_ratio: the GPU with room). */
static int option_fits(const strata_config *cfg, option *o, int world, strata_device *dev) {
    strata_plan p;
    int known = plan_option(cfg, o, world, dev, &p);
    if (p.fits) return 1;
    if (p.device_over || !o->offload) return 0;
    /* nvme_ratio: the host's verdict improves as the NVMe share grows, the disk's worsens */
    if (o->offload == 2 && p.nvme_over && !p.host_over && !p.nvme_error[0] &&
        split_share(cfg, o, &o->nvme_pct, world, dev, over_host, over_nvme))
        return 1;
    /* a device of unknown size (no GPU here, no memory.gpu_gb) has no room to count on; a
     * unit kept there updates its parameters there, so they must live there too */
    if (!known || o->params) return 0;
    return split_share(cfg, o, &o->ratio_pct, world, dev, over_device, over_off_device);
}

static void join_sets(char sets[][96], int n, char *line, size_t line_len) {
    size_t o = 0;
    if (line_len) line[0] = 0;
    for (int i = 0; i < n && o < line_len; i++)
        o += (size_t)snprintf(line + o, line_len - o, "%s--set %s", i ? " " : "", sets[i]);
}

/* The options are planned without a device, so with the dtype the device will compute in
 * (the CPU backend computes in fp32 whatever train.dtype says). */
static strata_config device_config(const strata_config *cfg, strata_device *dev) {
    strata_config c = *cfg;
    if (dev) c.train.dtype = dev->compute_dtype == STRATA_BF16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_FP32;
    return c;
}

int strata_plan_suggest(const strata_config *cfg_in, int world, strata_device *dev, char sets[][96], int max_sets,
                        char *sets_line, size_t line_len, double *cost) {
    strata_config dev_cfg = device_config(cfg_in, dev);
    const strata_config *cfg = &dev_cfg;
    strata_plan p;
    strata_plan_compute(&p, cfg, world);
    strata_plan_check(&p, cfg, dev);
    if (sets_line && line_len) sets_line[0] = 0;
    if (cost) *cost = 0;
    if (p.fits) return 0;
    option *opts = strata_xcalloc(MAX_OPTIONS, sizeof *opts);
    int n_opts = enumerate_options(cfg, world, opts, MAX_OPTIONS);
    option best = {.cost = -1};
    for (int i = 0; i < n_opts; i++) {
        if (best.cost >= 0 && opts[i].cost >= best.cost) continue;
        if (option_fits(cfg, &opts[i], world, dev)) best = opts[i];
    }
    free(opts);
    if (best.cost < 0) return -1;
    strata_config out;
    int n = apply_option(cfg, &best, &out, sets, max_sets);
    if (sets_line) join_sets(sets, n, sets_line, line_len);
    if (cost) *cost = best.cost;
    return n;
}

int strata_plan_changes_numerics(char sets[][96], int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(sets[i], "optim.state=int8")) return 1;
    return 0;
}

/* Blocks recomputed by a checkpointing choice (0 none, K every K). */
static int recomputed_blocks(const strata_config *cfg, int ckpt) {
    int L = cfg->model.n_layer;
    return ckpt > 0 ? (L + ckpt - 1) / ckpt : 0;
}

/* o changes everything c does, at least as far: if c fits, o only adds work. */
static int option_extends(const strata_config *cfg, const option *o, const option *c) {
    return recomputed_blocks(cfg, o->ckpt) >= recomputed_blocks(cfg, c->ckpt) && o->halvings >= c->halvings &&
           o->stage >= c->stage && o->offload >= c->offload && o->params >= c->params && o->grads >= c->grads &&
           o->chunk >= c->chunk && o->mlp >= c->mlp && o->acts >= c->acts && o->q8 >= c->q8;
}

static int by_cost(const void *a, const void *b) {
    const option *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? 1 : -1;
    return (x->order > y->order) - (x->order < y->order);
}

int strata_plan_candidates(const strata_config *cfg_in, int world, strata_device *dev, strata_plan_candidate *out,
                           int max) {
    strata_config dev_cfg = device_config(cfg_in, dev);
    const strata_config *cfg = &dev_cfg;
    strata_plan p;
    strata_plan_compute(&p, cfg, world);
    strata_plan_check(&p, cfg, dev);
    if (p.fits) return 0;
    option *opts = strata_xcalloc(MAX_OPTIONS, sizeof *opts);
    int n_opts = enumerate_options(cfg, world, opts, MAX_OPTIONS);
    /* ties keep the enumeration order, as in strata_plan_suggest, so the first candidate is
     * its suggestion (qsort is not stable: the index goes into the key) */
    for (int i = 0; i < n_opts; i++) opts[i].order = i;
    qsort(opts, (size_t)n_opts, sizeof *opts, by_cost);
    option *taken = strata_xcalloc((size_t)(max > 0 ? max : 1), sizeof *taken);
    int n = 0;
    for (int i = 0; i < n_opts && n < max; i++) {
        int dup = 0;
        for (int k = 0; k < n && !dup; k++) dup = option_extends(cfg, &opts[i], &taken[k]);
        if (dup || !option_fits(cfg, &opts[i], world, dev)) continue;
        strata_plan_candidate *c = &out[n];
        strata_config applied;
        memset(c, 0, sizeof *c);
        c->n_sets = apply_option(cfg, &opts[i], &applied, c->sets, STRATA_PLAN_MAX_SETS);
        join_sets(c->sets, c->n_sets, c->line, sizeof c->line);
        c->cost = opts[i].cost;
        for (int k = 0; k < n && !dup; k++) dup = !strcmp(out[k].line, c->line);
        if (!dup) taken[n++] = opts[i];
    }
    free(taken);
    free(opts);
    return n > 0 ? n : -1;
}

/* ---- offload.optimizer_ratio and nvme_ratio: auto ---- */

/* What auto keeps free of the plan: on the device, room for what the runtime may allocate
 * past its measured allowance; in host memory, room for the system, the page cache and the
 * process's own unplanned memory. */
#define AUTO_DEVICE_HEADROOM 0.02
#define AUTO_HOST_HEADROOM 0.10

static int device_has_room(const strata_plan *p) {
    return !p->cpu_backend && p->capacity[STRATA_TIER_DEVICE] > 0 &&
           (double)strata_plan_device_total(p) <= (1.0 - AUTO_DEVICE_HEADROOM) * (double)p->capacity[STRATA_TIER_DEVICE];
}

static int host_has_room(const strata_plan *p) {
    double need = (double)(p->need[STRATA_TIER_PINNED] + p->need[STRATA_TIER_HOST] +
                           (p->cpu_backend ? p->need[STRATA_TIER_DEVICE] : 0));
    return need <= (1.0 - AUTO_HOST_HEADROOM) * (double)p->capacity[STRATA_TIER_HOST] &&
           p->need[STRATA_TIER_PINNED] <= p->capacity[STRATA_TIER_PINNED];
}

static int share_has_room(strata_config *c, double *share, int pct, int world, strata_device *dev,
                          int (*room)(const strata_plan *)) {
    strata_plan p;
    *share = pct / 100.0;
    strata_plan_compute(&p, c, world);
    strata_plan_check(&p, c, dev);
    return room(&p);
}

/* The smallest share (percent) of *share that leaves room where `room` looks, by
 * bisection over 1..100 (a larger share moves state out of there); 0 when not even all.
 * *share is left at whatever was tried last. */
static int smallest_share(strata_config *c, double *share, int world, strata_device *dev,
                          int (*room)(const strata_plan *)) {
    if (!share_has_room(c, share, 100, world, dev, room)) return 0;
    int lo = 1, hi = 100;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (share_has_room(c, share, mid, world, dev, room)) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

void strata_plan_resolve_auto(strata_config *cfg, int world, strata_device *dev) {
    strata_config c = device_config(cfg, dev);
    int opt_auto = cfg->offload.optimizer_ratio == STRATA_AUTO, nvme_auto = cfg->offload.nvme_ratio == STRATA_AUTO;
    c.offload.optimizer_ratio = cfg->offload.optimizer_ratio = opt_auto ? 1.0 : cfg->offload.optimizer_ratio;
    c.offload.nvme_ratio = cfg->offload.nvme_ratio = nvme_auto ? 1.0 : cfg->offload.nvme_ratio;
    /* first what the device keeps (the faster tier), then, of the rest, what the host keeps */
    if (opt_auto && cfg->offload.optimizer != STRATA_OFFLOAD_NONE && cfg->offload.params == STRATA_OFFLOAD_NONE) {
        int pct = smallest_share(&c, &c.offload.optimizer_ratio, world, dev, device_has_room);
        cfg->offload.optimizer_ratio = c.offload.optimizer_ratio = pct ? pct / 100.0 : 1.0;
    }
    if (nvme_auto && cfg->offload.optimizer == STRATA_OFFLOAD_NVME) {
        int pct = smallest_share(&c, &c.offload.nvme_ratio, world, dev, host_has_room);
        cfg->offload.nvme_ratio = pct ? pct / 100.0 : 1.0;
    }
}

int strata_plan_auto_hint(const strata_config *cfg, int world, strata_device *dev, char *line, size_t len) {
    if (len) line[0] = 0;
    if (cfg->offload.optimizer == STRATA_OFFLOAD_NONE || cfg->offload.params != STRATA_OFFLOAD_NONE ||
        cfg->offload.optimizer_ratio != 1.0)
        return 0;
    strata_config c = *cfg;
    c.offload.optimizer_ratio = STRATA_AUTO;
    strata_plan_resolve_auto(&c, world, dev);
    double r = c.offload.optimizer_ratio;
    if (r >= 1.0) return 0;
    snprintf(line, len, "hint: the device has room for %.0f%% of the optimizer state: --set offload.optimizer_ratio=auto "
                        "(%g here) keeps it there, with no PCIe transfer or CPU update for it",
             100.0 * (1.0 - r), r);
    return 1;
}
