/* offload/nvme.c: the io_uring scratch store of offload/nvme.h.
 *
 * State: a table of requests (what the caller asked for) and a table of queue_depth
 * block slots (what is in flight). A FIFO lists the requests with bytes not yet handed
 * to a block; pump() fills free slots from it, submits, and reaps completions, each of
 * which either finishes its block, resubmits the rest of it (short transfer, -EAGAIN,
 * -EINTR) or fails its request. A request is done when it has failed or all its bytes
 * are transferred, and no block of it is still in flight (its buffer may not be reused
 * before that). One mutex serialises callers; the thread in pump() holds it, also while
 * it sleeps in the kernel for a completion, and completes every caller's blocks.
 *
 * On the pread/pwrite fallback a "submission" performs the system call at once and
 * queues its result, so completions go through the same code, injection included. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "offload/nvme.h"

/* Back-to-back -EAGAIN/-EINTR/no-progress completions of one block before giving up. */
#define NVME_MAX_RETRIES 1000
/* io_uring refuses to register a single buffer above 1 GiB, so big ranges are split. */
#define NVME_REG_PIECE ((size_t)1 << 30)

typedef struct nvme_req {
    int in_use, op, failed;
    unsigned char *buf;
    size_t off, bytes;
    size_t next;  /* bytes already handed to blocks */
    size_t done;  /* bytes transferred */
    int inflight; /* blocks of this request in flight */
    strata_nvme_ticket ticket;
    int err; /* of the first failure: its errno (0 = no progress), offset and bytes */
    size_t err_off, err_bytes;
} nvme_req;

typedef struct nvme_block {
    int req; /* -1 when the slot is free */
    unsigned char *buf;
    size_t off, bytes, done;
    int retries;
    int sync_res; /* the fallback's result, waiting to be reaped */
} nvme_block;

typedef struct nvme_inject {
    int armed, after, result;
} nvme_inject;

struct strata_nvme_store {
    char path[PATH_MAX];
    int fd, direct, uring, n_registered;
    size_t bytes, block_bytes;
    int qd;
    struct io_uring ring;
    struct iovec *iov; /* registered pieces */
    int n_iov;

    nvme_req reqs[STRATA_NVME_MAX_REQUESTS];
    int pending[STRATA_NVME_MAX_REQUESTS]; /* FIFO of requests with bytes to hand out */
    int pend_head, pend_count;
    uint64_t seq;

    nvme_block *blocks;
    int *free_blocks, n_free;
    int inflight;
    int *sync_done, sync_head, sync_count; /* fallback completions, FIFO */
    int broken;             /* errno from the ring itself failing; nothing completes then */
    const char *broken_what; /* which io_uring call failed */

    nvme_inject inject[2];
    strata_nvme_stats st;
    pthread_mutex_t mu;
};

static const char *op_name(int op) { return op == STRATA_NVME_WRITE ? "write" : "read"; }

/* ---------------------------------------------------------------------------------- */
/* Open and close                                                                       */

/* The swap file is flock()ed for the store's life: the lock is what tells a live store
 * from one a killed process left behind (strata_nvme_reclaim). Between the create and the
 * lock another process's reclaim may take the file for stale and remove it (holding its
 * lock for a moment, so this waits); then the name no longer leads to our file, and it
 * is made again. */
static int lock_file(strata_nvme_store *s) {
    while (flock(s->fd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        if (errno != ENOLCK && errno != EOPNOTSUPP && errno != EINVAL) return -1;
        STRATA_WARN("nvme", "%s: the filesystem has no file locks (%s), so a later run cannot tell this file "
                            "from a stale one", s->path, strerror(errno));
        return 0;
    }
    struct stat mine, named;
    if (fstat(s->fd, &mine) == 0 && stat(s->path, &named) == 0 && mine.st_dev == named.st_dev &&
        mine.st_ino == named.st_ino)
        return 0;
    errno = ENOENT;
    return -1;
}

static int create_file(strata_nvme_store *s, const char *dir) {
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    for (int attempt = 0; attempt < 4; attempt++) {
        s->fd = open(s->path, flags | O_DIRECT, 0600);
        s->direct = s->fd >= 0;
        if (s->fd < 0 && errno == EINVAL) s->fd = open(s->path, flags, 0600);
        if (s->fd >= 0) {
            if (lock_file(s) == 0) return 0;
            int e = errno;
            close(s->fd);
            s->fd = -1;
            if (e == ENOENT) continue; /* removed under us as stale: make it again */
            return strata_fail("nvme: cannot lock %s: %s", s->path, strerror(e));
        }
        /* the same pid's file from a process that died without closing */
        if (errno == EEXIST && unlink(s->path) == 0) continue;
        break;
    }
    int e = errno;
    return strata_fail("nvme: cannot create %s: %s; offload.nvme_path (%s) must be a writable "
                       "directory on a local disk",
                       s->path, strerror(e), dir);
}

/* flock(LOCK_EX | LOCK_NB) on a swap file, waiting a little when the lock is held but the
 * process named in the file's name is gone from this host: a killed process's io_uring is
 * torn down by the kernel after the process is reaped, and the ring holds the file (and so
 * its lock) until then. A pid alive here, or one that stays locked (another host's process
 * on a shared disk), is left as held. Returns flock's result, errno set on failure. */
static int lock_when_owner_gone(int fd, long pid) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
    if (errno != EWOULDBLOCK) return -1;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) {
        errno = EWOULDBLOCK;
        return -1;
    }
    for (int i = 0; i < 200; i++) { /* up to 2 s */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK) return -1;
    }
    return -1;
}

int strata_nvme_reclaim(const char *dir, char *live, size_t live_len, size_t *live_bytes) {
    if (live_len) live[0] = 0;
    if (live_bytes) *live_bytes = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : strata_fail("nvme: cannot list %s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int rank = -1, n = 0;
        long pid = -1;
        const char *nm = e->d_name;
        /* strata-rank%05d-%ld.swap, as strata_nvme_open names it, and nothing else */
        if (sscanf(nm, "strata-rank%5d-%ld.swap%n", &rank, &pid, &n) != 2 || nm[n] != 0 || rank < 0 || pid <= 0)
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, nm) >= (int)sizeof path) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* its owner closed it, or another rank reclaimed it */
            rc = strata_fail("nvme: cannot open %s to see whether it is in use: %s", path, strerror(errno));
            break;
        }
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            continue;
        }
        char hb[32];
        strata_fmt_bytes(hb, sizeof hb, (double)st.st_blocks * 512.0);
        if (lock_when_owner_gone(fd, pid) == 0) {
            /* nobody holds it: its process is gone (killed before it could remove it) */
            if (unlink(path) != 0 && errno != ENOENT) {
                rc = strata_fail("nvme: %s is a stale swap file (process %ld is gone) holding %s, but it "
                                 "cannot be removed: %s; delete it by hand", path, pid, hb, strerror(errno));
                close(fd);
                break;
            }
            STRATA_INFO("nvme", "removed %s, a stale swap file left by process %ld (no longer running), which "
                                "held %s of the disk", path, pid, hb);
        } else if (errno == EWOULDBLOCK || errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL) {
            /* held; or, on a filesystem without locks, impossible to tell: left alone */
            if (live_bytes) *live_bytes += (size_t)st.st_blocks * 512;
            if (live_len) {
                size_t o = strlen(live);
                if (o + 1 < live_len)
                    snprintf(live + o, live_len - o, "%s%s (%s, rank %d of a running process %ld)", o ? ", " : "",
                             path, hb, rank, pid);
            }
        } else {
            rc = strata_fail("nvme: cannot lock %s to see whether it is in use: %s", path, strerror(errno));
            close(fd);
            break;
        }
        close(fd);
    }
    closedir(d);
    return rc;
}

static int preallocate(strata_nvme_store *s, const char *dir) {
    if (fallocate(s->fd, 0, 0, (off_t)s->bytes) == 0) return 0;
    int e = errno;
    if (e == ENOSPC) {
        /* give back what a partial allocation took, so the free count is the real one */
        if (ftruncate(s->fd, 0) != 0) e = ENOSPC;
        struct statvfs vfs;
        unsigned long long free_b = 0;
        if (statvfs(dir, &vfs) == 0) free_b = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        char hn[32], hf[32];
        return strata_fail("nvme: no space for %s: it needs %zu bytes (%s) but the filesystem "
                           "has %llu bytes free (%s); free space, offload less, or set "
                           "offload.nvme_path to a larger disk",
                           s->path, s->bytes, strata_fmt_bytes(hn, sizeof hn, (double)s->bytes),
                           free_b, strata_fmt_bytes(hf, sizeof hf, (double)free_b));
    }
    if (e == EOPNOTSUPP || e == ENOSYS) {
        if (ftruncate(s->fd, (off_t)s->bytes) == 0) {
            STRATA_WARN("nvme", "%s: the filesystem cannot preallocate (fallocate: %s); a full "
                                "disk will show up as a failed write instead of at open",
                        s->path, strerror(e));
            return 0;
        }
        e = errno;
    }
    return strata_fail("nvme: cannot size %s to %zu bytes: %s", s->path, s->bytes, strerror(e));
}

/* Some filesystems accept O_DIRECT at open and refuse it at the first I/O; find out now. */
static int probe_direct(strata_nvme_store *s) {
    if (!s->direct) return 0;
    void *tmp = NULL;
    if (posix_memalign(&tmp, STRATA_NVME_ALIGN, STRATA_NVME_ALIGN) != 0)
        return strata_fail("nvme: %s: out of host memory for the O_DIRECT probe", s->path);
    ssize_t r = pread(s->fd, tmp, STRATA_NVME_ALIGN, 0);
    int e = errno;
    free(tmp);
    if (r >= 0) return 0;
    if (e != EINVAL) return strata_fail("nvme: cannot read %s: %s", s->path, strerror(e));
    int fd = open(s->path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return strata_fail("nvme: cannot reopen %s: %s", s->path, strerror(errno));
    close(s->fd);
    s->fd = fd;
    s->direct = 0;
    return 0;
}

static void setup_ring(strata_nvme_store *s, void *const *reg_bufs, const size_t *reg_sizes,
                       int n_reg) {
    const char *no = getenv("STRATA_NVME_NO_URING");
    if (no && *no && strcmp(no, "0")) {
        STRATA_INFO("nvme", "%s: STRATA_NVME_NO_URING is set: synchronous pread/pwrite", s->path);
        return;
    }
    int r = io_uring_queue_init((unsigned)s->qd, &s->ring, 0);
    if (r < 0) {
        STRATA_WARN("nvme", "%s: io_uring is unavailable (%s; see "
                            "/proc/sys/kernel/io_uring_disabled and the container's seccomp "
                            "profile): falling back to synchronous pread/pwrite, one I/O at a time",
                    s->path, strerror(-r));
        return;
    }
    s->uring = 1;
    int n = 0;
    for (int i = 0; i < n_reg; i++)
        if (reg_bufs[i] && reg_sizes[i]) n += (int)((reg_sizes[i] + NVME_REG_PIECE - 1) / NVME_REG_PIECE);
    if (n == 0) return;
    s->iov = strata_xcalloc((size_t)n, sizeof *s->iov);
    for (int i = 0; i < n_reg; i++) {
        if (!reg_bufs[i] || !reg_sizes[i]) continue;
        for (size_t o = 0; o < reg_sizes[i]; o += NVME_REG_PIECE) {
            s->iov[s->n_iov].iov_base = (unsigned char *)reg_bufs[i] + o;
            s->iov[s->n_iov].iov_len = strata_min_size(NVME_REG_PIECE, reg_sizes[i] - o);
            s->n_iov++;
        }
    }
    r = io_uring_register_buffers(&s->ring, s->iov, (unsigned)s->n_iov);
    if (r < 0) {
        STRATA_WARN("nvme", "%s: io_uring could not register %d buffer range(s) (%s; check "
                            "`ulimit -l`): using unregistered I/O",
                    s->path, s->n_iov, strerror(-r));
        free(s->iov);
        s->iov = NULL;
        s->n_iov = 0;
        return;
    }
    s->n_registered = s->n_iov;
}

strata_nvme_store *strata_nvme_open(const char *dir, int rank, size_t bytes, size_t block_bytes,
                                    int queue_depth, void *const *reg_bufs,
                                    const size_t *reg_sizes, int n_reg) {
    if (!dir || !*dir) {
        strata_fail("nvme: no directory given (offload.nvme_path)");
        return NULL;
    }
    if (block_bytes == 0 || block_bytes % STRATA_NVME_ALIGN || block_bytes > NVME_REG_PIECE) {
        strata_fail("nvme: block size %zu bytes is not a multiple of %d between %d and 1 GiB "
                    "(offload.block_kb)", block_bytes, STRATA_NVME_ALIGN, STRATA_NVME_ALIGN);
        return NULL;
    }
    if (queue_depth < 1 || queue_depth > 4096) {
        strata_fail("nvme: queue depth %d is outside 1..4096 (offload.queue_depth)", queue_depth);
        return NULL;
    }
    if (bytes == 0 || bytes > (size_t)1 << 60) {
        strata_fail("nvme: a store of %zu bytes is not a usable size", bytes);
        return NULL;
    }
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        if (e == ENOENT)
            strata_fail("nvme: directory %s does not exist; create it or set offload.nvme_path "
                        "to an existing directory", dir);
        else
            strata_fail("nvme: cannot use directory %s: %s", dir, strerror(e));
        return NULL;
    }
    if (!S_ISDIR(st.st_mode)) {
        strata_fail("nvme: %s is not a directory (offload.nvme_path)", dir);
        return NULL;
    }

    strata_nvme_store *s = strata_xcalloc(1, sizeof *s);
    s->fd = -1;
    s->bytes = strata_round_up(bytes, STRATA_NVME_ALIGN);
    s->block_bytes = block_bytes;
    s->qd = queue_depth;
    int len = snprintf(s->path, sizeof s->path, "%s/strata-rank%05d-%ld.swap", dir, rank,
                       (long)getpid());
    if (len < 0 || (size_t)len >= sizeof s->path) {
        strata_fail("nvme: directory path %s is too long", dir);
        free(s);
        return NULL;
    }
    if (create_file(s, dir) != 0) {
        free(s);
        return NULL;
    }
    if (preallocate(s, dir) != 0 || probe_direct(s) != 0) {
        close(s->fd);
        unlink(s->path);
        free(s);
        return NULL;
    }
    if (!s->direct)
        STRATA_WARN("nvme", "the filesystem holding %s refuses O_DIRECT: using buffered I/O "
                            "(slower, and it fills the page cache)", s->path);

    pthread_mutex_init(&s->mu, NULL);
    s->blocks = strata_xcalloc((size_t)s->qd, sizeof *s->blocks);
    s->free_blocks = strata_xmalloc((size_t)s->qd * sizeof *s->free_blocks);
    s->sync_done = strata_xmalloc((size_t)s->qd * sizeof *s->sync_done);
    for (int i = 0; i < s->qd; i++) {
        s->blocks[i].req = -1;
        s->free_blocks[i] = s->qd - 1 - i;
    }
    s->n_free = s->qd;
    setup_ring(s, reg_bufs, reg_sizes, n_reg);

    char hb[32];
    STRATA_DEBUG("nvme", "opened %s: %s, %s, block %zu bytes, queue depth %d, %d registered "
                         "range(s)", s->path, strata_fmt_bytes(hb, sizeof hb, (double)s->bytes),
                 s->direct ? "O_DIRECT" : "buffered", s->block_bytes, s->qd, s->n_registered);
    return s;
}

/* ---------------------------------------------------------------------------------- */
/* The engine (all under s->mu)                                                          */

static int fixed_index(const strata_nvme_store *s, const unsigned char *p, size_t len) {
    for (int i = 0; i < s->n_registered; i++) {
        const unsigned char *b = s->iov[i].iov_base;
        if (p >= b && p + len <= b + s->iov[i].iov_len) return i;
    }
    return -1;
}

static void fail_req(nvme_req *r, size_t off, size_t bytes, int err) {
    if (r->failed) return; /* the first error is the one reported */
    r->failed = 1;
    r->err = err;
    r->err_off = off;
    r->err_bytes = bytes;
}

/* Puts request r's failure into this thread's error buffer; returns -1. */
static int report(const strata_nvme_store *s, const nvme_req *r) {
    if (s->broken)
        return strata_fail("nvme %s: %s failed: %s; the %s of %zu bytes at offset %zu is lost",
                           s->path, s->broken_what, strerror(s->broken), op_name(r->op),
                           r->bytes, r->off);
    if (r->err == 0)
        return strata_fail("nvme %s: %s of %zu bytes at offset %zu made no progress in %d "
                           "attempts (0 bytes transferred each time), in the request of %zu "
                           "bytes at offset %zu",
                           s->path, op_name(r->op), r->err_bytes, r->err_off, NVME_MAX_RETRIES,
                           r->bytes, r->off);
    if (r->err == ENOSPC)
        return strata_fail("nvme %s: no space left on the device (ENOSPC): %s of %zu bytes at "
                           "offset %zu failed, so the request of %zu bytes at offset %zu is not "
                           "stored; free space or set offload.nvme_path to a larger disk",
                           s->path, op_name(r->op), r->err_bytes, r->err_off, r->bytes, r->off);
    return strata_fail("nvme %s: %s of %zu bytes at offset %zu failed: %s (errno %d), in the "
                       "request of %zu bytes at offset %zu",
                       s->path, op_name(r->op), r->err_bytes, r->err_off, strerror(r->err),
                       r->err, r->bytes, r->off);
}

static void release_block(strata_nvme_store *s, int bi) {
    nvme_block *b = &s->blocks[bi];
    s->reqs[b->req].inflight--;
    b->req = -1;
    s->free_blocks[s->n_free++] = bi;
    s->inflight--;
}

/* Hands the unfinished part of block bi to the kernel (or, on the fallback, does it). */
static void issue_block(strata_nvme_store *s, int bi) {
    nvme_block *b = &s->blocks[bi];
    int op = s->reqs[b->req].op;
    unsigned char *p = b->buf + b->done;
    size_t len = b->bytes - b->done;
    off_t off = (off_t)(b->off + b->done);
    s->st.blocks++;
    if (!s->uring) {
        ssize_t r = op == STRATA_NVME_WRITE ? pwrite(s->fd, p, len, off) : pread(s->fd, p, len, off);
        b->sync_res = r < 0 ? -errno : (int)r;
        s->sync_done[(s->sync_head + s->sync_count++) % s->qd] = bi;
        return;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) {
        /* the SQ holds queue_depth entries and at most that many blocks exist, so a full
         * SQ only means earlier entries are prepared and not yet submitted */
        io_uring_submit(&s->ring);
        sqe = io_uring_get_sqe(&s->ring);
        STRATA_ASSERT(sqe != NULL);
    }
    int fi = fixed_index(s, p, len);
    if (op == STRATA_NVME_WRITE) {
        if (fi >= 0) io_uring_prep_write_fixed(sqe, s->fd, p, (unsigned)len, (uint64_t)off, fi);
        else io_uring_prep_write(sqe, s->fd, p, (unsigned)len, (uint64_t)off);
    } else {
        if (fi >= 0) io_uring_prep_read_fixed(sqe, s->fd, p, (unsigned)len, (uint64_t)off, fi);
        else io_uring_prep_read(sqe, s->fd, p, (unsigned)len, (uint64_t)off);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)bi);
}

/* Fills free block slots from the pending FIFO, in request order. */
static void fill(strata_nvme_store *s) {
    while (s->n_free > 0 && s->pend_count > 0) {
        int ri = s->pending[s->pend_head];
        nvme_req *r = &s->reqs[ri];
        if (r->failed || r->next == r->bytes) {
            s->pend_head = (s->pend_head + 1) % STRATA_NVME_MAX_REQUESTS;
            s->pend_count--;
            continue;
        }
        int bi = s->free_blocks[--s->n_free];
        nvme_block *b = &s->blocks[bi];
        b->req = ri;
        b->buf = r->buf + r->next;
        b->off = r->off + r->next;
        b->bytes = strata_min_size(s->block_bytes, r->bytes - r->next);
        b->done = 0;
        b->retries = 0;
        r->next += b->bytes;
        r->inflight++;
        s->inflight++;
        issue_block(s, bi);
    }
}

static void complete_block(strata_nvme_store *s, int bi, int res) {
    nvme_block *b = &s->blocks[bi];
    nvme_req *r = &s->reqs[b->req];
    nvme_inject *inj = &s->inject[r->op];
    if (inj->armed) {
        if (inj->after == 0) {
            inj->armed = 0;
            res = inj->result;
        } else {
            inj->after--;
        }
    }
    size_t want = b->bytes - b->done;
    if (r->failed) { /* the request is lost already; just let its blocks drain */
        release_block(s, bi);
        return;
    }
    if (res == -EAGAIN || res == -EINTR || res == 0) {
        if (++b->retries > NVME_MAX_RETRIES) {
            fail_req(r, b->off + b->done, want, -res);
            release_block(s, bi);
            return;
        }
        s->st.resubmits++;
        issue_block(s, bi);
        return;
    }
    if (res < 0) {
        fail_req(r, b->off + b->done, want, -res);
        release_block(s, bi);
        return;
    }
    size_t got = (size_t)res < want ? (size_t)res : want;
    if (got < want) {
        /* O_DIRECT needs the remainder aligned: step back to the last aligned byte (the
         * transfer is idempotent, so redoing a few bytes is harmless) */
        size_t done = b->done + got;
        if (s->direct) done &= ~(size_t)(STRATA_NVME_ALIGN - 1);
        if (done > b->done) {
            b->retries = 0;
        } else if (++b->retries > NVME_MAX_RETRIES) {
            fail_req(r, b->off + b->done, want, 0);
            release_block(s, bi);
            return;
        }
        b->done = done > b->done ? done : b->done;
        s->st.resubmits++;
        issue_block(s, bi);
        return;
    }
    r->done += b->bytes;
    release_block(s, bi);
}

static void submit(strata_nvme_store *s) {
    if (!s->uring || io_uring_sq_ready(&s->ring) == 0) return;
    int r = io_uring_submit(&s->ring);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        s->broken = -r;
        s->broken_what = "io_uring_submit";
    }
}

/* Reaps at least one completion (blocking when none is ready); called with I/O in flight. */
static void reap(strata_nvme_store *s) {
    if (!s->uring) {
        while (s->sync_count > 0) {
            int bi = s->sync_done[s->sync_head];
            s->sync_head = (s->sync_head + 1) % s->qd;
            s->sync_count--;
            complete_block(s, bi, s->blocks[bi].sync_res);
        }
        return;
    }
    struct io_uring_cqe *cqe = NULL;
    int r;
    /* submits whatever is prepared (resubmissions included) and sleeps for one completion */
    do r = io_uring_submit_and_wait(&s->ring, 1);
    while (r == -EINTR || r == -EAGAIN);
    if (r < 0) {
        s->broken = -r;
        s->broken_what = "waiting for io_uring completions";
        return;
    }
    /* take every completion that is ready, not just the first */
    while (io_uring_peek_cqe(&s->ring, &cqe) == 0 && cqe) {
        int bi = (int)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&s->ring, cqe);
        complete_block(s, bi, res);
    }
}

/* One round: keep the queue full, submit, and reap what completes. */
static void pump(strata_nvme_store *s) {
    fill(s);
    submit(s);
    if (!s->broken && s->inflight > 0) reap(s);
}

/* A broken ring completes nothing more, so its requests count as done (and failed). */
static int req_done(const strata_nvme_store *s, const nvme_req *r) {
    return s->broken || (r->inflight == 0 && (r->failed || r->done == r->bytes));
}

/* ---------------------------------------------------------------------------------- */
/* Requests                                                                               */

static int start(strata_nvme_store *s, int op, size_t offset, void *buf, size_t bytes,
                 strata_nvme_ticket *ticket) {
    if (offset % STRATA_NVME_ALIGN || bytes % STRATA_NVME_ALIGN ||
        (uintptr_t)buf % STRATA_NVME_ALIGN)
        return strata_fail("nvme %s: %s of %zu bytes at offset %zu from buffer %p: the offset, "
                           "the size and the buffer address must all be multiples of %d "
                           "(O_DIRECT)",
                           s->path, op_name(op), bytes, offset, buf, STRATA_NVME_ALIGN);
    if (offset > s->bytes || bytes > s->bytes - offset)
        return strata_fail("nvme %s: %s of %zu bytes at offset %zu runs past the end of the "
                           "%zu-byte store",
                           s->path, op_name(op), bytes, offset, s->bytes);
    pthread_mutex_lock(&s->mu);
    if (s->broken) {
        pthread_mutex_unlock(&s->mu);
        return strata_fail("nvme %s: %s failed earlier (%s); the store is unusable", s->path,
                           s->broken_what, strerror(s->broken));
    }
    int slot = -1;
    for (int i = 0; i < STRATA_NVME_MAX_REQUESTS; i++) {
        int k = (int)((s->seq + (uint64_t)i) % STRATA_NVME_MAX_REQUESTS);
        if (!s->reqs[k].in_use) {
            slot = k;
            break;
        }
    }
    if (slot < 0) {
        pthread_mutex_unlock(&s->mu);
        return strata_fail("nvme %s: %d requests are outstanding, the most a store holds; wait "
                           "for some before queueing the %s at offset %zu",
                           s->path, STRATA_NVME_MAX_REQUESTS, op_name(op), offset);
    }
    nvme_req *r = &s->reqs[slot];
    memset(r, 0, sizeof *r);
    r->in_use = 1;
    r->op = op;
    r->buf = buf;
    r->off = offset;
    r->bytes = bytes;
    /* the low bits name the slot; the sequence number catches a stale ticket */
    r->ticket = (++s->seq << 16) | (uint64_t)slot;
    *ticket = r->ticket;
    if (bytes > 0) {
        s->pending[(s->pend_head + s->pend_count++) % STRATA_NVME_MAX_REQUESTS] = slot;
        fill(s);
        submit(s);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int strata_nvme_write_async(strata_nvme_store *s, size_t offset, const void *buf, size_t bytes,
                            strata_nvme_ticket *ticket) {
    /* the buffer is only read on a write */
    return start(s, STRATA_NVME_WRITE, offset, (void *)(uintptr_t)buf, bytes, ticket);
}

int strata_nvme_read_async(strata_nvme_store *s, size_t offset, void *buf, size_t bytes,
                           strata_nvme_ticket *ticket) {
    return start(s, STRATA_NVME_READ, offset, buf, bytes, ticket);
}

/* Waits for slot's request and frees it; called with s->mu held. */
static int finish(strata_nvme_store *s, int slot) {
    nvme_req *r = &s->reqs[slot];
    while (!req_done(s, r)) {
        pump(s);
        STRATA_ASSERT(req_done(s, r) || s->inflight > 0 || s->pend_count > 0);
    }
    int failed = r->failed || s->broken;
    if (failed) {
        s->st.failed_requests++;
        report(s, r);
    } else if (r->op == STRATA_NVME_WRITE) {
        s->st.bytes_written += r->bytes;
    } else {
        s->st.bytes_read += r->bytes;
    }
    r->in_use = 0;
    return failed ? -1 : 0;
}

int strata_nvme_wait(strata_nvme_store *s, strata_nvme_ticket ticket) {
    int slot = (int)(ticket & 0xffff);
    pthread_mutex_lock(&s->mu);
    if (slot >= STRATA_NVME_MAX_REQUESTS || !s->reqs[slot].in_use ||
        s->reqs[slot].ticket != ticket) {
        pthread_mutex_unlock(&s->mu);
        return strata_fail("nvme %s: ticket %llu is unknown or was already waited for", s->path,
                           (unsigned long long)ticket);
    }
    int rc = finish(s, slot);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int strata_nvme_wait_all(strata_nvme_store *s) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    char first[2048] = "";
    /* oldest first, so the first failure reported is the earliest request's */
    for (;;) {
        int slot = -1;
        uint64_t oldest = UINT64_MAX;
        for (int i = 0; i < STRATA_NVME_MAX_REQUESTS; i++)
            if (s->reqs[i].in_use && s->reqs[i].ticket < oldest) {
                oldest = s->reqs[i].ticket;
                slot = i;
            }
        if (slot < 0) break;
        if (finish(s, slot) != 0 && rc == 0) {
            rc = -1;
            snprintf(first, sizeof first, "%s", strata_error());
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc) strata_fail("%s", first);
    return rc;
}

int strata_nvme_write(strata_nvme_store *s, size_t offset, const void *buf, size_t bytes) {
    strata_nvme_ticket t = 0;
    if (strata_nvme_write_async(s, offset, buf, bytes, &t) != 0) return -1;
    return strata_nvme_wait(s, t);
}

int strata_nvme_read(strata_nvme_store *s, size_t offset, void *buf, size_t bytes) {
    strata_nvme_ticket t = 0;
    if (strata_nvme_read_async(s, offset, buf, bytes, &t) != 0) return -1;
    return strata_nvme_wait(s, t);
}

void strata_nvme_close(strata_nvme_store *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    int abandoned = 0;
    for (int i = 0; i < STRATA_NVME_MAX_REQUESTS; i++) abandoned += s->reqs[i].in_use;
    /* hand out nothing more, but let the kernel finish with every buffer it holds */
    s->pend_count = 0;
    while (s->inflight > 0 && !s->broken) {
        submit(s);
        reap(s);
    }
    pthread_mutex_unlock(&s->mu);
    if (abandoned)
        STRATA_WARN("nvme", "%s closed with %d request(s) never waited for", s->path, abandoned);
    if (s->uring) {
        if (s->n_registered) io_uring_unregister_buffers(&s->ring);
        io_uring_queue_exit(&s->ring);
    }
    close(s->fd);
    if (unlink(s->path) != 0)
        STRATA_WARN("nvme", "cannot remove %s: %s; delete it by hand", s->path, strerror(errno));
    pthread_mutex_destroy(&s->mu);
    free(s->iov);
    free(s->blocks);
    free(s->free_blocks);
    free(s->sync_done);
    free(s);
}

/* ---------------------------------------------------------------------------------- */

const char *strata_nvme_path(const strata_nvme_store *s) { return s->path; }
int strata_nvme_is_direct(const strata_nvme_store *s) { return s->direct; }
int strata_nvme_uses_uring(const strata_nvme_store *s) { return s->uring; }
int strata_nvme_registered(const strata_nvme_store *s) { return s->n_registered; }

strata_nvme_stats strata_nvme_get_stats(strata_nvme_store *s) {
    pthread_mutex_lock(&s->mu);
    strata_nvme_stats st = s->st;
    pthread_mutex_unlock(&s->mu);
    return st;
}

void strata_nvme_inject(strata_nvme_store *s, int op, int after_n, int result) {
    STRATA_ASSERT(op == STRATA_NVME_READ || op == STRATA_NVME_WRITE);
    pthread_mutex_lock(&s->mu);
    s->inject[op] = (nvme_inject){.armed = 1, .after = after_n, .result = result};
    pthread_mutex_unlock(&s->mu);
}
