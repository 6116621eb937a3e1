/* tests/gate.h: a host task that blocks its stream until the test opens the gate, so a test
 * can hold work pending for as long as it needs (and queue more behind it) without guessing
 * at sleep lengths, then check that nothing downstream ran early. */
#ifndef STRATA_TESTS_GATE_H
#define STRATA_TESTS_GATE_H

#include <pthread.h>
#include <unistd.h>

typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} gate;

#define GATE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

static inline void gate_init(gate *g) {
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
}

/* A host task: returns once the gate is open. */
static inline void gate_wait(void *arg) {
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static inline void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Opens a gate after ms milliseconds from a thread of its own, for tests whose own
 * threads are all waiting on what the gate holds; gate_timer_join waits for it. */
typedef struct gate_timer {
    gate *g;
    unsigned ms;
    pthread_t thread;
} gate_timer;

static inline void *gate_timer_run(void *arg) {
    gate_timer *t = arg;
    usleep(t->ms * 1000u);
    gate_open(t->g);
    return NULL;
}

static inline void gate_open_after(gate_timer *t, gate *g, unsigned ms) {
    t->g = g;
    t->ms = ms;
    pthread_create(&t->thread, NULL, gate_timer_run, t);
}

static inline void gate_timer_join(gate_timer *t) { pthread_join(t->thread, NULL); }

#endif
