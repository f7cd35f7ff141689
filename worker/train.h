/* train.h - the training loop of ps-worker over the parameter servers.
 *
 * Per step: get the parameters (a pull, or the reply of the previous step's
 * push-pull), forward/backward on a minibatch of this worker's shard, push
 * the gradients (each as soon as the backward pass has produced it), clock.
 * The cluster is reached only through libpsclient's public API.
 */
#ifndef WORKER_TRAIN_H
#define WORKER_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "psclient.h"

#include "backend.h"
#include "data.h"
#include "model.h"

/* Exit codes of ps-worker. */
#define TRAIN_EXIT_OK 0
#define TRAIN_EXIT_FAILED 1 /* cluster or runtime failure */
#define TRAIN_EXIT_CONFIG 2 /* bad flag, file or data */

typedef struct train_config {
    model_config model;
    const char *model_name; /* variable name prefix */
    int batch_size;
    int epochs;
    int64_t steps; /* > 0 overrides epochs */
    ps_optimizer optimizer;
    ps_dtype embed_dtype;    /* --model embbag-mlp: how the servers store the table's rows */
    uint64_t embed_ram_rows; /* --model embbag-mlp: the table's ram_rows (0: all in RAM) */
    double lr;
    double momentum;
    bool nesterov;
    int staleness; /* PS_STALENESS_DEFAULT, _ASYNC, _BSP or s > 0 */
    bool fused_push_pull;
    bool step_call; /* one Step request per server per step (ps_step) */
    bool overlap;   /* with step_call: pushes per layer group during backward (train.c) */
    bool prefetch;  /* with overlap, ASP/SSP: the next step's parameters while one computes */
    uint64_t seed;
    int64_t eval_every; /* steps; 0 = every epoch */
    int64_t log_every;
    bool progress_bar;
    const char *save_model; /* NULL or "" = none */
    int64_t done_wait_ms;
    int64_t progress_every; /* steps between progress records; 0 = no record, no resume */
    int slow_worker;        /* shard index that sleeps slow_delay_ms per step, -1 none */
    int64_t slow_delay_ms;  /* a straggler, for staleness experiments */
    double target_accuracy; /* > 0: report when evaluation first reaches it */
    /* --logdir's event files (train_events.h), or NULL */
    struct train_events *events;
    /* who am I */
    int shard_index; /* 0 .. shard_count-1; 0 evaluates */
    int shard_count;
} train_config;

/* Summary of a run. */
typedef struct train_result {
    int64_t first_step; /* > 0: resumed there, as recorded by the cluster */
    int64_t steps;      /* run by this process (from first_step) */
    int64_t skipped;    /* steps the barrier passed while this worker was evicted */
    uint64_t samples;
    double wall_s;              /* training loop only */
    double samples_per_s;       /* this worker */
    double comm_ms_per_step;    /* time blocked on the cluster per step */
    double compute_ms_per_step; /* the rest of the step */
    double wait_ms_per_step;    /* of comm: blocked for prefetched parameters (overlap) */
    double final_loss;          /* mean training loss of the last log window */
    double test_accuracy;       /* worker 0 only, else -1 */
    double test_loss;
    double time_to_target_s; /* seconds until target_accuracy was first reached, -1 never */
    int64_t staleness_max;   /* largest staleness the servers saw for the first variable */
    /* worker 0: acknowledged pushes the cluster lost to server restarts (the workers' own
     * counts added up), -1 unknown */
    int64_t lost_updates;
} train_result;

/* Set asynchronously (signal handler) to stop the loop after the current step. */
extern volatile int train_stop_signal;

/* Progress: every progress_every steps each worker records the steps it has done (their
 * pushes acknowledged and clocked) in its own slot of "<model_name>/progress_of_<count>", a
 * float variable updated by SGD with rate 1 (a push of recorded - done sets the slot to done),
 * with an asynchronous push: no round trip is waited for per step. The servers checkpoint it
 * like any variable. At start a worker reads its slot and resumes there (same epoch, same
 * position in the epoch's deterministic order); when it finishes it sets the slot back to 0,
 * so that a later run with the same model name on the same servers starts at 0. */

/* Creates the variables (idempotent), trains, and on shard 0 waits for the
 * other workers, evaluates on `test` and prints the final line
 * "test_accuracy=..." on stdout, and saves the model if asked. Logs progress.
 * Returns a TRAIN_EXIT_* code (errors logged). */
/* Creates (idempotently) the variable of each of m's parameters, vars[i] for parameter i: its
 * shape, initialized once by its owning server (Glorot-uniform for a kernel, zeros else, seed
 * cfg->seed + i), with cfg's optimizer, learning rate, momentum, Nesterov and staleness.
 * Returns PS_OK, or the status of the first create that failed (logged as "creating variable
 * NAME: status: message"; the variables before it stay made). */
int train_create_param_vars(ps_client *client, model *m, const train_config *cfg, ps_var **vars);

/* Creates (idempotently) variable `name` of `count` float slots, one per worker, each changed
 * only by its own worker: zeros, SGD at learning rate 1 (pushing -d adds d), asynchronous.
 * Returns PS_OK, or the create's status (logged as above). */
int train_create_slots_var(ps_client *client, const char *name, int count, ps_var **out);

/* Waits for the operations ops[0..n) of parameters 0..n-1 (NULL ones skipped), destroys them
 * and clears the slots; returns the first failure, logged as "WHAT PARAM: status: message". */
int train_wait_param_ops(model *m, ps_op **ops, int n, const char *what);

int train_run(ps_client *client, backend *be, const train_config *cfg, const dataset *train,
              const dataset *test, train_result *res);

/* Learning rate used when cfg->lr is 0: the optimizer's usual default. */
double train_default_lr(ps_optimizer opt);

#endif /* WORKER_TRAIN_H */
