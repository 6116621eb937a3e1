/* io/files.c: file kinds, bounded reads, paths and durable writes (io/files.h). */
#include "io/files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"

/* Linux moves at most ~2 GiB per read/write call; stay well under it. */
#define IO_CHUNK ((size_t)1 << 30)

int strata_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int strata_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char *strata_file_kind(mode_t m) {
    return S_ISREG(m) ? "a regular file" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

static int check_stat(const char *path, const struct stat *st, size_t max_bytes) {
    if (!S_ISREG(st->st_mode)) return strata_fail("%s: is %s, not a regular file", path, strata_file_kind(st->st_mode));
    if ((uint64_t)st->st_size > max_bytes) {
        char b1[32], b2[32];
        return strata_fail("%s: %s, more than the %s such a file may hold", path,
                           strata_fmt_bytes(b1, sizeof b1, (double)st->st_size),
                           strata_fmt_bytes(b2, sizeof b2, (double)max_bytes));
    }
    return 0;
}

int strata_check_file_bounded(const char *path, size_t max_bytes) {
    struct stat st;
    if (stat(path, &st) != 0) return strata_fail("%s: cannot read: %s", path, strerror(errno));
    return check_stat(path, &st, max_bytes);
}

int strata_read_file_bounded(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
     * fd is read-only: closing it cannot lose data, so no close below is checked. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return strata_fail("%s: cannot read: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        (void)close(fd);
        return strata_fail("%s: cannot stat: %s", path, strerror(e));
    }
    if (check_stat(path, &st, max_bytes)) {
        (void)close(fd);
        return -1;
    }
    /* read to the end, never past max_bytes: the file may grow after fstat */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = strata_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) break;
            cap = cap * 2 < max_bytes + 1 ? cap * 2 : max_bytes + 1;
            buf = strata_xrealloc(buf, cap + 1);
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            (void)close(fd);
            free(buf);
            return strata_fail("%s: read failed: %s", path, strerror(e));
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    (void)close(fd);
    if (n > max_bytes) {
        free(buf);
        char b[32];
        return strata_fail("%s: grew past the %s such a file may hold while being read", path,
                           strata_fmt_bytes(b, sizeof b, (double)max_bytes));
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int strata_path_join(char *out, size_t n, const char *dir, const char *file) {
    size_t dl = strlen(dir);
    int k = snprintf(out, n, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", file);
    if (k < 0 || (size_t)k >= n) {
        if (n) out[0] = 0;
        return strata_fail("%s/%s: path too long (at most %zu bytes)", dir, file, n ? n - 1 : 0);
    }
    return 0;
}

void strata_path_dir(char *out, size_t n, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

int strata_mkdir_p(const char *dir) {
    char p[STRATA_PATH_MAX + 64];
    int k = snprintf(p, sizeof p, "%s", dir);
    if (k < 0 || (size_t)k >= sizeof p) return strata_fail("%.200s...: directory path too long", dir);
    size_t n = strlen(p);
    if (n == 0) return strata_fail("cannot create a directory with an empty name");
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char saved = p[i];
        p[i] = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return strata_fail("%s: cannot create directory: %s", p, strerror(errno));
        p[i] = saved;
    }
    if (!strata_is_dir(p)) return strata_fail("%s: exists but is not a directory", p);
    return 0;
}

int strata_fsync_dir(const char *dir) {
    /* a read-only descriptor: the fsync is the check; its close has nothing to lose */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return strata_fail("%s: cannot open directory to fsync it: %s", dir, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        int e = errno;
        (void)close(fd);
        return strata_fail("%s: fsync of directory failed: %s", dir, strerror(e));
    }
    (void)close(fd);
    return 0;
}

int strata_write_all(int fd, const void *buf, size_t bytes, const char *path) {
    const char *p = buf;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes < IO_CHUNK ? bytes : IO_CHUNK);
        if (w < 0) {
            if (errno == EINTR) continue;
            return strata_fail("%s: write failed: %s", path, strerror(errno));
        }
        if (w == 0) return strata_fail("%s: write made no progress (disk full?)", path);
        p += w;
        bytes -= (size_t)w;
    }
    return 0;
}

int strata_pread_all(int fd, void *buf, size_t bytes, uint64_t offset, const char *path) {
    char *p = buf;
    while (bytes > 0) {
        size_t n = bytes < IO_CHUNK ? bytes : IO_CHUNK;
        ssize_t r = pread(fd, p, n, (off_t)offset);
        if (r < 0) {
            if (errno == EINTR) continue;
            return strata_fail("%s: read of %zu bytes at offset %llu failed: %s", path, n, (unsigned long long)offset,
                               strerror(errno));
        }
        if (r == 0)
            return strata_fail("%s: unexpected end of file at byte %llu (the file shrank after it was opened)", path,
                               (unsigned long long)offset);
        p += r;
        offset += (uint64_t)r;
        bytes -= (size_t)r;
    }
    return 0;
}

int strata_write_file_synced(const char *path, const void *data, size_t bytes) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return strata_fail("%s: cannot create: %s", path, strerror(errno));
    /* on the failing paths the file is already lost; closing it only frees the descriptor */
    if (strata_write_all(fd, data, bytes, path) != 0) {
        (void)close(fd);
        return -1;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        (void)close(fd);
        return strata_fail("%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0) return strata_fail("%s: close failed: %s", path, strerror(errno));
    return 0;
}

int strata_write_file_atomic(const char *path, const void *data, size_t bytes) {
    char tmp[STRATA_PATH_MAX + 16], dir[STRATA_PATH_MAX + 16];
    int k = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (k < 0 || (size_t)k >= sizeof tmp) return strata_fail("%.200s...: path too long", path);
    /* on a failure, removing the temporary twin is best effort: path itself is untouched,
     * and the next write replaces the twin */
    if (strata_write_file_synced(tmp, data, bytes)) {
        (void)unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        (void)unlink(tmp);
        return strata_fail("%s: cannot rename to %s: %s", tmp, path, strerror(e));
    }
    strata_path_dir(dir, sizeof dir, path);
    return strata_fsync_dir(dir);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

int strata_rm_tree(const char *path) {
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return strata_fail("%s: cannot delete: %s", path, strerror(errno));
    return 0;
}

int strata_lock_take(const char *path, int *fd, char *holder, size_t holder_n) {
    *fd = -1;
    if (holder_n) holder[0] = 0;
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f < 0) return strata_fail("%s: cannot open this lock file: %s", path, strerror(errno));
    /* on the refused and failing paths the descriptor was only read: closing it loses nothing */
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK && holder_n) {
            ssize_t n = pread(f, holder, holder_n - 1, 0);
            holder[n > 0 ? n : 0] = 0;
            holder[strcspn(holder, "\n")] = 0;
        }
        (void)close(f);
        return e == EWOULDBLOCK ? 1 : strata_fail("%s: cannot lock: %s", path, strerror(e));
    }
    char host[64] = "?", when[32] = "?", text[256];
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?"); /* only a name in a message */
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    int len = snprintf(text, sizeof text, "pid %ld on %s, started %s\n", (long)getpid(), host, when);
    if (ftruncate(f, 0) != 0 || pwrite(f, text, (size_t)len, 0) != len) {
        int e = errno;
        (void)close(f);
        return strata_fail("%s: cannot write this lock file: %s", path, strerror(e));
    }
    *fd = f;
    return 0;
}

int strata_link_entry(const char *src_dir, const char *name, const char *dst_dir) {
    char src[STRATA_PATH_MAX + 256], dst[STRATA_PATH_MAX + 256];
    STRATA_TRY(strata_path_join(src, sizeof src, src_dir, name));
    STRATA_TRY(strata_path_join(dst, sizeof dst, dst_dir, name));
    struct stat st;
    if (lstat(src, &st) != 0) return strata_fail("%s: cannot stat: %s", src, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (link(src, dst) != 0) return strata_fail("%s: cannot hard-link it as %s: %s", src, dst, strerror(errno));
        return 0;
    }
    if (mkdir(dst, st.st_mode & 07777) != 0) return strata_fail("%s: cannot create directory: %s", dst, strerror(errno));
    DIR *d = opendir(src);
    if (!d) return strata_fail("%s: cannot list: %s", src, strerror(errno));
    int rc = 0;
    struct dirent *ent;
    errno = 0;
    while (!rc && (ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) rc = strata_link_entry(src, ent->d_name, dst);
        errno = 0;
    }
    if (!rc && errno != 0) rc = strata_fail("%s: cannot list: %s", src, strerror(errno));
    (void)closedir(d); /* a directory stream that was only read */
    return rc;
}

int strata_dir_swap(const char *new_dir, const char *target, char *old_at, size_t old_n) {
    char parent[STRATA_PATH_MAX + 16], old[STRATA_PATH_MAX + 32];
    strata_path_dir(parent, sizeof parent, target);
    int k = snprintf(old, sizeof old, "%s.old", new_dir);
    if (k < 0 || (size_t)k >= sizeof old || (size_t)k >= old_n) return strata_fail("%.200s...: path too long", new_dir);
    old_at[0] = 0;
    struct stat st;
    if (lstat(target, &st) != 0) {
        if (errno != ENOENT) return strata_fail("%s: cannot stat: %s", target, strerror(errno));
        if (rename(new_dir, target) != 0) return strata_fail("cannot rename %s to %s: %s", new_dir, target, strerror(errno));
        return strata_fsync_dir(parent);
    }
    if (!S_ISDIR(st.st_mode)) return strata_fail("%s: is %s, not a directory", target, strata_file_kind(st.st_mode));
    const char *no_exchange = getenv("STRATA_FAULT_NO_RENAME_EXCHANGE");
    int e = EINVAL;
    if (!(no_exchange && !strcmp(no_exchange, "1"))) {
        if (renameat2(AT_FDCWD, new_dir, AT_FDCWD, target, RENAME_EXCHANGE) == 0) {
            snprintf(old_at, old_n, "%s", new_dir); /* it fits: it is shorter than old */
            return strata_fsync_dir(parent);
        }
        e = errno;
    }
    if (e != EINVAL && e != ENOSYS)
        return strata_fail("cannot exchange %s with %s: %s", new_dir, target, strerror(e));
    /* the file system cannot exchange: two renames, target missing in between */
    if (rename(target, old) != 0) return strata_fail("cannot rename %s to %s: %s", target, old, strerror(errno));
    if (rename(new_dir, target) != 0) {
        e = errno;
        if (rename(old, target) != 0)
            return strata_fail("cannot rename %s to %s (%s), nor the old directory back from %s: %s", new_dir, target,
                               strerror(e), old, strerror(errno));
        return strata_fail("cannot rename %s to %s: %s", new_dir, target, strerror(e));
    }
    snprintf(old_at, old_n, "%s", old); /* checked above */
    return strata_fsync_dir(parent);
}
