/* What replication uses of the RPC server (rpc_server.h, rpc_local.h): references on a
 * received request that outlive its call (a primary forwards it to its group), and the
 * in-process server with no socket that runs request bytes through the same checks and
 * handlers (a replica applying its group's log; tests and fuzzing). */
#include "rpc_local.h"

#include <stdlib.h>
#include <string.h>

#include "rpc_server_internal.h"
#include "rpc_validate.h"
#include "status.h"
#include "timeutil.h"

/* ---- held requests ---- */

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

void rpcs_free_request(rpc_call *c)
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

/* ---- requests in memory, no socket ---- */

rpc_server *rpc_server_open_local(const rpc_server_config *cfg)
{
    rpc_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    rpc_server_config local = *cfg;
    /* No contexts and no room to park: rpc_call_defer never opens a context on the (absent)
     * socket, it refuses and the handler replies at once. */
    local.url = NULL;
    local.contexts = 0;
    local.max_parked = 0;
    local.threads = 0;
    local.max_connections = 0;
    local.max_per_connection = 0;
    local.drop_percent = 0;
    memset(&local.tls, 0, sizeof(local.tls));
    rpcs_server_init(s, &local);
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
    c->moved_to = -1;
    c->moved_applied = false;
    c->recv_ns = time_now_ns();
    atomic_fetch_add(&s->stats.requests, 1);
    atomic_fetch_add(&s->stats.bytes_in, c->len);
    if (rpc_validate(c)) {
        c->validated = true;
        bool twice = rpcs_fault_chance(s, s->cfg.dup_percent);
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
    rpcs_metrics_record(c, c->reply ? nng_msg_len(c->reply) : 0);
    frame_fini(&c->f);
    rpcs_free_request(c);
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
    rpcs_server_free(s);
}
