/* The primary's streams of a group's log to its backups: one thread per backup sends
 * REPLICATE batches in lsn order, up to REPL_STREAM_WINDOW in flight, in chain order (a backup
 * gets an operation only once every backup of lower rank holds it); a backup answers a batch
 * once it holds its operations (it applies them behind the answer), and the answers move the
 * commit point. */
#include "repl_group.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "status.h"
#include "timeutil.h"

/* One batch in flight to a peer: its operations, from the log, in lsn order. Chain order: a
 * peer gets an operation only once every peer of lower rank in the view holds it, so that the
 * first live backup (the next primary) always holds the most. */
typedef struct sync_call {
    /* The batch's peer, its lsns [first, last] (last = first - 1: none) and the log's end when
     * it was sent; its answer is taken in (acked, commit, answers) by the reply's callback
     * (batch_done), which frees it. */
    struct rpeer *peer;
    uint64_t first, last, sent_last;
    bool counted; /* the batch said the peer is waited for */
    /* The batch: the packed ReplicateRequest and the operations that make its segment, each
     * referenced (or, for one logged as a copy, copied) while the call runs. */
    uint8_t *body;
    size_t body_len, seg_len;
    struct batch_op {
        const uint8_t *bytes;
        size_t len;
        rpc_held *held;
        uint8_t *own;
    } * ops;
    size_t nops;
} sync_call;

static int build_batch(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    sync_call *s = arg;
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.deadline_ms = deadline_ms;
    env.worker_id = -1;
    env.body.data = s->body;
    env.body.len = s->body_len;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = s->seg_len / 4;
    env.tensor = &t;
    char tok[80];
    if (repl.agent && view_agent_token(repl.agent, tok, sizeof(tok))) {
        env.auth_token.data = (uint8_t *)tok;
        env.auth_token.len = strlen(tok);
    }
    /* The operations go straight from the log into the message: its only copy of them. */
    uint8_t *seg = NULL;
    int rv = frame_build(out, &env, NULL, s->seg_len, &seg);
    if (rv != 0)
        return rv;
    size_t at = 0;
    for (size_t i = 0; i < s->nops; i++) {
        const struct batch_op *o = &s->ops[i];
        size_t padded = (o->len + 3) & ~(size_t)3;
        memcpy(seg + at, o->bytes, o->len);
        memset(seg + at + o->len, 0, padded - o->len);
        at += padded;
    }
    return 0;
}

/* Lets go of the batch's operations and body, and frees it. */
static void batch_free(sync_call *s)
{
    for (size_t i = 0; i < s->nops; i++) {
        rpc_held_release(s->ops[i].held);
        free(s->ops[i].own);
    }
    free(s->ops);
    free(s->body);
    free(s);
}

/* Batch s answered by its peer: it holds everything below lsn held (q held). Returns the calls
 * now answered. */
/* Withdraws p's report to the view agent, if any (q held). */
static void unmark_locked(rpeer *p)
{
    if (!p->unreach_marked)
        return;
    p->unreach_marked = false;
    if (repl.agent)
        view_agent_mark_unreachable(repl.agent, p->server, false);
}

/* p answered (q held), if only with an error: its connection delivers. */
static void answered_locked(rpeer *p)
{
    p->unanswered_since_ns = 0;
    unmark_locked(p);
}

void repl_peer_reached_locked(rpeer *p)
{
    p->failing_since_ns = 0;
    answered_locked(p);
}

static rop *took_ack_locked(const sync_call *s, uint64_t held)
{
    rpeer *p = s->peer;
    rgroup *G = p->grp;
    repl_peer_reached_locked(p);
    if (s->counted && p->catching_up)
        p->confirmed = true;
    if (held > s->sent_last + 1) {
        /* Ahead of this primary's log: operations of an older primary it alone holds (a
         * backup of this version finds that itself and copies the group again). Never taken
         * for agreement: this primary's operations at those positions are others. */
        log_warn("group %u: backup %u reports lsn %llu held, past this primary's log end "
                 "%llu: not counted",
                 G->g, p->server, (unsigned long long)(held - 1), (unsigned long long)s->sent_last);
        return repl_progress_locked(G);
    }
    uint64_t pos = held ? held - 1 : 0;
    if (pos > p->acked)
        atomic_fetch_add(&repl.replicated_ops, pos - p->acked);
    if (pos + 1 < s->first && !p->stall) {
        /* It does not hold what comes before this batch: an earlier batch in flight was not
         * there yet when this one came, or it holds less than it reported (it lost state).
         * Sent again from where it stands once every answer is in. */
        p->stall = true;
        p->stall_pos = pos;
    }
    if (p->stall) {
        if (pos > p->stall_pos)
            p->stall_pos = pos;
        if (p->inflight == 0) {
            /* Every batch answered: the highest it reported is where it stands (also below
             * what it reported before: a backup that lost state rewinds its stream). */
            p->acked = p->stall_pos;
            p->sent = p->acked;
            p->stall = false;
        }
    } else if (pos > p->acked) {
        p->acked = pos;
    }
    /* Caught up: told so once. It stays catching up (its log kept) until a view adds it: a
     * server restarted while the view still names its previous process live is in_view as
     * that process, and leaves the view before it is added back. */
    if (p->catching_up && p->acked >= s->sent_last)
        p->told = true;
    return repl_progress_locked(G);
}

/* A batch to p failed (q held): the stream goes on from what it holds after a pause. Returns
 * the calls now answered. */
static rop *failed_locked(rpeer *p, int st, const char *message, bool answered)
{
    rgroup *G = p->grp;
    p->sent = p->acked; /* sent again: the backup drops what it holds already */
    if (p->stall && p->inflight == 0) {
        p->acked = p->sent = p->stall_pos > p->acked ? p->stall_pos : p->acked;
        p->stall = false;
    }
    if (atomic_load(&repl.stopping))
        return NULL;
    rop *done = NULL;
    uint64_t now = time_now_ns();
    p->retry_ns = now + 50 * 1000000ull;
    if (p->failing_since_ns == 0)
        p->failing_since_ns = now;
    if (answered)
        answered_locked(p); /* refused (e.g. still copying): reachable all the same */
    else if (p->unanswered_since_ns == 0)
        p->unanswered_since_ns = now;
    if (p->catching_up && p->told &&
        now - p->failing_since_ns > (uint64_t)repl.cfg.lease_ms * 2000000ull) {
        /* A rejoining backup out of reach for two leases: no longer waited for. Its
         * registration has expired by now unless it reaches the coordinator, and a view
         * that adds it was installed here long since (then it is in_view). */
        p->told = p->confirmed = false;
        log_warn("group %u: rejoining backup %u out of reach for %u ms: no longer waited "
                 "for until it catches up again",
                 G->g, p->server, 2 * repl.cfg.lease_ms);
        done = repl_progress_locked(G);
    }
    uint64_t unreachable_ns =
        ((uint64_t)repl.cfg.lease_ms * 2 + REPL_UNREACHABLE_EXTRA_MS) * 1000000ull;
    if (G->serving && p->in_view && !p->unreach_marked && repl.agent &&
        p->unanswered_since_ns != 0 && now - p->unanswered_since_ns > unreachable_ns) {
        /* In the view, so it keeps its lease, yet out of this primary's reach (its connection
         * was opened again meanwhile): without this, every update of the group would wait
         * for it until the partition heals. */
        p->unreach_marked = true;
        view_agent_mark_unreachable(repl.agent, p->server, true);
        log_warn("group %u: backup %u unreachable for %.1f s while it keeps its lease (%s): "
                 "asking the coordinator to take it out of sync; updates are acknowledged "
                 "without it, and it copies the group again once it is reachable",
                 G->g, p->server, (double)(now - p->unanswered_since_ns) / 1e9, message);
    }
    /* A rejoining backup's failures are expected while it restarts: logged less often. */
    if (now - p->errors_logged_ns > (p->catching_up ? 10000000000ull : 2000000000ull)) {
        p->errors_logged_ns = now;
        log_warn("group %u: streaming to backup %u failed (%s: %s); retrying until the "
                 "view drops it",
                 G->g, p->server, status_name(st), message);
    }
    return done;
}

static void batch_done(void *arg, int status, const char *message, const frame *reply)
{
    sync_call *s = arg;
    uint64_t held = 0;
    if (status == STATUS_OK && reply && reply->env) {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        if (r) {
            /* A backup of an older version answers once it applied: held is applied there. */
            held = r->held_lsn ? r->held_lsn : r->applied_lsn;
            psd__v1__replicate_reply__free_unpacked(r, NULL);
        } else {
            status = STATUS_INTERNAL;
            message = "REPLICATE reply does not decode";
        }
    }
    /* Taken in here: the calls it completes are answered without waking the peer's thread
     * first. */
    rpeer *p = s->peer;
    rgroup *G = p->grp;
    pthread_mutex_lock(&G->q);
    p->inflight--;
    rop *done = status == STATUS_OK
                    ? took_ack_locked(s, held)
                    : failed_locked(p, status, message ? message : "", reply != NULL);
    pthread_cond_broadcast(&G->qcond);
    pthread_mutex_unlock(&G->q);
    repl_answer(done);
    batch_free(s);
}

/* Highest lsn peer p may be sent now (q held): the log's end, or what the peer of next lower
 * rank in the view holds. */
static uint64_t send_limit_locked(rgroup *G, const rpeer *p)
{
    uint64_t lim = G->last_lsn;
    uint32_t best = 0;
    for (uint32_t i = 0; i < G->npeers; i++) {
        const rpeer *o = &G->peers[i];
        if (o == p || !o->in_view)
            continue;
        /* Ring distance from the primary: lower ranks come first in the chain. */
        uint32_t prim = G->primary >= 0 ? (uint32_t)G->primary : G->g;
        uint32_t N = repl.cfg.num_servers;
        uint32_t d_o = (o->server + N - prim) % N, d_p = (p->server + N - prim) % N;
        if (d_o < d_p && d_o > best) {
            best = d_o;
            lim = o->acked < lim ? o->acked : lim;
        }
    }
    return lim;
}

/* Waits on G's queue at most ms (q held). */
static void wait_ms_locked(rgroup *G, uint64_t ms)
{
    struct timespec ts = time_deadline(CLOCK_REALTIME, ms);
    pthread_cond_timedwait(&G->qcond, &G->q, &ts);
}

/* The batch of operations (p->sent, lim] that fit (q held), or, for tell, none from
 * p->acked + 1. NULL when out of memory; *gap when the log no longer holds p->sent + 1. */
static sync_call *batch_make_locked(rgroup *G, rpeer *p, uint64_t lim, bool tell, size_t budget,
                                    bool *gap)
{
    *gap = false;
    size_t nops = 0, seg = 0;
    uint64_t first = 0;
    if (!tell) {
        for (rop *o = G->head; o && o->lsn <= lim; o = o->next) {
            if (o->lsn <= p->sent)
                continue;
            size_t padded = (o->len + 3) & ~(size_t)3;
            if (nops > 0 && seg + padded > budget)
                break;
            if (nops == 0)
                first = o->lsn;
            nops++;
            seg += padded;
        }
        if (nops == 0 || first != p->sent + 1) {
            *gap = true;
            return NULL;
        }
    } else {
        first = p->acked + 1;
    }
    sync_call *s = calloc(1, sizeof(*s));
    Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
    uint64_t *lens = malloc((nops ? nops : 1) * sizeof(*lens));
    uint64_t *times = malloc((nops ? nops : 1) * sizeof(*times));
    uint64_t *epochs = malloc((nops ? nops : 1) * sizeof(*epochs));
    struct batch_op *ops = calloc(nops ? nops : 1, sizeof(*ops));
    bool ok = s && lens && times && epochs && ops;
    rq.group = G->g;
    rq.epoch = G->epoch;
    rq.first_lsn = first;
    rq.committed_lsn = G->committed;
    rq.last_lsn = G->last_lsn;
    rq.counted = repl_peer_counted(p);
    rq.n_op_len = nops;
    rq.op_len = lens;
    rq.n_op_time_ms = nops;
    rq.op_time_ms = times;
    rq.n_op_epoch = nops;
    rq.op_epoch = epochs;
    /* References to the operations, not copies: the log may drop them meanwhile (the peer
     * left the view) while the call still needs their bytes. */
    size_t i = 0;
    for (rop *o = G->head; ok && o && i < nops; o = o->next) {
        if (o->lsn < first)
            continue;
        lens[i] = o->len;
        times[i] = o->time_ms;
        epochs[i] = o->epoch;
        ops[i].len = o->len;
        if (o->held) {
            ops[i].held = rpc_held_ref(o->held);
            ops[i].bytes = o->bytes;
        } else if ((ops[i].own = malloc(o->len)) != NULL) {
            memcpy(ops[i].own, o->bytes, o->len);
            ops[i].bytes = ops[i].own;
        } else {
            ok = false;
        }
        i++;
    }
    if (s) {
        s->ops = ops;
        s->nops = i;
        ops = NULL;
        s->peer = p;
        s->first = first;
        s->last = first + nops - 1;
        s->sent_last = G->last_lsn;
        s->counted = rq.counted;
        s->seg_len = seg;
        s->body_len = ok ? psd__v1__replicate_request__get_packed_size(&rq) : 0;
        s->body = ok ? malloc(s->body_len ? s->body_len : 1) : NULL;
        if (s->body)
            psd__v1__replicate_request__pack(&rq, s->body);
        else
            ok = false;
    }
    free(lens);
    free(times);
    free(epochs);
    free(ops);
    if (!ok && s) {
        batch_free(s);
        s = NULL;
    }
    return s;
}

/* A connection for the stream to p, or NULL (logged). */
static rpc_conn *stream_open(const rgroup *G, const rpeer *p)
{
    char label[64], err[512];
    snprintf(label, sizeof(label), "ps %u (backup of group %u)", p->server, G->g);
    rpc_conn_config cc = {
        .url = repl.cfg.urls[p->server],
        .connections = 1,
        .resend_ms = 0,
        .max_message = 1u << 20,
        .label = label,
        .tls = repl.cfg.tls,
    };
    rpc_conn *c = NULL;
    if (rpc_conn_open(&c, &cc, err, sizeof(err)) != 0) {
        log_error("group %u: cannot open a stream to backup %u: %s", G->g, p->server, err);
        return NULL;
    }
    return c;
}

/* Whether p's stream should open its connection again (q held): none is open (an open
 * failed), or no batch was answered at all (not even refused) for REPL_STREAM_STALE_MS. A
 * connection nng still counts up can deliver nothing while both servers stay up and in the
 * view: its peer's socket gone without a reset reaching us (a lost conntrack or NAT entry, a
 * blackholed flow), or a dead pipe whose removal nng 1.5.2 has not run yet (its reaper thread
 * also redials). Nothing else would end that: the backup keeps its lease, so no view drops it,
 * and every update of the group waits for it. A fresh connection costs one dial. */
static bool stream_stale_locked(const rpeer *p, uint64_t now)
{
    const uint64_t stale = (uint64_t)REPL_STREAM_STALE_MS * 1000000ull;
    if (now - p->reopened_ns < (p->conn ? stale : 1000000000ull))
        return false;
    return p->conn == NULL ||
           (p->unanswered_since_ns != 0 && now - p->unanswered_since_ns >= stale);
}

/* Opens p's stream connection again (q held; released meanwhile: closing fails the batches
 * still in flight on the old connection and waits for their callbacks, which take q). */
static void stream_reopen_locked(rgroup *G, rpeer *p, uint64_t now)
{
    rpc_conn *old = p->conn;
    p->conn = NULL;
    p->reopened_ns = now;
    bool say = old && p->reopens++ % 6 == 0; /* the first time, then every 30 s or so */
    double failing_s = p->unanswered_since_ns ? (double)(now - p->unanswered_since_ns) / 1e9 : 0;
    pthread_mutex_unlock(&G->q);
    if (say)
        log_warn("group %u: no batch to backup %u answered for %.1f s: closing its stream's "
                 "connection and opening it again (%u time(s) so far)",
                 G->g, p->server, failing_s, p->reopens);
    rpc_conn_close(old);
    rpc_conn *c = stream_open(G, p);
    pthread_mutex_lock(&G->q);
    p->conn = c;
}

static void *peer_main(void *arg)
{
    rpeer *p = arg;
    rgroup *G = p->grp;
    size_t budget = repl.cfg.max_message > 4096 ? repl.cfg.max_message - 4096 : 4096;
    if (budget > BATCH_MAX_BYTES)
        budget = BATCH_MAX_BYTES;
    pthread_mutex_lock(&G->q);
    while (!atomic_load(&repl.stopping)) {
        bool to = G->serving && (p->in_view || p->catching_up);
        uint64_t now = time_now_ns();
        if (p->unreach_marked && !(G->serving && p->in_view))
            unmark_locked(p); /* out of sync by now, or the group moved: done with */
        if (to && stream_stale_locked(p, now)) {
            stream_reopen_locked(G, p, now);
            continue;
        }
        if (to && p->conn == NULL) {
            wait_ms_locked(G, 100); /* opened again once a second */
            continue;
        }
        if (p->sent < p->acked)
            p->sent = p->acked;
        uint64_t lim = to ? send_limit_locked(G, p) : 0;
        bool may = to && !p->stall && p->inflight < REPL_STREAM_WINDOW && now >= p->retry_ns;
        bool tell = may && p->inflight == 0 && p->catching_up && (!p->told || !p->confirmed) &&
                    lim <= p->acked;
        if (!tell && (!may || lim <= p->sent)) {
            if (to && !p->stall && p->retry_ns > now)
                wait_ms_locked(G, (p->retry_ns - now) / 1000000 + 1);
            else
                pthread_cond_wait(&G->qcond, &G->q);
            continue;
        }
        bool gap;
        sync_call *s = batch_make_locked(G, p, lim, tell, budget, &gap);
        if (s == NULL) {
            if (gap && p->inflight > 0) {
                pthread_cond_wait(&G->qcond, &G->q); /* answers may move it on */
                continue;
            }
            if (gap && now - p->errors_logged_ns > 5000000000ull) {
                /* What it needs is no longer in the log: only a fresh copy brings it back. */
                p->errors_logged_ns = now;
                log_error("group %u: backup %u holds up to lsn %llu but the log starts at "
                          "%llu: it needs a fresh copy of the group (restart it to rejoin)",
                          G->g, p->server, (unsigned long long)p->acked,
                          (unsigned long long)(G->head ? G->head->lsn : G->last_lsn + 1));
            }
            wait_ms_locked(G, gap ? 1000 : 50);
            continue;
        }
        if (!tell)
            p->sent = s->last;
        p->inflight++;
        pthread_mutex_unlock(&G->q);
        rpc_call_opts o = {
            .deadline_ms = 3000, .retries = 0, .backoff_ms = 20, .max_backoff_ms = 200};
        int st = rpc_conn_call(p->conn, &o, build_batch, batch_done, s);
        pthread_mutex_lock(&G->q);
        if (st != 0) {
            /* Not started: batch_done will not run. */
            p->inflight--;
            rop *done = failed_locked(p, st, "could not start the call", false);
            pthread_mutex_unlock(&G->q);
            repl_answer(done);
            batch_free(s);
            pthread_mutex_lock(&G->q);
        }
    }
    /* Batches still in flight end by their deadline or when the stream's connection closes
     * (replica_stop closes it once this thread returned): their answers need the group. */
    pthread_mutex_unlock(&G->q);
    return NULL;
}

/* Starts the streams of a group this server now serves (q held). */
void repl_start_peers_locked(rgroup *G)
{
    for (uint32_t i = 0; i < G->npeers; i++) {
        rpeer *p = &G->peers[i];
        if (p->started)
            continue;
        if (p->conn == NULL && (p->conn = stream_open(G, p)) == NULL)
            continue;
        if (pthread_create(&p->thread, NULL, peer_main, p) == 0)
            p->started = true;
        else
            log_error("group %u: cannot start the stream to backup %u", G->g, p->server);
    }
}
