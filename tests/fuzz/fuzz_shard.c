/* tests/fuzz/fuzz_shard.c: the token shard reader (strata_shard_open and the batch
 * reader over it) and llm.c's tokenizer file, the two binary readers of io/data.c.
 *
 * Input: one file, written as shard_000000.bin. It is opened as a shard; an accepted one
 * is read through strata_loader_open/read with a T and vocabulary size taken from its
 * last byte, every sequence once, in order or shuffled. The same bytes are also loaded as
 * an llm.c tokenizer file (its magic differs, so the corpus holds seeds of both). Checked
 * beyond "no crash": an accepted shard's token count matches the file's size. */
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
    if (sh.n_tokens * 2 + STRATA_SHARD_HEADER_INTS * 4 != size)
        fuzz_violation("shard accepted with %zu tokens in a %zu-byte file", sh.n_tokens, size);
    unsigned sum = 0;
    for (size_t i = 0; i < sh.n_tokens; i++) sum += sh.tokens[i];
    (void)sum;
    strata_shard_close(&sh);

    uint8_t knobs = size ? data[size - 1] : 0;
    int T = 1 + (knobs & 15);
    int vocab = knobs & 16 ? 65536 : 256 + (knobs >> 5);
    int shuffle = knobs >> 7;
    char pattern[640];
    fuzz_path(pattern, sizeof pattern, "shard_*.bin");
    strata_loader L;
    if (strata_loader_open(&L, pattern, T, vocab, shuffle, 1234)) return 0;
    int32_t *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    if (!in || !tg) abort();
    int ok = 1;
    uint64_t n = L.n_chunks < MAX_SEQUENCES ? L.n_chunks : MAX_SEQUENCES;
    for (uint64_t s = 0; s < n + 1 && ok; s++) /* +1: the first of the next epoch */
        ok = strata_loader_read(&L, s, 1, in, tg) == 0;
    for (int t = 0; ok && t < T; t++)
        if (in[t] < 0 || in[t] >= vocab || tg[t] < 0 || tg[t] >= vocab)
            fuzz_violation("token %d outside the vocabulary of %d was read", in[t] >= vocab ? in[t] : tg[t], vocab);
    free(in);
    free(tg);
    strata_loader_close(&L);
    fuzz_accepted = 1;
    return 0;
}
