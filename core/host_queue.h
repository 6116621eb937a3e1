/* core/host_queue.h: the worker behind a stream that runs on a thread of its own (every
 * non-compute stream of the CPU backend, every HOST stream of the CUDA one). One thread
 * runs a FIFO of tasks in the order they were pushed; sync waits for what was pushed
 * before it; stop lets the queue drain, as cudaStreamDestroy lets pending work finish.
 *
 * A task is the backend's own struct of task_bytes, copied in; the worker hands each to
 * run(owner, task). The ring grows when full (doubling), so a push never blocks on the
 * worker; once a run's deepest queue has been seen, pushes allocate nothing. */
#ifndef STRATA_HOST_QUEUE_H
#define STRATA_HOST_QUEUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct strata_host_queue {
    char name[64]; /* the stream's, for messages and the thread's name */
    void (*run)(void *owner, void *task);
    void *owner;
    size_t task_bytes;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t has_work; /* the worker waits here for tasks */
    pthread_cond_t progress; /* sync waits here for `done` to advance */
    unsigned char *ring;     /* FIFO of `count` tasks starting at `head`, `cap` slots */
    size_t cap, head, count;
    uint64_t enqueued, done; /* task tickets: sync waits until done reaches enqueued */
    int stop;
} strata_host_queue;

/* Starts the worker thread (named "st:<name>"). 0, or -1 + error naming the stream. */
int strata_host_queue_start(strata_host_queue *q, const char *name, size_t task_bytes,
                            void (*run)(void *owner, void *task), void *owner);
/* Appends a copy of task. `stamp`, when not NULL, edits the caller's task under the
 * queue's lock just before it is copied in, so whatever it numbers enters the FIFO in
 * number order (a CUDA event record takes its ticket so). -1 + error after stop. */
int strata_host_queue_push(strata_host_queue *q, void *task, void (*stamp)(void *owner, void *task));
/* Where the queue stands: tasks done, the one running (0 or 1), and those waiting. */
void strata_host_queue_progress(strata_host_queue *q, uint64_t *done, uint64_t *running, uint64_t *queued);
/* Waits until every task pushed before this call has run. */
void strata_host_queue_sync(strata_host_queue *q);
/* Lets the worker drain the queue, joins it and frees the ring. */
void strata_host_queue_stop(strata_host_queue *q);

#endif
