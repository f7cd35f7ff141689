/* train_embbag.c - the training loop of train_embbag.h. */
#include "train_embbag.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "timeutil.h"
#include "train_events.h"

typedef struct emb_trainer {
    ps_client *client;
    backend *be;
    const train_config *cfg;
    model *m;
    layer *bag; /* the model's first layer */
    ps_table *table;
    ps_var *vars[MODEL_MAX_PARAMS];
    ps_op *ops[MODEL_MAX_PARAMS];
    ps_var *done_var;
    embbag_ids ids;
    float *rows; /* the batch's distinct rows, then their gradients */
    float *grads;
} emb_trainer;

static int exit_for(int status)
{
    return status == PS_ALREADY_EXISTS || status == PS_INVALID_ARGUMENT ? TRAIN_EXIT_CONFIG
                                                                        : TRAIN_EXIT_FAILED;
}

int train_embbag_same_width(dataset *a, dataset *b)
{
    dataset *narrow = a->dim < b->dim ? a : b;
    size_t width = a->dim < b->dim ? b->dim : a->dim;
    if (narrow->dim == width)
        return 0;
    int64_t *ids = malloc(narrow->n * width * sizeof(int64_t));
    if (ids == NULL)
        return -1;
    for (size_t i = 0; i < narrow->n; i++)
        for (size_t j = 0; j < width; j++)
            ids[i * width + j] = j < narrow->dim ? narrow->ids[i * narrow->dim + j] : -1;
    free(narrow->ids);
    narrow->ids = ids;
    narrow->dim = width;
    return 0;
}

static int create_cluster_state(emb_trainer *t)
{
    const train_config *cfg = t->cfg;
    char name[PS_MAX_NAME + 1];
    snprintf(name, sizeof(name), "%s/emb", cfg->model_name);
    ps_table_spec ts;
    ps_table_spec_init(&ts, name, (uint32_t)cfg->model.sizes[0], cfg->optimizer);
    /* Small random rows: zeros would make every example's bag the same at the start. */
    ts.initializer = PS_INIT_UNIFORM;
    ts.init_a = -0.05;
    ts.init_b = 0.05;
    ts.seed = cfg->seed;
    ts.learning_rate = cfg->lr;
    ts.momentum = cfg->momentum;
    ts.nesterov = cfg->nesterov;
    ts.dtype = cfg->embed_dtype;
    ts.ram_rows = cfg->embed_ram_rows;
    int rc = ps_table_create(t->client, &ts, &t->table);
    if (rc != PS_OK) {
        log_error("creating table %s: %s: %s", name, ps_strerror(rc), ps_last_error());
        return exit_for(rc);
    }
    if ((rc = train_create_param_vars(t->client, t->m, cfg, t->vars)) != PS_OK)
        return exit_for(rc);
    /* Completion slots, one per worker, as the MLP's trainer keeps them. */
    snprintf(name, sizeof(name), "%s/workers_done_of_%d", cfg->model_name, cfg->shard_count);
    if ((rc = train_create_slots_var(t->client, name, cfg->shard_count, &t->done_var)) != PS_OK)
        return exit_for(rc);
    return TRAIN_EXIT_OK;
}

/* Waits for every op in ops[0..n) and frees them; returns the first failure (logged). */
static int wait_ops(emb_trainer *t, int n, const char *what)
{
    return train_wait_param_ops(t->m, t->ops, n, what);
}

/* Pulls every dense variable and the rows of the batch's distinct ids, at once. */
static int pull_step(emb_trainer *t, bool dense)
{
    ps_op *rows_op = NULL;
    int rc = ps_table_pull_async(t->table, t->ids.ids, t->ids.n, t->rows, NULL, NULL, &rows_op);
    if (rc != PS_OK) {
        log_error("table pull: %s: %s", ps_strerror(rc), ps_last_error());
        return rc;
    }
    int n = dense ? model_num_params(t->m) : 0;
    for (int i = 0; i < n && rc == PS_OK; i++) {
        model_param *p = model_get_param(t->m, i);
        rc = ps_pull_async(t->client, t->vars[i], 0, p->numel, p->host, NULL, NULL, &t->ops[i]);
        if (rc != PS_OK)
            log_error("pull %s: %s: %s", p->name, ps_strerror(rc), ps_last_error());
    }
    int wrc = wait_ops(t, n, "pull");
    int st = ps_op_wait(rows_op);
    if (st != PS_OK)
        log_error("table pull of %zu ids: %s: %s", t->ids.n, ps_strerror(st),
                  ps_op_message(rows_op));
    ps_op_destroy(rows_op);
    return rc != PS_OK ? rc : wrc != PS_OK ? wrc : st;
}

static int on_grad(model *m, int i, void *arg)
{
    emb_trainer *t = arg;
    model_param *p = model_get_param(m, i);
    int rc =
        ps_push_async(t->client, t->vars[i], 0, p->numel, p->grad_host, NULL, NULL, &t->ops[i]);
    if (rc != PS_OK)
        log_error("push %s: %s: %s", p->name, ps_strerror(rc), ps_last_error());
    return rc;
}

/* The ids and labels of step's batch (batch examples of dim ids) into idb and yb, the shard
 * shuffled for its epoch first (*shuffled: the last epoch shuffled for). */
static void draw_batch(const dataset *train, data_shard *shard, int *shuffled, int64_t per_epoch,
                       int batch, int64_t step, int64_t *idb, int32_t *yb)
{
    int epoch = (int)(step / per_epoch);
    while (*shuffled < epoch)
        data_shard_shuffle(shard, (uint64_t)++ * shuffled);
    const uint32_t *order = shard->index + (size_t)(step % per_epoch) * (size_t)batch;
    for (int i = 0; i < batch; i++) {
        memcpy(idb + (size_t)i * train->dim, train->ids + (size_t)order[i] * train->dim,
               train->dim * sizeof(int64_t));
        yb[i] = train->y[order[i]];
    }
}

/* Waits for the prefetch in flight (*op, if any) and frees it: a hint, so a failure is only
 * logged. */
static void end_prefetch(ps_op **op)
{
    if (*op == NULL)
        return;
    int st = ps_op_wait(*op);
    if (st != PS_OK)
        log_warn("table prefetch: %s: %s", ps_strerror(st), ps_op_message(*op));
    ps_op_destroy(*op);
    *op = NULL;
}

/* Maps a batch (the ids of count examples) to row numbers in x, pulls and sets its rows and
 * uploads it. Returns PS_OK, a client status (logged) or -1 (model error, logged). */
static int prepare_batch(emb_trainer *t, const int64_t *ids, float *x, const int32_t *y, int count,
                         bool dense)
{
    size_t entries = (size_t)count * (size_t)t->bag->in;
    if (embbag_map_batch(&t->ids, ids, entries, x) != 0) {
        log_error("a batch of %zu ids is more than the %zu planned", entries, t->ids.max_entries);
        return -1;
    }
    int rc = pull_step(t, dense);
    if (rc != PS_OK)
        return rc;
    if ((dense && model_upload_params(t->m) != 0) ||
        layer_embbag_set_rows(t->bag, t->rows, (int)t->ids.n) != 0 ||
        model_set_batch(t->m, x, y, count) != 0) {
        log_error("%s%s", model_errmsg(t->m), backend_errmsg(t->be));
        return -1;
    }
    return PS_OK;
}

static int evaluate(emb_trainer *t, const dataset *test, float *xb, double *loss, double *acc)
{
    int batch = model_max_batch(t->m);
    double loss_sum = 0.0, correct = 0.0;
    bool first = true;
    for (size_t at = 0; at < test->n; at += (size_t)batch) {
        int count = (int)(test->n - at < (size_t)batch ? test->n - at : (size_t)batch);
        int rc = prepare_batch(t, test->ids + at * test->dim, xb, test->y + at, count, first);
        if (rc != PS_OK)
            return rc;
        first = false;
        model_stats st;
        if (model_forward(t->m, &st) != 0) {
            log_error("evaluation: %s", model_errmsg(t->m));
            return -1;
        }
        loss_sum += st.loss * count;
        correct += st.correct;
    }
    *loss = test->n ? loss_sum / (double)test->n : 0.0;
    *acc = test->n ? correct / (double)test->n : 0.0;
    return PS_OK;
}

/* Adds 1 to this worker's completion slot; worker 0 then waits (up to done_wait_ms) until
 * every slot reached its own. */
static int finish(emb_trainer *t)
{
    const train_config *cfg = t->cfg;
    int n = cfg->shard_count;
    float *v = calloc((size_t)n, sizeof(float));
    if (v == NULL)
        return PS_RESOURCE_EXHAUSTED;
    v[cfg->shard_index] = -1.0f;
    int rc = ps_push(t->client, t->done_var, v);
    uint64_t deadline = time_now_ns() + (uint64_t)cfg->done_wait_ms * 1000000u;
    while (rc == PS_OK && cfg->shard_index == 0) {
        if ((rc = ps_pull(t->client, t->done_var, v)) != PS_OK)
            break;
        int finished = 0;
        for (int i = 0; i < n; i++)
            finished += v[i] >= v[0];
        if (finished == n)
            break;
        if (time_now_ns() >= deadline || train_stop_signal) {
            log_warn("%d of %d workers finished (--done-wait-ms): evaluating the model as it is",
                     finished, n);
            break;
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rc != PS_OK)
        log_error("completion slots: %s: %s", ps_strerror(rc), ps_last_error());
    free(v);
    return rc;
}

int train_embbag_run(ps_client *client, backend *be, const train_config *cfg, bool mean,
                     const dataset *train, const dataset *test, train_result *res)
{
    memset(res, 0, sizeof(*res));
    res->test_accuracy = -1.0;
    res->test_loss = -1.0;
    res->time_to_target_s = -1.0;
    emb_trainer t;
    memset(&t, 0, sizeof(t));
    t.client = client;
    t.be = be;
    t.cfg = cfg;
    if (train->dim != test->dim || train->dim > (size_t)MODEL_MAX_WIDTH) {
        log_error("the training set has %zu ids per example, the test set %zu", train->dim,
                  test->dim);
        return TRAIN_EXIT_CONFIG;
    }
    /* embbag (row dimension sizes[0]), then dense/activation for the rest of --layers. */
    const model_config *mc = &cfg->model;
    layer_spec specs[MODEL_MAX_SEQ];
    int ns = 0;
    specs[ns++] = (layer_spec){.type = mean ? "embbag_mean" : "embbag", .units = mc->sizes[0]};
    for (int l = 1; l < mc->num_sizes; l++) {
        specs[ns++] = (layer_spec){.type = "dense", .units = mc->sizes[l], .l2 = mc->l2};
        if (l < mc->num_sizes - 1)
            specs[ns++] = (layer_spec){.type = model_activation_name(mc->act)};
    }
    if ((uint64_t)cfg->batch_size * train->dim > LAYER_EMBBAG_MAX_ROWS) {
        log_error("--batch-size %d x %zu ids per example is more than the %d ids a batch may "
                  "hold: use a smaller batch",
                  cfg->batch_size, train->dim, LAYER_EMBBAG_MAX_ROWS);
        return TRAIN_EXIT_CONFIG;
    }
    char err[512];
    if (model_create_layers(be, (int)train->dim, specs, ns, cfg->batch_size, cfg->model_name, &t.m,
                            err, sizeof(err)) != 0) {
        log_error("%s", err);
        return TRAIN_EXIT_CONFIG;
    }
    t.bag = model_get_layer(t.m, 0);
    int exit_code = TRAIN_EXIT_FAILED;
    data_shard shard;
    memset(&shard, 0, sizeof(shard));
    size_t entries = (size_t)cfg->batch_size * train->dim;
    size_t dim = (size_t)mc->sizes[0];
    float *xb = malloc(entries * sizeof(float));
    int64_t *idb = malloc(entries * sizeof(int64_t));
    int32_t *yb = malloc((size_t)cfg->batch_size * sizeof(int32_t));
    /* With a cold tier, the next batch is drawn a step ahead (its ids prefetched). */
    const bool prefetch = cfg->embed_ram_rows > 0;
    int64_t *idb_next = prefetch ? malloc(entries * sizeof(int64_t)) : NULL;
    int32_t *yb_next = prefetch ? malloc((size_t)cfg->batch_size * sizeof(int32_t)) : NULL;
    ps_op *prefetch_op = NULL;
    t.rows = malloc(entries * dim * sizeof(float));
    t.grads = malloc(entries * dim * sizeof(float));
    if (xb == NULL || idb == NULL || yb == NULL || t.rows == NULL || t.grads == NULL ||
        (prefetch && (idb_next == NULL || yb_next == NULL)) ||
        embbag_ids_init(&t.ids, entries) != 0) {
        log_error("out of memory for a batch of %d", cfg->batch_size);
        goto out;
    }
    if (data_shard_init(&shard, train->n, cfg->shard_index, cfg->shard_count, cfg->seed) != 0) {
        log_error("cannot give worker %d of %d a shard of the %zu training examples",
                  cfg->shard_index, cfg->shard_count, train->n);
        exit_code = TRAIN_EXIT_CONFIG;
        goto out;
    }
    int rc = create_cluster_state(&t);
    if (rc != TRAIN_EXIT_OK) {
        exit_code = rc;
        goto out;
    }
    int batch = cfg->batch_size < (int)shard.n ? cfg->batch_size : (int)shard.n;
    int64_t per_epoch = (int64_t)(shard.n / (size_t)batch);
    int64_t total = cfg->steps > 0 ? cfg->steps : per_epoch * cfg->epochs;
    log_info("training %s (embedding bag of dim %zu, %s, over %zu ids per example, then %zu dense "
             "parameters) on shard %d of %d: %zu examples, batch %d, %" PRId64 " steps, %s lr %g",
             cfg->model_name, dim, mean ? "mean" : "sum", train->dim, model_total_params(t.m),
             cfg->shard_index, cfg->shard_count, shard.n, batch, total,
             ps_optimizer_name(cfg->optimizer), cfg->lr);
    uint64_t t0 = time_now_ns(), comm_ns = 0, rows_pulled = 0;
    train_events_begin(cfg->events, client, t.m, t0);
    double win_loss = 0.0, win_correct = 0.0;
    int64_t win_steps = 0;
    int shuffled = -1;
    for (int64_t step = 0; step < total; step++) {
        if (train_stop_signal) {
            log_warn("stopping at step %" PRId64 " on a signal", step);
            goto out;
        }
        int epoch = (int)(step / per_epoch);
        if (!prefetch || step == 0) {
            draw_batch(train, &shard, &shuffled, per_epoch, batch, step, idb, yb);
        } else { /* drawn a step ago */
            int64_t *ti = idb;
            int32_t *ty = yb;
            idb = idb_next, yb = yb_next;
            idb_next = ti, yb_next = ty;
        }
        uint64_t c0 = time_now_ns();
        if ((rc = prepare_batch(&t, idb, xb, yb, batch, true)) != PS_OK) {
            exit_code = rc < 0 ? TRAIN_EXIT_FAILED : exit_for(rc);
            goto out;
        }
        if (prefetch && step + 1 < total) {
            /* The next batch's rows come from disk on the servers while this step computes. */
            end_prefetch(&prefetch_op);
            draw_batch(train, &shard, &shuffled, per_epoch, batch, step + 1, idb_next, yb_next);
            int prc = ps_table_prefetch_async(t.table, idb_next, (size_t)batch * train->dim, NULL,
                                              NULL, &prefetch_op);
            if (prc != PS_OK) {
                log_warn("table prefetch: %s: %s", ps_strerror(prc), ps_last_error());
                prefetch_op = NULL;
            }
        }
        rows_pulled += t.ids.n;
        uint64_t c1 = time_now_ns();
        model_stats st;
        rc = model_train_step(t.m, on_grad, &t, &st);
        if (rc == 0 && (layer_embbag_get_grads(t.bag, t.grads) != 0 || backend_sync(be) != 0)) {
            log_error("row gradients: %s", backend_errmsg(be));
            rc = -1;
        }
        uint64_t c2 = time_now_ns();
        int prc = PS_OK;
        if (rc == 0 && (prc = ps_table_push(t.table, t.ids.ids, t.ids.n, t.grads)) != PS_OK)
            log_error("table push of %zu rows: %s: %s", t.ids.n, ps_strerror(prc), ps_last_error());
        int wrc = wait_ops(&t, model_num_params(t.m), "push");
        if (rc != 0) {
            if (rc < 0)
                log_error("%s", model_errmsg(t.m));
            exit_code = rc > 0 ? exit_for(rc) : TRAIN_EXIT_FAILED;
            goto out;
        }
        if (prc == PS_OK)
            prc = wrc;
        if (prc == PS_OK && (prc = ps_clock(client, NULL)) != PS_OK)
            log_error("clock: %s: %s", ps_strerror(prc), ps_last_error());
        if (prc != PS_OK) {
            exit_code = exit_for(prc);
            goto out;
        }
        uint64_t c3 = time_now_ns();
        comm_ns += (c1 - c0) + (c3 - c2);
        res->steps++;
        res->samples += (uint64_t)batch;
        train_events_step(cfg->events, step + 1, &st, batch, (c1 - c0) + (c3 - c2), c3);
        win_loss += st.loss;
        win_correct += st.correct;
        win_steps++;
        if (cfg->log_every > 0 && (step + 1) % cfg->log_every == 0) {
            double el = (double)(time_now_ns() - t0) * 1e-9;
            double loss = win_loss / (double)win_steps, sps = (double)res->samples / el;
            double acc = win_correct / ((double)win_steps * batch);
            double rows = (double)rows_pulled / (double)res->steps;
            char fields[256];
            snprintf(fields, sizeof(fields),
                     "\"step\":%" PRId64 ",\"epoch\":%d,\"loss\":%.5f,\"train_accuracy\":%.4f,"
                     "\"samples_per_s\":%.1f,\"rows_per_step\":%.1f",
                     step + 1, epoch + 1, loss, acc, sps, rows);
            log_fields(LOG_INFO, fields,
                       "step %" PRId64 "/%" PRId64 " epoch %d loss %.4f train_acc %.4f %.0f "
                       "samples/s %.0f rows/step",
                       step + 1, total, epoch + 1, loss, acc, sps, rows);
            win_loss = win_correct = 0.0;
            win_steps = 0;
        }
        res->final_loss = st.loss;
    }
    res->wall_s = (double)(time_now_ns() - t0) * 1e-9;
    res->samples_per_s = res->wall_s > 0 ? (double)res->samples / res->wall_s : 0.0;
    res->comm_ms_per_step = res->steps ? (double)comm_ns * 1e-6 / (double)res->steps : 0.0;
    char fields[256];
    snprintf(fields, sizeof(fields),
             "\"steps\":%" PRId64 ",\"wall_s\":%.3f,\"samples_per_s\":%.1f,\"loss\":%.5f,"
             "\"comm_ms_per_step\":%.3f",
             res->steps, res->wall_s, res->samples_per_s, res->final_loss, res->comm_ms_per_step);
    log_fields(LOG_INFO, fields,
               "trained %" PRId64 " steps in %.2f s: %.1f samples/s, %.3f ms per step on the "
               "cluster",
               res->steps, res->wall_s, res->samples_per_s, res->comm_ms_per_step);
    if ((rc = finish(&t)) != PS_OK) {
        exit_code = exit_for(rc);
        goto out;
    }
    if ((rc = ps_worker_finished(client)) != PS_OK)
        log_warn("telling the servers this worker finished: %s: %s", ps_strerror(rc),
                 ps_last_error());
    if (cfg->shard_index == 0) {
        double loss, acc;
        if ((rc = evaluate(&t, test, xb, &loss, &acc)) != PS_OK) {
            exit_code = rc < 0 ? TRAIN_EXIT_FAILED : exit_for(rc);
            goto out;
        }
        res->test_accuracy = acc;
        res->test_loss = loss;
        log_info("final test_accuracy=%.4f test_loss=%.4f on %zu examples", acc, loss, test->n);
        train_events_eval(cfg->events, res->steps, loss, acc);
        printf("test_accuracy=%.4f test_loss=%.4f steps=%" PRId64 " wall_s=%.2f "
               "samples_per_s=%.1f comm_ms_per_step=%.3f\n",
               acc, loss, res->steps, res->wall_s, res->samples_per_s, res->comm_ms_per_step);
        fflush(stdout);
    }
    exit_code = TRAIN_EXIT_OK;
out:
    end_prefetch(&prefetch_op);
    wait_ops(&t, MODEL_MAX_PARAMS, "push");
    ps_table_free(t.table);
    embbag_ids_fini(&t.ids);
    free(xb);
    free(idb);
    free(yb);
    free(idb_next);
    free(yb_next);
    free(t.rows);
    free(t.grads);
    data_shard_free(&shard);
    model_destroy(t.m);
    return exit_code;
}
