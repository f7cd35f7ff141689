#include "rpc_client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/protocol/reqrep0/req.h>

#include "status.h"
#include "timeutil.h"

enum req_state { REQ_IDLE, REQ_SEND, REQ_RECV, REQ_BACKOFF };

typedef struct rpc_req {
    rpc_conn *conn;
    int sock_index;
    nng_ctx ctx;
    nng_aio *aio;
    enum req_state state;
    uint64_t deadline_ns;
    int attempt;
    rpc_call_opts opts;
    rpc_build_fn build;
    rpc_done_fn done;
    void *arg;
    struct rpc_req *next_free;
} rpc_req;

struct rpc_conn {
    char url[256];
    size_t max_message;
    int nsocks;
    nng_socket *socks;
    atomic_uint next_sock;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    rpc_req *free_list;
    rpc_req **all; /* every request object ever made, to free at close */
    size_t nall, capall;
    int inflight;
    bool closing;
};

const char *rpc_conn_url(const rpc_conn *c)
{
    return c->url;
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
    char msg[384];
    int st = status_from_nng(rv);
    if (rv == NNG_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "no reply from %s within %u ms (server down or overloaded?)",
                 r->conn->url, r->opts.deadline_ms);
    else
        snprintf(msg, sizeof(msg), "transport error talking to %s: %s", r->conn->url,
                 nng_strerror(rv));
    req_finish(r, st, msg, NULL);
}

static void req_attempt(rpc_req *r)
{
    uint32_t left = ms_left(r);
    if (left == 0) {
        req_fail_nng(r, NNG_ETIMEDOUT);
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
    nng_aio_set_timeout(r->aio, (nng_duration)left);
    nng_ctx_send(r->ctx, r->aio);
}

static void req_cb(void *arg)
{
    rpc_req *r = arg;
    int rv = nng_aio_result(r->aio);
    switch (r->state) {
    case REQ_SEND:
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(r->aio));
            req_fail_nng(r, rv);
            return;
        }
        r->state = REQ_RECV;
        nng_aio_set_timeout(r->aio, (nng_duration)(ms_left(r) ? ms_left(r) : 1));
        nng_ctx_recv(r->ctx, r->aio);
        return;
    case REQ_RECV: {
        if (rv != 0) {
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
        if (f.env->status == STATUS_UNAVAILABLE && r->attempt < r->opts.retries) {
            uint32_t backoff = r->opts.backoff_ms << (r->attempt < 16 ? r->attempt : 16);
            frame_fini(&f);
            nng_msg_free(m);
            if (backoff < ms_left(r)) {
                r->attempt++;
                r->state = REQ_BACKOFF;
                nng_sleep_aio((nng_duration)backoff, r->aio);
                return;
            }
            req_finish(r, STATUS_UNAVAILABLE, "server unavailable and no time left to retry", NULL);
            return;
        }
        rpc_done_fn done = r->done;
        void *darg = r->arg;
        /* Release first: the callback may start follow-up calls on this connection. */
        req_release(r);
        done(darg, f.env->status, f.env->message ? f.env->message : "", &f);
        frame_fini(&f);
        nng_msg_free(m);
        return;
    }
    case REQ_BACKOFF:
        if (rv != 0 && rv != NNG_ETIMEDOUT) {
            req_fail_nng(r, rv);
            return;
        }
        req_attempt(r);
        return;
    case REQ_IDLE:
        return;
    }
}

int rpc_conn_open(rpc_conn **out, const rpc_conn_config *cfg, char *err, size_t errlen)
{
    rpc_conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(c->url, sizeof(c->url), "%s", cfg->url);
    c->max_message = cfg->max_message;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    c->socks = calloc((size_t)cfg->connections, sizeof(nng_socket));
    if (c->socks == NULL) {
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
        nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 20);
        nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 1000);
        rv = nng_dial(s, cfg->url, NULL, NNG_FLAG_NONBLOCK);
        if (rv != 0) {
            snprintf(err, errlen, "cannot dial %s: %s", cfg->url, nng_strerror(rv));
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    rpc_conn_close(c);
    return -1;
}

void rpc_conn_close(rpc_conn *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->nsocks; i++)
        nng_close(c->socks[i]);
    pthread_mutex_lock(&c->lock);
    while (c->inflight > 0)
        pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < c->nall; i++) {
        nng_aio_stop(c->all[i]->aio);
        nng_aio_free(c->all[i]->aio);
        free(c->all[i]);
    }
    free(c->all);
    free(c->socks);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->idle);
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
    if (nng_aio_alloc(&r->aio, req_cb, r) != 0) {
        free(r);
        return NULL;
    }
    if (nng_ctx_open(&r->ctx, c->socks[want]) != 0) {
        nng_aio_free(r->aio);
        free(r);
        return NULL;
    }
    c->all[c->nall++] = r;
    return r;
}

int rpc_conn_call(rpc_conn *c, const rpc_call_opts *o, rpc_build_fn build, rpc_done_fn done,
                  void *arg)
{
    int want = (int)(atomic_fetch_add(&c->next_sock, 1) % (unsigned)c->nsocks);
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
    pthread_mutex_unlock(&c->lock);
    r->opts = *o;
    r->attempt = 0;
    r->build = build;
    r->done = done;
    r->arg = arg;
    r->deadline_ns = time_now_ns() + (uint64_t)o->deadline_ms * 1000000u;
    req_attempt(r);
    return 0;
}
