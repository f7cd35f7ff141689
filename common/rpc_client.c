/* The RPC client (rpc_client.h): connections of REQ sockets to one server, calls with
 * deadlines, retries and backoff, and the watch that logs calls waiting long for a reply. The
 * sockets' credentials (TLS, admin token) are made in rpc_tls.c. */
#include "rpc_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/protocol/reqrep0/req.h>

#include "hash.h"
#include "log.h"
#include "status.h"
#include "timeutil.h"
#include "tls.h"

/* A call without a reply this long is logged, and again at the interval while it waits. */
#define WATCH_FIRST_NS 2000000000ull
#define WATCH_REPEAT_MS 5000
#define WATCH_TICK_MS 250
/* TLS: a connection the server closes within this of its handshake counts as a refusal of
 * our certificate; after each one in a row the dialer waits up to twice as long before the
 * next try (nng picks a random wait below RECONNMINT), from TLS_REDIAL_MIN_MS up to
 * TLS_REDIAL_MAX_MS. */
#define TLS_REFUSED_NS 500000000ull
#define TLS_REDIAL_MIN_MS 100
#define TLS_REDIAL_MAX_MS 3200
/* How long rpc_conn_close waits for nng_close (see there). */
#define CLOSE_WAIT_MS 2000
/* A server answers UNAVAILABLE "slot moving" while the request's slots are frozen for a move
 * (server/slot_gate.c): a freeze lasts milliseconds, so such a reply is retried after this
 * fixed step (not the call's backoff), until the call's deadline, without counting against
 * its retries. */
#define SLOT_MOVING_RETRY_MS 3
#define SLOT_MOVING_PREFIX "slot moving"
/* A call on a socket whose connection is not up waits this long at a time, then moves to a
 * socket whose connection is (req_attempt). */
#define REHOME_MS 250
/* While no socket of the connection has one up, a call waits this long at a time for one
 * before it sends (req_attempt). */
#define NO_CONN_POLL_MS 20
/* A connection opened for its first call (rpc_conn_config.fast_connect) waits in 1 ms steps
 * for this long from the call's start, then in NO_CONN_POLL_MS ones: the dial takes well
 * under a millisecond on a LAN, and such calls (a slot move's SEND, install, COMMIT) would
 * otherwise all pay 20 ms for it. */
#define FAST_CONN_POLL_NS 100000000ull

enum req_state { REQ_IDLE, REQ_SEND, REQ_RECV, REQ_BACKOFF };

typedef struct rpc_req {
    rpc_conn *conn;
    int sock_index;
    nng_ctx ctx;
    nng_aio *aio;      /* sends and receives */
    nng_aio *wait_aio; /* backoffs and waits for a connection (req_wait) */
    enum req_state state;
    uint64_t deadline_ns;
    int attempt;
    bool unanswered;        /* its last attempt got no reply within resend_ms on a connection up */
    uint64_t busy_since_ns; /* start of the call in progress, 0 when idle (conn lock) */
    int sends;              /* attempts of the call handed to nng so far */
    uint64_t rng;
    char last_err[200]; /* why the last attempt failed, for the final message */
    rpc_call_opts opts;
    rpc_build_fn build;
    rpc_done_fn done;
    void *arg;
    struct rpc_req *next_free;
} rpc_req;

struct rpc_conn {
    char url[256];
    char label[64]; /* "ps 0", or empty */
    size_t max_message;
    int nsocks;
    nng_socket *socks;
    atomic_uint next_sock;
    uint32_t resend_ms; /* of its REQ sockets: also when a call tries another connection */
    bool fast_connect;  /* rpc_conn_config.fast_connect */
    pthread_mutex_t lock;
    pthread_cond_t idle;
    /* Context operations are started under io_lock (shared) and only while !io_closed;
     * rpc_conn_close sets io_closed (exclusive) before nng_close. nng 1.5.2 panics
     * ("pthread_mutex_lock: Invalid argument") when a context operation starts on a socket
     * that nng_close is tearing down. */
    pthread_rwlock_t io_lock;
    bool io_closed;
    rpc_req *free_list;
    rpc_req **all; /* every request object ever made, to free at close */
    size_t nall, capall;
    int inflight;
    bool closing;
    bool watching;
    pthread_t watcher;
    pthread_cond_t watch_cond;
    log_every waiting_log; /* the "waiting for" lines of the current episode */
    bool (*hint)(void *hint_arg, uint64_t since_ns, char *buf, size_t cap); /* config's */
    void *hint_arg;
    bool tls;
    atomic_uint pipes_added, pipes_removed; /* TLS connections made and lost (hint below) */
    struct dial_state *dials;               /* one per socket, the argument of conn_pipe_cb */
    /* Envelope.server_instance of the first reply and of the latest (conn_note_instance). */
    _Atomic uint64_t first_instance, last_instance;
    bool log_restarts; /* cfg->watch: this connection says when the server restarted */
};

/* One socket's dialer, its connections and (TLS) its refusals in a row (conn_pipe_cb). */
typedef struct dial_state {
    rpc_conn *conn;
    nng_dialer dialer;
    atomic_int pipes;          /* connections up: counted from ADD_PRE to REM_POST */
    _Atomic uint64_t added_ns; /* TLS: when its connection was made */
    atomic_uint refusals;
} dial_state;

/* "ps 0 (tcp://host:port)" or the URL alone. */
static void conn_name(const rpc_conn *c, char *buf, size_t cap)
{
    if (c->label[0])
        snprintf(buf, cap, "%s (%s)", c->label, c->url);
    else
        snprintf(buf, cap, "%s", c->url);
}

/* Notes the server process (Envelope.server_instance, 0: a server that does not say) of a
 * reply. Returns true when it is another process than the one that answered this
 * connection's first reply: the server restarted meanwhile, and lost what it had not
 * checkpointed, unless it is replicated (the reply names a view epoch: its groups' other
 * copies kept it). The first reply of a new process is logged (log_restarts). */
static bool conn_note_instance(rpc_conn *c, uint64_t instance, bool replicated)
{
    if (instance == 0)
        return false;
    uint64_t first = 0;
    if (atomic_compare_exchange_strong(&c->first_instance, &first, instance)) {
        atomic_store(&c->last_instance, instance);
        return false;
    }
    if (first == instance)
        return false;
    uint64_t prev = atomic_exchange(&c->last_instance, instance);
    if (prev != instance && c->log_restarts) {
        char name[340];
        conn_name(c, name, sizeof(name));
        log_warn("%s restarted: its replies now come from a new server process (instance "
                 "%016llx, before %016llx); %s",
                 name, (unsigned long long)instance, (unsigned long long)prev,
                 replicated ? "its replica groups kept what they acknowledged (it copies them "
                              "back from their primaries)"
                            : "what it applied after its last checkpoint is lost");
    }
    return true;
}

uint32_t rpc_backoff_ms(uint32_t backoff_ms, uint32_t max_ms, int attempt, uint64_t *rng)
{
    if (max_ms == 0)
        max_ms = 1000;
    if (backoff_ms == 0)
        backoff_ms = 1;
    uint64_t b = (uint64_t)backoff_ms << (attempt < 20 ? (attempt > 0 ? attempt : 0) : 20);
    if (b > max_ms)
        b = max_ms;
    uint64_t half = b / 2;
    return (uint32_t)(b + (half > 0 ? splitmix64_next(rng) % (half + 1) : 0));
}

const char *rpc_conn_url(const rpc_conn *c)
{
    return c->url;
}

/* Counts each socket's connections up (pick_socket). Under TLS also counts connections made
 * and lost, and backs the dialer off while the server closes each connection right after
 * the handshake (it refuses our certificate): without that the
 * dialer redials at once after every connection made, tens of times a second, each costing
 * the server a handshake and a log line. */
static void conn_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    dial_state *d = arg;
    rpc_conn *c = d->conn;
    /* nng runs REM_POST for a pipe exactly when it ran ADD_PRE: the count stays exact. */
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        atomic_fetch_add(&d->pipes, 1);
        return;
    }
    if (ev == NNG_PIPE_EV_REM_POST)
        atomic_fetch_sub(&d->pipes, 1);
    if (!c->tls)
        return;
    if (ev == NNG_PIPE_EV_ADD_POST) {
        atomic_fetch_add(&c->pipes_added, 1);
        atomic_store(&d->added_ns, time_now_ns());
        return;
    }
    if (ev != NNG_PIPE_EV_REM_POST)
        return;
    atomic_fetch_add(&c->pipes_removed, 1);
    uint64_t added = atomic_load(&d->added_ns);
    unsigned n = 0;
    if (added != 0 && time_now_ns() - added < TLS_REFUSED_NS)
        n = atomic_fetch_add(&d->refusals, 1) + 1;
    else if (atomic_exchange(&d->refusals, 0) == 0)
        return; /* no refusal before: the wait is as it was */
    int ms = TLS_REDIAL_MIN_MS;
    for (unsigned i = 0; i < n && ms < TLS_REDIAL_MAX_MS; i++)
        ms *= 2;
    if (ms > TLS_REDIAL_MAX_MS)
        ms = TLS_REDIAL_MAX_MS;
    nng_dialer_set_ms(d->dialer, NNG_OPT_RECONNMINT, ms); /* fails once closed: no matter */
}

static uint32_t ms_left(const rpc_req *r)
{
    uint64_t now = time_now_ns();
    if (now >= r->deadline_ns)
        return 0;
    uint64_t ms = (r->deadline_ns - now + 999999u) / 1000000u;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

static void req_release(rpc_req *r)
{
    rpc_conn *c = r->conn;
    pthread_mutex_lock(&c->lock);
    r->state = REQ_IDLE;
    r->busy_since_ns = 0;
    r->next_free = c->free_list;
    c->free_list = r;
    c->inflight--;
    if (c->inflight == 0)
        pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
}

static void req_finish(rpc_req *r, int status, const char *msg, const frame *reply)
{
    rpc_done_fn done = r->done;
    void *arg = r->arg;
    /* The request object goes back to the pool before the callback runs, so a callback that
     * starts a follow-up call can reuse it; done/arg were saved above. */
    req_release(r);
    done(arg, status, msg, reply);
}

static void req_fail_nng(rpc_req *r, int rv)
{
    char msg[1000], name[340];
    conn_name(r->conn, name, sizeof(name));
    int st = status_from_nng(rv);
    char hint[300] = "";
    if (rv == NNG_ETIMEDOUT && r->conn->tls) {
        unsigned added = atomic_load(&r->conn->pipes_added);
        unsigned lost = atomic_load(&r->conn->pipes_removed);
        if (added == 0)
            snprintf(hint, sizeof(hint),
                     "; TLS: no connection completed its handshake: server down, or is its "
                     "certificate not signed by our tls-ca or not issued to its name?");
        else if (lost > 0)
            snprintf(hint, sizeof(hint),
                     "; TLS: the server closed %u of %u connection(s) right after the "
                     "handshake: it refused this client's certificate (none, another CA's or "
                     "expired? see the server's log)",
                     lost, added);
    }
    if (rv == NNG_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "no reply from %s within the deadline of %u ms (%s%s)", name,
                 r->opts.deadline_ms,
                 r->last_err[0] ? r->last_err
                 : hint[0]      ? "no connection"
                                : "server down, stopped or overloaded?",
                 hint);
    else
        snprintf(msg, sizeof(msg), "transport error talking to %s: %s", name, nng_strerror(rv));
    req_finish(r, st, msg, NULL);
}

/* Connection-level failures a restarting server causes: worth another attempt. A closed
 * context is ours only while this connection closes. */
static bool retryable_nng(const rpc_conn *c, int rv)
{
    switch (rv) {
    case NNG_ESTATE:
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
    case NNG_ECONNABORTED:
    case NNG_EUNREACHABLE:
    case NNG_EAGAIN:
        return true;
    case NNG_ECLOSED: {
        rpc_conn *m = (rpc_conn *)c;
        pthread_mutex_lock(&m->lock);
        bool closing = m->closing;
        pthread_mutex_unlock(&m->lock);
        return !closing;
    }
    default:
        return false;
    }
}

static void req_attempt(rpc_req *r);
static bool req_io_begin(rpc_req *r);
static void req_io_end(rpc_req *r);

/* Waits ms, then makes the next attempt (req_wait_cb), unless the connection is closing.
 * On its own aio: nng 1.5.2 leaves an aio that has slept marked so that any later operation
 * of it that times out completes with success instead of NNG_ETIMEDOUT (aio.c's a_expire_ok
 * is set by nng_sleep_aio and never cleared): on the send aio, a send whose wait (attempt_ms)
 * ran out would then look sent, its message lost, and a receive that timed out would look
 * answered with no reply. */
static void req_wait(rpc_req *r, uint32_t ms)
{
    if (!req_io_begin(r)) {
        req_fail_nng(r, NNG_ECLOSED);
        return;
    }
    r->state = REQ_BACKOFF;
    nng_sleep_aio((nng_duration)ms, r->wait_aio);
    req_io_end(r);
}

static void req_wait_cb(void *arg)
{
    rpc_req *r = arg;
    int rv = nng_aio_result(r->wait_aio);
    if (rv != 0 && rv != NNG_ETIMEDOUT) {
        req_fail_nng(r, rv);
        return;
    }
    req_attempt(r);
}

/* Retries after a backoff (UNAVAILABLE reply or connection failure `why`), or fails: with
 * `status` when retries are off, with DEADLINE_EXCEEDED once no time is left. The caller
 * bounds the retries of UNAVAILABLE replies by opts.retries; lost connections are retried
 * until the deadline. */
static void req_retry(rpc_req *r, int status, const char *why)
{
    snprintf(r->last_err, sizeof(r->last_err), "last error: %s", why);
    if (r->opts.retries <= 0) {
        char msg[700], name[340];
        conn_name(r->conn, name, sizeof(name));
        snprintf(msg, sizeof(msg), "%s: %s", name, why);
        req_finish(r, status, msg, NULL);
        return;
    }
    uint32_t left = ms_left(r);
    if (left == 0) {
        req_fail_nng(r, NNG_ETIMEDOUT);
        return;
    }
    uint32_t b = rpc_backoff_ms(r->opts.backoff_ms, r->opts.max_backoff_ms, r->attempt, &r->rng);
    if (b > left)
        b = left; /* the next attempt then reports the deadline */
    r->attempt++;
    req_wait(r, b);
}

/* Brackets the start of a context operation (see rpc_conn.io_lock). False: the connection
 * is closing and nothing may be started. */
static bool req_io_begin(rpc_req *r)
{
    pthread_rwlock_rdlock(&r->conn->io_lock);
    if (r->conn->io_closed) {
        pthread_rwlock_unlock(&r->conn->io_lock);
        return false;
    }
    return true;
}

static void req_io_end(rpc_req *r)
{
    pthread_rwlock_unlock(&r->conn->io_lock);
}

static bool sock_up(const rpc_conn *c, int i)
{
    return atomic_load_explicit(&c->dials[i].pipes, memory_order_relaxed) > 0;
}

/* Moves r to a socket whose connection is up when its own has none (still dialing, mid-
 * handshake or redialing) and another has: a new context there. Called with io_lock held
 * (shared) and r idle between attempts. */
static void req_rehome(rpc_req *r)
{
    rpc_conn *c = r->conn;
    bool leave = r->unanswered; /* no reply on it within resend_ms: try another if one is up */
    r->unanswered = false;
    if (sock_up(c, r->sock_index) && !leave)
        return;
    for (int k = 1; k < c->nsocks; k++) {
        int i = (r->sock_index + k) % c->nsocks;
        nng_ctx ctx;
        if (sock_up(c, i) && nng_ctx_open(&ctx, c->socks[i]) == 0) {
            nng_ctx_close(r->ctx);
            r->ctx = ctx;
            r->sock_index = i;
            return;
        }
    }
}

/* The wait of one attempt: REHOME_MS while r's socket has no connection up, resend_ms when
 * it has one and another socket has one too, else all that is left. When it runs out the
 * attempt is made again (same request, same sequence number: the server's exactly-once
 * table drops a push seen twice), on another socket whose connection is up if any: a request
 * is not left waiting on one connection that stalls (seen under TLS with nng 1.5.2: a fresh
 * connection, up on both ends, delivering nothing, while nng's own resends went the same
 * way). */
static uint32_t attempt_ms(const rpc_req *r, uint32_t left)
{
    const rpc_conn *c = r->conn;
    uint32_t slice = left;
    if (!sock_up(c, r->sock_index)) {
        slice = REHOME_MS;
    } else if (c->resend_ms > 0) {
        for (int k = 1; k < c->nsocks; k++) {
            if (sock_up(c, (r->sock_index + k) % c->nsocks)) {
                slice = c->resend_ms;
                break;
            }
        }
    }
    return slice < left ? slice : left;
}

static void req_attempt(rpc_req *r)
{
    uint32_t left = ms_left(r);
    if (left == 0) {
        req_fail_nng(r, NNG_ETIMEDOUT);
        return;
    }
    if (rpc_conn_sockets_up(r->conn) == 0) {
        /* No connection up (client starting, server down or restarting): wait for one
         * before handing nng the request. Queued in a REQ socket without a connection, a
         * request goes out on whichever connection starts next, and nng 1.5.2's REQ starts
         * a connection that closed meanwhile (a server stopping or starting closes them at
         * once) without checking: the send into it fails without a callback, and the copy
         * of the request made for it is never freed. */
        uint32_t poll = NO_CONN_POLL_MS;
        if (r->conn->fast_connect && time_now_ns() - r->busy_since_ns < FAST_CONN_POLL_NS)
            poll = 1;
        req_wait(r, left < poll ? left : poll);
        return;
    }
    nng_msg *m = NULL;
    int rv = r->build(r->arg, left, &m);
    if (rv != 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "cannot build request: %s", nng_strerror(rv));
        req_finish(r, rv == NNG_ENOMEM ? STATUS_RESOURCE_EXHAUSTED : STATUS_INVALID_ARGUMENT, msg,
                   NULL);
        return;
    }
    r->state = REQ_SEND;
    nng_aio_set_msg(r->aio, m);
    if (!req_io_begin(r)) {
        nng_aio_set_msg(r->aio, NULL);
        nng_msg_free(m);
        req_fail_nng(r, NNG_ECLOSED);
        return;
    }
    req_rehome(r);
    r->sends++;
    nng_aio_set_timeout(r->aio, (nng_duration)attempt_ms(r, left));
    nng_ctx_send(r->ctx, r->aio);
    req_io_end(r);
}

static void req_cb(void *arg)
{
    rpc_req *r = arg;
    int rv = nng_aio_result(r->aio);
    switch (r->state) {
    case REQ_SEND:
        if (rv == NNG_ETIMEDOUT && ms_left(r) > 0) {
            nng_msg_free(nng_aio_get_msg(r->aio)); /* a slice (attempt_ms) ran out: again */
            req_attempt(r);
            return;
        }
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(r->aio));
            if (retryable_nng(r->conn, rv)) {
                req_retry(r, STATUS_UNAVAILABLE, nng_strerror(rv));
                return;
            }
            req_fail_nng(r, rv);
            return;
        }
        r->state = REQ_RECV;
        nng_aio_set_timeout(r->aio, (nng_duration)(ms_left(r) ? attempt_ms(r, ms_left(r)) : 1));
        if (!req_io_begin(r)) {
            req_fail_nng(r, NNG_ECLOSED);
            return;
        }
        nng_ctx_recv(r->ctx, r->aio);
        req_io_end(r);
        return;
    case REQ_RECV: {
        if (rv == NNG_ETIMEDOUT && ms_left(r) > 0) {
            /* A slice (attempt_ms) ran out: the same request again, elsewhere if it can. */
            r->unanswered = sock_up(r->conn, r->sock_index);
            req_attempt(r);
            return;
        }
        if (rv != 0) {
            if (retryable_nng(r->conn, rv)) {
                req_retry(r, STATUS_UNAVAILABLE, nng_strerror(rv));
                return;
            }
            req_fail_nng(r, rv);
            return;
        }
        nng_msg *m = nng_aio_get_msg(r->aio);
        frame f;
        char err[384];
        if (nng_msg_len(m) > r->conn->max_message) {
            snprintf(err, sizeof(err), "reply of %zu bytes from %s exceeds max-message-bytes",
                     nng_msg_len(m), r->conn->url);
            nng_msg_free(m);
            req_finish(r, STATUS_RESOURCE_EXHAUSTED, err, NULL);
            return;
        }
        int st = frame_parse(m, &f, err, sizeof(err));
        if (st != STATUS_OK) {
            char msg[700];
            snprintf(msg, sizeof(msg), "malformed reply from %.250s: %.380s", r->conn->url, err);
            nng_msg_free(m);
            req_finish(r, STATUS_INTERNAL, msg, NULL);
            return;
        }
        bool restarted = conn_note_instance(r->conn, f.env->server_instance, f.env->epoch != 0);
        if (f.env->status == STATUS_UNAVAILABLE && r->opts.retries > 0 && f.env->message &&
            strncmp(f.env->message, SLOT_MOVING_PREFIX, strlen(SLOT_MOVING_PREFIX)) == 0) {
            snprintf(r->last_err, sizeof(r->last_err), "last error: UNAVAILABLE: %.140s",
                     f.env->message);
            frame_fini(&f);
            nng_msg_free(m);
            uint32_t left = ms_left(r);
            if (left == 0) {
                req_fail_nng(r, NNG_ETIMEDOUT);
                return;
            }
            req_wait(r, left < SLOT_MOVING_RETRY_MS ? left : SLOT_MOVING_RETRY_MS);
            return;
        }
        if (f.env->status == STATUS_UNAVAILABLE && r->attempt < r->opts.retries) {
            char why[200];
            snprintf(why, sizeof(why), "UNAVAILABLE: %s",
                     f.env->message ? f.env->message : "server unavailable");
            frame_fini(&f);
            nng_msg_free(m);
            req_retry(r, STATUS_UNAVAILABLE, why);
            return;
        }
        rpc_done_fn done = r->done;
        void *darg = r->arg;
        const char *smsg = f.env->message ? f.env->message : "";
        char longer[1200];
        if (f.env->status == STATUS_DEADLINE_EXCEEDED && r->sends > 1) {
            /* The server timed out the last copy it got: each one sent again (another
             * connection, resend-ms without a reply) started its wait anew there, so its
             * figure is short of the call's. */
            snprintf(longer, sizeof(longer),
                     "%.1000s (that is the last of %d attempts: the call waited %.1f s in all)",
                     smsg, r->sends, (double)(time_now_ns() - r->busy_since_ns) / 1e9);
            smsg = longer;
        }
        char with_restart[1500];
        if (restarted && f.env->status != STATUS_OK) {
            /* e.g. a NOT_FOUND for a variable the process before held: say why. */
            snprintf(with_restart, sizeof(with_restart),
                     "%.1000s (%s restarted since this client's first call to it: this reply is "
                     "from a new server process, instance %016llx, which holds only what it "
                     "restored from its checkpoint, if any)",
                     smsg, r->conn->label[0] ? r->conn->label : r->conn->url,
                     (unsigned long long)f.env->server_instance);
            smsg = with_restart;
        }
        /* Release first: the callback may start follow-up calls on this connection. */
        req_release(r);
        done(darg, f.env->status, smsg, &f);
        frame_fini(&f);
        nng_msg_free(m);
        return;
    }
    case REQ_BACKOFF: /* waits are on wait_aio (req_wait_cb) */
    case REQ_IDLE:
        return;
    }
}

/* Logs calls of this connection that wait long for a reply: one line for all of them, when
 * the oldest has waited WATCH_FIRST_NS and then every WATCH_REPEAT_MS while any still waits. */
static void *watch_main(void *arg)
{
    rpc_conn *c = arg;
    uint64_t last_tick = time_now_ns(), quiet_until = 0;
    pthread_mutex_lock(&c->lock);
    while (!c->closing) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)WATCH_TICK_MS * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&c->watch_cond, &c->lock, &ts);
        if (c->closing)
            break;
        uint64_t now = time_now_ns(), oldest = 0, least_left = UINT64_MAX;
        uint32_t deadline_ms = 0;
        /* A tick far too late: this process itself did not run (stopped by SIGSTOP, the
         * machine suspended). Its calls look old for that, not for the server: give them the
         * first wait again before a line blames anything. */
        if (now - last_tick > 4ull * WATCH_TICK_MS * 1000000u)
            quiet_until = now + WATCH_FIRST_NS;
        last_tick = now;
        if (now < quiet_until)
            continue;
        int waiting = 0;
        for (size_t i = 0; i < c->nall; i++) {
            const rpc_req *r = c->all[i];
            if (r->busy_since_ns == 0 || now - r->busy_since_ns < WATCH_FIRST_NS)
                continue;
            waiting++;
            if (now - r->busy_since_ns > oldest)
                oldest = now - r->busy_since_ns;
            uint64_t left = r->deadline_ns > now ? r->deadline_ns - now : 0;
            if (left < least_left) {
                least_left = left;
                deadline_ms = r->opts.deadline_ms;
            }
        }
        if (waiting == 0) {
            log_every_reset(&c->waiting_log);
            continue;
        }
        if (!log_every_due(&c->waiting_log, WATCH_REPEAT_MS, now))
            continue;
        pthread_mutex_unlock(&c->lock);
        char why[400];
        if (c->hint == NULL || !c->hint(c->hint_arg, now - oldest, why, sizeof(why)))
            snprintf(why, sizeof(why), "server down, stopped, restarting or overloaded?");
        log_warn("waiting for %s at %s: %d call(s) without a reply for %.1f s, %.1f s left of "
                 "the %.1f s deadline (%s)",
                 c->label[0] ? c->label : "server", c->url, waiting, (double)oldest / 1e9,
                 (double)least_left / 1e9, (double)deadline_ms / 1e3, why);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int rpc_conn_open(rpc_conn **out, const rpc_conn_config *cfg, char *err, size_t errlen)
{
    rpc_conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(c->url, sizeof(c->url), "%s", cfg->url);
    snprintf(c->label, sizeof(c->label), "%s", cfg->label ? cfg->label : "");
    c->log_restarts = cfg->watch != 0;
    c->max_message = cfg->max_message;
    c->resend_ms = cfg->resend_ms;
    c->fast_connect = cfg->fast_connect;
    c->hint = cfg->hint;
    c->hint_arg = cfg->hint_arg;
    pthread_mutex_init(&c->lock, NULL);
    pthread_rwlock_init(&c->io_lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    pthread_cond_init(&c->watch_cond, NULL);
    nng_tls_config *tls = NULL;
    c->socks = calloc((size_t)cfg->connections, sizeof(nng_socket));
    if (c->socks == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    c->tls = rpc_tls_on(&cfg->tls);
    if (c->tls && rpc_tls_config(&tls, &cfg->tls, false, err, errlen) != 0)
        goto fail;
    if ((c->dials = calloc((size_t)cfg->connections, sizeof(*c->dials))) == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->connections; i++) {
        nng_socket s;
        int rv = nng_req0_open(&s);
        if (rv != 0) {
            snprintf(err, errlen, "cannot open REQ socket: %s", nng_strerror(rv));
            goto fail;
        }
        c->socks[c->nsocks++] = s;
        nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, (nng_duration)cfg->resend_ms);
        nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, cfg->max_message);
        /* TLS: a server that refuses the certificate closes each connection after its
         * handshake; redial less eagerly than plain TCP (each try costs a handshake). */
        nng_socket_set_ms(s, NNG_OPT_RECONNMINT, tls ? TLS_REDIAL_MIN_MS : 20);
        nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 1000);
        nng_dialer d;
        rv = nng_dialer_create(&d, s, cfg->url);
        if (rv == 0) {
            dial_state *ds = &c->dials[i];
            ds->conn = c;
            ds->dialer = d;
            nng_pipe_notify(s, NNG_PIPE_EV_ADD_PRE, conn_pipe_cb, ds);
            nng_pipe_notify(s, NNG_PIPE_EV_ADD_POST, conn_pipe_cb, ds);
            nng_pipe_notify(s, NNG_PIPE_EV_REM_POST, conn_pipe_cb, ds);
        }
        if (rv == 0 && tls)
            rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tls);
        if (rv == 0)
            rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
        if (rv != 0) {
            snprintf(err, errlen, "cannot dial %s: %s", cfg->url, nng_strerror(rv));
            goto fail;
        }
    }
    if (tls)
        nng_tls_config_free(tls); /* the dialers hold it */
    tls = NULL;
    if (cfg->watch) {
        int rv = pthread_create(&c->watcher, NULL, watch_main, c);
        if (rv != 0) {
            snprintf(err, errlen, "cannot start the thread watching %s: %s", cfg->url,
                     strerror(rv));
            goto fail;
        }
        c->watching = true;
    }
    *out = c;
    return 0;
fail:
    if (tls)
        nng_tls_config_free(tls);
    rpc_conn_close(c);
    return -1;
}

/* A bounded nng_close (rpc_close_sockets_bounded): shared by the caller and the closing
 * thread, freed by whichever lets go last. */
typedef struct close_job {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int refs;
    int n;
    nng_socket socks[];
} close_job;

static void close_job_release(close_job *j)
{
    pthread_mutex_lock(&j->lock);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->lock);
    if (last) {
        pthread_mutex_destroy(&j->lock);
        pthread_cond_destroy(&j->cond);
        free(j);
    }
}

static void *close_job_main(void *arg)
{
    close_job *j = arg;
    for (int i = 0; i < j->n; i++)
        nng_close(j->socks[i]);
    pthread_mutex_lock(&j->lock);
    j->done = true;
    pthread_cond_broadcast(&j->cond);
    pthread_mutex_unlock(&j->lock);
    close_job_release(j);
    return NULL;
}

bool rpc_close_sockets_bounded(const nng_socket *socks, int n, uint32_t wait_ms)
{
    if (n <= 0)
        return true;
    close_job *j = calloc(1, sizeof(*j) + (size_t)n * sizeof(nng_socket));
    pthread_t t;
    if (j != NULL) {
        pthread_mutex_init(&j->lock, NULL);
        pthread_cond_init(&j->cond, NULL);
        j->refs = 2;
        j->n = n;
        memcpy(j->socks, socks, (size_t)n * sizeof(nng_socket));
    }
    if (j == NULL || pthread_create(&t, NULL, close_job_main, j) != 0) {
        for (int i = 0; i < n; i++)
            nng_close(socks[i]); /* no thread to bound it with: unbounded */
        if (j != NULL) {
            j->refs = 1;
            close_job_release(j);
        }
        return true;
    }
    pthread_detach(t);
    struct timespec until = time_deadline(CLOCK_REALTIME, wait_ms);
    pthread_mutex_lock(&j->lock);
    while (!j->done) {
        if (pthread_cond_timedwait(&j->cond, &j->lock, &until) == ETIMEDOUT)
            break;
    }
    bool done = j->done;
    pthread_mutex_unlock(&j->lock);
    close_job_release(j);
    return done;
}

void rpc_conn_close(rpc_conn *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    pthread_cond_broadcast(&c->watch_cond);
    pthread_mutex_unlock(&c->lock);
    if (c->watching)
        pthread_join(c->watcher, NULL);
    pthread_rwlock_wrlock(&c->io_lock);
    c->io_closed = true;
    pthread_rwlock_unlock(&c->io_lock);
    /* Cancel every request's pending operation and wait for its callback (which fails the
     * call: nothing new starts once io_closed is set) before closing the sockets: with
     * operations pending, nng 1.5.2's nng_close could wait forever. No new request objects
     * appear once closing is set. */
    for (size_t i = 0; i < c->nall; i++) {
        nng_aio_stop(c->all[i]->wait_aio);
        nng_aio_stop(c->all[i]->aio);
        nng_ctx_close(c->all[i]->ctx); /* each context explicitly, before its socket */
    }
    if (!rpc_close_sockets_bounded(c->socks, c->nsocks, CLOSE_WAIT_MS)) {
        char name[340];
        conn_name(c, name, sizeof(name));
        log_warn("closing the connection to %s: nng_close did not return within %d ms (nng 1.5 "
                 "can hang while connections come and go, e.g. when the server refuses our TLS "
                 "certificate or calls were in flight); leaving it open",
                 name, CLOSE_WAIT_MS);
        return; /* c stays allocated: nng may still call back into it */
    }
    pthread_mutex_lock(&c->lock);
    while (c->inflight > 0)
        pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < c->nall; i++) {
        nng_aio_stop(c->all[i]->wait_aio);
        nng_aio_stop(c->all[i]->aio);
        nng_aio_free(c->all[i]->wait_aio);
        nng_aio_free(c->all[i]->aio);
        free(c->all[i]);
    }
    free(c->all);
    free(c->socks);
    free(c->dials);
    pthread_mutex_destroy(&c->lock);
    pthread_rwlock_destroy(&c->io_lock);
    pthread_cond_destroy(&c->idle);
    pthread_cond_destroy(&c->watch_cond);
    free(c);
}

/* Takes an idle request object, preferring one bound to socket `want`. Called with the lock
 * held. A new one is made when none is free. */
static rpc_req *req_get_locked(rpc_conn *c, int want)
{
    rpc_req **pp = &c->free_list;
    for (rpc_req *r = c->free_list; r; pp = &r->next_free, r = r->next_free) {
        if (r->sock_index == want) {
            *pp = r->next_free;
            return r;
        }
    }
    if (c->nall == c->capall) {
        size_t cap = c->capall ? c->capall * 2 : 16;
        rpc_req **all = realloc(c->all, cap * sizeof(*all));
        if (all == NULL)
            return NULL;
        c->all = all;
        c->capall = cap;
    }
    rpc_req *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->conn = c;
    r->sock_index = want;
    r->rng = time_now_ns() ^ (uint64_t)(uintptr_t)r;
    if (nng_aio_alloc(&r->aio, req_cb, r) != 0) {
        free(r);
        return NULL;
    }
    if (nng_aio_alloc(&r->wait_aio, req_wait_cb, r) != 0) {
        nng_aio_free(r->aio);
        free(r);
        return NULL;
    }
    if (nng_ctx_open(&r->ctx, c->socks[want]) != 0) {
        nng_aio_free(r->wait_aio);
        nng_aio_free(r->aio);
        free(r);
        return NULL;
    }
    c->all[c->nall++] = r;
    return r;
}

/* The socket for the next call: the next in turn that has a connection up, so that a call
 * does not wait on a connection still being made (or remade) while another is ready; the
 * next in turn when none is up. */
static int pick_socket(rpc_conn *c)
{
    int start = (int)(atomic_fetch_add(&c->next_sock, 1) % (unsigned)c->nsocks);
    for (int k = 0; k < c->nsocks; k++) {
        int i = (start + k) % c->nsocks;
        if (sock_up(c, i))
            return i;
    }
    return start;
}

int rpc_conn_sockets_up(const rpc_conn *c)
{
    int n = 0;
    for (int k = 0; k < c->nsocks; k++)
        n += sock_up(c, k);
    return n;
}

int rpc_conn_call(rpc_conn *c, const rpc_call_opts *o, rpc_build_fn build, rpc_done_fn done,
                  void *arg)
{
    int want = pick_socket(c);
    pthread_mutex_lock(&c->lock);
    if (c->closing) {
        pthread_mutex_unlock(&c->lock);
        return STATUS_CANCELLED;
    }
    rpc_req *r = req_get_locked(c, want);
    if (r == NULL) {
        pthread_mutex_unlock(&c->lock);
        return STATUS_RESOURCE_EXHAUSTED;
    }
    c->inflight++;
    r->opts = *o;
    r->attempt = 0;
    r->sends = 0;
    r->unanswered = false;
    r->last_err[0] = '\0';
    r->build = build;
    r->done = done;
    r->arg = arg;
    r->busy_since_ns = time_now_ns();
    r->deadline_ns = r->busy_since_ns + (uint64_t)o->deadline_ms * 1000000u;
    pthread_mutex_unlock(&c->lock);
    req_attempt(r);
    return 0;
}

void rpc_waiter_init(rpc_waiter *w, rpc_build_fn build, rpc_done_fn done, void *arg)
{
    pthread_mutex_init(&w->m, NULL);
    pthread_cond_init(&w->c, NULL);
    w->done = false;
    w->status = STATUS_OK;
    w->build = build;
    w->fn = done;
    w->arg = arg;
}

int rpc_waiter_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    rpc_waiter *w = arg;
    return w->build(w->arg, deadline_ms, out);
}

void rpc_waiter_done(void *arg, int status, const char *message, const frame *reply)
{
    rpc_waiter *w = arg;
    if (w->fn)
        w->fn(w->arg, status, message, reply);
    pthread_mutex_lock(&w->m);
    w->status = status;
    w->done = true;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

int rpc_waiter_abandon(rpc_waiter *w, int start_status)
{
    pthread_mutex_destroy(&w->m);
    pthread_cond_destroy(&w->c);
    return start_status;
}

int rpc_waiter_wait(rpc_waiter *w)
{
    pthread_mutex_lock(&w->m);
    while (!w->done)
        pthread_cond_wait(&w->c, &w->m);
    pthread_mutex_unlock(&w->m);
    return rpc_waiter_abandon(w, w->status);
}

int rpc_conn_call_wait(rpc_conn *c, const rpc_call_opts *o, rpc_build_fn build, rpc_done_fn done,
                       void *arg)
{
    rpc_waiter w;
    rpc_waiter_init(&w, build, done, arg);
    int rc = rpc_conn_call(c, o, rpc_waiter_build, rpc_waiter_done, &w);
    return rc != 0 ? rpc_waiter_abandon(&w, rc) : rpc_waiter_wait(&w);
}
