/* Replica groups: routing by group and epoch, the ordered update log, its streams to the
 * backups, and the backups' side of it (replica.h). */
#include "replica.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "log.h"
#include "methods.h"
#include "metrics.h"
#include "placement.h"
#include "repl_match.h"
#include "status.h"
#include "sync.h"
#include "table.h"
#include "timeutil.h"
#include "view_agent.h"

#define REPLICA_MAX 16 /* members of a group at most */
/* Bytes of operations one REPLICATE batch carries at most (less when max-message-bytes is). */
#define BATCH_MAX_BYTES (8u << 20)

/* One logged operation: a whole request message as the primary received it. Its bytes are
 * those of the received message itself, held (the client's request at the primary, the
 * REPLICATE batch that carried it at a backup), or a copy of them (own) where it could not be. */
typedef struct rop {
    uint64_t lsn;
    uint64_t epoch; /* the view epoch its primary logged it under */
    uint64_t
        time_ms; /* when the primary logged it (wall clock): the time every copy applies it at */
    const uint8_t *bytes;
    size_t len;
    rpc_held *held;
    uint8_t *own;
    rpc_call *call; /* the client's parked call, answered once every backup applied it */
    /* Logged and streamed while the primary still applies it (run_update): stays in the log,
     * and its call is attached, once the apply is done (order held meanwhile). */
    bool busy;
    struct rop *next;
} rop;

struct rgroup;

/* A member of a group other than this server: where this server streams the group's log
 * while it serves the group as primary. */
typedef struct rpeer {
    struct rgroup *grp;
    uint32_t server;
    uint32_t rank;    /* ring distance from the group's placement server (1 .. r-1, 0: it) */
    uint64_t acked;   /* highest lsn it reported applied (q) */
    bool in_view;     /* live in the view and not the primary (q) */
    bool catching_up; /* rejoining: took a copy at acked + 1, streamed to, not waited for (q) */
    bool told;        /* catching up: it saw the log's end once; waited for from then (q) */
    bool confirmed;   /* catching up: it applied a batch that said it is waited for (q) */
    uint64_t failing_since_ns; /* its stream fails since then (0: it does not) (q) */
    /* Primary: the image of a copy this peer is fetching (q). */
    uint8_t *img;
    size_t img_len;
    uint64_t img_lsn;
    uint64_t img_epoch;
    bool started; /* thread running */
    pthread_t thread;
    rpc_conn *conn;
    uint64_t errors_logged_ns;
} rpeer;

typedef struct rgroup {
    uint32_t g;
    server_state *st;
    bool owned;            /* st made here (a backup copy), freed at stop */
    rpc_server *local;     /* runs logged requests through the handlers on st */
    pthread_mutex_t order; /* one update at a time: apply order = log order */
    uint64_t next_lsn;     /* next lsn to assign (primary) or to apply (backup); order */
    uint64_t last_epoch;   /* the epoch of the operation at next_lsn - 1 (0: unknown); order */
    /* Backup: the primary's stream confirmed this copy's log since it took the group over
     * (repl_match.h); order. */
    bool verified;
    pthread_mutex_t q;
    pthread_cond_t qcond; /* new operations, acks, view changes, stop */
    rop *head, *tail;     /* operations not yet applied by every backup in the view */
    uint64_t last_lsn;    /* highest lsn in the log (q) */
    uint64_t committed;   /* every backup in the view applied up to here (q) */
    bool serving;         /* this server is the group's primary in the view (q) */
    int32_t primary;      /* the group's primary in the view (q) */
    uint64_t epoch;       /* the view's epoch (q) */
    bool ready;           /* the copy is usable: REPLICATE applies (order) */
    bool copying;         /* a rejoin copy thread runs (q) */
    bool marked;          /* caught up after a copy, told the coordinator (q) */
    pthread_t copy_thread;
    bool copy_started;
    bool fresh; /* a copy was installed since this server was last live (q) */
    rpeer peers[REPLICA_MAX];
    uint32_t npeers;
    /* Parked calls resumed (a staleness wait or BSP barrier ended) before the log position
     * their reply depends on was applied by every backup in the view: each answered once
     * committed reaches its lsn (q). */
    rop *riders;
    /* Checkpoints of a group other than its own while this server serves it (taken over):
     * started when it begins serving, stopped when it no longer does (vlock). */
    checkpointer *ck;
    uint64_t ck_next_seq;  /* the sequence number its next checkpointer starts from */
    atomic_bool has_files; /* group-copies-<self> may hold checkpoints of it */
    bool restored;         /* restored at start with a log position (view_copy) */
    uint64_t restored_epoch, restored_lsn;
} rgroup;

/* The group and log position of the update this thread applies now (run_update, log_evict):
 * calls it resumes (waits it ended: their replies show its effect) go out only once it is
 * applied everywhere. */
static _Thread_local struct {
    const struct rgroup *G;
    uint64_t lsn;
} applying;

static struct node {
    bool on;
    replica_config cfg;
    rgroup *groups[VIEW_MAX_SERVERS]; /* NULL where this server is no member */
    pthread_mutex_t vlock;
    view cur;
    rpc_server *rpc;
    atomic_bool stopping;
    rpc_method *methods;
    size_t n_methods;
    char local_token[33];
    atomic_uint_fast64_t replicated_ops, failovers;
    view_agent *agent;     /* the coordinator's agent (NULL: a fixed view) */
    atomic_bool uncertain; /* the lease could not be renewed: acknowledge nothing alone */
    server_state *retired[VIEW_MAX_SERVERS * 2]; /* states replaced by copies, freed at the end */
    size_t nretired;
    /* The own group's log position after replica_free, for its final checkpoint. */
    bool final_valid;
    uint64_t final_epoch, final_lsn;
} node = {.vlock = PTHREAD_MUTEX_INITIALIZER};

/* ---- the log (primary side) ---- */

/* This server's lease is valid now (always, with a fixed view): it may acknowledge alone. */
static bool lease_valid_now(void)
{
    if (atomic_load(&node.uncertain))
        return false;
    return node.agent == NULL || view_agent_serving(node.agent);
}

static void rop_free(rop *o)
{
    if (o) {
        rpc_held_release(o->held);
        free(o->own);
        free(o);
    }
}

/* Whether the primary waits for peer p before it acknowledges (q held): a backup in the view,
 * or a rejoining one since it caught up once (so that the coordinator, which it tells once it
 * knows it is waited for, never makes it in sync while this primary acknowledges without it,
 * say before this primary installed the view that adds it). */
static bool peer_counted(const rpeer *p)
{
    return p->in_view || (p->catching_up && p->told);
}

/* Moves committed to the lowest lsn every peer in the view applied, takes the operations
 * every one of them applied off the log and returns their parked calls (q held). */
static rop *progress_locked(rgroup *G)
{
    uint64_t low = G->last_lsn, keep = G->last_lsn;
    for (uint32_t i = 0; i < G->npeers; i++) {
        if (peer_counted(&G->peers[i]) && G->peers[i].acked < low)
            low = G->peers[i].acked;
        /* Kept until every backup streamed to has it, also one that joined the view behind
         * what was committed without it. */
        if ((G->peers[i].catching_up || G->peers[i].in_view) && G->peers[i].acked < keep)
            keep = G->peers[i].acked;
    }
    if (!G->serving)
        return NULL;
    bool alone = true;
    for (uint32_t i = 0; i < G->npeers; i++)
        if (peer_counted(&G->peers[i]))
            alone = false;
    /* Alone, a primary acknowledges only while its lease is valid at this moment: the lease
     * events come through a queue that can lag behind, and once etcd expired the lease another
     * server may already serve the group. */
    if (alone && low > G->committed && !lease_valid_now())
        low = G->committed; /* perhaps out of the view already: acknowledge nothing alone */
    if (low > G->committed)
        G->committed = low;
    if (keep > G->committed)
        keep = G->committed;
    rop *done = NULL, **tail = &done;
    while (G->head && G->head->lsn <= keep && !G->head->busy) {
        rop *o = G->head;
        G->head = o->next;
        if (G->head == NULL)
            G->tail = NULL;
        o->next = NULL;
        *tail = o;
        tail = &o->next;
    }
    for (rop **pp = &G->riders; *pp;) {
        rop *r = *pp;
        if (r->lsn <= G->committed) {
            *pp = r->next;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
        } else {
            pp = &r->next;
        }
    }
    /* Calls of operations kept for a catching-up backup are answered all the same. */
    for (rop *o = G->head; o && o->lsn <= G->committed; o = o->next) {
        if (o->call == NULL)
            continue;
        rop *a = calloc(1, sizeof(*a));
        if (a == NULL)
            continue; /* answered once the catching-up backup has it */
        a->call = o->call;
        o->call = NULL;
        *tail = a;
        tail = &a->next;
    }
    return done;
}

/* Drops the whole log (q held; no call left in it). */
static void free_log_locked(rgroup *G)
{
    while (G->head) {
        rop *o = G->head;
        G->head = o->next;
        rop_free(o);
    }
    G->tail = NULL;
}

/* Answers the parked calls of done and frees it (no lock held). */
static void answer(rop *done)
{
    while (done) {
        rop *n = done->next;
        if (done->call)
            rpc_call_resume(done->call);
        rop_free(done);
        done = n;
    }
}

/* The sender of one peer's stream: batches of the log after what it applied, in lsn order,
 * one in flight at a time. Chain order: a peer gets an operation only once every peer of
 * lower rank in the view applied it, so that the first live backup (the next primary) is
 * always the most advanced one. */
typedef struct sync_call {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool done;
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
    if (node.agent && view_agent_token(node.agent, tok, sizeof(tok))) {
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
    atomic_fetch_add(&node.replicated_ops, applied > first ? applied - first : 0);
    if (applied > sent_last + 1) {
        /* Ahead of this primary's log: operations of an older primary it alone applied (a
         * backup of this version finds that itself and copies the group again). Never taken
         * for agreement: this primary's operations at those positions are others. */
        log_warn("group %u: backup %u reports lsn %llu applied, past this primary's log end "
                 "%llu: not counted",
                 G->g, p->server, (unsigned long long)(applied - 1), (unsigned long long)sent_last);
        return progress_locked(G);
    }
    /* applied_lsn is its next lsn: it applied everything below. A backup behind what we sent
     * (it lost state) rewinds the stream to where it stands. */
    p->acked = applied ? applied - 1 : 0;
    /* Caught up: told so once. It stays catching up (its log kept) until a view adds it: a
     * server restarted while the view still names its previous process live is in_view as
     * that process, and leaves the view before it is added back. */
    if (p->catching_up && p->acked >= sent_last)
        p->told = true;
    rop *done = progress_locked(G);
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
        answer(done);
    }
    pthread_mutex_lock(&s->m);
    s->status = status;
    s->applied = applied;
    snprintf(s->message, sizeof(s->message), "%s", message);
    s->done = true;
    pthread_cond_signal(&s->c);
    pthread_mutex_unlock(&s->m);
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
        uint32_t N = node.cfg.num_servers;
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
    pthread_mutex_init(&sc.m, NULL);
    pthread_cond_init(&sc.c, NULL);
    size_t budget = node.cfg.max_message > 4096 ? node.cfg.max_message - 4096 : 4096;
    if (budget > BATCH_MAX_BYTES)
        budget = BATCH_MAX_BYTES;
    pthread_mutex_lock(&G->q);
    while (!atomic_load(&node.stopping)) {
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
        rq.counted = peer_counted(p);
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
            sc.done = false;
            sc.seg_len = seg;
            sc.applied = 0;
            sc.peer = p;
            sc.first = first;
            sc.sent_last = sent_last;
            rpc_call_opts o = {
                .deadline_ms = 3000, .retries = 0, .backoff_ms = 20, .max_backoff_ms = 200};
            st = rpc_conn_call(p->conn, &o, build_batch, batch_done, &sc);
            if (st == 0) {
                pthread_mutex_lock(&sc.m);
                while (!sc.done)
                    pthread_cond_wait(&sc.c, &sc.m);
                pthread_mutex_unlock(&sc.m);
                st = sc.status;
            } else {
                snprintf(sc.message, sizeof(sc.message), "could not start the call");
            }
        } else {
            snprintf(sc.message, sizeof(sc.message), "out of memory");
        }
        batch_release(&sc);
        pthread_mutex_lock(&G->q);
        if (st == STATUS_OK) {
            /* taken in by batch_done */
        } else if (!atomic_load(&node.stopping)) {
            uint64_t now = time_now_ns();
            if (p->failing_since_ns == 0)
                p->failing_since_ns = now;
            if (p->catching_up && p->told &&
                now - p->failing_since_ns > (uint64_t)node.cfg.lease_ms * 2000000ull) {
                /* A rejoining backup out of reach for two leases: no longer waited for. Its
                 * registration has expired by now unless it reaches the coordinator, and a view
                 * that adds it was installed here long since (then it is in_view). */
                p->told = p->confirmed = false;
                log_warn("group %u: rejoining backup %u out of reach for %u ms: no longer waited "
                         "for until it catches up again",
                         G->g, p->server, 2 * node.cfg.lease_ms);
                rop *done = progress_locked(G);
                pthread_mutex_unlock(&G->q);
                answer(done);
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
    pthread_mutex_destroy(&sc.m);
    pthread_cond_destroy(&sc.c);
    return NULL;
}

/* Starts the streams of a group this server now serves (q held). */
static void start_peers_locked(rgroup *G)
{
    for (uint32_t i = 0; i < G->npeers; i++) {
        rpeer *p = &G->peers[i];
        if (p->started)
            continue;
        if (p->conn == NULL) {
            char label[64], err[512];
            snprintf(label, sizeof(label), "ps %u (backup of group %u)", p->server, G->g);
            rpc_conn_config cc = {
                .url = node.cfg.urls[p->server],
                .connections = 1,
                .resend_ms = 0,
                .max_message = 1u << 20,
                .label = label,
                .tls = node.cfg.tls,
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

/* ---- routing ---- */

static bool is_update(int method)
{
    return server_method_logged(method);
}

static rpc_handler_fn original_handler(const rpc_method *m)
{
    for (size_t i = 0; i < server_methods_len; i++)
        if (server_methods[i].method == m->method)
            return server_methods[i].handler;
    return NULL;
}

/* The resume gate of a call its handler parked (a Step or pull that waits for the staleness
 * bound or the BSP barrier): its reply, set when the wait ends, goes out only once every backup
 * in the view applied the update it made (lsn: a Step's pushes and clock; 0 for a pull) and
 * the update whose apply ended the wait (another worker's clock, a logged eviction), whose
 * effect the reply may show. Returns true when it keeps the call. */
static bool commit_gate(rpc_call *call, void *arg, uint64_t lsn)
{
    rgroup *G = arg;
    if (applying.G == G && applying.lsn > lsn)
        lsn = applying.lsn;
    bool kept = false;
    pthread_mutex_lock(&G->q);
    if (G->committed >= lsn) {
        /* applied everywhere already: send now */
    } else if (!G->serving) {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server %u no longer serves group %u: the update was not acknowledged: "
                        "retry",
                        node.cfg.self, G->g);
    } else {
        rop *r = calloc(1, sizeof(*r));
        if (r == NULL) {
            pthread_mutex_unlock(&G->q);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "out of memory holding a reply until the replicas applied its "
                            "update: retry");
            return false;
        }
        r->lsn = lsn;
        r->call = call;
        r->next = G->riders;
        G->riders = r;
        kept = true;
    }
    pthread_mutex_unlock(&G->q);
    return kept;
}

/* Appends o, just applied, to the log for the streams (order and q held); returns the calls
 * now answered (with no backup in the view: its own at once). */
static rop *append_locked(rgroup *G, rop *o)
{
    if (G->tail)
        G->tail->next = o;
    else
        G->head = o;
    G->tail = o;
    G->last_lsn = o->lsn;
    rop *done = progress_locked(G);
    pthread_cond_broadcast(&G->qcond);
    return done;
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
        rop_free(o);
        return;
    }
    o->time_ms = time_wall_ms();
    applying.G = G;
    applying.lsn = G->next_lsn;
    time_op_set(o->time_ms);
    if (rpc_server_handle_borrowed(G->local, o->bytes, o->len) != 0)
        log_error("group %u: out of memory applying %s", G->g, what);
    time_op_set(0);
    applying.G = NULL;
    o->lsn = G->next_lsn++;
    o->epoch = G->last_epoch = G->epoch;
    pthread_mutex_lock(&G->q);
    rop *done = append_locked(G, o);
    pthread_mutex_unlock(&G->q);
    pthread_mutex_unlock(&G->order);
    answer(done);
}

/* Heard from since the sweep looked: not evicted. */
static bool still_silent(rgroup *G, const void *arg)
{
    return sync_worker_silent(G->st, *(const int32_t *)arg);
}

/* sync_evict_fn of the groups this server serves: the eviction of a silent worker, logged as an
 * internal Clock request (evict), so that every replica evicts it, and applies the BSP
 * aggregates it held back, at the same point of the log. */
static void log_evict(void *arg, int32_t worker)
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
static void log_sweep(void *arg, const char *name)
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
                        node.cfg.self, g, (unsigned long long)epoch, prim);
    } else {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "group %u has no live in-sync member in view epoch %llu: it is served "
                        "again once one of the servers that hold its newest copy (%s) is back",
                        g, (unsigned long long)epoch, holders ? holders : "see psctl status");
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
        rop_free(o);
        refuse_not_serving(call, G->g, prim, epoch, NULL);
        return;
    }
    /* Logged and streamed first, applied here meanwhile: the backups' transfer and apply overlap
     * the primary's (they run the same handler on the same state in the same order, so the
     * order of the copies' applies does not matter). */
    o->lsn = G->next_lsn++;
    o->epoch = G->last_epoch = epoch;
    o->busy = true;
    o->time_ms = time_wall_ms();
    pthread_mutex_lock(&G->q);
    rop *before = append_locked(G, o); /* earlier operations' calls, answered below */
    pthread_mutex_unlock(&G->q);
    rpc_call_set_gate(call, commit_gate, G, o->lsn);
    applying.G = G;
    applying.lsn = o->lsn;
    time_op_set(o->time_ms);
    h(call, G->st);
    time_op_set(0);
    applying.G = NULL;
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
                            node.cfg.self, G->g);
        }
    }
    rop *done = progress_locked(G);
    pthread_mutex_unlock(&G->order);
    pthread_mutex_unlock(&G->q);
    answer(before);
    answer(done);
}

static void dispatch(rpc_call *call, void *arg)
{
    (void)arg;
    const envelope *env = rpc_call_envelope(call);
    const rpc_method *m = rpc_call_method(call);
    rpc_handler_fn h = original_handler(m);
    uint32_t N = node.cfg.num_servers, self = node.cfg.self;
    uint32_t g = env->group ? env->group - 1 : self;
    if (g >= N) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "group %u does not exist: the cluster has %u servers (groups 0..%u)", g, N,
                        N - 1);
        return;
    }
    rgroup *G = node.groups[g];
    if (m->method == PSD__V1__METHOD__SERVER_STATUS || m->method == PSD__V1__METHOD__SHUTDOWN ||
        m->method == PSD__V1__METHOD__CHECKPOINT) {
        /* Not a group's data: status of the group asked (when held), admin calls of the
         * process (checkpoints are of the server's own group). */
        h(call, G && m->method == PSD__V1__METHOD__SERVER_STATUS ? G->st : node.groups[self]->st);
        return;
    }
    char holders[96] = "";
    pthread_mutex_lock(&node.vlock);
    uint64_t epoch = node.cur.epoch;
    int32_t prim = node.cur.primary[g];
    if (prim < 0 && epoch != 0)
        in_sync_list(&node.cur, g, holders, sizeof(holders));
    pthread_mutex_unlock(&node.vlock);
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
    bool reads =
        !is_update(m->method) && !(m->method == PSD__V1__METHOD__TABLE_PULL &&
                                   sync_would_register(G->st, env->worker_id, env->client_id));
    if (reads) {
        /* A pull that parks (staleness bound, BSP barrier) is answered by the update that ends
         * its wait: its reply goes out once that update is applied everywhere (commit_gate). */
        rpc_call_set_gate(call, commit_gate, G, 0);
        sync_set_thread_logged(false);
        h(call, G->st);
        sync_set_thread_logged(true);
        if (!rpc_call_deferred_here(call))
            rpc_call_set_gate(call, NULL, NULL, 0);
        return;
    }
    run_update(call, G, h);
}

/* ---- the backups' side ---- */

static int var_cmp(const void *a, const void *b)
{
    return strcmp((*(variable *const *)a)->name, (*(variable *const *)b)->name);
}

/* FNV-1a over every variable of st by name: name, version, range, values and optimizer slots
 * (updates held off meanwhile), then every table's rows (server_tables_checksum). */
static uint64_t group_checksum(server_state *st, uint32_t *nvars)
{
    uint64_t h = FNV1A_INIT;
    store_freeze(st->vars);
    variable **vars;
    size_t n = store_list(st->vars, &vars);
    if (n)
        qsort(vars, n, sizeof(*vars), var_cmp);
    for (size_t i = 0; i < n; i++) {
        variable *v = vars[i];
        uint64_t ver = atomic_load(&v->version);
        h = fnv1a_update(h, v->name, strlen(v->name) + 1);
        h = fnv1a_update(h, &ver, sizeof(ver));
        h = fnv1a_update(h, &v->offset, sizeof(v->offset));
        h = fnv1a_update(h, &v->count, sizeof(v->count));
        h = fnv1a_update(h, v->params, v->count * sizeof(float));
        for (size_t k = 0; k < v->nslots; k++)
            h = fnv1a_update(h, v->slots[k], v->count * sizeof(float));
    }
    store_list_release(vars, n);
    h = server_tables_checksum(st, h);
    store_thaw(st->vars);
    *nvars = (uint32_t)n;
    return h;
}

/* Primary: the chunk of a copy image at rq->copy_offset, for the rejoining server rq->from - 1.
 * Offset 0 takes a new image: a checkpoint of the group written while its updates wait, at
 * log position copy_lsn, from which the backup is streamed as catching up. */
static void copy_serve(rpc_call *call, rgroup *G, const Psd__V1__ReplicateRequest *rq)
{
    Psd__V1__ReplicateReply rep = PSD__V1__REPLICATE_REPLY__INIT;
    rpeer *p = NULL;
    for (uint32_t i = 0; i < G->npeers; i++)
        if (rq->from != 0 && G->peers[i].server == rq->from - 1)
            p = &G->peers[i];
    if (p == NULL) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "copy of group %u asked for by server %d, which is no member of it", G->g,
                        (int)rq->from - 1);
        return;
    }
    pthread_mutex_lock(&G->q);
    bool serving = G->serving;
    pthread_mutex_unlock(&G->q);
    if (!serving) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "copy of group %u: server %u does not serve it as primary", G->g,
                        node.cfg.self);
        return;
    }
    if (rq->copy_offset == 0) {
        char dir[] = "/tmp/psd-copy-XXXXXX", err[4400];
        if (mkdtemp(dir) == NULL) {
            rpc_reply_error(call, STATUS_INTERNAL, "copy of group %u: mkdtemp: %s", G->g,
                            strerror(errno));
            return;
        }
        checkpoint_config cc = {.dir = dir, .keep = 1, .cluster_hash = node.cfg.cluster_hash};
        checkpointer *ck = checkpointer_create(G->st, &cc, 1, err, sizeof(err));
        checkpoint_info info;
        int rc = -1;
        uint64_t lsn = 0, img_epoch = 0;
        if (ck) {
            pthread_mutex_lock(&G->order);
            rc = checkpoint_write(ck, &info, err, sizeof(err));
            lsn = G->next_lsn;
            img_epoch = G->last_epoch;
            if (rc == 0) {
                pthread_mutex_lock(&G->q);
                p->catching_up = true;
                p->told = p->confirmed = false;
                p->failing_since_ns = 0;
                p->acked = lsn - 1;
                pthread_mutex_unlock(&G->q);
            }
            pthread_mutex_unlock(&G->order);
            checkpointer_destroy(ck);
        }
        uint8_t *img = NULL;
        size_t len = 0;
        if (rc == 0) {
            FILE *f = fopen(info.path, "rb");
            if (f && fseek(f, 0, SEEK_END) == 0) {
                long n = ftell(f);
                if (n > 0 && (img = malloc((size_t)n)) != NULL) {
                    rewind(f);
                    if (fread(img, 1, (size_t)n, f) == (size_t)n) {
                        len = (size_t)n;
                    } else {
                        free(img);
                        img = NULL;
                    }
                }
            }
            if (f)
                fclose(f);
            if (img == NULL) {
                rc = -1;
                snprintf(err, sizeof(err), "cannot read back %s", info.path);
            }
            unlink(info.path);
        }
        char path[64];
        snprintf(path, sizeof(path), "%s/.state-%u", dir, G->g);
        unlink(path);
        rmdir(dir);
        if (rc != 0) {
            pthread_mutex_lock(&G->q);
            p->catching_up = false;
            pthread_mutex_unlock(&G->q);
            rpc_reply_error(call, STATUS_INTERNAL, "copy of group %u: %s", G->g, err);
            return;
        }
        pthread_mutex_lock(&G->q);
        free(p->img);
        p->img = img;
        p->img_len = len;
        p->img_lsn = lsn;
        p->img_epoch = img_epoch;
        pthread_cond_broadcast(&G->qcond);
        pthread_mutex_unlock(&G->q);
        log_info("group %u: copy for rejoining server %u: %zu bytes at lsn %llu", G->g, p->server,
                 len, (unsigned long long)lsn);
    }
    pthread_mutex_lock(&G->q);
    if (p->img == NULL || rq->copy_offset > p->img_len) {
        pthread_mutex_unlock(&G->q);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "copy of group %u: no image at offset %llu (ask from offset 0)", G->g,
                        (unsigned long long)rq->copy_offset);
        return;
    }
    size_t chunk =
        rpc_call_max_message(call) > (1u << 17) ? rpc_call_max_message(call) - 65536 : 65536;
    if (chunk > (4u << 20))
        chunk = 4u << 20;
    size_t n = p->img_len - (size_t)rq->copy_offset;
    if (n > chunk)
        n = chunk;
    rep.copy_total = p->img_len;
    rep.copy_len = n;
    rep.copy_lsn = p->img_lsn;
    rep.copy_epoch = p->img_epoch;
    uint64_t words = (n + 3) / 4;
    uint8_t *seg = rpc_reply_ok_segment(call, &rep.base, 0, words);
    if (seg) {
        memcpy(seg, p->img + rq->copy_offset, n);
        memset(seg + n, 0, (size_t)words * 4 - n);
    }
    if (rq->copy_offset + n == p->img_len) {
        free(p->img);
        p->img = NULL;
        p->img_len = 0;
    }
    pthread_mutex_unlock(&G->q);
}

static void rejoin_locked(rgroup *G);

/* Whether call, a REPLICATE of its log or copy, comes from a server of this cluster: it
 * carries the cluster token (view_agent_token). Refused (answered) otherwise. */
static bool replica_peer_ok(rpc_call *call)
{
    char tok[80];
    if (node.agent == NULL || !view_agent_token(node.agent, tok, sizeof(tok))) {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server %u has not read the cluster token from the coordinator yet: "
                        "retry",
                        node.cfg.self);
        return false;
    }
    if (rpc_call_carries_token(call, tok))
        return true;
    log_warn("refused REPLICATE without the cluster token (a server-to-server method: only the "
             "cluster's servers, which read the token from the coordinator, may send it)");
    rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                    "REPLICATE is a server-to-server method: the request does not carry the "
                    "cluster token that the servers read from the coordinator");
    return false;
}

void replica_handle_replicate(rpc_call *call, void *arg)
{
    (void)arg;
    if (!node.on) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "this server runs with replicas 1: it holds no replica group");
        return;
    }
    const Psd__V1__ReplicateRequest *rq = (const Psd__V1__ReplicateRequest *)rpc_call_body(call);
    uint32_t N = node.cfg.num_servers, self = node.cfg.self;
    if (rq->group >= N || node.groups[rq->group] == NULL) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u holds no copy of group %u (replicas %u of %u servers)", self,
                        rq->group, node.cfg.replicas, N);
        return;
    }
    rgroup *G = node.groups[rq->group];
    Psd__V1__ReplicateReply rep = PSD__V1__REPLICATE_REPLY__INIT;
    /* A group's checksum is a read for operators (the admin role); its log and copies are
     * the cluster's servers' alone: the cluster token, never a loopback peer as such. */
    if (rq->checksum ? !rpc_call_check_admin(call) : !replica_peer_ok(call))
        return;
    if (rq->checksum) {
        pthread_mutex_lock(&G->order);
        rep.applied_lsn = G->next_lsn;
        rep.checksum = group_checksum(G->st, &rep.variables);
        pthread_mutex_unlock(&G->order);
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (rq->copy) {
        copy_serve(call, G, rq);
        return;
    }
    pthread_mutex_lock(&node.vlock);
    uint64_t epoch = node.cur.epoch;
    int32_t prim = node.cur.primary[rq->group];
    pthread_mutex_unlock(&node.vlock);
    if (rq->epoch > epoch) {
        /* From a view this server has not installed yet (or no view at all): it does not know
         * whether the sender is the group's primary there. The sender retries. */
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "REPLICATE of group %u under view epoch %llu: this server is at epoch "
                        "%llu and has not installed that view yet: retry",
                        rq->group, (unsigned long long)rq->epoch, (unsigned long long)epoch);
        return;
    }
    if (rq->epoch < epoch) {
        if (prim >= 0)
            rpc_call_set_primary(call, (uint32_t)prim);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "REPLICATE of group %u under view epoch %llu refused: this server is at "
                        "epoch %llu, where the group's primary is server %d",
                        rq->group, (unsigned long long)rq->epoch, (unsigned long long)epoch, prim);
        return;
    }
    if (prim == (int32_t)self) {
        /* Even from a newer epoch: until this server installed that view it numbers the
         * group's log itself; the sender retries. */
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "REPLICATE of group %u refused: this server is its primary in epoch %llu",
                        rq->group, (unsigned long long)epoch);
        return;
    }
    size_t seglen;
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    size_t total = 0;
    for (size_t i = 0; i < rq->n_op_len; i++) {
        if (rq->op_len[i] == 0 || rq->op_len[i] > seglen) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "REPLICATE operation %zu has length %llu (segment of %zu bytes)", i,
                            (unsigned long long)rq->op_len[i], seglen);
            return;
        }
        total += ((size_t)rq->op_len[i] + 3) & ~(size_t)3;
    }
    if (total != seglen || (rq->n_op_len > 0 && rq->first_lsn == 0)) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "REPLICATE: %zu operations of %zu padded bytes in a segment of %zu bytes "
                        "(first lsn %llu)",
                        rq->n_op_len, total, seglen, (unsigned long long)rq->first_lsn);
        return;
    }
    pthread_mutex_lock(&G->order);
    if (!G->ready) {
        pthread_mutex_unlock(&G->order);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u is copying group %u from its primary: not ready for its log yet",
                        self, rq->group);
        return;
    }
    /* Checked again under the order lock, which a view change takes: a view installed since
     * the check above may have made this server the group's primary or moved past the epoch. */
    if (G->serving || rq->epoch < G->epoch) {
        uint64_t now = G->epoch;
        bool serving = G->serving;
        pthread_mutex_unlock(&G->order);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "REPLICATE of group %u under view epoch %llu refused: this server %s "
                        "(epoch %llu)",
                        rq->group, (unsigned long long)rq->epoch,
                        serving ? "is now its primary" : "moved to a newer view",
                        (unsigned long long)now);
        return;
    }
    /* Log matching (repl_match.h): a copy that diverged from the primary copies the group
     * again, and answers nothing the primary could count as agreement meanwhile. */
    uint64_t mine = G->next_lsn - 1;
    repl_match match =
        repl_match_batch(mine, G->last_epoch, G->verified, rq->last_lsn, rq->committed_lsn,
                         rq->first_lsn, rq->n_op_len, rq->op_epoch, rq->n_op_epoch);
    if (match == REPL_MATCHED)
        G->verified = true;
    if (match == REPL_DIVERGED) {
        uint64_t at_primary =
            mine <= rq->last_lsn && rq->first_lsn <= mine && mine < rq->first_lsn + rq->n_op_epoch
                ? rq->op_epoch[mine - rq->first_lsn]
                : 0;
        log_warn("group %u: this copy applied up to lsn %llu (epoch %llu), which the primary's "
                 "log (end %llu, epoch %llu there) does not hold: copying the group again",
                 G->g, (unsigned long long)mine, (unsigned long long)G->last_epoch,
                 (unsigned long long)rq->last_lsn, (unsigned long long)at_primary);
        pthread_mutex_lock(&G->q);
        G->fresh = false;
        rejoin_locked(G);
        pthread_mutex_unlock(&G->q);
        pthread_mutex_unlock(&G->order);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u diverged from the primary on group %u at lsn %llu: it copies "
                        "the group again",
                        self, rq->group, (unsigned long long)mine);
        return;
    }
    /* Kept operations reference the batch's message (replicas > 2). */
    rpc_held *batch = NULL;
    if (node.cfg.replicas > 2) {
        const uint8_t *d;
        size_t l;
        batch = rpc_call_hold_request(call, &d, &l);
    }
    size_t at = 0;
    for (size_t i = 0; i < rq->n_op_len; i++) {
        uint64_t lsn = rq->first_lsn + i;
        size_t len = (size_t)rq->op_len[i];
        if (lsn == G->next_lsn) {
            /* Applied from the received message's bytes, in place, at the time the primary
             * logged it (a primary of an older version sends none: now). */
            uint64_t t = i < rq->n_op_time_ms ? rq->op_time_ms[i] : 0;
            time_op_set(t);
            if (rpc_server_handle_borrowed(G->local, seg + at, len) != 0)
                log_error("group %u: out of memory applying lsn %llu", G->g,
                          (unsigned long long)lsn);
            time_op_set(0);
            G->next_lsn++;
            if (i < rq->n_op_epoch)
                G->last_epoch = rq->op_epoch[i];
            if (node.cfg.replicas > 2) {
                /* Kept until every replica applied it: this copy may become the primary that
                 * brings a backup behind it up to date. */
                rop *o = calloc(1, sizeof(*o));
                if (o && batch) {
                    o->held = rpc_held_ref(batch);
                    o->bytes = seg + at;
                } else if (o && (o->own = malloc(len)) != NULL) {
                    memcpy(o->own, seg + at, len);
                    o->bytes = o->own;
                }
                if (o && o->bytes) {
                    o->len = len;
                    o->lsn = lsn;
                    o->epoch = i < rq->n_op_epoch ? rq->op_epoch[i] : 0;
                    o->time_ms = t;
                    pthread_mutex_lock(&G->q);
                    if (G->tail)
                        G->tail->next = o;
                    else
                        G->head = o;
                    G->tail = o;
                    G->last_lsn = lsn;
                    pthread_mutex_unlock(&G->q);
                } else {
                    free(o);
                }
            }
        }
        at += (len + 3) & ~(size_t)3;
    }
    rpc_held_release(batch);
    rep.applied_lsn = G->next_lsn;
    /* Caught up once the primary waits for it (rq->counted): from then on every update it
     * acknowledges is one this copy has. */
    bool caught_up = G->next_lsn > rq->last_lsn && rq->counted;
    pthread_mutex_unlock(&G->order);
    pthread_mutex_lock(&G->q);
    bool mark = caught_up && !G->marked;
    if (mark)
        G->marked = true;
    pthread_mutex_unlock(&G->q);
    if (mark) {
        log_info("group %u: caught up with its primary at lsn %llu", G->g,
                 (unsigned long long)rep.applied_lsn);
        if (node.agent)
            view_agent_mark_caught_up(node.agent, G->g);
    }
    if (rq->committed_lsn) {
        pthread_mutex_lock(&G->q);
        if (!G->serving) {
            while (G->head && G->head->lsn <= rq->committed_lsn) {
                rop *o = G->head;
                G->head = o->next;
                if (G->head == NULL)
                    G->tail = NULL;
                rop_free(o);
            }
            if (rq->committed_lsn > G->committed)
                G->committed = rq->committed_lsn;
        }
        pthread_mutex_unlock(&G->q);
    }
    rpc_reply_ok(call, &rep.base);
}

static server_state *make_state(uint32_t g, char *err, size_t errlen);

/* ---- checkpoints of the groups ---- */

/* checkpoint_position_fn of a group: its log stays still (order) while its state is copied. */
static bool group_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn)
{
    rgroup *G = arg;
    if (!hold) {
        pthread_mutex_unlock(&G->order);
        return false;
    }
    pthread_mutex_lock(&G->order);
    pthread_mutex_lock(&G->q);
    /* Before the first view: the copy is the restored one, at its position. */
    *epoch = G->epoch ? G->epoch : G->restored_epoch;
    pthread_mutex_unlock(&G->q);
    *lsn = G->next_lsn;
    return G->ready; /* a copy being replaced has no position */
}

/* The own group's position once its group is freed (its final checkpoint). */
static bool final_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn)
{
    (void)arg;
    if (!hold)
        return false;
    *epoch = node.final_epoch;
    *lsn = node.final_lsn;
    return node.final_valid;
}

/* Where the groups this server took over are checkpointed: <dir>/group-copies-<self>. */
static void copies_dir(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/group-copies-%u", node.cfg.ckpt->dir, node.cfg.self);
}

/* Starts checkpointing group G, which this server begins to serve and does not own (vlock
 * held). Failures are logged: the group is served all the same, as without checkpoints. */
static void group_ck_start(rgroup *G)
{
    if (node.cfg.own_ck == NULL || G->ck != NULL || G->g == node.cfg.self)
        return;
    char dir[4200], err[1024];
    copies_dir(dir, sizeof(dir));
    checkpoint_config cc = *node.cfg.ckpt;
    cc.dir = dir;
    cc.failpoint = NULL;
    checkpointer *ck = checkpointer_create(G->st, &cc, G->ck_next_seq, err, sizeof(err));
    if (ck != NULL) {
        checkpointer_set_position(ck, group_position, G);
        if (checkpointer_start(ck, err, sizeof(err)) != 0) {
            checkpointer_destroy(ck);
            ck = NULL;
        }
    }
    if (ck == NULL) {
        log_error("group %u: served here from now on, but not checkpointed: %s", G->g, err);
        return;
    }
    G->ck = ck;
    atomic_store(&G->has_files, true);
    log_info("group %u: checkpointed into %s while this server serves it", G->g, dir);
}

/* Stops checkpointing G (no longer served here; vlock held, order not). */
static void group_ck_stop(rgroup *G)
{
    if (G->ck == NULL)
        return;
    checkpointer_stop(G->ck);
    G->ck_next_seq = checkpointer_next_seq(G->ck);
    checkpointer_destroy(G->ck);
    G->ck = NULL;
}

/* Removes the checkpoints of group G (not the own one) from <dir>/group-copies-<self>: this
 * server's copy of G no longer is the one they hold (it stopped serving G while it lives on,
 * or copied G from another primary), and a restart must not take them for what it held in
 * sync (view_agent_set_lacks). Not at shutdown: a stopping server keeps its final checkpoint. */
static void group_copies_drop(rgroup *G)
{
    if (node.cfg.own_ck == NULL || G->g == node.cfg.self || atomic_load(&node.stopping))
        return;
    atomic_store(&G->has_files, false);
    char dir[4200], path[4600], pfx[32], tmp[32], state[32];
    copies_dir(dir, sizeof(dir));
    snprintf(pfx, sizeof(pfx), "ckpt-%u-", G->g);
    snprintf(tmp, sizeof(tmp), ".ckpt-%u-", G->g);
    snprintf(state, sizeof(state), ".state-%u", G->g);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, pfx, strlen(pfx)) != 0 &&
            strncmp(e->d_name, tmp, strlen(tmp)) != 0 && strcmp(e->d_name, state) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            n++;
        else
            log_warn("group %u: cannot remove %s: %s", G->g, path, strerror(errno));
    }
    closedir(d);
    if (n > 0)
        log_info("group %u: removed %d checkpoint file(s) of it from %s: this server's copy is "
                 "no longer the one they hold",
                 G->g, n, dir);
}

/* Restores group G (not the own one) from <dir>/group-copies-<self> at start, if it has a
 * checkpoint there: its copy and log position, published to the coordinator. */
static int group_restore(rgroup *G, char *err, size_t errlen)
{
    char dir[4200], why[2048];
    copies_dir(dir, sizeof(dir));
    checkpoint_config cc = *node.cfg.ckpt;
    cc.dir = dir;
    checkpoint_info info;
    uint64_t max_seq = 0;
    int r = CKPT_NONE;
    struct stat sb;
    if (stat(dir, &sb) == 0)
        r = checkpoint_restore(G->st, &cc, &info, &max_seq, why, sizeof(why));
    G->ck_next_seq = max_seq + 1;
    if (r == CKPT_NONE)
        return 0;
    atomic_store(&G->has_files, true);
    if (r != CKPT_RESTORED) {
        /* Only a copy: the group's other members may hold a good one. Start it empty. */
        log_warn("group %u: its checkpoints in %s do not restore (%s): this server holds no "
                 "copy of it until it copies one from the group's primary",
                 G->g, dir, why);
        server_state *fresh = make_state(G->g, err, errlen);
        if (fresh == NULL)
            return -1;
        server_state *old = G->st;
        G->st = fresh;
        server_tables_free(old);
        store_destroy(old->vars);
        dedup_destroy(old->dedup);
        sync_destroy(old->sync);
        free(old);
        return 0;
    }
    sync_resume(G->st);
    if (info.has_position) {
        G->restored = true;
        G->restored_epoch = info.epoch;
        G->last_epoch = info.epoch;
        G->restored_lsn = info.lsn;
        G->next_lsn = info.lsn;
        G->last_lsn = G->committed = info.lsn - 1;
    }
    log_info("group %u: restored the copy checkpointed while this server served it: %s, %u "
             "variables, %llu table rows, view epoch %llu, lsn %llu",
             G->g, info.path, info.variables, (unsigned long long)info.table_rows,
             (unsigned long long)info.epoch, (unsigned long long)info.lsn);
    return 0;
}

size_t replica_restored_copies(view_copy *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS && n < cap; g++) {
        rgroup *G = node.groups[g];
        if (G && G->restored)
            out[n++] = (view_copy){.server = node.cfg.self,
                                   .group = g,
                                   .epoch = G->restored_epoch,
                                   .lsn = G->restored_lsn};
    }
    return n;
}

/* ---- rejoin (the backup's side) ---- */

typedef struct copy_call {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool done;
    int status;
    char message[512];
    uint8_t body[64];
    size_t body_len;
    uint8_t *dst; /* the image being filled */
    size_t cap, total, len;
    uint64_t lsn;
    uint64_t epoch; /* of the image's last operation */
} copy_call;

static int copy_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    copy_call *k = arg;
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.deadline_ms = deadline_ms;
    env.worker_id = -1;
    env.body.data = k->body;
    env.body.len = k->body_len;
    char tok[80];
    if (node.agent && view_agent_token(node.agent, tok, sizeof(tok))) {
        env.auth_token.data = (uint8_t *)tok;
        env.auth_token.len = strlen(tok);
    }
    return frame_build(out, &env, NULL, 0, NULL);
}

static void copy_done(void *arg, int status, const char *message, const frame *reply)
{
    copy_call *k = arg;
    pthread_mutex_lock(&k->m);
    k->status = status;
    snprintf(k->message, sizeof(k->message), "%s", message);
    if (status == STATUS_OK && reply) {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        size_t at = k->len;
        if (r == NULL || r->copy_total == 0 || (k->total && r->copy_total != k->total) ||
            r->copy_len > reply->segment_len || at + r->copy_len > r->copy_total) {
            k->status = STATUS_INTERNAL;
            snprintf(k->message, sizeof(k->message), "copy reply does not fit the image");
        } else {
            if (k->dst == NULL) {
                k->dst = malloc((size_t)r->copy_total);
                k->cap = (size_t)r->copy_total;
                k->total = (size_t)r->copy_total;
                k->lsn = r->copy_lsn;
                k->epoch = r->copy_epoch;
            }
            if (k->dst == NULL) {
                k->status = STATUS_RESOURCE_EXHAUSTED;
                snprintf(k->message, sizeof(k->message), "out of memory for the copy");
            } else {
                memcpy(k->dst + at, reply->segment, (size_t)r->copy_len);
                k->len += (size_t)r->copy_len;
            }
        }
        if (r)
            psd__v1__replicate_reply__free_unpacked(r, NULL);
    }
    k->done = true;
    pthread_cond_signal(&k->c);
    pthread_mutex_unlock(&k->m);
}

/* Fetches a whole image of group G from server prim. Returns 0 with it in k. */
static int copy_fetch(rgroup *G, int32_t prim, copy_call *k, uint64_t epoch)
{
    char label[64], err[512];
    snprintf(label, sizeof(label), "ps %d (primary of group %u)", prim, G->g);
    rpc_conn_config cc = {
        .url = node.cfg.urls[prim],
        .connections = 1,
        .max_message = node.cfg.max_message + 65536,
        .label = label,
        .tls = node.cfg.tls,
    };
    rpc_conn *conn;
    if (rpc_conn_open(&conn, &cc, err, sizeof(err)) != 0) {
        log_warn("group %u: cannot reach its primary %d for a copy: %s", G->g, prim, err);
        return -1;
    }
    int rc = 0;
    free(k->dst);
    k->dst = NULL;
    k->total = k->len = 0;
    do {
        Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
        rq.group = G->g;
        rq.epoch = epoch;
        rq.copy = true;
        rq.copy_offset = k->len;
        rq.from = node.cfg.self + 1;
        k->body_len = psd__v1__replicate_request__pack(&rq, k->body);
        k->done = false;
        rpc_call_opts o = {.deadline_ms = 60000, .retries = 3, .backoff_ms = 100};
        if (rpc_conn_call(conn, &o, copy_build, copy_done, k) != 0) {
            rc = -1;
            break;
        }
        pthread_mutex_lock(&k->m);
        while (!k->done)
            pthread_cond_wait(&k->c, &k->m);
        pthread_mutex_unlock(&k->m);
        if (k->status != STATUS_OK) {
            log_warn("group %u: copy from primary %d failed: %s: %s", G->g, prim,
                     status_name(k->status), k->message);
            rc = -1;
            break;
        }
    } while (k->len < k->total && !atomic_load(&node.stopping));
    rpc_conn_close(conn);
    return rc == 0 && k->len == k->total ? 0 : -1;
}

/* Restores an image into a fresh state of group G and makes it G's copy at log position lsn,
 * taken from primary `from` in view view_epoch, its last operation logged under `epoch`. */
static int copy_install(rgroup *G, const uint8_t *img, size_t len, uint64_t lsn, uint64_t epoch,
                        int32_t from, uint64_t view_epoch)
{
    char dir[] = "/tmp/psd-rejoin-XXXXXX", path[128], err[4400];
    if (mkdtemp(dir) == NULL) {
        log_error("group %u: mkdtemp: %s", G->g, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof(path), "%s/ckpt-%u-1.psc", dir, G->g);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(img, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    server_state *st = ok ? make_state(G->g, err, sizeof(err)) : NULL;
    int rc = -1;
    if (st) {
        checkpoint_config cc = {.dir = dir, .keep = 1, .cluster_hash = node.cfg.cluster_hash};
        checkpoint_info info;
        uint64_t max_seq;
        int r = checkpoint_restore(st, &cc, &info, &max_seq, err, sizeof(err));
        if (r == CKPT_RESTORED) {
            rc = 0;
        } else {
            log_error("group %u: the copy does not restore: %s", G->g,
                      r == CKPT_NONE ? "no image" : err);
        }
    }
    unlink(path);
    rmdir(dir);
    if (rc != 0) {
        if (st) {
            store_destroy(st->vars);
            dedup_destroy(st->dedup);
            sync_destroy(st->sync);
            free(st);
        }
        return -1;
    }
    rpc_server_config lc = {
        .max_message = node.cfg.max_message,
        .default_deadline_ms = 60000,
        .methods = server_methods,
        .n_methods = server_methods_len,
        .handler_arg = G->owned ? st : G->st, /* the own group keeps its address */
        .trusted = true,
    };
    rpc_server *local = rpc_server_open_local(&lc);
    if (local == NULL)
        return -1; /* st leaks: out of memory anyway */
    server_state *old = NULL;
    if (!G->owned && (old = malloc(sizeof(*old))) == NULL) {
        rpc_server_close_local(local);
        return -1;
    }
    pthread_mutex_lock(&G->order);
    if (!G->owned) {
        /* The server's own group keeps its address (its checkpoints and metrics use it): the
         * copy's contents move in, the previous ones out. */
        memcpy(old, G->st, sizeof(*old));
        /* What belongs to the process, not to the group's contents, stays: its checkpointer,
         * its failover agent (a stop revokes the lease through it: without it a server that
         * had rejoined left the others waiting for its lease to expire), its RPC server, a
         * shutdown asked for, its start time, counters and create count. */
        atomic_store(&st->ck, atomic_load(&G->st->ck));
        st->view_agent = G->st->view_agent;
        st->rpc = G->st->rpc;
        st->start_ns = G->st->start_ns;
        atomic_store(&st->shutdown_requested, atomic_load(&G->st->shutdown_requested));
        atomic_store(&st->updates_applied, atomic_load(&G->st->updates_applied));
        atomic_store(&st->duplicates_dropped, atomic_load(&G->st->duplicates_dropped));
        /* Creates count on from the process's count: its checkpointer's durable mark is in
         * that count (back at 0, a create would pass for durable before any checkpoint). */
        atomic_store(&st->create_gen, atomic_load(&G->st->create_gen));
        memcpy(G->st, st, sizeof(*st));
        free(st);
        st = G->st;
        old->rpc = NULL;
        /* The tables count their memory against the state they were made in. */
        server_tables_rebind(st);
        server_tables_rebind(old);
    } else {
        old = G->st;
    }
    if (node.nretired < sizeof(node.retired) / sizeof(node.retired[0]))
        node.retired[node.nretired++] = old;
    rpc_server_close_local(G->local);
    G->local = local;
    G->st = st;
    sync_set_logged(st, log_evict, G);
    G->next_lsn = lsn;
    G->last_epoch = epoch;
    G->ready = true;
    group_copies_drop(G);
    pthread_mutex_lock(&G->q);
    G->fresh = true;
    /* The primary's own log up to lsn, unless the view moved since it was asked for. */
    G->verified = G->primary == from && G->epoch == view_epoch;
    if (!G->serving) {
        free_log_locked(G); /* operations of the copy it replaced */
        G->last_lsn = G->committed = lsn - 1;
    }
    pthread_mutex_unlock(&G->q);
    pthread_mutex_unlock(&G->order);

    log_info("group %u: installed a copy of %zu bytes at lsn %llu; catching up on its log", G->g,
             len, (unsigned long long)lsn);
    return 0;
}

static void *copy_main(void *arg)
{
    rgroup *G = arg;
    copy_call k;
    memset(&k, 0, sizeof(k));
    pthread_mutex_init(&k.m, NULL);
    pthread_cond_init(&k.c, NULL);
    while (!atomic_load(&node.stopping)) {
        pthread_mutex_lock(&node.vlock);
        int32_t prim = node.cur.primary[G->g];
        uint64_t epoch = node.cur.epoch;
        pthread_mutex_unlock(&node.vlock);
        if (prim >= 0 && prim != (int32_t)node.cfg.self && copy_fetch(G, prim, &k, epoch) == 0 &&
            copy_install(G, k.dst, k.len, k.lsn, k.epoch, prim, epoch) == 0) {
            /* A copy from a server that is no longer the primary (asked under a view that
             * changed meanwhile, the old primary not yet aware): the new one never streams to
             * this copy, which would never catch up. Copied again from the primary. */
            pthread_mutex_lock(&G->q);
            int32_t now = G->primary;
            bool serving = G->serving;
            pthread_mutex_unlock(&G->q);
            if (now == prim || serving || now < 0)
                break;
            log_info("group %u: the copy came from server %d, no longer its primary: copying it "
                     "again from server %d",
                     G->g, prim, now);
        }
        struct timespec ts = {0, 300 * 1000000};
        nanosleep(&ts, NULL);
    }
    free(k.dst);
    pthread_mutex_destroy(&k.m);
    pthread_cond_destroy(&k.c);
    pthread_mutex_lock(&G->q);
    G->copying = false;
    pthread_mutex_unlock(&G->q);
    return NULL;
}

/* Out of the view: every copy this server holds is stale from now on; copy each group again
 * from its primary (order and q held). */
static void rejoin_locked(rgroup *G)
{
    if (G->copying || G->fresh)
        return; /* one copy per time out of the view: the stream keeps it up to date */
    G->ready = false;
    G->marked = false;
    if (node.agent)
        view_agent_unmark_caught_up(node.agent, G->g); /* a mark of an earlier copy */
    if (G->copy_started) {
        pthread_join(G->copy_thread, NULL); /* finished: copying is false */
        G->copy_started = false;
    }
    if (pthread_create(&G->copy_thread, NULL, copy_main, G) == 0) {
        G->copying = true;
        G->copy_started = true;
    } else {
        log_error("group %u: cannot start the copy thread", G->g);
    }
}

/* ---- life cycle ---- */

static void collect(metrics_out *out, void *arg)
{
    (void)arg;
    metrics_emit_one(out, "psd_replica_degraded_groups", METRIC_GAUGE,
                     "Groups this server serves as primary with a backup out of the view.",
                     (double)replica_degraded_groups());
    metrics_emit_one(out, "psd_replica_ops_streamed_total", METRIC_COUNTER,
                     "Logged operations applied by backups of groups this server serves.",
                     (double)atomic_load(&node.replicated_ops));
    uint64_t lag = 0;
    for (uint32_t g = 0; g < node.cfg.num_servers; g++) {
        rgroup *G = node.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&G->q);
        if (G->serving)
            lag += G->last_lsn - G->committed;
        pthread_mutex_unlock(&G->q);
    }
    metrics_emit_one(out, "psd_replica_lag_ops", METRIC_GAUGE,
                     "Logged operations not yet applied by every backup in the view.", (double)lag);
}

static server_state *make_state(uint32_t g, char *err, size_t errlen)
{
    const replica_config *c = &node.cfg;
    server_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        goto oom;
    st->task_index = g;
    st->num_servers = c->num_servers;
    st->replicated = true;
    st->start_ns = time_now_ns();
    st->vars = store_create();
    st->dedup = dedup_create(c->dedup_window);
    st->default_staleness = c->default_staleness;
    st->sync = sync_create(c->n_workers, c->worker_timeout_ms, c->bsp_mean, SERVER_MAX_WORKERS);
    st->rpc = node.groups[c->self]->st->rpc;
    if (st->vars && st->dedup && st->sync &&
        server_set_limits(st, c->max_bytes, c->max_vars, c->dedup_max_clients, c->dedup_idle_ms) ==
            0)
        return st;
    store_destroy(st->vars);
    dedup_destroy(st->dedup);
    sync_destroy(st->sync);
    free(st);
oom:
    snprintf(err, errlen, "out of memory making the copy of group %u", g);
    return NULL;
}

static void group_free(rgroup *G)
{
    if (G == NULL)
        return;
    rpc_server_close_local(G->local);
    if (G->owned) {
        server_tables_free(G->st);
        store_destroy(G->st->vars);
        dedup_destroy(G->st->dedup);
        sync_destroy(G->st->sync);
        free(G->st);
    }
    while (G->head) {
        rop *o = G->head;
        G->head = o->next;
        rop_free(o);
    }
    for (uint32_t i = 0; i < G->npeers; i++)
        free(G->peers[i].img);
    pthread_mutex_destroy(&G->order);
    pthread_mutex_destroy(&G->q);
    pthread_cond_destroy(&G->qcond);
    free(G);
}

int replica_start(const replica_config *cfg, server_state *own, char *err, size_t errlen)
{
    if (cfg->replicas < 2 || cfg->replicas > REPLICA_MAX || cfg->replicas > cfg->num_servers ||
        cfg->num_servers > VIEW_MAX_SERVERS) {
        snprintf(err, errlen,
                 "replicas %u: must be 2..%u and at most the %u servers of the cluster",
                 cfg->replicas, REPLICA_MAX, cfg->num_servers);
        return -1;
    }
    node.cfg = *cfg;
    atomic_store(&node.stopping, false);
    uint64_t r1 = time_now_ns() ^ ((uint64_t)cfg->self << 48), r2 = (uint64_t)(uintptr_t)&node;
    snprintf(node.local_token, sizeof(node.local_token), "%016llx%016llx", (unsigned long long)r1,
             (unsigned long long)r2);
    /* Every group this server is a member of: its own first (make_state copies its rpc). */
    for (uint32_t k = 0; k < cfg->replicas; k++) {
        uint32_t g = (cfg->self + cfg->num_servers - k) % cfg->num_servers;
        rgroup *G = calloc(1, sizeof(*G));
        if (G == NULL) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        G->g = g;
        node.groups[g] = G;
        pthread_mutex_init(&G->order, NULL);
        pthread_mutex_init(&G->q, NULL);
        pthread_cond_init(&G->qcond, NULL);
        G->next_lsn = 1;
        G->ready = true;
        if (k == 0) {
            G->st = own;
            own->replicated = true;
            if (cfg->own_restored) {
                G->restored = true;
                G->restored_epoch = cfg->own_epoch;
                G->last_epoch = cfg->own_epoch;
                G->restored_lsn = cfg->own_lsn;
                G->next_lsn = cfg->own_lsn;
                G->last_lsn = G->committed = cfg->own_lsn - 1;
            }
        } else {
            G->owned = true;
            if ((G->st = make_state(g, err, errlen)) == NULL)
                goto fail;
            if (cfg->own_ck && group_restore(G, err, errlen) != 0)
                goto fail;
        }
        rpc_server_config lc = {
            .max_message = cfg->max_message,
            .default_deadline_ms = 60000,
            .max_deadline_ms = 0,
            .methods = server_methods,
            .n_methods = server_methods_len,
            .handler_arg = G->st,
            .trusted = true,
        };
        if ((G->local = rpc_server_open_local(&lc)) == NULL) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        sync_set_logged(G->st, log_evict, G);
        for (uint32_t j = 0; j < cfg->replicas; j++) {
            uint32_t s = (g + j) % cfg->num_servers;
            if (s == cfg->self)
                continue;
            rpeer *p = &G->peers[G->npeers++];
            p->grp = G;
            p->server = s;
            p->rank = j;
        }
    }
    /* The initial view. With a coordinator, none: nothing is served until its first view.
     * Without, a fixed one: everyone up, every group at its placement server. */
    view v;
    memset(&v, 0, sizeof(v));
    v.epoch = 1;
    v.num_servers = cfg->num_servers;
    v.replicas = cfg->replicas;
    for (uint32_t i = 0; i < cfg->num_servers; i++) {
        v.primary[i] = cfg->coordinated ? -1 : (int32_t)i;
        v.live[i] = !cfg->coordinated;
    }
    if (cfg->coordinated) {
        node.cur = v;
        node.cur.epoch = 0;
    }
    node.methods = calloc(server_methods_len, sizeof(*node.methods));
    if (node.methods == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < server_methods_len; i++) {
        node.methods[i] = server_methods[i];
        if (server_methods[i].method != PSD__V1__METHOD__REPLICATE)
            node.methods[i].handler = dispatch;
    }
    node.n_methods = server_methods_len;
    node.on = true;
    node.final_valid = false;
    if (cfg->own_ck)
        checkpointer_set_position(cfg->own_ck, group_position, node.groups[cfg->self]);
    if (!cfg->coordinated)
        replica_set_view(&v);
    metrics_add_collector(collect, NULL);
    log_info("replicas %u: serving group %u as primary, holding backup copies of %u group(s)",
             cfg->replicas, cfg->self, cfg->replicas - 1);
    return 0;
fail:
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        group_free(node.groups[g]);
        node.groups[g] = NULL;
    }
    free(node.methods);
    node.methods = NULL;
    return -1;
}

const rpc_method *replica_methods(size_t *n)
{
    *n = node.n_methods;
    return node.methods;
}

void *replica_handler_arg(void)
{
    return &node;
}

void replica_set_server(rpc_server *rpc)
{
    node.rpc = rpc;
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++)
        if (node.groups[g])
            node.groups[g]->st->rpc = rpc;
    pthread_mutex_lock(&node.vlock);
    rpc_server_set_epoch(rpc, node.cur.epoch);
    pthread_mutex_unlock(&node.vlock);
}

bool replica_sweeps_own(void)
{
    if (!node.on)
        return true;
    pthread_mutex_lock(&node.vlock);
    bool mine = node.cur.epoch != 0 && node.cur.primary[node.cfg.self] == (int32_t)node.cfg.self;
    pthread_mutex_unlock(&node.vlock);
    return mine;
}

void replica_sweep(void)
{
    if (!node.on)
        return;
    uint32_t N = node.cfg.num_servers, self = node.cfg.self;
    for (uint32_t g = 0; g < N; g++) {
        if (node.groups[g] == NULL)
            continue;
        pthread_mutex_lock(&node.vlock);
        bool mine = node.cur.epoch != 0 && node.cur.primary[g] == (int32_t)self;
        pthread_mutex_unlock(&node.vlock);
        /* A group served is never replaced by a copy; a replaced state is retired, not
         * freed, until replica_free. Its own group's workers are swept by the caller. */
        if (mine && g != self)
            sync_sweep(node.groups[g]->st);
        if (mine)
            server_tables_sweep_due(node.groups[g]->st, log_sweep, node.groups[g]);
    }
}

void replica_get_view(view *out)
{
    pthread_mutex_lock(&node.vlock);
    *out = node.cur;
    pthread_mutex_unlock(&node.vlock);
}

void replica_set_view(const view *v)
{
    if (!node.on)
        return;
    pthread_mutex_lock(&node.vlock);
    if (v->epoch <= node.cur.epoch || v->num_servers != node.cfg.num_servers) {
        pthread_mutex_unlock(&node.vlock);
        return;
    }
    view old = node.cur;
    node.cur = *v;
    if (node.rpc)
        rpc_server_set_epoch(node.rpc, v->epoch);
    uint32_t self = node.cfg.self;
    for (uint32_t g = 0; g < node.cfg.num_servers; g++) {
        rgroup *G = node.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&G->order); /* order before q, as updates take them */
        pthread_mutex_lock(&G->q);
        rop *moved = NULL; /* calls answered: no longer the primary */
        bool was = G->serving;
        int32_t was_primary = G->primary;
        G->serving = v->primary[g] == (int32_t)self;
        bool lost = was && !G->serving;
        G->primary = v->primary[g];
        G->epoch = v->epoch;
        if (G->serving && !was && !atomic_load(&node.stopping))
            group_ck_start(G); /* a group of another server: checkpointed while served here */
        if (G->serving && !was && old.epoch != 0) {
            atomic_fetch_add(&node.failovers, 1);
            /* Taking over: the log it kept as a backup is still to reach the others. */
            G->last_lsn = G->next_lsn - 1;
            for (uint32_t i = 0; i < G->npeers; i++)
                G->peers[i].acked = G->committed; /* every member had applied that much */
            /* Its workers' silence counts from now. */
            sync_heard_all(G->st);
            log_warn("view epoch %llu: serving group %u as its primary from lsn %llu",
                     (unsigned long long)v->epoch, g, (unsigned long long)G->last_lsn);
        } else if (!G->serving && was) {
            log_warn("view epoch %llu: group %u is now served by server %d",
                     (unsigned long long)v->epoch, g, v->primary[g]);
            /* Calls still waiting for backups are not acknowledged here: the client sends
             * them again (same seq) to the new primary, whose window drops what it has. When
             * the new primary is not known yet (this server lost its lease before it read the
             * view without it), UNAVAILABLE: the client retries here, and is sent on once this
             * server knows the view (FAILED_PRECONDITION without a primary would end the
             * client's call with an error). */
            for (rop *o = G->head; o; o = o->next) {
                if (o->call == NULL)
                    continue;
                rop *a = calloc(1, sizeof(*a));
                if (a == NULL)
                    continue;
                if (v->primary[g] >= 0) {
                    rpc_call_set_primary(o->call, (uint32_t)v->primary[g]);
                    rpc_reply_error(o->call, STATUS_FAILED_PRECONDITION,
                                    "server %u no longer serves group %u (view epoch %llu): its "
                                    "primary is server %d; the update was not acknowledged",
                                    self, g, (unsigned long long)v->epoch, v->primary[g]);
                } else {
                    rpc_reply_error(o->call, STATUS_UNAVAILABLE,
                                    "server %u no longer serves group %u and does not know its "
                                    "new primary yet (it lost its lease); the update was not "
                                    "acknowledged: retry",
                                    self, g);
                }
                a->call = o->call;
                o->call = NULL;
                a->next = moved;
                moved = a;
            }
            free_log_locked(G);
            /* Replies held for updates not applied everywhere: not sent; retried elsewhere. */
            while (G->riders) {
                rop *r = G->riders;
                G->riders = r->next;
                if (v->primary[g] >= 0)
                    rpc_call_set_primary(r->call, (uint32_t)v->primary[g]);
                rpc_reply_error(r->call, STATUS_UNAVAILABLE,
                                "server %u no longer serves group %u (view epoch %llu): the "
                                "update this reply depends on was not acknowledged: retry",
                                self, g, (unsigned long long)v->epoch);
                r->next = moved;
                moved = r;
            }
        }
        bool degraded = false;
        for (uint32_t i = 0; i < G->npeers; i++) {
            rpeer *p = &G->peers[i];
            bool in = v->live[p->server] && view_in_sync(v, g, p->server) &&
                      v->primary[g] != (int32_t)p->server;
            if (in && p->catching_up) {
                p->catching_up = false; /* caught up, added back: waited for from now on */
                log_info("view epoch %llu: server %u is a backup of group %u again",
                         (unsigned long long)v->epoch, p->server, g);
            }
            /* Left the view: no longer waited for until it has caught up again (a new
             * incarnation that already asked for a copy is still streamed to). */
            if (p->in_view && !in)
                p->told = p->confirmed = false;
            p->in_view = in;
            if (!in)
                degraded = true;
        }
        bool in_sync = v->live[self] && view_in_sync(v, g, self);
        if (in_sync && old.epoch != 0)
            G->fresh = false; /* live: the next time out of the view needs a new copy */
        if (in_sync && node.agent)
            view_agent_set_lacks(node.agent, g, false); /* kept in sync from now on */
        if (v->live[self] && !G->serving && atomic_load(&G->has_files))
            group_copies_drop(G); /* a live backup's copy moves on past its checkpoints */
        /* Out of the view or out of sync, or the first view: copy from the primary. A copy
         * taken from a primary that is no longer one may hold operations the new primary
         * never logged: copied again from the new one. */
        if (was_primary != v->primary[g])
            G->verified = false; /* a new primary's stream confirms this copy's log first */
        if (!in_sync && !G->serving && was_primary != v->primary[g] && old.epoch != 0)
            G->fresh = false;
        if ((!in_sync || old.epoch == 0) && !G->serving && v->primary[g] >= 0)
            rejoin_locked(G);
        if (G->serving) {
            if (degraded)
                log_warn("view epoch %llu: group %u runs degraded (a backup is out of the "
                         "view): updates are acknowledged by fewer replicas",
                         (unsigned long long)v->epoch, g);
            start_peers_locked(G);
        }
        rop *done = progress_locked(G);
        pthread_cond_broadcast(&G->qcond);
        pthread_mutex_unlock(&G->q);
        pthread_mutex_unlock(&G->order);
        answer(done);
        answer(moved);
        if (lost) {
            group_ck_stop(G); /* its checkpoints go on at its new primary */
            group_copies_drop(G);
        }
        if (lost) {
            /* Its pulls waiting for a staleness bound (no longer swept here) go to the new
             * primary: the client retries, and is told which server that is. */
            char why[160];
            snprintf(why, sizeof(why),
                     "server %u no longer serves group %u (view epoch %llu): retry", self, g,
                     (unsigned long long)v->epoch);
            sync_cancel_all(G->st, why);
        }
    }
    pthread_mutex_unlock(&node.vlock);
}

/* Installs v with this server out of it: its incarnation is not the one v names live. */
static void set_view_without_self(const view *v, bool force)
{
    view w = *v;
    uint32_t self = node.cfg.self;
    w.live[self] = 0;
    for (uint32_t g = 0; g < w.num_servers; g++)
        if (w.primary[g] == (int32_t)self)
            w.primary[g] = -1;
    if (force) {
        pthread_mutex_lock(&node.vlock);
        if (w.epoch == node.cur.epoch && w.epoch > 0)
            node.cur.epoch--; /* the same epoch again, this time without this server */
        pthread_mutex_unlock(&node.vlock);
    }
    replica_set_view(&w);
}

void replica_attach_agent(view_agent *a)
{
    node.agent = a;
}

void replica_on_view_event(void *arg, view_event ev, const view *v)
{
    (void)arg;
    if (!node.on)
        return;
    switch (ev) {
    case VIEW_EVENT_VIEW:
        if (v->live[node.cfg.self] && node.agent && !view_agent_in_view(node.agent))
            set_view_without_self(v, false); /* the view names a previous incarnation */
        else
            replica_set_view(v);
        break;
    case VIEW_EVENT_LEASE_LOST: {
        /* Before the first view nothing was served or acknowledged: nothing to rejoin. */
        pthread_mutex_lock(&node.vlock);
        bool first = node.cur.epoch == 0;
        pthread_mutex_unlock(&node.vlock);
        if (first) {
            log_warn("lease lost before the first view: nothing was served; registering again");
            break;
        }
        log_warn("lease lost: serving no group until this server has rejoined");
        for (uint32_t g = 0; g < node.cfg.num_servers; g++) {
            if (node.groups[g] == NULL)
                continue;
            pthread_mutex_lock(&node.groups[g]->q);
            node.groups[g]->fresh = false;
            pthread_mutex_unlock(&node.groups[g]->q);
        }
        set_view_without_self(v, true);
        break;
    }
    case VIEW_EVENT_LEASE_UNCERTAIN:
        log_warn("lease not renewed in time: groups without a live backup acknowledge nothing "
                 "until it is");
        atomic_store(&node.uncertain, true);
        break;
    case VIEW_EVENT_LEASE_OK:
        atomic_store(&node.uncertain, false);
        for (uint32_t g = 0; g < node.cfg.num_servers; g++) {
            rgroup *G = node.groups[g];
            if (G == NULL)
                continue;
            pthread_mutex_lock(&G->q);
            rop *done = progress_locked(G);
            pthread_mutex_unlock(&G->q);
            answer(done);
        }
        break;
    default:
        break;
    }
}

uint32_t replica_degraded_groups(void)
{
    uint32_t n = 0;
    if (!node.on)
        return 0;
    for (uint32_t g = 0; g < node.cfg.num_servers; g++) {
        rgroup *G = node.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&G->q);
        bool d = false;
        for (uint32_t i = 0; i < G->npeers; i++)
            if (!G->peers[i].in_view)
                d = true;
        if (G->serving && d)
            n++;
        pthread_mutex_unlock(&G->q);
    }
    return n;
}

void replica_stop(void)
{
    if (!node.on)
        return;
    atomic_store(&node.stopping, true);
    metrics_remove_collector(collect, NULL);
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        rgroup *G = node.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&node.vlock);
        if (G->ck)
            checkpointer_stop(G->ck); /* answers its queued Checkpoint calls; final one below */
        pthread_mutex_unlock(&node.vlock);
        pthread_mutex_lock(&G->q);
        pthread_cond_broadcast(&G->qcond);
        pthread_mutex_unlock(&G->q);
        for (uint32_t i = 0; i < G->npeers; i++) {
            rpeer *p = &G->peers[i];
            if (p->started)
                pthread_join(p->thread, NULL); /* a batch in flight ends by its deadline */
            p->started = false;
            rpc_conn_close(p->conn);
            p->conn = NULL;
        }
        if (G->copy_started)
            pthread_join(G->copy_thread, NULL);
        G->copy_started = false;
        /* The waits of groups it took over (its own group's were ended already): their
         * replies, held until their updates are applied everywhere, are answered below. */
        sync_cancel_all(G->st, "server is shutting down");
        pthread_mutex_lock(&G->order); /* no update being applied holds an entry of the log */
        pthread_mutex_lock(&G->q);
        rop *o = G->head;
        G->head = G->tail = NULL;
        if (G->riders) {
            rop *r = G->riders;
            while (r->next)
                r = r->next;
            r->next = o;
            o = G->riders;
            G->riders = NULL;
        }
        pthread_mutex_unlock(&G->q);
        pthread_mutex_unlock(&G->order);
        while (o) {
            rop *n = o->next;
            if (o->call) {
                rpc_reply_error(o->call, STATUS_UNAVAILABLE,
                                "server is shutting down before every replica applied the "
                                "update: retry it");
                rpc_call_resume(o->call);
            }
            rop_free(o);
            o = n;
        }
    }
}

static void state_free(server_state *st)
{
    server_tables_free(st);
    store_destroy(st->vars);
    dedup_destroy(st->dedup);
    sync_destroy(st->sync);
    free(st);
}

void replica_free(void)
{
    if (!node.on)
        return;
    for (size_t i = 0; i < node.nretired; i++)
        state_free(node.retired[i]);
    node.nretired = 0;
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        rgroup *G = node.groups[g];
        if (G && G->ck) {
            /* Everything it applied, as the own group's final checkpoint does. */
            checkpoint_info fi;
            char err[1536];
            if (checkpoint_write(G->ck, &fi, err, sizeof(err)) != 0)
                log_error("group %u: final checkpoint failed: %s", g, err);
            checkpointer_destroy(G->ck);
            G->ck = NULL;
        }
    }
    rgroup *own = node.groups[node.cfg.self];
    if (node.cfg.own_ck && own) {
        uint64_t e, l;
        node.final_valid = group_position(own, true, &e, &l);
        group_position(own, false, NULL, NULL);
        node.final_epoch = e;
        node.final_lsn = l;
        checkpointer_set_position(node.cfg.own_ck, final_position, NULL);
    }
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        group_free(node.groups[g]);
        node.groups[g] = NULL;
    }
    free(node.methods);
    node.methods = NULL;
    node.on = false;
}
