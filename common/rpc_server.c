#include "rpc_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/rep.h>

#include "log.h"
#include "metrics.h"
#include "status.h"
#include "timeutil.h"
#include "util.h"

enum call_state { CALL_RECV, CALL_WORK, CALL_SEND };

#define CONN_BUCKETS 256
#define REFUSAL_SLOTS 32
#define REFUSAL_LOG_INTERVAL_NS 1000000000u
#define SERVER_CLOSE_WAIT_MS 5000 /* bound of nng_close in rpc_server_stop */

typedef struct conn_entry {
    uint32_t pipe;
    int inflight;
    struct conn_entry *next;
} conn_entry;

struct rpc_call {
    rpc_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    enum call_state state;
    nng_msg *req; /* the request message (NULL: borrowed bytes, rpc_server_handle_borrowed) */
    const uint8_t *data; /* the request's bytes: req's body or the borrowed ones */
    size_t len;
    rpc_held *held; /* req shared with references taken by rpc_call_hold_request */
    frame f;
    ProtobufCMessage *body;
    const rpc_method *method;
    uint64_t recv_ns;
    uint64_t deadline_ns;
    nng_msg *reply;
    int status; /* of the reply set, for the metrics */
    bool validated;
    bool parked;    /* deferred: left the receive loop, replied to later */
    bool counted;   /* counted in its connection's requests in progress */
    uint32_t pipe;  /* id of the connection it came on */
    rpc_call *next; /* work queue link or idle list */
    /* Envelope.primary of the reply (rpc_call_set_primary); -1: none */
    int64_t primary;
    rpc_resume_gate gate; /* rpc_call_set_gate */
    void *gate_arg;
    uint64_t gate_tag;
};

struct rpc_server {
    rpc_server_config cfg;
    nng_socket sock;
    rpc_call **calls; /* every call object made, to free at stop */
    int ncalls, capcalls;
    int nreceiving; /* calls in the receive loop (not parked), guarded by qlock */
    rpc_call *idle; /* calls out of the loop, reusable for the next deferral */
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    rpc_call *qhead, *qtail;
    atomic_bool stopping;
    atomic_uint_fast64_t epoch; /* Envelope.epoch of every reply (rpc_server_set_epoch) */
    atomic_bool draining;
    atomic_int busy; /* requests received and not yet replied to */
    rpc_stats stats;
    uint64_t instance; /* Envelope.server_instance of every reply */
    /* Fault injection (tests only): a counter hashed into random numbers, and what it did. */
    atomic_uint_fast64_t fault_rng;
    atomic_uint_fast64_t dropped, duplicated;
    atomic_uint_fast64_t tls_refused; /* connections closed for want of a verified certificate */
    /* The last "refused TLS connection" line per peer address, under connlock. */
    struct refusal_log {
        char addr[INET6_ADDRSTRLEN + 16];
        uint64_t logged_ns;  /* 0: slot unused */
        uint64_t suppressed; /* refusals from addr not logged since then */
    } refusals[REFUSAL_SLOTS];
    /* Connections and their requests in progress (max_connections, max_per_connection). */
    pthread_mutex_t connlock;
    struct conn_entry *conns[CONN_BUCKETS];
    int nconns;
    struct method_metrics *mm; /* per method, and one more for requests of no known method */
    nng_listener listener;     /* on cfg.url */
};

/* Metrics of one method, looked up once (metrics.h): requests by status, latency, bytes. */
struct method_metrics {
    const char *name;
    metric *latency, *bytes_in, *bytes_out;
    _Atomic(metric *) by_status[STATUS_COUNT];
};

static metric_family *fam_requests;

static void metrics_init(rpc_server *s)
{
    fam_requests = metrics_family(METRIC_COUNTER, "psd_rpc_requests_total",
                                  "RPC requests answered, by method and reply status.",
                                  "method,status", NULL, 0);
    metric_family *lat =
        metrics_family(METRIC_HISTOGRAM, "psd_rpc_request_duration_seconds",
                       "Time from receiving an RPC request to sending its reply, by method.",
                       "method", metrics_latency_buckets, metrics_latency_buckets_len);
    metric_family *in =
        metrics_family(METRIC_COUNTER, "psd_rpc_received_bytes_total",
                       "Bytes of RPC requests received, by method.", "method", NULL, 0);
    metric_family *out = metrics_family(METRIC_COUNTER, "psd_rpc_sent_bytes_total",
                                        "Bytes of RPC replies sent, by method.", "method", NULL, 0);
    s->mm = calloc(s->cfg.n_methods + 1, sizeof(*s->mm));
    if (s->mm == NULL)
        return;
    for (size_t i = 0; i <= s->cfg.n_methods; i++) {
        struct method_metrics *m = &s->mm[i];
        m->name = i < s->cfg.n_methods ? s->cfg.methods[i].name : "invalid";
        m->latency = metrics_series1(lat, m->name);
        m->bytes_in = metrics_series1(in, m->name);
        m->bytes_out = metrics_series1(out, m->name);
    }
}

/* The one metrics hook: a reply (or, when none could be built, the request) is done. */
static void metrics_record(rpc_call *c, size_t reply_len)
{
    rpc_server *s = c->srv;
    if (s->mm == NULL)
        return;
    size_t i = c->method ? (size_t)(c->method - s->cfg.methods) : s->cfg.n_methods;
    struct method_metrics *m = &s->mm[i];
    int st = c->status >= 0 && c->status < STATUS_COUNT ? c->status : STATUS_UNKNOWN;
    metric *req = atomic_load_explicit(&m->by_status[st], memory_order_acquire);
    if (req == NULL) { /* first reply of this method with this status: make its series */
        req = metrics_series2(fam_requests, m->name, status_name(st));
        atomic_store_explicit(&m->by_status[st], req, memory_order_release);
    }
    metric_inc(req);
    metric_observe(m->latency, (double)(time_now_ns() - c->recv_ns) * 1e-9);
    metric_add(m->bytes_in, c->len);
    metric_add(m->bytes_out, reply_len);
}

/* True with probability percent/100 (splitmix64 over a shared counter: thread-safe). */
static bool fault_chance(rpc_server *s, int percent)
{
    if (percent <= 0)
        return false;
    uint64_t z = atomic_fetch_add(&s->fault_rng, 0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z % 100 < (uint64_t)percent;
}

static const rpc_method *find_method(const rpc_server *s, int method)
{
    for (size_t i = 0; i < s->cfg.n_methods; i++)
        if (s->cfg.methods[i].method == method)
            return &s->cfg.methods[i];
    return NULL;
}

/* Turns the reply being built into a bare error reply: status and message, no body, tensor or
 * segment (the caller gets no segment area to fill). */
static void reply_error_only(envelope *env, int status, char *message, size_t *seg_len,
                             uint8_t ***segment_out)
{
    env->status = status;
    env->message = message;
    env->tensor = NULL;
    env->body.len = 0;
    env->body.data = NULL;
    *seg_len = 0;
    if (*segment_out)
        **segment_out = NULL;
    *segment_out = NULL;
}

static void set_reply(rpc_call *c, int status, const char *message, const ProtobufCMessage *body,
                      const Psd__V1__TensorMeta *tensor, uint8_t **segment_out)
{
    envelope env = PSD__V1__ENVELOPE__INIT;
    uint8_t stackbuf[512];
    uint8_t *bodybuf = NULL;
    if (c->f.env) {
        env.method = c->f.env->method;
        env.request_id = c->f.env->request_id;
    }
    env.is_reply = true;
    env.server_instance = c->srv->instance;
    env.epoch = atomic_load(&c->srv->epoch);
    if (c->primary >= 0)
        env.primary = (uint32_t)c->primary + 1;
    env.status = status;
    /* Messages may quote what a client sent: make sure the string field is valid UTF-8 so that
     * every conforming protobuf decoder accepts the reply. */
    char clean[1100];
    message = message ? message : "";
    if (!utf8_text_ok(message, strlen(message), NULL))
        message = utf8_sanitize(clean, sizeof(clean), message);
    env.message = (char *)message;
    c->status = status;
    if (body) {
        size_t n = protobuf_c_message_get_packed_size(body);
        bodybuf = n <= sizeof(stackbuf) ? stackbuf : malloc(n);
        if (bodybuf == NULL) {
            status = STATUS_RESOURCE_EXHAUSTED;
            env.status = status;
            env.message = "out of memory packing the reply";
        } else {
            protobuf_c_message_pack(body, bodybuf);
            env.body.data = bodybuf;
            env.body.len = n;
        }
    }
    size_t seg_len = 0;
    if (tensor && status == STATUS_OK) {
        env.tensor = (Psd__V1__TensorMeta *)tensor;
        seg_len = (size_t)tensor->count * frame_dtype_size(tensor->dtype);
    }
    size_t env_len = protobuf_c_message_get_packed_size(&env.base);
    size_t total = frame_segment_offset(env_len) + seg_len;
    if (env_len > FRAME_MAX_ENVELOPE) {
        /* A handler built a body past the envelope's bound (handlers size variable replies with
         * rpc_call_max_reply_body): our bug, never the caller's, so INTERNAL naming the cause. */
        snprintf(clean, sizeof(clean),
                 "%s built a reply envelope of %zu bytes, more than the protocol's bound of %u "
                 "bytes",
                 c->method ? c->method->name : "the handler", env_len, FRAME_MAX_ENVELOPE);
        status = STATUS_INTERNAL;
        c->status = status;
        reply_error_only(&env, status, clean, &seg_len, &segment_out);
    } else if (status == STATUS_OK && total > c->srv->cfg.max_message) {
        /* The limit holds both ways: a reply that outgrew it is refused, not sent. */
        snprintf(clean, sizeof(clean),
                 "reply of %zu bytes would exceed max-message-bytes (%zu): ask for less (smaller "
                 "ranges, pages)",
                 total, c->srv->cfg.max_message);
        status = STATUS_RESOURCE_EXHAUSTED;
        reply_error_only(&env, status, clean, &seg_len, &segment_out);
    }
    if (c->reply) {
        nng_msg_free(c->reply);
        c->reply = NULL;
    }
    int rv = frame_build(&c->reply, &env, NULL, seg_len, segment_out);
    if (rv != 0 && seg_len > 0) {
        /* Could not allocate the segment: fall back to a small error reply. */
        envelope err = env;
        err.status = STATUS_RESOURCE_EXHAUSTED;
        err.message = "out of memory allocating the reply";
        err.tensor = NULL;
        err.body.len = 0;
        err.body.data = NULL;
        rv = frame_build(&c->reply, &err, NULL, 0, NULL);
        if (segment_out)
            *segment_out = NULL;
        status = STATUS_RESOURCE_EXHAUSTED;
        c->status = status;
    }
    if (rv != 0)
        c->reply = NULL; /* the send step turns this into a bare error */
    if (status == STATUS_INTERNAL)
        log_error("%s answered INTERNAL: %s", c->method ? c->method->name : "request", env.message);
    if (status != STATUS_OK)
        atomic_fetch_add(&c->srv->stats.errors, 1);
    if (bodybuf && bodybuf != stackbuf)
        free(bodybuf);
}

void rpc_reply_error(rpc_call *c, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    set_reply(c, status, msg, NULL, NULL, NULL);
}

void rpc_reply_ok(rpc_call *c, const ProtobufCMessage *body)
{
    set_reply(c, STATUS_OK, "", body, NULL, NULL);
}

uint8_t *rpc_reply_ok_segment(rpc_call *c, const ProtobufCMessage *body, uint64_t offset,
                              uint64_t count)
{
    return rpc_reply_ok_tensor(c, body, PSD__V1__DTYPE__FLOAT32, offset, count);
}

uint8_t *rpc_reply_ok_tensor(rpc_call *c, const ProtobufCMessage *body, int dtype, uint64_t offset,
                             uint64_t count)
{
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = (Psd__V1__DType)dtype;
    t.offset = offset;
    t.count = count;
    uint8_t *seg = NULL;
    set_reply(c, STATUS_OK, "", body, &t, &seg);
    if (seg == NULL && count > 0)
        return NULL;
    return seg ? seg : (uint8_t *)"";
}

const uint8_t *rpc_call_request(const rpc_call *c, size_t *len)
{
    *len = c->len;
    return c->data;
}

int rpc_call_reply_status(const rpc_call *c)
{
    return c->reply ? c->status : -1;
}

void rpc_call_set_primary(rpc_call *c, uint32_t primary)
{
    c->primary = primary;
}

void rpc_server_set_epoch(rpc_server *s, uint64_t epoch)
{
    atomic_store(&s->epoch, epoch);
}

const envelope *rpc_call_envelope(const rpc_call *c)
{
    return c->f.env;
}

const ProtobufCMessage *rpc_call_body(const rpc_call *c)
{
    return c->body;
}

const uint8_t *rpc_call_segment(const rpc_call *c, size_t *len)
{
    *len = c->f.segment_len;
    return c->f.segment;
}

size_t rpc_call_max_message(const rpc_call *c)
{
    return c->srv->cfg.max_message;
}

size_t rpc_call_max_reply_body(const rpc_call *c)
{
    size_t max =
        c->srv->cfg.max_message < FRAME_MAX_ENVELOPE ? c->srv->cfg.max_message : FRAME_MAX_ENVELOPE;
    return max > 2 * RPC_ENVELOPE_RESERVE ? max - RPC_ENVELOPE_RESERVE : max / 2;
}

const rpc_method *rpc_call_method(const rpc_call *c)
{
    return c->method;
}

uint64_t rpc_call_deadline_ns(const rpc_call *c)
{
    return c->deadline_ns;
}

const rpc_stats *rpc_server_stats(const rpc_server *s)
{
    return &s->stats;
}

uint64_t rpc_server_instance(const rpc_server *s)
{
    return s->instance;
}

/* Logs a bad request with a short hex sample of its first bytes, as Redis does. */
static void log_bad_request(const rpc_call *c, int status, const char *why)
{
    const uint8_t *p = c->data;
    size_t n = c->len;
    char hex[3 * 16 + 1] = "";
    for (size_t i = 0; i < n && i < 16; i++)
        snprintf(hex + 3 * i, sizeof(hex) - 3 * i, "%02x ", p[i]);
    log_warn("bad request (%zu bytes, first: %s): %s: %s", n, hex, status_name(status), why);
}

/* The peer address of a pipe as text ("10.0.0.7:51234"), "unknown" if not available. */
static void pipe_peer(nng_pipe p, char *buf, size_t cap, bool *loopback)
{
    nng_sockaddr sa;
    char ip[INET6_ADDRSTRLEN] = "";
    *loopback = false;
    snprintf(buf, cap, "unknown peer");
    if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
        return;
    switch (sa.s_family) {
    case NNG_AF_INET:
        inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip));
        snprintf(buf, cap, "%s:%u", ip, ntohs(sa.s_in.sa_port));
        *loopback = (ntohl(sa.s_in.sa_addr) >> 24) == 127;
        break;
    case NNG_AF_INET6: {
        static const uint8_t lo6[16] = {[15] = 1};
        static const uint8_t v4mapped[12] = {[10] = 0xff, [11] = 0xff};
        inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip));
        snprintf(buf, cap, "[%s]:%u", ip, ntohs(sa.s_in6.sa_port));
        /* ::1, or 127.0.0.0/8 as a listener on [::] sees it (::ffff:127.x.y.z). */
        *loopback = memcmp(sa.s_in6.sa_addr, lo6, 16) == 0 ||
                    (memcmp(sa.s_in6.sa_addr, v4mapped, 12) == 0 && sa.s_in6.sa_addr[12] == 127);
        break;
    }
    case NNG_AF_IPC:
    case NNG_AF_INPROC:
    case NNG_AF_ABSTRACT:
        snprintf(buf, cap, "local (%s)", sa.s_family == NNG_AF_INPROC ? "inproc" : "ipc");
        *loopback = true; /* same host, guarded by the file system or the process */
        break;
    default:
        break;
    }
}

/* Constant-time comparison of the sent token with the server's. */
static bool token_equal(const uint8_t *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned diff = alen != blen;
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned)(b[i] ^ (i < alen ? a[i] : 0));
    return diff == 0;
}

/* The admin role of an RPC_ADMIN method (rpc_server_config.admin_token). */
static bool check_admin(rpc_call *c)
{
    const envelope *env = c->f.env;
    const char *tok = c->srv->cfg.admin_token;
    const char *name = c->method->name;
    char peer[96];
    bool loopback;
    if (c->req) {
        pipe_peer(nng_msg_get_pipe(c->req), peer, sizeof(peer), &loopback);
    } else {
        snprintf(peer, sizeof(peer), "in-process");
        loopback = false;
    }
    if (tok && tok[0]) {
        if (env->auth_token.len == 0) {
            log_warn("refused %s from %s: no admin token", name, peer);
            rpc_reply_error(c, STATUS_UNAUTHENTICATED,
                            "%s is an admin method and the request carries no admin token "
                            "(set admin-token-file on the client)",
                            name);
            return false;
        }
        if (!token_equal(env->auth_token.data, env->auth_token.len, tok)) {
            log_warn("refused %s from %s: wrong admin token", name, peer);
            rpc_reply_error(c, STATUS_PERMISSION_DENIED,
                            "%s is an admin method and the admin token sent does not match the "
                            "server's admin-token-file",
                            name);
            return false;
        }
        return true;
    }
    if (!loopback) {
        log_warn("refused %s from %s: admin methods are allowed from loopback only without an "
                 "admin-token-file",
                 name, peer);
        rpc_reply_error(c, STATUS_PERMISSION_DENIED,
                        "%s is an admin method, allowed only from loopback peers (this is %s) "
                        "while the server has no admin-token-file: set one on the server and "
                        "the client",
                        name, peer);
        return false;
    }
    return true;
}

bool rpc_call_check_admin(rpc_call *c)
{
    return c->srv->cfg.trusted || check_admin(c);
}

bool rpc_call_carries_token(const rpc_call *c, const char *token)
{
    const envelope *env = c->f.env;
    return token && token[0] && env && env->auth_token.len > 0 &&
           token_equal(env->auth_token.data, env->auth_token.len, token);
}

/* ---- connections: counted through nng's pipe notifications ---- */

static conn_entry **conn_slot(rpc_server *s, uint32_t pipe)
{
    conn_entry **p = &s->conns[(pipe * 2654435761u) % CONN_BUCKETS];
    while (*p && (*p)->pipe != pipe)
        p = &(*p)->next;
    return p;
}

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    rpc_server *s = arg;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    pthread_mutex_lock(&s->connlock);
    conn_entry **slot = conn_slot(s, id);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        if (s->cfg.max_connections > 0 && s->nconns >= s->cfg.max_connections) {
            int n = s->nconns;
            pthread_mutex_unlock(&s->connlock);
            log_warn("connection refused: %d connections open (max-connections)", n);
            nng_pipe_close(p);
            return;
        }
        conn_entry *e = *slot == NULL ? calloc(1, sizeof(*e)) : NULL;
        if (e) {
            e->pipe = id;
            *slot = e;
            s->nconns++;
        }
    } else if (ev == NNG_PIPE_EV_REM_POST && *slot) {
        conn_entry *e = *slot;
        *slot = e->next;
        free(e);
        s->nconns--;
    }
    pthread_mutex_unlock(&s->connlock);
}

/* Under TLS: closes a connection whose peer certificate was not verified, before it reaches
 * the socket (the listener's authentication is OPTIONAL so that this can log it; with
 * REQUIRED, mbed TLS refuses the handshake and nng 1.5 reports nothing at all). Replaces
 * pipe_cb for ADD_PRE and calls it for the connections it lets through. */
/* Rate limit of the refusal lines (a refused client redials many times a second): true when
 * a refusal from peer ("address:port") is to be logged now, at most once a second per
 * address; *suppressed then gets how many refusals from that address were not logged since
 * its last line, over *since_s seconds. REFUSAL_SLOTS addresses are remembered, the least
 * recently logged one giving way to a new one (its count not logged is lost). */
static bool refusal_log_due(rpc_server *s, const char *peer, uint64_t *suppressed, double *since_s)
{
    char addr[sizeof(s->refusals[0].addr)];
    const char *colon = strrchr(peer, ':');
    size_t n = colon != NULL && colon != peer ? (size_t)(colon - peer) : strlen(peer);
    if (n >= sizeof(addr))
        n = sizeof(addr) - 1;
    memcpy(addr, peer, n);
    addr[n] = '\0';
    uint64_t now = time_now_ns();
    bool due = true;
    *suppressed = 0;
    *since_s = 0;
    pthread_mutex_lock(&s->connlock);
    struct refusal_log *e = NULL, *oldest = &s->refusals[0];
    for (int i = 0; i < REFUSAL_SLOTS && e == NULL; i++) {
        struct refusal_log *r = &s->refusals[i];
        if (r->logged_ns != 0 && strcmp(r->addr, addr) == 0)
            e = r;
        else if (r->logged_ns < oldest->logged_ns)
            oldest = r;
    }
    if (e == NULL) {
        e = oldest;
        memcpy(e->addr, addr, n + 1);
        e->logged_ns = now;
        e->suppressed = 0;
    } else if (now - e->logged_ns >= REFUSAL_LOG_INTERVAL_NS) {
        *suppressed = e->suppressed;
        *since_s = (double)(now - e->logged_ns) / 1e9;
        e->logged_ns = now;
        e->suppressed = 0;
    } else {
        e->suppressed++;
        due = false;
    }
    pthread_mutex_unlock(&s->connlock);
    return due;
}

static void tls_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    rpc_server *s = arg;
    bool verified = false;
    int rv = nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified);
    if (ev != NNG_PIPE_EV_ADD_PRE || (rv == 0 && verified)) {
        pipe_cb(p, ev, arg); /* one callback per event and socket: chain the connection count */
        return;
    }
    char peer[96];
    bool loopback;
    pipe_peer(p, peer, sizeof(peer), &loopback);
    atomic_fetch_add(&s->tls_refused, 1);
    uint64_t suppressed;
    double since_s;
    if (!refusal_log_due(s, peer, &suppressed, &since_s)) {
        nng_pipe_close(p);
        return;
    }
    char more[96] = "";
    if (suppressed > 0)
        snprintf(more, sizeof(more),
                 " (and %llu more from this address in the last %.1f s, "
                 "not logged)",
                 (unsigned long long)suppressed, since_s);
    if (rv != 0)
        log_warn("refused TLS connection from %s: cannot tell whether its certificate was "
                 "verified: %s%s",
                 peer, nng_strerror(rv), more);
    else
        log_warn("refused TLS connection from %s: no client certificate, or one not verified "
                 "by tls-ca %s (signed by another CA, expired or not yet valid; nng 1.5 does "
                 "not say which)%s",
                 peer, s->cfg.tls.ca, more);
    nng_pipe_close(p);
}

/* ---- the listener ---- */

/* Creates, configures and starts s->listener on cfg.url. */
static int server_listen(rpc_server *s, char *err, size_t errlen)
{
    const rpc_server_config *cfg = &s->cfg;
    nng_listener l;
    int rv = nng_listener_create(&l, s->sock, cfg->url);
    if (rv != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", cfg->url, nng_strerror(rv));
        return -1;
    }
    if (rpc_tls_on(&cfg->tls)) {
        nng_tls_config *tls;
        if (rpc_tls_config(&tls, &cfg->tls, true, err, errlen) != 0) {
            nng_listener_close(l);
            return -1;
        }
        rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tls);
        nng_tls_config_free(tls); /* the listener holds it */
        if (rv != 0) {
            snprintf(err, errlen, "cannot use TLS on %s (the URL must be tls+tcp://): %s", cfg->url,
                     nng_strerror(rv));
            nng_listener_close(l);
            return -1;
        }
    }
    if ((rv = nng_listener_start(l, 0)) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", cfg->url, nng_strerror(rv));
        nng_listener_close(l);
        return -1;
    }
    s->listener = l;
    return 0;
}

/* Counts c in its connection's requests in progress; false when that is at the limit. A
 * connection unknown here (closed meanwhile) is not limited: its reply goes nowhere. */
static bool conn_admit(rpc_call *c)
{
    rpc_server *s = c->srv;
    c->pipe = c->req ? (uint32_t)nng_pipe_id(nng_msg_get_pipe(c->req)) : 0;
    pthread_mutex_lock(&s->connlock);
    conn_entry *e = *conn_slot(s, c->pipe);
    bool ok = e == NULL || e->inflight < s->cfg.max_per_connection;
    if (e && ok) {
        e->inflight++;
        c->counted = true;
    }
    pthread_mutex_unlock(&s->connlock);
    return ok;
}

static void conn_release(rpc_call *c)
{
    rpc_server *s = c->srv;
    pthread_mutex_lock(&s->connlock);
    conn_entry *e = *conn_slot(s, c->pipe);
    if (e && e->inflight > 0)
        e->inflight--;
    c->counted = false;
    pthread_mutex_unlock(&s->connlock);
}

/* Validation every request passes before its handler (Redis' processCommand). */
static bool validate(rpc_call *c)
{
    rpc_server *s = c->srv;
    char err[512];
    size_t len = c->len;
    if (len > s->cfg.max_message) {
        snprintf(err, sizeof(err), "message of %zu bytes exceeds max-message-bytes (%zu)", len,
                 s->cfg.max_message);
        log_bad_request(c, STATUS_RESOURCE_EXHAUSTED, err);
        set_reply(c, STATUS_RESOURCE_EXHAUSTED, err, NULL, NULL, NULL);
        return false;
    }
    int st = frame_parse_bytes(c->data, c->len, &c->f, err, sizeof(err));
    if (st != STATUS_OK) {
        log_bad_request(c, st, err);
        set_reply(c, st, err, NULL, NULL, NULL);
        return false;
    }
    const envelope *env = c->f.env;
    uint32_t dl = env->deadline_ms ? env->deadline_ms : s->cfg.default_deadline_ms;
    if (s->cfg.max_deadline_ms && dl > s->cfg.max_deadline_ms)
        dl = s->cfg.max_deadline_ms; /* max-deadline-ms: no request holds resources longer */
    c->deadline_ns = c->recv_ns + (uint64_t)dl * 1000000u;
    if (env->is_reply) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT, "a reply was sent as a request");
        return false;
    }
    c->method = find_method(s, env->method);
    if (c->method == NULL) {
        rpc_reply_error(c, STATUS_UNIMPLEMENTED, "unknown method %d", (int)env->method);
        log_bad_request(c, STATUS_UNIMPLEMENTED, "unknown method");
        return false;
    }
    if (s->cfg.max_per_connection > 0 && !conn_admit(c)) {
        rpc_reply_error(c, STATUS_RESOURCE_EXHAUSTED,
                        "more than %d requests in progress on this connection "
                        "(max-requests-per-connection)",
                        s->cfg.max_per_connection);
        return false;
    }
    unsigned fl = c->method->flags;
    if ((fl & (RPC_RANGE | RPC_SEGMENT)) && env->tensor == NULL) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT, "%s needs a tensor range (Envelope.tensor)",
                        c->method->name);
        return false;
    }
    if ((fl & RPC_SEGMENT) && !c->f.has_segment) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT,
                        "%s needs a tensor segment of %llu elements after the envelope",
                        c->method->name, (unsigned long long)env->tensor->count);
        return false;
    }
    if (!(fl & (RPC_SEGMENT | RPC_MAY_SEGMENT)) && c->f.has_segment) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT, "%s takes no tensor segment", c->method->name);
        return false;
    }
    if ((fl & RPC_ADMIN) && !c->srv->cfg.trusted && !check_admin(c))
        return false;
    if ((fl & RPC_REPLY_RANGE) && env->tensor) {
        /* The reply's segment is the range: refuse before any work what could not be sent. */
        size_t esz = frame_dtype_size(env->tensor->dtype);
        uint64_t seg =
            esz && env->tensor->count <= UINT64_MAX / esz ? env->tensor->count * esz : UINT64_MAX;
        if (seg > s->cfg.max_message || seg + 256 > s->cfg.max_message) {
            rpc_reply_error(c, STATUS_RESOURCE_EXHAUSTED,
                            "%s of %llu elements: reply would exceed max-message-bytes (%zu); "
                            "pull smaller ranges (the client library splits large pulls into "
                            "chunks of chunk-bytes)",
                            c->method->name, (unsigned long long)env->tensor->count,
                            s->cfg.max_message);
            return false;
        }
    }
    char serr[256];
    int sst =
        frame_check_strings(c->method->request, env->body.data, env->body.len, serr, sizeof(serr));
    if (sst != STATUS_OK) {
        rpc_reply_error(c, sst, "body of %s: %s", c->method->name, serr);
        return false;
    }
    c->body = protobuf_c_message_unpack(c->method->request, NULL, env->body.len, env->body.data);
    if (c->body == NULL) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT, "body of %s does not decode as %s",
                        c->method->name, c->method->request->name);
        return false;
    }
    if (!c->srv->cfg.trusted && time_now_ns() > c->deadline_ns) {
        rpc_reply_error(c, STATUS_DEADLINE_EXCEEDED, "deadline of %u ms expired before %s ran", dl,
                        c->method->name);
        return false;
    }
    return true;
}

/* Starts a receive on a context unless the server is stopping. */
static void srv_recv(rpc_server *s, nng_ctx ctx, nng_aio *aio)
{
    if (!atomic_load(&s->stopping))
        nng_ctx_recv(ctx, aio);
}

/* Sends the aio's message on a context, or frees it when the server is stopping. */
static void srv_send(rpc_server *s, nng_ctx ctx, nng_aio *aio)
{
    if (!atomic_load(&s->stopping)) {
        nng_ctx_send(ctx, aio);
    } else {
        nng_msg_free(nng_aio_get_msg(aio));
        nng_aio_set_msg(aio, NULL);
    }
}

struct rpc_held {
    atomic_int refs;
    nng_msg *msg;
};

rpc_held *rpc_call_hold_request(rpc_call *c, const uint8_t **data, size_t *len)
{
    if (c->req == NULL)
        return NULL;
    if (c->held == NULL) {
        c->held = malloc(sizeof(*c->held));
        if (c->held == NULL)
            return NULL;
        atomic_init(&c->held->refs, 1); /* the call's own, released when it replies */
        c->held->msg = c->req;
    }
    atomic_fetch_add(&c->held->refs, 1);
    *data = c->data;
    *len = c->len;
    return c->held;
}

rpc_held *rpc_held_ref(rpc_held *h)
{
    atomic_fetch_add(&h->refs, 1);
    return h;
}

void rpc_held_release(rpc_held *h)
{
    if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
        nng_msg_free(h->msg);
        free(h);
    }
}

/* Lets go of the request message: freed, or left to the references taken on it. */
static void call_free_request(rpc_call *c)
{
    if (c->held)
        rpc_held_release(c->held);
    else if (c->req)
        nng_msg_free(c->req);
    c->held = NULL;
    c->req = NULL;
    c->data = NULL;
    c->len = 0;
}

static void call_send(rpc_call *c)
{
    if (c->counted)
        conn_release(c);
    if (c->reply == NULL) {
        /* Last resort: the reply could not even be built (out of memory). */
        if (nng_msg_alloc(&c->reply, 0) != 0) {
            c->reply = NULL;
        }
    }
    if (c->body) {
        protobuf_c_message_free_unpacked(c->body, NULL);
        c->body = NULL;
    }
    metrics_record(c, c->reply ? nng_msg_len(c->reply) : 0);
    frame_fini(&c->f);
    call_free_request(c);
    if (c->reply == NULL) {
        /* Nothing to send: drop the request, the client's deadline tells it. */
        atomic_fetch_sub(&c->srv->busy, 1);
        c->state = CALL_RECV;
        srv_recv(c->srv, c->ctx, c->aio);
        return;
    }
    atomic_fetch_add(&c->srv->stats.bytes_out, nng_msg_len(c->reply));
    atomic_fetch_sub(&c->srv->busy, 1);
    nng_aio_set_msg(c->aio, c->reply);
    c->reply = NULL;
    c->state = CALL_SEND;
    srv_send(c->srv, c->ctx, c->aio);
}

/* Runs the handler of a validated call and sends its reply. */
static _Thread_local rpc_call *deferred_now; /* set by rpc_call_defer on the handler's thread */

static void call_handle(rpc_call *c)
{
    bool twice = fault_chance(c->srv, c->srv->cfg.dup_percent);
    c->method->handler(c, c->srv->cfg.handler_arg);
    if (deferred_now == c) {
        /* Parked: another thread may already be replying; c is not ours to touch. */
        deferred_now = NULL;
        return;
    }
    if (twice) {
        /* Fault injection: the request arrives again and the first reply is lost. */
        atomic_fetch_add(&c->srv->duplicated, 1);
        if (c->reply) {
            nng_msg_free(c->reply);
            c->reply = NULL;
        }
        c->method->handler(c, c->srv->cfg.handler_arg);
        if (deferred_now == c) {
            deferred_now = NULL;
            return;
        }
    }
    if (c->reply == NULL)
        rpc_reply_error(c, STATUS_INTERNAL, "%s produced no reply", c->method->name);
    call_send(c);
}

/* Bytes a validated call will move: its request plus the tensor it names (a pull's reply). */
static size_t call_work_bytes(const rpc_call *c)
{
    size_t n = c->len;
    const envelope *env = c->f.env;
    if (env->tensor && !c->f.has_segment && env->tensor->count < SIZE_MAX / 8)
        n += (size_t)env->tensor->count * frame_dtype_size(env->tensor->dtype);
    return n;
}

static void enqueue(rpc_server *s, rpc_call *c);

/* Validates a call, then handles it here when it is small, or hands it to the pool. */
static void call_work(rpc_call *c, bool on_pool)
{
    if (!c->validated) {
        if (atomic_load(&c->srv->draining)) {
            char ignored[8];
            (void)frame_parse_bytes(c->data, c->len, &c->f, ignored,
                                    sizeof(ignored)); /* for the request id */
            rpc_reply_error(c, STATUS_UNAVAILABLE, "server is shutting down");
            call_send(c);
            return;
        }
        if (!validate(c)) {
            call_send(c);
            return;
        }
        c->validated = true;
    }
    if (!on_pool &&
        ((c->method->flags & RPC_POOL) || call_work_bytes(c) > c->srv->cfg.inline_max)) {
        enqueue(c->srv, c);
        return;
    }
    call_handle(c);
}

static void enqueue(rpc_server *s, rpc_call *c)
{
    pthread_mutex_lock(&s->qlock);
    c->next = NULL;
    if (s->qtail)
        s->qtail->next = c;
    else
        s->qhead = c;
    s->qtail = c;
    pthread_cond_signal(&s->qcond);
    pthread_mutex_unlock(&s->qlock);
}

static void *pool_main(void *arg)
{
    rpc_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->qlock);
        while (s->qhead == NULL && !atomic_load(&s->stopping))
            pthread_cond_wait(&s->qcond, &s->qlock);
        rpc_call *c = s->qhead;
        if (c) {
            s->qhead = c->next;
            if (s->qhead == NULL)
                s->qtail = NULL;
        }
        pthread_mutex_unlock(&s->qlock);
        if (c == NULL)
            return NULL; /* stopping and drained */
        call_work(c, true);
    }
}

static void call_cb(void *arg)
{
    rpc_call *c = arg;
    rpc_server *s = c->srv;
    int rv = nng_aio_result(c->aio);
    switch (c->state) {
    case CALL_RECV:
        if (rv != 0) {
            if (rv == NNG_ECLOSED)
                return;
            srv_recv(s, c->ctx, c->aio);
            return;
        }
        c->req = nng_aio_get_msg(c->aio);
        c->data = nng_msg_body(c->req);
        c->len = nng_msg_len(c->req);
        if (fault_chance(s, s->cfg.drop_percent)) {
            /* Fault injection: lost on the way in; the client's REQ socket resends it. */
            atomic_fetch_add(&s->dropped, 1);
            call_free_request(c);
            srv_recv(s, c->ctx, c->aio);
            return;
        }
        c->recv_ns = time_now_ns();
        atomic_fetch_add(&s->stats.requests, 1);
        atomic_fetch_add(&s->busy, 1);
        atomic_fetch_add(&s->stats.bytes_in, c->len);
        c->state = CALL_WORK;
        c->validated = false;
        c->method = NULL;
        c->status = STATUS_OK;
        c->primary = -1;
        c->gate = NULL;
        if (c->len <= s->cfg.inline_max)
            call_work(c, false);
        else
            enqueue(s, c);
        return;
    case CALL_SEND:
        if (rv != 0)
            nng_msg_free(nng_aio_get_msg(c->aio));
        c->state = CALL_RECV;
        if (c->parked) {
            pthread_mutex_lock(&s->qlock);
            c->parked = false;
            bool rejoin = s->nreceiving < s->cfg.contexts;
            if (rejoin) {
                s->nreceiving++;
            } else {
                c->next = s->idle;
                s->idle = c;
            }
            pthread_mutex_unlock(&s->qlock);
            if (!rejoin)
                return;
        }
        srv_recv(s, c->ctx, c->aio);
        return;
    case CALL_WORK:
        return;
    }
}

/* Makes a call object with its own context. Called with qlock held, or before serving. */
static rpc_call *call_new(rpc_server *s)
{
    if (s->ncalls == s->capcalls) {
        int cap = s->capcalls ? s->capcalls * 2 : 64;
        rpc_call **n = realloc(s->calls, (size_t)cap * sizeof(*n));
        if (n == NULL)
            return NULL;
        s->calls = n;
        s->capcalls = cap;
    }
    rpc_call *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->srv = s;
    c->primary = -1;
    if (nng_aio_alloc(&c->aio, call_cb, c) != 0) {
        free(c);
        return NULL;
    }
    if (nng_ctx_open(&c->ctx, s->sock) != 0) {
        nng_aio_free(c->aio);
        free(c);
        return NULL;
    }
    s->calls[s->ncalls++] = c;
    return c;
}

int rpc_call_defer(rpc_call *c)
{
    rpc_server *s = c->srv;
    pthread_mutex_lock(&s->qlock);
    if (atomic_load(&s->stopping)) {
        /* rpc_server_stop is stopping every context: no new one, nothing new received. */
        pthread_mutex_unlock(&s->qlock);
        return -1;
    }
    rpc_call *n = s->idle;
    if (n) {
        s->idle = n->next;
    } else if (s->ncalls < s->cfg.contexts + s->cfg.max_parked) {
        n = call_new(s);
    }
    if (n == NULL) {
        pthread_mutex_unlock(&s->qlock);
        return -1;
    }
    c->parked = true;
    /* The replacement keeps the receive loop at full strength while c waits. */
    n->state = CALL_RECV;
    pthread_mutex_unlock(&s->qlock);
    deferred_now = c;
    srv_recv(s, n->ctx, n->aio);
    return 0;
}

bool rpc_call_deferred_here(const rpc_call *c)
{
    return deferred_now == c;
}

bool rpc_call_trusted(const rpc_call *c)
{
    return c->srv != NULL && c->srv->cfg.trusted;
}

void rpc_call_set_gate(rpc_call *c, rpc_resume_gate gate, void *arg, uint64_t tag)
{
    c->gate = gate;
    c->gate_arg = arg;
    c->gate_tag = tag;
}

void rpc_call_resume(rpc_call *c)
{
    rpc_resume_gate gate = c->gate;
    if (gate) {
        c->gate = NULL;
        if (gate(c, c->gate_arg, c->gate_tag))
            return; /* kept: the gate resumes it again */
    }
    if (c->reply == NULL)
        rpc_reply_error(c, STATUS_INTERNAL, "%s produced no reply", c->method->name);
    call_send(c);
}

int rpc_server_start(rpc_server **out, const rpc_server_config *cfg, char *err, size_t errlen)
{
    rpc_server *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->cfg = *cfg;
    if (getrandom(&s->instance, sizeof(s->instance), 0) != sizeof(s->instance))
        s->instance = time_now_ns() ^ ((uint64_t)getpid() << 40);
    if (s->instance == 0)
        s->instance = 1; /* 0 reads as "no instance" (a reply from an older server) */
    atomic_store(&s->fault_rng, s->instance);
    metrics_init(s);
    if (cfg->drop_percent > 0 || cfg->dup_percent > 0)
        log_warn("fault injection (tests only): dropping %d%% of requests, handling %d%% twice",
                 cfg->drop_percent, cfg->dup_percent);
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->qcond, NULL);
    pthread_mutex_init(&s->connlock, NULL);
    int rv = nng_rep0_open(&s->sock);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open REP socket: %s", nng_strerror(rv));
        goto fail_sock;
    }
    /* Accept up to twice the limit at the transport, so that moderately oversized requests
     * get a RESOURCE_EXHAUSTED reply; beyond that nng closes the connection. */
    size_t transport_max = cfg->max_message > SIZE_MAX / 2 ? SIZE_MAX : cfg->max_message * 2;
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, transport_max);
    nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, s);
    nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, pipe_cb, s);
    for (int i = 0; i < cfg->contexts; i++) {
        if (call_new(s) == NULL) {
            snprintf(err, errlen, "cannot create %d contexts", cfg->contexts);
            goto fail_close;
        }
    }
    s->nreceiving = cfg->contexts;
    if (rpc_tls_on(&cfg->tls))
        nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, tls_pipe_cb, s);
    if (server_listen(s, err, errlen) != 0)
        goto fail_close;
    s->threads = calloc((size_t)cfg->threads, sizeof(pthread_t));
    if (s->threads == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail_close;
    }
    for (int i = 0; i < cfg->threads; i++) {
        if (pthread_create(&s->threads[i], NULL, pool_main, s) != 0) {
            snprintf(err, errlen, "cannot start thread: %s", strerror(errno));
            goto fail_close;
        }
        s->nthreads++;
    }
    for (int i = 0; i < s->ncalls; i++) {
        s->calls[i]->state = CALL_RECV;
        srv_recv(s, s->calls[i]->ctx, s->calls[i]->aio);
    }
    *out = s;
    return 0;
fail_close:
    rpc_server_stop(s);
    return -1;
fail_sock:
    free(s->mm);
    pthread_mutex_destroy(&s->connlock);
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->qcond);
    free(s);
    return -1;
}

void rpc_server_drain(rpc_server *s, uint32_t grace_ms)
{
    atomic_store(&s->draining, true);
    uint64_t until = time_now_ns() + (uint64_t)grace_ms * 1000000u;
    while (atomic_load(&s->busy) > 0 && time_now_ns() < until) {
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }
}

void rpc_server_stop(rpc_server *s)
{
    if (s == NULL)
        return;
    if (s->cfg.drop_percent > 0 || s->cfg.dup_percent > 0)
        log_info("fault injection: %llu requests dropped, %llu handled twice, of %llu received",
                 (unsigned long long)atomic_load(&s->dropped),
                 (unsigned long long)atomic_load(&s->duplicated),
                 (unsigned long long)(atomic_load(&s->stats.requests) + atomic_load(&s->dropped)));
    /* Set under qlock: once it is released, rpc_call_defer makes no new context. */
    pthread_mutex_lock(&s->qlock);
    atomic_store(&s->stopping, true);
    pthread_cond_broadcast(&s->qcond);
    pthread_mutex_unlock(&s->qlock);
    /* The pool's threads first: they drain the calls queued for them (each answered on its
     * context), and none may send on a context closed below (nng frees a closed context: a
     * send on it then aborted the process in rep0_ctx_close). */
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    free(s->threads);
    s->threads = NULL;
    s->nthreads = 0;
    /* Stop every context's aio first (cancels its pending receive or send and waits for a
     * callback in progress; with stopping set, callbacks start nothing new) and close the
     * context, then the socket: with operations still pending, nng 1.5.2's nng_close could
     * wait forever for a context. */
    for (int i = 0; s->calls && i < s->ncalls; i++) {
        if (s->calls[i]->aio) {
            nng_aio_stop(s->calls[i]->aio);
            nng_ctx_close(s->calls[i]->ctx);
        }
    }
    /* Bounded: nng_close can still wait forever on its reaper when a connection comes or goes
     * meanwhile (clients redialling a stopping server; about 1 stop in 30 of a training run).
     * A server that stops must not hang: past the bound the socket is left to the process's
     * exit, and so is everything nng might still touch (the call objects, s itself). */
    bool closed = rpc_close_sockets_bounded(&s->sock, 1, SERVER_CLOSE_WAIT_MS);
    if (!closed)
        log_warn("stopping the RPC server on %s: nng_close did not return within %d ms (nng 1.5 "
                 "can hang while connections come and go); leaving the socket to the exit",
                 s->cfg.url ? s->cfg.url : "?", SERVER_CLOSE_WAIT_MS);
    if (!closed)
        return;
    if (s->calls) {
        for (int i = 0; i < s->ncalls; i++) {
            rpc_call *c = s->calls[i];
            if (c->aio) {
                nng_aio_stop(c->aio);
                nng_aio_free(c->aio);
            }
            call_free_request(c);
            if (c->reply)
                nng_msg_free(c->reply);
            if (c->body)
                protobuf_c_message_free_unpacked(c->body, NULL);
            frame_fini(&c->f);
            free(c);
        }
        free(s->calls);
    }
    for (int i = 0; i < CONN_BUCKETS; i++) {
        while (s->conns[i]) {
            conn_entry *e = s->conns[i];
            s->conns[i] = e->next;
            free(e);
        }
    }
    pthread_mutex_destroy(&s->connlock);
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->qcond);
    free(s->mm);
    free(s);
}

/* ---- requests in memory, no socket (rpc_server.h) ---- */

rpc_server *rpc_server_open_local(const rpc_server_config *cfg)
{
    rpc_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cfg = *cfg;
    /* No contexts and no room to park: rpc_call_defer never opens a context on the (absent)
     * socket, it refuses and the handler replies at once. */
    s->cfg.url = NULL;
    s->cfg.contexts = 0;
    s->cfg.max_parked = 0;
    s->cfg.threads = 0;
    s->cfg.max_connections = 0;
    s->cfg.max_per_connection = 0;
    s->cfg.drop_percent = 0;
    memset(&s->cfg.tls, 0, sizeof(s->cfg.tls));
    if (getrandom(&s->instance, sizeof(s->instance), 0) != sizeof(s->instance))
        s->instance = time_now_ns() ^ ((uint64_t)getpid() << 40);
    if (s->instance == 0)
        s->instance = 1;
    atomic_store(&s->fault_rng, s->instance);
    metrics_init(s);
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->qcond, NULL);
    pthread_mutex_init(&s->connlock, NULL);
    return s;
}

/* Runs the request c holds (c->data, c->len) through the generic checks and its handler, on
 * this thread, and frees what it made; the reply is left in c->reply (NULL: out of memory). */
static void handle_local(rpc_server *s, rpc_call *c)
{
    c->srv = s;
    c->state = CALL_WORK;
    c->status = STATUS_OK;
    c->primary = -1;
    c->recv_ns = time_now_ns();
    atomic_fetch_add(&s->stats.requests, 1);
    atomic_fetch_add(&s->stats.bytes_in, c->len);
    if (validate(c)) {
        c->validated = true;
        bool twice = fault_chance(s, s->cfg.dup_percent);
        c->method->handler(c, s->cfg.handler_arg);
        if (twice) {
            atomic_fetch_add(&s->duplicated, 1);
            if (c->reply) {
                nng_msg_free(c->reply);
                c->reply = NULL;
            }
            c->method->handler(c, s->cfg.handler_arg);
        }
        if (c->reply == NULL)
            rpc_reply_error(c, STATUS_INTERNAL, "%s produced no reply", c->method->name);
    }
    /* What call_send does, with the reply kept here instead of sent. */
    if (c->body)
        protobuf_c_message_free_unpacked(c->body, NULL);
    c->body = NULL;
    metrics_record(c, c->reply ? nng_msg_len(c->reply) : 0);
    frame_fini(&c->f);
    call_free_request(c);
    if (c->reply)
        atomic_fetch_add(&s->stats.bytes_out, nng_msg_len(c->reply));
}

int rpc_server_handle_bytes(rpc_server *s, const void *req, size_t len, void **reply,
                            size_t *reply_len)
{
    *reply = NULL;
    *reply_len = 0;
    rpc_call c;
    memset(&c, 0, sizeof(c));
    if (nng_msg_alloc(&c.req, len) != 0)
        return -1;
    if (len)
        memcpy(nng_msg_body(c.req), req, len);
    c.data = nng_msg_body(c.req);
    c.len = len;
    handle_local(s, &c);
    if (c.reply == NULL)
        return -1; /* not even an error reply could be built: out of memory */
    size_t n = nng_msg_len(c.reply);
    void *out = malloc(n ? n : 1);
    if (out == NULL) {
        nng_msg_free(c.reply);
        return -1;
    }
    memcpy(out, nng_msg_body(c.reply), n);
    nng_msg_free(c.reply);
    *reply = out;
    *reply_len = n;
    return 0;
}

int rpc_server_handle_borrowed(rpc_server *s, const void *req, size_t len)
{
    rpc_call c;
    memset(&c, 0, sizeof(c));
    c.data = req;
    c.len = len;
    handle_local(s, &c);
    if (c.reply == NULL)
        return -1;
    nng_msg_free(c.reply);
    return 0;
}

void rpc_server_close_local(rpc_server *s)
{
    if (s == NULL)
        return;
    pthread_mutex_destroy(&s->connlock);
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->qcond);
    free(s->mm);
    free(s);
}
