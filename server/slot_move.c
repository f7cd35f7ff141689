/* slot_move.c - a batch of slots exported, installed and dropped (slot_move.h).
 *
 * The package, in the host's byte order (little-endian on every host we build), each part
 * starting on 8 bytes:
 *   u32 magic "PSMV", u32 format (1), u32 nslots, u32 source task;
 *   u64 bitmap[nslots / 64]: the batch's slots;
 *   u64 nwindows, u32 words, u32 0; nwindows x (client, highest, bits[words]) (dedup_export);
 *   u32 ntables, u32 0; per table: u32 spec_len, u32 row_floats, u64 nrows, the packed
 *     TableSpec (padded to 8), nrows x (i64 id, i64 updated_ms), nrows x row_floats f32
 *     (parameters then optimizer slots; padded to 8);
 *   u32 nvars, u32 0; per variable: u32 spec_len, u32 nslots, u64 numel, u64 version,
 *     i32 staleness, u32 part, the packed VariableSpec (padded to 8), (1 + nslots) x numel f32
 *     (parameters, then each optimizer slot; padded to 8). A variable held whole has part 0
 *     and numel its elements; of one cut in parts (spec.parts) an entry is a part (part its
 *     index, numel its elements) or the head (numel 0), sent with every part and with the
 *     name's slot so that the target can serve what it receives;
 *   u32 CRC-32C of everything before it, u32 0.
 *
 * Format 2 (the changes of a batch since a snapshot of it, slot_move_export_changes) is format 1
 * with, per table, a u64 nids after nrows, its rows those made or updated since the snapshot
 * (updated_ms at or after it, or 0: made by a read and never updated) and, after their floats,
 * nids x i64: the id of every row the table holds in the batch (the target drops the others). */
#include "slot_move.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "hash.h"
#include "placement.h"
#include "slots.h"
#include "status.h"
#include "table_ckpt.h"
#include "table_registry.h"

#define PKG_MAGIC 0x564d5350u /* "PSMV" */
#define PKG_FORMAT 1u
#define PKG_FORMAT_CHANGES 2u

void slot_set_mark(uint64_t *bits, uint32_t nslots, const uint32_t *slots, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (slots[i] < nslots)
            bits[slots[i] / 64] |= UINT64_C(1) << (slots[i] % 64);
}

/* ---- writing ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} wbuf;

static void put(wbuf *b, const void *src, size_t n)
{
    if (b->failed || n == 0)
        return; /* nothing to copy (src may then be NULL: a table with no row to move) */
    size_t need = b->len + n + 8;
    if (need > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < need)
            nc *= 2;
        uint8_t *g = realloc(b->p, nc);
        if (g == NULL) {
            b->failed = true;
            return;
        }
        b->p = g;
        b->cap = nc;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void pad8(wbuf *b)
{
    static const uint8_t zero[8];
    if (b->len % 8)
        put(b, zero, 8 - b->len % 8);
}

static void put32(wbuf *b, uint32_t v)
{
    put(b, &v, 4);
}

static void put64(wbuf *b, uint64_t v)
{
    put(b, &v, 8);
}

/* ---- reading ---- */

typedef struct rbuf {
    const uint8_t *p;
    size_t len, at;
    bool bad;
} rbuf;

static const uint8_t *take(rbuf *r, size_t n)
{
    if (r->bad || n > r->len - r->at) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *q = r->p + r->at;
    r->at += n;
    return q;
}

static void skip8(rbuf *r)
{
    if (r->at % 8)
        take(r, 8 - r->at % 8);
}

static uint32_t get32(rbuf *r)
{
    uint32_t v = 0;
    const uint8_t *q = take(r, 4);
    if (q)
        memcpy(&v, q, 4);
    return v;
}

static uint64_t get64(rbuf *r)
{
    uint64_t v = 0;
    const uint8_t *q = take(r, 8);
    if (q)
        memcpy(&v, q, 8);
    return v;
}

/* ---- export ---- */

/* True if the batch moves v: a variable held whole by its name's slot, a part by its own;
 * heads go with the batch too (var_head_in), but are never dropped. */
static bool var_in(const variable *v, const uint64_t *bits, uint32_t nslots)
{
    if (v->spec->parts && v->part != VARIABLE_HEAD)
        return slot_set_has(bits, slots_of_part(v->name, v->part, nslots));
    return !v->spec->split && slot_set_has(bits, slots_of_name(v->name, nslots));
}

/* True if the batch carries the head v: its name's slot or one of its parts is in the batch
 * (parts: the n parts the batch moves). */
static bool var_head_in(const variable *v, variable *const *parts, size_t n, const uint64_t *bits,
                        uint32_t nslots)
{
    if (!variable_is_head(v))
        return false;
    if (slot_set_has(bits, slots_of_name(v->name, nslots)))
        return true;
    for (size_t i = 0; i < n; i++)
        if (strcmp(parts[i]->name, v->name) == 0)
            return true;
    return false;
}

/* True when the BSP aggregate of v holds gradients of the open clock. */
static bool var_pending(variable *v)
{
    if (!atomic_load(&v->agg_ready))
        return false;
    variable_lock_all(v);
    bool pending = v->agg_count > 0;
    variable_unlock_all(v);
    return pending;
}

/* True when a row updated at updated_ms goes with the changes since since_ms (< 0: every row). */
static bool row_changed(int64_t updated_ms, int64_t since_ms)
{
    return since_ms < 0 || updated_ms == 0 || updated_ms >= since_ms;
}

static int export_tables(server_state *st, const uint64_t *bits, uint32_t nslots, int64_t since_ms,
                         wbuf *b, slot_move_counts *cnt, char *err, size_t errlen)
{
    size_t n = 0;
    table_entry **es = registry_list(st, &n);
    if (es == NULL && n > 0)
        return snprintf(err, errlen, "out of memory listing the tables"), STATUS_RESOURCE_EXHAUSTED;
    int rc = STATUS_OK;
    /* A BSP aggregate's rows of the batch are gradients of the open clock: refused. */
    for (size_t i = 0; rc == STATUS_OK && i < n; i++) {
        if (!registry_is_bsp_name(table_name(es[i]->t)))
            continue;
        table_rows rows;
        if (server_table_slot_rows(es[i]->t, bits, nslots, &rows) != 0)
            rc = STATUS_RESOURCE_EXHAUSTED, snprintf(err, errlen, "out of memory");
        else if (rows.n > 0)
            rc = STATUS_FAILED_PRECONDITION,
            snprintf(err, errlen,
                     "table \"%.*s\" is BSP (staleness 0) and its aggregate of the open clock "
                     "holds %zu rows of the batch: BSP state does not move (finish the clock)",
                     (int)(strlen(table_name(es[i]->t)) - strlen(BSP_SUFFIX)), table_name(es[i]->t),
                     rows.n);
        table_rows_free(&rows);
    }
    uint32_t nt = 0;
    for (size_t i = 0; i < n; i++)
        nt += !registry_is_bsp_name(table_name(es[i]->t));
    put32(b, nt);
    put32(b, 0);
    for (size_t i = 0; rc == STATUS_OK && i < n; i++) {
        table_entry *e = es[i];
        if (registry_is_bsp_name(table_name(e->t)))
            continue;
        table_rows rows;
        if (server_table_slot_rows(e->t, bits, nslots, &rows) != 0) {
            snprintf(err, errlen, "out of memory copying the rows of table \"%s\"",
                     table_name(e->t));
            rc = STATUS_RESOURCE_EXHAUSTED;
            break;
        }
        size_t sl = psd__v1__table_spec__get_packed_size(e->spec);
        uint8_t *spec = malloc(sl ? sl : 1);
        if (spec == NULL) {
            table_rows_free(&rows);
            snprintf(err, errlen, "out of memory");
            rc = STATUS_RESOURCE_EXHAUSTED;
            break;
        }
        psd__v1__table_spec__pack(e->spec, spec);
        size_t nch = 0;
        for (size_t k = 0; k < rows.n; k++)
            nch += row_changed(rows.updated_ms[k], since_ms);
        put32(b, (uint32_t)sl);
        put32(b, rows.row_floats);
        put64(b, nch);
        if (since_ms >= 0)
            put64(b, rows.n);
        put(b, spec, sl);
        pad8(b);
        for (size_t k = 0; k < rows.n; k++)
            if (row_changed(rows.updated_ms[k], since_ms)) {
                put64(b, (uint64_t)rows.ids[k]);
                put64(b, (uint64_t)rows.updated_ms[k]);
            }
        if (nch == rows.n)
            put(b, rows.floats, rows.n * rows.row_floats * sizeof(float));
        else
            for (size_t k = 0; k < rows.n; k++)
                if (row_changed(rows.updated_ms[k], since_ms))
                    put(b, rows.floats + k * rows.row_floats, rows.row_floats * sizeof(float));
        pad8(b);
        if (since_ms >= 0)
            put(b, rows.ids, rows.n * sizeof(int64_t));
        cnt->rows += nch;
        cnt->ids += rows.n;
        free(spec);
        table_rows_free(&rows);
    }
    registry_release(es, n);
    return rc;
}

static int export_vars(server_state *st, const uint64_t *bits, uint32_t nslots, wbuf *b,
                       slot_move_counts *cnt, char *err, size_t errlen)
{
    variable **vs = NULL;
    size_t n = store_list(st->vars, &vs);
    int rc = STATUS_OK;
    uint32_t nv = 0;
    bool *in = calloc(n ? n : 1, sizeof(bool));
    variable **parts = malloc((n ? n : 1) * sizeof(*parts)); /* the parts the batch moves */
    if (in == NULL || parts == NULL) {
        free(in);
        free(parts);
        store_list_release(vs, n);
        return snprintf(err, errlen, "out of memory"), STATUS_RESOURCE_EXHAUSTED;
    }
    size_t nparts = 0;
    for (size_t i = 0; i < n; i++) {
        in[i] = var_in(vs[i], bits, nslots);
        if (in[i] && vs[i]->part != VARIABLE_HEAD)
            parts[nparts++] = vs[i];
    }
    for (size_t i = 0; i < n; i++) {
        in[i] = in[i] || var_head_in(vs[i], parts, nparts, bits, nslots);
        if (!in[i])
            continue;
        if (var_pending(vs[i]) && rc == STATUS_OK) {
            snprintf(err, errlen,
                     "variable \"%s\" is BSP (staleness 0) and its aggregate of the open clock "
                     "holds gradients: BSP state does not move (finish the clock)",
                     vs[i]->name);
            rc = STATUS_FAILED_PRECONDITION;
        }
        nv++;
    }
    put32(b, nv);
    put32(b, 0);
    for (size_t i = 0; rc == STATUS_OK && i < n; i++) {
        variable *v = vs[i];
        if (!in[i])
            continue;
        size_t sl = psd__v1__variable_spec__get_packed_size(v->spec);
        uint8_t *spec = malloc(sl ? sl : 1);
        if (spec == NULL) {
            snprintf(err, errlen, "out of memory");
            rc = STATUS_RESOURCE_EXHAUSTED;
            break;
        }
        psd__v1__variable_spec__pack(v->spec, spec);
        put32(b, (uint32_t)sl);
        put32(b, (uint32_t)v->nslots);
        put64(b, v->count);
        variable_lock_all(v);
        put64(b, atomic_load(&v->version));
        put32(b, (uint32_t)v->staleness);
        put32(b, v->part == VARIABLE_HEAD ? 0 : (uint32_t)v->part);
        put(b, spec, sl);
        pad8(b);
        put(b, v->params, v->count * sizeof(float));
        for (size_t s = 0; s < v->nslots; s++)
            put(b, v->slots[s], v->count * sizeof(float));
        variable_unlock_all(v);
        pad8(b);
        free(spec);
        cnt->variables++;
    }
    free(in);
    free(parts);
    store_list_release(vs, n);
    return rc;
}

/* The package of the batch (since_ms < 0: whole, format 1; else its changes since then, format
 * 2), with the source's windows or none. */
static int export_pkg(server_state *st, const uint64_t *bits, int64_t since_ms, bool windows,
                      uint8_t **out, size_t *len, slot_move_counts *counts, char *err,
                      size_t errlen)
{
    slot_map m = server_slots(st);
    uint32_t nslots = m.nslots;
    *out = NULL;
    *len = 0;
    slot_move_counts cnt = {0};
    wbuf b = {0};
    put32(&b, PKG_MAGIC);
    put32(&b, since_ms < 0 ? PKG_FORMAT : PKG_FORMAT_CHANGES);
    put32(&b, nslots);
    put32(&b, st->task_index);
    put(&b, bits, nslots / 8);
    uint64_t nw = 0;
    uint32_t words = 0;
    uint64_t *win = windows ? dedup_export(st->dedup, &nw, &words) : NULL;
    if (win == NULL && nw > 0) {
        free(b.p);
        return snprintf(err, errlen, "out of memory copying the exactly-once windows"),
               STATUS_RESOURCE_EXHAUSTED;
    }
    put64(&b, nw);
    put32(&b, words);
    put32(&b, 0);
    put(&b, win, nw * (2 + (size_t)words) * sizeof(uint64_t));
    free(win);
    cnt.windows = nw;
    int rc = export_tables(st, bits, nslots, since_ms, &b, &cnt, err, errlen);
    if (rc == STATUS_OK)
        rc = export_vars(st, bits, nslots, &b, &cnt, err, errlen);
    if (rc == STATUS_OK && !b.failed) {
        put32(&b, crc32c(0, b.p, b.len));
        put32(&b, 0);
    }
    if (rc == STATUS_OK && b.failed) {
        snprintf(err, errlen, "out of memory for the package of the batch");
        rc = STATUS_RESOURCE_EXHAUSTED;
    }
    if (rc != STATUS_OK) {
        free(b.p);
        return rc;
    }
    cnt.bytes = b.len;
    if (counts)
        *counts = cnt;
    *out = b.p;
    *len = b.len;
    return STATUS_OK;
}

int slot_move_export(server_state *st, const uint64_t *bits, uint8_t **out, size_t *len,
                     slot_move_counts *counts, char *err, size_t errlen)
{
    return export_pkg(st, bits, -1, true, out, len, counts, err, errlen);
}

int slot_move_export_snapshot(server_state *st, const uint64_t *bits, uint8_t **out, size_t *len,
                              slot_move_counts *counts, char *err, size_t errlen)
{
    return export_pkg(st, bits, -1, false, out, len, counts, err, errlen);
}

int slot_move_export_changes(server_state *st, const uint64_t *bits, int64_t since_ms,
                             uint8_t **out, size_t *len, slot_move_counts *counts, char *err,
                             size_t errlen)
{
    return export_pkg(st, bits, since_ms < 0 ? 0 : since_ms, true, out, len, counts, err, errlen);
}

/* ---- install ---- */

bool slot_move_is_changes(const uint8_t *pkg, size_t len)
{
    uint32_t format = 0;
    if (len >= 8)
        memcpy(&format, pkg + 4, 4);
    return format == PKG_FORMAT_CHANGES;
}

/* One table of a package, as read. */
typedef struct pkg_table {
    Psd__V1__TableSpec *spec;
    const uint8_t *spec_raw;
    uint32_t spec_len, row_floats;
    uint64_t nrows;
    const uint8_t *idt;    /* nrows x (id, updated_ms) */
    const uint8_t *floats; /* nrows x row_floats */
    uint64_t nids;         /* format 2: every row id the table holds in the batch */
    const uint8_t *ids;    /* format 2: nids x i64; NULL in format 1 */
} pkg_table;

typedef struct pkg_var {
    Psd__V1__VariableSpec *spec;
    uint32_t nslots, part;
    uint64_t numel, version;
    int32_t staleness;
    const uint8_t *data; /* (1 + nslots) x numel floats */
} pkg_var;

typedef struct pkg {
    bool changes; /* format 2 */
    uint32_t nslots, from;
    const uint8_t *bits;
    uint64_t nwin;
    uint32_t words;
    const uint8_t *win;
    uint32_t ntables, nvars;
    pkg_table *tables;
    pkg_var *vars;
} pkg;

static void pkg_free(pkg *p)
{
    for (uint32_t i = 0; p->tables && i < p->ntables; i++)
        if (p->tables[i].spec)
            psd__v1__table_spec__free_unpacked(p->tables[i].spec, NULL);
    for (uint32_t i = 0; p->vars && i < p->nvars; i++)
        if (p->vars[i].spec)
            psd__v1__variable_spec__free_unpacked(p->vars[i].spec, NULL);
    free(p->tables);
    free(p->vars);
    memset(p, 0, sizeof(*p));
}

static bool bit_at(const uint8_t *bits, uint32_t slot)
{
    uint64_t w;
    memcpy(&w, bits + (size_t)(slot / 64) * 8, 8);
    return (w >> (slot % 64)) & 1;
}

/* Reads and checks the whole package. Returns STATUS_OK or INVALID_ARGUMENT with why. */
static int pkg_read(const uint8_t *data, size_t len, const uint64_t *want, uint32_t nslots, pkg *p,
                    char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
#define BAD(...)                                                                                   \
    return (snprintf(err, errlen, "slot move package: " __VA_ARGS__), STATUS_INVALID_ARGUMENT)
    if (len < 24 || len % 8)
        BAD("%zu bytes", len);
    uint32_t crc;
    memcpy(&crc, data + len - 8, 4);
    if (crc != crc32c(0, data, len - 8))
        BAD("checksum mismatch");
    rbuf r = {.p = data, .len = len - 8};
    uint32_t magic = get32(&r), format = get32(&r);
    if (magic != PKG_MAGIC || (format != PKG_FORMAT && format != PKG_FORMAT_CHANGES))
        BAD("not a package of format %u or %u", PKG_FORMAT, PKG_FORMAT_CHANGES);
    p->changes = format == PKG_FORMAT_CHANGES;
    p->nslots = get32(&r);
    p->from = get32(&r);
    if (p->nslots != nslots)
        BAD("%u slots, this server has %u", p->nslots, nslots);
    p->bits = take(&r, nslots / 8);
    for (uint32_t s = 0; p->bits && s < nslots; s++)
        if (bit_at(p->bits, s) != slot_set_has(want, s))
            BAD("slot %u is %s the batch asked for", s,
                slot_set_has(want, s) ? "not in" : "beyond");
    p->nwin = get64(&r);
    p->words = get32(&r);
    get32(&r);
    if (p->words > 1u << 16 || p->nwin > (r.len - r.at) / 8 / (2 + (uint64_t)p->words))
        BAD("%llu windows of %u words past its end", (unsigned long long)p->nwin, p->words);
    p->win = take(&r, p->nwin * (2 + (size_t)p->words) * 8);
    p->ntables = get32(&r);
    get32(&r);
    if (r.bad || p->ntables > SERVER_MAX_TABLES)
        BAD("%u tables", p->ntables);
    p->tables = calloc(p->ntables ? p->ntables : 1, sizeof(*p->tables));
    if (p->tables == NULL)
        return snprintf(err, errlen, "out of memory"), STATUS_RESOURCE_EXHAUSTED;
    for (uint32_t i = 0; i < p->ntables; i++) {
        pkg_table *t = &p->tables[i];
        t->spec_len = get32(&r);
        t->row_floats = get32(&r);
        t->nrows = get64(&r);
        t->nids = p->changes ? get64(&r) : 0;
        t->spec_raw = take(&r, t->spec_len);
        skip8(&r);
        if (r.bad || t->row_floats == 0 || t->row_floats > (1u << 20) ||
            t->nrows > (r.len - r.at) / (16 + 4 * (uint64_t)t->row_floats))
            BAD("table %u: %llu rows of %u floats past its end", i, (unsigned long long)t->nrows,
                t->row_floats);
        t->spec = psd__v1__table_spec__unpack(NULL, t->spec_len, t->spec_raw);
        if (t->spec == NULL || t->spec->name == NULL)
            BAD("table %u: a spec that does not decode", i);
        t->idt = take(&r, t->nrows * 16);
        t->floats = take(&r, t->nrows * t->row_floats * 4);
        skip8(&r);
        if (p->changes && (r.bad || t->nids > (r.len - r.at) / 8))
            BAD("table %u: %llu row ids past its end", i, (unsigned long long)t->nids);
        if (p->changes)
            t->ids = take(&r, t->nids * 8);
        for (uint64_t k = 0; !r.bad && k < t->nrows + t->nids; k++) {
            int64_t id;
            memcpy(&id, k < t->nrows ? t->idt + k * 16 : t->ids + (k - t->nrows) * 8, 8);
            if (!slot_set_has(want, slots_of_row(t->spec->name, id, nslots)))
                BAD("table \"%s\": row %lld is not in the batch", t->spec->name, (long long)id);
        }
    }
    p->nvars = get32(&r);
    get32(&r);
    if (r.bad || p->nvars > (r.len - r.at) / 32)
        BAD("%u variables past its end", p->nvars);
    p->vars = calloc(p->nvars ? p->nvars : 1, sizeof(*p->vars));
    if (p->vars == NULL)
        return snprintf(err, errlen, "out of memory"), STATUS_RESOURCE_EXHAUSTED;
    for (uint32_t i = 0; i < p->nvars; i++) {
        pkg_var *v = &p->vars[i];
        uint32_t sl = get32(&r);
        v->nslots = get32(&r);
        v->numel = get64(&r);
        v->version = get64(&r);
        v->staleness = (int32_t)get32(&r);
        v->part = get32(&r);
        const uint8_t *spec = take(&r, sl);
        skip8(&r);
        if (r.bad || v->nslots > OPTIMIZER_MAX_SLOTS ||
            v->numel > (r.len - r.at) / 4 / (1 + (uint64_t)v->nslots))
            BAD("variable %u: %llu elements past its end", i, (unsigned long long)v->numel);
        v->spec = psd__v1__variable_spec__unpack(NULL, sl, spec);
        if (v->spec == NULL || v->spec->name == NULL || (v->spec->split && !v->spec->parts))
            BAD("variable %u: a spec that does not decode, or of a variable split in ranges", i);
        if (!v->spec->parts && (v->numel == 0 || v->part != 0))
            BAD("variable \"%s\": %llu elements, part %u", v->spec->name,
                (unsigned long long)v->numel, v->part);
        if (v->spec->parts) {
            uint64_t total = 1, off, cnt;
            for (size_t d = 0; d < v->spec->n_shape; d++)
                total = v->spec->shape[d] && total <= UINT64_MAX / v->spec->shape[d]
                            ? total * v->spec->shape[d]
                            : 0;
            placement_part_range(total, v->part, &off, &cnt);
            if (v->numel != 0 && v->numel != cnt)
                BAD("variable \"%s\": part %u of %llu elements, its spec says %llu", v->spec->name,
                    v->part, (unsigned long long)v->numel, (unsigned long long)cnt);
            if (v->numel != 0 && !slot_set_has(want, slots_of_part(v->spec->name, v->part, nslots)))
                BAD("variable \"%s\": part %u is not in the batch", v->spec->name, v->part);
        } else if (!slot_set_has(want, slots_of_name(v->spec->name, nslots)))
            BAD("variable \"%s\" is not in the batch", v->spec->name);
        v->data = take(&r, v->numel * (1 + (size_t)v->nslots) * 4);
        skip8(&r);
    }
    if (r.bad || r.at != r.len)
        BAD("%zu bytes past its parts", r.len - r.at);
#undef BAD
    return STATUS_OK;
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The row ids of the snapshot staged here (slot_move_stage), per table, sorted: what this
 * server holds of the batch until the package of changes, which then removes the staged ids it
 * does not list without reading the table. One staged batch per process; under mu. */
typedef struct staged_table {
    char *name;
    int64_t *ids;
    size_t n;
} staged_table;
static struct {
    pthread_mutex_t mu;
    staged_table *t;
    size_t n;
} staged = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void staged_clear_locked(void)
{
    for (size_t i = 0; i < staged.n; i++) {
        free(staged.t[i].name);
        free(staged.t[i].ids);
    }
    free(staged.t);
    staged.t = NULL;
    staged.n = 0;
}

void slot_move_unstage(void)
{
    pthread_mutex_lock(&staged.mu);
    staged_clear_locked();
    pthread_mutex_unlock(&staged.mu);
}

/* Notes the ids of p's tables as the staged snapshot (nothing noted when memory runs out: the
 * changes then read the tables). */
static void staged_note(const pkg *p)
{
    pthread_mutex_lock(&staged.mu);
    staged_clear_locked();
    staged.t = calloc(p->ntables ? p->ntables : 1, sizeof(*staged.t));
    bool ok = staged.t != NULL;
    for (uint32_t i = 0; ok && i < p->ntables; i++) {
        const pkg_table *pt = &p->tables[i];
        staged_table *e = &staged.t[staged.n++];
        e->name = strdup(pt->spec->name);
        e->ids = malloc((pt->nrows ? pt->nrows : 1) * sizeof(int64_t));
        ok = e->name != NULL && e->ids != NULL;
        for (uint64_t k = 0; ok && k < pt->nrows; k++)
            memcpy(&e->ids[k], pt->idt + k * 16, 8);
        e->n = ok ? pt->nrows : 0;
        if (ok)
            qsort(e->ids, e->n, sizeof(int64_t), cmp_id);
    }
    if (!ok)
        staged_clear_locked();
    pthread_mutex_unlock(&staged.mu);
}

/* Format 2: removes the rows t holds in the batch that the package's id list does not name
 * (removed at the source since the snapshot): of the staged ids when a snapshot of t is staged
 * here, else of the rows read from t. Returns 0, or -1 when memory runs out. */
static int keep_listed(table *t, const pkg_table *pt, const uint64_t *bits, uint32_t nslots)
{
    int64_t *want = malloc((pt->nids ? pt->nids : 1) * sizeof(int64_t));
    if (want == NULL)
        return -1;
    memcpy(want, pt->ids, pt->nids * sizeof(int64_t));
    qsort(want, pt->nids, sizeof(int64_t), cmp_id);
    int64_t *gone = NULL;
    size_t ngone = 0;
    pthread_mutex_lock(&staged.mu);
    for (size_t i = 0; i < staged.n; i++) {
        staged_table *e = &staged.t[i];
        if (strcmp(e->name, table_name(t)) != 0)
            continue;
        gone = malloc((e->n ? e->n : 1) * sizeof(int64_t));
        for (size_t k = 0; gone && k < e->n; k++)
            if (bsearch(&e->ids[k], want, pt->nids, sizeof(int64_t), cmp_id) == NULL)
                gone[ngone++] = e->ids[k];
        if (gone == NULL) {
            pthread_mutex_unlock(&staged.mu);
            free(want);
            return -1;
        }
        break;
    }
    pthread_mutex_unlock(&staged.mu);
    if (gone == NULL) { /* no snapshot of t staged: its rows in the batch, read */
        table_rows rows;
        if (server_table_slot_rows(t, bits, nslots, &rows) != 0) {
            free(want);
            return -1;
        }
        for (size_t k = 0; k < rows.n; k++)
            if (bsearch(&rows.ids[k], want, pt->nids, sizeof(int64_t), cmp_id) == NULL)
                rows.ids[ngone++] = rows.ids[k];
        table_remove(t, rows.ids, ngone);
        table_rows_free(&rows);
    } else {
        table_remove(t, gone, ngone);
        free(gone);
    }
    free(want);
    return 0;
}

static int install_table(server_state *st, const pkg_table *pt, const uint64_t *bits,
                         uint32_t nslots, char *err, size_t errlen)
{
    const char *name = pt->spec->name;
    variable *clash = store_find(st->vars, name);
    if (clash != NULL) {
        variable_release(clash);
        return snprintf(err, errlen, "table \"%s\": a variable of that name is here", name),
               STATUS_ALREADY_EXISTS;
    }
    table_entry *e = registry_find(st, name);
    if (e == NULL) {
        table *t = NULL;
        if (server_table_make(st, pt->spec_raw, pt->spec_len, &t, err, errlen) != 0)
            return STATUS_INVALID_ARGUMENT;
        if (server_table_register(st, t, pt->spec_raw, pt->spec_len) != 0)
            table_destroy(t); /* registered meanwhile by a TableCreate, or out of memory */
        e = registry_find(st, name);
        if (e == NULL)
            return snprintf(err, errlen, "table \"%s\": out of memory", name),
                   STATUS_RESOURCE_EXHAUSTED;
    } else if (!registry_spec_equal(e->spec, pt->spec)) {
        registry_put(e);
        return snprintf(err, errlen, "table \"%s\" exists here with another spec", name),
               STATUS_ALREADY_EXISTS;
    }
    int rc = STATUS_OK;
    if (table_row_floats(e->t) != pt->row_floats) {
        snprintf(err, errlen, "table \"%s\": rows of %u floats here, %u in the package", name,
                 table_row_floats(e->t), pt->row_floats);
        rc = STATUS_INVALID_ARGUMENT;
    }
    if (rc == STATUS_OK && pt->ids != NULL && keep_listed(e->t, pt, bits, nslots) != 0)
        rc = STATUS_RESOURCE_EXHAUSTED,
        snprintf(err, errlen, "table \"%s\": out of memory listing its rows", name);
    float *row = rc == STATUS_OK ? malloc(pt->row_floats * sizeof(float)) : NULL;
    if (rc == STATUS_OK && row == NULL)
        rc = STATUS_RESOURCE_EXHAUSTED, snprintf(err, errlen, "out of memory");
    for (uint64_t k = 0; rc == STATUS_OK && k < pt->nrows; k++) {
        int64_t id, up;
        memcpy(&id, pt->idt + k * 16, 8);
        memcpy(&up, pt->idt + k * 16 + 8, 8);
        memcpy(row, pt->floats + k * pt->row_floats * 4, pt->row_floats * 4);
        int tr = table_insert_row(e->t, id, row, up);
        if (tr != TABLE_OK) {
            snprintf(err, errlen, "table \"%s\": row %lld: %s", name, (long long)id,
                     tr == TABLE_LIMIT ? "max-server-bytes reached" : "out of memory");
            rc = STATUS_RESOURCE_EXHAUSTED;
        }
    }
    free(row);
    registry_put(e);
    return rc;
}

static int install_var(server_state *st, const pkg_var *pv, char *err, size_t errlen)
{
    const char *name = pv->spec->name;
    if (server_table_exists(st, name))
        return snprintf(err, errlen, "variable \"%s\": a table of that name is here", name),
               STATUS_ALREADY_EXISTS;
    /* Of a variable cut in parts: the whole variable's elements and this entry's range. */
    uint64_t total = pv->numel, off = 0;
    if (pv->spec->parts) {
        total = 1;
        for (size_t d = 0; d < pv->spec->n_shape; d++)
            total *= pv->spec->shape[d];
        off = pv->numel ? (uint64_t)pv->part << PLACEMENT_PART_SHIFT : 0;
        if (pv->numel == 0) { /* a head: kept if here already with the same spec */
            variable *h = store_find(st->vars, name);
            bool same = h && spec_diff(h->spec, pv->spec, NULL, 0) == NULL;
            variable_release(h);
            if (same)
                return STATUS_OK;
        }
    }
    uint64_t bytes = store_shard_bytes(pv->numel, pv->nslots);
    int rc = store_reserve(st->vars, bytes, err, errlen);
    if (rc != STATUS_OK)
        return rc;
    char verr[256];
    variable *nv = variable_create_unfilled(pv->spec, total, off, pv->numel, verr, sizeof(verr));
    if (nv == NULL || nv->nslots != pv->nslots) {
        store_unreserve(st->vars, bytes);
        snprintf(err, errlen, "variable \"%s\": %s", name,
                 nv ? "another number of optimizer slots here" : verr);
        variable_destroy(nv);
        return nv ? STATUS_INVALID_ARGUMENT : STATUS_RESOURCE_EXHAUSTED;
    }
    memcpy(nv->params, pv->data, pv->numel * 4);
    for (size_t s = 0; s < nv->nslots; s++)
        memcpy(nv->slots[s], pv->data + (s + 1) * pv->numel * 4, pv->numel * 4);
    atomic_store(&nv->version, pv->version);
    nv->restored_version = pv->version;
    nv->staleness = pv->staleness;
    nv->create_gen = atomic_fetch_add(&st->create_gen, 1) + 1;
    variable *v = store_insert(st->vars, nv);
    store_unreserve(st->vars, bytes);
    if (v != nv) {
        variable_release(v);
        variable_destroy(nv);
        return snprintf(err, errlen, "variable \"%s\" was created here meanwhile", name),
               STATUS_ALREADY_EXISTS;
    }
    variable_release(v);
    return STATUS_OK;
}

static uint64_t drop_vars(server_state *st, const uint64_t *bits, uint32_t nslots);

/* Format 2: the batch's rows of the tables the package does not name (dropped at the source
 * since the snapshot) and its variables (the package carries each whole) go first. */
static void drop_unlisted(server_state *st, const pkg *p, const uint64_t *bits, uint32_t nslots)
{
    size_t n = 0;
    table_entry **es = registry_list(st, &n);
    for (size_t i = 0; es && i < n; i++) {
        bool listed = false;
        for (uint32_t k = 0; !listed && k < p->ntables; k++)
            listed = strcmp(p->tables[k].spec->name, table_name(es[i]->t)) == 0;
        if (!listed)
            server_table_drop_slots(es[i]->t, bits, nslots);
    }
    registry_release(es, n);
    drop_vars(st, bits, nslots);
}

static int install_pkg(server_state *st, uint32_t from, const uint64_t *bits, const uint8_t *data,
                       size_t len, bool stage, slot_move_counts *counts, char *err, size_t errlen)
{
    slot_map m = server_slots(st);
    pkg p;
    int rc = pkg_read(data, len, bits, m.nslots, &p, err, errlen);
    if (rc != STATUS_OK) {
        pkg_free(&p);
        return rc;
    }
    if (p.from != from) {
        pkg_free(&p);
        return snprintf(err, errlen, "slot move package: made by ps %u, not ps %u", p.from, from),
               STATUS_INVALID_ARGUMENT;
    }
    slot_move_counts cnt = {.bytes = len};
    /* Under the update lock: a checkpoint's copy holds the whole batch or none of it. */
    store_update_begin(st->vars);
    if (p.changes)
        drop_unlisted(st, &p, bits, m.nslots); /* over the staged snapshot */
    else
        slot_move_drop(st, bits); /* what an earlier attempt left */
    for (uint32_t i = 0; rc == STATUS_OK && i < p.ntables; i++) {
        rc = install_table(st, &p.tables[i], bits, m.nslots, err, errlen);
        cnt.rows += p.tables[i].nrows;
        cnt.ids += p.tables[i].nids;
    }
    for (uint32_t i = 0; rc == STATUS_OK && i < p.nvars; i++) {
        rc = install_var(st, &p.vars[i], err, errlen);
        cnt.variables++;
    }
    store_update_end(st->vars);
    uint64_t *w = NULL;
    if (rc == STATUS_OK && p.nwin > 0 && (w = malloc((2 + (size_t)p.words) * 8)) == NULL)
        rc = STATUS_RESOURCE_EXHAUSTED, snprintf(err, errlen, "out of memory");
    for (uint64_t i = 0; rc == STATUS_OK && i < p.nwin; i++) {
        memcpy(w, p.win + i * (2 + (size_t)p.words) * 8, (2 + (size_t)p.words) * 8);
        if (dedup_merge(st->dedup, slots_stream_client(w[0], from), w[1], w + 2, p.words) != 0)
            rc = STATUS_RESOURCE_EXHAUSTED,
            snprintf(err, errlen, "out of memory for the exactly-once windows");
        cnt.windows++;
    }
    free(w);
    if (rc == STATUS_OK && stage && !p.changes)
        staged_note(&p);
    else
        slot_move_unstage(); /* applied (or dropped): the staged ids say nothing any more */
    pkg_free(&p);
    if (rc != STATUS_OK) {
        slot_move_drop(st, bits); /* nothing of the package stays (merged marks are harmless) */
        return rc;
    }
    if (counts)
        *counts = cnt;
    return STATUS_OK;
}

int slot_move_install(server_state *st, uint32_t from, const uint64_t *bits, const uint8_t *data,
                      size_t len, slot_move_counts *counts, char *err, size_t errlen)
{
    return install_pkg(st, from, bits, data, len, false, counts, err, errlen);
}

int slot_move_stage(server_state *st, uint32_t from, const uint64_t *bits, const uint8_t *data,
                    size_t len, slot_move_counts *counts, char *err, size_t errlen)
{
    return install_pkg(st, from, bits, data, len, true, counts, err, errlen);
}

uint64_t slot_move_drop(server_state *st, const uint64_t *bits)
{
    uint32_t nslots = server_slots(st).nslots;
    uint64_t gone = 0;
    size_t n = 0;
    table_entry **es = registry_list(st, &n);
    for (size_t i = 0; es && i < n; i++)
        gone += server_table_drop_slots(es[i]->t, bits, nslots);
    registry_release(es, n);
    return gone + drop_vars(st, bits, nslots);
}

/* Drops the variables the batch moves (heads stay). Returns how many. */
static uint64_t drop_vars(server_state *st, const uint64_t *bits, uint32_t nslots)
{
    uint64_t gone = 0;
    variable **vs = NULL;
    size_t nv = store_list(st->vars, &vs);
    for (size_t i = 0; i < nv; i++) {
        if (!var_in(vs[i], bits, nslots))
            continue;
        variable *v = store_remove_part(st->vars, vs[i]->name, vs[i]->part);
        if (v) {
            variable_release(v);
            gone++;
        }
    }
    store_list_release(vs, nv);
    return gone;
}
