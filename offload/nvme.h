/* offload/nvme.h: a per-rank scratch store on a local disk, driven by io_uring.
 *
 * strata_nvme_open creates "<dir>/strata-rank%05d-<pid>.swap", opened with O_DIRECT and
 * preallocated to its full size with fallocate, so a disk that is too small fails at
 * open (naming the path, the bytes needed and the bytes free) rather than mid-run. The
 * file is removed again by strata_nvme_close, and flock()ed while open, so that
 * strata_nvme_reclaim can tell a live store's file from one a killed process left. Fallbacks, each logged once at open under
 * the [nvme] tag:
 *  - a filesystem that refuses O_DIRECT gets buffered I/O (slower, fills the page cache);
 *  - buffers io_uring will not register are used unregistered (a little more CPU per I/O);
 *  - a kernel without io_uring (or with it disabled, as in some containers) gets
 *    synchronous pread/pwrite; STRATA_NVME_NO_URING=1 forces that path.
 * The same alignment rules hold on every path, so behaviour never depends on the disk.
 *
 * I/O: a request of (offset, bytes, buffer) is split into block_bytes pieces with up to
 * queue_depth pieces in flight across all requests. offset, bytes and the buffer address
 * must be multiples of STRATA_NVME_ALIGN (O_DIRECT's rule) and the range must lie inside
 * the store. Short transfers are resubmitted for the remainder; -EAGAIN and -EINTR are
 * retried; any other error fails the request with a message naming the path, the
 * operation, the offset and the bytes (ENOSPC says so plainly). A failed write is always
 * reported by the wait for its request, never dropped, and the store stays usable: the
 * bytes of a failed write are simply undefined until written again.
 *
 * Threads: a store may be used from several threads (it serialises them internally), but
 * the intended user is one HOST stream worker per direction. The blocking calls submit
 * and reap until their request is done, keeping the queue full with any other requests
 * outstanding, which is what a stream worker wants. */
#ifndef STRATA_NVME_H
#define STRATA_NVME_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_NVME_ALIGN 4096
/* Requests (not blocks) outstanding at once; an async submit beyond it fails. */
#define STRATA_NVME_MAX_REQUESTS 256

enum { STRATA_NVME_READ = 0, STRATA_NVME_WRITE = 1 };

typedef struct strata_nvme_store strata_nvme_store;
typedef uint64_t strata_nvme_ticket;

typedef struct strata_nvme_stats {
    uint64_t bytes_read, bytes_written; /* completed, successful requests only */
    uint64_t blocks;                    /* block I/Os issued, resubmissions included */
    uint64_t resubmits;                 /* after a short transfer, -EAGAIN or -EINTR */
    uint64_t failed_requests;
} strata_nvme_stats;

/* Opens rank's store of `bytes` (rounded up to STRATA_NVME_ALIGN) under dir.
 * block_bytes (a multiple of STRATA_NVME_ALIGN, at most 1 GiB) is the size of one I/O; queue_depth (>= 1)
 * the I/Os in flight. reg_bufs/reg_sizes name n_reg host ranges (typically the pinned
 * pool, offload/pinned.h) to register with io_uring: I/O into them skips per-request
 * page pinning. NULL + error on failure; nothing is left on disk then. */
strata_nvme_store *strata_nvme_open(const char *dir, int rank, size_t bytes, size_t block_bytes,
                                    int queue_depth, void *const *reg_bufs,
                                    const size_t *reg_sizes, int n_reg);
/* Before a run plans its disk space: every strata-rank*-*.swap file in dir whose lock can be
 * taken belongs to a process that is gone (killed before it could remove it) and is
 * removed, saying so at info level with its size. Files whose lock is held belong to a
 * running process: they stay, and are described in `live` ("path (size, rank r of a
 * running process p)", ", "-separated) with their disk bytes summed in *live_bytes.
 * A missing dir is not an error here (the plan names it). 0, or -1 + error. */
int strata_nvme_reclaim(const char *dir, char *live, size_t live_len, size_t *live_bytes);
/* Finishes the I/O in flight, releases the ring and removes the file. Requests never
 * waited for are abandoned with a warning. */
void strata_nvme_close(strata_nvme_store *s);

/* Blocking: 0 once every byte is on disk (write) or in buf (read), -1 + error. */
int strata_nvme_write(strata_nvme_store *s, size_t offset, const void *buf, size_t bytes);
int strata_nvme_read(strata_nvme_store *s, size_t offset, void *buf, size_t bytes);

/* Asynchronous: queue the request, start as many of its blocks as the queue allows, and
 * return a ticket at once. Validation errors (alignment, range, too many requests)
 * return -1 here and no ticket. buf must stay valid until the wait returns. */
int strata_nvme_write_async(strata_nvme_store *s, size_t offset, const void *buf, size_t bytes,
                            strata_nvme_ticket *ticket);
int strata_nvme_read_async(strata_nvme_store *s, size_t offset, void *buf, size_t bytes,
                           strata_nvme_ticket *ticket);
/* Blocks until the ticket's request is done, driving all outstanding I/O meanwhile;
 * 0, or -1 with the request's error. Each ticket is waited for exactly once. */
int strata_nvme_wait(strata_nvme_store *s, strata_nvme_ticket ticket);
/* Waits for every outstanding request (their tickets are used up); 0, or -1 with the
 * first failure's error. */
int strata_nvme_wait_all(strata_nvme_store *s);

const char *strata_nvme_path(const strata_nvme_store *s);
int strata_nvme_is_direct(const strata_nvme_store *s);  /* 1 with O_DIRECT */
int strata_nvme_uses_uring(const strata_nvme_store *s); /* 0 on the pread/pwrite fallback */
int strata_nvme_registered(const strata_nvme_store *s); /* io_uring buffer slots registered */
strata_nvme_stats strata_nvme_get_stats(strata_nvme_store *s);

/* TEST HOOK (fault injection): makes the completion of the (after_n+1)-th block I/O of
 * `op` (STRATA_NVME_READ or _WRITE) counted from now report `result` instead of what the
 * kernel returned: a negative errno (-EAGAIN, -EINTR, -EIO, -ENOSPC) or a short byte
 * count. One pending injection per op; a new call replaces it. Never used in training. */
void strata_nvme_inject(strata_nvme_store *s, int op, int after_n, int result);

#endif
