/* tests/fuzz/driver.c: the in-tree fuzzing loop, so CI fuzzes with no package beyond the
 * compiler's sanitizers. It links with one target (a LLVMFuzzerTestOneInput) and:
 *   1. loads the seed files named on the command line (files, or every file of a folder);
 *   2. runs each seed once as it is (a seed called valid-* must be accepted: fuzz.h);
 *   3. until the time or iteration budget is spent, takes a corpus entry, applies one to
 *      four mutations from a seeded PRNG (bit flips; bytes set to 0, 0xff, 0x7f, 0x80 and
 *      other interesting values; inserts; deletes; chunk copies; splices with another
 *      entry; binary integers and decimal numbers overwritten with boundary values) and
 *      runs the result.
 * There is no coverage instrumentation; instead an input whose outcome is new (the
 * target's error message with numbers and quoted text left out, or acceptance) joins the
 * corpus, which steers mutation past the first checks of a format.
 *
 * A finding (a sanitizer report, abort, crash, an input that runs longer than twice -T seconds
 * or exits the program, a leak, an allocation over the limit in __asan_default_options)
 * writes the input to DIR/crash-<target>-<hash> and prints how to replay it: the same
 * program with that file as its only seed and -n 0. Usage: see usage() below. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "fuzz.h"

/* Sanitizer hooks, present when a sanitizer runtime is linked (weak: absent otherwise). */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));
extern size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

/* Defaults for the fuzz programs only (ASAN_OPTIONS / UBSAN_OPTIONS still override):
 * an allocation over 256 MiB from inputs of a few KiB is a finding, not a slow test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=0:max_allocation_size_mb=256:hard_rss_limit_mb=2048:detect_leaks=1";
}
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1"; }

typedef struct entry {
    uint8_t *data;
    size_t len;
} entry;

static struct {
    const char *prog; /* the target's name, from argv[0] */
    char crash_dir[512];
    const uint8_t *volatile cur;
    volatile size_t cur_len;
    volatile sig_atomic_t running; /* an input is inside the target */
    unsigned per_input_s;
} g = {.per_input_s = 10};

/* ---- findings: written from signal handlers and sanitizer callbacks, so only
 * async-signal-safe calls (open, write, close) ---- */

static void put(const char *s) {
    size_t n = strlen(s);
    while (n) {
        ssize_t k = write(2, s, n);
        if (k <= 0) return;
        s += k;
        n -= (size_t)k;
    }
}

static void save_reproducer(const char *why) {
    if (!g.running) return;
    g.running = 0;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < g.cur_len; i++) h = (h ^ g.cur[i]) * 1099511628211ull;
    char path[700], hex[17];
    for (int i = 15; i >= 0; i--, h >>= 4) hex[i] = "0123456789abcdef"[h & 15];
    hex[16] = 0;
    size_t at = 0;
    const char *pieces[] = {g.crash_dir, "/crash-", g.prog, "-", hex};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
        for (const char *c = pieces[i]; *c && at + 1 < sizeof path; c++) path[at++] = *c;
    path[at] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int ok = fd >= 0;
    for (size_t done = 0; ok && done < g.cur_len;) {
        ssize_t k = write(fd, g.cur + done, g.cur_len - done);
        if (k <= 0) ok = 0;
        else done += (size_t)k;
    }
    if (fd >= 0) close(fd);
    put("\nfuzz: FINDING in ");
    put(g.prog);
    put(": ");
    put(why);
    if (g.cur_len <= 4096) { /* CI logs outlive the build folder: show the bytes too */
        put("\nfuzz: the input, C-escaped: \"");
        for (size_t i = 0; i < g.cur_len; i++) {
            unsigned char c = g.cur[i];
            char esc[5] = {(char)c, 0};
            if (c == '"' || c == '\\') esc[0] = '\\', esc[1] = (char)c, esc[2] = 0;
            else if (c < 0x20 || c >= 0x7f) {
                esc[0] = '\\';
                esc[1] = (char)('0' + (c >> 6));
                esc[2] = (char)('0' + ((c >> 3) & 7));
                esc[3] = (char)('0' + (c & 7));
            }
            put(esc);
        }
        put("\"");
    }
    if (ok) {
        put("\nfuzz: the input is in ");
        put(path);
        put("\nfuzz: replay it with: ");
        put(g.prog);
        put(" -n 0 ");
        put(path);
        put("\n");
    } else {
        put("\nfuzz: could not write the reproducer to ");
        put(path);
        put("\n");
    }
}

static void on_sanitizer_death(void) { save_reproducer("a sanitizer report (above)"); }

/* ASan calls this as it starts a report: symbolising the stacks may take seconds, which
 * must not pass for a hang. */
void __asan_on_error(void);
void __asan_on_error(void) { alarm(0); }

static volatile sig_atomic_t alarm_strikes;

static void on_signal(int sig) {
    /* the first alarm may have caught a slow report (UBSan has no hook like the one
     * above): the input gets a second period before it counts as a hang */
    if (sig == SIGALRM && g.running && !alarm_strikes++) {
        alarm(g.per_input_s);
        return;
    }
    save_reproducer(sig == SIGALRM ? "the input ran past the per-input time limit (-T): a hang?"
                    : sig == SIGABRT ? "abort() (an assertion or a violated property, above)"
                                     : "a fatal signal (crash)");
    if (sig == SIGALRM) _exit(70);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_exit_call(void) {
    save_reproducer("the target called exit() in the middle of an input");
}

/* ---- the PRNG (splitmix64) ---- */

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ---- the corpus ---- */

#define MAX_CORPUS 4096
static entry corpus[MAX_CORPUS];
static size_t n_corpus, n_seeds;

static void add_entry(const uint8_t *data, size_t len) {
    if (n_corpus == MAX_CORPUS) return;
    entry *e = &corpus[n_corpus++];
    e->data = malloc(len ? len : 1);
    if (!e->data) abort();
    if (len) memcpy(e->data, data, len);
    e->len = len;
}

/* Outcomes seen: hashes of the normalised error message (open addressing, 0 = empty). */
#define OUTCOME_SLOTS 8192
static uint64_t outcomes[OUTCOME_SLOTS];
static size_t n_outcomes;

/* The error message without digits, quoted text, or words holding a '/' or a non-ASCII
 * byte (values, names, paths), so "key 'x': expected an integer" is one outcome whatever
 * x is. */
static uint64_t outcome_hash(void) {
    const char *m = strata_error();
    uint64_t h = 1469598103934665603ull ^ (uint64_t)fuzz_accepted;
    char quote = 0;
    while (*m) {
        size_t word = strcspn(m, " ");
        int keep = 1;
        for (size_t i = 0; i < word; i++)
            if (m[i] == '/' || (unsigned char)m[i] >= 0x80) keep = 0;
        for (size_t i = 0; keep && i < word; i++) {
            char c = m[i];
            if (quote) {
                if (c == quote) quote = 0;
                continue;
            }
            if (c == '\'' || c == '"') {
                quote = c;
                continue;
            }
            if (c >= '0' && c <= '9') continue;
            h = (h ^ (unsigned char)c) * 1099511628211ull;
        }
        h = (h ^ ' ') * 1099511628211ull;
        m += word;
        m += strspn(m, " ");
    }
    return h ? h : 1;
}

static int new_outcome(uint64_t h) {
    if (n_outcomes * 2 >= OUTCOME_SLOTS) return 0;
    for (size_t i = h % OUTCOME_SLOTS;; i = (i + 1) % OUTCOME_SLOTS) {
        if (outcomes[i] == h) return 0;
        if (!outcomes[i]) {
            outcomes[i] = h;
            n_outcomes++;
            return 1;
        }
    }
}

/* ---- running one input ---- */

static unsigned long long leak_checks;

static void run_one(const uint8_t *data, size_t len) {
    size_t before = __sanitizer_get_current_allocated_bytes ? __sanitizer_get_current_allocated_bytes() : 0;
    strata_clear_error();
    fuzz_accepted = 0;
    g.cur = data;
    g.cur_len = len;
    g.running = 1;
    alarm_strikes = 0;
    alarm(g.per_input_s);
    LLVMFuzzerTestOneInput(data, len);
    alarm(0);
    /* Memory still held after the input returned: a leak, or a cache filled once. Only
     * then is the (slower) leak check run, with the input still marked as current. */
    if (__sanitizer_get_current_allocated_bytes && __lsan_do_recoverable_leak_check &&
        __sanitizer_get_current_allocated_bytes() > before) {
        leak_checks++;
        if (__lsan_do_recoverable_leak_check()) {
            save_reproducer("memory leaked (the leak report is above)");
            _exit(71);
        }
    }
    g.running = 0;
}

/* ---- mutations ---- */

static const uint8_t interesting_bytes[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe, 0x20, '\n', '\t', '"', '\\',
                                            '\'', '{', '}', '[', ']', ':', ',', '-', '.', '0', '9', '#', '&',
                                            '*', '!', '|', '>', '/', 0xc0, 0xe2, 0xf4};
static const uint64_t interesting_ints[] = {0,          1,          2,          0x7f,       0x80,
                                            0xff,       0x100,      0x7fff,     0x8000,     0xffff,
                                            0x10000,    0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull,
                                            1u << 20,   1u << 30,   INT64_MAX,  (uint64_t)INT64_MIN,
                                            UINT64_MAX, UINT64_MAX - 1, 20240520,   20240328};
static const char *const interesting_numbers[] = {
    "0", "1", "-1", "-0", "2147483647", "2147483648", "-2147483648", "-2147483649", "4294967295", "4294967296",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "99999999999999999999999999", "1e308", "1e309", "-1e309", "1e-400", "0.1", "0x10",
    "nan", ".nan", ".inf", "-.inf", "1.5", "3"};

/* Each returns the new length; data has room for max bytes. */
static size_t mutate_once(uint8_t *d, size_t len, size_t max) {
    switch (below(11)) {
    case 0: /* flip a bit */
        if (!len) break;
        d[below(len)] ^= (uint8_t)(1u << below(8));
        return len;
    case 1: /* an interesting byte */
        if (!len) break;
        d[below(len)] = interesting_bytes[below(sizeof interesting_bytes)];
        return len;
    case 2: /* a random byte */
        if (!len) break;
        d[below(len)] = (uint8_t)rnd();
        return len;
    case 3: { /* insert 1..8 bytes: random, or one repeated */
        size_t n = 1 + below(8);
        if (len + n > max) break;
        size_t at = below(len + 1);
        memmove(d + at + n, d + at, len - at);
        int repeat = (int)below(2);
        uint8_t b = repeat ? interesting_bytes[below(sizeof interesting_bytes)] : 0;
        for (size_t i = 0; i < n; i++) d[at + i] = repeat ? b : (uint8_t)rnd();
        return len + n;
    }
    case 4: { /* delete a range, usually short */
        if (!len) break;
        size_t at = below(len);
        size_t n = 1 + (below(4) ? below(8) : below(len - at));
        if (n > len - at) n = len - at;
        memmove(d + at, d + at + n, len - at - n);
        return len - n;
    }
    case 5: { /* copy a chunk of this input elsewhere, inserted or overwriting */
        if (len < 2) break;
        size_t from = below(len), n = 1 + below(len - from < 64 ? len - from : 64);
        uint8_t tmp[64];
        memcpy(tmp, d + from, n);
        size_t at = below(len + 1);
        if (below(2) && len + n <= max) {
            memmove(d + at + n, d + at, len - at);
            memcpy(d + at, tmp, n);
            return len + n;
        }
        if (at + n > len) n = len - at;
        memcpy(d + at, tmp, n);
        return len;
    }
    case 6: { /* splice: this input's head, another entry's tail */
        const entry *o = &corpus[below(n_corpus)];
        if (!o->len) break;
        size_t cut = below(len + 1), from = below(o->len), n = o->len - from;
        if (cut + n > max) n = max - cut;
        memcpy(d + cut, o->data + from, n);
        return cut + n;
    }
    case 7: { /* insert a chunk of another entry */
        const entry *o = &corpus[below(n_corpus)];
        if (!o->len) break;
        size_t from = below(o->len), n = 1 + below(o->len - from < 128 ? o->len - from : 128);
        if (len + n > max) break;
        size_t at = below(len + 1);
        memmove(d + at + n, d + at, len - at);
        memcpy(d + at, o->data + from, n);
        return len + n;
    }
    case 8: { /* a binary integer field: a boundary value, or the old one nudged */
        size_t w = (size_t)1 << below(4); /* 1, 2, 4, 8 bytes */
        if (len < w) break;
        size_t at = below(len - w + 1);
        int big_endian = below(4) == 0;
        uint64_t v;
        if (below(3)) {
            v = interesting_ints[below(sizeof interesting_ints / sizeof *interesting_ints)];
        } else {
            v = 0;
            for (size_t i = 0; i < w; i++) v |= (uint64_t)d[at + (big_endian ? w - 1 - i : i)] << (8 * i);
            v += (uint64_t)(int64_t)((int)below(33) - 16);
        }
        for (size_t i = 0; i < w; i++) d[at + (big_endian ? w - 1 - i : i)] = (uint8_t)(v >> (8 * i));
        return len;
    }
    case 9: { /* a decimal number in text replaced by a boundary value */
        if (!len) break;
        size_t at = below(len), tries = 0;
        while (tries < len && !(d[at] >= '0' && d[at] <= '9')) at = (at + 1) % len, tries++;
        if (tries == len) break; /* no digit: nothing to replace */
        size_t a = at, b = at;
        while (a > 0 && d[a - 1] >= '0' && d[a - 1] <= '9') a--;
        while (b < len && ((d[b] >= '0' && d[b] <= '9') || d[b] == '.' || d[b] == 'e')) b++;
        const char *num = interesting_numbers[below(sizeof interesting_numbers / sizeof *interesting_numbers)];
        size_t n = strlen(num);
        if (len - (b - a) + n > max) break;
        memmove(d + a + n, d + b, len - b);
        memcpy(d + a, num, n);
        return len - (b - a) + n;
    }
    case 10: /* truncate */
        if (!len) break;
        return below(len);
    }
    return len;
}

/* ---- seeds ---- */

static int load_file(const char *path, size_t max, int *valid) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot read seed %s: %s\n", g.prog, path, strerror(errno));
        return -1;
    }
    uint8_t *buf = malloc(max + 1);
    if (!buf) abort();
    size_t n = fread(buf, 1, max + 1, f);
    fclose(f);
    if (n > max) {
        fprintf(stderr, "%s: seed %s is longer than the %zu-byte input limit (-l)\n", g.prog, path, max);
        free(buf);
        return -1;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    *valid = !strncmp(base, "valid-", 6);
    add_entry(buf, n);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A folder's regular files in name order (so runs with the same -s are the same). */
static int load_seeds(const char *path, size_t max, char ***valid_names, size_t *n_valid) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: %s: %s\n", g.prog, path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        if (!dir) {
            fprintf(stderr, "%s: cannot list %s: %s\n", g.prog, path, strerror(errno));
            return -1;
        }
        for (struct dirent *e; (e = readdir(dir));) {
            if (e->d_name[0] == '.') continue;
            char *full = malloc(strlen(path) + strlen(e->d_name) + 2);
            if (!full) abort();
            sprintf(full, "%s/%s", path, e->d_name);
            if (stat(full, &st) != 0 || !S_ISREG(st.st_mode)) {
                free(full);
                continue;
            }
            names = realloc(names, (n + 1) * sizeof *names);
            if (!names) abort();
            names[n++] = full;
        }
        closedir(dir);
        qsort(names, n, sizeof *names, by_name);
    } else {
        names = malloc(sizeof *names);
        if (!names) abort();
        names[n++] = strdup(path);
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int valid = 0;
        if (!rc && load_file(names[i], max, &valid) != 0) rc = -1;
        if (!rc && valid) {
            *valid_names = realloc(*valid_names, (*n_valid + 1) * sizeof **valid_names);
            if (!*valid_names) abort();
            (*valid_names)[(*n_valid)++] = strdup(names[i]);
        } else if (!rc) {
            *valid_names = realloc(*valid_names, (*n_valid + 1) * sizeof **valid_names);
            if (!*valid_names) abort();
            (*valid_names)[(*n_valid)++] = NULL;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

static void usage(void) {
    fprintf(stderr,
            "usage: %s [-t SECONDS] [-n RUNS] [-s SEED] [-l BYTES] [-T SECONDS] [-o DIR] [-v] SEEDS...\n"
            "  SEEDS      files, or folders whose files are the seed corpus (tests/fuzz/seeds/NAME)\n"
            "  -t SECONDS stop mutating after this long (default 10; 0 = run the seeds only)\n"
            "  -n RUNS    stop after this many mutated inputs (default: no limit; 0 = seeds only)\n"
            "  -s SEED    the PRNG seed (default: from the clock; printed, so a run can be repeated)\n"
            "  -l BYTES   longest input (default 65536)\n"
            "  -T SECONDS a single input running twice as long is a finding (default 10)\n"
            "  -o DIR     where a finding's input is written (default: the current folder)\n"
            "  -v         print each new outcome (error message) as it is first reached\n",
            g.prog);
}

static int parse_num(const char *opt, const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || *s == '-') {
        fprintf(stderr, "%s: %s expects a non-negative integer, got '%s'\n", g.prog, opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    const char *slash = strrchr(argv[0], '/');
    g.prog = slash ? slash + 1 : argv[0];
    snprintf(g.crash_dir, sizeof g.crash_dir, ".");
    unsigned long long seconds = 10, runs = ~0ull, max_len = 65536, per_input = 10, seed = 0;
    int seed_given = 0, verbose = 0, opt;
    while ((opt = getopt(argc, argv, "t:n:s:l:T:o:vh")) != -1) {
        int bad = 0;
        switch (opt) {
        case 't': bad = parse_num("-t", optarg, &seconds); break;
        case 'n': bad = parse_num("-n", optarg, &runs); break;
        case 's': bad = parse_num("-s", optarg, &seed), seed_given = 1; break;
        case 'l': bad = parse_num("-l", optarg, &max_len) || max_len == 0 || max_len > (1u << 26); break;
        case 'T': bad = parse_num("-T", optarg, &per_input) || per_input == 0 || per_input > 3600; break;
        case 'o': snprintf(g.crash_dir, sizeof g.crash_dir, "%s", optarg); break;
        case 'v': verbose = 1; break;
        default: usage(); return opt == 'h' ? 0 : 2;
        }
        if (bad) {
            usage();
            return 2;
        }
    }
    if (optind == argc) {
        usage();
        return 2;
    }
    g.per_input_s = (unsigned)per_input;
    if (!seed_given) seed = (unsigned long long)time(NULL) * 1000003ull ^ (unsigned long long)getpid();
    rng_state = seed;

    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(on_sanitizer_death);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGALRM, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
    /* A sanitizer reports crashes itself (and calls back above): keep its handlers. */
    if (!__sanitizer_set_death_callback) {
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        sigaction(SIGFPE, &sa, NULL);
        sigaction(SIGILL, &sa, NULL);
    }
    atexit(on_exit_call);
    strata_log_set_level(STRATA_LOG_ERROR); /* targets' warnings are expected noise */

    char **valid = NULL;
    size_t n_valid = 0;
    for (int i = optind; i < argc; i++)
        if (load_seeds(argv[i], (size_t)max_len, &valid, &n_valid) != 0) return 2;
    n_seeds = n_corpus;
    if (!n_seeds) {
        fprintf(stderr, "%s: no seeds in", g.prog);
        for (int i = optind; i < argc; i++) fprintf(stderr, " %s", argv[i]);
        fprintf(stderr, "\n");
        return 2;
    }
    printf("%s: %zu seeds, PRNG seed %llu, budget %llu s", g.prog, n_seeds, seed, seconds);
    if (runs != ~0ull) printf(" or %llu runs", runs);
    printf("\n");
    fflush(stdout);

    int stale = 0;
    for (size_t i = 0; i < n_seeds; i++) {
        run_one(corpus[i].data, corpus[i].len);
        new_outcome(outcome_hash());
        if (verbose) printf("seed %zu: %s\n", i, fuzz_accepted ? "accepted" : strata_error());
        if (valid[i] && !fuzz_accepted) {
            fprintf(stderr, "%s: seed %s is no longer accepted: %s\n  (regenerate it: tests/fuzz/README.md)\n",
                    g.prog, valid[i], strata_error()[0] ? strata_error() : "(no message)");
            stale = 1;
        }
    }
    for (size_t i = 0; i < n_valid; i++) free(valid[i]);
    free(valid);
    if (stale) return 1;

    uint8_t *buf = malloc((size_t)max_len);
    if (!buf) abort();
    double t0 = strata_now_ms(), deadline = t0 + 1000.0 * (double)seconds;
    unsigned long long done = 0;
    while (done < runs && seconds > 0) {
        if ((done & 63) == 0 && strata_now_ms() >= deadline) break;
        const entry *e = &corpus[below(n_corpus)];
        size_t len = e->len < max_len ? e->len : (size_t)max_len;
        memcpy(buf, e->data, len);
        size_t n_mut = 1 + (below(2) ? 0 : below(4));
        for (size_t k = 0; k < n_mut; k++) len = mutate_once(buf, len, (size_t)max_len);
        run_one(buf, len);
        if (new_outcome(outcome_hash())) {
            add_entry(buf, len);
            if (verbose) printf("new outcome %zu: %s\n", n_outcomes, fuzz_accepted ? "accepted" : strata_error());
        }
        done++;
    }
    double secs = (strata_now_ms() - t0) / 1000.0;
    printf("%s: %llu runs in %.1f s (%.0f/s), %zu outcomes, corpus %zu (%zu seeds), %llu leak checks, no "
           "finding\n",
           g.prog, done, secs, secs > 0 ? (double)done / secs : 0.0, n_outcomes, n_corpus, n_seeds, leak_checks);
    free(buf);
    for (size_t i = 0; i < n_corpus; i++) free(corpus[i].data);
    return 0;
}
