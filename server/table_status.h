/* What a server reports about its sparse tables: ServerStatus's entries and the tables' metrics
 * (BSP aggregates left out: they are part of their tables). */
#ifndef PSD_SERVER_TABLE_STATUS_H
#define PSD_SERVER_TABLE_STATUS_H

#include <stddef.h>

#include "table_registry.h"

/* ServerStatus: this server's part of every table (only the one named `only` when it is
 * non-empty), in name order, in *out (free with server_tables_status_free). Returns 0, or -1
 * when memory runs out (*out NULL). */
int server_tables_status(server_state *st, const char *only, Psd__V1__TableStatus ***out,
                         size_t *n);
void server_tables_status_free(Psd__V1__TableStatus **ts, size_t n);
struct metrics_out;
/* Emits the tables' metrics (psd_server_tables, psd_table_*{table}) in a metrics collector. */
void server_tables_metrics(struct metrics_out *out, server_state *st);

#endif
