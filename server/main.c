/* ps-server: holds a shard of the model's variables and applies updates as they arrive. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ckpt_dir.h"
#include "cold_store.h"
#include "events_export.h"
#include "http_endpoint.h"
#include "ipc_socket.h"
#include "jemalloc_conf.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "program.h"
#include "replica.h"
#include "server.h"
#include "slot_gate.h"
#include "slot_move_rpc.h"
#include "slot_start.h"
#include "table_bsp.h"
#include "table_status.h"
#include "timeutil.h"
#include "view_agent.h"
#include "tls.h"

/* /metrics of the state that lives in the server's structures (metrics.h collector). */
static void collect_state(metrics_out *out, server_state *st)
{
    char num[32];
    metrics_emit_one(out, "psd_server_uptime_seconds", METRIC_GAUGE, "Seconds since start.",
                     (double)(time_now_ns() - st->start_ns) * 1e-9);
    metrics_emit_one(out, "psd_server_updates_applied_total", METRIC_COUNTER,
                     "Updates (pushes) applied to variables.",
                     (double)atomic_load(&st->updates_applied));
    metrics_emit_one(out, "psd_server_duplicates_dropped_total", METRIC_COUNTER,
                     "Retried pushes recognised and not applied again.",
                     (double)atomic_load(&st->duplicates_dropped));
    slot_map map = server_slots(st);
    uint32_t owned = 0;
    for (uint32_t s = 0; s < map.nslots; s++)
        owned += slots_owner(&map, s) == st->task_index;
    metrics_emit_one(out, "psd_slots_owned", METRIC_GAUGE,
                     "Slots of the slot map this server holds (whole variables and table rows "
                     "placed in them).",
                     (double)owned);
    slot_move_stats ms;
    slot_move_stats_get(&ms);
    static const char *const results[] = {"started", "finished", "failed"};
    const uint64_t counts[] = {ms.started, ms.finished, ms.failed};
    metrics_emit_header(out, "psd_slot_moves_total", METRIC_COUNTER,
                        "Batches of slots this server sent to another, by result (started; "
                        "finished: the map gave them there; failed: they stayed here).");
    for (int i = 0; i < 3; i++) {
        const char *labels[] = {"result", results[i], NULL};
        metrics_emit(out, "psd_slot_moves_total", labels, (double)counts[i]);
    }
    metrics_emit_one(out, "psd_slot_bytes_moved_total", METRIC_COUNTER,
                     "Bytes of the batches of slots this server sent to another.",
                     (double)ms.bytes);
    metrics_emit_one(out, "psd_server_memory_bytes", METRIC_GAUGE,
                     "Bytes held by every variable (parameters, optimizer slots).",
                     (double)store_bytes(st->vars));
    checkpointer *ck = checkpointer_of(st);
    if (ck) {
        checkpoint_health h;
        checkpointer_health(ck, &h);
        metrics_emit_one(out, "psd_checkpoint_age_seconds", METRIC_GAUGE,
                         "Seconds since the newest checkpoint this server wrote became durable "
                         "(since its start while it has written none).",
                         h.age_s);
        metrics_emit_one(out, "psd_checkpoint_failures_in_row", METRIC_GAUGE,
                         "Checkpoints failed since the last one that succeeded.",
                         (double)h.failures_row);
    }
    variable **vars;
    size_t n = store_list(st->vars, &vars);
    static const struct {
        const char *name, *help;
        metric_type type;
    } vm[] = {
        {"psd_variable_memory_bytes", "Bytes of a variable's parameters and optimizer slots.",
         METRIC_GAUGE},
        {"psd_variable_version", "Updates applied to a variable.", METRIC_GAUGE},
        {"psd_variable_staleness_max_clocks", "Largest staleness a pull of a variable observed.",
         METRIC_GAUGE},
        {"psd_variable_pulls_total", "Pulls of a variable by workers.", METRIC_COUNTER},
        {"psd_variable_pull_waits_total", "Pulls of a variable that waited for the bound.",
         METRIC_COUNTER},
        {"psd_variable_pull_timeouts_total", "Pulls of a variable whose wait timed out.",
         METRIC_COUNTER},
    };
    Psd__V1__StalenessStats *obs = calloc(n ? n : 1, sizeof(*obs));
    uint64_t *hist = calloc((n ? n : 1) * STALENESS_BUCKETS, sizeof(uint64_t));
    for (size_t i = 0; obs && hist && i < n; i++)
        sync_variable_stats(vars[i], &obs[i], hist + i * STALENESS_BUCKETS);
    for (size_t k = 0; vars && obs && hist && n > 0 && k < sizeof(vm) / sizeof(vm[0]); k++) {
        metrics_emit_header(out, vm[k].name, vm[k].type, vm[k].help);
        for (size_t i = 0; i < n; i++) {
            const variable *v = vars[i];
            if (variable_is_head(v))
                continue; /* its parts have their own series, labelled by part */
            char part[24];
            snprintf(part, sizeof(part), "%llu", (unsigned long long)v->part);
            const char *labels[] = {"variable", v->name, v->spec->parts ? "part" : NULL, part,
                                    NULL};
            double x = k == 0   ? (double)v->count * sizeof(float) * (double)(1 + v->nslots)
                       : k == 1 ? (double)atomic_load(&v->version)
                       : k == 2 ? (double)obs[i].max
                       : k == 3 ? (double)obs[i].pulls
                       : k == 4 ? (double)obs[i].waits
                                : (double)obs[i].timeouts;
            metrics_emit(out, vm[k].name, labels, x);
        }
    }
    free(obs);
    free(hist);
    size_t names = 0; /* the parts of a variable count once, by its head */
    for (size_t i = 0; vars && i < n; i++)
        names += vars[i]->part == VARIABLE_HEAD;
    store_list_release(vars, n);
    metrics_emit_one(out, "psd_server_variables", METRIC_GAUGE, "Variables held.", (double)names);
    server_tables_metrics(out, st);
    Psd__V1__ServerStatusReply rep = PSD__V1__SERVER_STATUS_REPLY__INIT;
    sync_status(st, &rep);
    metrics_emit_one(out, "psd_server_workers_evicted_total", METRIC_COUNTER,
                     "Workers evicted for silence.", (double)rep.evictions);
    metrics_emit_one(out, "psd_server_min_clock", METRIC_GAUGE,
                     "Clock of the slowest live worker (-1: none).", (double)rep.min_clock);
    if (rep.n_workers > 0) {
        metrics_emit_header(out, "psd_server_worker_clock", METRIC_GAUGE,
                            "Clock (steps finished) of each worker this server knows.");
        for (size_t i = 0; i < rep.n_workers; i++) {
            snprintf(num, sizeof(num), "%d", (int)rep.workers[i]->id);
            const char *labels[] = {"worker", num, NULL};
            metrics_emit(out, "psd_server_worker_clock", labels, (double)rep.workers[i]->clock);
        }
        metrics_emit_header(out, "psd_server_worker_live", METRIC_GAUGE,
                            "1 while a worker is live, 0 once evicted.");
        for (size_t i = 0; i < rep.n_workers; i++) {
            snprintf(num, sizeof(num), "%d", (int)rep.workers[i]->id);
            const char *labels[] = {"worker", num, NULL};
            metrics_emit(out, "psd_server_worker_live", labels, rep.workers[i]->live ? 1 : 0);
        }
    }
    sync_status_free(&rep);
}

/* The server's metrics, read under its state's swap lock (a rejoin copy may replace what the
 * state holds). */
static void server_collect(metrics_out *out, void *arg)
{
    server_state *st = arg;
    server_state_read_begin(st);
    collect_state(out, st);
    server_state_read_end(st);
}

/* /readyz's detail: checkpoints that fail leave the server ready (it serves correctly; taking
 * it out of service would stop training) but say so (docs/operations.md, Durability). */
static void checkpoint_detail(void *arg, char *buf, size_t cap)
{
    checkpoint_health h;
    checkpointer_health(checkpointer_of(arg), &h);
    if (h.failures_row > 0)
        snprintf(buf, cap,
                 "checkpoints failing: %llu in a row; newest durable checkpoint %llu, none "
                 "written for %.0f s; last error: %.500s",
                 (unsigned long long)h.failures_row, (unsigned long long)h.last_seq, h.age_s,
                 h.last_error);
}

/* An ipc:// socket file left by a dead server makes nng's listener fail with EADDRINUSE:
 * removes path if it is a socket that no live socket is bound to. Liveness is read from
 * /proc/net/unix (Linux) rather than by connecting: a bare connect() that closes without the
 * SP handshake was seen to stop a live nng IPC listener from serving. A live listener, a file
 * that is not a socket, or an unreadable /proc/net/unix leaves the file alone (the listen then
 * fails and says so). Returns 0, or -1 (logged) when a stale socket cannot be removed. */
static int server_remove_stale_ipc(const char *path)
{
    struct stat stt;
    if (lstat(path, &stt) != 0 || !S_ISSOCK(stt.st_mode))
        return 0;
    if (ipc_socket_bound(path, false) != 0)
        return 0; /* live, or the table cannot be read */
    if (unlink(path) != 0 && errno != ENOENT) {
        log_error("cannot remove stale ipc socket %s: %s", path, strerror(errno));
        return -1;
    }
    log_info("removed stale ipc socket %s (no server was listening on it)", path);
    return 0;
}

/* The pool's size: `threads`, or for 0 one thread per online core (at least 2, so that one
 * long update does not hold up the rest; at most the setting's bound) - large updates of
 * different variables or ranges then apply in parallel on every core. */
static int pool_threads(int64_t setting)
{
    if (setting > 0)
        return (int)setting;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 2)
        return 2;
    return cores > 256 ? 256 : (int)cores;
}

/* cold-dir: an existing directory this process may write, under which tables with ram_rows keep
 * the rows that do not fit in RAM. Returns 0, or -1 (logged): a configuration error, which a
 * restart does not cure. */
static int check_cold_dir(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        log_error("cold-dir %s: %s (create the directory, or leave cold-dir empty)", dir,
                  strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        log_error("cold-dir %s: not a directory", dir);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        log_error("cold-dir %s: not writable: %s", dir, strerror(errno));
        return -1;
    }
    if (!cold_store_available())
        log_warn("cold-dir %s is set but this server was built without RocksDB: tables with "
                 "ram_rows are refused",
                 dir);
    return 0;
}

static const char usage[] =
    "usage: ps-server [options]\n"
    "Serves one parameter-server task of the cluster given by TF_CONFIG or --cluster/--task.";

int main(int argc, char **argv)
{
    program prog;
    bool exit_now;
    int rc = program_start(&prog, argc, argv, OPT_SCOPE_SERVER, "ps", usage, true, &exit_now);
    if (exit_now)
        return rc;
    const cluster_spec *cl = &prog.cluster;
    /* join: a new server of a running cluster, whose spec names the existing servers and no
     * task; its index is its place in the published slot map (slot_start). */
    bool join = opt_bool(prog.opts, OPT_JOIN);
    const char *listen = opt_str(prog.opts, OPT_LISTEN);
    if (join && (cl->task_type[0] != '\0' || listen == NULL || listen[0] == '\0')) {
        log_error("join: %s", cl->task_type[0] != '\0'
                                  ? "a joining server has no task in the cluster spec (its spec "
                                    "names the existing servers; drop task/--task)"
                                  : "set listen to this server's own address, e.g. --listen "
                                    "tcp://10.0.0.3:2222 (it registers there)");
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    if (!join && strcmp(cl->task_type, "ps") != 0) {
        log_error("task is \"%s:%d\" but ps-server serves a ps task (set task.type to \"ps\")",
                  cl->task_type[0] ? cl->task_type : "(none)", cl->task_index);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    char plain[300], url[310];
    rpc_tls tls = {
        .ca = opt_str(prog.opts, OPT_TLS_CA),
        .cert = opt_str(prog.opts, OPT_TLS_CERT),
        .key = opt_str(prog.opts, OPT_TLS_KEY),
        .engine = opt_enum(prog.opts, OPT_TLS_ENGINE),
    };
    if (listen && listen[0]) {
        snprintf(plain, sizeof(plain), "%s", listen);
    } else if (cluster_url(cl->ps[cl->task_index], plain, sizeof(plain)) != 0) {
        log_error("cluster address \"%s\" is too long", cl->ps[cl->task_index]);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    if (cluster_is_ipc(plain) && rpc_tls_on(&tls)) {
        log_error("listen address \"%s\": ipc:// is local-only and cannot use TLS; unset "
                  "tls-ca/tls-cert/tls-key or use a host:port (TCP) address",
                  plain);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    if (cluster_is_ipc(plain) && server_remove_stale_ipc(plain + strlen(CLUSTER_IPC_PREFIX)) != 0) {
        program_end(&prog);
        return 1;
    }
    if (rpc_tls_url(plain, rpc_tls_on(&tls), url, sizeof(url)) != 0) {
        log_error("listen address \"%s\" is too long", plain);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    if (rpc_tls_on(&tls)) { /* a configuration error exits 2 before anything starts */
        nng_tls_config *check;
        char terr[700];
        if (rpc_tls_config(&check, &tls, true, terr, sizeof(terr)) != 0) {
            log_error("%s", terr);
            program_end(&prog);
            return PROGRAM_EXIT_CONFIG;
        }
        nng_tls_config_free(check);
    }
    /* Admin role: a token from a file (never on the command line), else loopback only. */
    static char admin_token[256];
    const char *token_file = opt_str(prog.opts, OPT_ADMIN_TOKEN_FILE);
    if (token_file && token_file[0]) {
        char terr[512];
        if (rpc_read_token(token_file, admin_token, sizeof(admin_token), terr, sizeof(terr)) != 0) {
            log_error("%s", terr);
            program_end(&prog);
            return PROGRAM_EXIT_CONFIG;
        }
    }

    /* Replication needs a coordinator, and a group of distinct servers (exit 2 otherwise). */
    uint32_t n_replicas = (uint32_t)opt_int(prog.opts, OPT_REPLICAS);
    const char *coordinator = opt_str(prog.opts, OPT_COORDINATOR);
    if (n_replicas > 1 && (coordinator == NULL || coordinator[0] == '\0')) {
        log_error("replicas %u needs a coordinator: set coordinator to the etcd endpoints that "
                  "keep the cluster's view, e.g. --coordinator http://127.0.0.1:2379 "
                  "(docs/operations.md, Replication)",
                  n_replicas);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    if (join && (coordinator == NULL || coordinator[0] == '\0' || n_replicas > 1)) {
        log_error("join: %s",
                  n_replicas > 1 ? "replicas > 1 cannot grow yet: moving slots needs replicas 1 "
                                   "(a replica group's slots would move with its log, which is "
                                   "not done)"
                                 : "set coordinator to the etcd endpoints of the cluster (its slot "
                                   "map lives there), e.g. --coordinator http://127.0.0.1:2379");
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    /* With a coordinator (replicas 1) the slot map is the one published in etcd: read, made by
     * the first server, or joined. Replicated clusters keep the static map. */
    static slots_record slot_rec;
    uint32_t self = join ? 0 : (uint32_t)cl->task_index;
    if (n_replicas == 1 && coordinator != NULL && coordinator[0] != '\0') {
        char join_addr[SLOTS_ADDR_MAX], serr[2048];
        if (join &&
            slot_join_address(listen, join_addr, sizeof(join_addr), serr, sizeof(serr)) != 0) {
            log_error("%s", serr);
            program_end(&prog);
            return PROGRAM_EXIT_CONFIG;
        }
        slot_start_config sc = {
            .endpoints = coordinator,
            .prefix = opt_str(prog.opts, OPT_COORDINATOR_PREFIX),
            .cl = cl,
            .join_addr = join ? join_addr : NULL,
            .wait_ms = 30000,
        };
        int src = slot_start(&sc, &slot_rec, &self, serr, sizeof(serr));
        if (src != 0) {
            log_error("%s", serr);
            program_end(&prog);
            return src;
        }
        if (join) { /* log lines name its index from now on */
            log_level lvl = LOG_INFO;
            log_format fmt = LOG_FORMAT_AUTO;
            log_level_parse(opt_enum(prog.opts, OPT_LOG_LEVEL), &lvl);
            log_format_parse(opt_enum(prog.opts, OPT_LOG_FORMAT), &fmt);
            log_init("ps", (int)self, lvl, fmt);
        }
    }
    if (n_replicas > 1 && (n_replicas > cl->n_ps || cl->n_ps > VIEW_MAX_SERVERS)) {
        log_error("replicas %u: the cluster has %zu ps tasks; a replica group needs that many "
                  "distinct servers (and at most %d ps tasks)",
                  n_replicas, cl->n_ps, VIEW_MAX_SERVERS);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }

    /* TensorBoard event files of the metrics: an unwritable events-dir is a configuration
     * error, found before anything starts. */
    events_export *events = NULL;
    if (opt_str(prog.opts, OPT_EVENTS_DIR)[0] != '\0') {
        char eerr[4600];
        if (events_export_open(&events, opt_str(prog.opts, OPT_EVENTS_DIR), (int)self,
                               (int)opt_int(prog.opts, OPT_EVENTS_INTERVAL_S), eerr,
                               sizeof(eerr)) != 0) {
            log_error("%s", eerr);
            program_end(&prog);
            return PROGRAM_EXIT_CONFIG;
        }
    }

    /* Signals are taken synchronously by the main thread only. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    const char *cold_dir = opt_str(prog.opts, OPT_COLD_DIR);
    if (cold_dir && cold_dir[0] && check_cold_dir(cold_dir) != 0) {
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    if (cold_dir && cold_dir[0]) {
        int stale = cold_store_remove_stale(cold_dir);
        if (stale > 0)
            log_info("cold-dir %s: removed %d table stores that stopped processes left", cold_dir,
                     stale);
    }
    registry_set_cold_dir(cold_dir);

    static server_state st;
    st.task_index = self;
    st.num_servers = (uint32_t)cl->n_ps;
    st.slots =
        slot_rec.nslots ? slots_record_map(&slot_rec) : slots_static(SLOTS_DEFAULT, st.num_servers);
    /* Slots move between live servers: the gate and the methods that move them. */
    static char slot_pfx[512];
    if (slot_rec.nslots) {
        slot_prefix(opt_str(prog.opts, OPT_COORDINATOR_PREFIX), cl, slot_pfx, sizeof(slot_pfx));
        if (slot_gate_start(&st, &slot_rec) != 0) {
            log_error("out of memory for the slot map");
            program_end(&prog);
            return 1;
        }
        slot_gate_failpoint(opt_str(prog.opts, OPT_TEST_FAILPOINT));
        slot_move_config mc = {.endpoints = coordinator,
                               .prefix = slot_pfx,
                               .tls = tls,
                               .failpoint = opt_str(prog.opts, OPT_TEST_FAILPOINT)};
        slot_move_rpc_init(&mc);
    }
    st.start_ns = time_now_ns();
    st.vars = store_create();
    st.dedup = dedup_create((uint32_t)opt_int(prog.opts, OPT_DEDUP_WINDOW));
    st.default_staleness = (int32_t)opt_int(prog.opts, OPT_DEFAULT_STALENESS);
    /* Every worker of the spec is expected from the start (the chief is worker 0). */
    int n_workers = (int)(cl->n_chief + cl->n_worker);
    st.sync = sync_create(n_workers, (uint32_t)opt_int(prog.opts, OPT_WORKER_TIMEOUT_MS),
                          strcmp(opt_enum(prog.opts, OPT_BSP_AGGREGATION), "mean") == 0,
                          SERVER_MAX_WORKERS);
    if (st.vars == NULL || st.dedup == NULL || st.sync == NULL ||
        server_set_limits(&st, (uint64_t)opt_int(prog.opts, OPT_MAX_SERVER_BYTES),
                          (uint32_t)opt_int(prog.opts, OPT_REPLICAS),
                          (uint64_t)opt_int(prog.opts, OPT_MAX_VARIABLES),
                          (uint64_t)opt_int(prog.opts, OPT_DEDUP_MAX_CLIENTS),
                          (uint64_t)opt_int(prog.opts, OPT_DEDUP_IDLE_MS)) != 0) {
        log_error("out of memory");
        return 1;
    }
    /* The sparse tables' BSP aggregates apply when the barrier moves. */
    sync_set_barrier_fn(server_tables_bsp_apply);
    /* /metrics, /livez, /readyz: up from the start, ready once restored and listening. */
    http_endpoint *http;
    if (http_endpoint_start_logged(&http, opt_str(prog.opts, OPT_HTTP_LISTEN)) != 0) {
        program_end(&prog);
        return 1;
    }
    if (http) {
        http_endpoint_set_ready(http, false, "restoring checkpoint");
        metrics_add_collector(server_collect, &st);
    }
    /* Checkpoints: restore the newest valid one before serving, then keep writing them. */
    checkpoint_config ck_cfg = {
        .dir = opt_str(prog.opts, OPT_CHECKPOINT_DIR),
        .keep = (int)opt_int(prog.opts, OPT_CHECKPOINT_KEEP),
        .full_every = (int)opt_int(prog.opts, OPT_CHECKPOINT_FULL_EVERY),
        .interval_s = opt_int(prog.opts, OPT_CHECKPOINT_INTERVAL_S),
        .interval_updates = opt_int(prog.opts, OPT_CHECKPOINT_INTERVAL_UPDATES),
        .cluster_hash = checkpoint_cluster_hash(cl->ps, cl->n_ps),
        .failpoint = opt_str(prog.opts, OPT_TEST_FAILPOINT),
        .replicas = (uint32_t)opt_int(prog.opts, OPT_REPLICAS),
    };
    checkpointer *ck = NULL;
    int ck_lock = -1;
    char err[1536];
    checkpoint_info own_restore = {0}; /* its log position, with replicas > 1 */
    if (ck_cfg.dir && ck_cfg.dir[0]) {
        checkpoint_info ri;
        uint64_t max_seq = 0;
        int fail = 0, r = CKPT_NONE;
        /* One server of a task per directory: a second one would restore, overwrite and prune
         * the first one's checkpoints. A configuration error: a restart does not cure it. */
        ck_lock = ckpt_dir_lock(ck_cfg.dir, st.task_index, err, sizeof(err));
        if (ck_lock < 0) {
            log_error("%s", err);
            fail = PROGRAM_EXIT_CONFIG;
        }
        ckpt_record last;
        if (fail == 0) {
            ckpt_record_read(ck_cfg.dir, st.task_index, &last);
            r = checkpoint_restore(&st, &ck_cfg, &ri, &max_seq, err, sizeof(err));
        }
        if (r == CKPT_REFUSED || r == CKPT_FAILED) {
            /* Another cluster's checkpoint, or only damaged ones: restarting changes neither. */
            log_error("%s%s", err,
                      r == CKPT_FAILED ? " (move the unusable files out of the directory to start "
                                         "empty, or put a good checkpoint back)"
                                       : "");
            fail = PROGRAM_EXIT_CONFIG;
        }
        if (fail == 0 && r == CKPT_RESTORED && ri.from_servers) {
            own_restore = ri;
            sync_resume(&st);
            log_info("restored the slots of ps %u of %u from the checkpoints of a cluster of %u "
                     "ps tasks in %s (%u deltas): %u variables, %llu table rows, %llu bytes in "
                     "%llu ms",
                     st.task_index, st.num_servers, ri.from_servers, ck_cfg.dir, ri.deltas,
                     ri.variables, (unsigned long long)ri.table_rows, (unsigned long long)ri.bytes,
                     (unsigned long long)ri.ms);
        } else if (fail == 0 && r == CKPT_RESTORED) {
            own_restore = ri;
            sync_resume(&st);
            log_info("restored %s: checkpoint %llu (full %llu + %u deltas), %u variables, %llu "
                     "table rows, %llu bytes in %llu ms",
                     ri.path, (unsigned long long)ri.seq, (unsigned long long)ri.base, ri.deltas,
                     ri.variables, (unsigned long long)ri.table_rows, (unsigned long long)ri.bytes,
                     (unsigned long long)ri.ms);
        }
        if (fail == 0 && !(r == CKPT_RESTORED && ri.from_servers)) {
            char verdict[1024];
            bool lost = ckpt_restore_verdict(&last, st.task_index, r == CKPT_RESTORED, ri.seq,
                                             ri.versions, n_replicas > 1, verdict, sizeof(verdict));
            if (lost)
                log_warn("%s", verdict);
            else
                log_info("%s", verdict);
        }
        if (fail == 0) {
            ck = checkpointer_create(&st, &ck_cfg, max_seq + 1, err, sizeof(err));
            if (ck == NULL) {
                log_error("%s", err);
                fail = PROGRAM_EXIT_CONFIG;
            } else if (r == CKPT_RESTORED && ri.from_servers) {
                /* This server's own checkpoint of what it restored, before it serves: from now
                 * on it restores from its own files, not the old cluster's. */
                checkpoint_info wi;
                if (checkpoint_write(ck, &wi, err, sizeof(err)) != 0) {
                    log_error("the first checkpoint after restoring from a cluster of %u ps "
                              "tasks failed: %s",
                              ri.from_servers, err);
                    fail = 1;
                }
            } else if (r == CKPT_RESTORED) {
                checkpointer_set_restored(ck, ri.seq, ri.versions);
            }
            if (ck && checkpointer_start(ck, err, sizeof(err)) != 0) {
                log_error("%s", err);
                fail = 1;
            }
        }
        if (fail != 0) {
            metrics_remove_collector(server_collect, &st);
            http_endpoint_stop(http);
            checkpointer_destroy(ck);
            ckpt_dir_unlock(ck_lock);
            server_state_clear(&st);
            program_end(&prog);
            return fail;
        }
    } else if (opt_is_set(prog.opts, OPT_CHECKPOINT_INTERVAL_S) || ck_cfg.interval_updates > 0) {
        log_warn("checkpoint-interval-s/-updates are set but checkpoint-dir is empty: "
                 "checkpoints are off");
    }
    rpc_server_config rc_cfg = {
        .url = url,
        .contexts = (int)opt_int(prog.opts, OPT_RPC_CONTEXTS),
        .threads = pool_threads(opt_int(prog.opts, OPT_THREADS)),
        .max_message = (size_t)opt_int(prog.opts, OPT_MAX_MESSAGE_BYTES),
        .inline_max = (size_t)opt_int(prog.opts, OPT_INLINE_MAX_BYTES),
        .default_deadline_ms = (uint32_t)opt_int(prog.opts, OPT_DEFAULT_DEADLINE_MS),
        .max_deadline_ms = (uint32_t)opt_int(prog.opts, OPT_MAX_DEADLINE_MS),
        .max_connections = (int)opt_int(prog.opts, OPT_MAX_CONNECTIONS),
        .max_per_connection = (int)opt_int(prog.opts, OPT_MAX_REQUESTS_PER_CONNECTION),
        .max_parked = (int)opt_int(prog.opts, OPT_MAX_WAITING),
        .methods = server_methods,
        .n_methods = server_methods_len,
        .handler_arg = &st,
        .drop_percent = (int)opt_int(prog.opts, OPT_TEST_DROP_PERCENT),
        .dup_percent = (int)opt_int(prog.opts, OPT_TEST_DUP_PERCENT),
        .drop_reply_percent = (int)opt_int(prog.opts, OPT_TEST_DROP_REPLY_PERCENT),
        .tls = tls,
        .admin_token = admin_token,
    };
    uint32_t replicas = n_replicas;
    static char peer_urls[VIEW_MAX_SERVERS][300];
    static const char *peer_url_ptrs[VIEW_MAX_SERVERS];
    if (replicas > 1) {
        int rfail = 0;
        for (size_t i = 0; rfail == 0 && i < cl->n_ps; i++) {
            char p[300];
            if (cluster_url(cl->ps[i], p, sizeof(p)) != 0 ||
                rpc_tls_url(p, rpc_tls_on(&tls), peer_urls[i], sizeof(peer_urls[i])) != 0) {
                log_error("cluster address \"%s\" is too long", cl->ps[i]);
                rfail = PROGRAM_EXIT_CONFIG;
            }
            peer_url_ptrs[i] = peer_urls[i];
        }
        replica_config rcfg = {
            .self = st.task_index,
            .num_servers = st.num_servers,
            .replicas = replicas,
            .urls = peer_url_ptrs,
            .tls = tls,
            .max_message = rc_cfg.max_message,
            .dedup_window = (uint32_t)opt_int(prog.opts, OPT_DEDUP_WINDOW),
            .default_staleness = st.default_staleness,
            .n_workers = n_workers,
            .lease_ms = (uint32_t)opt_int(prog.opts, OPT_LEASE_MS),
            .worker_timeout_ms = (uint32_t)opt_int(prog.opts, OPT_WORKER_TIMEOUT_MS),
            .bsp_mean = strcmp(opt_enum(prog.opts, OPT_BSP_AGGREGATION), "mean") == 0,
            .max_bytes = (uint64_t)opt_int(prog.opts, OPT_MAX_SERVER_BYTES),
            .max_vars = (uint64_t)opt_int(prog.opts, OPT_MAX_VARIABLES),
            .dedup_max_clients = (uint64_t)opt_int(prog.opts, OPT_DEDUP_MAX_CLIENTS),
            .dedup_idle_ms = (uint64_t)opt_int(prog.opts, OPT_DEDUP_IDLE_MS),
            .cluster_hash = checkpoint_cluster_hash(cl->ps, cl->n_ps),
            .coordinated = true,
            .own_ck = ck,
            .ckpt = &ck_cfg,
            .own_restored = own_restore.has_position,
            .own_epoch = own_restore.epoch,
            .own_lsn = own_restore.lsn,
        };
        if (rfail == 0 && replica_start(&rcfg, &st, err, sizeof(err)) != 0) {
            log_error("%s", err);
            rfail = 1;
        }
        /* The failover agent: this server's lease and the view in etcd, started once the groups
         * are restored (it publishes their copies with its registration). */
        if (rfail == 0) {
            char prefix[64], self_url[300];
            const char *pfx = opt_str(prog.opts, OPT_COORDINATOR_PREFIX);
            if (pfx == NULL || pfx[0] == '\0') {
                view_default_prefix((const char *const *)cl->ps, cl->n_ps, prefix, sizeof(prefix));
                pfx = prefix;
            }
            if (cluster_url(cl->ps[cl->task_index], self_url, sizeof(self_url)) != 0)
                snprintf(self_url, sizeof(self_url), "%s", plain);
            static view_copy copies[VIEW_MAX_SERVERS];
            view_agent_config va_cfg = {
                .endpoints = coordinator,
                .prefix = pfx,
                .self = st.task_index,
                .num_servers = st.num_servers,
                .replicas = n_replicas,
                .url = self_url,
                .lease_ms = opt_int(prog.opts, OPT_LEASE_MS),
                .copies = copies,
                .ncopies = replica_restored_copies(copies, VIEW_MAX_SERVERS),
            };
            if (view_agent_start(&st.view_agent, &va_cfg, err, sizeof(err)) != 0) {
                log_error("%s", err);
                replica_stop();
                replica_free();
                rfail = PROGRAM_EXIT_CONFIG;
            }
        }
        if (rfail) {
            view_agent_stop(st.view_agent);
            metrics_remove_collector(server_collect, &st);
            http_endpoint_stop(http);
            checkpointer_destroy(ck);
            ckpt_dir_unlock(ck_lock);
            program_end(&prog);
            return rfail;
        }
        rc_cfg.methods = replica_methods(&rc_cfg.n_methods);
        rc_cfg.handler_arg = replica_handler_arg();
        /* From here the agent's views reach the groups (the one it knows already at once). */
        replica_attach_agent(st.view_agent);
        view_agent_on_change(st.view_agent, replica_on_view_event, NULL);
    }
    if (rc_cfg.default_deadline_ms > rc_cfg.max_deadline_ms) {
        log_warn("default-deadline-ms %u is above max-deadline-ms %u: requests that carry no "
                 "deadline get %u ms",
                 rc_cfg.default_deadline_ms, rc_cfg.max_deadline_ms, rc_cfg.max_deadline_ms);
        rc_cfg.default_deadline_ms = rc_cfg.max_deadline_ms;
    }
    if (rpc_server_start(&st.rpc, &rc_cfg, err, sizeof(err)) != 0) {
        log_error("%s", err);
        view_agent_halt(st.view_agent); /* no view reaches the groups after this */
        replica_stop();
        replica_free();
        view_agent_free(st.view_agent);
        st.view_agent = NULL;
        metrics_remove_collector(server_collect, &st);
        http_endpoint_stop(http);
        checkpointer_destroy(ck);
        ckpt_dir_unlock(ck_lock);
        server_state_clear(&st);
        program_end(&prog);
        return 1;
    }
    if (replicas > 1)
        replica_set_server(st.rpc);
    if (ck) {
        checkpointer_record(ck, false); /* a restart before the next record: a crash */
        http_endpoint_set_detail_fn(http, checkpoint_detail, &st);
    }
    http_endpoint_set_ready(http, true, NULL);
    if (events != NULL) {
        if (http == NULL) /* the figures of the server's structures, as /metrics has them */
            metrics_add_collector(server_collect, &st);
        events_export_start(events);
    }
    log_info("ps %u of %u serving on %s (version %s, instance %016llx), expecting %d worker(s), "
             "%d pool threads",
             st.task_index, st.num_servers, url, PSD_VERSION,
             (unsigned long long)rpc_server_instance(st.rpc), n_workers, rc_cfg.threads);
    char admin_names[256] = "";
    for (size_t i = 0, len = 0; i < server_methods_len; i++)
        if ((server_methods[i].flags & RPC_ADMIN) && len < sizeof(admin_names))
            len += (size_t)snprintf(admin_names + len, sizeof(admin_names) - len, "%s%s",
                                    len ? ", " : "", server_methods[i].name);
    char tls_line[200];
    snprintf(tls_line, sizeof(tls_line),
             "mutual TLS (peers need a certificate signed by tls-ca; tls-engine %s, %s)",
             tls.engine, tls_engine_describe(tls.engine));
    log_info("security: %s; admin methods (%s) %s",
             rpc_tls_on(&tls)
                 ? tls_line
                 : "plain TCP, no TLS (set tls-ca, tls-cert and tls-key to turn it on)",
             admin_names,
             admin_token[0] ? "need the admin token of admin-token-file"
                            : "allowed from loopback peers only (no admin-token-file)");

    int sig = 0;
    while (!atomic_load(&st.shutdown_requested)) {
        struct timespec ts = {0, 50 * 1000000};
        sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig > 0)
            break;
        if (replica_sweeps_own()) {
            server_state_read_begin(&st);
            sync_sweep(&st); /* liveness and wait deadlines */
            server_state_read_end(&st);
        }
        replica_sweep(); /* ... of the groups it took over */
    }
    if (sig > 0)
        log_info("received %s, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    else {
        log_info("shutdown requested by a client");
        /* Let the acknowledgement leave before the socket closes. */
        struct timespec ts = {0, 200 * 1000000};
        nanosleep(&ts, NULL);
    }
    http_endpoint_set_ready(http, false, "shutting down");
    /* The lease first: the others fail over at once, whatever the drain below waits for
     * (updates in progress here are answered once their backups applied them, or not
     * acknowledged: nothing is acknowledged alone without a lease). */
    view_agent_leave(st.view_agent);
    replica_await_handover();
    sync_cancel_all(&st, "server is shutting down");
    rpc_server_drain(st.rpc, (uint32_t)opt_int(prog.opts, OPT_SHUTDOWN_GRACE_MS));
    view_agent_halt(st.view_agent);
    checkpointer_stop(ck); /* answers Checkpoint calls still queued */
    /* Answers the calls still waiting for backups. */
    replica_stop();
    rpc_server_stop(st.rpc);
    replica_free();
    /* After replication's threads, which read its token until they end. */
    view_agent_free(st.view_agent);
    st.view_agent = NULL;
    int exit_code = 0;
    events_export_close(events); /* its last sample reads the collector below */
    /* Both read the checkpointer, freed below. */
    http_endpoint_set_detail_fn(http, NULL, NULL);
    metrics_remove_collector(server_collect, &st);
    if (ck) {
        checkpoint_info fi;
        if (checkpoint_write(ck, &fi, err, sizeof(err)) != 0) {
            log_error("final checkpoint failed: %s", err);
            exit_code = 1;
        } else {
            checkpointer_record(ck, true); /* everything applied is in it */
        }
        checkpointer_destroy(ck);
        ckpt_dir_unlock(ck_lock);
    }
    http_endpoint_stop(http);
    log_info("stopped: %llu updates applied, %llu duplicates dropped",
             (unsigned long long)atomic_load(&st.updates_applied),
             (unsigned long long)atomic_load(&st.duplicates_dropped));
    server_state_clear(&st);
    slots_record_free(&slot_rec);
    program_end(&prog);
    return exit_code;
}
