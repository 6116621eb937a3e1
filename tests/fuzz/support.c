/* tests/fuzz/support.c: the temporary folder, file writing and input splitting the fuzz
 * targets share (tests/fuzz/fuzz.h). Linked into every target, with either engine. */
#include "fuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fuzz_accepted;

static char tmpdir[512];
static pid_t tmpdir_owner;

/* The harness itself failing (no temp folder, a full disk) is not a finding: say so. */
static _Noreturn void harness_failure(const char *what, const char *path) {
    fprintf(stderr, "fuzz harness: %s %s: %s\n", what, path, strerror(errno));
    _exit(99);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_tmpdir(void) {
    if (tmpdir[0] && getpid() == tmpdir_owner) nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_tmpdir(void) {
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        if (!base || !*base) base = "/tmp";
        snprintf(tmpdir, sizeof tmpdir, "%s/strata-fuzz-XXXXXX", base);
        if (!mkdtemp(tmpdir)) harness_failure("cannot make the temporary folder", tmpdir);
        tmpdir_owner = getpid();
        atexit(remove_tmpdir);
    }
    return tmpdir;
}

void fuzz_path(char *out, size_t outlen, const char *name) {
    if (snprintf(out, outlen, "%s/%s", fuzz_tmpdir(), name) >= (int)outlen) {
        errno = ENAMETOOLONG;
        harness_failure("path too long:", name);
    }
}

const char *fuzz_write(const char *name, const void *data, size_t len) {
    /* a few slots, so a target can hold several paths at once */
    static char paths[8][640];
    static unsigned next;
    char *path = paths[next++ % 8];
    fuzz_path(path, sizeof paths[0], name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) harness_failure("cannot write", path);
    const char *p = data;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) harness_failure("cannot write", path);
        p += k;
        len -= (size_t)k;
    }
    close(fd);
    return path;
}

void fuzz_remove(const char *name) {
    char path[640];
    fuzz_path(path, sizeof path, name);
    if (unlink(path) != 0 && errno != ENOENT) harness_failure("cannot remove", path);
}

size_t fuzz_split(const uint8_t *data, size_t size, fuzz_part *parts, size_t max) {
    size_t n = 0, start = 0;
    if (!data) data = (const uint8_t *)""; /* libFuzzer may pass NULL for an empty input */
    while (n + 1 < max) {
        const uint8_t *nul = size > start ? memchr(data + start, 0, size - start) : NULL;
        if (!nul) break;
        size_t end = (size_t)(nul - data);
        parts[n++] = (fuzz_part){data + start, end - start};
        start = end + 1;
    }
    parts[n++] = (fuzz_part){data + start, size - start};
    return n;
}

void fuzz_violation(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: property violated: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
