/* train_events.h - ps-worker's training figures as TensorBoard event files (--logdir).
 *
 * The run directory of a worker task is LOGDIR/worker-<i> (LOGDIR/chief-<i> for a chief);
 * the step of every record is the worker's global step. Tags (docs/operations.md, "TensorBoard
 * event files"):
 *   every events-every steps, the means over those steps:
 *     train/loss, train/accuracy, train/samples_per_s, train/step_ms, train/comm_share,
 *     train/lost_pushes (this worker's acknowledged pushes lost to server restarts, so far)
 *   at each progress log line (log-every): staleness/max, staleness/waits, staleness/wait_ms
 *   at each evaluation (worker 0): test/loss, test/accuracy
 *   every histogram-every steps (0: never): weights/<param> and gradients/<param> histograms
 * With events-every equal to log-every, the train/ figures are the values of the progress log
 * lines.
 *
 * Every function takes NULL (no --logdir) and then does nothing. */
#ifndef WORKER_TRAIN_EVENTS_H
#define WORKER_TRAIN_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "psclient.h"

#include "model.h"

typedef struct train_events train_events;

/* Opens the run directory of task role:index under logdir (created when missing). Returns
 * 0, or -1 with a message in err (an unwritable directory). */
int train_events_open(train_events **out, const char *logdir, const char *role, int index,
                      int64_t every, int64_t histogram_every, char *err, size_t errlen);

/* Writes what is left and closes the files. */
void train_events_close(train_events *e);

/* Training starts at t_start_ns (monotonic), with model m and client c. */
void train_events_begin(train_events *e, ps_client *c, model *m, uint64_t t_start_ns);

/* One step done: done_steps is the global step after it, comm_ns its time blocked on the
 * cluster, now_ns the monotonic time at its end. */
void train_events_step(train_events *e, int64_t done_steps, const model_stats *st, int batch,
                       uint64_t comm_ns, uint64_t now_ns);

/* The staleness the servers observed, as of a progress log line at step. */
void train_events_staleness(train_events *e, int64_t step, const ps_staleness_stats *ss);

/* An evaluation on the test set at step. */
void train_events_eval(train_events *e, int64_t step, double loss, double accuracy);

#endif /* WORKER_TRAIN_EVENTS_H */
