/* tests/fuzz/fuzz_safetensors.c: the safetensors header reader (io/safetensors.c), from
 * memory and from a file, and the range reads that follow it.
 *
 * Input: a whole .safetensors file. It is parsed in memory, then written to a file and
 * opened, and every tensor of a supported dtype is read whole as fp32. Checked beyond "no
 * crash": both ways agree on acceptance, every tensor found by name is that tensor, and
 * an accepted header's tensors lie inside the file. */
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "fuzz.h"

static void check_header(const strata_safetensors *st, uint64_t file_bytes) {
    for (int i = 0; i < st->n_tensors; i++) {
        const strata_st_tensor *t = &st->tensors[i];
        if (strata_safetensors_find(st, t->name) != t)
            fuzz_violation("tensor %d (\"%s\") is not what strata_safetensors_find returns for its name", i, t->name);
        if (t->begin > t->end || st->data_offset + t->end > file_bytes)
            fuzz_violation("tensor \"%s\" at [%llu, %llu) runs past the file's %llu bytes", t->name,
                           (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)file_bytes);
        if (t->end - t->begin != t->numel * strata_st_dtype_bytes(t->dtype))
            fuzz_violation("tensor \"%s\": %llu bytes for %llu elements", t->name,
                           (unsigned long long)(t->end - t->begin), (unsigned long long)t->numel);
    }
    for (int i = 0; i < st->n_meta; i++)
        if (!strata_safetensors_meta(st, st->meta_keys[i])) fuzz_violation("metadata key %d is not found", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    strata_safetensors mem;
    int mem_ok = strata_safetensors_parse(&mem, data, size, size, "fuzz.safetensors") == 0;
    if (mem_ok) {
        check_header(&mem, size);
        strata_safetensors_close(&mem);
    }

    const char *path = fuzz_write("fuzz.safetensors", data, size);
    strata_safetensors st;
    int file_ok = strata_safetensors_open(&st, path) == 0;
    if (file_ok != mem_ok)
        fuzz_violation("parsed from memory: %s; opened as a file: %s", mem_ok ? "accepted" : "refused",
                       file_ok ? "accepted" : "refused");
    if (!file_ok) return 0;
    check_header(&st, size);
    int all_read = 1;
    for (int i = 0; i < st.n_tensors; i++) {
        const strata_st_tensor *t = &st.tensors[i];
        if (t->dtype != STRATA_ST_F32 && t->dtype != STRATA_ST_F16 && t->dtype != STRATA_ST_BF16 &&
            t->dtype != STRATA_ST_F64) {
            float one;
            if (t->numel && strata_safetensors_read_f32(&st, t, 0, 1, &one) == 0)
                fuzz_violation("tensor \"%s\" of dtype %s was read as fp32", t->name, strata_st_dtype_name(t->dtype));
            continue;
        }
        /* numel fits: the header check bounded numel * dtype bytes by the file's size */
        float *dst = malloc((t->numel ? t->numel : 1) * sizeof *dst);
        if (!dst) abort();
        if (strata_safetensors_read_f32(&st, t, 0, t->numel, dst)) all_read = 0;
        /* a range past the end is refused, not read */
        if (strata_safetensors_read_f32(&st, t, t->numel, t->numel + 1, dst) == 0)
            fuzz_violation("tensor \"%s\": elements past its end were read", t->name);
        free(dst);
    }
    strata_safetensors_close(&st);
    fuzz_accepted = all_read;
    return 0;
}
