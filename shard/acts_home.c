/* shard/acts_home.c: the residual streams in pinned host memory (shard/acts_home.h). */
#include "shard/acts_home.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"

struct strata_acts_home {
    const strata_model *m;
    strata_device *dev;
    int L, K;                 /* streams 0..L; K device buffers (stream l in l % K) */
    size_t bytes;             /* one stream's */
    void **host;              /* streams 0..L-K: the ones a later forward writes over */
    int holds[STRATA_ACTS_HOME_SLOTS];      /* the stream each buffer holds */
    unsigned char out_pending[STRATA_ACTS_HOME_SLOTS], in_pending[STRATA_ACTS_HOME_SLOTS];
    strata_event *ev_out[STRATA_ACTS_HOME_SLOTS], *ev_in[STRATA_ACTS_HOME_SLOTS];
    strata_event *ev_mark;    /* on compute: everything enqueued so far */
    strata_stream *out, *in;  /* DEVICE streams */
    uint64_t d2h, h2d;
};

strata_acts_home *strata_acts_home_plan(const strata_model *m, strata_arena *a, size_t es) {
    int L = m->shape.n_layer, K = m->resid_slots;
    if (K > L) return NULL; /* every stream has a buffer of its own */
    STRATA_ASSERT(K == STRATA_ACTS_HOME_SLOTS);
    strata_acts_home *h = strata_xcalloc(1, sizeof *h);
    h->m = m;
    h->L = L;
    h->K = K;
    h->bytes = (size_t)m->B * m->T * m->shape.n_embd * es;
    h->host = strata_xcalloc((size_t)(L - K + 1), sizeof *h->host);
    char name[64];
    for (int l = 0; l <= L - K; l++) {
        snprintf(name, sizeof name, "resid.%d (host)", l);
        strata_arena_reserve(a, STRATA_MEM_PINNED, STRATA_CAT_ACTIVATIONS, name, h->bytes, &h->host[l]);
    }
    for (int s = 0; s < K; s++) h->holds[s] = -1;
    return h;
}

void strata_acts_home_open(strata_acts_home *h, strata_device *dev) {
    h->dev = dev;
    h->out = strata_stream_create(dev, "acts-out", STRATA_STREAM_DEVICE);
    h->in = strata_stream_create(dev, "acts-in", STRATA_STREAM_DEVICE);
    h->ev_mark = strata_event_create(dev);
    for (int s = 0; s < h->K; s++) {
        h->ev_out[s] = strata_event_create(dev);
        h->ev_in[s] = strata_event_create(dev);
    }
}

void strata_acts_home_free(strata_acts_home *h) {
    if (!h) return;
    if (h->dev) {
        for (int s = 0; s < h->K; s++) {
            strata_event_destroy(h->dev, h->ev_out[s]);
            strata_event_destroy(h->dev, h->ev_in[s]);
        }
        strata_event_destroy(h->dev, h->ev_mark);
        strata_stream_destroy(h->dev, h->out);
        strata_stream_destroy(h->dev, h->in);
    }
    free(h->host);
    free(h);
}

size_t strata_acts_home_bytes(const strata_acts_home *h) { return h ? (size_t)(h->L - h->K + 1) * h->bytes : 0; }

strata_event *strata_acts_home_before_forward(strata_acts_home *h, int u) {
    if (u > h->L) return NULL; /* the head writes no stream */
    int s = u % h->K;
    h->holds[s] = u;
    if (!h->out_pending[s]) return NULL;
    h->out_pending[s] = 0;
    return h->ev_out[s];
}

int strata_acts_home_after_forward(strata_acts_home *h, int u) {
    if (u > h->L - h->K) return 0; /* no later forward writes over it */
    int s = u % h->K;
    strata_device *d = h->dev;
    STRATA_TRY(strata_event_record(d, h->ev_mark, d->compute));
    STRATA_TRY(strata_stream_wait_event(d, h->out, h->ev_mark));
    STRATA_TRY(strata_memcpy_async(d, h->out, h->host[u], strata_model_resid(h->m, u), h->bytes));
    STRATA_TRY(strata_event_record(d, h->ev_out[s], h->out));
    h->out_pending[s] = 1;
    h->d2h += h->bytes;
    return 0;
}

int strata_acts_home_before_backward(strata_acts_home *h, int u, strata_event **wait) {
    *wait = NULL;
    if (u == 0) return 0; /* the embedding's backward reads no stream */
    int need = u - 1, s = need % h->K;
    if (h->holds[s] != need)
        return strata_fail("residual stream %d is not on the device for unit %d's backward (its buffer holds %d)", need, u,
                           h->holds[s]);
    if (h->in_pending[s]) {
        h->in_pending[s] = 0;
        *wait = h->ev_in[s];
    }
    /* the stream unit u-1's backward reads, into a buffer whose stream (>= u-1+K) the
     * backwards already enqueued were the last to read */
    int next = u - 2, s2 = next % h->K;
    if (next < 0 || h->holds[s2] == next) return 0;
    strata_device *d = h->dev;
    STRATA_TRY(strata_event_record(d, h->ev_mark, d->compute));
    STRATA_TRY(strata_stream_wait_event(d, h->in, h->ev_mark));
    STRATA_TRY(strata_memcpy_async(d, h->in, strata_model_resid(h->m, next), h->host[next], h->bytes));
    STRATA_TRY(strata_event_record(d, h->ev_in[s2], h->in));
    h->in_pending[s2] = 1;
    h->holds[s2] = next;
    h->h2d += h->bytes;
    return 0;
}

void strata_acts_home_take_bytes(strata_acts_home *h, uint64_t *d2h, uint64_t *h2d) {
    *d2h = h ? h->d2h : 0;
    *h2d = h ? h->h2d : 0;
    if (h) h->d2h = h->h2d = 0;
}
