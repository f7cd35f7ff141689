/* libpsclient: the public C API of the parameter-server service.
 *
 * A program connects to a cluster of ps-server processes (described by a TF_CONFIG-style
 * cluster spec), creates or looks up variables, and pulls parameters and pushes gradients.
 * Placement is computed here: every client maps every element to the same server, with no
 * coordinator. Every call has a deadline; pushes are applied exactly once.
 *
 * Conventions:
 *  - Functions return 0 (PS_OK) or a positive ps_status code. ps_strerror() names a code; the
 *    calling thread's ps_last_error() holds the full message (the server's, when it replied).
 *  - All functions are thread-safe: a ps_client may be shared by any number of threads.
 *  - "Blocks" means the call waits for the network, bounded by the client's deadline-ms
 *    setting (default 30 s) times the retries on UNAVAILABLE.
 *  - Objects made by a create or open function are freed by the matching destroy or close;
 *    passing NULL to those is a no-op.
 */
#ifndef PSCLIENT_H
#define PSCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PS_VERSION_MAJOR 0
#define PS_VERSION_MINOR 1
#define PS_VERSION_PATCH 0

/* Status codes: gRPC's canonical codes, with the same numbers. */
typedef enum ps_status {
    PS_OK = 0,
    PS_CANCELLED = 1,
    PS_UNKNOWN = 2,
    PS_INVALID_ARGUMENT = 3,
    PS_DEADLINE_EXCEEDED = 4,
    PS_NOT_FOUND = 5,
    PS_ALREADY_EXISTS = 6,
    PS_PERMISSION_DENIED = 7,
    PS_RESOURCE_EXHAUSTED = 8,
    PS_FAILED_PRECONDITION = 9,
    PS_ABORTED = 10,
    PS_OUT_OF_RANGE = 11,
    PS_UNIMPLEMENTED = 12,
    PS_INTERNAL = 13,
    PS_UNAVAILABLE = 14,
    PS_DATA_LOSS = 15,
    PS_UNAUTHENTICATED = 16,
} ps_status;

/* Canonical name of a status code ("NOT_FOUND"); never NULL, static storage. */
const char *ps_strerror(int status);

/* The message of the last failed call made by this thread (the server's message when the
 * server replied with an error), or "" if none. Valid until this thread's next ps_ call. */
const char *ps_last_error(void);

/* Library version as "MAJOR.MINOR.PATCH"; static storage. */
const char *ps_version(void);

/* ---- logging ---------------------------------------------------------------------------- */

/* The library writes its lines to stderr as the program's own logger would. In a program that
 * sets up no psd logging of its own (a Python program, a plain C program), each ps_client_open
 * applies that client's log-level and log-format settings and names the line's role and task
 * after the client: its task in the cluster spec, else "worker" and its worker-id setting, else
 * "client" and -1. */

/* Log levels passed to a ps_log_fn (the log-level setting names them). */
#define PS_LOG_DEBUG 0
#define PS_LOG_INFO 1
#define PS_LOG_WARN 2
#define PS_LOG_ERROR 3

/* Receives the library's log lines. level is one of PS_LOG_*; line is one complete line as the
 * library would write it to stderr, without the trailing newline: a JSON object
 * ({"ts":...,"level":"warn","role":...,"task":...,"msg":"..."}) or, with the log-format setting
 * text (or auto with stderr a terminal), "TS LEVEL role/task: msg". line is valid only during
 * the call. Only lines at or above the minimum log level reach it. Thread-safety: it is called
 * from library threads (background connection and I/O threads) as well as the calling thread;
 * calls are serialized (never two at once) and hold the library's log lock, so the handler must
 * not block long (every thread that logs waits for it), and must not call ps_ functions or
 * ps_set_log_handler. */
typedef void (*ps_log_fn)(int level, const char *line, void *arg);

/* Sends every log line of the library (process-wide, all clients) to fn(level, line, arg)
 * instead of stderr. NULL restores the default, writing to stderr. Once it returns, the
 * previous handler is no longer called. Thread-safe; does not block (beyond a handler call in
 * progress). */
void ps_set_log_handler(ps_log_fn fn, void *arg);

/* Receives the library's log messages before they are made into lines, so that a program with
 * a logger of its own writes them as its own lines (its role, task, format and lock: one logger
 * per process). message is the text alone (no timestamp, level or identity), valid only during
 * the call; fields is NULL or a JSON object-body fragment ("\"k\":1,\"s\":\"x\"") of
 * structured fields for the line. Only messages at min_level (PS_LOG_*) or above are formatted
 * and passed. Calls are serialized and hold the library's log lock, as for ps_log_fn: fn must
 * not block long nor call ps_ functions. While one is set, ps_set_log_handler's handler and
 * stderr get nothing from the library. NULL restores them (min_level stays the minimum).
 * Thread-safe. */
typedef void (*ps_log_message_fn)(int level, const char *message, const char *fields, void *arg);
void ps_set_log_message_handler(int min_level, ps_log_message_fn fn, void *arg);

typedef struct ps_client ps_client;
typedef struct ps_config ps_config;
typedef struct ps_var ps_var;
typedef struct ps_op ps_op;

/* ---- configuration ---------------------------------------------------------------------- */

/* Creates a configuration holding every client setting at its default. Returns PS_OK or
 * PS_RESOURCE_EXHAUSTED. Caller frees with ps_config_destroy. */
int ps_config_create(ps_config **out);
void ps_config_destroy(ps_config *cfg);

/* Sets one client setting by name, as on the command line without the dashes, e.g.
 * ("deadline-ms", "5000"), ("connections", "4"), ("chunk-bytes", "1M"), ("cluster", json).
 * The README lists them all. Returns PS_INVALID_ARGUMENT (message in ps_last_error) for an
 * unknown name or a value of the wrong type or out of bounds. Does not block. */
int ps_config_set(ps_config *cfg, const char *name, const char *value);

/* Reads settings from the environment (PS_* variables and TF_CONFIG), as every program of the
 * project does. Values set with ps_config_set afterwards take precedence. */
int ps_config_load_env(ps_config *cfg);

/* ---- connection ------------------------------------------------------------------------- */

/* Connects to the cluster named by cfg's "cluster" setting (TF_CONFIG JSON, or @file) or, if
 * unset, its "tf-config" setting (environment TF_CONFIG after ps_config_load_env). cfg may be
 * NULL: then the environment alone is used. Connections are made in the background: open
 * does not wait for servers to be up (the first call does, within its deadline).
 * Returns PS_OK, PS_INVALID_ARGUMENT for a bad spec (message names what is wrong), or
 * PS_RESOURCE_EXHAUSTED. cfg is not retained. Caller closes with ps_client_close. */
int ps_client_open(ps_client **out, const ps_config *cfg);

/* Closes every connection and frees the client and its ps_var handles. Operations still in
 * flight complete with PS_CANCELLED first. Blocks until their callbacks have returned. */
void ps_client_close(ps_client *c);

/* Number of ps tasks in the cluster spec. */
int ps_client_num_servers(const ps_client *c);

/* ---- variables -------------------------------------------------------------------------- */

/* Variables are PS_FLOAT32; a table's rows (ps_table_spec.dtype) may also be stored in 16 bits:
 * PS_BFLOAT16 (8 bits of mantissa, float32's range) or PS_FLOAT16 (IEEE half: 11 bits, up to
 * 65504), rounded to nearest, with the optimizer's state kept in float32. */
typedef enum ps_dtype { PS_FLOAT32 = 1, PS_BFLOAT16 = 2, PS_FLOAT16 = 3 } ps_dtype;

typedef enum ps_initializer {
    PS_INIT_ZEROS = 0,
    PS_INIT_CONSTANT = 1,       /* init_a */
    PS_INIT_UNIFORM = 2,        /* [init_a, init_b) */
    PS_INIT_NORMAL = 3,         /* mean init_a, stddev init_b */
    PS_INIT_GLOROT_UNIFORM = 4, /* from the shape's fan-in and fan-out */
} ps_initializer;

/* The optimizers the servers run (the update rules are in the README). The numbers are the
 * wire's and never change; new optimizers are appended. */
typedef enum ps_optimizer {
    PS_OPT_SGD = 0,
    PS_OPT_MOMENTUM = 1,
    PS_OPT_ADAGRAD = 2,
    PS_OPT_ADAM = 3,
    PS_OPT_ADAMW = 4, /* Adam with decoupled weight decay (weight_decay) */
    PS_OPT_FTRL = 5,  /* FTRL-Proximal: sparse tables only (ps_table_spec) */
    /* Row-wise Adagrad: one accumulator per row (of the row's mean squared gradient), the
     * update p -= lr / (sqrt(acc) + epsilon) * g; sparse tables only (ps_table_spec). */
    PS_OPT_ROWWISE_ADAGRAD = 6,
} ps_optimizer;

/* Canonical lower-case name of an optimizer ("sgd", "momentum", "adagrad", "adam", "adamw"),
 * or "unknown"; never NULL, static storage. */
const char *ps_optimizer_name(int optimizer);

/* The optimizer named `name` (ASCII case-insensitive). Returns PS_OK and stores it in *out, or
 * PS_INVALID_ARGUMENT (ps_last_error lists the names) for an unknown name; *out is then
 * untouched. */
int ps_optimizer_parse(const char *name, ps_optimizer *out);

#define PS_MAX_DIMS 8
#define PS_MAX_NAME 255

/* Description of a variable. Fill it with ps_var_spec_init, then change what you need. The
 * optimizer runs on the servers: pushes carry gradients, the servers apply the update.
 *
 * The struct is versioned by its size: ps_var_spec_init records sizeof(ps_var_spec) as this
 * program was compiled in struct_size, and the library reads only the fields that fit in it,
 * taking defaults for the rest. New fields are only ever appended, so a program built against
 * an older psclient.h keeps working with a newer library. Always initialise a spec with
 * ps_var_spec_init (or ps_var_spec_init_sized from a language binding). */
typedef struct ps_var_spec {
    size_t struct_size; /* set by ps_var_spec_init: sizeof(ps_var_spec) of the caller */
    const char *name;   /* 1..PS_MAX_NAME bytes of [A-Za-z0-9_./:-]; copied by create */
    ps_dtype dtype;     /* PS_FLOAT32 */
    int ndims;          /* 0..PS_MAX_DIMS */
    uint64_t dims[PS_MAX_DIMS];
    ps_initializer initializer;
    double init_a, init_b;
    uint64_t seed;
    ps_optimizer optimizer;
    double learning_rate;
    double momentum;            /* momentum */
    bool nesterov;              /* momentum */
    double beta1, beta2;        /* adam, adamw */
    double epsilon;             /* adam, adamw, adagrad */
    double initial_accumulator; /* adagrad */
    int staleness;              /* bound: see PS_STALENESS_* */
    /* ---- appended fields: read only when struct_size covers them ---- */
    double weight_decay; /* adamw: each update first multiplies the weights by
                          * 1 - learning_rate * weight_decay */
} ps_var_spec;

/* Staleness bounds (ps_var_spec.staleness). A pull by a worker at clock c of a variable with
 * bound s >= 0 returns only when every live worker's clock is >= c - s. */
#define PS_STALENESS_ASYNC (-1)   /* never wait */
#define PS_STALENESS_BSP 0        /* synchronous: one aggregated update per clock */
#define PS_STALENESS_DEFAULT (-2) /* the servers' default-staleness setting */

/* Fills the first `size` bytes of spec with defaults and sets spec->struct_size = size:
 * float32, scalar, zeros, SGD with learning rate 0.01, seed 0, momentum 0.9, beta1 0.9,
 * beta2 0.999, epsilon 1e-8, initial accumulator 0.1, weight decay 0.01,
 * staleness PS_STALENESS_DEFAULT. name is stored as given (not copied). size must cover at
 * least the fields up to staleness (the first layout); a smaller size, or NULL, is ignored. */
void ps_var_spec_init_sized(ps_var_spec *spec, size_t size, const char *name);

/* ps_var_spec_init(spec, name): ps_var_spec_init_sized with this header's sizeof. */
static inline void ps_var_spec_init(ps_var_spec *spec, const char *name)
{
    ps_var_spec_init_sized(spec, sizeof(*spec), name);
}

/* Creates the variable on its owning server(s), or finds it if a variable with the same name
 * and the same spec exists already (idempotent: any number of workers may call it; one that
 * differs only in its placement, made by a client with another split-threshold-bytes or
 * split-parts, is found as it is). Another spec under the same name is PS_ALREADY_EXISTS,
 * with the differing field in the message.
 * On success *out is a handle owned by the client (valid until ps_client_close). Blocks. */
int ps_var_create(ps_client *c, const ps_var_spec *spec, ps_var **out);

/* Finds an existing variable by name. PS_NOT_FOUND if no server has it. *out as for create.
 * Blocks (unless the handle is cached). */
int ps_var_lookup(ps_client *c, const char *name, ps_var **out);

/* Deletes the variable (or sparse table: ps_table_delete) from every server that holds it
 * (each shard of a split one); admin (see docs/operations.md "Security": a loopback peer, or
 * the admin token). Pulls waiting on it
 * for the staleness bound are answered PS_NOT_FOUND. PS_NOT_FOUND if no server has it. The
 * client's cached handle for the name is dropped from its name cache (not freed: it stays
 * valid memory until ps_client_close), so a later create/lookup makes a fresh handle; calls on
 * a handle still held afterwards reach the servers by name and get PS_NOT_FOUND, or, once the
 * name is created again, act on the new variable. The name may be created again at once, with
 * fresh values. Blocks. */
int ps_var_delete(ps_client *c, const char *name);

/* Lists the names of all variables in the cluster. *names is an array of *count strings;
 * free it with ps_names_free. Blocks. */
int ps_var_list(ps_client *c, char ***names, size_t *count);
void ps_names_free(char **names, size_t count);

/* Properties of a handle. The name is owned by the handle. */
const char *ps_var_name(const ps_var *v);
uint64_t ps_var_numel(const ps_var *v);
int ps_var_ndims(const ps_var *v);
uint64_t ps_var_dim(const ps_var *v, int i);
/* Number of servers the variable is split over (1 for a variable held whole), or of its parts
 * when it is cut in fixed parts (split-parts). */
int ps_var_num_shards(const ps_var *v);
/* The variable's staleness bound as the servers enforce it (-1, 0 or s > 0). */
int ps_var_staleness_bound(const ps_var *v);

/* Observed staleness of the pulls of one variable by workers, summed over its servers: the
 * gap between the reading worker's clock and the slowest live worker's. */
#define PS_STALENESS_BUCKETS 13
typedef struct ps_staleness_stats {
    int64_t max;      /* largest gap seen */
    uint64_t pulls;   /* pulls by workers */
    uint64_t waits;   /* pulls that waited for the bound */
    uint64_t wait_ms; /* total time they waited */
    uint64_t timeouts;
    /* histogram[g] counts gaps g = 0..8; then [9] 9-16, [10] 17-32, [11] 33-64, [12] > 64 */
    uint64_t histogram[PS_STALENESS_BUCKETS];
} ps_staleness_stats;

/* Reads the observed staleness of v from the servers holding it. Blocks. */
int ps_var_staleness(ps_client *c, ps_var *v, ps_staleness_stats *out);

/* ---- pull and push (blocking) ----------------------------------------------------------- */

/* Copies the whole variable into dst (ps_var_numel floats). Blocks. */
int ps_pull(ps_client *c, ps_var *v, float *dst);
/* Copies elements [offset, offset + count) of the flattened variable into dst.
 * PS_OUT_OF_RANGE if the range exceeds the variable. Blocks. */
int ps_pull_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, float *dst);

/* Sends a gradient for the whole variable (ps_var_numel floats); the servers apply their
 * optimizer. Applied exactly once even when the transport resends it. Blocks. */
int ps_push(ps_client *c, ps_var *v, const float *grad);
int ps_push_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad);

/* Pushes grad and returns in dst the parameters just after that update. Blocks. */
int ps_push_pull(ps_client *c, ps_var *v, const float *grad, float *dst);
int ps_push_pull_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad,
                       float *dst);

/* Writes values (ps_var_numel floats, or count from offset) into the variable as they are: no
 * optimizer step and no BSP aggregate (the optimizer's state, e.g. Adam's moments, is kept).
 * Exactly once like a push, and always sent in float32 (wire-dtype applies to gradients only).
 * How a program makes its own initial values the servers': one task (the chief) creates the
 * variable and assigns them, the others wait for it and pull. Any client may assign; pushes and
 * assigns of the same elements at once are applied in some order. Blocks. */
int ps_assign(ps_client *c, ps_var *v, const float *values);
int ps_assign_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *values);

/* ---- asynchronous operations ------------------------------------------------------------ */

/* Completion callback: runs once, on a library thread, when every part of the operation has
 * completed. It must not block or call ps_op_wait; it may start new operations. */
typedef void (*ps_done_fn)(ps_op *op, void *arg);

/* Starts a pull, push or push-pull and returns at once. The buffers (dst, grad) must stay
 * valid and untouched until the operation completes. cb may be NULL. *out_op receives a
 * handle to wait on; the caller must free it with ps_op_destroy after completion (or after
 * the callback ran). Returns PS_OK if started; an error (and no handle) if the arguments are
 * invalid. Errors of the transfer itself are reported by ps_op_wait / ps_op_status. */
int ps_pull_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, float *dst,
                  ps_done_fn cb, void *arg, ps_op **out_op);
int ps_push_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad,
                  ps_done_fn cb, void *arg, ps_op **out_op);
int ps_push_pull_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad,
                       float *dst, ps_done_fn cb, void *arg, ps_op **out_op);

int ps_assign_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *values,
                    ps_done_fn cb, void *arg, ps_op **out_op);

/* Waits for completion and returns the operation's status (also sets ps_last_error). Blocks,
 * at most the operation's deadline and retries. */
int ps_op_wait(ps_op *op);
/* True once the operation has completed. Does not block. */
bool ps_op_done(const ps_op *op);
/* Status and message of a completed operation (message owned by op; "" on success). */
int ps_op_status(const ps_op *op);
const char *ps_op_message(const ps_op *op);
/* Frees a handle. If the operation is still running it is waited for first (blocks). */
void ps_op_destroy(ps_op *op);

/* ---- one request per server per step --------------------------------------------------- */

/* One variable's part of a step: the range [offset, offset + count) of var, with count gradient
 * values to push (grad, or NULL: none) and/or room for count parameter values to pull (dst, or
 * NULL: none). At least one of grad and dst is set. */
typedef struct ps_step_item {
    ps_var *var;
    uint64_t offset, count;
    const float *grad;
    float *dst;
} ps_step_item;

/* ps_step flags. PS_STEP_CLOCK: advance this client's clock after the pushes, as ps_clock
 * does, and pull at the new clock (needs a worker id). */
#define PS_STEP_CLOCK 1u

/* A training step in one round trip per server: pushes every item's gradient, then (with
 * PS_STEP_CLOCK) advances the clock on every server, then pulls every item's parameters at
 * the new clock, waiting like ps_pull for each variable's staleness bound; the parameters
 * pulled include this step's pushes (and, under BSP, the aggregate of every worker's). Equal
 * in effect to ps_push of each item, ps_clock, then ps_pull of each item, with the same
 * exactly-once and staleness guarantees, but each server gets one message each way carrying
 * all of its variables (more only when its share exceeds chunk-bytes: then its pushes go
 * first, in messages of chunk-bytes, and its pulls and clock after them). Items may name the
 * same variable or overlap only if they do not both pull and push the same elements. grad
 * buffers are read, and dst written, until the call returns. Blocks. On an error, pushes the
 * servers acknowledged stay applied (a failed step may be retried with a new ps_step: its
 * pushes are new updates). */
int ps_step(ps_client *c, const ps_step_item *items, size_t n, unsigned flags);
/* The same, asynchronous: items is copied, but the grad and dst buffers must stay valid and
 * untouched until the operation completes; cb, out_op as for ps_push_async. */
int ps_step_async(ps_client *c, const ps_step_item *items, size_t n, unsigned flags, ps_done_fn cb,
                  void *arg, ps_op **out_op);

/* Prefetch: pulls every item's range (items only pull: grad NULL, dst set) at `clock`, or at
 * this client's clock if that is higher, without pushing or advancing the clock. Each server
 * answers once the variables' bounds allow a read at that clock (every live worker at clock - s
 * or later), with the updates it has applied by then. A worker at clock c fetches step c + 1's
 * parameters while it computes step c with clock c + 1: under SSP (s >= 1) its own clock c
 * meets the bound, so the read does not wait for its own step; under ASP nothing waits; under
 * BSP (s = 0) the answer waits until this worker has clocked too. The values hold this
 * client's own pushes only as far as the servers applied them before answering. One message
 * per server (more only beyond chunk-bytes). dst buffers are written until the operation
 * completes. PS_FAILED_PRECONDITION without a worker id. Otherwise as ps_step_async. */
int ps_pull_at_async(ps_client *c, const ps_step_item *items, size_t n, int64_t clock,
                     ps_done_fn cb, void *arg, ps_op **out_op);

/* ---- clock and cluster ------------------------------------------------------------------ */

/* Advances this client's clock by one and reports it to every server. Call it after the
 * pushes of the clock have completed: under BSP the servers apply the aggregated update once
 * every live worker has clocked past it. A worker client also sends heartbeats in the
 * background (setting heartbeat-ms); a worker that was evicted continues from the clock the
 * servers give it. *clock_out (may be NULL) receives the new clock. Blocks. */
int ps_clock(ps_client *c, int64_t *clock_out);
/* This client's current clock. Does not block. */
int64_t ps_client_clock(const ps_client *c);

/* Tells every server that this worker has finished: it leaves the barrier, so that no
 * staleness wait or BSP update of the other workers waits for its clock any more, and its
 * heartbeats stop. Later calls of this client (e.g. final pulls) work but do not bring it
 * back; a new client with the same worker id (a new run, a restarted worker) joins again.
 * Call it once its last pushes and clock are done. PS_FAILED_PRECONDITION without a worker
 * id. Blocks. */
int ps_worker_finished(ps_client *c);

/* Updates lost to server restarts, as far as this client can tell: a server that is killed
 * (SIGKILL, a crash) comes back from its newest checkpoint, and the pushes it had applied and
 * acknowledged after that checkpoint are gone. The client notices the restart in the next push
 * reply of that server (each server process has a random instance id) and counts, per variable
 * and server, the versions it had seen acknowledged above the restored one; it logs each such
 * loss once (log level warn: "ps N restarted (checkpoint version V): K acknowledged updates to
 * VAR since it are lost"). The sum over every restart seen so far; a lower bound of what the
 * cluster lost, since other clients may have had later updates acknowledged. It counts every
 * client's updates to those shards as this client saw them: summed over clients it counts a
 * loss once per client (ps_client_lost_pushes adds up). 0 after a clean restart (SIGTERM,
 * Shutdown), which loses nothing. Does not block. */
uint64_t ps_client_lost_updates(const ps_client *c);

/* This client's own pushes among those lost updates: of the pushes acknowledged to it (one per
 * variable shard and chunk), those whose update a server restart lost (they were applied after
 * the checkpoint it restored). Summed over the clients of a job it is the job's loss in pushes,
 * where ps_client_lost_updates of each client is its view of the shared total. Exact while the
 * restored checkpoint is among this client's latest 8192 pushes to the shard, else a lower
 * bound (the warning says "at least"). Does not block. */
uint64_t ps_client_lost_pushes(const ps_client *c);

typedef struct ps_server_stats {
    uint32_t task_index;
    uint64_t uptime_ms;
    uint64_t requests;
    uint64_t errors;
    uint64_t updates_applied;
    uint64_t duplicates_dropped;
    uint64_t bytes_in, bytes_out;
    uint64_t bytes_held; /* parameters and optimizer state */
    uint32_t num_variables;
    int64_t min_clock; /* slowest live worker's clock, -1 if none */
    uint32_t live_workers;
    uint64_t evictions;
    ps_staleness_stats staleness; /* all variables */
} ps_server_stats;

/* Asks server `server` (0..num_servers-1) for its counters. Blocks. */
int ps_server_status(ps_client *c, int server, ps_server_stats *out);

/* How a server's checkpoints fare (ps_server_checkpoint_status). */
typedef struct ps_checkpoint_status {
    bool enabled;             /* false: the server has no checkpoint-dir (the rest is 0) */
    uint64_t last_seq;        /* newest durable checkpoint, restored or written (0: none) */
    uint64_t age_ms;          /* since the newest it wrote (since its start if none yet) */
    uint64_t failures;        /* checkpoints failed since it started */
    uint64_t failures_in_row; /* failed since the last success */
    char last_error[512];     /* the newest failure's message ("" if none) */
} ps_checkpoint_status;

/* Asks server `server` how its checkpoints fare. Blocks. */
int ps_server_checkpoint_status(ps_client *c, int server, ps_checkpoint_status *out);

/* Which workers the servers count as live: live[i] (i < n) is set to 1 when worker i is live
 * (heard from within the liveness timeout, not evicted, not finished: ps_worker_finished) on
 * at least one server, else 0. Asks every server. Blocks. */
int ps_cluster_workers_live(ps_client *c, int n, unsigned char *live);

/* Asks every server to checkpoint its shard now; returns once every checkpoint is durable on
 * its server's disk. PS_FAILED_PRECONDITION when a server has no checkpoint-dir setting
 * (checkpoints off). Blocks. */
int ps_checkpoint(ps_client *c);

/* Asks every server to shut down cleanly (admin). Blocks until each has acknowledged. */
int ps_shutdown_cluster(ps_client *c);

/* ---- Sparse tables: int64 id -> a row of `dim` float32, spread by id over every server ----
 *
 * A row is made on a server the first time a push touches its id (from the initializer, a pure
 * function of (seed, table name, id)); a pull of an id without a row returns the initializer's
 * row without making it. Every int64 id is valid, negative ones included. Each id's row lives
 * on the server proto/README.md's table placement names. A table has a staleness bound like
 * a variable (ps_table_spec.staleness) and is in the servers' checkpoints. */
typedef struct ps_table ps_table;

typedef struct ps_table_spec {
    const char *name; /* 1..PS_MAX_NAME bytes of [A-Za-z0-9_./:-], not a variable's name */
    uint32_t dim;     /* floats per row, 1..65536 */
    ps_initializer initializer; /* ZEROS, CONSTANT, UNIFORM or NORMAL */
    double init_a, init_b;
    uint64_t seed;
    ps_optimizer optimizer; /* any, PS_OPT_FTRL and PS_OPT_ROWWISE_ADAGRAD included; per-row
                               ("lazy") updates; Adam's step count is one per row */
    double learning_rate;   /* FTRL: alpha */
    double momentum;
    bool nesterov;
    double beta1, beta2, epsilon, initial_accumulator, weight_decay;
    double ftrl_beta, l1, l2; /* FTRL */
    uint32_t min_count;       /* pushes of an id before its row is made (0, 1: the first) */
    int64_t ttl_ms;           /* rows not updated for this long are removed (0: never) */
    uint64_t max_rows; /* rows per server at most, least recently updated evicted (0: none) */
    /* PS_STALENESS_DEFAULT (the servers' default-staleness), PS_STALENESS_ASYNC,
     * PS_STALENESS_BSP (a worker's pushes of a clock are summed, or averaged per row, and
     * applied once every live worker passed it; the name at most 251 bytes), or s >= 1 (SSP:
     * a pull by a worker at clock c waits until every live worker reached c - s), as for
     * variables (docs/design.md). */
    int staleness;
    /* How the servers store the rows' parameters: PS_FLOAT32 (the default), PS_BFLOAT16 or
     * PS_FLOAT16 (half the bytes; each update rounds them, and an update smaller than half a
     * unit in the last place is lost; not with PS_OPT_ADAMW, whose decay would be). The
     * optimizer's state stays float32; pulls and pushes still carry float32 rows. */
    ps_dtype dtype;
    /* Rows each server keeps in RAM; the others live on disk under the server's cold-dir and
     * are read back when pulled or pushed (a table larger than memory; results are the same).
     * 0: every row in RAM. A server without cold-dir, or built without RocksDB, refuses it
     * (PS_INVALID_ARGUMENT). */
    uint64_t ram_rows;
} ps_table_spec;

/* Fills *spec with the defaults (zeros initializer, the optimizer's default settings as for
 * variables; FTRL: learning_rate 0.05, ftrl_beta 1, l1 = l2 = 0; row-wise Adagrad: Adagrad's;
 * no admission or eviction; staleness PS_STALENESS_DEFAULT; dtype PS_FLOAT32). */
void ps_table_spec_init(ps_table_spec *spec, const char *name, uint32_t dim, ps_optimizer opt);

/* Creates the table on every server (idempotent for the same spec; another spec under the
 * name is PS_ALREADY_EXISTS). *out is a handle to free with ps_table_free. Blocks. */
int ps_table_create(ps_client *c, const ps_table_spec *spec, ps_table **out);
/* Deletes the table from every server (admin, as ps_var_delete, whose request it sends: that
 * call deletes a table of the name too). Its rows and their memory go; calls on a handle still
 * held get PS_NOT_FOUND (a pull parked for the staleness bound when its wait ends), and the
 * name may be created again at once with fresh rows. Like a variable's delete, it is not waited
 * on until durable: a server killed before its next checkpoint restarts with the table.
 * PS_NOT_FOUND if no server has it. Blocks. */
int ps_table_delete(ps_client *c, const char *name);
/* A handle to an existing table (PS_NOT_FOUND if none). Blocks. */
int ps_table_lookup(ps_client *c, const char *name, ps_table **out);
void ps_table_free(ps_table *t);
uint32_t ps_table_dim(const ps_table *t);

/* Rows of ids[0..n) into rows[0..n*dim), in the caller's order, duplicates repeated. Each
 * distinct id is sent once; the ids are split by owning server and sent to all of them at
 * once, in requests of at most ps_table_max_ids ids. Rows (and ps_table_push's gradients) travel in
 * the client's wire-dtype: bfloat16 rounds them on the wire, the servers keep and apply float32.
 * Blocks. */
int ps_table_pull(ps_table *t, const int64_t *ids, size_t n, float *rows);
/* Pushes gradients grads[i*dim .. (i+1)*dim) of ids[i]; duplicate ids' gradients are summed
 * in the caller's order (by the client in the float32 wire dtype, which then sends each
 * distinct id once, else by the servers) and the optimizer applied once per distinct row. Each
 * request is applied exactly once (resends are dropped by its sequence number). A gradient holding
 * NaN or Inf makes the servers refuse that request whole (PS_INVALID_ARGUMENT; other servers'
 * requests of the same call may have been applied). Blocks. */
int ps_table_push(ps_table *t, const int64_t *ids, size_t n, const float *grads);
/* Asynchronous forms: start the call (every request in flight) and return at once, as
 * ps_pull_async does: ids, rows and grads must stay valid and untouched until the operation
 * completes (a resent request is built from them again); cb may be NULL; free *out_op with
 * ps_op_destroy. */
int ps_table_pull_async(ps_table *t, const int64_t *ids, size_t n, float *rows, ps_done_fn cb,
                        void *arg, ps_op **out_op);
int ps_table_push_async(ps_table *t, const int64_t *ids, size_t n, const float *grads,
                        ps_done_fn cb, void *arg, ps_op **out_op);
/* Prefetch: brings the rows of ids[0..n) that a table with a cold tier (ram_rows) keeps on
 * disk back to RAM on their servers, so that a pull or push of them soon after (the next
 * step's, named while this one computes) finds them there. Split by owning server like a
 * pull, each distinct id sent once; an id with no row makes none, and a table all in RAM does
 * nothing. A hint: no row is read out and no parameter changes. *cold (may be NULL): how many
 * rows came from disk, summed over the servers. Blocks. */
int ps_table_prefetch(ps_table *t, const int64_t *ids, size_t n, uint64_t *cold);
/* The asynchronous form, as ps_table_pull_async (ids must stay valid until it completes). */
int ps_table_prefetch_async(ps_table *t, const int64_t *ids, size_t n, ps_done_fn cb, void *arg,
                            ps_op **out_op);
/* Ids one request of t carries at most (from max-message-bytes and the server's limit). */
size_t ps_table_max_ids(const ps_table *t);
/* Admin (as ps_checkpoint): a page of the rows table t has on server `server`: their ids into
 * ids[0..max) and parameters (no optimizer state) into rows[0..max*dim), *n of them. Start
 * with *cursor = 0 and call again with the *cursor it sets until *done. Not a snapshot: a row
 * present throughout the paging comes exactly once; rows made or removed meanwhile may or may
 * not. Pages are at most ps_table_max_ids rows. Blocks. */
int ps_table_export(ps_table *t, int server, uint64_t *cursor, size_t max, int64_t *ids,
                    float *rows, size_t *n, bool *done);

/* A table as the servers hold it, summed over every server (ps_table_info_get). struct_size
 * is set by the caller to sizeof(ps_table_info); later versions add fields at the end only. */
typedef struct ps_table_info {
    size_t struct_size;
    uint32_t dim;
    int staleness; /* the bound in force: -1, 0 or s >= 1 */
    ps_optimizer optimizer;
    int servers;               /* servers that hold it (all of them) */
    uint64_t rows;             /* rows held */
    uint64_t bytes;            /* memory held: row slabs, indexes, admission sketches */
    uint64_t rows_created;     /* rows made (admitted) */
    uint64_t pushes_counted;   /* pushed ids held back by min_count */
    uint64_t evicted_ttl;      /* rows removed by ttl_ms */
    uint64_t evicted_max_rows; /* rows removed to stay within max_rows */
    uint64_t evicted_memory;   /* rows removed because max-server-bytes was reached */
    uint64_t lookups;          /* ids pulled (a request's distinct ids) */
    uint64_t rows_updated;     /* row updates applied */
    uint64_t rows_disk;        /* of rows, those on disk (a table with ram_rows) */
    uint64_t promotions;       /* rows moved from disk into RAM */
    uint64_t demotions;        /* rows moved from RAM to disk */
    uint64_t cold_hits;        /* ids pulled or pushed that were on disk (prefetched ones not) */
} ps_table_info;

/* Fills *out (its struct_size set) for the table `name` from every server's ServerStatus.
 * PS_NOT_FOUND if no server has it. Blocks. */
int ps_table_info_get(ps_client *c, const char *name, ps_table_info *out);
/* The names of the cluster's tables, in name order; free with ps_names_free. Blocks. */
int ps_table_list(ps_client *c, char ***names, size_t *count);

/* One sparse table's part of a step (ps_step_ex): n ids of table, with grads (n x dim floats,
 * row i the gradient of ids[i]; NULL: no push) and/or room for their rows (n x dim floats;
 * NULL: no pull). At least one of grads and rows is set; n may be 0 (nothing to move).
 * struct_size is sizeof(ps_table_item) as the caller was compiled (PS_TABLE_ITEM_INIT sets
 * it): later versions add fields only at the end and read only what the caller's size holds.
 * It is also the array's stride, so every item of one array has the same struct_size. */
typedef struct ps_table_item {
    size_t struct_size;
    ps_table *table;
    const int64_t *ids;
    size_t n;
    const float *grads;
    float *rows;
} ps_table_item;
#define PS_TABLE_ITEM_INIT                                                                         \
    {                                                                                              \
        sizeof(ps_table_item), NULL, NULL, 0, NULL, NULL                                           \
    }

/* ps_step with table items: a training step's dense items and table rows in one request per
 * server (more only when a server's share exceeds chunk-bytes, as for ps_step). Each server
 * gets, in this order: the dense pushes, the table pushes (each exactly once, like
 * ps_table_push; duplicate ids of an item summed), with PS_STEP_CLOCK the clock, then the
 * dense pulls and the table rows at that clock, each waiting for its variable's or table's
 * staleness bound. Rows come back in each item's order, duplicates repeated, and include this
 * step's pushes. Pushes and pulls travel in the client's wire-dtype (bfloat16 rounds them).
 * ids, grads and rows are read and written until the call returns. Blocks. */
int ps_step_ex(ps_client *c, const ps_step_item *items, size_t n, const ps_table_item *tables,
               size_t ntables, unsigned flags);
/* The same, asynchronous: items and table items are copied, but the buffers they point at
 * must stay valid and untouched until the operation completes; cb, out_op as for
 * ps_push_async. */
int ps_step_ex_async(ps_client *c, const ps_step_item *items, size_t n, const ps_table_item *tables,
                     size_t ntables, unsigned flags, ps_done_fn cb, void *arg, ps_op **out_op);

#ifdef __cplusplus
}
#endif

#endif
