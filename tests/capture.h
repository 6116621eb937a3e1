/* tests/capture.h: what a piece of code writes to stderr, for tests that check a message.
 * capture_begin points fd 2 at a temporary file; capture_end points it back and returns
 * what was written (malloc'd, NUL-terminated). */
#ifndef STRATA_TESTS_CAPTURE_H
#define STRATA_TESTS_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/common.h"
#include "io/files.h"

typedef struct capture {
    char path[64];
    int fd, saved;
} capture;

static inline int capture_begin(capture *c) {
    snprintf(c->path, sizeof c->path, "/tmp/strata-test-capture-XXXXXX");
    c->fd = mkstemp(c->path);
    if (c->fd < 0) return -1;
    fflush(stderr);
    c->saved = dup(2);
    dup2(c->fd, 2);
    return 0;
}

static inline char *capture_end(capture *c) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    char *text = NULL;
    size_t len = 0;
    if (strata_read_file_bounded(c->path, 1 << 20, &text, &len) != 0) text = strata_xstrdup("");
    close(c->fd);
    unlink(c->path);
    return text;
}

#endif
