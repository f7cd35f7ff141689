/* slot_gate.c - the slots a live server refuses while they move and after (slot_gate.h). */
#include "slot_gate.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dedup.h"
#include "log.h"
#include "placement.h"
#include "slots.h"
#include "status.h"
#include "timeutil.h"

/* Failpoint slot-cut-hold (test-failpoint, tests only): a table push this server refused as
 * moved, come back under the same client id and seq (the piece of it that stays here, once the
 * client cut it), waits this long before the gate, so that the next batch of slots can move
 * some of its rows away meanwhile and the piece is refused and cut a second time. */
#define CUT_HOLD_MS 1500
/* Table pushes refused as moved that it remembers, (client id, seq), the latest. */
#define CUT_HOLD_RING 64

static struct {
    atomic_bool on;
    /* Calls inside the gate hold it shared; a freeze takes it exclusive once, to wait for
     * the calls that passed before the batch was frozen. */
    pthread_rwlock_t inside;
    pthread_mutex_t mu; /* guards the frozen batch's identity and the owners' writes */
    uint32_t nslots, nservers;
    uint32_t *owner; /* [nslots], read and written with atomic builtins */
    uint8_t *frozen; /* [nslots], the same */
    atomic_uint nfrozen;
    /* [nslots], the same: slots a batch installed here whose COMMIT has not come yet (the
     * map in the coordinator may give them here already: a client that read it is told to
     * retry, not that they are another server's); nincoming counts them. */
    uint8_t *incoming;
    atomic_uint nincoming;
    atomic_bool moved; /* some slot moved since the start: requests are checked slot by slot */
    atomic_uint_fast64_t version;
    char move_id[128];
    bool cut_hold; /* failpoint slot-cut-hold */
    uint64_t refused[CUT_HOLD_RING][2];
    unsigned nrefused;
} g = {.inside = PTHREAD_RWLOCK_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER};

void slot_gate_failpoint(const char *failpoint)
{
    g.cut_hold = failpoint && strcmp(failpoint, "slot-cut-hold") == 0;
}

/* slot-cut-hold: remembers a table push refused as moved. */
static void cut_hold_note(const envelope *env)
{
    if (!g.cut_hold || env->seq == 0)
        return;
    pthread_mutex_lock(&g.mu);
    uint64_t *e = g.refused[g.nrefused++ % CUT_HOLD_RING];
    e[0] = env->client_id;
    e[1] = env->seq;
    pthread_mutex_unlock(&g.mu);
}

/* slot-cut-hold: a table push refused as moved before, back under the same key, waits. */
static void cut_hold_wait(rpc_call *call)
{
    const envelope *env = rpc_call_envelope(call);
    if (!g.cut_hold || env->method != PSD__V1__METHOD__TABLE_PUSH || env->seq == 0)
        return;
    bool seen = false;
    pthread_mutex_lock(&g.mu);
    for (unsigned i = 0; i < CUT_HOLD_RING && !seen; i++)
        seen = g.refused[i][0] == env->client_id && g.refused[i][1] == env->seq;
    pthread_mutex_unlock(&g.mu);
    if (!seen)
        return;
    log_warn("failpoint slot-cut-hold: holding a table push refused as moved before (client "
             "%016llx seq %llu) for %d ms",
             (unsigned long long)env->client_id, (unsigned long long)env->seq, CUT_HOLD_MS);
    time_sleep_ms(CUT_HOLD_MS);
}

int slot_gate_start(server_state *st, const slots_record *rec)
{
    /* Writers first: a freeze must not wait behind a steady stream of calls. */
    pthread_rwlockattr_t at;
    pthread_rwlockattr_init(&at);
    pthread_rwlockattr_setkind_np(&at, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_destroy(&g.inside);
    pthread_rwlock_init(&g.inside, &at);
    pthread_rwlockattr_destroy(&at);
    uint32_t n = rec->nslots;
    g.owner = malloc((size_t)n * sizeof(uint32_t));
    g.frozen = calloc(n, 1);
    g.incoming = calloc(n, 1);
    if (g.owner == NULL || g.frozen == NULL || g.incoming == NULL) {
        free(g.owner);
        free(g.frozen);
        free(g.incoming);
        g.owner = NULL;
        g.frozen = NULL;
        g.incoming = NULL;
        return -1;
    }
    slot_map m = slots_record_map(rec);
    for (uint32_t s = 0; s < n; s++)
        g.owner[s] = slots_owner(&m, s);
    g.nslots = n;
    g.nservers = rec->nservers;
    atomic_store(&g.version, rec->version);
    if (slots_record_moved(rec)) {
        /* The map st holds points into rec, which main keeps: use the live copy instead. */
        st->slots.nservers = g.nservers;
        st->slots.owner = g.owner;
        atomic_store(&g.moved, true);
    }
    atomic_store(&g.on, true);
    return 0;
}

bool slot_gate_on(void)
{
    return atomic_load(&g.on);
}

uint32_t slot_gate_owner(server_state *st, uint32_t slot)
{
    if (!atomic_load(&g.on) || slot >= g.nslots) {
        slot_map m = server_slots(st);
        return slots_owner(&m, slot);
    }
    return __atomic_load_n(&g.owner[slot], __ATOMIC_ACQUIRE);
}

uint64_t slot_gate_version(void)
{
    return atomic_load(&g.version);
}

int slot_gate_map_copy(const server_state *st, slot_map *out, uint32_t **owner)
{
    *owner = NULL;
    bool on = atomic_load(&g.on);
    if (on)
        pthread_mutex_lock(&g.mu);
    *out = server_slots(st);
    int rc = 0;
    if (out->owner != NULL) {
        *owner = malloc((size_t)out->nslots * sizeof(uint32_t));
        if (*owner == NULL)
            rc = -1;
        else
            for (uint32_t s = 0; s < out->nslots; s++)
                (*owner)[s] = __atomic_load_n(&out->owner[s], __ATOMIC_ACQUIRE);
        out->owner = *owner;
    }
    if (on)
        pthread_mutex_unlock(&g.mu);
    return rc;
}

static bool is_frozen(uint32_t slot)
{
    return __atomic_load_n(&g.frozen[slot], __ATOMIC_ACQUIRE) != 0;
}

static bool is_incoming(uint32_t slot)
{
    return atomic_load(&g.nincoming) > 0 && __atomic_load_n(&g.incoming[slot], __ATOMIC_ACQUIRE);
}

static void refuse_moving(rpc_call *call, uint32_t slot)
{
    rpc_reply_error(call, STATUS_UNAVAILABLE,
                    "slot moving: slot %u is being moved to another server (retry)", slot);
}

static void refuse_moved(rpc_call *call, uint32_t slot, uint32_t to)
{
    uint64_t v = atomic_load(&g.version);
    rpc_call_set_moved(call, to, v);
    rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                    "slot moved: slot %u is held by ps %u since slot map version %llu (re-read "
                    "the slot map and resend there)",
                    slot, to, (unsigned long long)v);
}

/* A variable's request: its name's slot, or for a variable cut in parts the slot of the part
 * holding element `offset` of its range; none when this server holds it split in ranges. */
static bool check_name(rpc_call *call, server_state *st, const char *name, uint64_t offset,
                       bool update)
{
    variable *v = store_find(st->vars, name);
    bool split = v && v->spec->split, parts = v && v->spec->parts;
    if (v)
        variable_release(v);
    if (split && !parts)
        return true;
    uint32_t slot = parts ? slots_of_part(name, placement_part_of(offset), g.nslots)
                          : slots_of_name(name, g.nslots);
    uint32_t owner = __atomic_load_n(&g.owner[slot], __ATOMIC_ACQUIRE);
    bool frozen = update && is_frozen(slot);
    if (owner == st->task_index && !frozen)
        return true;
    if (frozen || (owner != st->task_index && is_incoming(slot))) {
        refuse_moving(call, slot);
        return false;
    }
    if (!atomic_load(&g.moved))
        return true; /* the handler answers as before */
    refuse_moved(call, slot, owner);
    return false;
}

typedef enum rows_verdict { ROWS_HERE, ROWS_MOVING, ROWS_MOVED } rows_verdict;

/* The slot of each of the n ids at seg (8 bytes each, unaligned): all this server's, one
 * frozen (*slot), or one moved away (*slot, to *to). */
static rows_verdict rows_check(server_state *st, const char *name, const uint8_t *seg, uint64_t n,
                               bool update, uint32_t *slot, uint32_t *to)
{
    for (uint64_t i = 0; i < n; i++) {
        int64_t id;
        memcpy(&id, seg + i * 8, 8);
        *slot = slots_of_row(name, id, g.nslots);
        if (update && is_frozen(*slot))
            return ROWS_MOVING;
        *to = __atomic_load_n(&g.owner[*slot], __ATOMIC_ACQUIRE);
        if (*to != st->task_index && is_incoming(*slot))
            return ROWS_MOVING;
        if (*to != st->task_index && atomic_load(&g.moved))
            return ROWS_MOVED;
    }
    return ROWS_HERE;
}

static bool check_rows(rpc_call *call, server_state *st, const char *name, const uint8_t *seg,
                       uint64_t n, bool update)
{
    uint32_t slot = 0, to = 0;
    switch (rows_check(st, name, seg, n, update, &slot, &to)) {
    case ROWS_MOVING:
        refuse_moving(call, slot);
        return false;
    case ROWS_MOVED:
        refuse_moved(call, slot, to);
        return false;
    default:
        return true;
    }
}

/* A table's request: the slot of every id of the segment. A push whose rows moved away is
 * answered moved only when this server's window proves it unapplied here: one applied before
 * its rows moved (its reply lost) goes on to the handler, which answers it as a duplicate (or
 * refuses what it cannot prove new), so that a push refused as moved is known unapplied and
 * the client may send its pieces under keys of their own (client/route_split.c). */
static bool check_ids(rpc_call *call, server_state *st, const char *name, uint64_t n, bool update)
{
    size_t len = 0;
    const uint8_t *seg = rpc_call_segment(call, &len);
    if (name == NULL || seg == NULL || n == 0 || n > len / 8)
        return true; /* malformed: the handler says so */
    uint32_t slot = 0, to = 0;
    switch (rows_check(st, name, seg, n, update, &slot, &to)) {
    case ROWS_MOVING:
        refuse_moving(call, slot);
        return false;
    case ROWS_MOVED: {
        const envelope *env = rpc_call_envelope(call);
        if (update && env->seq != 0 && dedup_peek(st->dedup, env->client_id, env->seq) != DEDUP_NEW)
            return true;
        if (update)
            cut_hold_note(env);
        refuse_moved(call, slot, to);
        return false;
    }
    default:
        return true;
    }
}

bool slot_gate_moved(void)
{
    return atomic_load(&g.on) && atomic_load(&g.moved);
}

/* True when a Step's items need no check: no slot moved, and none is coming here. */
static bool step_unchecked(const char *name)
{
    return !atomic_load(&g.on) || name == NULL ||
           (!atomic_load(&g.moved) && atomic_load(&g.nincoming) == 0);
}

bool slot_gate_step_name(rpc_call *call, server_state *st, const char *name, uint64_t offset)
{
    if (step_unchecked(name))
        return true;
    return check_name(call, st, name, offset, false);
}

bool slot_gate_step_rows(rpc_call *call, server_state *st, const char *name, const uint8_t *ids,
                         uint64_t n)
{
    if (step_unchecked(name))
        return true;
    return check_rows(call, st, name, ids, n, false);
}

static bool check(rpc_call *call, server_state *st)
{
    const envelope *env = rpc_call_envelope(call);
    const ProtobufCMessage *body = rpc_call_body(call);
    if (body == NULL)
        return true;
    uint64_t offset = env->tensor ? env->tensor->offset : 0; /* a part's: its first element */
    switch (env->method) {
    case PSD__V1__METHOD__PUSH:
    case PSD__V1__METHOD__PUSH_PULL:
    case PSD__V1__METHOD__ASSIGN:
        return check_name(call, st, ((const Psd__V1__PushRequest *)body)->name, offset, true);
    case PSD__V1__METHOD__PULL:
        return check_name(call, st, ((const Psd__V1__PullRequest *)body)->name, offset, false);
    case PSD__V1__METHOD__CREATE_VARIABLE: {
        const Psd__V1__CreateVariableRequest *r = (const void *)body;
        if (r->spec == NULL || r->spec->name == NULL || r->spec->split)
            return true;
        return check_name(call, st, r->spec->name, 0, true);
    }
    case PSD__V1__METHOD__TABLE_PUSH: {
        const Psd__V1__TablePushRequest *r = (const void *)body;
        return r->sweep || check_ids(call, st, r->name, r->n, true);
    }
    case PSD__V1__METHOD__TABLE_PULL: {
        const Psd__V1__TablePullRequest *r = (const void *)body;
        return check_ids(call, st, r->name, r->n, false);
    }
    case PSD__V1__METHOD__STEP:
        if (atomic_load(&g.nfrozen) > 0) {
            rpc_reply_error(call, STATUS_UNAVAILABLE,
                            "slot moving: a batch of slots of this server is being moved; "
                            "steps wait until it is done (retry)");
            return false;
        }
        return true;
    default:
        return true;
    }
}

bool slot_gate_enter(rpc_call *call, server_state *st)
{
    if (!atomic_load(&g.on))
        return true;
    cut_hold_wait(call);
    pthread_rwlock_rdlock(&g.inside);
    if (atomic_load(&g.nfrozen) == 0 && !atomic_load(&g.moved))
        return true;
    if (check(call, st))
        return true;
    pthread_rwlock_unlock(&g.inside);
    return false;
}

void slot_gate_leave(void)
{
    if (atomic_load(&g.on))
        pthread_rwlock_unlock(&g.inside);
}

int slot_gate_freeze(server_state *st, const char *move_id, const uint32_t *slots, size_t n,
                     char *err, size_t errlen)
{
    if (!atomic_load(&g.on))
        return snprintf(err, errlen,
                        "this server moves no slots (replicas 1 with a coordinator only)"),
               STATUS_FAILED_PRECONDITION;
    pthread_mutex_lock(&g.mu);
    if (atomic_load(&g.nfrozen) > 0 && strcmp(g.move_id, move_id) != 0) {
        snprintf(err, errlen, "another batch of slots of this server is moving (move %s)",
                 g.move_id);
        pthread_mutex_unlock(&g.mu);
        return STATUS_FAILED_PRECONDITION;
    }
    for (size_t i = 0; i < n; i++) {
        if (slots[i] >= g.nslots || g.owner[slots[i]] != st->task_index) {
            snprintf(err, errlen, "slot %u is not this server's (ps %u) in its map (version %llu)",
                     slots[i], st->task_index, (unsigned long long)atomic_load(&g.version));
            pthread_mutex_unlock(&g.mu);
            return STATUS_FAILED_PRECONDITION;
        }
    }
    unsigned nf = 0;
    for (size_t i = 0; i < n; i++) {
        nf += g.frozen[slots[i]] == 0;
        __atomic_store_n(&g.frozen[slots[i]], 1, __ATOMIC_RELEASE);
    }
    atomic_fetch_add(&g.nfrozen, nf);
    snprintf(g.move_id, sizeof(g.move_id), "%s", move_id);
    pthread_mutex_unlock(&g.mu);
    /* Every call that passed before the batch froze has left once this is had. */
    pthread_rwlock_wrlock(&g.inside);
    pthread_rwlock_unlock(&g.inside);
    return STATUS_OK;
}

void slot_gate_drain(void)
{
    if (!atomic_load(&g.on))
        return;
    pthread_rwlock_wrlock(&g.inside);
    pthread_rwlock_unlock(&g.inside);
}

void slot_gate_unfreeze(void)
{
    if (!atomic_load(&g.on))
        return;
    pthread_mutex_lock(&g.mu);
    for (uint32_t s = 0; s < g.nslots; s++)
        __atomic_store_n(&g.frozen[s], 0, __ATOMIC_RELEASE);
    atomic_store(&g.nfrozen, 0);
    g.move_id[0] = '\0';
    pthread_mutex_unlock(&g.mu);
}

void slot_gate_incoming(const uint32_t *slots, size_t n, bool on)
{
    if (!atomic_load(&g.on))
        return;
    pthread_mutex_lock(&g.mu);
    for (size_t i = 0; i < n; i++) {
        if (slots[i] >= g.nslots || (g.incoming[slots[i]] != 0) == on)
            continue;
        __atomic_store_n(&g.incoming[slots[i]], on ? 1 : 0, __ATOMIC_RELEASE);
        if (on)
            atomic_fetch_add(&g.nincoming, 1);
        else
            atomic_fetch_sub(&g.nincoming, 1);
    }
    pthread_mutex_unlock(&g.mu);
}

void slot_gate_commit(server_state *st, const uint32_t *slots, size_t n, uint32_t to,
                      uint64_t version)
{
    if (!atomic_load(&g.on))
        return;
    pthread_mutex_lock(&g.mu);
    for (size_t i = 0; i < n; i++)
        if (slots[i] < g.nslots)
            __atomic_store_n(&g.owner[slots[i]], to, __ATOMIC_RELEASE);
    if (to >= g.nservers)
        g.nservers = to + 1;
    if (version > atomic_load(&g.version))
        atomic_store(&g.version, version);
    /* From now on the map st's owner checks read is this live one. */
    st->slots.nslots = g.nslots;
    st->slots.nservers = g.nservers;
    __atomic_store_n(&st->slots.owner, g.owner, __ATOMIC_RELEASE);
    atomic_store(&g.moved, true);
    pthread_mutex_unlock(&g.mu);
    slot_gate_incoming(slots, n, false);
    slot_gate_unfreeze();
}
