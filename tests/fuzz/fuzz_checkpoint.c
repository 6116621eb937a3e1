/* tests/fuzz/fuzz_checkpoint.c: opening a checkpoint someone else wrote (io/checkpoint_read.c):
 * manifest.yaml, the rank indices and the reads they direct into the rank files.
 *
 * Input: the files of one checkpoint directory joined by NUL bytes (fuzz.h): manifest.yaml,
 * then rank00000.yaml, rank00000.bin, rank00001.yaml, rank00001.bin (the seeds, written
 * by Strata's own checkpoint code, hold fp32 values with no zero byte, so the split
 * falls only where a mutation puts one). A file the input lacks is absent. An accepted
 * checkpoint has every unit and kind read whole, padding included when it is short.
 * Checked beyond "no crash": its layout matches itself, and padding reads as 0. A
 * manifest whose first line is a checksum line gets the right checksum for its body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "fuzz.h"

enum { MAX_RANKS = 2, MAX_PADDING_READ = 1024 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dir[640];
    if (!dir[0]) {
        fuzz_path(dir, sizeof dir, "ckpt");
        if (mkdir(dir, 0700) != 0) abort();
    }
    fuzz_part part[1 + 2 * MAX_RANKS];
    size_t n = fuzz_split(data, size, part, 1 + 2 * MAX_RANKS);
    /* A manifest that starts with its checksum line gets the checksum of its (mutated) body,
     * as a forger would write it, so mutations reach the parser behind the check; one whose
     * first line was itself mutated exercises the check. */
    static const char crc_key[] = "manifest_crc32c: 0x";
    const size_t key_len = sizeof crc_key - 1, line_len = key_len + 9; /* 8 hex digits, '\n' */
    if (part[0].len >= line_len && !memcmp(part[0].data, crc_key, key_len) && part[0].data[line_len - 1] == '\n') {
        uint8_t *manifest = malloc(part[0].len);
        if (!manifest) abort();
        memcpy(manifest, part[0].data, part[0].len);
        char hex[9];
        snprintf(hex, sizeof hex, "%08x", strata_crc32c(0, manifest + line_len, part[0].len - line_len));
        memcpy(manifest + key_len, hex, 8);
        fuzz_write("ckpt/manifest.yaml", manifest, part[0].len);
        free(manifest);
    } else {
        fuzz_write("ckpt/manifest.yaml", part[0].data, part[0].len);
    }
    for (int r = 0; r < MAX_RANKS; r++) {
        char yaml[32], bin[32];
        snprintf(yaml, sizeof yaml, "ckpt/rank%05d.yaml", r);
        snprintf(bin, sizeof bin, "ckpt/rank%05d.bin", r);
        size_t i = 1 + 2 * (size_t)r;
        if (i < n) fuzz_write(yaml, part[i].data, part[i].len);
        else fuzz_remove(yaml);
        if (i + 1 < n) fuzz_write(bin, part[i + 1].data, part[i + 1].len);
        else fuzz_remove(bin);
    }

    strata_ckpt *ck = strata_ckpt_open(dir);
    if (!ck) return 0;
    const strata_param_layout *L = strata_ckpt_get_layout(ck);
    if (strata_ckpt_check_layout(ck, L)) fuzz_violation("a checkpoint's layout differs from itself: %s", strata_error());
    (void)strata_ckpt_get_meta(ck)->config_yaml;
    int ok = 1;
    for (int u = 0; u < L->n_units && ok; u++) {
        /* the open check tiled every unit with segments inside the rank files, so numel
         * is bounded by the input; padding is not, so only a short stretch of it is read */
        size_t numel = L->unit_numel[u], padded = L->unit_padded[u];
        size_t hi = padded > numel && padded - numel <= MAX_PADDING_READ ? padded : numel;
        float *dst = malloc((hi ? hi : 1) * sizeof *dst);
        if (!dst) abort();
        for (int k = 0; k < STRATA_CKPT_KINDS && ok; k++) {
            ok = strata_ckpt_read_range(ck, u, k, 0, hi, dst) == 0;
            for (size_t i = numel; ok && i < hi; i++)
                if (dst[i] != 0.0f) fuzz_violation("unit %d: padding element %zu read as %g", u, i, dst[i]);
            /* a second, partial read goes through the verified-segment cache */
            if (ok && hi > 2) ok = strata_ckpt_read_range(ck, u, k, 1, hi - 1, dst) == 0;
        }
        free(dst);
    }
    strata_ckpt_close(ck);
    fuzz_accepted = ok;
    return 0;
}
