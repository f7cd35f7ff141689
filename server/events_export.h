/* events_export.h - ps-server's /metrics figures as TensorBoard event files (events-dir).
 *
 * A thread renders the process's metrics (metrics.h, what /metrics serves) every
 * events-interval-s seconds and writes them, as one Event of scalars, to
 * EVENTS_DIR/ps-<task>; the step is the second since the server started, the wall time the
 * sample's, so TensorBoard's "wall" and "step" axes both line up with the workers' runs. Tags
 * (docs/operations.md, "TensorBoard event files"), from a metric psd_NAME with labels k=v:
 *   gauge      NAME[/k=v,...]                 its value
 *   counter    NAME_per_s[/k=v,...]           the increase per second over the interval
 *              (NAME without _total)
 *   histogram  NAME_per_s, NAME_p50, NAME_p99 observations per second and the median and 99th
 *              percentile of those in the interval (interpolated within a bucket)
 */
#ifndef PSD_SERVER_EVENTS_EXPORT_H
#define PSD_SERVER_EVENTS_EXPORT_H

#include <stddef.h>

typedef struct events_export events_export;

/* Opens EVENTS_DIR/ps-<task> (created when missing). Returns 0, or -1 with a message in err
 * (an unwritable directory). */
int events_export_open(events_export **out, const char *dir, int task, int interval_s, char *err,
                       size_t errlen);

/* Starts the sampling thread. Returns 0 or -1 (logged). */
int events_export_start(events_export *x);

/* Stops the thread, writes a last sample and closes the files; NULL is a no-op. */
void events_export_close(events_export *x);

#endif /* PSD_SERVER_EVENTS_EXPORT_H */
