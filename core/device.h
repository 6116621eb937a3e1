/* core/device.h: the device interface. One table of functions, two backends: CPU
 * (core/cpu/device_cpu.c, always built) and CUDA (core/cuda/device_cuda.cu, built when nvcc is
 * found). Callers never #ifdef; they call through the table.
 *
 * Semantics follow CUDA's:
 *  - memory kinds: device memory, pinned host memory (fast transfers), plain host memory;
 *  - streams run their work in the order it was enqueued; different streams run
 *    concurrently and meet only through events;
 *  - event_record(e, s) marks "everything enqueued on s so far"; stream_wait_event(s2, e)
 *    makes later work on s2 wait for that mark; waiting on a never-recorded event
 *    returns at once.
 *
 * On the CPU backend the compute stream runs its work on the calling thread, at once;
 * every other stream is a worker thread with an ordered queue, and events are real
 * cross-thread signals. A missing wait is therefore a real data race on the CPU too,
 * which ThreadSanitizer reports in CI.
 *
 * Streams come in two kinds. DEVICE streams run copies, memsets and kernels (on CUDA,
 * a cudaStream_t). HOST streams run host functions in order on a worker thread (the MPI
 * collectives, NVMe I/O and CPU AdamW use them); their copies are done by that thread. */
#ifndef STRATA_DEVICE_H
#define STRATA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

typedef enum strata_dtype {
    STRATA_F32 = 0,
    STRATA_BF16 = 1,
} strata_dtype;
size_t strata_dtype_size(strata_dtype t);
const char *strata_dtype_name(strata_dtype t);

typedef enum strata_mem_kind {
    STRATA_MEM_DEVICE = 0,
    STRATA_MEM_PINNED = 1,
    STRATA_MEM_HOST = 2,
    STRATA_MEM_KINDS = 3,
} strata_mem_kind;

typedef enum strata_stream_kind {
    STRATA_STREAM_DEVICE = 0,
    STRATA_STREAM_HOST = 1,
} strata_stream_kind;

typedef struct strata_device strata_device;
typedef struct strata_stream strata_stream;
typedef struct strata_event strata_event;
typedef struct strata_kernels strata_kernels;

/* Live and peak bytes per memory kind, and the number of allocation calls: the tests
 * use these to prove a training step allocates nothing and that the plan is exact. */
typedef struct strata_mem_counters {
    size_t live_bytes;
    size_t peak_bytes;
    uint64_t n_alloc;
    uint64_t n_free;
} strata_mem_counters;

typedef struct strata_device_ops {
    const char *name; /* "cpu" or "cuda", for messages (strata_device_caps says what it can do) */
    void (*destroy)(strata_device *d);

    void *(*alloc)(strata_device *d, strata_mem_kind kind, size_t bytes); /* NULL + error */
    void (*free)(strata_device *d, strata_mem_kind kind, void *p);

    strata_stream *(*stream_create)(strata_device *d, const char *name, strata_stream_kind kind);
    void (*stream_destroy)(strata_stream *s);
    int (*stream_sync)(strata_stream *s); /* host waits until s is idle */

    /* Any direction between any memory kinds of this device. */
    int (*memcpy_async)(strata_stream *s, void *dst, const void *src, size_t bytes);
    int (*memset_async)(strata_stream *s, void *dst, int value, size_t bytes);
    /* Runs fn(arg) in stream order (on the worker of a HOST stream). */
    int (*host_task)(strata_stream *s, void (*fn)(void *arg), void *arg);

    strata_event *(*event_create)(strata_device *d);
    void (*event_destroy)(strata_event *e);
    int (*event_record)(strata_event *e, strata_stream *s);
    int (*stream_wait_event)(strata_stream *s, strata_event *e);
    int (*event_sync)(strata_event *e);  /* host waits for the last record */
    int (*event_query)(strata_event *e); /* 1 complete, 0 pending */
    /* Timing: an event made by event_create_timed also keeps when its newest record was
     * reached, and event_elapsed_ms gives the time from a's to b's, both complete (it
     * never waits: -1 + error while either is pending). On CUDA both must be recorded on
     * DEVICE streams (the GPU's clock); plain events skip timing, which CUDA makes cheaper. */
    strata_event *(*event_create_timed)(strata_device *d);
    int (*event_elapsed_ms)(strata_event *a, strata_event *b, double *ms);

    /* Free and total bytes of device memory, as the backend sees them. */
    int (*mem_info)(strata_device *d, size_t *free_bytes, size_t *total_bytes);
    /* The host waits until all streams are idle (start-up and shutdown only). */
    int (*sync_all)(strata_device *d);
    /* The name the stream was made with, for messages. */
    const char *(*stream_name)(const strata_stream *s);
} strata_device_ops;

/* What callers may assume of a backend; they test these, never its name. */
typedef struct strata_device_caps {
    /* Device memory is ordinary host memory: host code (a host task, MPI, the CPU's
     * kernels) may read and write it directly. Otherwise work on it is a copy or a
     * kernel on one of the device's streams. */
    int host_memory;
    /* A GPU, which other processes share: the memory in use is what mem_info reports
     * (nvidia-smi's view, not only Strata's allocations), and NCCL can move its buffers. */
    int gpu;
} strata_device_caps;

struct strata_device {
    const strata_device_ops *ops;
    strata_device_caps caps;
    const strata_kernels *k; /* the backend's kernels (core/kernels.h) */
    strata_stream *compute;  /* made by the backend at open */
    strata_dtype compute_dtype;
    int ordinal; /* GPU index, 0 on the CPU */
    char description[128];
    strata_mem_counters mem[STRATA_MEM_KINDS];
    int copy_fault_armed; /* strata_device_arm_copy_fault; read and cleared atomically */
    void *impl;
};

/* Opens a backend by name ("cpu" or "cuda"); "auto" picks cuda when a GPU is present.
 * ordinal selects the GPU (ignored on the CPU). NULL + error when unavailable. */
strata_device *strata_device_open(const char *backend, int ordinal);
void strata_device_close(strata_device *d);
int strata_cuda_available(void); /* 1 when built with CUDA and a GPU answers */

/* Thin, readable wrappers over the table. */
static inline void *strata_alloc(strata_device *d, strata_mem_kind k, size_t n) { return d->ops->alloc(d, k, n); }
static inline void strata_free(strata_device *d, strata_mem_kind k, void *p) { d->ops->free(d, k, p); }
static inline strata_stream *strata_stream_create(strata_device *d, const char *name, strata_stream_kind k) { return d->ops->stream_create(d, name, k); }
static inline void strata_stream_destroy(strata_device *d, strata_stream *s) { if (s) d->ops->stream_destroy(s); }
static inline int strata_stream_sync(strata_device *d, strata_stream *s) { return d->ops->stream_sync(s); }
/* A copy fails as a real one would, on whichever backend, once a test has armed the fault
 * (strata_device_arm_copy_fault below); one relaxed atomic load otherwise. */
int strata_device_copy_fault(strata_device *d, strata_stream *s, void *dst, const void *src, size_t n);
static inline int strata_memcpy_async(strata_device *d, strata_stream *s, void *dst, const void *src, size_t n) {
    if (__atomic_load_n(&d->copy_fault_armed, __ATOMIC_RELAXED)) return strata_device_copy_fault(d, s, dst, src, n);
    return d->ops->memcpy_async(s, dst, src, n);
}
static inline int strata_memset_async(strata_device *d, strata_stream *s, void *dst, int v, size_t n) { return d->ops->memset_async(s, dst, v, n); }
static inline int strata_host_task(strata_device *d, strata_stream *s, void (*fn)(void *), void *arg) { return d->ops->host_task(s, fn, arg); }
static inline strata_event *strata_event_create(strata_device *d) { return d->ops->event_create(d); }
static inline void strata_event_destroy(strata_device *d, strata_event *e) { if (e) d->ops->event_destroy(e); }
static inline int strata_event_record(strata_device *d, strata_event *e, strata_stream *s) { return d->ops->event_record(e, s); }
static inline int strata_stream_wait_event(strata_device *d, strata_stream *s, strata_event *e) { return d->ops->stream_wait_event(s, e); }
static inline int strata_event_sync(strata_device *d, strata_event *e) { return d->ops->event_sync(e); }
static inline int strata_event_query(strata_device *d, strata_event *e) { return d->ops->event_query(e); }
static inline strata_event *strata_event_create_timed(strata_device *d) { return d->ops->event_create_timed(d); }
static inline int strata_event_elapsed_ms(strata_device *d, strata_event *a, strata_event *b, double *ms) { return d->ops->event_elapsed_ms(a, b, ms); }

/* Memory of kind k starting on an `align` boundary (a power of two), for O_DIRECT I/O:
 * what the backend returns when that is aligned already (both backends page-align pinned
 * memory), else a block one `align` larger, rounded up. *raw gets the pointer to hand
 * strata_free. NULL + error on failure. */
void *strata_alloc_aligned(strata_device *d, strata_mem_kind k, size_t bytes, size_t align, void **raw);

/* A fault test's switch (STRATA_FAULT_COPY_STEP, read once by shard/engine.c): the next
 * memcpy_async on d, from whatever thread, fails with "memcpy of N bytes on stream S:
 * injected failure (why)" and copies nothing, as a failed cudaMemcpyAsync would. */
void strata_device_arm_copy_fault(strata_device *d, const char *why);

/* Backend constructors (registered in core/device.c). */
strata_device *strata_device_cpu_open(void);
strata_device *strata_device_cuda_open(int ordinal);

/* Bookkeeping shared by the backends. */
void strata_mem_count_alloc(strata_device *d, strata_mem_kind k, size_t bytes);
void strata_mem_count_free(strata_device *d, strata_mem_kind k, size_t bytes);

#endif
