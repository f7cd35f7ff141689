/* ps-server: holds a shard of the model's variables and applies updates as they arrive. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "jemalloc_conf.h"
#include "log.h"
#include "program.h"
#include "server.h"
#include "timeutil.h"

/* The "running" marker: <checkpoint-dir>/.running-<task> exists from the start of serving
 * until the final checkpoint of a clean shutdown, so that a restart can tell whether the
 * previous process crashed (and lost the updates it applied after its newest checkpoint) or
 * stopped cleanly (and lost nothing). */
static int marker_path(char *buf, size_t cap, const char *dir, uint32_t task)
{
    return (size_t)snprintf(buf, cap, "%s/.running-%u", dir, task) < cap ? 0 : -1;
}

static bool marker_exists(const char *dir, uint32_t task)
{
    char p[4200];
    return marker_path(p, sizeof(p), dir, task) == 0 && access(p, F_OK) == 0;
}

static void marker_set(const char *dir, uint32_t task)
{
    char p[4200];
    if (marker_path(p, sizeof(p), dir, task) != 0)
        return;
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        log_warn("cannot create %s (a restart after a crash will not say that updates were "
                 "lost): %s",
                 p, strerror(errno));
        return;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (write(fd, pid, (size_t)n) != n)
        log_warn("cannot write %s: %s", p, strerror(errno));
    close(fd);
}

static void marker_clear(const char *dir, uint32_t task)
{
    char p[4200];
    if (marker_path(p, sizeof(p), dir, task) == 0 && unlink(p) != 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", p, strerror(errno));
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
    if (strcmp(cl->task_type, "ps") != 0) {
        log_error("task is \"%s:%d\" but ps-server serves a ps task (set task.type to \"ps\")",
                  cl->task_type[0] ? cl->task_type : "(none)", cl->task_index);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }
    char url[300];
    const char *listen = opt_str(prog.opts, OPT_LISTEN);
    if (listen && listen[0]) {
        snprintf(url, sizeof(url), "%s", listen);
    } else if (cluster_url(cl->ps[cl->task_index], url, sizeof(url)) != 0) {
        log_error("cluster address \"%s\" is too long", cl->ps[cl->task_index]);
        program_end(&prog);
        return PROGRAM_EXIT_CONFIG;
    }

    /* Signals are taken synchronously by the main thread only. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    static server_state st;
    st.task_index = (uint32_t)cl->task_index;
    st.num_servers = (uint32_t)cl->n_ps;
    st.start_ns = time_now_ns();
    st.vars = store_create();
    st.dedup = dedup_create((uint32_t)opt_int(prog.opts, OPT_DEDUP_WINDOW));
    st.default_staleness = (int32_t)opt_int(prog.opts, OPT_DEFAULT_STALENESS);
    /* Every worker of the spec is expected from the start (the chief is worker 0). */
    int n_workers = (int)(cl->n_chief + cl->n_worker);
    st.sync = sync_create(n_workers, (uint32_t)opt_int(prog.opts, OPT_WORKER_TIMEOUT_MS),
                          strcmp(opt_enum(prog.opts, OPT_BSP_AGGREGATION), "mean") == 0,
                          SERVER_MAX_WORKERS);
    if (st.vars == NULL || st.dedup == NULL || st.sync == NULL) {
        log_error("out of memory");
        return 1;
    }
    /* Checkpoints: restore the newest valid one before serving, then keep writing them. */
    checkpoint_config ck_cfg = {
        .dir = opt_str(prog.opts, OPT_CHECKPOINT_DIR),
        .keep = (int)opt_int(prog.opts, OPT_CHECKPOINT_KEEP),
        .interval_s = opt_int(prog.opts, OPT_CHECKPOINT_INTERVAL_S),
        .interval_updates = opt_int(prog.opts, OPT_CHECKPOINT_INTERVAL_UPDATES),
        .cluster_hash = checkpoint_cluster_hash(cl->ps, cl->n_ps),
        .failpoint = opt_str(prog.opts, OPT_TEST_FAILPOINT),
    };
    checkpointer *ck = NULL;
    char err[1536];
    if (ck_cfg.dir && ck_cfg.dir[0]) {
        checkpoint_info ri;
        uint64_t max_seq;
        bool crashed = marker_exists(ck_cfg.dir, st.task_index);
        int r = checkpoint_restore(&st, &ck_cfg, &ri, &max_seq, err, sizeof(err));
        int fail = 0;
        if (r == CKPT_REFUSED || r == CKPT_FAILED) {
            log_error("%s", err);
            fail = r == CKPT_REFUSED ? PROGRAM_EXIT_CONFIG : 1;
        }
        if (r == CKPT_RESTORED) {
            sync_resume(&st);
            log_info("restored %s: checkpoint %llu, %u variables, %llu bytes in %llu ms", ri.path,
                     (unsigned long long)ri.seq, ri.variables, (unsigned long long)ri.bytes,
                     (unsigned long long)ri.ms);
            if (crashed)
                log_warn("ps %u did not shut down cleanly: the updates it applied after "
                         "checkpoint %llu are lost (clients that had them acknowledged log how "
                         "many)",
                         st.task_index, (unsigned long long)ri.seq);
            else
                log_info("ps %u shut down cleanly after writing checkpoint %llu: nothing was lost",
                         st.task_index, (unsigned long long)ri.seq);
        } else if (r == CKPT_NONE) {
            if (crashed)
                log_warn("no checkpoint of ps %u in %s: starting empty; the previous ps %u did "
                         "not shut down cleanly and every update it applied is lost",
                         st.task_index, ck_cfg.dir, st.task_index);
            else
                log_info("no checkpoint of ps %u in %s: starting empty", st.task_index, ck_cfg.dir);
        }
        if (fail == 0) {
            ck = checkpointer_create(&st, &ck_cfg, max_seq + 1, err, sizeof(err));
            if (ck == NULL) {
                log_error("%s", err);
                fail = PROGRAM_EXIT_CONFIG;
            } else if (checkpointer_start(ck, err, sizeof(err)) != 0) {
                log_error("%s", err);
                fail = 1;
            }
        }
        if (fail != 0) {
            checkpointer_destroy(ck);
            store_destroy(st.vars);
            dedup_destroy(st.dedup);
            sync_destroy(st.sync);
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
        .threads = (int)opt_int(prog.opts, OPT_THREADS),
        .max_message = (size_t)opt_int(prog.opts, OPT_MAX_MESSAGE_BYTES),
        .inline_max = (size_t)opt_int(prog.opts, OPT_INLINE_MAX_BYTES),
        .default_deadline_ms = (uint32_t)opt_int(prog.opts, OPT_DEFAULT_DEADLINE_MS),
        .max_parked = (int)opt_int(prog.opts, OPT_MAX_WAITING),
        .methods = server_methods,
        .n_methods = server_methods_len,
        .handler_arg = &st,
        .drop_percent = (int)opt_int(prog.opts, OPT_TEST_DROP_PERCENT),
        .dup_percent = (int)opt_int(prog.opts, OPT_TEST_DUP_PERCENT),
    };
    if (rpc_server_start(&st.rpc, &rc_cfg, err, sizeof(err)) != 0) {
        log_error("%s", err);
        checkpointer_destroy(ck);
        store_destroy(st.vars);
        dedup_destroy(st.dedup);
        program_end(&prog);
        return 1;
    }
    if (ck)
        marker_set(ck_cfg.dir, st.task_index);
    log_info("ps %u of %u serving on %s (version %s, instance %016llx), expecting %d worker(s)",
             st.task_index, st.num_servers, url, PSD_VERSION,
             (unsigned long long)rpc_server_instance(st.rpc), n_workers);

    int sig = 0;
    while (!atomic_load(&st.shutdown_requested)) {
        struct timespec ts = {0, 50 * 1000000};
        sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig > 0)
            break;
        sync_sweep(&st); /* liveness and wait deadlines */
    }
    if (sig > 0)
        log_info("received %s, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    else {
        log_info("shutdown requested by a client");
        /* Let the acknowledgement leave before the socket closes. */
        struct timespec ts = {0, 200 * 1000000};
        nanosleep(&ts, NULL);
    }
    sync_cancel_all(&st, "server is shutting down");
    rpc_server_drain(st.rpc, (uint32_t)opt_int(prog.opts, OPT_SHUTDOWN_GRACE_MS));
    checkpointer_stop(ck); /* answers Checkpoint calls still queued */
    rpc_server_stop(st.rpc);
    int exit_code = 0;
    if (ck) {
        checkpoint_info fi;
        if (checkpoint_write(ck, &fi, err, sizeof(err)) != 0) {
            log_error("final checkpoint failed: %s", err);
            exit_code = 1;
        } else {
            marker_clear(ck_cfg.dir, st.task_index); /* everything applied is in it */
        }
        checkpointer_destroy(ck);
    }
    log_info("stopped: %llu updates applied, %llu duplicates dropped",
             (unsigned long long)atomic_load(&st.updates_applied),
             (unsigned long long)atomic_load(&st.duplicates_dropped));
    store_destroy(st.vars);
    dedup_destroy(st.dedup);
    sync_destroy(st.sync);
    program_end(&prog);
    return exit_code;
}
