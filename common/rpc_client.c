#include "rpc_client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/protocol/reqrep0/req.h>

#include "log.h"
#include "status.h"
#include "timeutil.h"

/* A call without a reply this long is logged, and again at the interval while it waits. */
#define WATCH_FIRST_NS 2000000000ull
#define WATCH_REPEAT_NS 5000000000ull
#define WATCH_TICK_MS 250

enum req_state { REQ_IDLE, REQ_SEND, REQ_RECV, REQ_BACKOFF };

typedef struct rpc_req {
    rpc_conn *conn;
    int sock_index;
    nng_ctx ctx;
    nng_aio *aio;
    enum req_state state;
    uint64_t deadline_ns;
    int attempt;
    uint64_t busy_since_ns; /* start of the call in progress, 0 when idle (conn lock) */
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
    pthread_mutex_t lock;
    pthread_cond_t idle;
    rpc_req *free_list;
    rpc_req **all; /* every request object ever made, to free at close */
    size_t nall, capall;
    int inflight;
    bool closing;
    bool watching;
    pthread_t watcher;
    pthread_cond_t watch_cond;
    uint64_t logged_ns; /* last "waiting for" line of the current episode, 0 if none */
};

/* "ps 0 (tcp://host:port)" or the URL alone. */
static void conn_name(const rpc_conn *c, char *buf, size_t cap)
{
    if (c->label[0])
        snprintf(buf, cap, "%s (%s)", c->label, c->url);
    else
        snprintf(buf, cap, "%s", c->url);
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
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
    return (uint32_t)(b + (half > 0 ? splitmix64(rng) % (half + 1) : 0));
}

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
    char msg[700], name[340];
    conn_name(r->conn, name, sizeof(name));
    int st = status_from_nng(rv);
    if (rv == NNG_ETIMEDOUT)
        snprintf(msg, sizeof(msg), "no reply from %s within the deadline of %u ms (%s)", name,
                 r->opts.deadline_ms,
                 r->last_err[0] ? r->last_err : "server down, stopped or overloaded?");
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
    r->state = REQ_BACKOFF;
    nng_sleep_aio((nng_duration)b, r->aio);
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
            if (retryable_nng(r->conn, rv)) {
                req_retry(r, STATUS_UNAVAILABLE, nng_strerror(rv));
                return;
            }
            req_fail_nng(r, rv);
            return;
        }
        r->state = REQ_RECV;
        nng_aio_set_timeout(r->aio, (nng_duration)(ms_left(r) ? ms_left(r) : 1));
        nng_ctx_recv(r->ctx, r->aio);
        return;
    case REQ_RECV: {
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

/* Logs calls of this connection that wait long for a reply: one line for all of them, when
 * the oldest has waited WATCH_FIRST_NS and then every WATCH_REPEAT_NS while any still waits. */
static void *watch_main(void *arg)
{
    rpc_conn *c = arg;
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
            c->logged_ns = 0;
            continue;
        }
        if (c->logged_ns != 0 && now - c->logged_ns < WATCH_REPEAT_NS)
            continue;
        c->logged_ns = now;
        pthread_mutex_unlock(&c->lock);
        log_warn("waiting for %s at %s: %d call(s) without a reply for %.1f s, %.1f s left of "
                 "the %.1f s deadline (server down, stopped, restarting or overloaded?)",
                 c->label[0] ? c->label : "server", c->url, waiting, (double)oldest / 1e9,
                 (double)least_left / 1e9, (double)deadline_ms / 1e3);
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
    c->max_message = cfg->max_message;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->idle, NULL);
    pthread_cond_init(&c->watch_cond, NULL);
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
    rpc_conn_close(c);
    return -1;
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
    r->opts = *o;
    r->attempt = 0;
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
