/* launcher/watchdog.c: the end of a run that makes no progress (launcher/watchdog.h). */
#include "launcher/watchdog.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "launcher/signals.h"

#define AUTO_FACTOR 20.0
#define AUTO_MIN_S (20.0 * 60.0)
#define FIRST_FACTOR 3.0 /* the first of a kind: three times the minimum (an hour) */

static double fixed_s;                        /* run.hang_timeout_s; 0: auto */
static double min_s = AUTO_MIN_S;             /* auto's least limit */
static double longest_s[STRATA_DOING_END + 1]; /* the longest completed, per kind */

static int watched(strata_doing d) { return d != STRATA_DOING_START && d != STRATA_DOING_END; }

/* A checkpoint save keeps auto's limit whatever run.hang_timeout_s says: a large model's
 * save is long, and a short limit set for steps must not cut one off. */
static int fixed_applies(strata_doing d) { return fixed_s > 0 && d != STRATA_DOING_SAVE; }

static double limit_for(strata_doing d) {
    if (fixed_applies(d)) return fixed_s;
    if (longest_s[d] <= 0) return FIRST_FACTOR * min_s;
    double s = AUTO_FACTOR * longest_s[d];
    return s > min_s ? s : min_s;
}

static const char *kind_name(strata_doing d) {
    switch (d) {
    case STRATA_DOING_STEP: return "step";
    case STRATA_DOING_EVAL: return "validation";
    case STRATA_DOING_AGREE: return "agreement at a step's end";
    case STRATA_DOING_SAVE: return "checkpoint save";
    case STRATA_DOING_TRIAL: return "memory.auto trial step";
    default: return "final optimizer update";
    }
}

static _Noreturn void end_hung(strata_doing d, double waited_s, double limit_s) {
    char note[1024], why[160];
    strata_signals_note(note, sizeof note);
    if (fixed_applies(d)) snprintf(why, sizeof why, "run.hang_timeout_s is %g", fixed_s);
    else if (longest_s[d] <= 0) snprintf(why, sizeof why, "run.hang_timeout_s auto allows the first %s %.0f s", kind_name(d), limit_s);
    else
        snprintf(why, sizeof why, "run.hang_timeout_s auto allows %.0f s: %.0f x the longest %s so far, %.1f s",
                 limit_s, AUTO_FACTOR, kind_name(d), longest_s[d]);
    STRATA_ERROR("train", "no progress for %.0f s (%s): the run ends here rather than hang. %s Waits that went on "
                 "long were reported above (STRATA_WAIT_REPORT_S); a longer run.hang_timeout_s waits longer.",
                 waited_s, why, note);
    fflush(stderr);
    _exit(STRATA_EXIT_HUNG);
}

/* Polls where the loop is; a change of phase (or step) ends the last one, whose length
 * feeds auto's limit. Phases shorter than a poll merge into the one before: that only
 * lengthens the limit. */
static void *watch(void *arg) {
    (void)arg;
    double last_since = -1;
    strata_doing last = STRATA_DOING_START;
    for (;;) {
        double limit_min = fixed_s > 0 ? fixed_s : min_s, poll_s = limit_min < 10 ? limit_min / 10 : 1.0;
        struct timespec nap = {(time_t)poll_s, (long)((poll_s - (double)(time_t)poll_s) * 1e9)};
        nanosleep(&nap, NULL);
        double since;
        strata_doing d = strata_signals_where(&since);
        if (since != last_since) {
            if (last_since >= 0 && watched(last)) {
                double took = (since - last_since) / 1e3;
                if (took > longest_s[last]) longest_s[last] = took;
            }
            last_since = since;
            last = d;
        }
        if (!watched(d)) continue;
        double waited = (strata_now_ms() - since) / 1e3, limit = limit_for(d);
        if (waited > limit) end_hung(d, waited, limit);
    }
    return NULL;
}

void strata_watchdog_start(double limit_s) {
    static int started;
    if (started) return;
    started = 1;
    fixed_s = limit_s;
    const char *test_min = getenv("STRATA_WATCHDOG_MIN_S");
    if (test_min && atof(test_min) > 0) min_s = atof(test_min);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, watch, NULL) != 0)
        STRATA_WARN("train", "could not start the watchdog thread: a run that hangs will not end by itself");
    pthread_attr_destroy(&attr);
}
