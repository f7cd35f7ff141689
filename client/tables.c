/* Sparse tables: create, lookup, pull, push and prefetch. A pull, push or prefetch splits its
 * ids by owning server (slots_row_owner), cuts each server's list into requests of at most
 * max_ids ids, sends them all at once and scatters the rows back into the caller's order. */
#include <stdatomic.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "id_dups.h"
#include "placement.h"
#include "spec_fields.h"
#include "status.h"

/* The server's limit of ids per request (server/server.h SERVER_TABLE_MAX_IDS). */
#define TABLE_MAX_IDS ((size_t)1 << 22)
/* Room left in a request or reply for the frame header and envelope. */
#define TABLE_ENVELOPE_ROOM 4096

void ps_table_spec_init(ps_table_spec *spec, const char *name, uint32_t dim, ps_optimizer opt)
{
    if (spec == NULL)
        return;
    memset(spec, 0, sizeof(*spec));
    spec->name = name;
    spec->dim = dim;
    spec->initializer = PS_INIT_ZEROS;
    spec->optimizer = opt;
    spec->staleness = PS_STALENESS_DEFAULT;
    spec->dtype = PS_FLOAT32;
    /* The optimizer's defaults: their rows of common/spec_fields.h, then the kind's own. */
#define PS_HPARAM_DEFAULT_(field, pt, wt, def) spec->field = (def);
    PS_SPEC_HPARAMS(PS_HPARAM_DEFAULT_)
    PS_TABLE_HPARAMS(PS_HPARAM_DEFAULT_)
#undef PS_HPARAM_DEFAULT_
#define PS_HPARAM_KIND_DEFAULT_(ID, field, def)                                                    \
    if (opt == PS_OPT_##ID)                                                                        \
        spec->field = (def);
    PS_HPARAM_KIND_DEFAULTS(PS_HPARAM_KIND_DEFAULT_)
#undef PS_HPARAM_KIND_DEFAULT_
}

static ps_table *table_new(ps_client *c, const char *name, uint32_t dim)
{
    ps_table *t = calloc(1, sizeof(*t));
    if (t == NULL || (t->name = strdup(name)) == NULL) {
        free(t);
        return NULL;
    }
    t->c = c;
    t->dim = dim;
    t->name_hash = placement_hash(name);
    return t;
}

void ps_table_free(ps_table *t)
{
    if (t == NULL)
        return;
    free(t->name);
    free(t);
}

uint32_t ps_table_dim(const ps_table *t)
{
    return t ? t->dim : 0;
}

size_t ps_table_max_ids(const ps_table *t)
{
    size_t per = 8 + (size_t)t->dim * sizeof(float);
    size_t room =
        t->c->max_message > TABLE_ENVELOPE_ROOM ? t->c->max_message - TABLE_ENVELOPE_ROOM : 0;
    size_t n = room / per;
    return n < TABLE_MAX_IDS ? n : TABLE_MAX_IDS;
}

int ps_table_create(ps_client *c, const ps_table_spec *spec, ps_table **out)
{
    if (c == NULL || spec == NULL || spec->name == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_create: NULL argument");
    if (strlen(spec->name) == 0 || strlen(spec->name) > PS_MAX_NAME)
        return client_fail(PS_INVALID_ARGUMENT, "table name must be 1 to %d bytes", PS_MAX_NAME);
    /* float32 travels as unspecified (the servers' one form of it); 0 is float32 too. */
    Psd__V1__DType dtype;
    switch ((int)spec->dtype) {
    case 0:
    case PS_FLOAT32:
        dtype = PSD__V1__DTYPE__DTYPE_UNSPECIFIED;
        break;
    case PS_BFLOAT16:
        dtype = PSD__V1__DTYPE__BFLOAT16;
        break;
    case PS_FLOAT16:
        dtype = PSD__V1__DTYPE__FLOAT16;
        break;
    default:
        return client_fail(PS_INVALID_ARGUMENT,
                           "table \"%s\": dtype %d: not PS_FLOAT32, PS_BFLOAT16 or PS_FLOAT16",
                           spec->name, (int)spec->dtype);
    }
    Psd__V1__TableSpec w = PSD__V1__TABLE_SPEC__INIT;
    w.name = (char *)spec->name;
    w.dtype = dtype;
    w.dim = spec->dim;
    w.optimizer = (Psd__V1__Optimizer)spec->optimizer;
    w.learning_rate = spec->learning_rate;
    w.momentum = spec->momentum;
    w.nesterov = spec->nesterov;
    w.beta1 = spec->beta1;
    w.beta2 = spec->beta2;
    w.epsilon = spec->epsilon;
    w.initial_accumulator = spec->initial_accumulator;
    w.weight_decay = spec->weight_decay;
    w.ftrl_beta = spec->ftrl_beta;
    w.l1 = spec->l1;
    w.l2 = spec->l2;
    w.initializer = (Psd__V1__Initializer)spec->initializer;
    w.init_a = spec->init_a;
    w.init_b = spec->init_b;
    w.seed = spec->seed;
    w.staleness = spec->staleness;
    w.min_count = spec->min_count;
    w.ttl_ms = spec->ttl_ms;
    w.max_rows = spec->max_rows;
    w.ram_rows = spec->ram_rows;
    w.num_servers = (uint32_t)c->nservers;
    Psd__V1__TableCreateRequest req = PSD__V1__TABLE_CREATE_REQUEST__INIT;
    req.spec = &w;
    /* Every server holds a table: those that joined too. */
    int reach = client_reach(c);
    int *servers = malloc((size_t)reach * sizeof(int));
    ProtobufCMessage **replies = calloc((size_t)reach, sizeof(*replies));
    if (replies == NULL || servers == NULL) {
        free(servers);
        free(replies);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; i < reach; i++)
        servers[i] = i;
    int rc = client_unary(c, servers, reach, PSD__V1__METHOD__TABLE_CREATE, &req.base,
                          &psd__v1__table_create_reply__descriptor, replies);
    client_free_replies(replies, reach);
    free(replies);
    free(servers);
    if (rc != PS_OK)
        return rc;
    ps_table *t = table_new(c, spec->name, spec->dim);
    if (t == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    *out = t;
    return PS_OK;
}

int ps_table_delete(ps_client *c, const char *name)
{
    if (c == NULL || name == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_delete: NULL argument");
    /* DeleteVariable to every server: a server deletes the table of that name when it holds no
     * variable of it (names are unique across variables and tables). */
    int rc = ps_var_delete(c, name);
    if (rc == PS_NOT_FOUND)
        return client_fail(PS_NOT_FOUND, "table \"%s\" not found on any of %d server(s)", name,
                           c->nservers);
    return rc;
}

int ps_table_lookup(ps_client *c, const char *name, ps_table **out)
{
    if (c == NULL || name == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_lookup: NULL argument");
    int server = 0;
    Psd__V1__TableLookupRequest req = PSD__V1__TABLE_LOOKUP_REQUEST__INIT;
    req.name = (char *)name;
    ProtobufCMessage *reply = NULL;
    int rc = client_unary(c, &server, 1, PSD__V1__METHOD__TABLE_LOOKUP, &req.base,
                          &psd__v1__table_lookup_reply__descriptor, &reply);
    if (rc != PS_OK)
        return rc;
    const Psd__V1__TableLookupReply *r = (const void *)reply;
    if (r->spec == NULL || r->spec->dim == 0 || r->spec->num_servers != (uint32_t)c->nservers) {
        client_free_replies(&reply, 1);
        return client_fail(PS_FAILED_PRECONDITION,
                           "table \"%s\": ps 0 sent no spec or one placed for another number of "
                           "servers than this client's %d",
                           name, c->nservers);
    }
    ps_table *t = table_new(c, name, r->spec->dim);
    client_free_replies(&reply, 1);
    if (t == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    *out = t;
    return PS_OK;
}

/* One request: ids order[start .. start+count) of the call, all owned by `server`. */
typedef struct table_part {
    struct table_call *tc;
    int server;
    size_t start, count;
    uint64_t seq;
} table_part;

/* What a table call sends (TablePull, TablePush, TablePrefetch). */
typedef enum { CALL_PULL, CALL_PUSH, CALL_PREFETCH } call_kind;

typedef struct table_call {
    ps_table *t;
    ps_op *op;
    call_kind kind;
    bool push;             /* kind == CALL_PUSH */
    _Atomic uint64_t cold; /* a prefetch: rows the servers brought from disk, summed */
    uint64_t *cold_out;    /* where the sum goes when the call completes, or NULL */
    const int64_t *ids;    /* the ids sent: the caller's, or its distinct ids (dups) */
    const float *grads;    /* the gradients sent: the caller's, or their sums per distinct id */
    float *rows;           /* the caller's rows */
    size_t *order;         /* indexes into ids, grouped by server */
    bool in_order;         /* order[i] == i for every i (one server holds them all) */
    id_dups *dups;         /* NULL when the caller's ids were distinct */
    size_t nparts;
    table_part parts[];
} table_call;

static int table_part_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    table_part *p = arg;
    table_call *tc = p->tc;
    ps_client *c = tc->t->c;
    size_t dim = tc->t->dim;
    envelope env;
    static const int methods[] = {PSD__V1__METHOD__TABLE_PULL, PSD__V1__METHOD__TABLE_PUSH,
                                  PSD__V1__METHOD__TABLE_PREFETCH};
    client_envelope(c, &env, methods[tc->kind], deadline_ms);
    env.seq = p->seq;
    /* Rows and gradients in the wire dtype; count: the segment's length in its elements. */
    size_t esize = frame_dtype_size(c->wire_dtype);
    size_t seglen = p->count * 8 + (tc->push ? p->count * dim * esize : 0);
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = (Psd__V1__DType)c->wire_dtype;
    tm.count = seglen / esize;
    env.tensor = &tm;
    Psd__V1__TablePushRequest push = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    Psd__V1__TablePullRequest pull = PSD__V1__TABLE_PULL_REQUEST__INIT;
    Psd__V1__TablePrefetchRequest pre = PSD__V1__TABLE_PREFETCH_REQUEST__INIT;
    push.name = pull.name = pre.name = tc->t->name;
    push.n = pull.n = pre.n = p->count;
    ProtobufCMessage *body = tc->kind == CALL_PUSH   ? &push.base
                             : tc->kind == CALL_PULL ? &pull.base
                                                     : &pre.base;
    uint8_t *seg;
    int rv = client_build_segment(&env, body, seglen, &seg, out);
    if (rv != 0)
        return rv;
    const size_t *ord = tc->order + p->start;
    uint8_t *g = seg + 8 * p->count;
    if (tc->in_order) { /* the part's ids and gradients are a run of the call's: one copy */
        memcpy(seg, tc->ids + p->start, 8 * p->count);
        if (tc->push)
            frame_put_floats(g, tc->grads + p->start * dim, p->count * dim, c->wire_dtype);
        return 0;
    }
    for (size_t k = 0; k < p->count; k++)
        memcpy(seg + 8 * k, &tc->ids[ord[k]], 8);
    if (tc->push)
        for (size_t k = 0; k < p->count; k++)
            frame_put_floats(g + k * dim * esize, tc->grads + ord[k] * dim, dim, c->wire_dtype);
    return 0;
}

static void table_part_done(void *arg, int status, const char *message, const frame *reply)
{
    table_part *p = arg;
    table_call *tc = p->tc;
    size_t dim = tc->t->dim;
    int dtype = tc->t->c->wire_dtype;
    size_t esize = frame_dtype_size(dtype);
    if (status == STATUS_OK && tc->kind == CALL_PREFETCH) {
        Psd__V1__TablePrefetchReply *r =
            reply == NULL ? NULL
                          : psd__v1__table_prefetch_reply__unpack(NULL, reply->env->body.len,
                                                                  reply->env->body.data);
        if (r == NULL) {
            status = STATUS_INTERNAL;
            message = "TablePrefetch reply could not be decoded";
        } else {
            atomic_fetch_add(&tc->cold, r->cold);
            psd__v1__table_prefetch_reply__free_unpacked(r, NULL);
        }
    } else if (status == STATUS_OK && tc->kind == CALL_PULL) {
        if (reply == NULL || reply->env->tensor == NULL || !reply->has_segment ||
            (int)reply->env->tensor->dtype != dtype ||
            reply->segment_len != p->count * dim * esize) {
            status = STATUS_INTERNAL;
            message = "TablePull reply does not carry one row per id in the wire dtype";
        } else if (tc->in_order && tc->dups == NULL) { /* a run of the caller's rows */
            frame_get_floats(tc->rows + p->start * dim, reply->segment, p->count * dim, dtype);
        } else {
            const size_t *ord = tc->order + p->start;
            for (size_t k = 0; k < p->count; k++) {
                float *row = tc->rows + id_dups_place(tc->dups, ord[k]) * dim;
                frame_get_floats(row, reply->segment + k * dim * esize, dim, dtype);
                id_dups_copy_row(tc->dups, ord[k], tc->rows, dim);
            }
        }
    }
    client_op_release(tc->op, p->server, status, message);
}

/* Starts every part of a table call's op (client_op_fanout). */
static void table_call_send_all(void *arg, ps_op *op)
{
    table_call *tc = arg;
    tc->op = op;
    for (size_t i = 0; i < tc->nparts; i++) {
        table_part *p = &tc->parts[i];
        int rc =
            client_call(tc->t->c, p->server, &tc->t->c->call, table_part_build, table_part_done, p);
        if (rc != 0)
            client_op_release(op, p->server, rc, "could not start the call");
    }
}

static void table_call_free(void *arg)
{
    table_call *tc = arg;
    free(tc->order);
    id_dups_free(tc->dups);
    free(tc);
}

/* A prefetch's completion: the servers' counts summed into the caller's *cold_out. */
static void table_call_complete(void *arg, int status)
{
    table_call *tc = arg;
    if (tc->cold_out != NULL)
        *tc->cold_out = status == STATUS_OK ? atomic_load(&tc->cold) : 0;
}

/* Starts the call (its requests all in flight) and returns its op in *out_op; a prefetch's
 * count of rows brought from disk goes to *cold_out (when not NULL) as it completes. */
static int table_call_start(ps_table *t, call_kind kind, const int64_t *ids, size_t n,
                            const float *grads, float *rows, uint64_t *cold_out, ps_done_fn cb,
                            void *arg, ps_op **out_op)
{
    static const char *fns[] = {"ps_table_pull", "ps_table_push", "ps_table_prefetch"};
    const char *fn = fns[kind];
    const bool push = kind == CALL_PUSH;
    if (t == NULL || out_op == NULL ||
        (n > 0 && (ids == NULL || (kind == CALL_PUSH && grads == NULL) ||
                   (kind == CALL_PULL && rows == NULL))))
        return client_fail(PS_INVALID_ARGUMENT, "%s: NULL argument", fn);
    ps_client *c = t->c;
    size_t max_ids = ps_table_max_ids(t);
    if (max_ids == 0)
        return client_fail(PS_INVALID_ARGUMENT,
                           "%s: table \"%s\": one row of dim %u does not fit in "
                           "max-message-bytes (%zu)",
                           fn, t->name, t->dim, c->max_message);
    /* Only distinct ids travel: fewer bytes, and less for the servers to do. */
    id_dups *d = NULL;
    if ((push && c->wire_dtype != PSD__V1__DTYPE__FLOAT32) ||
        id_dups_find(ids, n, push ? grads : NULL, t->dim, &d) != 0)
        d = NULL; /* 16-bit pushes, or no memory to spare: sent as they are */
    if (d != NULL) {
        ids = d->ids;
        grads = push ? d->sums : NULL;
        n = d->n;
    }
    int ns = client_reach(c); /* owners below it (client_slots_refresh) */
    size_t *count = calloc((size_t)ns + 1, sizeof(size_t));
    uint32_t *owner = malloc((n ? n : 1) * sizeof(*owner));
    size_t *order = malloc((n ? n : 1) * sizeof(*order)); /* n = 0: no part, done at once */
    if (count == NULL || owner == NULL || order == NULL) {
        free(count);
        free(owner);
        free(order);
        id_dups_free(d);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        owner[i] = slots_row_owner_h(&c->slots, t->name_hash, ids[i]);
        if (owner[i] >= (uint32_t)ns) /* a map read meanwhile: ps 0 redirects it */
            owner[i] = 0;
        count[owner[i] + 1]++;
    }
    size_t nparts = 0;
    for (int s = 0; s < ns; s++)
        nparts += (count[s + 1] + max_ids - 1) / max_ids;
    for (int s = 0; s < ns; s++) /* count[s]: where server s's ids start in order */
        count[s + 1] += count[s];
    table_call *tc = calloc(1, sizeof(*tc) + nparts * sizeof(table_part));
    if (tc == NULL) {
        free(count);
        free(owner);
        free(order);
        id_dups_free(d);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    tc->dups = d;
    size_t *fill = malloc((size_t)ns * sizeof(size_t));
    if (fill == NULL) {
        free(count);
        free(owner);
        free(order);
        id_dups_free(d);
        free(tc);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    memcpy(fill, count, (size_t)ns * sizeof(size_t));
    bool in_order = true;
    for (size_t i = 0; i < n; i++) {
        size_t at = fill[owner[i]]++;
        order[at] = i;
        in_order &= at == i;
    }
    free(fill);
    free(owner);
    tc->t = t;
    tc->cold_out = cold_out;
    tc->kind = kind;
    tc->push = push;
    tc->ids = ids;
    tc->grads = grads;
    tc->rows = rows;
    tc->order = order;
    tc->in_order = in_order;
    size_t k = 0;
    for (int s = 0; s < ns; s++)
        for (size_t at = count[s]; at < count[s + 1]; at += max_ids) {
            table_part *p = &tc->parts[k++];
            p->tc = tc;
            p->server = s;
            p->start = at;
            p->count = count[s + 1] - at < max_ids ? count[s + 1] - at : max_ids;
            if (push)
                p->seq = client_next_seq(c, s);
        }
    tc->nparts = k;
    free(count);
    return client_op_fanout(c, cb, arg, tc, table_call_free, table_call_complete, tc->nparts,
                            table_call_send_all, out_op);
}

static int table_call_run(ps_table *t, call_kind kind, const int64_t *ids, size_t n,
                          const float *grads, float *rows)
{
    ps_op *op;
    int rc = table_call_start(t, kind, ids, n, grads, rows, NULL, NULL, NULL, &op);
    if (rc != PS_OK)
        return rc;
    rc = ps_op_wait(op);
    ps_op_destroy(op);
    return rc;
}

int ps_table_pull(ps_table *t, const int64_t *ids, size_t n, float *rows)
{
    return table_call_run(t, CALL_PULL, ids, n, NULL, rows);
}

int ps_table_push(ps_table *t, const int64_t *ids, size_t n, const float *grads)
{
    return table_call_run(t, CALL_PUSH, ids, n, grads, NULL);
}

int ps_table_pull_async(ps_table *t, const int64_t *ids, size_t n, float *rows, ps_done_fn cb,
                        void *arg, ps_op **out_op)
{
    return table_call_start(t, CALL_PULL, ids, n, NULL, rows, NULL, cb, arg, out_op);
}

int ps_table_push_async(ps_table *t, const int64_t *ids, size_t n, const float *grads,
                        ps_done_fn cb, void *arg, ps_op **out_op)
{
    return table_call_start(t, CALL_PUSH, ids, n, grads, NULL, NULL, cb, arg, out_op);
}

int ps_table_prefetch_async(ps_table *t, const int64_t *ids, size_t n, ps_done_fn cb, void *arg,
                            ps_op **out_op)
{
    return table_call_start(t, CALL_PREFETCH, ids, n, NULL, NULL, NULL, cb, arg, out_op);
}

int ps_table_prefetch(ps_table *t, const int64_t *ids, size_t n, uint64_t *cold)
{
    uint64_t sum = 0;
    ps_op *op;
    int rc = table_call_start(t, CALL_PREFETCH, ids, n, NULL, NULL, &sum, NULL, NULL, &op);
    if (rc != PS_OK)
        return rc;
    rc = ps_op_wait(op);
    ps_op_destroy(op);
    if (cold != NULL)
        *cold = rc == PS_OK ? sum : 0;
    return rc;
}

/* ServerStatus of one server for its tables: `variable` names the table (no variable has its
 * name), or with NULL every table and at most one variable. */
static int table_status_call(ps_client *c, int server, const char *name, ProtobufCMessage **reply)
{
    Psd__V1__ServerStatusRequest req = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    req.max_variables = 1;
    req.variable = (char *)(name ? name : "");
    return client_unary(c, &server, 1, PSD__V1__METHOD__SERVER_STATUS, &req.base,
                        &psd__v1__server_status_reply__descriptor, reply);
}

int ps_table_info_get(ps_client *c, const char *name, ps_table_info *out)
{
    if (c == NULL || name == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_info_get: NULL argument");
    size_t want = out->struct_size;
    if (want < offsetof(ps_table_info, rows_updated) + sizeof(uint64_t))
        return client_fail(PS_INVALID_ARGUMENT,
                           "ps_table_info_get: struct_size %zu: set it to sizeof(ps_table_info)",
                           want);
    ps_table_info sum;
    memset(&sum, 0, sizeof(sum));
    int found = 0;
    for (int s = 0; s < client_reach(c); s++) {
        ProtobufCMessage *reply = NULL;
        int rc = table_status_call(c, s, name, &reply);
        if (rc != PS_OK)
            return rc;
        const Psd__V1__ServerStatusReply *r = (const void *)reply;
        for (size_t i = 0; i < r->n_tables; i++) {
            const Psd__V1__TableStatus *t = r->tables[i];
            if (t->name == NULL || strcmp(t->name, name) != 0)
                continue;
            found++;
            sum.dim = t->dim;
            sum.staleness = t->staleness;
            sum.optimizer = (ps_optimizer)t->optimizer;
            sum.rows += t->rows;
            sum.bytes += t->bytes;
            sum.rows_created += t->rows_created;
            sum.pushes_counted += t->pushes_counted;
            sum.evicted_ttl += t->evicted_ttl;
            sum.evicted_max_rows += t->evicted_max_rows;
            sum.evicted_memory += t->evicted_memory;
            sum.lookups += t->lookups;
            sum.rows_updated += t->rows_updated;
            sum.rows_disk += t->rows_disk;
            sum.promotions += t->promotions;
            sum.cold_hits += t->cold_hits;
            sum.demotions += t->demotions;
        }
        client_free_replies(&reply, 1);
    }
    if (found == 0)
        return client_fail(PS_NOT_FOUND, "table \"%s\" not found on any of %d server(s)", name,
                           c->nservers);
    sum.struct_size = want;
    sum.servers = found;
    memcpy(out, &sum, want < sizeof(sum) ? want : sizeof(sum));
    return PS_OK;
}

int ps_table_list(ps_client *c, char ***names, size_t *count)
{
    if (c == NULL || names == NULL || count == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_list: NULL argument");
    *names = NULL;
    *count = 0;
    /* Every table spans every server: server 0 lists them all. */
    ProtobufCMessage *reply = NULL;
    int rc = table_status_call(c, 0, NULL, &reply);
    if (rc != PS_OK)
        return rc;
    const Psd__V1__ServerStatusReply *r = (const void *)reply;
    if (r->n_tables < r->num_tables) {
        client_free_replies(&reply, 1);
        return client_fail(PS_RESOURCE_EXHAUSTED,
                           "ps 0 holds %llu tables, more than one status reply lists",
                           (unsigned long long)r->num_tables);
    }
    char **out = calloc(r->n_tables ? r->n_tables : 1, sizeof(*out));
    for (size_t i = 0; out && i < r->n_tables; i++) {
        out[i] = strdup(r->tables[i]->name ? r->tables[i]->name : "");
        if (out[i] == NULL) {
            ps_names_free(out, i);
            out = NULL;
        }
    }
    size_t n = r->n_tables;
    client_free_replies(&reply, 1);
    if (out == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    *names = out;
    *count = n;
    return PS_OK;
}

/* ---- export (admin): a page of one server's rows ---------------------------------------- */

typedef struct export_call {
    ps_table *t;
    const Psd__V1__TableExportRequest *req;
    size_t max;
    int64_t *ids;
    float *rows;
    size_t n;
    uint64_t next;
    bool done;
    int status;
    char message[400];
} export_call;

static int export_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    export_call *x = arg;
    envelope env;
    client_envelope(x->t->c, &env, PSD__V1__METHOD__TABLE_EXPORT, deadline_ms);
    return client_build(&env, &x->req->base, NULL, 0, out);
}

static void export_done(void *arg, int status, const char *message, const frame *reply)
{
    export_call *x = arg;
    x->status = status;
    snprintf(x->message, sizeof(x->message), "%s", message);
    if (status == STATUS_OK && reply) {
        Psd__V1__TableExportReply *r =
            psd__v1__table_export_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        size_t dim = x->t->dim;
        size_t want = r ? (size_t)r->n * (8 + 4 * dim) : 0;
        if (r == NULL || r->dim != x->t->dim || r->n > x->max ||
            (r->n > 0 && (!reply->has_segment || reply->segment_len != want))) {
            x->status = STATUS_INTERNAL;
            snprintf(x->message, sizeof(x->message),
                     "TableExport reply of table \"%s\" does not match its request (rows, dim "
                     "or segment length)",
                     x->t->name);
        } else {
            x->n = (size_t)r->n;
            x->next = r->next_cursor;
            x->done = r->done;
            if (x->n > 0) {
                memcpy(x->ids, reply->segment, x->n * 8);
                memcpy(x->rows, reply->segment + x->n * 8, x->n * dim * sizeof(float));
            }
        }
        if (r)
            psd__v1__table_export_reply__free_unpacked(r, NULL);
    }
}

int ps_table_export(ps_table *t, int server, uint64_t *cursor, size_t max, int64_t *ids,
                    float *rows, size_t *n, bool *done)
{
    if (t == NULL || cursor == NULL || ids == NULL || rows == NULL || n == NULL || done == NULL ||
        max == 0)
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_export: NULL argument or max = 0");
    if (server < 0 || server >= client_reach(t->c))
        return client_fail(PS_INVALID_ARGUMENT, "ps_table_export: server %d: the cluster has %d",
                           server, client_reach(t->c));
    size_t cap = ps_table_max_ids(t);
    Psd__V1__TableExportRequest req = PSD__V1__TABLE_EXPORT_REQUEST__INIT;
    req.name = t->name;
    req.cursor = *cursor;
    req.max_rows = (uint32_t)(max < cap ? max : cap);
    export_call x = {.t = t, .req = &req, .max = req.max_rows, .ids = ids, .rows = rows};
    rpc_waiter w;
    rpc_waiter_init(&w, export_build, export_done, &x);
    int rc = client_call(t->c, server, &t->c->call, rpc_waiter_build, rpc_waiter_done, &w);
    if (rc != 0) {
        x.status = rpc_waiter_abandon(&w, rc);
        snprintf(x.message, sizeof(x.message), "cannot start the call");
    } else {
        rpc_waiter_wait(&w);
    }
    if (x.status != STATUS_OK)
        return client_fail(x.status, "ps %d: %s", server, x.message);
    *n = x.n;
    *done = x.done;
    *cursor = x.next;
    return PS_OK;
}
