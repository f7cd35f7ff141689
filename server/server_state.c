/* A server state's limits and its teardown (server.h). */
#include "server.h"

#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "table_registry.h"

/* Contents (variables, tables, ...) held by this process: one budget each. */
static atomic_uint_fast64_t contents_held;

uint64_t server_states_held(void)
{
    return atomic_load(&contents_held);
}

int server_set_limits(server_state *st, uint64_t max_bytes, uint32_t replicas, uint64_t max_vars,
                      uint64_t dedup_max_clients, uint64_t dedup_idle_ms)
{
    if (max_bytes == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            max_bytes = (uint64_t)pages / 4 * 3 * (uint64_t)page;
    }
    if (st->budget == NULL) {
        if ((st->budget = calloc(1, sizeof(*st->budget))) == NULL)
            return -1;
        atomic_fetch_add(&contents_held, 1);
    }
    uint64_t share = replicas > 1 ? max_bytes / replicas : max_bytes;
    budget_set_max(st->budget, share);
    st->budget->tables_logical = replicas > 1;
    store_set_limits(st->vars, st->budget, max_vars);
    if (replicas > 1)
        log_info("limits: max-server-bytes %llu (%llu for each of the %u replica groups' copies "
                 "this server holds), max-variables %llu, dedup-max-clients %llu, "
                 "dedup-idle-ms %llu",
                 (unsigned long long)max_bytes, (unsigned long long)share, replicas,
                 (unsigned long long)max_vars, (unsigned long long)dedup_max_clients,
                 (unsigned long long)dedup_idle_ms);
    else
        log_info("limits: max-server-bytes %llu, max-variables %llu, dedup-max-clients %llu, "
                 "dedup-idle-ms %llu",
                 (unsigned long long)max_bytes, (unsigned long long)max_vars,
                 (unsigned long long)dedup_max_clients, (unsigned long long)dedup_idle_ms);
    return dedup_set_limits(st->dedup, dedup_max_clients, dedup_idle_ms);
}

void server_state_clear(server_state *st)
{
    server_tables_free(st);
    store_destroy(st->vars);
    dedup_destroy(st->dedup);
    sync_destroy(st->sync);
    if (st->budget) {
        free(st->budget); /* after what counted against it */
        atomic_fetch_sub(&contents_held, 1);
    }
    st->vars = NULL;
    st->dedup = NULL;
    st->sync = NULL;
    st->budget = NULL;
}

void server_state_free(server_state *st)
{
    if (st == NULL)
        return;
    server_state_clear(st);
    free(st);
}
