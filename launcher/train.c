/* launcher/train.c: `strata train`, the training run, as its phases in the order
 * strata_cmd_train runs them. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/common.h"
#include "core/model.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/data.h"
#include "io/files.h"
#include "io/json.h"
#include "io/pretrained.h"
#include "io/tensorboard.h"
#include "shard/comm.h"
#include "shard/engine.h"
#include "shard/mpi.h"
#include "shard/peers.h"
#include "offload/nvme.h"
#include "offload/pipeline.h"
#include "launcher/auto.h"
#include "launcher/agree.h"
#include "launcher/build.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/export.h"
#include "launcher/offload_report.h"
#include "launcher/plan.h"
#include "launcher/resume.h"
#include "launcher/run_dir.h"
#include "launcher/sample.h"
#include "launcher/signals.h"
#include "launcher/watchdog.h"
#include "launcher/tokenizer.h"

/* ---- metrics ---- */

/* On resume, cuts metrics.jsonl back to one history: the rows of steps 0..last_step, each
 * once, in order. Rows of later steps (a run that went further and was killed), a last
 * line cut short (a full disk, a kill mid-write) and repeats are dropped. The file is
 * rewritten through path.tmp, fsynced and renamed; on any failure the .tmp is removed and
 * the original stays as it was. 0 or -1 + error naming the file and errno. */
static int metrics_truncate(const char *path, int64_t last_step) {
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? 0 : strata_fail("%s: cannot read: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(in), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(in);
        return strata_fail("%s is not a regular file: cannot cut it back to the resumed step", path);
    }
    char tmp[STRATA_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        int e = errno;
        fclose(in);
        return strata_fail("%s: cannot create: %s", tmp, strerror(e));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int64_t prev = -1; /* step 0: the validation before the first step (train.eval_at_start) */
    int e = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        if (line[n - 1] != '\n') continue; /* cut short */
        const char *sp = strstr(line, "\"step\":");
        int64_t step = sp ? atoll(sp + 7) : 0;
        if (step <= prev || step > last_step) continue;
        prev = step;
        if (fwrite(line, 1, (size_t)n, out) != (size_t)n) { e = errno; break; }
    }
    if (!e && ferror(in)) e = errno ? errno : EIO;
    free(line);
    fclose(in);
    if (!e && (fflush(out) != 0 || fsync(fileno(out)) != 0)) e = errno;
    if (fclose(out) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return strata_fail("%s: cutting it back to step %lld through %s failed: %s (errno %d)", path,
                           (long long)last_step, tmp, strerror(e), e);
    }
    return 0;
}

/* Resident set size of this process, from /proc (0 where unavailable). */
static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

static void fmt_eta(char *buf, size_t n, double seconds) {
    if (seconds < 0 || !isfinite(seconds)) seconds = 0;
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else if (s >= 60) snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, n, "%lds", s);
}

/* ---- train ---- */

typedef struct trainer {
    strata_config cfg;
    strata_cli cli;
    int rank, world, local_rank;
    strata_device *dev;
    strata_comm *comm;
    strata_model m;
    strata_arena arena;
    strata_engine *engine;
    strata_loader train, val;
    int have_train, have_val;
    int64_t start;          /* the step training starts from (a resumed checkpoint's) */
    double tokens_seen;
    double tokens_per_step; /* all ranks together */
    strata_rng rng;         /* sampling's, saved in checkpoints */
    FILE *metrics;
    char *config_yaml; /* the effective config as the checkpoints record it */
    char auto_change[800];  /* what memory.auto chose, "" if nothing */
    strata_auto autosel;    /* memory.auto's candidates, trials and the basis of its choice */
    size_t planned_device;  /* device bytes the plan predicted (the arena) */
    size_t planned_pinned;  /* pinned host bytes the plan predicted */
    size_t planned_nvme;    /* NVMe bytes the plan predicted */
    size_t rss_peak;        /* resident host memory, highest seen after a step */
    size_t planned_runtime; /* the plan's CUDA runtime row (0 on the CPU backend) */
    size_t device_used_peak; /* device memory in use (device_used), highest seen after a step */
    strata_bpe *tokenizer;  /* what the token ids mean (launcher/tokenizer.h), or NULL */
    int lock_fd;            /* rank 0: run.dir/lock, flock()ed for the run's life (-1: none) */
    char nvme_live[1024];   /* swap files of running processes in offload.nvme_path, for the plan's message */
    char metrics_path[STRATA_PATH_MAX + 32];
    long metrics_good_bytes; /* metrics.jsonl's length after its last complete line */
    strata_tb_writer *tb;    /* rank 0: the TensorBoard events (run.tensorboard), or NULL */
    char record_failed[STRATA_PATH_MAX + 160]; /* rank 0: which of the step's records could not be written */
    strata_plan plan;        /* the plan this run allocated, for its records (metrics.jsonl's first row, the events) */
    strata_offload_split split; /* the offload split and its floor (launcher/offload_report.h) */
    int kernel_profile; /* STRATA_PROFILE=kernels (report_kernel_profile) */
    int stopped;        /* the ranks agreed to stop on a signal (it may have reached another rank only) */
    /* train.early_stop_patience: the lowest validation loss so far (NaN: none yet), its
     * step, and the validations since that did not come below it by min_delta */
    double es_best;
    int64_t es_best_step;
    int es_since;
    int64_t step_now;   /* the step in progress, 1-based (atomic: the terminal hook may run on any thread) */
    FILE *term_log;     /* rank 0: run.dir/train.log, opened once the terminal is lost (terminal_lost) */
    char refused[1200]; /* load_config's refusal, said by meet_ranks under mpirun ("" if none) */
} trainer;

/* A rank that cannot continue ends the whole job at once with its message: the other
 * ranks may be inside a collective that would otherwise wait for it until the timeout. */
static _Noreturn void fatal(const trainer *t, const char *what) {
    strata_log(STRATA_LOG_ERROR, "train", "%s: %s", what, strata_error());
    if (t->world > 1) strata_mpi_abort(STRATA_EXIT_ERROR);
    exit(STRATA_EXIT_ERROR);
}

/* Keeps the effective config's YAML for the checkpoints: -1 + error naming a string key
 * YAML cannot hold, which the run must refuse at its start rather than at its first save. */
static int record_config(trainer *t) {
    char *yaml = strata_config_yaml(&t->cfg, 0);
    if (!yaml) return -1;
    free(t->config_yaml);
    t->config_yaml = yaml;
    return 0;
}

/* Device memory in use as nvidia-smi counts it on CUDA (total - free: every process on the
 * GPU); on the CPU backend, where "device" memory is host memory shared with everything
 * else, Strata's own device allocations, which the plan predicts exactly. */
static size_t device_used(const trainer *t) {
    if (!t->dev->caps.gpu) return t->dev->mem[STRATA_MEM_DEVICE].live_bytes;
    size_t free_b = 0, total = 0;
    if (t->dev->ops->mem_info(t->dev, &free_b, &total)) return 0;
    return total - free_b;
}

static double percent_off(size_t got, size_t predicted) {
    return predicted ? 100.0 * ((double)got - (double)predicted) / (double)predicted : 0.0;
}

/* Writes the checkpoint of `step` completed steps; its directory goes to dir (dir_len). */
/* val_loss: the step's validation, NaN when it had none (ckpt/best compares them). */
static int save_checkpoint(trainer *t, int64_t step, double loss, double val_loss, char *dir, size_t dir_len) {
    strata_ckpt_meta meta = {.step = step, .world = t->world, .stage = t->cfg.zero.stage, .seed = t->cfg.train.seed,
                             .rng_state = t->rng.state, .tokens_seen = t->tokens_seen, .last_loss = loss,
                             .validated = !isnan(val_loss), .val_loss = val_loss, .config_yaml = t->config_yaml};
    double t0 = strata_now_ms();
    if (strata_engine_save(t->engine, t->cfg.run.dir, &meta, dir, dir_len)) return -1;
    if (t->rank == 0) STRATA_INFO("ckpt", "saved %s (%.0f ms)", dir, strata_now_ms() - t0);
    return 0;
}

/* Appends one shell word to buf, single-quoted when it holds anything the shell would read. */
static void append_word(char *buf, size_t n, const char *w) {
    size_t o = strlen(buf);
    int plain = *w != 0;
    for (const char *c = w; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%", *c)) plain = 0;
    if (o + 1 >= n) return;
    if (o) buf[o++] = ' ';
    if (plain) {
        snprintf(buf + o, n - o, "%s", w);
        return;
    }
    if (o < n) buf[o++] = '\'';
    for (const char *c = w; *c && o + 5 < n; c++) {
        if (*c == '\'') { memcpy(buf + o, "'\\''", 4); o += 4; }
        else buf[o++] = *c;
    }
    if (o + 1 < n) buf[o++] = '\'';
    buf[o < n ? o : n - 1] = 0;
}

/* The command that repeats this run, resuming from `ckpt_dir` (or from scratch when NULL). */
static void resume_command(const trainer *t, const char *ckpt_dir, char *buf, size_t n) {
    buf[0] = 0;
    if (t->world > 1) {
        char np[16];
        snprintf(np, sizeof np, "%d", t->world);
        append_word(buf, n, "mpirun");
        append_word(buf, n, "-np");
        append_word(buf, n, np);
    }
    append_word(buf, n, "strata");
    append_word(buf, n, "train");
    if (t->cli.config_path) append_word(buf, n, t->cli.config_path);
    for (int i = 0; i < t->cli.n_sets; i++) {
        append_word(buf, n, "--set");
        append_word(buf, n, t->cli.sets[i]);
    }
    if (ckpt_dir) {
        append_word(buf, n, "--resume");
        append_word(buf, n, ckpt_dir);
    }
}

/* Step `step` (0-based) hit a device fault, out of memory in practice, on some rank, and
 * every rank skipped its update, so the state is still that of `step` completed steps:
 * checkpoint it through the usual atomic path, then say who needed how much, what the
 * device holds now, and the command that resumes. Every rank comes here together (they
 * agreed on the fault), since the checkpoint is collective. */
static int out_of_memory(trainer *t, int64_t step, double loss) {
    char fault[1024];
    int kind = strata_fault_take(fault, sizeof fault);
    if (kind != STRATA_FAULT_NONE && t->rank != 0) /* rank 0's own is in the summary below */
        STRATA_ERROR("train", "step %lld: %s", (long long)step + 1, fault);
    int64_t done = step; /* completed steps, whose state is intact */
    char dir[STRATA_PATH_MAX] = "";
    int saved = 0;
    if (done > 0) {
        if (save_checkpoint(t, done, loss, NAN, dir, sizeof dir) == 0) saved = 1;
        else if (t->rank == 0) STRATA_ERROR("ckpt", "the emergency checkpoint of step %lld failed: %s", (long long)done, strata_error());
    }
    if (t->rank != 0) return STRATA_EXIT_OOM;
    size_t free_b = 0, total = 0;
    char b[6][32], cmd[4096];
    int have_info = t->dev->ops->mem_info(t->dev, &free_b, &total) == 0;
    size_t plan = t->planned_device + t->planned_runtime;
    STRATA_ERROR("train", "%s in step %lld: %s", kind == STRATA_FAULT_DEVICE ? "device fault" : "out of device memory",
                 (long long)step + 1, kind != STRATA_FAULT_NONE ? fault : "on another rank (its message is above)");
    strata_out_printf(stderr, "  Every rank abandoned the step before its update, so no parameter or optimizer state was touched.\n");
    char holds[160];
    if (t->planned_runtime)
        snprintf(holds, sizeof holds, "%s (arena %s + CUDA runtime %s)", strata_fmt_bytes(b[3], 32, (double)plan),
                 strata_fmt_bytes(b[4], 32, (double)t->planned_device), strata_fmt_bytes(b[5], 32, (double)t->planned_runtime));
    else
        snprintf(holds, sizeof holds, "%s", strata_fmt_bytes(b[3], 32, (double)plan));
    if (have_info)
        strata_out_printf(stderr, "  Device %s now: %s free of %s (%s in use); Strata's plan holds %s of it.\n",
                t->dev->description, strata_fmt_bytes(b[0], 32, (double)free_b), strata_fmt_bytes(b[1], 32, (double)total),
                strata_fmt_bytes(b[2], 32, (double)(total - free_b)), holds);
    strata_out_printf(stderr, "  The plan fitted when the run started, so another process probably took device memory since: "
                    "%s lists who holds it.\n", t->dev->caps.gpu ? "`nvidia-smi`" : "`top -o %MEM`");
    if (saved) {
        resume_command(t, dir, cmd, sizeof cmd);
        strata_out_printf(stderr, "  The state of step %lld is saved in %s. When the memory is free again, resume with:\n    %s\n",
                (long long)done, dir, cmd);
    } else if (done == 0) {
        resume_command(t, NULL, cmd, sizeof cmd);
        strata_out_printf(stderr, "  No step had completed, so there is nothing to save; when the memory is free again, start "
                        "over with:\n    %s\n", cmd);
    } else {
        strata_out_printf(stderr, "  The emergency checkpoint could not be written; resume from the last periodic one with "
                        "--resume latest.\n");
    }
    return STRATA_EXIT_OOM;
}

/* A fault recorded after the engine's check (in the norm or the optimizer update) with a
 * step that otherwise completed: the update may be partly applied, so there is nothing
 * trustworthy to save, and the run ends here, pointing at the last checkpoint written. */
static void update_fault(trainer *t, int64_t step) {
    char fault[1024];
    int kind = strata_fault_take(fault, sizeof fault);
    if (kind == STRATA_FAULT_NONE) return;
    strata_log(STRATA_LOG_ERROR, "train", "%s in the optimizer update of step %lld: %s. The update may be partly "
               "applied, so it is not checkpointed; resume from the last checkpoint with --resume latest "
               "(`nvidia-smi` lists who else holds device memory).",
               kind == STRATA_FAULT_OOM ? "out of device memory" : "device fault", (long long)step + 1, fault);
    int code = kind == STRATA_FAULT_OOM ? STRATA_EXIT_OOM : STRATA_EXIT_ERROR;
    if (t->world > 1) strata_mpi_abort(code);
    exit(code);
}

/* The plan of what this rank allocates: the engine's arena, its NVMe file and the
 * collectives' pinned staging buffer, checked against the machine. */
static void plan_this_run(trainer *t, strata_plan *plan) {
    strata_plan_from_arena(plan, &t->arena, t->world, t->cfg.zero.stage);
    strata_plan_set_model(plan, &t->cfg, &t->m);
    strata_plan_add_nvme(plan, strata_engine_nvme_bytes(t->engine), strata_engine_nvme_param_bytes(t->engine));
    strata_plan_add_pinned_buffers(plan, strata_comm_pinned_bytes(t->comm));
    strata_plan_check(plan, &t->cfg, t->dev);
}

/* run.keep_best keeps a checkpoint whose step validated: say so before step 1 when only the
 * last step both validates and saves (periodic checkpoints never fall on a validation). */
static void check_keep_best(const trainer *t) {
    const strata_config *cfg = &t->cfg;
    int64_t e = cfg->train.eval_every, c = cfg->run.checkpoint_every, steps = cfg->train.steps;
    if (!strata_config_keeps_best(cfg) || !cfg->data.val[0]) return;
    int64_t a = e, b = c;
    while (b) { int64_t r = a % b; a = b; b = r; } /* gcd */
    if (e > 0 && c > 0 && e / a * c <= steps) return; /* some periodic checkpoint validates */
    STRATA_WARN("ckpt", "%s: no periodic checkpoint falls on a validation (train.eval_every %lld, "
                "run.checkpoint_every %lld), so only the last step can be the best; make checkpoint_every a multiple of "
                "eval_every", cfg->run.keep_best ? "run.keep_best" : "train.early_stop_patience", (long long)e, (long long)c);
}

/* Checkpoints are bytes too: warn before step 1 when run.dir's filesystem cannot hold the
 * checkpoints the run will keep (the write would fail atomically, but hours in). */
static void check_checkpoint_space(const trainer *t) {
    const strata_config *cfg = &t->cfg;
    if (!cfg->run.checkpoint_at_end && cfg->run.checkpoint_every == 0) return;
    const size_t *padded = strata_engine_padded(t->engine);
    double one = 0; /* fp32 master, m, v of every padded element, all ranks together */
    for (int u = 0; u < t->m.n_units; u++) one += 12.0 * (double)padded[u];
    int64_t steps = cfg->train.steps, every = cfg->run.checkpoint_every;
    double count = every > 0 ? (double)(steps / every) + (steps % every ? 1 : 0) : 1;
    if (cfg->run.keep > 0 && count > cfg->run.keep) count = cfg->run.keep + (strata_config_keeps_best(cfg) ? 1 : 0);
    double need = one * (count + (count > 1 ? 1 : 0)); /* the newest is written before the oldest goes */
    char dir[STRATA_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cfg->run.dir);
    struct statvfs vfs;
    while (statvfs(dir, &vfs) != 0) { /* the run dir may not exist yet: its nearest parent */
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) {
            snprintf(dir, sizeof dir, "%s", slash == dir ? "/" : ".");
            if (statvfs(dir, &vfs) != 0) return;
            break;
        }
        *slash = 0;
    }
    double free_b = (double)vfs.f_bavail * (double)vfs.f_frsize;
    char b1[32], b2[32], b3[32];
    if (need > free_b)
        STRATA_WARN("plan", "checkpoints: each takes %s, and up to %.0f are on disk at once (%s), but %s (run.dir's "
                    "filesystem) has %s free: the first write that does not fit will fail. Free space, lower run.keep, "
                    "or point run.dir elsewhere.", strata_fmt_bytes(b1, 32, one), count + (count > 1 ? 1 : 0),
                    strata_fmt_bytes(b2, 32, need), dir, strata_fmt_bytes(b3, 32, free_b));
}

/* ---- the phases of `strata train`, in the order strata_cmd_train runs them ---- */

/* STRATA_PROFILE, read once at the start: 1 kernels, 0 unset, empty or off, -1 anything
 * else (a usage error, with the message set). */
static int kernel_profile_choice(void) {
    const char *v = getenv("STRATA_PROFILE");
    if (!v || !*v || !strcmp(v, "off")) return 0;
    if (!strcmp(v, "kernels")) return 1;
    return strata_fail("STRATA_PROFILE=%s: not a profile this build knows (kernels, or off)", v);
}

/* train.epochs into train.steps: passes over data.train's sequences (chunks of T + 1
 * tokens, as the loader cuts them), a step taking the global batch, micro_batch x
 * grad_accum x world sequences; rounded up, so the last step's batch may run into the next
 * pass, as any step's may. Under mpirun the ranks' results are compared with the rest of
 * their configs (a rank whose data.train holds other shards differs). 0, or -1 + error. */
static int steps_from_epochs(trainer *t) {
    strata_config *cfg = &t->cfg;
    if (!(cfg->train.epochs > 0)) return 0;
    strata_loader L;
    int T = strata_config_seq_len(cfg);
    if (strata_loader_open(&L, cfg->data.train, T, cfg->model.vocab_size, 0, 0))
        return strata_fail_wrap("train.epochs counts the sequences of data.train");
    uint64_t n = L.n_chunks;
    strata_loader_close(&L);
    double per_step = (double)cfg->train.micro_batch * cfg->train.grad_accum * t->world;
    double want = cfg->train.epochs * (double)n / per_step;
    int64_t steps = (int64_t)ceil(want - 1e-9 * want); /* 0.1 x 80 / 8 is 1, not 1 + an ulp */
    if (steps < 1) steps = 1;
    if (t->rank == 0)
        STRATA_INFO("train", "train.epochs %g: %lld steps of %.0f sequences over the %llu of data.train (T %d)%s",
                    cfg->train.epochs, (long long)steps, per_step, (unsigned long long)n, T,
                    cfg->train.steps > 0 && cfg->train.steps != steps ? "; the train.steps given is not used" : "");
    cfg->train.steps = steps;
    return 0;
}

/* optim.warmup_ratio into optim.warmup_steps, once train.steps is known (train.epochs);
 * the effective config (recorded with the run and its checkpoints) then says the steps. */
static void warmup_from_ratio(trainer *t) {
    strata_config *cfg = &t->cfg;
    if (!(cfg->optim.warmup_ratio > 0)) return;
    double w = floor(cfg->optim.warmup_ratio * (double)cfg->train.steps + 0.5);
    cfg->optim.warmup_steps = w > INT_MAX ? INT_MAX : (int)w;
    if (t->rank == 0)
        STRATA_INFO("train", "optim.warmup_ratio %g: %d warmup steps of %lld", cfg->optim.warmup_ratio,
                    cfg->optim.warmup_steps, (long long)cfg->train.steps);
    cfg->optim.warmup_ratio = 0;
}

/* run.export_dir, before hours of training: a directory or nothing yet, in a directory
 * this process may write. */
static int check_export_dir(const strata_config *cfg) {
    const char *dir = cfg->run.export_dir, *file = cfg->path[0] ? cfg->path : "<built-in>";
    if (!dir[0]) return 0;
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return strata_fail("%s: key 'run.export_dir': '%s' is not a directory", file, dir);
    char parent[STRATA_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = 0;
    else *slash = 0;
    if (access(parent, W_OK) != 0)
        return strata_fail("%s: key 'run.export_dir': '%s' cannot be written (%s: %s)", file, dir, parent,
                           strerror(errno));
    return 0;
}

/* The config and what it names, checked before anything is opened: its tokenizer, its
 * YAML for the checkpoints, STRATA_PROFILE, and offload.nvme_path (missing, or not a
 * directory). A refusal is a usage error (exit 2), said by rank 0, before run.dir is
 * touched. Returns an exit code (0: go on). */
static int load_config(trainer *t) {
    strata_config *cfg = &t->cfg;
    const char *where = NULL; /* names the config in the message, for what it leads to */
    if (strata_config_load(cfg, t->cli.config_path, t->cli.sets, t->cli.n_sets) ||
        strata_config_set_world(cfg, cfg->path[0] ? cfg->path : "<built-in>", t->world))
        goto refuse;
    where = cfg->path[0] ? cfg->path : "<built-in>";
    /* said now, not after the plan is allocated: llm.c's uint16 shards cannot hold the ids
     * of a vocabulary past 65536, and examples packed into sequences of one length would be
     * cut across by chunks of another (a data.train that names no shard, or a bad shard, is
     * open_data's to say) */
    for (int split = 0; split < 2; split++) {
        const char *key = split ? "data.val" : "data.train", *glob = split ? cfg->data.val : cfg->data.train;
        int wide = 1, packed = 0, T = strata_config_seq_len(cfg);
        if (!glob[0] || strata_shards_info(glob, &wide, &packed, NULL)) continue;
        if (!split && cfg->model.vocab_size > 65536 && !wide) {
            strata_fail("model.vocab_size is %d, but the shards of data.train (%s) hold uint16 tokens (at most 65536 "
                        "ids), so they were made for another vocabulary; `strata prepare --tokenizer` with the model's "
                        "tokenizer writes 32-bit shards", cfg->model.vocab_size, cfg->data.train);
            goto refuse;
        }
        if (packed < 0) {
            strata_fail("the shards of %s (%s) were packed into sequences of different lengths (strata prepare --jsonl "
                        "--seq-len): prepare them again with one --seq-len", key, glob);
            goto refuse;
        }
        if (packed && packed != T) {
            strata_fail("the shards of %s (%s) hold examples packed into sequences of %d tokens (strata prepare --jsonl "
                        "--seq-len %d), but the run reads sequences of %d (train.seq_len, else model.seq_len): set "
                        "train.seq_len=%d, or prepare again with --seq-len %d", key, glob, packed, packed, T, packed, T);
            goto refuse;
        }
    }
    if (steps_from_epochs(t)) goto refuse;
    warmup_from_ratio(t);
    if (strata_run_tokenizer_open(cfg, &t->tokenizer) || record_config(t)) goto refuse;
    where = NULL;
    if ((t->kernel_profile = kernel_profile_choice()) < 0) goto refuse;
    if (cfg->train.threads > 0) omp_set_num_threads(cfg->train.threads);
    if (strata_plan_check_paths(cfg) || check_export_dir(cfg)) goto refuse;
    return 0;
refuse:
    snprintf(t->refused, sizeof t->refused, "%s%s%s", where ? where : "", where ? ": " : "", strata_error());
    if (t->world == 1) fprintf(stderr, "%s\n", t->refused); /* under mpirun, meet_ranks says it with ranks and hosts */
    return STRATA_EXIT_USAGE;
}

/* Under mpirun, first of all: every rank learns every rank's pid, host and local rank
 * (shard/peers.h), and a config that some rank refused (rc, from load_config: a path that
 * one host lacks) is said once by rank 0, naming the ranks and hosts, and refused on every
 * rank. Returns an exit code (0: go on). */
static int meet_ranks(trainer *t, int rc) {
    if (t->world == 1) return rc;
    if (strata_peers_exchange(t->rank, t->world, t->local_rank, strata_mpi_local_rank_source()))
        fatal(t, "exchanging the ranks' pids and hosts");
    int agreed = strata_ranks_refusals(rc, t->refused, t->rank, t->world);
    if (agreed < 0) fatal(t, "gathering the ranks' refusals of the config");
    if (agreed) return agreed;
    char text[1024];
    strata_peers_local_clash(text, sizeof text);
    if (t->rank == 0 && text[0]) STRATA_WARN("train", "%s", text);
    if (t->rank == 0 && strata_peers_n_hosts() > 1) {
        size_t o = 0;
        text[0] = 0;
        strata_peers_describe_hosts(text, &o, sizeof text);
        STRATA_INFO("train", "%d ranks on %d hosts: %s", t->world, strata_peers_n_hosts(), text);
        int far = strata_peers_unreachable(text, sizeof text, 2000);
        if (far)
            STRATA_WARN("train", "rank 0 cannot reach %s %s by TCP at the port each rank listens on to show it is "
                        "alive (a firewall between hosts?): should a host be lost, the survivors could not say which",
                        far == 1 ? "rank" : "ranks", text);
    }
    STRATA_DEBUG("train", "host %s, local rank %d (from %s), device %d", strata_peers_host(t->rank), t->local_rank,
                 strata_mpi_local_rank_source(), strata_peers_device_index());
    return 0;
}

/* Before anything else is opened: rank 0 takes run.dir (launcher/run_dir.h), then tells
 * every rank whether the run may start, so a refusal reaches each of them before any
 * collective; under mpirun every rank must see the same run.dir. Returns an exit code
 * (0: go on). */
static int claim_run_dir(trainer *t) {
    int32_t rc = 0;
    char why[2048] = "";
    if (t->rank == 0 && (rc = strata_run_dir_take(t->cfg.run.dir, &t->lock_fd)))
        snprintf(why, sizeof why, "%s", strata_error());
    if (rc) /* said before the others hear it, so none ends the job before it is out */
        strata_log(STRATA_LOG_ERROR, "train", "%s", why);
    if (strata_mpi_bcast(&rc, sizeof rc, 0)) fatal(t, "agreeing on the run directory");
    if (rc) return rc;
    strata_signals_run_dir(t->cfg.run.dir);
    if (t->world > 1 && (rc = strata_run_dir_shared(t->cfg.run.dir, t->rank, t->world)) < 0)
        fatal(t, "checking that every rank sees run.dir");
    return rc;
}

/* Under mpirun, every rank's config, data and tokenizer against rank 0's (launcher/agree.h),
 * before any collective work. Returns an exit code (0: go on). */
static int agree_ranks(trainer *t) {
    int rc = strata_ranks_agree(&t->cfg, t->tokenizer, t->rank, t->world);
    if (rc < 0) fatal(t, "comparing the ranks' configs, data and tokenizers");
    return rc ? STRATA_EXIT_USAGE : 0;
}

/* --resume: the checkpoint's model keys and tokenizer against this run's
 * (launcher/resume.h), before anything is built. Returns an exit code (0: go on). */
static int check_resume(trainer *t) {
    if (!t->cli.resume) return 0;
    int usage = 0;
    if (strata_resume_check(&t->cfg, t->cli.resume, t->tokenizer, t->cli.allow_new_tokenizer, &usage) == 0) return 0;
    if (!usage) fatal(t, "--resume");
    if (t->rank == 0) strata_log(STRATA_LOG_ERROR, "train", "--resume: %s", strata_error());
    return STRATA_EXIT_USAGE;
}

/* Swap files a killed run left in offload.nvme_path would count as used space: remove
 * them (strata_nvme_reclaim) before the plan measures the disk; those of running
 * processes stay and are named. Every rank looks before any rank makes its own file, and
 * all agree. Returns an exit code (0: go on). */
static int reclaim_nvme(trainer *t) {
    const strata_config *cfg = &t->cfg;
    if (!cfg->offload.nvme_path[0] ||
        (cfg->offload.optimizer != STRATA_OFFLOAD_NVME && cfg->offload.params != STRATA_OFFLOAD_NVME))
        return 0;
    size_t live_bytes = 0;
    int32_t rc = strata_nvme_reclaim(cfg->offload.nvme_path, t->nvme_live, sizeof t->nvme_live, &live_bytes) ? STRATA_EXIT_ERROR : 0;
    if (rc && strata_peers_n_hosts() > 1)
        strata_log(STRATA_LOG_ERROR, "nvme", "offload.nvme_path on host %s: %s", strata_peers_host(t->rank), strata_error());
    else if (rc)
        strata_log(STRATA_LOG_ERROR, "nvme", "offload.nvme_path: %s", strata_error());
    else if (t->nvme_live[0] && t->rank == 0) {
        char b[32];
        STRATA_INFO("nvme", "offload.nvme_path also holds swap files of running processes (%s in all): %s",
                    strata_fmt_bytes(b, sizeof b, (double)live_bytes), t->nvme_live);
    }
    int32_t *all = strata_xcalloc((size_t)t->world, sizeof *all);
    if (strata_mpi_allgather(&rc, all, sizeof rc)) fatal(t, "agreeing on offload.nvme_path");
    for (int r = 0; r < t->world; r++)
        if (all[r]) rc = all[r];
    free(all);
    return rc;
}

/* The device and the collectives. Returns an exit code (0: go on). */
static int open_device(trainer *t, int local_rank) {
    const strata_config *cfg = &t->cfg;
    /* the launcher's local rank, unless it clashes on this host (meet_ranks warned) */
    if (t->world > 1) local_rank = strata_peers_device_index();
    t->dev = strata_device_open(strata_backend_name(cfg), local_rank);
    if (!t->dev) fatal(t, "opening the device");
    /* STRATA_CUDA_UNVERIFIED=1 lets bench/gpu-check.sh exercise these paths on a GPU.
     * Verified there (H200, 2026-11-27, docs/gpu-matrix.md): zero stages 0-3 at world 1
     * (stages 1-3, offload cpu/nvme, checkpointing and NCCL bit for bit equal to stage 0)
     * and the Llama family (every row of its matrix). */
    /* the device's own AdamW with bf16 or 8-bit moments (an offloaded update runs the CPU's) */
    int small_state = cfg->optim.state != STRATA_OPTIM_STATE_FP32 &&
                      (cfg->offload.optimizer == STRATA_OFFLOAD_NONE || cfg->offload.optimizer_ratio < 1);
    if (t->dev->caps.gpu && (t->world > 1 || small_state) && !getenv("STRATA_CUDA_UNVERIFIED")) {
        /* Not yet proven on a GPU: several ranks sharing the H200 parted at stage 3 (a race,
         * fixed since and not yet rerun), and the bf16/8-bit AdamW's runs have not yet been
         * compared with the CPU's in a stable run. Refuse rather than risk a wrong result. */
        if (t->rank == 0)
            fprintf(stderr, "%s: %s on the CUDA backend is not available in this version (verified on a GPU: "
                            "zero.stage 0-3 at world size 1 with optim.state fp32, GPT-2 and the Llama family); use "
                            "those, offload.optimizer: cpu for bf16 or int8 state, or device: cpu\n",
                    cfg->path[0] ? cfg->path : "<built-in>",
                    t->world > 1 ? "training with several ranks" : "the device's AdamW with optim.state bf16 or int8");
        return STRATA_EXIT_USAGE;
    }
    /* built of the parts the GPU matrix has verified (device streams, event waits, the
     * tier's host streams) and bitwise-tested on the CPU backend, whose streams are threads
     * under ThreadSanitizer; a user whose gradients do not fit has no other way, so it runs,
     * and says so */
    if (t->dev->caps.gpu && cfg->offload.gradients != STRATA_OFFLOAD_NONE && t->rank == 0)
        STRATA_WARN("train", "offload.gradients: cpu has not yet run on a GPU (its rows of docs/gpu-matrix.md wait "
                             "for the next check); it is bitwise-tested on the CPU backend");
    if (t->dev->caps.gpu && cfg->offload.activations != STRATA_OFFLOAD_NONE && t->rank == 0)
        STRATA_WARN("train", "offload.activations: cpu has not yet run on a GPU (its rows of docs/gpu-matrix.md wait "
                             "for the next check); it is bitwise-tested on the CPU backend");
    t->comm = strata_comm_open_config(t->dev, cfg);
    if (!t->comm) fatal(t, "opening the collectives");
    if (t->rank == 0)
        STRATA_INFO("train", "%s | device %s | comm %s, world %d | zero stage %d", cfg->path[0] ? cfg->path : "(built-in quickstart)",
                    t->dev->description, strata_comm_backend_name(t->comm), t->world, cfg->zero.stage);
    return 0;
}

/* A plan that does not fit: refuse with the cheapest change that would, or (memory.auto)
 * measure the changes that fit, apply the fastest to the config and rebuild. */
static int fit_the_plan(trainer *t, strata_plan *plan) {
    strata_config *cfg = &t->cfg;
    char sets[STRATA_PLAN_MAX_SETS][96], line[800];
    double cost = 0;
    int n = strata_plan_suggest(cfg, t->world, t->dev, sets, STRATA_PLAN_MAX_SETS, line, sizeof line, &cost);
    if (!cfg->memory.auto_fit || n <= 0) {
        if (t->rank == 0) {
            const char *config = t->cli.config_path ? t->cli.config_path : "";
            strata_plan_print(plan, stderr);
            if (n > 0)
                fprintf(stderr, "error: the run does not fit (%s). The cheapest change that fits, keeping the "
                                "global batch (about +%.0f%% step time%s):\n  strata train %s %s\n"
                                "or set memory.auto: true to apply it automatically.\n",
                        plan->why, cost * 100,
                        strata_plan_changes_numerics(sets, n) ? "; changes the optimizer's numerics, 8-bit Adam moments" : "",
                        config, line);
            else
                fprintf(stderr, "error: the run does not fit (%s), and no change of micro-batch, activation "
                                "checkpointing or ZeRO stage makes it fit: add ranks or offload.\n", plan->why);
            /* the 8-bit rung, when memory.allow_int8_state left it out and it is cheaper */
            strata_config any = *cfg;
            char sets8[STRATA_PLAN_MAX_SETS][96], line8[800];
            double cost8 = 0;
            any.memory.allow_int8_state = 1;
            int n8 = cfg->memory.allow_int8_state ? 0
                                                  : strata_plan_suggest(&any, t->world, t->dev, sets8, STRATA_PLAN_MAX_SETS,
                                                                        line8, sizeof line8, &cost8);
            if (n8 > 0 && strata_plan_changes_numerics(sets8, n8) && (n <= 0 || cost8 < cost))
                fprintf(stderr, "Cheaper, changing the optimizer's numerics (8-bit Adam moments; about +%.0f%% step "
                                "time):\n  strata train %s %s\n(memory.allow_int8_state: true lets memory.auto "
                                "choose it.)\n",
                        cost8 * 100, config, line8);
        }
        return STRATA_EXIT_NOFIT;
    }
    strata_unbuild(t->engine, &t->arena, &t->m);
    t->autosel = (strata_auto){.cfg = cfg, .dev = t->dev, .comm = t->comm, .rank = t->rank, .world = t->world};
    const strata_plan_candidate *pick = strata_auto_choose(&t->autosel, plan);
    if (pick) {
        n = pick->n_sets;
        memcpy(sets, pick->sets, sizeof sets);
        snprintf(line, sizeof line, "%s", pick->line);
        cost = pick->cost;
    }
    for (int i = 0; i < n; i++)
        if (strata_config_set(cfg, sets[i]) || strata_config_check(cfg, "memory.auto")) fatal(t, "applying memory.auto");
    snprintf(t->auto_change, sizeof t->auto_change, "%s", line);
    STRATA_DEBUG("plan", "memory.auto: this rank applies %s", line);
    if (!pick) {
        t->autosel.basis = "cheapest estimate";
        if (t->rank == 0)
            STRATA_INFO("plan", "memory.auto: %s; chose %s (cheapest that fits, about +%.0f%% step time)", plan->why,
                        line, cost * 100);
    }
    if (record_config(t)) fatal(t, "recording the config memory.auto chose");
    t->engine = strata_build(cfg, t->dev, t->comm, t->rank, t->world, &t->m, &t->arena);
    plan_this_run(t, plan);
    return 0;
}

/* offload.optimizer_ratio and nvme_ratio: auto become shares on this rank's device and host
 * (launcher/plan.c); every rank takes the largest any found, so none keeps more than its
 * device or host holds. */
static void resolve_auto_ratios(trainer *t) {
    strata_config *cfg = &t->cfg;
    int opt_auto = cfg->offload.optimizer_ratio == STRATA_AUTO, nvme_auto = cfg->offload.nvme_ratio == STRATA_AUTO;
    if (!opt_auto && !nvme_auto) return;
    strata_plan_resolve_auto(cfg, t->world, t->dev);
    double mine[2] = {cfg->offload.optimizer_ratio, cfg->offload.nvme_ratio};
    double *all = strata_xcalloc(2 * (size_t)t->world, sizeof *all);
    if (strata_mpi_allgather(mine, all, sizeof mine)) fatal(t, "agreeing on the offload ratios set to auto");
    for (int i = 0; i < t->world; i++) {
        cfg->offload.optimizer_ratio = fmax(cfg->offload.optimizer_ratio, all[2 * i]);
        cfg->offload.nvme_ratio = fmax(cfg->offload.nvme_ratio, all[2 * i + 1]);
    }
    free(all);
    if (t->rank == 0 && opt_auto)
        STRATA_INFO("plan", "offload.optimizer_ratio: auto is %g: %s", cfg->offload.optimizer_ratio,
                    cfg->offload.optimizer_ratio < 1
                        ? "the optimizer state the device cannot hold is offloaded, the rest stays on it"
                        : "all of the optimizer state is offloaded (the device has no room for any, or its size is "
                          "unknown: set memory.gpu_gb)");
    if (t->rank == 0 && nvme_auto)
        STRATA_INFO("plan", "offload.nvme_ratio: auto is %g: %s", cfg->offload.nvme_ratio,
                    cfg->offload.nvme_ratio < 1 ? "the offloaded state host memory cannot hold is on NVMe, the rest pinned"
                                                : "all of the offloaded state is on NVMe (host memory has no room for any)");
    if (record_config(t)) fatal(t, "recording the config with its resolved ratios"); /* the run's record names them */
}

/* The model, its memory plan and the engine: the plan is checked (and fitted) before
 * anything is allocated, then committed. Returns an exit code (0: go on). */
static int build_and_plan(trainer *t) {
    resolve_auto_ratios(t);
    const strata_config *cfg = &t->cfg;
    t->engine = strata_build(cfg, t->dev, t->comm, t->rank, t->world, &t->m, &t->arena);
    strata_plan plan;
    plan_this_run(t, &plan);
    if (!plan.fits && t->nvme_live[0] && plan.need[STRATA_TIER_NVME] > plan.capacity[STRATA_TIER_NVME]) {
        size_t o = strlen(plan.why); /* name who holds the disk (reclaim_nvme removed the stale ones) */
        snprintf(plan.why + o, sizeof plan.why - o, "; swap files of running processes hold part of it: %s", t->nvme_live);
    }
    int rc;
    if (!plan.fits && (rc = fit_the_plan(t, &plan))) return rc;
    char hint[400];
    if (t->rank == 0 && strata_plan_auto_hint(&t->cfg, t->world, t->dev, hint, sizeof hint)) STRATA_INFO("plan", "%s", hint);
    t->planned_device = plan.need[STRATA_TIER_DEVICE];
    t->planned_pinned = plan.need[STRATA_TIER_PINNED];
    t->planned_nvme = plan.need[STRATA_TIER_NVME];
    t->planned_runtime = plan.runtime_bytes;
    t->plan = plan;
    if (t->rank == 0) {
        int B = cfg->train.micro_batch, T = strata_config_seq_len(cfg), A = cfg->train.grad_accum;
        char desc[256];
        strata_config_model_describe(cfg, desc, sizeof desc);
        STRATA_INFO("train", "model: %s (padded %d), %zu parameters", desc, t->m.shape.padded_vocab_size,
                    strata_model_num_params(&t->m));
        STRATA_INFO("train", "batch: %d x %d tokens x %d accumulation x %d ranks = %lld tokens per step", B, T, A,
                    t->world, (long long)B * T * A * t->world);
        strata_plan_print(&plan, stdout);
        int update_threads = strata_offload_cpu_threads(cfg, t->dev);
        if (cfg->offload.optimizer != STRATA_OFFLOAD_NONE && update_threads > 0)
            STRATA_INFO("offload", "the CPU's update runs on %d thread%s (offload.cpu_threads%s)", update_threads,
                        update_threads == 1 ? "" : "s",
                        cfg->offload.cpu_threads ? "" : ": auto, every core but 2 beside the GPU");
        check_checkpoint_space(t);
        check_keep_best(t);
    }
    if (strata_arena_commit(&t->arena)) fatal(t, "allocating the memory plan");
    return 0;
}

/* What the run does with the examples packed into its sequences: kept apart (the shards
 * mark where they start and data.document_mask is on), or not, and why. */
static void say_documents(trainer *t) {
    const strata_config *cfg = &t->cfg;
    int marked = t->train.has_docs || (t->have_val && t->val.has_docs);
    int unmarked = t->train.unmarked_packed || (t->have_val && t->val.unmarked_packed);
    if (t->rank) return;
    if (marked && cfg->data.document_mask) {
        STRATA_INFO("data", "packed examples are kept apart: each attends only within itself, its positions from 0 "
                            "(data.document_mask; the shards mark where each starts)");
        if (t->dev->caps.gpu)
            STRATA_WARN("data", "data.document_mask on packed examples has not yet run on a GPU (its rows of "
                                "docs/gpu-matrix.md wait for the next check); the CPU backend checks it against "
                                "each example alone");
    } else if (marked) {
        STRATA_INFO("data", "data.document_mask: false: each packed example attends to the ones packed before it in "
                            "its sequence");
    }
    if (unmarked && cfg->data.document_mask)
        STRATA_WARN("data", "the shards of %s were packed from examples by a `strata prepare` that did not mark "
                            "where each starts: each attends to the ones packed before it; prepare them again to "
                            "keep them apart", t->train.unmarked_packed ? cfg->data.train : cfg->data.val);
}

/* The data loaders. Returns an exit code (0: go on): a path that names no shard file
 * (nothing matches, a directory, a device) is a config error, a bad shard a failure. */
static int open_data(trainer *t) {
    const strata_config *cfg = &t->cfg;
    int T = strata_config_seq_len(cfg);
    int rc = strata_loader_open(&t->train, cfg->data.train, T, cfg->model.vocab_size, cfg->data.shuffle, cfg->train.seed);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", strata_error());
        strata_fail("%s (text becomes shards with `strata prepare --text FILE... --out DIR`)", why);
        if (rc != STRATA_DATA_NOT_SHARDS) fatal(t, "opening the training data (data.train)");
        /* every rank opens its own data, so the rank that failed says so */
        strata_log(STRATA_LOG_ERROR, "train", "opening the training data (data.train): %s", strata_error());
        return STRATA_EXIT_USAGE;
    }
    t->have_train = 1;
    if (cfg->data.val[0]) {
        rc = strata_loader_open(&t->val, cfg->data.val, T, cfg->model.vocab_size, 0, cfg->train.seed);
        if (rc && rc != STRATA_DATA_NOT_SHARDS) fatal(t, "opening the validation data (data.val)");
        if (rc) {
            strata_log(STRATA_LOG_ERROR, "train", "opening the validation data (data.val): %s", strata_error());
            return STRATA_EXIT_USAGE;
        }
        t->have_val = 1;
    }
    say_documents(t);
    return 0;
}

/* Where training starts: a checkpoint (--resume), pretrained weights (model.init_from) or
 * the seeded init. Sets t->start, t->tokens_seen and t->rng. */
static void restore_state(trainer *t) {
    const strata_config *cfg = &t->cfg;
    strata_rng_seed(&t->rng, cfg->train.seed);
    if (t->cli.resume) {
        char dir[STRATA_PATH_MAX];
        if (strata_ckpt_resolve(t->cli.resume, cfg->run.dir, dir, sizeof dir)) fatal(t, "resolving --resume");
        int bad_manifest = 0;
        strata_ckpt *ck = strata_ckpt_open_checked(dir, &bad_manifest);
        if (!ck && bad_manifest) { /* an edited manifest is bad input, not a failed run */
            strata_log(STRATA_LOG_ERROR, "train", "--resume: %s", strata_error());
            if (t->world > 1) strata_mpi_abort(STRATA_EXIT_USAGE);
            exit(STRATA_EXIT_USAGE);
        }
        if (!ck) fatal(t, "opening the checkpoint");
        if (strata_engine_load(t->engine, ck)) fatal(t, "loading the checkpoint");
        const strata_ckpt_meta *meta = strata_ckpt_get_meta(ck);
        t->start = meta->step;
        t->tokens_seen = meta->tokens_seen;
        t->rng.state = meta->rng_state;
        if (t->rank == 0)
            STRATA_INFO("train", "resumed from %s (step %lld, saved at world %d stage %d)", dir, (long long)t->start,
                        meta->world, meta->stage);
        strata_ckpt_close(ck);
    } else if (cfg->model.init_from[0]) {
        /* pretrained weights, each rank reading only its own shard of every unit */
        strata_pretrained *pt = strata_pretrained_open(cfg->model.init_from, &t->m);
        if (!pt || strata_engine_init_from(t->engine, strata_pretrained_read, pt)) fatal(t, "loading model.init_from");
        if (t->rank == 0) STRATA_INFO("train", "initialised from %s: %s", cfg->model.init_from, strata_pretrained_describe(pt));
        STRATA_DEBUG("train", "model.init_from: this rank read %zu of the model's %zu parameters",
                     strata_pretrained_elements_read(pt), strata_model_num_params(&t->m));
        strata_pretrained_close(pt);
    } else if (strata_engine_init_params(t->engine, cfg->train.seed)) {
        fatal(t, "initialising parameters");
    }
    /* a kernel that found no memory while the state was set up leaves it incomplete */
    char setup_fault[1024];
    if (strata_fault_take(setup_fault, sizeof setup_fault) != STRATA_FAULT_NONE) {
        strata_fail("%s", setup_fault);
        fatal(t, t->cli.resume ? "loading the checkpoint" : "initialising parameters");
    }
}

/* The TensorBoard tag of each figure of metrics.jsonl's lines: how a step's line becomes
 * its event, here and when a resume writes lost events again from the lines. */
static const struct {
    const char *key, *tag;
} FIGURE_TAGS[] = {
    {"loss", "loss/train"}, {"val_loss", "loss/val"}, {"lr", "optim/lr"}, {"grad_norm", "optim/grad_norm"},
    {"tokens_per_s", "speed/tokens_per_s"}, {"step_ms", "speed/step_ms"}, {"tflops", "speed/tflops"},
    {"tokens", "progress/tokens"}, {"learned_tokens", "progress/learned_tokens"},
    {"peak_mem_bytes", "memory/peak_mem_bytes"}, {"mem_params", "memory/mem_params"},
    {"mem_grads", "memory/mem_grads"}, {"mem_optimizer", "memory/mem_optimizer"},
    {"mem_activations", "memory/mem_activations"}, {"mem_buffers", "memory/mem_buffers"},
    {"plan_device_bytes", "memory/plan_device_bytes"}, {"rss_bytes", "memory/rss_bytes"},
    {"plan_pinned_bytes", "memory/plan_pinned_bytes"}, {"pinned_bytes", "memory/pinned_bytes"},
    {"device_used_bytes", "memory/device_used_bytes"}, {"device_used_peak_bytes", "memory/device_used_peak_bytes"},
    {"plan_device_total_bytes", "memory/plan_device_total_bytes"},
    {"device_used_vs_plan_pct", "memory/device_used_vs_plan_pct"},
    {"comm_bytes", "comm/comm_bytes"}, {"comm_allreduce_bytes", "comm/comm_allreduce_bytes"},
    {"comm_reduce_scatter_bytes", "comm/comm_reduce_scatter_bytes"}, {"comm_allgather_bytes", "comm/comm_allgather_bytes"},
    {"comm_broadcast_bytes", "comm/comm_broadcast_bytes"},
    {"compute_ms", "time/compute_ms"}, {"comm_wait_ms", "time/comm_wait_ms"},
    {"offload_wait_ms", "time/offload_wait_ms"}, {"data_ms", "time/data_ms"},
    {"compute_busy_ms", "offload/compute_busy_ms"}, {"offload_gather_h2d_bytes", "offload/offload_gather_h2d_bytes"},
#define SPLIT_TAG_(f) {"offload_" #f, "offload/offload_" #f},
    STRATA_TIER_SECONDS(SPLIT_TAG_) STRATA_TIER_COUNTS(SPLIT_TAG_)
#undef SPLIT_TAG_
};

/* The tag of metrics.jsonl's figure `key`, or NULL for what is no scalar (the plan, memory.auto's choice). */
static const char *figure_tag(const char *key) {
    for (size_t i = 0; i < sizeof FIGURE_TAGS / sizeof FIGURE_TAGS[0]; i++)
        if (!strcmp(FIGURE_TAGS[i].key, key)) return FIGURE_TAGS[i].tag;
    return NULL;
}

/* A resume whose events lost their last steps to a torn record (a run killed, or a machine
 * lost, while writing one) while metrics.jsonl kept them: those steps' events are written
 * again from metrics.jsonl's lines (cut back to the resumed step already), the same numbers
 * under the same tags, so TensorBoard shows every step once. A line that is not JSON is
 * skipped, saying so: an event is not worth a run. */
static int rewrite_lost_events(trainer *t) {
    int64_t kept = strata_tb_last_kept(t->tb), first = 0, last = 0;
    if (kept >= t->start) return 0;
    FILE *in = fopen(t->metrics_path, "r");
    if (!in) return errno == ENOENT ? 0 : strata_fail("%s: cannot read: %s", t->metrics_path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0, at = 0;
    while (!rc && (n = getline(&line, &cap, in)) > 0) {
        at++;
        char name[sizeof t->metrics_path + 32];
        snprintf(name, sizeof name, "%s line %d", t->metrics_path, at);
        strata_json_doc doc;
        if (strata_json_parse(&doc, line, (size_t)n, name)) {
            STRATA_WARN("tb", "%s; its event is not written again", strata_error());
            continue;
        }
        const strata_json *step = strata_json_get(&doc.root, "step");
        if (step && step->type == STRATA_JSON_NUMBER && step->is_int && step->integer > kept &&
            step->integer <= t->start) {
            strata_tb_scalar v[64];
            int nv = 0;
            for (size_t i = 0; i < doc.root.len && nv < (int)(sizeof v / sizeof v[0]); i++) {
                const strata_json_member *m = &doc.root.members[i];
                const char *tag = figure_tag(m->key);
                if (tag && m->value.type == STRATA_JSON_NUMBER) v[nv++] = (strata_tb_scalar){tag, (float)m->value.number};
            }
            rc = strata_tb_write_scalars(t->tb, step->integer, v, nv);
            if (!first) first = step->integer;
            last = step->integer;
        }
        strata_json_free(&doc);
    }
    free(line);
    (void)fclose(in); /* read-only */
    if (!rc && first)
        STRATA_INFO("tb", "steps %lld-%lld written again from %s: a torn record had taken their events",
                    (long long)first, (long long)last, t->metrics_path);
    return rc;
}

/* The TensorBoard events (run.tensorboard; in run.tensorboard_dir, else run.dir), cut back
 * to the resumed step as metrics.jsonl is (io/tensorboard.h), and the memory plan as text
 * at the step this run starts from (TensorBoard's text plugin renders it as Markdown). */
static int open_events(trainer *t) {
    const strata_config *cfg = &t->cfg;
    const char *dir = cfg->run.tensorboard_dir[0] ? cfg->run.tensorboard_dir : cfg->run.dir;
    if (strata_tb_open(&t->tb, dir, t->cli.resume ? t->start : -1)) return -1;
    if (t->cli.resume && rewrite_lost_events(t)) return -1;
    char *plan = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&plan, &len);
    if (!m) return strata_fail("the memory plan's text: out of host memory");
    fprintf(m, "The memory plan of rank 0, from step %lld%s%s:\n\n```\n", (long long)t->start,
            t->auto_change[0] ? "; memory.auto chose " : "", t->auto_change);
    strata_plan_print(&t->plan, m);
    fprintf(m, "```\n");
    if (fclose(m) != 0) {
        free(plan);
        return strata_fail("the memory plan's text: out of host memory");
    }
    int rc = strata_tb_write_text(t->tb, t->start, "memory_plan", plan);
    free(plan);
    return rc;
}

/* metrics.jsonl (cut back to the resumed step), the TensorBoard events and the run's
 * tokenizer, in run.dir (claim_run_dir made it): rank 0's. */
static void open_run_dir(trainer *t) {
    const strata_config *cfg = &t->cfg;
    if (t->rank != 0) return;
    char *path = t->metrics_path;
    snprintf(path, sizeof t->metrics_path, "%s/metrics.jsonl", cfg->run.dir);
    if (t->cli.resume && metrics_truncate(path, t->start)) fatal(t, "resuming metrics");
    char tmp[STRATA_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path); /* a killed resume's */
    if (unlink(tmp) == 0) STRATA_INFO("train", "removed %s, left by a run killed while resuming", tmp);
    t->metrics = fopen(path, t->cli.resume ? "a" : "w");
    if (!t->metrics) { strata_fail("%s: %s", path, strerror(errno)); fatal(t, "opening metrics"); }
    struct stat st;
    t->metrics_good_bytes = fstat(fileno(t->metrics), &st) == 0 && S_ISREG(st.st_mode) ? (long)st.st_size : 0;
    if (cfg->run.tensorboard && open_events(t)) fatal(t, "opening the TensorBoard events");
    if (t->tokenizer && strata_run_tokenizer_record(cfg, t->tokenizer)) fatal(t, "recording the tokenizer");
}

/* ---- the kernel profile (STRATA_PROFILE=kernels, core/profile.h) ---- */

/* At the end of a run, rank 0: this rank's kernel groups per step (the engine read their
 * events a step late; the last step's are read here, after the run's final sync). */
static void report_kernel_profile(trainer *t) {
    if (!t->kernel_profile || t->rank != 0) return;
    strata_prof_report r;
    if (strata_engine_kernel_profile(t->engine, &r)) {
        STRATA_WARN("prof", "no kernel profile: %s", strata_error());
        return;
    }
    strata_prof_print(&r, t->world > 1 ? "[rank 0] [prof] " : "[prof] ", stdout);
    fflush(stdout);
}

/* What one step measured, for the progress line and metrics.jsonl. */
typedef struct step_figures {
    int64_t done;           /* steps completed, this one included */
    strata_step_result r;
    double ms;              /* the step, wall clock */
    double val_loss;        /* NaN unless eval_now */
    int eval_now;
    uint64_t comm_bytes;    /* this rank's collective traffic in the step (ring accounting) */
    uint64_t coll_bytes[STRATA_COLL_KINDS]; /* the same by kind of collective */
} step_figures;

static void print_progress(trainer *t, const step_figures *f, double run_t0) {
    const strata_config *cfg = &t->cfg;
    int64_t steps = cfg->train.steps;
    if (!(f->done % cfg->train.log_every == 0 || f->done == steps || f->done == t->start + 1 || f->eval_now)) return;
    double eta_s = (strata_now_ms() - run_t0) / 1e3 / (double)(f->done - t->start) * (double)(steps - f->done);
    char eta[32], vbuf[48] = "";
    fmt_eta(eta, sizeof eta, eta_s);
    if (f->eval_now) snprintf(vbuf, sizeof vbuf, " | val %.4f", f->val_loss);
    strata_out_printf(stdout, "step %6lld/%lld | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms | eta %s\n",
                      (long long)f->done, (long long)steps, f->r.loss, vbuf, f->r.lr, f->r.grad_norm,
                      t->tokens_per_step / (f->ms / 1e3), f->ms, eta);
}

/* A write to metrics.jsonl failed: put the file back to its last complete line (so it
 * stays one JSON object per line), drop what stdio still holds, and fail naming the
 * file and errno. */
static int metrics_failed(trainer *t, int e) {
    FILE *m = t->metrics;
    __fpurge(m);
    struct stat st;
    if (fstat(fileno(m), &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fileno(m), (off_t)t->metrics_good_bytes) != 0)
        STRATA_WARN("train", "%s: cannot cut back its partial last line: %s", t->metrics_path, strerror(errno));
    return strata_fail("writing %s failed: %s (errno %d)", t->metrics_path, strerror(e), e);
}

/* A step's record as it is made: metrics.jsonl's line, and the scalars of its event. */
typedef struct step_record {
    FILE *line;
    strata_tb_scalar tb[64];
    int n_tb;
} step_record;

/* `, "key": value` into the line, printed with fmt; the same number (as printed, so both
 * files say the same) becomes the event's scalar under the key's tag. */
static void figure(step_record *r, const char *key, const char *fmt, double v) {
    char num[32];
    snprintf(num, sizeof num, fmt, v);
    fprintf(r->line, ", \"%s\": %s", key, num);
    const char *tag = figure_tag(key);
    STRATA_ASSERT(tag && r->n_tb < (int)(sizeof r->tb / sizeof r->tb[0]));
    r->tb[r->n_tb].tag = tag;
    r->tb[r->n_tb].value = (float)strtod(num, NULL);
    r->n_tb++;
}

/* The start of step `step`'s record (rank 0): metrics.jsonl's line opened on its step. NULL
 * line when out of host memory. */
static step_record open_record(char **text, size_t *len, int64_t step) {
    step_record rec = {.line = open_memstream(text, len)};
    if (rec.line) fprintf(rec.line, "{\"step\": %lld", (long long)step);
    return rec;
}

/* The record of step `step` closed and written: its line to metrics.jsonl, flushed, its
 * scalars as one TensorBoard event; an event that cannot be written takes the line back
 * too, so both records end at the same step. 0 or -1 + error, t->record_failed naming the
 * file. */
static int commit_record(trainer *t, int64_t step, step_record *rec, char **text, size_t *len) {
    fprintf(rec->line, "}\n");
    if (fclose(rec->line) != 0) {
        free(*text);
        return strata_fail("metrics: out of host memory for a line");
    }
    errno = 0;
    int bad = fwrite(*text, 1, *len, t->metrics) != *len || fflush(t->metrics) != 0;
    int e = errno ? errno : EIO;
    free(*text);
    if (bad) return metrics_failed(t, e);
    if (t->tb && strata_tb_write_scalars(t->tb, step, rec->tb, rec->n_tb)) {
        snprintf(t->record_failed, sizeof t->record_failed, "the TensorBoard events (%s)", strata_tb_path(t->tb));
        char why[1200];
        snprintf(why, sizeof why, "%s", strata_error());
        /* the line just written goes too: both records end at the previous step */
        if (ftruncate(fileno(t->metrics), (off_t)t->metrics_good_bytes) != 0 ||
            fseek(t->metrics, t->metrics_good_bytes, SEEK_SET) != 0)
            STRATA_WARN("train", "%s: cannot take back step %lld's line: %s", t->metrics_path, (long long)step,
                        strerror(errno));
        return strata_fail("%s (metrics.jsonl's line of this step is taken back, so both end at step %lld)", why,
                           (long long)step - 1);
    }
    t->metrics_good_bytes += (long)*len;
    return 0;
}

/* The plan this run allocated, once per run (its first row): bytes per tier and category
 * (the five of `strata plan`'s table), each tier's capacity (0: unknown) and the device's
 * runtime row. metrics.jsonl's rows carry what a step measured; what the plan holds and
 * what each tier can hold are fixed for the life of a run, so they are written once, in
 * the row a resume starts from, and `strata plot` draws memory against them. */
static void write_plan(FILE *m, const strata_plan *p) {
    static const char *const tiers[STRATA_TIERS] = {"device", "pinned", "host", "nvme"};
    fprintf(m, ", \"plan\": {\"world\": %d, \"stage\": %d", p->world, p->stage);
    for (int i = 0; i < STRATA_TIERS; i++) {
        size_t buffers = 0;
        for (int c = STRATA_CAT_COMM; c < STRATA_CAT_COUNT; c++) buffers += p->bytes[i][c];
        fprintf(m, ", \"%s\": {\"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, \"activations\": %zu, "
                "\"buffers\": %zu, ", tiers[i], p->bytes[i][STRATA_CAT_PARAMS], p->bytes[i][STRATA_CAT_GRADS],
                p->bytes[i][STRATA_CAT_OPTIMIZER], p->bytes[i][STRATA_CAT_ACTIVATIONS], buffers);
        if (i == STRATA_TIER_DEVICE) fprintf(m, "\"runtime\": %zu, ", p->runtime_bytes);
        fprintf(m, "\"capacity\": %zu}", p->capacity[i]);
    }
    fprintf(m, "}");
}

/* One line of metrics.jsonl per step (rank 0): the step's figures, memory against the plan;
 * and the same figures as one event of the TensorBoard events. Every write is checked and
 * the line flushed; an event that cannot be written takes the step's line back too, so
 * both records end at the same step. 0 or -1 + error, t->record_failed naming the file. */
static int write_metrics(trainer *t, const step_figures *f) {
    const strata_step_result *r = &f->r;
    double tok_s = t->tokens_per_step / (f->ms / 1e3);
    strata_engine_memory mem = strata_engine_get_memory(t->engine);
    size_t used = device_used(t), predicted = t->planned_device + t->planned_runtime, rss = rss_bytes();
    if (rss > t->rss_peak) t->rss_peak = rss;
    if (used > t->device_used_peak) t->device_used_peak = used;
    snprintf(t->record_failed, sizeof t->record_failed, "metrics.jsonl");
    /* the line is made in memory and written at once, so the write's errno is its own */
    char *text = NULL;
    size_t len = 0;
    step_record rec = open_record(&text, &len, f->done);
    FILE *m = rec.line;
    if (!m) return strata_fail("metrics: out of host memory for a line");
    figure(&rec, "loss", "%.9g", r->loss);
    if (f->eval_now) figure(&rec, "val_loss", "%.9g", f->val_loss);
    figure(&rec, "lr", "%.9g", r->lr);
    figure(&rec, "grad_norm", "%.9g", r->grad_norm);
    figure(&rec, "tokens_per_s", "%.1f", tok_s);
    figure(&rec, "step_ms", "%.3f", f->ms);
    figure(&rec, "tflops", "%.3f",
           tok_s * strata_model_flops_per_token(&t->m, strata_config_seq_len(&t->cfg)) / 1e12);
    figure(&rec, "tokens", "%.0f", t->tokens_seen);
    figure(&rec, "learned_tokens", "%.0f", (double)r->learned_tokens);
    figure(&rec, "peak_mem_bytes", "%.0f", (double)t->dev->mem[STRATA_MEM_DEVICE].peak_bytes);
    figure(&rec, "mem_params", "%.0f", (double)mem.params);
    figure(&rec, "mem_grads", "%.0f", (double)mem.grads);
    figure(&rec, "mem_optimizer", "%.0f", (double)mem.optimizer);
    figure(&rec, "mem_activations", "%.0f", (double)mem.activations);
    figure(&rec, "mem_buffers", "%.0f", (double)mem.buffers);
    figure(&rec, "plan_device_bytes", "%.0f", (double)t->planned_device);
    figure(&rec, "rss_bytes", "%.0f", (double)rss);
    figure(&rec, "plan_pinned_bytes", "%.0f", (double)t->planned_pinned);
    figure(&rec, "pinned_bytes", "%.0f", (double)t->dev->mem[STRATA_MEM_PINNED].live_bytes);
    figure(&rec, "comm_bytes", "%.0f", (double)f->comm_bytes);
    if (t->world > 1) { /* the same by collective (a barrier moves none) */
        figure(&rec, "comm_allreduce_bytes", "%.0f", (double)f->coll_bytes[STRATA_COLL_ALLREDUCE]);
        figure(&rec, "comm_reduce_scatter_bytes", "%.0f", (double)f->coll_bytes[STRATA_COLL_REDUCE_SCATTER]);
        figure(&rec, "comm_allgather_bytes", "%.0f", (double)f->coll_bytes[STRATA_COLL_ALLGATHER]);
        figure(&rec, "comm_broadcast_bytes", "%.0f", (double)f->coll_bytes[STRATA_COLL_BROADCAST]);
    }
    figure(&rec, "compute_ms", "%.3f", f->ms - r->comm_wait_ms - r->offload_wait_ms - r->data_ms);
    figure(&rec, "comm_wait_ms", "%.3f", r->comm_wait_ms);
    figure(&rec, "offload_wait_ms", "%.3f", r->offload_wait_ms);
    figure(&rec, "data_ms", "%.3f", r->data_ms);
    /* the device as nvidia-smi sees it (CUDA) against the plan's prediction of it */
    figure(&rec, "device_used_bytes", "%.0f", (double)used);
    figure(&rec, "device_used_peak_bytes", "%.0f", (double)t->device_used_peak);
    figure(&rec, "plan_device_total_bytes", "%.0f", (double)predicted);
    figure(&rec, "device_used_vs_plan_pct", "%.3f",
           percent_off(t->device_used_peak, predicted));
    if (f->done == t->start + 1) write_plan(m, &t->plan);
    if (t->auto_change[0] && f->done == t->start + 1) strata_auto_write_metrics(&t->autosel, t->auto_change, m);
    if (r->have_split) { /* the offload split: this rank's, the previous step's update (see strata_step_result) */
        figure(&rec, "compute_busy_ms", "%.3f", r->compute_ms);
        figure(&rec, "offload_gather_h2d_bytes", "%.0f", (double)r->gather_h2d_bytes);
#define SPLIT_SECONDS_(f) figure(&rec, "offload_" #f, "%.6f", r->tier.f);
#define SPLIT_COUNTS_(f) figure(&rec, "offload_" #f, "%.0f", (double)r->tier.f);
        STRATA_TIER_SECONDS(SPLIT_SECONDS_)
        STRATA_TIER_COUNTS(SPLIT_COUNTS_)
#undef SPLIT_SECONDS_
#undef SPLIT_COUNTS_
    }
    return commit_record(t, f->done, &rec, &text, &len);
}


/* A step whose loss is not finite: a device fault on some rank (checkpoint what is intact,
 * exit 4) or a diverged run (stop, exit 1). Every rank comes here together. */
static int nonfinite_step(trainer *t, int64_t step, const strata_step_result *r, double last_loss, int64_t last_saved) {
    /* a device fault poisons the step's loss (shard/engine.c): is that what this is, on
     * any rank? (every rank asks, so a collective checkpoint can follow) */
    double faulted = strata_fault_peek(NULL, 0) != STRATA_FAULT_NONE;
    if (t->world > 1 && strata_allreduce_host_f64(t->comm, &faulted, 1)) fatal(t, "agreeing on a device fault");
    if (faulted > 0) return out_of_memory(t, step, last_loss);
    if (t->rank == 0)
        STRATA_ERROR("train", "step %lld: loss %g, gradient norm %g: not finite, so the update was skipped "
                     "and the run stops here; the last good checkpoint is %s. Lower optim.lr or set "
                     "optim.grad_clip.", (long long)step + 1, r->loss, r->grad_norm,
                     last_saved >= 0 ? "intact" : "absent (none was saved yet)");
    return STRATA_EXIT_ERROR;
}

/* metrics.jsonl or the TensorBoard events could not be written (rank 0 said why, and which
 * in t->record_failed): every rank saves what is intact (this may fail too on a full disk;
 * the last good checkpoint is never touched), then the run ends with exit 1. Every rank
 * comes here together. */
static int metrics_stop(trainer *t, int64_t done, double loss, int64_t last_saved) {
    char dir[STRATA_PATH_MAX] = "";
    strata_signals_doing(STRATA_DOING_SAVE);
    int saved = save_checkpoint(t, done, loss, NAN, dir, sizeof dir) == 0;
    if (saved) strata_signals_saved(done);
    if (t->rank != 0) return STRATA_EXIT_ERROR;
    if (saved)
        STRATA_ERROR("train", "stopped after step %lld because %s could not be written; step %lld is "
                     "saved in %s. Free space, then resume with --resume latest.", (long long)done, t->record_failed,
                     (long long)done, dir);
    else
        STRATA_ERROR("train", "stopped after step %lld because %s could not be written, and the checkpoint "
                     "of this step failed too (%s). %s Free space, then resume with --resume latest.",
                     (long long)done, t->record_failed, strata_error(),
                     last_saved >= 0 ? "The last good checkpoint is intact." : "No checkpoint had been written yet.");
    return STRATA_EXIT_ERROR;
}

/* The micro-batches of a validation pass: train.eval_batches, or for 0 every sequence of
 * data.val that fills a whole micro-batch on every rank (at least one micro-batch). */
static int eval_batches(const trainer *t) {
    const strata_config *cfg = &t->cfg;
    if (cfg->train.eval_batches > 0) return cfg->train.eval_batches;
    uint64_t per = (uint64_t)cfg->train.micro_batch * (uint64_t)t->world, n = t->val.n_chunks / per;
    return n < 1 ? 1 : n > INT_MAX ? INT_MAX : (int)n;
}

/* Step `step`'s validation loss into the early stop's count (every rank, with the same loss):
 * 1 when train.early_stop_patience validations in a row have not come below the lowest. */
static int early_stop_count(trainer *t, int64_t step, double val_loss) {
    const strata_config *cfg = &t->cfg;
    if (isnan(val_loss)) return 0;
    if (isnan(t->es_best) || val_loss < t->es_best - cfg->train.early_stop_min_delta) {
        t->es_best = val_loss;
        t->es_best_step = step;
        t->es_since = 0;
    } else {
        t->es_since++;
    }
    return cfg->train.early_stop_patience > 0 && t->es_since >= cfg->train.early_stop_patience;
}

/* A resumed run's early stop goes on counting where the run was: rank 0 replays the
 * validations metrics.jsonl holds (cut back to the resumed step), every rank takes its
 * count. */
static void early_stop_resume(trainer *t) {
    const strata_config *cfg = &t->cfg;
    if (cfg->train.early_stop_patience < 1 || !t->cli.resume) return;
    double s[4] = {0, 0, 0, 0}; /* have, best, best step, since: rank 0's */
    if (t->rank == 0) {
        FILE *f = fopen(t->metrics_path, "r");
        char *line = NULL;
        size_t cap = 0;
        while (f && getline(&line, &cap, f) > 0) {
            const char *v = strstr(line, "\"val_loss\":"), *st = strstr(line, "\"step\":");
            if (v && st) early_stop_count(t, atoll(st + 7), strtod(v + 11, NULL));
        }
        free(line);
        if (f) fclose(f);
        if (!isnan(t->es_best)) s[0] = 1, s[1] = t->es_best, s[2] = (double)t->es_best_step, s[3] = t->es_since;
        if (s[0])
            STRATA_INFO("train", "train.early_stop_patience %d: the lowest validation loss so far is %.4f (step %lld), "
                        "%d validation%s since without a lower one", cfg->train.early_stop_patience, t->es_best,
                        (long long)t->es_best_step, t->es_since, t->es_since == 1 ? "" : "s");
        else
            STRATA_INFO("train", "train.early_stop_patience %d: %s holds no validation before step %lld, so the count "
                        "starts with this run's", cfg->train.early_stop_patience, t->metrics_path, (long long)t->start);
    }
    if (t->world > 1 && strata_allreduce_host_f64(t->comm, s, 4)) fatal(t, "agreeing on the early stop's count");
    t->es_best = s[0] ? s[1] : NAN;
    t->es_best_step = (int64_t)s[2];
    t->es_since = (int)s[3];
}

/* A validation pass before the first step (train.eval_at_start; auto: a run that starts
 * from model.init_from), so the curve starts where the weights did: rank 0 prints it and
 * records it as step 0 (metrics.jsonl's row of val_loss alone, and its event). Every rank
 * comes here together. Returns an exit code (0: go on). */
static int validate_at_start(trainer *t) {
    const strata_config *cfg = &t->cfg;
    int want = cfg->train.eval_at_start == STRATA_EVAL_START_AUTO ? cfg->model.init_from[0] != 0
                                                                   : cfg->train.eval_at_start == STRATA_EVAL_START_TRUE;
    if (!want || !t->have_val || t->cli.resume || t->start != 0) return 0;
    int n = eval_batches(t);
    double val_loss = NAN;
    strata_signals_doing(STRATA_DOING_EVAL);
    if (t->rank == 0) STRATA_DEBUG("train", "validation before the first step, %d batches", n);
    int ev = strata_engine_eval(t->engine, &t->val, n, &val_loss);
    if (ev < 0) fatal(t, "validation before the first step");
    if (ev == STRATA_ENGINE_STOPPED) { /* the first step's agreement stops the run */
        if (t->rank == 0) STRATA_INFO("train", "validation before the first step abandoned: a stop was asked for");
        return 0;
    }
    early_stop_count(t, 0, val_loss); /* the weights the run starts from: the first to beat */
    double failed = 0;
    if (t->rank == 0) {
        strata_out_printf(stdout, "step %6d/%lld | val %.4f (before training, %d batches)\n", 0,
                          (long long)cfg->train.steps, val_loss, n);
        char *text = NULL;
        size_t len = 0;
        step_record rec = open_record(&text, &len, 0);
        if (!rec.line) {
            strata_fail("metrics: out of host memory for a line");
            failed = 1;
        } else {
            figure(&rec, "val_loss", "%.9g", val_loss);
            failed = commit_record(t, 0, &rec, &text, &len) != 0;
        }
        if (failed) strata_log(STRATA_LOG_ERROR, "train", "before the first step: %s", strata_error());
    }
    if (t->world > 1 && strata_allreduce_host_f64(t->comm, &failed, 1)) fatal(t, "agreeing on the first record");
    if (failed && t->rank == 0)
        STRATA_ERROR("train", "stopped before the first step because %s could not be written; nothing was trained",
                     t->record_failed);
    return failed ? STRATA_EXIT_ERROR : 0;
}

/* The steps from t->start to train.steps, with validation, metrics and checkpoints; stops
 * early on a signal (every rank agrees first), a non-finite step or a metrics write that
 * fails. Returns an exit code. */
static int train_loop(trainer *t) {
    const strata_config *cfg = &t->cfg;
    int64_t steps = cfg->train.steps, last_saved = t->cli.resume ? t->start : -1;
    double loss = NAN, run_t0 = strata_now_ms();
    strata_signals_saved(last_saved);
    early_stop_resume(t);
    int rc = validate_at_start(t);
    if (rc) return rc;
    run_t0 = strata_now_ms(); /* the ETA counts steps, not the validation before them */
    for (int64_t step = t->start; step < steps; step++) {
        step_figures f = {.done = step + 1, .val_loss = NAN};
        __atomic_store_n(&t->step_now, step + 1, __ATOMIC_RELAXED);
        strata_signals_step(step + 1);
        strata_signals_doing(STRATA_DOING_STEP);
        double t0 = strata_now_ms();
        strata_comm_stats cs0 = strata_comm_get_stats(t->comm);
        if (strata_engine_step(t->engine, &t->train, step, &f.r)) fatal(t, "training"); /* the error names the step */
        f.ms = strata_now_ms() - t0;
        strata_offload_split_add(&t->split, &f.r, f.ms);
        strata_comm_stats cs1 = strata_comm_get_stats(t->comm);
        for (int k = 0; k < STRATA_COLL_KINDS; k++) {
            f.coll_bytes[k] = cs1.bytes[k] - cs0.bytes[k];
            f.comm_bytes += f.coll_bytes[k];
        }
        if (f.r.nonfinite) return nonfinite_step(t, step, &f.r, loss, last_saved);
        update_fault(t, step);
        loss = f.r.loss;
        t->tokens_seen += t->tokens_per_step;
        f.eval_now = t->have_val && ((cfg->train.eval_every > 0 && f.done % cfg->train.eval_every == 0) || f.done == steps);
        strata_signals_doing(STRATA_DOING_EVAL);
        if (f.eval_now) {
            int n = eval_batches(t);
            if (t->rank == 0) STRATA_DEBUG("train", "step %lld: validation, %d batches", (long long)f.done, n);
            int ev = strata_engine_eval(t->engine, &t->val, n, &f.val_loss);
            if (ev < 0) fatal(t, "validation");
            if (ev == STRATA_ENGINE_STOPPED) { /* a stop on some rank: every rank left it at the same batch */
                f.eval_now = 0;
                if (t->rank == 0)
                    STRATA_INFO("train", "validation of step %lld abandoned: a stop was asked for", (long long)f.done);
            }
        }
        int early = f.eval_now && early_stop_count(t, f.done, f.val_loss);
        /* agree[0]: a stop signal on some rank; agree[1]: rank 0 could not write metrics or events */
        double agree[2] = {0, 0};
        /* asked to stop: the progress line waits until the stop checkpoint is written, since
         * a terminal that is gone or blocked must not stand before it */
        int progress_later = strata_signals_stop_requested() != 0;
        if (t->rank == 0) {
            if (!progress_later) print_progress(t, &f, run_t0);
            if (write_metrics(t, &f)) {
                strata_log(STRATA_LOG_ERROR, "train", "step %lld: %s", (long long)f.done, strata_error());
                agree[1] = 1;
            }
        }
        /* every rank must agree to stop, or some would wait in a collective for the others */
        strata_signals_doing(STRATA_DOING_AGREE);
        agree[0] = strata_signals_stop_requested() ? 1.0 : 0.0;
        if (t->world > 1 && strata_allreduce_host_f64(t->comm, agree, 2)) fatal(t, "agreeing on a stop");
        if (agree[1] > 0) return metrics_stop(t, f.done, loss, last_saved);
        double stop = agree[0];
        int periodic = cfg->run.checkpoint_every > 0 && f.done % cfg->run.checkpoint_every == 0;
        if (periodic || ((f.done == steps || early) && cfg->run.checkpoint_at_end) || stop > 0) {
            char dir[STRATA_PATH_MAX];
            strata_signals_doing(STRATA_DOING_SAVE);
            if (save_checkpoint(t, f.done, loss, f.eval_now ? f.val_loss : NAN, dir, sizeof dir))
                fatal(t, "saving a checkpoint");
            last_saved = f.done;
            strata_signals_saved(f.done);
        }
        if (progress_later && t->rank == 0) print_progress(t, &f, run_t0);
        if (stop > 0) {
            t->stopped = 1;
            if (t->rank == 0) STRATA_INFO("train", "stopped by signal after step %lld; resume with --resume latest", (long long)f.done);
            break;
        }
        if (early) {
            if (t->rank == 0 && cfg->train.early_stop_min_delta > 0)
                STRATA_INFO("train", "early stop after step %lld of %lld: %d validations in a row have not come %g below "
                            "%.4f, step %lld's validation loss (train.early_stop_patience %d, early_stop_min_delta %g)",
                            (long long)f.done, (long long)steps, t->es_since, cfg->train.early_stop_min_delta, t->es_best,
                            (long long)t->es_best_step, cfg->train.early_stop_patience, cfg->train.early_stop_min_delta);
            else if (t->rank == 0)
                STRATA_INFO("train", "early stop after step %lld of %lld: %d validations in a row have not come below "
                            "the lowest validation loss, %.4f at step %lld (train.early_stop_patience %d)",
                            (long long)f.done, (long long)steps, t->es_since, t->es_best, (long long)t->es_best_step,
                            cfg->train.early_stop_patience);
            break;
        }
    }
    /* the last step's offloaded update runs behind it; its errors must not go unseen */
    strata_signals_doing(STRATA_DOING_FINISH);
    if (strata_engine_sync(t->engine)) fatal(t, "finishing the last optimizer update");
    /* the file is complete only once it is closed without error */
    if (t->metrics) {
        int bad = fclose(t->metrics) != 0;
        int e = errno;
        t->metrics = NULL;
        if (bad) {
            strata_fail("closing %s failed: %s (errno %d)", t->metrics_path, strerror(e), e);
            strata_log(STRATA_LOG_ERROR, "train", "%s; the checkpoints are intact", strata_error());
            return STRATA_EXIT_ERROR;
        }
    }
    strata_tb_writer *tb = t->tb;
    t->tb = NULL;
    if (strata_tb_close(tb)) {
        strata_log(STRATA_LOG_ERROR, "train", "%s; the checkpoints are intact", strata_error());
        return STRATA_EXIT_ERROR;
    }
    return STRATA_EXIT_OK;
}

/* The final sample's sink: each token to the text, unless a stop was asked for (then the
 * sample ends at that token) or the text cannot be written. */
typedef struct sample_sink {
    strata_text_out out;
    int stopped;
} sample_sink;
static int sample_put(void *ctx, int32_t id) {
    sample_sink *s = ctx;
    if (strata_signals_stop_requested()) return s->stopped = 1;
    return strata_text_out_put(&s->out, id);
}

/* train.sample_tokens of text from the trained model (rank 0, parameters resident), on
 * stdout; none once stdout is gone. A stop signal ends it at the next token. */
static void final_sample(trainer *t) {
    const strata_config *cfg = &t->cfg;
    int n = cfg->train.sample_tokens;
    int32_t prompt[1];
    int n_prompt = 0, eot = t->tokenizer ? strata_bpe_special_id(t->tokenizer, "<|endoftext|>") : -1;
    if (cfg->model.vocab_size <= 256) prompt[n_prompt++] = '\n';
    else if (eot >= 0 && eot < cfg->model.vocab_size) prompt[n_prompt++] = eot; /* GPT-2's start of a text */
    strata_out_printf(stdout, "---- sample (%d tokens, temperature 0.8, top-k 40) ----\n", n);
    if (strata_out_lost(stdout)) {
        STRATA_INFO("train", "no sample: stdout is gone");
        return;
    }
    /* the text goes out a token at a time; a write that fails ends the sample (checked there) */
    sample_sink sink = {.stopped = 0};
    strata_text_out_init(&sink.out, stdout, cfg->model.vocab_size, NULL, t->tokenizer);
    int rc = strata_generate(&t->m, prompt, n_prompt, n, 0.8f, 40, &t->rng, sample_put, &sink);
    strata_text_out_finish(&sink.out);
    strata_out_printf(stdout, "\n----\n");
    if (sink.stopped) STRATA_INFO("train", "sample ended early: a stop was asked for");
    else if (rc) STRATA_WARN("train", "sample: %s", strata_error());
}

/* stdout or stderr is gone (core/common.h, strata_out_set_hook), rank 0: the run goes on,
 * and from a line saying when and why, every line it logs goes to run.dir/train.log too. This is the one place a run keeps such lines: metrics.jsonl holds one JSON row
 * per step, which its readers (resume, plot) count on. Runs under the output lock: no logging. */
static FILE *terminal_lost(const char *name, int err, void *arg) {
    trainer *t = arg;
    char path[STRATA_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/train.log", t->cfg.run.dir);
    if (!t->term_log && !(t->term_log = fopen(path, "a"))) return NULL; /* nowhere left to say it */
    char when[32] = "?";
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    int64_t step = __atomic_load_n(&t->step_now, __ATOMIC_RELAXED);
    char at[48] = "before the first step";
    if (step > 0) snprintf(at, sizeof at, "in step %lld", (long long)step);
    /* a failure here leaves nowhere to report it: the run goes on regardless */
    if (fprintf(t->term_log, "%s [train] %s is gone (%s, errno %d) %s: the run goes on, and what it would "
                "have written there follows here\n", when, name, strerror(err), err, at) > 0)
        (void)fflush(t->term_log);
    return t->term_log;
}

/* The checkpoint of the lowest validation loss (ckpt/best), at the end of a run (rank 0):
 * where it is and how to export it, or what removed it. */
static void report_best(const trainer *t) {
    char ckpt_dir[STRATA_PATH_MAX + 8], name[256], man[STRATA_PATH_MAX + 300];
    double val = NAN;
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", t->cfg.run.dir);
    int have = strata_ckpt_best(ckpt_dir, name, sizeof name, &val);
    if (have <= 0) {
        if (have < 0) STRATA_WARN("ckpt", "%s", strata_error());
        return;
    }
    snprintf(man, sizeof man, "%s/%s/manifest.yaml", ckpt_dir, name);
    if (strata_is_file(man))
        STRATA_INFO("ckpt", "the lowest validation loss of a saved step, %.4f, is %s/%s: `strata export %s/best --out DIR` "
                    "exports it", val, ckpt_dir, name, ckpt_dir);
    else
        STRATA_INFO("ckpt", "the lowest validation loss of a saved step, %.4f, was %s/%s, which run.keep has removed "
                    "(run.keep_best: true keeps it)", val, ckpt_dir, name);
}

/* The checkpoint run.export_dir gets (run.export_checkpoint) into `from`: RUN/ckpt/best,
 * or the run (its latest). -1 + said when best is asked for and there is none. */
static int choose_export(const trainer *t, char *from, size_t len) {
    const strata_config *cfg = &t->cfg;
    char ckpt_dir[STRATA_PATH_MAX + 8], out[STRATA_PATH_MAX + 300];
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", cfg->run.dir);
    snprintf(from, len, "%s", cfg->run.dir);
    if (cfg->run.export_checkpoint == STRATA_EXPORT_LATEST) return 0;
    if (strata_ckpt_resolve("best", cfg->run.dir, out, sizeof out) == 0) {
        snprintf(from, len, "%s/best", ckpt_dir);
        return 0;
    }
    if (cfg->run.export_checkpoint == STRATA_EXPORT_AUTO) {
        STRATA_INFO("train", "run.export_dir: the latest checkpoint (no best: %s)", strata_error());
        return 0;
    }
    from[0] = 0;
    STRATA_ERROR("train", "run.export_checkpoint best: %s; the run is complete, nothing was exported", strata_error());
    return -1;
}

/* `strata export FROM --out TO` once the run has ended (rank 0); an export that fails
 * leaves the run complete and says how to try again. */
static int export_at_end(const char *from, const char *to) {
    STRATA_INFO("train", "run.export_dir: exporting %s to %s", from, to);
    char *argv[] = {(char *)from, "--out", (char *)to};
    int rc = strata_cmd_export(3, argv);
    if (rc)
        STRATA_ERROR("train", "the run is complete, but its export to %s failed (above): `strata export %s --out %s` "
                     "tries again", to, from, to);
    return rc ? STRATA_EXIT_ERROR : STRATA_EXIT_OK;
}

/* Memory as planned against memory as used, at the end of the run (rank 0). */
static void report_memory(const trainer *t) {
    char b1[32], b2[32], b3[32], b4[32];
    size_t peak = t->dev->mem[STRATA_MEM_DEVICE].peak_bytes, predicted = t->planned_device + t->planned_runtime;
    STRATA_INFO("plan", "device memory: planned %s, peak allocated %s (%+.2f%%)",
                strata_fmt_bytes(b1, 32, (double)t->planned_device), strata_fmt_bytes(b2, 32, (double)peak),
                percent_off(peak, t->planned_device));
    if (t->planned_runtime)
        STRATA_INFO("plan", "device memory in use (nvidia-smi's view): last %s, peak %s; predicted %s "
                    "(plan + CUDA runtime) (%+.2f%%)",
                    strata_fmt_bytes(b1, 32, (double)device_used(t)),
                    strata_fmt_bytes(b3, 32, (double)t->device_used_peak),
                    strata_fmt_bytes(b4, 32, (double)predicted), percent_off(t->device_used_peak, predicted));
    size_t pinned_peak = t->dev->mem[STRATA_MEM_PINNED].peak_bytes;
    if (t->planned_pinned || pinned_peak)
        STRATA_INFO("plan", "pinned host memory: planned %s, peak allocated %s (%+.2f%%)",
                    strata_fmt_bytes(b1, 32, (double)t->planned_pinned), strata_fmt_bytes(b2, 32, (double)pinned_peak),
                    percent_off(pinned_peak, t->planned_pinned));
    if (t->planned_nvme)
        STRATA_INFO("plan", "nvme: planned %s, held %s in %s", strata_fmt_bytes(b1, 32, (double)t->planned_nvme),
                    strata_fmt_bytes(b2, 32, (double)strata_engine_nvme_bytes(t->engine)), t->cfg.offload.nvme_path);
    STRATA_INFO("plan", "host memory: resident peak %s (the process: code, data loader, pinned pages)",
                strata_fmt_bytes(b1, 32, (double)t->rss_peak));
}

static void close_trainer(trainer *t) {
    strata_out_set_hook(NULL, NULL);
    if (t->term_log) (void)fclose(t->term_log); /* every line was flushed as it was written */
    if (t->metrics) fclose(t->metrics); /* only on a path that already failed */
    STRATA_IGNORE(strata_tb_close(t->tb)); /* likewise: every record was written whole, or cut back */
    if (t->lock_fd >= 0) close(t->lock_fd); /* lets go of run.dir */
    if (t->engine) strata_unbuild(t->engine, &t->arena, &t->m);
    if (t->have_train) strata_loader_close(&t->train);
    if (t->have_val) strata_loader_close(&t->val);
    if (t->comm) strata_comm_close(t->comm);
    if (t->dev) strata_device_close(t->dev);
    strata_bpe_free(t->tokenizer);
    free(t->config_yaml);
    free(t);
}

int strata_cmd_train(int argc, char **argv, int rank, int world, int local_rank) {
    trainer *t = strata_xcalloc(1, sizeof *t);
    t->lock_fd = -1;
    t->es_best = NAN; /* no validation yet */
    t->rank = rank;
    t->world = world;
    t->local_rank = local_rank;
    int rc = strata_cli_parse(argc, argv, &t->cli, "train", 1, 0);
    if (!rc) rc = load_config(t);
    if ((rc = meet_ranks(t, rc)) || (rc = agree_ranks(t)) || (rc = claim_run_dir(t)) || (rc = check_resume(t))) {
        close_trainer(t);
        return rc;
    }
    strata_signals_install(world);
    if (rank == 0) strata_out_set_hook(terminal_lost, t); /* run.dir is there from now on */
    strata_config *cfg = &t->cfg;
    strata_watchdog_start(cfg->run.hang_timeout_s); /* start-up is not watched; memory.auto's trials are */
    if ((rc = reclaim_nvme(t)) || (rc = open_device(t, local_rank)) || (rc = build_and_plan(t))) {
        close_trainer(t);
        return rc;
    }
    /* on the arena's memory, before the state is put in it */
    if (strata_offload_measure_floor(&t->split, cfg, t->dev, &t->arena, rank, world))
        fatal(t, "agreeing to measure the offload floor");
    if (t->kernel_profile && strata_engine_profile_kernels(t->engine)) fatal(t, "starting the kernel profile");
    t->tokens_per_step = (double)cfg->train.micro_batch * strata_config_seq_len(cfg) * cfg->train.grad_accum * world;
    if ((rc = open_data(t))) {
        close_trainer(t);
        return rc;
    }
    restore_state(t);
    if (t->cli.resume && t->start >= cfg->train.steps) {
        if (rank == 0)
            STRATA_INFO("train", "run already at step %lld of %lld; nothing to do (raise train.steps to train further)",
                        (long long)t->start, (long long)cfg->train.steps);
        close_trainer(t);
        return STRATA_EXIT_OK;
    }
    open_run_dir(t);
    strata_engine_set_stop(t->engine, strata_signals_stop_requested);

    int exit_code = train_loop(t);
    if (exit_code == STRATA_EXIT_OK && strata_offload_split_report(&t->split, cfg, rank, world))
        fatal(t, "gathering the offload split");
    /* no collective is left before MPI_Finalize: from here a rank may end before another
     * (rank 0 still sampling), and a stop signal must not make that one look lost */
    strata_signals_doing(STRATA_DOING_END);
    if (exit_code == STRATA_EXIT_OK) report_kernel_profile(t);
    int stopping = t->stopped || strata_signals_stop_requested();
    if (exit_code == STRATA_EXIT_OK && !stopping && rank == 0 && cfg->train.sample_tokens > 0 &&
        strata_engine_params_resident(t->engine) == 0)
        final_sample(t);
    if (rank == 0) report_memory(t);
    if (rank == 0 && exit_code == STRATA_EXIT_OK) report_best(t);
    char export_from[STRATA_PATH_MAX + 16] = "", export_to[STRATA_PATH_MAX] = "";
    if (rank == 0 && exit_code == STRATA_EXIT_OK && !stopping && cfg->run.export_dir[0] &&
        choose_export(t, export_from, sizeof export_from))
        exit_code = STRATA_EXIT_ERROR;
    snprintf(export_to, sizeof export_to, "%s", cfg->run.export_dir);
    close_trainer(t); /* the run's memory goes back before the export reads the checkpoint */
    if (export_from[0]) exit_code = export_at_end(export_from, export_to);
    return exit_code;
}
