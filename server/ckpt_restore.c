/* The restore of a server's shard at start (ckpt_restore.h): the chains of the directory's
 * files, the deltas applied over their full file, and the result applied to the server. */
#include "ckpt_restore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_dir.h"
#include "ckpt_format.h"
#include "ckpt_frame.h"
#include "log.h"
#include "placement.h"
#include "slots.h"
#include "table.h"
#include "timeutil.h"
#include "util.h"

/* errf returns -1: a failure's message and CKPT_FAILED in one (rc = errf(...)). */
_Static_assert(CKPT_FAILED == -1, "errf's -1 is CKPT_FAILED");

static long loaded_find_table(const ckpt_loaded *l, const char *name);

static int apply_loaded(server_state *st, ckpt_loaded *l, char *err, size_t errlen)
{
    /* The sketches of the newest file, onto the tables as restored. */
    for (size_t i = 0; i < l->nsketches; i++) {
        long b = loaded_find_table(l, l->sketches[i].name);
        if (b < 0)
            return errf(err, errlen, "admission sketch of table \"%s\", which the file lacks",
                        l->sketches[i].name);
        if (table_sketch_load(l->tables[b].t, l->sketches[i].data, l->sketches[i].len) != 0)
            return errf(err, errlen,
                        "admission sketch of table \"%s\": %zu bytes, which its spec does not "
                        "hold",
                        l->sketches[i].name, l->sketches[i].len);
    }
    for (size_t i = 0; i < l->ntables; i++) {
        loaded_table *lt = &l->tables[i];
        if (server_table_register(st, lt->t, lt->spec, lt->len))
            return errf(err, errlen, "table \"%s\" appears twice (or out of memory)",
                        table_name(lt->t));
        lt->t = NULL; /* the server owns it */
    }
    for (size_t i = 0; i < l->nvars; i++) {
        variable *v = l->vars[i];
        variable *in = store_insert(st->vars, v);
        variable_release(in); /* the store keeps its own reference */
        if (in != v)
            return errf(err, errlen, "variable \"%s\" appears twice", v->name);
        l->vars[i] = NULL; /* the store owns it */
    }
    size_t per = 2 + (size_t)l->dedup_words;
    for (uint64_t i = 0; i < l->dedup_clients; i++) {
        const uint64_t *e = l->dedup + i * per;
        if (dedup_import(st->dedup, e[0], e[1], e + 2, l->dedup_words) != 0)
            return errf(err, errlen, "out of memory restoring the dedup table");
    }
    if (l->floors) {
        int rc = dedup_import_floors(st->dedup, l->floors, l->nfloors);
        if (rc != 0)
            return errf(err, errlen, "%s",
                        rc == -2 ? "out of memory restoring the dedup tombstones"
                                 : "malformed dedup tombstone record");
    }
    if (l->have_sync)
        sync_import(st, l->workers, l->nworkers, l->applied_min, l->frontier);
    return 0;
}

static long loaded_find_table(const ckpt_loaded *l, const char *name)
{
    for (size_t i = 0; i < l->ntables; i++)
        if (l->tables[i].t && strcmp(table_name(l->tables[i].t), name) == 0)
            return (long)i;
    return -1;
}

static void loaded_drop_table(ckpt_loaded *l, size_t i)
{
    table_destroy(l->tables[i].t);
    free(l->tables[i].spec);
    l->tables[i] = l->tables[l->ntables - 1];
    l->ntables--;
}

/* Applies one partition segment list of a table delta to t. Returns 0 or -1 (err). */
static int apply_table_delta(table *t, const ckpt_table_delta *d, const ckpt_source *src, char *err,
                             size_t errlen)
{
    uint64_t per = 16 + 4 * (uint64_t)d->row_floats, off = 0;
    /* Rows as written now, or as before Adam's step count was one per row (apply_delta). */
    bool legacy = d->row_floats != table_row_floats(t);
    float *row = malloc(((size_t)d->row_floats + table_row_floats(t)) * 4);
    if (row == NULL)
        return errf(err, errlen, "out of memory");
    float *now = row + d->row_floats;
    for (uint32_t p = 0; p < d->nparts; p++) {
        uint32_t flags;
        uint64_t nrem, nrows;
        memcpy(&flags, d->body + off, 4);
        memcpy(&nrem, d->body + off + 8, 8);
        memcpy(&nrows, d->body + off + 16, 8);
        off += 24;
        if (flags & CKPT_PART_WHOLE)
            table_partition_clear(t, p);
        for (uint64_t i = 0; i < nrem; i++, off += 8) {
            int64_t id;
            memcpy(&id, d->body + off, 8);
            table_remove(t, &id, 1);
        }
        for (uint64_t i = 0; i < nrows; i++, off += per) {
            int64_t id, upd;
            memcpy(&id, d->body + off, 8);
            memcpy(&upd, d->body + off + 8, 8);
            if (src->keep && slots_row_owner(src->keep, d->name, id) != src->self)
                continue; /* another server's row now */
            memcpy(row, d->body + off + 16, (size_t)d->row_floats * 4);
            if (legacy)
                table_row_from_legacy(t, row, now);
            int rc = table_insert_row(t, id, legacy ? now : row, ckpt_row_time(upd));
            if (rc != TABLE_OK) {
                free(row);
                return errf(err, errlen, "table \"%s\": row %" PRId64 " could not be restored%s",
                            d->name, id,
                            rc == TABLE_LIMIT ? " within max-server-bytes or max_rows"
                                              : " (out of memory)");
            }
        }
    }
    free(row);
    return 0;
}

/* Applies delta file d over l (the state of the previous file of the chain): tables as d
 * says (changed rows, removed ids, new and deleted tables), everything else replaced by d's.
 * Returns 0, or -1 with a message: a table delta without its base (nothing applied), or a
 * row that does not fit (l then half applied: the restore fails). d is emptied. */
static int apply_delta(ckpt_loaded *l, ckpt_loaded *d, const ckpt_source *src, char *err,
                       size_t errlen)
{
    for (size_t i = 0; i < d->ntdeltas; i++) {
        const ckpt_table_delta *td = &d->tdeltas[i];
        long b = loaded_find_table(l, td->name);
        if (b < 0)
            return errf(err, errlen, "table \"%s\" changed in the delta but absent before it",
                        td->name);
        const loaded_table *lt = &l->tables[b];
        if (lt->len != td->spec_len || memcmp(lt->spec, td->spec, td->spec_len) != 0 ||
            (table_row_floats(lt->t) != td->row_floats &&
             table_legacy_row_floats(lt->t) != td->row_floats) ||
            table_partitions(lt->t) != td->nparts)
            return errf(err, errlen,
                        "table \"%s\": the delta's spec differs from the one before it", td->name);
    }
    /* Deleted tables (in neither list of d) and tables d holds whole go. */
    for (size_t i = 0; i < l->ntables;) {
        const char *name = table_name(l->tables[i].t);
        bool changed = false;
        for (size_t k = 0; k < d->ntdeltas && !changed; k++)
            changed = strcmp(d->tdeltas[k].name, name) == 0;
        if (changed)
            i++;
        else
            loaded_drop_table(l, i);
    }
    for (size_t i = 0; i < d->ntables; i++) {
        loaded_table *nt = realloc(l->tables, (l->ntables + 1) * sizeof(*nt));
        if (nt == NULL)
            return errf(err, errlen, "out of memory");
        l->tables = nt;
        l->tables[l->ntables++] = d->tables[i];
        d->tables[i] = (loaded_table){0};
    }
    d->ntables = 0;
    for (size_t i = 0; i < d->ntdeltas; i++) {
        long b = loaded_find_table(l, d->tdeltas[i].name);
        if (b < 0 || apply_table_delta(l->tables[b].t, &d->tdeltas[i], src, err, errlen) != 0)
            return b < 0
                       ? errf(err, errlen, "internal error: table \"%s\" lost", d->tdeltas[i].name)
                       : -1;
    }
    /* The rest of the state is d's. */
    for (size_t i = 0; i < l->nvars; i++)
        variable_destroy(l->vars[i]);
    free(l->vars);
    free(l->dedup);
    free(l->floors);
    free(l->workers);
    l->vars = d->vars;
    l->nvars = d->nvars;
    l->cap = d->cap;
    l->dedup = d->dedup;
    l->dedup_clients = d->dedup_clients;
    l->dedup_words = d->dedup_words;
    l->floors = d->floors;
    l->nfloors = d->nfloors;
    l->workers = d->workers;
    l->nworkers = d->nworkers;
    l->applied_min = d->applied_min;
    l->frontier = d->frontier;
    l->have_sync = d->have_sync;
    for (size_t i = 0; i < l->nsketches; i++) {
        free(l->sketches[i].name);
        free(l->sketches[i].data);
    }
    free(l->sketches);
    l->sketches = d->sketches; /* the delta's sketches: the newest */
    l->nsketches = d->nsketches;
    d->sketches = NULL;
    d->nsketches = 0;
    free(l->slot_owner); /* the delta's slot map: the newest */
    l->slot_owner = d->slot_owner;
    d->slot_owner = NULL;
    l->has_slots = d->has_slots;
    l->slots_n = d->slots_n;
    l->slots_servers = d->slots_servers;
    l->has_pos = d->has_pos; /* the delta's position: the newest */
    l->pos_epoch = d->pos_epoch;
    l->pos_lsn = d->pos_lsn;
    l->bytes += d->bytes;
    l->prev = d->prev;
    d->vars = NULL;
    d->nvars = d->cap = 0;
    d->dedup = NULL;
    d->floors = NULL;
    d->workers = NULL;
    return 0;
}

/* Loads the newest valid checkpoint among files[0..n) (newest first, files of src's task):
 * its full file and the deltas of its chain, into *out (not applied). A corrupt or truncated
 * one is skipped with a warning and the previous one tried. Fills info's path, seq, base,
 * deltas, skipped, bytes. Returns CKPT_RESTORED, CKPT_REFUSED or CKPT_FAILED (err). */
static int load_newest(server_state *st, const checkpoint_config *cfg, const ckpt_source *src,
                       const ckpt_file *files, long n, ckpt_loaded *out, checkpoint_info *info,
                       char *err, size_t errlen)
{
    int rc = CKPT_FAILED;
    size_t off = 0;
    off +=
        (size_t)snprintf(err, errlen, "no valid checkpoint of ps %u in %s:", src->task, cfg->dir);
    /* bad[i]: files[i] can't be restored, nor any delta built on it. */
    bool *bad = calloc((size_t)n, sizeof(*bad));
    long *chain = calloc((size_t)n, sizeof(*chain));
    if (bad == NULL || chain == NULL) {
        free(bad);
        free(chain);
        errf(err, errlen, "out of memory listing checkpoints");
        return CKPT_FAILED;
    }
    for (long i = 0; i < n && rc == CKPT_FAILED; i++) {
        if (bad[i])
            continue;
        char path[4200], why[1024];
        /* The chain of files[i]: chain[0] = i, back to its full checkpoint chain[len-1]. */
        long len = 0, cur = i;
        bool broken = false;
        while (!broken) {
            chain[len++] = cur;
            uint64_t prev = 0;
            snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[cur].name);
            if (ckpt_peek_prev(path, &prev, why, sizeof(why)) != 0) {
                broken = true;
                bad[cur] = true;
                break;
            }
            if (prev == 0)
                break;
            long j = cur + 1;
            while (j < n && files[j].seq != prev)
                j++;
            if (j == n || bad[j] || len == n) {
                snprintf(why, sizeof(why), "it is a delta of checkpoint %" PRIu64 ", which is %s",
                         prev, j == n ? "missing" : "unusable");
                broken = true;
                break;
            }
            cur = j;
        }
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[i].name);
        if (broken) {
            bad[i] = true;
            if (info->skipped == 0)
                info->skipped = files[i].seq;
            log_warn("checkpoint %s is unusable (%s)%s", path, why,
                     i + 1 < n ? ": trying the previous one" : "");
            if (off < errlen)
                off += (size_t)snprintf(err + off, errlen - off, " %s: %s;", files[i].name, why);
            continue;
        }
        long full = chain[len - 1];
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[full].name);
        ckpt_loaded l;
        uint64_t seq = 0;
        int r = ckpt_file_read(path, st, src, cfg->cluster_hash, files[full].seq, &l, &seq, why,
                               sizeof(why));
        if (r == CKPT_REFUSED) {
            errf(err, errlen, "checkpoint %s: %s", path, why);
            rc = CKPT_REFUSED;
            break;
        }
        if (r == 0 && l.prev != 0) {
            ckpt_loaded_free(&l);
            snprintf(why, sizeof(why), "its header changed while reading");
            r = -1;
        }
        if (r != 0) {
            bad[full] = true;
            bad[i] = true;
            if (info->skipped == 0)
                info->skipped = files[i].seq;
            log_warn("checkpoint %s is unusable (%s)%s", path, why,
                     i + 1 < n ? ": trying the previous one" : "");
            if (off < errlen)
                off += (size_t)snprintf(err + off, errlen - off, " %s: %s;", files[full].name, why);
            continue;
        }
        /* The deltas, oldest first; a damaged one ends the chain at the file before it. */
        long good = full;
        uint32_t deltas = 0;
        for (long k = len - 2; k >= 0; k--) {
            char dpath[4200];
            snprintf(dpath, sizeof(dpath), "%s/%s", cfg->dir, files[chain[k]].name);
            ckpt_loaded d;
            uint64_t dseq = 0;
            int dr = ckpt_file_read(dpath, st, src, cfg->cluster_hash, files[chain[k]].seq, &d,
                                    &dseq, why, sizeof(why));
            if (dr == 0 && d.prev != files[good].seq) {
                ckpt_loaded_free(&d);
                snprintf(why, sizeof(why), "its header names another previous file");
                dr = -1;
            }
            if (dr != 0) {
                log_warn("checkpoint delta %s is unusable (%s): restoring checkpoint %" PRIu64
                         " instead, the last consistent point of its chain; updates applied after "
                         "it are lost",
                         dpath, why, files[good].seq);
                info->skipped = files[chain[k]].seq;
                break;
            }
            int ar = apply_delta(&l, &d, src, why, sizeof(why));
            ckpt_loaded_free(&d);
            if (ar != 0) {
                errf(err, errlen, "restoring %s over checkpoint %" PRIu64 ": %s", dpath,
                     files[good].seq, why);
                ckpt_loaded_free(&l);
                free(bad);
                free(chain);
                return CKPT_FAILED;
            }
            good = chain[k];
            deltas++;
        }
        snprintf(info->path, sizeof(info->path), "%s/%s", cfg->dir, files[good].name);
        info->seq = files[good].seq;
        info->base = files[full].seq;
        info->deltas = deltas;
        info->bytes = l.bytes;
        *out = l;
        rc = CKPT_RESTORED;
    }
    free(bad);
    free(chain);
    return rc;
}

/* ---- a restore onto another number of servers (or of files written before slots) ---- */

/* True if a file of shape sh is placed as map `now` places this cluster: the same static map,
 * or (a file written before slots) hash mod N, which is the static map when N divides S. */
static bool shape_current(const ckpt_shape *sh, const slot_map *now)
{
    if (sh->num_servers != now->nservers || now->owner != NULL)
        return false;
    if (sh->has_slots)
        return sh->slots_fixed && sh->slots_n == now->nslots && sh->slots_servers == now->nservers;
    return now->nservers != 0 && now->nslots % now->nservers == 0;
}

/* The files of files[0..n) (listed from dir) that `want` accepts: current (want_current:
 * placed as `now` places, and made after `after` ns) or of cluster size want_n and not
 * current. A file whose header does not read counts as current (the restore reports it as
 * today's damaged files). Returns the count, the files into out (as many as files). */
static long files_of_shape(const char *dir, const ckpt_file *files, long n, const slot_map *now,
                           bool want_current, uint64_t after, uint32_t want_n, ckpt_file *out)
{
    long k = 0;
    for (long i = 0; i < n; i++) {
        char path[4200], why[256];
        snprintf(path, sizeof(path), "%s/%s", dir, files[i].name);
        ckpt_shape sh;
        bool readable = ckpt_peek_shape(path, &sh, why, sizeof(why)) == 0;
        bool cur = !readable || shape_current(&sh, now);
        if (want_current ? cur && (!readable || sh.created_ns > after)
                         : (!cur && sh.num_servers == want_n))
            out[k++] = files[i];
    }
    return k;
}

static int grow_vars(ckpt_loaded *l)
{
    if (l->nvars < l->cap)
        return 0;
    size_t nc = l->cap ? 2 * l->cap : 16;
    variable **nv = realloc(l->vars, nc * sizeof(*nv));
    if (nv == NULL)
        return -1;
    l->vars = nv;
    l->cap = nc;
    return 0;
}

/* What the old tasks' files restore, merged (restore_resized). */
typedef struct resized {
    ckpt_loaded all; /* tables, variables (as pieces: place_vars), windows, clocks */
    struct floors {
        uint64_t *w;
        size_t n;
    } * floors; /* each old task's dedup floors, imported after the windows */
    size_t nfloors;
} resized;

/* Moves what l (one old task's state, its rows filtered already) holds into acc: its tables
 * (rows added to a table acc has), its variables, its exactly-once windows and floors, clocks
 * (the union, each worker's newest clock), finished workers, the newest frontier. */
static int merge_task(server_state *st, resized *acc, ckpt_loaded *l, char *err, size_t errlen)
{
    ckpt_loaded *all = &acc->all;
    for (size_t i = 0; i < l->ntables; i++) {
        loaded_table *lt = &l->tables[i];
        size_t nlen = 0;
        uint8_t *nspec = ckpt_table_spec_for(lt->spec, lt->len, st->num_servers, &nlen);
        if (nspec == NULL)
            return errf(err, errlen, "out of memory");
        free(lt->spec);
        lt->spec = nspec;
        lt->len = nlen;
        long b = loaded_find_table(all, table_name(lt->t));
        if (b < 0) {
            loaded_table *nt = realloc(all->tables, (all->ntables + 1) * sizeof(*nt));
            if (nt == NULL)
                return errf(err, errlen, "out of memory");
            all->tables = nt;
            all->tables[all->ntables++] = *lt;
            *lt = (loaded_table){0};
            continue;
        }
        table *dst = all->tables[b].t;
        if (all->tables[b].len != lt->len || memcmp(all->tables[b].spec, lt->spec, lt->len) != 0 ||
            table_row_floats(dst) != table_row_floats(lt->t))
            return errf(err, errlen, "table \"%s\": the old servers' files hold different specs",
                        table_name(dst));
        for (uint32_t p = 0; p < table_partitions(lt->t); p++) {
            table_rows rows = {0};
            if (table_copy_partition(lt->t, p, &rows) != 0)
                return errf(err, errlen, "out of memory copying table \"%s\"", table_name(dst));
            for (size_t r = 0; r < rows.n; r++) {
                int rc =
                    table_insert_row(dst, rows.ids[r], rows.floats + r * (size_t)rows.row_floats,
                                     rows.updated_ms[r]);
                if (rc != TABLE_OK) {
                    table_rows_free(&rows);
                    return errf(err, errlen,
                                "table \"%s\": row %" PRId64 " could not be restored%s",
                                table_name(dst), rows.ids[r],
                                rc == TABLE_LIMIT ? " within max-server-bytes or max_rows"
                                                  : " (out of memory)");
                }
            }
            table_rows_free(&rows);
        }
    }
    for (size_t i = 0; i < l->nvars; i++) {
        if (grow_vars(all) != 0)
            return errf(err, errlen, "out of memory");
        all->vars[all->nvars++] = l->vars[i];
        l->vars[i] = NULL;
    }
    l->nvars = 0;
    /* Exactly-once windows: every client's (a client numbers its updates per placement task,
     * so a client's window of this server's own old task is the one that numbers its stream
     * here: it is imported last and wins). */
    if (l->dedup_clients) {
        if (all->dedup_words == 0)
            all->dedup_words = l->dedup_words;
        size_t per_l = 2 + (size_t)l->dedup_words, per = 2 + (size_t)all->dedup_words;
        uint64_t *nd =
            realloc(all->dedup, (size_t)(all->dedup_clients + l->dedup_clients) * per * 8);
        if (nd == NULL)
            return errf(err, errlen, "out of memory merging the dedup tables");
        all->dedup = nd;
        for (uint64_t c = 0; c < l->dedup_clients; c++) {
            uint64_t *e = all->dedup + (size_t)all->dedup_clients * per;
            const uint64_t *x = l->dedup + (size_t)c * per_l;
            memset(e, 0, per * 8);
            memcpy(e, x, (per < per_l ? per : per_l) * 8);
            all->dedup_clients++;
        }
    }
    if (l->floors) {
        struct floors *nf = realloc(acc->floors, (acc->nfloors + 1) * sizeof(*nf));
        if (nf == NULL)
            return errf(err, errlen, "out of memory merging the dedup tombstones");
        acc->floors = nf;
        acc->floors[acc->nfloors++] = (struct floors){.w = l->floors, .n = l->nfloors};
        l->floors = NULL;
        l->nfloors = 0;
    }
    if (l->have_sync) {
        for (size_t i = 0; i < l->nworkers; i++) {
            const sync_worker_rec *w = &l->workers[i];
            size_t k = 0;
            while (k < all->nworkers && all->workers[k].id != w->id)
                k++;
            if (k == all->nworkers) {
                sync_worker_rec *nw = realloc(all->workers, (all->nworkers + 1) * sizeof(*nw));
                if (nw == NULL)
                    return errf(err, errlen, "out of memory merging the clock tables");
                all->workers = nw;
                all->workers[all->nworkers++] = *w;
                continue;
            }
            sync_worker_rec *a = &all->workers[k];
            if (w->clock > a->clock)
                a->clock = w->clock;
            a->known = a->known || w->known;
            a->live = a->live || w->live;
            if (w->left && !a->left) {
                a->left = true;
                a->left_client = w->left_client;
            }
        }
        if (!all->have_sync || l->applied_min > all->applied_min)
            all->applied_min = l->applied_min;
        if (l->frontier != SYNC_NO_FRONTIER &&
            (all->frontier == SYNC_NO_FRONTIER || l->frontier > all->frontier))
            all->frontier = l->frontier;
        all->have_sync = true;
    }
    all->bytes += l->bytes;
    return 0;
}

/* The output of place_vars: the variables this server keeps, in order. */
typedef struct placed {
    variable **v;
    size_t n, cap;
} placed;

static int placed_add(placed *o, variable *v)
{
    if (o->n == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 16;
        variable **g = realloc(o->v, nc * sizeof(*g));
        if (g == NULL)
            return -1;
        o->v = g;
        o->cap = nc;
    }
    o->v[o->n++] = v;
    return 0;
}

/* A new entry [off, off+cnt) of the split variable v (its spec as now), unfilled; NULL with
 * why in err. */
static variable *piece_make(variable *v, uint64_t off, uint64_t cnt, char *err, size_t errlen)
{
    char verr[512];
    variable *nv = variable_create_unfilled(v->spec, v->numel, off, cnt, verr, sizeof(verr));
    if (nv == NULL || nv->nslots != v->nslots) {
        errf(err, errlen, "variable \"%s\": %s", v->name,
             nv ? "pieces with other optimizer slots" : verr);
        variable_destroy(nv);
        return NULL;
    }
    nv->staleness = v->staleness;
    return nv;
}

/* Copies into nv what the old pieces (n of them) hold of its range; returns the elements
 * copied. */
static uint64_t piece_fill(variable *nv, variable *const *pieces, size_t n)
{
    uint64_t off = nv->offset, cnt = nv->count, covered = 0;
    for (size_t j = 0; j < n; j++) {
        const variable *p = pieces[j];
        uint64_t lo = p->offset > off ? p->offset : off;
        uint64_t hi = p->offset + p->count < off + cnt ? p->offset + p->count : off + cnt;
        if (lo >= hi)
            continue;
        memcpy(nv->params + (lo - off), p->params + (lo - p->offset), (hi - lo) * 4);
        for (size_t k = 0; k < nv->nslots; k++)
            memcpy(nv->slots[k] + (lo - off), p->slots[k] + (lo - p->offset), (hi - lo) * 4);
        covered += hi - lo;
    }
    return covered;
}

/* The entries this server makes of the variable split in ranges whose old pieces are
 * pieces[0..n) (v = pieces[0]): on another number of servers (convert) and with more than
 * one part's elements it is converted to parts
 * (the head, and the parts whose slot `now` gives this server), else it is cut in this
 * cluster's ranges (or held whole by its slot's owner when it can't be split over this many
 * servers). Each made entry is filled from the pieces that overlap it, its version the
 * highest of theirs. */
static int place_split(server_state *st, variable *const *pieces, size_t n, const slot_map *now,
                       bool convert, placed *out, char *err, size_t errlen)
{
    variable *v = pieces[0];
    uint32_t self = st->task_index, m = st->num_servers;
    uint64_t numel = v->numel, version = 0;
    bool agg = false;
    for (size_t j = 0; j < n; j++) {
        uint64_t pv = atomic_load(&pieces[j]->version);
        version = pv > version ? pv : version;
        agg = agg || pieces[j]->agg != NULL;
    }
    bool parts = convert && placement_is_parts(numel, numel * 4, 0);
    bool split = parts || placement_is_split(numel, numel * 4, 0, m);
    v->spec->parts = parts;
    v->spec->split = split;
    v->spec->num_servers = parts ? 0 : m;
    size_t first = out->n;
    int rc = 0;
    uint64_t k = 0, nk = parts ? placement_part_count(numel) : 1;
    if (parts) { /* the head, then the parts */
        variable *h = piece_make(v, 0, 0, err, errlen);
        if (h == NULL) {
            rc = -1;
        } else if (placed_add(out, h) != 0) {
            variable_destroy(h);
            rc = errf(err, errlen, "out of memory");
        }
    }
    for (; rc == 0 && k < nk; k++) {
        uint64_t off = 0, cnt = numel;
        if (parts) {
            if (slots_part_owner(now, v->name, k) != self)
                continue;
            placement_part_range(numel, k, &off, &cnt);
        } else if (split) {
            placement_range(numel, m, self, &off, &cnt);
        } else if (slots_name_owner(now, v->name) != self) {
            continue;
        }
        variable *nv = piece_make(v, off, cnt, err, errlen);
        if (nv == NULL)
            rc = -1;
        else if (piece_fill(nv, pieces, n) != cnt)
            rc = errf(err, errlen,
                      "variable \"%s\": the old servers' files lack some of the %" PRIu64
                      " elements from %" PRIu64 " this server holds now (a server's "
                      "checkpoints are missing)",
                      v->name, cnt, off);
        else if (placed_add(out, nv) != 0)
            rc = errf(err, errlen, "out of memory");
        if (rc != 0)
            variable_destroy(nv);
        else
            atomic_store(&nv->version, version);
    }
    if (rc != 0) {
        for (size_t j = first; j < out->n; j++)
            variable_destroy(out->v[j]);
        out->n = first;
        return rc;
    }
    if (out->n > first + (parts ? 1 : 0) && agg)
        log_warn("variable \"%s\": its BSP aggregate of the open clock is not restored onto "
                 "another number of servers: the workers' pushes of that clock are dropped",
                 v->name);
    return 0;
}

/* Places acc's variable pieces as this cluster does: a variable held whole goes to its slot's
 * owner; a part of one cut in parts to its part's slot's owner, the head to every server; one
 * split in ranges as place_split says (converted to parts on another number of servers,
 * `convert`, when it has more than one part's elements: a range checkpoint is only values). */
static int place_vars(server_state *st, ckpt_loaded *all, const slot_map *now, bool convert,
                      char *err, size_t errlen)
{
    uint32_t self = st->task_index, m = st->num_servers;
    placed out = {0};
    variable **pieces = malloc((all->nvars ? all->nvars : 1) * sizeof(*pieces));
    int rc = pieces ? 0 : errf(err, errlen, "out of memory");
    for (size_t i = 0; rc == 0 && i < all->nvars; i++) {
        variable *v = all->vars[i];
        if (v == NULL)
            continue;
        all->vars[i] = NULL;
        if (v->spec->parts) {
            /* Parts are never cut again: a part goes to its slot's owner, as it is; every
             * server keeps the head (once, though every old server's files hold it). */
            size_t dup = out.n;
            for (size_t j = 0; j < out.n && dup == out.n; j++)
                if (out.v[j]->part == v->part && strcmp(out.v[j]->name, v->name) == 0)
                    dup = j;
            bool mine = v->part == VARIABLE_HEAD || slots_part_owner(now, v->name, v->part) == self;
            if (!mine ||
                (dup < out.n && atomic_load(&out.v[dup]->version) >= atomic_load(&v->version))) {
                variable_destroy(v);
            } else if (dup < out.n) { /* a part in two old servers' files: the later state wins */
                variable_destroy(out.v[dup]);
                out.v[dup] = v;
            } else if (placed_add(&out, v) != 0) {
                variable_destroy(v);
                rc = errf(err, errlen, "out of memory");
            }
            continue;
        }
        if (!v->spec->split) {
            if (slots_name_owner(now, v->name) != self) {
                variable_destroy(v);
                continue;
            }
            v->spec->num_servers = m;
            if (placed_add(&out, v) != 0) {
                variable_destroy(v);
                rc = errf(err, errlen, "out of memory");
            }
            continue;
        }
        /* v and the pieces of the same name after it. */
        size_t n = 0;
        pieces[n++] = v;
        for (size_t j = i + 1; j < all->nvars; j++)
            if (all->vars[j] && strcmp(all->vars[j]->name, v->name) == 0) {
                pieces[n++] = all->vars[j];
                all->vars[j] = NULL;
            }
        rc = place_split(st, pieces, n, now, convert, &out, err, errlen);
        for (size_t j = 0; j < n; j++)
            variable_destroy(pieces[j]);
    }
    free(pieces);
    for (size_t i = 0; i < all->nvars; i++)
        variable_destroy(all->vars[i]); /* what an error left */
    free(all->vars);
    all->vars = out.v;
    all->nvars = out.n;
    all->cap = out.cap;
    if (rc != 0) {
        for (size_t i = 0; i < out.n; i++)
            variable_destroy(out.v[i]);
        all->nvars = 0;
    }
    return rc;
}

static void resized_free(resized *acc)
{
    ckpt_loaded_free(&acc->all);
    for (size_t i = 0; i < acc->nfloors; i++)
        free(acc->floors[i].w);
    free(acc->floors);
    memset(acc, 0, sizeof(*acc));
}

/* Restores this server's slots from the files of a cluster of old_n servers (another size,
 * or files written before slots): every old task's newest valid checkpoint, full file and
 * deltas, its rows and variables filtered to what `now` gives this server, merged. */
static int restore_resized(server_state *st, const checkpoint_config *cfg, uint32_t old_n,
                           const slot_map *now, checkpoint_info *info, char *err, size_t errlen)
{
    uint32_t self = st->task_index;
    if (cfg->replicas > 1 || st->replicated) {
        errf(err, errlen,
             "%s holds checkpoints of a cluster of %u ps tasks%s, this one has %u and "
             "replicas %u: a restore onto another number of servers needs replicas 1 "
             "(start this cluster with replicas 1 once to restore and checkpoint them, or "
             "start %u ps tasks)",
             cfg->dir, old_n, old_n == st->num_servers ? " written before slots" : "",
             st->num_servers, cfg->replicas, old_n);
        return CKPT_REFUSED;
    }
    resized acc = {0};
    acc.all.frontier = SYNC_NO_FRONTIER;
    uint32_t tasks = 0;
    bool sketches = false;
    int rc = CKPT_RESTORED;
    /* This server's own old task last: its clients' windows win (merge_task). A server that
     * joined (an index past the old tasks) reads its own files too: the slots moved to it. */
    uint32_t ntasks = self < old_n ? old_n : old_n + 1;
    for (uint32_t k = 0; k < ntasks && rc == CKPT_RESTORED; k++) {
        uint32_t t = self < old_n ? (self + 1 + k) % old_n : k < old_n ? k : self;
        ckpt_file *files = NULL;
        long n = ckpt_dir_list(cfg->dir, t, false, &files, err, errlen);
        if (n < 0) {
            rc = CKPT_FAILED;
            break;
        }
        ckpt_file *mine = malloc((n ? (size_t)n : 1) * sizeof(*mine));
        if (mine == NULL) {
            free(files);
            rc = errf(err, errlen, "out of memory listing checkpoints");
            break;
        }
        long k2 = files_of_shape(cfg->dir, files, n, now, false, 0, old_n, mine);
        free(files);
        if (k2 == 0) {
            free(mine);
            log_warn("no checkpoint of ps %u of the cluster of %u in %s: the slots it held start "
                     "empty",
                     t, old_n, cfg->dir);
            continue;
        }
        ckpt_source src = {.num_servers = old_n, .task = t, .keep = now, .self = self};
        ckpt_loaded l;
        checkpoint_info ti = {0};
        rc = load_newest(st, cfg, &src, mine, k2, &l, &ti, err, errlen);
        free(mine);
        if (rc != CKPT_RESTORED)
            break;
        log_info("ps %u restores its slots of %s (checkpoint %" PRIu64 ", full %" PRIu64
                 " + %u deltas, made by ps %u of %u)",
                 self, ti.path, ti.seq, ti.base, ti.deltas, t, old_n);
        if (t == self || info->seq == 0) {
            memcpy(info->path, ti.path, sizeof(info->path));
            info->seq = ti.seq;
            info->base = ti.base;
        }
        info->deltas += ti.deltas;
        if (ti.skipped)
            info->skipped = ti.skipped;
        sketches = sketches || l.nsketches > 0;
        char why[1024];
        if (merge_task(st, &acc, &l, why, sizeof(why)) != 0) {
            rc = errf(err, errlen, "restoring %s: %s", ti.path, why);
            ckpt_loaded_free(&l);
            break;
        }
        ckpt_loaded_free(&l);
        tasks++;
    }
    if (rc == CKPT_RESTORED && tasks == 0)
        rc = CKPT_NONE;
    char why[1024];
    if (rc == CKPT_RESTORED &&
        place_vars(st, &acc.all, now, old_n != st->num_servers, why, sizeof(why)) != 0)
        rc = errf(err, errlen, "restoring from the checkpoints of %u ps tasks: %s", old_n, why);
    if (rc == CKPT_RESTORED) {
        if (sketches)
            log_warn("tables' admission sketches are not restored onto another number of "
                     "servers: ids not yet admitted count their pushes from zero again");
        for (size_t k = 0; k < acc.all.nvars; k++)
            info->versions += atomic_load(&acc.all.vars[k]->version);
        for (size_t k = 0; k < acc.all.ntables; k++) {
            table_stats ts;
            table_stats_get(acc.all.tables[k].t, &ts);
            info->table_rows += ts.rows;
        }
        info->variables = (uint32_t)acc.all.nvars;
        info->bytes = acc.all.bytes;
        info->from_servers = old_n;
        if (apply_loaded(st, &acc.all, why, sizeof(why)) != 0)
            rc = errf(err, errlen, "restoring from the checkpoints of %u ps tasks: %s", old_n, why);
        for (size_t i = 0; rc == CKPT_RESTORED && i < acc.nfloors; i++) {
            int fr = dedup_import_floors(st->dedup, acc.floors[i].w, acc.floors[i].n);
            if (fr != 0)
                rc = errf(err, errlen, "%s",
                          fr == -2 ? "out of memory restoring the dedup tombstones"
                                   : "malformed dedup tombstone record");
        }
    }
    resized_free(&acc);
    return rc;
}

bool checkpoint_file_foreign(const char *path, void *map)
{
    ckpt_shape sh;
    char why[256];
    return ckpt_peek_shape(path, &sh, why, sizeof(why)) == 0 &&
           !shape_current(&sh, (const slot_map *)map);
}

/* The newest file of any task in dir placed otherwise than `now` (by the creation time in
 * its header): its cluster size in *old_n and its time in *when; false (both 0) when none. */
static bool newest_foreign(const char *dir, const slot_map *now, uint32_t *old_n, uint64_t *when)
{
    *old_n = 0;
    *when = 0;
    ckpt_file *files;
    char why[512];
    long n = ckpt_dir_list(dir, CKPT_ALL_TASKS, false, &files, why, sizeof(why));
    for (long i = 0; i < n; i++) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, files[i].name);
        ckpt_shape sh;
        if (ckpt_peek_shape(path, &sh, why, sizeof(why)) == 0 && !shape_current(&sh, now) &&
            (*old_n == 0 || sh.created_ns > *when)) {
            *old_n = sh.num_servers;
            *when = sh.created_ns;
        }
    }
    if (n >= 0)
        free(files);
    return *old_n != 0;
}

int checkpoint_restore(server_state *st, const checkpoint_config *cfg, checkpoint_info *info,
                       uint64_t *max_seq, char *err, size_t errlen)
{
    memset(info, 0, sizeof(*info));
    *max_seq = 0;
    struct stat sb;
    if (stat(cfg->dir, &sb) != 0 && errno == ENOENT)
        return CKPT_NONE;
    ckpt_file *files;
    long n = ckpt_dir_list(cfg->dir, st->task_index, true, &files, err, errlen);
    if (n < 0)
        return CKPT_FAILED;
    if (n > 0)
        *max_seq = files[0].seq;
    slot_map now = server_slots(st);
    ckpt_file *cur = malloc((n ? (size_t)n : 1) * sizeof(*cur));
    if (cur == NULL) {
        free(files);
        errf(err, errlen, "out of memory listing checkpoints");
        return CKPT_FAILED;
    }
    /* The directory's files of other placements (another cluster size, or written before
     * slots): this task's own files restore only when made after the newest of them (a task's
     * files of an earlier cluster of this size are older than the cluster between). */
    uint32_t old_n;
    uint64_t when;
    bool foreign = newest_foreign(cfg->dir, &now, &old_n, &when);
    long ncur = files_of_shape(cfg->dir, files, n, &now, true, when, 0, cur);
    free(files);
    uint64_t t0 = time_now_ns();
    int rc;
    if (ncur == 0) {
        free(cur);
        if (!foreign)
            return CKPT_NONE;
        rc = restore_resized(st, cfg, old_n, &now, info, err, errlen);
        info->ms = (time_now_ns() - t0) / 1000000u;
        return rc;
    }
    ckpt_source src = {
        .num_servers = st->num_servers, .task = st->task_index, .self = st->task_index};
    ckpt_loaded l;
    rc = load_newest(st, cfg, &src, cur, ncur, &l, info, err, errlen);
    free(cur);
    if (rc != CKPT_RESTORED)
        return rc;
    for (size_t k = 0; k < l.nvars; k++)
        info->versions += atomic_load(&l.vars[k]->version);
    for (size_t k = 0; k < l.ntables; k++) {
        table_stats ts;
        table_stats_get(l.tables[k].t, &ts);
        info->table_rows += ts.rows;
    }
    char why[1024];
    if (apply_loaded(st, &l, why, sizeof(why)) != 0) {
        ckpt_loaded_free(&l);
        errf(err, errlen, "restoring %s: %s", info->path, why);
        return CKPT_FAILED;
    }
    info->variables = (uint32_t)l.nvars;
    info->ms = (time_now_ns() - t0) / 1000000u;
    info->has_position = l.has_pos;
    info->epoch = l.pos_epoch;
    info->lsn = l.pos_lsn;
    ckpt_loaded_free(&l);
    return CKPT_RESTORED;
}
