/* The registry of the sparse tables one server holds (table_registry.h): entries and their
 * references under one lock, the budget hook, making and registering tables, finding a table
 * for a call, its ids and rows, and the walks over every table (rebind, sweeps, checksum). */
#include "table_registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "log.h"
#include "placement.h"
#include "server.h"
#include "status.h"
#include "timeutil.h"
#include "util.h"

#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

struct server_tables {
    table_entry **e;
    size_t n, cap;
};

/* One lock for the registry of every server_state (a process has one). A call that finds an
 * entry holds a reference on it (registry_find, registry_put), so an entry unlinked meanwhile stays
 * valid until its last call is done. */
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;

table_entry *registry_find(server_state *st, const char *name)
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

void registry_put(table_entry *e)
{
    if (e == NULL || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&e->bsp_lock);
    table_destroy(e->t);
    psd__v1__table_spec__free_unpacked(e->spec, NULL);
    free(e);
}

table_entry **registry_list(server_state *st, size_t *n)
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

void registry_release(table_entry **es, size_t n)
{
    for (size_t i = 0; es && i < n; i++)
        registry_put(es[i]);
    free(es);
}

size_t registry_held(server_state *st)
{
    pthread_mutex_lock(&tables_lock);
    size_t held = st->tables ? st->tables->n : 0;
    pthread_mutex_unlock(&tables_lock);
    return held;
}

size_t server_tables_count(server_state *st)
{
    size_t n = 0;
    pthread_mutex_lock(&tables_lock);
    for (size_t i = 0; st->tables && i < st->tables->n; i++)
        n += !registry_is_bsp_name(table_name(st->tables->e[i]->t));
    pthread_mutex_unlock(&tables_lock);
    return n;
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
    if (registry_is_bsp_name(name))
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
    registry_put(agg);
    if (e == NULL)
        return -1;
    table_stats ts;
    table_stats_get(e->t, &ts);
    log_info("table \"%s\" deleted (%llu rows, %llu bytes on this server)", name,
             (unsigned long long)ts.rows, (unsigned long long)ts.bytes);
    registry_put(e); /* the registry's reference: freed once the last call holding it is done */
    return 0;
}

bool server_table_exists(server_state *st, const char *name)
{
    table_entry *e = registry_find(st, name);
    registry_put(e);
    return e != NULL;
}

void server_tables_free(server_state *st)
{
    if (st->tables == NULL)
        return;
    for (size_t i = 0; i < st->tables->n; i++)
        registry_put(st->tables->e[i]);
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

bool registry_spec_equal(const Psd__V1__TableSpec *a, const Psd__V1__TableSpec *b)
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

int registry_table_spec(const Psd__V1__TableSpec *s, table_spec *out, char *err, size_t errlen)
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
    switch (s->dtype) {
    case PSD__V1__DTYPE__DTYPE_UNSPECIFIED:
    case PSD__V1__DTYPE__FLOAT32:
        out->dtype = ROW_FLOAT32;
        break;
    case PSD__V1__DTYPE__BFLOAT16:
        out->dtype = ROW_BFLOAT16;
        break;
    case PSD__V1__DTYPE__FLOAT16:
        out->dtype = ROW_FLOAT16;
        break;
    default:
        snprintf(err, errlen, "table \"%s\": dtype %d is not one of FLOAT32, BFLOAT16, FLOAT16",
                 s->name, (int)s->dtype);
        return STATUS_INVALID_ARGUMENT;
    }
    out->min_count = s->min_count;
    out->ttl_ms = s->ttl_ms;
    out->max_rows = s->max_rows;
    out->ram_rows = s->ram_rows;
    /* A BSP aggregate holds acknowledged gradients: refused rather than evicted. */
    out->never_evict = registry_is_bsp_name(s->name);
    return STATUS_OK;
}

/* max-server-bytes: a table's allocation is refused when it would take the process's
 * variables and tables past it (the table then evicts a row to make room, or refuses the
 * row); the state's own table bytes are counted for its status. */
static bool table_budget_take(void *arg, uint64_t bytes)
{
    server_state *st = arg;
    if (!budget_take(st->budget, bytes))
        return false;
    atomic_fetch_add(&st->table_bytes, bytes);
    return true;
}

static void table_budget_give(void *arg, uint64_t bytes)
{
    server_state *st = arg;
    budget_give(st->budget, bytes);
    atomic_fetch_sub(&st->table_bytes, bytes);
}

/* The server's cold-dir: one setting for every state of the process (replica groups' copies). */
static const char *cold_dir;

void registry_set_cold_dir(const char *dir)
{
    cold_dir = dir && dir[0] ? dir : NULL;
}

void registry_budget(table_spec *ts, server_state *st)
{
    ts->budget.take = table_budget_take;
    ts->budget.give = table_budget_give;
    ts->budget.arg = st;
    /* A replicated group's copies decide evictions alike only by counting rows. */
    ts->budget.logical = st->budget != NULL && st->budget->tables_logical;
    ts->cold_dir = cold_dir;
}

table_entry *registry_add_created(server_state *st, table *t, const Psd__V1__TableSpec *s,
                                  bool *created)
{
    table_entry *e = NULL;
    *created = false;
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
        *created = true;
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
    return e;
}

/* ---- finding tables, reading ids and rows (TablePull, TablePush, Step) ---- */

server_table *server_table_get(server_state *st, const char *name, int *status, char *err,
                               size_t errlen)
{
    table_entry *e = registry_is_bsp_name(name) ? NULL : registry_find(st, name);
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
    registry_put(e);
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
    slot_map map = server_slots(st);
    uint64_t name_hash = placement_hash(name);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t owner = slots_row_owner_h(&map, name_hash, ids[i]);
        if (owner != st->task_index) {
            snprintf(err, errlen,
                     "table \"%s\": id %lld (index %llu) belongs on ps %u, not ps %u (split ids "
                     "by slots_row_owner)",
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
    else if (registry_table_spec(s, &ts, err, errlen) == STATUS_OK) {
        registry_budget(&ts, st);
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

/* ---- every table ---- */

void server_tables_rebind(server_state *st)
{
    size_t n;
    table_entry **es = registry_list(st, &n);
    for (size_t i = 0; es && i < n; i++)
        table_set_budget_arg(es[i]->t, st);
    registry_release(es, n);
}

void server_tables_sweep_due(server_state *st, void (*log_sweep)(void *arg, const char *name),
                             void *arg)
{
    size_t n;
    table_entry **es = registry_list(st, &n);
    int64_t now = (int64_t)time_wall_ms();
    for (size_t i = 0; es && i < n; i++) {
        table_entry *e = es[i];
        int64_t last = atomic_load(&e->last_sweep_ms);
        if (e->spec->ttl_ms > 0 && !registry_is_bsp_name(table_name(e->t)) && now - last >= 1000 &&
            atomic_compare_exchange_strong(&e->last_sweep_ms, &last, now))
            log_sweep(arg, table_name(e->t));
    }
    registry_release(es, n);
}

/* Checksum: each table's rows sorted by id. */
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
    table_entry **es = registry_list(st, &n);
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
    registry_release(es, n);
    return h;
}
