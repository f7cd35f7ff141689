/* A checkpoint's snapshot (ckpt_snapshot.h): the components of a server's state, each copied
 * in three steps (prepare, take, finish) around one pause of its updates. */
#include "ckpt_snapshot.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slot_gate.h"
#include "table.h"
#include "timeutil.h"
#include "util.h"

#define AGG_WORDS CKPT_AGG_WORDS
_Static_assert(AGG_WORDS <= VARIABLE_AGG_MIN_WORDS, "variable_agg_ensure makes too few words");

void ckpt_snapshot_free(ckpt_snapshot *s)
{
    server_tables_copy_free(s->tables, s->ntables);
    for (size_t i = 0; i < s->nvars; i++) {
        free(s->vars[i].spec);
        free(s->vars[i].data);
    }
    free(s->vars);
    free(s->dedup);
    free(s->floors);
    free(s->workers);
    free(s->slots_owner);
    memset(s, 0, sizeof(*s));
}

static size_t var_floats(const variable *v, bool agg)
{
    return (size_t)v->count * (1 + v->nslots + (agg ? 1 : 0));
}

/* Allocates (and touches, so that the copy under the lock does not fault) room for v. */
static int snap_reserve(ckpt_snap_var *sv, const variable *v)
{
    /* Outside the variable's locks: agg_ready, not agg, may be read (a hint: snap_copy grows
     * the buffer if the aggregate was made meanwhile). */
    bool agg = v->staleness == 0 || atomic_load(&v->agg_ready);
    if (atomic_load(&v->version) == 0 && !atomic_load(&v->agg_ready))
        return 0; /* likely still initial (snap_copy allocates if not) */
    size_t need = var_floats(v, agg);
    if (need == 0)
        need = 1;
    if (sv->data_cap >= need)
        return 0;
    free(sv->data);
    sv->data = malloc(need * sizeof(float));
    if (sv->data == NULL) {
        sv->data_cap = 0;
        return -1;
    }
    memset(sv->data, 0, need * sizeof(float));
    sv->data_cap = need;
    return 0;
}

/* Copies v into sv; called with the store frozen. Returns -1 if memory can't be had. */
static int snap_copy(ckpt_snap_var *sv, variable *v)
{
    variable_lock_all(v);
    uint32_t has_agg = v->agg != NULL;
    /* Never updated (no push, no BSP contribution): its values are the initializer's, which
     * the restore makes again from the spec. A checkpoint made for a create is then small. */
    sv->initial = atomic_load(&v->version) == 0 && !has_agg;
    size_t need = sv->initial ? 0 : var_floats(v, has_agg);
    if (sv->data_cap < need || sv->data == NULL) {
        free(sv->data);
        sv->data = malloc((need ? need : 1) * sizeof(float));
        sv->data_cap = sv->data ? need : 0;
    }
    if (sv->data == NULL) {
        variable_unlock_all(v);
        return -1;
    }
    size_t n = sv->initial ? 0 : (size_t)v->count;
    memcpy(sv->data, v->params, n * sizeof(float));
    for (size_t i = 0; i < v->nslots; i++)
        memcpy(sv->data + (1 + i) * n, v->slots[i], n * sizeof(float));
    if (has_agg) {
        memcpy(sv->data + (1 + v->nslots) * n, v->agg, n * sizeof(float));
        /* agg_words 0: made by code that does not record it, with SERVER_MAX_WORKERS bits. */
        size_t words = v->agg_words && v->agg_words < AGG_WORDS ? v->agg_words : AGG_WORDS;
        memset(sv->agg_workers, 0, sizeof(sv->agg_workers));
        memcpy(sv->agg_workers, v->agg_workers, words * sizeof(uint64_t));
    }
    sv->src = v;
    sv->numel = v->numel;
    sv->offset = v->offset;
    sv->count = v->count;
    sv->version = atomic_load(&v->version);
    sv->staleness = v->staleness;
    sv->nslots = (uint32_t)v->nslots;
    sv->has_agg = has_agg;
    sv->agg_count = v->agg_count;
    variable_unlock_all(v);
    return 0;
}

/* What a snapshot being taken keeps between its steps. */
typedef struct snap_ctx {
    server_state *st;
    uint64_t base, cut; /* the tables' cuts (server_tables_copy) */
    bool track;
    const char *cold_at, *cold_rel; /* linked cuts of cold tables (server_tables_copy) */
    /* The variables listed before the pause and during it. pre's references are kept until
     * the copy is matched against them: a variable deleted meanwhile stays allocated, so no
     * new one can take its address (ckpt_snap_var.src). */
    variable **pre, **now;
    size_t npre, nnow;
} snap_ctx;

/* One step of a component; returns 0, or -1 with a message (the snapshot then fails). */
typedef int (*snap_step)(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen);

/* Variables: each one's spec and room for its values before the pause, its values during it
 * (variables created since are added); those deleted meanwhile are dropped after it. */
static int vars_prepare(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    c->npre = store_list(c->st->vars, &c->pre);
    if (c->pre == NULL)
        return errf(err, errlen, "out of memory listing variables");
    s->cap = c->npre + 16;
    s->vars = calloc(s->cap, sizeof(*s->vars));
    if (s->vars == NULL)
        return errf(err, errlen, "out of memory for the snapshot's table");
    for (size_t i = 0; i < c->npre; i++) {
        ckpt_snap_var *sv = &s->vars[i];
        variable *v = c->pre[i];
        sv->src = v;
        size_t n = psd__v1__variable_spec__get_packed_size(v->spec);
        sv->spec = malloc(n ? n : 1);
        if (sv->spec == NULL || snap_reserve(sv, v) != 0) {
            errf(err, errlen, "out of memory copying variable \"%s\" (%" PRIu64 " elements)",
                 v->name, v->count);
            s->nvars = i + 1;
            return -1;
        }
        sv->spec_len = psd__v1__variable_spec__pack(v->spec, sv->spec);
    }
    s->nvars = c->npre;
    return 0;
}

static int vars_take(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    c->nnow = store_list(c->st->vars, &c->now);
    if (c->now == NULL)
        return errf(err, errlen, "out of memory listing variables");
    for (size_t i = 0; i < c->nnow; i++) {
        variable *v = c->now[i];
        ckpt_snap_var *sv = NULL;
        for (size_t j = 0; j < s->nvars; j++) {
            size_t k = (i + j) % s->nvars;
            if (s->vars[k].src == v) {
                sv = &s->vars[k];
                break;
            }
        }
        if (sv == NULL) { /* created since the list before the pause */
            if (s->nvars == s->cap) {
                ckpt_snap_var *nv = realloc(s->vars, 2 * s->cap * sizeof(*nv));
                if (nv == NULL)
                    return errf(err, errlen, "out of memory for the snapshot's table");
                memset(nv + s->cap, 0, s->cap * sizeof(*nv));
                s->vars = nv;
                s->cap *= 2;
            }
            sv = &s->vars[s->nvars++];
            size_t n = psd__v1__variable_spec__get_packed_size(v->spec);
            sv->spec = malloc(n ? n : 1);
            if (sv->spec == NULL)
                return errf(err, errlen, "out of memory copying a spec");
            sv->spec_len = psd__v1__variable_spec__pack(v->spec, sv->spec);
        }
        if (snap_copy(sv, v) != 0)
            return errf(err, errlen, "out of memory copying variable \"%s\"", v->name);
    }
    return 0;
}

static int vars_finish(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    (void)c, (void)err, (void)errlen;
    /* Variables deleted between the two lists were never copied (numel stays 0): drop them. */
    size_t kept = 0;
    for (size_t i = 0; i < s->nvars; i++) {
        if (s->vars[i].numel == 0) {
            free(s->vars[i].spec);
            free(s->vars[i].data);
        } else {
            s->vars[kept++] = s->vars[i];
        }
    }
    s->nvars = kept;
    return 0;
}

/* The exactly-once windows and what proves evicted clients' pushes applied. */
static int dedup_take(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    s->dedup = dedup_export(c->st->dedup, &s->dedup_clients, &s->dedup_words);
    if (s->dedup == NULL)
        return errf(err, errlen, "out of memory copying the dedup table");
    s->floors = dedup_export_floors(c->st->dedup, &s->nfloors);
    if (s->floors == NULL)
        return errf(err, errlen, "out of memory copying the dedup tombstones");
    return 0;
}

/* The clock table. */
static int sync_take(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    s->workers = sync_export(c->st, &s->nworkers, &s->applied_min, &s->frontier);
    return 0;
}

/* Sparse tables: the copies' memory is allocated and faulted in before the pause; during it
 * the tables are only marked, and each partition is copied after the thaw, before anything
 * changes it (table.h, table_cut_begin), so the pause does not grow with the rows. */
static int tables_prepare(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    if (server_tables_copy_prepare(c->st, c->base, &s->tables, &s->ntables) != 0)
        return errf(err, errlen, "out of memory preparing the copy of the sparse tables");
    return 0;
}

static int tables_take(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    if (server_tables_copy(c->st, c->base, c->cut, c->track, c->cold_at, c->cold_rel, &s->tables,
                           &s->ntables) != 0)
        return errf(err, errlen, "out of memory starting the copy of the sparse tables");
    return 0;
}

static int tables_finish(snap_ctx *c, ckpt_snapshot *s, char *err, size_t errlen)
{
    (void)c;
    if (server_tables_copy_finish(s->tables, s->ntables) != 0)
        return errf(err, errlen, "out of memory copying the sparse tables");
    return 0;
}

/* The components of a snapshot, in the order their steps run. A step may be NULL. */
static const struct {
    const char *name;
    snap_step prepare; /* before the pause */
    snap_step take;    /* during it, the store frozen */
    snap_step finish;  /* after it */
} components[] = {
    {"variables", vars_prepare, vars_take, vars_finish},
    {"dedup", NULL, dedup_take, NULL},
    {"clock table", NULL, sync_take, NULL},
    {"sparse tables", tables_prepare, tables_take, tables_finish},
};
#define NCOMPONENTS (sizeof(components) / sizeof(components[0]))

int ckpt_snapshot_take(server_state *st, ckpt_snapshot *s, uint64_t base, uint64_t cut, bool track,
                       checkpoint_position_fn position, void *position_arg, uint64_t *pause_ns,
                       char *err, size_t errlen)
{
    return ckpt_snapshot_take_linked(st, s, base, cut, track, NULL, NULL, position, position_arg,
                                     pause_ns, err, errlen);
}

int ckpt_snapshot_take_linked(server_state *st, ckpt_snapshot *s, uint64_t base, uint64_t cut,
                              bool track, const char *cold_at, const char *cold_rel,
                              checkpoint_position_fn position, void *position_arg,
                              uint64_t *pause_ns, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    /* A copy: a move's COMMIT may change the live map while the file is written. */
    if (slot_gate_map_copy(st, &s->slots, &s->slots_owner) != 0) {
        snprintf(err, errlen, "out of memory copying the slot map");
        return -1;
    }
    snap_ctx c = {.st = st,
                  .base = base,
                  .cut = cut,
                  .track = track,
                  .cold_at = cold_at,
                  .cold_rel = cold_rel};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < NCOMPONENTS; i++)
        if (components[i].prepare)
            rc = components[i].prepare(&c, s, err, errlen);
    if (rc == 0) {
        uint64_t t0 = time_now_ns();
        if (position)
            s->has_pos = position(position_arg, true, &s->pos_epoch, &s->pos_lsn);
        store_freeze(st->vars);
        for (size_t i = 0; rc == 0 && i < NCOMPONENTS; i++)
            if (components[i].take)
                rc = components[i].take(&c, s, err, errlen);
        s->create_gen = atomic_load(&st->create_gen);
        store_thaw(st->vars);
        if (position)
            position(position_arg, false, NULL, NULL);
        *pause_ns = time_now_ns() - t0;
        for (size_t i = 0; rc == 0 && i < NCOMPONENTS; i++)
            if (components[i].finish)
                rc = components[i].finish(&c, s, err, errlen);
    }
    store_list_release(c.now, c.nnow);
    store_list_release(c.pre, c.npre);
    if (rc != 0) {
        ckpt_snapshot_free(s);
        return -1;
    }
    return 0;
}
