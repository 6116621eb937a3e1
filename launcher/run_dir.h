/* launcher/run_dir.h: run.dir belongs to one `strata train` at a time. Rank 0 takes it
 * before anything else is opened: a lock held for the run's life (released by the kernel
 * however the process ends) that names its holder to whoever is refused, and the
 * unfinished checkpoints of a run killed while saving removed; and under mpirun, a check
 * that every rank sees the same run.dir. */
#ifndef STRATA_RUN_DIR_H
#define STRATA_RUN_DIR_H

/* Creates run.dir `dir` if missing, locks it (flock on dir/lock, with this process's pid,
 * host and start time written in it), checks that dir and dir/ckpt are directories it can
 * write (or missing), and removes what killed saves left in dir/ckpt.
 * Returns an exit code with the error set: 0, the lock's descriptor in *lock_fd (closing
 * it lets go of run.dir); 2 when another run holds the lock (the message names it), or
 * when dir or dir/ckpt is a symbolic link loop, a link to nothing, not a directory or
 * not writable; 1 on a failure. */
int strata_run_dir_take(const char *dir, int *lock_fd);

/* Under mpirun, after the take: run.dir must be one directory every rank sees, since each
 * writes its part of a checkpoint into run.dir/ckpt, rank 0 commits them and a resume reads
 * them all. Rank 0 writes dir/job.txt naming this job by a random token (and its pid, host
 * and the job's hosts); every rank reads it back, waiting a few seconds for a shared
 * filesystem's caches when it is not there. Collective. Returns 0 when every rank sees it;
 * 2 on every rank when some cannot (rank 0 names them with their hosts: no file, another
 * job's file, an unreadable one, and what must be shared); 1 when rank 0 cannot write it;
 * -1 + error when the exchange failed. */
int strata_run_dir_shared(const char *dir, int rank, int world);

#endif
