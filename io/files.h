/* io/files.h: the file side of every format, written once: what a path names (kinds,
 * bounded reads of user-named files), paths, and durable writes (all of a buffer, fsynced
 * files and directories, mkdir -p, a tree removed).
 *
 * Every function fails the project's way (core/common.h): 0 or -1 with the reason in
 * strata_error(), naming the path; callers add what the path was for. */
#ifndef STRATA_FILES_H
#define STRATA_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

int strata_is_dir(const char *path);  /* 1: a directory (links followed) */
int strata_is_file(const char *path); /* 1: a regular file (links followed) */
/* What a non-regular file is, for messages: "a directory", "a FIFO", "a character device"... */
const char *strata_file_kind(mode_t mode);

/* Reads a whole file the user named (a config, a tokenizer, a JSON file) into memory,
 * refusing anything that is not a regular file (a directory, /dev/zero, a FIFO) or holds
 * more than max_bytes, so a wrong path can never eat memory. *out is NUL-terminated and
 * freed by the caller. 0, or -1 with the error naming the file and the limit. */
int strata_read_file_bounded(const char *path, size_t max_bytes, char **out, size_t *len);
/* The same check without reading: 0 if path is a regular file of at most max_bytes. */
int strata_check_file_bounded(const char *path, size_t max_bytes);

/* "dir/file" into out (one slash between them); -1 + error when it does not fit. */
int strata_path_join(char *out, size_t n, const char *dir, const char *file);
/* The folder holding the file `path`: "." when it names none, "/" for a file at the root. */
void strata_path_dir(char *out, size_t n, const char *path);

/* mkdir -p: every missing folder of dir; -1 when one cannot be made or dir names a file. */
int strata_mkdir_p(const char *dir);
/* A directory's fsync makes the names in it durable (new files, renames, deletions); file
 * systems that cannot sync a directory (EINVAL, EROFS) have nothing more to do. */
int strata_fsync_dir(const char *dir);
/* All of buf, in writes of at most 1 GiB (Linux moves at most ~2 GiB a call), retried on
 * EINTR; a write that makes no progress is a full disk. `path` names fd in messages. */
int strata_write_all(int fd, const void *buf, size_t bytes, const char *path);
/* All of [offset, offset + bytes), retried on EINTR; the file ending first is an error
 * (it shrank after it was opened and checked). */
int strata_pread_all(int fd, void *buf, size_t bytes, uint64_t offset, const char *path);
/* Creates (truncating) path, writes the bytes, fsyncs and closes it, every step checked. */
int strata_write_file_synced(const char *path, const void *data, size_t bytes);
/* Replaces path with the bytes so that a crash leaves the old file or the new one, never
 * a part: written to "<path>.tmp", fsynced, renamed over path, its folder fsynced. */
int strata_write_file_atomic(const char *path, const void *data, size_t bytes);
/* rm -r that does not follow links; a path already gone is fine. */
int strata_rm_tree(const char *path);

/* Takes an exclusive flock(2) on the file `path` (created if missing) without waiting, and
 * writes this process's pid, host and start time in it for whoever is refused. 0: taken,
 * its descriptor in *fd (closing it lets go, and so does the process ending, however it
 * ends); 1: another process holds it, and holder has what that one wrote ("" if nothing
 * yet); -1 on a failure. */
int strata_lock_take(const char *path, int *fd, char *holder, size_t holder_n);

/* Hard-links the entry `name` of src_dir into dst_dir under the same name: a file of any
 * kind by link(2) (a symbolic link as the link itself), a directory by making it again
 * (same permissions) and linking its entries in turn. Nothing is copied or moved: src_dir
 * stays as it was. -1 where a link cannot be made (another file system, one without hard
 * links), naming the entry. */
int strata_link_entry(const char *src_dir, const char *name, const char *dst_dir);

/* Puts the directory new_dir in the place of the directory target in one step, so that a
 * path looked up under target finds all of the old directory or all of the new one, never
 * a mix: renameat2(RENAME_EXCHANGE), which leaves the old directory at new_dir's name; a
 * rename when there is no target. Where the file system cannot exchange (EINVAL, ENOSYS;
 * or STRATA_FAULT_NO_RENAME_EXCHANGE=1, to test this path), target is renamed to
 * "<new_dir>.old" and new_dir then to target, the first undone if the second fails: for
 * that moment target is missing, still never mixed. On 0, old_at names where the old
 * directory now is ("" when there was none; the caller removes it) and target's folder
 * is fsynced. */
int strata_dir_swap(const char *new_dir, const char *target, char *old_at, size_t old_n);

#endif
