/* The BSP aggregate of a sparse table of staleness 0: a hidden table named the table's name
 * and "#bsp" (BSP_SUFFIX) in the registry, where a clock's pushes are summed until every live
 * worker passed it (table_bsp.c says how). */
#ifndef PSD_SERVER_TABLE_BSP_H
#define PSD_SERVER_TABLE_BSP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "table_registry.h"

/* BSP push of n gradient rows (float32, any alignment) into e's aggregate (made on first use),
 * with the caller's update lock held. Returns a TABLE_* code with a message in err. */
int table_bsp_add(server_state *st, table_entry *e, const int64_t *ids, size_t n,
                  const float *grads, int64_t now, char *err, size_t errlen);
/* BSP tables (staleness 0): applies each one's aggregate of the clock that every live worker
 * has passed, as one push of the summed rows (divided per row by the number of pushes that
 * touched it when mean). The sync module's barrier hook (sync_set_barrier_fn): called when the
 * slowest live worker's clock moves forward, before the pulls it allows are answered. */
void server_tables_bsp_apply(server_state *st, bool mean);

#endif
