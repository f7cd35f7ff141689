/* The server's own methods: Clock (a worker's clock, its leave, a replicated group's logged
 * evictions), ServerStatus, Checkpoint and Shutdown. */
#include "admin_rpc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "server.h"
#include "status.h"
#include "table_status.h"
#include "timeutil.h"
#include "util.h"
#include "var_rpc.h"

/* ServerStatus lists at most this many variables unless the request asks for fewer. */
#define STATUS_DEFAULT_VARIABLES 1000

void handle_clock(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const envelope *env = rpc_call_envelope(call);
    if (env->worker_id < 0 || env->worker_id >= SERVER_MAX_WORKERS) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "clock needs a worker id in [0, %d), got %d",
                        SERVER_MAX_WORKERS, (int)env->worker_id);
        return;
    }
    const Psd__V1__ClockRequest *req = (const void *)rpc_call_body(call);
    Psd__V1__ClockReply rep = PSD__V1__CLOCK_REPLY__INIT;
    int64_t min;
    if (req != NULL && req->evict) {
        if (!rpc_call_trusted(call)) {
            rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                            "clock: evict is internal to replication (a replicated group's "
                            "primary logs its evictions); it is not a client's request");
            return;
        }
        sync_evict(st, env->worker_id);
        min = sync_min_clock(st);
        rep.clock = env->clock;
    } else if (req != NULL && req->finished) {
        sync_leave(st, env->worker_id, env->client_id, env->clock);
        min = sync_min_clock(st);
        rep.clock = env->clock;
    } else {
        rep.clock = sync_clock(st, env->worker_id, env->client_id, env->clock, &min);
    }
    rep.min_clock = min == INT64_MAX ? rep.clock : min;
    char parked[768];
    sync_parked_for(st, env->worker_id, parked, sizeof(parked));
    rep.parked_for = parked;
    rpc_reply_ok(call, &rep.base);
}

/* Counters, the workers and per-variable entries: only the variable asked for by name (of one
 * cut in parts, its head and the parts this server holds), or at
 * most max_variables (default STATUS_DEFAULT_VARIABLES) in name order and never more than fit
 * in a reply body (rpc_call_max_reply_body); num_variables always counts them all. */
void handle_server_status(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__ServerStatusRequest *req = (const void *)rpc_call_body(call);
    const rpc_stats *rs = rpc_server_stats(st->rpc);
    Psd__V1__ServerStatusReply rep = PSD__V1__SERVER_STATUS_REPLY__INIT;
    rep.task_index = st->task_index;
    rep.num_servers = st->num_servers;
    rep.uptime_ms = (time_now_ns() - st->start_ns) / 1000000u;
    rep.requests = atomic_load(&rs->requests);
    rep.errors = atomic_load(&rs->errors);
    rep.bytes_in = atomic_load(&rs->bytes_in);
    rep.bytes_out = atomic_load(&rs->bytes_out);
    rep.updates_applied = atomic_load(&st->updates_applied);
    rep.duplicates_dropped = atomic_load(&st->duplicates_dropped);
    rep.bytes_held = store_bytes(st->vars) + atomic_load(&st->table_bytes);
    rep.version = PSD_VERSION;
    size_t n;
    variable **vars = var_sorted_vars(st, &n);
    rep.num_variables = n;
    size_t want = req->max_variables ? req->max_variables : STATUS_DEFAULT_VARIABLES;
    if (req->variable && req->variable[0]) {
        variable *one = store_find(st->vars, req->variable);
        store_list_release(vars, n);
        vars = NULL;
        n = 0;
        if (one && variable_is_head(one)) {
            /* A variable cut in parts: an entry for each part held (after the head), whose
             * pulls' staleness the caller sums as over a split variable's servers. */
            variable_release(one);
            vars = var_parts_of(st, req->variable, &n);
        } else if ((vars = malloc(sizeof(*vars))) != NULL && one) {
            vars[n++] = one;
        } else {
            variable_release(one);
        }
        want = n;
    }
    size_t cap = n < want ? n : want;
    Psd__V1__VariableStatus *vs = calloc(cap ? cap : 1, sizeof(*vs));
    Psd__V1__VariableStatus **vsp = calloc(cap ? cap : 1, sizeof(*vsp));
    Psd__V1__StalenessStats *obs = calloc(cap ? cap : 1, sizeof(*obs));
    uint64_t *hist = calloc((cap ? cap : 1) * STALENESS_BUCKETS, sizeof(uint64_t));
    if (vars == NULL || vs == NULL || vsp == NULL || obs == NULL || hist == NULL) {
        store_list_release(vars, n);
        free(vs);
        free(vsp);
        free(obs);
        free(hist);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory building status");
        return;
    }
    /* The counters, the checkpoints and the workers first: the variables get what is left of
     * the body. */
    Psd__V1__CheckpointStatus cks = PSD__V1__CHECKPOINT_STATUS__INIT;
    checkpoint_health ch;
    checkpointer *ck = checkpointer_of(st);
    if (ck) {
        checkpointer_health(ck, &ch);
        cks.last_seq = ch.last_seq;
        cks.age_ms = (uint64_t)(ch.age_s * 1000.0);
        cks.failures = ch.failures;
        cks.failures_in_row = ch.failures_row;
        cks.last_error = ch.last_error;
        rep.checkpoint = &cks;
    }
    sync_status(st, &rep);
    size_t max = rpc_call_max_reply_body(call);
    size_t fixed = psd__v1__server_status_reply__get_packed_size(&rep) + REPLY_RESERVE;
    size_t budget = max > 2 * fixed ? max - fixed : max / 4;
    size_t used = 0, k = 0;
    for (size_t i = 0; i < cap; i++) {
        psd__v1__variable_status__init(&vs[k]);
        vs[k].name = vars[i]->name;
        vs[k].offset = vars[i]->offset;
        vs[k].count = vars[i]->count;
        vs[k].version = atomic_load(&vars[i]->version);
        vs[k].staleness = vars[i]->staleness;
        sync_variable_stats(vars[i], &obs[k], hist + k * STALENESS_BUCKETS);
        vs[k].observed = &obs[k];
        size_t b = reply_entry_bytes(psd__v1__variable_status__get_packed_size(&vs[k]));
        if (k > 0 && used + b > budget)
            break;
        used += b;
        vsp[k] = &vs[k];
        k++;
    }
    rep.n_variables = k;
    rep.variables = vsp;
    rep.variables_truncated = k < n;
    /* The tables after the variables, in what is left of the body. */
    Psd__V1__TableStatus **ts = NULL;
    size_t nts = 0;
    rep.num_tables = server_tables_count(st);
    if (server_tables_status(st, req->variable, &ts, &nts) == 0) {
        size_t kt = 0;
        for (; kt < nts; kt++) {
            size_t b = reply_entry_bytes(psd__v1__table_status__get_packed_size(ts[kt]));
            if (used + b > budget)
                break;
            used += b;
        }
        rep.tables = ts;
        rep.n_tables = kt;
    }
    rpc_reply_ok(call, &rep.base);
    server_tables_status_free(ts, nts);
    sync_status_free(&rep);
    free(obs);
    free(hist);
    free(vsp);
    free(vs);
    store_list_release(vars, n);
}

void handle_checkpoint(rpc_call *call, void *arg)
{
    server_state *st = arg;
    checkpointer *ck = checkpointer_of(st);
    if (ck == NULL) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "checkpoints are off: set checkpoint-dir");
        return;
    }
    checkpointer_request(ck, call); /* answered once the file is durable */
}
void handle_shutdown(rpc_call *call, void *arg)
{
    server_state *st = arg;
    Psd__V1__ShutdownReply rep = PSD__V1__SHUTDOWN_REPLY__INIT;
    rpc_reply_ok(call, &rep.base);
    atomic_store(&st->shutdown_requested, true);
}
