/* io/nfc.c: NFC (io/nfc.h) over the tables of io/nfc_tables.h: decode to code points,
 * decompose canonically (recursively; Hangul syllables by arithmetic), put each run of
 * non-starters in canonical order (a stable sort by combining class), then compose each
 * character with the last starter when nothing between blocks it, as UAX #15 says. */
#include "io/nfc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/nfc_tables.h"
#include "io/text.h"

#define N_CCC (sizeof nfc_ccc / sizeof nfc_ccc[0])
#define N_DECOMP (sizeof nfc_decomp / sizeof nfc_decomp[0])
#define N_COMP (sizeof nfc_comp / sizeof nfc_comp[0])

/* Hangul (UAX #15, "Hangul"): syllable = S + (L index * 21 + V index) * 28 + T index */
enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21, T_COUNT = 28,
       N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

const char *strata_nfc_unicode_version(void) { return STRATA_NFC_UNICODE_VERSION; }

static int ccc_of(uint32_t c) {
    if (c < 0x300) return 0;
    size_t lo = 0, hi = N_CCC;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < nfc_ccc[mid][0]) hi = mid;
        else if (c > nfc_ccc[mid][1]) lo = mid + 1;
        else return (int)nfc_ccc[mid][2];
    }
    return 0;
}

/* The one-level canonical decomposition of c, or NULL. */
static const uint32_t *decomp_of(uint32_t c) {
    size_t lo = 0, hi = N_DECOMP;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < nfc_decomp[mid][0]) hi = mid;
        else if (c > nfc_decomp[mid][0]) lo = mid + 1;
        else return nfc_decomp[mid];
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = N_COMP;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = nfc_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1])) hi = mid;
        else if (a > e[0] || b > e[1]) lo = mid + 1;
        else return e[2];
    }
    return 0;
}

typedef struct cps {
    uint32_t *v;
    size_t n, cap;
} cps;

static void cps_push(cps *a, uint32_t c) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = strata_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = c;
}

/* Appends the full canonical decomposition of c (a decomposition is at most a few levels
 * deep: the recursion ends at characters without one). */
static void decompose(cps *out, uint32_t c, int depth) {
    if (c >= S_BASE && c < S_BASE + S_COUNT) {
        uint32_t s = c - S_BASE;
        cps_push(out, L_BASE + s / N_COUNT);
        cps_push(out, V_BASE + (s % N_COUNT) / T_COUNT);
        if (s % T_COUNT) cps_push(out, T_BASE + s % T_COUNT);
        return;
    }
    const uint32_t *d = depth < 8 ? decomp_of(c) : NULL;
    if (!d) {
        cps_push(out, c);
        return;
    }
    decompose(out, d[1], depth + 1);
    if (d[2]) decompose(out, d[2], depth + 1);
}

char *strata_nfc(const char *s, size_t n, size_t *out_len) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0xCC) i++; /* a lead byte from 0xCC on starts U+0300 or above */
    if (i == n) return NULL;
    cps a = {0};
    for (size_t k = 0; k < n;) {
        uint32_t c = 0xFFFD;
        size_t len = strata_utf8_decode(s + k, n - k, &c);
        if (!len) len = 1; /* the caller passes valid UTF-8; a stray byte would become U+FFFD */
        decompose(&a, c, 0);
        k += len;
    }
    /* canonical order: within each run of non-starters, a stable sort by class */
    for (size_t k = 1; k < a.n; k++) {
        int cc = ccc_of(a.v[k]);
        if (!cc) continue;
        uint32_t c = a.v[k];
        size_t j = k;
        while (j > 0 && ccc_of(a.v[j - 1]) > cc) {
            a.v[j] = a.v[j - 1];
            j--;
        }
        a.v[j] = c;
    }
    /* composition: c joins the last starter unless a character between them blocks it
     * (one of class 0, or of a class not below c's); last_class 0 means adjacent */
    size_t w = 0, starter = 0;
    int have_starter = 0, last_class = 0;
    for (size_t k = 0; k < a.n; k++) {
        uint32_t c = a.v[k];
        int cc = ccc_of(c);
        uint32_t comp = have_starter && (last_class < cc || last_class == 0) ? compose(a.v[starter], c) : 0;
        if (comp) {
            a.v[starter] = comp;
            continue;
        }
        if (cc == 0) {
            starter = w;
            have_starter = 1;
        }
        last_class = cc;
        a.v[w++] = c;
    }
    char *out = strata_xmalloc(4 * w + 1);
    size_t o = 0;
    for (size_t k = 0; k < w; k++) o += strata_utf8_encode(out + o, a.v[k]);
    out[o] = 0;
    free(a.v);
    *out_len = o;
    return out;
}
