/* tests/test_safetensors.c: the safetensors header parser against valid and invalid files
 * (every refusal naming the problem), its bounds (every prefix and thousands of mutated
 * headers parsed from exact-length heap copies, for AddressSanitizer), and range reads with
 * F32, F16, BF16 and F64 converted to fp32 exactly. */
#include "core/common.h"
#include "io/safetensors.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A file image: 8-byte length, header, `data_bytes` bytes of data (0, 1, 2, ...). */
static unsigned char *image(const char *header, size_t data_bytes, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_bytes;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_bytes; i++) b[8 + h + i] = (unsigned char)i;
    return b;
}

static int parse_image(strata_safetensors *st, const char *header, size_t data_bytes) {
    size_t len;
    unsigned char *b = image(header, data_bytes, &len);
    int rc = strata_safetensors_parse(st, b, len, len, "m.safetensors");
    free(b);
    return rc;
}

static int refused(const char *header, size_t data_bytes, const char *what) {
    strata_safetensors st;
    if (parse_image(&st, header, data_bytes) == 0) {
        strata_safetensors_close(&st);
        printf("    accepted: %s\n", header);
        return 0;
    }
    int ok = strstr(strata_error(), "m.safetensors") && strstr(strata_error(), what);
    if (!ok) printf("    message: %s\n", strata_error());
    return ok;
}

static const char *valid =
    "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[24,30]},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},\"e\":{\"dtype\":\"I8\",\"shape\":[0],"
    "\"data_offsets\":[30,30]},\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[30,32]}}";

static void test_parse(void) {
    strata_safetensors st;
    CHECK(parse_image(&st, valid, 32) == 0, "a valid header parses (%s)", strata_error());
    CHECK(st.n_tensors == 4 && !strcmp(st.tensors[0].name, "b") && !strcmp(st.tensors[1].name, "a"),
          "4 tensors, in header order");
    const strata_st_tensor *a = strata_safetensors_find(&st, "a");
    CHECK(a && a->dtype == STRATA_ST_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 && a->numel == 6 &&
              a->begin == 0 && a->end == 24, "tensor a: F32 [2, 3] at [0, 24)");
    const strata_st_tensor *s = strata_safetensors_find(&st, "s");
    CHECK(s && s->ndim == 0 && s->numel == 1, "a scalar has one element");
    CHECK(strata_safetensors_find(&st, "e")->numel == 0, "an empty tensor");
    CHECK(st.data_offset == 8 + strlen(valid), "data starts after the header");
    CHECK(strata_safetensors_meta(&st, "format") && !strcmp(strata_safetensors_meta(&st, "format"), "pt") &&
              !strata_safetensors_meta(&st, "x"), "metadata");
    strata_safetensors_close(&st);
    CHECK(parse_image(&st, "{}", 0) == 0 && st.n_tensors == 0, "no tensors, no data: valid");
    strata_safetensors_close(&st);
    CHECK(parse_image(&st, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}        ", 4) == 0,
          "trailing spaces pad the header");
    strata_safetensors_close(&st);

#define T(dtype, shape, offs) "{\"t\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offs "}}"
    CHECK(refused(T("F32", "[2]", "[0,8]"), 12, "the tensors end at data offset 8"), "bytes after the last tensor");
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "4 bytes at data offset 0"),
          "a hole before the first tensor");
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
                  "\"data_offsets\":[4,12]}}", 12, "overlap"), "overlapping tensors");
    CHECK(refused(T("F32", "[3]", "[0,8]"), 8, "span 8 bytes, but 3 F32 elements take 12"), "size not numel x dtype");
    CHECK(refused(T("F32", "[2]", "[0,8]"), 4, "outside the 4 bytes of data"), "offsets past the file's end");
    CHECK(refused(T("F32", "[2]", "[8,0]"), 8, "outside"), "begin after end");
    CHECK(refused(T("F99", "[2]", "[0,8]"), 8, "unknown dtype \"F99\""), "an unknown dtype");
    CHECK(refused(T("F32", "[-2]", "[0,8]"), 8, "shape[0] must be a non-negative integer"), "a negative dimension");
    CHECK(refused(T("F32", "[2.5]", "[0,8]"), 8, "shape[0]"), "a fractional dimension");
    CHECK(refused(T("F32", "[4294967296,4294967296]", "[0,8]"), 8, "overflows"), "a shape whose element count overflows");
    CHECK(refused(T("F64", "[4611686018427387904]", "[0,8]"), 8, "elements take"), "numel x dtype overflows");
    CHECK(refused(T("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, "9 dimensions"), "too many dimensions");
    CHECK(refused(T("F32", "[2]", "[0]"), 8, "data_offsets"), "one offset");
    CHECK(refused(T("F32", "2", "[0,8]"), 8, "\"shape\" must be an array"), "shape not an array");
    CHECK(refused("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown field \"x\""),
          "an unknown field");
    CHECK(refused("{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "\"dtype\" must be a string"), "no dtype");
    CHECK(refused("{\"t\":[1]}", 0, "expected an object"), "a tensor that is not an object");
    CHECK(refused("{\"__metadata__\":{\"k\":1}}", 0, "must be a string"), "metadata that is not a string");
    CHECK(refused("{\"t\\u0000x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "NUL"), "NUL in a name");
    CHECK(refused("{\"t\":{},\"t\":{}}", 0, "duplicate key"), "a name given twice");
    CHECK(refused("[1]", 0, "does not start with '{'"), "a header that is not an object");
    CHECK(refused("{\"t\":", 0, "byte 5"), "truncated JSON, with the byte offset");
#undef T
    unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    CHECK(strata_safetensors_parse(&st, b, 10, 10, "m.safetensors") != 0 && strstr(strata_error(), "more than the"),
          "a header length beyond 100 MB");
    b[0] = 100, memset(b + 1, 0, 7);
    CHECK(strata_safetensors_parse(&st, b, 10, 10, "m.safetensors") != 0 && strstr(strata_error(), "runs past the end"),
          "a header length past the end");
    CHECK(strata_safetensors_parse(&st, b, 5, 5, "m.safetensors") != 0 && strstr(strata_error(), "shorter than the 8-byte"),
          "fewer than 8 bytes");
}

/* Every prefix of a valid file, and every byte of its header changed to a set of values:
 * each parsed or refused cleanly, reading nothing outside the buffer. */
static void test_bounds(void) {
    size_t len;
    unsigned char *full = image(valid, 32, &len);
    int bad = 0, parsed = 0, refusals = 0;
    check_quiet = 1;
    for (size_t k = 0; k < len; k++) {
        unsigned char *p = malloc(k ? k : 1);
        memcpy(p, full, k);
        strata_safetensors st;
        if (strata_safetensors_parse(&st, p, k, k, "m.safetensors") == 0) {
            strata_safetensors_close(&st);
            bad++;
        }
        free(p);
    }
    CHECK(bad == 0, "all %zu proper prefixes of a valid file are refused", len);
    static const unsigned char subst[] = {0, 1, '"', '\\', '{', '}', '[', ']', ',', ':', '0', '9', '-', 'e', 0x80, 0xff};
    for (size_t k = 0; k < 8 + strlen(valid); k++) {
        for (size_t j = 0; j < sizeof subst; j++) {
            unsigned char *p = malloc(len);
            memcpy(p, full, len);
            p[k] = subst[j];
            strata_safetensors st;
            if (strata_safetensors_parse(&st, p, len, len, "m.safetensors") == 0) {
                parsed++;
                strata_safetensors_close(&st);
            } else {
                refusals++;
                if (!strstr(strata_error(), "m.safetensors")) bad++;
            }
            free(p);
        }
    }
    check_quiet = 0;
    CHECK(bad == 0 && refusals > 0, "%d mutated files: %d parsed, %d refused, each refusal names the file",
          parsed + refusals, parsed, refusals);
    free(full);
}

static uint16_t f32_to_f16(float f) { /* exact for the values used below */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e <= 0) return (uint16_t)(sign | ((man | 0x800000) >> (14 - e)));
    return (uint16_t)(sign | (uint32_t)e << 10 | man >> 13);
}

static void test_read(void) {
    char path[] = "/tmp/strata-test-st-XXXXXX";
    int fd = mkstemp(path);
    const float vals[5] = {1.0f, -2.5f, 0.0009765625f, 65504.0f, 5.9604644775390625e-08f /* f16 subnormal */};
    char header[600];
    snprintf(header, sizeof header,
             "{\"f32\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[0,20]},"
             "\"f16\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[20,30]},"
             "\"bf16\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[30,40]},"
             "\"f64\":{\"dtype\":\"F64\",\"shape\":[5],\"data_offsets\":[40,80]},"
             "\"i8\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[80,84]}}");
    unsigned char data[84];
    memcpy(data, vals, 20);
    for (int i = 0; i < 5; i++) {
        uint16_t h = f32_to_f16(vals[i]), b = strata_f32_to_bf16(vals[i]);
        double d = vals[i];
        memcpy(data + 20 + 2 * i, &h, 2);
        memcpy(data + 30 + 2 * i, &b, 2);
        memcpy(data + 40 + 8 * i, &d, 8);
    }
    memset(data + 80, 7, 4);
    uint64_t n = strlen(header);
    if (write(fd, &n, 8) != 8 || write(fd, header, n) != (ssize_t)n || write(fd, data, 84) != 84) perror("write");
    close(fd);
    strata_safetensors st;
    CHECK(strata_safetensors_open(&st, path) == 0, "open a file with F32, F16, BF16, F64 and I8 tensors (%s)", strata_error());
    float out[5];
    const char *names[4] = {"f32", "f16", "bf16", "f64"};
    for (int k = 0; k < 4; k++) {
        memset(out, 0xff, sizeof out);
        int rc = strata_safetensors_read_f32(&st, strata_safetensors_find(&st, names[k]), 0, 5, out);
        int same = rc == 0;
        for (int i = 0; i < 5 && same; i++) {
            float want = k == 2 ? strata_bf16_to_f32(strata_f32_to_bf16(vals[i])) : vals[i];
            same = out[i] == want;
        }
        CHECK(same, "%s reads back as fp32 exactly (f16 subnormal and 65504 included)", names[k]);
    }
    CHECK(strata_safetensors_read_f32(&st, strata_safetensors_find(&st, "f16"), 2, 4, out) == 0 && out[0] == vals[2] &&
              out[1] == vals[3], "a range [2, 4) of an F16 tensor");
    CHECK(strata_safetensors_read_f32(&st, strata_safetensors_find(&st, "i8"), 0, 4, out) != 0 &&
              strstr(strata_error(), "\"i8\" has dtype I8"), "an I8 tensor is refused by name and dtype");
    CHECK(strata_safetensors_read_f32(&st, strata_safetensors_find(&st, "f32"), 3, 6, out) != 0, "a range past the end");
    strata_safetensors_close(&st);

    /* a file truncated after it was written: refused by the header check, naming the file */
    CHECK(truncate(path, 8 + (off_t)n + 50) == 0 && strata_safetensors_open(&st, path) != 0 &&
              strstr(strata_error(), path) && strstr(strata_error(), "outside the 50 bytes"), "a truncated file is refused");
    unlink(path);
    CHECK(strata_safetensors_open(&st, path) != 0 && strstr(strata_error(), "cannot open"), "a missing file");
}

int main(void) {
    test_parse();
    test_bounds();
    test_read();
    return check_report();
}
