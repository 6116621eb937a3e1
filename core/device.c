/* core/device.c: what the backends share: dtype facts, opening a backend by name, aligned
 * allocations, and the memory counters every backend's alloc/free report to. */
#include "core/device.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"

size_t strata_dtype_size(strata_dtype t) {
    switch (t) {
    case STRATA_F32: return 4;
    case STRATA_BF16: return 2;
    }
    return 0;
}

const char *strata_dtype_name(strata_dtype t) {
    switch (t) {
    case STRATA_F32: return "f32";
    case STRATA_BF16: return "bf16";
    }
    return "unknown-dtype";
}

#ifndef STRATA_HAVE_CUDA
/* Without nvcc the CUDA backend is absent; these two keep the table's callers free of
 * #ifdefs. With STRATA_HAVE_CUDA they come from core/cuda/device_cuda.cu. */
int strata_cuda_available(void) { return 0; }

strata_device *strata_device_cuda_open(int ordinal) {
    strata_fail("cuda device %d: this strata was built without CUDA (no nvcc at configure "
                "time); rebuild with the CUDA toolkit installed or use device \"cpu\"",
                ordinal);
    return NULL;
}
#endif

strata_device *strata_device_open(const char *backend, int ordinal) {
    if (!backend) backend = "auto";
    strata_device *d = NULL;
    if (!strcmp(backend, "cpu")) {
        d = strata_device_cpu_open();
    } else if (!strcmp(backend, "cuda")) {
        d = strata_device_cuda_open(ordinal);
    } else if (!strcmp(backend, "auto")) {
        d = strata_cuda_available() ? strata_device_cuda_open(ordinal) : strata_device_cpu_open();
    } else {
        strata_fail("device backend \"%s\" is unknown: use \"cpu\", \"cuda\" or \"auto\"", backend);
        return NULL;
    }
    if (!d) {
        /* Copy first: strata_fail formats into the buffer it would be reading. */
        char why[1024];
        snprintf(why, sizeof why, "%s", strata_error());
        strata_fail("opening device \"%s\" (ordinal %d): %s", backend, ordinal, why);
        return NULL;
    }
    STRATA_DEBUG("device", "opened %s", d->description);
    return d;
}

void strata_device_close(strata_device *d) {
    if (d) d->ops->destroy(d);
}

void *strata_alloc_aligned(strata_device *d, strata_mem_kind k, size_t bytes, size_t align, void **raw) {
    *raw = strata_alloc(d, k, bytes);
    if (*raw && ((uintptr_t)*raw & (align - 1))) {
        strata_free(d, k, *raw);
        *raw = NULL;
        if (bytes > SIZE_MAX - align) {
            strata_fail("an aligned allocation of %zu bytes overflows", bytes);
            return NULL;
        }
        *raw = strata_alloc(d, k, bytes + align);
    }
    if (!*raw) return NULL;
    return (void *)(((uintptr_t)*raw + align - 1) & ~(uintptr_t)(align - 1));
}

/* The armed fault's reason; one fault at a time per process is all a test needs. */
static char copy_fault_why[256];

void strata_device_arm_copy_fault(strata_device *d, const char *why) {
    snprintf(copy_fault_why, sizeof copy_fault_why, "%s", why);
    __atomic_store_n(&d->copy_fault_armed, 1, __ATOMIC_RELEASE);
}

int strata_device_copy_fault(strata_device *d, strata_stream *s, void *dst, const void *src, size_t n) {
    /* one copy takes the fault; a copy racing it on another thread goes through */
    if (!__atomic_exchange_n(&d->copy_fault_armed, 0, __ATOMIC_ACQ_REL)) return d->ops->memcpy_async(s, dst, src, n);
    return strata_fail("memcpy of %zu bytes on stream \"%s\": injected failure (%s)", n, d->ops->stream_name(s),
                       copy_fault_why);
}

/* Allocations are rare (start-up, plan changes) but may come from several threads (the
 * offload workers), so one lock for the counters of every device is plenty. */
static pthread_mutex_t mem_count_lock = PTHREAD_MUTEX_INITIALIZER;

void strata_mem_count_alloc(strata_device *d, strata_mem_kind k, size_t bytes) {
    STRATA_ASSERT(k >= 0 && k < STRATA_MEM_KINDS);
    pthread_mutex_lock(&mem_count_lock);
    strata_mem_counters *m = &d->mem[k];
    m->live_bytes += bytes;
    if (m->live_bytes > m->peak_bytes) m->peak_bytes = m->live_bytes;
    m->n_alloc++;
    pthread_mutex_unlock(&mem_count_lock);
}

void strata_mem_count_free(strata_device *d, strata_mem_kind k, size_t bytes) {
    STRATA_ASSERT(k >= 0 && k < STRATA_MEM_KINDS);
    pthread_mutex_lock(&mem_count_lock);
    strata_mem_counters *m = &d->mem[k];
    STRATA_ASSERT(m->live_bytes >= bytes);
    m->live_bytes -= bytes;
    m->n_free++;
    pthread_mutex_unlock(&mem_count_lock);
}
