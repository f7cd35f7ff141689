/* rpc_oneshot.c - one request to a server by its address (rpc_oneshot.h). */
#include "rpc_oneshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "status.h"

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
        if (reply->env->body.len > 0 && (k->out->body = malloc(reply->env->body.len)) != NULL) {
            memcpy(k->out->body, reply->env->body.data, reply->env->body.len);
            k->out->body_len = reply->env->body.len;
        }
    }
}

int rpc_oneshot(const char *addr, const rpc_tls *tls, int method, const ProtobufCMessage *body,
                const void *seg, size_t seg_len, const char *token, uint32_t deadline_ms,
                rpc_oneshot_reply *out)
{
    memset(out, 0, sizeof(*out));
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
    oneshot k = {.method = method, .seg = seg, .seg_len = seg_len, .token = token, .out = out};
    k.body_len = body ? protobuf_c_message_get_packed_size(body) : 0;
    k.body = malloc(k.body_len ? k.body_len : 1);
    if (k.body == NULL) {
        snprintf(out->message, sizeof(out->message), "out of memory");
        return out->status = STATUS_RESOURCE_EXHAUSTED;
    }
    if (body)
        protobuf_c_message_pack(body, k.body);
    rpc_conn_config cc = {
        .url = turl,
        .connections = 1,
        .max_message = (seg_len > (1u << 24) ? seg_len : (1u << 24)) + 65536,
        .label = addr,
    };
    if (on)
        cc.tls = *tls;
    rpc_conn *c = NULL;
    char err[512];
    if (rpc_conn_open(&c, &cc, err, sizeof(err)) != 0) {
        free(k.body);
        snprintf(out->message, sizeof(out->message), "%s", err);
        return out->status = STATUS_UNAVAILABLE;
    }
    rpc_call_opts o = {
        .deadline_ms = deadline_ms, .retries = 20, .backoff_ms = 50, .max_backoff_ms = 1000};
    int rc = rpc_conn_call_wait(c, &o, oneshot_build, oneshot_done, &k);
    rpc_conn_close(c);
    free(k.body);
    if (rc != STATUS_OK && out->message[0] == '\0')
        snprintf(out->message, sizeof(out->message), "%s", status_name(rc));
    out->status = rc;
    return rc;
}
