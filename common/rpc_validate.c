/* The generic checks every request passes before its handler (rpc_validate.h). */
#include "rpc_validate.h"

#include <stdio.h>

#include "rpc_auth.h"
#include "rpc_server_internal.h"
#include "status.h"
#include "timeutil.h"

static const rpc_method *find_method(const rpc_server *s, int method)
{
    for (size_t i = 0; i < s->cfg.n_methods; i++)
        if (s->cfg.methods[i].method == method)
            return &s->cfg.methods[i];
    return NULL;
}

/* Counts c in its connection's requests in progress (max_per_connection); false when that is
 * at the limit. */
static bool admit(rpc_call *c)
{
    c->pipe = c->req ? (uint32_t)nng_pipe_id(nng_msg_get_pipe(c->req)) : 0;
    return rpc_conns_admit(&c->srv->conns, c->pipe, &c->counted);
}

/* As Redis' processCommand. */
bool rpc_validate(rpc_call *c)
{
    rpc_server *s = c->srv;
    char err[512];
    size_t len = c->len;
    if (len > s->cfg.max_message) {
        snprintf(err, sizeof(err), "message of %zu bytes exceeds max-message-bytes (%zu)", len,
                 s->cfg.max_message);
        rpcs_log_bad_request(c, STATUS_RESOURCE_EXHAUSTED, err);
        rpcs_set_reply(c, STATUS_RESOURCE_EXHAUSTED, err, NULL, NULL, NULL);
        return false;
    }
    int st = frame_parse_bytes(c->data, c->len, &c->f, err, sizeof(err));
    if (st != STATUS_OK) {
        rpcs_log_bad_request(c, st, err);
        rpcs_set_reply(c, st, err, NULL, NULL, NULL);
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
        rpcs_log_bad_request(c, STATUS_UNIMPLEMENTED, "unknown method");
        return false;
    }
    if (s->cfg.max_per_connection > 0 && !admit(c)) {
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
    if ((fl & RPC_ADMIN) && !c->srv->cfg.trusted && !rpc_auth_check_admin(c))
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
