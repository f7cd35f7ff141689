/* libpsclient's client (psclient.h): opening and closing the connections to the cluster, its
 * settings, per-group sequence numbers, heartbeats, and the calls and errors every operation
 * shares; variables are in variables.c, their operations in ops.c, steps in step.c, tables in
 * tables.c. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "client_internal.h"
#include "cluster.h"
#include "log.h"
#include "placement.h"
#include "status.h"
#include "timeutil.h"

_Static_assert((int)PS_INVALID_ARGUMENT == (int)STATUS_INVALID_ARGUMENT, "status codes must match");
_Static_assert((int)PS_UNAUTHENTICATED == (int)STATUS_UNAUTHENTICATED, "status codes must match");

/* ---- errors ------------------------------------------------------------------------------ */

static _Thread_local char last_error[512];

const char *ps_strerror(int status)
{
    return status_name(status);
}

const char *ps_last_error(void)
{
    return last_error;
}

const char *ps_version(void)
{
    return PSD_VERSION;
}

int client_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return status;
}

static void clear_error(void)
{
    last_error[0] = '\0';
}

static void *heartbeat_main(void *arg);

/* ---- configuration ----------------------------------------------------------------------- */

struct ps_config {
    options *opts;
};

int ps_config_create(ps_config **out)
{
    ps_config *cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL || options_create(&cfg->opts, OPT_SCOPE_CLIENT) != 0) {
        free(cfg);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    *out = cfg;
    return PS_OK;
}

void ps_config_destroy(ps_config *cfg)
{
    if (cfg == NULL)
        return;
    options_destroy(cfg->opts);
    free(cfg);
}

int ps_config_set(ps_config *cfg, const char *name, const char *value)
{
    char err[400];
    if (cfg == NULL || name == NULL || value == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_config_set: NULL argument");
    if (options_set(cfg->opts, name, value, err, sizeof(err)) != 0)
        return client_fail(PS_INVALID_ARGUMENT, "%s", err);
    return PS_OK;
}

int ps_config_load_env(ps_config *cfg)
{
    char err[400];
    if (cfg == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_config_load_env: NULL config");
    if (options_load_env(cfg->opts, err, sizeof(err)) != 0)
        return client_fail(PS_INVALID_ARGUMENT, "%s", err);
    return PS_OK;
}

/* ---- connection -------------------------------------------------------------------------- */

int ps_client_open(ps_client **out, const ps_config *cfg)
{
    clear_error();
    char err[512];
    if (out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_client_open: NULL out");
    *out = NULL;
    ps_config *own = NULL;
    if (cfg == NULL) {
        int rc = ps_config_create(&own);
        if (rc == PS_OK)
            rc = ps_config_load_env(own);
        if (rc != PS_OK) {
            ps_config_destroy(own);
            return rc;
        }
        cfg = own;
    }
    ps_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        ps_config_destroy(own);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->ack_lock, NULL);
    pthread_cond_init(&c->heartbeat_cond, NULL);
    cluster_spec cl;
    memset(&cl, 0, sizeof(cl));
    if (cluster_from_options(cfg->opts, &cl, err, sizeof(err)) != 0) {
        ps_config_destroy(own);
        ps_client_close(c);
        return client_fail(PS_INVALID_ARGUMENT, "bad cluster spec: %s", err);
    }
    const options *o = cfg->opts;
    c->call.deadline_ms = (uint32_t)opt_int(o, OPT_DEADLINE_MS);
    c->call.retries = (int)opt_int(o, OPT_RETRIES);
    c->call.backoff_ms = (uint32_t)opt_int(o, OPT_RETRY_BACKOFF_MS);
    c->call.max_backoff_ms = (uint32_t)opt_int(o, OPT_RETRY_MAX_BACKOFF_MS);
    c->chunk_elems = (uint64_t)opt_int(o, OPT_CHUNK_BYTES) / sizeof(float);
    if (c->chunk_elems == 0)
        c->chunk_elems = 1;
    c->wire_dtype = strcmp(opt_enum(o, OPT_WIRE_DTYPE), "bfloat16") == 0 ? PSD__V1__DTYPE__BFLOAT16
                                                                         : PSD__V1__DTYPE__FLOAT32;
    c->split_threshold = (uint64_t)opt_int(o, OPT_SPLIT_THRESHOLD_BYTES);
    c->split_parts = opt_bool(o, OPT_SPLIT_PARTS);
    c->max_message = (size_t)opt_int(o, OPT_MAX_MESSAGE_BYTES);
    /* A chunk and its envelope must fit in a message (servers refuse larger pulls). */
    if (c->chunk_elems * sizeof(float) + 1024 > c->max_message)
        c->chunk_elems = (c->max_message - 1024) / sizeof(float);
    int64_t wid = opt_int(o, OPT_WORKER_ID);
    if (wid < 0 && (strcmp(cl.task_type, "worker") == 0 || strcmp(cl.task_type, "chief") == 0)) {
        /* The chief is worker 0 when there is one; workers follow it. */
        wid = cl.task_index;
        if (strcmp(cl.task_type, "worker") == 0 && cl.n_chief > 0)
            wid += (int64_t)cl.n_chief;
    }
    c->worker_id = (int32_t)wid;
    /* A program that set up no logging of its own (Python, a plain C program) gets the client's
     * log-level, log-format and identity: its task in the spec, else its worker id. */
    log_level lvl = LOG_INFO;
    log_format fmt = LOG_FORMAT_AUTO;
    log_level_parse(opt_enum(o, OPT_LOG_LEVEL), &lvl);
    log_format_parse(opt_enum(o, OPT_LOG_FORMAT), &fmt);
    if (cl.task_type[0])
        log_adopt(cl.task_type, cl.task_index, lvl, fmt);
    else
        log_adopt(wid >= 0 ? "worker" : "client", wid >= 0 ? (int)wid : -1, lvl, fmt);
    const char *token_file = opt_str(o, OPT_ADMIN_TOKEN_FILE);
    if (token_file && token_file[0] &&
        rpc_read_token(token_file, c->admin_token, sizeof(c->admin_token), err, sizeof(err)) != 0) {
        cluster_fini(&cl);
        ps_config_destroy(own);
        ps_client_close(c);
        return client_fail(PS_INVALID_ARGUMENT, "%s", err);
    }
    rpc_tls tls = {
        .ca = opt_str(o, OPT_TLS_CA),
        .cert = opt_str(o, OPT_TLS_CERT),
        .key = opt_str(o, OPT_TLS_KEY),
        .server_name = opt_str(o, OPT_TLS_SERVER_NAME),
        .engine = opt_enum(o, OPT_TLS_ENGINE),
    };
    if (getrandom(&c->client_id, sizeof(c->client_id), 0) != sizeof(c->client_id))
        c->client_id = time_now_ns() ^ ((uint64_t)getpid() << 32);
    c->nservers = (int)cl.n_ps;
    /* Room for servers that join (slots move to them) when the slot map is in etcd. */
    const char *coord = opt_str(o, OPT_COORDINATOR);
    bool may_grow = opt_int(o, OPT_REPLICAS) <= 1 && coord && coord[0];
    c->cap_servers = may_grow && cl.n_ps < SLOTS_MAX_SERVERS ? SLOTS_MAX_SERVERS : (int)cl.n_ps;
    atomic_init(&c->nreach, (int)cl.n_ps);
    c->servers = calloc((size_t)c->cap_servers, sizeof(*c->servers));
    c->route = calloc((size_t)c->cap_servers, sizeof(*c->route));
    c->next_seq = calloc((size_t)c->cap_servers, sizeof(*c->next_seq));
    for (int i = 0; c->route && i < c->cap_servers; i++)
        atomic_init(&c->route[i], i);
    /* Every group's sequence numbers start at the wall clock in ns, not at 1: a server that had
     * to forget evicted clients refuses an unknown client's pushes up to a floor made of their
     * highest seqs (server/dedup.h), and a client opened later starts above any seq they
     * reached. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; c->next_seq && i < c->cap_servers; i++)
        atomic_init(&c->next_seq[i], (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec);
    c->tls_ca = strdup(tls.ca ? tls.ca : "");
    c->tls_cert = strdup(tls.cert ? tls.cert : "");
    c->tls_key = strdup(tls.key ? tls.key : "");
    c->tls_name = strdup(tls.server_name ? tls.server_name : "");
    if (c->servers == NULL || c->route == NULL || c->next_seq == NULL) {
        cluster_fini(&cl);
        ps_config_destroy(own);
        ps_client_close(c);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    c->heartbeat_ms = (uint32_t)opt_int(o, OPT_HEARTBEAT_MS);
    c->replicated = opt_int(o, OPT_REPLICAS) > 1;
    int slots_rc = client_slots_load(c, o, &cl);
    if (slots_rc != PS_OK) {
        cluster_fini(&cl);
        ps_config_destroy(own);
        ps_client_close(c);
        return slots_rc;
    }
    bool heartbeats = c->worker_id >= 0 && c->heartbeat_ms > 0;
    if (heartbeats) {
        /* For the servers that may join too (their connection made when they do). */
        c->hb_conns = calloc((size_t)c->cap_servers, sizeof(*c->hb_conns));
        c->hb = calloc((size_t)c->cap_servers, sizeof(*c->hb));
        if (c->hb_conns == NULL || c->hb == NULL) {
            cluster_fini(&cl);
            ps_config_destroy(own);
            ps_client_close(c);
            return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
        }
        for (int i = 0; i < c->cap_servers; i++) {
            c->hb[i].c = c;
            c->hb[i].server = (int)i;
            pthread_mutex_init(&c->hb[i].lock, NULL);
        }
    }
    for (size_t i = 0; i < cl.n_ps; i++) {
        char plain[300], url[310], label[32];
        snprintf(label, sizeof(label), "ps %zu", i);
        if (cluster_is_ipc(cl.ps[i]) && rpc_tls_on(&tls)) {
            cluster_fini(&cl);
            ps_config_destroy(own);
            ps_client_close(c);
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps %zu: ipc:// addresses are local-only and cannot use TLS; unset "
                               "the TLS settings or use host:port",
                               i);
        }
        if (cluster_url(cl.ps[i], plain, sizeof(plain)) != 0 ||
            rpc_tls_url(plain, rpc_tls_on(&tls), url, sizeof(url)) != 0) {
            cluster_fini(&cl);
            ps_config_destroy(own);
            ps_client_close(c);
            return client_fail(PS_INVALID_ARGUMENT, "cluster address too long");
        }
        rpc_conn_config rc = {
            .url = url,
            .connections = (int)opt_int(o, OPT_CONNECTIONS),
            .resend_ms = (uint32_t)opt_int(o, OPT_RESEND_MS),
            .max_message = c->max_message,
            .label = label,
            .watch = 1,
            .tls = tls,
            /* a call waiting long: what the heartbeats say about it */
            .hint = heartbeats ? client_wait_hint : NULL,
            .hint_arg = heartbeats ? &c->hb[i] : NULL,
        };
        if (i == 0) { /* a joining server's connection is made the same way */
            c->conn_cfg = rc;
            c->conn_cfg.url = NULL;
            c->conn_cfg.label = NULL;
            c->conn_cfg.hint = NULL;
            c->conn_cfg.hint_arg = NULL;
            c->conn_cfg.tls.ca = c->tls_ca;
            c->conn_cfg.tls.cert = c->tls_cert;
            c->conn_cfg.tls.key = c->tls_key;
            c->conn_cfg.tls.server_name = c->tls_name;
        }
        if (rpc_conn_open(&c->servers[i], &rc, err, sizeof(err)) != 0) {
            cluster_fini(&cl);
            ps_config_destroy(own);
            ps_client_close(c);
            return client_fail(PS_UNAVAILABLE, "ps %zu: %s", i, err);
        }
        if (heartbeats) {
            rc.connections = 1;
            rc.watch = 0; /* the data calls' wait is what a user needs to hear about */
            rc.hint = NULL;
            if (rpc_conn_open(&c->hb_conns[i], &rc, err, sizeof(err)) != 0) {
                cluster_fini(&cl);
                ps_config_destroy(own);
                ps_client_close(c);
                return client_fail(PS_UNAVAILABLE, "ps %zu (heartbeats): %s", i, err);
            }
        }
    }
    cluster_fini(&cl);
    ps_config_destroy(own);
    if ((slots_rc = client_slots_connect(c)) != PS_OK) {
        ps_client_close(c);
        return slots_rc;
    }
    if (heartbeats) {
        int rv = pthread_create(&c->heartbeat, NULL, heartbeat_main, c);
        if (rv != 0) {
            ps_client_close(c);
            return client_fail(PS_RESOURCE_EXHAUSTED, "cannot start the heartbeat thread: %s",
                               strerror(rv));
        }
        c->heartbeat_running = true;
    }
    *out = c;
    return PS_OK;
}

void ps_client_close(ps_client *c)
{
    if (c == NULL)
        return;
    if (c->heartbeat_running) {
        pthread_mutex_lock(&c->lock);
        c->closing = true;
        pthread_cond_broadcast(&c->heartbeat_cond);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->heartbeat, NULL);
    }
    atomic_store(&c->conns_closing, true);
    for (int i = 0; c->hb_conns && i < c->cap_servers; i++)
        if (c->hb_conns[i])
            rpc_conn_close(c->hb_conns[i]);
    free(c->hb_conns);
    for (int i = 0; c->servers && i < client_reach(c); i++)
        rpc_conn_close(c->servers[i]); /* their watchers read c->hb (client_wait_hint) */
    free(c->tls_ca);
    free(c->tls_cert);
    free(c->tls_key);
    free(c->tls_name);
    free(c->servers);
    client_slots_free(c);
    free(c->route);
    free(c->next_seq);
    for (int i = 0; c->hb && i < c->cap_servers; i++)
        pthread_mutex_destroy(&c->hb[i].lock);
    free(c->hb);
    for (size_t i = 0; i < c->nvars; i++) {
        free(c->vars[i]->name);
        for (int s = 0; c->vars[i]->ack && s < c->nservers; s++)
            var_ack_free(&c->vars[i]->ack[s]);
        free(c->vars[i]->ack);
        free(c->vars[i]);
    }
    free(c->vars);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->ack_lock);
    pthread_cond_destroy(&c->heartbeat_cond);
    free(c);
}

int ps_client_num_servers(const ps_client *c)
{
    return c ? c->nservers : 0;
}

int64_t ps_client_clock(const ps_client *c)
{
    return c ? atomic_load(&c->clock) : 0;
}

uint64_t ps_client_lost_updates(const ps_client *c)
{
    return c ? atomic_load(&((ps_client *)c)->lost_updates) : 0;
}

/* ---- server restarts seen in push replies ------------------------------------------------- */

uint64_t ps_client_lost_pushes(const ps_client *c)
{
    return c ? atomic_load(&((ps_client *)c)->lost_pushes) : 0;
}

void client_note_push(ps_client *c, ps_var *v, int server, uint64_t instance, uint64_t version,
                      uint64_t restored_version)
{
    if (instance == 0 || server < 0 || server >= c->nservers)
        return; /* a server that does not say which process it is */
    ack_reply r = {.instance = instance,
                   .version = version,
                   .restored_version = restored_version,
                   .bsp = ps_var_staleness_bound(v) == 0,
                   .replicated = atomic_load(&c->view_epoch) != 0};
    ack_loss loss = {0};
    pthread_mutex_lock(&c->ack_lock);
    if (v->ack == NULL)
        v->ack = calloc((size_t)c->nservers, sizeof(*v->ack));
    if (v->ack)
        var_ack_note(&v->ack[server], &r, &loss);
    pthread_mutex_unlock(&c->ack_lock);
    if (loss.lost == 0)
        return;
    atomic_fetch_add(&c->lost_updates, loss.lost);
    atomic_fetch_add(&c->lost_pushes, loss.own_lost);
    if (r.replicated)
        log_warn("ps %d: the new primary of its group holds \"%s\" at version %llu, below the "
                 "%llu this client saw acknowledged: %llu acknowledged updates are lost (a lower "
                 "bound), %llu of them with this client's own pushes%s",
                 server, v->name, (unsigned long long)loss.kept, (unsigned long long)loss.acked,
                 (unsigned long long)loss.lost, (unsigned long long)loss.own_lost,
                 loss.own_bound ? " (at least)" : "");
    else
        log_warn("ps %d restarted (checkpoint version %llu): %llu acknowledged updates to \"%s\" "
                 "since it are lost (a lower bound: this client saw up to version %llu "
                 "acknowledged), %llu of them this client's own pushes%s",
                 server, (unsigned long long)restored_version, (unsigned long long)loss.lost,
                 v->name, (unsigned long long)loss.acked, (unsigned long long)loss.own_lost,
                 loss.own_bound ? " (at least)" : "");
}

/* ---- message building -------------------------------------------------------------------- */

uint64_t client_next_seq(ps_client *c, int server)
{
    return atomic_fetch_add(&c->next_seq[server], 1) + 1;
}

void client_envelope(ps_client *c, envelope *env, int method, uint32_t deadline_ms)
{
    psd__v1__envelope__init(env);
    env->method = method;
    env->request_id = atomic_fetch_add(&c->next_request, 1) + 1;
    env->deadline_ms = deadline_ms;
    env->worker_id = c->worker_id;
    env->client_id = c->client_id;
    env->clock = atomic_load(&c->clock);
    if (c->admin_token[0]) {
        env->auth_token.data = (uint8_t *)c->admin_token;
        env->auth_token.len = strlen(c->admin_token);
    }
}

int client_build(envelope *env, const ProtobufCMessage *body, const void *segment,
                 size_t segment_len, nng_msg **out)
{
    uint8_t *seg;
    int rv = client_build_segment(env, body, segment_len, &seg, out);
    if (rv == 0 && segment_len > 0)
        memcpy(seg, segment, segment_len);
    return rv;
}

int client_build_segment(envelope *env, const ProtobufCMessage *body, size_t segment_len,
                         uint8_t **segment, nng_msg **out)
{
    uint8_t stackbuf[1024];
    uint8_t *buf = stackbuf;
    if (body) {
        size_t n = protobuf_c_message_get_packed_size(body);
        if (n > sizeof(stackbuf) && (buf = malloc(n)) == NULL)
            return NNG_ENOMEM;
        protobuf_c_message_pack(body, buf);
        env->body.data = buf;
        env->body.len = n;
    }
    *segment = NULL;
    int rv = frame_build(out, env, NULL, segment_len, segment);
    if (buf != stackbuf)
        free(buf);
    return rv;
}

/* ---- unary calls (metadata): one request to each of a set of servers, wait for all ------- */

typedef struct unary_part {
    struct unary *u;
    int server;
    /* Envelope.request_id of every attempt of this part: a server tells a request sent again
     * (a Checkpoint asked again while the one it asked for is written) from a new one. */
    uint64_t request_id;
    int status;
    char message[400];
    ProtobufCMessage *reply;
} unary_part;

typedef struct unary {
    ps_client *c;
    int method;
    const ProtobufCMessage *request;
    const ProtobufCMessageDescriptor *reply_desc;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int pending;
} unary;

static int unary_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    unary_part *p = arg;
    envelope env;
    client_envelope(p->u->c, &env, p->u->method, deadline_ms);
    if (p->request_id == 0)
        p->request_id = env.request_id;
    env.request_id = p->request_id;
    return client_build(&env, p->u->request, NULL, 0, out);
}

static void unary_done(void *arg, int status, const char *message, const frame *reply)
{
    unary_part *p = arg;
    unary *u = p->u;
    p->status = status;
    snprintf(p->message, sizeof(p->message), "%s", message);
    if (status == STATUS_OK && reply) {
        p->reply = protobuf_c_message_unpack(u->reply_desc, NULL, reply->env->body.len,
                                             reply->env->body.data);
        if (p->reply == NULL) {
            p->status = STATUS_INTERNAL;
            snprintf(p->message, sizeof(p->message), "reply body does not decode as %s",
                     u->reply_desc->name);
        }
    }
    pthread_mutex_lock(&u->lock);
    if (--u->pending == 0)
        pthread_cond_signal(&u->cond);
    pthread_mutex_unlock(&u->lock);
}

int client_unary_opts(ps_client *c, const rpc_call_opts *opts, const int *servers, int nservers,
                      int method, const ProtobufCMessage *request,
                      const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **replies)
{
    unary u = {.c = c, .method = method, .request = request, .reply_desc = reply_desc};
    unary_part *parts = calloc((size_t)nservers, sizeof(*parts));
    if (parts == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_init(&u.lock, NULL);
    pthread_cond_init(&u.cond, NULL);
    for (int i = 0; i < nservers; i++) {
        parts[i].u = &u;
        parts[i].server = servers[i];
        pthread_mutex_lock(&u.lock);
        u.pending++;
        pthread_mutex_unlock(&u.lock);
        int rc = client_call(c, servers[i], opts, unary_build, unary_done, &parts[i]);
        if (rc != 0) {
            parts[i].status = rc;
            snprintf(parts[i].message, sizeof(parts[i].message), "cannot start the call");
            pthread_mutex_lock(&u.lock);
            u.pending--;
            pthread_mutex_unlock(&u.lock);
        }
    }
    pthread_mutex_lock(&u.lock);
    while (u.pending > 0)
        pthread_cond_wait(&u.cond, &u.lock);
    pthread_mutex_unlock(&u.lock);
    int status = PS_OK;
    for (int i = 0; i < nservers; i++) {
        replies[i] = parts[i].reply;
        if (parts[i].status != PS_OK && status == PS_OK)
            status = client_fail(parts[i].status, "ps %d: %s", parts[i].server, parts[i].message);
    }
    free(parts);
    pthread_mutex_destroy(&u.lock);
    pthread_cond_destroy(&u.cond);
    return status;
}

int client_unary(ps_client *c, const int *servers, int nservers, int method,
                 const ProtobufCMessage *request, const ProtobufCMessageDescriptor *reply_desc,
                 ProtobufCMessage **replies)
{
    return client_unary_opts(c, &c->call, servers, nservers, method, request, reply_desc, replies);
}

void client_free_replies(ProtobufCMessage **replies, int n)
{
    for (int i = 0; i < n; i++)
        if (replies[i])
            protobuf_c_message_free_unpacked(replies[i], NULL);
}

int client_all_servers(ps_client *c, int **out)
{
    int *s = malloc((size_t)c->nservers * sizeof(int));
    if (s == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < c->nservers; i++)
        s[i] = i;
    *out = s;
    return PS_OK;
}

/* ---- clock and cluster ------------------------------------------------------------------- */

/* A CLOCK request (finished: the worker's last, it leaves the barrier) to every server:
 * PS_OK or the failure. When the call succeeded and `given` is not NULL, *given is raised to
 * the highest clock a server answered with. */
static int clock_all_servers(ps_client *c, bool finished, int64_t *given)
{
    /* Every server reached: those of the spec and those that joined (slots moved there). */
    int n = client_reach(c);
    int *servers = calloc((size_t)n + 1, sizeof(int));
    if (servers == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n; i++)
        servers[i] = i;
    Psd__V1__ClockRequest req = PSD__V1__CLOCK_REQUEST__INIT;
    req.finished = finished;
    ProtobufCMessage **replies = calloc((size_t)n, sizeof(*replies));
    if (replies == NULL) {
        free(servers);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    int rc = client_unary(c, servers, (size_t)n, PSD__V1__METHOD__CLOCK, &req.base,
                          &psd__v1__clock_reply__descriptor, replies);
    for (int i = 0; given && rc == PS_OK && i < n; i++) {
        int64_t clock = ((const Psd__V1__ClockReply *)replies[i])->clock;
        if (clock > *given)
            *given = clock;
    }
    client_free_replies(replies, (size_t)n);
    free(replies);
    free(servers);
    return rc;
}

int ps_clock(ps_client *c, int64_t *clock_out)
{
    clear_error();
    if (c == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_clock: NULL client");
    if (c->worker_id < 0)
        return client_fail(PS_FAILED_PRECONDITION,
                           "ps_clock needs a worker id: run as a worker task or set worker-id");
    int64_t now = atomic_fetch_add(&c->clock, 1) + 1;
    /* A worker that was evicted continues from the clock the servers gave it. */
    int rc = clock_all_servers(c, false, &now);
    int64_t cur = atomic_load(&c->clock);
    while (now > cur && !atomic_compare_exchange_weak(&c->clock, &cur, now)) {
    }
    if (clock_out)
        *clock_out = atomic_load(&c->clock);
    return rc;
}

/* Background heartbeats: every heartbeat-ms a CLOCK carrying the current clock (the servers
 * never lower it) to each placement task whose previous heartbeat has completed, on the
 * heartbeat connections, with a short deadline and no retries; nothing waits for the replies.
 * In a replicated cluster each goes to the task's group's primary (route.c). */
static int hb_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    client_hb *h = arg;
    envelope env;
    client_envelope(h->c, &env, PSD__V1__METHOD__CLOCK, deadline_ms);
    Psd__V1__ClockRequest req = PSD__V1__CLOCK_REQUEST__INIT;
    return client_build(&env, &req.base, NULL, 0, out);
}

static void hb_done(void *arg, int status, const char *message, const frame *reply)
{
    (void)message;
    client_hb *h = arg;
    if (status == STATUS_OK && reply != NULL) {
        Psd__V1__ClockReply *r =
            psd__v1__clock_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        pthread_mutex_lock(&h->lock);
        h->answered_ns = time_now_ns();
        snprintf(h->parked_for, sizeof(h->parked_for), "%s",
                 r && r->parked_for ? r->parked_for : "");
        pthread_mutex_unlock(&h->lock);
        if (r)
            psd__v1__clock_reply__free_unpacked(r, NULL);
    }
    atomic_store(&h->busy, false);
}

bool client_wait_hint(void *arg, uint64_t since_ns, char *buf, size_t cap)
{
    client_hb *h = arg;
    pthread_mutex_lock(&h->lock);
    uint64_t age = time_now_ns() - h->answered_ns;
    /* Only a heartbeat answered while the call waits speaks for the server. */
    bool recent = h->answered_ns != 0 && h->answered_ns > since_ns;
    if (recent && h->parked_for[0])
        snprintf(buf, cap,
                 "ps %d is up and answers heartbeats: it holds the call at the staleness bound, "
                 "waiting for %s",
                 h->server, h->parked_for);
    else if (recent)
        snprintf(buf, cap,
                 "ps %d is up and answered a heartbeat %.1f s ago: the call is queued or slow "
                 "there (overloaded?)",
                 h->server, (double)age / 1e9);
    pthread_mutex_unlock(&h->lock);
    return recent;
}

int ps_worker_finished(ps_client *c)
{
    clear_error();
    if (c == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_worker_finished: NULL client");
    if (c->worker_id < 0)
        return client_fail(PS_FAILED_PRECONDITION,
                           "ps_worker_finished needs a worker id: run as a worker task or set "
                           "worker-id");
    /* Heartbeats first: one sent after the servers took the worker out would be a request
     * of the same client (harmless, but it would refresh a worker that has left). */
    pthread_mutex_lock(&c->lock);
    c->finished = true;
    pthread_mutex_unlock(&c->lock);
    return clock_all_servers(c, true, NULL);
}

static void *heartbeat_main(void *arg)
{
    ps_client *c = arg;
    rpc_call_opts o = {.deadline_ms = c->heartbeat_ms > 1000 ? c->heartbeat_ms : 1000,
                       .retries = 0,
                       .backoff_ms = 1};
    pthread_mutex_lock(&c->lock);
    while (!c->closing) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->heartbeat_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&c->heartbeat_cond, &c->lock, &ts);
        if (c->closing)
            break;
        if (c->finished)
            continue; /* left the barrier: nothing to keep alive */
        pthread_mutex_unlock(&c->lock);
        for (int i = 0, n = client_reach(c); i < n; i++) {
            client_hb *h = &c->hb[i];
            if (c->hb_conns[i] == NULL) /* a server that joined, not connected for them */
                continue;
            if (atomic_exchange(&h->busy, true))
                continue; /* the last one is still waiting for this server */
            /* To the group's primary (route.c), as data calls go: after a failover the
             * server that took the group over is the one that must hear from this worker. */
            if (client_call_on(c, c->hb_conns, i, &o, hb_build, hb_done, h) != 0)
                atomic_store(&h->busy, false);
        }
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* ServerStatus of one server for the public call `fn` (out: its output, checked for NULL),
 * asking for at most max_variables variables (0: the server's default): the reply in *reply
 * (client_free_replies) when PS_OK. */
static int server_status_call(ps_client *c, int server, const void *out, const char *fn,
                              uint32_t max_variables, ProtobufCMessage **reply)
{
    clear_error();
    if (c == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (server < 0 || server >= c->nservers)
        return client_fail(PS_INVALID_ARGUMENT, "server %d out of range: cluster has %d", server,
                           c->nservers);
    Psd__V1__ServerStatusRequest req = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    req.max_variables = max_variables;
    return client_unary(c, &server, 1, PSD__V1__METHOD__SERVER_STATUS, &req.base,
                        &psd__v1__server_status_reply__descriptor, reply);
}

int ps_server_status(ps_client *c, int server, ps_server_stats *out)
{
    ProtobufCMessage *reply = NULL;
    int rc = server_status_call(c, server, out, "ps_server_status", 0, &reply);
    if (rc == PS_OK) {
        const Psd__V1__ServerStatusReply *r = (const void *)reply;
        memset(out, 0, sizeof(*out));
        out->task_index = r->task_index;
        out->uptime_ms = r->uptime_ms;
        out->requests = r->requests;
        out->errors = r->errors;
        out->updates_applied = r->updates_applied;
        out->duplicates_dropped = r->duplicates_dropped;
        out->bytes_in = r->bytes_in;
        out->bytes_out = r->bytes_out;
        out->bytes_held = r->bytes_held;
        out->num_variables = (uint32_t)(r->num_variables ? r->num_variables : r->n_variables);
        out->min_clock = r->min_clock;
        out->evictions = r->evictions;
        for (size_t i = 0; i < r->n_workers; i++)
            out->live_workers += r->workers[i]->live;
        if (r->staleness)
            client_add_staleness(&out->staleness, r->staleness);
    }
    client_free_replies(&reply, 1);
    return rc;
}

int ps_server_checkpoint_status(ps_client *c, int server, ps_checkpoint_status *out)
{
    ProtobufCMessage *reply = NULL;
    /* max_variables 1: the counters are wanted, not the variables */
    int rc = server_status_call(c, server, out, "ps_server_checkpoint_status", 1, &reply);
    if (rc == PS_OK) {
        const Psd__V1__CheckpointStatus *k =
            ((const Psd__V1__ServerStatusReply *)reply)->checkpoint;
        memset(out, 0, sizeof(*out));
        if (k) {
            out->enabled = true;
            out->last_seq = k->last_seq;
            out->age_ms = k->age_ms;
            out->failures = k->failures;
            out->failures_in_row = k->failures_in_row;
            snprintf(out->last_error, sizeof(out->last_error), "%s",
                     k->last_error ? k->last_error : "");
        }
    }
    client_free_replies(&reply, 1);
    return rc;
}

int ps_cluster_workers_live(ps_client *c, int n, unsigned char *live)
{
    clear_error();
    if (c == NULL || live == NULL || n < 0)
        return client_fail(PS_INVALID_ARGUMENT, "ps_cluster_workers_live: bad argument");
    memset(live, 0, (size_t)n);
    for (int s = 0; s < c->nservers; s++) {
        Psd__V1__ServerStatusRequest req = PSD__V1__SERVER_STATUS_REQUEST__INIT;
        ProtobufCMessage *reply = NULL;
        int rc = client_unary(c, &s, 1, PSD__V1__METHOD__SERVER_STATUS, &req.base,
                              &psd__v1__server_status_reply__descriptor, &reply);
        if (rc != PS_OK)
            return rc;
        const Psd__V1__ServerStatusReply *r = (const void *)reply;
        for (size_t i = 0; i < r->n_workers; i++)
            if (r->workers[i]->live && r->workers[i]->id >= 0 && r->workers[i]->id < n)
                live[r->workers[i]->id] = 1;
        client_free_replies(&reply, 1);
    }
    return PS_OK;
}

void client_add_staleness(ps_staleness_stats *out, const Psd__V1__StalenessStats *s)
{
    if (s->max > out->max)
        out->max = s->max;
    out->pulls += s->pulls;
    out->waits += s->waits;
    out->wait_ms += s->wait_ms;
    out->timeouts += s->timeouts;
    for (size_t i = 0; i < s->n_histogram && i < PS_STALENESS_BUCKETS; i++)
        out->histogram[i] += s->histogram[i];
}

static int broadcast_empty(ps_client *c, int method, const ProtobufCMessage *req,
                           const ProtobufCMessageDescriptor *reply_desc)
{
    clear_error();
    if (c == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "NULL client");
    int *servers;
    int rc = client_all_servers(c, &servers);
    if (rc != PS_OK)
        return rc;
    ProtobufCMessage **replies = calloc((size_t)c->nservers, sizeof(*replies));
    if (replies == NULL) {
        free(servers);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    rc = client_unary(c, servers, c->nservers, method, req, reply_desc, replies);
    client_free_replies(replies, c->nservers);
    free(replies);
    free(servers);
    return rc;
}

int ps_checkpoint(ps_client *c)
{
    Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
    return broadcast_empty(c, PSD__V1__METHOD__CHECKPOINT, &req.base,
                           &psd__v1__checkpoint_reply__descriptor);
}

int ps_shutdown_cluster(ps_client *c)
{
    Psd__V1__ShutdownRequest req = PSD__V1__SHUTDOWN_REQUEST__INIT;
    return broadcast_empty(c, PSD__V1__METHOD__SHUTDOWN, &req.base,
                           &psd__v1__shutdown_reply__descriptor);
}
