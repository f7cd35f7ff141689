/* Step: a training step's pushes, clock and pulls with this server, in one message. Every
 * item is checked before anything is applied; the pushes go through the update path in item
 * order, then the clock moves, then the pulls are answered once the strictest staleness bound
 * among them allows. */
#include "step_rpc.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dedup.h"
#include "server.h"
#include "slot_gate.h"
#include "status.h"
#include "table_registry.h"
#include "update.h"
#include "util.h"
#include "var_rpc.h"

/* name, quoted for a message: escaped, cut after 64 bytes (never raw client bytes). */
#define QUOTED(buf, name) quote_text((buf), sizeof(buf), (name), 64)

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

/* Whether this server applied the Step (any of its pushes is marked in its window, or the
 * window cannot tell): said with a refusal as moved (Envelope.moved_applied), so that the
 * client resends its parts where its window went with the slots (answered as duplicates
 * there), and otherwise under keys of their own (client/step.c). */
static bool step_applied(server_state *st, const envelope *env, const Psd__V1__StepRequest *req)
{
    for (size_t i = 0; i < req->n_items; i++)
        if (req->items[i]->push && req->items[i]->seq != 0 &&
            dedup_peek(st->dedup, env->client_id, req->items[i]->seq) != DEDUP_NEW)
            return true;
    for (size_t j = 0; j < req->n_table_items; j++)
        if (req->table_items[j]->push && req->table_items[j]->seq != 0 &&
            dedup_peek(st->dedup, env->client_id, req->table_items[j]->seq) != DEDUP_NEW)
            return true;
    return false;
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
    /* Inside the gate no owner of this Step's slots changes: what the window says now holds
     * for the refusal below, if any. */
    if (slot_gate_moved() && step_applied(st, env, req))
        rpc_call_set_moved_applied(call);
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
        if (!slot_gate_step_name(call, st, it->name, it->offset))
            return false; /* moved away: the client resends it to the owner */
        int status;
        k->vars[i] = var_find_range(st, it->name, it->offset, it->count, &status, err, sizeof(err));
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
        if (!slot_gate_step_rows(call, st, ti->name, seg + at, ti->n))
            return false;
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

void handle_step(rpc_call *call, void *arg)
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
        int rc = update_push_one(st, k->vars[i], &in, NULL, NULL, 0, &dup, &k->res[i].version, err,
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
