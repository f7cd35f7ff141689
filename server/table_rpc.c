/* Sparse tables over the wire: TableCreate, TableLookup, TablePull and TablePush
 * (proto/README.md "Sparse tables"). Every table exists on every server; each server holds
 * the rows placement_table_owner gives it and refuses ids it does not own. A table lives until
 * DeleteVariable names it (server_table_delete) or the server exits. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "log.h"
#include "metrics.h"
#include "placement.h"
#include "server.h"
#include "status.h"
#include "table.h"
#include "table_index.h"
#include "timeutil.h"
#include "util.h"

#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

typedef struct table_entry {
    table *t;
    Psd__V1__TableSpec *spec; /* unpacked copy of the spec it was created with */
    _Atomic int64_t last_sweep_ms;
    _Atomic uint64_t refs;    /* the registry's reference and every call's that found it */
    _Atomic bool deleted;     /* unlinked by a delete: calls holding it answer NOT_FOUND */
    uint64_t create_gen;      /* server_state.create_gen at its creation; 0: restored */
    pthread_mutex_t bsp_lock; /* BSP: its aggregate's pushes against their apply */
} table_entry;

/* A BSP table's aggregate (docs/design.md "Staleness of tables") is a table of its own, named
 * the table's name and this suffix (a character no client name has), of dim + 1 floats a row:
 * SGD with learning rate 1 from zeros (w -= g), pushed the negated gradients and -1 in the last
 * column for each push that touches the row, holds their sum and the count of those pushes. */
#define BSP_SUFFIX "#bsp"
#define BSP_MAX_NAME (TABLE_MAX_NAME - 4)

static bool is_bsp_aggregate(const char *name)
{
    return strchr(name, '#') != NULL;
}

struct server_tables {
    table_entry **e;
    size_t n, cap;
};

/* One lock for the registry of every server_state (a process has one). A call that finds an
 * entry holds a reference on it (find_entry, entry_put), so an entry unlinked meanwhile stays
 * valid until its last call is done. */
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;

/* The entry of `name`, referenced (entry_put), or NULL. */
static table_entry *find_entry(server_state *st, const char *name)
{
    table_entry *found = NULL;
    pthread_mutex_lock(&tables_lock);
    for (size_t i = 0; st->tables && i < st->tables->n; i++)
        if (strcmp(table_name(st->tables->e[i]->t), name) == 0) {
            found = st->tables->e[i];
            atomic_fetch_add(&found->refs, 1);
            break;
        }
    pthread_mutex_unlock(&tables_lock);
    return found;
}

static void entry_put(table_entry *e)
{
    if (e == NULL || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&e->bsp_lock);
    table_destroy(e->t);
    psd__v1__table_spec__free_unpacked(e->spec, NULL);
    free(e);
}

/* Every entry, referenced (entries_release), in creation order; NULL with *n 0 when there is
 * none, NULL with *n > 0 when memory runs out. */
static table_entry **entries_list(server_state *st, size_t *n)
{
    pthread_mutex_lock(&tables_lock);
    *n = st->tables ? st->tables->n : 0;
    table_entry **es = *n ? malloc(*n * sizeof(*es)) : NULL;
    for (size_t i = 0; es && i < *n; i++) {
        es[i] = st->tables->e[i];
        atomic_fetch_add(&es[i]->refs, 1);
    }
    pthread_mutex_unlock(&tables_lock);
    return es;
}

static void entries_release(table_entry **es, size_t n)
{
    for (size_t i = 0; es && i < n; i++)
        entry_put(es[i]);
    free(es);
}

/* Unlinks the entry `name` (tables_lock held); NULL if none. */
static table_entry *unlink_locked(server_state *st, const char *name)
{
    for (size_t i = 0; st->tables && i < st->tables->n; i++)
        if (strcmp(table_name(st->tables->e[i]->t), name) == 0) {
            table_entry *e = st->tables->e[i];
            memmove(&st->tables->e[i], &st->tables->e[i + 1],
                    (st->tables->n - i - 1) * sizeof(*st->tables->e));
            st->tables->n--;
            atomic_store(&e->deleted, true);
            return e;
        }
    return NULL;
}

int server_table_delete(server_state *st, const char *name)
{
    if (is_bsp_aggregate(name))
        return -1;
    char aggname[TABLE_MAX_NAME + 8];
    snprintf(aggname, sizeof(aggname), "%s" BSP_SUFFIX, name);
    /* Held against a checkpoint's copy like an update: a snapshot has the table whole or not,
     * with its BSP aggregate. */
    store_update_begin(st->vars);
    pthread_mutex_lock(&tables_lock);
    table_entry *e = unlink_locked(st, name);
    table_entry *agg = e ? unlink_locked(st, aggname) : NULL;
    pthread_mutex_unlock(&tables_lock);
    store_update_end(st->vars);
    entry_put(agg);
    if (e == NULL)
        return -1;
    table_stats ts;
    table_stats_get(e->t, &ts);
    log_info("table \"%s\" deleted (%llu rows, %llu bytes on this server)", name,
             (unsigned long long)ts.rows, (unsigned long long)ts.bytes);
    entry_put(e); /* the registry's reference: freed once the last call holding it is done */
    return 0;
}

bool server_table_exists(server_state *st, const char *name)
{
    table_entry *e = find_entry(st, name);
    entry_put(e);
    return e != NULL;
}

void server_tables_free(server_state *st)
{
    if (st->tables == NULL)
        return;
    for (size_t i = 0; i < st->tables->n; i++)
        entry_put(st->tables->e[i]);
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
    /* A BSP aggregate holds acknowledged gradients: refused rather than evicted. */
    out->never_evict = is_bsp_aggregate(s->name);
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
    bool from_default = s->staleness == -2;
    if (from_default)
        s->staleness = st->default_staleness;
    if (s->staleness < -1 || s->staleness > 1000000) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": staleness %d (use -1 async, 0 BSP, 1..1000000 SSP, -2 "
                        "the server's default)",
                        s->name, (int)s->staleness);
        return;
    }
    if (s->staleness == 0 && strlen(s->name) > BSP_MAX_NAME) {
        /* Its aggregate is a table named name + BSP_SUFFIX. */
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%.64s...\": staleness 0 (BSP%s) needs a name of at most %d "
                        "characters (%zu given)",
                        s->name, from_default ? ", this server's default-staleness" : "",
                        BSP_MAX_NAME, strlen(s->name));
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
        if (ne)
            pthread_mutex_init(&ne->bsp_lock, NULL);
        Psd__V1__TableSpec *copy = spec_copy(s);
        /* Under the update lock, so that a checkpoint's copy holds exactly the tables created up
         * to the create_gen it reads (as for variables). */
        store_update_begin(st->vars);
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
            if (strcmp(table_name(st->tables->e[i]->t), s->name) == 0) {
                e = st->tables->e[i];
                atomic_fetch_add(&e->refs, 1);
            }
        if (room && ne && copy && e == NULL) {
            ne->t = t;
            ne->spec = copy;
            ne->create_gen = atomic_fetch_add(&st->create_gen, 1) + 1;
            atomic_init(&ne->refs, 2); /* the registry's and this call's */
            st->tables->e[st->tables->n++] = ne;
            e = ne;
            rep.created = true;
            t = NULL, ne = NULL, copy = NULL;
        }
        pthread_mutex_unlock(&tables_lock);
        store_update_end(st->vars);
        table_destroy(t);
        if (ne)
            pthread_mutex_destroy(&ne->bsp_lock);
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
        entry_put(e);
        return;
    }
    /* Acknowledged once durable: a crash must not lose a table a client was told of. */
    checkpointer *ck = checkpointer_of(st);
    if (ck == NULL ||
        !checkpointer_await_table_create(ck, call, e->create_gen, s->name, rep.created))
        rpc_reply_ok(call, &rep.base);
    entry_put(e);
}

/* ---- finding tables, reading ids, pulling and pushing rows (TablePull, TablePush, Step) ---- */

server_table *server_table_get(server_state *st, const char *name, int *status, char *err,
                               size_t errlen)
{
    table_entry *e = is_bsp_aggregate(name) ? NULL : find_entry(st, name);
    if (e)
        return e;
    char q[96];
    variable *v = store_find(st->vars, name);
    if (v) {
        variable_release(v);
        snprintf(err, errlen, "%s is a dense variable, not a table (use Pull/Push for it)",
                 QUOTED(q, name));
    } else {
        snprintf(err, errlen, "table %s not found on ps %u", QUOTED(q, name), st->task_index);
    }
    *status = STATUS_NOT_FOUND;
    return NULL;
}

void server_table_put(server_table *e)
{
    entry_put(e);
}

const char *server_table_name(const server_table *e)
{
    return table_name(e->t);
}

uint32_t server_table_dim(const server_table *e)
{
    return table_dim(e->t);
}

int32_t server_table_staleness(const server_table *e)
{
    return e->spec->staleness;
}

bool server_table_deleted(const server_table *e)
{
    return atomic_load(&e->deleted);
}

int server_table_ids(server_state *st, const server_table *e, const uint8_t *seg, uint64_t n,
                     int64_t **ids_out, char *err, size_t errlen)
{
    const char *name = table_name(e->t);
    *ids_out = NULL;
    if (n == 0 || n > SERVER_TABLE_MAX_IDS) {
        snprintf(err, errlen, "table \"%s\": n = %llu ids (must be 1..%llu per request)", name,
                 (unsigned long long)n, (unsigned long long)SERVER_TABLE_MAX_IDS);
        return STATUS_INVALID_ARGUMENT;
    }
    int64_t *ids = malloc((size_t)n * sizeof(*ids));
    if (ids == NULL) {
        snprintf(err, errlen, "out of memory for %llu ids", (unsigned long long)n);
        return STATUS_RESOURCE_EXHAUSTED;
    }
    memcpy(ids, seg, (size_t)n * 8); /* little-endian on the wire and on the hosts we build */
    for (uint64_t i = 0; i < n; i++) {
        uint32_t owner = placement_table_owner(name, ids[i], st->num_servers);
        if (owner != st->task_index) {
            snprintf(err, errlen,
                     "table \"%s\": id %lld (index %llu) belongs on ps %u, not ps %u (split ids "
                     "by placement_table_owner)",
                     name, (long long)ids[i], (unsigned long long)i, owner, st->task_index);
            free(ids);
            return STATUS_INVALID_ARGUMENT;
        }
    }
    *ids_out = ids;
    return STATUS_OK;
}

int server_table_read(server_table *e, const int64_t *ids, uint64_t n, uint8_t *dst, int dtype)
{
    size_t count = (size_t)n * table_dim(e->t);
    if (dtype == PSD__V1__DTYPE__FLOAT32 && (uintptr_t)dst % sizeof(float) == 0) {
        table_pull(e->t, ids, (size_t)n, (float *)(void *)dst);
        return 0;
    }
    float *tmp = malloc(count * sizeof(float));
    if (tmp == NULL)
        return -1;
    table_pull(e->t, ids, (size_t)n, tmp);
    frame_put_floats(dst, tmp, count, dtype);
    free(tmp);
    return 0;
}

/* The aggregate of BSP table e (made on first use, under the caller's update lock, so that a
 * checkpoint has it whole or not), referenced; NULL with a message when it can't be made. */
static table_entry *bsp_aggregate(server_state *st, table_entry *e, char *err, size_t errlen)
{
    char name[TABLE_MAX_NAME + 1];
    snprintf(name, sizeof(name), "%s" BSP_SUFFIX, table_name(e->t));
    table_entry *agg = find_entry(st, name);
    if (agg)
        return agg;
    Psd__V1__TableSpec spec = PSD__V1__TABLE_SPEC__INIT;
    spec.name = name;
    spec.dim = table_dim(e->t) + 1;
    spec.optimizer = PSD__V1__OPTIMIZER__OPT_SGD;
    spec.learning_rate = 1.0;
    spec.initializer = PSD__V1__INITIALIZER__INIT_ZEROS;
    spec.staleness = -1;
    spec.num_servers = st->num_servers;
    uint8_t buf[TABLE_MAX_NAME + 64];
    size_t len = psd__v1__table_spec__pack(&spec, buf);
    table *t = NULL;
    if (server_table_make(st, buf, len, &t, err, errlen) != 0)
        return NULL;
    if (server_table_register(st, t, buf, len) != 0)
        table_destroy(t); /* made meanwhile by another push (or out of memory) */
    agg = find_entry(st, name);
    if (agg == NULL)
        snprintf(err, errlen, "table \"%s\": out of memory for its BSP aggregate",
                 table_name(e->t));
    return agg;
}

/* BSP push of n gradient rows (float32, any alignment) into e's aggregate. Returns a TABLE_*
 * code with a message in err. */
static int bsp_add(server_state *st, table_entry *e, const int64_t *ids, size_t n,
                   const float *grads, int64_t now, char *err, size_t errlen)
{
    size_t dim = table_dim(e->t), w = dim + 1;
    table_entry *agg = bsp_aggregate(st, e, err, errlen);
    if (agg == NULL)
        return TABLE_NOMEM;
    /* Rows pushed to the aggregate: minus the gradient, and -1 in the count column for the
     * first occurrence of an id in this push (a push counts once per row, as it is summed). */
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    float *rows = malloc(n * w * sizeof(float));
    int64_t *seen = malloc(cap * sizeof(*seen));
    unsigned char *used = calloc(cap, 1);
    int rc = TABLE_NOMEM;
    if (rows && seen && used) {
        for (size_t i = 0; i < n; i++) {
            const unsigned char *g = (const unsigned char *)grads + i * dim * sizeof(float);
            for (size_t k = 0; k < dim; k++) {
                float x;
                memcpy(&x, g + k * sizeof(float), sizeof(x));
                rows[i * w + k] = -x;
            }
            size_t j = (size_t)table_id_hash(ids[i]) & (cap - 1);
            while (used[j] && seen[j] != ids[i])
                j = (j + 1) & (cap - 1);
            rows[i * w + dim] = used[j] ? 0.0f : -1.0f;
            used[j] = 1;
            seen[j] = ids[i];
        }
        pthread_mutex_lock(&e->bsp_lock);
        rc = table_push(agg->t, ids, n, rows, now, err, errlen);
        pthread_mutex_unlock(&e->bsp_lock);
    } else {
        snprintf(err, errlen, "table \"%s\": out of memory for a BSP push of %zu rows",
                 table_name(e->t), n);
    }
    free(rows);
    free(seen);
    free(used);
    entry_put(agg);
    return rc;
}

/* Applies BSP table e's aggregate (update lock held by the caller): each row's sum (its mean
 * over the pushes that touched it, with `mean`) is pushed into e's table, and removed from the
 * aggregate once that push is done with it (table_push_track): a row not applied for want of
 * memory stays for the next clock, and no row is applied twice. A row that cannot be applied
 * (a sum that is not finite, or an update that would overflow the table's row) is logged and
 * dropped, so that it does not hold the others back at every clock. */
static void bsp_apply_one(server_state *st, table_entry *e, bool mean)
{
    char name[TABLE_MAX_NAME + 1], err[512];
    snprintf(name, sizeof(name), "%s" BSP_SUFFIX, table_name(e->t));
    table_entry *agg = find_entry(st, name);
    if (agg == NULL)
        return;
    size_t dim = table_dim(e->t), w = dim + 1;
    pthread_mutex_lock(&e->bsp_lock);
    uint32_t nparts = table_partitions(agg->t);
    table_rows *parts = calloc(nparts, sizeof(*parts));
    size_t total = 0;
    bool ok = parts != NULL;
    for (uint32_t p = 0; ok && p < nparts; p++) {
        ok = table_copy_partition(agg->t, p, &parts[p]) == 0 && parts[p].row_floats == w;
        total += parts[p].n;
    }
    int64_t *ids = ok && total ? malloc(total * sizeof(*ids)) : NULL;
    int64_t *gone = ok && total ? malloc(total * sizeof(*gone)) : NULL;
    float *grads = ok && total ? malloc(total * dim * sizeof(float)) : NULL;
    bool *done = ok && total ? malloc(total * sizeof(*done)) : NULL;
    if (total > 0 && (ids == NULL || gone == NULL || grads == NULL || done == NULL)) {
        log_warn("table \"%s\": out of memory applying its BSP aggregate of %zu rows: kept "
                 "for the next clock",
                 table_name(e->t), total);
    } else if (total > 0) {
        size_t k = 0, ngone = 0;
        for (uint32_t p = 0; p < nparts; p++)
            for (size_t i = 0; i < parts[p].n; i++) {
                const float *r = parts[p].floats + i * w;
                float count = r[dim]; /* pushes that touched the row */
                float scale = mean && count > 1.0f ? 1.0f / count : 1.0f;
                bool finite = true;
                for (size_t j = 0; j < dim; j++) {
                    grads[k * dim + j] = r[j] * scale;
                    finite = finite && isfinite(grads[k * dim + j]);
                }
                if (!finite) {
                    log_error("table \"%s\": the BSP sum of id %lld is not finite: dropped, "
                              "not applied",
                              table_name(e->t), (long long)parts[p].ids[i]);
                    gone[ngone++] = parts[p].ids[i];
                    continue;
                }
                ids[k++] = parts[p].ids[i];
            }
        int rc =
            table_push_track(e->t, ids, k, grads, (int64_t)time_op_ms(), done, err, sizeof(err));
        if (rc == TABLE_OVERFLOW)
            log_error("table \"%s\": applying its BSP aggregate: %s (their sums dropped)",
                      table_name(e->t), err);
        else if (rc != TABLE_OK)
            log_warn("table \"%s\": applying its BSP aggregate: %s (the rows not applied are "
                     "kept for the next clock)",
                     table_name(e->t), err);
        size_t applied = 0;
        for (size_t i = 0; i < k; i++)
            if (done[i]) {
                gone[ngone++] = ids[i];
                applied++;
            }
        table_remove(agg->t, gone, ngone);
        if (applied > 0)
            atomic_fetch_add(&st->updates_applied, 1);
    }
    pthread_mutex_unlock(&e->bsp_lock);
    for (uint32_t p = 0; parts && p < nparts; p++)
        table_rows_free(&parts[p]);
    free(parts);
    free(ids);
    free(gone);
    free(grads);
    free(done);
    entry_put(agg);
}

typedef struct id_row {
    int64_t id;
    const float *row;
} id_row;

static int id_row_cmp(const void *a, const void *b)
{
    int64_t x = ((const id_row *)a)->id, y = ((const id_row *)b)->id;
    return (x > y) - (x < y);
}

static int entry_name_cmp(const void *a, const void *b)
{
    return strcmp(table_name((*(table_entry *const *)a)->t),
                  table_name((*(table_entry *const *)b)->t));
}

uint64_t server_tables_checksum(server_state *st, uint64_t h)
{
    size_t n;
    table_entry **es = entries_list(st, &n);
    if (n)
        qsort(es, n, sizeof(*es), entry_name_cmp);
    for (size_t i = 0; es && i < n; i++) {
        table *t = es[i]->t;
        uint32_t nparts = table_partitions(t), w = table_row_floats(t);
        table_rows *parts = calloc(nparts, sizeof(*parts));
        size_t total = 0;
        for (uint32_t p = 0; parts && p < nparts; p++)
            if (table_copy_partition(t, p, &parts[p]) == 0)
                total += parts[p].n;
        id_row *rows = malloc((total ? total : 1) * sizeof(*rows));
        h = fnv1a_update(h, table_name(t), strlen(table_name(t)) + 1);
        if (parts && rows) {
            size_t k = 0;
            for (uint32_t p = 0; p < nparts; p++)
                for (size_t j = 0; j < parts[p].n; j++, k++)
                    rows[k] = (id_row){parts[p].ids[j], parts[p].floats + j * w};
            qsort(rows, total, sizeof(*rows), id_row_cmp);
            for (size_t j = 0; j < total; j++) {
                h = fnv1a_update(h, &rows[j].id, sizeof(rows[j].id));
                h = fnv1a_update(h, rows[j].row, w * sizeof(float));
            }
        } else {
            h = ~h; /* out of memory: a checksum no copy matches */
        }
        for (uint32_t p = 0; parts && p < nparts; p++)
            table_rows_free(&parts[p]);
        free(parts);
        free(rows);
    }
    entries_release(es, n);
    return h;
}

void server_tables_bsp_apply(server_state *st, bool mean)
{
    size_t n;
    table_entry **es = entries_list(st, &n);
    for (size_t i = 0; es && i < n; i++) {
        if (es[i]->spec->staleness != 0 || is_bsp_aggregate(table_name(es[i]->t)))
            continue;
        /* Held against a checkpoint's copy like an update: it has the aggregate or its rows. */
        store_update_begin(st->vars);
        bsp_apply_one(st, es[i], mean);
        store_update_end(st->vars);
    }
    entries_release(es, n);
}

int server_table_push(server_state *st, server_table *e, uint64_t client, uint64_t seq,
                      int32_t worker, const int64_t *ids, uint64_t n, const uint8_t *grads,
                      int dtype, bool *duplicate, char *errbuf, size_t errlen)
{
    char err[512];
    const char *name = table_name(e->t);
    *duplicate = false;
    /* A BFLOAT16 gradient is widened before the dedup mark (nothing is held meanwhile). */
    float *wide = NULL;
    if (dtype != PSD__V1__DTYPE__FLOAT32) {
        size_t count = (size_t)n * table_dim(e->t);
        wide = malloc(count * sizeof(float));
        if (wide == NULL) {
            snprintf(errbuf, errlen, "table \"%s\": out of memory for %llu gradient rows", name,
                     (unsigned long long)n);
            return STATUS_RESOURCE_EXHAUSTED;
        }
        frame_get_floats(wide, grads, count, dtype);
        grads = (const uint8_t *)wide;
    }
    store_update_begin(st->vars);
    uint64_t floor = 0;
    dedup_result d = dedup_begin_floor(st->dedup, client, seq, &floor);
    if (d != DEDUP_NEW && d != DEDUP_DUPLICATE) {
        store_update_end(st->vars);
        free(wide);
        server_push_refusal(d, client, seq, floor, errbuf, errlen);
        return STATUS_ABORTED;
    }
    if (worker >= 0)
        sync_heard(st, worker);
    int64_t now = (int64_t)time_op_ms();
    int rc = TABLE_OK;
    bool bsp = e->spec->staleness == 0 && worker >= 0;
    if (d == DEDUP_NEW && bsp) {
        /* BSP: summed into the aggregate, applied once every live worker passed this clock. */
        rc = bsp_add(st, e, ids, (size_t)n, (const float *)(const void *)grads, now, err,
                     sizeof(err));
        if (rc == TABLE_INVALID)
            dedup_unmark(st->dedup, client, seq);
    } else if (d == DEDUP_NEW) {
        rc = table_push(e->t, ids, (size_t)n, grads, now, err, sizeof(err));
        if (rc == TABLE_INVALID)
            dedup_unmark(st->dedup, client, seq); /* nothing was applied */
    } else {
        atomic_fetch_add(&st->duplicates_dropped, 1);
    }
    store_update_end(st->vars);
    free(wide);
    if (rc == TABLE_INVALID) {
        snprintf(errbuf, errlen, "table \"%s\": %s: the batch was refused, nothing applied", name,
                 err);
        return STATUS_INVALID_ARGUMENT;
    }
    if (rc == TABLE_OVERFLOW) {
        /* The other rows were applied (the dedup mark stays: a resend is a duplicate). */
        snprintf(errbuf, errlen, "table \"%s\": %s", name, err);
        return STATUS_FAILED_PRECONDITION;
    }
    if (rc != TABLE_OK) {
        snprintf(errbuf, errlen, "table \"%s\": %s%s", name,
                 rc == TABLE_NOMEM ? "out of memory" : err,
                 rc == TABLE_LIMIT ? " (max-server-bytes)" : "");
        return STATUS_RESOURCE_EXHAUSTED;
    }
    if (d == DEDUP_NEW && !bsp) /* a BSP push counts when its aggregate is applied */
        atomic_fetch_add(&st->updates_applied, 1);
    *duplicate = d == DEDUP_DUPLICATE;
    /* ttl_ms: expired rows are swept on a push, at most once a second per table (a replica
     * group's, by the sweeps its primary logs). */
    int64_t last = atomic_load(&e->last_sweep_ms);
    if (e->spec->ttl_ms > 0 && !st->replicated && now - last >= 1000 &&
        atomic_compare_exchange_strong(&e->last_sweep_ms, &last, now))
        table_sweep(e->t, now);
    return STATUS_OK;
}

void server_tables_rebind(server_state *st)
{
    size_t n;
    table_entry **es = entries_list(st, &n);
    for (size_t i = 0; es && i < n; i++)
        table_set_budget_arg(es[i]->t, st);
    entries_release(es, n);
}

void server_tables_sweep_due(server_state *st, void (*log_sweep)(void *arg, const char *name),
                             void *arg)
{
    size_t n;
    table_entry **es = entries_list(st, &n);
    int64_t now = (int64_t)time_wall_ms();
    for (size_t i = 0; es && i < n; i++) {
        table_entry *e = es[i];
        int64_t last = atomic_load(&e->last_sweep_ms);
        if (e->spec->ttl_ms > 0 && !is_bsp_aggregate(table_name(e->t)) && now - last >= 1000 &&
            atomic_compare_exchange_strong(&e->last_sweep_ms, &last, now))
            log_sweep(arg, table_name(e->t));
    }
    entries_release(es, n);
}

/* The table a call names, referenced; NULL after replying NOT_FOUND (saying so when the name
 * is a dense variable). */
static table_entry *resolve_table(server_state *st, rpc_call *call, const char *name)
{
    char err[512];
    int status;
    table_entry *e = server_table_get(st, name, &status, err, sizeof(err));
    if (e == NULL)
        rpc_reply_error(call, status, "%s", err);
    return e;
}

/* Checks a TablePull/TablePush's n and segment (ids, then for a push n rows of gradients in
 * the segment's dtype, FLOAT32 or BFLOAT16: the frame layer refused any other), copies the ids
 * (aligned) into *ids_out and checks this server owns each. Replies with the error and returns
 * false otherwise. */
static bool table_ids(server_state *st, rpc_call *call, table_entry *e, uint64_t n, bool push,
                      int64_t **ids_out, const uint8_t **grads_out)
{
    const char *name = table_name(e->t);
    uint64_t dim = table_dim(e->t);
    const envelope *env = rpc_call_envelope(call);
    char err[512];
    if (n == 0 || n > SERVER_TABLE_MAX_IDS) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": n = %llu ids (must be 1..%llu per request)", name,
                        (unsigned long long)n, (unsigned long long)SERVER_TABLE_MAX_IDS);
        return false;
    }
    size_t esize = frame_dtype_size(env->tensor->dtype);
    size_t seglen;
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    uint64_t want = 8 * n + (push ? esize * n * dim : 0);
    if (seglen != want) {
        if (push)
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": segment is %zu bytes, but n = %llu ids and rows of "
                            "dim %llu need %llu (8 x n bytes of ids, then %zu x n x dim of "
                            "gradients)",
                            name, seglen, (unsigned long long)n, (unsigned long long)dim,
                            (unsigned long long)want, esize);
        else
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": ids segment is %zu bytes, but n = %llu ids need 8 x n "
                            "= %llu",
                            name, seglen, (unsigned long long)n, (unsigned long long)want);
        return false;
    }
    if (!push && esize * n * dim + 4096 > rpc_call_max_message(call)) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "table \"%s\": %llu rows of dim %llu would exceed max-message-bytes (%zu) "
                        "in the reply; pull fewer ids per request",
                        name, (unsigned long long)n, (unsigned long long)dim,
                        rpc_call_max_message(call));
        return false;
    }
    int rc = server_table_ids(st, e, seg, n, ids_out, err, sizeof(err));
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return false;
    }
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
    entry_put(e);
}

/* A TablePull's ids and table, held until its rows are read (now, or when the staleness bound
 * allows). */
typedef struct table_pull_wait {
    table_entry *e;
    int64_t *ids;
    uint64_t n;
} table_pull_wait;

static void table_pull_drop(void *arg, bool timed_out)
{
    (void)timed_out;
    table_pull_wait *w = arg;
    free(w->ids);
    entry_put(w->e);
    free(w);
}

static void table_pull_answer(server_state *st, rpc_call *call, void *arg, int64_t min_clock,
                              uint64_t wait_ns)
{
    (void)st, (void)min_clock, (void)wait_ns;
    table_pull_wait *w = arg;
    if (atomic_load(&w->e->deleted)) {
        rpc_reply_error(call, STATUS_NOT_FOUND, "table \"%s\" was deleted", table_name(w->e->t));
    } else {
        int dtype = rpc_call_envelope(call)->tensor->dtype;
        size_t count = (size_t)w->n * table_dim(w->e->t);
        Psd__V1__TablePullReply rep = PSD__V1__TABLE_PULL_REPLY__INIT;
        uint8_t *dst = rpc_reply_ok_tensor(call, &rep.base, dtype, 0, count);
        if (dst != NULL && server_table_read(w->e, w->ids, w->n, dst, dtype) != 0)
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for rows");
    }
    table_pull_drop(w, false);
}

void handle_table_pull(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePullRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    if (e == NULL)
        return;
    if (!table_ids(st, call, e, req->n, false, &ids, NULL)) {
        entry_put(e);
        return;
    }
    table_pull_wait *w = malloc(sizeof(*w));
    if (w == NULL) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for a pull");
        free(ids);
        entry_put(e);
        return;
    }
    *w = (table_pull_wait){e, ids, req->n};
    const envelope *env = rpc_call_envelope(call);
    int32_t bound = e->spec->staleness;
    if (bound < 0) {
        table_pull_answer(st, call, w, 0, 0);
        return;
    }
    /* SSP: like a dense pull, at clock c it waits until every live worker reached c - s. */
    char what[160];
    snprintf(what, sizeof(what), "pull of table \"%.64s\" at clock %lld (bound: clock %lld)",
             table_name(e->t), (long long)env->clock, (long long)(env->clock - bound));
    sync_wait(st, call, env->worker_id, env->clock, env->clock - bound, what, table_pull_answer,
              table_pull_drop, w);
}

void handle_table_push(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePushRequest *req = (const void *)rpc_call_body(call);
    const envelope *env = rpc_call_envelope(call);
    if (req->sweep && !rpc_call_trusted(call)) {
        rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                        "table push: sweep is internal to replication (a replicated group's "
                        "primary logs its tables' expiry); it is not a client's request");
        return;
    }
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    const uint8_t *grads;
    if (e == NULL)
        return;
    if (req->sweep) {
        /* Held against a checkpoint's copy like an update. */
        store_update_begin(st->vars);
        table_sweep(e->t, (int64_t)time_op_ms());
        store_update_end(st->vars);
        entry_put(e);
        Psd__V1__TablePushReply rep = PSD__V1__TABLE_PUSH_REPLY__INIT;
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (!table_ids(st, call, e, req->n, true, &ids, &grads)) {
        entry_put(e);
        return;
    }
    char err[768];
    bool dup;
    int rc = server_table_push(st, e, env->client_id, env->seq, env->worker_id, ids, req->n, grads,
                               env->tensor->dtype, &dup, err, sizeof(err));
    free(ids);
    entry_put(e);
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return;
    }
    Psd__V1__TablePushReply rep = PSD__V1__TABLE_PUSH_REPLY__INIT;
    rep.duplicate = dup;
    rpc_reply_ok(call, &rep.base);
}

/* TableExport (psctl dump): a page of this server's rows, ids then rows in the segment. */
static void export_page(rpc_call *call, const Psd__V1__TableExportRequest *req, table_entry *e)
{
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

void handle_table_export(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TableExportRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    if (e == NULL)
        return;
    export_page(call, req, e);
    entry_put(e);
}

/* ---- checkpoints (server/checkpoint.c) ---- */

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
    table_entry **es = entries_list(st, &nt);
    if (nt == 0)
        return 0;
    server_table_copy *c = es ? calloc(nt, sizeof(*c)) : NULL;
    if (c == NULL) {
        entries_release(es, nt);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nt; i++)
        rc = copy_prepare(&c[i], es[i], base);
    *out = c;
    *n = nt;
    entries_release(es, nt);
    return rc;
}

int server_tables_copy(server_state *st, uint64_t base, uint64_t id, bool track,
                       server_table_copy **out, size_t *n)
{
    server_table_copy *pre = *out;
    size_t npre = *n;
    *out = NULL;
    *n = 0;
    size_t nt;
    table_entry **es = entries_list(st, &nt);
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
        table_cut_start(c[i].cut, id, track);
        c[i].delta = table_cut_is_delta(c[i].cut);
    }
    server_tables_copy_free(pre, npre); /* tables deleted since the prepare, if any */
    entries_release(es, nt);
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
    if (ne)
        pthread_mutex_init(&ne->bsp_lock, NULL);
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
            atomic_init(&ne->refs, 1);
            st->tables->e[st->tables->n++] = ne;
            ne = NULL;
            copy = NULL;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    if (ne)
        pthread_mutex_destroy(&ne->bsp_lock);
    free(ne);
    if (copy)
        psd__v1__table_spec__free_unpacked(copy, NULL);
    return rc;
}

/* ---- ServerStatus ---- */

static int status_name_cmp(const void *a, const void *b)
{
    const Psd__V1__TableStatus *x = *(const Psd__V1__TableStatus *const *)a,
                               *y = *(const Psd__V1__TableStatus *const *)b;
    return strcmp(x->name, y->name);
}

int server_tables_status(server_state *st, const char *only, Psd__V1__TableStatus ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t ne;
    table_entry **es = entries_list(st, &ne);
    if (ne == 0)
        return 0;
    Psd__V1__TableStatus **ts = es ? calloc(ne, sizeof(*ts)) : NULL;
    if (ts == NULL) {
        entries_release(es, ne);
        return -1;
    }
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; i < ne; i++) {
        if ((only && only[0] && strcmp(only, table_name(es[i]->t)) != 0) ||
            is_bsp_aggregate(table_name(es[i]->t)))
            continue;
        Psd__V1__TableStatus *x = malloc(sizeof(*x));
        char *name = strdup(table_name(es[i]->t));
        if (x == NULL || name == NULL) {
            free(x);
            free(name);
            rc = -1;
            break;
        }
        psd__v1__table_status__init(x);
        table_stats s;
        table_stats_get(es[i]->t, &s);
        x->name = name;
        x->dim = table_dim(es[i]->t);
        x->staleness = es[i]->spec->staleness;
        x->optimizer = es[i]->spec->optimizer;
        x->rows = s.rows;
        x->bytes = s.bytes;
        x->rows_created = s.rows_created;
        x->pushes_counted = s.pushes_counted;
        x->evicted_ttl = s.evicted_ttl;
        x->evicted_max_rows = s.evicted_max_rows;
        x->evicted_memory = s.evicted_memory;
        x->lookups = s.lookups;
        x->rows_updated = s.rows_updated;
        ts[k++] = x;
    }
    entries_release(es, ne);
    if (k > 1)
        qsort(ts, k, sizeof(*ts), status_name_cmp);
    *out = ts;
    *n = k;
    if (rc != 0) {
        server_tables_status_free(ts, k);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

void server_tables_status_free(Psd__V1__TableStatus **ts, size_t n)
{
    for (size_t i = 0; ts && i < n; i++) {
        free(ts[i]->name);
        free(ts[i]);
    }
    free(ts);
}

size_t server_tables_count(server_state *st)
{
    size_t n = 0;
    pthread_mutex_lock(&tables_lock);
    for (size_t i = 0; st->tables && i < st->tables->n; i++)
        n += !is_bsp_aggregate(table_name(st->tables->e[i]->t));
    pthread_mutex_unlock(&tables_lock);
    return n;
}

/* ---- metrics ---- */

void server_tables_metrics(metrics_out *out, server_state *st)
{
    size_t n;
    table_entry **es = entries_list(st, &n);
    /* BSP aggregates are part of their tables, not tables of their own. */
    size_t kept = 0;
    for (size_t i = 0; es && i < n; i++) {
        if (is_bsp_aggregate(table_name(es[i]->t)))
            entry_put(es[i]);
        else
            es[kept++] = es[i];
    }
    if (es)
        n = kept;
    metrics_emit_one(out, "psd_server_tables", METRIC_GAUGE, "Sparse tables held.", (double)n);
    table_stats *ts = es ? calloc(n, sizeof(*ts)) : NULL;
    if (ts == NULL) {
        entries_release(es, n);
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
    entries_release(es, n);
}
