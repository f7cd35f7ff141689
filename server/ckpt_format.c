/* The checkpoint file format (ckpt_format.h): each record type's writer, reader and size, in
 * one table in file order, and the file's header. One concept, kept whole past 1,000 lines on
 * purpose: the format is read as a whole (a record's reader beside its writer, every record
 * beside the others it must agree with), and it is the one place a format change is made. */
#include "ckpt_format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "ckpt_snapshot.h"
#include "ckpt_types.h"
#include "log.h"
#include "slots_record.h"
#include "timeutil.h"
#include "util.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the checkpoint format is written in host order: little-endian hosts only");

#define AGG_WORDS CKPT_AGG_WORDS
#define META_MAX (1u << 20) /* a variable record's meta part (spec included) */

/* Records written so far, which the end record counts. */
typedef struct tally {
    uint64_t nrec, total; /* records, sum of their payload lengths */
} tally;

/* A file being read. */
typedef struct file_read {
    ckpt_reader r;
    server_state *st;
    const ckpt_source *src;
    uint32_t ver; /* the header's format version */
    ckpt_loaded *l;
    uint64_t nrec, total; /* records read before the end record, sum of their payload lengths */
    bool ended;           /* the end record was read: */
    uint64_t end_nrec, end_total; /* what it counts */
} file_read;

/* ---- variables (record 1) ---- */

static uint64_t var_meta_len(const ckpt_snap_var *sv)
{
    return 8 * 4 + 4 * 6 + sv->spec_len;
}

static uint64_t var_payload_len(const ckpt_snap_var *sv)
{
    uint64_t n = 4 + var_meta_len(sv);
    if (sv->initial)
        return n;
    n += sv->count * 4 * (1 + sv->nslots + sv->has_agg);
    if (sv->has_agg)
        n += AGG_WORDS * 8;
    return n;
}

static int write_var(ckpt_writer *w, const ckpt_snap_var *sv)
{
    uint64_t len = var_payload_len(sv);
    if (ckw_rec_begin_flags(w, CKPT_REC_VARIABLE, sv->initial ? CKPT_VAR_INITIAL : 0, len))
        return -1;
    uint32_t meta = (uint32_t)var_meta_len(sv);
    int rc = ckw_u32(w, meta) || ckw_u64(w, sv->numel) || ckw_u64(w, sv->offset) ||
             ckw_u64(w, sv->count) || ckw_u64(w, sv->version) ||
             ckw_u32(w, (uint32_t)sv->staleness) || ckw_u32(w, sv->nslots) ||
             ckw_u32(w, sv->has_agg) || ckw_u32(w, (uint32_t)sv->agg_count) ||
             ckw_u32(w, sv->has_agg ? AGG_WORDS : 0) || ckw_u32(w, (uint32_t)sv->spec_len) ||
             ckw_put(w, sv->spec, sv->spec_len);
    if (rc == 0 && !sv->initial)
        rc = ckw_put(w, sv->data, (size_t)sv->count * 4 * (1 + sv->nslots + sv->has_agg));
    if (rc == 0 && sv->has_agg)
        rc = ckw_put(w, sv->agg_workers, AGG_WORDS * 8);
    if (rc == 0)
        rc = ckw_rec_end(w);
    return rc ? -1 : 0;
}

static uint64_t vars_size(const ckpt_snapshot *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->nvars; i++)
        n += 20 + var_payload_len(&s->vars[i]);
    return n;
}

static int write_vars(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    for (size_t i = 0; i < s->nvars; i++) {
        if (write_var(w, &s->vars[i]))
            return -1;
        t->nrec++;
        t->total += var_payload_len(&s->vars[i]);
    }
    return 0;
}

static int read_var(file_read *f, uint32_t flags, uint64_t len)
{
    ckpt_reader *r = &f->r;
    const ckpt_source *src = f->src;
    ckpt_loaded *l = f->l;
    bool initial = (flags & CKPT_VAR_INITIAL) != 0;
    if ((flags & ~(uint32_t)CKPT_VAR_INITIAL) != 0)
        return errf(r->err, r->errlen, "variable record at byte %" PRIu64 ": unknown flags %08x",
                    r->pos, flags);
    uint32_t meta;
    if (ckr_u32(r, &meta, "a variable record") != 0)
        return -1;
    if (meta < 56 || meta > META_MAX || meta > len - 4)
        return errf(r->err, r->errlen, "variable record at byte %" PRIu64 ": bad meta size %u",
                    r->pos, meta);
    uint8_t *m = malloc(meta);
    if (m == NULL)
        return errf(r->err, r->errlen, "out of memory");
    if (ckr_get(r, m, meta, "a variable record") != 0) {
        free(m);
        return -1;
    }
    uint64_t numel, offset, count, version;
    uint32_t stal, nslots, has_agg, agg_count, agg_words, spec_len;
    memcpy(&numel, m, 8);
    memcpy(&offset, m + 8, 8);
    memcpy(&count, m + 16, 8);
    memcpy(&version, m + 24, 8);
    memcpy(&stal, m + 32, 4);
    memcpy(&nslots, m + 36, 4);
    memcpy(&has_agg, m + 40, 4);
    memcpy(&agg_count, m + 44, 4);
    memcpy(&agg_words, m + 48, 4);
    memcpy(&spec_len, m + 52, 4);
    if (spec_len != meta - 56 || nslots > OPTIMIZER_MAX_SLOTS || has_agg > 1 ||
        (has_agg && agg_words != AGG_WORDS) || offset > numel || count > numel - offset ||
        (initial && (has_agg || version != 0 || len != 4 + (uint64_t)meta)) ||
        (!initial && len != 4 + (uint64_t)meta + count * 4 * (1 + nslots + has_agg) +
                                (has_agg ? (uint64_t)agg_words * 8 : 0))) {
        free(m);
        return errf(r->err, r->errlen,
                    "variable record ending at byte %" PRIu64 ": inconsistent sizes", r->pos);
    }
    Psd__V1__VariableSpec *spec = psd__v1__variable_spec__unpack(NULL, spec_len, m + 56);
    free(m);
    if (spec == NULL)
        return errf(r->err, r->errlen, "variable record at byte %" PRIu64 ": bad spec", r->pos);
    char verr[512];
    /* An initial one is made again by its initializer (a pure function of the spec). */
    variable *v = initial
                      ? variable_create(spec, numel, offset, count, verr, sizeof(verr))
                      : variable_create_unfilled(spec, numel, offset, count, verr, sizeof(verr));
    int rc = 0;
    if (v == NULL)
        rc = errf(r->err, r->errlen, "variable \"%s\": %s", spec->name, verr);
    else if (v->nslots != nslots)
        rc = errf(r->err, r->errlen, "variable \"%s\": %u optimizer slots stored, %zu expected",
                  spec->name, nslots, v->nslots);
    else if (!spec->parts && spec->num_servers != src->num_servers)
        rc = errf(r->err, r->errlen,
                  "variable \"%s\": placed for %u servers, the file's cluster has %u", spec->name,
                  spec->num_servers, src->num_servers);
    psd__v1__variable_spec__free_unpacked(spec, NULL);
    if (rc != 0) {
        variable_destroy(v);
        return -1;
    }
    if (l->nvars == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        variable **nv = realloc(l->vars, nc * sizeof(*nv));
        if (nv == NULL) {
            variable_destroy(v);
            return errf(r->err, r->errlen, "out of memory");
        }
        l->vars = nv;
        l->cap = nc;
    }
    l->vars[l->nvars++] = v; /* freed with l from here on */
    atomic_store(&v->version, version);
    v->staleness = (int32_t)stal;
    if (initial)
        return 0;
    if (ckr_get(r, v->params, (size_t)count * 4, "parameters"))
        return -1;
    for (size_t i = 0; i < nslots; i++)
        if (ckr_get(r, v->slots[i], (size_t)count * 4, "optimizer slots"))
            return -1;
    if (has_agg) {
        v->agg = malloc((count ? (size_t)count : 1) * sizeof(float));
        v->agg_workers = calloc(AGG_WORDS, sizeof(uint64_t));
        if (v->agg == NULL || v->agg_workers == NULL)
            return errf(r->err, r->errlen, "out of memory for a BSP aggregate");
        v->agg_words = AGG_WORDS;
        v->agg_count = (int)agg_count;
        if (ckr_get(r, v->agg, (size_t)count * 4, "a BSP aggregate") ||
            ckr_get(r, v->agg_workers, AGG_WORDS * 8, "a BSP aggregate"))
            return -1;
        atomic_store(&v->agg_ready, true); /* not yet shared: variable_agg_ensure has no work */
    }
    return 0;
}

/* ---- sparse tables (records 6 and 7) ---- */

/* A table record: u32 spec length, the packed TableSpec, u32 floats per row, u32 0, u64 rows,
 * then per row (oldest update first): i64 id, i64 update time (ms), the row's floats. */
static uint64_t table_payload_len(const server_table_copy *t)
{
    return 4 + t->spec_len + 16 + t->rows * (16 + 4 * (uint64_t)t->row_floats);
}

/* A partition's rows: id, update time, then the row's floats, each. */
static int write_rows(ckpt_writer *w, const table_rows *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (ckw_u64(w, (uint64_t)r->ids[i]) || ckw_u64(w, (uint64_t)r->updated_ms[i]) ||
            ckw_put(w, r->floats + i * r->row_floats, (size_t)r->row_floats * 4))
            return -1;
    return 0;
}

/* Partition p's rows on disk (a table with a cold tier), read from the cut's snapshot now and
 * freed once written: one partition's at a time in memory. */
static int write_cold_rows(ckpt_writer *w, const server_table_copy *t, uint32_t p)
{
    if (table_cut_cold_count(t->cut, p) == 0)
        return 0;
    table_rows cold;
    if (table_cut_cold_rows(t->cut, p, &cold) != 0)
        return errf(w->err, w->errlen,
                    "table \"%s\": cannot read the rows on disk of partition %u (the cold "
                    "store's read failed, or memory ran out)",
                    t->name, p);
    int rc = write_rows(w, &cold);
    table_rows_free(&cold);
    return rc;
}

static int write_table(ckpt_writer *w, const server_table_copy *t)
{
    if (ckw_rec_begin(w, CKPT_REC_TABLE, table_payload_len(t)) ||
        ckw_u32(w, (uint32_t)t->spec_len) || ckw_put(w, t->spec, t->spec_len) ||
        ckw_u32(w, t->row_floats) || ckw_u32(w, 0) || ckw_u64(w, t->rows))
        return -1;
    /* Each partition's rows on disk first: they are older than its RAM rows, so a restore
     * inserting in file order rebuilds both tiers. */
    for (uint32_t p = 0; p < t->nparts; p++)
        if (write_cold_rows(w, t, p) || write_rows(w, &t->parts[p]))
            return -1;
    return ckw_rec_end(w);
}

/* A table record with its rows on disk in a copy of its cold store (CKPT_REC_TABLE_COLD,
 * ckpt_format.h): u32 spec length, the packed TableSpec, u32 floats per row, u32 partitions,
 * u32 length of the copy's directory name, u32 0, the name (relative to the file's
 * directory, no NUL), u64 rows in the copy of each partition, u64 RAM rows, then the RAM
 * rows as in record 6 (each partition's oldest update first). */
static uint64_t ram_rows(const server_table_copy *t)
{
    uint64_t n = 0;
    for (uint32_t p = 0; p < t->nparts; p++)
        n += t->parts[p].n;
    return n;
}

static uint64_t table_cold_len(const server_table_copy *t)
{
    return 4 + t->spec_len + 16 + strlen(t->cold_dir) + 8 * (uint64_t)t->nparts + 8 +
           ram_rows(t) * (16 + 4 * (uint64_t)t->row_floats);
}

static int write_table_cold(ckpt_writer *w, const server_table_copy *t)
{
    uint32_t dir_len = (uint32_t)strlen(t->cold_dir);
    if (ckw_rec_begin(w, CKPT_REC_TABLE_COLD, table_cold_len(t)) ||
        ckw_u32(w, (uint32_t)t->spec_len) || ckw_put(w, t->spec, t->spec_len) ||
        ckw_u32(w, t->row_floats) || ckw_u32(w, t->nparts) || ckw_u32(w, dir_len) ||
        ckw_u32(w, 0) || ckw_put(w, t->cold_dir, dir_len))
        return -1;
    for (uint32_t p = 0; p < t->nparts; p++)
        if (ckw_u64(w, table_cut_cold_count(t->cut, p)))
            return -1;
    if (ckw_u64(w, ram_rows(t)))
        return -1;
    for (uint32_t p = 0; p < t->nparts; p++)
        if (write_rows(w, &t->parts[p]))
            return -1;
    return ckw_rec_end(w);
}

/* A table delta record (CKPT_REC_TABLE_DELTA, checkpoint.h). */
static uint64_t table_delta_len(const server_table_copy *t)
{
    uint64_t n = 4 + t->spec_len + 8;
    for (uint32_t p = 0; p < t->nparts; p++)
        n += 24 + 8 * (uint64_t)t->parts[p].nremoved +
             t->parts[p].n * (16 + 4 * (uint64_t)t->row_floats);
    return n;
}

static int write_table_delta(ckpt_writer *w, const server_table_copy *t)
{
    if (ckw_rec_begin(w, CKPT_REC_TABLE_DELTA, table_delta_len(t)) ||
        ckw_u32(w, (uint32_t)t->spec_len) || ckw_put(w, t->spec, t->spec_len) ||
        ckw_u32(w, t->row_floats) || ckw_u32(w, t->nparts))
        return -1;
    for (uint32_t p = 0; p < t->nparts; p++) {
        const table_rows *r = &t->parts[p];
        if (ckw_u32(w, r->full ? CKPT_PART_WHOLE : 0) || ckw_u32(w, 0) || ckw_u64(w, r->nremoved) ||
            ckw_u64(w, r->n) || (r->nremoved && ckw_put(w, r->removed, r->nremoved * 8)) ||
            write_rows(w, r))
            return -1;
    }
    return ckw_rec_end(w);
}

static uint64_t table_rec_len(const server_table_copy *t)
{
    return t->cold_dir ? table_cold_len(t) : t->delta ? table_delta_len(t) : table_payload_len(t);
}

static uint64_t tables_size(const ckpt_snapshot *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->ntables; i++)
        n += 20 + table_rec_len(&s->tables[i]);
    return n;
}

/* Each table is one record: 12 when its cut is linked, 7 when it is a delta, else 6. */
static int write_tables(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    for (size_t i = 0; i < s->ntables; i++) {
        const server_table_copy *c = &s->tables[i];
        if (c->cold_dir ? write_table_cold(w, c)
            : c->delta  ? write_table_delta(w, c)
                        : write_table(w, c))
            return -1;
        t->nrec++;
        t->total += table_rec_len(c);
    }
    return 0;
}

uint8_t *ckpt_table_spec_for(const uint8_t *spec, size_t len, uint32_t num_servers, size_t *out_len)
{
    Psd__V1__TableSpec *s = psd__v1__table_spec__unpack(NULL, len, spec);
    if (s == NULL)
        return NULL;
    s->num_servers = num_servers;
    size_t n = psd__v1__table_spec__get_packed_size(s);
    uint8_t *out = malloc(n ? n : 1);
    if (out)
        *out_len = psd__v1__table_spec__pack(s, out);
    psd__v1__table_spec__free_unpacked(s, NULL);
    return out;
}

int64_t ckpt_row_time(int64_t updated_ms)
{
    return updated_ms < 1000000000000 ? (int64_t)time_wall_ms() : updated_ms;
}

/* The start of a table record (6 or 12): u32 spec length, then the packed TableSpec, of which
 * the table is made (as this cluster's when the file is another size's) and kept in f's
 * tables. fixed: the record's bytes past the spec at least. Returns 0 or -1. */
static int read_table_spec(file_read *f, uint64_t len, uint64_t fixed, table **out,
                           uint32_t *spec_len_out)
{
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint32_t spec_len;
    if (len < 4 + fixed || ckr_u32(r, &spec_len, "a table record"))
        return -1;
    if (spec_len > META_MAX || spec_len > len - 4 - fixed)
        return errf(r->err, r->errlen, "table record at byte %" PRIu64 ": bad spec size %u", r->pos,
                    spec_len);
    uint8_t *spec = malloc(spec_len ? spec_len : 1);
    loaded_table *nt = realloc(l->tables, (l->ntables + 1) * sizeof(*nt));
    if (nt)
        l->tables = nt;
    if (spec == NULL || nt == NULL) {
        free(spec);
        return errf(r->err, r->errlen, "out of memory");
    }
    if (ckr_get(r, spec, spec_len, "a table record")) {
        free(spec);
        return -1;
    }
    table *t = NULL;
    char terr[512];
    /* A file of another cluster size: its table is made as this cluster's (its spec as read
     * is kept, which the file's deltas compare theirs with). */
    size_t mlen = spec_len;
    uint8_t *mspec = f->src->num_servers == f->st->num_servers
                         ? spec
                         : ckpt_table_spec_for(spec, spec_len, f->st->num_servers, &mlen);
    if (mspec == NULL || server_table_make(f->st, mspec, mlen, &t, terr, sizeof(terr)) != 0) {
        if (mspec == NULL)
            snprintf(terr, sizeof(terr), "a table spec that does not decode");
        if (mspec != spec)
            free(mspec);
        free(spec);
        return errf(r->err, r->errlen, "table record at byte %" PRIu64 ": %s", r->pos, terr);
    }
    if (mspec != spec)
        free(mspec);
    /* freed with l from here on */
    l->tables[l->ntables++] = (loaded_table){.t = t, .spec = spec, .len = spec_len};
    *out = t;
    *spec_len_out = spec_len;
    return 0;
}

/* rows rows of row_floats floats each (legacy: as before Adam's step count was one per row)
 * into t, oldest first; another server's rows (a restore onto another size) skipped. */
static int read_table_rows(file_read *f, table *t, uint64_t rows, uint32_t row_floats, bool legacy)
{
    ckpt_reader *r = &f->r;
    float *row = malloc(((size_t)row_floats + table_row_floats(t)) * 4);
    if (row == NULL)
        return errf(r->err, r->errlen, "out of memory");
    float *now = row + row_floats; /* a legacy row converted */
    for (uint64_t i = 0; i < rows; i++) {
        uint64_t id, upd;
        if (ckr_u64(r, &id, "a table row") || ckr_u64(r, &upd, "a table row") ||
            ckr_get(r, row, (size_t)row_floats * 4, "a table row")) {
            free(row);
            return -1;
        }
        if (f->src->keep &&
            slots_row_owner(f->src->keep, table_name(t), (int64_t)id) != f->src->self)
            continue; /* another server's row now */
        if (legacy)
            table_row_from_legacy(t, row, now);
        int rc = table_insert_row(t, (int64_t)id, legacy ? now : row, ckpt_row_time((int64_t)upd));
        if (rc != TABLE_OK) {
            free(row);
            return errf(r->err, r->errlen, "table \"%s\": row %" PRId64 " could not be restored%s",
                        table_name(t), (int64_t)id,
                        rc == TABLE_LIMIT ? " within max-server-bytes or max_rows"
                                          : " (out of memory)");
        }
    }
    free(row);
    return 0;
}

static int read_table(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    uint32_t spec_len, row_floats, pad;
    uint64_t rows;
    table *t;
    if (read_table_spec(f, len, 16, &t, &spec_len) != 0)
        return -1;
    if (ckr_u32(r, &row_floats, "a table record") || ckr_u32(r, &pad, "a table record") ||
        ckr_u64(r, &rows, "a table record"))
        return -1;
    uint64_t per = 16 + 4 * (uint64_t)row_floats;
    /* Rows as this version writes them, or as before Adam's step count was one per row. */
    bool legacy = row_floats != table_row_floats(t) && row_floats == table_legacy_row_floats(t);
    if ((row_floats != table_row_floats(t) && !legacy) || pad != 0 ||
        rows > (len - 20 - spec_len) / per || len != 20 + spec_len + rows * per)
        return errf(r->err, r->errlen,
                    "table \"%s\" ending at byte %" PRIu64 ": inconsistent sizes", table_name(t),
                    r->pos);
    return read_table_rows(f, t, rows, row_floats, legacy);
}

/* Rows another server holds now (a restore onto another size) dropped from t's cold tier. */
static int drop_foreign_cold(file_read *f, table *t)
{
    for (uint32_t p = 0; p < table_partitions(t); p++) {
        table_rows part;
        if (table_copy_partition(t, p, &part) != 0)
            return errf(f->r.err, f->r.errlen,
                        "table \"%s\": cannot read its rows on disk (memory, or a read error)",
                        table_name(t));
        for (size_t i = 0; i < part.n; i++)
            if (slots_row_owner(f->src->keep, table_name(t), part.ids[i]) != f->src->self)
                (void)table_remove(t, &part.ids[i], 1);
        table_rows_free(&part);
    }
    return 0;
}

/* A table record with its rows on disk in a copy of its cold store (CKPT_REC_TABLE_COLD). */
static int read_table_cold(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    uint32_t spec_len, row_floats, nparts, dir_len, pad;
    uint64_t rows;
    table *t;
    if (read_table_spec(f, len, 24, &t, &spec_len) != 0)
        return -1;
    if (ckr_u32(r, &row_floats, "a table record") || ckr_u32(r, &nparts, "a table record") ||
        ckr_u32(r, &dir_len, "a table record") || ckr_u32(r, &pad, "a table record"))
        return -1;
    uint64_t per = 16 + 4 * (uint64_t)row_floats, fixed = 4 + (uint64_t)spec_len + 16;
    if (row_floats != table_row_floats(t) || nparts != table_partitions(t) || pad != 0 ||
        dir_len == 0 || dir_len > 1024 || len < fixed + dir_len + 8 * (uint64_t)nparts + 8)
        return errf(r->err, r->errlen,
                    "table \"%s\" ending at byte %" PRIu64 ": inconsistent sizes", table_name(t),
                    r->pos);
    char dir[1025];
    uint64_t *cold_n = malloc((size_t)nparts * 8);
    if (cold_n == NULL)
        return errf(r->err, r->errlen, "out of memory");
    if (ckr_get(r, dir, dir_len, "a table record") ||
        ckr_get(r, cold_n, (size_t)nparts * 8, "a table record") ||
        ckr_u64(r, &rows, "a table record")) {
        free(cold_n);
        return -1;
    }
    dir[dir_len] = '\0';
    fixed += dir_len + 8 * (uint64_t)nparts + 8;
    if (rows > (len - fixed) / per || len != fixed + rows * per || strlen(dir) != dir_len ||
        dir[0] == '/' || strstr(dir, "..") != NULL) {
        free(cold_n);
        return errf(r->err, r->errlen,
                    "table \"%s\" ending at byte %" PRIu64 ": inconsistent sizes", table_name(t),
                    r->pos);
    }
    /* The copy is named relative to the file's directory. */
    char from[4200];
    const char *slash = strrchr(r->path, '/');
    if (slash != NULL)
        snprintf(from, sizeof(from), "%.*s/%s", (int)(slash - r->path), r->path, dir);
    else
        snprintf(from, sizeof(from), "%s", dir);
    int rc = table_cold_adopt(t, from, cold_n, r->err, r->errlen);
    free(cold_n);
    if (rc != 0 || (f->src->keep && drop_foreign_cold(f, t) != 0))
        return -1;
    /* Its RAM rows after: newer than the rows on disk. */
    return read_table_rows(f, t, rows, row_floats, false);
}

/* Reads a table delta record (checked, kept for the restore to apply). */
static int read_table_delta(file_read *f, uint32_t rec_flags, uint64_t len)
{
    (void)rec_flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint32_t spec_len;
    if (len < 12 || ckr_u32(r, &spec_len, "a table delta record"))
        return -1;
    if (spec_len > META_MAX || spec_len > len - 12)
        return errf(r->err, r->errlen, "table delta record at byte %" PRIu64 ": bad spec size %u",
                    r->pos, spec_len);
    ckpt_table_delta *nd = realloc(l->tdeltas, (l->ntdeltas + 1) * sizeof(*nd));
    if (nd == NULL)
        return errf(r->err, r->errlen, "out of memory");
    l->tdeltas = nd;
    ckpt_table_delta *d = &l->tdeltas[l->ntdeltas];
    memset(d, 0, sizeof(*d));
    l->ntdeltas++; /* freed with l from here on */
    d->spec_len = spec_len;
    d->body_len = len - 12 - spec_len;
    d->spec = malloc(spec_len ? spec_len : 1);
    d->body = malloc(d->body_len ? (size_t)d->body_len : 1);
    if (d->spec == NULL || d->body == NULL)
        return errf(r->err, r->errlen, "out of memory for a table delta of %" PRIu64 " bytes", len);
    if (ckr_get(r, d->spec, spec_len, "a table delta record") ||
        ckr_u32(r, &d->row_floats, "a table delta record") ||
        ckr_u32(r, &d->nparts, "a table delta record") ||
        ckr_get(r, d->body, (size_t)d->body_len, "a table delta record"))
        return -1;
    Psd__V1__TableSpec *ts = psd__v1__table_spec__unpack(NULL, spec_len, d->spec);
    if (ts == NULL || ts->name == NULL || (d->name = strdup(ts->name)) == NULL) {
        if (ts)
            psd__v1__table_spec__free_unpacked(ts, NULL);
        return errf(r->err, r->errlen,
                    "table delta record ending at byte %" PRIu64 ": its spec does not decode",
                    r->pos);
    }
    psd__v1__table_spec__free_unpacked(ts, NULL);
    /* The partitions must fill the record exactly. */
    uint64_t per = 16 + 4 * (uint64_t)d->row_floats, off = 0;
    for (uint32_t p = 0; p < d->nparts; p++) {
        uint32_t flags, pad;
        uint64_t nrem, nrows;
        if (d->row_floats == 0 || d->row_floats > (1u << 24) || d->body_len - off < 24)
            goto bad;
        memcpy(&flags, d->body + off, 4);
        memcpy(&pad, d->body + off + 4, 4);
        memcpy(&nrem, d->body + off + 8, 8);
        memcpy(&nrows, d->body + off + 16, 8);
        off += 24;
        if ((flags & ~(uint32_t)CKPT_PART_WHOLE) != 0 || pad != 0 || nrem > (d->body_len - off) / 8)
            goto bad;
        off += nrem * 8;
        if (nrows > (d->body_len - off) / per)
            goto bad;
        off += nrows * per;
    }
    if (d->nparts == 0 || d->nparts > TABLE_MAX_PARTITIONS || off != d->body_len)
        goto bad;
    return 0;
bad:
    return errf(r->err, r->errlen,
                "table delta of \"%s\" ending at byte %" PRIu64 ": inconsistent sizes", d->name,
                r->pos);
}

/* ---- the dedup windows (record 2) and their floors (record 5) ---- */

static uint64_t dedup_len(const ckpt_snapshot *s)
{
    return 8 + s->dedup_clients * (2 + s->dedup_words) * 8;
}

static uint64_t dedup_size(const ckpt_snapshot *s)
{
    return 20 + dedup_len(s);
}

static int write_dedup(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    uint64_t dlen = dedup_len(s);
    if (ckw_rec_begin(w, CKPT_REC_DEDUP, dlen) || ckw_u32(w, s->dedup_words) || ckw_u32(w, 0) ||
        ckw_put(w, s->dedup, (size_t)(s->dedup_clients * (2 + s->dedup_words) * 8)) ||
        ckw_rec_end(w))
        return -1;
    t->nrec++;
    t->total += dlen;
    return 0;
}

static int read_dedup(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint32_t words, pad;
    if (len < 8 || ckr_u32(r, &words, "the dedup table") || ckr_u32(r, &pad, "the dedup table"))
        return -1;
    uint64_t per = (2 + (uint64_t)words) * 8;
    if (words == 0 || words > (1u << 20) || (len - 8) % per != 0)
        return errf(r->err, r->errlen, "dedup record at byte %" PRIu64 ": bad sizes", r->pos);
    l->dedup_clients = (len - 8) / per;
    l->dedup_words = words;
    free(l->dedup);
    l->dedup = malloc(len - 8 ? (size_t)(len - 8) : 1);
    if (l->dedup == NULL)
        return errf(r->err, r->errlen, "out of memory for the dedup table");
    return ckr_get(r, l->dedup, (size_t)(len - 8), "the dedup table");
}

static uint64_t floors_size(const ckpt_snapshot *s)
{
    return 20 + s->nfloors * 8;
}

static int write_floors(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    uint64_t flen = s->nfloors * 8;
    if (ckw_rec_begin(w, CKPT_REC_DEDUP_FLOORS, flen) || ckw_put(w, s->floors, (size_t)flen) ||
        ckw_rec_end(w))
        return -1;
    t->nrec++;
    t->total += flen;
    return 0;
}

static int read_floors(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    if (len % 8 != 0 || len > ((uint64_t)1 << 34))
        return errf(r->err, r->errlen, "dedup tombstone record at byte %" PRIu64 ": bad size",
                    r->pos);
    free(l->floors);
    l->floors = malloc(len ? (size_t)len : 1);
    if (l->floors == NULL)
        return errf(r->err, r->errlen, "out of memory for the dedup tombstones");
    l->nfloors = (size_t)(len / 8);
    return ckr_get(r, l->floors, (size_t)len, "the dedup tombstones");
}

/* ---- the clock table (record 3) and its rest (record 8) ---- */

static uint64_t sync_size(const ckpt_snapshot *s)
{
    return 20 + 16 + s->nworkers * 16;
}

static int write_sync(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    uint64_t slen = 16 + s->nworkers * 16;
    if (ckw_rec_begin(w, CKPT_REC_SYNC, slen) || ckw_u64(w, (uint64_t)s->applied_min) ||
        ckw_u64(w, s->nworkers))
        return -1;
    for (size_t i = 0; i < s->nworkers; i++) {
        const sync_worker_rec *r = &s->workers[i];
        if (ckw_u32(w, (uint32_t)r->id) ||
            ckw_u32(w, (uint32_t)(r->known ? 1 : 0) | (uint32_t)(r->live ? 2 : 0)) ||
            ckw_u64(w, (uint64_t)r->clock))
            return -1;
    }
    if (ckw_rec_end(w))
        return -1;
    t->nrec++;
    t->total += slen;
    return 0;
}

static int read_sync(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint64_t amin, nw;
    if (len < 16 || ckr_u64(r, &amin, "the clock table") || ckr_u64(r, &nw, "the clock table"))
        return -1;
    if (nw > SERVER_MAX_WORKERS || len != 16 + nw * 16)
        return errf(r->err, r->errlen, "clock record at byte %" PRIu64 ": bad sizes", r->pos);
    free(l->workers);
    l->workers = calloc(nw ? nw : 1, sizeof(*l->workers));
    if (l->workers == NULL)
        return errf(r->err, r->errlen, "out of memory");
    for (uint64_t i = 0; i < nw; i++) {
        uint32_t id, fl;
        uint64_t clock;
        if (ckr_u32(r, &id, "the clock table") || ckr_u32(r, &fl, "the clock table") ||
            ckr_u64(r, &clock, "the clock table"))
            return -1;
        l->workers[i] = (sync_worker_rec){
            .id = (int32_t)id, .clock = (int64_t)clock, .known = fl & 1, .live = (fl & 2) != 0};
    }
    l->nworkers = (size_t)nw;
    l->applied_min = (int64_t)amin;
    l->frontier = SYNC_NO_FRONTIER; /* unless record 8 follows */
    l->have_sync = true;
    return 0;
}

/* Record 8 is written only when a known worker is not live (finished or evicted): then its
 * finish and the frontier matter to who rejoins where. */
static bool sync_out_needed(const ckpt_snapshot *s)
{
    for (size_t i = 0; i < s->nworkers; i++)
        if (!s->workers[i].live)
            return true;
    return false;
}

static uint64_t sync_left_count(const ckpt_snapshot *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->nworkers; i++)
        n += s->workers[i].left;
    return n;
}

static uint64_t sync_out_size(const ckpt_snapshot *s)
{
    return sync_out_needed(s) ? 20 + 16 + sync_left_count(s) * 16 : 0;
}

static int write_sync_out(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    if (!sync_out_needed(s))
        return 0;
    uint64_t olen = 16 + sync_left_count(s) * 16;
    if (ckw_rec_begin(w, CKPT_REC_SYNC_OUT, olen) || ckw_u64(w, (uint64_t)s->frontier) ||
        ckw_u64(w, sync_left_count(s)))
        return -1;
    for (size_t i = 0; i < s->nworkers; i++) {
        const sync_worker_rec *r = &s->workers[i];
        if (r->left && (ckw_u32(w, (uint32_t)r->id) || ckw_u32(w, 0) || ckw_u64(w, r->left_client)))
            return -1;
    }
    if (ckw_rec_end(w))
        return -1;
    t->nrec++;
    t->total += olen;
    return 0;
}

static int read_sync_out(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint64_t fr, nl;
    if (!l->have_sync || len < 16 || ckr_u64(r, &fr, "the clock table") ||
        ckr_u64(r, &nl, "the clock table"))
        return -1;
    if (nl > l->nworkers || len != 16 + nl * 16)
        return errf(r->err, r->errlen, "clock record at byte %" PRIu64 ": bad sizes", r->pos);
    for (uint64_t i = 0; i < nl; i++) {
        uint32_t id, zero;
        uint64_t client;
        if (ckr_u32(r, &id, "the clock table") || ckr_u32(r, &zero, "the clock table") ||
            ckr_u64(r, &client, "the clock table"))
            return -1;
        for (size_t k = 0; k < l->nworkers; k++)
            if (l->workers[k].id == (int32_t)id) {
                l->workers[k].left = true;
                l->workers[k].left_client = client;
            }
    }
    l->frontier = (int64_t)fr;
    return 0;
}

/* ---- the tables' admission sketches (record 10) ---- */

static uint64_t sketch_rec_len(const server_table_copy *c)
{
    return 4 + strlen(c->name) + 4 + 8 + c->sketch_len;
}

static uint64_t sketches_size(const ckpt_snapshot *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->ntables; i++)
        if (s->tables[i].sketch_len)
            n += 20 + sketch_rec_len(&s->tables[i]);
    return n;
}

static int write_sketches(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    for (size_t i = 0; i < s->ntables; i++) {
        const server_table_copy *c = &s->tables[i];
        if (c->sketch_len == 0)
            continue;
        uint32_t nl = (uint32_t)strlen(c->name);
        if (ckw_rec_begin(w, CKPT_REC_TABLE_SKETCH, sketch_rec_len(c)) || ckw_u32(w, nl) ||
            ckw_put(w, c->name, nl) || ckw_u32(w, 0) || ckw_u64(w, c->sketch_len) ||
            ckw_put(w, c->sketch, c->sketch_len) || ckw_rec_end(w))
            return -1;
        t->nrec++;
        t->total += sketch_rec_len(c);
    }
    return 0;
}

static int read_sketch(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint32_t nl, pad;
    uint64_t n;
    if (len < 16 || ckr_u32(r, &nl, "a table sketch record"))
        return -1;
    if (nl == 0 || nl > TABLE_MAX_NAME || nl > len - 16)
        return errf(r->err, r->errlen, "table sketch record at byte %" PRIu64 ": bad name size %u",
                    r->pos, nl);
    struct loaded_sketch *ns = realloc(l->sketches, (l->nsketches + 1) * sizeof(*ns));
    if (ns == NULL)
        return errf(r->err, r->errlen, "out of memory");
    l->sketches = ns;
    struct loaded_sketch *e = &l->sketches[l->nsketches];
    memset(e, 0, sizeof(*e));
    if ((e->name = calloc(1, nl + 1)) == NULL)
        return errf(r->err, r->errlen, "out of memory");
    l->nsketches++; /* freed with l from here on */
    if (ckr_get(r, e->name, nl, "a table sketch record") ||
        ckr_u32(r, &pad, "a table sketch record") || ckr_u64(r, &n, "a table sketch record"))
        return -1;
    if (pad != 0 || n != len - 16 - nl)
        return errf(r->err, r->errlen,
                    "table sketch record of \"%s\" ending at byte %" PRIu64 ": inconsistent sizes",
                    e->name, r->pos);
    if ((e->data = malloc(n ? n : 1)) == NULL)
        return errf(r->err, r->errlen, "out of memory");
    e->len = n;
    return ckr_get(r, e->data, n, "a table sketch record");
}

/* ---- the replica group's log position (record 9) ---- */

static uint64_t replica_size(const ckpt_snapshot *s)
{
    return s->has_pos ? 20 + 16 : 0;
}

static int write_replica(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    if (!s->has_pos)
        return 0;
    if (ckw_rec_begin(w, CKPT_REC_REPLICA, 16) || ckw_u64(w, s->pos_epoch) ||
        ckw_u64(w, s->pos_lsn) || ckw_rec_end(w))
        return -1;
    t->nrec++;
    t->total += 16;
    return 0;
}

static int read_replica(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_loaded *l = f->l;
    if (len != 16 || ckr_u64(&f->r, &l->pos_epoch, "the replica position") ||
        ckr_u64(&f->r, &l->pos_lsn, "the replica position"))
        return -1;
    l->has_pos = true;
    return 0;
}

/* ---- the slot map (record 11) ---- */

enum { SLOTS_STATIC = 1 };

static uint64_t slots_size(const ckpt_snapshot *s)
{
    return 20 + 16 + (s->slots.owner ? (uint64_t)s->slots.nslots * 4 : 0);
}

static int write_slots(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    const slot_map *m = &s->slots;
    uint64_t len = slots_size(s) - 20;
    if (ckw_rec_begin(w, CKPT_REC_SLOTS, len) || ckw_u32(w, m->nslots) || ckw_u32(w, m->nservers) ||
        ckw_u32(w, m->owner ? 0 : SLOTS_STATIC) || ckw_u32(w, 0) ||
        (m->owner && ckw_put(w, m->owner, (size_t)m->nslots * 4)) || ckw_rec_end(w))
        return -1;
    t->nrec++;
    t->total += len;
    return 0;
}

static int read_slots(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    ckpt_reader *r = &f->r;
    ckpt_loaded *l = f->l;
    uint32_t n, ns, fl, pad;
    if (len < 16 || ckr_u32(r, &n, "the slot map") || ckr_u32(r, &ns, "the slot map") ||
        ckr_u32(r, &fl, "the slot map") || ckr_u32(r, &pad, "the slot map"))
        return -1;
    bool fixed = (fl & SLOTS_STATIC) != 0;
    /* An explicit map may name servers that joined, past the cluster spec's. */
    bool servers_ok =
        fixed ? ns == f->src->num_servers : ns >= f->src->num_servers && ns <= SLOTS_MAX_SERVERS;
    if (!slots_count_valid(n) || !servers_ok || pad != 0 || (fl & ~(uint32_t)SLOTS_STATIC) != 0 ||
        len != 16 + (fixed ? 0 : (uint64_t)n * 4))
        return errf(r->err, r->errlen, "slot map record at byte %" PRIu64 ": bad sizes", r->pos);
    if (!fixed) {
        free(l->slot_owner);
        l->slot_owner = malloc((size_t)n * 4);
        if (l->slot_owner == NULL)
            return errf(r->err, r->errlen, "out of memory for the slot map");
        if (ckr_get(r, l->slot_owner, (size_t)n * 4, "the slot map"))
            return -1;
        for (uint32_t i = 0; i < n; i++)
            if (l->slot_owner[i] >= ns)
                return errf(r->err, r->errlen, "slot map: slot %u on task %u of %u", i,
                            l->slot_owner[i], ns);
    }
    l->has_slots = true;
    l->slots_n = n;
    l->slots_servers = ns;
    return 0;
}

/* ---- the end (record 4): how many records came before it, of how many bytes ---- */

static uint64_t end_size(const ckpt_snapshot *s)
{
    (void)s;
    return 20 + 16;
}

static int write_end(ckpt_writer *w, const ckpt_snapshot *s, tally *t)
{
    (void)s;
    if (ckw_rec_begin(w, CKPT_REC_END, 16) || ckw_u64(w, t->nrec) || ckw_u64(w, t->total) ||
        ckw_rec_end(w))
        return -1;
    return 0;
}

static int read_end(file_read *f, uint32_t flags, uint64_t len)
{
    (void)flags;
    if (len != 16 || ckr_u64(&f->r, &f->end_nrec, "the end record") ||
        ckr_u64(&f->r, &f->end_total, "the end record"))
        return -1;
    f->ended = true;
    return 0;
}

/* ---- the record types ---- */

/* Every record type, in the order a file holds them. size: bytes of its records in the file
 * of a snapshot, framing included; write: writes them (none, one or many), counting each in
 * the tally; read: reads the payload of one (len bytes, its flags) into the file's state.
 * since: the oldest format version that has it; flags0: read only with flags 0. */
static const struct record_type {
    uint32_t type;
    const char *name;
    uint32_t since;
    bool flags0;
    uint64_t (*size)(const ckpt_snapshot *s);
    int (*write)(ckpt_writer *w, const ckpt_snapshot *s, tally *t);
    int (*read)(file_read *f, uint32_t flags, uint64_t len);
} record_types[] = {
    {CKPT_REC_SLOTS, "slot map", 1, true, slots_size, write_slots, read_slots},
    {CKPT_REC_VARIABLE, "variable", 1, false, vars_size, write_vars, read_var},
    /* write_tables writes each table as record 6, 7 or 12. */
    {CKPT_REC_TABLE, "table", 1, true, tables_size, write_tables, read_table},
    {CKPT_REC_TABLE_DELTA, "table delta", CKPT_FORMAT_DELTA, true, NULL, NULL, read_table_delta},
    {CKPT_REC_TABLE_COLD, "table with its cold store", 1, true, NULL, NULL, read_table_cold},
    {CKPT_REC_TABLE_SKETCH, "table sketch", 1, true, sketches_size, write_sketches, read_sketch},
    {CKPT_REC_DEDUP, "dedup table", 1, false, dedup_size, write_dedup, read_dedup},
    {CKPT_REC_DEDUP_FLOORS, "dedup floors", 2, false, floors_size, write_floors, read_floors},
    {CKPT_REC_SYNC, "clock table", 1, false, sync_size, write_sync, read_sync},
    {CKPT_REC_SYNC_OUT, "clock table rest", 1, false, sync_out_size, write_sync_out, read_sync_out},
    {CKPT_REC_REPLICA, "replica position", 1, false, replica_size, write_replica, read_replica},
    {CKPT_REC_END, "end", 1, false, end_size, write_end, read_end},
};
#define NRECORD_TYPES (sizeof(record_types) / sizeof(record_types[0]))

/* The row that reads a record of type with flags in a file of format version ver; NULL: an
 * unknown record. */
static const struct record_type *record_type_of(uint32_t type, uint32_t flags, uint32_t ver)
{
    for (size_t i = 0; i < NRECORD_TYPES; i++) {
        const struct record_type *rt = &record_types[i];
        if (rt->type == type)
            return ver >= rt->since && (!rt->flags0 || flags == 0) ? rt : NULL;
    }
    return NULL;
}

/* ---- files ---- */

uint64_t ckpt_file_size(const ckpt_snapshot *s)
{
    uint64_t n = CKPT_HEADER_SIZE;
    for (size_t i = 0; i < NRECORD_TYPES; i++)
        if (record_types[i].size)
            n += record_types[i].size(s);
    return n;
}

int ckpt_file_write(ckpt_writer *w, const ckpt_snapshot *s, const ckpt_file_id *id)
{
    uint8_t hdr[CKPT_HEADER_SIZE] = {0};
    memcpy(hdr, CKPT_MAGIC, 8);
    uint32_t u32;
    uint64_t u64;
    u32 = id->prev ? CKPT_FORMAT_DELTA : CKPT_FORMAT_VERSION;
    memcpy(hdr + 48, &id->prev, 8);
    memcpy(hdr + 8, &u32, 4);
    u32 = CKPT_HEADER_SIZE;
    memcpy(hdr + 12, &u32, 4);
    memcpy(hdr + 16, &id->num_servers, 4);
    memcpy(hdr + 20, &id->task, 4);
    memcpy(hdr + 24, &id->cluster_hash, 8);
    memcpy(hdr + 32, &id->seq, 8);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    u64 = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    memcpy(hdr + 40, &u64, 8);
    memcpy(hdr + 56, &s->slots.nslots, 4); /* the slot record follows the header */
    u32 = ckpt_header_crc(hdr);
    memcpy(hdr + 60, &u32, 4);
    if (ckw_put(w, hdr, sizeof(hdr)))
        return -1;
    tally t = {0};
    for (size_t i = 0; i < NRECORD_TYPES; i++)
        if (record_types[i].write && record_types[i].write(w, s, &t))
            return -1;
    return ckw_flush(w);
}

void ckpt_loaded_free(ckpt_loaded *l)
{
    for (size_t i = 0; i < l->nvars; i++)
        variable_destroy(l->vars[i]);
    free(l->vars);
    free(l->dedup);
    free(l->floors);
    free(l->workers);
    for (size_t i = 0; i < l->ntables; i++) {
        table_destroy(l->tables[i].t);
        free(l->tables[i].spec);
    }
    free(l->tables);
    for (size_t i = 0; i < l->ntdeltas; i++) {
        free(l->tdeltas[i].name);
        free(l->tdeltas[i].spec);
        free(l->tdeltas[i].body);
    }
    free(l->tdeltas);
    for (size_t i = 0; i < l->nsketches; i++) {
        free(l->sketches[i].name);
        free(l->sketches[i].data);
    }
    free(l->sketches);
    free(l->slot_owner);
    memset(l, 0, sizeof(*l));
}

int ckpt_file_read(const char *path, server_state *st, const ckpt_source *src,
                   uint64_t cluster_hash, uint64_t name_seq, ckpt_loaded *l, uint64_t *seq_out,
                   char *err, size_t errlen)
{
    memset(l, 0, sizeof(*l));
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "cannot open: %s", strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    file_read fr = {
        .r = {.f = f, .path = path, .err = err, .errlen = errlen}, .st = st, .src = src, .l = l};
    ckpt_reader *r = &fr.r;
    uint8_t hdr[CKPT_HEADER_SIZE];
    int rc = -1;
    if (ckr_get(r, hdr, sizeof(hdr), "the header"))
        goto out;
    if (memcmp(hdr, CKPT_MAGIC, 8) != 0) {
        errf(err, errlen, "bad magic (not a psd checkpoint)");
        goto out;
    }
    uint32_t ver, hsize, nserv, task, hcrc;
    uint64_t hash, seq;
    memcpy(&ver, hdr + 8, 4);
    memcpy(&hsize, hdr + 12, 4);
    memcpy(&nserv, hdr + 16, 4);
    memcpy(&task, hdr + 20, 4);
    memcpy(&hash, hdr + 24, 8);
    memcpy(&seq, hdr + 32, 8);
    memcpy(&hcrc, hdr + 60, 4);
    if (hcrc != ckpt_header_crc(hdr)) {
        errf(err, errlen, "bad header CRC");
        goto out;
    }
    uint32_t hslots;
    memcpy(&hslots, hdr + 56, 4);
    if (ver < CKPT_FORMAT_VERSION_MIN || ver > CKPT_FORMAT_DELTA || hsize != CKPT_HEADER_SIZE) {
        errf(err, errlen,
             "format version %u (header %u bytes); this server reads versions %u to %u", ver, hsize,
             CKPT_FORMAT_VERSION_MIN, CKPT_FORMAT_DELTA);
        goto out;
    }
    memcpy(&l->prev, hdr + 48, 8);
    if ((ver == CKPT_FORMAT_DELTA) != (l->prev != 0) || l->prev >= name_seq) {
        errf(err, errlen, "header of a %s names previous file %" PRIu64,
             ver == CKPT_FORMAT_DELTA ? "delta" : "full checkpoint", l->prev);
        goto out;
    }
    if (nserv != src->num_servers || task != src->task) {
        errf(err, errlen,
             "made for ps %u of a cluster of %u ps tasks, but ps %u of %u was expected: "
             "refusing to restore it (move it away or fix the cluster spec)",
             task, nserv, src->task, src->num_servers);
        rc = CKPT_REFUSED;
        goto out;
    }
    if (seq != name_seq) {
        errf(err, errlen, "header says sequence %" PRIu64 ", the file name %" PRIu64, seq,
             name_seq);
        goto out;
    }
    if (hash != cluster_hash && src->keep == NULL) /* a resize: of course other addresses */
        log_warn("%s was made with other ps addresses (same number of tasks): restoring it", path);
    fr.ver = ver;
    for (;;) {
        uint32_t type, flags;
        uint64_t len;
        ckr_rec_begin(r);
        if (ckr_u32(r, &type, "a record header") || ckr_u32(r, &flags, "a record header") ||
            ckr_u64(r, &len, "a record header"))
            goto out;
        const struct record_type *rt = record_type_of(type, flags, ver);
        if (rt == NULL) {
            errf(err, errlen, "unknown record type %u at byte %" PRIu64, type, r->pos);
            goto out;
        }
        if (rt->read(&fr, flags, len) || ckr_rec_end(r, type))
            goto out;
        if (fr.ended) {
            if (fr.end_nrec != fr.nrec || fr.end_total != fr.total) {
                errf(err, errlen,
                     "end record counts %" PRIu64 " records of %" PRIu64 " bytes, file has %" PRIu64
                     " of %" PRIu64,
                     fr.end_nrec, fr.end_total, fr.nrec, fr.total);
                goto out;
            }
            break;
        }
        fr.nrec++;
        fr.total += len;
    }
    if (hslots != (l->has_slots ? l->slots_n : 0)) {
        errf(err, errlen, "the header says %u slots, its slot record %u", hslots,
             l->has_slots ? l->slots_n : 0);
        goto out;
    }
    int extra = fgetc(f);
    if (extra != EOF) {
        errf(err, errlen, "data after the end record at byte %" PRIu64, r->pos);
        goto out;
    }
    l->bytes = r->pos;
    *seq_out = seq;
    rc = 0;
out:
    fclose(f);
    if (rc != 0)
        ckpt_loaded_free(l);
    return rc;
}

int ckpt_peek_shape(const char *path, ckpt_shape *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    uint8_t hdr[CKPT_HEADER_SIZE], rec[16];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "cannot open: %s", strerror(errno));
    size_t got = fread(hdr, 1, sizeof(hdr), f);
    size_t rgot = got == sizeof(hdr) ? fread(rec, 1, sizeof(rec), f) : 0;
    uint32_t hcrc, type = 0;
    uint64_t len = 0;
    memcpy(&hcrc, hdr + 60, 4);
    memcpy(&type, rec, 4);
    memcpy(&len, rec + 8, 8);
    if (got != sizeof(hdr) || memcmp(hdr, CKPT_MAGIC, 8) != 0 || hcrc != ckpt_header_crc(hdr)) {
        fclose(f);
        return errf(err, errlen, "bad or truncated header");
    }
    memcpy(&out->num_servers, hdr + 16, 4);
    memcpy(&out->task, hdr + 20, 4);
    memcpy(&out->created_ns, hdr + 40, 8);
    uint32_t hslots;
    memcpy(&hslots, hdr + 56, 4);
    if (hslots == 0) {
        fclose(f);
        return 0; /* a file written before slots */
    }
    if (rgot != sizeof(rec) || type != CKPT_REC_SLOTS) {
        fclose(f);
        return errf(err, errlen, "damaged slot record");
    }
    /* The slot record, its CRC checked: a damaged one must not pass for another placement. */
    uint8_t *p = len >= 16 && len <= 16 + ((uint64_t)4 << 24) ? malloc((size_t)len + 4) : NULL;
    bool ok = p && fread(p, 1, (size_t)len + 4, f) == len + 4;
    fclose(f);
    uint32_t crc = 0, stored = 0;
    if (ok) {
        crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), rec, sizeof(rec));
        crc = (uint32_t)crc32(crc, p, (uInt)len);
        memcpy(&stored, p + len, 4);
    }
    if (!ok || crc != stored) {
        free(p);
        return errf(err, errlen, "damaged slot record");
    }
    uint32_t flags;
    memcpy(&out->slots_n, p, 4);
    memcpy(&out->slots_servers, p + 4, 4);
    memcpy(&flags, p + 8, 4);
    free(p);
    out->has_slots = true;
    out->slots_fixed = (flags & SLOTS_STATIC) != 0;
    return 0;
}
