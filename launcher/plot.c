/* launcher/plot.c: metrics.jsonl of one run or several -> one self-contained SVG, with libc
 * only: loss (and lr), speed, gradient norm and memory against the plan, runs overlaid.
 *
 * The metrics file is parsed by a small scanner for flat JSON objects that keeps the
 * numeric fields it knows and skips everything else; the one nested object it reads, the
 * "plan" of a run's first step's row (launcher/train.c), goes through io/json.c. A malformed line
 * costs a warning, not the plot.
 *
 * Every curve carries the points it draws in data units (data-run, data-points="step,value
 * ..."), every panel its box and axis ranges (data-box, data-x, data-y, data-y2), and every
 * memory bar its bytes (data-tier, data-category, data-bytes), so a reader (or a test) can
 * check the picture against metrics.jsonl without measuring pixels. */
#include "launcher/plot.h"

#include "core/common.h"
#include "io/files.h"
#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One metrics line; NAN marks a field that is absent or null. */
typedef struct metrics_row {
    double step, loss, val_loss, lr, grad_norm, tokens_per_s, step_ms;
    double peak_mem, device_used_peak, pinned;
} metrics_row;

/* The memory plan a run recorded (the last "plan" of its metrics: the one in force at
 * its end), and the peaks its rows measured since. */
enum { TIER_DEVICE, TIER_PINNED, TIER_HOST, TIER_NVME, N_TIERS };
enum { CAT_PARAMS, CAT_GRADS, CAT_OPTIMIZER, CAT_ACTIVATIONS, CAT_BUFFERS, CAT_RUNTIME, N_CATS };
static const char *const tier_key[N_TIERS] = {"device", "pinned", "host", "nvme"};
static const char *const tier_label[N_TIERS] = {"device", "pinned host", "host", "NVMe"};
static const char *const cat_key[N_CATS] = {"params", "grads", "optimizer", "activations", "buffers", "runtime"};
static const char *const cat_label[N_CATS] = {"parameters", "gradients", "optimizer", "activations", "buffers",
                                              "CUDA runtime"};
static const char *const cat_color[N_CATS] = {"#60a5fa", "#f59e0b", "#10b981", "#a78bfa", "#9ca3af", "#f472b6"};

typedef struct run_plan {
    int have;
    double bytes[N_TIERS][N_CATS];
    double capacity[N_TIERS]; /* 0: unknown */
    double measured[N_TIERS]; /* the peak the rows since the plan saw (device, pinned); 0: none */
} run_plan;

typedef struct run_data {
    const char *dir;
    metrics_row *rows;
    int n;
    run_plan plan;
} run_data;

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

/* The "plan" object [p, end) of a first step's row (launcher/train.c, write_plan) into plan. */
static int parse_plan(const char *p, const char *end, run_plan *plan, char *why, size_t why_len) {
    strata_json_doc doc;
    if (strata_json_parse(&doc, p, (size_t)(end - p), "plan")) {
        snprintf(why, why_len, "%s", strata_error());
        return -1;
    }
    memset(plan, 0, sizeof *plan);
    int rc = 0;
    for (int t = 0; t < N_TIERS && !rc; t++) {
        const strata_json *tier = strata_json_get(&doc.root, tier_key[t]);
        if (!tier) continue; /* a tier a later Strata adds or drops is no reason to lose the plot */
        for (int c = 0; c <= N_CATS && !rc; c++) {
            const strata_json *v = strata_json_get(tier, c < N_CATS ? cat_key[c] : "capacity");
            if (!v) continue;
            if (v->type != STRATA_JSON_NUMBER || !(v->number >= 0)) {
                snprintf(why, why_len, "plan.%s.%s is not a byte count", tier_key[t], c < N_CATS ? cat_key[c] : "capacity");
                rc = -1;
            } else if (c < N_CATS) {
                plan->bytes[t][c] = v->number;
            } else {
                plan->capacity[t] = v->number;
            }
        }
    }
    strata_json_free(&doc);
    plan->have = !rc;
    return rc;
}

/* Parses one line into r (and a "plan" into *plan, *has_plan set); on failure returns -1
 * with a short reason in `why`. */
static int parse_line(const char *s, metrics_row *r, run_plan *plan, int *has_plan, char *why, size_t why_len) {
    r->step = r->loss = r->val_loss = r->lr = r->grad_norm = r->tokens_per_s = r->step_ms = NAN;
    r->peak_mem = r->device_used_peak = r->pinned = NAN;
    *has_plan = 0;
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
            const char *start = p;
            p = skip_nested(p);
            if (p && *start == '{' && key_is(k, klen, "plan")) {
                if (parse_plan(start, p, plan, why, why_len)) return -1;
                *has_plan = 1;
            }
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
        static const struct { const char *key; size_t off; } fields[] = {
            {"step", offsetof(metrics_row, step)},
            {"loss", offsetof(metrics_row, loss)},
            {"val_loss", offsetof(metrics_row, val_loss)},
            {"lr", offsetof(metrics_row, lr)},
            {"grad_norm", offsetof(metrics_row, grad_norm)},
            {"tokens_per_s", offsetof(metrics_row, tokens_per_s)},
            {"step_ms", offsetof(metrics_row, step_ms)},
            {"peak_mem_bytes", offsetof(metrics_row, peak_mem)},
            {"device_used_peak_bytes", offsetof(metrics_row, device_used_peak)},
            {"pinned_bytes", offsetof(metrics_row, pinned)},
        };
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            if (key_is(k, klen, fields[i].key)) *(double *)((char *)r + fields[i].off) = v;
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

/* The peaks a row measured, into the plan in force: the device against the arena plus
 * the runtime row where there is one (nvidia-smi's view), else the allocator's peak. */
static void measure(run_plan *plan, const metrics_row *r) {
    double dev = plan->bytes[TIER_DEVICE][CAT_RUNTIME] > 0 ? r->device_used_peak : r->peak_mem;
    if (isfinite(dev)) plan->measured[TIER_DEVICE] = fmax(plan->measured[TIER_DEVICE], dev);
    if (isfinite(r->pinned)) plan->measured[TIER_PINNED] = fmax(plan->measured[TIER_PINNED], r->pinned);
}

static int read_metrics(const char *path, run_data *run) {
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
        run_plan plan;
        int has_plan;
        char why[300];
        if (parse_line(line, &r, &plan, &has_plan, why, sizeof why) != 0) {
            STRATA_WARN("plot", "%s:%d: line skipped: %s", path, line_no, why);
            skipped++;
            continue;
        }
        if (has_plan) run->plan = plan; /* a resumed run's plan replaces the one before it */
        if (run->plan.have) measure(&run->plan, &r);
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
    run->rows = rows;
    run->n = n;
    return 0;
}

/* ---- drawing ---- */

#define SVG_W 960
#define PLOT_L 80
#define PLOT_R 880
#define LOSS_H 410  /* the loss panel; the others are shorter */
#define SMALL_H 170
#define GAP 64      /* between panels: the step labels and the next panel's title */
/* More points than this per polyline are averaged in buckets: beyond ~1 per pixel they
 * only make the file larger. */
#define MAX_POLY_POINTS 1600
#define MAX_RUNS 16

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

/* A panel: its box on the page and its axes (x: steps; y left; y2 right, if used). */
typedef struct panel {
    const char *name, *title;
    int top, bottom;
    axis ax, ay, ay2;
    int has_y2;
} panel;

static double map_x(const panel *p, double x) {
    return PLOT_L + (x - p->ax.lo) / (p->ax.hi - p->ax.lo) * (PLOT_R - PLOT_L);
}
static double map_y(const panel *p, const axis *a, double y) {
    return p->bottom - (y - a->lo) / (a->hi - a->lo) * (p->bottom - p->top);
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

/* The series a curve draws: each row's field, where finite. */
typedef struct series_def {
    const char *cls;    /* the polyline's class */
    const char *label;  /* in the legend */
    const char *axis;   /* the right axis's title, for a series drawn there */
    size_t field;       /* offsetof(metrics_row, ...) */
    const char *color;  /* with one run; several runs take the run's colour */
    const char *dash;   /* "" solid */
    double width;
    int right;          /* on the right axis */
} series_def;

static const series_def S_TRAIN = {"train", "train loss", "", offsetof(metrics_row, loss), "#1d4ed8", "", 1.5, 0};
static const series_def S_VAL = {"val", "val loss", "", offsetof(metrics_row, val_loss), "#dc2626", "6 3", 1.5, 0};
static const series_def S_LR = {"lr", "lr (right axis)", "learning rate", offsetof(metrics_row, lr), "#2a9d8f", "2 3", 1, 1};
static const series_def S_TOK = {"tokens_per_s", "tokens/s", "", offsetof(metrics_row, tokens_per_s), "#1d4ed8", "", 1.5, 0};
static const series_def S_MS = {"step_ms", "step time, ms (right axis)", "step time (ms)", offsetof(metrics_row, step_ms),
                                "#d97706", "5 3", 1.2, 1};
static const series_def S_NORM = {"grad_norm", "gradient norm", "", offsetof(metrics_row, grad_norm), "#7c3aed", "", 1.5, 0};

static const char *const run_colors[] = {"#1d4ed8", "#dc2626", "#059669", "#d97706",
                                         "#7c3aed", "#db2777", "#0891b2", "#4b5563"};

typedef struct plot {
    const run_data *runs;
    int n_runs;
    double smin, smax; /* steps over every run */
} plot;

static const char *color_of(const plot *pl, const series_def *s, int run) {
    return pl->n_runs == 1 ? s->color : run_colors[run % (int)(sizeof run_colors / sizeof run_colors[0])];
}

static double row_value(const metrics_row *r, size_t field) { return *(const double *)((const char *)r + field); }

/* Range of a series' finite values over every run; 0 if it has none anywhere. */
static int series_range(const plot *pl, size_t field, double *lo, double *hi) {
    int any = 0;
    for (int k = 0; k < pl->n_runs; k++)
        for (int i = 0; i < pl->runs[k].n; i++) {
            double v = row_value(&pl->runs[k].rows[i], field);
            if (!isfinite(v)) continue;
            if (!any) *lo = *hi = v;
            *lo = fmin(*lo, v), *hi = fmax(*hi, v);
            any = 1;
        }
    return any;
}

/* One run's curve of series s in panel p: its points, bucket means beyond MAX_POLY_POINTS,
 * as pixels and (data-points) in data units. A single point draws no line. */
static void polyline(FILE *f, const plot *pl, const panel *p, const series_def *s, int run) {
    const run_data *rd = &pl->runs[run];
    double *xs = strata_xmalloc(sizeof(double) * (size_t)rd->n), *ys = strata_xmalloc(sizeof(double) * (size_t)rd->n);
    int n = 0;
    for (int i = 0; i < rd->n; i++) {
        double v = row_value(&rd->rows[i], s->field);
        if (!isfinite(v)) continue;
        xs[n] = rd->rows[i].step, ys[n] = v, n++;
    }
    const axis *ay = s->right ? &p->ay2 : &p->ay;
    if (n >= 2) {
        int buckets = n > MAX_POLY_POINTS ? MAX_POLY_POINTS : n;
        double *bx = strata_xmalloc(sizeof(double) * (size_t)buckets), *by = strata_xmalloc(sizeof(double) * (size_t)buckets);
        for (int b = 0; b < buckets; b++) {
            int i0 = (int)((long long)b * n / buckets), i1 = (int)((long long)(b + 1) * n / buckets);
            double sx = 0, sy = 0;
            for (int i = i0; i < i1; i++) sx += xs[i], sy += ys[i];
            bx[b] = sx / (i1 - i0), by[b] = sy / (i1 - i0);
        }
        fprintf(f, "<polyline class=\"%s\" data-run=\"%d\" fill=\"none\" stroke=\"%s\" stroke-width=\"%g\"%s%s%s points=\"",
                s->cls, run, color_of(pl, s, run), s->width, s->dash[0] ? " stroke-dasharray=\"" : "", s->dash,
                s->dash[0] ? "\"" : "");
        for (int b = 0; b < buckets; b++) fprintf(f, "%s%.1f,%.1f", b ? " " : "", map_x(p, bx[b]), map_y(p, ay, by[b]));
        fprintf(f, "\" data-points=\"");
        for (int b = 0; b < buckets; b++) fprintf(f, "%s%.9g,%.9g", b ? " " : "", bx[b], by[b]);
        fprintf(f, "\"/>\n");
        free(bx), free(by);
    }
    if (s == &S_VAL) /* a marker at each val point */
        for (int i = 0; i < n; i++)
            fprintf(f, "<circle class=\"val\" data-run=\"%d\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", run,
                    map_x(p, xs[i]), map_y(p, ay, ys[i]), color_of(pl, s, run));
    free(xs), free(ys);
}

/* The grid at the ticks, the frame, tick labels (steps below, y left, y2 right), the
 * titles; the panel's group opens here and carries its box and ranges. */
static void panel_open(FILE *f, const panel *p, const char *y_label, const char *y2_label, const char *y2_color) {
    fprintf(f, "<g class=\"panel\" data-panel=\"%s\" data-box=\"%d %d %d %d\" data-x=\"%.9g %.9g\" data-y=\"%.9g %.9g\"",
            p->name, PLOT_L, p->top, PLOT_R, p->bottom, p->ax.lo, p->ax.hi, p->ay.lo, p->ay.hi);
    if (p->has_y2) fprintf(f, " data-y2=\"%.9g %.9g\"", p->ay2.lo, p->ay2.hi);
    fprintf(f, ">\n");
    if (p->title) fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s</text>\n", PLOT_L, p->top - 8, p->title);
    const axis *ax = &p->ax, *ay = &p->ay, *a2 = &p->ay2;
    fprintf(f, "<g class=\"axes\" stroke=\"#ddd\">\n");
    for (int k = 0; ay->lo + k * ay->tick <= ay->hi + ay->tick * 1e-6; k++) {
        double y = map_y(p, ay, ay->lo + k * ay->tick);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", PLOT_L, y, PLOT_R, y);
    }
    for (int k = 0; ax->lo + k * ax->tick <= ax->hi + ax->tick * 1e-6; k++) {
        double x = map_x(p, ax->lo + k * ax->tick);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, p->top, x, p->bottom);
    }
    fprintf(f, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", PLOT_L,
            p->top, PLOT_R - PLOT_L, p->bottom - p->top);
    fprintf(f, "<g class=\"ticks\">\n");
    for (int k = 0; ax->lo + k * ax->tick <= ax->hi + ax->tick * 1e-6; k++) {
        double v = ax->lo + k * ax->tick;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.6g</text>\n", map_x(p, v), p->bottom + 18, v);
    }
    for (int k = 0; ay->lo + k * ay->tick <= ay->hi + ay->tick * 1e-6; k++) {
        double v = ay->lo + k * ay->tick;
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.6g</text>\n", PLOT_L - 6, map_y(p, ay, v) + 4, v);
    }
    if (p->has_y2)
        for (int k = 0; a2->lo + k * a2->tick <= a2->hi + a2->tick * 1e-6; k++) {
            double v = a2->lo + k * a2->tick;
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"%s\">%.3g</text>\n", PLOT_R + 6, map_y(p, a2, v) + 4, y2_color, v);
        }
    fprintf(f, "</g>\n");
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (PLOT_L + PLOT_R) / 2, p->bottom + 36);
    fprintf(f, "<text transform=\"translate(24 %d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            (p->top + p->bottom) / 2, y_label);
    if (p->has_y2)
        fprintf(f, "<text transform=\"translate(%d %d) rotate(90)\" text-anchor=\"middle\" fill=\"%s\">%s</text>\n",
                SVG_W - 20, (p->top + p->bottom) / 2, y2_color, y2_label);
}

/* The panel's legend, top right inside it: a row per series drawn, in the one run's
 * colours (several runs: in grey, the runs' colours being the title's legend). */
static void panel_legend(FILE *f, const plot *pl, const panel *p, const series_def *const *s, int n) {
    int lx0 = PLOT_R - 190, ly0 = p->top + 12;
    fprintf(f, "<g class=\"legend\">\n<rect x=\"%d\" y=\"%d\" width=\"180\" height=\"%d\" fill=\"white\" stroke=\"#bbb\"/>\n",
            lx0 - 6, ly0 - 8, 16 * n + 6);
    for (int i = 0; i < n; i++) {
        const char *c = pl->n_runs == 1 ? s[i]->color : "#444";
        int y = ly0 + 16 * i;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s%s%s/>", lx0, y,
                lx0 + 24, y, c, s[i]->dash[0] ? " stroke-dasharray=\"" : "", s[i]->dash, s[i]->dash[0] ? "\"" : "");
        if (s[i] == &S_VAL) fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"6\" height=\"6\" fill=\"%s\"/>", lx0 + 9, y - 3, c);
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx0 + 30, y + 4, s[i]->label);
    }
    fprintf(f, "</g>\n");
}

/* A panel of series over steps: left-axis series from 0 (or their range, for the loss),
 * right-axis ones on their own axis from 0. Returns the next panel's top, or top itself
 * when no run has any of the series. */
static int step_panel(FILE *f, const plot *pl, const char *name, const char *title, int top, int height,
                      const series_def *const *s, int n, const char *y_label, int from_zero) {
    panel p = {.name = name, .title = title, .top = top, .bottom = top + height};
    p.ax = nice_axis(pl->smin, pl->smax, 8);
    double lo = INFINITY, hi = -INFINITY, hi2 = 0;
    const series_def *drawn[8];
    int n_drawn = 0;
    for (int i = 0; i < n; i++) {
        double a, b;
        if (!series_range(pl, s[i]->field, &a, &b)) continue;
        drawn[n_drawn++] = s[i];
        if (s[i]->right) p.has_y2 = 1, hi2 = fmax(hi2, b);
        else lo = fmin(lo, a), hi = fmax(hi, b);
    }
    if (!n_drawn) return top;
    if (!isfinite(lo)) lo = 0, hi = 1;
    p.ay = nice_axis(from_zero ? fmin(0, lo) : lo, hi, height > 300 ? 6 : 4);
    p.ay2 = nice_axis(0, hi2 > 0 ? hi2 : 1, height > 300 ? 6 : 4);
    const char *y2_label = "", *y2_color = "#444";
    for (int i = 0; i < n_drawn; i++)
        if (drawn[i]->right) y2_label = drawn[i]->axis, y2_color = pl->n_runs == 1 ? drawn[i]->color : "#444";
    panel_open(f, &p, y_label, y2_label, y2_color);
    /* right-axis curves first, so the left-axis ones draw over them */
    for (int pass = 1; pass >= 0; pass--)
        for (int i = 0; i < n_drawn; i++)
            if (drawn[i]->right == pass)
                for (int r = 0; r < pl->n_runs; r++) polyline(f, pl, &p, drawn[i], r);
    panel_legend(f, pl, &p, drawn, n_drawn);
    fprintf(f, "</g>\n");
    return p.bottom + GAP;
}

/* ---- the memory panel ---- */

static double plan_need(const run_plan *pl, int t) {
    double s = 0;
    for (int c = 0; c < N_CATS; c++) s += pl->bytes[t][c];
    return s;
}

/* A binary unit for a byte range: its divisor and name. */
static double byte_unit(double max, const char **name) {
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double d = 1;
    while (u < 4 && max / d >= 1024) d *= 1024, u++;
    *name = names[u];
    return d;
}

#define BAR_H 14
#define BAR_GAP 6
#define MEM_TIER_PAD 40 /* a tier's title and its byte axis */
#define MEM_R (PLOT_R - 150) /* the bars' right end; each bar's total and capacity to its right */

/* Bytes per category and tier as planned, one stacked bar per run, against each run's
 * capacity of that tier (a solid line; named at the bar's end when it lies far beyond the
 * bars, as a machine's whole memory does next to a small run) and the peak its rows
 * measured (a dashed line). Returns the next top (top itself when no run has a plan). */
static int memory_panel(FILE *f, const plot *pl, int top) {
    int shown[N_TIERS] = {0}, any = 0;
    for (int r = 0; r < pl->n_runs; r++) {
        const run_plan *rp = &pl->runs[r].plan;
        if (!rp->have) continue;
        any = 1;
        for (int t = 0; t < N_TIERS; t++)
            if (plan_need(rp, t) > 0 || t == TIER_DEVICE) shown[t] = 1;
    }
    if (!any) return top;
    int tiers = 0, rows = pl->n_runs;
    for (int t = 0; t < N_TIERS; t++) tiers += shown[t];
    int height = tiers * (MEM_TIER_PAD + rows * (BAR_H + BAR_GAP)) + 10;
    fprintf(f, "<g class=\"panel\" data-panel=\"memory\" data-box=\"%d %d %d %d\">\n", PLOT_L, top, PLOT_R, top + height);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">memory per rank as planned, by tier and category, "
               "against capacity and the measured peak</text>\n", PLOT_L, top - 8);
    int y = top;
    for (int t = 0; t < N_TIERS; t++) {
        if (!shown[t]) continue;
        double max = 0, far_cap = 0;
        for (int r = 0; r < pl->n_runs; r++) {
            const run_plan *rp = &pl->runs[r].plan;
            if (rp->have) max = fmax(max, fmax(plan_need(rp, t), rp->measured[t]));
        }
        for (int r = 0; r < pl->n_runs; r++) { /* capacities near the bars widen the scale to show them */
            const run_plan *rp = &pl->runs[r].plan;
            if (rp->have && rp->capacity[t] > 0 && rp->capacity[t] <= 3 * max) far_cap = fmax(far_cap, rp->capacity[t]);
        }
        max = fmax(max, far_cap);
        const char *unit;
        double div = byte_unit(max > 0 ? max : 1, &unit);
        axis ax = nice_axis(0, max > 0 ? max / div : 1, 6);
        double scale = (MEM_R - PLOT_L) / ((ax.hi - ax.lo) * div), top_bytes = ax.hi * div; /* pixels per byte */
        int bars = rows * (BAR_H + BAR_GAP);
        fprintf(f, "<g class=\"tier\" data-tier=\"%s\" data-x=\"0 %.9g\">\n", tier_key[t], top_bytes);
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s (%s)</text>\n", PLOT_L, y + 14, tier_label[t], unit);
        int y0 = y + 22;
        for (int k = 0; ax.lo + k * ax.tick <= ax.hi + ax.tick * 1e-6; k++) {
            double v = ax.lo + k * ax.tick;
            double x = PLOT_L + v * div * scale;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
                       "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">%.4g</text>\n",
                    x, y0, x, y0 + bars, x, y0 + bars + 11, v);
        }
        for (int r = 0; r < pl->n_runs; r++) {
            const run_plan *rp = &pl->runs[r].plan;
            int by = y0 + r * (BAR_H + BAR_GAP) + BAR_GAP / 2;
            if (!rp->have) {
                fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#888\" font-size=\"10\">no plan recorded</text>\n", PLOT_L + 4,
                        by + 11);
                continue;
            }
            if (pl->n_runs > 1)
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"8\" height=\"%d\" fill=\"%s\"/>\n", PLOT_L - 12, by, BAR_H,
                        run_colors[r % (int)(sizeof run_colors / sizeof run_colors[0])]);
            double x = PLOT_L;
            for (int c = 0; c < N_CATS; c++) {
                double w = rp->bytes[t][c] * scale;
                if (rp->bytes[t][c] <= 0) continue;
                fprintf(f, "<rect class=\"mem\" data-run=\"%d\" data-tier=\"%s\" data-category=\"%s\" data-bytes=\"%.0f\" "
                           "x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>\n",
                        r, tier_key[t], cat_key[c], rp->bytes[t][c], x, by, w, BAR_H, cat_color[c]);
                x += w;
            }
            char b1[32], b2[32];
            double cap = rp->capacity[t];
            if (cap > 0 && cap <= top_bytes)
                fprintf(f, "<line class=\"capacity\" data-run=\"%d\" data-tier=\"%s\" data-bytes=\"%.0f\" x1=\"%.2f\" "
                           "y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#111\" stroke-width=\"2\"/>\n",
                        r, tier_key[t], cap, PLOT_L + cap * scale, by - 3, PLOT_L + cap * scale, by + BAR_H + 3);
            if (rp->measured[t] > 0)
                fprintf(f, "<line class=\"measured\" data-run=\"%d\" data-tier=\"%s\" data-bytes=\"%.0f\" x1=\"%.2f\" "
                           "y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#111\" stroke-width=\"1.5\" stroke-dasharray=\"3 2\"/>\n",
                        r, tier_key[t], rp->measured[t], PLOT_L + rp->measured[t] * scale, by - 3,
                        PLOT_L + rp->measured[t] * scale, by + BAR_H + 3);
            fprintf(f, "<text class=\"total\" data-run=\"%d\" data-tier=\"%s\" data-bytes=\"%.0f\" data-capacity=\"%.0f\" "
                       "x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#333\">%s of %s%s</text>\n",
                    r, tier_key[t], plan_need(rp, t), cap, MEM_R + 8, by + 11, strata_fmt_bytes(b1, 32, plan_need(rp, t)),
                    cap > 0 ? strata_fmt_bytes(b2, 32, cap) : "unknown capacity", cap > top_bytes ? " (off the scale)" : "");
        }
        fprintf(f, "</g>\n");
        y = y0 + bars + 18;
    }
    /* the categories' legend, with the two lines */
    int lx = PLOT_L, ly = y + 12;
    fprintf(f, "<g class=\"legend\">\n");
    for (int c = 0; c < N_CATS; c++) {
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
                lx, ly - 9, cat_color[c], lx + 14, ly, cat_label[c]);
        lx += 14 + 7 * (int)strlen(cat_label[c]) + 12;
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#111\" stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">"
               "capacity</text>\n", lx, ly - 10, lx, ly + 2, lx + 6, ly);
    lx += 80;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#111\" stroke-dasharray=\"3 2\"/><text x=\"%d\" "
               "y=\"%d\">peak measured</text>\n", lx, ly - 10, lx, ly + 2, lx + 6, ly);
    fprintf(f, "</g>\n</g>\n");
    return ly + 20;
}

/* ---- the page ---- */

/* What a reader checks first of run k: its steps, last train loss, best val loss. */
static void run_summary(FILE *f, const run_data *rd) {
    double smin = INFINITY, smax = -INFINITY, last = NAN, best = INFINITY, best_step = 0;
    for (int i = 0; i < rd->n; i++) {
        const metrics_row *r = &rd->rows[i];
        smin = fmin(smin, r->step), smax = fmax(smax, r->step);
        if (isfinite(r->loss)) last = r->loss;
        if (isfinite(r->val_loss) && r->val_loss < best) best = r->val_loss, best_step = r->step;
    }
    fprintf(f, "steps %.0f to %.0f", smin, smax);
    if (isfinite(last)) fprintf(f, ", last train loss %.4f", last);
    if (isfinite(best)) fprintf(f, ", best val loss %.4f at step %.0f", best, best_step);
}

/* Title, subtitle or the runs' legend (several runs); returns where the first panel's
 * box starts. */
static int svg_header(FILE *f, const plot *pl) {
    fprintf(f, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">", SVG_W / 2);
    if (pl->n_runs == 1) {
        fprintf(f, "Strata run ");
        xml_escaped(f, pl->runs[0].dir);
        fprintf(f, "</text>\n<text x=\"%d\" y=\"50\" text-anchor=\"middle\" fill=\"#555\">", SVG_W / 2);
        run_summary(f, &pl->runs[0]);
        fprintf(f, "</text>\n");
        return 70;
    }
    fprintf(f, "Strata: %d runs compared</text>\n<g class=\"runs\">\n", pl->n_runs);
    for (int r = 0; r < pl->n_runs; r++) {
        int y = 50 + 18 * r;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>"
                   "<text class=\"run\" data-run=\"%d\" x=\"%d\" y=\"%d\">", PLOT_L, y - 4, PLOT_L + 28, y - 4,
                run_colors[r % (int)(sizeof run_colors / sizeof run_colors[0])], r, PLOT_L + 36, y);
        xml_escaped(f, pl->runs[r].dir);
        fprintf(f, ": ");
        run_summary(f, &pl->runs[r]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g>\n");
    return 50 + 18 * pl->n_runs + 20;
}

/* The whole SVG: the panels drawn into a buffer first, since the page's height is known
 * only once they are. */
static int write_svg(FILE *out, const plot *pl) {
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f) return strata_fail("plot: out of host memory");
    int y = svg_header(f, pl);
    static const series_def *const loss[] = {&S_TRAIN, &S_VAL, &S_LR};
    static const series_def *const speed[] = {&S_TOK, &S_MS};
    static const series_def *const norm[] = {&S_NORM};
    y = step_panel(f, pl, "loss", NULL, y, LOSS_H, loss, 3, "loss", 0);
    y = step_panel(f, pl, "speed", "speed", y, SMALL_H, speed, 2, "tokens/s", 1);
    y = step_panel(f, pl, "grad_norm", "gradient norm (before clipping)", y, SMALL_H, norm, 1, "norm", 1);
    y = memory_panel(f, pl, y + 8);
    if (fclose(f) != 0) {
        free(body);
        return strata_fail("plot: out of host memory");
    }
    int h = y + 10;
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                 "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            SVG_W, h, SVG_W, h, SVG_W, h);
    fwrite(body, 1, len, out);
    fprintf(out, "</svg>\n");
    free(body);
    return 0;
}

int strata_plot_runs(const char *const *run_dirs, int n_runs, const char *svg_path) {
    if (n_runs < 1 || n_runs > MAX_RUNS) return strata_fail("plot: %d runs; between 1 and %d can be drawn at once", n_runs, MAX_RUNS);
    char out[4096], tmp[4200];
    if (!svg_path) {
        if (n_runs == 1) snprintf(out, sizeof out, "%s/plot.svg", run_dirs[0]);
        else snprintf(out, sizeof out, "plot.svg");
        svg_path = out;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);
    run_data runs[MAX_RUNS];
    memset(runs, 0, sizeof runs);
    plot pl = {.runs = runs, .n_runs = n_runs, .smin = INFINITY, .smax = -INFINITY};
    int rc = 0, rows = 0;
    for (int r = 0; r < n_runs && !rc; r++) {
        char metrics[4096];
        runs[r].dir = run_dirs[r];
        if (snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dirs[r]) >= (int)sizeof metrics)
            rc = strata_fail("%s: run directory path too long", run_dirs[r]);
        else rc = read_metrics(metrics, &runs[r]);
        for (int i = 0; !rc && i < runs[r].n; i++)
            pl.smin = fmin(pl.smin, runs[r].rows[i].step), pl.smax = fmax(pl.smax, runs[r].rows[i].step);
        rows += runs[r].n;
    }
    FILE *f = NULL;
    if (!rc && !(f = fopen(tmp, "w"))) rc = strata_fail("%s: cannot create plot: %s", tmp, strerror(errno));
    if (!rc) {
        rc = write_svg(f, &pl);
        int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
        int err = errno;
        if (fclose(f) != 0 && !bad) bad = 1, err = errno;
        if (!rc && bad) rc = strata_fail("%s: writing the plot failed: %s", tmp, strerror(err));
        if (!rc && rename(tmp, svg_path) != 0) rc = strata_fail("%s: cannot rename %s into place: %s", svg_path, tmp, strerror(errno));
        if (rc) (void)unlink(tmp); /* the plot failed already; this only tidies */
    }
    for (int r = 0; r < n_runs; r++) free(runs[r].rows);
    if (!rc) STRATA_INFO("plot", "%s: %d rows from %d run%s", svg_path, rows, n_runs, n_runs == 1 ? "" : "s");
    return rc;
}

int strata_plot_run(const char *run_dir, const char *svg_path) { return strata_plot_runs(&run_dir, 1, svg_path); }
