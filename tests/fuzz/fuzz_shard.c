/* tests/fuzz/fuzz_shard.c: the token shard reader (strata_shard_open and the batch
 * reader over it: llm.c's uint16 shards, Strata's 32-bit ones with or without a loss mask,
 * llm.c's Llama 3 ones) and llm.c's tokenizer file, the two binary readers of io/data.c.
 *
 * Input: one file, written as shard_000000.bin. It is opened as a shard; an accepted one
 * is read through strata_loader_open/read with a T and vocabulary size taken from its
 * last byte, every sequence once, in order or shuffled, and its learned targets counted.
 * The same bytes are also loaded as an llm.c tokenizer file (its magic differs, so the
 * corpus holds seeds of both). Checked beyond "no crash": an accepted shard's token count
 * (and mask) matches the file's size; every token read is inside the vocabulary, every
 * target too or -1 where the mask says so; the learned count is the targets that are not
 * -1, and refuses no sequence the read accepts. */
#include <stdlib.h>
#include <string.h>

#include "io/data.h"
#include "fuzz.h"

enum { MAX_SEQUENCES = 4096 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("shard_000000.bin", data, size);
    strata_tokenizer tk;
    if (strata_tokenizer_load(&tk, path) == 0) {
        fuzz_accepted = 1;
        for (int i = 0; i < tk.vocab_size; i++)
            if (strlen(tk.pieces[i]) > tk.lens[i]) fuzz_violation("tokenizer piece %d is longer than its length", i);
        strata_tokenizer_free(&tk);
    }

    strata_shard sh;
    if (strata_shard_open(&sh, path)) return 0;
    size_t per = sh.tokens32 ? 4 + (sh.mask != NULL) : 2;
    if (sh.n_tokens * per + STRATA_SHARD_HEADER_INTS * 4 != size)
        fuzz_violation("shard accepted with %zu tokens (%zu bytes each) in a %zu-byte file", sh.n_tokens, per, size);
    unsigned sum = 0;
    for (size_t i = 0; i < sh.n_tokens; i++) sum += strata_shard_token(&sh, i) + (sh.mask ? sh.mask[i] : 0);
    (void)sum;
    strata_shard_close(&sh);

    uint8_t knobs = size ? data[size - 1] : 0;
    int T = 1 + (knobs & 15);
    int vocab = knobs & 16 ? (knobs & 32 ? 200000 : 65536) : 256 + (knobs >> 5);
    int shuffle = knobs >> 7;
    char pattern[640];
    fuzz_path(pattern, sizeof pattern, "shard_*.bin");
    strata_loader L;
    if (strata_loader_open(&L, pattern, T, vocab, shuffle, 1234)) return 0;
    int32_t *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    if (!in || !tg) abort();
    int ok = 1;
    uint64_t n = L.n_chunks < MAX_SEQUENCES ? L.n_chunks : MAX_SEQUENCES;
    for (uint64_t s = 0; s < n + 1 && ok; s++) { /* +1: the first of the next epoch */
        uint64_t learned = 0, minus = 0;
        ok = strata_loader_read(&L, s, 1, in, tg, NULL) == 0;
        int counted = strata_loader_count_learned(&L, s, 1, &learned) == 0;
        if (ok && !counted) /* the count checks the mask alone; the read checks it and the ids */
            fuzz_violation("sequence %llu: read accepted but the count refused", (unsigned long long)s);
        for (int t = 0; ok && t < T; t++) {
            if (in[t] < 0 || in[t] >= vocab || tg[t] < -1 || tg[t] >= vocab || (tg[t] == -1 && !L.has_mask))
                fuzz_violation("token %d outside the vocabulary of %d was read", in[t] >= vocab ? in[t] : tg[t], vocab);
            minus += tg[t] == -1;
        }
        if (ok && learned != (uint64_t)T - minus)
            fuzz_violation("sequence %llu: %llu learned counted, %llu targets not -1", (unsigned long long)s,
                           (unsigned long long)learned, (unsigned long long)(T - minus));
    }
    free(in);
    free(tg);
    strata_loader_close(&L);
    fuzz_accepted = 1;
    return 0;
}
