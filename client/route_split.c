/* A table request refused because some of its ids' slots moved (Envelope.moved_to), whose ids
 * the re-read slot map now places on several servers: cut by the new map, each piece sent to
 * its server with the same seq (the piece that stays under the key the request went with, each
 * other under a key of its own, slots_piece_client: the refusing server answers moved only
 * what its window proves unapplied), and answered to its caller as one call: a push OK when every
 * piece is, a pull's rows put back in the order asked. A piece refused again (a second move
 * meanwhile) follows that move as a call of its own would (route.c: redirected, or cut again). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "status.h"

typedef struct split_call split_call;

typedef struct split_piece {
    split_call *s;
    int server;
    uint64_t key;
    size_t n;
    size_t *at; /* [n]: each id's index in the refused request */
} split_piece;

struct split_call {
    envelope env; /* the refused request's, unpacked (frame f) */
    frame f;
    nng_msg *orig;
    bool push;
    Psd__V1__TablePushRequest *pr; /* the body (one of the two) */
    Psd__V1__TablePullRequest *lr;
    const char *name;
    size_t n, row_bytes; /* ids; a gradient's or a row's bytes */
    int dtype;
    uint8_t *rows; /* pull: n rows of row_bytes, in the order asked (at the first reply) */
    atomic_int left;
    atomic_int status;
    char message[600];
    pthread_mutex_t mu;
    rpc_done_fn done;
    void *arg;
    size_t npieces;
    split_piece pieces[];
};

static int piece_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    split_piece *p = arg;
    split_call *s = p->s;
    envelope env = *s->f.env;
    env.deadline_ms = deadline_ms; /* client_id: the route sets p->key */
    Psd__V1__TensorMeta tm = *s->f.env->tensor;
    size_t esize = frame_dtype_size(s->dtype);
    size_t seglen = p->n * 8 + (s->push ? p->n * s->row_bytes : 0);
    tm.count = seglen / esize;
    env.tensor = &tm;
    Psd__V1__TablePushRequest push = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    Psd__V1__TablePullRequest pull = PSD__V1__TABLE_PULL_REQUEST__INIT;
    push.name = pull.name = (char *)s->name;
    push.n = pull.n = p->n;
    uint8_t *seg;
    int rv = client_build_segment(&env, s->push ? &push.base : &pull.base, seglen, &seg, out);
    if (rv != 0)
        return rv;
    for (size_t k = 0; k < p->n; k++)
        memcpy(seg + 8 * k, s->f.segment + 8 * p->at[k], 8);
    if (s->push) {
        const uint8_t *g = s->f.segment + 8 * s->n;
        for (size_t k = 0; k < p->n; k++)
            memcpy(seg + 8 * p->n + k * s->row_bytes, g + p->at[k] * s->row_bytes, s->row_bytes);
    }
    return 0;
}

static void split_free(split_call *s)
{
    for (size_t i = 0; i < s->npieces; i++)
        free(s->pieces[i].at);
    free(s->rows);
    if (s->pr)
        psd__v1__table_push_request__free_unpacked(s->pr, NULL);
    if (s->lr)
        psd__v1__table_pull_request__free_unpacked(s->lr, NULL);
    frame_fini(&s->f);
    nng_msg_free(s->orig);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void split_release(split_call *s);

static void piece_done(void *arg, int status, const char *message, const frame *reply)
{
    split_piece *p = arg;
    split_call *s = p->s;
    if (status == STATUS_OK && !s->push) {
        /* A row's size: the first reply's, which every other must match. */
        pthread_mutex_lock(&s->mu);
        size_t rb = reply && reply->has_segment ? reply->segment_len / p->n : 0;
        if (s->rows == NULL && rb > 0 && reply->segment_len == p->n * rb) {
            s->row_bytes = rb;
            s->rows = malloc(s->n * rb);
        }
        if (s->rows == NULL || rb != s->row_bytes || reply->segment_len != p->n * rb) {
            status = STATUS_INTERNAL;
            message = "TablePull reply does not carry one row per id";
        } else {
            for (size_t k = 0; k < p->n; k++)
                memcpy(s->rows + p->at[k] * rb, reply->segment + k * rb, rb);
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (status != STATUS_OK) {
        pthread_mutex_lock(&s->mu);
        if (atomic_load(&s->status) == STATUS_OK) {
            atomic_store(&s->status, status);
            snprintf(s->message, sizeof(s->message), "ps %d: %s", p->server,
                     message ? message : "");
        }
        pthread_mutex_unlock(&s->mu);
    }
    split_release(s);
}

/* One piece (or the start's own count) done: the last one answers the caller. */
static void split_release(split_call *s)
{
    if (atomic_fetch_sub(&s->left, 1) != 1)
        return;
    int st = atomic_load(&s->status);
    if (st == STATUS_OK && !s->push) {
        envelope env = PSD__V1__ENVELOPE__INIT;
        Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
        tm.dtype = (Psd__V1__DType)s->dtype;
        tm.count = s->n * s->row_bytes / frame_dtype_size(s->dtype);
        env.tensor = &tm;
        env.is_reply = true;
        frame f = {.env = &env,
                   .segment = s->rows,
                   .segment_len = s->n * s->row_bytes,
                   .has_segment = true};
        s->done(s->arg, st, "", &f);
    } else {
        s->done(s->arg, st, st == STATUS_OK ? "" : s->message, NULL);
    }
    split_free(s);
}

int route_split_moved(ps_client *c, rpc_conn **conns, int refused_by, uint64_t key,
                      const rpc_call_opts *opts, rpc_build_fn build, void *build_arg,
                      rpc_done_fn done, void *arg)
{
    nng_msg *orig = NULL;
    if (build(build_arg, opts->deadline_ms, &orig) != 0)
        return -1;
    frame f;
    char err[128];
    if (frame_parse(orig, &f, err, sizeof(err)) != STATUS_OK) {
        nng_msg_free(orig);
        return -1;
    }
    int m = (int)f.env->method;
    bool push = m == PSD__V1__METHOD__TABLE_PUSH;
    const char *name = NULL;
    uint64_t n = 0;
    Psd__V1__TablePushRequest *pr = NULL;
    Psd__V1__TablePullRequest *lr = NULL;
    if (push && (pr = psd__v1__table_push_request__unpack(NULL, f.env->body.len,
                                                          f.env->body.data)) != NULL) {
        name = pr->name;
        n = pr->n;
    } else if (m == PSD__V1__METHOD__TABLE_PULL &&
               (lr = psd__v1__table_pull_request__unpack(NULL, f.env->body.len,
                                                         f.env->body.data)) != NULL) {
        name = lr->name;
        n = lr->n;
    }
    int dtype = f.env->tensor ? (int)f.env->tensor->dtype : 0;
    size_t esize = dtype ? frame_dtype_size(dtype) : 0;
    uint32_t *owner = NULL;
    split_call *s = NULL;
    int rc = -1;
    if (name == NULL || n == 0 || esize == 0 || !f.has_segment || f.segment_len < n * 8)
        goto out;
    /* A push's gradient rows follow the ids; a pull's row size comes with its replies. */
    size_t row_bytes = push ? (f.segment_len - n * 8) / n : 0;
    owner = malloc(n * sizeof(uint32_t));
    if (owner == NULL)
        goto out;
    slot_map map = c->slots;
    uint64_t version = c->slots_rec.version;
    size_t nsrv = 0;
    int reach = client_reach(c);
    int *count = calloc((size_t)reach, sizeof(int));
    if (count == NULL)
        goto out;
    for (uint64_t i = 0; i < n; i++) {
        int64_t id;
        memcpy(&id, f.segment + 8 * i, 8);
        owner[i] = slots_row_owner(&map, name, id);
        if (owner[i] >= (uint32_t)reach) {
            free(count);
            goto out;
        }
        nsrv += count[owner[i]]++ == 0;
    }
    if (nsrv < 2) { /* one server holds them all now: the caller redirects it whole */
        free(count);
        goto out;
    }
    s = calloc(1, sizeof(*s) + nsrv * sizeof(split_piece));
    if (s == NULL) {
        free(count);
        goto out;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->f = f;
    s->orig = orig;
    s->push = push;
    s->pr = pr;
    s->lr = lr;
    s->name = name;
    s->n = n;
    s->dtype = dtype;
    s->done = done;
    s->arg = arg;
    s->row_bytes = row_bytes;
    for (int srv = 0; srv < reach; srv++) {
        if (count[srv] == 0)
            continue;
        split_piece *p = &s->pieces[s->npieces++];
        p->s = s;
        p->server = srv;
        /* The server that refused it proved it unapplied (server/slot_gate.c): a piece that
         * leaves it goes under a key of its own, never one another piece of the same seq used
         * there, nor the one its window came under. */
        p->key = srv == refused_by
                     ? key
                     : slots_piece_client(slots_stream_client(key, (uint32_t)refused_by),
                                          f.env->seq, version, (uint32_t)srv);
        p->at = malloc((size_t)count[srv] * sizeof(size_t));
        if (p->at == NULL) {
            free(count);
            goto out;
        }
        for (uint64_t i = 0; i < n; i++)
            if ((int)owner[i] == srv)
                p->at[p->n++] = i;
    }
    free(count);
    rc = 0;
out:
    free(owner);
    if (rc != 0) {
        if (s) {
            for (size_t i = 0; i < s->npieces; i++)
                free(s->pieces[i].at);
            pthread_mutex_destroy(&s->mu);
            free(s);
        }
        if (pr)
            psd__v1__table_push_request__free_unpacked(pr, NULL);
        if (lr)
            psd__v1__table_pull_request__free_unpacked(lr, NULL);
        frame_fini(&f);
        nng_msg_free(orig);
        return -1;
    }
    /* Every piece in flight before any can finish the call. */
    atomic_store(&s->left, (int)s->npieces + 1);
    atomic_store(&s->status, STATUS_OK);
    for (size_t i = 0; i < s->npieces; i++) {
        split_piece *p = &s->pieces[i];
        int st = client_call_keyed(c, conns, p->server, opts, p->key, piece_build, piece_done, p);
        if (st != 0)
            piece_done(p, st, "could not start the call", NULL);
    }
    split_release(s); /* the start's own count */
    return 0;
}
