/* The process's replication state (repl) and the states made for the copies of the groups
 * this server backs up (repl_state_make). */
#include "repl_group.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "sync.h"
#include "timeutil.h"

struct repl_node repl = {.vlock = PTHREAD_MUTEX_INITIALIZER};
_Thread_local repl_applying_t repl_applying;

server_state *repl_state_make(uint32_t g, char *err, size_t errlen)
{
    const replica_config *c = &repl.cfg;
    server_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        goto oom;
    st->task_index = g;
    st->num_servers = c->num_servers;
    st->replicated = true;
    st->start_ns = time_now_ns();
    st->vars = store_create();
    st->dedup = dedup_create(c->dedup_window);
    st->default_staleness = c->default_staleness;
    st->sync = sync_create(c->n_workers, c->worker_timeout_ms, c->bsp_mean, SERVER_MAX_WORKERS);
    st->rpc = repl.groups[c->self]->st->rpc;
    if (st->vars && st->dedup && st->sync &&
        server_set_limits(st, c->max_bytes, c->replicas, c->max_vars, c->dedup_max_clients,
                          c->dedup_idle_ms) == 0)
        return st;
    server_state_free(st);
oom:
    snprintf(err, errlen, "out of memory making the copy of group %u", g);
    return NULL;
}
