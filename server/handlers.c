/* RPC handlers of ps-server. The RPC layer has already checked the frame, the method, the
 * presence of a tensor range/segment, the body's type and the deadline. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "log.h"
#include "placement.h"
#include "server.h"
#include "status.h"
#include "timeutil.h"
#include "util.h"

#define MAX_NUMEL (1ull << 40)
/* ServerStatus lists at most this many variables unless the request asks for fewer. */
#define STATUS_DEFAULT_VARIABLES 1000
/* Room kept in a reply for the envelope and the fields other than a listing. */
#define REPLY_RESERVE 4096

/* name, quoted for a message: escaped, cut after 64 bytes (never raw client bytes). */
#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

static bool name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 255)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '/' || ch == ':' || ch == '-'))
            return false;
    }
    return true;
}

int server_check_spec(const server_state *st, const Psd__V1__VariableSpec *spec, uint64_t *numel,
                      char *err, size_t errlen)
{
    if (spec == NULL) {
        snprintf(err, errlen, "missing variable spec");
        return STATUS_INVALID_ARGUMENT;
    }
    if (!name_ok(spec->name)) {
        char q[96];
        snprintf(err, errlen, "invalid variable name %s: 1 to 255 characters of [A-Za-z0-9_./:-]",
                 QUOTED(q, spec->name));
        return STATUS_INVALID_ARGUMENT;
    }
    if (spec->dtype != PSD__V1__DTYPE__FLOAT32) {
        snprintf(err, errlen, "variable \"%s\": unsupported dtype %d (supported: FLOAT32)",
                 spec->name, (int)spec->dtype);
        return STATUS_INVALID_ARGUMENT;
    }
    if (spec->staleness < -1 || spec->staleness > 1000000) {
        snprintf(err, errlen,
                 "variable \"%s\": staleness %d (use -1 async, 0 BSP, 1..1000000 SSP, -2 the "
                 "server's default)",
                 spec->name, (int)spec->staleness);
        return STATUS_INVALID_ARGUMENT;
    }
    if (spec->n_shape > 8) {
        snprintf(err, errlen, "variable \"%s\": %zu dimensions, at most 8", spec->name,
                 spec->n_shape);
        return STATUS_INVALID_ARGUMENT;
    }
    uint64_t n = 1;
    for (size_t i = 0; i < spec->n_shape; i++) {
        if (spec->shape[i] == 0 || spec->shape[i] > MAX_NUMEL || n > MAX_NUMEL / spec->shape[i]) {
            snprintf(err, errlen,
                     "variable \"%s\": dimension %zu is %llu (each must be >= 1, %llu elements "
                     "at most in all)",
                     spec->name, i, (unsigned long long)spec->shape[i],
                     (unsigned long long)MAX_NUMEL);
            return STATUS_INVALID_ARGUMENT;
        }
        n *= spec->shape[i];
    }
    if (spec->num_servers != st->num_servers) {
        snprintf(err, errlen,
                 "variable \"%s\": placement computed for %u servers but this cluster has %u "
                 "(client and server cluster specs differ)",
                 spec->name, spec->num_servers, st->num_servers);
        return STATUS_FAILED_PRECONDITION;
    }
    if (spec->split) {
        if (!placement_is_split(n, n * 4, 0, st->num_servers)) {
            snprintf(err, errlen, "variable \"%s\": cannot split %llu elements over %u servers",
                     spec->name, (unsigned long long)n, st->num_servers);
            return STATUS_INVALID_ARGUMENT;
        }
    } else {
        uint32_t owner = placement_owner(spec->name, st->num_servers);
        if (owner != st->task_index) {
            snprintf(err, errlen,
                     "variable \"%s\" belongs on ps %u, not ps %u (placement mismatch: client "
                     "and server cluster specs differ)",
                     spec->name, owner, st->task_index);
            return STATUS_FAILED_PRECONDITION;
        }
    }
    *numel = n;
    return STATUS_OK;
}

int server_set_limits(server_state *st, uint64_t max_bytes, uint64_t max_vars,
                      uint64_t dedup_max_clients, uint64_t dedup_idle_ms)
{
    if (max_bytes == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            max_bytes = (uint64_t)pages / 4 * 3 * (uint64_t)page;
    }
    store_set_limits(st->vars, max_bytes, max_vars);
    log_info("limits: max-server-bytes %llu, max-variables %llu, dedup-max-clients %llu, "
             "dedup-idle-ms %llu",
             (unsigned long long)max_bytes, (unsigned long long)max_vars,
             (unsigned long long)dedup_max_clients, (unsigned long long)dedup_idle_ms);
    return dedup_set_limits(st->dedup, dedup_max_clients, dedup_idle_ms);
}

static void fill_shard(const server_state *st, const variable *v, Psd__V1__Shard *sh)
{
    sh->server = st->task_index;
    sh->offset = v->offset;
    sh->count = v->count;
}

static void handle_create(rpc_call *call, void *arg)
{
    server_state *st = arg;
    Psd__V1__CreateVariableRequest *req = (void *)rpc_call_body(call);
    char err[512];
    if (req->spec && req->spec->staleness == -2)
        req->spec->staleness = st->default_staleness;
    uint64_t numel;
    int rc = server_check_spec(st, req->spec, &numel, err, sizeof(err));
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return;
    }
    Psd__V1__CreateVariableReply rep = PSD__V1__CREATE_VARIABLE_REPLY__INIT;
    Psd__V1__Shard shard = PSD__V1__SHARD__INIT;
    rep.shard = &shard;
    variable *v = store_find(st->vars, req->spec->name);
    if (v == NULL) {
        uint64_t off = 0, cnt = numel;
        if (req->spec->split)
            placement_range(numel, st->num_servers, st->task_index, &off, &cnt);
        /* max-server-bytes, max-variables: refused before anything is allocated. */
        int kind = (int)req->spec->optimizer;
        size_t nslots = optimizer_kind_valid(kind) ? optimizer_slot_count((optimizer_kind)kind) : 0;
        uint64_t bytes = store_shard_bytes(cnt, nslots);
        rc = store_reserve(st->vars, bytes, err, sizeof(err));
        if (rc != STATUS_OK) {
            rpc_reply_error(call, rc, "cannot create variable \"%s\": %s", req->spec->name, err);
            return;
        }
        variable *nv = variable_create(req->spec, numel, off, cnt, err, sizeof(err));
        if (nv == NULL) {
            store_unreserve(st->vars, bytes);
            rpc_reply_error(call,
                            strncmp(err, "out of memory", 13) == 0 ? STATUS_RESOURCE_EXHAUSTED
                                                                   : STATUS_INVALID_ARGUMENT,
                            "%s", err);
            return;
        }
        v = store_insert(st->vars, nv);
        store_unreserve(st->vars, bytes);
        if (v != nv)
            variable_destroy(nv); /* another client created it meanwhile */
        else
            rep.created = true;
    }
    char detail[128];
    const char *diff = spec_diff(v->spec, req->spec, detail, sizeof(detail));
    if (diff) {
        rpc_reply_error(call, STATUS_ALREADY_EXISTS,
                        "variable \"%s\" exists with another spec (field %s differs, existing vs "
                        "requested: %s)",
                        v->name, diff, detail);
    } else {
        fill_shard(st, v, &shard);
        rep.staleness = v->staleness;
        rpc_reply_ok(call, &rep.base);
    }
    variable_release(v);
}

static void handle_lookup(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__LookupVariableRequest *req = (const void *)rpc_call_body(call);
    variable *v = store_find(st->vars, req->name);
    if (v == NULL) {
        char q[96];
        rpc_reply_error(call, STATUS_NOT_FOUND, "variable %s not found on ps %u",
                        QUOTED(q, req->name), st->task_index);
        return;
    }
    Psd__V1__LookupVariableReply rep = PSD__V1__LOOKUP_VARIABLE_REPLY__INIT;
    rep.spec = v->spec;
    rpc_reply_ok(call, &rep.base);
    variable_release(v);
}

static int var_name_cmp(const void *a, const void *b)
{
    const variable *x = *(const variable *const *)a, *y = *(const variable *const *)b;
    return strcmp(x->name, y->name);
}

/* All variables sorted by name (bytewise), or NULL when memory can't be had; each referenced
 * (store_list_release). */
static variable **sorted_vars(server_state *st, size_t *n)
{
    variable **vars;
    *n = store_list(st->vars, &vars);
    if (vars && *n > 1)
        qsort(vars, *n, sizeof(*vars), var_name_cmp);
    return vars;
}

/* Index of the first variable whose name sorts after `after` ("" : 0). */
static size_t first_after(variable **vars, size_t n, const char *after)
{
    size_t lo = 0, hi = n;
    if (after == NULL || after[0] == '\0')
        return 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(vars[mid]->name, after) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Bytes a repeated message field entry of packed size n adds: tag, length, body. */
static size_t entry_bytes(size_t n)
{
    return 1 + 10 + n;
}

/* Pages in name order: page_size entries at most (0: no count limit) and never more than fit
 * in a reply of max-message-bytes; next_page_token is the last name listed while more follow. */
static void handle_list(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__ListVariablesRequest *req = (const void *)rpc_call_body(call);
    size_t n;
    variable **vars = sorted_vars(st, &n);
    Psd__V1__ListVariablesReply rep = PSD__V1__LIST_VARIABLES_REPLY__INIT;
    Psd__V1__VariableSpec **specs = malloc((n ? n : 1) * sizeof(*specs));
    if (vars == NULL || specs == NULL) {
        store_list_release(vars, n);
        free(specs);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory listing variables");
        return;
    }
    size_t max = rpc_call_max_message(call);
    size_t budget = max > 2 * REPLY_RESERVE ? max - REPLY_RESERVE : max / 2;
    size_t used = 0, k = 0, i = first_after(vars, n, req->page_token);
    for (; i < n && (req->page_size == 0 || k < req->page_size); i++) {
        size_t b = entry_bytes(psd__v1__variable_spec__get_packed_size(vars[i]->spec));
        if (k > 0 && used + b > budget)
            break;
        used += b;
        specs[k++] = vars[i]->spec;
    }
    rep.n_variables = k;
    rep.variables = specs;
    if (i < n && k > 0)
        rep.next_page_token = vars[i - 1]->name;
    rpc_reply_ok(call, &rep.base);
    free(specs);
    store_list_release(vars, n);
}

/* Finds the variable (referenced: the caller releases it) and checks that the request's range
 * lies in this server's shard. Replies with the error and returns NULL otherwise. */
static variable *resolve_range(server_state *st, rpc_call *call, const char *name)
{
    const envelope *env = rpc_call_envelope(call);
    variable *v = store_find(st->vars, name);
    if (v == NULL) {
        char q[96];
        rpc_reply_error(call, STATUS_NOT_FOUND, "variable %s not found on ps %u", QUOTED(q, name),
                        st->task_index);
        return NULL;
    }
    uint64_t off = env->tensor->offset, cnt = env->tensor->count;
    if (off > v->numel || cnt > v->numel - off) {
        rpc_reply_error(call, STATUS_OUT_OF_RANGE,
                        "range [%llu, %llu+%llu) is outside variable \"%s\" of %llu elements",
                        (unsigned long long)off, (unsigned long long)off, (unsigned long long)cnt,
                        v->name, (unsigned long long)v->numel);
        variable_release(v);
        return NULL;
    }
    if (off < v->offset || off + cnt > v->offset + v->count) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "range [%llu, %llu) of \"%s\" is not held by ps %u, which holds [%llu, "
                        "%llu)",
                        (unsigned long long)off, (unsigned long long)(off + cnt), v->name,
                        st->task_index, (unsigned long long)v->offset,
                        (unsigned long long)(v->offset + v->count));
        variable_release(v);
        return NULL;
    }
    return v;
}

/* The version of every variable when this process began serving (restored from a checkpoint),
 * taken once, by the first pull, push or clock: nothing changes a version before one of those
 * has run. Push replies carry it (PushReply.restored_version) so that a client that sees the
 * server's instance change can count the updates acknowledged to it that the restart lost.
 * Kept in the variable itself (variable.restored_version, 0 for one created since), so that a
 * deleted variable's entry goes with it and a name created again starts from 0. */
static pthread_mutex_t restored_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool restored_taken;

static void restored_snapshot(server_state *st)
{
    if (atomic_load_explicit(&restored_taken, memory_order_acquire))
        return;
    pthread_mutex_lock(&restored_lock);
    if (!atomic_load_explicit(&restored_taken, memory_order_relaxed)) {
        variable **vars;
        size_t n = store_list(st->vars, &vars);
        /* Out of memory: every restored version reads 0, so clients overstate a loss once
         * rather than miss it. */
        for (size_t i = 0; vars && i < n; i++)
            vars[i]->restored_version = atomic_load(&vars[i]->version);
        store_list_release(vars, n);
        atomic_store_explicit(&restored_taken, true, memory_order_release);
    }
    pthread_mutex_unlock(&restored_lock);
}

static void handle_pull(rpc_call *call, void *arg)
{
    server_state *st = arg;
    restored_snapshot(st);
    const Psd__V1__PullRequest *req = (const void *)rpc_call_body(call);
    variable *v = resolve_range(st, call, req->name);
    if (v == NULL)
        return;
    const envelope *env = rpc_call_envelope(call);
    sync_pull(st, call, v, env->worker_id, env->clock, env->tensor->offset, env->tensor->count);
    variable_release(v);
}

/* Push and push-pull: dedup by (client, seq), apply the optimizer reading the gradient in
 * place from the request, and for push-pull copy the result back in the same critical
 * section. A push that found v before a DeleteVariable unlinked it applies to the unlinked
 * shard (it is ordered before the delete); one that looks after gets NOT_FOUND. */
static void push_apply(rpc_call *call, server_state *st, variable *v, bool reply_params)
{
    const envelope *env = rpc_call_envelope(call);
    uint64_t off = env->tensor->offset, cnt = env->tensor->count;
    size_t seglen;
    const uint8_t *grad = rpc_call_segment(call, &seglen);
    Psd__V1__PushReply rep = PSD__V1__PUSH_REPLY__INIT;
    rep.restored_version = v->restored_version;
    /* From the dedup mark through the update, a checkpoint's snapshot waits (store.h): it sees
     * a push either marked and applied, or neither. */
    store_update_begin(st->vars);
    dedup_result d = dedup_begin(st->dedup, env->client_id, env->seq);
    if (d == DEDUP_TOO_OLD) {
        store_update_end(st->vars);
        rpc_reply_error(call, STATUS_ABORTED,
                        "push seq %llu of client %016llx is older than the dedup window, or the "
                        "client was evicted from the dedup table (dedup-max-clients, "
                        "dedup-idle-ms): refused, it may or may not have been applied",
                        (unsigned long long)env->seq, (unsigned long long)env->client_id);
        return;
    }
    uint8_t *dst = NULL;
    if (d == DEDUP_DUPLICATE) {
        atomic_fetch_add(&st->duplicates_dropped, 1);
        rep.duplicate = true;
    }
    rep.version = atomic_load(&v->version) + (d == DEDUP_NEW);
    if (reply_params) {
        sync_record_read(st, v, env->worker_id, env->clock);
        dst = rpc_reply_ok_segment(call, &rep.base, off, cnt);
        if (dst == NULL) {
            if (d == DEDUP_NEW)
                dedup_unmark(st->dedup, env->client_id, env->seq);
            store_update_end(st->vars);
            return;
        }
    }
    size_t first = (size_t)(off - v->offset);
    if (env->worker_id >= 0)
        sync_heard(st, env->worker_id);
    if (d == DEDUP_NEW && v->staleness == 0 && env->worker_id >= 0) {
        /* BSP: summed now, applied once every live worker is past this clock. */
        if (sync_aggregate(st, v, env->worker_id, grad, first, cnt) != 0) {
            dedup_unmark(st->dedup, env->client_id, env->seq);
            store_update_end(st->vars);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "out of memory for the BSP aggregate of \"%s\"", v->name);
            return;
        }
        d = DEDUP_DUPLICATE; /* nothing more to apply below */
        rep.version = atomic_load(&v->version);
    }
    pthread_mutex_lock(&v->lock);
    if (d == DEDUP_NEW) {
        float *slots[OPTIMIZER_MAX_SLOTS];
        for (size_t i = 0; i < v->nslots; i++)
            slots[i] = v->slots[i] + first;
        optimizer_apply(&v->opt, v->params + first, grad, slots, (size_t)cnt);
        atomic_fetch_add(&v->version, 1);
    }
    if (dst)
        memcpy(dst, v->params + first, (size_t)cnt * sizeof(float));
    pthread_mutex_unlock(&v->lock);
    store_update_end(st->vars);
    if (d == DEDUP_NEW)
        atomic_fetch_add(&st->updates_applied, 1);
    (void)seglen;
    if (!reply_params)
        rpc_reply_ok(call, &rep.base);
}

static void push_common(rpc_call *call, server_state *st, bool reply_params)
{
    const Psd__V1__PushRequest *req = (const void *)rpc_call_body(call);
    restored_snapshot(st);
    variable *v = resolve_range(st, call, req->name);
    if (v == NULL)
        return;
    push_apply(call, st, v, reply_params);
    variable_release(v);
}

static void handle_push(rpc_call *call, void *arg)
{
    push_common(call, arg, false);
}

static void handle_push_pull(rpc_call *call, void *arg)
{
    push_common(call, arg, true);
}

static void handle_clock(rpc_call *call, void *arg)
{
    server_state *st = arg;
    restored_snapshot(st);
    const envelope *env = rpc_call_envelope(call);
    if (env->worker_id < 0 || env->worker_id >= SERVER_MAX_WORKERS) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "clock needs a worker id in [0, %d), got %d",
                        SERVER_MAX_WORKERS, (int)env->worker_id);
        return;
    }
    Psd__V1__ClockReply rep = PSD__V1__CLOCK_REPLY__INIT;
    int64_t min;
    rep.clock = sync_clock(st, env->worker_id, env->clock, &min);
    rep.min_clock = min == INT64_MAX ? rep.clock : min;
    rpc_reply_ok(call, &rep.base);
}

/* Counters, the workers and per-variable entries: only the variable asked for by name, or at
 * most max_variables (default STATUS_DEFAULT_VARIABLES) in name order and never more than fit
 * in a reply of max-message-bytes; num_variables always counts them all. */
static void handle_status(rpc_call *call, void *arg)
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
    rep.bytes_held = store_bytes(st->vars);
    rep.version = PSD_VERSION;
    size_t n;
    variable **vars = sorted_vars(st, &n);
    rep.num_variables = n;
    size_t want = req->max_variables ? req->max_variables : STATUS_DEFAULT_VARIABLES;
    if (req->variable && req->variable[0]) {
        variable *one = store_find(st->vars, req->variable);
        for (size_t i = 0; vars && i < n; i++)
            variable_release(vars[i]);
        n = 0;
        if (vars && one)
            vars[n++] = one;
        else
            variable_release(one);
        want = 1;
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
    size_t max = rpc_call_max_message(call);
    size_t budget = max > 4 * REPLY_RESERVE ? max / 2 : max / 4;
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
        size_t b = entry_bytes(psd__v1__variable_status__get_packed_size(&vs[k]));
        if (k > 0 && used + b > budget)
            break;
        used += b;
        vsp[k] = &vs[k];
        k++;
    }
    rep.n_variables = k;
    rep.variables = vsp;
    rep.variables_truncated = k < n;
    sync_status(st, &rep);
    rpc_reply_ok(call, &rep.base);
    sync_status_free(&rep);
    free(obs);
    free(hist);
    free(vsp);
    free(vs);
    store_list_release(vars, n);
}

static void handle_checkpoint(rpc_call *call, void *arg)
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

/* Admin. Unlinks the variable (this server's shard), answers the pulls parked on it with
 * NOT_FOUND and drops the store's reference: the shard is freed, and its bytes leave
 * bytes_held, once the last call still using it is done. The name may be created again at
 * once, with fresh values. Held against a checkpoint's copy like an update (store.h), so that a
 * snapshot sees the variable whole or not at all. */
static void handle_delete(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__DeleteVariableRequest *req = (const void *)rpc_call_body(call);
    char q[96];
    store_update_begin(st->vars);
    variable *v = store_remove(st->vars, req->name);
    store_update_end(st->vars);
    if (v == NULL) {
        rpc_reply_error(call, STATUS_NOT_FOUND, "variable %s not found on ps %u",
                        QUOTED(q, req->name), st->task_index);
        return;
    }
    char why[160];
    snprintf(why, sizeof(why), "variable %s was deleted", QUOTED(q, v->name));
    sync_delete(st, v, why);
    log_info("variable %s deleted (%llu elements of this shard)", q, (unsigned long long)v->count);
    variable_release(v);
    Psd__V1__DeleteVariableReply rep = PSD__V1__DELETE_VARIABLE_REPLY__INIT;
    rep.deleted = true;
    rpc_reply_ok(call, &rep.base);
}

static void handle_shutdown(rpc_call *call, void *arg)
{
    server_state *st = arg;
    Psd__V1__ShutdownReply rep = PSD__V1__SHUTDOWN_REPLY__INIT;
    rpc_reply_ok(call, &rep.base);
    atomic_store(&st->shutdown_requested, true);
}

const rpc_method server_methods[] = {
    {PSD__V1__METHOD__CREATE_VARIABLE, "CreateVariable",
     &psd__v1__create_variable_request__descriptor, handle_create, 0},
    {PSD__V1__METHOD__LOOKUP_VARIABLE, "LookupVariable",
     &psd__v1__lookup_variable_request__descriptor, handle_lookup, 0},
    {PSD__V1__METHOD__LIST_VARIABLES, "ListVariables", &psd__v1__list_variables_request__descriptor,
     handle_list, 0},
    {PSD__V1__METHOD__PULL, "Pull", &psd__v1__pull_request__descriptor, handle_pull,
     RPC_RANGE | RPC_REPLY_RANGE},
    {PSD__V1__METHOD__PUSH, "Push", &psd__v1__push_request__descriptor, handle_push,
     RPC_RANGE | RPC_SEGMENT},
    {PSD__V1__METHOD__PUSH_PULL, "PushPull", &psd__v1__push_request__descriptor, handle_push_pull,
     RPC_RANGE | RPC_SEGMENT | RPC_REPLY_RANGE},
    {PSD__V1__METHOD__CLOCK, "Clock", &psd__v1__clock_request__descriptor, handle_clock, RPC_POOL},
    {PSD__V1__METHOD__SERVER_STATUS, "ServerStatus", &psd__v1__server_status_request__descriptor,
     handle_status, 0},
    {PSD__V1__METHOD__CHECKPOINT, "Checkpoint", &psd__v1__checkpoint_request__descriptor,
     handle_checkpoint, RPC_ADMIN},
    {PSD__V1__METHOD__SHUTDOWN, "Shutdown", &psd__v1__shutdown_request__descriptor, handle_shutdown,
     RPC_ADMIN},
    {PSD__V1__METHOD__DELETE_VARIABLE, "DeleteVariable",
     &psd__v1__delete_variable_request__descriptor, handle_delete, RPC_ADMIN},
};
const size_t server_methods_len = sizeof(server_methods) / sizeof(server_methods[0]);
