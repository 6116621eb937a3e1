/* tests/test_tensorboard.c: io/tensorboard.c against bytes TensorBoard's own Python made
 * (tensorboard 2.21: event_pb2, text_pb, masked_crc32c), the reader on torn and corrupt
 * records, and the writer: a fresh run, a resume cut back to its step, a torn last record,
 * several files, a write that fails (the file cut back to its last whole record) and a
 * cut-back that cannot be made (the original untouched). */
#include "core/common.h"
#include "io/tensorboard.h"
#include "tests/check.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int hex_is(const strata_sbuf *b, const char *hex) {
    char got[2048] = "";
    for (size_t i = 0; i < b->len && 2 * i + 2 < sizeof got; i++) snprintf(got + 2 * i, 3, "%02x", (unsigned char)b->p[i]);
    if (!strcmp(got, hex)) return 1;
    printf("  got:      %s\n  expected: %s\n", got, hex);
    return 0;
}

/* What TensorBoard's Python wrote for the same messages (see the file's comment). */
static void test_known_bytes(void) {
    CHECK(strata_tb_masked_crc("123456789", 9) == 0xc78ab0e5u, "masked CRC-32C of \"123456789\" is 0xc78ab0e5");
    CHECK(strata_tb_masked_crc("", 0) == 0xa282ead8u, "masked CRC-32C of nothing is the mask's delta, 0xa282ead8");

    strata_sbuf b = {0};
    strata_tb_event_file_version(&b, 1700000000.5);
    CHECK(hex_is(&b, "0900002040fc54d9411a0d627261696e2e4576656e743a32"), "the file_version Event");
    b.len = 0;
    strata_tb_scalar v[2] = {{"loss/train", 2.5f}, {"optim/lr", 3e-4f}};
    strata_tb_event_scalars(&b, 1700000001.25, 300, v, 2);
    CHECK(hex_is(&b, "0900005040fc54d94110ac022a240a110a0a6c6f73732f747261696e15000020400a0f0a086f7074696d2f6c721552499d39"),
          "an Event of two scalars at step 300");
    b.len = 0;
    strata_tb_event_text(&b, 1700000002.0, 0, "memory_plan", "    plan\n");
    const char *text_event = "0900008040fc54d9412a2a0a280a0b6d656d6f72795f706c616e420f08071200420920202020706c616e0a4a080a06"
                             "0a0474657874";
    CHECK(hex_is(&b, text_event), "a text Event at step 0, as text_pb makes it (no step field at 0)");
    strata_sbuf rec = {0};
    strata_tb_frame(&rec, b.p, b.len);
    char framed[512];
    snprintf(framed, sizeof framed, "3500000000000000d6c55de6%s83c4da98", text_event);
    CHECK(hex_is(&rec, framed), "its record: length, masked CRC of the length, data, masked CRC of the data");

    int64_t step = 0;
    int meta = 0;
    CHECK(strata_tb_event_info((const unsigned char *)b.p, b.len, &step, &meta) == 0 && step == 0 && meta == 1,
          "the text Event decodes to step 0, with plugin metadata");
    int64_t steps[] = {1, 300, -1, (int64_t)1 << 40};
    for (int i = 0; i < 4; i++) {
        b.len = 0;
        strata_tb_event_scalars(&b, 1.0, steps[i], v, 2);
        CHECK(strata_tb_event_info((const unsigned char *)b.p, b.len, &step, &meta) == 0 && step == steps[i] && meta == 0,
              "scalars at step %lld decode to that step, without metadata", (long long)steps[i]);
    }
    CHECK(strata_tb_event_info((const unsigned char *)"\x12\x05" "ab", 4, &step, &meta) != 0,
          "a length past the end is not an Event");
    strata_sbuf_free(&b);
    strata_sbuf_free(&rec);
}

/* Writes n framed scalar records (steps 1..n) to path; returns the file's length. */
static long write_records(const char *path, int n) {
    FILE *f = fopen(path, "wb");
    strata_sbuf ev = {0}, rec = {0};
    for (int s = 1; s <= n; s++) {
        strata_tb_scalar v = {"loss/train", (float)s};
        ev.len = rec.len = 0;
        strata_tb_event_scalars(&ev, 1.0, s, &v, 1);
        strata_tb_frame(&rec, ev.p, ev.len);
        fwrite(rec.p, 1, rec.len, f);
    }
    long len = ftell(f);
    fclose(f);
    strata_sbuf_free(&ev);
    strata_sbuf_free(&rec);
    return len;
}

/* The steps of path's whole records into steps (file_version is step 0); -1 if a record is torn. */
static int read_steps(const char *path, int64_t *steps, int max, int *torn) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    strata_sbuf data = {0};
    const char *why;
    int n = 0, r;
    while ((r = strata_tb_read_record(f, &data, &why)) == 1 && n < max) {
        int meta;
        if (strata_tb_event_info((const unsigned char *)data.p, data.len, &steps[n], &meta)) steps[n] = -999;
        n++;
    }
    *torn = r < 0;
    fclose(f);
    strata_sbuf_free(&data);
    return n;
}

static void test_reader(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/records", tmpdir);
    long len = write_records(path, 3);
    int64_t steps[8];
    int torn;
    CHECK(read_steps(path, steps, 8, &torn) == 3 && !torn && steps[2] == 3, "three whole records read back");
    /* every cut of the last record: the first two still read, then a torn record, never more */
    long last = len / 3;
    int all = 1;
    for (long cut = len - last + 1; cut < len; cut++) {
        if (truncate(path, cut) != 0) all = 0;
        if (read_steps(path, steps, 8, &torn) != 2 || !torn) all = 0;
        write_records(path, 3);
    }
    CHECK(all, "each of the %ld cuts inside the last record leaves two records and a torn end", last - 1);
    /* a flipped byte in the data, or in the header */
    FILE *f = fopen(path, "r+b");
    fseek(f, last + 14, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    FILE *g = fopen(path, "rb");
    strata_sbuf data = {0};
    const char *why = "";
    CHECK(strata_tb_read_record(g, &data, &why) == 1 && strata_tb_read_record(g, &data, &why) == -1 &&
              !strcmp(why, "data whose checksum does not match"),
          "a flipped data byte: the record is refused (%s)", why);
    fclose(g);
    write_records(path, 3);
    f = fopen(path, "r+b");
    fputc(0x7f, f); /* the first length's low byte */
    fclose(f);
    g = fopen(path, "rb");
    CHECK(strata_tb_read_record(g, &data, &why) == -1 && !strcmp(why, "a header whose checksum does not match"),
          "a flipped length byte: the header is refused (%s)", why);
    fclose(g);
    strata_sbuf_free(&data);
}

/* The events files of dir, sorted; returns how many. */
static int events_files(const char *dir, char names[][256], int max) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20) && n < max) snprintf(names[n++], 256, "%s", e->d_name);
    if (d) closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[256];
            memcpy(t, names[j], 256), memcpy(names[j], names[j - 1], 256), memcpy(names[j - 1], t, 256);
        }
    return n;
}

static int steps_are(const int64_t *got, int n, const int64_t *want, int m) {
    if (n != m) {
        printf("  got %d records, expected %d\n", n, m);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            printf("  record %d: step %lld, expected %lld\n", i, (long long)got[i], (long long)want[i]);
            return 0;
        }
    return 1;
}

static int write_steps(strata_tb_writer *w, int from, int to) {
    for (int s = from; s <= to; s++) {
        strata_tb_scalar v[2] = {{"loss/train", 1.0f / (float)s}, {"optim/lr", 1e-3f}};
        if (strata_tb_write_scalars(w, s, v, 2)) return -1;
    }
    return 0;
}

static void test_writer(void) {
    char dir[512], path[1200], names[8][256];
    int64_t steps[64];
    int torn;
    snprintf(dir, sizeof dir, "%s/run/tb", tmpdir); /* made by open, parents too */
    strata_tb_writer *w = NULL;
    MUST(strata_tb_open(&w, dir, -1));
    if (!w) return;
    MUST(strata_tb_write_text(w, 0, "memory_plan", "plan"));
    MUST(write_steps(w, 1, 10));
    MUST(strata_tb_close(w));
    CHECK(events_files(dir, names, 8) == 1, "a fresh run writes one events file");
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    int n = read_steps(path, steps, 64, &torn);
    int64_t fresh[] = {0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    CHECK(steps_are(steps, n, fresh, 12) && !torn, "file_version, the plan at step 0, steps 1-10");

    /* resume at 6, with a record torn by a kill after step 10 */
    FILE *f = fopen(path, "ab");
    fwrite("\x30\0\0\0\0\0\0\0\1\2", 1, 10, f);
    fclose(f);
    MUST(strata_tb_open(&w, dir, 6));
    if (!w) return;
    MUST(strata_tb_write_text(w, 6, "memory_plan", "plan again"));
    MUST(write_steps(w, 7, 8));
    MUST(strata_tb_close(w));
    CHECK(events_files(dir, names, 8) == 1, "a resume appends to the run's file");
    n = read_steps(path, steps, 64, &torn);
    int64_t resumed[] = {0, 0, 1, 2, 3, 4, 5, 6, 6, 7, 8};
    CHECK(steps_are(steps, n, resumed, 11) && !torn,
          "after a resume at 6: steps to 6 kept, 7-10 and the torn record dropped, the plan at 6, then 7-8");
    /* resuming at 6 again: the plan written at 6 goes (it is written again), step 6's scalars stay */
    MUST(strata_tb_open(&w, dir, 6));
    MUST(strata_tb_write_text(w, 6, "memory_plan", "plan a third time"));
    MUST(strata_tb_close(w));
    n = read_steps(path, steps, 64, &torn);
    int64_t again[] = {0, 0, 1, 2, 3, 4, 5, 6, 6};
    CHECK(steps_are(steps, n, again, 9), "a second resume at 6: one plan at 6, no step twice");

    /* two files, as a run moved between hosts would leave: both cut back, the newest appended to */
    char older[1100];
    snprintf(older, sizeof older, "%s/events.out.tfevents.0000000001.other", dir);
    write_records(older, 9);
    MUST(strata_tb_open(&w, dir, 4));
    MUST(write_steps(w, 5, 5));
    MUST(strata_tb_close(w));
    n = read_steps(older, steps, 64, &torn);
    int64_t old4[] = {1, 2, 3, 4};
    CHECK(steps_are(steps, n, old4, 4), "the older file keeps steps 1-4 only");
    n = read_steps(path, steps, 64, &torn);
    int64_t new4[] = {0, 0, 1, 2, 3, 4, 5};
    CHECK(steps_are(steps, n, new4, 7), "the newer file keeps 0-4 and gets step 5");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s/.strata-events.tmp", dir);
    CHECK(access(tmp, F_OK) != 0, "no temporary file left");

    /* a cut-back that cannot be made (its temporary name is a directory): the files stand */
    struct stat before, after;
    stat(older, &before);
    mkdir(tmp, 0755);
    snprintf(path, sizeof path, "%s/x", tmp);
    f = fopen(path, "w"); /* not empty, so the open's clean-up cannot remove it */
    fclose(f);
    CHECK(strata_tb_open(&w, dir, 2) != 0 && w == NULL && strstr(strata_error(), ".strata-events.tmp: cannot create"),
          "a cut-back that cannot write its copy fails naming it: %s", strata_error());
    stat(older, &after);
    CHECK(before.st_size == after.st_size && before.st_ino == after.st_ino, "and the file it would cut is untouched");
    remove(path);
    rmdir(tmp);

    /* a fresh run in that directory removes both files */
    MUST(strata_tb_open(&w, dir, -1));
    MUST(strata_tb_close(w));
    CHECK(events_files(dir, names, 8) == 1 && strcmp(names[0], "events.out.tfevents.0000000001.other") > 0,
          "a fresh run leaves only its own file");
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    n = read_steps(path, steps, 64, &torn);
    CHECK(n == 1 && steps[0] == 0, "holding its file_version record alone");
}

/* A write that fails (the file-size limit: EFBIG from the real write) leaves the file at
 * its last whole record, and the error names it. */
static void test_write_failure(void) {
    char dir[512], names[4][256], path[1024];
    snprintf(dir, sizeof dir, "%s/full", tmpdir);
    strata_tb_writer *w = NULL;
    MUST(strata_tb_open(&w, dir, -1));
    if (!w) return;
    MUST(write_steps(w, 1, 3));
    events_files(dir, names, 4);
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    struct stat st;
    stat(path, &st);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)st.st_size + 20; /* part of the next record fits */
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    int rc = write_steps(w, 4, 4);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    char want[1200];
    snprintf(want, sizeof want, "%s: write failed: File too large", path);
    CHECK(rc != 0 && strstr(strata_error(), want), "a failed write names the file and the reason: %s", strata_error());
    struct stat after;
    stat(path, &after);
    CHECK(after.st_size == st.st_size, "the file is cut back to its last whole record (%lld bytes, was %lld)",
          (long long)after.st_size, (long long)st.st_size);
    MUST(write_steps(w, 4, 5)); /* room again: it goes on from there */
    MUST(strata_tb_close(w));
    int64_t steps[16];
    int torn;
    int n = read_steps(path, steps, 16, &torn);
    int64_t want_steps[] = {0, 1, 2, 3, 4, 5};
    CHECK(steps_are(steps, n, want_steps, 6) && !torn, "every record whole afterwards: 0-5");
}

int main(void) {
    strata_log_set_level(STRATA_LOG_ERROR); /* the writer's notes are expected */
    int len = snprintf(tmpdir, sizeof tmpdir, "/tmp/strata_test_tb_");
    memset(tmpdir + len, 'X', 6);
    tmpdir[len + 6] = 0;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_known_bytes();
    test_reader();
    test_writer();
    test_write_failure();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", tmpdir);
    return check_report();
}
