/* slot_move_rpc.c - SLOT_MOVE and SLOT_INSTALL (slot_move_rpc.h). */
#include "slot_move_rpc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpointer.h"
#include "log.h"
#include "rpc_oneshot.h"
#include "server.h"
#include "slot_gate.h"
#include "slot_move.h"
#include "slot_start.h"
#include "status.h"
#include "timeutil.h"

/* Time a batch's package may take to reach its target and be installed (made durable there
 * too, with a checkpoint-dir): the batch's slots stay frozen meanwhile, and clients wait for
 * them within their own deadlines. */
#define INSTALL_DEADLINE_MS 20000
/* Failpoint slot-move-hold (test-failpoint, tests only): a source whose target answered the
 * install waits this long before it answers the SEND, with a log line ("failpoint
 * slot-move-hold: holding move ID"), so that a test kills the source, psctl or etcd inside a
 * batch (installed on the target, frozen here, the map not flipped) without racing it. */
#define HOLD_MS 3000

static struct {
    slot_move_config cfg;
    atomic_uint_fast64_t started, finished, failed, bytes;
    pthread_mutex_t token_mu;
    char token[80];
    /* The target's staged snapshot (pre-copy): the move, its source and slots, that a
     * package of changes applies over. stage_id "" when none. Under token_mu. */
    char stage_id[104];
    uint32_t stage_from;
    uint32_t *stage_slots;
    size_t stage_n;
} m = {.token_mu = PTHREAD_MUTEX_INITIALIZER};

/* Notes (id non-NULL) or forgets (NULL) the snapshot staged here. Returns 0, or -1 when
 * memory can't be had (nothing noted). */
static int stage_note(const char *id, uint32_t from, const uint32_t *slots, size_t n)
{
    uint32_t *copy = NULL;
    if (id != NULL && (copy = malloc(n * sizeof(uint32_t))) == NULL)
        return -1;
    if (copy != NULL)
        memcpy(copy, slots, n * sizeof(uint32_t));
    pthread_mutex_lock(&m.token_mu);
    free(m.stage_slots);
    m.stage_slots = copy;
    m.stage_n = copy ? n : 0;
    m.stage_from = from;
    snprintf(m.stage_id, sizeof(m.stage_id), "%s", id ? id : "");
    pthread_mutex_unlock(&m.token_mu);
    return 0;
}

/* True when the snapshot staged here is the one of move id from `from` for these slots. */
static bool stage_is(const char *id, uint32_t from, const uint32_t *slots, size_t n)
{
    pthread_mutex_lock(&m.token_mu);
    bool same = m.stage_id[0] != '\0' && strcmp(m.stage_id, id) == 0 && m.stage_from == from &&
                m.stage_n == n && memcmp(m.stage_slots, slots, n * sizeof(uint32_t)) == 0;
    pthread_mutex_unlock(&m.token_mu);
    return same;
}

void slot_move_rpc_init(const slot_move_config *cfg)
{
    m.cfg = *cfg;
}

void slot_move_stats_get(slot_move_stats *out)
{
    out->started = atomic_load(&m.started);
    out->finished = atomic_load(&m.finished);
    out->failed = atomic_load(&m.failed);
    out->bytes = atomic_load(&m.bytes);
}

/* The cluster token into buf (read from etcd once). Returns 0, or -1 with why in err. */
static int token(char *buf, size_t cap, char *err, size_t errlen)
{
    pthread_mutex_lock(&m.token_mu);
    int rc = 0;
    if (m.token[0] == '\0')
        rc = slot_cluster_token(m.cfg.endpoints, m.cfg.prefix, m.token, sizeof(m.token), err,
                                errlen);
    if (rc == 0)
        snprintf(buf, cap, "%s", m.token);
    pthread_mutex_unlock(&m.token_mu);
    return rc;
}

/* The batch's bitmap (nslots bits) from a request's slot list: NULL with a reply sent when the
 * list is empty, too long, unordered or out of range. */
static uint64_t *batch_bits(rpc_call *call, const uint32_t *slots, size_t n, uint32_t nslots)
{
    bool ok = n > 0 && n <= nslots;
    for (size_t i = 0; ok && i < n; i++)
        ok = slots[i] < nslots && (i == 0 || slots[i] > slots[i - 1]);
    if (!ok) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "a batch lists 1 to %u slots, ascending, each below %u (this one: %zu)",
                        nslots, nslots, n);
        return NULL;
    }
    uint64_t *bits = calloc(nslots / 64 ? nslots / 64 : 1, sizeof(uint64_t));
    if (bits == NULL) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    slot_set_mark(bits, nslots, slots, n);
    return bits;
}

/* Sends the package pkg of len bytes to the batch's target at `stage`
 * (PSD__V1__SLOT_INSTALL_REQUEST__STAGE__*), no faster than the request's cap. *staged: the
 * target staged it (a SNAPSHOT, on a target that knows the stages). Returns the install's
 * status, with why in err. */
static int install_on(const Psd__V1__SlotMoveRequest *rq, const char *tok, int stage,
                      const uint8_t *pkg, size_t len, bool *staged, char *err, size_t errlen)
{
    if (rq->max_bytes_per_second > 0) {
        /* The cap: the batch takes at least its size over the cap (one batch is sent at once;
         * psctl sends the next one after). */
        double s = (double)len / (double)rq->max_bytes_per_second;
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    Psd__V1__SlotInstallRequest ir = PSD__V1__SLOT_INSTALL_REQUEST__INIT;
    ir.move_id = rq->move_id;
    ir.from = rq->from;
    ir.slots = rq->slots;
    ir.n_slots = rq->n_slots;
    ir.stage = stage;
    rpc_oneshot_reply r;
    int rc = rpc_oneshot(rq->to_address, &m.cfg.tls, PSD__V1__METHOD__SLOT_INSTALL, &ir.base, pkg,
                         len, tok, INSTALL_DEADLINE_MS, &r);
    if (rc != STATUS_OK)
        snprintf(err, errlen, "target ps %u (%s): %s", rq->to, rq->to_address, r.message);
    *staged = false;
    if (rc == STATUS_OK && r.body != NULL) {
        Psd__V1__SlotInstallReply *rep =
            psd__v1__slot_install_reply__unpack(NULL, r.body_len, r.body);
        *staged = rep != NULL && rep->staged;
        if (rep)
            psd__v1__slot_install_reply__free_unpacked(rep, NULL);
    }
    free(r.body);
    return rc;
}

/* What a batch's SEND sent: its snapshot (pre-copy) and what went under the freeze. */
typedef struct sent {
    slot_move_counts snap, frozen;
    bool staged;    /* the target staged the snapshot: the freeze sent its changes */
    uint64_t ns[5]; /* snapshot (export and install), freeze, export, install: ns each */
} sent;

/* Pre-copy: the batch as it is now, sent to the target while it still takes updates, staged
 * there. *since_ms: the time the changes after it are counted from. Returns 0 (s->staged
 * false when the target does not stage: the batch then goes whole under the freeze), or a
 * STATUS_* with why in err (nothing frozen). */
static int send_snapshot(server_state *st, const Psd__V1__SlotMoveRequest *rq, const uint64_t *bits,
                         const char *tok, int64_t *since_ms, sent *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < rq->n_slots; i++)
        if (slot_gate_owner(st, rq->slots[i]) != st->task_index)
            return snprintf(err, errlen,
                            "slot %u is not this server's (ps %u) in its map "
                            "(version %llu)",
                            rq->slots[i], st->task_index, (unsigned long long)slot_gate_version()),
                   STATUS_FAILED_PRECONDITION;
    uint64_t t0 = time_now_ns();
    /* Every update applied from here on is stamped at or after since_ms: it goes again with
     * the changes, whichever rows the snapshot's copy saw before or after it. */
    *since_ms = (int64_t)time_wall_forward_ms();
    slot_gate_drain();
    uint8_t *pkg = NULL;
    size_t len = 0;
    int rc = slot_move_export_snapshot(st, bits, &pkg, &len, &s->snap, err, errlen);
    uint64_t t1 = time_now_ns();
    if (rc == STATUS_OK)
        rc = install_on(rq, tok, PSD__V1__SLOT_INSTALL_REQUEST__STAGE__SNAPSHOT, pkg, len,
                        &s->staged, err, errlen);
    free(pkg);
    s->ns[0] = t1 - t0;
    s->ns[1] = time_now_ns() - t1;
    return rc;
}

/* Under the freeze: the batch's changes since the snapshot when the target staged one, else
 * (or when the target lost it: a restart) the whole batch. */
static int send_frozen(server_state *st, const Psd__V1__SlotMoveRequest *rq, const uint64_t *bits,
                       const char *tok, int64_t since_ms, sent *s, char *err, size_t errlen)
{
    for (int whole = !s->staged; whole < 2; whole++) {
        uint8_t *pkg = NULL;
        size_t len = 0;
        uint64_t t0 = time_now_ns();
        int rc = whole ? slot_move_export(st, bits, &pkg, &len, &s->frozen, err, errlen)
                       : slot_move_export_changes(st, bits, since_ms, &pkg, &len, &s->frozen, err,
                                                  errlen);
        uint64_t t1 = time_now_ns();
        bool staged;
        if (rc == STATUS_OK)
            rc = install_on(rq, tok,
                            whole ? PSD__V1__SLOT_INSTALL_REQUEST__STAGE__WHOLE
                                  : PSD__V1__SLOT_INSTALL_REQUEST__STAGE__CHANGES,
                            pkg, len, &staged, err, errlen);
        free(pkg);
        s->ns[3] += t1 - t0;
        s->ns[4] += time_now_ns() - t1;
        if (rc == STATUS_FAILED_PRECONDITION && !whole) {
            log_warn("move %s: ps %u holds no snapshot of the batch (%s): sending it whole",
                     rq->move_id, rq->to, err);
            s->staged = false;
            continue;
        }
        return rc;
    }
    return STATUS_INTERNAL; /* not reached */
}

static void send_batch(rpc_call *call, server_state *st, const Psd__V1__SlotMoveRequest *rq,
                       const uint64_t *bits)
{
    char err[2048];
    if (rq->from != st->task_index || rq->to == st->task_index || rq->to_address == NULL ||
        rq->to_address[0] == '\0') {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "SEND goes to the batch's source (ps %u here) and names another target "
                        "with its address (from %u, to %u)",
                        st->task_index, rq->from, rq->to);
        return;
    }
    atomic_fetch_add(&m.started, 1);
    sent s = {0};
    char tok[80];
    int64_t since_ms = 0;
    int rc = token(tok, sizeof(tok), err, sizeof(err)) != 0 ? STATUS_UNAVAILABLE : STATUS_OK;
    if (rc == STATUS_OK)
        rc = send_snapshot(st, rq, bits, tok, &since_ms, &s, err, sizeof(err));
    if (rc != STATUS_OK) {
        atomic_fetch_add(&m.failed, 1);
        log_warn("move %s: %zu slots to ps %u not sent, they stay here: %s", rq->move_id,
                 rq->n_slots, rq->to, err);
        rpc_reply_error(call, rc, "move %s: %s", rq->move_id, err);
        return;
    }
    uint64_t t0 = time_now_ns();
    rc = slot_gate_freeze(st, rq->move_id, rq->slots, rq->n_slots, err, sizeof(err));
    if (rc != STATUS_OK) {
        atomic_fetch_add(&m.failed, 1);
        rpc_reply_error(call, rc, "move %s: %s", rq->move_id, err);
        return;
    }
    s.ns[2] = time_now_ns() - t0;
    rc = send_frozen(st, rq, bits, tok, since_ms, &s, err, sizeof(err));
    uint64_t frozen_ns = time_now_ns() - t0;
    if (rc == STATUS_OK && m.cfg.failpoint && strcmp(m.cfg.failpoint, "slot-move-hold") == 0) {
        log_warn("failpoint slot-move-hold: holding move %s (%zu slots installed on ps %u, "
                 "frozen here) for %d ms",
                 rq->move_id, rq->n_slots, rq->to, HOLD_MS);
        nanosleep(&(struct timespec){HOLD_MS / 1000, (HOLD_MS % 1000) * 1000000L}, NULL);
    }
    if (rc != STATUS_OK) {
        slot_gate_unfreeze();
        atomic_fetch_add(&m.failed, 1);
        log_warn("move %s: %zu slots to ps %u not sent, they stay here: %s", rq->move_id,
                 rq->n_slots, rq->to, err);
        rpc_reply_error(call, rc, "move %s: %s", rq->move_id, err);
        return;
    }
    uint64_t snap_bytes = s.staged ? s.snap.bytes : 0, len = s.frozen.bytes;
    atomic_fetch_add(&m.bytes, snap_bytes + len);
    log_info("move %s: sent %zu slots to ps %u (%s): %llu rows, %llu variables, %llu bytes "
             "(%llu exactly-once windows); they stay frozen until the map gives them there "
             "(snapshot %llu bytes, %llu rows: export %.1f ms, install %.1f ms; frozen %llu "
             "bytes, %llu rows: freeze %.1f ms, export %.1f ms, install %.1f ms)",
             rq->move_id, rq->n_slots, rq->to, rq->to_address,
             (unsigned long long)(s.staged ? s.frozen.ids : s.frozen.rows),
             (unsigned long long)s.frozen.variables, (unsigned long long)(snap_bytes + len),
             (unsigned long long)s.frozen.windows, (unsigned long long)snap_bytes,
             (unsigned long long)(s.staged ? s.snap.rows : 0), (double)s.ns[0] / 1e6,
             (double)s.ns[1] / 1e6, (unsigned long long)len, (unsigned long long)s.frozen.rows,
             (double)s.ns[2] / 1e6, (double)s.ns[3] / 1e6, (double)s.ns[4] / 1e6);
    Psd__V1__SlotMoveReply rep = PSD__V1__SLOT_MOVE_REPLY__INIT;
    rep.rows = s.staged ? s.frozen.ids : s.frozen.rows;
    rep.variables = s.frozen.variables;
    rep.windows = s.frozen.windows;
    rep.bytes = snap_bytes + len;
    rep.snapshot_bytes = snap_bytes;
    rep.frozen_bytes = len;
    rep.snapshot_rows = s.staged ? s.snap.rows : 0;
    rep.frozen_rows = s.frozen.rows;
    rep.frozen_us = frozen_ns / 1000;
    rpc_reply_ok(call, &rep.base);
}

void handle_slot_move(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__SlotMoveRequest *rq = (const void *)rpc_call_body(call);
    if (!slot_gate_on()) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "this server moves no slots: slots move between the servers of a "
                        "cluster with a coordinator and replicas 1");
        return;
    }
    if (rq->move_id == NULL || rq->move_id[0] == '\0' || strlen(rq->move_id) > 100) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "a move names its id (1 to 100 bytes)");
        return;
    }
    uint32_t nslots = server_slots(st).nslots;
    uint64_t *bits = batch_bits(call, rq->slots, rq->n_slots, nslots);
    if (bits == NULL)
        return;
    switch (rq->phase) {
    case PSD__V1__SLOT_MOVE_REQUEST__PHASE__SEND:
        send_batch(call, st, rq, bits);
        break;
    case PSD__V1__SLOT_MOVE_REQUEST__PHASE__COMMIT: {
        if (rq->to == st->task_index) {
            stage_note(NULL, 0, NULL, 0);
            slot_move_unstage();
        }
        bool source =
            slot_gate_owner(st, rq->slots[0]) == st->task_index && rq->to != st->task_index;
        slot_gate_commit(st, rq->slots, rq->n_slots, rq->to, rq->version);
        if (source) {
            uint64_t gone = slot_move_drop(st, bits);
            atomic_fetch_add(&m.finished, 1);
            log_info("move %s: %zu slots are ps %u's since slot map version %llu: dropped %llu "
                     "rows and variables here",
                     rq->move_id, rq->n_slots, rq->to, (unsigned long long)rq->version,
                     (unsigned long long)gone);
        }
        Psd__V1__SlotMoveReply rep = PSD__V1__SLOT_MOVE_REPLY__INIT;
        rpc_reply_ok(call, &rep.base);
        break;
    }
    case PSD__V1__SLOT_MOVE_REQUEST__PHASE__ABORT: {
        if (rq->from == st->task_index)
            slot_gate_unfreeze();
        if (rq->to == st->task_index) {
            stage_note(NULL, 0, NULL, 0); /* a staged snapshot goes too */
            slot_move_unstage();
            slot_gate_incoming(rq->slots, rq->n_slots, false);
            /* What an install left of slots this server does not hold. */
            for (size_t i = 0; i < rq->n_slots; i++)
                if (slot_gate_owner(st, rq->slots[i]) == st->task_index)
                    bits[rq->slots[i] / 64] &= ~(UINT64_C(1) << (rq->slots[i] % 64));
            slot_move_drop(st, bits);
        }
        log_info("move %s: %zu slots from ps %u to ps %u rolled back", rq->move_id, rq->n_slots,
                 rq->from, rq->to);
        Psd__V1__SlotMoveReply rep = PSD__V1__SLOT_MOVE_REPLY__INIT;
        rpc_reply_ok(call, &rep.base);
        break;
    }
    default:
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "SLOT_MOVE: unknown phase %d",
                        (int)rq->phase);
    }
    free(bits);
}

/* With a checkpoint-dir, the installed batch is made durable before the install is answered,
 * so before the map can give it here: a checkpoint holding it (its slot map still the source's;
 * a restore keeps the rows the map in etcd gives this server). Returns 0, or -1 with why. */
static int durable(server_state *st, const Psd__V1__SlotInstallRequest *rq, char *err,
                   size_t errlen)
{
    checkpointer *ck = checkpointer_of(st);
    if (ck == NULL)
        return 0;
    checkpoint_info info;
    char why[768];
    if (checkpoint_write(ck, &info, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "the installed batch could not be made durable here (ps %u): %s",
                 st->task_index, why);
        return -1;
    }
    log_info("move %s: the %zu slots from ps %u are durable in checkpoint %llu", rq->move_id,
             rq->n_slots, rq->from, (unsigned long long)info.seq);
    return 0;
}

void handle_slot_install(rpc_call *call, void *arg)
{
    server_state *st = arg;
    const Psd__V1__SlotInstallRequest *rq = (const void *)rpc_call_body(call);
    if (!slot_gate_on()) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION, "this server moves no slots");
        return;
    }
    char tok[80], err[1024];
    if (token(tok, sizeof(tok), err, sizeof(err)) != 0) {
        rpc_reply_error(call, STATUS_UNAVAILABLE, "cannot read the cluster token: %s", err);
        return;
    }
    if (!rpc_call_carries_token(call, tok)) {
        log_warn("refused SLOT_INSTALL without the cluster token (a server-to-server method)");
        rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                        "SLOT_INSTALL is a server-to-server method: the request does not carry "
                        "the cluster token that the servers read from the coordinator");
        return;
    }
    uint32_t nslots = server_slots(st).nslots;
    uint64_t *bits = batch_bits(call, rq->slots, rq->n_slots, nslots);
    if (bits == NULL)
        return;
    for (size_t i = 0; i < rq->n_slots; i++)
        if (slot_gate_owner(st, rq->slots[i]) == st->task_index) {
            rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                            "move %s: slot %u is this server's (ps %u) already", rq->move_id,
                            rq->slots[i], st->task_index);
            free(bits);
            return;
        }
    bool snapshot = rq->stage == PSD__V1__SLOT_INSTALL_REQUEST__STAGE__SNAPSHOT;
    bool changes = rq->stage == PSD__V1__SLOT_INSTALL_REQUEST__STAGE__CHANGES;
    if (!snapshot && !changes && rq->stage != PSD__V1__SLOT_INSTALL_REQUEST__STAGE__WHOLE) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT, "move %s: SLOT_INSTALL: unknown stage %d",
                        rq->move_id, (int)rq->stage);
        free(bits);
        return;
    }
    if (changes && !stage_is(rq->move_id, rq->from, rq->slots, rq->n_slots)) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "move %s: no snapshot of these %zu slots from ps %u is staged here (ps "
                        "%u): send the batch whole",
                        rq->move_id, rq->n_slots, rq->from, st->task_index);
        free(bits);
        return;
    }
    size_t len = 0;
    const uint8_t *seg = rpc_call_segment(call, &len);
    if (changes != slot_move_is_changes(seg, len)) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "move %s: SLOT_INSTALL: stage %s with a package of %s", rq->move_id,
                        changes ? "CHANGES" : "SNAPSHOT or WHOLE",
                        changes ? "a whole batch" : "changes");
        free(bits);
        return;
    }
    /* A new install replaces whatever was staged (its rows are dropped by the install). */
    stage_note(NULL, 0, NULL, 0);
    slot_move_counts cnt;
    int rc = snapshot ? slot_move_stage(st, rq->from, bits, seg, len, &cnt, err, sizeof(err))
                      : slot_move_install(st, rq->from, bits, seg, len, &cnt, err, sizeof(err));
    if (rc == STATUS_OK && snapshot) {
        /* Staged: not durable, not served (the map does not give the slots here yet). */
        if (stage_note(rq->move_id, rq->from, rq->slots, rq->n_slots) != 0) {
            slot_move_drop(st, bits);
            rc = STATUS_RESOURCE_EXHAUSTED;
            snprintf(err, sizeof(err), "out of memory");
        }
        free(bits);
        if (rc != STATUS_OK) {
            rpc_reply_error(call, rc, "move %s: %s", rq->move_id, err);
            return;
        }
        log_info("move %s: staged a snapshot of %zu slots from ps %u: %llu rows, %llu variables",
                 rq->move_id, rq->n_slots, rq->from, (unsigned long long)cnt.rows,
                 (unsigned long long)cnt.variables);
        Psd__V1__SlotInstallReply rep = PSD__V1__SLOT_INSTALL_REPLY__INIT;
        rep.rows = cnt.rows;
        rep.variables = cnt.variables;
        rep.staged = true;
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (rc == STATUS_OK && durable(st, rq, err, sizeof(err)) != 0) {
        /* Not durable here: the source keeps the batch (it answers the SEND with this). */
        slot_move_drop(st, bits);
        rc = STATUS_UNAVAILABLE;
    }
    free(bits);
    if (rc != STATUS_OK) {
        rpc_reply_error(call, rc, "move %s: %s", rq->move_id, err);
        return;
    }
    /* Until its COMMIT (or ABORT): a request for them is told to retry, not sent back. */
    slot_gate_incoming(rq->slots, rq->n_slots, true);
    log_info("move %s: installed %zu slots from ps %u: %llu rows, %llu variables", rq->move_id,
             rq->n_slots, rq->from, (unsigned long long)cnt.rows,
             (unsigned long long)cnt.variables);
    Psd__V1__SlotInstallReply rep = PSD__V1__SLOT_INSTALL_REPLY__INIT;
    rep.rows = cnt.rows;
    rep.variables = cnt.variables;
    rpc_reply_ok(call, &rep.base);
}
