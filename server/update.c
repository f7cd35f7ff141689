/* The update path: a push of a dense range (Push, PushPull, Assign, a Step's items) or of a
 * sparse table's rows (TablePush, a Step's table items) is made exactly once by (client, seq)
 * through the dedup window, then applied by the optimizer (or summed into a BSP aggregate),
 * held against a checkpoint's copy from the dedup mark through the update. */
#include "update.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "server.h"
#include "status.h"
#include "table_bsp.h"
#include "timeutil.h"
#include "var_rpc.h"

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

/* ---- dense variables ---- */

int update_push_one(server_state *st, variable *v, const push_in *in, push_reply_fn reply,
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
        dedup_refusal(d, in->client, in->seq, floor, err, errlen);
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

/* Push and push-pull: update_push_one, and the reply. */
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
    int rc = update_push_one(st, v, &in, reply_params ? push_pull_reply_alloc : NULL, &r,
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
    variable *v = var_resolve_range(st, call, req->name);
    if (v == NULL)
        return;
    push_apply(call, st, v, reply_params, assign);
    variable_release(v);
}

void handle_push(rpc_call *call, void *arg)
{
    push_common(call, arg, false, false);
}

void handle_assign(rpc_call *call, void *arg)
{
    push_common(call, arg, false, true);
}

void handle_push_pull(rpc_call *call, void *arg)
{
    push_common(call, arg, true, false);
}

/* ---- sparse tables ---- */

int server_table_push(server_state *st, server_table *e, uint64_t client, uint64_t seq,
                      int32_t worker, const int64_t *ids, uint64_t n, const uint8_t *grads,
                      int dtype, bool *duplicate, char *errbuf, size_t errlen)
{
    char err[512];
    const char *name = table_name(e->t);
    *duplicate = false;
    /* A BFLOAT16 gradient is widened before the dedup mark (nothing is held meanwhile). */
    float *wide = NULL;
    if (dtype != PSD__V1__DTYPE__FLOAT32) {
        size_t count = (size_t)n * table_dim(e->t);
        wide = malloc(count * sizeof(float));
        if (wide == NULL) {
            snprintf(errbuf, errlen, "table \"%s\": out of memory for %llu gradient rows", name,
                     (unsigned long long)n);
            return STATUS_RESOURCE_EXHAUSTED;
        }
        frame_get_floats(wide, grads, count, dtype);
        grads = (const uint8_t *)wide;
    }
    store_update_begin(st->vars);
    uint64_t floor = 0;
    dedup_result d = dedup_begin_floor(st->dedup, client, seq, &floor);
    if (d != DEDUP_NEW && d != DEDUP_DUPLICATE) {
        store_update_end(st->vars);
        free(wide);
        dedup_refusal(d, client, seq, floor, errbuf, errlen);
        return STATUS_ABORTED;
    }
    if (worker >= 0)
        sync_heard(st, worker);
    int64_t now = (int64_t)time_op_ms();
    int rc = TABLE_OK;
    bool bsp = e->spec->staleness == 0 && worker >= 0;
    if (d == DEDUP_NEW && bsp) {
        /* BSP: summed into the aggregate, applied once every live worker passed this clock. */
        rc = table_bsp_add(st, e, ids, (size_t)n, (const float *)(const void *)grads, now, err,
                           sizeof(err));
        if (rc == TABLE_INVALID)
            dedup_unmark(st->dedup, client, seq);
    } else if (d == DEDUP_NEW) {
        rc = table_push(e->t, ids, (size_t)n, grads, now, err, sizeof(err));
        if (rc == TABLE_INVALID)
            dedup_unmark(st->dedup, client, seq); /* nothing was applied */
    } else {
        atomic_fetch_add(&st->duplicates_dropped, 1);
    }
    store_update_end(st->vars);
    free(wide);
    if (rc == TABLE_INVALID) {
        snprintf(errbuf, errlen, "table \"%s\": %s: the batch was refused, nothing applied", name,
                 err);
        return STATUS_INVALID_ARGUMENT;
    }
    if (rc == TABLE_OVERFLOW) {
        /* The other rows were applied (the dedup mark stays: a resend is a duplicate). */
        snprintf(errbuf, errlen, "table \"%s\": %s", name, err);
        return STATUS_FAILED_PRECONDITION;
    }
    if (rc != TABLE_OK) {
        snprintf(errbuf, errlen, "table \"%s\": %s%s", name,
                 rc == TABLE_NOMEM ? "out of memory" : err,
                 rc == TABLE_LIMIT ? " (max-server-bytes: " BUDGET_FULL_HINT ")" : "");
        return STATUS_RESOURCE_EXHAUSTED;
    }
    if (d == DEDUP_NEW && !bsp) /* a BSP push counts when its aggregate is applied */
        atomic_fetch_add(&st->updates_applied, 1);
    *duplicate = d == DEDUP_DUPLICATE;
    /* ttl_ms: expired rows are swept on a push, at most once a second per table (a replica
     * group's, by the sweeps its primary logs). */
    int64_t last = atomic_load(&e->last_sweep_ms);
    if (e->spec->ttl_ms > 0 && !st->replicated && now - last >= 1000 &&
        atomic_compare_exchange_strong(&e->last_sweep_ms, &last, now))
        table_sweep(e->t, now);
    return STATUS_OK;
}
