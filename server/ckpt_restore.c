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
#include "table.h"
#include "timeutil.h"
#include "util.h"

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
static int apply_table_delta(table *t, const ckpt_table_delta *d, char *err, size_t errlen)
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
static int apply_delta(ckpt_loaded *l, ckpt_loaded *d, char *err, size_t errlen)
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
        if (b < 0 || apply_table_delta(l->tables[b].t, &d->tdeltas[i], err, errlen) != 0)
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
    if (n == 0) {
        free(files);
        return CKPT_NONE;
    }
    *max_seq = files[0].seq;
    int rc = CKPT_FAILED;
    size_t off = 0;
    off += (size_t)snprintf(err, errlen, "no valid checkpoint of ps %u in %s:", st->task_index,
                            cfg->dir);
    /* bad[i]: files[i] can't be restored, nor any delta built on it. */
    bool *bad = calloc((size_t)n, sizeof(*bad));
    long *chain = calloc((size_t)n, sizeof(*chain));
    if (bad == NULL || chain == NULL) {
        free(bad);
        free(chain);
        free(files);
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
        uint64_t t0 = time_now_ns();
        long full = chain[len - 1];
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[full].name);
        ckpt_loaded l;
        uint64_t seq = 0;
        int r = ckpt_file_read(path, st, cfg->cluster_hash, files[full].seq, &l, &seq, why,
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
        for (long k = len - 2; k >= 0 && rc == CKPT_FAILED; k--) {
            char dpath[4200];
            snprintf(dpath, sizeof(dpath), "%s/%s", cfg->dir, files[chain[k]].name);
            ckpt_loaded d;
            uint64_t dseq = 0;
            int dr = ckpt_file_read(dpath, st, cfg->cluster_hash, files[chain[k]].seq, &d, &dseq,
                                    why, sizeof(why));
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
            int ar = apply_delta(&l, &d, why, sizeof(why));
            ckpt_loaded_free(&d);
            if (ar != 0) {
                errf(err, errlen, "restoring %s over checkpoint %" PRIu64 ": %s", dpath,
                     files[good].seq, why);
                rc = CKPT_FAILED;
                ckpt_loaded_free(&l);
                goto done;
            }
            good = chain[k];
            deltas++;
        }
        uint64_t versions = 0;
        for (size_t k = 0; k < l.nvars; k++)
            versions += atomic_load(&l.vars[k]->version);
        for (size_t k = 0; k < l.ntables; k++) {
            table_stats ts;
            table_stats_get(l.tables[k].t, &ts);
            info->table_rows += ts.rows;
        }
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[good].name);
        if (apply_loaded(st, &l, why, sizeof(why)) != 0) {
            ckpt_loaded_free(&l);
            errf(err, errlen, "restoring %s: %s", path, why);
            rc = CKPT_FAILED;
            break;
        }
        snprintf(info->path, sizeof(info->path), "%s", path);
        info->seq = files[good].seq;
        info->base = files[full].seq;
        info->deltas = deltas;
        info->versions = versions;
        info->bytes = l.bytes;
        info->variables = (uint32_t)l.nvars;
        info->ms = (time_now_ns() - t0) / 1000000u;
        info->has_position = l.has_pos;
        info->epoch = l.pos_epoch;
        info->lsn = l.pos_lsn;
        ckpt_loaded_free(&l);
        rc = CKPT_RESTORED;
    }
done:
    free(bad);
    free(chain);
    free(files);
    return rc;
}
