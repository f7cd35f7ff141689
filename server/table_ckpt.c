/* Checkpoints of sparse tables: the cuts of every table a checkpoint copies (prepared before
 * updates are held off, taken while they are, finished after), over the registry. */
#include "table_ckpt.h"

#include <stdlib.h>
#include <string.h>

#include "server.h"

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
                       server_table_copy **out, size_t *n)
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
        table_cut_start(c[i].cut, id, track);
        c[i].delta = table_cut_is_delta(c[i].cut);
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
        table_cut_free(c[i].cut);
    }
    free(c);
}
