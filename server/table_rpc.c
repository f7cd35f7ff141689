/* Sparse tables over the wire: the handlers of TableCreate, TableLookup, TablePull, TablePush,
 * TablePrefetch and TableExport (proto/README.md "Sparse tables"), over the registry
 * (table_registry.h). */
#include "table_rpc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "checkpoint.h"
#include "dedup.h"
#include "server.h"
#include "status.h"
#include "table_registry.h"
#include "timeutil.h"
#include "update.h"
#include "util.h"

#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

void handle_table_create(rpc_call *call, void *arg)
{
    server_state *st = arg;
    Psd__V1__TableCreateRequest *req = (void *)rpc_call_body(call);
    Psd__V1__TableSpec *s = req->spec;
    char err[512], q[96];
    if (s == NULL) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "missing table spec");
        return;
    }
    if (!name_valid(s->name, TABLE_MAX_NAME)) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "invalid table name %s: 1 to 255 characters of [A-Za-z0-9_./:-]",
                        QUOTED(q, s->name));
        return;
    }
    if (s->num_servers != st->num_servers) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "table \"%s\": placement computed for %u servers but this cluster has %u "
                        "(client and server cluster specs differ)",
                        s->name, s->num_servers, st->num_servers);
        return;
    }
    /* float32 rows are stored as unspecified: one spec whichever way a client says it. */
    if (s->dtype == PSD__V1__DTYPE__FLOAT32)
        s->dtype = PSD__V1__DTYPE__DTYPE_UNSPECIFIED;
    bool from_default = s->staleness == -2;
    if (from_default)
        s->staleness = st->default_staleness;
    if (s->staleness < -1 || s->staleness > 1000000) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": staleness %d (use -1 async, 0 BSP, 1..1000000 SSP, -2 "
                        "the server's default)",
                        s->name, (int)s->staleness);
        return;
    }
    if (s->staleness == 0 && strlen(s->name) > BSP_MAX_NAME) {
        /* Its aggregate is a table named name + BSP_SUFFIX. */
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%.64s...\": staleness 0 (BSP%s) needs a name of at most %d "
                        "characters (%zu given)",
                        s->name, from_default ? ", this server's default-staleness" : "",
                        BSP_MAX_NAME, strlen(s->name));
        return;
    }
    variable *v = store_find(st->vars, s->name);
    if (v != NULL) {
        variable_release(v);
        rpc_reply_error(call, STATUS_ALREADY_EXISTS,
                        "\"%s\" is a dense variable on ps %u, not a table", s->name,
                        st->task_index);
        return;
    }
    table_spec ts;
    int rc = registry_table_spec(s, &ts, err, sizeof(err));
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return;
    }
    Psd__V1__TableCreateReply rep = PSD__V1__TABLE_CREATE_REPLY__INIT;
    registry_budget(&ts, st);
    table_entry *e = registry_find(st, s->name);
    if (e == NULL) {
        size_t held = registry_held(st);
        if (held >= SERVER_MAX_TABLES) {
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "cannot create table \"%s\": ps %u holds %zu tables, the most allowed",
                            s->name, st->task_index, held);
            return;
        }
        table *t = NULL;
        rc = table_create(&ts, &t, err, sizeof(err));
        if (rc != TABLE_OK) {
            rpc_reply_error(
                call, rc == TABLE_INVALID ? STATUS_INVALID_ARGUMENT : STATUS_RESOURCE_EXHAUSTED,
                "cannot create table \"%s\": %s%s", s->name,
                rc == TABLE_NOMEM ? "out of memory" : err,
                rc == TABLE_LIMIT ? " (max-server-bytes: " BUDGET_FULL_HINT ")" : "");
            return;
        }
        bool created;
        e = registry_add_created(st, t, s, &created);
        rep.created = created;
        if (e == NULL) {
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "cannot create table \"%s\": out of memory", s->name);
            return;
        }
    }
    if (!registry_spec_equal(e->spec, s)) {
        rpc_reply_error(call, STATUS_ALREADY_EXISTS,
                        "table \"%s\" exists with another spec (dim %u, optimizer %d; requested "
                        "dim %u, optimizer %d)",
                        s->name, e->spec->dim, (int)e->spec->optimizer, s->dim, (int)s->optimizer);
        registry_put(e);
        return;
    }
    /* Acknowledged once durable: a crash must not lose a table a client was told of. */
    checkpointer *ck = checkpointer_of(st);
    if (ck == NULL ||
        !checkpointer_await_table_create(ck, call, e->create_gen, s->name, rep.created))
        rpc_reply_ok(call, &rep.base);
    registry_put(e);
}

/* The table a call names, referenced; NULL after replying NOT_FOUND (saying so when the name
 * is a dense variable). */
static table_entry *resolve_table(server_state *st, rpc_call *call, const char *name)
{
    char err[512];
    int status;
    table_entry *e = server_table_get(st, name, &status, err, sizeof(err));
    if (e == NULL)
        rpc_reply_error(call, status, "%s", err);
    return e;
}

/* What a request with ids carries and answers (table_ids). */
typedef enum { IDS_PULL, IDS_PUSH, IDS_PREFETCH } ids_kind;

/* Checks a TablePull/TablePush/TablePrefetch's n and segment (ids, then for a push n rows of
 * gradients in the segment's dtype, FLOAT32 or BFLOAT16: the frame layer refused any other),
 * copies the ids (aligned) into *ids_out and checks this server owns each. Replies with the
 * error and returns false otherwise. */
static bool table_ids(server_state *st, rpc_call *call, table_entry *e, uint64_t n, ids_kind kind,
                      int64_t **ids_out, const uint8_t **grads_out)
{
    const bool push = kind == IDS_PUSH;
    const char *name = table_name(e->t);
    uint64_t dim = table_dim(e->t);
    const envelope *env = rpc_call_envelope(call);
    char err[512];
    if (n == 0 || n > SERVER_TABLE_MAX_IDS) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "table \"%s\": n = %llu ids (must be 1..%llu per request)", name,
                        (unsigned long long)n, (unsigned long long)SERVER_TABLE_MAX_IDS);
        return false;
    }
    size_t esize = frame_dtype_size(env->tensor->dtype);
    size_t seglen;
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    uint64_t want = 8 * n + (push ? esize * n * dim : 0);
    if (seglen != want) {
        if (push)
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": segment is %zu bytes, but n = %llu ids and rows of "
                            "dim %llu need %llu (8 x n bytes of ids, then %zu x n x dim of "
                            "gradients)",
                            name, seglen, (unsigned long long)n, (unsigned long long)dim,
                            (unsigned long long)want, esize);
        else
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "table \"%s\": ids segment is %zu bytes, but n = %llu ids need 8 x n "
                            "= %llu",
                            name, seglen, (unsigned long long)n, (unsigned long long)want);
        return false;
    }
    if (kind == IDS_PULL && esize * n * dim + 4096 > rpc_call_max_message(call)) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "table \"%s\": %llu rows of dim %llu would exceed max-message-bytes (%zu) "
                        "in the reply; pull fewer ids per request",
                        name, (unsigned long long)n, (unsigned long long)dim,
                        rpc_call_max_message(call));
        return false;
    }
    int rc = server_table_ids(st, e, seg, n, ids_out, err, sizeof(err));
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return false;
    }
    if (grads_out)
        *grads_out = seg + 8 * n;
    return true;
}

void handle_table_lookup(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TableLookupRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    if (e == NULL)
        return;
    Psd__V1__TableLookupReply rep = PSD__V1__TABLE_LOOKUP_REPLY__INIT;
    rep.spec = e->spec;
    rpc_reply_ok(call, &rep.base);
    registry_put(e);
}

/* A TablePull's ids and table, held until its rows are read (now, or when the staleness bound
 * allows). */
typedef struct table_pull_wait {
    table_entry *e;
    int64_t *ids;
    uint64_t n;
} table_pull_wait;

static void table_pull_drop(void *arg, bool timed_out)
{
    (void)timed_out;
    table_pull_wait *w = arg;
    free(w->ids);
    registry_put(w->e);
    free(w);
}

static void table_pull_answer(server_state *st, rpc_call *call, void *arg, int64_t min_clock,
                              uint64_t wait_ns)
{
    (void)st, (void)min_clock, (void)wait_ns;
    table_pull_wait *w = arg;
    if (atomic_load(&w->e->deleted)) {
        rpc_reply_error(call, STATUS_NOT_FOUND, "table \"%s\" was deleted", table_name(w->e->t));
    } else {
        int dtype = rpc_call_envelope(call)->tensor->dtype;
        size_t count = (size_t)w->n * table_dim(w->e->t);
        Psd__V1__TablePullReply rep = PSD__V1__TABLE_PULL_REPLY__INIT;
        uint8_t *dst = rpc_reply_ok_tensor(call, &rep.base, dtype, 0, count);
        if (dst != NULL && server_table_read(w->e, w->ids, w->n, dst, dtype) != 0)
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for rows");
    }
    table_pull_drop(w, false);
}

void handle_table_pull(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePullRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    if (e == NULL)
        return;
    if (!table_ids(st, call, e, req->n, IDS_PULL, &ids, NULL)) {
        registry_put(e);
        return;
    }
    table_pull_wait *w = malloc(sizeof(*w));
    if (w == NULL) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for a pull");
        free(ids);
        registry_put(e);
        return;
    }
    *w = (table_pull_wait){e, ids, req->n};
    const envelope *env = rpc_call_envelope(call);
    int32_t bound = e->spec->staleness;
    if (bound < 0) {
        table_pull_answer(st, call, w, 0, 0);
        return;
    }
    /* SSP: like a dense pull, at clock c it waits until every live worker reached c - s. */
    char what[160];
    snprintf(what, sizeof(what), "pull of table \"%.64s\" at clock %lld (bound: clock %lld)",
             table_name(e->t), (long long)env->clock, (long long)(env->clock - bound));
    sync_wait(st, call, env->worker_id, env->clock, env->clock - bound, what, table_pull_answer,
              table_pull_drop, w);
}

void handle_table_push(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePushRequest *req = (const void *)rpc_call_body(call);
    const envelope *env = rpc_call_envelope(call);
    if (req->sweep && !rpc_call_trusted(call)) {
        rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                        "table push: sweep is internal to replication (a replicated group's "
                        "primary logs its tables' expiry); it is not a client's request");
        return;
    }
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    const uint8_t *grads;
    if (e == NULL)
        return;
    if (req->sweep) {
        /* Held against a checkpoint's copy like an update. */
        store_update_begin(st->vars);
        table_sweep(e->t, (int64_t)time_op_ms());
        store_update_end(st->vars);
        registry_put(e);
        Psd__V1__TablePushReply rep = PSD__V1__TABLE_PUSH_REPLY__INIT;
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (env->seq != 0 && dedup_peek(st->dedup, env->client_id, env->seq) == DEDUP_DUPLICATE) {
        /* Applied here already (its reply lost): answered from the window before the ids'
         * owners are checked, since some of its rows may have moved away since (the slot gate
         * lets such a resend through rather than refuse it as moved). */
        registry_put(e);
        atomic_fetch_add(&st->duplicates_dropped, 1);
        Psd__V1__TablePushReply rep = PSD__V1__TABLE_PUSH_REPLY__INIT;
        rep.duplicate = true;
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (!table_ids(st, call, e, req->n, IDS_PUSH, &ids, &grads)) {
        registry_put(e);
        return;
    }
    char err[768];
    bool dup;
    int rc = server_table_push(st, e, env->client_id, env->seq, env->worker_id, ids, req->n, grads,
                               env->tensor->dtype, &dup, err, sizeof(err));
    free(ids);
    registry_put(e);
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "%s", err);
        return;
    }
    Psd__V1__TablePushReply rep = PSD__V1__TABLE_PUSH_REPLY__INIT;
    rep.duplicate = dup;
    rpc_reply_ok(call, &rep.base);
}

void handle_table_prefetch(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TablePrefetchRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    int64_t *ids;
    if (e == NULL)
        return;
    if (!table_ids(st, call, e, req->n, IDS_PREFETCH, &ids, NULL)) {
        registry_put(e);
        return;
    }
    /* No staleness wait: it reads no row out, and changes no parameter. */
    Psd__V1__TablePrefetchReply rep = PSD__V1__TABLE_PREFETCH_REPLY__INIT;
    rep.cold = table_prefetch(e->t, ids, (size_t)req->n);
    free(ids);
    registry_put(e);
    rpc_reply_ok(call, &rep.base);
}

/* TableExport (psctl dump): a page of this server's rows, ids then rows in the segment. */
static void export_page(rpc_call *call, const Psd__V1__TableExportRequest *req, table_entry *e)
{
    uint64_t dim = table_dim(e->t), per = 8 + 4 * dim;
    size_t room = rpc_call_max_message(call);
    uint64_t fit = room > 4096 ? (room - 4096) / per : 0;
    uint64_t max = req->max_rows && req->max_rows < fit ? req->max_rows : fit;
    if (max > SERVER_TABLE_MAX_IDS)
        max = SERVER_TABLE_MAX_IDS;
    if (max == 0) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "table \"%s\": a row of dim %llu does not fit in max-message-bytes (%zu)",
                        table_name(e->t), (unsigned long long)dim, room);
        return;
    }
    int64_t *ids = malloc((size_t)max * sizeof(*ids));
    float *rows = malloc((size_t)max * dim * sizeof(float));
    if (ids == NULL || rows == NULL) {
        free(ids);
        free(rows);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory for %llu rows",
                        (unsigned long long)max);
        return;
    }
    uint64_t cursor = req->cursor;
    size_t n = table_export(e->t, &cursor, (size_t)max, ids, rows);
    Psd__V1__TableExportReply rep = PSD__V1__TABLE_EXPORT_REPLY__INIT;
    rep.n = n;
    rep.done = cursor == UINT64_MAX;
    rep.next_cursor = rep.done ? 0 : cursor;
    rep.dim = (uint32_t)dim;
    /* count: the segment's length in 4-byte words (ids, then rows), as for the table calls. */
    uint8_t *dst =
        rpc_reply_ok_tensor(call, &rep.base, PSD__V1__DTYPE__FLOAT32, 0, (uint64_t)n * (2 + dim));
    if (dst != NULL) {
        memcpy(dst, ids, n * 8);
        memcpy(dst + n * 8, rows, n * dim * sizeof(float));
    }
    free(ids);
    free(rows);
}

void handle_table_export(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__TableExportRequest *req = (const void *)rpc_call_body(call);
    table_entry *e = resolve_table(st, call, req->name);
    if (e == NULL)
        return;
    export_page(call, req, e);
    registry_put(e);
}
