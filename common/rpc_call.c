/* One RPC call (rpc_server_internal.h): the reply a handler sets and what it reads of the call,
 * and what every server, on a socket or in process, keeps of its own: its identity, the
 * metrics of its methods, the fault injection of tests, its locks and connection table. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "hash.h"
#include "log.h"
#include "metrics.h"
#include "rpc_server_internal.h"
#include "status.h"
#include "timeutil.h"
#include "util.h"

/* Metrics of one method, looked up once (metrics.h): requests by status, latency, bytes. */
struct rpc_method_metrics {
    const char *name;
    metric *latency, *bytes_in, *bytes_out;
    _Atomic(metric *) by_status[STATUS_COUNT];
};

static metric_family *fam_requests;

/* Makes the metrics of s's methods (s->mm; left NULL when out of memory: none recorded). */
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
        struct rpc_method_metrics *m = &s->mm[i];
        m->name = i < s->cfg.n_methods ? s->cfg.methods[i].name : "invalid";
        m->latency = metrics_series1(lat, m->name);
        m->bytes_in = metrics_series1(in, m->name);
        m->bytes_out = metrics_series1(out, m->name);
    }
}

void rpcs_metrics_record(rpc_call *c, size_t reply_len)
{
    rpc_server *s = c->srv;
    if (s->mm == NULL)
        return;
    size_t i = c->method ? (size_t)(c->method - s->cfg.methods) : s->cfg.n_methods;
    struct rpc_method_metrics *m = &s->mm[i];
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

void rpcs_server_init(rpc_server *s, const rpc_server_config *cfg)
{
    s->cfg = *cfg;
    if (getrandom(&s->instance, sizeof(s->instance), 0) != sizeof(s->instance))
        s->instance = time_now_ns() ^ ((uint64_t)getpid() << 40);
    if (s->instance == 0)
        s->instance = 1; /* 0 reads as "no instance" (a reply from an older server) */
    atomic_store(&s->fault_rng, s->instance);
    metrics_init(s);
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->qcond, NULL);
    rpc_conns_init(&s->conns, cfg->max_connections, cfg->max_per_connection);
}

void rpcs_server_free(rpc_server *s)
{
    rpc_conns_fini(&s->conns);
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->qcond);
    free(s->mm);
    free(s);
}

/* splitmix64 over a shared counter: thread-safe. */
bool rpcs_fault_chance(rpc_server *s, int percent)
{
    if (percent <= 0)
        return false;
    uint64_t z = atomic_fetch_add(&s->fault_rng, HASH_GOLDEN_GAMMA) + HASH_GOLDEN_GAMMA;
    return mix64(z) % 100 < (uint64_t)percent;
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

void rpcs_set_reply(rpc_call *c, int status, const char *message, const ProtobufCMessage *body,
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
    if (c->moved_to >= 0) {
        env.moved_to = (uint32_t)c->moved_to + 1;
        env.slots_version = c->slots_version;
        env.moved_applied = c->moved_applied;
    }
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
    rpcs_set_reply(c, status, msg, NULL, NULL, NULL);
}

void rpc_reply_ok(rpc_call *c, const ProtobufCMessage *body)
{
    rpcs_set_reply(c, STATUS_OK, "", body, NULL, NULL);
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
    rpcs_set_reply(c, STATUS_OK, "", body, &t, &seg);
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

void rpc_call_set_moved(rpc_call *c, uint32_t to, uint64_t version)
{
    c->moved_to = to;
    c->slots_version = version;
}

void rpc_call_set_moved_applied(rpc_call *c)
{
    c->moved_applied = true;
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

bool rpc_call_trusted(const rpc_call *c)
{
    return c->srv != NULL && c->srv->cfg.trusted;
}

/* As Redis does. */
void rpcs_log_bad_request(const rpc_call *c, int status, const char *why)
{
    const uint8_t *p = c->data;
    size_t n = c->len;
    char hex[3 * 16 + 1] = "";
    for (size_t i = 0; i < n && i < 16; i++)
        snprintf(hex + 3 * i, sizeof(hex) - 3 * i, "%02x ", p[i]);
    log_warn("bad request (%zu bytes, first: %s): %s: %s", n, hex, status_name(status), why);
}
