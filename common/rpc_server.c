#include "rpc_server.h"

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
#include "status.h"
#include "timeutil.h"

enum call_state { CALL_RECV, CALL_WORK, CALL_SEND };

struct rpc_call {
    rpc_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    enum call_state state;
    nng_msg *req;
    frame f;
    ProtobufCMessage *body;
    const rpc_method *method;
    uint64_t recv_ns;
    uint64_t deadline_ns;
    nng_msg *reply;
    bool validated;
    bool parked;    /* deferred: left the receive loop, replied to later */
    rpc_call *next; /* work queue link or idle list */
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
    atomic_bool draining;
    atomic_int busy; /* requests received and not yet replied to */
    rpc_stats stats;
    uint64_t instance; /* Envelope.server_instance of every reply */
    /* Fault injection (tests only): a counter hashed into random numbers, and what it did. */
    atomic_uint_fast64_t fault_rng;
    atomic_uint_fast64_t dropped, duplicated;
};

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
    env.status = status;
    env.message = (char *)(message ? message : "");
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
    }
    if (rv != 0)
        c->reply = NULL; /* the send step turns this into a bare error */
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
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.offset = offset;
    t.count = count;
    uint8_t *seg = NULL;
    set_reply(c, STATUS_OK, "", body, &t, &seg);
    if (seg == NULL && count > 0)
        return NULL;
    return seg ? seg : (uint8_t *)"";
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
    const uint8_t *p = nng_msg_body(c->req);
    size_t n = nng_msg_len(c->req);
    char hex[3 * 16 + 1] = "";
    for (size_t i = 0; i < n && i < 16; i++)
        snprintf(hex + 3 * i, sizeof(hex) - 3 * i, "%02x ", p[i]);
    log_warn("bad request (%zu bytes, first: %s): %s: %s", n, hex, status_name(status), why);
}

/* Validation every request passes before its handler (Redis' processCommand). */
static bool validate(rpc_call *c)
{
    rpc_server *s = c->srv;
    char err[512];
    size_t len = nng_msg_len(c->req);
    if (len > s->cfg.max_message) {
        snprintf(err, sizeof(err), "message of %zu bytes exceeds max-message-bytes (%zu)", len,
                 s->cfg.max_message);
        log_bad_request(c, STATUS_RESOURCE_EXHAUSTED, err);
        set_reply(c, STATUS_RESOURCE_EXHAUSTED, err, NULL, NULL, NULL);
        return false;
    }
    int st = frame_parse(c->req, &c->f, err, sizeof(err));
    if (st != STATUS_OK) {
        log_bad_request(c, st, err);
        set_reply(c, st, err, NULL, NULL, NULL);
        return false;
    }
    const envelope *env = c->f.env;
    uint32_t dl = env->deadline_ms ? env->deadline_ms : s->cfg.default_deadline_ms;
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
    if (!(fl & RPC_SEGMENT) && c->f.has_segment) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT, "%s takes no tensor segment", c->method->name);
        return false;
    }
    c->body = protobuf_c_message_unpack(c->method->request, NULL, env->body.len, env->body.data);
    if (c->body == NULL) {
        rpc_reply_error(c, STATUS_INVALID_ARGUMENT, "body of %s does not decode as %s",
                        c->method->name, c->method->request->name);
        return false;
    }
    if (time_now_ns() > c->deadline_ns) {
        rpc_reply_error(c, STATUS_DEADLINE_EXCEEDED, "deadline of %u ms expired before %s ran", dl,
                        c->method->name);
        return false;
    }
    return true;
}

static void call_send(rpc_call *c)
{
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
    frame_fini(&c->f);
    nng_msg_free(c->req);
    c->req = NULL;
    if (c->reply == NULL) {
        /* Nothing to send: drop the request, the client's deadline tells it. */
        atomic_fetch_sub(&c->srv->busy, 1);
        c->state = CALL_RECV;
        if (!atomic_load(&c->srv->stopping))
            nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    atomic_fetch_add(&c->srv->stats.bytes_out, nng_msg_len(c->reply));
    atomic_fetch_sub(&c->srv->busy, 1);
    nng_aio_set_msg(c->aio, c->reply);
    c->reply = NULL;
    c->state = CALL_SEND;
    nng_ctx_send(c->ctx, c->aio);
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
    size_t n = nng_msg_len(c->req);
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
            (void)frame_parse(c->req, &c->f, ignored, sizeof(ignored)); /* for the request id */
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
            if (rv == NNG_ECLOSED || atomic_load(&s->stopping))
                return;
            nng_ctx_recv(c->ctx, c->aio);
            return;
        }
        c->req = nng_aio_get_msg(c->aio);
        if (fault_chance(s, s->cfg.drop_percent)) {
            /* Fault injection: lost on the way in; the client's REQ socket resends it. */
            atomic_fetch_add(&s->dropped, 1);
            nng_msg_free(c->req);
            c->req = NULL;
            if (!atomic_load(&s->stopping))
                nng_ctx_recv(c->ctx, c->aio);
            return;
        }
        c->recv_ns = time_now_ns();
        atomic_fetch_add(&s->stats.requests, 1);
        atomic_fetch_add(&s->busy, 1);
        atomic_fetch_add(&s->stats.bytes_in, nng_msg_len(c->req));
        c->state = CALL_WORK;
        c->validated = false;
        if (nng_msg_len(c->req) <= s->cfg.inline_max)
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
        if (!atomic_load(&s->stopping))
            nng_ctx_recv(c->ctx, c->aio);
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
    if (!atomic_load(&s->stopping))
        nng_ctx_recv(n->ctx, n->aio);
    return 0;
}

void rpc_call_resume(rpc_call *c)
{
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
    if (cfg->drop_percent > 0 || cfg->dup_percent > 0)
        log_warn("fault injection (tests only): dropping %d%% of requests, handling %d%% twice",
                 cfg->drop_percent, cfg->dup_percent);
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->qcond, NULL);
    int rv = nng_rep0_open(&s->sock);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open REP socket: %s", nng_strerror(rv));
        goto fail_sock;
    }
    /* Accept up to twice the limit at the transport, so that moderately oversized requests
     * get a RESOURCE_EXHAUSTED reply; beyond that nng closes the connection. */
    size_t transport_max = cfg->max_message > SIZE_MAX / 2 ? SIZE_MAX : cfg->max_message * 2;
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, transport_max);
    for (int i = 0; i < cfg->contexts; i++) {
        if (call_new(s) == NULL) {
            snprintf(err, errlen, "cannot create %d contexts", cfg->contexts);
            goto fail_close;
        }
    }
    s->nreceiving = cfg->contexts;
    if ((rv = nng_listen(s->sock, cfg->url, NULL, 0)) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", cfg->url, nng_strerror(rv));
        goto fail_close;
    }
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
        nng_ctx_recv(s->calls[i]->ctx, s->calls[i]->aio);
    }
    *out = s;
    return 0;
fail_close:
    rpc_server_stop(s);
    return -1;
fail_sock:
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
    atomic_store(&s->stopping, true);
    nng_close(s->sock);
    pthread_mutex_lock(&s->qlock);
    pthread_cond_broadcast(&s->qcond);
    pthread_mutex_unlock(&s->qlock);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    free(s->threads);
    if (s->calls) {
        for (int i = 0; i < s->ncalls; i++) {
            rpc_call *c = s->calls[i];
            if (c->aio) {
                nng_aio_stop(c->aio);
                nng_aio_free(c->aio);
            }
            if (c->req)
                nng_msg_free(c->req);
            if (c->reply)
                nng_msg_free(c->reply);
            if (c->body)
                protobuf_c_message_free_unpacked(c->body, NULL);
            frame_fini(&c->f);
            free(c);
        }
        free(s->calls);
    }
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->qcond);
    free(s);
}
