/* tests/test_io_memory.c: initialising, saving, loading and evaluating hold no memory the
 * plan does not count. Every heap allocation of the process is counted (malloc and its
 * relatives are replaced below, over glibc's own); after the arena is committed, each of
 * those operations may raise the bytes outstanding by at most IO_BOUND_BYTES (the
 * checkpoint reader's scratch, an index's text, small bookkeeping), for a model whose
 * optimizer state is about 20 times that: so any copy of a shard, a unit's range or the
 * whole state outside the arena fails here. Stages 0, 1 and 3, and the optimizer state
 * offloaded to pinned memory, to NVMe (parameters too, at stage 3) and split between
 * the device and the tier. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/common.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/data.h"
#include "io/files.h"
#include "launcher/build.h"
#include "shard/comm.h"
#include "shard/engine.h"
#include "tests/check.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* A sanitizer owns malloc: nothing to count here. */
int main(void) {
    printf("sanitizer build: allocation counting is off, skipping\n");
    return 77;
}
#else

/* ---- counting every allocation ---- */

/* glibc's allocator under the replacement (glibc documents replacing malloc by symbol
 * interposition; these are its exported entry points). */
extern void *__libc_malloc(size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

/* Each block carries its size and the pointer glibc returned, just below what the
 * caller gets. */
typedef struct block_header {
    void *raw;
    size_t bytes;
} block_header;

static long long live_bytes, peak_bytes; /* atomics: OpenMP and stream threads allocate too */

static void *count_block(void *raw, size_t align, size_t bytes) {
    if (!raw) return NULL;
    char *user = (char *)raw + align;
    block_header *h = (block_header *)user - 1;
    h->raw = raw;
    h->bytes = bytes;
    long long now = __atomic_add_fetch(&live_bytes, (long long)bytes, __ATOMIC_RELAXED);
    long long peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return user;
}

static void *aligned_block(size_t align, size_t bytes) {
    if (align < sizeof(block_header)) align = sizeof(block_header);
    if (align & (align - 1)) return NULL;
    return count_block(__libc_memalign(align, bytes + align), align, bytes);
}

void *malloc(size_t bytes) { return count_block(__libc_malloc(bytes + 16), 16, bytes); }
void free(void *p) {
    if (!p) return;
    block_header *h = (block_header *)p - 1;
    __atomic_sub_fetch(&live_bytes, (long long)h->bytes, __ATOMIC_RELAXED);
    __libc_free(h->raw);
}
void *calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}
void *realloc(void *old, size_t bytes) {
    if (!old) return malloc(bytes);
    if (!bytes) {
        free(old);
        return NULL;
    }
    void *p = malloc(bytes);
    if (!p) return NULL;
    size_t had = ((block_header *)old - 1)->bytes;
    memcpy(p, old, had < bytes ? had : bytes);
    free(old);
    return p;
}
void *reallocarray(void *old, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    return realloc(old, n * size);
}
void *memalign(size_t align, size_t bytes) { return aligned_block(align, bytes); }
void *aligned_alloc(size_t align, size_t bytes) { return aligned_block(align, bytes); }
int posix_memalign(void **out, size_t align, size_t bytes) {
    void *p = aligned_block(align, bytes);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
void *valloc(size_t bytes) { return aligned_block((size_t)sysconf(_SC_PAGESIZE), bytes); }
void *pvalloc(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return aligned_block(page, strata_round_up(bytes, page));
}
size_t malloc_usable_size(void *p) { return p ? ((block_header *)p - 1)->bytes : 0; }

/* The highest the outstanding bytes rose above where they stood when `mark` was taken. */
static long long mark(void) {
    long long now = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&peak_bytes, now, __ATOMIC_RELAXED);
    return now;
}
static long long rise_since(long long at) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED) - at; }

/* ---- the runs ---- */

#define IO_BOUND_BYTES ((long long)2 << 20)

static strata_device *dev;
static strata_comm *comm;
static char root[256], data_glob[320];

typedef struct setting {
    const char *what;
    const char *sets[4];
} setting;

/* One setting: build, commit, then init, a step, eval, save, load, each measured. */
static void check_setting(const setting *s) {
    char run_dir[400], nvme[400], sets[8][480];
    snprintf(run_dir, sizeof run_dir, "%s/run", root);
    snprintf(nvme, sizeof nvme, "%s/nvme", root);
    const char *sp[8];
    int n = 0;
    snprintf(sets[n], sizeof sets[n], "data.train=%s", data_glob), sp[n] = sets[n], n++;
    snprintf(sets[n], sizeof sets[n], "offload.nvme_path=%s", nvme), sp[n] = sets[n], n++;
    for (int i = 0; i < 4 && s->sets[i]; i++) sp[n++] = s->sets[i];
    /* per block 12 * 384^2 = 1.8M parameters: 7 MB per state array, 42 MB of state in all */
    const char *yaml = "device: cpu\n"
                       "model: {n_layer: 2, n_head: 4, n_embd: 384, seq_len: 16, vocab_size: 256}\n"
                       "data: {train: x, shuffle: false}\n"
                       "train: {steps: 1, micro_batch: 2, seed: 3}\n";
    strata_config cfg;
    if (strata_config_load_string(&cfg, "test.yaml", yaml, sp, n)) {
        CHECK(0, "%s: config: %s", s->what, strata_error());
        return;
    }
    strata_model m;
    strata_arena arena;
    strata_loader L;
    strata_engine *e = strata_build(&cfg, dev, comm, 0, 1, &m, &arena);
    MUST(strata_arena_commit(&arena));
    MUST(strata_loader_open(&L, data_glob, 16, 256, 0, 3));
    strata_engine_memory mem = strata_engine_get_memory(e);
    CHECK(mem.optimizer >= 20 * (size_t)IO_BOUND_BYTES, "%s: the optimizer state (%zu bytes) is 20 times the bound",
          s->what, mem.optimizer);

    long long at = mark();
    MUST(strata_engine_init_params(e, 3));
    long long init = rise_since(at);
    strata_step_result r;
    MUST(strata_engine_step(e, &L, 0, &r));
    double loss;
    at = mark();
    MUST(strata_engine_eval(e, &L, 2, &loss));
    long long eval = rise_since(at);
    strata_ckpt_meta meta = {.step = 1, .world = 1, .stage = cfg.zero.stage, .seed = 3, .config_yaml = ""};
    char dir[600];
    at = mark();
    MUST(strata_engine_save(e, run_dir, &meta, dir, sizeof dir));
    long long save = rise_since(at);
    strata_ckpt *ck = strata_ckpt_open(dir); /* its index: a few lines per tensor, not counted */
    CHECK(ck != NULL, "%s: the checkpoint opens", s->what);
    long long load = -1;
    if (ck) {
        at = mark();
        MUST(strata_engine_load(e, ck));
        load = rise_since(at);
        strata_ckpt_close(ck);
    }
    MUST(strata_engine_sync(e));
    CHECK(init <= IO_BOUND_BYTES && eval <= IO_BOUND_BYTES && save <= IO_BOUND_BYTES && load >= 0 &&
              load <= IO_BOUND_BYTES,
          "%s: beyond the arena, init holds %lld bytes, eval %lld, save %lld, load %lld (at most %lld each)", s->what,
          init, eval, save, load, IO_BOUND_BYTES);
    strata_loader_close(&L);
    strata_unbuild(e, &arena, &m);
}

int main(void) {
    strata_log_set_level(STRATA_LOG_WARN);
    const char *base = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/strata_io_memory_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    char path[400];
    snprintf(path, sizeof path, "%s/nvme", root);
    if (strata_mkdir_p(path)) return 1;
    uint16_t tok[4096];
    for (size_t i = 0; i < 4096; i++) tok[i] = (uint16_t)((i * 31 + i / 7) % 256);
    snprintf(path, sizeof path, "%s/train_000000.bin", root);
    if (strata_shard_write(path, tok, 4096)) return 1;
    snprintf(data_glob, sizeof data_glob, "%s/train_*.bin", root);
    dev = strata_device_open("cpu", 0);
    comm = strata_comm_open_local(dev);

    static const setting settings[] = {
        {"stage 0", {"zero.stage=0"}},
        {"stage 1", {"zero.stage=1"}},
        {"stage 3", {"zero.stage=3"}},
        {"optimizer in pinned memory", {"offload.optimizer=cpu"}},
        {"optimizer on NVMe", {"offload.optimizer=nvme"}},
        {"stage 3, optimizer and parameters on NVMe", {"zero.stage=3", "offload.optimizer=nvme", "offload.params=nvme"}},
        {"optimizer split: device, pinned, NVMe",
         {"offload.optimizer=nvme", "offload.optimizer_ratio=0.6", "offload.nvme_ratio=0.5"}},
    };
    for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) check_setting(&settings[i]);

    strata_comm_close(comm);
    strata_device_close(dev);
    if (strata_rm_tree(root)) printf("could not remove %s: %s\n", root, strata_error());
    return check_report();
}
#endif
