/* tests/check.h: the assertion macros of the C tests.
 *
 * CHECK(cond, fmt, ...) counts the check, and prints "ok" or "FAIL" with the message (and
 * where, on failure). Tests that loop over many cases set check_quiet = 1 to print only
 * failures; multi-rank tests set check_prefix to "[rank N] ". A test ends with
 * `return check_report();`, which prints the tally and gives the exit code. */
#ifndef STRATA_TESTS_CHECK_H
#define STRATA_TESTS_CHECK_H

#include <stdio.h>

/* unused in a test whose body is compiled out (a GPU test in a build without CUDA) */
static int failures __attribute__((unused)), checks __attribute__((unused));
static int check_quiet __attribute__((unused));
static char check_prefix[32] __attribute__((unused));

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        int ok_ = (cond);                                                        \
        checks++;                                                                \
        if (!ok_) failures++;                                                    \
        if (!ok_ || !check_quiet) {                                              \
            printf("%s%s ", check_prefix, ok_ ? "ok  " : "FAIL");                \
            printf(__VA_ARGS__);                                                 \
            if (!ok_) printf("  (%s:%d)", __FILE__, __LINE__);                   \
            printf("\n");                                                        \
            fflush(stdout);                                                      \
        }                                                                        \
    } while (0)

/* MUST(call): a call that returns a status (0 ok) and must succeed for the test to mean
 * anything, such as a device copy or a stream sync: a failure counts and prints the call
 * and the library's error; success is silent. */
const char *strata_error(void);
#define MUST(call)                                                                         \
    do {                                                                                   \
        if ((call) != 0) {                                                                 \
            checks++;                                                                      \
            failures++;                                                                    \
            printf("%sFAIL %s: %s  (%s:%d)\n", check_prefix, #call, strata_error(), __FILE__, __LINE__); \
            fflush(stdout);                                                                \
        }                                                                                  \
    } while (0)

static inline int check_report(void) {
    printf("%s%s: %d checks, %d failures\n", check_prefix, failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}

#endif
