/* tests/test_data.c: token shards (llm.c's uint16, Strata's 32-bit with and without a loss
 * mask, llm.c's Llama 3), the batch reader and its masked targets, the learned-target
 * count, the shard sink's packing overlap, the batch index formula, byte-level text
 * preparation and the llm.c tokenizer file, each against hand-computed results. */
#include "core/common.h"
#include "io/data.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static char tmpdir[256];

static const char *tpath(char *buf, const char *name) {
    snprintf(buf, 1024, "%s/%s", tmpdir, name);
    return buf;
}

/* Writes a shard the way llm.c's Python does: 256 int32 header, then uint16 tokens,
 * with the header fields given explicitly so tests can corrupt them. */
static void write_raw_shard(const char *path, int32_t magic, int32_t version, int32_t n_header,
                            const uint16_t *tokens, size_t n_tokens) {
    int32_t header[256] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = n_header;
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(header, sizeof(int32_t), 256, f);
    if (n_tokens) fwrite(tokens, sizeof(uint16_t), n_tokens, f);
    fclose(f);
}

static int error_is(const char *expected) {
    if (strcmp(strata_error(), expected) == 0) return 1;
    printf("  got:      %s\n  expected: %s\n", strata_error(), expected);
    return 0;
}

static void test_shard_round_trip(void) {
    char p[1024];
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)(i * 977 + 13);
    tpath(p, "round.bin");
    CHECK(strata_shard_write(p, tok, 1000) == 0, "shard_write 1000 tokens");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(tmp, F_OK) != 0, "no .tmp file left behind after the rename");
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == 1024 + 2000, "file is 1024 + 2*1000 bytes");
    strata_shard sh;
    CHECK(strata_shard_open(&sh, p) == 0, "shard_open of the written shard");
    CHECK(sh.n_tokens == 1000 && memcmp(sh.tokens, tok, sizeof tok) == 0,
          "tokens read back equal tokens written");
    strata_shard_close(&sh);
    CHECK(sh.map == NULL && sh.tokens == NULL, "close clears the shard");
}

static void test_bad_shards(void) {
    char p[1024], msg[2048];
    uint16_t tok[1000] = {0};

    write_raw_shard(tpath(p, "badmagic.bin"), 123, 1, 10, tok, 10);
    strata_shard sh;
    CHECK(strata_shard_open(&sh, p) != 0, "bad magic refused");
    snprintf(msg, sizeof msg, "%s: bad magic 123 (expected 20240520; not a token shard)", p);
    CHECK(error_is(msg), "bad magic message names the file and the value");

    write_raw_shard(tpath(p, "trunc.bin"), STRATA_SHARD_MAGIC, 1, 1000, tok, 998);
    CHECK(strata_shard_open(&sh, p) != 0, "truncated shard refused");
    snprintf(msg, sizeof msg, "%s: header says 1000 tokens but the file holds 998", p);
    CHECK(error_is(msg), "truncated message gives both counts");

    write_raw_shard(tpath(p, "ver.bin"), STRATA_SHARD_MAGIC, 3, 10, tok, 10);
    CHECK(strata_shard_open(&sh, p) != 0, "wrong version refused");
    snprintf(msg, sizeof msg, "%s: unsupported shard version 3 (expected 1, uint16 tokens, or 2, uint32 tokens)", p);
    CHECK(error_is(msg), "version message names the version");

    FILE *f = fopen(tpath(p, "tiny.bin"), "wb");
    fwrite("hello", 1, 5, f);
    fclose(f);
    CHECK(strata_shard_open(&sh, p) != 0, "file shorter than the header refused");
    snprintf(msg, sizeof msg,
             "%s: file is 5 bytes, shorter than the 1024-byte shard header (not a token shard, "
             "or truncated)",
             p);
    CHECK(error_is(msg), "short file message gives the size");

    CHECK(strata_shard_open(&sh, tpath(p, "absent.bin")) != 0, "missing shard refused");
    snprintf(msg, sizeof msg, "%s: cannot open token shard: No such file or directory", p);
    CHECK(error_is(msg), "missing shard message names the file");
}

/* A header of our choosing, then raw payload bytes: for 32-bit shards and their corruptions. */
static void write_raw32(const char *path, int32_t magic, int32_t version, int32_t n_header, int32_t flags,
                        const void *payload, size_t bytes) {
    int32_t header[256] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = n_header;
    header[3] = flags;
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(header, sizeof(int32_t), 256, f);
    if (bytes) fwrite(payload, 1, bytes, f);
    fclose(f);
}

static void test_shard32(void) {
    char p[1024], msg[2048];
    uint32_t tok[300];
    uint8_t mask[300];
    for (int i = 0; i < 300; i++) {
        tok[i] = (uint32_t)(i * 977 + 65000); /* past 65536 from the third token on */
        mask[i] = (uint8_t)(i % 3 != 0);
    }
    strata_shard sh;
    tpath(p, "wide.bin");
    CHECK(strata_shard_write32(p, tok, NULL, 300, 0, 0) == 0, "shard_write32 without a mask");
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == 1024 + 1200, "32-bit shard is 1024 + 4*300 bytes");
    CHECK(strata_shard_open(&sh, p) == 0 && sh.tokens32 && !sh.tokens && !sh.mask && sh.n_tokens == 300 &&
              memcmp(sh.tokens32, tok, sizeof tok) == 0 && strata_shard_token(&sh, 299) == tok[299],
          "32-bit tokens read back, no mask");
    strata_shard_close(&sh);
    tpath(p, "masked.bin");
    CHECK(strata_shard_write32(p, tok, mask, 300, 0, 0) == 0, "shard_write32 with a mask");
    CHECK(stat(p, &st) == 0 && st.st_size == 1024 + 1500, "masked shard is 1024 + 5*300 bytes");
    CHECK(strata_shard_open(&sh, p) == 0 && sh.mask && memcmp(sh.mask, mask, 300) == 0 &&
              memcmp(sh.tokens32, tok, sizeof tok) == 0,
          "tokens and mask read back");
    strata_shard_close(&sh);

    /* llm.c's Llama 3 shards: another magic, version 7, uint32 */
    write_raw32(tpath(p, "llmc3.bin"), STRATA_SHARD_LLMC32_MAGIC, 7, 300, 0, tok, sizeof tok);
    CHECK(strata_shard_open(&sh, p) == 0 && sh.tokens32 && sh.n_tokens == 300 && !sh.mask,
          "llm.c's Llama 3 shard (magic 20240801, version 7) opens");
    strata_shard_close(&sh);
    write_raw32(tpath(p, "llmc3v.bin"), STRATA_SHARD_LLMC32_MAGIC, 1, 300, 0, tok, sizeof tok);
    CHECK(strata_shard_open(&sh, p) != 0, "llm.c Llama 3 magic with another version refused");
    snprintf(msg, sizeof msg, "%s: unsupported llm.c Llama 3 shard version 1 (expected 7)", p);
    CHECK(error_is(msg), "its message names the version");

    /* the checks of the 16-bit format hold for the 32-bit one */
    write_raw32(tpath(p, "trunc32.bin"), STRATA_SHARD_MAGIC, 2, 300, 0, tok, 4 * 299);
    CHECK(strata_shard_open(&sh, p) != 0, "truncated 32-bit shard refused");
    snprintf(msg, sizeof msg, "%s: header says 300 tokens but the file holds 299", p);
    CHECK(error_is(msg), "truncated 32-bit message gives both counts");
    write_raw32(tpath(p, "truncmask.bin"), STRATA_SHARD_MAGIC, 2, 60, 1, tok, 5 * 60 - 1);
    CHECK(strata_shard_open(&sh, p) != 0, "masked shard missing its last mask byte refused");
    snprintf(msg, sizeof msg, "%s: header says 60 tokens but the file holds 59", p);
    CHECK(error_is(msg), "its message gives both counts");
    write_raw32(tpath(p, "odd32.bin"), STRATA_SHARD_MAGIC, 2, 60, 0, tok, 4 * 60 + 2);
    CHECK(strata_shard_open(&sh, p) != 0, "32-bit shard with a stray half token refused");
    snprintf(msg, sizeof msg, "%s: 242 bytes after the header are not a whole number of uint32 tokens", p);
    CHECK(error_is(msg), "its message names the unit");
    write_raw32(tpath(p, "flags.bin"), STRATA_SHARD_MAGIC, 2, 60, 6, tok, 4 * 60);
    CHECK(strata_shard_open(&sh, p) != 0, "unknown flag bits refused");
    snprintf(msg, sizeof msg, "%s: flags 0x6 in header[3] name bits this reader does not know (only bit 0, the loss "
             "mask, and bit 1, document starts)", p);
    CHECK(error_is(msg), "flags message names the bits");
    write_raw32(tpath(p, "docs_nomask.bin"), STRATA_SHARD_MAGIC, 2, 60, 2, tok, 4 * 60);
    CHECK(strata_shard_open(&sh, p) != 0, "document starts without a mask refused");
    snprintf(msg, sizeof msg, "%s: flags 0x2 in header[3]: bit 1 (document starts, kept in the mask) without bit 0 "
             "(a mask)", p);
    CHECK(error_is(msg), "its message says the mask is missing");
}

/* 32-bit masked shards through the loader: ids past 65536, masked targets -1, the learned
 * count, a vocabulary error and a corrupt mask byte named by shard and position. */
static void test_loader_masked(void) {
    char dir[1024], p[1100], pat[1100], msg[2048];
    snprintf(dir, sizeof dir, "%s/masked", tmpdir);
    mkdir(dir, 0755);
    /* shard 0: tokens 70000..70012 (13 tokens, T=4: 3 chunks), mask 0 at every third */
    uint32_t tok[13];
    uint8_t mask[13];
    for (int i = 0; i < 13; i++) {
        tok[i] = 70000u + (uint32_t)i;
        mask[i] = (uint8_t)(i % 3 != 0);
    }
    snprintf(p, sizeof p, "%s/train_000000.bin", dir);
    CHECK(strata_shard_write32(p, tok, mask, 13, 0, 0) == 0, "masked shard written");
    /* shard 1: llm.c's uint16, no mask: 5 tokens, 1 chunk, every target learned */
    uint16_t small[5] = {1, 2, 3, 4, 5};
    snprintf(p, sizeof p, "%s/train_000001.bin", dir);
    CHECK(strata_shard_write(p, small, 5) == 0, "16-bit shard written beside it");
    snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
    int wide = -1, packed = -1;
    CHECK(strata_shards_info(pat, &wide, &packed, NULL) == 0 && wide == 1 && packed == 0,
          "strata_shards_info: one 32-bit shard makes the set wide; none is packed");
    snprintf(p, sizeof p, "%s/train_000001.bin", dir);
    CHECK(strata_shards_info(p, &wide, &packed, NULL) == 0 && wide == 0, "strata_shards_info: llm.c's shard alone is not wide");
    strata_loader L;
    CHECK(strata_loader_open(&L, pat, 4, 128256, 0, 0) == 0 && L.n_chunks == 4 && L.has_mask,
          "a vocabulary of 128256 opens on 32-bit shards, with a mask");
    int32_t in[16], tg[16];
    CHECK(strata_loader_read(&L, 0, 4, in, tg, NULL) == 0, "read 4 sequences");
    const int32_t want_in[16] = {70000, 70001, 70002, 70003, 70004, 70005, 70006, 70007,
                                 70008, 70009, 70010, 70011, 1, 2, 3, 4};
    /* target t is token t+1, -1 where its mask byte is 0 (positions 3, 6, 9, 12) */
    const int32_t want_tg[16] = {70001, 70002, -1, 70004, 70005, -1, 70007, 70008,
                                 -1, 70010, 70011, -1, 2, 3, 4, 5};
    CHECK(memcmp(in, want_in, sizeof in) == 0, "inputs: 32-bit ids, then the uint16 shard's");
    CHECK(memcmp(tg, want_tg, sizeof tg) == 0, "targets the mask does not learn are -1");
    uint64_t n = 0;
    CHECK(strata_loader_count_learned(&L, 0, 4, &n) == 0 && n == 12, "12 of 16 targets learned (got %llu)",
          (unsigned long long)n);
    CHECK(strata_loader_count_learned(&L, 1, 1, &n) == 0 && n == 3, "sequence 1 alone: 3 learned");
    CHECK(strata_loader_count_learned(&L, 4 + 3, 1, &n) == 0 && n == 4, "the unmasked shard's sequence, an epoch on: 4");
    strata_loader_close(&L);

    CHECK(strata_loader_open(&L, pat, 4, 70005, 0, 0) == 0, "open with vocab 70005");
    CHECK(strata_loader_read(&L, 1, 1, in, tg, NULL) != 0, "token 70005 refused with vocab 70005");
    snprintf(msg, sizeof msg,
             "%s/train_000000.bin: token 70005 at position 5 is >= vocab_size 70005 (data tokenised for a larger "
             "vocabulary?)", dir);
    CHECK(error_is(msg), "32-bit vocabulary error names shard and position");
    strata_loader_close(&L);

    mask[6] = 7;
    snprintf(p, sizeof p, "%s/train_000000.bin", dir);
    CHECK(strata_shard_write32(p, tok, mask, 13, 0, 0) == 0, "a shard with a corrupt mask byte");
    CHECK(strata_loader_open(&L, pat, 4, 128256, 0, 0) == 0, "opens (masks are checked as read)");
    CHECK(strata_loader_count_learned(&L, 1, 1, &n) != 0, "the count refuses mask byte 7");
    snprintf(msg, sizeof msg, "%s/train_000000.bin: mask byte 7 at position 6 is not one this shard's flags define "
             "(0 or 1; a corrupt shard?)", dir);
    CHECK(error_is(msg), "mask error names shard and position");
    CHECK(strata_loader_read(&L, 1, 1, in, tg, NULL) != 0 && error_is(msg), "so does the read");
    strata_loader_close(&L);
    /* vocabulary sizes are no longer capped at 65536 for uint16 data either */
    snprintf(p, sizeof p, "%s/train_000001.bin", dir);
    CHECK(strata_loader_open(&L, p, 4, 100000, 0, 0) == 0 && !L.has_mask, "uint16 shard opens with vocab 100000");
    strata_loader_close(&L);
}

/* The sink with overlap: shards of k*T + 1 tokens, each after the first starting with the
 * token the one before ended on, so sequence g of the whole stream is chunk g of the set. */
static void test_sink_overlap(void) {
    char dir[1024], pat[1100];
    snprintf(dir, sizeof dir, "%s/sink", tmpdir);
    mkdir(dir, 0755);
    enum { T = 4, SEQ = 7 };
    int32_t ids[SEQ * T + 1];
    uint8_t mask[SEQ * T + 1];
    for (int i = 0; i < SEQ * T + 1; i++) {
        ids[i] = 100000 + i;
        mask[i] = (uint8_t)(i % 2);
    }
    strata_shard_sink s;
    strata_shard_sink_init(&s, dir, "train", 2 * T + 1, 0, 1, T);
    CHECK(strata_shard_sink_push(&s, ids, mask, 10) == 0 && strata_shard_sink_push(&s, ids + 10, mask + 10, SEQ * T + 1 - 10) == 0 &&
              strata_shard_sink_finish(&s) == 0,
          "7 sequences of 4 (+1) through a sink of 2-sequence shards");
    CHECK(s.n_shards == 4 && s.total == SEQ * T + 1, "4 shards (2+2+2+1 sequences), 29 tokens counted once (got %d, %zu)",
          s.n_shards, s.total);
    size_t want_learned = 0;
    for (int i = 0; i < SEQ * T + 1; i++) want_learned += mask[i];
    CHECK(s.learned == want_learned, "learned tokens counted once: %zu", s.learned);
    snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
    strata_loader L;
    CHECK(strata_loader_open(&L, pat, T, 200000, 0, 0) == 0 && L.n_chunks == SEQ, "the set holds exactly 7 chunks");
    int32_t in[SEQ * T], tg[SEQ * T];
    int ok = strata_loader_read(&L, 0, SEQ, in, tg, NULL) == 0;
    for (int g = 0; ok && g < SEQ; g++)
        for (int t = 0; t < T; t++) {
            int i = g * T + t;
            ok &= in[i] == ids[i] && tg[i] == (mask[i + 1] ? ids[i + 1] : -1);
        }
    CHECK(ok, "sequence g is stream tokens [gT, gT+T], across every shard boundary");
    strata_loader_close(&L);

    /* the shards record the length they were packed to, and refuse to be read in another */
    int wide = 0, packed = 0;
    CHECK(strata_shards_info(pat, &wide, &packed, NULL) == 0 && wide && packed == T, "every shard records seq_len %d (got %d)",
          T, packed);
    char first[1200], msg[2048];
    snprintf(first, sizeof first, "%s/train_000000.bin", dir);
    CHECK(strata_loader_open(&L, pat, 2 * T, 200000, 0, 0) == -1, "sequences of 2T from shards packed to T refused");
    snprintf(msg, sizeof msg, "%s: its examples were packed into sequences of 4 tokens (strata prepare --jsonl --seq-len "
             "4), but sequences of 8 are read from it: train with train.seq_len 4, or prepare again with --seq-len 8",
             first);
    CHECK(error_is(msg), "the refusal names the shard and both lengths");
    uint32_t tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    snprintf(first, sizeof first, "%s/other_000000.bin", dir);
    CHECK(strata_shard_write32(first, tok, NULL, 9, 2, 0) == 0, "a shard packed to 2");
    snprintf(pat, sizeof pat, "%s/*_000000.bin", dir);
    CHECK(strata_shards_info(pat, &wide, &packed, NULL) == 0 && packed == -1, "shards packed to 2 and to 4: -1 (got %d)", packed);
    CHECK(strata_shard_write32(first, tok, NULL, 9, -1, 0) != 0, "a negative packed length is not written");
    int32_t header[256] = {0};
    header[0] = STRATA_SHARD_MAGIC;
    header[1] = STRATA_SHARD_VERSION_32;
    header[2] = 9;
    header[4] = -3;
    FILE *f = fopen(first, "wb");
    CHECK(f && fwrite(header, sizeof header, 1, f) == 1 && fwrite(tok, sizeof tok, 1, f) == 1 && fclose(f) == 0,
          "a shard whose header[4] is -3");
    strata_shard sh;
    CHECK(strata_shard_open(&sh, first) != 0, "a negative packed length refused");
    snprintf(msg, sizeof msg, "%s: header[4], the packed sequence length, is -3 (negative; corrupt header)", first);
    CHECK(error_is(msg), "its message names header[4]");
}

/* Two hand-built llm.c shards, created in reverse name order to check the glob is sorted:
 * shard_00 holds 0..10 (11 tokens -> 2 chunks of 5: [0..4], [4..8]; 9, 10 unused),
 * shard_01 holds 100..108 (9 tokens -> 2 chunks: [100..104], [104..108]). */
static void make_llmc_dir(char *dir_out) {
    snprintf(dir_out, 1024, "%s/llmc", tmpdir);
    mkdir(dir_out, 0755);
    char p[1100];
    uint16_t b[9], a[11];
    for (int i = 0; i < 9; i++) b[i] = (uint16_t)(100 + i);
    for (int i = 0; i < 11; i++) a[i] = (uint16_t)i;
    snprintf(p, sizeof p, "%s/shard_01.bin", dir_out);
    write_raw_shard(p, STRATA_SHARD_MAGIC, 1, 9, b, 9);
    snprintf(p, sizeof p, "%s/shard_00.bin", dir_out);
    write_raw_shard(p, STRATA_SHARD_MAGIC, 1, 11, a, 11);
}

static void test_loader_sequences(void) {
    char dir[1024], pat[1100];
    make_llmc_dir(dir);
    snprintf(pat, sizeof pat, "%s/*.bin", dir);
    strata_loader L;
    CHECK(strata_loader_open(&L, pat, 4, 256, 0, 0) == 0, "loader opens hand-built llm.c shards");
    CHECK(L.n_shards == 2 && L.n_chunks == 4, "2 shards give 2 + 2 chunks of T+1 = 5 (got %d, %llu)",
          L.n_shards, (unsigned long long)L.n_chunks);
    /* seq 1..5: within shard 0, across the boundary into shard 1, then the epoch wraps
     * back to seq 0 and 1. */
    int32_t in[5 * 4], tg[5 * 4];
    CHECK(strata_loader_read(&L, 1, 5, in, tg, NULL) == 0, "read seq 1..5");
    const int32_t want_in[5 * 4] = {4, 5, 6, 7, 100, 101, 102, 103, 104, 105,
                                    106, 107, 0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t want_tg[5 * 4] = {5, 6, 7, 8, 101, 102, 103, 104, 105, 106,
                                    107, 108, 1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(memcmp(in, want_in, sizeof in) == 0, "inputs across shard boundary and epoch wrap");
    CHECK(memcmp(tg, want_tg, sizeof tg) == 0, "targets are inputs shifted by one");
    /* A late epoch gives the same chunk as epoch 0 without shuffling. */
    int32_t in1[4], tg1[4];
    CHECK(strata_loader_read(&L, 4 * 1000 + 2, 1, in1, tg1, NULL) == 0 && in1[0] == 100 && tg1[3] == 104,
          "seq 4002 (epoch 1000) is chunk 2");
    strata_loader_close(&L);

    /* Vocabulary check names the shard and the position. */
    char msg[2048];
    CHECK(strata_loader_open(&L, pat, 4, 105, 0, 0) == 0, "open with vocab 105");
    CHECK(strata_loader_read(&L, 0, 3, in, tg, NULL) == 0, "chunks below the vocabulary read fine");
    CHECK(strata_loader_read(&L, 3, 1, in, tg, NULL) != 0, "token 105 refused with vocab 105");
    snprintf(msg, sizeof msg,
             "%s/shard_01.bin: token 105 at position 5 is >= vocab_size 105 (data tokenised for a "
             "larger vocabulary?)",
             dir);
    CHECK(error_is(msg), "vocab error names shard and position");
    strata_loader_close(&L);

    snprintf(pat, sizeof pat, "%s/none/*.bin", tmpdir);
    CHECK(strata_loader_open(&L, pat, 4, 256, 0, 0) != 0, "glob with no match refused");
    snprintf(msg, sizeof msg, "no token shards match '%s'", pat);
    CHECK(error_is(msg), "no-match message names the pattern");

    /* A shard too short for one chunk. */
    char p[1100];
    uint16_t few[4] = {1, 2, 3, 4};
    snprintf(p, sizeof p, "%s/short_shard.bin", tmpdir);
    write_raw_shard(p, STRATA_SHARD_MAGIC, 1, 4, few, 4);
    CHECK(strata_loader_open(&L, p, 4, 256, 0, 0) != 0, "shards with no full chunk refused");
    snprintf(msg, sizeof msg,
             "'%s': 1 shard holding 4 tokens, but none holds a sequence of T+1 = 5 tokens (use "
             "more data or a shorter seq_len)",
             p);
    CHECK(error_is(msg), "too-short message gives counts");
}

/* Shard of tokens 0..48 with T=4: 12 chunks; chunk c starts with token 4c, which
 * identifies it. */
static void read_epoch(strata_loader *L, uint64_t epoch, int *chunk_ids) {
    int n = (int)L->n_chunks;
    int32_t *in = malloc(sizeof(int32_t) * 4 * n), *tg = malloc(sizeof(int32_t) * 4 * n);
    if (strata_loader_read(L, epoch * (uint64_t)n, n, in, tg, NULL) != 0) {
        printf("read failed: %s\n", strata_error());
        exit(1);
    }
    for (int i = 0; i < n; i++) chunk_ids[i] = in[4 * i] / 4;
    free(in);
    free(tg);
}

static int is_permutation(const int *ids, int n) {
    int seen[64] = {0};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n || seen[ids[i]]) return 0;
        seen[ids[i]] = 1;
    }
    return 1;
}

static void test_shuffle(void) {
    char p[1024];
    uint16_t tok[49];
    for (int i = 0; i < 49; i++) tok[i] = (uint16_t)i;
    tpath(p, "shuf.bin");
    strata_shard_write(p, tok, 49);
    strata_loader L, L2, L3;
    CHECK(strata_loader_open(&L, p, 4, 256, 1, 1234) == 0 && L.n_chunks == 12, "shuffled loader, 12 chunks");
    int e0[12], e1[12], e0b[12], e0c[12], e1c[12];
    read_epoch(&L, 1, e1); /* out of order on purpose: the order is a function of (seed, seq) */
    read_epoch(&L, 0, e0);
    CHECK(is_permutation(e0, 12), "epoch 0 visits every chunk once");
    CHECK(is_permutation(e1, 12), "epoch 1 visits every chunk once");
    CHECK(memcmp(e0, e1, sizeof e0) != 0, "epochs 0 and 1 are ordered differently");
    int identity = 1;
    for (int i = 0; i < 12; i++) identity &= e0[i] == i;
    CHECK(!identity, "epoch 0 is not the identity order");

    CHECK(strata_loader_open(&L2, p, 4, 256, 1, 1234) == 0, "second loader, same seed");
    read_epoch(&L2, 0, e0b);
    CHECK(memcmp(e0, e0b, sizeof e0) == 0, "same seed gives the same order");
    /* One sequence read alone on a fresh loader equals its place in the full epoch. */
    int32_t in[4], tg[4];
    strata_loader_read(&L2, 12 + 7, 1, in, tg, NULL);
    CHECK(in[0] / 4 == e1[7] && tg[3] == in[3] + 1, "seq 19 alone equals epoch 1 position 7");

    CHECK(strata_loader_open(&L3, p, 4, 256, 1, 99) == 0, "third loader, seed 99");
    read_epoch(&L3, 0, e0c);
    read_epoch(&L3, 1, e1c);
    CHECK(is_permutation(e0c, 12), "seed 99 epoch 0 is a permutation");
    CHECK(memcmp(e0, e0c, sizeof e0) != 0 || memcmp(e1, e1c, sizeof e1) != 0,
          "a different seed gives a different order");
    strata_loader_close(&L);
    strata_loader_close(&L2);
    strata_loader_close(&L3);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_batch_seq(void) {
    const int B = 2;
    int all_ok = 1, same_order = 1;
    for (int N = 1; N <= 4; N++)
        for (int A = 1; A <= 3; A++)
            for (int64_t step = 0; step < 3; step++) {
                int G = N * B * A;
                uint64_t dist[64], one[64];
                int k = 0;
                for (int a = 0; a < A; a++)
                    for (int r = 0; r < N; r++)
                        for (int b = 0; b < B; b++) {
                            dist[k++] = strata_batch_seq(step, a, r, b, N, A, B);
                            /* World N micro-batch B equals world 1 micro-batch N*B, micro by micro. */
                            if (strata_batch_seq(step, a, r, b, N, A, B) !=
                                strata_batch_seq(step, a, 0, r * B + b, 1, A, N * B))
                                same_order = 0;
                        }
                for (int b = 0; b < G; b++) one[b] = strata_batch_seq(step, 0, 0, b, 1, 1, G);
                qsort(dist, G, sizeof *dist, cmp_u64);
                qsort(one, G, sizeof *one, cmp_u64);
                /* Oracle: step s covers exactly [s*G, (s+1)*G), each once. */
                for (int i = 0; i < G; i++)
                    if (dist[i] != (uint64_t)(step * G + i) || one[i] != dist[i]) all_ok = 0;
            }
    CHECK(all_ok, "world N x micro-batch B x accum A covers the same sequences per step as world 1 "
                  "x micro-batch N*B*A (N 1..4, A 1..3)");
    CHECK(same_order, "each micro-step of world N equals that micro-step of world 1 with N*B rows");
    CHECK(strata_batch_seq(5, 1, 2, 1, 4, 3, 2) == 5 * 24 + 1 * 8 + 2 * 2 + 1, "formula spot check");
}

static void write_file(const char *path, const unsigned char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
}

static void test_prepare_text(void) {
    char f1[1024], f2[1024], out[1024], p[1100], msg[4096];
    unsigned char t1[1000], t2[300];
    for (int i = 0; i < 1000; i++) t1[i] = (unsigned char)(i * 7);
    for (int i = 0; i < 300; i++) t2[i] = (unsigned char)(255 - i);
    write_file(tpath(f1, "a.txt"), t1, sizeof t1);
    write_file(tpath(f2, "b.txt"), t2, sizeof t2);
    tpath(out, "prep/nested/dir");
    /* A stale shard from an earlier, larger preparation must not survive. */
    mkdir(tpath(p, "prep"), 0755);
    mkdir(tpath(p, "prep/nested"), 0755);
    mkdir(tpath(p, "prep/nested/dir"), 0755);
    snprintf(p, sizeof p, "%s/train_000009.bin", out);
    uint16_t z = 0;
    strata_shard_write(p, &z, 1);

    const char *files[2] = {f1, f2};
    CHECK(strata_prepare_text(files, 2, out, 0.1, 256, NULL, 0) == 0, "prepare_text on two files");
    CHECK(access(p, F_OK) != 0, "stale train_000009.bin removed");
    /* train: 900 + 270 = 1170 bytes -> 256*4 + 146; val: 100 + 30 = 130 -> one shard. */
    unsigned char want_train[1170], want_val[130];
    memcpy(want_train, t1, 900);
    memcpy(want_train + 900, t2, 270);
    memcpy(want_val, t1 + 900, 100);
    memcpy(want_val + 100, t2 + 270, 30);
    size_t expect_sizes[5] = {256, 256, 256, 256, 146};
    size_t pos = 0;
    int contents_ok = 1, sizes_ok = 1;
    for (int s = 0; s < 5; s++) {
        strata_shard sh;
        snprintf(p, sizeof p, "%s/train_%06d.bin", out, s);
        if (strata_shard_open(&sh, p) != 0) {
            printf("  %s\n", strata_error());
            sizes_ok = 0;
            continue;
        }
        if (sh.n_tokens != expect_sizes[s]) sizes_ok = 0;
        for (size_t i = 0; i < sh.n_tokens && pos + i < 1170; i++)
            if (sh.tokens[i] != want_train[pos + i]) contents_ok = 0;
        pos += sh.n_tokens;
        strata_shard_close(&sh);
    }
    snprintf(p, sizeof p, "%s/train_000005.bin", out);
    CHECK(sizes_ok && access(p, F_OK) != 0, "train: 5 shards of 256,256,256,256,146 tokens");
    CHECK(contents_ok && pos == 1170, "train tokens are the bytes of each file's first 90%%");
    strata_shard sh;
    snprintf(p, sizeof p, "%s/val_000000.bin", out);
    int val_ok = strata_shard_open(&sh, p) == 0 && sh.n_tokens == 130;
    for (size_t i = 0; val_ok && i < 130; i++)
        if (sh.tokens[i] != want_val[i]) val_ok = 0;
    if (sh.map) strata_shard_close(&sh);
    CHECK(val_ok, "val: one shard of 130 tokens, the last 10%% of each file");
    snprintf(p, sizeof p, "%s/val_000001.bin", out);
    CHECK(access(p, F_OK) != 0, "no second val shard");

    write_file(tpath(p, "empty.txt"), t1, 0);
    const char *bad[1] = {p};
    CHECK(strata_prepare_text(bad, 1, out, 0.1, 256, NULL, 0) != 0, "empty text file refused");
    snprintf(msg, sizeof msg, "prepare into %s (left as it was): %s: text file is empty (nothing to tokenise)", out, p);
    CHECK(error_is(msg), "empty-file message names the file");
    tpath(p, "missing.txt");
    CHECK(strata_prepare_text(bad, 1, out, 0.1, 256, NULL, 0) != 0, "missing text file refused");
    snprintf(msg, sizeof msg, "prepare into %s (left as it was): %s: cannot read: No such file or directory", out, p);
    CHECK(error_is(msg), "missing-file message names the file");
    /* the failed preparations left the earlier one as it was (tests/e2e_prepare.sh has more) */
    snprintf(p, sizeof p, "%s/train_000004.bin", out);
    CHECK(strata_shard_open(&sh, p) == 0 && sh.n_tokens == 146, "the shards of the earlier preparation are still there");
    if (sh.map) strata_shard_close(&sh);
    CHECK(strata_prepare_text(files, 2, out, 1.5, 256, NULL, 0) != 0 &&
              error_is("prepare: val_fraction 1.5 is outside [0, 1)"),
          "val_fraction 1.5 refused");
}

static void write_tokenizer(const char *path, uint32_t magic, uint32_t version, uint32_t vocab,
                            uint32_t eot, const char *const *pieces, int n_pieces) {
    uint32_t h[256] = {0};
    h[0] = magic;
    h[1] = version;
    h[2] = vocab;
    h[3] = eot;
    FILE *f = fopen(path, "wb");
    fwrite(h, sizeof h, 1, f);
    for (int i = 0; i < n_pieces; i++) {
        unsigned char len = (unsigned char)strlen(pieces[i]);
        fwrite(&len, 1, 1, f);
        fwrite(pieces[i], 1, len, f);
    }
    fclose(f);
}

static void test_tokenizer(void) {
    char p[1024], msg[2048];
    const char *pieces[3] = {"a", " bc", "<|endoftext|>"};
    write_tokenizer(tpath(p, "tok_v2.bin"), 20240328, 2, 3, 2, pieces, 3);
    strata_tokenizer tk;
    CHECK(strata_tokenizer_load(&tk, p) == 0, "load a v2 tokenizer of 3 pieces");
    CHECK(tk.vocab_size == 3 && tk.lens[0] == 1 && tk.lens[1] == 3 && tk.lens[2] == 13,
          "vocab size and piece lengths");
    CHECK(!strcmp(tk.pieces[1], " bc") && !strcmp(tk.pieces[2], "<|endoftext|>"), "piece bytes");
    strata_tokenizer_free(&tk);
    CHECK(tk.pieces == NULL && tk.vocab_size == 0, "free clears the tokenizer");

    write_tokenizer(tpath(p, "tok_v1.bin"), 20240328, 1, 2, 0, pieces, 2);
    CHECK(strata_tokenizer_load(&tk, p) == 0 && tk.vocab_size == 2, "load a v1 tokenizer");
    strata_tokenizer_free(&tk);

    write_tokenizer(tpath(p, "tok_magic.bin"), 7, 2, 3, 2, pieces, 3);
    CHECK(strata_tokenizer_load(&tk, p) != 0, "tokenizer with bad magic refused");
    snprintf(msg, sizeof msg, "%s: bad magic 7 (expected 20240328; not an llm.c tokenizer file)", p);
    CHECK(error_is(msg), "tokenizer bad-magic message");

    write_tokenizer(tpath(p, "tok_ver.bin"), 20240328, 3, 3, 2, pieces, 3);
    CHECK(strata_tokenizer_load(&tk, p) != 0, "tokenizer version 3 refused");
    snprintf(msg, sizeof msg, "%s: unsupported tokenizer version 3 (expected 1 or 2)", p);
    CHECK(error_is(msg), "tokenizer version message");

    write_tokenizer(tpath(p, "tok_trunc.bin"), 20240328, 2, 4, 2, pieces, 3);
    CHECK(strata_tokenizer_load(&tk, p) != 0, "tokenizer with a missing piece refused");
    snprintf(msg, sizeof msg, "%s: truncated at token 3 of 4", p);
    CHECK(error_is(msg), "tokenizer truncation message");
}

/* Shards that mark where packed documents start: the reader's positions count from 0 at
 * each start and at each row's first token, across shard boundaries; the learned bit alone
 * makes targets and counts; a shard without marks gives each row positions 0 .. T-1. */
static void test_document_positions(void) {
    char dir[1024], pat[1100];
    snprintf(dir, sizeof dir, "%s/docs", tmpdir);
    mkdir(dir, 0755);
    enum { T = 6, SEQ = 4, N = SEQ * T + 1 };
    int32_t ids[N];
    uint8_t mask[N];
    /* documents start at 0, 4 (mid-row), 6 (a row's first token), 9, 10 (one token
     * long between), 20 (in the third shard: shards of one sequence + 1); odd tokens learned */
    const int starts[] = {0, 4, 6, 9, 10, 20};
    for (int i = 0; i < N; i++) {
        ids[i] = 1000 + i;
        mask[i] = (uint8_t)(i % 2 ? STRATA_MASK_LEARNED : 0);
    }
    for (size_t k = 0; k < sizeof starts / sizeof *starts; k++) mask[starts[k]] |= STRATA_MASK_DOC_START;
    mask[9] = STRATA_MASK_DOC_START | STRATA_MASK_LEARNED; /* a start may be learned too (byte 3) */
    strata_shard_sink s;
    strata_shard_sink_init(&s, dir, "train", T + 1, 1, STRATA_SHARD_FLAG_MASK | STRATA_SHARD_FLAG_DOCS, T);
    CHECK(strata_shard_sink_push(&s, ids, mask, N) == 0 && strata_shard_sink_finish(&s) == 0,
          "4 sequences with document marks written");
    size_t want_learned = 0;
    for (int i = 0; i < N; i++) want_learned += mask[i] & STRATA_MASK_LEARNED;
    CHECK(s.learned == want_learned, "the sink counts the learned bit only: %zu (want %zu)", s.learned, want_learned);
    snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
    int wide, packed, docs = 0;
    CHECK(strata_shards_info(pat, &wide, &packed, &docs) == 0 && docs == 1 && strata_shards_mark_documents(pat) == 1,
          "strata_shards_info and strata_shards_mark_documents see the marks");
    strata_loader L;
    CHECK(strata_loader_open(&L, pat, T, 5000, 0, 0) == 0 && L.has_docs && !L.unmarked_packed && L.n_chunks == SEQ,
          "the loader opens them: has_docs");
    int32_t in[SEQ * T], tg[SEQ * T], pos[SEQ * T];
    CHECK(strata_loader_read(&L, 0, SEQ, in, tg, pos) == 0, "read with positions");
    const int32_t want_pos[SEQ * T] = {0, 1, 2, 3, 0, 1, /* row 0: documents at 0 and 4 */
                                       0, 1, 2, 0, 0, 1, /* row 1: 6, 9, 10 */
                                       0, 1, 2, 3, 4, 5, /* row 2: document 10 runs on, from 0 */
                                       0, 1, 0, 1, 2, 3};
    int ok = !memcmp(pos, want_pos, sizeof pos);
    for (int i = 0; i < SEQ * T; i++) ok &= in[i] == ids[i] && tg[i] == (mask[i + 1] & 1 ? ids[i + 1] : -1);
    CHECK(ok, "positions restart at each mark and each row; targets from the learned bit alone");
    uint64_t n = 0;
    size_t want_row = 0;
    for (int i = 1; i <= SEQ * T; i++) want_row += mask[i] & STRATA_MASK_LEARNED;
    CHECK(strata_loader_count_learned(&L, 0, SEQ, &n) == 0 && n == want_row, "count_learned: %llu (want %zu)",
          (unsigned long long)n, want_row);
    strata_loader_close(&L);

    /* the same tokens with the learned bit but no marks: positions 0 .. T-1 in every row */
    snprintf(pat, sizeof pat, "%s/plain_*.bin", dir);
    for (int i = 0; i < N; i++) mask[i] &= STRATA_MASK_LEARNED;
    strata_shard_sink_init(&s, dir, "plain", N, 1, STRATA_SHARD_FLAG_MASK, T);
    CHECK(strata_shard_sink_push(&s, ids, mask, N) == 0 && strata_shard_sink_finish(&s) == 0, "unmarked shard written");
    CHECK(strata_shards_mark_documents(pat) == 0 && strata_shards_mark_documents("") == 0 &&
              strata_shards_mark_documents("/nonexistent/x_*.bin") == 0,
          "no marks: 0 (also for no pattern and a pattern matching nothing)");
    CHECK(strata_loader_open(&L, pat, T, 5000, 0, 0) == 0 && !L.has_docs && L.unmarked_packed,
          "a packed, masked shard without marks: unmarked_packed");
    ok = strata_loader_read(&L, 0, SEQ, in, tg, pos) == 0;
    for (int i = 0; i < SEQ * T; i++) ok &= pos[i] == i % T;
    CHECK(ok, "without marks every row counts 0 .. T-1");
    /* a start bit in a shard that does not mark documents is a corrupt byte */
    strata_loader_close(&L);
    mask[7] |= STRATA_MASK_DOC_START;
    char p[1200], msg[2048];
    snprintf(p, sizeof p, "%s/plain_000000.bin", dir);
    CHECK(strata_shard_write32(p, (const uint32_t *)ids, mask, N, T, 0) == 0, "an unmarked shard with a stray bit 1");
    CHECK(strata_loader_open(&L, p, T, 5000, 0, 0) == 0 && strata_loader_read(&L, 1, 1, in, tg, pos) != 0,
          "its read is refused");
    snprintf(msg, sizeof msg, "%s: mask byte 3 at position 7 is not one this shard's flags define (0 or 1; a corrupt "
             "shard?)", p);
    CHECK(error_is(msg), "naming the shard, byte and position");
    strata_loader_close(&L);
}

int main(void) {
    strata_log_set_level(STRATA_LOG_WARN);
    /* mkdtemp template: the prefix, then six placeholder characters it replaces. */
    int len = snprintf(tmpdir, sizeof tmpdir, "/tmp/strata_test_data_");
    memset(tmpdir + len, 'X', 6);
    tmpdir[len + 6] = 0;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_shard_round_trip();
    test_bad_shards();
    test_shard32();
    test_loader_sequences();
    test_loader_masked();
    test_sink_overlap();
    test_document_positions();
    test_shuffle();
    test_batch_seq();
    test_prepare_text();
    test_tokenizer();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", tmpdir);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "PASSED", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
