/* Requests to a replicated group: each goes to the group's primary under the view's epoch;
 * updates are logged, streamed and applied in log order and answered once every counted backup
 * applied them; internal operations (a silent worker's eviction, a table's sweep) are logged the
 * same way. Reads are served unlogged. */
#include "repl_group.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "methods.h"
#include "placement.h"
#include "status.h"
#include "sync.h"
#include "table.h"
#include "timeutil.h"

static rpc_handler_fn original_handler(const rpc_method *m)
{
    for (size_t i = 0; i < server_methods_len; i++)
        if (server_methods[i].method == m->method)
            return server_methods[i].handler;
    return NULL;
}

/* Logs an internal request of group G (env: a silent worker's eviction, a table's sweep) and
 * applies it here through the handler the backups apply it with, so that every replica applies
 * it at the same point of the log. Nothing when this server no longer serves G, or due() (order
 * held) says it is no longer due. */
static void log_internal(rgroup *G, const envelope *env, const void *seg, size_t seglen,
                         bool (*due)(rgroup *G, const void *arg), const void *arg, const char *what)
{
    nng_msg *m = NULL;
    rop *o = calloc(1, sizeof(*o));
    if (o == NULL || frame_build(&m, env, seg, seglen, NULL) != 0 ||
        (o->own = malloc(nng_msg_len(m))) == NULL) {
        log_error("group %u: out of memory logging %s (the next sweep tries again)", G->g, what);
        if (m)
            nng_msg_free(m);
        free(o);
        return;
    }
    o->len = nng_msg_len(m);
    memcpy(o->own, nng_msg_body(m), o->len);
    o->bytes = o->own;
    nng_msg_free(m);
    pthread_mutex_lock(&G->order);
    pthread_mutex_lock(&G->q);
    bool serving = G->serving;
    pthread_mutex_unlock(&G->q);
    if (!serving || (due && !due(G, arg))) {
        pthread_mutex_unlock(&G->order);
        repl_op_free(o);
        return;
    }
    o->time_ms = repl_op_time_locked(G);
    repl_applying.G = G;
    repl_applying.lsn = G->next_lsn;
    time_op_set(o->time_ms);
    if (rpc_server_handle_borrowed(G->local, o->bytes, o->len) != 0)
        log_error("group %u: out of memory applying %s", G->g, what);
    time_op_set(0);
    repl_applying.G = NULL;
    o->lsn = G->next_lsn++;
    o->epoch = G->last_epoch = G->epoch;
    pthread_mutex_lock(&G->q);
    rop *done = repl_append_locked(G, o);
    pthread_mutex_unlock(&G->q);
    pthread_mutex_unlock(&G->order);
    repl_answer(done);
}

/* Heard from since the sweep looked: not evicted. */
static bool still_silent(rgroup *G, const void *arg)
{
    return sync_worker_silent(G->st, *(const int32_t *)arg);
}

/* sync_evict_fn of the groups this server serves: the eviction of a silent worker, logged as an
 * internal Clock request (evict), so that every replica evicts it, and applies the BSP
 * aggregates it held back, at the same point of the log. */
void repl_log_evict(void *arg, int32_t worker)
{
    Psd__V1__ClockRequest rq = PSD__V1__CLOCK_REQUEST__INIT;
    rq.evict = true;
    uint8_t body[16];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CLOCK;
    env.worker_id = worker;
    env.body.data = body;
    env.body.len = psd__v1__clock_request__pack(&rq, body);
    char what[64];
    snprintf(what, sizeof(what), "the eviction of worker %d", (int)worker);
    log_internal(arg, &env, NULL, 0, still_silent, &worker, what);
}

/* The expiry of table `name`'s old rows (ttl_ms), logged as an internal TablePush (sweep):
 * every replica removes the same rows at the same point of the log, at the time logged. */
void repl_log_sweep(void *arg, const char *name)
{
    Psd__V1__TablePushRequest rq = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    rq.name = (char *)name;
    rq.sweep = true;
    uint8_t body[TABLE_MAX_NAME + 32];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__TABLE_PUSH;
    env.worker_id = -1;
    env.body.data = body;
    env.body.len = psd__v1__table_push_request__pack(&rq, body);
    /* TablePush carries a segment: one zero word, not read. */
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    env.tensor = &t;
    const float zero = 0.0f;
    log_internal(arg, &env, &zero, sizeof(zero), NULL, NULL, "a table sweep");
}

/* Answers a call for group g that this server does not serve in view `epoch`: sent on to
 * its primary prim, or told to retry while the group has none. */
static void refuse_not_serving(rpc_call *call, uint32_t g, int32_t prim, uint64_t epoch,
                               const char *holders)
{
    if (prim >= 0) {
        rpc_call_set_primary(call, (uint32_t)prim);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u does not serve group %u in view epoch %llu: its primary "
                        "is server %d",
                        repl.cfg.self, g, (unsigned long long)epoch, prim);
    } else {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "group %u has no live in-sync member in view epoch %llu: it is served "
                        "again once one of the servers that hold its newest copy (%s) is back "
                        "(or, giving up the updates only they hold, once an operator runs "
                        "psctl force-primary %u SERVER)",
                        g, (unsigned long long)epoch, holders ? holders : "see psctl status", g);
    }
}

/* The in-sync members of group g in v, as "ps 0, ps 2" (or "none known"). */
static void in_sync_list(const view *v, uint32_t g, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t k = 0; k < v->replicas && o < cap; k++) {
        uint32_t s = view_member(v, g, k);
        if (view_in_sync(v, g, s))
            o += (size_t)snprintf(buf + o, cap - o, "%sps %u", o ? ", " : "", s);
    }
    if (o == 0)
        snprintf(buf, cap, "none known");
}

/* Runs an updating request on the group this server serves: in log order, streamed, answered
 * once every backup in the view applied it. */
static void run_update(rpc_call *call, rgroup *G, rpc_handler_fn h)
{
    rop *o = calloc(1, sizeof(*o));
    if (o && (o->held = rpc_call_hold_request(call, &o->bytes, &o->len)) == NULL) {
        size_t len;
        const uint8_t *req = rpc_call_request(call, &len);
        if ((o->own = malloc(len ? len : 1)) != NULL) {
            memcpy(o->own, req, len);
            o->bytes = o->own;
            o->len = len;
        }
    }
    if (o == NULL || o->bytes == NULL) {
        free(o);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "out of memory logging the request for the replicas");
        return;
    }
    pthread_mutex_lock(&G->order);
    /* dispatch saw this server as the primary without order held: a view change may have
     * come in between. Applied on a copy that no longer serves, the update would advance a
     * backup's log position and its call would wait in no log. */
    pthread_mutex_lock(&G->q);
    bool serving = G->serving;
    int32_t prim = G->primary;
    uint64_t epoch = G->epoch;
    pthread_mutex_unlock(&G->q);
    if (!serving) {
        pthread_mutex_unlock(&G->order);
        repl_op_free(o);
        refuse_not_serving(call, G->g, prim, epoch, NULL);
        return;
    }
    /* Logged and streamed first, applied here meanwhile: the backups' transfer and apply overlap
     * the primary's (they run the same handler on the same state in the same order, so the
     * order of the copies' applies does not matter). */
    o->lsn = G->next_lsn++;
    o->epoch = G->last_epoch = epoch;
    o->busy = true;
    o->time_ms = repl_op_time_locked(G);
    pthread_mutex_lock(&G->q);
    rop *before = repl_append_locked(G, o); /* earlier operations' calls, answered below */
    pthread_mutex_unlock(&G->q);
    rpc_call_set_gate(call, repl_commit_gate, G, o->lsn);
    repl_applying.G = G;
    repl_applying.lsn = o->lsn;
    time_op_set(o->time_ms);
    h(call, G->st);
    time_op_set(0);
    repl_applying.G = NULL;
    bool parked = rpc_call_deferred_here(call);
    if (!parked)
        rpc_call_set_gate(call, NULL, NULL, 0);
    uint64_t lsn = o->lsn;
    pthread_mutex_lock(&G->q);
    o->busy = false;
    /* Not yet applied by every backup in the view (or alone while the lease is uncertain:
     * progress_locked holds the commit): the reply waits. */
    if (G->committed < lsn && !parked) {
        if (rpc_call_defer(call) == 0) {
            o->call = call;
        } else {
            /* No room to park the call (max-waiting): the thread is never held (it may be one
             * nng shares with the replies that would end the wait). The update is logged and
             * goes to the backups all the same; the client sends it again (same seq), and that
             * duplicate's reply waits for a later position of the log, so it acknowledges the
             * update only once every backup in the view applied it. */
            rpc_reply_error(call, STATUS_UNAVAILABLE,
                            "server %u cannot hold more replies waiting for the replicas of "
                            "group %u (max-waiting): the update was not acknowledged: retry",
                            repl.cfg.self, G->g);
        }
    }
    rop *done = repl_progress_locked(G);
    pthread_mutex_unlock(&G->order);
    pthread_mutex_unlock(&G->q);
    repl_answer(before);
    repl_answer(done);
}

void repl_dispatch(rpc_call *call, void *arg)
{
    (void)arg;
    const envelope *env = rpc_call_envelope(call);
    const rpc_method *m = rpc_call_method(call);
    rpc_handler_fn h = original_handler(m);
    uint32_t N = repl.cfg.num_servers, self = repl.cfg.self;
    uint32_t g = env->group ? env->group - 1 : self;
    if (g >= N) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "group %u does not exist: the cluster has %u servers (groups 0..%u)", g, N,
                        N - 1);
        return;
    }
    rgroup *G = repl.groups[g];
    if (m->method == PSD__V1__METHOD__SERVER_STATUS || m->method == PSD__V1__METHOD__SHUTDOWN ||
        m->method == PSD__V1__METHOD__CHECKPOINT) {
        /* Not a group's data: status of the group asked (when held), read under its swap
         * lock; admin calls of the process (checkpoints are of the server's own group). */
        if (m->method == PSD__V1__METHOD__SERVER_STATUS) {
            rgroup *S = G ? G : repl.groups[self];
            pthread_rwlock_rdlock(&S->swap);
            h(call, S->st);
            pthread_rwlock_unlock(&S->swap);
        } else {
            h(call, repl.groups[self]->st);
        }
        return;
    }
    char holders[96] = "";
    pthread_mutex_lock(&repl.vlock);
    uint64_t epoch = repl.cur.epoch;
    int32_t prim = repl.cur.primary[g];
    if (prim < 0 && epoch != 0)
        in_sync_list(&repl.cur, g, holders, sizeof(holders));
    pthread_mutex_unlock(&repl.vlock);
    if (env->epoch != 0 && env->epoch < epoch && prim < 0) {
        refuse_not_serving(call, g, prim, epoch, holders); /* UNAVAILABLE: the group waits */
        return;
    }
    if (env->epoch != 0 && env->epoch < epoch) {
        rpc_call_set_primary(call, (uint32_t)prim);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "request sent under view epoch %llu, the current epoch is %llu: group "
                        "%u is served by server %d",
                        (unsigned long long)env->epoch, (unsigned long long)epoch, g, prim);
        return;
    }
    if (epoch == 0) {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server %u has no view of the replicated cluster yet (waiting for the "
                        "coordinator): retry",
                        self);
        return;
    }
    if (G == NULL || prim != (int32_t)self) {
        refuse_not_serving(call, g, prim, epoch, holders);
        return;
    }
    if (m->method == PSD__V1__METHOD__CLOCK) {
        const Psd__V1__ClockRequest *rq = (const Psd__V1__ClockRequest *)rpc_call_body(call);
        if (rq && rq->evict) { /* refused before it is logged: backups trust their log */
            rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                            "clock: evict is internal to replication (a replicated group's "
                            "primary logs its evictions); it is not a client's request");
            return;
        }
    }
    if (m->method == PSD__V1__METHOD__TABLE_PUSH) {
        const Psd__V1__TablePushRequest *rq =
            (const Psd__V1__TablePushRequest *)rpc_call_body(call);
        if (rq && rq->sweep) { /* refused before it is logged, as an eviction */
            rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                            "table push: sweep is internal to replication (a replicated group's "
                            "primary logs its tables' expiry); it is not a client's request");
            return;
        }
    }
    /* A table pull reads: not logged, unless it registers its worker again (sync_wait), which
     * every copy must do at the same point of the log (rare: after an eviction). */
    pthread_rwlock_rdlock(&G->swap); /* a read holds it; an update holds order instead */
    bool reads = !server_method_logged(m->method) &&
                 !(m->method == PSD__V1__METHOD__TABLE_PULL &&
                   sync_would_register(G->st, env->worker_id, env->client_id));
    if (reads) {
        /* A pull that parks (staleness bound, BSP barrier) is answered by the update that ends
         * its wait: its reply goes out once that update is applied everywhere (repl_commit_gate).
         */
        rpc_call_set_gate(call, repl_commit_gate, G, 0);
        sync_set_thread_logged(false);
        h(call, G->st);
        sync_set_thread_logged(true);
        if (!rpc_call_deferred_here(call))
            rpc_call_set_gate(call, NULL, NULL, 0);
        pthread_rwlock_unlock(&G->swap);
        return;
    }
    pthread_rwlock_unlock(&G->swap);
    run_update(call, G, h);
}
