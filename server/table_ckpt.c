/* Checkpoints of sparse tables: the cuts of every table a checkpoint copies (prepared before
 * updates are held off, taken while they are, finished after), over the registry; and the rows
 * of a set of slots, copied or removed (a slot move). */
#include "table_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "placement.h"
#include "server.h"
#include "slots.h"

/* Prepares tc's cut of e's table (spec packed, memory allocated). Returns 0 or -1. */
static int copy_prepare(server_table_copy *tc, table_entry *e, uint64_t base)
{
    tc->spec_len = psd__v1__table_spec__get_packed_size(e->spec);
    tc->spec = malloc(tc->spec_len ? tc->spec_len : 1);
    tc->nparts = table_partitions(e->t);
    tc->row_floats = table_row_floats(e->t);
    tc->name = table_name(e->t);
    tc->sketch_len = table_sketch_bytes(e->t);
    if (tc->sketch_len && (tc->sketch = malloc(tc->sketch_len)) == NULL)
        return -1;
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
    table_entry **es = registry_list(st, &nt);
    if (nt == 0)
        return 0;
    server_table_copy *c = es ? calloc(nt, sizeof(*c)) : NULL;
    if (c == NULL) {
        registry_release(es, nt);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nt; i++)
        rc = copy_prepare(&c[i], es[i], base);
    *out = c;
    *n = nt;
    registry_release(es, nt);
    return rc;
}

int server_tables_copy(server_state *st, uint64_t base, uint64_t id, bool track,
                       const char *cold_at, const char *cold_rel, server_table_copy **out,
                       size_t *n)
{
    server_table_copy *pre = *out;
    size_t npre = *n;
    *out = NULL;
    *n = 0;
    size_t nt;
    table_entry **es = registry_list(st, &nt);
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
        char dir[4200];
        if (cold_at != NULL) {
            snprintf(dir, sizeof(dir), "%s/%zu", cold_at, i);
            table_cut_link(c[i].cut, dir);
        }
        table_cut_start(c[i].cut, id, track);
        c[i].delta = table_cut_is_delta(c[i].cut);
        const char *why = NULL;
        if (cold_at != NULL && table_cut_linked(c[i].cut, &why) != NULL) {
            snprintf(dir, sizeof(dir), "%s/%zu", cold_rel, i);
            if ((c[i].cold_dir = strdup(dir)) == NULL)
                rc = -1;
        } else if (why != NULL) {
            log_warn("table \"%s\": checkpoint writes its rows on disk one by one: %s",
                     table_name(es[i]->t), why);
        }
        if (c[i].sketch)
            table_sketch_save(es[i]->t, c[i].sketch); /* with the rows of the cut */
    }
    server_tables_copy_free(pre, npre); /* tables deleted since the prepare, if any */
    registry_release(es, nt);
    *out = c;
    *n = c ? nt : 0;
    return rc;
}

int server_tables_copy_finish(server_table_copy *c, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        server_table_copy *tc = &c[i];
        /* Rows on disk stay in the cut's snapshots: the writer reads them a partition at a
         * time (table_cut_cold_rows). */
        if (tc->cut == NULL || table_cut_finish_ram(tc->cut) != 0) {
            rc = -1;
            continue;
        }
        tc->parts = table_cut_rows(tc->cut, 0);
        tc->rows = tc->removed = 0;
        for (uint32_t p = 0; p < tc->nparts; p++) {
            tc->rows += tc->parts[p].n + table_cut_cold_count(tc->cut, p);
            tc->removed += tc->parts[p].nremoved;
        }
    }
    return rc;
}

void server_tables_copy_free(server_table_copy *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++) {
        free(c[i].spec);
        free(c[i].sketch);
        free(c[i].cold_dir);
        table_cut_free(c[i].cut);
    }
    free(c);
}

/* ---- the rows of a set of slots (a slot move, server/slot_move.c) ---- */

typedef struct slot_set {
    const uint64_t *bits;
    uint32_t nslots;
    uint64_t name_hash; /* placement_hash of the table's name */
} slot_set;

static bool slot_marked(void *arg, int64_t id)
{
    const slot_set *ss = arg;
    uint32_t s = slots_of_hash(placement_table_hash_of(ss->name_hash, id), ss->nslots);
    return (ss->bits[s / 64] >> (s % 64)) & 1;
}

int server_table_slot_rows(table *t, const uint64_t *slots, uint32_t nslots, table_rows *out)
{
    memset(out, 0, sizeof(*out));
    uint32_t rf = table_row_floats(t), np = table_partitions(t);
    out->row_floats = rf;
    out->full = true;
    slot_set ss = {.bits = slots, .nslots = nslots, .name_hash = placement_hash(table_name(t))};
    /* Each partition's rows of the slots (their ids alone read for the others), then joined. */
    table_rows *parts = calloc(np ? np : 1, sizeof(*parts));
    int rc = parts ? 0 : -1;
    size_t total = 0;
    for (uint32_t p = 0; rc == 0 && p < np; p++) {
        rc = table_copy_partition_if(t, p, slot_marked, &ss, &parts[p]);
        total += parts[p].n;
    }
    if (rc == 0 && total > 0) {
        out->ids = malloc(total * sizeof(*out->ids));
        out->updated_ms = malloc(total * sizeof(*out->updated_ms));
        out->floats = malloc(total * rf * sizeof(float));
        rc = out->ids && out->updated_ms && out->floats ? 0 : -1;
    }
    for (uint32_t p = 0; rc == 0 && p < np; p++) {
        size_t k = parts[p].n;
        if (k == 0)
            continue;
        memcpy(out->ids + out->n, parts[p].ids, k * sizeof(*out->ids));
        memcpy(out->updated_ms + out->n, parts[p].updated_ms, k * sizeof(*out->updated_ms));
        memcpy(out->floats + out->n * rf, parts[p].floats, k * rf * sizeof(float));
        out->n += k;
    }
    for (uint32_t p = 0; parts && p < np; p++)
        table_rows_free(&parts[p]);
    free(parts);
    if (rc != 0) {
        table_rows_free(out);
        memset(out, 0, sizeof(*out));
        out->row_floats = rf;
        return -1;
    }
    return 0;
}

size_t server_table_drop_slots(table *t, const uint64_t *slots, uint32_t nslots)
{
    table_rows rows;
    if (server_table_slot_rows(t, slots, nslots, &rows) != 0) {
        /* Out of memory for the copy: remove partition by partition instead. */
        slot_set ss = {.bits = slots, .nslots = nslots, .name_hash = placement_hash(table_name(t))};
        size_t gone = 0;
        for (uint32_t p = 0; p < table_partitions(t); p++) {
            table_rows part;
            if (table_copy_partition_if(t, p, slot_marked, &ss, &part) != 0)
                continue;
            gone += table_remove(t, part.ids, part.n);
            table_rows_free(&part);
        }
        return gone;
    }
    size_t gone = table_remove(t, rows.ids, rows.n);
    table_rows_free(&rows);
    return gone;
}
