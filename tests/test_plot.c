/* tests/test_plot.c: `strata plot` on synthetic metrics.jsonl files: the SVG's structure,
 * the number of plotted points, their orientation, the numbers each curve carries against
 * the rows, the memory panel against the recorded plan (a resumed run's replacing the
 * first), several runs overlaid, tolerance of bad lines, and the errors. */
#include "core/common.h"
#include "launcher/plot.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static char tmpdir[256];

static int error_is(const char *expected) {
    if (strcmp(strata_error(), expected) == 0) return 1;
    printf("  got:      %s\n  expected: %s\n", strata_error(), expected);
    return 0;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Parses the points of the polyline with the given class into xs/ys; returns the count. */
static int polyline_points(const char *svg, const char *cls, double *xs, double *ys, int max) {
    char key[64];
    snprintf(key, sizeof key, "<polyline class=\"%s\"", cls);
    const char *p = strstr(svg, key);
    if (!p) return 0;
    p = strstr(p, "points=\"");
    if (!p) return 0;
    p += 8;
    int n = 0;
    while (*p != '"' && n < max) {
        char *e;
        xs[n] = strtod(p, &e);
        if (*e != ',') return -1;
        ys[n] = strtod(e + 1, &e);
        n++;
        p = e;
        while (*p == ' ') p++;
    }
    return n;
}

/* The value of attribute `name` in the element that starts at tag (up to its '>'), into
 * out; 0 when it has none. */
static int attr(const char *tag, const char *name, char *out, size_t n) {
    const char *end = strchr(tag, '>');
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = strstr(tag, key);
    if (!p || (end && p > end)) return 0;
    p += strlen(key);
    const char *q = strchr(p, '"');
    snprintf(out, n, "%.*s", (int)(q - p), p);
    return 1;
}

/* The element of class cls (a polyline, rect, ...) whose data-run is run (and, when tier
 * is given, whose data-tier is it, and data-category cat): its start, or NULL. */
static const char *element(const char *svg, const char *kind, const char *cls, int run, const char *tier, const char *cat) {
    char key[96], v[64];
    snprintf(key, sizeof key, "<%s class=\"%s\"", kind, cls);
    for (const char *p = svg; (p = strstr(p, key)); p++) {
        if (!attr(p, "data-run", v, sizeof v) || atoi(v) != run) continue;
        if (tier && (!attr(p, "data-tier", v, sizeof v) || strcmp(v, tier))) continue;
        if (cat && (!attr(p, "data-category", v, sizeof v) || strcmp(v, cat))) continue;
        return p;
    }
    return NULL;
}

/* data-points of the run's curve of class cls: "step,value ..." into xs, ys; the count. */
static int data_points(const char *svg, const char *cls, int run, double *xs, double *ys, int max) {
    const char *p = element(svg, "polyline", cls, run, NULL, NULL);
    static char buf[1 << 16];
    if (!p || !attr(p, "data-points", buf, sizeof buf)) return 0;
    int n = 0;
    for (char *q = buf; *q && n < max;) {
        xs[n] = strtod(q, &q);
        if (*q++ != ',') return -1;
        ys[n++] = strtod(q, &q);
        while (*q == ' ') q++;
    }
    return n;
}

static double attr_num(const char *tag, const char *name) {
    char v[64];
    return tag && attr(tag, name, v, sizeof v) ? strtod(v, NULL) : NAN;
}

static void test_plot_synthetic(void) {
    char run[512], path[1024], svg_path[1024];
    snprintf(run, sizeof run, "%s/run1", tmpdir);
    mkdir(run, 0755);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "w");
    for (int s = 0; s < 50; s++) {
        double loss = 1.0 + 4.0 * exp(-s / 15.0);
        double lr = s < 10 ? 6e-4 * (s + 1) / 10 : 6e-4 * 0.5 * (1 + cos(M_PI * (s - 10) / 40.0));
        fprintf(f, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.3e, \"grad_norm\": 1.5, "
                   "\"tokens_per_s\": 12345.0, \"step_ms\": 20.5, \"note\": \"a {tricky} \\\"str\\\"\", "
                   "\"mem\": {\"gpu\": [1, 2]}, \"val_loss\": null}\n",
                s, loss, lr);
        if (s % 10 == 9) fprintf(f, "{\"step\":%d,\"val_loss\":%.6f}\n", s, loss + 0.1);
        if (s == 20) fprintf(f, "\n{\"step\": 21, \"loss\": oops}\n"); /* blank + malformed */
    }
    fprintf(f, "{\"step\": 50, \"loss\": 1.0"); /* partial line of a run still writing */
    fclose(f);

    snprintf(svg_path, sizeof svg_path, "%s/loss.svg", run);
    CHECK(strata_plot_run(run, svg_path) == 0, "plot a 50-step run with 5 val points");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);
    CHECK(access(tmp, F_OK) != 0, "no .tmp left after the rename");
    char *svg = slurp(svg_path);
    CHECK(svg != NULL, "SVG file exists");
    if (!svg) return;
    size_t n = strlen(svg);
    while (n > 0 && (svg[n - 1] == '\n' || svg[n - 1] == ' ')) n--;
    CHECK(strncmp(svg, "<svg", 4) == 0, "starts with <svg");
    CHECK(n >= 6 && strncmp(svg + n - 6, "</svg>", 6) == 0, "ends with </svg>");
    CHECK(count(svg, "<") == count(svg, ">"), "angle brackets balance (%d '<')", count(svg, "<"));
    CHECK(count(svg, "<g") == count(svg, "</g>"), "every <g> is closed");
    CHECK(count(svg, "<polyline") >= 2, "at least 2 polylines (got %d)", count(svg, "<polyline"));
    CHECK(count(svg, "<circle") == 5, "5 val markers (got %d)", count(svg, "<circle"));
    CHECK(strstr(svg, run) != NULL, "title names the run dir");
    CHECK(strstr(svg, "train loss") && strstr(svg, "val loss") && strstr(svg, "lr (right axis)"),
          "legend names the three series");

    double xs[200], ys[200];
    int nt = polyline_points(svg, "train", xs, ys, 200);
    CHECK(nt == 50, "train polyline has 50 points (malformed and partial lines skipped; got %d)", nt);
    int inside = 1, x_up = 1, y_down_screen = 1;
    for (int i = 0; i < nt; i++) {
        if (xs[i] < 80 || xs[i] > 880 || ys[i] < 70 || ys[i] > 480) inside = 0;
        if (i && xs[i] <= xs[i - 1]) x_up = 0;
        if (i && ys[i] < ys[i - 1]) y_down_screen = 0; /* falling loss moves down the page */
    }
    CHECK(inside, "train points lie inside the plot box");
    CHECK(x_up && y_down_screen, "steps go right, falling loss goes down");
    int nv = polyline_points(svg, "val", xs, ys, 200);
    CHECK(nv == 5, "val polyline has 5 points (got %d)", nv);
    int nl = polyline_points(svg, "lr", xs, ys, 200);
    CHECK(nl == 50, "lr polyline has 50 points (got %d)", nl);
    /* lr peaks at step 9 (end of warmup), the top of its axis range. */
    int top = 0;
    for (int i = 1; i < nl; i++)
        if (ys[i] < ys[top]) top = i;
    CHECK(top == 9, "lr curve is highest at step 9 (got %d)", top);

    /* the numbers each curve carries are the rows' own */
    nt = data_points(svg, "train", 0, xs, ys, 200);
    int same = nt == 50;
    for (int s = 0; s < nt && same; s++) same = xs[s] == s && fabs(ys[s] - (1.0 + 4.0 * exp(-s / 15.0))) < 1e-6;
    CHECK(same, "train loss's data-points are the 50 rows' (step, loss)");
    const char *panels[] = {"loss", "speed", "grad_norm"}, *curves[] = {"tokens_per_s", "step_ms", "grad_norm"};
    double want[] = {12345.0, 20.5, 1.5};
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "data-panel=\"%s\"", panels[i]);
        CHECK(strstr(svg, key) != NULL, "a %s panel", panels[i]);
        int n = data_points(svg, curves[i], 0, xs, ys, 200), all = n == 50;
        for (int s = 0; s < n && all; s++) all = xs[s] == s && ys[s] == want[i];
        CHECK(all, "%s: 50 points of %g", curves[i], want[i]);
    }
    CHECK(strstr(svg, "data-panel=\"memory\"") == NULL, "no memory panel for metrics without a plan");
    free(svg);

    CHECK(strata_plot_run(run, NULL) == 0, "default output path");
    snprintf(path, sizeof path, "%s/plot.svg", run);
    CHECK(access(path, F_OK) == 0, "NULL svg_path writes <run_dir>/plot.svg");
}

/* Writes run dir/metrics.jsonl: steps 1..n, loss falling from base, a val every 5, and the
 * given first-row plan objects at the steps named (0: none). */
static void write_run(const char *dir, int n, double base, const char *plan1, int at1, const char *plan2, int at2) {
    char path[1024];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= n; s++) {
        fprintf(f, "{\"step\": %d, \"loss\": %.6f, ", s, base - 0.01 * s);
        if (s % 5 == 0) fprintf(f, "\"val_loss\": %.6f, ", base - 0.01 * s + 0.05);
        fprintf(f, "\"lr\": 0.001, \"grad_norm\": %.3f, \"tokens_per_s\": %.1f, \"step_ms\": %.3f, \"peak_mem_bytes\": %d, "
                   "\"pinned_bytes\": %d", 1.0 + s * 0.01, 1000.0 + s, 10.0 + s * 0.5, 1000000 + 1000 * s, 5000 + s);
        if (s == at1) fprintf(f, ", \"plan\": %s", plan1);
        if (s == at2) fprintf(f, ", \"plan\": %s", plan2);
        fprintf(f, "}\n");
    }
    fclose(f);
}

static void test_plot_runs(void) {
    char a[512], b[512], c[512], out[600];
    snprintf(a, sizeof a, "%s/cmp_a", tmpdir);
    snprintf(b, sizeof b, "%s/cmp_b", tmpdir);
    snprintf(c, sizeof c, "%s/cmp_c", tmpdir);
    const char *plan_a = "{\"world\": 1, \"stage\": 0, \"device\": {\"params\": 100000, \"grads\": 100000, \"optimizer\": 300000, "
                         "\"activations\": 500000, \"buffers\": 256, \"runtime\": 0, \"capacity\": 2000000}, \"pinned\": "
                         "{\"params\": 0, \"grads\": 0, \"optimizer\": 0, \"activations\": 0, \"buffers\": 65536, \"capacity\": "
                         "99000000000}, \"host\": {\"params\": 0, \"grads\": 0, \"optimizer\": 0, \"activations\": 1024, \"buffers\": 0, "
                         "\"capacity\": 99000000000}, \"nvme\": {\"params\": 0, \"grads\": 0, \"optimizer\": 0, \"activations\": 0, "
                         "\"buffers\": 0, \"capacity\": 0}}";
    /* b: resumed at step 10 with its optimizer offloaded: that plan is the one drawn */
    const char *plan_b2 = "{\"device\": {\"params\": 100000, \"grads\": 100000, \"optimizer\": 0, \"activations\": 500000, "
                          "\"buffers\": 256, \"runtime\": 0, \"capacity\": 2000000}, \"pinned\": {\"params\": 0, \"grads\": 0, "
                          "\"optimizer\": 300000, \"activations\": 0, \"buffers\": 100000, \"capacity\": 600000}}";
    write_run(a, 20, 5.0, plan_a, 1, NULL, 0);
    write_run(b, 30, 4.8, plan_a, 1, plan_b2, 11);
    write_run(c, 15, 4.9, NULL, 0, NULL, 0); /* metrics of a Strata that recorded no plan */
    const char *dirs[] = {a, b, c};
    snprintf(out, sizeof out, "%s/cmp.svg", tmpdir);
    CHECK(strata_plot_runs(dirs, 3, out) == 0, "three runs overlaid: %s", strata_error());
    char *svg = slurp(out);
    if (!svg) return;
    CHECK(count(svg, "<") == count(svg, ">") && count(svg, "<g") == count(svg, "</g>"), "well formed");
    CHECK(strstr(svg, "3 runs compared") && strstr(svg, a) && strstr(svg, b) && strstr(svg, c), "the legend names the three runs");
    double xs[64], ys[64];
    int lens[] = {20, 30, 15}, ok = 1;
    double bases[] = {5.0, 4.8, 4.9};
    for (int r = 0; r < 3; r++) {
        int n = data_points(svg, "train", r, xs, ys, 64);
        if (n != lens[r]) ok = 0;
        for (int i = 0; i < n; i++)
            if (xs[i] != i + 1 || fabs(ys[i] - (bases[r] - 0.01 * (i + 1))) > 1e-9) ok = 0;
        int nv = data_points(svg, "val", r, xs, ys, 64);
        if (nv != lens[r] / 5) ok = 0;
        int ng = data_points(svg, "grad_norm", r, xs, ys, 64);
        for (int i = 0; i < ng; i++)
            if (fabs(ys[i] - (1.0 + (i + 1) * 0.01)) > 1e-9) ok = 0;
        if (ng != lens[r] || data_points(svg, "tokens_per_s", r, xs, ys, 64) != lens[r] ||
            data_points(svg, "step_ms", r, xs, ys, 64) != lens[r])
            ok = 0;
    }
    CHECK(ok, "each run's curves carry its own rows (train, val, gradient norm, tokens/s, step time)");
    CHECK(count(svg, "<circle") == 4 + 6 + 3, "a val marker per val row of each run (got %d)", count(svg, "<circle"));
    /* the memory panel: a's plan, b's second plan (after its resume), none for c */
    CHECK(attr_num(element(svg, "rect", "mem", 0, "device", "optimizer"), "data-bytes") == 300000 &&
              attr_num(element(svg, "rect", "mem", 0, "device", "activations"), "data-bytes") == 500000,
          "run a's device bar: its plan's optimizer and activations");
    CHECK(element(svg, "rect", "mem", 1, "device", "optimizer") == NULL &&
              attr_num(element(svg, "rect", "mem", 1, "pinned", "optimizer"), "data-bytes") == 300000,
          "run b's bars follow the plan of its resume: the optimizer state pinned");
    CHECK(element(svg, "rect", "mem", 2, "device", NULL) == NULL && strstr(svg, "no plan recorded"),
          "run c recorded no plan and says so");
    CHECK(attr_num(element(svg, "line", "capacity", 0, "device", NULL), "data-bytes") == 2000000,
          "a's device capacity is drawn as a line");
    CHECK(element(svg, "line", "capacity", 0, "pinned", NULL) == NULL &&
              strstr(element(svg, "text", "total", 0, "pinned", NULL), "(off the scale)"),
          "a's pinned capacity (99 GB beside 64 KiB) is named, not drawn");
    CHECK(attr_num(element(svg, "line", "measured", 0, "device", NULL), "data-bytes") == 1000000 + 1000 * 20,
          "a's measured device peak is its highest peak_mem_bytes");
    CHECK(attr_num(element(svg, "line", "measured", 1, "pinned", NULL), "data-bytes") == 5000 + 30,
          "b's measured pinned peak is its highest pinned_bytes since the resume");
    CHECK(attr_num(element(svg, "text", "total", 1, "pinned", NULL), "data-capacity") == 600000 &&
              attr_num(element(svg, "text", "total", 1, "pinned", NULL), "data-bytes") == 400000,
          "b's pinned total and capacity as planned");
    free(svg);

    /* several runs without --out: ./plot.svg */
    char cwd[1024];
    if (!getcwd(cwd, sizeof cwd) || chdir(tmpdir) != 0) return;
    CHECK(strata_plot_runs(dirs, 2, NULL) == 0 && access("plot.svg", F_OK) == 0, "several runs default to ./plot.svg");
    if (chdir(cwd) != 0) printf("warning: cannot return to %s\n", cwd);
}

static void test_plot_errors(void) {
    char run[512], msg[2048], path[1024];
    snprintf(run, sizeof run, "%s/empty_run", tmpdir);
    mkdir(run, 0755);
    CHECK(strata_plot_run(run, NULL) != 0, "run dir without metrics refused");
    snprintf(msg, sizeof msg, "%s/metrics.jsonl: cannot open metrics (No such file or directory)", run);
    CHECK(error_is(msg), "missing-metrics message names the file");

    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "w");
    fprintf(f, "not json\n{\"loss\": 2.0}\n");
    fclose(f);
    CHECK(strata_plot_run(run, NULL) != 0, "metrics without a valid row refused");
    snprintf(msg, sizeof msg, "%s: no metrics rows (2 lines, 2 skipped as malformed)", path);
    CHECK(error_is(msg), "no-rows message names the file and counts");
    snprintf(path, sizeof path, "%s/plot.svg", run);
    CHECK(access(path, F_OK) != 0, "no SVG written on failure");

    /* one run of several missing: named, nothing written */
    char good[512], out[600];
    snprintf(good, sizeof good, "%s/cmp_a", tmpdir);
    const char *dirs[] = {good, run};
    snprintf(out, sizeof out, "%s/bad.svg", tmpdir);
    CHECK(strata_plot_runs(dirs, 2, out) != 0 && strstr(strata_error(), run) && access(out, F_OK) != 0,
          "a bad run among several is named, and no SVG is written: %s", strata_error());
    const char *many[17];
    for (int i = 0; i < 17; i++) many[i] = good;
    CHECK(strata_plot_runs(many, 17, out) != 0, "more than 16 runs refused: %s", strata_error());
}

int main(void) {
    strata_log_set_level(STRATA_LOG_ERROR); /* the skipped-line warnings are expected */
    /* mkdtemp template: the prefix, then six placeholder characters it replaces. */
    int len = snprintf(tmpdir, sizeof tmpdir, "/tmp/strata_test_plot_");
    memset(tmpdir + len, 'X', 6);
    tmpdir[len + 6] = 0;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_plot_synthetic();
    test_plot_runs();
    test_plot_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", tmpdir);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "PASSED", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
