/* Pull, push and push-pull: an operation on a range of a variable is split by owning server
 * (by part and its slot's owner for a variable cut in parts) and then into chunks of
 * chunk-bytes; every part is in flight at once, each with its own
 * sequence number (pushes; from its server's stream, client_next_seq), and the operation
 * completes when the last part does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "placement.h"
#include "status.h"

enum op_kind { OP_PULL, OP_PUSH, OP_PUSH_PULL, OP_ASSIGN };

typedef struct op_part {
    ps_op *op;
    int server;
    uint64_t offset, count; /* in the variable's index space */
    uint64_t seq;
} op_part;

struct ps_op {
    ps_client *c;
    ps_var *var;
    enum op_kind kind;
    void *ext; /* a step's state (step.c), freed with ext_free by ps_op_destroy */
    void (*ext_free)(void *ext);
    void (*ext_complete)(void *ext, int status); /* runs before the waiters wake */
    uint64_t offset, count;
    float *dst;
    const float *grad;
    ps_done_fn cb;
    void *cb_arg;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int pending;
    bool done;
    int status;
    char message[512];
    size_t nparts;
    op_part parts[];
};

static const int op_method[] = {PSD__V1__METHOD__PULL, PSD__V1__METHOD__PUSH,
                                PSD__V1__METHOD__PUSH_PULL, PSD__V1__METHOD__ASSIGN};

static int part_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    op_part *p = arg;
    ps_op *op = p->op;
    envelope env;
    client_envelope(op->c, &env, op_method[op->kind], deadline_ms);
    env.seq = p->seq;
    /* Values to assign travel in float32 whatever wire-dtype says: they are parameters, not
     * gradients, and must arrive exactly. */
    int dtype = op->kind == OP_ASSIGN ? PSD__V1__DTYPE__FLOAT32 : op->c->wire_dtype;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = (Psd__V1__DType)dtype;
    t.offset = p->offset;
    t.count = p->count;
    env.tensor = &t;
    if (op->kind == OP_PULL) {
        Psd__V1__PullRequest req = PSD__V1__PULL_REQUEST__INIT;
        req.name = op->var->name;
        return client_build(&env, &req.base, NULL, 0, out);
    }
    Psd__V1__PushRequest req = PSD__V1__PUSH_REQUEST__INIT;
    req.name = op->var->name;
    const float *grad = op->grad + (p->offset - op->offset);
    if (dtype == PSD__V1__DTYPE__FLOAT32)
        return client_build(&env, &req.base, grad, (size_t)p->count * sizeof(float), out);
    uint8_t *seg;
    int rv = client_build_segment(&env, &req.base, (size_t)p->count * 2, &seg, out);
    if (rv == 0)
        frame_put_floats(seg, grad, (size_t)p->count, op->c->wire_dtype);
    return rv;
}

static void op_complete(ps_op *op)
{
    ps_done_fn cb = op->cb;
    if (op->ext_complete)
        op->ext_complete(op->ext, op->status);
    pthread_mutex_lock(&op->lock);
    op->done = true;
    pthread_cond_broadcast(&op->cond);
    pthread_mutex_unlock(&op->lock);
    /* After done is set, a waiter may destroy op unless a callback is pending: ps_op_destroy
     * waits for `pending` to reach -1, set below once the callback returned. */
    if (cb)
        cb(op, op->cb_arg);
    pthread_mutex_lock(&op->lock);
    op->pending = -1;
    pthread_cond_broadcast(&op->cond);
    pthread_mutex_unlock(&op->lock);
}

static void part_done(void *arg, int status, const char *message, const frame *reply)
{
    op_part *p = arg;
    ps_op *op = p->op;
    if (status == STATUS_OK && op->kind != OP_PULL && reply != NULL) {
        /* Acknowledged: remember the version, and notice a server that restarted. */
        Psd__V1__PushReply *r =
            psd__v1__push_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        if (r) {
            client_note_push(op->c, op->var, p->server, reply->env->server_instance, r->version,
                             r->restored_version);
            psd__v1__push_reply__free_unpacked(r, NULL);
        }
    }
    if (status == STATUS_OK && op->dst) {
        /* Pull and push-pull: the reply must carry exactly the range asked for. */
        if (reply == NULL || reply->env->tensor == NULL || !reply->has_segment ||
            reply->env->tensor->offset != p->offset || reply->env->tensor->count != p->count ||
            (int)reply->env->tensor->dtype != op->c->wire_dtype) {
            status = STATUS_INTERNAL;
            message = "reply does not carry the requested range";
        } else {
            frame_get_floats(op->dst + (p->offset - op->offset), reply->segment, (size_t)p->count,
                             op->c->wire_dtype);
        }
    }
    client_op_release(op, p->server, status, message);
}

ps_op *client_op_new(ps_client *c, size_t extra, ps_done_fn cb, void *arg)
{
    ps_op *op = calloc(1, sizeof(*op) + extra);
    if (op == NULL)
        return NULL;
    op->c = c;
    op->cb = cb;
    op->cb_arg = arg;
    op->pending = 1;
    pthread_mutex_init(&op->lock, NULL);
    pthread_cond_init(&op->cond, NULL);
    return op;
}

void client_op_set_ext(ps_op *op, void *ext, void (*ext_free)(void *ext),
                       void (*ext_complete)(void *ext, int status))
{
    op->ext = ext;
    op->ext_free = ext_free;
    op->ext_complete = ext_complete;
}

void client_op_hold(ps_op *op, int n)
{
    pthread_mutex_lock(&op->lock);
    op->pending += n;
    pthread_mutex_unlock(&op->lock);
}

void client_op_release(ps_op *op, int server, int status, const char *message)
{
    pthread_mutex_lock(&op->lock);
    if (status != STATUS_OK && op->status == STATUS_OK) {
        op->status = status;
        if (server >= 0)
            snprintf(op->message, sizeof(op->message), "ps %d: %s", server, message);
        else
            snprintf(op->message, sizeof(op->message), "%s", message);
    }
    bool last = --op->pending == 0;
    pthread_mutex_unlock(&op->lock);
    if (last)
        op_complete(op);
}

int client_op_status(ps_op *op)
{
    pthread_mutex_lock(&op->lock);
    int st = op->status;
    pthread_mutex_unlock(&op->lock);
    return st;
}

int client_op_fanout(ps_client *c, ps_done_fn cb, void *arg, void *ext, void (*ext_free)(void *ext),
                     void (*ext_complete)(void *ext, int status), size_t nparts,
                     void (*start)(void *ext, ps_op *op), ps_op **out_op)
{
    ps_op *op = client_op_new(c, 0, cb, arg);
    if (op == NULL) {
        ext_free(ext);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    client_op_set_ext(op, ext, ext_free, ext_complete);
    *out_op = op;
    /* The starter's hold (client_op_new's) keeps the op from completing (and being freed by a
     * callback) before every part is started. */
    client_op_hold(op, (int)nparts);
    start(ext, op);
    client_op_release(op, -1, STATUS_OK, "");
    return PS_OK;
}

/* Counts the parts of [offset, offset+count) on one server's range [lo, hi). */
static size_t parts_in(uint64_t offset, uint64_t count, uint64_t lo, uint64_t hi, uint64_t chunk)
{
    uint64_t a = offset > lo ? offset : lo;
    uint64_t b = offset + count < hi ? offset + count : hi;
    return b > a ? (size_t)((b - a + chunk - 1) / chunk) : 0;
}

static size_t add_parts(ps_op *op, size_t k, int server, uint64_t lo, uint64_t hi, uint64_t chunk)
{
    uint64_t a = op->offset > lo ? op->offset : lo;
    uint64_t b = op->offset + op->count < hi ? op->offset + op->count : hi;
    for (uint64_t x = a; x < b; x += chunk) {
        op_part *p = &op->parts[k++];
        p->op = op;
        p->server = server;
        p->offset = x;
        p->count = b - x < chunk ? b - x : chunk;
        if (op->kind != OP_PULL)
            p->seq = client_next_seq(op->c, server);
    }
    return k;
}

static int op_start(ps_client *c, ps_var *v, enum op_kind kind, uint64_t offset, uint64_t count,
                    const float *grad, float *dst, ps_done_fn cb, void *arg, ps_op **out)
{
    if (c == NULL || v == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "NULL client, variable or op");
    bool writes = kind == OP_PULL || kind == OP_PUSH_PULL;
    if ((writes && dst == NULL) || (kind != OP_PULL && grad == NULL))
        return client_fail(PS_INVALID_ARGUMENT, "NULL buffer for \"%s\"", v->name);
    if (offset > v->numel || count > v->numel - offset)
        return client_fail(PS_OUT_OF_RANGE,
                           "range [%llu, %llu+%llu) is outside \"%s\" of %llu elements",
                           (unsigned long long)offset, (unsigned long long)offset,
                           (unsigned long long)count, v->name, (unsigned long long)v->numel);
    uint64_t chunk = c->chunk_elems;
    size_t nparts = 0;
    /* A variable cut in parts: the parts [first_part, end_part) the range touches, each on
     * its slot's owner in the client's map now, cut in chunks inside the part. */
    uint64_t first_part = placement_part_of(offset);
    uint64_t end_part = count ? placement_part_of(offset + count - 1) + 1 : first_part;
    slot_map map = c->slots;
    if (v->parts) {
        for (uint64_t p = first_part; p < end_part; p++) {
            uint64_t lo, n;
            placement_part_range(v->numel, p, &lo, &n);
            nparts += parts_in(offset, count, lo, lo + n, chunk);
        }
    } else if (v->split) {
        for (uint32_t s = 0; s < v->nservers; s++) {
            uint64_t lo, n;
            placement_range(v->numel, v->nservers, s, &lo, &n);
            nparts += parts_in(offset, count, lo, lo + n, chunk);
        }
    } else {
        nparts = parts_in(offset, count, 0, v->numel, chunk);
    }
    ps_op *op = client_op_new(c, nparts * sizeof(op_part), cb, arg);
    if (op == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    op->var = v;
    op->kind = kind;
    op->offset = offset;
    op->count = count;
    op->dst = kind == OP_PUSH || kind == OP_ASSIGN ? NULL : dst;
    op->grad = grad;
    op->nparts = nparts;
    size_t k = 0;
    if (v->parts) {
        for (uint64_t p = first_part; p < end_part; p++) {
            uint64_t lo, n;
            placement_part_range(v->numel, p, &lo, &n);
            k = add_parts(op, k, client_part_owner(c, &map, v->name, p), lo, lo + n, chunk);
        }
    } else if (v->split) {
        for (uint32_t s = 0; s < v->nservers; s++) {
            uint64_t lo, n;
            placement_range(v->numel, v->nservers, s, &lo, &n);
            k = add_parts(op, k, (int)s, lo, lo + n, chunk);
        }
    } else {
        k = add_parts(op, k, (int)v->owner, 0, v->numel, chunk);
    }
    *out = op;
    /* pending counts the parts plus one for this function (client_op_new's), so that the
     * operation can't complete (and be freed by a callback) before every part is started. */
    client_op_hold(op, (int)nparts);
    for (size_t i = 0; i < nparts; i++) {
        int rc =
            client_call(c, op->parts[i].server, &c->call, part_build, part_done, &op->parts[i]);
        if (rc != 0)
            part_done(&op->parts[i], rc, "cannot start the request", NULL);
    }
    client_op_release(op, -1, STATUS_OK, "");
    return PS_OK;
}

int ps_pull_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, float *dst,
                  ps_done_fn cb, void *arg, ps_op **out_op)
{
    return op_start(c, v, OP_PULL, offset, count, NULL, dst, cb, arg, out_op);
}

int ps_push_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad,
                  ps_done_fn cb, void *arg, ps_op **out_op)
{
    return op_start(c, v, OP_PUSH, offset, count, grad, NULL, cb, arg, out_op);
}

int ps_push_pull_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad,
                       float *dst, ps_done_fn cb, void *arg, ps_op **out_op)
{
    return op_start(c, v, OP_PUSH_PULL, offset, count, grad, dst, cb, arg, out_op);
}

int ps_assign_async(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *values,
                    ps_done_fn cb, void *arg, ps_op **out_op)
{
    return op_start(c, v, OP_ASSIGN, offset, count, values, NULL, cb, arg, out_op);
}

int ps_op_wait(ps_op *op)
{
    if (op == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_op_wait: NULL op");
    pthread_mutex_lock(&op->lock);
    while (!op->done)
        pthread_cond_wait(&op->cond, &op->lock);
    pthread_mutex_unlock(&op->lock);
    if (op->status != PS_OK)
        return client_fail(op->status, "%s", op->message);
    return PS_OK;
}

bool ps_op_done(const ps_op *op)
{
    ps_op *m = (ps_op *)op;
    pthread_mutex_lock(&m->lock);
    bool d = m->done;
    pthread_mutex_unlock(&m->lock);
    return d;
}

int ps_op_status(const ps_op *op)
{
    return op->status;
}

const char *ps_op_message(const ps_op *op)
{
    return op->message;
}

void ps_op_destroy(ps_op *op)
{
    if (op == NULL)
        return;
    pthread_mutex_lock(&op->lock);
    while (op->pending != -1)
        pthread_cond_wait(&op->cond, &op->lock);
    pthread_mutex_unlock(&op->lock);
    pthread_mutex_destroy(&op->lock);
    pthread_cond_destroy(&op->cond);
    if (op->ext_free)
        op->ext_free(op->ext);
    free(op);
}

/* Blocking forms: start, wait, free. */
static int run_sync(ps_client *c, ps_var *v, enum op_kind kind, uint64_t offset, uint64_t count,
                    const float *grad, float *dst)
{
    ps_op *op;
    int rc = op_start(c, v, kind, offset, count, grad, dst, NULL, NULL, &op);
    if (rc != PS_OK)
        return rc;
    rc = ps_op_wait(op);
    ps_op_destroy(op);
    return rc;
}

int ps_pull(ps_client *c, ps_var *v, float *dst)
{
    return run_sync(c, v, OP_PULL, 0, v ? v->numel : 0, NULL, dst);
}

int ps_pull_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, float *dst)
{
    return run_sync(c, v, OP_PULL, offset, count, NULL, dst);
}

int ps_push(ps_client *c, ps_var *v, const float *grad)
{
    return run_sync(c, v, OP_PUSH, 0, v ? v->numel : 0, grad, NULL);
}

int ps_push_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad)
{
    return run_sync(c, v, OP_PUSH, offset, count, grad, NULL);
}

int ps_push_pull(ps_client *c, ps_var *v, const float *grad, float *dst)
{
    return run_sync(c, v, OP_PUSH_PULL, 0, v ? v->numel : 0, grad, dst);
}

int ps_push_pull_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *grad,
                       float *dst)
{
    return run_sync(c, v, OP_PUSH_PULL, offset, count, grad, dst);
}

int ps_assign(ps_client *c, ps_var *v, const float *values)
{
    return run_sync(c, v, OP_ASSIGN, 0, v ? v->numel : 0, values, NULL);
}

int ps_assign_range(ps_client *c, ps_var *v, uint64_t offset, uint64_t count, const float *values)
{
    return run_sync(c, v, OP_ASSIGN, offset, count, values, NULL);
}
