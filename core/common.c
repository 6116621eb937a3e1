/* core/common.c: errors, logging, allocation, checksums and random numbers. */
#include "core/common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ERROR_MAX 2048

static _Thread_local char error_buf[ERROR_MAX];

int strata_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
    return -1;
}

int strata_fail_wrap(const char *fmt, ...) {
    char prev[ERROR_MAX], ctx[ERROR_MAX / 2];
    memcpy(prev, error_buf, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    /* context, ": ", then as much of the previous message as fits */
    size_t n = strlen(ctx), m = strlen(prev);
    if (m > sizeof error_buf - n - 3) m = sizeof error_buf - n - 3;
    memcpy(error_buf, ctx, n);
    memcpy(error_buf + n, ": ", 2);
    memcpy(error_buf + n + 2, prev, m);
    error_buf[n + 2 + m] = 0;
    return -1;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int strata_fail_call(const char *file, int line, const char *call) {
    return strata_fail_wrap("%s:%d: %s", base_name(file), line, call);
}

void strata_ignored_call(const char *file, int line, const char *call) {
    strata_log(STRATA_LOG_WARN, "ignored", "%s:%d: %s: %s (going on)", base_name(file), line, call, strata_error());
}

const char *strata_error(void) { return error_buf[0] ? error_buf : "unknown error"; }
void strata_clear_error(void) { error_buf[0] = 0; }

/* ---- the device fault record ---- */

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static int fault_kind;
static char fault_msg[ERROR_MAX];

void strata_fault_record(int oom, const char *fmt, ...) {
    char msg[ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&fault_mu);
    if (fault_kind == STRATA_FAULT_NONE) {
        fault_kind = oom ? STRATA_FAULT_OOM : STRATA_FAULT_DEVICE;
        memcpy(fault_msg, msg, sizeof fault_msg);
    }
    pthread_mutex_unlock(&fault_mu);
}

static int fault_read(char *msg, size_t n, int clear) {
    pthread_mutex_lock(&fault_mu);
    int kind = fault_kind;
    if (msg && n) snprintf(msg, n, "%s", kind ? fault_msg : "");
    if (clear) {
        fault_kind = STRATA_FAULT_NONE;
        fault_msg[0] = 0;
    }
    pthread_mutex_unlock(&fault_mu);
    return kind;
}
int strata_fault_peek(char *msg, size_t n) { return fault_read(msg, n, 0); }
int strata_fault_take(char *msg, size_t n) { return fault_read(msg, n, 1); }

/* ---- logging ---- */

static strata_log_level log_level = STRATA_LOG_INFO;
static int log_rank = 0, log_world = 1;

void strata_log_init(int rank, int world) {
    log_rank = rank;
    log_world = world;
    const char *env = getenv("STRATA_LOG");
    if (!env) return;
    if (!strcmp(env, "debug")) log_level = STRATA_LOG_DEBUG;
    else if (!strcmp(env, "info")) log_level = STRATA_LOG_INFO;
    else if (!strcmp(env, "warn")) log_level = STRATA_LOG_WARN;
    else if (!strcmp(env, "error")) log_level = STRATA_LOG_ERROR;
}
void strata_log_set_level(strata_log_level level) { log_level = level; }
int strata_log_rank(void) { return log_rank; }

/* ---- stdout and stderr (core/common.h: strata_out_printf) ---- */

static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static int out_err[2];       /* stdout, stderr: the errno of the write that lost it, 0 while it works */
static strata_out_hook out_hook;
static void *out_hook_arg;
static FILE *out_divert;     /* where lost streams' lines go (NULL: nowhere) */

static int out_index(FILE *f) { return f == stderr; }
static const char *out_name(int i) { return i ? "stderr" : "stdout"; }

/* out_mu held: stream i failed with err. What stdio still holds for it is dropped and its
 * descriptor pointed at /dev/null, so no later write to it (ours or anyone's) fails or blocks
 * on a pipe nobody reads; the hook says where its lines go now. */
static void out_lose(FILE *f, int err) {
    int i = out_index(f);
    out_err[i] = err ? err : EIO;
    __fpurge(f);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) {
        (void)dup2(null, fileno(f)); /* if it fails, the writes just go on failing, unseen */
        (void)close(null);           /* only /dev/null's: nothing to lose */
    }
    clearerr(f);
    if (out_hook) out_divert = out_hook(out_name(i), out_err[i], out_hook_arg);
}

/* out_mu held: one whole line to f, flushed, unless f is lost; and to the divert file once
 * there is one (from a loss on it holds every line, both streams', in order). A divert file
 * that fails too leaves nowhere to say so: its failure is ignored. */
static void out_write(FILE *f, const char *text, size_t len) {
    if (!out_err[out_index(f)]) {
        errno = 0;
        if (fwrite(text, 1, len, f) != len || fflush(f) != 0) out_lose(f, errno);
    }
    if (out_divert && fwrite(text, 1, len, out_divert) == len) (void)fflush(out_divert);
}

void strata_out_printf(FILE *stream, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    pthread_mutex_lock(&out_mu);
    out_write(stream, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    pthread_mutex_unlock(&out_mu);
}

int strata_out_lost(FILE *stream) {
    pthread_mutex_lock(&out_mu);
    int err = out_err[out_index(stream)];
    pthread_mutex_unlock(&out_mu);
    return err;
}

void strata_out_set_hook(strata_out_hook hook, void *arg) {
    pthread_mutex_lock(&out_mu);
    out_hook = hook;
    out_hook_arg = arg;
    out_divert = NULL;
    for (int i = 0; hook && i < 2; i++)
        if (out_err[i]) out_divert = hook(out_name(i), out_err[i], arg);
    pthread_mutex_unlock(&out_mu);
}

void strata_log(strata_log_level level, const char *tag, const char *fmt, ...) {
    if (level > log_level) return;
    char line[4096];
    int n = 0;
    if (log_world > 1) n += snprintf(line + n, sizeof line - n, "[rank %d] ", log_rank);
    if (level == STRATA_LOG_ERROR) n += snprintf(line + n, sizeof line - n, "error: ");
    else if (level == STRATA_LOG_WARN) n += snprintf(line + n, sizeof line - n, "warning: ");
    if (tag && *tag) n += snprintf(line + n, sizeof line - n, "[%s] ", tag);
    va_list ap;
    va_start(ap, fmt);
    if (n < (int)sizeof line - 1) n += vsnprintf(line + n, sizeof line - 1 - n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    line[n] = 0;
    /* One write per line so ranks sharing a terminal do not interleave mid-line. */
    pthread_mutex_lock(&out_mu);
    out_write(level <= STRATA_LOG_WARN ? stderr : stdout, line, (size_t)n);
    pthread_mutex_unlock(&out_mu);
}

_Noreturn void strata_panic(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d] internal error at %s:%d: %s\n", log_rank, file, line, msg);
    fflush(stderr);
    abort();
}

/* ---- allocation ---- */

void *strata_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) strata_panic(__FILE__, __LINE__, "out of host memory allocating %zu bytes", bytes);
    return p;
}
void *strata_xcalloc(size_t n, size_t bytes) {
    void *p = calloc(n ? n : 1, bytes ? bytes : 1);
    if (!p) strata_panic(__FILE__, __LINE__, "out of host memory allocating %zu x %zu bytes", n, bytes);
    return p;
}
void *strata_xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) strata_panic(__FILE__, __LINE__, "out of host memory reallocating %zu bytes", bytes);
    return q;
}
char *strata_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = strata_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

/* ---- small helpers ---- */

double strata_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int strata_cpus_available(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- long waits ---- */

/* milliseconds before the first report; -2: not read from the environment yet, 0: off */
static int64_t wait_report_ms = -2;

static int64_t wait_report_get(void) {
    int64_t ms = __atomic_load_n(&wait_report_ms, __ATOMIC_RELAXED);
    if (ms != -2) return ms;
    const char *env = getenv("STRATA_WAIT_REPORT_S");
    char *end = NULL;
    double s = env && *env ? strtod(env, &end) : 300.0;
    if (env && *env && (*end || !(s >= 0))) {
        STRATA_WARN("device", "STRATA_WAIT_REPORT_S='%s' is not a number of seconds: using 300", env);
        s = 300.0;
    }
    int64_t want = (int64_t)(s * 1e3), expected = -2;
    __atomic_compare_exchange_n(&wait_report_ms, &expected, want, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return __atomic_load_n(&wait_report_ms, __ATOMIC_RELAXED);
}

int strata_wait_reports_on(void) { return wait_report_get() > 0; }

void strata_set_wait_report_s(double seconds) {
    __atomic_store_n(&wait_report_ms, seconds > 0 ? (int64_t)(seconds * 1e3) : 0, __ATOMIC_RELAXED);
}

void strata_long_wait_begin(strata_long_wait *w) {
    int64_t ms = wait_report_get();
    w->start_ms = strata_now_ms();
    w->next_s = ms > 0 ? ms * 1e-3 : -1.0;
}

double strata_long_wait_check(strata_long_wait *w) {
    if (w->next_s <= 0) return 0;
    double waited = (strata_now_ms() - w->start_ms) * 1e-3;
    if (waited < w->next_s) return 0;
    while (w->next_s <= waited) w->next_s *= 2;
    return waited;
}

struct timespec strata_wait_tick(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    return ts;
}

void strata_cond_wait_reporting(pthread_cond_t *cv, pthread_mutex_t *mu, int (*reached)(void *arg),
                                void (*report)(void *arg, double waited_s), void *arg) {
    if (!reached(arg) && strata_wait_reports_on()) {
        strata_long_wait w;
        strata_long_wait_begin(&w);
        while (!reached(arg)) {
            struct timespec tick = strata_wait_tick();
            pthread_cond_timedwait(cv, mu, &tick);
            double waited = reached(arg) ? 0 : strata_long_wait_check(&w);
            if (waited > 0) {
                pthread_mutex_unlock(mu);
                report(arg, waited);
                pthread_mutex_lock(mu);
            }
        }
    }
    while (!reached(arg)) pthread_cond_wait(cv, mu);
}

const char *strata_thread_name(char *buf, size_t n) {
    if (n == 0) return buf;
    if (pthread_getname_np(pthread_self(), buf, n) != 0) snprintf(buf, n, "?");
    return buf;
}

size_t strata_round_up(size_t x, size_t multiple) {
    return multiple ? (x + multiple - 1) / multiple * multiple : x;
}
size_t strata_min_size(size_t a, size_t b) { return a < b ? a : b; }

const char *strata_fmt_bytes(char *buf, size_t buflen, double bytes) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = bytes < 0 ? -bytes : bytes;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (bytes < 0) v = -v;
    if (u == 0) snprintf(buf, buflen, "%.0f B", v);
    else snprintf(buf, buflen, "%.2f %s", v, units[u]);
    return buf;
}

/* CRC-32C, slicing by one byte with a table built once (checkpoint verification reads
 * at disk speed, so this is not the bottleneck worth more code). */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}
uint32_t strata_crc32c(uint32_t crc, const void *data, size_t bytes) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    /* slicing-by-8: eight table lookups per 8 bytes */
    while (bytes >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
              crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        bytes -= 8;
    }
    while (bytes--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* ---- random numbers ---- */

uint64_t strata_hash64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static uint64_t key3(uint64_t seed, uint64_t stream, uint64_t index) {
    return strata_hash64(strata_hash64(strata_hash64(seed) ^ stream) ^ index);
}
float strata_rand_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    /* Box-Muller on two independent draws derived from the same counter. */
    uint64_t h = key3(seed, stream, index);
    double u1 = ((h >> 11) + 1) * (1.0 / 9007199254740993.0); /* (0,1] */
    double u2 = (strata_hash64(h) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void strata_rng_seed(strata_rng *r, uint64_t seed) { r->state = strata_hash64(seed ^ 0x5EEDull); }
uint64_t strata_rng_next(strata_rng *r) {
    r->state += 0x9E3779B97F4A7C15ull;
    return strata_hash64(r->state);
}
float strata_rng_uniform(strata_rng *r) { return (float)(strata_rng_next(r) >> 40) * (1.0f / 16777216.0f); }
