/* RPC handlers of ps-server. The RPC layer has already checked the frame, the method, the
 * presence of a tensor range/segment, the body's type and the deadline. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "log.h"
#include "placement.h"
#include "replica.h"
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
    st->max_bytes = max_bytes;
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
    if (server_table_exists(st, req->spec->name)) {
        rpc_reply_error(call, STATUS_ALREADY_EXISTS, "\"%s\" is a sparse table, not a variable",
                        req->spec->name);
        return;
    }
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
 * in a reply body (rpc_call_max_reply_body: max-message-bytes and the envelope's 1 MiB bound);
 * next_page_token is the last name listed while more follow. */
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
    size_t max = rpc_call_max_reply_body(call);
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

/* Finds the variable (referenced: the caller releases it) and checks that the range
 * [off, off+cnt) lies in this server's shard. Returns NULL with the status and a message in
 * err otherwise. */
static variable *find_range(server_state *st, const char *name, uint64_t off, uint64_t cnt,
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
    *status = check_range(st, v, off, cnt, err, errlen);
    if (*status != STATUS_OK) {
        variable_release(v);
        return NULL;
    }
    return v;
}

/* find_range for a Pull/Push/PushPull request's range (Envelope.tensor); replies with the
 * error and returns NULL when it fails. */
static variable *resolve_range(server_state *st, rpc_call *call, const char *name)
{
    const envelope *env = rpc_call_envelope(call);
    char err[512];
    int status;
    variable *v =
        find_range(st, name, env->tensor->offset, env->tensor->count, &status, err, sizeof(err));
    if (v == NULL)
        rpc_reply_error(call, status, "%s", err);
    return v;
}

static void handle_pull(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__PullRequest *req = (const void *)rpc_call_body(call);
    variable *v = resolve_range(st, call, req->name);
    if (v == NULL)
        return;
    const envelope *env = rpc_call_envelope(call);
    sync_pull(st, call, v, env->worker_id, env->clock, env->tensor->offset, env->tensor->count);
    variable_release(v);
}

/* Applies a gradient of `dtype` (FLOAT32: read in place from the request; BFLOAT16: widened a
 * block at a time) to elements [first, first+cnt) of v's shard, with that range locked. An
 * element whose update would overflow (optimizer_apply_finite) keeps its values: returns how
 * many did, the first one's index in the range in *first_bad. */
static uint64_t apply_grad(variable *v, uint64_t first, const uint8_t *grad, int dtype,
                           uint64_t cnt, uint64_t *first_bad)
{
    float *slots[OPTIMIZER_MAX_SLOTS];
    size_t at = 0;
    if (dtype == PSD__V1__DTYPE__FLOAT32) {
        for (size_t i = 0; i < v->nslots; i++)
            slots[i] = v->slots[i] + first;
        uint64_t bad =
            optimizer_apply_finite(&v->opt, v->params + first, grad, slots, (size_t)cnt, &at);
        *first_bad = at;
        return bad;
    }
    enum { BLOCK = 2048 };
    float block[BLOCK];
    size_t esize = frame_dtype_size(dtype);
    uint64_t bad = 0;
    for (uint64_t k = 0; k < cnt; k += BLOCK) {
        size_t n = cnt - k < BLOCK ? (size_t)(cnt - k) : BLOCK;
        frame_get_floats(block, grad + esize * k, n, dtype);
        for (size_t i = 0; i < v->nslots; i++)
            slots[i] = v->slots[i] + first + k;
        size_t b = optimizer_apply_finite(&v->opt, v->params + first + k, block, slots, n, &at);
        if (b > 0 && bad == 0)
            *first_bad = k + at;
        bad += b;
    }
    return bad;
}

/* One push: Push, PushPull or an item of Step. */
typedef struct push_in {
    uint64_t client, seq;
    int32_t worker;
    const uint8_t *grad; /* cnt values of dtype; may be unaligned */
    int dtype;
    uint64_t off, cnt; /* in the variable's index space, checked against the shard */
    bool assign;       /* grad holds values to write as they are (PushRequest.assign) */
} push_in;

/* Where a push-pull's reply goes, once the push is marked: `reply` allocates the reply (with
 * the push's outcome) and returns its segment area, or NULL with an error reply in place. */
typedef uint8_t *(*push_reply_fn)(void *arg, bool duplicate, uint64_t version);

/* The message of a push that dedup could not prove new (ABORTED): why, and what the client
 * can know. */
static void push_refusal(dedup_result d, const push_in *in, uint64_t floor, char *err,
                         size_t errlen)
{
    unsigned long long seq = (unsigned long long)in->seq, client = (unsigned long long)in->client;
    if (d == DEDUP_EVICTED)
        snprintf(err, errlen,
                 "push seq %llu of client %016llx: the client was evicted from the dedup table "
                 "(dedup-max-clients, dedup-idle-ms) when its highest seq was %llu, so this one "
                 "may already have been applied: refused, not applied again (seqs above %llu "
                 "are accepted)",
                 seq, client, (unsigned long long)floor, (unsigned long long)floor);
    else if (d == DEDUP_UNPROVEN)
        snprintf(err, errlen,
                 "push seq %llu of client %016llx: the dedup table does not know this client "
                 "and cannot prove it is not one it evicted and forgot (dedup-max-clients "
                 "exceeded beyond the tombstones; floor %llu for this id), so this push may "
                 "already have been applied: refused, not applied (seqs above %llu are "
                 "accepted)",
                 seq, client, (unsigned long long)floor, (unsigned long long)floor);
    else if (d == DEDUP_NO_MEMORY)
        snprintf(err, errlen,
                 "push seq %llu of client %016llx: no memory for the client's dedup window, so "
                 "the push cannot be proven new: refused, it may or may not have been applied",
                 seq, client);
    else
        snprintf(err, errlen,
                 "push seq %llu of client %016llx is older than the dedup window "
                 "(dedup-window): refused, it may or may not have been applied",
                 seq, client);
}

void server_push_refusal(dedup_result d, uint64_t client, uint64_t seq, uint64_t floor, char *err,
                         size_t errlen)
{
    push_in in = {.client = client, .seq = seq};
    push_refusal(d, &in, floor, err, errlen);
}

/* Dedups by (client, seq), then applies the optimizer (or adds to the BSP aggregate),
 * reading the gradient in place from the request. With `reply`, copies the parameters just
 * after the update, in out_dtype, into the area it returns, in the same critical section.
 * Returns STATUS_OK with *duplicate and *version set, -1 when `reply` failed (its error reply
 * is in place), or an error status with a message in err: FAILED_PRECONDITION when the update
 * of some elements would have left them non-finite (those kept their values, the others were
 * applied; a push-pull's reply is then replaced by the error). A push that found v before a
 * DeleteVariable unlinked it applies to the unlinked shard (it is ordered before the delete).
 */
static int push_one(server_state *st, variable *v, const push_in *in, push_reply_fn reply,
                    void *reply_arg, int out_dtype, bool *duplicate, uint64_t *version, char *err,
                    size_t errlen)
{
    uint64_t first = in->off - v->offset;
    /* From the dedup mark through the update, a checkpoint's snapshot waits (store.h): it sees
     * a push either marked and applied, or neither. */
    store_update_begin(st->vars);
    uint64_t floor = 0;
    dedup_result d = dedup_begin_floor(st->dedup, in->client, in->seq, &floor);
    if (d != DEDUP_NEW && d != DEDUP_DUPLICATE) {
        store_update_end(st->vars);
        push_refusal(d, in, floor, err, errlen);
        return STATUS_ABORTED;
    }
    if (d == DEDUP_DUPLICATE)
        atomic_fetch_add(&st->duplicates_dropped, 1);
    *duplicate = d == DEDUP_DUPLICATE;
    *version = atomic_load(&v->version) + (d == DEDUP_NEW);
    if (in->worker >= 0)
        sync_heard(st, in->worker);
    if (d == DEDUP_NEW && v->staleness == 0 && in->worker >= 0 && !in->assign) {
        /* BSP: summed now, applied once every live worker is past this clock. */
        if (sync_aggregate(st, v, in->worker, in->grad, in->dtype, first, in->cnt) != 0) {
            dedup_unmark(st->dedup, in->client, in->seq);
            store_update_end(st->vars);
            snprintf(err, errlen, "out of memory for the BSP aggregate of \"%s\"", v->name);
            return STATUS_RESOURCE_EXHAUSTED;
        }
        d = DEDUP_DUPLICATE; /* nothing more to apply below */
        *version = atomic_load(&v->version);
    }
    uint8_t *dst = NULL;
    if (reply) {
        dst = reply(reply_arg, *duplicate, *version);
        if (dst == NULL) {
            if (d == DEDUP_NEW)
                dedup_unmark(st->dedup, in->client, in->seq);
            store_update_end(st->vars);
            return -1;
        }
    }
    variable_lock_range(v, first, in->cnt);
    uint64_t overflowed = 0, first_bad = 0;
    if (d == DEDUP_NEW) {
        if (in->assign)
            frame_get_floats(v->params + first, in->grad, (size_t)in->cnt, in->dtype);
        else
            overflowed = apply_grad(v, first, in->grad, in->dtype, in->cnt, &first_bad);
        /* Disjoint ranges of v apply at once: the version this update made is the one its
         * increment returns. A push-pull's reply was packed before (with the version read
         * then: equal to a concurrent push's at worst, which only makes a client's count of
         * acknowledged updates lower, never higher). */
        uint64_t made = atomic_fetch_add(&v->version, 1) + 1;
        if (!reply)
            *version = made;
    }
    if (dst)
        frame_put_floats(dst, v->params + first, (size_t)in->cnt, out_dtype);
    variable_unlock_range(v, first, in->cnt);
    store_update_end(st->vars);
    if (d == DEDUP_NEW)
        atomic_fetch_add(&st->updates_applied, 1);
    if (overflowed > 0) {
        /* The other elements were applied (the dedup mark stays: a resend is a duplicate). */
        snprintf(err, errlen,
                 "variable \"%s\": the update of element %llu would leave it non-finite (inf or "
                 "NaN): %llu elements left unchanged; the push's other elements were applied",
                 v->name, (unsigned long long)(in->off + first_bad),
                 (unsigned long long)overflowed);
        return STATUS_FAILED_PRECONDITION;
    }
    return STATUS_OK;
}

typedef struct push_pull_reply {
    rpc_call *call;
    server_state *st;
    variable *v;
} push_pull_reply;

static uint8_t *push_pull_reply_alloc(void *arg, bool duplicate, uint64_t version)
{
    push_pull_reply *r = arg;
    const envelope *env = rpc_call_envelope(r->call);
    Psd__V1__PushReply rep = PSD__V1__PUSH_REPLY__INIT;
    rep.restored_version = r->v->restored_version;
    rep.duplicate = duplicate;
    rep.version = version;
    sync_record_read(r->st, r->v, env->worker_id, env->clock);
    return rpc_reply_ok_tensor(r->call, &rep.base, env->tensor->dtype, env->tensor->offset,
                               env->tensor->count);
}

/* Push and push-pull: push_one, and the reply. */
static void push_apply(rpc_call *call, server_state *st, variable *v, bool reply_params,
                       bool assign)
{
    const envelope *env = rpc_call_envelope(call);
    size_t seglen;
    push_in in = {.client = env->client_id,
                  .seq = env->seq,
                  .worker = env->worker_id,
                  .grad = rpc_call_segment(call, &seglen),
                  .dtype = env->tensor->dtype,
                  .off = env->tensor->offset,
                  .cnt = env->tensor->count,
                  .assign = assign};
    push_pull_reply r = {call, st, v};
    bool dup;
    uint64_t version;
    char err[512];
    int rc = push_one(st, v, &in, reply_params ? push_pull_reply_alloc : NULL, &r,
                      env->tensor->dtype, &dup, &version, err, sizeof(err));
    if (rc == -1)
        return; /* the reply could not be made: its error is in place */
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return;
    }
    if (!reply_params) {
        Psd__V1__PushReply rep = PSD__V1__PUSH_REPLY__INIT;
        rep.restored_version = v->restored_version;
        rep.duplicate = dup;
        rep.version = version;
        rpc_reply_ok(call, &rep.base);
    }
}

static void push_common(rpc_call *call, server_state *st, bool reply_params, bool assign)
{
    const Psd__V1__PushRequest *req = (const void *)rpc_call_body(call);
    variable *v = resolve_range(st, call, req->name);
    if (v == NULL)
        return;
    push_apply(call, st, v, reply_params, assign);
    variable_release(v);
}

static void handle_push(rpc_call *call, void *arg)
{
    push_common(call, arg, false, false);
}

static void handle_assign(rpc_call *call, void *arg)
{
    push_common(call, arg, false, true);
}

static void handle_push_pull(rpc_call *call, void *arg)
{
    push_common(call, arg, true, false);
}

/* ---- Step: a training step's pushes, clock and pulls with this server, in one message ---- */

/* Items of one Step request at most. */
#define STEP_MAX_ITEMS 65536

typedef struct step_ctx {
    Psd__V1__StepRequest *req; /* the call's body (lives as long as the call) */
    size_t n;
    variable **vars; /* per item, referenced */
    Psd__V1__StepResult *res;
    Psd__V1__StepResult **resp;
    int dtype; /* of both segments */
    uint64_t pull_total;
    int64_t clock, min_clock;
    /* Table items (StepRequest.table_items), per item: */
    size_t nt;
    server_table **tabs;    /* referenced */
    int64_t **ids;          /* the item's ids, checked as this server's */
    const uint8_t **tgrads; /* push: its gradients in the request's segment */
    Psd__V1__StepResult *tres;
    Psd__V1__StepResult **tresp;
    uint64_t table_pull_total; /* elements of the table rows pulled */
} step_ctx;

static void step_free(step_ctx *k)
{
    for (size_t i = 0; k->vars && i < k->n; i++)
        variable_release(k->vars[i]);
    for (size_t j = 0; k->tabs && j < k->nt; j++)
        server_table_put(k->tabs[j]);
    for (size_t j = 0; k->ids && j < k->nt; j++)
        free(k->ids[j]);
    free(k->tabs);
    free(k->ids);
    free(k->tgrads);
    free(k->tres);
    free(k->tresp);
    free(k->vars);
    free(k->res);
    free(k->resp);
    free(k);
}

static void step_drop(void *arg, bool timed_out)
{
    (void)timed_out;
    step_free(arg);
}

/* The pulls, once the bound allows: every pulled range in item order, each copied under its
 * variable's lock (one consistent range per item, like a Pull). */
static void step_answer(server_state *st, rpc_call *call, void *arg, int64_t min_clock,
                        uint64_t wait_ns)
{
    step_ctx *k = arg;
    const envelope *env = rpc_call_envelope(call);
    for (size_t i = 0; i < k->n; i++) {
        const Psd__V1__StepItem *it = k->req->items[i];
        if (!it->pull)
            continue;
        if (atomic_load(&k->vars[i]->deleted)) {
            rpc_reply_error(call, STATUS_NOT_FOUND, "variable \"%s\" was deleted",
                            k->vars[i]->name);
            step_free(k);
            return;
        }
        if (env->worker_id >= 0)
            sync_record(st, k->vars[i], k->clock, min_clock, wait_ns);
        k->res[i].version = atomic_load(&k->vars[i]->version);
    }
    for (size_t j = 0; j < k->nt; j++) {
        if (k->req->table_items[j]->pull && server_table_deleted(k->tabs[j])) {
            rpc_reply_error(call, STATUS_NOT_FOUND, "table \"%s\" was deleted",
                            server_table_name(k->tabs[j]));
            step_free(k);
            return;
        }
    }
    Psd__V1__StepReply rep = PSD__V1__STEP_REPLY__INIT;
    rep.n_results = k->n;
    rep.results = k->resp;
    rep.n_table_results = k->nt;
    rep.table_results = k->tresp;
    rep.clock = k->clock;
    rep.min_clock = k->min_clock;
    uint8_t *dst =
        rpc_reply_ok_tensor(call, &rep.base, k->dtype, 0, k->pull_total + k->table_pull_total);
    if (dst != NULL) {
        size_t esize = frame_dtype_size(k->dtype);
        for (size_t i = 0; i < k->n; i++) {
            const Psd__V1__StepItem *it = k->req->items[i];
            if (!it->pull)
                continue;
            variable *v = k->vars[i];
            uint64_t first = it->offset - v->offset;
            variable_lock_range(v, first, it->count);
            frame_put_floats(dst, v->params + first, (size_t)it->count, k->dtype);
            variable_unlock_range(v, first, it->count);
            dst += esize * it->count;
        }
        for (size_t j = 0; j < k->nt; j++) {
            const Psd__V1__StepTableItem *ti = k->req->table_items[j];
            if (!ti->pull)
                continue;
            if (server_table_read(k->tabs[j], k->ids[j], ti->n, dst, k->dtype) != 0) {
                rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                                "out of memory reading the rows of table \"%s\"",
                                server_table_name(k->tabs[j]));
                break;
            }
            dst += esize * ti->n * server_table_dim(k->tabs[j]);
        }
    }
    step_free(k);
}

/* Checks every item before anything is applied: a valid name found here, a range this server
 * holds, push or pull set, and segment sizes that add up. Replies with the error and returns
 * false otherwise. */
static bool step_check(server_state *st, rpc_call *call, step_ctx *k)
{
    const envelope *env = rpc_call_envelope(call);
    size_t seglen;
    (void)rpc_call_segment(call, &seglen);
    const Psd__V1__StepRequest *req = k->req;
    if (req->n_items > STEP_MAX_ITEMS || req->n_table_items > STEP_MAX_ITEMS) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "step of %zu items and %zu table items: at most %d of each", req->n_items,
                        req->n_table_items, STEP_MAX_ITEMS);
        return false;
    }
    if (req->advance_clock && (env->worker_id < 0 || env->worker_id >= SERVER_MAX_WORKERS)) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "step with advance_clock needs a worker id in [0, %d), got %d",
                        SERVER_MAX_WORKERS, (int)env->worker_id);
        return false;
    }
    uint64_t push_total = 0;
    for (size_t i = 0; i < req->n_items; i++) {
        const Psd__V1__StepItem *it = req->items[i];
        char err[512];
        if (it->count == 0) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "step item %zu (%s) has count 0", i,
                            QUOTED(err, it->name));
            return false;
        }
        if (!it->push && !it->pull) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "step item %zu (%s) neither pushes nor pulls", i,
                            QUOTED(err, it->name));
            return false;
        }
        int status;
        k->vars[i] = find_range(st, it->name, it->offset, it->count, &status, err, sizeof(err));
        if (k->vars[i] == NULL) {
            rpc_reply_error(call, status, "step item %zu: %s", i, err);
            return false;
        }
        /* Ranges are within a shard (< 2^40 elements each): the sums can't overflow. */
        if (it->push)
            push_total += it->count;
        if (it->pull)
            k->pull_total += it->count;
    }
    size_t esize = frame_dtype_size(k->dtype);
    uint64_t described = env->tensor ? env->tensor->count : 0;
    if ((env->tensor && env->tensor->offset != 0) || (push_total > 0 && seglen == 0) ||
        (k->nt == 0 && (push_total != described || (push_total > 0) != (seglen > 0)))) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "step pushes %llu elements but Envelope.tensor describes %llu at offset "
                        "%llu with %zu segment bytes (it must describe exactly the pushed items' "
                        "gradients, offset 0)",
                        (unsigned long long)push_total, (unsigned long long)described,
                        (unsigned long long)(env->tensor ? env->tensor->offset : 0), seglen);
        return false;
    }
    /* Table items: their ids (and gradients) follow the dense gradients in the segment. */
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    uint64_t at = push_total * esize;
    for (size_t j = 0; j < k->nt; j++) {
        const Psd__V1__StepTableItem *ti = req->table_items[j];
        char err[512];
        if (!ti->push && !ti->pull) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "step table item %zu (%s) neither pushes nor pulls", j,
                            QUOTED(err, ti->name));
            return false;
        }
        int status;
        k->tabs[j] = server_table_get(st, ti->name, &status, err, sizeof(err));
        if (k->tabs[j] == NULL) {
            rpc_reply_error(call, status, "step table item %zu: %s", j, err);
            return false;
        }
        uint64_t dim = server_table_dim(k->tabs[j]);
        if (ti->n == 0 || ti->n > SERVER_TABLE_MAX_IDS) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "step table item %zu (table \"%s\"): n = %llu ids (must be 1..%llu)", j,
                            server_table_name(k->tabs[j]), (unsigned long long)ti->n,
                            (unsigned long long)SERVER_TABLE_MAX_IDS);
            return false;
        }
        uint64_t need = 8 * ti->n + (ti->push ? esize * ti->n * dim : 0);
        if (at > seglen || need > seglen - at) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "step table item %zu (table \"%s\"): the segment ends at byte %zu, "
                            "before its %llu ids%s (from byte %llu)",
                            j, server_table_name(k->tabs[j]), seglen, (unsigned long long)ti->n,
                            ti->push ? " and their gradient rows" : "", (unsigned long long)at);
            return false;
        }
        status = server_table_ids(st, k->tabs[j], seg + at, ti->n, &k->ids[j], err, sizeof(err));
        if (status != STATUS_OK) {
            rpc_reply_error(call, status, "step table item %zu: %s", j, err);
            return false;
        }
        k->tgrads[j] = seg + at + 8 * ti->n;
        /* A non-finite gradient refuses the step before anything of it is applied. */
        for (uint64_t x = 0; ti->push && x < ti->n * dim; x++) {
            float g;
            frame_get_floats(&g, k->tgrads[j] + esize * x, 1, k->dtype);
            if (!isfinite(g)) {
                rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                                "step table item %zu (table \"%s\"): the gradient of id %lld "
                                "(index %llu, element %llu) is not finite: nothing applied",
                                j, server_table_name(k->tabs[j]), (long long)k->ids[j][x / dim],
                                (unsigned long long)(x / dim), (unsigned long long)(x % dim));
                return false;
            }
        }
        at += need;
        if (ti->pull)
            k->table_pull_total += ti->n * dim;
    }
    if (k->nt > 0 && at != seglen) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "step segment is %zu bytes but its items need %llu (dense gradients, then "
                        "each table item's ids and gradient rows)",
                        seglen, (unsigned long long)at);
        return false;
    }
    size_t max = rpc_call_max_message(call);
    if (k->pull_total + k->table_pull_total > (max > 4096 ? max - 4096 : 0) / esize) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "step pulls %llu elements: the reply would exceed max-message-bytes "
                        "(%zu); pull less per step (the client library splits a step into "
                        "messages of chunk-bytes)",
                        (unsigned long long)(k->pull_total + k->table_pull_total), max);
        return false;
    }
    return true;
}

static void handle_step(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const envelope *env = rpc_call_envelope(call);
    step_ctx *k = calloc(1, sizeof(*k));
    Psd__V1__StepRequest *req = (void *)rpc_call_body(call);
    size_t n = req->n_items, nt = req->n_table_items;
    if (k == NULL || (k->vars = calloc(n ? n : 1, sizeof(*k->vars))) == NULL ||
        (k->res = calloc(n ? n : 1, sizeof(*k->res))) == NULL ||
        (k->resp = calloc(n ? n : 1, sizeof(*k->resp))) == NULL ||
        (k->tabs = calloc(nt ? nt : 1, sizeof(*k->tabs))) == NULL ||
        (k->ids = calloc(nt ? nt : 1, sizeof(*k->ids))) == NULL ||
        (k->tgrads = calloc(nt ? nt : 1, sizeof(*k->tgrads))) == NULL ||
        (k->tres = calloc(nt ? nt : 1, sizeof(*k->tres))) == NULL ||
        (k->tresp = calloc(nt ? nt : 1, sizeof(*k->tresp))) == NULL) {
        if (k)
            step_free(k);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for a step of %zu items",
                        n);
        return;
    }
    k->req = req;
    k->n = n;
    k->nt = nt;
    k->dtype = env->tensor ? (int)env->tensor->dtype : PSD__V1__DTYPE__FLOAT32;
    if (!step_check(st, call, k)) {
        step_free(k);
        return;
    }
    /* Pushes, in item order. */
    size_t seglen;
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    size_t esize = frame_dtype_size(k->dtype);
    for (size_t i = 0; i < n; i++) {
        const Psd__V1__StepItem *it = req->items[i];
        psd__v1__step_result__init(&k->res[i]);
        k->resp[i] = &k->res[i];
        k->res[i].restored_version = k->vars[i]->restored_version;
        if (!it->push)
            continue;
        push_in in = {.client = env->client_id,
                      .seq = it->seq,
                      .worker = env->worker_id,
                      .grad = seg,
                      .dtype = k->dtype,
                      .off = it->offset,
                      .cnt = it->count};
        seg += esize * it->count; /* count > 0 (step_check): the segment is there */
        char err[512];
        bool dup = false;
        int rc = push_one(st, k->vars[i], &in, NULL, NULL, 0, &dup, &k->res[i].version, err,
                          sizeof(err));
        k->res[i].duplicate = dup;
        if (rc != STATUS_OK) {
            rpc_reply_error(call, rc, "step item %zu: %s", i, err);
            step_free(k);
            return;
        }
    }
    for (size_t j = 0; j < nt; j++) {
        const Psd__V1__StepTableItem *ti = req->table_items[j];
        psd__v1__step_result__init(&k->tres[j]);
        k->tresp[j] = &k->tres[j];
        if (!ti->push)
            continue;
        char err[768];
        bool dup = false;
        int rc =
            server_table_push(st, k->tabs[j], env->client_id, ti->seq, env->worker_id, k->ids[j],
                              ti->n, k->tgrads[j], k->dtype, &dup, err, sizeof(err));
        k->tres[j].duplicate = dup;
        if (rc != STATUS_OK) {
            rpc_reply_error(call, rc, "step table item %zu: %s", j, err);
            step_free(k);
            return;
        }
    }
    /* The clock, after every push of it. */
    k->clock = env->clock;
    if (req->advance_clock) {
        int64_t min;
        k->clock = sync_clock(st, env->worker_id, env->client_id, env->clock + 1, &min);
        k->min_clock = min == INT64_MAX ? k->clock : min;
    } else {
        int64_t min = sync_min_clock(st);
        k->min_clock = min == INT64_MAX ? k->clock : min;
    }
    /* The pulls, at the clock now recorded: the strictest bound among them decides the wait. */
    int64_t need = INT64_MIN;
    size_t first_pull = n, pulls = 0;
    for (size_t i = 0; i < n; i++) {
        if (!req->items[i]->pull)
            continue;
        pulls++;
        if (first_pull == n)
            first_pull = i;
        int32_t s = k->vars[i]->staleness;
        if (s >= 0 && k->clock - s > need)
            need = k->clock - s;
    }
    const char *first_name = first_pull < n ? k->vars[first_pull]->name : NULL;
    for (size_t j = 0; j < nt; j++) {
        if (!req->table_items[j]->pull)
            continue;
        pulls++;
        if (first_name == NULL)
            first_name = server_table_name(k->tabs[j]);
        int32_t s = server_table_staleness(k->tabs[j]);
        if (s >= 0 && k->clock - s > need)
            need = k->clock - s;
    }
    if (pulls == 0 || need == INT64_MIN) {
        step_answer(st, call, k, sync_min_clock(st), 0);
        return;
    }
    char what[160];
    snprintf(what, sizeof(what), "step pull of \"%.64s\"%s at clock %lld (bound: clock %lld)",
             first_name, pulls > 1 ? " and others" : "", (long long)k->clock, (long long)need);
    sync_wait(st, call, env->worker_id, k->clock, need, what, step_answer, step_drop, k);
}

static void handle_clock(rpc_call *call, void *arg)
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

/* Counters, the workers and per-variable entries: only the variable asked for by name, or at
 * most max_variables (default STATUS_DEFAULT_VARIABLES) in name order and never more than fit
 * in a reply body (rpc_call_max_reply_body); num_variables always counts them all. */
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
    rep.bytes_held = store_bytes(st->vars) + atomic_load(&st->table_bytes);
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
    /* The tables after the variables, in what is left of the body. */
    Psd__V1__TableStatus **ts = NULL;
    size_t nts = 0;
    rep.num_tables = server_tables_count(st);
    if (server_tables_status(st, req->variable, &ts, &nts) == 0) {
        size_t kt = 0;
        for (; kt < nts; kt++) {
            size_t b = entry_bytes(psd__v1__table_status__get_packed_size(ts[kt]));
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
    {PSD__V1__METHOD__ASSIGN, "Assign", &psd__v1__push_request__descriptor, handle_assign,
     RPC_RANGE | RPC_SEGMENT},
    {PSD__V1__METHOD__CLOCK, "Clock", &psd__v1__clock_request__descriptor, handle_clock, RPC_POOL},
    {PSD__V1__METHOD__SERVER_STATUS, "ServerStatus", &psd__v1__server_status_request__descriptor,
     handle_status, 0},
    {PSD__V1__METHOD__CHECKPOINT, "Checkpoint", &psd__v1__checkpoint_request__descriptor,
     handle_checkpoint, RPC_ADMIN},
    {PSD__V1__METHOD__SHUTDOWN, "Shutdown", &psd__v1__shutdown_request__descriptor, handle_shutdown,
     RPC_ADMIN},
    {PSD__V1__METHOD__DELETE_VARIABLE, "DeleteVariable",
     &psd__v1__delete_variable_request__descriptor, handle_delete, RPC_ADMIN},
    {PSD__V1__METHOD__STEP, "Step", &psd__v1__step_request__descriptor, handle_step,
     RPC_MAY_SEGMENT},
    {PSD__V1__METHOD__TABLE_CREATE, "TableCreate", &psd__v1__table_create_request__descriptor,
     handle_table_create, 0},
    {PSD__V1__METHOD__TABLE_LOOKUP, "TableLookup", &psd__v1__table_lookup_request__descriptor,
     handle_table_lookup, 0},
    {PSD__V1__METHOD__TABLE_PULL, "TablePull", &psd__v1__table_pull_request__descriptor,
     handle_table_pull, RPC_SEGMENT},
    {PSD__V1__METHOD__TABLE_PUSH, "TablePush", &psd__v1__table_push_request__descriptor,
     handle_table_push, RPC_SEGMENT},
    {PSD__V1__METHOD__TABLE_EXPORT, "TableExport", &psd__v1__table_export_request__descriptor,
     handle_table_export, RPC_ADMIN | RPC_POOL},
    {PSD__V1__METHOD__REPLICATE, "Replicate", &psd__v1__replicate_request__descriptor,
     replica_handle_replicate, RPC_POOL | RPC_MAY_SEGMENT}, /* its own: the cluster token */
};
const size_t server_methods_len = sizeof(server_methods) / sizeof(server_methods[0]);
