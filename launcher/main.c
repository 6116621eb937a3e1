/* launcher/main.c: the `strata` program. One binary, subcommands; under mpirun every
 * rank runs the same subcommand. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/device.h"
#include "io/bpe.h"
#include "io/config.h"
#include "io/data.h"
#include "io/files.h"
#include "io/jsonl.h"
#include "io/text.h"
#include "shard/comm.h"
#include "offload/bench_io.h"
#include "launcher/commands.h"
#include "launcher/deepspeed.h"
#include "launcher/dump_grads.h"
#include "launcher/export.h"
#include "launcher/help.h"
#include "launcher/plot.h"

static int cmd_config(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--from-deepspeed")) return strata_cmd_config_deepspeed(argc, argv);
    const char *path = NULL;
    const char *sets[64];
    int n_sets = 0;
    for (int i = 0; i < argc; i++) {
        if ((!strcmp(argv[i], "--set") || !strcmp(argv[i], "-s")) && i + 1 < argc && n_sets < 64) sets[n_sets++] = argv[++i];
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "strata config: unexpected argument '%s'\n", argv[i]);
            return STRATA_EXIT_USAGE;
        }
    }
    strata_config c;
    if (strata_config_load(&c, path, sets, n_sets)) {
        fprintf(stderr, "%s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    if (strata_config_write(&c, stdout, 1)) {
        fprintf(stderr, "%s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    return STRATA_EXIT_OK;
}

/* The options of `strata prepare`. */
typedef struct prepare_args {
    const char **files;
    int n, jsonl;
    const char *out, *tok_path, *text_field, *prompt_field, *response_field, *messages_field, *chat, *overflow, *pack,
        *val_split, *system_prompt;
    double val_fraction;
    long long shard_tokens, seq_len, threads;
    int skip_bad, dedup;
} prepare_args;

static int prepare_usage(const char *why, const char *arg) {
    if (why) fprintf(stderr, "strata prepare: %s%s%s%s\n", why, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    fprintf(stderr, "usage: strata prepare --text FILE... --out DIR [--tokenizer T] [--val-fraction F] [--shard-tokens N]\n"
                    "                      [--threads N]\n"
                    "       strata prepare --jsonl FILE... --out DIR --tokenizer T --seq-len N\n"
                    "                      [--text-field F | --prompt-field P --response-field R |\n"
                    "                       --messages-field M] [--chat-format llama3|chatml] [--system-prompt TEXT]\n"
                    "                      [--pack best-fit|in-order] [--overflow split|truncate|drop] [--skip-bad]\n"
                    "                      [--dedup] [--val-fraction F] [--val-split spread|end] [--shard-tokens N]\n"
                    "                      [--threads N]\n");
    return STRATA_EXIT_USAGE;
}

/* The command line into a; returns an exit code (0: go on), the error printed. */
static int parse_prepare(int argc, char **argv, prepare_args *a) {
    int in_files = 0;
    for (int i = 0; i < argc; i++) {
        char *end = NULL;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **str = !strcmp(argv[i], "--out") ? &a->out : !strcmp(argv[i], "--tokenizer") ? &a->tok_path
                         : !strcmp(argv[i], "--text-field") ? &a->text_field
                         : !strcmp(argv[i], "--prompt-field") ? &a->prompt_field
                         : !strcmp(argv[i], "--response-field") ? &a->response_field
                         : !strcmp(argv[i], "--messages-field") ? &a->messages_field
                         : !strcmp(argv[i], "--chat-format") ? &a->chat
                         : !strcmp(argv[i], "--overflow") ? &a->overflow
                         : !strcmp(argv[i], "--pack") ? &a->pack
                         : !strcmp(argv[i], "--val-split") ? &a->val_split
                         : !strcmp(argv[i], "--system-prompt") ? &a->system_prompt : NULL;
        if (!strcmp(argv[i], "--text") || !strcmp(argv[i], "--jsonl")) {
            int jsonl = argv[i][2] == 'j';
            if (a->n && jsonl != a->jsonl) return prepare_usage("--text and --jsonl do not mix", NULL);
            a->jsonl = jsonl;
            in_files = 1;
        } else if (str && v) {
            *str = argv[++i];
            in_files = 0;
        } else if (!strcmp(argv[i], "--skip-bad")) {
            a->skip_bad = 1;
            in_files = 0;
        } else if (!strcmp(argv[i], "--dedup")) {
            a->dedup = 1;
            in_files = 0;
        } else if (!strcmp(argv[i], "--val-fraction") && v) {
            a->val_fraction = strtod(argv[++i], &end);
            if (*end || !(a->val_fraction >= 0 && a->val_fraction < 1))
                return prepare_usage("--val-fraction expects a number in [0, 1), got", argv[i]);
            in_files = 0;
        } else if ((!strcmp(argv[i], "--shard-tokens") || !strcmp(argv[i], "--seq-len") || !strcmp(argv[i], "--threads")) &&
                   v) {
            long long *num = !strcmp(argv[i], "--shard-tokens") ? &a->shard_tokens
                          : !strcmp(argv[i], "--seq-len")    ? &a->seq_len
                                                             : &a->threads;
            const char *name = argv[i];
            *num = strtoll(argv[++i], &end, 10);
            long long most = num == &a->threads ? STRATA_PREPARE_MAX_THREADS : INT32_MAX;
            if (*end || *num < 1 || *num > most) {
                char why[96];
                snprintf(why, sizeof why, "%s expects an integer in [1, %lld], got", name, most);
                return prepare_usage(why, argv[i]);
            }
            in_files = 0;
        } else if (in_files && argv[i][0] != '-') {
            a->files[a->n++] = argv[i];
        } else {
            return prepare_usage("unexpected argument", argv[i]);
        }
    }
    if (!a->n || !a->out) return prepare_usage(NULL, NULL);
    const char *const fields[][2] = {{"--text-field", a->text_field}, {"--prompt-field", a->prompt_field},
                                     {"--response-field", a->response_field}, {"--messages-field", a->messages_field}};
    for (int k = 0; k < 4; k++)
        if (fields[k][1] && (!fields[k][1][0] || fields[k][1][strspn(fields[k][1], ",")] == 0 ||
                             strstr(fields[k][1], ",,") || fields[k][1][strlen(fields[k][1]) - 1] == ',')) {
            char why[128];
            snprintf(why, sizeof why, "%s expects field names, none of them empty (several are comma-separated), got",
                     fields[k][0]);
            return prepare_usage(why, fields[k][1]);
        }
    int modes = !!a->text_field + !!(a->prompt_field || a->response_field) + !!a->messages_field;
    if (!a->jsonl &&
        (modes || a->chat || a->overflow || a->pack || a->val_split || a->skip_bad || a->dedup || a->seq_len ||
         a->system_prompt))
        return prepare_usage("--text-field, --prompt-field, --response-field, --messages-field, --chat-format, "
                             "--system-prompt, --seq-len, --pack, --overflow, --val-split, --skip-bad and --dedup go "
                             "with --jsonl", NULL);
    if (a->system_prompt && (!a->system_prompt[0] || strata_utf8_invalid_at(a->system_prompt, strlen(a->system_prompt)) <
                                                         strlen(a->system_prompt)))
        return prepare_usage("--system-prompt expects UTF-8 text, not empty", NULL);
    if (!a->jsonl) return 0;
    if (modes > 1 || (a->prompt_field && !a->response_field) || (a->response_field && !a->prompt_field))
        return prepare_usage("--jsonl takes one of --text-field, --prompt-field with --response-field, or "
                             "--messages-field (or none: the first example's keys say which)", NULL);
    if (a->chat && modes && !a->messages_field) return prepare_usage("--chat-format goes with --messages-field", NULL);
    if (!a->tok_path) return prepare_usage("--jsonl needs --tokenizer (the model's: its special tokens and EOS)", NULL);
    if (!a->seq_len) return prepare_usage("--jsonl needs --seq-len (examples are packed into sequences of it)", NULL);
    if (a->overflow && strcmp(a->overflow, "split") && strcmp(a->overflow, "truncate") && strcmp(a->overflow, "drop"))
        return prepare_usage("--overflow is split, truncate or drop, not", a->overflow);
    if (a->pack && strcmp(a->pack, "best-fit") && strcmp(a->pack, "in-order"))
        return prepare_usage("--pack is best-fit or in-order, not", a->pack);
    if (a->val_split && strcmp(a->val_split, "spread") && strcmp(a->val_split, "end"))
        return prepare_usage("--val-split is spread or end, not", a->val_split);
    return 0;
}

static int prepare_jsonl(const prepare_args *a, strata_bpe *tk) {
    strata_jsonl_opts o = {.files = a->files, .n_files = a->n, .seq_len = (int)a->seq_len,
                           .overflow = !a->overflow || !strcmp(a->overflow, "split") ? STRATA_JSONL_SPLIT
                                       : !strcmp(a->overflow, "truncate")            ? STRATA_JSONL_TRUNCATE
                                                                                      : STRATA_JSONL_DROP,
                           .skip_bad = a->skip_bad, .dedup = a->dedup,
                           .pack_in_order = a->pack && !strcmp(a->pack, "in-order"),
                           .val_at_end = a->val_split && !strcmp(a->val_split, "end"),
                           .val_fraction = a->val_fraction, .max_shard_tokens = (size_t)a->shard_tokens,
                           .threads = (int)a->threads, .text_field = a->text_field, .prompt_field = a->prompt_field,
                           .response_field = a->response_field, .messages_field = a->messages_field};
    o.kind = a->text_field ? STRATA_JSONL_TEXT : a->prompt_field ? STRATA_JSONL_PROMPT : STRATA_JSONL_MESSAGES;
    if (!a->text_field && !a->prompt_field && !a->messages_field) { /* the layout from the first example's keys */
        char said[300];
        if (strata_jsonl_detect(a->files[0], &o, said, sizeof said)) {
            fprintf(stderr, "strata prepare: %s\n", strata_error());
            return STRATA_EXIT_USAGE;
        }
        printf("layout: %s, from the keys of %s's first example\n", said, a->files[0]);
    }
    if ((a->chat || a->system_prompt) && o.kind != STRATA_JSONL_MESSAGES) {
        fprintf(stderr, "strata prepare: %s goes with a chat (--messages-field), and %s's examples are none\n",
                a->chat ? "--chat-format" : "--system-prompt", a->files[0]);
        return STRATA_EXIT_USAGE;
    }
    o.system_prompt = a->system_prompt;
    if (a->chat && strata_chat_format_parse(a->chat, &o.chat_format)) {
        fprintf(stderr, "strata prepare: --chat-format: %s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    if (o.kind == STRATA_JSONL_MESSAGES && !a->chat) { /* the format the tokenizer's model is prompted in */
        o.chat_format = strata_chat_format_detect(tk);
        if (o.chat_format == STRATA_CHAT_NONE) {
            fprintf(stderr, "strata prepare: --messages-field needs --chat-format llama3 or chatml: tokenizer %s has "
                            "the special tokens of neither (or of both), so which it is prompted in is not known\n",
                    strata_bpe_source(tk));
            return STRATA_EXIT_USAGE;
        }
        printf("chat format: %s, the one tokenizer %s is prompted in (--chat-format chooses another)\n",
               strata_chat_format_name(o.chat_format), strata_bpe_source(tk));
    }
    strata_jsonl_report r;
    int rc = strata_prepare_jsonl(&o, a->out, tk, &r);
    if (rc) {
        fprintf(stderr, "strata prepare: %s\n", strata_error());
        return rc == STRATA_PREPARE_REFUSED || rc == STRATA_JSONL_BAD_LINE ? STRATA_EXIT_USAGE : STRATA_EXIT_ERROR;
    }
    size_t all = r.train_tokens + r.val_tokens;
    char longer[160];
    if (o.overflow == STRATA_JSONL_TRUNCATE)
        snprintf(longer, sizeof longer, "%zu truncated, %zu dropped (nothing learned in their first --seq-len tokens)",
                 r.truncated, r.dropped);
    else if (o.overflow == STRATA_JSONL_SPLIT)
        snprintf(longer, sizeof longer, "%zu split", r.split);
    else
        snprintf(longer, sizeof longer, "%zu dropped", r.dropped);
    printf("%zu examples packed %s into %zu train and %zu val sequences of %d tokens (%zu learned of %zu train "
           "tokens; padding %.1f%% of all); longer than --seq-len: %s; bad lines skipped: %zu\n",
           r.examples, o.pack_in_order ? "in order" : "by best fit", r.train_seqs, r.val_seqs, o.seq_len,
           r.train_learned, r.train_tokens, all ? 100.0 * (double)r.padding / (double)all : 0.0, longer, r.bad);
    printf("example lengths in tokens: median %zu, 99th percentile %zu, longest %zu (--seq-len %d)\n", r.len_median,
           r.len_p99, r.len_max, o.seq_len);
    if (r.duplicates)
        printf("%zu example%s repeat%s an earlier one (the same tokens, the same learned): %s\n", r.duplicates,
               r.duplicates == 1 ? "" : "s", r.duplicates == 1 ? "s" : "", a->dedup ? "dropped (--dedup)" : "kept (--dedup drops them)");
    return STRATA_EXIT_OK;
}

static int cmd_prepare(int argc, char **argv) {
    prepare_args a = {.files = calloc(argc + 1, sizeof *a.files), .val_fraction = 0.1, .shard_tokens = 100000000};
    int rc = parse_prepare(argc, argv, &a);
    for (int i = 0; i < a.n && !rc; i++) /* a wrong path (a directory, /dev/zero) is bad input, not a failure */
        if (strata_check_file_bounded(a.files[i], STRATA_TEXT_MAX_BYTES)) {
            fprintf(stderr, "strata prepare: %s: %s\n", a.jsonl ? "--jsonl" : "--text", strata_error());
            rc = STRATA_EXIT_USAGE;
        }
    strata_bpe *tk = NULL;
    if (!rc && a.tok_path && !(tk = strata_bpe_load(a.tok_path))) {
        fprintf(stderr, "strata prepare: --tokenizer: %s\n", strata_error());
        rc = STRATA_EXIT_USAGE;
    }
    if (!rc && a.jsonl) {
        rc = prepare_jsonl(&a, tk);
    } else if (!rc) {
        int prc = strata_prepare_text(a.files, a.n, a.out, a.val_fraction, (size_t)a.shard_tokens, tk, (int)a.threads);
        if (prc) {
            fprintf(stderr, "strata prepare: %s\n", strata_error());
            rc = prc == STRATA_PREPARE_REFUSED ? STRATA_EXIT_USAGE : STRATA_EXIT_ERROR;
        }
    }
    strata_bpe_free(tk);
    free(a.files);
    return rc;
}

/* `strata bench io`: the machine's transfer floors, so offload users know their limits. */
static int cmd_bench(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "io")) {
        fprintf(stderr, "usage: strata bench io [--nvme-dir DIR] [--block-kb N] [--queue-depth N] [--mb N] [--device cpu|cuda]\n");
        return STRATA_EXIT_USAGE;
    }
    const char *dir = NULL, *backend = "auto";
    long block_kb = 1024, qd = 32, mb = 256;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        long *num = !strcmp(argv[i], "--block-kb") ? &block_kb : !strcmp(argv[i], "--queue-depth") ? &qd
                  : !strcmp(argv[i], "--mb") ? &mb : NULL;
        if (num && i + 1 < argc) {
            *num = strtol(argv[++i], &end, 10);
            if (*end || *num < 1) {
                fprintf(stderr, "strata bench io: %s expects a positive integer, got '%s'\n", argv[i - 1], argv[i]);
                return STRATA_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--nvme-dir") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            backend = argv[++i];
        } else {
            fprintf(stderr, "strata bench io: unexpected argument '%s'\n", argv[i]);
            return STRATA_EXIT_USAGE;
        }
    }
    if (block_kb % 4) {
        fprintf(stderr, "strata bench io: --block-kb %ld must be a multiple of 4 (O_DIRECT alignment)\n", block_kb);
        return STRATA_EXIT_USAGE;
    }
    strata_device *d = strata_device_open(backend, 0);
    if (!d) {
        fprintf(stderr, "strata bench io: %s\n", strata_error());
        return STRATA_EXIT_ERROR;
    }
    int rc = strata_bench_io(stdout, d, dir, (size_t)block_kb * 1024, (int)qd, (size_t)mb << 20);
    if (rc) fprintf(stderr, "strata bench io: %s\n", strata_error());
    strata_device_close(d);
    return rc ? STRATA_EXIT_ERROR : STRATA_EXIT_OK;
}

static int cmd_plot(int argc, char **argv) {
    const char *dirs[16], *out = NULL;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] != '-' && n < 16) dirs[n++] = argv[i];
        else {
            fprintf(stderr, "%s", argv[i][0] == '-' ? "usage: strata plot RUNDIR... [--out FILE]\n"
                                                    : "strata plot: at most 16 runs at once\n");
            return STRATA_EXIT_USAGE;
        }
    }
    if (!n) {
        fprintf(stderr, "usage: strata plot RUNDIR... [--out FILE]\n");
        return STRATA_EXIT_USAGE;
    }
    if (strata_plot_runs(dirs, n, out)) {
        fprintf(stderr, "strata plot: %s\n", strata_error());
        return STRATA_EXIT_ERROR;
    }
    printf("wrote %s\n", out ? out : n == 1 ? "plot.svg in the run directory" : "plot.svg");
    return STRATA_EXIT_OK;
}

/* `strata train`: under mpirun every rank runs it, so MPI starts first. */
static int cmd_train(int argc, char **argv) {
    int rank = 0, world = 1, local_rank = 0;
    if (strata_mpi_init(&argc, &argv, &rank, &world, &local_rank)) {
        fprintf(stderr, "strata: %s\n", strata_error());
        return STRATA_EXIT_ERROR;
    }
    strata_log_init(rank, world);
    int rc = strata_cmd_train(argc, argv, rank, world, local_rank);
    /* a rank that fails alone must not leave the others waiting in MPI_Finalize; an
     * out-of-memory stop is agreed by every rank, which all return together */
    if (rc != STRATA_EXIT_OK && rc != STRATA_EXIT_OOM && world > 1) strata_mpi_abort(rc);
    strata_mpi_finalize();
    return rc;
}

/* The subcommands: what dispatches them and what the usage lists, in its order. */
static const struct command {
    const char *name;
    int (*run)(int argc, char **argv); /* the arguments after the command's name */
    const char *args;                  /* its synopsis, after the name */
    const char *help;                  /* one line: what it does */
} commands[] = {
    {"train", cmd_train, "[CONFIG] [--set section.key=value]... [--resume latest|DIR]",
     "train a model (no CONFIG: the built-in quickstart); under mpirun, on every rank"},
    {"prepare", cmd_prepare, "--text FILE... | --jsonl FILE... --out DIR [--tokenizer T] [--seq-len N] [...]",
     "turn text files, or JSONL fine-tuning data with a loss mask, into token shards: bytes, or a Hugging Face BPE's ids"},
    {"config", cmd_config, "[CONFIG] [--set ...] | --from-deepspeed ds_config.json",
     "print the effective config, every key, with defaults (or the Strata YAML of a DeepSpeed config)"},
    {"plan", strata_cmd_plan, "[CONFIG] [--world N] [--set ...]", "print the memory plan per rank without training"},
    {"sample", strata_cmd_sample, "CKPT|RUNDIR|HF_MODEL [--prompt TEXT] [--chat] [--tokens N] [--temperature T] [--top-k K]",
     "generate text from a checkpoint or a Hugging Face model"},
    {"chat", strata_cmd_chat, "CKPT|RUNDIR|HF_MODEL [--system TEXT] [--tokens N] [--temperature T] [--top-k K]",
     "a conversation with a chat model: each line of stdin a user's message, each reply on stdout"},
    {"eval", strata_cmd_eval, "CKPT|RUNDIR|HF_MODEL [--data GLOB] [--batches N] [--micro-batch B] [--seq-len T]",
     "the loss of a checkpoint or a Hugging Face model on token shards, as a run's validation computes it"},
    {"plot", cmd_plot, "RUNDIR... [--out FILE]",
     "draw loss, lr, speed, gradient norm and memory against the plan as an SVG; several runs overlaid"},
    {"bench", cmd_bench, "io [--nvme-dir DIR] [--block-kb N] [--queue-depth N] [--mb N]",
     "pinned/pageable host<->device and O_DIRECT io_uring bandwidth: the offload floors"},
    {"export", strata_cmd_export, "CKPT|RUNDIR --out DIR|FILE.safetensors",
     "a Hugging Face model directory (from_pretrained loads it), or the weights alone"},
    {"dump-grads", strata_cmd_dump_grads, "CKPT|RUNDIR --data GLOB --out FILE.safetensors [--batch B] [--seq T]",
     "loss, logits and every gradient of one batch, for checks against PyTorch"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

/* The top-level usage: every command of the table, its synopsis, and its help on the same
 * line when the synopsis is short, else on the next. */
static void usage(FILE *f) {
    fputs("usage: strata COMMAND [ARGS]     (strata COMMAND --help: its options; strata --version)\n\n", f);
    for (int i = 0; i < N_COMMANDS; i++) {
        int len = fprintf(f, "  %s %s", commands[i].name, commands[i].args);
        if (len <= 32) fprintf(f, "%*s%s\n", 34 - len, "", commands[i].help);
        else fprintf(f, "\n        %s\n", commands[i].help);
    }
    fputs("\nExit codes: 0 ok, 1 run-time failure, 2 bad command line or config, 3 does not fit,\n"
          "4 the device ran out of memory mid-run (an emergency checkpoint was written),\n"
          "5 no progress for run.hang_timeout_s (the run ended rather than hang; the last checkpoint is intact).\n", f);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? STRATA_EXIT_USAGE : STRATA_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) return strata_cmd_version();
    const char *cmd = argv[1];
    int sub_argc = argc - 2;
    char **sub_argv = argv + 2;
    if (strata_help_asked(sub_argc, sub_argv) && strata_cmd_help(cmd) == 0) return STRATA_EXIT_OK;
    for (int i = 0; i < N_COMMANDS; i++) {
        if (strcmp(cmd, commands[i].name)) continue;
        strata_log_init(0, 1); /* train sets its rank's once MPI has started */
        return commands[i].run(sub_argc, sub_argv);
    }
    strata_log_init(0, 1);
    fprintf(stderr, "strata: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return STRATA_EXIT_USAGE;
}
