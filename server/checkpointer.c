/* The checkpointer (checkpointer.h): writing one checkpoint, the thread and its queue of
 * Checkpoint RPCs, the creates parked until durable, health and metrics. */
#include "checkpointer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_dir.h"
#include "ckpt_format.h"
#include "ckpt_frame.h"
#include "ckpt_restore.h"
#include "ckpt_snapshot.h"
#include "log.h"
#include "metrics.h"
#include "status.h"
#include "table.h"
#include "timeutil.h"
#include "util.h"

/* A CreateVariable (or TableCreate: table) call parked until what it made is durable
 * (checkpointer_await_create, checkpointer_await_table_create). */
typedef struct create_wait {
    rpc_call *call;
    uint64_t gen;
    uint32_t server;
    uint64_t offset, count;
    int32_t staleness;
    bool created;
    bool table;
} create_wait;

struct checkpointer {
    server_state *st;
    char *dir;
    int keep, full_every;
    int64_t interval_s, interval_updates;
    /* The chain of deltas (write_lock): the previous durable file of this process's chain (0:
     * none, the next is full), the id of its tables' cuts (table.h: the base of the next
     * delta) and how many deltas follow its full file. A checkpointer with full_every 1 keeps
     * no chain: its tables' cuts are snapshot cuts. */
    uint64_t chain_prev;
    uint64_t chain_cut;
    int chain_len;
    uint64_t cluster_hash;
    bool crash_mid_write;
    bool slow_write; /* failpoint checkpoint-slow: each write takes CKPT_SLOW_MS longer */
    uint64_t next_seq;
    pthread_mutex_t write_lock; /* one checkpoint at a time */
    pthread_mutex_t lock;       /* the fields below */
    pthread_cond_t cond;
    rpc_call **queue;
    size_t nqueue, qcap;
    /* The Checkpoint calls the checkpoint being written answers, and the calls that are the
     * same requests sent again (a client's transport resends an unanswered request after
     * resend-ms): those ride on it instead of asking for another checkpoint. */
    rpc_call **writing;
    size_t nwriting;
    rpc_call **riders;
    size_t nriders, rcap;
    bool stop, running;
    pthread_t thread;
    uint64_t last_updates, last_ns;
    size_t last_nvars;
    create_wait *cwait; /* parked creates, in arrival order */
    size_t ncwait, cwcap;
    uint64_t durable_gen; /* create_gen of the newest durable checkpoint */
    /* Health (checkpointer_health), under lock. */
    uint64_t start_ns, ok_ns; /* ok_ns: newest written (0: none yet) */
    uint64_t failures, failures_row;
    uint64_t durable_seq, durable_versions; /* newest durable checkpoint (restored or written) */
    char last_error[512];
    checkpoint_position_fn position; /* write_lock */
    void *position_arg;
};

/* Failpoint checkpoint-slow (test-failpoint, tests only): what a write takes longer. */
#define CKPT_SLOW_MS 3000

checkpointer *checkpointer_create(server_state *st, const checkpoint_config *cfg, uint64_t next_seq,
                                  char *err, size_t errlen)
{
    if (cfg->dir == NULL || cfg->dir[0] == '\0') {
        errf(err, errlen, "checkpoints are off: set checkpoint-dir");
        return NULL;
    }
    if (checkpoint_mkdir(cfg->dir, err, errlen) != 0)
        return NULL;
    checkpointer *ck = calloc(1, sizeof(*ck));
    if (ck == NULL || (ck->dir = strdup(cfg->dir)) == NULL) {
        free(ck);
        errf(err, errlen, "out of memory");
        return NULL;
    }
    ck->st = st;
    ck->keep = cfg->keep < 1 ? 1 : cfg->keep;
    ck->full_every = cfg->full_every < 1 ? 1 : cfg->full_every;
    ck->interval_s = cfg->interval_s;
    ck->interval_updates = cfg->interval_updates;
    ck->cluster_hash = cfg->cluster_hash;
    ck->crash_mid_write =
        cfg->failpoint && strcmp(cfg->failpoint, "checkpoint-crash-mid-write") == 0;
    ck->slow_write = cfg->failpoint && strcmp(cfg->failpoint, "checkpoint-slow") == 0;
    ck->next_seq = next_seq ? next_seq : 1;
    ck->last_ns = time_now_ns();
    ck->start_ns = ck->last_ns;
    ck->last_updates = atomic_load(&st->updates_applied);
    /* Exported from the start, so that an alert on failures or age fires on a server that
     * never wrote a checkpoint. */
    metric_add(metrics_counter("psd_checkpoint_failures_total", "Checkpoints that failed."), 0);
    pthread_mutex_init(&ck->write_lock, NULL);
    pthread_mutex_init(&ck->lock, NULL);
    pthread_cond_init(&ck->cond, NULL);
    return ck;
}

/* Metrics of a checkpoint written (metrics.h); the age is the server's collector's. */
static void checkpoint_metrics(const checkpoint_info *info, double seconds)
{
    static const double buckets[] = {0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
    metric_inc(metrics_counter("psd_checkpoints_total", "Checkpoints written."));
    metric_observe(metrics_histogram("psd_checkpoint_duration_seconds",
                                     "Time to write a checkpoint, snapshot to durable file.",
                                     buckets, sizeof(buckets) / sizeof(buckets[0])),
                   seconds);
    metric_set(metrics_gauge("psd_checkpoint_bytes", "Size of the newest checkpoint."),
               (double)info->bytes);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    metric_set(metrics_gauge("psd_checkpoint_last_success_timestamp_seconds",
                             "Wall-clock time the newest checkpoint became durable."),
               (double)now.tv_sec + (double)now.tv_nsec * 1e-9);
}

/* Counts a failed checkpoint and keeps its message for checkpointer_health. */
static void note_failure(checkpointer *ck, const char *err)
{
    metric_inc(metrics_counter("psd_checkpoint_failures_total", "Checkpoints that failed."));
    pthread_mutex_lock(&ck->lock);
    ck->failures++;
    ck->failures_row++;
    snprintf(ck->last_error, sizeof(ck->last_error), "%s", err);
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_health(checkpointer *ck, checkpoint_health *out)
{
    memset(out, 0, sizeof(*out));
    if (ck == NULL)
        return;
    pthread_mutex_lock(&ck->lock);
    out->failures = ck->failures;
    out->failures_row = ck->failures_row;
    out->last_seq = ck->durable_seq;
    out->age_s = (double)(time_now_ns() - (ck->ok_ns ? ck->ok_ns : ck->start_ns)) * 1e-9;
    snprintf(out->last_error, sizeof(out->last_error), "%s", ck->last_error);
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_set_position(checkpointer *ck, checkpoint_position_fn fn, void *arg)
{
    pthread_mutex_lock(&ck->write_lock);
    ck->position = fn;
    ck->position_arg = arg;
    pthread_mutex_unlock(&ck->write_lock);
}

uint64_t checkpointer_next_seq(checkpointer *ck)
{
    pthread_mutex_lock(&ck->write_lock);
    uint64_t n = ck->next_seq;
    pthread_mutex_unlock(&ck->write_lock);
    return n;
}

void checkpointer_set_restored(checkpointer *ck, uint64_t seq, uint64_t versions)
{
    pthread_mutex_lock(&ck->lock);
    ck->durable_seq = seq;
    ck->durable_versions = versions;
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_record(checkpointer *ck, bool clean)
{
    pthread_mutex_lock(&ck->lock);
    ckpt_record r = {.state = clean ? CKPT_STOP_CLEAN : CKPT_STOP_RUNNING,
                     .pid = (long)getpid(),
                     .seq = ck->durable_seq,
                     .versions = ck->durable_versions};
    pthread_mutex_unlock(&ck->lock);
    char err[600];
    if (ckpt_record_write(ck->dir, ck->st->task_index, &r, err, sizeof(err)) != 0)
        log_warn("%s: a restart may misreport what was lost", err);
}

int checkpoint_write(checkpointer *ck, checkpoint_info *info, char *err, size_t errlen)
{
    uint64_t t0 = time_now_ns();
    pthread_mutex_lock(&ck->write_lock);
    memset(info, 0, sizeof(*info));
    uint64_t seq = ck->next_seq;
    uint64_t updates = atomic_load(&ck->st->updates_applied);
    ckpt_snapshot s;
    uint64_t pause_ns = 0;
    /* A delta of the previous file of the chain, unless the chain is due for a full one (or
     * broken: none yet in this process, or the last write failed). Without a chain the
     * tables' cuts are snapshot cuts: another checkpointer's chain of the state (a copy image
     * is written while the state's own checkpointer goes on) keeps its deltas. */
    bool chain = ck->full_every > 1;
    uint64_t base =
        chain && ck->chain_prev != 0 && ck->chain_len + 1 < ck->full_every ? ck->chain_prev : 0;
    uint64_t cut = chain ? table_cut_id_new() : 0;
    /* Tables with a cold tier: their stores copied (hard links) next to the file, which names
     * the copies (ckpt_dir.h). What an earlier failed try of this seq left is dropped first. */
    char cold[4200], cold_rel[64];
    ckpt_cold_path(cold, sizeof(cold), ck->dir, ck->st->task_index, seq);
    snprintf(cold_rel, sizeof(cold_rel), "ckpt-%u-%" PRIu64 ".cold", ck->st->task_index, seq);
    (void)ckpt_cold_remove(cold);
    bool linked = mkdir(cold, 0755) == 0;
    if (!linked)
        log_warn("checkpoint: cannot make %s (%s): tables with a cold tier are written row by row",
                 cold, strerror(errno));
    if (ckpt_snapshot_take_linked(ck->st, &s, base ? ck->chain_cut : 0, cut, chain,
                                  linked ? cold : NULL, cold_rel, ck->position, ck->position_arg,
                                  &pause_ns, err, errlen) != 0) {
        if (linked)
            (void)ckpt_cold_remove(cold);
        ck->chain_prev = 0;
        note_failure(ck, err);
        pthread_mutex_unlock(&ck->write_lock);
        return -1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s/.ckpt-%u-%" PRIu64 ".psc.tmp", ck->dir, ck->st->task_index, seq);
    int n = snprintf(info->path, sizeof(info->path), "%s/ckpt-%u-%" PRIu64 ".psc", ck->dir,
                     ck->st->task_index, seq);
    int rc = -1;
    bool renamed = false;
    ckpt_writer w = {.fd = -1, .path = tmp, .err = err, .errlen = errlen};
    if (n >= (int)sizeof(info->path)) {
        errf(err, errlen, "checkpoint path in %s is too long", ck->dir);
        goto out;
    }
    /* A delta only when some table is one: otherwise the file holds everything anyway. */
    bool delta = false;
    for (size_t i = 0; i < s.ntables; i++) {
        delta = delta || s.tables[i].delta;
        info->table_rows += s.tables[i].rows;
    }
    uint64_t prev = delta ? base : 0;
    uint64_t size = ckpt_file_size(&s);
    if (ck->crash_mid_write)
        w.crash_at = size / 2 ? size / 2 : 1;
    if (ck->slow_write) /* as a very large checkpoint would */
        time_sleep_ms(CKPT_SLOW_MS);
    w.buf = malloc(CKPT_WBUF_SIZE);
    if (w.buf == NULL) {
        errf(err, errlen, "out of memory for the write buffer");
        goto out;
    }
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        errf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    ckpt_file_id id = {.num_servers = ck->st->num_servers,
                       .task = ck->st->task_index,
                       .cluster_hash = ck->cluster_hash,
                       .seq = seq,
                       .prev = prev};
    if (ckpt_file_write(&w, &s, &id) != 0)
        goto out;
    if (w.written != size) {
        errf(err, errlen, "internal error: wrote %" PRIu64 " bytes to %s, expected %" PRIu64,
             w.written, tmp, size);
        goto out;
    }
    if (fsync(w.fd) != 0) {
        errf(err, errlen, "fsync of %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (close(w.fd) != 0) {
        w.fd = -1;
        errf(err, errlen, "closing %s: %s", tmp, strerror(errno));
        goto out;
    }
    w.fd = -1;
    /* The stores' copies: durable before the file that names them is (their files are synced
     * by the store as it copies them), or none made (removed). */
    if (linked && rmdir(cold) != 0 && ckpt_fsync_dir(cold, err, errlen) != 0)
        goto out;
    if (rename(tmp, info->path) != 0) {
        errf(err, errlen, "renaming %s to %s: %s", tmp, info->path, strerror(errno));
        goto out;
    }
    renamed = true;
    if (ckpt_fsync_dir(ck->dir, err, errlen) != 0)
        goto out;
    rc = 0;
    ck->next_seq = seq + 1;
    ck->chain_prev = seq;
    ck->chain_cut = cut;
    ck->chain_len = delta ? ck->chain_len + 1 : 0;
    info->base = prev;
    info->seq = seq;
    info->bytes = size;
    info->variables = (uint32_t)s.nvars;
    info->pause_us = pause_ns / 1000u;
    info->ms = (time_now_ns() - t0) / 1000000u;
    info->has_position = s.has_pos;
    info->epoch = s.pos_epoch;
    info->lsn = s.pos_lsn;
    for (size_t i = 0; i < s.nvars; i++)
        info->versions += s.vars[i].version;
    pthread_mutex_lock(&ck->lock);
    ck->last_updates = updates;
    ck->last_ns = time_now_ns();
    ck->last_nvars = s.nvars;
    ck->durable_gen = s.create_gen;
    ck->ok_ns = ck->last_ns;
    ck->failures_row = 0;
    ck->durable_seq = seq;
    ck->durable_versions = info->versions;
    pthread_mutex_unlock(&ck->lock);
    checkpointer_record(ck, false);
    checkpoint_metrics(info, (double)(time_now_ns() - t0) * 1e-9);
    char kind[64] = "full";
    if (prev)
        snprintf(kind, sizeof(kind), "delta of %" PRIu64, prev);
    log_info("checkpoint %s (%s): %u variables, %zu tables (%" PRIu64 " rows), %" PRIu64
             " bytes in %" PRIu64 " ms; updates paused %.3f ms",
             info->path, kind, info->variables, s.ntables, info->table_rows, info->bytes, info->ms,
             (double)pause_ns / 1e6);
    /* Files of another cluster size stay: the servers of this one restore from them until
     * each has written its own (checkpoint_restore). */
    ckpt_dir_prune(ck->dir, ck->st->task_index, ck->keep, checkpoint_file_foreign, &s.slots);
out:
    if (w.fd >= 0)
        close(w.fd);
    if (rc != 0) {
        unlink(tmp);
        if (linked && !renamed) /* else the file names them: pruned with it */
            (void)ckpt_cold_remove(cold);
        ck->chain_prev = 0; /* the tables' marks were taken by this cut: the next is full */
        note_failure(ck, err);
    }
    free(w.buf);
    ckpt_snapshot_free(&s);
    pthread_mutex_unlock(&ck->write_lock);
    return rc;
}

static void reply_batch(rpc_call **calls, size_t n, int rc, const checkpoint_info *info,
                        const char *err)
{
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) {
            Psd__V1__CheckpointReply rep = PSD__V1__CHECKPOINT_REPLY__INIT;
            rep.path = (char *)info->path;
            rep.version = info->seq;
            rep.bytes = info->bytes;
            rep.variables = info->variables;
            rep.pause_us = info->pause_us;
            rep.write_ms = info->ms;
            rpc_reply_ok(calls[i], &rep.base);
        } else {
            rpc_reply_error(calls[i], STATUS_INTERNAL, "checkpoint failed: %s", err);
        }
        rpc_call_resume(calls[i]);
    }
}

/* Answers parked creates after a checkpoint: OK for those it holds (rc 0), else UNAVAILABLE
 * naming the failure (the client's retry parks the create again and so tries once more). */
static void reply_creates(checkpointer *ck, create_wait *w, size_t n, int rc, const char *err)
{
    for (size_t i = 0; i < n; i++) {
        if (w[i].table) {
            const Psd__V1__TableCreateRequest *req = (const void *)rpc_call_body(w[i].call);
            const char *name = req && req->spec && req->spec->name ? req->spec->name : "?";
            if (rc == 0) {
                Psd__V1__TableCreateReply rep = PSD__V1__TABLE_CREATE_REPLY__INIT;
                rep.created = w[i].created;
                rpc_reply_ok(w[i].call, &rep.base);
            } else {
                rpc_reply_error(w[i].call, STATUS_UNAVAILABLE,
                                "table \"%.200s\" exists on ps %u but is not durable: the "
                                "checkpoint that would hold it failed (%s)",
                                name, ck->st->task_index, err);
            }
            rpc_call_resume(w[i].call);
            continue;
        }
        const Psd__V1__CreateVariableRequest *req = (const void *)rpc_call_body(w[i].call);
        const char *name = req && req->spec && req->spec->name ? req->spec->name : "?";
        if (rc == 0) {
            Psd__V1__CreateVariableReply rep = PSD__V1__CREATE_VARIABLE_REPLY__INIT;
            Psd__V1__Shard shard = PSD__V1__SHARD__INIT;
            shard.server = w[i].server;
            shard.offset = w[i].offset;
            shard.count = w[i].count;
            rep.shard = &shard;
            rep.staleness = w[i].staleness;
            rep.created = w[i].created;
            rpc_reply_ok(w[i].call, &rep.base);
        } else {
            rpc_reply_error(
                w[i].call, STATUS_UNAVAILABLE,
                "variable \"%.200s\" exists on ps %u but is not durable: the checkpoint "
                "that would hold it failed (%s)",
                name, ck->st->task_index, err);
        }
        rpc_call_resume(w[i].call);
    }
}

/* Parks `call` as *wait (gen: what must be durable; kind, name: for the messages). */
static bool await_gen(checkpointer *ck, rpc_call *call, const create_wait *wait, const char *kind,
                      const char *name);

bool checkpointer_await_create(checkpointer *ck, rpc_call *call, const variable *v,
                               const Psd__V1__CreateVariableReply *rep)
{
    create_wait w = {
        .call = call,
        .gen = v->create_gen,
        .server = rep->shard ? rep->shard->server : ck->st->task_index,
        .offset = rep->shard ? rep->shard->offset : 0,
        .count = rep->shard ? rep->shard->count : 0,
        .staleness = rep->staleness,
        .created = rep->created,
    };
    return await_gen(ck, call, &w, "variable", v->name);
}

bool checkpointer_await_table_create(checkpointer *ck, rpc_call *call, uint64_t gen,
                                     const char *name, bool created)
{
    create_wait w = {.call = call, .gen = gen, .created = created, .table = true};
    return await_gen(ck, call, &w, "table", name);
}

static bool await_gen(checkpointer *ck, rpc_call *call, const create_wait *wait, const char *kind,
                      const char *name)
{
    pthread_mutex_lock(&ck->lock);
    if (wait->gen <= ck->durable_gen) {
        pthread_mutex_unlock(&ck->lock);
        return false;
    }
    if (ck->stop || !ck->running) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server is shutting down before %s \"%.200s\" was durable", kind, name);
        return true;
    }
    if (ck->ncwait == ck->cwcap) {
        size_t nc = ck->cwcap ? 2 * ck->cwcap : 8;
        create_wait *nw = realloc(ck->cwait, nc * sizeof(*nw));
        if (nw == NULL) {
            pthread_mutex_unlock(&ck->lock);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "out of memory waiting for a checkpoint of %s \"%.200s\"", kind, name);
            return true;
        }
        ck->cwait = nw;
        ck->cwcap = nc;
    }
    if (rpc_call_defer(call) != 0) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "%s \"%.200s\" is not durable yet and too many calls wait on this "
                        "server to wait for its checkpoint: retry",
                        kind, name);
        return true;
    }
    ck->cwait[ck->ncwait++] = *wait;
    pthread_cond_signal(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
    return true;
}

static void *ck_thread(void *arg)
{
    checkpointer *ck = arg;
    pthread_mutex_lock(&ck->lock);
    for (;;) {
        bool due = false;
        uint64_t now = time_now_ns();
        uint64_t updates = atomic_load(&ck->st->updates_applied);
        if (ck->interval_s > 0 && now - ck->last_ns >= (uint64_t)ck->interval_s * 1000000000ull) {
            /* Counted without ck->lock (code that holds the state's swap lock for reading
             * may wait for it), under the state's swap lock (a copy may replace it). */
            pthread_mutex_unlock(&ck->lock);
            variable **vars;
            server_state_read_begin(ck->st);
            size_t nv = store_list(ck->st->vars, &vars);
            store_list_release(vars, nv);
            server_state_read_end(ck->st);
            pthread_mutex_lock(&ck->lock);
            if (updates != ck->last_updates || nv != ck->last_nvars)
                due = true;
            else
                ck->last_ns = now; /* nothing changed: wait another interval */
        }
        if (ck->interval_updates > 0 &&
            updates - ck->last_updates >= (uint64_t)ck->interval_updates)
            due = true;
        if (ck->ncwait > 0)
            due = true;
        if (ck->nqueue == 0 && !due) {
            if (ck->stop)
                break;
            struct timespec ts = time_deadline(CLOCK_REALTIME, 100);
            pthread_cond_timedwait(&ck->cond, &ck->lock, &ts);
            continue;
        }
        rpc_call **batch = ck->queue;
        size_t nb = ck->nqueue;
        ck->queue = NULL;
        ck->nqueue = ck->qcap = 0;
        create_wait *cw = ck->cwait;
        size_t ncw = ck->ncwait;
        ck->cwait = NULL;
        ck->ncwait = ck->cwcap = 0;
        ck->writing = batch;
        ck->nwriting = nb;
        pthread_mutex_unlock(&ck->lock);
        checkpoint_info info;
        char err[1024];
        int rc = checkpoint_write(ck, &info, err, sizeof(err));
        if (rc != 0) {
            log_error("checkpoint failed: %s", err);
            pthread_mutex_lock(&ck->lock);
            ck->last_ns = time_now_ns(); /* retry at the next interval, not at once */
            ck->last_updates = atomic_load(&ck->st->updates_applied);
            pthread_mutex_unlock(&ck->lock);
        }
        pthread_mutex_lock(&ck->lock);
        rpc_call **riders = ck->riders;
        size_t nriders = ck->nriders;
        ck->riders = NULL;
        ck->nriders = ck->rcap = 0;
        ck->writing = NULL;
        ck->nwriting = 0;
        pthread_mutex_unlock(&ck->lock);
        reply_batch(batch, nb, rc, &info, err);
        free(batch);
        reply_batch(riders, nriders, rc, &info, err);
        free(riders);
        reply_creates(ck, cw, ncw, rc, err); /* all made before the snapshot: in it */
        free(cw);
        /* Creates parked during the write whose variable the snapshot held anyway. */
        pthread_mutex_lock(&ck->lock);
        size_t kept = 0, ndone = 0;
        create_wait done[16];
        for (size_t i = 0; i < ck->ncwait; i++) {
            if (rc == 0 && ck->cwait[i].gen <= ck->durable_gen && ndone < 16)
                done[ndone++] = ck->cwait[i];
            else
                ck->cwait[kept++] = ck->cwait[i];
        }
        ck->ncwait = kept;
        pthread_mutex_unlock(&ck->lock);
        reply_creates(ck, done, ndone, 0, "");
        pthread_mutex_lock(&ck->lock);
    }
    pthread_mutex_unlock(&ck->lock);
    return NULL;
}

int checkpointer_start(checkpointer *ck, char *err, size_t errlen)
{
    int e = pthread_create(&ck->thread, NULL, ck_thread, ck);
    if (e != 0)
        return errf(err, errlen, "cannot start the checkpoint thread: %s", strerror(e));
    ck->running = true;
    atomic_store(&ck->st->ck, ck);
    return 0;
}

checkpointer *checkpointer_of(const server_state *st)
{
    return atomic_load(&((server_state *)st)->ck);
}

/* Whether a and b are one request (the same client and request id: a resend). */
static bool same_request(const rpc_call *a, const rpc_call *b)
{
    const envelope *x = rpc_call_envelope(a), *y = rpc_call_envelope(b);
    return x != NULL && y != NULL && x->client_id != 0 && x->client_id == y->client_id &&
           x->request_id == y->request_id;
}

/* A resend of a request the checkpoint being written answers: parked to get its answer (lock
 * held). Returns false when call is no such resend. */
static bool ride_locked(checkpointer *ck, rpc_call *call)
{
    size_t i = 0;
    while (i < ck->nwriting && !same_request(ck->writing[i], call))
        i++;
    if (i == ck->nwriting)
        return false;
    if (ck->nriders == ck->rcap) {
        size_t nc = ck->rcap ? 2 * ck->rcap : 4;
        rpc_call **nr = realloc(ck->riders, nc * sizeof(*nr));
        if (nr == NULL)
            return false;
        ck->riders = nr;
        ck->rcap = nc;
    }
    if (rpc_call_defer(call) != 0)
        return false;
    ck->riders[ck->nriders++] = call;
    return true;
}

void checkpointer_request(checkpointer *ck, rpc_call *call)
{
    pthread_mutex_lock(&ck->lock);
    if (ck->stop || !ck->running) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_UNAVAILABLE, "server is shutting down");
        return;
    }
    if (ride_locked(ck, call)) {
        pthread_mutex_unlock(&ck->lock);
        return;
    }
    if (ck->nqueue == ck->qcap) {
        size_t nc = ck->qcap ? 2 * ck->qcap : 8;
        rpc_call **nq = realloc(ck->queue, nc * sizeof(*nq));
        if (nq == NULL) {
            pthread_mutex_unlock(&ck->lock);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory queueing a checkpoint");
            return;
        }
        ck->queue = nq;
        ck->qcap = nc;
    }
    if (rpc_call_defer(call) != 0) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "too many calls waiting on this server to queue a checkpoint");
        return;
    }
    ck->queue[ck->nqueue++] = call;
    pthread_cond_signal(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_barrier(checkpointer *ck)
{
    pthread_mutex_lock(&ck->write_lock);
    pthread_mutex_unlock(&ck->write_lock);
}

void checkpointer_stop(checkpointer *ck)
{
    if (ck == NULL || !ck->running)
        return;
    pthread_mutex_lock(&ck->lock);
    ck->stop = true;
    pthread_cond_signal(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
    pthread_join(ck->thread, NULL); /* answers what is queued first */
    checkpointer *expect = ck;
    atomic_compare_exchange_strong(&ck->st->ck, &expect, NULL);
    pthread_mutex_lock(&ck->lock);
    ck->running = false;
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_destroy(checkpointer *ck)
{
    if (ck == NULL)
        return;
    checkpointer_stop(ck);
    free(ck->queue);
    free(ck->cwait);
    free(ck->dir);
    pthread_mutex_destroy(&ck->write_lock);
    pthread_mutex_destroy(&ck->lock);
    pthread_cond_destroy(&ck->cond);
    free(ck);
}
