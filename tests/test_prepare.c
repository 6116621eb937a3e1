/* tests/test_prepare.c: `strata prepare` on several threads gives the shards of one, with
 * a byte-level BPE (GPT-2's pattern, a few merges, ChatML's special tokens): --jsonl over
 * conversations many batches long (and its report and first bad line), --text over a text
 * cut into parts; --dedup gives the shards of the file without its repeats. The oracle is the one-thread run; what one thread makes is checked
 * against tokenizers and transformers end to end (tests/e2e_jsonl.sh, e2e_tokenizers.sh).
 * The ThreadSanitizer build runs this test too. */
#include "core/common.h"
#include "io/bpe.h"
#include "io/chat.h"
#include "io/data.h"
#include "io/files.h"
#include "io/jsonl.h"
#include "io/text.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tpath(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", tmpdir, name);
    return buf;
}

/* A tokenizer.json: the 256 byte characters (GPT-2's table), merges making "th", "the",
 * "Ġthe", "Ġt" and "Ġa", and ChatML's special tokens after them. */
static void write_tokenizer(const char *path) {
    strata_sbuf b = {0};
    strata_sbuf_puts(&b, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[");
    const char *special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++)
        strata_sbuf_printf(&b, "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                               "\"normalized\":false,\"special\":true}", i ? "," : "", 261 + i, special[i]);
    strata_sbuf_puts(&b, "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                         "\"trim_offsets\":true,\"use_regex\":true},\"post_processor\":{\"type\":\"ByteLevel\"},"
                         "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                         "\"unk_token\":null,\"vocab\":{");
    int extra = 0;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        uint32_t cp = printable ? (uint32_t)c : (uint32_t)(256 + extra++);
        char ch[8] = {0};
        strata_utf8_encode(ch, cp);
        if (c == '"' || c == '\\') strata_sbuf_printf(&b, "\"\\%c\":%d,", c, c);
        else strata_sbuf_printf(&b, "\"%s\":%d,", ch, c);
    }
    strata_sbuf_puts(&b, "\"\xc4\xa0t\":256,\"th\":257,\"the\":258,\"\xc4\xa0the\":259,\"\xc4\xa0" "a\":260,"
                         "\"<|endoftext|>\":261,\"<|im_start|>\":262,\"<|im_end|>\":263},"
                         "\"merges\":[\"t h\",\"th e\",\"\xc4\xa0 the\",\"\xc4\xa0 t\",\"\xc4\xa0 a\"]}}");
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(b.p, 1, b.len, f);
        fclose(f);
    }
    strata_sbuf_free(&b);
}

/* n conversations of a few words each (some of them not ASCII), a blank line now and
 * then; the lines listed in bad_at (1-based, 0 ends) are not JSON. */
static void write_jsonl(const char *path, int n, const int *bad_at) {
    static const char *words[] = {"the", "thee", "a", "at", "thither", "\xc3\xa9t\xc3\xa9", "\xe2\x80\x94", "to", "be",
                                  "\\\"quoted\\\"", "\\n", "Othello", "\xf0\x9f\x99\x82", "then", "other"};
    FILE *f = fopen(path, "w");
    if (!f) return;
    uint64_t r = 7;
    for (int line = 1, k = 0; line <= n; line++) {
        if (bad_at[k] == line) {
            fputs("{\"messages\": [oops]}\n", f);
            k++;
            continue;
        }
        if (line % 97 == 0) {
            fputs("  \n", f);
            continue;
        }
        fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"", f);
        r = strata_hash64(r);
        for (int w = 0; w < 1 + (int)(r % 5); w++) fprintf(f, "%s%s", w ? " " : "", words[(r >> (8 + 4 * w)) % 15]);
        fputs("\"}, {\"role\": \"assistant\", \"content\": \"", f);
        r = strata_hash64(r);
        /* now and then a long reply, longer than --seq-len: split across sequences */
        int len = r % 61 == 0 ? 200 : 1 + (int)(r % 23);
        for (int w = 0; w < len; w++) fprintf(f, "%s%s", w ? " " : "", words[strata_hash64(r + (uint64_t)w) % 15]);
        fputs("\"}]}\n", f);
    }
    fclose(f);
}

/* (not inlined: GCC 12 then takes the pointer it returns for one to its own local) */
__attribute__((noinline)) static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    *len = 0;
    if (strata_read_file_bounded(path, (size_t)1 << 30, &buf, len)) return NULL;
    return buf;
}

/* Whether dirs a and b hold the same bytes in each of the files named. */
static int same_files(const char *a, const char *b, const char *const *names, int n) {
    int same = 1;
    for (int i = 0; i < n; i++) {
        char pa[1300], pb[1300];
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        size_t la, lb;
        char *x = slurp(pa, &la), *y = slurp(pb, &lb);
        if (!x || !y || la != lb || memcmp(x, y, la)) {
            printf("  %s and %s differ (%zu and %zu bytes)\n", pa, pb, x ? la : 0, y ? lb : 0);
            same = 0;
        }
        free(x);
        free(y);
    }
    return same;
}

static int prepare(strata_jsonl_opts *o, const char *out, int threads, strata_jsonl_report *r) {
    char tok[600];
    strata_bpe *tk = strata_bpe_load(tpath(tok, sizeof tok, "tokenizer.json"));
    if (!tk) {
        printf("  %s\n", strata_error());
        return -1;
    }
    o->threads = threads;
    int rc = strata_prepare_jsonl(o, out, tk, r);
    strata_bpe_free(tk);
    return rc;
}

/* The same shards, report and tokenizer files from 1, 2, 3 and 5 threads, over a file of
 * 15000 lines: the batches (2048 lines a thread) end at different lines for each. */
static void test_threads_agree(void) {
    char jsonl[600], out[600], one[600];
    const int none[] = {0};
    write_jsonl(tpath(jsonl, sizeof jsonl, "chat.jsonl"), 15000, none);
    const char *files[] = {jsonl};
    strata_jsonl_opts o = {.files = files, .n_files = 1, .kind = STRATA_JSONL_MESSAGES, .messages_field = "messages",
                           .chat_format = STRATA_CHAT_CHATML, .seq_len = 128, .val_fraction = 0.1,
                           .max_shard_tokens = 100000};
    strata_jsonl_report r1, r;
    int rc = prepare(&o, tpath(one, sizeof one, "one"), 1, &r1);
    CHECK(rc == 0, "one thread prepares (%s)", rc ? strata_error() : "");
    CHECK(r1.threads == 1 && r1.examples == 15000 - 15000 / 97 && r1.split > 0 && r1.train_shards > 1,
          "one thread: %zu examples (%zu split), %d train shards", r1.examples, r1.split, r1.train_shards);
    /* every shard, and the tokenizer files */
    char shard[64][32];
    const char *names[66] = {"tokenizer.json", "tokenizer_config.json"};
    int n_names = 2;
    for (int s = 0; s < r1.train_shards + r1.val_shards && s < 64; s++, n_names++) {
        int val = s >= r1.train_shards;
        snprintf(shard[s], sizeof shard[s], "%s_%06d.bin", val ? "val" : "train", val ? s - r1.train_shards : s);
        names[n_names] = shard[s];
    }
    int threads[] = {2, 3, 5};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", threads[i]);
        rc = prepare(&o, tpath(out, sizeof out, name), threads[i], &r);
        CHECK(rc == 0 && r.threads == threads[i], "%d threads prepare (%s)", threads[i], rc ? strata_error() : "");
        CHECK(same_files(one, out, names, n_names), "%d threads: the %d shards and tokenizer files of one thread", threads[i],
              n_names - 2);
        CHECK(r.examples == r1.examples && r.split == r1.split && r.train_tokens == r1.train_tokens &&
                  r.val_learned == r1.val_learned && r.padding == r1.padding && r.len_median == r1.len_median &&
                  r.len_p99 == r1.len_p99 && r.len_max == r1.len_max && r.train_shards == r1.train_shards,
              "%d threads: the report of one thread", threads[i]);
    }
}

/* Bad lines in the second batch and after: each thread count names the first and stops
 * (nothing of it replaces the directory), or skips both and counts them. */
static void test_bad_lines(void) {
    char jsonl[600], out[600], want[700];
    const int bad_at[] = {5000, 9000, 0};
    write_jsonl(tpath(jsonl, sizeof jsonl, "bad.jsonl"), 10000, bad_at);
    snprintf(want, sizeof want, "%s:5000: ", jsonl);
    const char *files[] = {jsonl};
    strata_jsonl_opts o = {.files = files, .n_files = 1, .kind = STRATA_JSONL_MESSAGES, .messages_field = "messages",
                           .chat_format = STRATA_CHAT_CHATML, .seq_len = 128, .val_fraction = 0.1,
                           .max_shard_tokens = 100000};
    strata_jsonl_report r;
    char first[2048] = "";
    for (int t = 1; t <= 4; t += 3) {
        int rc = prepare(&o, tpath(out, sizeof out, "bad"), t, &r);
        CHECK(rc == STRATA_JSONL_BAD_LINE && strstr(strata_error(), want) && strstr(strata_error(), "--skip-bad"),
              "%d thread(s): the first bad line is named: %s", t, strata_error());
        if (t == 1) snprintf(first, sizeof first, "%s", strata_error());
        else CHECK(!strcmp(first, strata_error()), "%d threads: the message of one thread", t);
        CHECK(access(out, F_OK) != 0, "%d thread(s): no directory is left", t);
    }
    o.skip_bad = 1;
    char one[600];
    const char *names[] = {"train_000000.bin", "val_000000.bin"};
    CHECK(prepare(&o, tpath(one, sizeof one, "skip1"), 1, &r) == 0 && r.bad == 2, "one thread skips 2 lines");
    CHECK(prepare(&o, tpath(out, sizeof out, "skip4"), 4, &r) == 0 && r.bad == 2 && same_files(one, out, names, 2),
          "4 threads skip the same 2 and write the same shards");
}

/* A text of 400 KB (lines of words, blank lines, now and then one that starts with a
 * space or follows one ending in a space, so some newlines allow no cut) on 1 and 3
 * threads: the same shards, and the tokenizer allows the cuts. */
static void test_text_threads(void) {
    char txt[600], one[600], three[600];
    FILE *f = fopen(tpath(txt, sizeof txt, "corpus.txt"), "w");
    if (!f) return;
    static const char *words[] = {"the", "thee", "a", "at", "Othello", "\xc3\xa9t\xc3\xa9", "to", "be", "42", "then"};
    uint64_t r = 11;
    for (long bytes = 0; bytes < 400000;) {
        r = strata_hash64(r);
        int n = (int)(r % 12);
        bytes += fprintf(f, "%s", r % 7 == 0 ? " " : "");
        for (int w = 0; w < n; w++) bytes += fprintf(f, "%s%s", w ? " " : "", words[(r >> (4 * w)) % 10]);
        bytes += fprintf(f, "%s\n", r % 5 == 0 ? " " : r % 3 == 0 ? "." : "");
    }
    fclose(f);
    char tok[600];
    strata_bpe *tk = strata_bpe_load(tpath(tok, sizeof tok, "tokenizer.json"));
    CHECK(tk && strata_bpe_line_cuts(tk), "the tokenizer (GPT-2's pattern) allows cuts after a newline");
    const char *files[] = {txt};
    int rc1 = tk ? strata_prepare_text(files, 1, tpath(one, sizeof one, "text1"), 0.1, 50000, tk, 1) : -1;
    /* the debug log (stdout) says in how many parts the train side was encoded */
    char log[600];
    fflush(stdout);
    int saved = dup(1), fd = open(tpath(log, sizeof log, "log.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1);
    strata_log_set_level(STRATA_LOG_DEBUG);
    int rc3 = tk ? strata_prepare_text(files, 1, tpath(three, sizeof three, "text3"), 0.1, 50000, tk, 3) : -1;
    strata_log_set_level(STRATA_LOG_INFO);
    fflush(stdout);
    if (fd >= 0) dup2(saved, 1), close(fd);
    close(saved);
    size_t len;
    char *said = slurp(log, &len);
    const char *at = said ? strstr(said, "bytes encoded in ") : NULL;
    int parts = at ? atoi(at + strlen("bytes encoded in ")) : 0;
    free(said);
    CHECK(parts > 2, "--text on 3 threads: the train side in %d parts", parts);
    CHECK(rc1 == 0 && rc3 == 0, "--text on 1 and on 3 threads (%s)", rc1 || rc3 ? strata_error() : "");
    const char *names[] = {"train_000000.bin", "train_000001.bin", "val_000000.bin", "tokenizer.json"};
    CHECK(same_files(one, three, names, 4), "--text: 3 threads write the shards of one");
    strata_bpe_free(tk);
}

/* --dedup: a file with repeats (lines copied later on, and one with the same conversation
 * in other JSON spacing) gives the shards of the file with each repeat removed by hand,
 * on 1 and 3 threads; its report counts them; with a validation split, each example is kept
 * once, in train or in val. Without --dedup they are counted and kept. */
static void test_dedup(void) {
    char chat[600], dup[600], uniq[600], out[600], ref[600];
    const int none[] = {0};
    write_jsonl(tpath(chat, sizeof chat, "dedup-src.jsonl"), 3000, none);
    size_t len = 0;
    char *buf = slurp(chat, &len);
    if (!buf) { CHECK(0, "read %s", chat); return; }
    /* the lines, each 5th copied again at the end, and one more in other spacing */
    char *lines[4000];
    int n = 0;
    for (char *p = strtok(buf, "\n"); p && n < 3000; p = strtok(NULL, "\n"))
        if (p[strspn(p, " ")]) lines[n++] = p;
    int all = n;
    for (int i = 0; i < n && all < 3600; i += 5) lines[all++] = lines[i];
    char respaced[4096];
    snprintf(respaced, sizeof respaced, "%s", lines[1]);
    for (char *q = strstr(respaced, "\": "); q; q = strstr(q, "\": ")) memmove(q + 2, q + 3, strlen(q + 3) + 1);
    lines[all++] = respaced; /* {"messages":[{"role":"user",...: the same conversation */
    FILE *fd = fopen(tpath(dup, sizeof dup, "dedup.jsonl"), "w"), *fu = fopen(tpath(uniq, sizeof uniq, "uniq.jsonl"), "w");
    size_t repeats = 0;
    for (int i = 0; i < all && fd && fu; i++) {
        fprintf(fd, "%s\n", lines[i]);
        int again = i == all - 1; /* the respaced one: a repeat of line 1 */
        for (int k = 0; k < i && !again; k++) again = !strcmp(lines[k], lines[i]);
        if (again) repeats++;
        else fprintf(fu, "%s\n", lines[i]);
    }
    if (fd) fclose(fd);
    if (fu) fclose(fu);
    free(buf);
    const char *dfiles[] = {dup}, *ufiles[] = {uniq};
    strata_jsonl_opts o = {.files = ufiles, .n_files = 1, .kind = STRATA_JSONL_MESSAGES, .messages_field = "messages",
                           .chat_format = STRATA_CHAT_CHATML, .seq_len = 128, .val_fraction = 0,
                           .max_shard_tokens = 1000000};
    strata_jsonl_report ru, r;
    int rc = prepare(&o, tpath(ref, sizeof ref, "dedup-ref"), 1, &ru);
    CHECK(rc == 0 && ru.train_shards == 1 && ru.val_shards == 0, "the file without repeats prepares (%s)",
          rc ? strata_error() : "");
    const char *names[] = {"train_000000.bin"};
    o.files = dfiles;
    o.dedup = 1;
    for (int threads = 1; threads <= 3; threads += 2) {
        rc = prepare(&o, tpath(out, sizeof out, threads == 1 ? "dedup-1" : "dedup-3"), threads, &r);
        CHECK(rc == 0 && r.duplicates == repeats && r.examples == ru.examples && repeats > 500 &&
                  same_files(ref, out, names, 1),
              "--dedup on %d thread%s: %zu repeats of %d lines dropped (%zu counted), the shards of the file without them",
              threads, threads == 1 ? "" : "s", repeats, all, r.duplicates);
    }
    o.val_fraction = 0.2;
    rc = prepare(&o, tpath(out, sizeof out, "dedup-val"), 2, &r);
    CHECK(rc == 0 && r.duplicates == repeats && r.examples == ru.examples && r.val_seqs > 0,
          "--dedup with a validation split: each of the %zu examples once (%zu), train or val", ru.examples, r.examples);
    o.dedup = 0;
    rc = prepare(&o, tpath(out, sizeof out, "dedup-kept"), 2, &r);
    CHECK(rc == 0 && r.duplicates == repeats && r.examples == ru.examples + repeats,
          "without --dedup the %zu repeats are counted (%zu) and kept (%zu examples)", repeats, r.duplicates, r.examples);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/strata-test-prepare-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char tok[600];
    write_tokenizer(tpath(tok, sizeof tok, "tokenizer.json"));
    test_threads_agree();
    test_bad_lines();
    test_text_threads();
    test_dedup();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) printf("could not remove %s\n", tmpdir);
    return check_report();
}
