/* launcher/plot.h: `strata plot`, one run or several as one self-contained SVG.
 *
 * Reads each RUN/metrics.jsonl (one flat JSON object per line; the fields used are step,
 * loss, val_loss, lr, grad_norm, tokens_per_s, step_ms, the memory peaks, and the "plan"
 * object of a run's first row, any of which but step may be absent or null) and draws,
 * runs overlaid with a legend: train loss, val loss and the learning rate (right axis);
 * tokens/s and step time; the gradient norm; and memory per tier by category as planned,
 * against each tier's capacity and the peak measured. Lines that do not parse are skipped
 * with a warning naming file:line, so a run still being written can be plotted. The SVG
 * is written atomically (temp name, then rename). */
#ifndef STRATA_PLOT_H
#define STRATA_PLOT_H

/* svg_path NULL means <run_dir>/plot.svg for one run, ./plot.svg for several. Returns 0, or
 * nonzero with strata_error() naming the metrics file (missing, unreadable, or without a
 * single row) or the output path. At most 16 runs. */
int strata_plot_runs(const char *const *run_dirs, int n_runs, const char *svg_path);
int strata_plot_run(const char *run_dir, const char *svg_path);

#endif
