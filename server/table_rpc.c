/* Sparse tables over the wire: TableCreate, TableLookup, TablePull and TablePush
 * (proto/README.md "Sparse tables"). Every table exists on every server; each server holds
 * the rows placement_table_owner gives it and refuses ids it does not own. Tables live until
 * the server exits (no delete yet). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "placement.h"
#include "server.h"
#include "status.h"
#include "table.h"
#include "timeutil.h"
#include "util.h"

#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

typedef struct table_entry {
    table *t;
    Psd__V1__TableSpec *spec; /* unpacked copy of the spec it was created with */
    _Atomic int64_t last_sweep_ms;
} table_entry;

struct server_tables {
    table_entry **e;
    size_t n, cap;
};

/* One lock for the registry of every server_state (a process has one). Entries are never
 * removed while the server runs, so a found entry stays valid without holding it. */
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;

static table_entry *find_entry(server_state *st, const char *name)
{
    table_entry *found = NULL;
    pthread_mutex_lock(&tables_lock);
    for (size_t i = 0; st->tables && i < st->tables->n; i++)
        if (strcmp(table_name(st->tables->e[i]->t), name) == 0) {
            found = st->tables->e[i];
            break;
        }
    pthread_mutex_unlock(&tables_lock);
    return found;
}

bool server_table_exists(server_state *st, const char *name)
{
    return find_entry(st, name) != NULL;
}

void server_tables_free(server_state *st)
{
    if (st->tables == NULL)
        return;
    for (size_t i = 0; i < st->tables->n; i++) {
        table_destroy(st->tables->e[i]->t);
        psd__v1__table_spec__free_unpacked(st->tables->e[i]->spec, NULL);
        free(st->tables->e[i]);
    }
    free(st->tables->e);
    free(st->tables);
    st->tables = NULL;
}

static Psd__V1__TableSpec *spec_copy(const Psd__V1__TableSpec *s)
{
    size_t len = psd__v1__table_spec__get_packed_size(s);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL)
        return NULL;
    psd__v1__table_spec__pack(s, buf);
    Psd__V1__TableSpec *c = psd__v1__table_spec__unpack(NULL, len, buf);
    free(buf);
    return c;
}

static bool spec_equal(const Psd__V1__TableSpec *a, const Psd__V1__TableSpec *b)
{
    size_t la = psd__v1__table_spec__get_packed_size(a),
           lb = psd__v1__table_spec__get_packed_size(b);
    if (la != lb)
        return false;
    uint8_t *x = malloc(la + lb + 1);
    if (x == NULL)
        return false;
    psd__v1__table_spec__pack(a, x);
    psd__v1__table_spec__pack(b, x + la);
    bool eq = memcmp(x, x + la, la) == 0;
    free(x);
    return eq;
}

/* The core's spec from the wire's; INVALID_ARGUMENT with a message for what only the wire
 * can get wrong (the core validates the rest). */
static int to_table_spec(const Psd__V1__TableSpec *s, table_spec *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->name = s->name;
    out->dim = s->dim;
    if (!optimizer_kind_valid((int)s->optimizer)) {
        snprintf(err, errlen, "table \"%s\": unknown optimizer %d", s->name, (int)s->optimizer);
        return STATUS_INVALID_ARGUMENT;
    }
    optimizer_params_default(&out->opt, (optimizer_kind)s->optimizer);
    out->opt.learning_rate = (float)s->learning_rate;
    out->opt.momentum = (float)s->momentum;
    out->opt.nesterov = s->nesterov;
    out->opt.beta1 = (float)s->beta1;
    out->opt.beta2 = (float)s->beta2;
    out->opt.epsilon = (float)s->epsilon;
    out->opt.initial_accumulator = (float)s->initial_accumulator;
    out->opt.weight_decay = (float)s->weight_decay;
    out->opt.ftrl_beta = (float)s->ftrl_beta;
    out->opt.l1 = (float)s->l1;
    out->opt.l2 = (float)s->l2;
    switch (s->initializer) {
    case PSD__V1__INITIALIZER__INIT_ZEROS:
        out->init.kind = INITIALIZER_ZEROS;
        break;
    case PSD__V1__INITIALIZER__INIT_CONSTANT:
        out->init.kind = INITIALIZER_CONSTANT;
        break;
    case PSD__V1__INITIALIZER__INIT_UNIFORM:
        out->init.kind = INITIALIZER_UNIFORM;
        break;
    case PSD__V1__INITIALIZER__INIT_NORMAL:
        out->init.kind = INITIALIZER_NORMAL;
        break;
    default:
        snprintf(err, errlen,
                 "table \"%s\": initializer %d is not one of ZEROS, CONSTANT, UNIFORM, NORMAL",
                 s->name, (int)s->initializer);
        return STATUS_INVALID_ARGUMENT;
    }
    out->init.a = s->init_a;
    out->init.b = s->init_b;
    out->init.seed = s->seed;
    out->min_count = s->min_count;
    out->ttl_ms = s->ttl_ms;
    out->max_rows = s->max_rows;
    return STATUS_OK;
}

/* max-server-bytes: a table's allocation is refused when the tables' bytes and the
 * variables' would pass it (the table then evicts a row to make room, or refuses the row). */
static bool budget_take(void *arg, uint64_t bytes)
{
    server_state *st = arg;
    uint64_t now = atomic_fetch_add(&st->table_bytes, bytes) + bytes;
    uint64_t vars = store_bytes(st->vars);
    if (st->max_bytes && (now > st->max_bytes || vars > st->max_bytes - now)) {
        atomic_fetch_sub(&st->table_bytes, bytes);
        return false;
    }
    return true;
}

static void budget_give(void *arg, uint64_t bytes)
{
    server_state *st = arg;
    atomic_fetch_sub(&st->table_bytes, bytes);
}

void handle_table_create(rpc_call *call, void *arg)
{
    server_state *st = arg;
    Psd__V1__TableCreateRequest *req = (void *)rpc_call_body(call);
    Psd__V1__TableSpec *s = req->spec;
    char err[512], q[96];
    if (s == NULL) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "missing table spec");
        return;
    }
    if (!name_valid(s->name, TABLE_MAX_NAME)) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "invalid table name %s: 1 to 255 characters of [A-Za-z0-9_./:-]",
                        QUOTED(q, s->name));
        return;
    }
    if (s->num_servers != st->num_servers) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "table \"%s\": placement computed for %u servers but this cluster has %u "
                        "(client and server cluster specs differ)",
                        s->name, s->num_servers, st->num_servers);
        return;
    }
    if (s->staleness == -2)
        s->staleness = st->default_staleness;
    if (s->staleness != -1) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": staleness %d: tables are asynchronous only for now "
                        "(staleness -1)",
                        s->name, (int)s->staleness);
        return;
    }
    variable *v = store_find(st->vars, s->name);
    if (v != NULL) {
        variable_release(v);
        rpc_reply_error(call, STATUS_ALREADY_EXISTS,
                        "\"%s\" is a dense variable on ps %u, not a table", s->name,
                        st->task_index);
        return;
    }
    table_spec ts;
    int rc = to_table_spec(s, &ts, err, sizeof(err));
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return;
    }
    Psd__V1__TableCreateReply rep = PSD__V1__TABLE_CREATE_REPLY__INIT;
    ts.budget.take = budget_take;
    ts.budget.give = budget_give;
    ts.budget.arg = st;
    table_entry *e = find_entry(st, s->name);
    if (e == NULL) {
        pthread_mutex_lock(&tables_lock);
        size_t held = st->tables ? st->tables->n : 0;
        pthread_mutex_unlock(&tables_lock);
        if (held >= SERVER_MAX_TABLES) {
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "cannot create table \"%s\": ps %u holds %zu tables, the most allowed",
                            s->name, st->task_index, held);
            return;
        }
        table *t = NULL;
        rc = table_create(&ts, &t, err, sizeof(err));
        if (rc != TABLE_OK) {
            rpc_reply_error(
                call, rc == TABLE_INVALID ? STATUS_INVALID_ARGUMENT : STATUS_RESOURCE_EXHAUSTED,
                "cannot create table \"%s\": %s%s", s->name,
                rc == TABLE_NOMEM ? "out of memory" : err,
                rc == TABLE_LIMIT ? " (max-server-bytes)" : "");
            return;
        }
        table_entry *ne = calloc(1, sizeof(*ne));
        Psd__V1__TableSpec *copy = spec_copy(s);
        pthread_mutex_lock(&tables_lock);
        if (st->tables == NULL)
            st->tables = calloc(1, sizeof(*st->tables));
        bool room = st->tables != NULL;
        if (room && st->tables->n == st->tables->cap) {
            size_t cap = st->tables->cap ? 2 * st->tables->cap : 8;
            table_entry **g = realloc(st->tables->e, cap * sizeof(*g));
            if (g) {
                st->tables->e = g;
                st->tables->cap = cap;
            }
            room = g != NULL;
        }
        /* Another client may have created it meanwhile. */
        for (size_t i = 0; room && i < st->tables->n; i++)
            if (strcmp(table_name(st->tables->e[i]->t), s->name) == 0)
                e = st->tables->e[i];
        if (room && ne && copy && e == NULL) {
            ne->t = t;
            ne->spec = copy;
            st->tables->e[st->tables->n++] = ne;
            e = ne;
            rep.created = true;
            t = NULL, ne = NULL, copy = NULL;
        }
        pthread_mutex_unlock(&tables_lock);
        table_destroy(t);
        free(ne);
        if (copy)
            psd__v1__table_spec__free_unpacked(copy, NULL);
        if (e == NULL) {
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "cannot create table \"%s\": out of memory", s->name);
            return;
        }
    }
    if (!spec_equal(e->spec, s)) {
        rpc_reply_error(call, STATUS_ALREADY_EXISTS,
                        "table \"%s\" exists with another spec (dim %u, optimizer %d; requested "
                        "dim %u, optimizer %d)",
                        s->name, e->spec->dim, (int)e->spec->optimizer, s->dim, (int)s->optimizer);
        return;
    }
    rpc_reply_ok(call, &rep.base);
}

/* The table a call names; NULL after replying NOT_FOUND (saying so when the name is a dense
 * variable). */
static table_entry *resolve_table(server_state *st, rpc_call *call, const char *name)
{
    table_entry *e = find_entry(st, name);
    if (e)
        return e;
    char q[96];
    variable *v = store_find(st->vars, name);
    if (v) {
        variable_release(v);
        rpc_reply_error(call, STATUS_NOT_FOUND,
                        "%s is a dense variable, not a table (use Pull/Push for it)",
                        QUOTED(q, name));
    } else {
        rpc_reply_error(call, STATUS_NOT_FOUND, "table %s not found on ps %u", QUOTED(q, name),
                        st->task_index);
    }
    return NULL;
}

/* Checks a TablePull/TablePush's n and segment (ids, then for a push n rows of gradients),
 * copies the ids (aligned) into *ids_out and checks this server owns each. Replies with the
 * error and returns false otherwise. */
static bool table_ids(server_state *st, rpc_call *call, table_entry *e, uint64_t n, bool push,
                      int64_t **ids_out, const uint8_t **grads_out)
{
    const char *name = table_name(e->t);
    uint64_t dim = table_dim(e->t);
    const envelope *env = rpc_call_envelope(call);
    if (n == 0 || n > SERVER_TABLE_MAX_IDS) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": n = %llu ids (must be 1..%llu per request)", name,
                        (unsigned long long)n, (unsigned long long)SERVER_TABLE_MAX_IDS);
        return false;
    }
    if (env->tensor->dtype != PSD__V1__DTYPE__FLOAT32) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": Envelope.tensor.dtype must be FLOAT32 (its count is the "
                        "segment's length in 4-byte words; BFLOAT16 is not supported for tables)",
                        name);
        return false;
    }
    size_t seglen;
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    uint64_t want = 8 * n + (push ? 4 * n * dim : 0);
    if (seglen != want) {
        if (push)
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": segment is %zu bytes, but n = %llu ids and rows of "
                            "dim %llu need %llu (8 x n bytes of ids, then 4 x n x dim of "
                            "gradients)",
                            name, seglen, (unsigned long long)n, (unsigned long long)dim,
                            (unsigned long long)want);
        else
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": ids segment is %zu bytes, but n = %llu ids need 8 x n "
                            "= %llu",
                            name, seglen, (unsigned long long)n, (unsigned long long)want);
        return false;
    }
    if (!push && 4 * n * dim + 4096 > rpc_call_max_message(call)) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "table \"%s\": %llu rows of dim %llu would exceed max-message-bytes (%zu) "
                        "in the reply; pull fewer ids per request",
                        name, (unsigned long long)n, (unsigned long long)dim,
                        rpc_call_max_message(call));
        return false;
    }
    int64_t *ids = malloc((size_t)n * sizeof(*ids));
    if (ids == NULL) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for %llu ids",
                        (unsigned long long)n);
        return false;
    }
    memcpy(ids, seg, (size_t)n * 8); /* little-endian on the wire and on the hosts we build */
    for (uint64_t i = 0; i < n; i++) {
        uint32_t owner = placement_table_owner(name, ids[i], st->num_servers);
        if (owner != st->task_index) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": id %lld (index %llu) belongs on ps %u, not ps %u "
                            "(split ids by placement_table_owner)",
                            name, (long long)ids[i], (unsigned long long)i, owner, st->task_index);
            free(ids);
            return false;
        }
    }
    *ids_out = ids;
    if (grads_out)
        *grads_out = seg + 8 * n;
    return true;
}

void handle_table_lookup(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TableLookupRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    if (e == NULL)
        return;
    Psd__V1__TableLookupReply rep = PSD__V1__TABLE_LOOKUP_REPLY__INIT;
    rep.spec = e->spec;
    rpc_reply_ok(call, &rep.base);
}

void handle_table_pull(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePullRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    if (e == NULL || !table_ids(st, call, e, req->n, false, &ids, NULL))
        return;
    size_t count = (size_t)req->n * table_dim(e->t);
    Psd__V1__TablePullReply rep = PSD__V1__TABLE_PULL_REPLY__INIT;
    uint8_t *dst = rpc_reply_ok_tensor(call, &rep.base, PSD__V1__DTYPE__FLOAT32, 0, count);
    if (dst != NULL) {
        if ((uintptr_t)dst % sizeof(float) == 0) {
            table_pull(e->t, ids, (size_t)req->n, (float *)(void *)dst);
        } else {
            float *tmp = malloc(count * sizeof(float));
            if (tmp == NULL) {
                rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for rows");
            } else {
                table_pull(e->t, ids, (size_t)req->n, tmp);
                memcpy(dst, tmp, count * sizeof(float));
                free(tmp);
            }
        }
    }
    free(ids);
}

void handle_table_push(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePushRequest *req = (const void *)rpc_call_body(call);
    const envelope *env = rpc_call_envelope(call);
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    const uint8_t *grads;
    if (e == NULL || !table_ids(st, call, e, req->n, true, &ids, &grads))
        return;
    char err[512];
    struct {
        uint64_t client, seq;
    } in = {env->client_id, env->seq};
    store_update_begin(st->vars);
    uint64_t floor = 0;
    dedup_result d = dedup_begin_floor(st->dedup, in.client, in.seq, &floor);
    if (d != DEDUP_NEW && d != DEDUP_DUPLICATE) {
        store_update_end(st->vars);
        server_push_refusal(d, in.client, in.seq, floor, err, sizeof(err));
        rpc_reply_error(call, STATUS_ABORTED, "%s", err);
        free(ids);
        return;
    }
    int64_t now = (int64_t)time_now_ms();
    int rc = TABLE_OK;
    if (d == DEDUP_NEW) {
        rc = table_push(e->t, ids, (size_t)req->n, grads, now, err, sizeof(err));
        if (rc == TABLE_INVALID)
            dedup_unmark(st->dedup, in.client, in.seq); /* nothing was applied */
    } else {
        atomic_fetch_add(&st->duplicates_dropped, 1);
    }
    store_update_end(st->vars);
    free(ids);
    if (rc == TABLE_INVALID) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": %s: the batch was refused, nothing applied",
                        table_name(e->t), err);
        return;
    }
    if (rc != TABLE_OK) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "table \"%s\": %s%s", table_name(e->t),
                        rc == TABLE_NOMEM ? "out of memory" : err,
                        rc == TABLE_LIMIT ? " (max-server-bytes; the push's other rows were "
                                            "applied)"
                                          : "");
        return;
    }
    if (d == DEDUP_NEW)
        atomic_fetch_add(&st->updates_applied, 1);
    /* ttl_ms: expired rows are swept on a push, at most once a second per table. */
    int64_t last = atomic_load(&e->last_sweep_ms);
    if (e->spec->ttl_ms > 0 && now - last >= 1000 &&
        atomic_compare_exchange_strong(&e->last_sweep_ms, &last, now))
        table_sweep(e->t, now);
    Psd__V1__TablePushReply rep = PSD__V1__TABLE_PUSH_REPLY__INIT;
    rep.duplicate = d == DEDUP_DUPLICATE;
    rpc_reply_ok(call, &rep.base);
}

/* TableExport (psctl dump): a page of this server's rows, ids then rows in the segment. */
void handle_table_export(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TableExportRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    if (e == NULL)
        return;
    uint64_t dim = table_dim(e->t), per = 8 + 4 * dim;
    size_t room = rpc_call_max_message(call);
    uint64_t fit = room > 4096 ? (room - 4096) / per : 0;
    uint64_t max = req->max_rows && req->max_rows < fit ? req->max_rows : fit;
    if (max > SERVER_TABLE_MAX_IDS)
        max = SERVER_TABLE_MAX_IDS;
    if (max == 0) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "table \"%s\": a row of dim %llu does not fit in max-message-bytes (%zu)",
                        table_name(e->t), (unsigned long long)dim, room);
        return;
    }
    int64_t *ids = malloc((size_t)max * sizeof(*ids));
    float *rows = malloc((size_t)max * dim * sizeof(float));
    if (ids == NULL || rows == NULL) {
        free(ids);
        free(rows);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for %llu rows",
                        (unsigned long long)max);
        return;
    }
    uint64_t cursor = req->cursor;
    size_t n = table_export(e->t, &cursor, (size_t)max, ids, rows);
    Psd__V1__TableExportReply rep = PSD__V1__TABLE_EXPORT_REPLY__INIT;
    rep.n = n;
    rep.done = cursor == UINT64_MAX;
    rep.next_cursor = rep.done ? 0 : cursor;
    rep.dim = (uint32_t)dim;
    /* count: the segment's length in 4-byte words (ids, then rows), as for the table calls. */
    uint8_t *dst =
        rpc_reply_ok_tensor(call, &rep.base, PSD__V1__DTYPE__FLOAT32, 0, (uint64_t)n * (2 + dim));
    if (dst != NULL) {
        memcpy(dst, ids, n * 8);
        memcpy(dst + n * 8, rows, n * dim * sizeof(float));
    }
    free(ids);
    free(rows);
}

/* ---- checkpoints (server/checkpoint.c) ---- */

/* The registered tables now (a malloc'd array, *n of them; NULL when none or no memory). */
static table_entry **tables_now(server_state *st, size_t *n)
{
    pthread_mutex_lock(&tables_lock);
    *n = st->tables ? st->tables->n : 0;
    table_entry **es = *n ? malloc(*n * sizeof(*es)) : NULL;
    if (es)
        memcpy(es, st->tables->e, *n * sizeof(*es));
    pthread_mutex_unlock(&tables_lock);
    return es;
}

/* Prepares tc's cut of e's table (spec packed, memory allocated). Returns 0 or -1. */
static int copy_prepare(server_table_copy *tc, table_entry *e, uint64_t base)
{
    tc->spec_len = psd__v1__table_spec__get_packed_size(e->spec);
    tc->spec = malloc(tc->spec_len ? tc->spec_len : 1);
    tc->nparts = table_partitions(e->t);
    tc->row_floats = table_row_floats(e->t);
    if (tc->spec == NULL || (tc->cut = table_cut_prepare(e->t, base)) == NULL)
        return -1;
    psd__v1__table_spec__pack(e->spec, tc->spec);
    return 0;
}

int server_tables_copy_prepare(server_state *st, uint64_t base, server_table_copy **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t nt;
    table_entry **es = tables_now(st, &nt);
    if (nt == 0)
        return 0;
    server_table_copy *c = es ? calloc(nt, sizeof(*c)) : NULL;
    if (c == NULL) {
        free(es);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nt; i++)
        rc = copy_prepare(&c[i], es[i], base);
    *out = c;
    *n = nt;
    free(es);
    return rc;
}

int server_tables_copy(server_state *st, uint64_t base, uint64_t seq, bool track,
                       server_table_copy **out, size_t *n)
{
    server_table_copy *pre = *out;
    size_t npre = *n;
    *out = NULL;
    *n = 0;
    size_t nt;
    table_entry **es = tables_now(st, &nt);
    server_table_copy *c = nt && es ? calloc(nt, sizeof(*c)) : NULL;
    int rc = nt == 0 || c != NULL ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < nt; i++) {
        /* Prepared before the pause, unless created since. */
        for (size_t k = 0; k < npre; k++)
            if (pre[k].cut != NULL && table_cut_table(pre[k].cut) == es[i]->t) {
                c[i] = pre[k];
                memset(&pre[k], 0, sizeof(pre[k]));
                break;
            }
        if (c[i].cut == NULL && copy_prepare(&c[i], es[i], base) != 0)
            rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < nt; i++) {
        table_cut_start(c[i].cut, seq, track);
        c[i].delta = table_cut_is_delta(c[i].cut);
    }
    server_tables_copy_free(pre, npre); /* tables deleted since the prepare, if any */
    free(es);
    *out = c;
    *n = c ? nt : 0;
    return rc;
}

int server_tables_copy_finish(server_table_copy *c, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        server_table_copy *tc = &c[i];
        if (tc->cut == NULL || table_cut_finish(tc->cut) != 0) {
            rc = -1;
            continue;
        }
        tc->parts = table_cut_rows(tc->cut, 0);
        tc->rows = tc->removed = 0;
        for (uint32_t p = 0; p < tc->nparts; p++) {
            tc->rows += tc->parts[p].n;
            tc->removed += tc->parts[p].nremoved;
        }
    }
    return rc;
}

void server_tables_copy_free(server_table_copy *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++) {
        free(c[i].spec);
        table_cut_free(c[i].cut);
    }
    free(c);
}

int server_table_make(server_state *st, const uint8_t *spec, size_t len, table **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    Psd__V1__TableSpec *s = psd__v1__table_spec__unpack(NULL, len, spec);
    if (s == NULL) {
        snprintf(err, errlen, "a table spec that does not decode");
        return -1;
    }
    table_spec ts;
    int rc = -1;
    if (s->num_servers != st->num_servers)
        snprintf(err, errlen, "table \"%s\": placed for %u servers, this cluster has %u", s->name,
                 s->num_servers, st->num_servers);
    else if (to_table_spec(s, &ts, err, errlen) == STATUS_OK) {
        ts.budget.take = budget_take;
        ts.budget.give = budget_give;
        ts.budget.arg = st;
        rc = table_create(&ts, out, err, errlen) == TABLE_OK ? 0 : -1;
    }
    psd__v1__table_spec__free_unpacked(s, NULL);
    return rc;
}

int server_table_register(server_state *st, table *t, const uint8_t *spec, size_t len)
{
    table_entry *ne = calloc(1, sizeof(*ne));
    Psd__V1__TableSpec *copy = psd__v1__table_spec__unpack(NULL, len, spec);
    int rc = -1;
    pthread_mutex_lock(&tables_lock);
    if (st->tables == NULL)
        st->tables = calloc(1, sizeof(*st->tables));
    if (ne && copy && st->tables) {
        bool dup = false;
        for (size_t i = 0; i < st->tables->n; i++)
            dup = dup || strcmp(table_name(st->tables->e[i]->t), table_name(t)) == 0;
        if (!dup && st->tables->n == st->tables->cap) {
            size_t cap = st->tables->cap ? 2 * st->tables->cap : 8;
            table_entry **g = realloc(st->tables->e, cap * sizeof(*g));
            if (g) {
                st->tables->e = g;
                st->tables->cap = cap;
            }
        }
        if (!dup && st->tables->n < st->tables->cap) {
            ne->t = t;
            ne->spec = copy;
            st->tables->e[st->tables->n++] = ne;
            ne = NULL;
            copy = NULL;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    free(ne);
    if (copy)
        psd__v1__table_spec__free_unpacked(copy, NULL);
    return rc;
}

/* ---- metrics ---- */

void server_tables_metrics(metrics_out *out, server_state *st)
{
    pthread_mutex_lock(&tables_lock);
    size_t n = st->tables ? st->tables->n : 0;
    table_entry **es = n ? malloc(n * sizeof(*es)) : NULL;
    if (es)
        memcpy(es, st->tables->e, n * sizeof(*es));
    pthread_mutex_unlock(&tables_lock);
    metrics_emit_one(out, "psd_server_tables", METRIC_GAUGE, "Sparse tables held.", (double)n);
    table_stats *ts = es ? calloc(n, sizeof(*ts)) : NULL;
    if (ts == NULL) {
        free(es);
        return;
    }
    for (size_t i = 0; i < n; i++)
        table_stats_get(es[i]->t, &ts[i]);
    static const struct {
        const char *name, *help;
        metric_type type;
    } tm[] = {
        {"psd_table_rows", "Rows of a sparse table this server holds.", METRIC_GAUGE},
        {"psd_table_memory_bytes", "Bytes a sparse table holds (slabs, indexes, sketches).",
         METRIC_GAUGE},
        {"psd_table_lookups_total", "Ids pulled from a sparse table.", METRIC_COUNTER},
        {"psd_table_lookup_misses_total",
         "Ids pulled that had no row (the initializer's row was returned).", METRIC_COUNTER},
        {"psd_table_rows_created_total", "Rows made (admitted) in a sparse table.", METRIC_COUNTER},
        {"psd_table_pushes_counted_total",
         "Pushed ids held back by min_count (counted, gradient dropped).", METRIC_COUNTER},
        {"psd_table_rows_updated_total", "Row updates applied to a sparse table.", METRIC_COUNTER},
        {"psd_table_rows_refused_total",
         "New rows not made: max-server-bytes refused and nothing could be evicted.",
         METRIC_COUNTER},
    };
    for (size_t k = 0; k < sizeof(tm) / sizeof(tm[0]); k++) {
        metrics_emit_header(out, tm[k].name, tm[k].type, tm[k].help);
        for (size_t i = 0; i < n; i++) {
            const char *labels[] = {"table", table_name(es[i]->t), NULL};
            const table_stats *s = &ts[i];
            uint64_t x = k == 0   ? s->rows
                         : k == 1 ? s->bytes
                         : k == 2 ? s->lookups
                         : k == 3 ? s->lookup_misses
                         : k == 4 ? s->rows_created
                         : k == 5 ? s->pushes_counted
                         : k == 6 ? s->rows_updated
                                  : s->rows_refused;
            metrics_emit(out, tm[k].name, labels, (double)x);
        }
    }
    metrics_emit_header(out, "psd_table_evictions_total", METRIC_COUNTER,
                        "Rows removed from a sparse table, by reason (ttl, max_rows, memory).");
    for (size_t i = 0; i < n; i++) {
        const char *name = table_name(es[i]->t);
        const char *l1[] = {"table", name, "reason", "ttl", NULL};
        const char *l2[] = {"table", name, "reason", "max_rows", NULL};
        const char *l3[] = {"table", name, "reason", "memory", NULL};
        metrics_emit(out, "psd_table_evictions_total", l1, (double)ts[i].evicted_ttl);
        metrics_emit(out, "psd_table_evictions_total", l2, (double)ts[i].evicted_max_rows);
        metrics_emit(out, "psd_table_evictions_total", l3, (double)ts[i].evicted_memory);
    }
    free(ts);
    free(es);
}
