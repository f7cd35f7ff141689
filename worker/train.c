/* train.c - the training loop of train.h. */
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "optimizers.h"
#include "timeutil.h"
#include "train_events.h"

volatile int train_stop_signal = 0;

/* Push groups of a BSP step at most: a server gets at most this many requests per step (each
 * more only beyond chunk-bytes). */
#define OVERLAP_MAX_GROUPS 3

/* Bookkeeping of one run. */
typedef struct trainer {
    ps_client *client;
    backend *be;
    const train_config *cfg;
    model *m;
    ps_var *vars[2 * MODEL_MAX_LAYERS];
    ps_var *done_var;
    ps_var *lost_var; /* "<model>/lost_pushes_of_<count>": each worker's own lost pushes */
    /* progress record (train.h): the slot's value once every push started has applied */
    ps_var *progress_var; /* NULL when cfg->progress_every is 0 */
    ps_op *progress_op;   /* the push in flight, if any */
    float progress_delta; /* its gradient: stays valid until it completes */
    int64_t recorded;
    ps_op *ops[2 * MODEL_MAX_LAYERS];
    bool fused; /* push-pull: the reply carries the next step's parameters */
    bool step;  /* ps_step: one request per server carries the step's pushes, clock, pulls */
    ps_step_item items[2 * MODEL_MAX_LAYERS];
    /* overlap (train.h): layers' gradients go out in push groups as backward produces them;
     * group 0 (the first layers, produced last) goes out after the pass with the clock */
    bool overlap;
    /* With a bound, whose reads must be at the clock of the step that uses them: */
    bool prefetch; /* SSP: the next step's parameters are fetched while a step computes */
    /* ASP: each step's Step (gradients, clock, the parameters after them) goes out after its
     * backward pass and completes while the next step computes; its parameters serve the step
     * after that (final_pulls) */
    bool pipelined;
    bool final_pulls; /* final_op pulls into the back buffers */
    int ngroups;
    int group_of[2 * MODEL_MAX_LAYERS];  /* parameter -> push group */
    int group_first[OVERLAP_MAX_GROUPS]; /* its parameters: [first, first + count) */
    int group_count[OVERLAP_MAX_GROUPS];
    int group_left[OVERLAP_MAX_GROUPS];   /* gradients not yet delivered this step */
    ps_op *group_ops[OVERLAP_MAX_GROUPS]; /* push groups in flight */
    ps_op *prefetch_op;                   /* the next step's parameters, into host_back */
    ps_op *final_op;                      /* pipelined or with a prefetch: the last step's Step */
    /* The next step's prefetch starts once the back buffers are free (this step's parameters
     * swapped in) and the previous step's pushes and clock are acknowledged (final_op's
     * callback), whichever comes last; under pf_lock. */
    pthread_mutex_t pf_lock;
    bool pf_wanted;      /* buffers free, waiting for final_op */
    bool pf_final_done;  /* final_op has completed */
    int pf_error;        /* a prefetch the callback could not start */
    int64_t clock_acked; /* the client's clock when final_op's predecessor was done */
    uint64_t send_ns;    /* this step's time starting push groups */
    int failed_param;
    int failed_status;
    /* progress */
    bool bar_drawn;
    uint64_t bar_last_ns;
} trainer;

double train_default_lr(ps_optimizer opt)
{
    switch ((int)opt) {
#define PS_OPTIMIZER_LR_(ID, name, value, lr)                                                      \
    case value:                                                                                    \
        return lr;
        PS_OPTIMIZERS(PS_OPTIMIZER_LR_)
#undef PS_OPTIMIZER_LR_
    }
    return 0.01;
}

static double secs(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* Clears the progress bar line so that a log line starts at column 0. */
static void bar_clear(trainer *t)
{
    if (t->bar_drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        t->bar_drawn = false;
    }
}

static void bar_draw(trainer *t, int64_t step, int64_t total, int epoch, int epochs, double loss,
                     double sps, bool force)
{
    uint64_t now = time_now_ns();
    if (!force && now - t->bar_last_ns < 100000000u)
        return;
    t->bar_last_ns = now;
    enum { WIDTH = 30 };
    double frac = total > 0 ? (double)step / (double)total : 0.0;
    int fill = (int)(frac * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[WIDTH] = '\0';
    fprintf(stderr,
            "\r\033[K[%s] %3d%% epoch %d/%d step %" PRId64 "/%" PRId64 " loss %.4f %.0f samples/s",
            bar, (int)(frac * 100.0), epoch, epochs, step, total, loss, sps);
    fflush(stderr);
    t->bar_drawn = true;
}

/* Exit code for a failed client call: a conflict with an existing variable or a bad
 * argument is the user's configuration; anything else is a runtime failure. */
static int client_failure(int status)
{
    return status == PS_ALREADY_EXISTS || status == PS_INVALID_ARGUMENT ? TRAIN_EXIT_CONFIG
                                                                        : TRAIN_EXIT_FAILED;
}

static int create_variables(trainer *t)
{
    const train_config *cfg = t->cfg;
    int rc = train_create_param_vars(t->client, t->m, cfg, t->vars);
    if (rc != PS_OK) {
        if (rc == PS_ALREADY_EXISTS)
            log_error("a variable of that name exists with other settings: use another "
                      "--model-name or restart the servers");
        return client_failure(rc);
    }
    /* Completion counters, one slot per worker: each worker adds 1 to its own slot at the end
     * (SGD with rate 1 on a gradient of -1). Worker 0 waits until every slot has reached its
     * own, whenever the others finished, even before worker 0 started; with a server kept
     * across runs, the k-th run waits for every slot to reach k. The worker count is in the
     * name so that runs with another count do not collide. */
    char name[96];
    snprintf(name, sizeof(name), "%s/workers_done_of_%d", cfg->model_name, cfg->shard_count);
    rc = train_create_slots_var(t->client, name, cfg->shard_count, &t->done_var);
    if (rc != PS_OK)
        return client_failure(rc);
    /* Lost-update slots, one per worker: each sets its own to the count of its acknowledged
     * pushes that server restarts lost, before it marks itself done; worker 0 adds them up. */
    snprintf(name, sizeof(name), "%s/lost_pushes_of_%d", cfg->model_name, cfg->shard_count);
    rc = train_create_slots_var(t->client, name, cfg->shard_count, &t->lost_var);
    if (rc != PS_OK)
        return client_failure(rc);
    if (cfg->progress_every <= 0)
        return TRAIN_EXIT_OK;
    /* Progress slots, one per worker, updated like the completion counters (train.h). */
    snprintf(name, sizeof(name), "%s/progress_of_%d", cfg->model_name, cfg->shard_count);
    rc = train_create_slots_var(t->client, name, cfg->shard_count, &t->progress_var);
    if (rc != PS_OK)
        return client_failure(rc);
    return TRAIN_EXIT_OK;
}

int train_create_param_vars(ps_client *client, model *m, const train_config *cfg, ps_var **vars)
{
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        ps_var_spec spec;
        ps_var_spec_init(&spec, p->name);
        spec.dtype = PS_FLOAT32;
        spec.ndims = p->ndims;
        for (int d = 0; d < p->ndims; d++)
            spec.dims[d] = p->dims[d];
        /* Initialized once by the owning server (idempotent create), not by every worker. */
        spec.initializer = p->is_kernel ? PS_INIT_GLOROT_UNIFORM : PS_INIT_ZEROS;
        spec.seed = cfg->seed + (uint64_t)i;
        spec.optimizer = cfg->optimizer;
        spec.learning_rate = cfg->lr;
        spec.momentum = cfg->momentum;
        spec.nesterov = cfg->nesterov;
        spec.staleness = cfg->staleness;
        int rc = ps_var_create(client, &spec, &vars[i]);
        if (rc != PS_OK) {
            log_error("creating variable %s: %s: %s", p->name, ps_strerror(rc), ps_last_error());
            return rc;
        }
    }
    return PS_OK;
}

int train_create_slots_var(ps_client *client, const char *name, int count, ps_var **out)
{
    ps_var_spec spec;
    ps_var_spec_init(&spec, name);
    spec.ndims = 1;
    spec.dims[0] = (uint64_t)count;
    spec.initializer = PS_INIT_ZEROS;
    spec.optimizer = PS_OPT_SGD;
    spec.learning_rate = 1.0;
    spec.staleness = PS_STALENESS_ASYNC;
    int rc = ps_var_create(client, &spec, out);
    if (rc != PS_OK)
        log_error("creating variable %s: %s: %s", name, ps_strerror(rc), ps_last_error());
    return rc;
}

/* Steps a float slot counts exactly (2^24). */
#define PROGRESS_MAX_STEPS 16777216

/* Reads this worker's progress slot into t->recorded. */
static int progress_read(trainer *t)
{
    float v = 0.0f;
    int rc = ps_pull_range(t->client, t->progress_var, (uint64_t)t->cfg->shard_index, 1, &v);
    if (rc != PS_OK) {
        log_error("pull %s: %s: %s", ps_var_name(t->progress_var), ps_strerror(rc),
                  ps_last_error());
        return rc;
    }
    t->recorded = isfinite(v) && v > 0.0f ? (int64_t)llroundf(v) : 0;
    return PS_OK;
}

/* Waits for the progress push in flight, if any (after progress_every steps it is long done). */
static int progress_wait(trainer *t)
{
    if (t->progress_op == NULL)
        return PS_OK;
    int rc = ps_op_wait(t->progress_op);
    if (rc != PS_OK)
        log_error("push %s: %s: %s", ps_var_name(t->progress_var), ps_strerror(rc),
                  ps_op_message(t->progress_op));
    ps_op_destroy(t->progress_op);
    t->progress_op = NULL;
    return rc;
}

/* Sets this worker's slot to `steps`: asynchronously, or blocking when `wait`. SGD with rate 1
 * subtracts the gradient, so the gradient is the recorded value minus the new one. */
static int progress_set(trainer *t, int64_t steps, bool wait)
{
    int rc = progress_wait(t);
    if (rc != PS_OK || steps == t->recorded)
        return rc;
    t->progress_delta = (float)(t->recorded - steps);
    rc = ps_push_async(t->client, t->progress_var, (uint64_t)t->cfg->shard_index, 1,
                       &t->progress_delta, NULL, NULL, &t->progress_op);
    if (rc != PS_OK) {
        log_error("push %s: %s: %s", ps_var_name(t->progress_var), ps_strerror(rc),
                  ps_last_error());
        return rc;
    }
    t->recorded = steps;
    return wait ? progress_wait(t) : PS_OK;
}

/* Pulls every parameter (all at once, asynchronously) into the host copies. */
static int pull_all(trainer *t)
{
    int n = model_num_params(t->m);
    int rc = PS_OK, started = 0;
    for (int i = 0; i < n; i++) {
        model_param *p = model_get_param(t->m, i);
        rc = ps_pull_async(t->client, t->vars[i], 0, p->numel, p->host, NULL, NULL, &t->ops[i]);
        if (rc != PS_OK) {
            log_error("pull %s: %s: %s", p->name, ps_strerror(rc), ps_last_error());
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        int st = ps_op_wait(t->ops[i]);
        if (st != PS_OK && rc == PS_OK) {
            log_error("pull %s: %s: %s", model_get_param(t->m, i)->name, ps_strerror(st),
                      ps_op_message(t->ops[i]));
            rc = st;
        }
        ps_op_destroy(t->ops[i]);
        t->ops[i] = NULL;
    }
    return rc;
}

/* model_train_step callback: sends parameter i's gradient as soon as it exists. */
static int on_grad(model *m, int i, void *arg)
{
    trainer *t = arg;
    model_param *p = model_get_param(m, i);
    int rc;
    if (t->fused)
        rc = ps_push_pull_async(t->client, t->vars[i], 0, p->numel, p->grad_host, p->host, NULL,
                                NULL, &t->ops[i]);
    else
        rc =
            ps_push_async(t->client, t->vars[i], 0, p->numel, p->grad_host, NULL, NULL, &t->ops[i]);
    if (rc != PS_OK) {
        t->failed_param = i;
        t->failed_status = rc;
        log_error("push %s: %s: %s", p->name, ps_strerror(rc), ps_last_error());
        return rc;
    }
    return 0;
}

int train_wait_param_ops(model *m, ps_op **ops, int n, const char *what)
{
    int rc = PS_OK;
    for (int i = 0; i < n; i++) {
        if (ops[i] == NULL)
            continue;
        int st = ps_op_wait(ops[i]);
        if (st != PS_OK && rc == PS_OK) {
            log_error("%s %s: %s: %s", what, model_get_param(m, i)->name, ps_strerror(st),
                      ps_op_message(ops[i]));
            rc = st;
        }
        ps_op_destroy(ops[i]);
        ops[i] = NULL;
    }
    return rc;
}

/* Waits for every push started this step; returns the first failure. */
static int wait_pushes(trainer *t)
{
    return train_wait_param_ops(t->m, t->ops, model_num_params(t->m), "push");
}

/* The step's traffic in one request per server: every gradient, the clock, and (unless it is
 * the last step) the next step's parameters at the new clock, within the staleness bound. */
static int step_call(trainer *t, bool pull_next)
{
    int n = model_num_params(t->m);
    for (int i = 0; i < n; i++) {
        model_param *p = model_get_param(t->m, i);
        t->items[i] = (ps_step_item){.var = t->vars[i],
                                     .offset = 0,
                                     .count = p->numel,
                                     .grad = p->grad_host,
                                     .dst = pull_next ? p->host : NULL};
    }
    int rc = ps_step(t->client, t->items, (size_t)n, PS_STEP_CLOCK);
    if (rc != PS_OK)
        log_error("step: %s: %s", ps_strerror(rc), ps_last_error());
    return rc;
}

/* ---- overlap ---- */

/* Splits the parameters into push groups: the layers with parameters, in order, cut into at most
 * OVERLAP_MAX_GROUPS runs of about equal numbers of layers (a layer's kernel and bias always
 * together). Backward produces the last group first; group 0 holds the first layer. */
static void overlap_plan(trainer *t)
{
    int n = model_num_params(t->m);
    int layers = model_get_param(t->m, n - 1)->layer; /* 1-based, counting layers with params */
    t->ngroups = layers < OVERLAP_MAX_GROUPS ? layers : OVERLAP_MAX_GROUPS;
    for (int g = 0; g < t->ngroups; g++) {
        t->group_first[g] = n;
        t->group_count[g] = 0;
    }
    for (int i = 0; i < n; i++) {
        int g = (model_get_param(t->m, i)->layer - 1) * t->ngroups / layers;
        t->group_of[i] = g;
        if (i < t->group_first[g])
            t->group_first[g] = i;
        t->group_count[g]++;
    }
}

/* Items of group g's pushes, from items[first] on (pulls: none). */
static int group_items(trainer *t, int g, ps_step_item *items)
{
    int k = 0;
    for (int i = t->group_first[g]; i < t->group_first[g] + t->group_count[g]; i++) {
        model_param *p = model_get_param(t->m, i);
        items[k++] = (ps_step_item){.var = t->vars[i], .count = p->numel, .grad = p->grad_host};
    }
    return k;
}

/* model_train_step callback with overlap: once every gradient of a group other than 0 is
 * there, its pushes go out in one asynchronous Step (no clock). */
static int overlap_on_grad(model *m, int i, void *arg)
{
    (void)m;
    trainer *t = arg;
    int g = t->group_of[i];
    if (--t->group_left[g] > 0 || g == 0)
        return 0;
    uint64_t t0 = time_now_ns();
    ps_step_item items[2 * MODEL_MAX_LAYERS];
    int n = group_items(t, g, items);
    int rc = ps_step_async(t->client, items, (size_t)n, 0, NULL, NULL, &t->group_ops[g]);
    t->send_ns += time_now_ns() - t0;
    if (rc != PS_OK) {
        t->failed_param = i;
        t->failed_status = rc;
        log_error("push of layers' gradients (%s, ...): %s: %s", model_get_param(m, i)->name,
                  ps_strerror(rc), ps_last_error());
        return rc;
    }
    return 0;
}

/* Waits for the push groups in flight; returns the first failure. */
static int overlap_wait_groups(trainer *t)
{
    int rc = PS_OK;
    for (int g = 0; g < t->ngroups; g++) {
        if (t->group_ops[g] == NULL)
            continue;
        int st = ps_op_wait(t->group_ops[g]);
        if (st != PS_OK && rc == PS_OK) {
            log_error("push of layers' gradients: %s: %s", ps_strerror(st),
                      ps_op_message(t->group_ops[g]));
            rc = st;
        }
        ps_op_destroy(t->group_ops[g]);
        t->group_ops[g] = NULL;
    }
    return rc;
}

/* After the backward pass: once the other groups are acknowledged (a clock never reaches a
 * server before the pushes it closes), group 0's pushes and the clock in one Step per server,
 * with (pull_next) the next step's parameters at the new clock into the host copies. */
static int overlap_finish_step(trainer *t, bool pull_next)
{
    int rc = overlap_wait_groups(t);
    if (rc != PS_OK)
        return rc;
    int n = group_items(t, 0, t->items);
    if (pull_next) {
        for (int i = 0; i < n; i++)
            t->items[i].dst = model_get_param(t->m, i)->host;
        for (int i = t->group_count[0]; i < model_num_params(t->m); i++)
            t->items[n++] = (ps_step_item){.var = t->vars[i],
                                           .count = model_get_param(t->m, i)->numel,
                                           .dst = model_get_param(t->m, i)->host};
    }
    rc = ps_step(t->client, t->items, (size_t)n, PS_STEP_CLOCK);
    if (rc != PS_OK)
        log_error("step: %s: %s", ps_strerror(rc), ps_last_error());
    return rc;
}

static void final_done(ps_op *op, void *arg);

/* Waits for the last step's pushes and clock, if in flight. */
static int pipeline_wait(trainer *t)
{
    if (t->final_op == NULL)
        return PS_OK;
    int rc = ps_op_wait(t->final_op);
    if (rc != PS_OK)
        log_error("step: %s: %s", ps_strerror(rc), ps_op_message(t->final_op));
    ps_op_destroy(t->final_op);
    t->final_op = NULL;
    t->final_pulls = false;
    return rc;
}

/* Pipelined or with a prefetch, after the backward pass: once the previous step's Step is
 * acknowledged (its clock is the one this step's pushes belong to; the parameters it pulled
 * become the current ones), this step's gradients and the clock go out in one Step per server,
 * asynchronously, with (pull_next) the parameters after them into the back buffers. The next
 * step's backward pass writes the other gradient buffers: these stay untouched until the Step
 * completes. */
static int pipeline_push(trainer *t, bool pull_next)
{
    bool pulled = t->final_pulls;
    int rc = pipeline_wait(t);
    if (rc != PS_OK)
        return rc;
    if (pulled)
        model_params_swap(t->m);
    t->clock_acked = ps_client_clock(t->client);
    int n = model_num_params(t->m);
    for (int i = 0; i < n; i++) {
        model_param *p = model_get_param(t->m, i);
        t->items[i] = (ps_step_item){.var = t->vars[i],
                                     .count = p->numel,
                                     .grad = p->grad_host,
                                     .dst = pull_next ? p->host_back : NULL};
    }
    pthread_mutex_lock(&t->pf_lock);
    t->pf_final_done = false;
    pthread_mutex_unlock(&t->pf_lock);
    t->final_pulls = pull_next;
    rc = ps_step_async(t->client, t->items, (size_t)n, PS_STEP_CLOCK,
                       t->prefetch ? final_done : NULL, t, &t->final_op);
    if (rc != PS_OK) {
        log_error("step: %s: %s", ps_strerror(rc), ps_last_error());
        return rc;
    }
    model_grads_swap(t->m);
    return PS_OK;
}

/* Starts fetching the next step's parameters into the back buffers, at the clock of the next
 * step: the previous step's clock is acknowledged, this one's is not sent yet, so that is the
 * client's clock + 1 (a read within the staleness bound of the step that uses it). Called with
 * pf_lock held, from the training thread or final_op's callback. */
static int prefetch_start(trainer *t)
{
    int n = model_num_params(t->m);
    ps_step_item items[2 * MODEL_MAX_LAYERS];
    for (int i = 0; i < n; i++) {
        model_param *p = model_get_param(t->m, i);
        items[i] = (ps_step_item){.var = t->vars[i], .count = p->numel, .dst = p->host_back};
    }
    int rc = ps_pull_at_async(t->client, items, (size_t)n, ps_client_clock(t->client) + 1, NULL,
                              NULL, &t->prefetch_op);
    if (rc != PS_OK)
        log_error("prefetch of the next step's parameters: %s: %s", ps_strerror(rc),
                  ps_last_error());
    return rc;
}

/* final_op's callback: starts the prefetch if the training thread asked for it already. */
static void final_done(ps_op *op, void *arg)
{
    (void)op;
    trainer *t = arg;
    pthread_mutex_lock(&t->pf_lock);
    t->pf_final_done = true;
    if (t->pf_wanted) {
        t->pf_wanted = false;
        t->pf_error = prefetch_start(t);
    }
    pthread_mutex_unlock(&t->pf_lock);
}

/* The back buffers are free: the prefetch of the next step's parameters starts now, or once
 * the previous step's pushes and clock are acknowledged. */
static int prefetch_request(trainer *t)
{
    int rc = PS_OK;
    pthread_mutex_lock(&t->pf_lock);
    if (t->final_op == NULL || t->pf_final_done)
        rc = prefetch_start(t);
    else
        t->pf_wanted = true;
    pthread_mutex_unlock(&t->pf_lock);
    return rc;
}

/* Waits for the prefetch in flight, if any; with `use`, its parameters become the current ones
 * (else they are dropped). */
static int prefetch_finish(trainer *t, bool use)
{
    if (t->prefetch_op == NULL) {
        int rc = t->pf_error;
        t->pf_error = PS_OK;
        return rc;
    }
    int rc = ps_op_wait(t->prefetch_op);
    if (rc != PS_OK)
        log_error("prefetch of the next step's parameters: %s: %s", ps_strerror(rc),
                  ps_op_message(t->prefetch_op));
    ps_op_destroy(t->prefetch_op);
    t->prefetch_op = NULL;
    if (rc == PS_OK && use)
        model_params_swap(t->m);
    return rc;
}

/* Reads the completion slots into done (shard_count floats). */
static int read_done(trainer *t, float *done)
{
    int rc = ps_pull(t->client, t->done_var, done);
    if (rc != PS_OK)
        log_error("pull %s: %s: %s", ps_var_name(t->done_var), ps_strerror(rc), ps_last_error());
    return rc;
}

/* Adds 1 to this worker's completion slot. */
static int mark_done(trainer *t)
{
    int n = t->cfg->shard_count;
    float *grad = calloc((size_t)n, sizeof(float));
    if (grad == NULL) {
        log_error("out of memory");
        return PS_RESOURCE_EXHAUSTED;
    }
    grad[t->cfg->shard_index] = -1.0f;
    int rc = ps_push(t->client, t->done_var, grad);
    if (rc != PS_OK)
        log_error("push %s: %s: %s", ps_var_name(t->done_var), ps_strerror(rc), ps_last_error());
    free(grad);
    return rc;
}

/* Sets this worker's lost-update slot to its own count (SGD with rate 1: a push of
 * recorded - count sets it), so that a slot left by an earlier run is overwritten. */
static int set_lost_slot(trainer *t, uint64_t lost)
{
    uint64_t i = (uint64_t)t->cfg->shard_index;
    float v = 0.0f;
    int rc = ps_pull_range(t->client, t->lost_var, i, 1, &v);
    if (rc == PS_OK) {
        float delta = (isfinite(v) ? v : 0.0f) - (float)lost;
        if (delta != 0.0f)
            rc = ps_push_range(t->client, t->lost_var, i, 1, &delta);
    }
    if (rc != PS_OK)
        log_error("recording lost updates in %s: %s: %s", ps_var_name(t->lost_var), ps_strerror(rc),
                  ps_last_error());
    return rc;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Metrics of training (metrics.h), looked up once per run. */
static struct {
    metric *connected, *steps, *samples, *step_s, *pull_s, *compute_s, *push_s, *loss, *acc, *sps,
        *clock, *test_loss, *test_acc;
} wm;

static void worker_metrics_init(void)
{
    metric_family *phase = metrics_family(
        METRIC_HISTOGRAM, "psd_worker_step_phase_seconds",
        "Time of one training step's phases: pull (parameters), compute (forward, backward), "
        "push (gradients acknowledged, clock).",
        "phase", metrics_latency_buckets, metrics_latency_buckets_len);
    wm.connected = metrics_gauge("psd_worker_connected",
                                 "1 once the worker's first call to the cluster succeeded.");
    wm.steps = metrics_counter("psd_worker_steps_total", "Training steps finished.");
    wm.samples = metrics_counter("psd_worker_samples_total", "Training examples processed.");
    wm.step_s = metrics_histogram("psd_worker_step_seconds", "Time of one training step.",
                                  metrics_latency_buckets, metrics_latency_buckets_len);
    wm.pull_s = metrics_series1(phase, "pull");
    wm.compute_s = metrics_series1(phase, "compute");
    wm.push_s = metrics_series1(phase, "push");
    wm.loss = metrics_gauge("psd_worker_loss", "Training loss of the latest step.");
    wm.acc =
        metrics_gauge("psd_worker_train_accuracy", "Training accuracy of the latest step's batch.");
    wm.sps = metrics_gauge("psd_worker_samples_per_second",
                           "Examples per second over the latest log window (log-every steps).");
    wm.clock = metrics_gauge("psd_worker_clock", "Steps finished and clocked (the SSP clock).");
    wm.test_loss = metrics_gauge("psd_worker_test_loss", "Test loss at the latest evaluation.");
    wm.test_acc =
        metrics_gauge("psd_worker_test_accuracy", "Test accuracy at the latest evaluation.");
}

static void log_eval(int64_t step, int epoch, double loss, double acc, bool final)
{
    metric_set(wm.test_loss, loss);
    metric_set(wm.test_acc, acc);
    char fields[256];
    snprintf(fields, sizeof(fields),
             "\"step\":%" PRId64 ",\"epoch\":%d,\"test_loss\":%.5f,\"test_accuracy\":%.4f,"
             "\"final\":%s",
             step, epoch, loss, acc, final ? "true" : "false");
    log_fields(LOG_INFO, fields, "%s test_accuracy=%.4f test_loss=%.4f", final ? "final" : "eval",
               acc, loss);
}

static int evaluate(trainer *t, const dataset *test, double *loss, double *acc)
{
    if (model_evaluate(t->m, test, loss, acc) != 0) {
        log_error("evaluation: %s", model_errmsg(t->m));
        return -1;
    }
    return 0;
}

/* Worker 0: the cluster's updates lost to server restarts, once: the sum of the own counts
 * the workers that finished (done[i] at worker 0's) recorded in their slots. Returns it, -1
 * when it could not be read. */
static int64_t report_cluster_lost(trainer *t, const float *done)
{
    int n = t->cfg->shard_count;
    float *lost = calloc((size_t)n, sizeof(float));
    if (lost == NULL)
        return -1;
    int rc = ps_pull(t->client, t->lost_var, lost);
    if (rc != PS_OK) {
        log_warn("cannot read the workers' lost updates (%s): %s: %s", ps_var_name(t->lost_var),
                 ps_strerror(rc), ps_last_error());
        free(lost);
        return -1;
    }
    uint64_t total = 0;
    int counted = 0;
    for (int i = 0; i < n; i++) {
        if (done[i] < done[t->cfg->shard_index])
            continue;
        counted++;
        if (isfinite(lost[i]) && lost[i] > 0.0f)
            total += (uint64_t)llroundf(lost[i]);
    }
    free(lost);
    if (total > 0)
        log_warn("updates lost to server restarts, whole cluster: %" PRIu64
                 " acknowledged pushes (the sum of the own counts of the %d of %d workers that "
                 "finished)",
                 total, counted, n);
    return (int64_t)total;
}

/* Worker 0's end of run: wait for the others, pull the final model, evaluate, save. A worker
 * the servers evicted (dead, or silent for --worker-timeout-ms) is not waited for: the
 * servers' liveness is asked every LIVE_POLL_MS while some worker has not finished. */
#define LIVE_POLL_MS 500
static int finish_evaluator(trainer *t, const dataset *test, int epochs, train_result *res)
{
    const train_config *cfg = t->cfg;
    int n = cfg->shard_count;
    uint64_t deadline = time_now_ns() + (uint64_t)cfg->done_wait_ms * 1000000u;
    float *done = calloc((size_t)n, sizeof(float));
    unsigned char *live = malloc((size_t)n);
    unsigned char *told = calloc((size_t)n, 1);
    if (done == NULL || live == NULL || told == NULL) {
        log_error("out of memory");
        free(done);
        free(live);
        free(told);
        return TRAIN_EXIT_FAILED;
    }
    memset(live, 1, (size_t)n);
    bool logged = false;
    uint64_t next_poll = 0;
    int exit_code = TRAIN_EXIT_OK;
    for (;;) {
        if (read_done(t, done) != PS_OK) {
            exit_code = TRAIN_EXIT_FAILED;
            break;
        }
        int finished = 0, waiting = 0;
        for (int i = 0; i < n; i++)
            finished += done[i] >= done[cfg->shard_index];
        if (finished < n && time_now_ns() >= next_poll) {
            next_poll = time_now_ns() + LIVE_POLL_MS * 1000000ull;
            int rc = ps_cluster_workers_live(t->client, n, live);
            if (rc != PS_OK) {
                log_warn("cannot ask the servers which workers are live: %s: %s", ps_strerror(rc),
                         ps_last_error());
                memset(live, 1, (size_t)n);
            }
        }
        for (int i = 0; i < n; i++) {
            if (done[i] >= done[cfg->shard_index])
                continue;
            if (live[i]) {
                waiting++;
            } else if (!told[i]) {
                told[i] = 1;
                log_warn("worker %d died or was evicted before finishing: not waiting for it", i);
            }
        }
        if (waiting == 0) {
            if (finished < n)
                log_warn("%d of %d workers finished; evaluating without the %d that died", finished,
                         n, n - finished);
            break;
        }
        if (time_now_ns() >= deadline) {
            log_warn("%d of %d workers finished after %.1f s (--done-wait-ms): evaluating the "
                     "model as it is",
                     finished, n, (double)cfg->done_wait_ms / 1000.0);
            break;
        }
        if (train_stop_signal) {
            exit_code = TRAIN_EXIT_FAILED;
            break;
        }
        if (!logged) {
            log_info("waiting for the other workers to finish (%d of %d done)", finished, n);
            logged = true;
        }
        sleep_ms(50);
    }
    free(live);
    free(told);
    if (exit_code != TRAIN_EXIT_OK) {
        free(done);
        return exit_code;
    }
    res->lost_updates = report_cluster_lost(t, done);
    free(done);
    int rc = pull_all(t);
    if (rc != PS_OK)
        return client_failure(rc);
    if (model_upload_params(t->m) != 0) {
        log_error("%s", model_errmsg(t->m));
        return TRAIN_EXIT_FAILED;
    }
    double loss, acc;
    if (evaluate(t, test, &loss, &acc) != 0)
        return TRAIN_EXIT_FAILED;
    res->test_accuracy = acc;
    res->test_loss = loss;
    log_eval(res->first_step + res->steps, epochs, loss, acc, true);
    train_events_eval(cfg->events, res->first_step + res->steps, loss, acc);
    if (cfg->save_model != NULL && cfg->save_model[0] != '\0') {
        char err[512];
        if (model_save(t->m, cfg->save_model, err, sizeof(err)) != 0) {
            log_error("--save-model: %s", err);
            return TRAIN_EXIT_FAILED;
        }
        log_info("model saved to %s (%zu parameters)", cfg->save_model, model_total_params(t->m));
    }
    return TRAIN_EXIT_OK;
}

/* A worker other than 0 at its end: waits until worker 0, the evaluator, has finished
 * training too (its completion slot reached this worker's), or is gone (evicted: dead or
 * silent for worker-timeout-ms), or --done-wait-ms ran out. A run whose evaluator died must
 * not end quietly with 0: then this says so and fails. */
static int await_evaluator(trainer *t)
{
    const train_config *cfg = t->cfg;
    int n = cfg->shard_count;
    uint64_t start = time_now_ns();
    uint64_t deadline = start + (uint64_t)cfg->done_wait_ms * 1000000u;
    float *done = calloc((size_t)n, sizeof(float));
    unsigned char *live = malloc((size_t)n);
    if (done == NULL || live == NULL) {
        free(done);
        free(live);
        log_error("out of memory");
        return TRAIN_EXIT_FAILED;
    }
    int exit_code = TRAIN_EXIT_OK;
    bool logged = false;
    for (;;) {
        if (read_done(t, done) != PS_OK) {
            exit_code = TRAIN_EXIT_FAILED;
            break;
        }
        if (done[0] >= done[cfg->shard_index])
            break; /* it trained to the end: it evaluates and reports */
        int rc = ps_cluster_workers_live(t->client, n, live);
        if (rc != PS_OK) {
            log_warn("cannot ask the servers whether worker 0 is live: %s: %s", ps_strerror(rc),
                     ps_last_error());
        } else if (!live[0]) {
            /* Finished between the two reads? Worker 0 marks its completion slot (acknowledged)
             * before it tells the servers it finished, so a read after this one sees it. */
            if (read_done(t, done) == PS_OK && done[0] >= done[cfg->shard_index])
                break;
            log_error("worker 0, which evaluates the model, died or was evicted before finishing "
                      "(the servers no longer count it live): this run reports no test accuracy "
                      "unless worker 0 is restarted");
            exit_code = TRAIN_EXIT_FAILED;
            break;
        }
        if (time_now_ns() >= deadline) {
            log_warn("worker 0, which evaluates the model, had not finished after %.1f s "
                     "(--done-wait-ms): not waiting for it; it reports the test accuracy when "
                     "it does",
                     (double)cfg->done_wait_ms / 1000.0);
            break;
        }
        if (train_stop_signal) {
            exit_code = TRAIN_EXIT_FAILED;
            break;
        }
        if (!logged) {
            log_info("waiting for worker 0, which evaluates the model, to finish");
            logged = true;
        }
        sleep_ms(LIVE_POLL_MS);
    }
    free(done);
    free(live);
    return exit_code;
}

int train_run(ps_client *client, backend *be, const train_config *cfg, const dataset *train,
              const dataset *test, train_result *res)
{
    memset(res, 0, sizeof(*res));
    res->test_accuracy = -1.0;
    res->lost_updates = -1;
    res->time_to_target_s = -1.0;
    res->test_loss = -1.0;
    trainer t;
    memset(&t, 0, sizeof(t));
    t.client = client;
    t.be = be;
    t.cfg = cfg;
    const bool evaluator = cfg->shard_index == 0;

    char err[512];
    if (model_create(be, &cfg->model, cfg->batch_size, cfg->model_name, &t.m, err, sizeof(err)) !=
        0) {
        log_error("%s", err);
        return TRAIN_EXIT_CONFIG;
    }
    data_shard shard;
    if (data_shard_init(&shard, train->n, cfg->shard_index, cfg->shard_count, cfg->seed) != 0) {
        log_error("cannot give worker %d of %d a shard of the %zu training examples",
                  cfg->shard_index, cfg->shard_count, train->n);
        model_destroy(t.m);
        return TRAIN_EXIT_CONFIG;
    }
    pthread_mutex_init(&t.pf_lock, NULL);
    int exit_code = TRAIN_EXIT_FAILED;
    size_t in_dim = (size_t)cfg->model.sizes[0];
    float *xb = backend_host_alloc(be, (size_t)cfg->batch_size * in_dim * sizeof(float));
    int32_t *yb = backend_host_alloc(be, (size_t)cfg->batch_size * sizeof(int32_t));
    if (xb == NULL || yb == NULL) {
        log_error("out of memory for a batch of %d", cfg->batch_size);
        goto out;
    }

    int batch = cfg->batch_size;
    if ((size_t)batch > shard.n)
        batch = (int)shard.n;
    int64_t steps_per_epoch = (int64_t)(shard.n / (size_t)batch);
    int64_t total = cfg->steps > 0 ? cfg->steps : steps_per_epoch * cfg->epochs;
    int epochs_shown = (int)((total + steps_per_epoch - 1) / steps_per_epoch);

    worker_metrics_init();
    int rc = create_variables(&t);
    if (rc != TRAIN_EXIT_OK) {
        exit_code = rc;
        goto out;
    }
    metric_set(wm.connected, 1); /* /readyz: the cluster answered */
    int64_t first = 0;
    if (t.progress_var != NULL && total > PROGRESS_MAX_STEPS) {
        log_warn("%" PRId64 " steps are more than a progress record counts exactly (%d): "
                 "progress is neither recorded nor resumed",
                 total, PROGRESS_MAX_STEPS);
        t.progress_var = NULL;
    }
    if (t.progress_var != NULL) {
        if ((rc = progress_read(&t)) != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
        if (t.recorded > total) {
            log_warn("the cluster recorded step %" PRId64
                     " for worker %d, beyond this run's %" PRId64
                     " steps (other --steps, --epochs or --batch-size?): starting at step 0",
                     t.recorded, cfg->shard_index, total);
        } else if (t.recorded > 0) {
            first = t.recorded;
            log_info("resuming at step %" PRId64 " of %" PRId64 " (epoch %" PRId64
                     ") as recorded by the cluster",
                     first, total,
                     first < total ? first / steps_per_epoch + 1 : (int64_t)epochs_shown);
        }
    }
    res->first_step = first;
    /* The bound the servers enforce (the spec may have asked for their default). Without one,
     * the parameters a push-pull returns are as good as a pull's, one round trip earlier. */
    int bound = ps_var_staleness_bound(t.vars[0]);
    t.step = cfg->step_call;
    t.fused = !t.step && cfg->fused_push_pull && bound < 0;
    /* Overlap rides on the Step call. A prefetch needs a bound a read one clock ahead meets
     * without waiting for this worker's own clock: none (ASP) or s >= 1 (SSP). Under BSP the
     * next parameters are the aggregate of every worker's step: they come after the clock. */
    t.overlap = t.step && cfg->overlap;
    t.prefetch = t.overlap && cfg->prefetch && bound > 0;
    t.pipelined = t.overlap && cfg->prefetch && bound < 0;
    if (t.overlap)
        overlap_plan(&t);
    if ((t.prefetch || t.pipelined) && model_double_buffer(t.m) != 0) {
        log_error("%s", model_errmsg(t.m));
        goto out;
    }
    char layers[160];
    model_format_layers(&cfg->model, layers, sizeof(layers));
    log_info("training %s (layers %s, %zu parameters) on shard %d of %d: %zu examples, batch %d, "
             "%" PRId64 " steps (%" PRId64 " per epoch), %s lr %g, staleness %d, backend %s%s",
             cfg->model_name, layers, model_total_params(t.m), cfg->shard_index, cfg->shard_count,
             shard.n, batch, total, steps_per_epoch, ps_optimizer_name(cfg->optimizer), cfg->lr,
             bound, backend_name(be),
             t.pipelined  ? ", pipelined steps"
             : t.prefetch ? ", prefetch"
             : t.overlap  ? ", pushes per layer group"
             : t.step     ? ", one step call per server"
             : t.fused    ? ", fused push-pull"
                          : "");

    if (t.fused || t.step) {
        rc = pull_all(&t);
        if (rc != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
    }
    /* Context switches of the whole process (all its threads) while training: the hand-offs
     * between the training thread and the client library's I/O threads, per step. */
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    uint64_t t_start = time_now_ns();
    train_events_begin(cfg->events, client, t.m, t_start);
    uint64_t comm_ns = 0, win_comm_ns = 0, win_start = t_start;
    uint64_t wait_ns = 0; /* of comm_ns: blocked for the prefetched parameters */
    double win_loss = 0.0, win_correct = 0.0;
    int64_t win_steps = 0;
    uint64_t win_samples = 0;
    double last_loss = 0.0, last_sps = 0.0, bar_loss = 0.0;
    int64_t step = first;
    /* This process's clock minus its step count, from its first clock: a later clock beyond
     * that means the servers moved this worker on (below). */
    int64_t clock_base = INT64_MIN;
    int shuffled = -1; /* epochs shuffled so far: a resumed run replays them (data.h) */
    for (; step < total; step++) {
        if (train_stop_signal) {
            bar_clear(&t);
            log_warn("stopping at step %" PRId64 " on a signal", step);
            goto out;
        }
        int64_t in_epoch = step % steps_per_epoch;
        int epoch = (int)(step / steps_per_epoch);
        while (shuffled < epoch)
            data_shard_shuffle(&shard, (uint64_t)++shuffled);
        data_gather(train, shard.index + (size_t)in_epoch * (size_t)batch, (size_t)batch, xb, yb);

        uint64_t c0 = time_now_ns();
        if (!t.fused && !t.step && (rc = pull_all(&t)) != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
        if (t.prefetch && (rc = prefetch_finish(&t, true)) != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
        uint64_t c1 = time_now_ns();
        if (model_upload_params(t.m) != 0 || model_set_batch(t.m, xb, yb, batch) != 0) {
            log_error("%s", model_errmsg(t.m));
            goto out;
        }
        /* The back buffers are free (the step before last computed with them): fill them with
         * the next step's parameters while this one computes. */
        if (t.prefetch && step + 1 < total && (rc = prefetch_request(&t)) != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
        model_stats st;
        t.send_ns = 0;
        for (int g = 0; g < t.ngroups; g++)
            t.group_left[g] = t.group_count[g];
        rc = model_train_step(t.m,
                              t.prefetch || t.pipelined ? NULL
                              : t.overlap               ? overlap_on_grad
                              : t.step                  ? NULL
                                                        : on_grad,
                              &t, &st);
        uint64_t c2 = time_now_ns();
        int prc = t.overlap ? overlap_wait_groups(&t) : t.step ? PS_OK : wait_pushes(&t);
        if (rc != 0) {
            if (rc < 0)
                log_error("%s", model_errmsg(t.m));
            exit_code = rc > 0 ? client_failure(rc) : TRAIN_EXIT_FAILED;
            goto out;
        }
        if (prc != PS_OK) {
            exit_code = client_failure(prc);
            goto out;
        }
        if (t.prefetch || t.pipelined) {
            rc = pipeline_push(&t, t.pipelined && step + 1 < total);
        } else if (t.overlap) {
            rc = overlap_finish_step(&t, step + 1 < total);
        } else if (t.step) {
            rc = step_call(&t, step + 1 < total);
        } else if ((rc = ps_clock(client, NULL)) != PS_OK) {
            log_error("clock: %s: %s", ps_strerror(rc), ps_last_error());
        }
        if (rc != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
        int64_t done_steps = step + 1;
        /* Steps acknowledged and clocked, and the client's clock after them: pipelined or with
         * a prefetch, this step's pushes and clock were only sent, the previous step's are done. */
        bool async = t.prefetch || t.pipelined;
        int64_t acked = async ? step : done_steps;
        int64_t clk = async ? t.clock_acked : ps_client_clock(client);
        if (async && step == first) {
            /* nothing acknowledged yet */
        } else if (clock_base == INT64_MIN) {
            clock_base = clk - acked;
        } else if (bound >= 0 && clk - clock_base > acked) {
            /* Evicted (silent past the servers' worker-timeout-ms: paused, stalled) and back:
             * the servers re-registered this worker at the clock the others had reached, and
             * the barrier went on without it meanwhile. Take up the run where it stands, so
             * that this worker's steps and clocks end with the others'. */
            int64_t to = clk - clock_base < total ? clk - clock_base : total;
            bar_clear(&t);
            log_warn("this worker was evicted and has rejoined: the servers moved its clock on "
                     "by %" PRId64 " to %" PRId64
                     ", where the other workers are; its steps %" PRId64 " to %" PRId64
                     " went by without it (not trained): it continues with %" PRId64 " of %" PRId64
                     " steps done",
                     clk - clock_base - acked, clk, acked + 1, to, to, total);
            res->skipped += to - acked;
            /* With a prefetch, this step was sent at the new clock: one more done. */
            done_steps = async && to < total ? to + 1 : to;
            acked = to;
            step = done_steps - 1;
            /* Parameters fetched for the step that went by are not this worker's next ones. */
            if (async && ((rc = prefetch_finish(&t, false)) != PS_OK ||
                          (step + 1 < total && (rc = pull_all(&t)) != PS_OK))) {
                exit_code = client_failure(rc);
                goto out;
            }
        }
        /* Steps whose pushes are acknowledged and clocked: record them, without waiting. */
        if (t.progress_var != NULL && acked % cfg->progress_every == 0 && acked < total &&
            acked > 0 && (rc = progress_set(&t, acked, false)) != PS_OK) {
            exit_code = client_failure(rc);
            goto out;
        }
        uint64_t c3 = time_now_ns();
        if (cfg->slow_worker == cfg->shard_index && cfg->slow_delay_ms > 0) {
            struct timespec ts = {(time_t)(cfg->slow_delay_ms / 1000),
                                  (long)(cfg->slow_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        metric_observe(wm.pull_s, (double)(c1 - c0) * 1e-9);
        metric_observe(wm.compute_s, (double)(c2 - c1) * 1e-9);
        metric_observe(wm.push_s, (double)(c3 - c2) * 1e-9);
        metric_observe(wm.step_s, (double)(c3 - c0) * 1e-9);
        metric_inc(wm.steps);
        metric_add(wm.samples, (uint64_t)batch);
        metric_set(wm.loss, st.loss);
        metric_set(wm.acc, batch > 0 ? st.correct / (double)batch : 0.0);
        metric_set(wm.clock, (double)done_steps);
        uint64_t step_comm = (c1 - c0) + (c3 - c2) + t.send_ns;
        if (t.prefetch)
            wait_ns += c1 - c0;
        comm_ns += step_comm;
        win_comm_ns += step_comm;
        if (!isfinite(st.loss)) {
            log_error("training diverged at step %" PRId64 " (loss %g): lower --lr", step, st.loss);
            goto out;
        }
        win_loss += st.loss;
        win_correct += st.correct;
        win_steps++;
        win_samples += (uint64_t)batch;
        res->samples += (uint64_t)batch;

        uint64_t now = time_now_ns();
        train_events_step(cfg->events, done_steps, &st, batch, step_comm, now);
        if (done_steps % cfg->log_every == 0 || done_steps == total) {
            double dt = secs(now - win_start);
            last_loss = win_loss / (double)win_steps;
            last_sps = dt > 0 ? (double)win_samples / dt : 0.0;
            metric_set(wm.sps, last_sps);
            double comm_ms = (double)win_comm_ns / 1e6 / (double)win_steps;
            double step_ms = dt * 1e3 / (double)win_steps;
            /* Staleness the servers observed for this model's pulls (first variable). */
            ps_staleness_stats ss;
            if (ps_var_staleness(client, t.vars[0], &ss) != PS_OK)
                memset(&ss, 0, sizeof(ss));
            if (ss.max > res->staleness_max)
                res->staleness_max = ss.max;
            train_events_staleness(cfg->events, done_steps, &ss);
            if (!cfg->progress_bar) {
                char fields[512];
                snprintf(fields, sizeof(fields),
                         "\"step\":%" PRId64 ",\"epoch\":%d,\"loss\":%.5f,\"train_accuracy\":%.4f,"
                         "\"samples_per_s\":%.1f,\"step_ms\":%.3f,\"comm_ms\":%.3f,"
                         "\"staleness_max\":%" PRId64 ",\"staleness_waits\":%" PRIu64
                         ",\"staleness_wait_ms\":%" PRIu64,
                         done_steps, epoch + 1, last_loss, win_correct / (double)win_samples,
                         last_sps, step_ms, comm_ms, ss.max, ss.waits, ss.wait_ms);
                log_fields(LOG_INFO, fields,
                           "step %" PRId64 "/%" PRId64 " epoch %d loss %.4f %.0f samples/s "
                           "(comm %.2f of %.2f ms/step, staleness max %" PRId64 ")",
                           done_steps, total, epoch + 1, last_loss, last_sps, comm_ms, step_ms,
                           ss.max);
            }
            win_start = now;
            win_comm_ns = 0;
            win_loss = win_correct = 0.0;
            win_steps = 0;
            win_samples = 0;
        }
        if (cfg->progress_bar) {
            /* The bar shows a moving average of the loss and the rate since the start. */
            bar_loss = done_steps == first + 1 ? st.loss : 0.98 * bar_loss + 0.02 * st.loss;
            double el = secs(now - t_start);
            bar_draw(&t, done_steps, total, epoch + 1, epochs_shown, bar_loss,
                     el > 0 ? (double)res->samples / el : 0.0, done_steps == total);
        }

        bool eval_now = cfg->eval_every > 0 ? done_steps % cfg->eval_every == 0
                                            : (in_epoch == steps_per_epoch - 1);
        if (evaluator && eval_now && done_steps < total) {
            /* The device holds this step's parameters: evaluate those. */
            double loss, acc;
            if (evaluate(&t, test, &loss, &acc) != 0)
                goto out;
            bar_clear(&t);
            log_eval(done_steps, epoch + 1, loss, acc, false);
            train_events_eval(cfg->events, done_steps, loss, acc);
            if (cfg->target_accuracy > 0 && acc >= cfg->target_accuracy &&
                res->time_to_target_s < 0) {
                res->time_to_target_s = secs(time_now_ns() - t_start);
                log_info("reached test accuracy %.4f (target %.4f) at step %" PRId64
                         " after %.2f s",
                         acc, cfg->target_accuracy, done_steps, res->time_to_target_s);
            }
        }
    }
    bar_clear(&t);
    if ((rc = pipeline_wait(&t)) != PS_OK || (rc = prefetch_finish(&t, false)) != PS_OK) {
        exit_code = client_failure(rc);
        goto out;
    }
    res->steps = step - first - res->skipped;
    res->wall_s = secs(time_now_ns() - t_start);
    res->samples_per_s = res->wall_s > 0 ? (double)res->samples / res->wall_s : 0.0;
    res->comm_ms_per_step = res->steps > 0 ? (double)comm_ns / 1e6 / (double)res->steps : 0.0;
    res->wait_ms_per_step = res->steps > 0 ? (double)wait_ns / 1e6 / (double)res->steps : 0.0;
    res->compute_ms_per_step =
        res->steps > 0 ? res->wall_s * 1e3 / (double)res->steps - res->comm_ms_per_step : 0.0;
    res->final_loss = last_loss;
    getrusage(RUSAGE_SELF, &ru1);
    double csw = (double)((ru1.ru_nvcsw - ru0.ru_nvcsw) + (ru1.ru_nivcsw - ru0.ru_nivcsw));
    double cpu_s = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                   (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                   (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) * 1e-6 +
                   (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) * 1e-6;
    {
        char fields[512];
        snprintf(fields, sizeof(fields),
                 "\"steps\":%" PRId64 ",\"samples\":%" PRIu64 ",\"wall_s\":%.3f,"
                 "\"samples_per_s\":%.1f,\"comm_ms_per_step\":%.3f,\"compute_ms_per_step\":%.3f,"
                 "\"wait_ms_per_step\":%.3f,\"loss\":%.5f,\"first_step\":%" PRId64
                 ",\"context_switches_per_step\":%.1f,\"cpu_ms_per_step\":%.3f",
                 res->steps, res->samples, res->wall_s, res->samples_per_s, res->comm_ms_per_step,
                 res->compute_ms_per_step, res->wait_ms_per_step, res->final_loss, res->first_step,
                 res->steps > 0 ? csw / (double)res->steps : 0.0,
                 res->steps > 0 ? cpu_s * 1e3 / (double)res->steps : 0.0);
        log_fields(LOG_INFO, fields,
                   "trained %" PRId64 " steps in %.2f s: %.0f samples/s, %.3f ms/step in "
                   "communication, %.3f ms/step computing%s",
                   res->steps, res->wall_s, res->samples_per_s, res->comm_ms_per_step,
                   res->compute_ms_per_step, res->first_step > 0 ? " (resumed)" : "");
    }
    uint64_t lost = ps_client_lost_pushes(t.client);
    if (lost > 0)
        log_warn("updates lost to server restarts, this worker's own: %" PRIu64
                 " acknowledged pushes (one per variable shard and chunk; worker 0 reports the "
                 "whole cluster's)",
                 lost);
    if ((rc = set_lost_slot(&t, lost)) != PS_OK) {
        exit_code = client_failure(rc);
        goto out;
    }

    /* Done: a later run with this model name on these servers starts at 0 (train.h). A crash
     * between this and mark_done makes a restarted worker run its steps again, as it would
     * without a record. */
    if (t.progress_var != NULL && (rc = progress_set(&t, 0, true)) != PS_OK) {
        exit_code = client_failure(rc);
        goto out;
    }
    /* Tell worker 0 this worker is done. */
    rc = mark_done(&t);
    if (rc != PS_OK) {
        exit_code = client_failure(rc);
        goto out;
    }
    /* And the servers: no wait of the others counts this worker any more. */
    if ((rc = ps_worker_finished(client)) != PS_OK)
        log_warn("telling the servers this worker finished: %s: %s (they evict it once its "
                 "heartbeats stop)",
                 ps_strerror(rc), ps_last_error());
    if (evaluator) {
        exit_code = finish_evaluator(&t, test, epochs_shown, res);
        if (exit_code == TRAIN_EXIT_OK) {
            printf("test_accuracy=%.4f test_loss=%.4f steps=%" PRId64 " wall_s=%.2f "
                   "samples_per_s=%.1f comm_ms_per_step=%.3f time_to_target_s=%.2f "
                   "staleness_max=%" PRId64 " lost_updates=%" PRId64 "\n",
                   res->test_accuracy, res->test_loss, res->steps, res->wall_s, res->samples_per_s,
                   res->comm_ms_per_step, res->time_to_target_s, res->staleness_max,
                   res->lost_updates);
            fflush(stdout);
        }
    } else {
        exit_code = await_evaluator(&t);
    }
out:
    bar_clear(&t);
    for (int i = 0; i < 2 * MODEL_MAX_LAYERS; i++)
        ps_op_destroy(t.ops[i]);
    for (int g = 0; g < OVERLAP_MAX_GROUPS; g++)
        ps_op_destroy(t.group_ops[g]);
    ps_op_destroy(t.final_op);
    ps_op_destroy(t.prefetch_op);
    ps_op_destroy(t.progress_op);
    backend_host_free(be, xb);
    backend_host_free(be, yb);
    data_shard_free(&shard);
    model_destroy(t.m);
    pthread_mutex_destroy(&t.pf_lock);
    return exit_code;
}
