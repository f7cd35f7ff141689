/* The BSP aggregate of a sparse table of staleness 0 (docs/design.md "Staleness of tables"):
 * a hidden table of its own in the registry, named the table's name and BSP_SUFFIX ("#bsp"), of
 * dim + 1 floats a row: SGD with learning rate 1 from zeros (w -= g), pushed the negated
 * gradients and -1 in the last column for each push that touches the row, so that it holds
 * their sum and the count of those pushes. It is made on a table's first BSP push, applied to
 * the table when every live worker passed the clock (the sync module's barrier hook), never
 * evicted, checkpointed with the table, and left out of ServerStatus and the metrics. */
#include "table_bsp.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "table_index.h"
#include "timeutil.h"

/* The aggregate of BSP table e (made on first use, under the caller's update lock, so that a
 * checkpoint has it whole or not), referenced; NULL with a message when it can't be made. */
static table_entry *bsp_aggregate(server_state *st, table_entry *e, char *err, size_t errlen)
{
    char name[TABLE_MAX_NAME + 1];
    snprintf(name, sizeof(name), "%s" BSP_SUFFIX, table_name(e->t));
    table_entry *agg = registry_find(st, name);
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
    agg = registry_find(st, name);
    if (agg == NULL)
        snprintf(err, errlen, "table \"%s\": out of memory for its BSP aggregate",
                 table_name(e->t));
    return agg;
}

int table_bsp_add(server_state *st, table_entry *e, const int64_t *ids, size_t n,
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
    registry_put(agg);
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
    table_entry *agg = registry_find(st, name);
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
    registry_put(agg);
}
void server_tables_bsp_apply(server_state *st, bool mean)
{
    size_t n;
    table_entry **es = registry_list(st, &n);
    for (size_t i = 0; es && i < n; i++) {
        if (es[i]->spec->staleness != 0 || registry_is_bsp_name(table_name(es[i]->t)))
            continue;
        /* Held against a checkpoint's copy like an update: it has the aggregate or its rows. */
        store_update_begin(st->vars);
        bsp_apply_one(st, es[i], mean);
        store_update_end(st->vars);
    }
    registry_release(es, n);
}
