/* core/common.h: status codes, the per-thread error buffer, logging with rank and
 * subsystem tags, and small helpers every layer uses.
 *
 * Functions that can fail return int (0 ok, nonzero failure) or a pointer that is NULL
 * on failure; the reason is left in a per-thread buffer (strata_error()) by
 * strata_fail(). Callers add context with strata_fail() again ("while loading X: ...")
 * and the top level prints it once. */
#ifndef STRATA_COMMON_H
#define STRATA_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* C11 spells it _Noreturn; the CUDA sources include this header as C++. */
#if defined(__cplusplus) && !defined(_Noreturn)
#define _Noreturn [[noreturn]]
#endif

/* The longest path a config key or a file Strata writes may name. */
#define STRATA_PATH_MAX 1024

/* Process exit codes shared by every subcommand. */
enum {
    STRATA_EXIT_OK = 0,
    STRATA_EXIT_ERROR = 1,  /* run-time failure: I/O, NaN, a rank died, corrupt checkpoint */
    STRATA_EXIT_USAGE = 2,  /* bad command line or config: nothing was started */
    STRATA_EXIT_NOFIT = 3,  /* the memory plan does not fit: nothing was allocated */
    STRATA_EXIT_OOM = 4,    /* the device ran out of memory mid-run (another process took some):
                               the last completed step was checkpointed; resume when it is free */
    STRATA_EXIT_HUNG = 5,   /* a step or validation made no progress for run.hang_timeout_s:
                               the run ended rather than hang; the last checkpoint is intact */
};

/* Records a formatted message as this thread's error and returns -1, so
 * `return strata_fail("...")` reads naturally. */
int strata_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Layers context over the current error: "<formatted>: <previous error>". */
int strata_fail_wrap(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *strata_error(void);
void strata_clear_error(void);

/* ---- the error contract ----
 * Every call that can fail (a nonzero status, with strata_error() set) either propagates
 * its status or ignores it on purpose, by one of these names (NCCL's checks.h is the
 * model); no such call stands as a bare statement:
 *   STRATA_TRY(call)                  on failure, returns -1 from the enclosing function
 *   STRATA_TRY_GOTO(call, rc, label)  on failure, sets rc = -1 and jumps to label (cleanup)
 *   STRATA_IGNORE(call)               on failure, logs a warning and goes on: only where
 *                                     going on is right (a best-effort report; cleanup on a
 *                                     path that is already failing)
 * A POSIX call whose failure cannot matter (close of a read-only descriptor, unlink of a
 * temporary file on a path that already failed) is cast to (void) with a comment saying
 * why: it sets errno, not strata_error(), so STRATA_IGNORE would report the wrong thing.
 * A failure's message names the call and where it was made, over the callee's own:
 * "engine.c:1063: strata_memcpy_async(d, d->compute, ...): memcpy of 8 bytes on stream
 * \"compute\": ...". */
#define STRATA_TRY(call)                                                              \
    do {                                                                              \
        if ((call) != 0) return strata_fail_call(__FILE__, __LINE__, #call);          \
    } while (0)
#define STRATA_TRY_GOTO(call, rc, label)                                              \
    do {                                                                              \
        if ((call) != 0) {                                                            \
            (rc) = strata_fail_call(__FILE__, __LINE__, #call);                       \
            goto label;                                                               \
        }                                                                             \
    } while (0)
#define STRATA_IGNORE(call)                                                           \
    do {                                                                              \
        if ((call) != 0) strata_ignored_call(__FILE__, __LINE__, #call);              \
    } while (0)
/* What the macros call: wraps the error as "<file>:<line>: <call>: <error>" and returns -1;
 * or logs that as a warning. */
int strata_fail_call(const char *file, int line, const char *call);
void strata_ignored_call(const char *file, int line, const char *call);

/* The process-wide device fault record. A kernel wrapper has no status to return (the
 * kernel table's functions are void), so a device failure it can survive, an allocation
 * that ran out of memory, is recorded here and the wrapper carries on: the kernel did not
 * run, which spoils only the step in flight. The engine takes the record before any update
 * touches the state and abandons the step. The first fault wins (later ones are usually
 * its consequences); recording and taking are thread-safe. */
enum {
    STRATA_FAULT_NONE = 0,
    STRATA_FAULT_DEVICE = 1, /* some other device failure */
    STRATA_FAULT_OOM = 2,    /* out of device memory */
};
void strata_fault_record(int oom, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The pending fault's kind (STRATA_FAULT_*), its message copied into msg (n > 0); the
 * record is left in place. */
int strata_fault_peek(char *msg, size_t n);
/* The same, and clears the record. */
int strata_fault_take(char *msg, size_t n);

typedef enum strata_log_level {
    STRATA_LOG_ERROR = 0,
    STRATA_LOG_WARN = 1,
    STRATA_LOG_INFO = 2,
    STRATA_LOG_DEBUG = 3,
} strata_log_level;

/* The one piece of process state: log level and this process's rank, set once at
 * start-up (STRATA_LOG=debug|info|warn|error overrides the level). */
void strata_log_init(int rank, int world);
void strata_log_set_level(strata_log_level level);
int strata_log_rank(void);
/* Lines look like "[rank 1] [zero] message"; single-rank runs drop the rank prefix. */
void strata_log(strata_log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define STRATA_INFO(tag, ...) strata_log(STRATA_LOG_INFO, tag, __VA_ARGS__)
#define STRATA_WARN(tag, ...) strata_log(STRATA_LOG_WARN, tag, __VA_ARGS__)
#define STRATA_DEBUG(tag, ...) strata_log(STRATA_LOG_DEBUG, tag, __VA_ARGS__)
#define STRATA_ERROR(tag, ...) strata_log(STRATA_LOG_ERROR, tag, __VA_ARGS__)

/* stdout and stderr can go away while a run goes on: `strata train CONFIG | tee log`, then
 * Ctrl-C, ends tee too. `strata train` ignores SIGPIPE (launcher/signals.c), so a write to
 * the closed pipe fails (EPIPE) instead of ending the process. Lines written through
 * strata_log or strata_out_printf are flushed at once and checked: the first failure marks
 * that stream lost, and nothing more is written to it (its descriptor is pointed at
 * /dev/null, so stray writes elsewhere cannot fail either). From then on every such line,
 * of either stream, also goes to the file the lost-stream hook returns, if any. Other
 * writes to stdout and stderr (reports, tables) are left unchecked on purpose: a failure
 * there shows at the next checked line. */
void strata_out_printf(FILE *stream, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The errno of the write that lost stream (stdout or stderr), 0 while it works. */
int strata_out_lost(FILE *stream);
/* hook(name, err, arg) is called once per lost stream ("stdout" or "stderr", the errno of
 * the failed write), at once for one already lost; it returns the open file that lost
 * streams' lines go to from then on (NULL: nowhere). It runs under the output lock, so it
 * must not log. strata_out_set_hook(NULL, NULL) forgets the hook and its file (the caller
 * closes that file afterwards). */
typedef FILE *(*strata_out_hook)(const char *name, int err, void *arg);
void strata_out_set_hook(strata_out_hook hook, void *arg);

/* An invariant broken by our own code (not by input): print where and abort. */
#define STRATA_ASSERT(cond)                                                              \
    do {                                                                                 \
        if (!(cond)) strata_panic(__FILE__, __LINE__, "assertion failed: %s", #cond);    \
    } while (0)
_Noreturn void strata_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Allocation of host bookkeeping memory (not training buffers, which come from the
 * arena): aborts with a message on failure, since nothing sensible follows. */
void *strata_xmalloc(size_t bytes);
void *strata_xcalloc(size_t n, size_t bytes);
void *strata_xrealloc(void *p, size_t bytes);
char *strata_xstrdup(const char *s);

double strata_now_ms(void); /* monotonic clock */

/* The CPUs this process may run on (its affinity mask: a container's or taskset's share,
 * not the machine's count), at least 1. */
int strata_cpus_available(void);

/* A wait that might never end says so. Every blocking wait of the device backends (an event
 * or stream sync, a stream waiting for another's record) wakes at least every second
 * (strata_wait_tick) and calls strata_long_wait_check: after STRATA_WAIT_REPORT_S seconds
 * (default 300; 0: never) and again at each doubling it returns the seconds waited, and the
 * waiter names what it waits for and where every stream stands (a warning; the wait goes
 * on, since a long wait may be a slow disk, not a hang). */
typedef struct strata_long_wait {
    double start_ms, next_s;
} strata_long_wait;
int strata_wait_reports_on(void);
void strata_set_wait_report_s(double seconds); /* tests; <= 0 turns reports off */
void strata_long_wait_begin(strata_long_wait *w);
double strata_long_wait_check(strata_long_wait *w); /* > 0: seconds waited, report now */
struct timespec strata_wait_tick(void);             /* CLOCK_REALTIME, a second from now */
const char *strata_thread_name(char *buf, size_t n); /* "st:<stream>" for stream workers */
/* pthread_cond_wait on cv (mu held) until reached(arg); with reports on, report(arg, seconds)
 * is called whenever one is due, with mu released (it may take other locks). */
void strata_cond_wait_reporting(pthread_cond_t *cv, pthread_mutex_t *mu, int (*reached)(void *arg),
                                void (*report)(void *arg, double waited_s), void *arg);
size_t strata_round_up(size_t x, size_t multiple);
size_t strata_min_size(size_t a, size_t b);

/* Human-readable byte counts ("1.50 GiB") into buf, which is returned. */
const char *strata_fmt_bytes(char *buf, size_t buflen, double bytes);

/* CRC-32C (Castagnoli) of a buffer, chained through `crc` (start with 0). */
uint32_t strata_crc32c(uint32_t crc, const void *data, size_t bytes);

/* Counter-based random numbers: the value for (seed, stream, index) never depends on
 * what was drawn before, so any rank can produce any slice of a tensor's init. */
uint64_t strata_hash64(uint64_t x);
float strata_rand_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* bf16 as the upper 16 bits of an fp32: widening is exact; narrowing rounds to nearest,
 * ties to even, and keeps a NaN a (quiet) NaN. One definition for every CPU-side use. */
static inline float strata_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t strata_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* A small sequential generator for sampling and shuffling (state is checkpointed). */
typedef struct strata_rng {
    uint64_t state;
} strata_rng;
void strata_rng_seed(strata_rng *r, uint64_t seed);
uint64_t strata_rng_next(strata_rng *r);
float strata_rng_uniform(strata_rng *r); /* [0,1) */

#endif
