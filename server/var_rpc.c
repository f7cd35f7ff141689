/* Dense variables over the wire: CreateVariable, LookupVariable, ListVariables, Pull and
 * DeleteVariable; the checks of a variable's spec and of a range against this server's shard;
 * and the limits of a server's store and dedup table (max-server-bytes and the like). The RPC
 * layer has already checked the frame, the method, the presence of a tensor range/segment, the
 * body's type and the deadline. */
#include "var_rpc.h"

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
#include "util.h"

#define MAX_NUMEL (1ull << 40)

/* name, quoted for a message: escaped, cut after 64 bytes (never raw client bytes). */
#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

int server_check_spec(const server_state *st, const Psd__V1__VariableSpec *spec, uint64_t *numel,
                      char *err, size_t errlen)
{
    if (spec == NULL) {
        snprintf(err, errlen, "missing variable spec");
        return STATUS_INVALID_ARGUMENT;
    }
    if (!name_valid(spec->name, 255)) {
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
    if (spec->parts) {
        /* Placed by slot whatever the cluster size: num_servers 0 (which older servers refuse
         * as another cluster size), split set. */
        if (!spec->split || spec->num_servers != 0 || !placement_is_parts(n, n * 4, 0)) {
            snprintf(err, errlen,
                     "variable \"%s\": a spec cut in parts needs split, num_servers 0 and more "
                     "than %llu elements (it has split %d, num_servers %u, %llu elements)",
                     spec->name, (unsigned long long)PLACEMENT_PART_ELEMS, (int)spec->split,
                     spec->num_servers, (unsigned long long)n);
            return STATUS_INVALID_ARGUMENT;
        }
        *numel = n;
        return STATUS_OK;
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
        slot_map map = server_slots(st);
        uint32_t owner = slots_name_owner(&map, spec->name);
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

static void fill_shard(const server_state *st, const variable *v, Psd__V1__Shard *sh)
{
    sh->server = st->task_index;
    sh->offset = v->offset;
    sh->count = v->count;
}

/* Makes the head of a variable cut in parts and the parts this server's slots give it, all
 * reserved at once (max-server-bytes, max-variables: refused before anything is allocated),
 * and links the parts first, so that a head found means its parts are there. *out: the head
 * with a reference, or NULL when another client linked it first (what it made is dropped). */
static int create_parts(server_state *st, const Psd__V1__VariableSpec *spec, uint64_t numel,
                        variable **out, char *err, size_t errlen)
{
    *out = NULL;
    slot_map map = server_slots(st);
    uint64_t nparts = placement_part_count(numel), mine = 0, elems = 0;
    for (uint64_t k = 0; k < nparts; k++) {
        if (slots_part_owner(&map, spec->name, k) != st->task_index)
            continue;
        uint64_t off, cnt;
        placement_part_range(numel, k, &off, &cnt);
        mine++;
        elems += cnt;
    }
    int kind = (int)spec->optimizer;
    size_t nslots = optimizer_kind_valid(kind) ? optimizer_slot_count((optimizer_kind)kind) : 0;
    uint64_t bytes = store_shard_bytes(elems, nslots);
    int rc = store_reserve(st->vars, bytes, err, errlen);
    if (rc != STATUS_OK)
        return rc; /* RESOURCE_EXHAUSTED: the caller names the variable */
    variable **made = calloc(mine + 1, sizeof(*made));
    size_t n = 0;
    rc = made ? STATUS_OK : STATUS_RESOURCE_EXHAUSTED;
    if (made == NULL)
        errf(err, errlen, "out of memory for variable \"%s\"", spec->name);
    for (uint64_t k = 0; rc == STATUS_OK && k < nparts; k++) {
        if (slots_part_owner(&map, spec->name, k) != st->task_index)
            continue;
        uint64_t off, cnt;
        placement_part_range(numel, k, &off, &cnt);
        made[n] = variable_create(spec, numel, off, cnt, err, errlen);
        if (made[n] == NULL)
            rc = strncmp(err, "out of memory", 13) == 0 ? STATUS_RESOURCE_EXHAUSTED
                                                        : STATUS_INVALID_ARGUMENT;
        else
            n++;
    }
    variable *head = rc == STATUS_OK ? variable_create(spec, numel, 0, 0, err, errlen) : NULL;
    if (rc == STATUS_OK && head == NULL)
        rc = STATUS_INVALID_ARGUMENT;
    if (rc != STATUS_OK) {
        for (size_t i = 0; i < n; i++)
            variable_destroy(made[i]);
        free(made);
        store_unreserve(st->vars, bytes);
        return rc;
    }
    /* Under the update lock, so that a checkpoint's snapshot holds exactly the variables
     * created up to the create_gen it reads (the head's, the highest). */
    store_update_begin(st->vars);
    for (size_t i = 0; i < n; i++) {
        made[i]->create_gen = atomic_fetch_add(&st->create_gen, 1) + 1;
        variable *in = store_insert(st->vars, made[i]);
        if (in != made[i])
            variable_destroy(made[i]); /* another client's create linked it first */
        variable_release(in);
    }
    head->create_gen = atomic_fetch_add(&st->create_gen, 1) + 1;
    variable *in = store_insert(st->vars, head);
    store_update_end(st->vars);
    store_unreserve(st->vars, bytes);
    free(made);
    if (in != head) {
        variable_destroy(head);
        variable_release(in);
        return STATUS_OK;
    }
    *out = in;
    return STATUS_OK;
}

void handle_var_create(rpc_call *call, void *arg)
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
    if (server_table_exists(st, req->spec->name)) {
        rpc_reply_error(call, STATUS_ALREADY_EXISTS, "\"%s\" is a sparse table, not a variable",
                        req->spec->name);
        return;
    }
    variable *v = store_find(st->vars, req->spec->name);
    if (v == NULL && req->spec->parts) {
        rc = create_parts(st, req->spec, numel, &v, err, sizeof(err));
        if (rc == STATUS_RESOURCE_EXHAUSTED) {
            rpc_reply_error(call, rc, "cannot create variable \"%s\": %s", req->spec->name, err);
            return;
        }
        if (rc != STATUS_OK) {
            rpc_reply_error(call, rc, "%s", err);
            return;
        }
        rep.created = v != NULL;
        if (v == NULL)
            v = store_find(st->vars, req->spec->name); /* another client made it meanwhile */
        if (v == NULL) {
            rpc_reply_error(call, STATUS_UNAVAILABLE,
                            "variable \"%s\" was deleted while being created (retry)",
                            req->spec->name);
            return;
        }
    }
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
        /* Under the update lock, so that a checkpoint's snapshot holds exactly the variables
         * created up to the create_gen it reads. */
        store_update_begin(st->vars);
        nv->create_gen = atomic_fetch_add(&st->create_gen, 1) + 1;
        v = store_insert(st->vars, nv);
        store_update_end(st->vars);
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
        /* Acknowledged once durable: a crash must not lose a variable a client was told of. */
        checkpointer *ck = checkpointer_of(st);
        if (ck == NULL || !checkpointer_await_create(ck, call, v, &rep))
            rpc_reply_ok(call, &rep.base);
    }
    variable_release(v);
}

void handle_var_lookup(rpc_call *call, void *arg)
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
 * (store_list_release). A variable cut in parts is listed once, by its head. */
variable **var_sorted_vars(server_state *st, size_t *n)
{
    variable **vars;
    *n = store_list(st->vars, &vars);
    size_t k = 0;
    for (size_t i = 0; vars && i < *n; i++) {
        if (vars[i]->part != VARIABLE_HEAD)
            variable_release(vars[i]);
        else
            vars[k++] = vars[i];
    }
    if (vars)
        *n = k;
    if (vars && *n > 1)
        qsort(vars, *n, sizeof(*vars), var_name_cmp);
    return vars;
}

static int part_cmp(const void *a, const void *b)
{
    const variable *x = *(const variable *const *)a, *y = *(const variable *const *)b;
    return x->offset < y->offset   ? -1
           : x->offset > y->offset ? 1
                                   : (x->count > y->count) - (x->count < y->count);
}

variable **var_parts_of(server_state *st, const char *name, size_t *n)
{
    variable **vars;
    *n = store_list(st->vars, &vars);
    size_t k = 0;
    for (size_t i = 0; vars && i < *n; i++) {
        if (strcmp(vars[i]->name, name) != 0 || !vars[i]->spec->parts)
            variable_release(vars[i]);
        else
            vars[k++] = vars[i];
    }
    *n = vars ? k : 0;
    if (vars && k > 1)
        qsort(vars, k, sizeof(*vars), part_cmp);
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

/* Pages in name order: page_size entries at most (0: no count limit) and never more than fit
 * in a reply body (rpc_call_max_reply_body: max-message-bytes and the envelope's 1 MiB bound);
 * next_page_token is the last name listed while more follow. */
void handle_var_list(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__ListVariablesRequest *req = (const void *)rpc_call_body(call);
    size_t n;
    variable **vars = var_sorted_vars(st, &n);
    Psd__V1__ListVariablesReply rep = PSD__V1__LIST_VARIABLES_REPLY__INIT;
    Psd__V1__VariableSpec **specs = malloc((n ? n : 1) * sizeof(*specs));
    if (vars == NULL || specs == NULL) {
        store_list_release(vars, n);
        free(specs);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory listing variables");
        return;
    }
    size_t max = rpc_call_max_reply_body(call);
    size_t budget = max > 2 * REPLY_RESERVE ? max - REPLY_RESERVE : max / 2;
    size_t used = 0, k = 0, i = first_after(vars, n, req->page_token);
    for (; i < n && (req->page_size == 0 || k < req->page_size); i++) {
        size_t b = reply_entry_bytes(psd__v1__variable_spec__get_packed_size(vars[i]->spec));
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

/* Checks that [off, off+cnt) lies in v and in this server's shard of it. Returns STATUS_OK, or
 * the status with a message in err. */
static int check_range(const server_state *st, const variable *v, uint64_t off, uint64_t cnt,
                       char *err, size_t errlen)
{
    if (off > v->numel || cnt > v->numel - off) {
        snprintf(err, errlen, "range [%llu, %llu+%llu) is outside variable \"%s\" of %llu elements",
                 (unsigned long long)off, (unsigned long long)off, (unsigned long long)cnt, v->name,
                 (unsigned long long)v->numel);
        return STATUS_OUT_OF_RANGE;
    }
    if (off < v->offset || off + cnt > v->offset + v->count) {
        snprintf(err, errlen,
                 "range [%llu, %llu) of \"%s\" is not held by ps %u, which holds [%llu, %llu)",
                 (unsigned long long)off, (unsigned long long)(off + cnt), v->name, st->task_index,
                 (unsigned long long)v->offset, (unsigned long long)(v->offset + v->count));
        return STATUS_FAILED_PRECONDITION;
    }
    return STATUS_OK;
}

/* The part of the variable whose head is `head` (whose reference it takes over) that holds
 * [off, off+cnt): the range must lie inside one part, which this server must hold. */
static variable *find_part(server_state *st, variable *head, uint64_t off, uint64_t cnt,
                           int *status, char *err, size_t errlen)
{
    uint64_t k = placement_part_of(off);
    *status = STATUS_OK;
    if (off > head->numel || cnt > head->numel - off) {
        *status = check_range(st, head, off, cnt, err, errlen); /* OUT_OF_RANGE */
    } else if (cnt > 0 && placement_part_of(off + cnt - 1) != k) {
        snprintf(err, errlen,
                 "range [%llu, %llu) of \"%s\" crosses a part boundary (parts of %llu elements: "
                 "send one request per part)",
                 (unsigned long long)off, (unsigned long long)(off + cnt), head->name,
                 (unsigned long long)PLACEMENT_PART_ELEMS);
        *status = STATUS_INVALID_ARGUMENT;
    }
    variable *p = *status == STATUS_OK ? store_find_part(st->vars, head->name, k) : NULL;
    if (*status == STATUS_OK && p == NULL) {
        slot_map map = server_slots(st);
        uint32_t slot = slots_of_part(head->name, k, map.nslots);
        snprintf(err, errlen,
                 "part %llu of \"%s\" (slot %u) is not held by ps %u; the slot map gives it to "
                 "ps %u",
                 (unsigned long long)k, head->name, slot, st->task_index, slots_owner(&map, slot));
        *status = STATUS_FAILED_PRECONDITION;
    }
    variable_release(head);
    return p;
}

variable *var_find_range(server_state *st, const char *name, uint64_t off, uint64_t cnt,
                         int *status, char *err, size_t errlen)
{
    variable *v = store_find(st->vars, name);
    if (v == NULL) {
        char q[96];
        if (server_table_exists(st, name))
            snprintf(err, errlen,
                     "%s is a sparse table, not a dense variable (use TablePull/"
                     "TablePush for it)",
                     QUOTED(q, name));
        else
            snprintf(err, errlen, "variable %s not found on ps %u", QUOTED(q, name),
                     st->task_index);
        *status = STATUS_NOT_FOUND;
        return NULL;
    }
    if (variable_is_head(v))
        return find_part(st, v, off, cnt, status, err, errlen);
    *status = check_range(st, v, off, cnt, err, errlen);
    if (*status != STATUS_OK) {
        variable_release(v);
        return NULL;
    }
    return v;
}

variable *var_resolve_range(server_state *st, rpc_call *call, const char *name)
{
    const envelope *env = rpc_call_envelope(call);
    char err[512];
    int status;
    variable *v = var_find_range(st, name, env->tensor->offset, env->tensor->count, &status, err,
                                 sizeof(err));
    if (v == NULL)
        rpc_reply_error(call, status, "%s", err);
    return v;
}

void handle_var_pull(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__PullRequest *req = (const void *)rpc_call_body(call);
    variable *v = var_resolve_range(st, call, req->name);
    if (v == NULL)
        return;
    const envelope *env = rpc_call_envelope(call);
    sync_pull(st, call, v, env->worker_id, env->clock, env->tensor->offset, env->tensor->count);
    variable_release(v);
}

/* Admin. Unlinks the variable (this server's shard), answers the pulls parked on it with
 * NOT_FOUND and drops the store's reference: the shard is freed, and its bytes leave
 * bytes_held, once the last call still using it is done. The name may be created again at
 * once, with fresh values. Held against a checkpoint's copy like an update (store.h), so that a
 * snapshot sees the variable whole or not at all. */
/* Unlinks every part of `name` this server holds, answering the pulls parked on each. */
static void delete_parts(server_state *st, const char *name)
{
    variable **vars;
    size_t n = store_list(st->vars, &vars);
    char q[96], why[160];
    snprintf(why, sizeof(why), "variable %s was deleted", QUOTED(q, name));
    for (size_t i = 0; vars && i < n; i++) {
        if (vars[i]->part == VARIABLE_HEAD || strcmp(vars[i]->name, name) != 0)
            continue;
        store_update_begin(st->vars);
        variable *p = store_remove_part(st->vars, name, vars[i]->part);
        store_update_end(st->vars);
        if (p) {
            sync_delete(st, p, why);
            variable_release(p);
        }
    }
    store_list_release(vars, n);
}

void handle_var_delete(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__DeleteVariableRequest *req = (const void *)rpc_call_body(call);
    char q[96];
    store_update_begin(st->vars);
    variable *v = store_remove(st->vars, req->name);
    store_update_end(st->vars);
    if (v && v->spec->parts)
        delete_parts(st, v->name);
    if (v == NULL && server_table_delete(st, req->name) == 0) {
        Psd__V1__DeleteVariableReply rep = PSD__V1__DELETE_VARIABLE_REPLY__INIT;
        rep.deleted = true;
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (v == NULL) {
        rpc_reply_error(call, STATUS_NOT_FOUND, "variable or table %s not found on ps %u",
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
