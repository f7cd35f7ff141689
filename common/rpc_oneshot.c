/* rpc_oneshot.c - one request to a server by its address (rpc_oneshot.h). */
#include "rpc_oneshot.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frame.h"
#include "status.h"
#include "timeutil.h"

typedef struct oneshot {
    int method;
    uint8_t *body;
    size_t body_len;
    const void *seg;
    size_t seg_len;
    const char *token;
    rpc_oneshot_reply *out;
} oneshot;

static int oneshot_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    oneshot *k = arg;
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    env.method = k->method;
    env.deadline_ms = deadline_ms;
    env.worker_id = -1;
    env.body.data = k->body;
    env.body.len = k->body_len;
    if (k->token && k->token[0]) {
        env.auth_token.data = (uint8_t *)k->token;
        env.auth_token.len = strlen(k->token);
    }
    if (k->seg_len > 0) {
        tm.dtype = PSD__V1__DTYPE__FLOAT32;
        tm.count = k->seg_len / 4;
        env.tensor = &tm;
    }
    return frame_build(out, &env, k->seg, k->seg_len, NULL);
}

static void oneshot_done(void *arg, int status, const char *message, const frame *reply)
{
    oneshot *k = arg;
    k->out->status = status;
    snprintf(k->out->message, sizeof(k->out->message), "%s", message ? message : "");
    if (reply && reply->env) {
        k->out->moved_to = reply->env->moved_to;
        k->out->server_instance = reply->env->server_instance;
        if (reply->env->body.len > 0 && (k->out->body = malloc(reply->env->body.len)) != NULL) {
            memcpy(k->out->body, reply->env->body.data, reply->env->body.len);
            k->out->body_len = reply->env->body.len;
        }
    }
}

struct rpc_oneshot_call {
    rpc_conn *conn;
    oneshot k;
    rpc_waiter w;
};

int rpc_oneshot_start(const char *addr, const rpc_tls *tls, int method,
                      const ProtobufCMessage *body, const void *seg, size_t seg_len,
                      const char *token, uint32_t deadline_ms, rpc_oneshot_reply *out,
                      rpc_oneshot_call **call)
{
    memset(out, 0, sizeof(*out));
    *call = NULL;
    char url[600], turl[640];
    if (strstr(addr, "://"))
        snprintf(url, sizeof(url), "%s", addr);
    else
        snprintf(url, sizeof(url), "tcp://%s", addr);
    bool on = tls && rpc_tls_on(tls);
    if (rpc_tls_url(url, on, turl, sizeof(turl)) != 0) {
        snprintf(out->message, sizeof(out->message), "address too long: %s", addr);
        return out->status = STATUS_INVALID_ARGUMENT;
    }
    rpc_oneshot_call *oc = calloc(1, sizeof(*oc));
    size_t blen = body ? protobuf_c_message_get_packed_size(body) : 0;
    uint8_t *b = oc ? malloc(blen ? blen : 1) : NULL;
    if (b == NULL) {
        free(oc);
        snprintf(out->message, sizeof(out->message), "out of memory");
        return out->status = STATUS_RESOURCE_EXHAUSTED;
    }
    if (body)
        protobuf_c_message_pack(body, b);
    oc->k = (oneshot){.method = method,
                      .body = b,
                      .body_len = blen,
                      .seg = seg,
                      .seg_len = seg_len,
                      .token = token,
                      .out = out};
    rpc_conn_config cc = {
        .url = turl,
        .connections = 1,
        .max_message = (seg_len > (1u << 24) ? seg_len : (1u << 24)) + 65536,
        .label = addr,
        .fast_connect = true,
    };
    if (on)
        cc.tls = *tls;
    char err[512];
    if (rpc_conn_open(&oc->conn, &cc, err, sizeof(err)) != 0) {
        free(b);
        free(oc);
        snprintf(out->message, sizeof(out->message), "%s", err);
        return out->status = STATUS_UNAVAILABLE;
    }
    rpc_call_opts o = {
        .deadline_ms = deadline_ms, .retries = 20, .backoff_ms = 50, .max_backoff_ms = 1000};
    rpc_waiter_init(&oc->w, oneshot_build, oneshot_done, &oc->k);
    int rc = rpc_conn_call(oc->conn, &o, rpc_waiter_build, rpc_waiter_done, &oc->w);
    if (rc != 0) {
        rpc_waiter_abandon(&oc->w, rc);
        rpc_conn_close(oc->conn);
        free(b);
        free(oc);
        snprintf(out->message, sizeof(out->message), "%s", status_name(rc));
        return out->status = rc;
    }
    *call = oc;
    return STATUS_OK;
}

bool rpc_oneshot_wait(rpc_oneshot_call *c, uint32_t wait_ms)
{
    struct timespec until = time_deadline(CLOCK_REALTIME, wait_ms);
    pthread_mutex_lock(&c->w.m);
    while (!c->w.done && pthread_cond_timedwait(&c->w.c, &c->w.m, &until) == 0)
        ;
    bool done = c->w.done;
    pthread_mutex_unlock(&c->w.m);
    return done;
}

int rpc_oneshot_end(rpc_oneshot_call *c)
{
    rpc_oneshot_reply *out = c->k.out;
    rpc_conn_close(c->conn); /* a call still waiting completes with CANCELLED */
    int rc = rpc_waiter_wait(&c->w);
    free(c->k.body);
    free(c);
    if (rc != STATUS_OK && out->message[0] == '\0')
        snprintf(out->message, sizeof(out->message), "%s", status_name(rc));
    out->status = rc;
    return rc;
}

int rpc_oneshot(const char *addr, const rpc_tls *tls, int method, const ProtobufCMessage *body,
                const void *seg, size_t seg_len, const char *token, uint32_t deadline_ms,
                rpc_oneshot_reply *out)
{
    rpc_oneshot_call *c = NULL;
    int rc = rpc_oneshot_start(addr, tls, method, body, seg, seg_len, token, deadline_ms, out, &c);
    if (rc != STATUS_OK)
        return rc;
    while (!rpc_oneshot_wait(c, 60000))
        ;
    return rpc_oneshot_end(c);
}
