/* launcher/plot.c: metrics.jsonl -> SVG loss curve, with libc only.
 *
 * The metrics file is parsed by a small scanner for flat JSON objects that keeps the
 * numeric fields it knows and skips everything else; a malformed line costs a warning,
 * not the plot. */
#include "launcher/plot.h"

#include "core/common.h"
#include "io/files.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One metrics line; NAN marks a field that is absent or null. */
typedef struct metrics_row {
    double step, loss, val_loss, lr;
} metrics_row;

/* ---- the scanner ---- */

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return p;
}

/* p at the opening quote; returns the character after the closing quote, or NULL. */
static const char *skip_string(const char *p) {
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!p[1]) return NULL;
            p++;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* Skips a nested object or array (values we do not plot), minding strings. */
static const char *skip_nested(const char *p) {
    int depth = 0;
    while (*p) {
        if (*p == '"') {
            p = skip_string(p);
            if (!p) return NULL;
            continue;
        }
        if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') {
            if (--depth == 0) return p + 1;
        }
        p++;
    }
    return NULL;
}

static int key_is(const char *k, size_t klen, const char *name) {
    return strlen(name) == klen && memcmp(k, name, klen) == 0;
}

/* Parses one line into r; on failure returns -1 with a short reason in `why`. */
static int parse_line(const char *s, metrics_row *r, char *why, size_t why_len) {
    r->step = r->loss = r->val_loss = r->lr = NAN;
    const char *p = skip_ws(s);
    if (*p != '{') {
        snprintf(why, why_len, "expected a JSON object");
        return -1;
    }
    p = skip_ws(p + 1);
    if (*p == '}') goto close;
    for (;;) {
        if (*p != '"') {
            snprintf(why, why_len, "expected a quoted key at column %d", (int)(p - s) + 1);
            return -1;
        }
        const char *k = p + 1;
        const char *end = skip_string(p);
        if (!end) {
            snprintf(why, why_len, "unterminated string at column %d", (int)(p - s) + 1);
            return -1;
        }
        size_t klen = (size_t)(end - 1 - k);
        p = skip_ws(end);
        if (*p != ':') {
            snprintf(why, why_len, "expected ':' after key \"%.*s\"", (int)klen, k);
            return -1;
        }
        p = skip_ws(p + 1);
        double v = NAN;
        if (*p == '"') {
            p = skip_string(p);
        } else if (*p == '{' || *p == '[') {
            p = skip_nested(p);
        } else if (!strncmp(p, "null", 4)) {
            p += 4;
        } else if (!strncmp(p, "true", 4)) {
            p += 4;
        } else if (!strncmp(p, "false", 5)) {
            p += 5;
        } else {
            /* strtod also takes NaN and Infinity, which Python's json writes. */
            char *e;
            v = strtod(p, &e);
            if (e == p) p = NULL;
            else p = e;
        }
        if (!p) {
            snprintf(why, why_len, "bad value for key \"%.*s\"", (int)klen, k);
            return -1;
        }
        if (key_is(k, klen, "step")) r->step = v;
        else if (key_is(k, klen, "loss")) r->loss = v;
        else if (key_is(k, klen, "val_loss")) r->val_loss = v;
        else if (key_is(k, klen, "lr")) r->lr = v;
        p = skip_ws(p);
        if (*p == ',') {
            p = skip_ws(p + 1);
            continue;
        }
        if (*p == '}') break;
        snprintf(why, why_len, "expected ',' or '}' at column %d", (int)(p - s) + 1);
        return -1;
    }
close:
    p = skip_ws(p + 1);
    if (*p) {
        snprintf(why, why_len, "text after the closing '}' at column %d", (int)(p - s) + 1);
        return -1;
    }
    if (!isfinite(r->step)) {
        snprintf(why, why_len, "no numeric \"step\"");
        return -1;
    }
    return 0;
}

static int read_metrics(const char *path, metrics_row **rows_out, int *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) return strata_fail("%s: cannot open metrics (%s)", path, strerror(errno));
    /* a line per step: a million steps are a few hundred MiB */
    if (strata_check_file_bounded(path, (size_t)4 << 30)) {
        fclose(f);
        return -1;
    }
    metrics_row *rows = NULL;
    int n = 0, cap = 0, line_no = 0, skipped = 0;
    char *line = NULL;
    size_t line_cap = 0;
    while (getline(&line, &line_cap, f) >= 0) {
        line_no++;
        if (*skip_ws(line) == 0) continue;
        metrics_row r;
        char why[160];
        if (parse_line(line, &r, why, sizeof why) != 0) {
            STRATA_WARN("plot", "%s:%d: line skipped: %s", path, line_no, why);
            skipped++;
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            rows = strata_xrealloc(rows, (size_t)cap * sizeof *rows);
        }
        rows[n++] = r;
    }
    int bad = ferror(f);
    free(line);
    fclose(f);
    if (bad) {
        free(rows);
        return strata_fail("%s: read error after line %d", path, line_no);
    }
    if (n == 0) {
        free(rows);
        return strata_fail("%s: no metrics rows (%d line%s, %d skipped as malformed)", path, line_no,
                           line_no == 1 ? "" : "s", skipped);
    }
    *rows_out = rows;
    *n_out = n;
    return 0;
}

/* ---- drawing ---- */

#define SVG_W 960
#define SVG_H 540
#define PLOT_L 80
#define PLOT_R 880
#define PLOT_T 70
#define PLOT_B 480
/* More points than this per polyline are averaged in buckets: beyond ~1 per pixel they
 * only make the file larger. */
#define MAX_POLY_POINTS 1600

typedef struct axis {
    double lo, hi, tick;
} axis;

/* A range padded out to "nice" tick multiples (1, 2 or 5 times a power of ten). */
static axis nice_axis(double lo, double hi, int target_ticks) {
    if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * fmax(fabs(lo), 1.0)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    double raw = (hi - lo) / target_ticks;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    axis a = {floor(lo / step) * step, ceil(hi / step) * step, step};
    return a;
}

static double map_x(const axis *a, double x) {
    return PLOT_L + (x - a->lo) / (a->hi - a->lo) * (PLOT_R - PLOT_L);
}
static double map_y(const axis *a, double y) {
    return PLOT_B - (y - a->lo) / (a->hi - a->lo) * (PLOT_B - PLOT_T);
}

static void xml_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* Collects (step, field) pairs with a finite value; field is a byte offset in the row. */
static int series(const metrics_row *rows, int n, size_t field, double *xs, double *ys) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        double v = *(const double *)((const char *)&rows[i] + field);
        if (!isfinite(v)) continue;
        xs[k] = rows[i].step;
        ys[k] = v;
        k++;
    }
    return k;
}

static void polyline(FILE *f, const axis *ax, const axis *ay, const double *xs, const double *ys,
                     int n, const char *cls, const char *style) {
    if (n < 2) return;
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" %s points=\"", cls, style);
    int buckets = n > MAX_POLY_POINTS ? MAX_POLY_POINTS : n;
    for (int b = 0; b < buckets; b++) {
        int i0 = (int)((long long)b * n / buckets), i1 = (int)((long long)(b + 1) * n / buckets);
        double sx = 0, sy = 0;
        for (int i = i0; i < i1; i++) sx += xs[i], sy += ys[i];
        fprintf(f, "%s%.1f,%.1f", b ? " " : "", map_x(ax, sx / (i1 - i0)), map_y(ay, sy / (i1 - i0)));
    }
    fprintf(f, "\"/>\n");
}

/* What the drawing needs: the three series (step, value) with a finite value, the step
 * range, and the axes: steps, loss (left), learning rate (right). */
typedef struct plot_data {
    double *tx, *ty, *vx, *vy, *lx, *ly; /* train loss, val loss, lr */
    int nt, nv, nl;
    double smin, smax;
    axis ax, ay, al;
} plot_data;

/* The series of rows and the axes that hold them. */
static void plot_data_init(plot_data *d, const metrics_row *rows, int n) {
    d->tx = strata_xmalloc(sizeof(double) * n), d->ty = strata_xmalloc(sizeof(double) * n);
    d->vx = strata_xmalloc(sizeof(double) * n), d->vy = strata_xmalloc(sizeof(double) * n);
    d->lx = strata_xmalloc(sizeof(double) * n), d->ly = strata_xmalloc(sizeof(double) * n);
    d->nt = series(rows, n, offsetof(metrics_row, loss), d->tx, d->ty);
    d->nv = series(rows, n, offsetof(metrics_row, val_loss), d->vx, d->vy);
    d->nl = series(rows, n, offsetof(metrics_row, lr), d->lx, d->ly);

    double ymin = INFINITY, ymax = -INFINITY, lmax = 0;
    d->smin = INFINITY, d->smax = -INFINITY;
    for (int i = 0; i < n; i++) d->smin = fmin(d->smin, rows[i].step), d->smax = fmax(d->smax, rows[i].step);
    for (int i = 0; i < d->nt; i++) ymin = fmin(ymin, d->ty[i]), ymax = fmax(ymax, d->ty[i]);
    for (int i = 0; i < d->nv; i++) ymin = fmin(ymin, d->vy[i]), ymax = fmax(ymax, d->vy[i]);
    for (int i = 0; i < d->nl; i++) lmax = fmax(lmax, d->ly[i]);
    d->ax = nice_axis(d->smin, d->smax, 8);
    d->ay = nice_axis(ymin, ymax, 6);
    d->al = nice_axis(0, lmax > 0 ? lmax : 1, 6);
}

static void plot_data_free(plot_data *d) {
    free(d->tx), free(d->ty), free(d->vx), free(d->vy), free(d->lx), free(d->ly);
}

/* The SVG's opening, the title, and a subtitle with what a reader checks first. */
static void svg_title(FILE *f, const char *run_dir, const plot_data *d) {
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);
    fprintf(f, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">Strata run ", SVG_W / 2);
    xml_escaped(f, run_dir);
    fprintf(f, "</text>\n");

    fprintf(f, "<text x=\"%d\" y=\"50\" text-anchor=\"middle\" fill=\"#555\">steps %.0f to %.0f",
            SVG_W / 2, d->smin, d->smax);
    if (d->nt) fprintf(f, ", last train loss %.4f", d->ty[d->nt - 1]);
    if (d->nv) {
        int best = 0;
        for (int i = 1; i < d->nv; i++)
            if (d->vy[i] < d->vy[best]) best = i;
        fprintf(f, ", best val loss %.4f at step %.0f", d->vy[best], d->vx[best]);
    }
    fprintf(f, "</text>\n");
}

/* The grid at the ticks and the plot's frame. */
static void svg_grid(FILE *f, const plot_data *d) {
    const axis *ax = &d->ax, *ay = &d->ay;
    fprintf(f, "<g class=\"axes\" stroke=\"#ddd\">\n");
    for (int k = 0; ay->lo + k * ay->tick <= ay->hi + ay->tick * 1e-6; k++) {
        double y = map_y(ay, ay->lo + k * ay->tick);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", PLOT_L, y, PLOT_R, y);
    }
    for (int k = 0; ax->lo + k * ax->tick <= ax->hi + ax->tick * 1e-6; k++) {
        double x = map_x(ax, ax->lo + k * ax->tick);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, PLOT_T, x, PLOT_B);
    }
    fprintf(f, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n",
            PLOT_L, PLOT_T, PLOT_R - PLOT_L, PLOT_B - PLOT_T);
}

/* Tick labels (step below, loss on the left, lr on the right) and the axes' titles. */
static void svg_ticks(FILE *f, const plot_data *d) {
    const axis *ax = &d->ax, *ay = &d->ay, *al = &d->al;
    fprintf(f, "<g class=\"ticks\">\n");
    for (int k = 0; ax->lo + k * ax->tick <= ax->hi + ax->tick * 1e-6; k++) {
        double v = ax->lo + k * ax->tick;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.6g</text>\n", map_x(ax, v),
                PLOT_B + 18, v);
    }
    for (int k = 0; ay->lo + k * ay->tick <= ay->hi + ay->tick * 1e-6; k++) {
        double v = ay->lo + k * ay->tick;
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n", PLOT_L - 6,
                map_y(ay, v) + 4, v);
    }
    if (d->nl) {
        for (int k = 0; al->lo + k * al->tick <= al->hi + al->tick * 1e-6; k++) {
            double v = al->lo + k * al->tick;
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#2a9d8f\">%.3g</text>\n", PLOT_R + 6,
                    map_y(al, v) + 4, v);
        }
    }
    fprintf(f, "</g>\n");
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (PLOT_L + PLOT_R) / 2,
            PLOT_B + 42);
    fprintf(f, "<text transform=\"translate(24 %d) rotate(-90)\" text-anchor=\"middle\">loss</text>\n",
            (PLOT_T + PLOT_B) / 2);
    if (d->nl)
        fprintf(f, "<text transform=\"translate(%d %d) rotate(90)\" text-anchor=\"middle\" "
                   "fill=\"#2a9d8f\">learning rate</text>\n",
                SVG_W - 20, (PLOT_T + PLOT_B) / 2);
}

/* The curves: lr first so the losses draw over it; a marker at each val point. */
static void svg_curves(FILE *f, const plot_data *d) {
    polyline(f, &d->ax, &d->al, d->lx, d->ly, d->nl, "lr", "stroke=\"#2a9d8f\" stroke-width=\"1\" stroke-dasharray=\"4 3\"");
    polyline(f, &d->ax, &d->ay, d->tx, d->ty, d->nt, "train", "stroke=\"#1d4ed8\" stroke-width=\"1.5\"");
    polyline(f, &d->ax, &d->ay, d->vx, d->vy, d->nv, "val", "stroke=\"#dc2626\" stroke-width=\"1.5\"");
    for (int i = 0; i < d->nv; i++)
        fprintf(f, "<circle class=\"val\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#dc2626\"/>\n",
                map_x(&d->ax, d->vx[i]), map_y(&d->ay, d->vy[i]));
}

/* The legend, top right inside the plot (no circles here, so markers count val points),
 * one row per series drawn; then the SVG's end. */
static void svg_legend(FILE *f, const plot_data *d) {
    int nt = d->nt, nv = d->nv, nl = d->nl;
    int lx0 = PLOT_R - 170, ly0 = PLOT_T + 12, row = 0;
    fprintf(f, "<g class=\"legend\">\n<rect x=\"%d\" y=\"%d\" width=\"160\" height=\"%d\" fill=\"white\" "
               "stroke=\"#bbb\"/>\n",
            lx0 - 6, ly0 - 8, 16 * ((nt > 0) + (nv > 0) + (nl > 0)) + 6);
    if (nt) {
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1d4ed8\" stroke-width=\"2\"/>"
                   "<text x=\"%d\" y=\"%d\">train loss</text>\n",
                lx0, ly0 + 16 * row, lx0 + 24, ly0 + 16 * row, lx0 + 30, ly0 + 16 * row + 4);
        row++;
    }
    if (nv) {
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#dc2626\" stroke-width=\"2\"/>"
                   "<rect x=\"%d\" y=\"%d\" width=\"6\" height=\"6\" fill=\"#dc2626\"/>"
                   "<text x=\"%d\" y=\"%d\">val loss</text>\n",
                lx0, ly0 + 16 * row, lx0 + 24, ly0 + 16 * row, lx0 + 9, ly0 + 16 * row - 3, lx0 + 30,
                ly0 + 16 * row + 4);
        row++;
    }
    if (nl) {
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#2a9d8f\" "
                   "stroke-dasharray=\"4 3\"/><text x=\"%d\" y=\"%d\">lr (right axis)</text>\n",
                lx0, ly0 + 16 * row, lx0 + 24, ly0 + 16 * row, lx0 + 30, ly0 + 16 * row + 4);
        row++;
    }
    fprintf(f, "</g>\n</svg>\n");
}

/* The whole SVG of rows: title, grid, ticks, curves, legend. */
static void write_svg(FILE *f, const char *run_dir, const metrics_row *rows, int n) {
    plot_data d;
    plot_data_init(&d, rows, n);
    svg_title(f, run_dir, &d);
    svg_grid(f, &d);
    svg_ticks(f, &d);
    svg_curves(f, &d);
    svg_legend(f, &d);
    plot_data_free(&d);
}

int strata_plot_run(const char *run_dir, const char *svg_path) {
    char metrics[4096], out[4096], tmp[4200];
    if (snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir) >= (int)sizeof metrics)
        return strata_fail("%s: run directory path too long", run_dir);
    if (!svg_path) {
        snprintf(out, sizeof out, "%s/plot.svg", run_dir);
        svg_path = out;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);

    metrics_row *rows = NULL;
    int n = 0;
    if (read_metrics(metrics, &rows, &n) != 0) return -1;

    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(rows);
        return strata_fail("%s: cannot create plot: %s", tmp, strerror(errno));
    }
    write_svg(f, run_dir, rows, n);
    free(rows);
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int err = errno;
    if (fclose(f) != 0 && !bad) bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        return strata_fail("%s: writing the plot failed: %s", tmp, strerror(err));
    }
    if (rename(tmp, svg_path) != 0) {
        err = errno;
        unlink(tmp);
        return strata_fail("%s: cannot rename %s into place: %s", svg_path, tmp, strerror(err));
    }
    STRATA_INFO("plot", "%s: %d rows from %s", svg_path, n, metrics);
    return 0;
}
