/* What a server reports about its sparse tables: ServerStatus's entries, the count of tables
 * and the tables' metrics. BSP aggregates are part of their tables, not tables of their own. */
#include "table_status.h"

#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "server.h"

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
    table_entry **es = registry_list(st, &ne);
    if (ne == 0)
        return 0;
    Psd__V1__TableStatus **ts = es ? calloc(ne, sizeof(*ts)) : NULL;
    if (ts == NULL) {
        registry_release(es, ne);
        return -1;
    }
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; i < ne; i++) {
        if ((only && only[0] && strcmp(only, table_name(es[i]->t)) != 0) ||
            registry_is_bsp_name(table_name(es[i]->t)))
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
        x->rows_disk = s.rows_disk;
        x->promotions = s.promotions;
        x->cold_hits = s.cold_hits;
        x->demotions = s.demotions;
        ts[k++] = x;
    }
    registry_release(es, ne);
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

/* ---- metrics ---- */

void server_tables_metrics(metrics_out *out, server_state *st)
{
    size_t n;
    table_entry **es = registry_list(st, &n);
    /* BSP aggregates are part of their tables, not tables of their own. */
    size_t kept = 0;
    for (size_t i = 0; es && i < n; i++) {
        if (registry_is_bsp_name(table_name(es[i]->t)))
            registry_put(es[i]);
        else
            es[kept++] = es[i];
    }
    if (es)
        n = kept;
    metrics_emit_one(out, "psd_server_tables", METRIC_GAUGE, "Sparse tables held.", (double)n);
    table_stats *ts = es ? calloc(n, sizeof(*ts)) : NULL;
    if (ts == NULL) {
        registry_release(es, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        table_stats_get(es[i]->t, &ts[i]);
    static const struct {
        const char *name, *help;
        metric_type type;
    } tm[] = {
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
        {"psd_table_cold_hits_total",
         "Ids pulled or pushed whose row was on disk (a table with ram_rows).", METRIC_COUNTER},
        {"psd_table_promotions_total", "Rows of a sparse table moved from disk into RAM.",
         METRIC_COUNTER},
        {"psd_table_demotions_total", "Rows of a sparse table moved from RAM to disk.",
         METRIC_COUNTER},
        {"psd_table_cold_errors_total",
         "Reads and writes of a sparse table's disk store that failed.", METRIC_COUNTER},
    };
    /* Rows and bytes per tier: "ram", and "disk" (the cold tier of a table with ram_rows). */
    metrics_emit_header(out, "psd_table_rows", METRIC_GAUGE,
                        "Rows of a sparse table this server holds, by tier (ram, disk).");
    for (size_t i = 0; i < n; i++) {
        const char *ram[] = {"table", table_name(es[i]->t), "tier", "ram", NULL};
        const char *disk[] = {"table", table_name(es[i]->t), "tier", "disk", NULL};
        metrics_emit(out, "psd_table_rows", ram, (double)(ts[i].rows - ts[i].rows_disk));
        metrics_emit(out, "psd_table_rows", disk, (double)ts[i].rows_disk);
    }
    metrics_emit_header(out, "psd_table_bytes", METRIC_GAUGE,
                        "Bytes of a sparse table, by tier (ram: as psd_table_memory_bytes; disk: "
                        "its store's files, an estimate).");
    for (size_t i = 0; i < n; i++) {
        const char *ram[] = {"table", table_name(es[i]->t), "tier", "ram", NULL};
        const char *disk[] = {"table", table_name(es[i]->t), "tier", "disk", NULL};
        metrics_emit(out, "psd_table_bytes", ram, (double)ts[i].bytes);
        metrics_emit(out, "psd_table_bytes", disk, (double)ts[i].bytes_disk);
    }
    for (size_t k = 0; k < sizeof(tm) / sizeof(tm[0]); k++) {
        metrics_emit_header(out, tm[k].name, tm[k].type, tm[k].help);
        for (size_t i = 0; i < n; i++) {
            const char *labels[] = {"table", table_name(es[i]->t), NULL};
            const table_stats *s = &ts[i];
            const uint64_t v[] = {s->bytes,        s->lookups,        s->lookup_misses,
                                  s->rows_created, s->pushes_counted, s->rows_updated,
                                  s->rows_refused, s->cold_hits,      s->promotions,
                                  s->demotions,    s->cold_errors};
            _Static_assert(sizeof(v) / sizeof(v[0]) == sizeof(tm) / sizeof(tm[0]),
                           "a value per metric");
            uint64_t x = v[k];
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
    registry_release(es, n);
}
