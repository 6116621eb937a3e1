/* launcher/train.c: `strata train` and `strata plan`. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/checkpoint.h"
#include "core/common.h"
#include "core/config.h"
#include "core/data.h"
#include "core/model.h"
#include "launcher/commands.h"
#include "launcher/plan.h"
#include "launcher/sample.h"
#include "shard/comm.h"
#include "shard/engine.h"

static volatile sig_atomic_t stop_requested;
static void on_stop_signal(int sig) { stop_requested = sig; }

static int parse_cli(int argc, char **argv, strata_cli *cli, const char *cmd, int allow_resume, int allow_world) {
    memset(cli, 0, sizeof *cli);
    cli->world = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") || !strcmp(a, "-s")) {
            if (i + 1 >= argc) { fprintf(stderr, "strata %s: --set needs section.key=value\n", cmd); return STRATA_EXIT_USAGE; }
            if (cli->n_sets == 64) { fprintf(stderr, "strata %s: at most 64 --set overrides\n", cmd); return STRATA_EXIT_USAGE; }
            cli->sets[cli->n_sets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            if (cli->n_sets == 64) { fprintf(stderr, "strata %s: at most 64 --set overrides\n", cmd); return STRATA_EXIT_USAGE; }
            cli->sets[cli->n_sets++] = a + 6;
        } else if (allow_resume && !strcmp(a, "--resume")) {
            if (i + 1 >= argc) { fprintf(stderr, "strata %s: --resume needs 'latest' or a checkpoint directory\n", cmd); return STRATA_EXIT_USAGE; }
            cli->resume = argv[++i];
        } else if (allow_world && (!strcmp(a, "--gpu-gb") || !strcmp(a, "--host-gb") || !strcmp(a, "--nvme-gb"))) {
            /* shorthands for the memory.* keys, checked like any --set */
            static char buf[3][64];
            int k = a[2] == 'g' ? 0 : a[2] == 'h' ? 1 : 2;
            if (i + 1 >= argc || cli->n_sets == 64) { fprintf(stderr, "strata %s: %s needs a number of GiB\n", cmd, a); return STRATA_EXIT_USAGE; }
            snprintf(buf[k], sizeof buf[k], "memory.%s_gb=%s", k == 0 ? "gpu" : k == 1 ? "host" : "nvme", argv[++i]);
            cli->sets[cli->n_sets++] = buf[k];
        } else if (allow_world && !strcmp(a, "--world")) {
            char *end = NULL;
            if (i + 1 >= argc || (cli->world = (int)strtol(argv[i + 1], &end, 10), *end) || cli->world < 1) {
                fprintf(stderr, "strata %s: --world expects a positive integer\n", cmd);
                return STRATA_EXIT_USAGE;
            }
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "strata %s: unknown option '%s'\n", cmd, a);
            return STRATA_EXIT_USAGE;
        } else if (!cli->config_path) {
            cli->config_path = a;
        } else {
            fprintf(stderr, "strata %s: unexpected argument '%s' (one CONFIG file)\n", cmd, a);
            return STRATA_EXIT_USAGE;
        }
    }
    return 0;
}


int strata_cmd_plan(int argc, char **argv) {
    strata_cli cli;
    int rc = parse_cli(argc, argv, &cli, "plan", 0, 1);
    if (rc) return rc;
    strata_config cfg;
    if (strata_config_load(&cfg, cli.config_path, cli.sets, cli.n_sets)) {
        fprintf(stderr, "%s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    strata_plan p;
    strata_plan_compute(&p, &cfg, cli.world);
    strata_plan_check(&p, &cfg, NULL);
    strata_model_shape shape = strata_model_shape_from_config(&cfg);
    strata_model m;
    strata_model_init(&m, &shape);
    printf("model: %d layers, %d heads, %d channels, vocab %d, %zu parameters; batch %d x %d x %d accumulation\n",
           shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size, strata_model_num_params(&m),
           cfg.train.micro_batch, strata_config_seq_len(&cfg), cfg.train.grad_accum);
    strata_model_free(&m);
    strata_plan_print(&p, stdout);
    if (!p.fits) {
        char sets[8][96], line[800];
        double cost;
        int n = strata_plan_suggest(&cfg, cli.world, NULL, sets, 8, line, sizeof line, &cost);
        if (n > 0) printf("  cheapest change that fits (about +%.0f%% step time): %s\n", cost * 100, line);
        else printf("  no change within reach fits: more ranks, or offload, are needed\n");
        return STRATA_EXIT_NOFIT;
    }
    return STRATA_EXIT_OK;
}

/* ---- metrics ---- */

/* On resume, drops rows for steps after the checkpoint (a run that went further and was
 * killed) so the file describes one history. */
static void metrics_truncate(const char *path, int64_t last_step) {
    FILE *in = fopen(path, "r");
    if (!in) return;
    char tmp[STRATA_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) { fclose(in); return; }
    char line[4096];
    while (fgets(line, sizeof line, in)) {
        const char *s = strstr(line, "\"step\":");
        if (s && atoll(s + 7) > last_step) continue;
        fputs(line, out);
    }
    fclose(in);
    if (fclose(out) == 0) rename(tmp, path);
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
    int rank, world;
    strata_device *dev;
    strata_stream *comm_stream;
    strata_comm *comm;
    strata_model m;
    strata_arena arena;
    strata_engine *engine;
    strata_loader train, val;
    int have_val;
    FILE *metrics;
    char config_yaml[65536];
    char auto_change[800];  /* what memory.auto chose, "" if nothing */
    size_t planned_device;  /* device bytes the plan predicted */
    size_t planned_pinned;  /* pinned host bytes the plan predicted */
} trainer;

/* A rank that cannot continue ends the whole job at once with its message: the other
 * ranks may be inside a collective that would otherwise wait for it until the timeout. */
static _Noreturn void fatal(const trainer *t, const char *what) {
    strata_log(STRATA_LOG_ERROR, "train", "%s: %s", what, strata_error());
    if (t->world > 1) strata_mpi_abort(STRATA_EXIT_ERROR);
    exit(STRATA_EXIT_ERROR);
}

static void config_to_yaml(const strata_config *c, char *buf, size_t n) {
    FILE *f = fmemopen(buf, n, "w");
    if (!f) { buf[0] = 0; return; }
    strata_config_write(c, f, 0);
    fclose(f);
    buf[n - 1] = 0;
}

static int save_checkpoint(trainer *t, int64_t step, double loss, double tokens, strata_rng *rng) {
    strata_ckpt_meta meta = {.step = step, .world = t->world, .stage = t->cfg.zero.stage, .seed = t->cfg.train.seed,
                             .rng_state = rng->state, .tokens_seen = tokens, .last_loss = loss,
                             .config_yaml = t->config_yaml};
    char dir[STRATA_PATH_MAX];
    double t0 = strata_now_ms();
    if (strata_engine_save(t->engine, t->cfg.run.dir, &meta, dir, sizeof dir)) return -1;
    if (t->rank == 0) STRATA_INFO("ckpt", "saved %s (%.0f ms)", dir, strata_now_ms() - t0);
    return 0;
}

int strata_cmd_train(int argc, char **argv, int rank, int world, int local_rank) {
    trainer *t = strata_xcalloc(1, sizeof *t);
    t->rank = rank;
    t->world = world;
    int rc = parse_cli(argc, argv, &t->cli, "train", 1, 0);
    if (rc) return rc;
    strata_config *cfg = &t->cfg;
    if (strata_config_load(cfg, t->cli.config_path, t->cli.sets, t->cli.n_sets)) {
        if (rank == 0) fprintf(stderr, "%s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    config_to_yaml(cfg, t->config_yaml, sizeof t->config_yaml);
    if (cfg->train.threads > 0) omp_set_num_threads(cfg->train.threads);

    const char *backend = cfg->device == STRATA_BACKEND_CUDA ? "cuda" : cfg->device == STRATA_BACKEND_CPU ? "cpu" : "auto";
    t->dev = strata_device_open(backend, local_rank);
    if (!t->dev) fatal(t, "opening the device");
    /* STRATA_CUDA_UNVERIFIED=1 lets bench/gpu-check.sh exercise these paths on a GPU */
    if (!strcmp(t->dev->ops->name, "cuda") && (cfg->zero.stage >= 2 || world > 1) && !getenv("STRATA_CUDA_UNVERIFIED")) {
        /* Not yet proven on a GPU: stages 2-3 hung in their first GPU test, and several
         * ranks need NCCL or staged MPI buffers. Refuse rather than risk a hang. */
        if (rank == 0)
            fprintf(stderr, "%s: %s on the CUDA backend is not available in this version (verified on a GPU: "
                            "zero.stage 0 and 1 at world size 1); use those, or device: cpu\n",
                    cfg->path[0] ? cfg->path : "<built-in>", world > 1 ? "training with several ranks" : "zero.stage 2 and 3");
        return STRATA_EXIT_USAGE;
    }
    t->comm_stream = strata_stream_create(t->dev, "comm", STRATA_STREAM_HOST);
    t->comm = strata_comm_open(t->dev, t->comm_stream, cfg->comm.timeout_s);
    if (!t->comm) fatal(t, "opening the collectives");
    int B = cfg->train.micro_batch, T = strata_config_seq_len(cfg), A = cfg->train.grad_accum;
    if (rank == 0)
        STRATA_INFO("train", "%s | device %s | comm %s, world %d | zero stage %d", cfg->path[0] ? cfg->path : "(built-in quickstart)",
                    t->dev->description, strata_comm_backend_name(t->comm), world, cfg->zero.stage);

    strata_model_shape shape = strata_model_shape_from_config(cfg);
    strata_model_init(&t->m, &shape);
    strata_arena_init(&t->arena, t->dev);
    t->engine = strata_engine_create(cfg, &t->m, &t->arena, t->dev, t->comm, rank, world);

    /* the plan is checked before anything is allocated */
    strata_plan plan;
    strata_plan_from_arena(&plan, &t->arena, world, cfg->zero.stage);
    strata_plan_add_nvme(&plan, strata_engine_nvme_bytes(t->engine));
    strata_plan_check(&plan, cfg, t->dev);
    if (!plan.fits) {
        char sets[8][96], line[800];
        double cost = 0;
        int n = strata_plan_suggest(cfg, world, t->dev, sets, 8, line, sizeof line, &cost);
        if (!cfg->memory.auto_fit || n <= 0) {
            if (rank == 0) {
                strata_plan_print(&plan, stderr);
                if (n > 0)
                    fprintf(stderr, "error: the run does not fit (%s). The cheapest change that fits, keeping the "
                                    "global batch (about +%.0f%% step time):\n  strata train %s %s\n"
                                    "or set memory.auto: true to apply it automatically.\n",
                            plan.why, cost * 100, t->cli.config_path ? t->cli.config_path : "", line);
                else
                    fprintf(stderr, "error: the run does not fit (%s), and no change of micro-batch, activation "
                                    "checkpointing or ZeRO stage makes it fit: add ranks or offload.\n", plan.why);
            }
            return STRATA_EXIT_NOFIT;
        }
        /* memory.auto: rebuild with the chosen change */
        strata_engine_destroy(t->engine);
        strata_arena_release(&t->arena);
        strata_model_free(&t->m);
        for (int i = 0; i < n; i++)
            if (strata_config_set(cfg, sets[i]) || strata_config_check(cfg, "memory.auto")) fatal(t, "applying memory.auto");
        snprintf(t->auto_change, sizeof t->auto_change, "%s", line);
        if (rank == 0)
            STRATA_INFO("plan", "memory.auto: %s; chose %s (cheapest that fits, about +%.0f%% step time)", plan.why, line,
                        cost * 100);
        config_to_yaml(cfg, t->config_yaml, sizeof t->config_yaml);
        B = cfg->train.micro_batch;
        A = cfg->train.grad_accum;
        strata_model_init(&t->m, &shape);
        strata_arena_init(&t->arena, t->dev);
        t->engine = strata_engine_create(cfg, &t->m, &t->arena, t->dev, t->comm, rank, world);
        strata_plan_from_arena(&plan, &t->arena, world, cfg->zero.stage);
        strata_plan_add_nvme(&plan, strata_engine_nvme_bytes(t->engine));
        strata_plan_check(&plan, cfg, t->dev);
    }
    t->planned_device = plan.need[STRATA_TIER_DEVICE];
    t->planned_pinned = plan.need[STRATA_TIER_PINNED];
    if (rank == 0) {
        STRATA_INFO("train", "model: %d layers, %d heads, %d channels, vocab %d (padded %d), %zu parameters",
                    shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size, shape.padded_vocab_size,
                    strata_model_num_params(&t->m));
        STRATA_INFO("train", "batch: %d x %d tokens x %d accumulation x %d ranks = %lld tokens per step", B, T, A, world,
                    (long long)B * T * A * world);
        strata_plan_print(&plan, stdout);
    }
    if (strata_arena_commit(&t->arena)) fatal(t, "allocating the memory plan");

    if (strata_loader_open(&t->train, cfg->data.train, T, cfg->model.vocab_size, cfg->data.shuffle, cfg->train.seed)) {
        char why[1024];
        snprintf(why, sizeof why, "%s", strata_error());
        strata_fail("%s (text becomes shards with `strata prepare --text FILE... --out DIR`)", why);
        fatal(t, "opening the training data (data.train)");
    }
    if (cfg->data.val[0]) {
        if (strata_loader_open(&t->val, cfg->data.val, T, cfg->model.vocab_size, 0, cfg->train.seed))
            fatal(t, "opening the validation data (data.val)");
        t->have_val = 1;
    }

    int64_t start = 0;
    double tokens_seen = 0;
    strata_rng rng;
    strata_rng_seed(&rng, cfg->train.seed);
    if (t->cli.resume) {
        char dir[STRATA_PATH_MAX];
        if (strata_ckpt_resolve(t->cli.resume, cfg->run.dir, dir, sizeof dir)) fatal(t, "resolving --resume");
        strata_ckpt *ck = strata_ckpt_open(dir);
        if (!ck) fatal(t, "opening the checkpoint");
        if (strata_engine_load(t->engine, ck)) fatal(t, "loading the checkpoint");
        const strata_ckpt_meta *meta = strata_ckpt_get_meta(ck);
        start = meta->step;
        tokens_seen = meta->tokens_seen;
        rng.state = meta->rng_state;
        if (rank == 0)
            STRATA_INFO("train", "resumed from %s (step %lld, saved at world %d stage %d)", dir, (long long)start,
                        meta->world, meta->stage);
        strata_ckpt_close(ck);
    } else if (strata_engine_init_params(t->engine, cfg->train.seed)) {
        fatal(t, "initialising parameters");
    }

    char metrics_path[STRATA_PATH_MAX + 32];
    if (rank == 0) {
        char cmd[STRATA_PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "%s", cfg->run.dir);
        for (char *p = cmd + 1; *p; p++) /* mkdir -p */
            if (*p == '/') { *p = 0; mkdir(cmd, 0755); *p = '/'; }
        if (mkdir(cmd, 0755) && errno != EEXIST) { strata_fail("run.dir '%s': %s", cfg->run.dir, strerror(errno)); fatal(t, "creating the run directory"); }
        snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", cfg->run.dir);
        if (t->cli.resume) metrics_truncate(metrics_path, start);
        t->metrics = fopen(metrics_path, t->cli.resume ? "a" : "w");
        if (!t->metrics) { strata_fail("%s: %s", metrics_path, strerror(errno)); fatal(t, "opening metrics"); }
    }

    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int64_t steps = cfg->train.steps;
    double tokens_per_step = (double)B * T * A * world;
    double loss = NAN, run_t0 = strata_now_ms();
    int64_t last_saved = t->cli.resume ? start : -1;
    int exit_code = STRATA_EXIT_OK;
    for (int64_t step = start; step < steps; step++) {
        double t0 = strata_now_ms();
        strata_comm_stats cs0 = strata_comm_get_stats(t->comm);
        strata_step_result r;
        if (strata_engine_step(t->engine, &t->train, step, &r)) fatal(t, "training step");
        double ms = strata_now_ms() - t0;
        strata_comm_stats cs1 = strata_comm_get_stats(t->comm);
        uint64_t comm_bytes = 0; /* this rank's collective traffic in the step (ring accounting) */
        for (int k = 0; k < STRATA_COLL_KINDS; k++) comm_bytes += cs1.bytes[k] - cs0.bytes[k];
        if (r.nonfinite) {
            if (rank == 0)
                STRATA_ERROR("train", "step %lld: loss %g, gradient norm %g: not finite, so the update was skipped "
                             "and the run stops here; the last good checkpoint is %s. Lower optim.lr or set "
                             "optim.grad_clip.", (long long)step + 1, r.loss, r.grad_norm,
                             last_saved >= 0 ? "intact" : "absent (none was saved yet)");
            exit_code = STRATA_EXIT_ERROR;
            break;
        }
        loss = r.loss;
        tokens_seen += tokens_per_step;
        int64_t done = step + 1;
        double val_loss = NAN;
        int eval_now = t->have_val && ((cfg->train.eval_every > 0 && done % cfg->train.eval_every == 0) || done == steps);
        if (eval_now && strata_engine_eval(t->engine, &t->val, cfg->train.eval_batches, &val_loss)) fatal(t, "validation");
        if (rank == 0) {
            double tok_s = tokens_per_step / (ms / 1e3);
            double eta_s = (strata_now_ms() - run_t0) / 1e3 / (double)(done - start) * (double)(steps - done);
            char eta[32];
            fmt_eta(eta, sizeof eta, eta_s);
            if (done % cfg->train.log_every == 0 || done == steps || done == start + 1 || eval_now) {
                char vbuf[48] = "";
                if (eval_now) snprintf(vbuf, sizeof vbuf, " | val %.4f", val_loss);
                printf("step %6lld/%lld | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms | eta %s\n",
                       (long long)done, (long long)steps, loss, vbuf, r.lr, r.grad_norm, tok_s, ms, eta);
                fflush(stdout);
            }
            strata_engine_memory mem = strata_engine_get_memory(t->engine);
            fprintf(t->metrics, "{\"step\": %lld, \"loss\": %.9g, ", (long long)done, loss);
            if (eval_now) fprintf(t->metrics, "\"val_loss\": %.9g, ", val_loss);
            fprintf(t->metrics, "\"lr\": %.9g, \"grad_norm\": %.9g, \"tokens_per_s\": %.1f, \"step_ms\": %.3f, "
                    "\"tflops\": %.3f, \"tokens\": %.0f, \"peak_mem_bytes\": %zu, \"mem_params\": %zu, \"mem_grads\": %zu, "
                    "\"mem_optimizer\": %zu, \"mem_activations\": %zu, \"mem_buffers\": %zu, \"plan_device_bytes\": %zu, "
                    "\"rss_bytes\": %zu, \"plan_pinned_bytes\": %zu, \"pinned_bytes\": %zu, \"comm_bytes\": %llu, \"compute_ms\": %.3f, \"comm_wait_ms\": %.3f, "
                    "\"offload_wait_ms\": %.3f, \"data_ms\": %.3f",
                    r.lr, r.grad_norm, tok_s, ms, tok_s * strata_model_flops_per_token(&t->m, T) / 1e12, tokens_seen,
                    t->dev->mem[STRATA_MEM_DEVICE].peak_bytes,
                    mem.params, mem.grads, mem.optimizer, mem.activations, mem.buffers, t->planned_device, rss_bytes(),
                    t->planned_pinned, t->dev->mem[STRATA_MEM_PINNED].live_bytes, (unsigned long long)comm_bytes,
                    ms - r.comm_wait_ms - r.offload_wait_ms - r.data_ms, r.comm_wait_ms, r.offload_wait_ms, r.data_ms);
            if (t->auto_change[0] && done == start + 1) fprintf(t->metrics, ", \"memory_auto\": \"%s\"", t->auto_change);
            fprintf(t->metrics, "}\n");
            fflush(t->metrics);
        }
        /* every rank must agree to stop, or some would wait in a collective for the others */
        double stop = stop_requested ? 1.0 : 0.0;
        if (world > 1 && strata_allreduce_host_f64(t->comm, &stop, 1)) fatal(t, "agreeing on a stop");
        int periodic = cfg->run.checkpoint_every > 0 && done % cfg->run.checkpoint_every == 0;
        if (periodic || done == steps || stop > 0) {
            if (save_checkpoint(t, done, loss, tokens_seen, &rng)) fatal(t, "saving a checkpoint");
            last_saved = done;
        }
        if (stop > 0) {
            if (rank == 0) STRATA_INFO("train", "stopped by signal after step %lld; resume with --resume latest", (long long)done);
            break;
        }
    }

    if (exit_code == STRATA_EXIT_OK && !stop_requested && rank == 0 && cfg->train.sample_tokens > 0 &&
        strata_engine_params_resident(t->engine) == 0) {
        int n = cfg->train.sample_tokens;
        int32_t *tokens = strata_xcalloc((size_t)n + 2, sizeof(int32_t));
        int n_prompt = 0;
        if (cfg->model.vocab_size <= 256) tokens[n_prompt++] = '\n';
        strata_generate(&t->m, tokens, n_prompt, n, 0.8f, 40, &rng);
        printf("---- sample (%d tokens, temperature 0.8, top-k 40) ----\n", n);
        strata_write_tokens(stdout, tokens + n_prompt, n, cfg->model.vocab_size, NULL);
        printf("\n----\n");
        free(tokens);
    }
    if (rank == 0) {
        char b1[32], b2[32];
        size_t peak = t->dev->mem[STRATA_MEM_DEVICE].peak_bytes;
        STRATA_INFO("plan", "device memory: planned %s, peak allocated %s (%+.2f%%)",
                    strata_fmt_bytes(b1, 32, (double)t->planned_device), strata_fmt_bytes(b2, 32, (double)peak),
                    t->planned_device ? 100.0 * ((double)peak - (double)t->planned_device) / (double)t->planned_device : 0.0);
    }
    if (t->metrics) fclose(t->metrics);
    strata_engine_destroy(t->engine);
    strata_arena_release(&t->arena);
    strata_model_free(&t->m);
    strata_loader_close(&t->train);
    if (t->have_val) strata_loader_close(&t->val);
    strata_comm_close(t->comm);
    strata_stream_destroy(t->dev, t->comm_stream);
    strata_device_close(t->dev);
    free(t);
    return exit_code;
}
