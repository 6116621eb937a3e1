/* tests/test_nvme.c: the NVMe scratch store round-trips data at several block sizes and
 * queue depths (registered, unregistered and pread/pwrite paths), rejects misaligned or
 * out-of-range requests with a message, survives injected short transfers, -EAGAIN and
 * -EINTR, reports injected -EIO and -ENOSPC naming path, offset and bytes while staying
 * usable, refuses a store bigger than a real 4 MB tmpfs, a missing and a read-only
 * directory with clear errors, serves two threads at once, and removes its file on
 * close; strata_nvme_reclaim removes swap files nobody holds, keeps (and names) those of
 * open stores, and leaves other files alone. Ends with a small `bench io` table. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include "core/common.h"
#include "core/device.h"
#include "offload/bench_io.h"
#include "offload/nvme.h"
#include "offload/pinned.h"
#include "tests/check.h"


#define KB ((size_t)1024)
#define MB (KB * KB)
#define BIG (64 * MB)

static char base[256]; /* this run's scratch directory */
static unsigned char *src, *dst;

static void fill_random(unsigned char *p, size_t n, uint64_t seed) {
    strata_rng r;
    strata_rng_seed(&r, seed);
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t x = strata_rng_next(&r);
        memcpy(p + i, &x, 8);
    }
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n == 0;
}

/* ---------------------------------------------------------------------------------- */

typedef struct rt_config {
    size_t block;
    int qd;
    int registered;
    int no_uring;
} rt_config;

static void test_round_trip(rt_config c) {
    if (c.no_uring) setenv("STRATA_NVME_NO_URING", "1", 1);
    void *reg[2] = {src, dst};
    size_t reg_sizes[2] = {BIG, BIG};
    strata_nvme_store *s =
        strata_nvme_open(base, 3, BIG, c.block, c.qd, reg, reg_sizes, c.registered ? 2 : 0);
    unsetenv("STRATA_NVME_NO_URING");
    char label[96];
    snprintf(label, sizeof label, "block %zuK qd %-2d %s%s", c.block / KB, c.qd,
             c.registered ? "registered" : "unregistered", c.no_uring ? " pread/pwrite" : "");
    if (!s) {
        CHECK(0, "%s: open failed: %s", label, strata_error());
        return;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s", strata_nvme_path(s));
    struct stat st;
    char want_name[64];
    snprintf(want_name, sizeof want_name, "/strata-rank00003-%ld.swap", (long)getpid());
    CHECK(stat(path, &st) == 0 && (size_t)st.st_size == BIG && strstr(path, want_name),
          "%s: file %s exists, preallocated to %zu bytes (%s, %s, %d registered)", label, path,
          BIG, strata_nvme_is_direct(s) ? "O_DIRECT" : "buffered",
          strata_nvme_uses_uring(s) ? "io_uring" : "pread/pwrite", strata_nvme_registered(s));
    CHECK(strata_nvme_uses_uring(s) == !c.no_uring && (strata_nvme_registered(s) > 0) ==
                                                         (c.registered && !c.no_uring),
          "%s: the requested I/O path is the one in use", label);

    fill_random(src, BIG, 1234 + c.block + (size_t)c.qd);
    memset(dst, 0, BIG);
    /* four writes in flight at once, waited for in reverse order */
    strata_nvme_ticket t[4];
    int rc = 0;
    for (int i = 0; i < 4; i++)
        rc |= strata_nvme_write_async(s, (size_t)i * (BIG / 4), src + (size_t)i * (BIG / 4),
                                      BIG / 4, &t[i]);
    for (int i = 3; i >= 0; i--) rc |= strata_nvme_wait(s, t[i]);
    CHECK(rc == 0, "%s: 4 concurrent async writes of 16 MB complete", label);
    rc = strata_nvme_read(s, 0, dst, BIG);
    CHECK(rc == 0 && !memcmp(src, dst, BIG), "%s: 64 MB read back equals what was written%s%s",
          label, rc ? ": " : "", rc ? strata_error() : "");
    /* odd-sized sub-ranges (not multiples of the block) read concurrently */
    size_t offs[3] = {4 * KB, 5 * MB + 12 * KB, 40 * MB};
    size_t lens[3] = {300 * KB, 1 * MB + 4 * KB, 7 * MB + 28 * KB};
    memset(dst, 0, 16 * MB);
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        rc |= strata_nvme_read_async(s, offs[i], dst + at, lens[i], &t[i]);
        at += lens[i];
    }
    rc |= strata_nvme_wait_all(s);
    int same = 1;
    at = 0;
    for (int i = 0; i < 3; i++) {
        same &= !memcmp(dst + at, src + offs[i], lens[i]);
        at += lens[i];
    }
    CHECK(rc == 0 && same, "%s: 3 concurrent odd-sized sub-range reads match", label);
    strata_nvme_stats stats = strata_nvme_get_stats(s);
    CHECK(stats.bytes_written == BIG && stats.bytes_read == BIG + at && stats.resubmits == 0 &&
              stats.failed_requests == 0,
          "%s: stats count %llu bytes written, %llu read, %llu blocks", label,
          (unsigned long long)stats.bytes_written, (unsigned long long)stats.bytes_read,
          (unsigned long long)stats.blocks);
    strata_nvme_close(s);
    CHECK(!file_exists(path), "%s: file removed on close", label);
}

static void test_validation(void) {
    strata_nvme_store *s = strata_nvme_open(base, 0, 1 * MB, 64 * KB, 4, NULL, NULL, 0);
    if (!s) {
        CHECK(0, "open for validation: %s", strata_error());
        return;
    }
    strata_nvme_ticket t;
    int rc = strata_nvme_write(s, 100, src, 4 * KB);
    CHECK(rc != 0 && strstr(strata_error(), "offset 100") && strstr(strata_error(), "multiples of 4096"),
          "odd offset rejected: %s", strata_error());
    rc = strata_nvme_read(s, 0, dst, 1000);
    CHECK(rc != 0 && strstr(strata_error(), "1000 bytes") && strstr(strata_error(), "multiples of 4096"),
          "odd size rejected: %s", strata_error());
    rc = strata_nvme_write_async(s, 0, src + 8, 4 * KB, &t);
    CHECK(rc != 0 && strstr(strata_error(), "buffer address"), "unaligned buffer rejected");
    rc = strata_nvme_read(s, 1 * MB - 4 * KB, dst, 8 * KB);
    CHECK(rc != 0 && strstr(strata_error(), "past the end of the 1048576-byte store"),
          "read past the end rejected: %s", strata_error());
    rc = strata_nvme_read(s, SIZE_MAX - 4095, dst, 8 * KB);
    CHECK(rc != 0 && strstr(strata_error(), "past the end"), "offset overflow rejected");
    rc = strata_nvme_write_async(s, 0, src, 8 * KB, &t);
    int rc2 = strata_nvme_wait(s, t);
    int rc3 = strata_nvme_wait(s, t);
    CHECK(rc == 0 && rc2 == 0 && rc3 != 0 && strstr(strata_error(), "already waited"),
          "a ticket is waited for once: %s", strata_error());
    rc = strata_nvme_write(s, 0, src, 0);
    CHECK(rc == 0, "a zero-byte request completes at once");
    strata_nvme_close(s);

    s = strata_nvme_open(base, 0, 1 * MB, 1000, 4, NULL, NULL, 0);
    CHECK(!s && strstr(strata_error(), "block size 1000"), "block size 1000 refused: %s",
          strata_error());
    s = strata_nvme_open(base, 0, 1 * MB, 64 * KB, 0, NULL, NULL, 0);
    CHECK(!s && strstr(strata_error(), "queue depth 0"), "queue depth 0 refused: %s",
          strata_error());
}

/* Injected faults, on io_uring (no_uring 0) or the pread/pwrite path (1). On the latter
 * blocks complete in order, so the failing block's offset is known exactly. */
static void test_faults(int no_uring) {
    const char *path_name = no_uring ? "pread/pwrite" : "io_uring";
    if (no_uring) setenv("STRATA_NVME_NO_URING", "1", 1);
    void *reg = src;
    size_t reg_size = BIG;
    strata_nvme_store *s = strata_nvme_open(base, 1, 4 * MB, 64 * KB, 4, &reg, &reg_size, 1);
    unsetenv("STRATA_NVME_NO_URING");
    if (!s) {
        CHECK(0, "%s: open for fault injection: %s", path_name, strata_error());
        return;
    }
    const char *path = strata_nvme_path(s);
    const size_t n = 1 * MB; /* 16 blocks */
    fill_random(src, 4 * MB, 99);
    int rc = strata_nvme_write(s, 0, src, 4 * MB);
    CHECK(rc == 0, "%s: 4 MB written before the fault tests", path_name);

    struct {
        const char *what;
        int op, after, result;
    } ok_cases[] = {
        {"short read (5 of 16 pages)", STRATA_NVME_READ, 2, (int)(20 * KB)},
        {"short read, not page-aligned (1000 bytes)", STRATA_NVME_READ, 0, 1000},
        {"short write (8 KB)", STRATA_NVME_WRITE, 1, (int)(8 * KB)},
        {"read -EAGAIN", STRATA_NVME_READ, 4, -EAGAIN},
        {"write -EAGAIN", STRATA_NVME_WRITE, 0, -EAGAIN},
        {"read -EINTR", STRATA_NVME_READ, 7, -EINTR},
        {"write -EINTR", STRATA_NVME_WRITE, 15, -EINTR},
    };
    for (size_t i = 0; i < sizeof ok_cases / sizeof ok_cases[0]; i++) {
        size_t off = (i + 1) * 64 * KB; /* a different, block-misaligned range each time */
        strata_nvme_stats before = strata_nvme_get_stats(s);
        strata_nvme_inject(s, ok_cases[i].op, ok_cases[i].after, ok_cases[i].result);
        if (ok_cases[i].op == STRATA_NVME_WRITE) {
            fill_random(src + off, n, 500 + i);
            rc = strata_nvme_write(s, off, src + off, n);
            memset(dst, 0, n);
            rc |= strata_nvme_read(s, off, dst, n);
        } else {
            memset(dst, 0, n);
            rc = strata_nvme_read(s, off, dst, n);
        }
        strata_nvme_stats after = strata_nvme_get_stats(s);
        CHECK(rc == 0 && !memcmp(dst, src + off, n) && after.resubmits > before.resubmits &&
                  after.failed_requests == before.failed_requests,
              "%s: %s is resubmitted and the data is intact (%llu resubmission(s))", path_name,
              ok_cases[i].what, (unsigned long long)(after.resubmits - before.resubmits));
    }

    /* -EIO on a read: reported with path, offset and bytes; the store stays usable */
    strata_nvme_inject(s, STRATA_NVME_READ, 3, -EIO);
    rc = strata_nvme_read(s, 0, dst, n);
    char want[128];
    snprintf(want, sizeof want, "read of 65536 bytes at offset %s", no_uring ? "196608 " : "");
    const char *e = strata_error();
    CHECK(rc != 0 && strstr(e, path) && strstr(e, want) && strstr(e, "Input/output error") &&
              strstr(e, "request of 1048576 bytes at offset 0"),
          "%s: injected -EIO fails the read: %s", path_name, e);
    memset(dst, 0, n);
    rc = strata_nvme_read(s, 0, dst, n);
    CHECK(rc == 0 && !memcmp(dst, src, n), "%s: the next read of that range succeeds", path_name);

    /* -ENOSPC on a write: reported, never dropped; later writes work */
    strata_nvme_stats before = strata_nvme_get_stats(s);
    strata_nvme_inject(s, STRATA_NVME_WRITE, 0, -ENOSPC);
    fill_random(src + 2 * MB, 256 * KB, 77);
    rc = strata_nvme_write(s, 2 * MB, src + 2 * MB, 256 * KB);
    e = strata_error();
    CHECK(rc != 0 && strstr(e, path) && strstr(e, "ENOSPC") && strstr(e, "65536 bytes") &&
              strstr(e, "request of 262144 bytes at offset 2097152 is not stored"),
          "%s: injected -ENOSPC fails the write: %s", path_name, e);
    strata_nvme_stats after = strata_nvme_get_stats(s);
    CHECK(after.failed_requests == before.failed_requests + 1 &&
              after.bytes_written == before.bytes_written,
          "%s: the failed write is counted as failed, not as written", path_name);
    rc = strata_nvme_write(s, 2 * MB, src + 2 * MB, 256 * KB);
    memset(dst, 0, 256 * KB);
    rc |= strata_nvme_read(s, 2 * MB, dst, 256 * KB);
    CHECK(rc == 0 && !memcmp(dst, src + 2 * MB, 256 * KB),
          "%s: rewriting after -ENOSPC stores the data", path_name);

    /* two writes in flight, one completion fails: exactly one request reports it */
    strata_nvme_ticket ta, tb;
    strata_nvme_inject(s, STRATA_NVME_WRITE, 2, -EIO);
    rc = strata_nvme_write_async(s, 0, src, 512 * KB, &ta);
    rc |= strata_nvme_write_async(s, 1 * MB, src + 1 * MB, 512 * KB, &tb);
    int ra = strata_nvme_wait(s, ta), rb = strata_nvme_wait(s, tb);
    CHECK(rc == 0 && (ra != 0) + (rb != 0) == 1,
          "%s: with two writes in flight one -EIO fails exactly one of them", path_name);
    strata_nvme_close(s);
}

/* ---------------------------------------------------------------------------------- */

static void test_open_errors(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/does-not-exist", base);
    strata_nvme_store *s = strata_nvme_open(p, 0, 1 * MB, 64 * KB, 4, NULL, NULL, 0);
    CHECK(!s && strstr(strata_error(), p) && strstr(strata_error(), "does not exist"),
          "missing directory: %s", strata_error());

    snprintf(p, sizeof p, "%s/plain-file", base);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
    s = strata_nvme_open(p, 0, 1 * MB, 64 * KB, 4, NULL, NULL, 0);
    CHECK(!s && strstr(strata_error(), "is not a directory"), "a file as directory: %s",
          strata_error());
    unlink(p);

    /* a read-only directory: a read-only tmpfs when mounting works (root may write to a
     * chmod 555 directory, so permissions alone prove nothing), else /proc */
    snprintf(p, sizeof p, "%s/ro", base);
    mkdir(p, 0755);
    int mounted = mount("tmpfs", p, "tmpfs", MS_RDONLY, "size=1m") == 0;
    if (!mounted) {
        printf("note read-only tmpfs mount failed (%s): using /proc as the unwritable directory\n",
               strerror(errno));
        snprintf(p, sizeof p, "/proc");
    }
    s = strata_nvme_open(p, 0, 1 * MB, 64 * KB, 4, NULL, NULL, 0);
    CHECK(!s && strstr(strata_error(), "cannot create") && strstr(strata_error(), p) &&
              strstr(strata_error(), "writable"),
          "read-only directory: %s", strata_error());
    if (mounted) umount(p);
    snprintf(p, sizeof p, "%s/ro", base);
    rmdir(p);
}

static void test_real_enospc(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/small", base);
    mkdir(p, 0755);
    if (mount("tmpfs", p, "tmpfs", 0, "size=4m") != 0) {
        printf("skip real ENOSPC: mounting a 4 MB tmpfs failed (%s; needs root)\n",
               strerror(errno));
        rmdir(p);
        return;
    }
    strata_nvme_store *s = strata_nvme_open(p, 0, 16 * MB, 64 * KB, 4, NULL, NULL, 0);
    const char *e = strata_error();
    CHECK(!s && strstr(e, p) && strstr(e, "needs 16777216 bytes") && strstr(e, "4194304 bytes free"),
          "a 16 MB store on a 4 MB tmpfs is refused at open: %s", e);
    CHECK(dir_is_empty(p), "nothing is left on the full filesystem");
    s = strata_nvme_open(p, 0, 2 * MB, 64 * KB, 4, NULL, NULL, 0);
    if (s) {
        fill_random(src, 2 * MB, 5);
        int rc = strata_nvme_write(s, 0, src, 2 * MB);
        memset(dst, 0, 2 * MB);
        rc |= strata_nvme_read(s, 0, dst, 2 * MB);
        CHECK(rc == 0 && !memcmp(src, dst, 2 * MB), "a 2 MB store fits on it and round-trips (%s)",
              strata_nvme_is_direct(s) ? "tmpfs took O_DIRECT" : "tmpfs refused O_DIRECT: buffered");
        strata_nvme_close(s);
    } else {
        CHECK(0, "a 2 MB store on the 4 MB tmpfs: %s", strata_error());
    }
    CHECK(dir_is_empty(p), "closing removed the file");
    umount(p);
    rmdir(p);
}

typedef struct worker_arg {
    strata_nvme_store *s;
    int id, rc;
} worker_arg;

/* Each thread owns 8 MB of the store and of src/dst. */
static void *worker(void *arg) {
    worker_arg *w = arg;
    size_t base_off = (size_t)w->id * 8 * MB;
    for (int k = 0; k < 8 && w->rc == 0; k++) {
        size_t off = base_off + (size_t)k * MB;
        if (strata_nvme_write(w->s, off, src + off, MB) != 0) w->rc = 1;
        if (strata_nvme_read(w->s, off, dst + off, MB) != 0) w->rc = 1;
    }
    return NULL;
}

/* A store's file is locked while it is open: reclaim names it and keeps it. A swap file
 * nobody holds (what a SIGKILLed run leaves: the kernel let go of its lock) is removed;
 * files that only look similar are not touched. */
static void test_reclaim(void) {
    char dir[320], stale[400], other[400], odd[400];
    snprintf(dir, sizeof dir, "%s/reclaim", base);
    mkdir(dir, 0755);
    strata_nvme_store *s = strata_nvme_open(dir, 2, 64 * KB, 64 * KB, 2, NULL, NULL, 0);
    CHECK(s != NULL, "reclaim: a store opens (%s)", s ? "" : strata_error());
    if (!s) return;
    snprintf(stale, sizeof stale, "%s/strata-rank00001-999999999.swap", dir);
    snprintf(other, sizeof other, "%s/strata-rank00001-12.swap.bak", dir);
    snprintf(odd, sizeof odd, "%s/notes.txt", dir);
    const char *made[] = {stale, other, odd};
    for (int i = 0; i < 3; i++) {
        int fd = open(made[i], O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            CHECK(write(fd, "x", 1) == 1, "reclaim: wrote %s", made[i]);
            close(fd);
        }
    }
    char live[1024];
    size_t live_bytes = 0;
    int rc = strata_nvme_reclaim(dir, live, sizeof live, &live_bytes);
    CHECK(rc == 0, "reclaim: returns 0 (%s)", rc ? strata_error() : "");
    CHECK(!file_exists(stale), "reclaim: the unlocked swap file %s is removed", stale);
    CHECK(file_exists(strata_nvme_path(s)), "reclaim: the open store's file stays");
    CHECK(strstr(live, strata_nvme_path(s)) && strstr(live, "rank 2 of a running process"),
          "reclaim: the open store's file is named as live: '%s'", live);
    CHECK(live_bytes >= 64 * KB, "reclaim: its %zu bytes on disk are counted", live_bytes);
    CHECK(file_exists(other) && file_exists(odd), "reclaim: files that are not swap files are left alone");
    /* the same process holding the lock through another descriptor still counts as live */
    rc = strata_nvme_reclaim(dir, live, sizeof live, NULL);
    CHECK(rc == 0 && file_exists(strata_nvme_path(s)), "reclaim: a second look keeps the open store's file");
    strata_nvme_close(s);
    rc = strata_nvme_reclaim(dir, live, sizeof live, &live_bytes);
    CHECK(rc == 0 && live[0] == 0 && live_bytes == 0, "reclaim: nothing live once the store is closed: '%s'", live);
    char missing[400];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    CHECK(strata_nvme_reclaim(missing, live, sizeof live, NULL) == 0, "reclaim: a missing directory is left to the plan to name");
    unlink(other);
    unlink(odd);
    rmdir(dir);
}

static void test_threads(void) {
    strata_nvme_store *s = strata_nvme_open(base, 2, 16 * MB, 128 * KB, 8, NULL, NULL, 0);
    if (!s) {
        CHECK(0, "open for threads: %s", strata_error());
        return;
    }
    fill_random(src, 16 * MB, 31);
    memset(dst, 0, 16 * MB);
    pthread_t th[2];
    worker_arg wa[2] = {{s, 0, 0}, {s, 1, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, &wa[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(wa[0].rc == 0 && wa[1].rc == 0 && !memcmp(src, dst, 16 * MB),
          "two threads doing blocking writes and reads on one store get their own data back");
    strata_nvme_close(s);
}

static void test_bench(strata_device *d) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    int rc = strata_bench_io(out, d, base, 256 * KB, 8, 8 * MB);
    fclose(out);
    CHECK(rc == 0 && strstr(text, "pinned H2D") && strstr(text, "pageable D2H") &&
              strstr(text, "nvme write") && strstr(text, "nvme read") && strstr(text, "GB/s"),
          "bench io prints every row (8 MB, informational numbers below)%s%s", rc ? ": " : "",
          rc ? strata_error() : "");
    fputs(text, stdout);
    free(text);
    out = open_memstream(&text, &len);
    rc = strata_bench_io(out, d, NULL, 256 * KB, 8, 1 * MB);
    fclose(out);
    CHECK(rc == 0 && strstr(text, "pinned D2H") && !strstr(text, "nvme read"),
          "bench io without a directory skips the NVMe rows");
    free(text);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/strata-test-nvme-", tmp && *tmp ? tmp : "/tmp");
    size_t blen = strlen(base);
    memset(base + blen, 'X', 6); /* mkdtemp's template suffix */
    base[blen + 6] = 0;
    if (!mkdtemp(base)) {
        printf("FAIL cannot make a scratch directory %s: %s\n", base, strerror(errno));
        return 1;
    }
    strata_device *d = strata_device_open("cpu", 0);
    if (!d) {
        printf("FAIL cannot open the cpu device: %s\n", strata_error());
        return 1;
    }
    /* the I/O buffers come from the pinned pool, as in training */
    strata_pinned_pool *pool = strata_pinned_create(d, 2 * BIG);
    src = pool ? strata_pinned_carve(pool, "nvme-src", BIG) : NULL;
    dst = pool ? strata_pinned_carve(pool, "nvme-dst", BIG) : NULL;
    if (!src || !dst) {
        printf("FAIL pinned buffers: %s\n", strata_error());
        return 1;
    }
    printf("scratch directory %s\n", base);

    static const rt_config rts[] = {
        {64 * KB, 1, 1, 0}, {256 * KB, 4, 1, 0}, {1 * MB, 32, 1, 0},
        {128 * KB, 8, 0, 0}, {1 * MB, 4, 1, 1},
    };
    double t0 = strata_now_ms();
    for (size_t i = 0; i < sizeof rts / sizeof rts[0]; i++) test_round_trip(rts[i]);
    printf("info round trips took %.0f ms\n", strata_now_ms() - t0);
    test_validation();
    test_faults(0);
    test_faults(1);
    test_open_errors();
    test_real_enospc();
    test_threads();
    test_reclaim();
    test_bench(d);

    CHECK(dir_is_empty(base), "no store file is left in %s", base);
    rmdir(base);
    strata_pinned_destroy(pool);
    strata_device_close(d);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
