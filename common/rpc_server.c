/* The RPC server on its socket (rpc_server.h): an nng REP socket served by many contexts, each
 * a small state machine (RECV -> WORK -> SEND), the pool of threads that runs large requests
 * off nng's callback threads, parked (deferred) calls, and the server's start, drain and stop.
 * The checks before a handler are in rpc_validate.c, who may call in rpc_auth.c, connection
 * caps in rpc_conns.c, the reply in rpc_call.c, the in-process server in rpc_local.c. */
#include "rpc_server.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/protocol/reqrep0/rep.h>

#include "log.h"
#include "rpc_local.h"
#include "rpc_auth.h"
#include "rpc_server_internal.h"
#include "rpc_validate.h"
#include "status.h"
#include "timeutil.h"

#define SERVER_CLOSE_WAIT_MS 5000 /* bound of nng_close in rpc_server_stop */

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

/* Ends a call: sends its reply, or with drop (fault injection) sends nothing, so the client's
 * REQ socket resends the request after its resend-ms. */
static void call_finish(rpc_call *c, bool drop)
{
    if (c->counted) {
        rpc_conns_release(&c->srv->conns, c->pipe);
        c->counted = false;
    }
    if (drop && c->reply != NULL) {
        nng_msg_free(c->reply);
        c->reply = NULL;
    }
    if (c->reply == NULL && !drop) {
        /* Last resort: the reply could not even be built (out of memory). */
        if (nng_msg_alloc(&c->reply, 0) != 0) {
            c->reply = NULL;
        }
    }
    if (c->body) {
        protobuf_c_message_free_unpacked(c->body, NULL);
        c->body = NULL;
    }
    rpcs_metrics_record(c, c->reply ? nng_msg_len(c->reply) : 0);
    frame_fini(&c->f);
    rpcs_free_request(c);
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

static void call_send(rpc_call *c)
{
    call_finish(c, false);
}

/* Runs the handler of a validated call and sends its reply. */
static _Thread_local rpc_call *deferred_now; /* set by rpc_call_defer on the handler's thread */

static void call_handle(rpc_call *c)
{
    bool twice = rpcs_fault_chance(c->srv, c->srv->cfg.dup_percent);
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
    else if ((c->method->method == PSD__V1__METHOD__PUSH ||
              c->method->method == PSD__V1__METHOD__TABLE_PUSH) &&
             rpcs_fault_chance(c->srv, c->srv->cfg.drop_reply_percent)) {
        /* Fault injection: handled (applied), its reply lost on the way back. */
        atomic_fetch_add(&c->srv->replies_dropped, 1);
        call_finish(c, true);
        return;
    }
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
        if (!rpc_validate(c)) {
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
        if (rpcs_fault_chance(s, s->cfg.drop_percent)) {
            /* Fault injection: lost on the way in; the client's REQ socket resends it. */
            atomic_fetch_add(&s->dropped, 1);
            rpcs_free_request(c);
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
        c->moved_to = -1;
        c->moved_applied = false;
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
    c->moved_to = -1;
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
    rpcs_server_init(s, cfg);
    if (cfg->drop_percent > 0 || cfg->dup_percent > 0 || cfg->drop_reply_percent > 0)
        log_warn("fault injection (tests only): dropping %d%% of requests, handling %d%% twice, "
                 "dropping %d%% of push replies after applying",
                 cfg->drop_percent, cfg->dup_percent, cfg->drop_reply_percent);
    int rv = nng_rep0_open(&s->sock);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open REP socket: %s", nng_strerror(rv));
        goto fail_sock;
    }
    /* Accept up to twice the limit at the transport, so that moderately oversized requests
     * get a RESOURCE_EXHAUSTED reply; beyond that nng closes the connection. */
    size_t transport_max = cfg->max_message > SIZE_MAX / 2 ? SIZE_MAX : cfg->max_message * 2;
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, transport_max);
    nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, rpc_conns_pipe_cb, &s->conns);
    nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, rpc_conns_pipe_cb, &s->conns);
    for (int i = 0; i < cfg->contexts; i++) {
        if (call_new(s) == NULL) {
            snprintf(err, errlen, "cannot create %d contexts", cfg->contexts);
            goto fail_close;
        }
    }
    s->nreceiving = cfg->contexts;
    if (rpc_tls_on(&cfg->tls))
        nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, rpc_auth_tls_pipe_cb, s);
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
    rpcs_server_free(s);
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
    if (s->cfg.drop_percent > 0 || s->cfg.dup_percent > 0 || s->cfg.drop_reply_percent > 0)
        log_info("fault injection: %llu requests dropped, %llu handled twice, %llu push replies "
                 "dropped after applying, of %llu received",
                 (unsigned long long)atomic_load(&s->dropped),
                 (unsigned long long)atomic_load(&s->duplicated),
                 (unsigned long long)atomic_load(&s->replies_dropped),
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
            rpcs_free_request(c);
            if (c->reply)
                nng_msg_free(c->reply);
            if (c->body)
                protobuf_c_message_free_unpacked(c->body, NULL);
            frame_fini(&c->f);
            free(c);
        }
        free(s->calls);
    }
    rpcs_server_free(s);
}
