/* launcher/plot.h: `strata plot`, the loss curve of a run as a self-contained SVG.
 *
 * Reads <run_dir>/metrics.jsonl (one flat JSON object per line; the fields used are
 * step, loss, val_loss and lr, any of which but step may be absent or null) and draws
 * train loss, val loss and the learning rate (right axis). Lines that do not parse are
 * skipped with a warning naming file:line, so a run still being written can be plotted.
 * The SVG is written atomically (temp name, then rename). */
#ifndef STRATA_PLOT_H
#define STRATA_PLOT_H

/* svg_path NULL means <run_dir>/plot.svg. Returns 0, or nonzero with strata_error() naming
 * the metrics file (missing, unreadable, or without a single row) or the output path. */
int strata_plot_run(const char *run_dir, const char *svg_path);

#endif
