/* tests/fuzz/fuzz.h: what the fuzz targets share.
 *
 * A target is one file tests/fuzz/fuzz_<name>.c defining LLVMFuzzerTestOneInput, so it
 * links either with the in-tree mutation loop (tests/fuzz/driver.c, what CI runs) or with
 * clang's libFuzzer (-fsanitize=fuzzer). Its seeds live in tests/fuzz/seeds/<name>/.
 *
 * Inputs that stand for several files (a checkpoint's manifest and rank files, a config
 * and the base it builds on) are the files' bytes joined by NUL bytes: no text format a
 * target reads allows a NUL, so splitting there loses nothing a parser could accept.
 * Parsers that read a path get the bytes written to a file in a temporary folder of this
 * process, removed at exit. */
#ifndef STRATA_TESTS_FUZZ_H
#define STRATA_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Set by a target when the input was accepted all the way through (not just survived).
 * The driver clears it before each input; seeds named valid-* must set it, so a seed
 * that a format change made stale is noticed instead of fuzzing only the first check. */
extern int fuzz_accepted;

/* This process's temporary folder ($TMPDIR or /tmp, strata-fuzz-XXXXXX), made on the
 * first call and removed with its contents at exit. */
const char *fuzz_tmpdir(void);

/* Writes bytes to `name` inside fuzz_tmpdir() (replacing it) and returns its path, which
 * stays valid until the next call with the same name. */
const char *fuzz_write(const char *name, const void *data, size_t len);
/* Removes `name` from fuzz_tmpdir() if it is there. */
void fuzz_remove(const char *name);
/* The path of `name` inside fuzz_tmpdir() (a static buffer per call site is the caller's). */
void fuzz_path(char *out, size_t outlen, const char *name);

typedef struct fuzz_part {
    const uint8_t *data;
    size_t len;
} fuzz_part;

/* Splits data at NUL bytes into at most max parts (the last takes the rest, NULs and
 * all); returns how many. */
size_t fuzz_split(const uint8_t *data, size_t size, fuzz_part *parts, size_t max);

/* For a property a target checks (a round trip, a lookup): prints and aborts, which the
 * driver reports as a finding with its reproducer. */
_Noreturn void fuzz_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
