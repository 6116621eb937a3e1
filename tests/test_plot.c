/* tests/test_plot.c: `strata plot` on a synthetic metrics.jsonl: the SVG's structure, the
 * number of plotted points, their orientation, tolerance of bad lines, and the errors. */
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
    free(svg);

    CHECK(strata_plot_run(run, NULL) == 0, "default output path");
    snprintf(path, sizeof path, "%s/plot.svg", run);
    CHECK(access(path, F_OK) == 0, "NULL svg_path writes <run_dir>/plot.svg");
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
    test_plot_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", tmpdir);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "PASSED", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
