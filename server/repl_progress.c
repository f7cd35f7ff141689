/* The primary's streams of a group's log to its backups: one thread per backup sends
 * REPLICATE batches in lsn order, one in flight at a time, in chain order (a backup gets an
 * operation only once every backup of lower rank applied it); replies move the commit point. */
#include "repl_group.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "status.h"
#include "timeutil.h"

/* The sender of one peer's stream: batches of the log after what it applied, in lsn order,
 * one in flight at a time. Chain order: a peer gets an operation only once every peer of
 * lower rank in the view applied it, so that the first live backup (the next primary) is
 * always the most advanced one. */
typedef struct sync_call {
    /* The batch's peer, first lsn and the log's end when it was sent: an acknowledgement is
     * taken in (acked, commit, answers) by the reply's callback itself (batch_done), not
     * after a hand-over to the peer's thread. */
    struct rpeer *peer;
    uint64_t first, sent_last;
    bool counted; /* the batch said the peer is waited for */
    int status;
    char message[512];
    uint64_t applied;
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

/* Lets go of the batch's operations and body. */
static void batch_release(sync_call *s)
{
    for (size_t i = 0; i < s->nops; i++) {
        rpc_held_release(s->ops[i].held);
        free(s->ops[i].own);
    }
    free(s->ops);
    free(s->body);
    s->ops = NULL;
    s->nops = 0;
    s->body = NULL;
}

/* A batch applied by peer p up to applied - 1 (q held): its progress, and the calls now
 * answered. */
static rop *took_ack_locked(rpeer *p, uint64_t first, uint64_t sent_last, uint64_t applied,
                            bool counted)
{
    p->failing_since_ns = 0;
    if (counted && p->catching_up)
        p->confirmed = true;
    rgroup *G = p->grp;
    atomic_fetch_add(&repl.replicated_ops, applied > first ? applied - first : 0);
    if (applied > sent_last + 1) {
        /* Ahead of this primary's log: operations of an older primary it alone applied (a
         * backup of this version finds that itself and copies the group again). Never taken
         * for agreement: this primary's operations at those positions are others. */
        log_warn("group %u: backup %u reports lsn %llu applied, past this primary's log end "
                 "%llu: not counted",
                 G->g, p->server, (unsigned long long)(applied - 1), (unsigned long long)sent_last);
        return repl_progress_locked(G);
    }
    /* applied_lsn is its next lsn: it applied everything below. A backup behind what we sent
     * (it lost state) rewinds the stream to where it stands. */
    p->acked = applied ? applied - 1 : 0;
    /* Caught up: told so once. It stays catching up (its log kept) until a view adds it: a
     * server restarted while the view still names its previous process live is in_view as
     * that process, and leaves the view before it is added back. */
    if (p->catching_up && p->acked >= sent_last)
        p->told = true;
    rop *done = repl_progress_locked(G);
    pthread_cond_broadcast(&G->qcond);
    return done;
}

static void batch_done(void *arg, int status, const char *message, const frame *reply)
{
    sync_call *s = arg;
    uint64_t applied = 0;
    if (status == STATUS_OK && reply && reply->env) {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        if (r) {
            applied = r->applied_lsn;
            psd__v1__replicate_reply__free_unpacked(r, NULL);
        } else {
            status = STATUS_INTERNAL;
            message = "REPLICATE reply does not decode";
        }
    }
    if (status == STATUS_OK) {
        /* Taken in here: the calls it completes are answered without waking the peer's
         * thread first. */
        rgroup *G = s->peer->grp;
        pthread_mutex_lock(&G->q);
        rop *done = took_ack_locked(s->peer, s->first, s->sent_last, applied, s->counted);
        pthread_mutex_unlock(&G->q);
        repl_answer(done);
    }
    s->status = status; /* read once the call is waited for (rpc_conn_call_wait) */
    s->applied = applied;
    snprintf(s->message, sizeof(s->message), "%s", message);
}

/* Highest lsn peer p may be sent now (q held): the log's end, or what the peer of next lower
 * rank in the view applied. */
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

static void *peer_main(void *arg)
{
    rpeer *p = arg;
    rgroup *G = p->grp;
    sync_call sc;
    memset(&sc, 0, sizeof(sc));
    size_t budget = repl.cfg.max_message > 4096 ? repl.cfg.max_message - 4096 : 4096;
    if (budget > BATCH_MAX_BYTES)
        budget = BATCH_MAX_BYTES;
    pthread_mutex_lock(&G->q);
    while (!atomic_load(&repl.stopping)) {
        bool to = G->serving && (p->in_view || p->catching_up);
        uint64_t lim = to ? send_limit_locked(G, p) : 0;
        bool tell = to && p->catching_up && (!p->told || !p->confirmed) && lim <= p->acked;
        if (lim <= p->acked && !tell) {
            pthread_cond_wait(&G->qcond, &G->q);
            continue;
        }
        /* The batch: operations (p->acked, lim], as many as fit. */
        size_t nops = 0, seg = 0;
        uint64_t first = 0;
        for (rop *o = G->head; o && o->lsn <= lim; o = o->next) {
            if (o->lsn <= p->acked)
                continue;
            size_t padded = (o->len + 3) & ~(size_t)3;
            if (nops > 0 && seg + padded > budget)
                break;
            if (nops == 0)
                first = o->lsn;
            nops++;
            seg += padded;
        }
        if (tell) {
            first = p->acked + 1;
        } else if (nops == 0 || first != p->acked + 1) {
            /* What it needs is no longer in the log: only a fresh copy brings it back. */
            uint64_t now = time_now_ns();
            if (now - p->errors_logged_ns > 5000000000ull) {
                p->errors_logged_ns = now;
                log_error("group %u: backup %u applied up to lsn %llu but the log starts at "
                          "%llu: it needs a fresh copy of the group (restart it to rejoin)",
                          G->g, p->server, (unsigned long long)p->acked,
                          (unsigned long long)(G->head ? G->head->lsn : G->last_lsn + 1));
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&G->qcond, &G->q, &ts);
            continue;
        }
        Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
        uint64_t *lens = malloc((nops ? nops : 1) * sizeof(*lens));
        uint64_t *times = malloc((nops ? nops : 1) * sizeof(*times));
        uint64_t *epochs = malloc((nops ? nops : 1) * sizeof(*epochs));
        struct batch_op *ops = calloc(nops ? nops : 1, sizeof(*ops));
        rq.group = G->g;
        rq.epoch = G->epoch;
        rq.first_lsn = first;
        rq.committed_lsn = G->committed;
        rq.last_lsn = G->last_lsn;
        rq.counted = repl_peer_counted(p);
        sc.counted = rq.counted;
        uint64_t sent_last = G->last_lsn;
        rq.n_op_len = nops;
        rq.op_len = lens;
        rq.n_op_time_ms = nops;
        rq.op_time_ms = times;
        rq.n_op_epoch = nops;
        rq.op_epoch = epochs;
        /* References to the operations, not copies: the log may drop them meanwhile (the
         * peer left the view) while the call still needs their bytes. */
        size_t i = 0;
        bool ok = lens && times && epochs && ops;
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
        sc.ops = ops;
        sc.nops = i;
        sc.body_len = ok ? psd__v1__replicate_request__get_packed_size(&rq) : 0;
        sc.body = ok ? malloc(sc.body_len ? sc.body_len : 1) : NULL;
        if (sc.body)
            psd__v1__replicate_request__pack(&rq, sc.body);
        free(lens);
        free(times);
        free(epochs);
        pthread_mutex_unlock(&G->q);
        int st = STATUS_RESOURCE_EXHAUSTED;
        if (sc.body) {
            sc.seg_len = seg;
            sc.applied = 0;
            sc.peer = p;
            sc.first = first;
            sc.sent_last = sent_last;
            rpc_call_opts o = {
                .deadline_ms = 3000, .retries = 0, .backoff_ms = 20, .max_backoff_ms = 200};
            sc.status = INT32_MIN; /* batch_done not run: the call did not start */
            snprintf(sc.message, sizeof(sc.message), "could not start the call");
            st = rpc_conn_call_wait(p->conn, &o, build_batch, batch_done, &sc);
            if (sc.status != INT32_MIN)
                st = sc.status;
        } else {
            snprintf(sc.message, sizeof(sc.message), "out of memory");
        }
        batch_release(&sc);
        pthread_mutex_lock(&G->q);
        if (st == STATUS_OK) {
            /* taken in by batch_done */
        } else if (!atomic_load(&repl.stopping)) {
            uint64_t now = time_now_ns();
            if (p->failing_since_ns == 0)
                p->failing_since_ns = now;
            if (p->catching_up && p->told &&
                now - p->failing_since_ns > (uint64_t)repl.cfg.lease_ms * 2000000ull) {
                /* A rejoining backup out of reach for two leases: no longer waited for. Its
                 * registration has expired by now unless it reaches the coordinator, and a view
                 * that adds it was installed here long since (then it is in_view). */
                p->told = p->confirmed = false;
                log_warn("group %u: rejoining backup %u out of reach for %u ms: no longer waited "
                         "for until it catches up again",
                         G->g, p->server, 2 * repl.cfg.lease_ms);
                rop *done = repl_progress_locked(G);
                pthread_mutex_unlock(&G->q);
                repl_answer(done);
                pthread_mutex_lock(&G->q);
            }
            if (now - p->errors_logged_ns > 2000000000ull && !p->catching_up) {
                p->errors_logged_ns = now;
                log_warn("group %u: streaming to backup %u failed (%s: %s); retrying until the "
                         "view drops it",
                         G->g, p->server, status_name(st), sc.message);
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&G->qcond, &G->q, &ts);
        }
    }
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
        if (p->conn == NULL) {
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
            if (rpc_conn_open(&p->conn, &cc, err, sizeof(err)) != 0) {
                log_error("group %u: cannot open a stream to backup %u: %s", G->g, p->server, err);
                continue;
            }
        }
        if (pthread_create(&p->thread, NULL, peer_main, p) == 0)
            p->started = true;
        else
            log_error("group %u: cannot start the stream to backup %u", G->g, p->server);
    }
}
