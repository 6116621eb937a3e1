/* core/host_queue.c: the FIFO and worker thread of core/host_queue.h. */
#include "core/host_queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

static void *worker(void *arg) {
    strata_host_queue *q = arg;
    unsigned char *task = strata_xmalloc(q->task_bytes); /* the running task, off the ring */
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->count == 0 && !q->stop) pthread_cond_wait(&q->has_work, &q->mu);
        if (q->count == 0) break; /* stop requested and the queue is drained */
        memcpy(task, q->ring + q->head * q->task_bytes, q->task_bytes);
        q->head = (q->head + 1) % q->cap;
        q->count--;
        pthread_mutex_unlock(&q->mu);
        q->run(q->owner, task);
        pthread_mutex_lock(&q->mu);
        q->done++;
        pthread_cond_broadcast(&q->progress);
    }
    pthread_mutex_unlock(&q->mu);
    free(task);
    return NULL;
}

int strata_host_queue_start(strata_host_queue *q, const char *name, size_t task_bytes,
                            void (*run)(void *owner, void *task), void *owner) {
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name ? name : "unnamed");
    q->run = run;
    q->owner = owner;
    q->task_bytes = task_bytes;
    q->cap = 64;
    q->ring = strata_xmalloc(q->cap * task_bytes);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->has_work, NULL);
    pthread_cond_init(&q->progress, NULL);
    int rc = pthread_create(&q->thread, NULL, worker, q);
    if (rc) {
        pthread_cond_destroy(&q->progress);
        pthread_cond_destroy(&q->has_work);
        pthread_mutex_destroy(&q->mu);
        free(q->ring);
        q->ring = NULL;
        return strata_fail("stream \"%s\": cannot start its worker thread: %s", q->name, strerror(rc));
    }
    /* Thread names show up in gdb and perf; Linux allows 15 characters. */
    char tname[16] = "st:";
    size_t n = strnlen(q->name, sizeof tname - 4);
    memcpy(tname + 3, q->name, n);
    tname[3 + n] = 0;
    pthread_setname_np(q->thread, tname);
    return 0;
}

int strata_host_queue_push(strata_host_queue *q, void *task, void (*stamp)(void *owner, void *task)) {
    pthread_mutex_lock(&q->mu);
    if (q->stop) {
        pthread_mutex_unlock(&q->mu);
        return strata_fail("stream \"%s\": enqueue after the stream was destroyed", q->name);
    }
    if (q->count == q->cap) {
        size_t cap = q->cap * 2;
        unsigned char *ring = strata_xmalloc(cap * q->task_bytes);
        for (size_t i = 0; i < q->count; i++)
            memcpy(ring + i * q->task_bytes, q->ring + ((q->head + i) % q->cap) * q->task_bytes, q->task_bytes);
        free(q->ring);
        q->ring = ring;
        q->cap = cap;
        q->head = 0;
    }
    if (stamp) stamp(q->owner, task);
    memcpy(q->ring + ((q->head + q->count) % q->cap) * q->task_bytes, task, q->task_bytes);
    q->count++;
    q->enqueued++;
    pthread_cond_signal(&q->has_work);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

void strata_host_queue_progress(strata_host_queue *q, uint64_t *done, uint64_t *running, uint64_t *queued) {
    pthread_mutex_lock(&q->mu);
    *done = q->done;
    *queued = q->count;
    *running = q->enqueued - q->done - q->count; /* popped, not yet done */
    pthread_mutex_unlock(&q->mu);
}

typedef struct queue_wait {
    strata_host_queue *q;
    uint64_t ticket;
} queue_wait;

static int queue_reached(void *arg) {
    queue_wait *w = arg;
    return w->q->done >= w->ticket;
}

static void queue_report(void *arg, double waited) {
    queue_wait *w = arg;
    strata_host_queue *q = w->q;
    char me[32];
    uint64_t done, running, queued;
    strata_host_queue_progress(q, &done, &running, &queued);
    STRATA_WARN("device", "thread \"%s\" has waited %.0f s for stream \"%s\" to finish its queue: %llu of %llu tasks "
                "done, %llu running, %llu queued", strata_thread_name(me, sizeof me), waited, q->name,
                (unsigned long long)done, (unsigned long long)w->ticket, (unsigned long long)running,
                (unsigned long long)queued);
}

void strata_host_queue_sync(strata_host_queue *q) {
    pthread_mutex_lock(&q->mu);
    queue_wait w = {q, q->enqueued}; /* work pushed after this call is not waited for */
    strata_cond_wait_reporting(&q->progress, &q->mu, queue_reached, queue_report, &w);
    pthread_mutex_unlock(&q->mu);
}

void strata_host_queue_stop(strata_host_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->has_work);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->progress);
    pthread_cond_destroy(&q->has_work);
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    q->ring = NULL;
}
