/* ps-worker: trains an MLP against the parameter servers (or evaluates a saved model).
 *
 * Exit codes: 0 success, 1 runtime failure (cluster unreachable, a call failed; for a worker
 * other than 0: worker 0, the evaluator, died before it finished), 2 bad
 * configuration or input (flag, cluster spec, data or model file), 128+N stopped by signal N. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "psclient.h"

#include "backend.h"
#include "data.h"
#include "http_endpoint.h"
#include "jemalloc_conf.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "program.h"
#include "train.h"
#include "train_events.h"
#include "train_embbag.h"

static const char usage[] =
    "[options]\n"
    "Trains an MLP on its shard of the training set against the parameter servers of the\n"
    "cluster in TF_CONFIG (task type worker or chief); worker 0 (or the chief) evaluates on\n"
    "the test set and prints test_accuracy=... at the end.\n"
    "  ps-worker --eval FILE   evaluates a model saved with --save-model, without servers.";

static void on_signal(int sig)
{
    if (train_stop_signal != 0)
        _exit(128 + sig); /* second signal: stop now */
    train_stop_signal = sig;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* The model flags. Returns 0 or TRAIN_EXIT_CONFIG (logged). */
static int model_config_from_options(const options *o, model_config *mc)
{
    char err[256];
    memset(mc, 0, sizeof(*mc));
    if (model_parse_layers(opt_str(o, OPT_LAYERS), mc, err, sizeof(err)) != 0) {
        log_error("--%s", err);
        return TRAIN_EXIT_CONFIG;
    }
    if (model_parse_activation(opt_enum(o, OPT_ACTIVATION), &mc->act) != 0) {
        log_error("--activation: '%s' is not relu or tanh", opt_enum(o, OPT_ACTIVATION));
        return TRAIN_EXIT_CONFIG;
    }
    mc->l2 = (float)opt_double(o, OPT_L2);
    return 0;
}

/* Loads the test set, and the training set when train != NULL, from CSV files or the IDX
 * directory; CSV features are scaled with the training set's range. Returns 0 or
 * TRAIN_EXIT_CONFIG (logged). */
static int load_data(const options *o, dataset *train, dataset *test)
{
    char err[1024];
    dataset range_src; /* the training CSV when only its range is needed */
    memset(&range_src, 0, sizeof(range_src));
    const char *train_csv = opt_str(o, OPT_TRAIN_CSV);
    const char *test_csv = opt_str(o, OPT_TEST_CSV);
    bool csv = train_csv[0] != '\0' || test_csv[0] != '\0';
    if (!csv) {
        const char *dir = opt_str(o, OPT_DATA_DIR);
        if (train != NULL && data_load_idx_dir(dir, "train", train, err, sizeof(err)) != 0)
            goto fail;
        if (data_load_idx_dir(dir, "t10k", test, err, sizeof(err)) != 0)
            goto fail;
        return 0;
    }
    if (test_csv[0] == '\0') {
        log_error("--train-csv needs --test-csv (the test set the final accuracy is measured on)");
        return TRAIN_EXIT_CONFIG;
    }
    if (train != NULL && train_csv[0] == '\0') {
        log_error("--test-csv needs --train-csv to train");
        return TRAIN_EXIT_CONFIG;
    }
    if (train_csv[0] != '\0') {
        dataset *t = train != NULL ? train : &range_src;
        if (data_load_csv(train_csv, t, err, sizeof(err)) != 0)
            goto fail;
    }
    if (data_load_csv(test_csv, test, err, sizeof(err)) != 0)
        goto fail;
    const dataset *ref = train != NULL ? train : (range_src.n ? &range_src : test);
    float lo, hi;
    dataset_minmax(ref, &lo, &hi);
    if (train != NULL)
        dataset_scale(train, lo, hi);
    dataset_scale(test, lo, hi);
    log_info("CSV features scaled from [%g, %g] to [0, 1]", lo, hi);
    dataset_free(&range_src);
    return 0;
fail:
    log_error("%s", err);
    dataset_free(&range_src);
    return TRAIN_EXIT_CONFIG;
}

/* The sparse sets of --model embbag-mlp, made the same width. Returns 0 or TRAIN_EXIT_CONFIG
 * (logged). */
static int load_sparse(const options *o, dataset *train, dataset *test, const model_config *mc)
{
    const char *paths[2] = {opt_str(o, OPT_TRAIN_SPARSE), opt_str(o, OPT_TEST_SPARSE)};
    if (paths[0][0] == '\0' || paths[1][0] == '\0') {
        log_error("--model embbag-mlp needs --train-sparse and --test-sparse");
        return TRAIN_EXIT_CONFIG;
    }
    if (mc->num_sizes < 2) {
        log_error("--model embbag-mlp: --layers needs the row dimension and the classes");
        return TRAIN_EXIT_CONFIG;
    }
    char err[1024];
    if (data_load_sparse(paths[0], 4096, train, err, sizeof(err)) != 0 ||
        data_load_sparse(paths[1], 4096, test, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return TRAIN_EXIT_CONFIG;
    }
    if (train_embbag_same_width(train, test) != 0) {
        log_error("out of memory");
        return TRAIN_EXIT_CONFIG;
    }
    log_info("sparse examples: %zu training, %zu test, up to %zu ids each", train->n, test->n,
             train->dim);
    return 0;
}

static int check_data(const dataset *d, const char *what, const model_config *mc)
{
    int classes = mc->sizes[mc->num_sizes - 1];
    if ((int)d->dim != mc->sizes[0]) {
        log_error("%s set has %zu features per example but --layers starts with %d", what, d->dim,
                  mc->sizes[0]);
        return TRAIN_EXIT_CONFIG;
    }
    if (d->num_classes > classes) {
        log_error("%s set has labels up to %d but --layers ends with %d classes", what,
                  d->num_classes - 1, classes);
        return TRAIN_EXIT_CONFIG;
    }
    return 0;
}

static int open_backend(const options *o, backend **be)
{
    backend_options bo;
    backend_options_init(&bo);
    bo.blas_threads = (int)opt_int(o, OPT_BLAS_THREADS);
    bo.device_index = (int)opt_int(o, OPT_GPU);
    bo.tf32 = opt_bool(o, OPT_TF32);
    const char *why = NULL;
    char err[256];
    const char *dev = opt_enum(o, OPT_DEVICE);
    if (backend_open(dev, &bo, be, &why, err, sizeof(err)) != 0) {
        log_error("--device %s: %s", dev, err);
        return TRAIN_EXIT_CONFIG;
    }
    if (why != NULL)
        log_info("%s", why);
    if (strcmp(backend_name(*be), "cpu") == 0)
        log_info("cpu backend: BLAS kernels %s, %d thread(s)", backend_cpu_blas_core(),
                 bo.blas_threads);
    else
        log_info("%s backend: %s", backend_name(*be), backend_desc(*be));
    return 0;
}

/* ps-worker --eval FILE */
static int run_eval(const options *o, backend *be)
{
    const char *path = opt_str(o, OPT_EVAL);
    char err[1024];
    model *m = NULL;
    if (model_load(be, path, 1000, &m, err, sizeof(err)) != 0) {
        log_error("--eval: %s", err);
        return TRAIN_EXIT_CONFIG;
    }
    dataset test;
    memset(&test, 0, sizeof(test));
    int rc = load_data(o, NULL, &test);
    if (rc == 0)
        rc = check_data(&test, "test", model_get_config(m));
    if (rc == 0) {
        double loss, acc;
        if (model_evaluate(m, &test, &loss, &acc) != 0) {
            log_error("evaluation: %s", model_errmsg(m));
            rc = TRAIN_EXIT_FAILED;
        } else {
            char layers[128];
            model_format_layers(model_get_config(m), layers, sizeof(layers));
            log_info("evaluated %s (layers %s) on %zu test examples", path, layers, test.n);
            printf("test_accuracy=%.4f test_loss=%.4f examples=%zu\n", acc, loss, test.n);
            fflush(stdout);
        }
    }
    dataset_free(&test);
    model_destroy(m);
    return rc;
}

/* Passes every client setting given to this program (file, environment, flags) on to the
 * client library, which reads the same option table. Returns 0 or TRAIN_EXIT_CONFIG. */
static int client_config(const options *o, int worker_id, ps_config **out)
{
    ps_config *pc = NULL;
    if (ps_config_create(&pc) != PS_OK) {
        log_error("client configuration: %s", ps_last_error());
        return TRAIN_EXIT_FAILED;
    }
    for (unsigned row = 0; row < OPTION_ROW_COUNT; row++) {
        const option_def *d = &options_table[row];
        if (!(d->scope & OPT_SCOPE_CLIENT) || row == OPT_ROW(OPT_CONFIG) ||
            !options_is_set_row(o, row))
            continue;
        if (ps_config_set(pc, d->name, options_text_row(o, row)) != PS_OK) {
            log_error("--%s: %s", d->name, ps_last_error());
            ps_config_destroy(pc);
            return TRAIN_EXIT_CONFIG;
        }
    }
    if (!opt_is_set(o, OPT_WORKER_ID)) {
        char id[32];
        snprintf(id, sizeof(id), "%d", worker_id);
        if (ps_config_set(pc, "worker-id", id) != PS_OK) {
            log_error("worker-id: %s", ps_last_error());
            ps_config_destroy(pc);
            return TRAIN_EXIT_CONFIG;
        }
    }
    *out = pc;
    return 0;
}

/* libpsclient's log messages, written by this program's logger (its role, task and format):
 * the library keeps a logger of its own otherwise, which knows neither. */
static void log_library_message(int level, const char *message, const char *fields, void *arg)
{
    (void)arg;
    log_fields((log_level)level, fields, "%s", message);
}

/* Who this worker is, from the cluster spec (TF_CONFIG or --cluster/--task). */
typedef struct identity {
    bool ok;
    char err[1024];
    bool is_chief;
    int task_index;
    int shard_index; /* the chief is worker 0 when there is one; workers follow it */
    int shard_count;
} identity;

/* Parses the cluster spec into id (id->ok false, id->err set, on error) and, when it names a
 * worker or chief task, sets the role and index of every later log line. */
static void identify(const options *o, identity *id)
{
    memset(id, 0, sizeof(*id));
    cluster_spec cl;
    static const char prefix[] = "bad cluster spec: ";
    memcpy(id->err, prefix, sizeof(prefix));
    if (cluster_from_options(o, &cl, id->err + sizeof(prefix) - 1,
                             sizeof(id->err) - sizeof(prefix) + 1) != 0)
        return;
    id->is_chief = strcmp(cl.task_type, "chief") == 0;
    if (!id->is_chief && strcmp(cl.task_type, "worker") != 0) {
        snprintf(id->err, sizeof(id->err),
                 "task is \"%s:%d\" but ps-worker runs a worker or chief task (set task.type in "
                 "TF_CONFIG or --task worker:N)",
                 cl.task_type[0] ? cl.task_type : "(none)", cl.task_index);
        cluster_fini(&cl);
        return;
    }
    id->task_index = cl.task_index;
    id->shard_count = (int)(cl.n_chief + cl.n_worker);
    id->shard_index = id->is_chief ? cl.task_index : (int)cl.n_chief + cl.task_index;
    id->ok = true;
    cluster_fini(&cl);
    log_level lvl = LOG_INFO;
    log_format fmt = LOG_FORMAT_AUTO;
    log_level_parse(opt_enum(o, OPT_LOG_LEVEL), &lvl);
    log_format_parse(opt_enum(o, OPT_LOG_FORMAT), &fmt);
    log_init(id->is_chief ? "chief" : "worker", id->task_index, lvl, fmt);
    ps_set_log_message_handler((int)lvl, log_library_message, NULL);
}

static int run_training(program *prog, const identity *id, backend *be, const model_config *mc)
{
    const options *o = prog->opts;
    if (!id->ok) {
        log_error("%s", id->err);
        return TRAIN_EXIT_CONFIG;
    }
    train_config tc;
    memset(&tc, 0, sizeof(tc));
    tc.shard_count = id->shard_count;
    tc.shard_index = id->shard_index;

    tc.model = *mc;
    tc.model_name = opt_str(o, OPT_MODEL_NAME);
    tc.batch_size = (int)opt_int(o, OPT_BATCH_SIZE);
    tc.epochs = (int)opt_int(o, OPT_EPOCHS);
    tc.steps = opt_int(o, OPT_STEPS);
    tc.embed_ram_rows = (uint64_t)opt_int(o, OPT_EMBED_RAM_ROWS);
    const char *edt = opt_enum(o, OPT_EMBED_DTYPE);
    tc.embed_dtype = strcmp(edt, "bfloat16") == 0  ? PS_BFLOAT16
                     : strcmp(edt, "float16") == 0 ? PS_FLOAT16
                                                   : PS_FLOAT32;
    if (ps_optimizer_parse(opt_enum(o, OPT_OPTIMIZER), &tc.optimizer) != PS_OK) {
        log_error("--optimizer: %s", ps_last_error());
        return TRAIN_EXIT_CONFIG;
    }
    tc.lr = opt_double(o, OPT_LR);
    if (tc.lr == 0.0)
        tc.lr = train_default_lr(tc.optimizer);
    tc.momentum = opt_double(o, OPT_MOMENTUM);
    tc.nesterov = opt_bool(o, OPT_NESTEROV);
    tc.staleness = (int)opt_int(o, OPT_STALENESS);
    tc.slow_worker = (int)opt_int(o, OPT_SLOW_WORKER);
    tc.slow_delay_ms = opt_int(o, OPT_SLOW_DELAY_MS);
    tc.target_accuracy = opt_double(o, OPT_TARGET_ACCURACY);
    tc.fused_push_pull = opt_bool(o, OPT_FUSED_PUSH_PULL);
    tc.step_call = opt_bool(o, OPT_STEP_CALL);
    tc.overlap = opt_bool(o, OPT_OVERLAP);
    tc.prefetch = opt_bool(o, OPT_PREFETCH);
    tc.seed = (uint64_t)opt_int(o, OPT_SEED);
    tc.eval_every = opt_int(o, OPT_EVAL_EVERY);
    tc.log_every = opt_int(o, OPT_LOG_EVERY);
    const char *progress = opt_enum(o, OPT_PROGRESS);
    tc.progress_bar =
        strcmp(progress, "on") == 0 || (strcmp(progress, "auto") == 0 && isatty(STDERR_FILENO));
    tc.save_model = opt_str(o, OPT_SAVE_MODEL);
    tc.done_wait_ms = opt_int(o, OPT_DONE_WAIT_MS);
    tc.progress_every = opt_int(o, OPT_PROGRESS_EVERY);
    if (strlen(tc.model_name) == 0 || strlen(tc.model_name) > 40) {
        log_error("--model-name must be 1 to 40 characters");
        return TRAIN_EXIT_CONFIG;
    }

    dataset train, test;
    memset(&train, 0, sizeof(train));
    memset(&test, 0, sizeof(test));
    bool embbag = strcmp(opt_enum(o, OPT_MODEL), "embbag-mlp") == 0;
    int rc;
    if (!embbag &&
        (opt_str(o, OPT_TRAIN_SPARSE)[0] != '\0' || opt_str(o, OPT_TEST_SPARSE)[0] != '\0')) {
        log_error("--train-sparse and --test-sparse are the data of --model embbag-mlp (the model "
                  "is %s)",
                  opt_enum(o, OPT_MODEL));
        rc = TRAIN_EXIT_CONFIG;
    } else {
        rc = embbag ? load_sparse(o, &train, &test, mc) : load_data(o, &train, &test);
    }
    if (embbag) {
        /* check_data's width test is of dense examples: only the classes apply here. */
        model_config classes = *mc;
        classes.sizes[0] = (int)train.dim;
        if (rc == 0)
            rc = check_data(&train, "training", &classes);
        classes.sizes[0] = (int)test.dim;
        if (rc == 0)
            rc = check_data(&test, "test", &classes);
    }
    if (rc == 0 && !embbag)
        rc = check_data(&train, "training", mc);
    if (rc == 0 && !embbag)
        rc = check_data(&test, "test", mc);
    if (rc == 0 && train.n < (size_t)tc.shard_count) {
        log_error("the training set has %zu examples, fewer than the %d workers", train.n,
                  tc.shard_count);
        rc = TRAIN_EXIT_CONFIG;
    }
    if (rc == 0 && embbag && tc.save_model[0] != '\0') {
        log_error("--save-model is not supported with --model embbag-mlp (its table stays on the "
                  "servers)");
        rc = TRAIN_EXIT_CONFIG;
    }
    /* Checked before connecting: an unwritable --logdir is a configuration error. */
    if (rc == 0 && opt_str(o, OPT_LOGDIR)[0] != '\0') {
        char eerr[4600];
        if (train_events_open(&tc.events, opt_str(o, OPT_LOGDIR), id->is_chief ? "chief" : "worker",
                              id->task_index, opt_int(o, OPT_EVENTS_EVERY),
                              opt_int(o, OPT_HISTOGRAM_EVERY), eerr, sizeof(eerr)) != 0) {
            log_error("%s", eerr);
            rc = TRAIN_EXIT_CONFIG;
        }
    }
    ps_config *pc = NULL;
    if (rc == 0)
        rc = client_config(o, tc.shard_index, &pc);
    ps_client *client = NULL;
    if (rc == 0) {
        int st = ps_client_open(&client, pc);
        if (st != PS_OK) {
            log_error("connecting to the cluster: %s: %s", ps_strerror(st), ps_last_error());
            rc = st == PS_INVALID_ARGUMENT ? TRAIN_EXIT_CONFIG : TRAIN_EXIT_FAILED;
        }
    }
    ps_config_destroy(pc);
    if (rc == 0) {
        train_result res;
        if (embbag)
            rc = train_embbag_run(client, be, &tc,
                                  strcmp(opt_enum(o, OPT_EMBED_POOLING), "mean") == 0, &train,
                                  &test, &res);
        else
            rc = train_run(client, be, &tc, &train, &test, &res);
    }
    ps_client_close(client);
    train_events_close(tc.events);
    dataset_free(&train);
    dataset_free(&test);
    return rc;
}

/* Re-executes this program with a faster OpenBLAS kernel when the library fell back to a slow
 * one (see backend_cpu_better_coretype); returns only if that is not needed or fails. */
static void maybe_reexec_for_blas(char **argv)
{
    const char *core = backend_cpu_better_coretype();
    if (core == NULL)
        return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* exec failed: carry on with the slow kernels */
}

/* /readyz of a worker: ready once its first call to the cluster succeeded (train.c). */
static bool worker_ready(void *arg, char *why, size_t cap)
{
    if (metric_value(metrics_gauge("psd_worker_connected",
                                   "1 once the worker's first call to the cluster succeeded.")) > 0)
        return true;
    snprintf(why, cap, "not connected to the cluster yet");
    return false;
}

int main(int argc, char **argv)
{
    maybe_reexec_for_blas(argv);
    program prog;
    bool exit_now;
    int rc = program_start(&prog, argc, argv, OPT_SCOPE_WORKER, "worker", usage, false, &exit_now);
    if (exit_now)
        return rc;
    install_signals();
    if (prog.npositional > 0) {
        log_error("unexpected argument '%s' (see --help)", prog.positional[0]);
        program_end(&prog);
        return TRAIN_EXIT_CONFIG;
    }
    http_endpoint *http;
    if (http_endpoint_start_logged(&http, opt_str(prog.opts, OPT_HTTP_LISTEN)) != 0) {
        program_end(&prog);
        return TRAIN_EXIT_CONFIG;
    }
    if (http)
        http_endpoint_set_ready_fn(http, worker_ready, NULL);
    bool eval_mode = opt_str(prog.opts, OPT_EVAL)[0] != '\0';
    static identity id;
    if (!eval_mode)
        identify(prog.opts, &id);
    model_config mc;
    backend *be = NULL;
    rc = model_config_from_options(prog.opts, &mc);
    /* Checked before connecting anywhere: a missing device is a configuration error. */
    if (rc == 0)
        rc = open_backend(prog.opts, &be);
    if (rc == 0) {
        if (eval_mode)
            rc = run_eval(prog.opts, be);
        else
            rc = run_training(&prog, &id, be, &mc);
    }
    backend_close(be);
    http_endpoint_stop(http);
    program_end(&prog);
    if (train_stop_signal != 0)
        return 128 + train_stop_signal;
    return rc;
}
