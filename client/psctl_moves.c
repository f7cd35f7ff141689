/* psctl add-server, remove-server, rebalance (psctl_moves.h).
 *
 * One batch: record the move in etcd (PREFIX/moves/current: "id=ID from=F to=T updated_ms=MS
 * owner=HOST:PID slots=S1,S2,..."; owner may be absent in records of older psctl), SLOT_MOVE SEND
 * to the source (it sends a snapshot of the batch to the target, freezes the batch and sends
 * what changed since), a status call to the target (a target whose process changed since before
 * the SEND, or that does not answer, may not hold what it installed: the batch is rolled back),
 * flip the slot map by CAS
 * (slots_apply: version + 1), SLOT_MOVE COMMIT to the target, the source and every other server,
 * delete the record. A failure before the flip: ABORT to both (the source serves the slots again,
 * the target drops what it installed) and the record deleted; after it, the move is done and a
 * rerun sends the COMMITs again. A record updated in the last MOVE_STALE_MS is another psctl's
 * running move, unless its owner is a process of this host that is gone (a psctl killed mid-move:
 * the rerun resumes at once). */
#include "psctl_moves.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psctl_view.h"
#include "rpc_client.h"
#include "rpc_oneshot.h"
#include "slots_plan.h"
#include "slots_record.h"
#include "status.h"
#include "view_etcd.h"

/* A move record updated this recently belongs to a psctl still running. */
#define MOVE_STALE_MS 30000
/* Deadline of a SEND (the source sends the batch to the target within it), and of a
 * COMMIT or ABORT (a server that does not answer is down: the ABORT's target lost what it
 * installed with it; the COMMIT's learns the map at its restart). */
#define MOVE_SEND_MS 180000
#define MOVE_PHASE_MS 10000
/* While a SEND runs, the source is asked for its status every MOVE_PROBE_MS: MOVE_PROBES
 * unanswered in a row fail the SEND (the source died; it is not waited for until the SEND's
 * deadline), and the SEND's connection is closed, so nothing resends it to the source if it
 * comes back. */
#define MOVE_PROBE_MS 2000
#define MOVE_PROBES 3
/* How long a batch whose flip got no answer waits for etcd to say whether it took. */
#define MOVE_ETCD_WAIT_MS 10000

typedef struct mover {
    etcd_client *etcd;
    char prefix[512];
    char key[600];
    char token[256];
    rpc_tls tls;
    const psctl_move_opts *mo;
    /* The map as this run last wrote or read it, and its mod revision in etcd. */
    slots_record map;
    int64_t map_rev;
    bool have_map;
    int64_t rec_rev; /* mod revision of the record this run wrote last (0: none) */
    bool keep_rec;   /* a batch left the record for a rerun */
    int64_t ms[4];   /* the last batch's phases: record, SEND, flip, COMMITs (ms) */
    /* The process of the last batch's target as its check after the SEND found it (its
     * Envelope.server_instance; 0: none yet): the next batch to that target starts from it
     * rather than asking again. */
    uint32_t last_to;
    uint64_t last_inst;
} mover;

typedef struct move_rec {
    char id[64];
    char owner[300]; /* HOST:PID of the psctl that wrote it ("" in older records) */
    /* The run it is a batch of ("" and 0 in older records): its command, the slots of the run
     * moved before this batch, the run's slots in all, the bytes moved before it. */
    char cmd[32];
    size_t run_done, run_total;
    uint64_t run_bytes;
    uint32_t from, to;
    uint32_t *slots;
    size_t n;
    int64_t updated_ms;
} move_rec;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *rec_text(const move_rec *r)
{
    size_t cap = 500 + r->n * 6;
    char *t = malloc(cap);
    if (t == NULL)
        return NULL;
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    int k = snprintf(t, cap,
                     "id=%s from=%u to=%u updated_ms=%" PRId64 " owner=%s:%ld run=%s:%zu/%zu "
                     "bytes=%" PRIu64 " slots=",
                     r->id, r->from, r->to, r->updated_ms, host[0] ? host : "?", (long)getpid(),
                     r->cmd[0] ? r->cmd : "?", r->run_done, r->run_total, r->run_bytes);
    for (size_t i = 0; i < r->n; i++)
        k += snprintf(t + k, cap - (size_t)k, "%s%u", i ? "," : "", r->slots[i]);
    return t;
}

/* Parses a record; false when it is not one. */
static bool rec_parse(const char *t, size_t len, move_rec *r)
{
    memset(r, 0, sizeof(*r));
    char *s = strndup(t, len);
    if (s == NULL)
        return false;
    const char *sl = strstr(s, " slots=");
    int64_t up = 0;
    bool ok = sl && sscanf(s, "id=%63s from=%u to=%u updated_ms=%" SCNd64, r->id, &r->from, &r->to,
                           &up) == 4;
    r->updated_ms = up;
    const char *ow = ok ? strstr(s, " owner=") : NULL;
    if (ow && ow < sl)
        snprintf(r->owner, sizeof(r->owner), "%.*s", (int)strcspn(ow + 7, " "), ow + 7);
    const char *run = ok ? strstr(s, " run=") : NULL;
    if (run && run < sl) {
        size_t cl = strcspn(run + 5, ":");
        snprintf(r->cmd, sizeof(r->cmd), "%.*s", (int)(cl < sizeof(r->cmd) ? cl : 0), run + 5);
        if (sscanf(run + 5 + cl, ":%zu/%zu bytes=%" SCNu64, &r->run_done, &r->run_total,
                   &r->run_bytes) != 3)
            r->cmd[0] = '\0';
    }
    if (ok) {
        r->slots = malloc(SLOTS_DEFAULT * sizeof(uint32_t));
        ok = r->slots != NULL;
        for (const char *p = sl + 7; ok && *p;) {
            char *end;
            unsigned long v = strtoul(p, &end, 10);
            ok = end != p && r->n < SLOTS_DEFAULT && v < SLOTS_DEFAULT;
            if (ok)
                r->slots[r->n++] = (uint32_t)v;
            p = *end == ',' ? end + 1 : end;
            ok = ok && (*end == ',' || *end == '\0');
        }
        ok = ok && r->n > 0;
    }
    free(s);
    if (!ok) {
        free(r->slots);
        r->slots = NULL;
    }
    return ok;
}

/* The SLOT_MOVE request of r's phase into *rq (it points into r). */
static void slot_request(const mover *m, int phase, const move_rec *r, const char *to_addr,
                         uint64_t version, Psd__V1__SlotMoveRequest *rq)
{
    *rq = (Psd__V1__SlotMoveRequest)PSD__V1__SLOT_MOVE_REQUEST__INIT;
    rq->phase = phase;
    rq->move_id = (char *)r->id;
    rq->slots = r->slots;
    rq->n_slots = r->n;
    rq->from = r->from;
    rq->to = r->to;
    rq->to_address = (char *)(to_addr ? to_addr : "");
    rq->version = version;
    rq->max_bytes_per_second = m->mo->max_bytes_per_second;
}

/* True when the server at addr answers a status call (whatever its status); its process's
 * instance (Envelope.server_instance: a restart changes it) into *instance if not NULL. */
static bool server_answers(mover *m, const char *addr, uint64_t *instance)
{
    Psd__V1__ServerStatusRequest rq = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    rq.max_variables = 1;
    rpc_oneshot_reply out;
    int rc = rpc_oneshot(addr, &m->tls, PSD__V1__METHOD__SERVER_STATUS, &rq.base, NULL, 0, m->token,
                         MOVE_PROBE_MS, &out);
    free(out.body);
    if (instance)
        *instance = out.server_instance;
    return rc != STATUS_UNAVAILABLE && rc != STATUS_DEADLINE_EXCEEDED && rc != STATUS_CANCELLED;
}

/* One SLOT_MOVE call to addr. Returns its status, the reply in *rep (may be NULL). */
static int slot_call(mover *m, const char *addr, int phase, const move_rec *r, const char *to_addr,
                     uint64_t version, Psd__V1__SlotMoveReply **rep, char *msg, size_t cap)
{
    Psd__V1__SlotMoveRequest rq;
    slot_request(m, phase, r, to_addr, version, &rq);
    rpc_oneshot_reply out;
    int rc;
    if (phase == PSD__V1__SLOT_MOVE_REQUEST__PHASE__SEND) {
        /* Watched: a source that dies mid-batch would otherwise hold psctl for the whole
         * deadline (a lost connection is redialed and the request resent until then). */
        rpc_oneshot_call *c = NULL;
        rc = rpc_oneshot_start(addr, &m->tls, PSD__V1__METHOD__SLOT_MOVE, &rq.base, NULL, 0,
                               m->token, MOVE_SEND_MS, &out, &c);
        int lost = 0;
        while (rc == STATUS_OK && !rpc_oneshot_wait(c, MOVE_PROBE_MS) && lost < MOVE_PROBES)
            lost = server_answers(m, addr, NULL) ? 0 : lost + 1;
        if (rc == STATUS_OK)
            rc = rpc_oneshot_end(c);
        if (lost >= MOVE_PROBES) {
            rc = STATUS_UNAVAILABLE;
            snprintf(out.message, sizeof(out.message),
                     "the source stopped answering during the SEND (%d probes in a row, %d s "
                     "apart, got no answer)",
                     MOVE_PROBES, MOVE_PROBE_MS / 1000);
        }
    } else {
        rc = rpc_oneshot(addr, &m->tls, PSD__V1__METHOD__SLOT_MOVE, &rq.base, NULL, 0, m->token,
                         MOVE_PHASE_MS, &out);
    }
    snprintf(msg, cap, "%s", out.message);
    if (rep)
        *rep = rc == STATUS_OK && out.body
                   ? psd__v1__slot_move_reply__unpack(NULL, out.body_len, out.body)
                   : NULL;
    free(out.body);
    return rc;
}

/* COMMIT of r at version to every server of map: the target first (so that the source,
 * once it refuses the batch as moved, sends clients to a target that serves it), then the
 * source and every other server at once. Returns the number of the target's and source's
 * calls that failed (each tried 3 times). */
static int commit_all(mover *m, const slots_record *map, const move_rec *r, uint64_t version)
{
    char msg[1024];
    int failed = 0, rc = STATUS_UNAVAILABLE;
    for (int tries = 0; tries < 3 && rc != STATUS_OK; tries++)
        rc = slot_call(m, map->addr[r->to], PSD__V1__SLOT_MOVE_REQUEST__PHASE__COMMIT, r, NULL,
                       version, NULL, msg, sizeof(msg));
    if (rc != STATUS_OK) {
        fprintf(stderr, "psctl: move %s: COMMIT to ps %u (%s): %s\n", r->id, r->to,
                map->addr[r->to], msg);
        failed++;
    }
    uint32_t n = map->nservers;
    rpc_oneshot_call **calls = calloc(n, sizeof(*calls));
    rpc_oneshot_reply *outs = calloc(n, sizeof(*outs));
    int *rcs = calloc(n, sizeof(*rcs));
    Psd__V1__SlotMoveRequest rq;
    slot_request(m, PSD__V1__SLOT_MOVE_REQUEST__PHASE__COMMIT, r, NULL, version, &rq);
    for (uint32_t i = 0; i < n; i++) {
        if (i == r->to)
            continue;
        if (calls == NULL || outs == NULL || rcs == NULL) {
            if (rcs)
                rcs[i] = STATUS_RESOURCE_EXHAUSTED;
            continue;
        }
        rcs[i] = rpc_oneshot_start(map->addr[i], &m->tls, PSD__V1__METHOD__SLOT_MOVE, &rq.base,
                                   NULL, 0, m->token, MOVE_PHASE_MS, &outs[i], &calls[i]);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (i == r->to)
            continue;
        if (calls && calls[i]) {
            while (!rpc_oneshot_wait(calls[i], 60000))
                ;
            rcs[i] = rpc_oneshot_end(calls[i]);
        }
        snprintf(msg, sizeof(msg), "%s", outs ? outs[i].message : "out of memory");
        if (outs)
            free(outs[i].body);
        rc = rcs ? rcs[i] : STATUS_RESOURCE_EXHAUSTED;
        for (int tries = 1; i == r->from && tries < 3 && rc != STATUS_OK; tries++)
            rc = slot_call(m, map->addr[i], PSD__V1__SLOT_MOVE_REQUEST__PHASE__COMMIT, r, NULL,
                           version, NULL, msg, sizeof(msg));
        if (rc == STATUS_OK)
            continue;
        if (i == r->from) {
            fprintf(stderr, "psctl: move %s: COMMIT to ps %u (%s): %s\n", r->id, i, map->addr[i],
                    msg);
            failed++;
        } else {
            fprintf(stderr,
                    "psctl: move %s: COMMIT to ps %u (%s): %s (it learns the map at its "
                    "restart)\n",
                    r->id, i, map->addr[i], msg);
        }
    }
    free(calls);
    free(outs);
    free(rcs);
    return failed;
}

static void abort_both(mover *m, const slots_record *map, const move_rec *r)
{
    char msg[1024];
    uint32_t who[2] = {r->from, r->to};
    for (int k = 0; k < 2; k++)
        if (who[k] < map->nservers &&
            slot_call(m, map->addr[who[k]], PSD__V1__SLOT_MOVE_REQUEST__PHASE__ABORT, r, NULL, 0,
                      NULL, msg, sizeof(msg)) != STATUS_OK)
            fprintf(stderr, "psctl: move %s: ABORT to ps %u (%s): %s\n", r->id, who[k],
                    map->addr[who[k]], msg);
}

/* True when map gives every slot of r to r->to. */
static bool flipped(const slots_record *map, const move_rec *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (map->owner[r->slots[i]] != r->to)
            return false;
    return true;
}

/* True when the record's owner is a process of this host that no longer runs. */
static bool owner_gone(const move_rec *r)
{
    const char *colon = strrchr(r->owner, ':');
    char host[256] = "";
    if (colon == NULL || gethostname(host, sizeof(host) - 1) != 0 ||
        strncmp(r->owner, host, (size_t)(colon - r->owner)) != 0 || host[colon - r->owner] != '\0')
        return false;
    char *end;
    long pid = strtol(colon + 1, &end, 10);
    return pid > 0 && *end == '\0' && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

void psctl_move_describe(const char *rec, size_t len, char *out, size_t cap)
{
    move_rec r;
    if (!rec_parse(rec, len, &r)) {
        snprintf(out, cap, "%.*s (not a move record)", (int)(len < 200 ? len : 200), rec);
        return;
    }
    double age = (double)(wall_ms() - r.updated_ms) / 1000.0;
    int k = snprintf(out, cap, "move %s: %zu slots ps %u -> ps %u", r.id, r.n, r.from, r.to);
    if (r.cmd[0] && k > 0 && (size_t)k < cap)
        k += snprintf(out + k, cap - (size_t)k,
                      ", a batch of psctl %s (%zu/%zu slots moved before it, %.1f MiB)", r.cmd,
                      r.run_done, r.run_total, (double)r.run_bytes / 1048576.0);
    if (k > 0 && (size_t)k < cap)
        snprintf(out + k, cap - (size_t)k, "; psctl %s, recorded %.1f s ago%s",
                 r.owner[0] ? r.owner : "?", age,
                 age >= MOVE_STALE_MS / 1000.0 || owner_gone(&r)
                     ? " (its psctl is gone: a rerun finishes or rolls it back)"
                     : "");
    free(r.slots);
}

/* A record left by a psctl that stopped: finished (the map flipped: COMMITs again) or rolled
 * back. Returns 0, 1 (failed), or 2 (another psctl's move is running). */
static int resume(mover *m)
{
    char *val = NULL, err[2048];
    size_t len = 0;
    int64_t rev = 0;
    int rc = etcd_get(m->etcd, m->key, &val, &len, &rev, err, sizeof(err));
    if (rc == ETCD_ENOTFOUND)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "psctl: %s: %s\n", m->key, err);
        return 1;
    }
    move_rec r;
    bool ok = rec_parse(val, len, &r);
    free(val);
    if (!ok) {
        fprintf(stderr, "psctl: %s holds no move record (delete the key if nothing moves)\n",
                m->key);
        return 1;
    }
    int64_t age = wall_ms() - r.updated_ms;
    if (age < MOVE_STALE_MS && owner_gone(&r)) {
        printf("move %s: its psctl (%s) is gone: resuming it\n", r.id, r.owner);
    } else if (age < MOVE_STALE_MS) {
        fprintf(stderr,
                "psctl: a move is already running (move %s: %zu slots from ps %u to ps %u, "
                "updated %" PRId64 " ms ago): wait for it, or rerun %d s after its psctl "
                "stopped to finish or roll it back\n",
                r.id, r.n, r.from, r.to, age, MOVE_STALE_MS / 1000);
        free(r.slots);
        return 2;
    }
    slots_record map;
    rc = slots_etcd_read(m->etcd, m->prefix, &map, NULL, err, sizeof(err));
    if (rc != 0 || r.from >= map.nservers || r.to >= map.nservers) {
        fprintf(stderr, "psctl: resuming move %s: %s\n", r.id,
                rc ? err : "its servers are not in the slot map");
        if (rc == 0)
            slots_record_free(&map);
        free(r.slots);
        return 1;
    }
    int out = 0;
    if (flipped(&map, &r)) {
        printf("move %s: the map gave its %zu slots to ps %u (version %" PRIu64 "): finishing it\n",
               r.id, r.n, r.to, map.version);
        out = commit_all(m, &map, &r, map.version) ? 1 : 0;
    } else {
        printf("move %s: not committed: rolling it back (its %zu slots stay on ps %u)\n", r.id, r.n,
               r.from);
        abort_both(m, &map, &r);
    }
    if (out == 0 && etcd_delete(m->etcd, m->key, err, sizeof(err)) != 0) {
        fprintf(stderr, "psctl: %s: %s\n", m->key, err);
        out = 1;
    }
    slots_record_free(&map);
    free(r.slots);
    return out;
}

/* The progress line on stderr: slots moved of the plan's, bytes, rate (rewritten in place on
 * a terminal, one line per batch otherwise). */
static void progress_err(const char *cmd, size_t done, size_t total, uint64_t bytes,
                         int64_t elapsed_ms)
{
    double s = elapsed_ms > 0 ? (double)elapsed_ms / 1000.0 : 0.001;
    bool tty = isatty(STDERR_FILENO);
    fprintf(stderr, "%spsctl: %s: %zu/%zu slots moved, %.1f MiB, %.1f MiB/s, %.1f s%s",
            tty ? "\r" : "", cmd, done, total, (double)bytes / 1048576.0,
            (double)bytes / 1048576.0 / s, s, tty && done < total ? "" : "\n");
    fflush(stderr);
}

static void progress(const psctl_move_opts *mo, size_t done, size_t total, size_t b, size_t nb,
                     const move_rec *r, const Psd__V1__SlotMoveReply *rep, uint64_t version,
                     const int64_t ms[4])
{
    int pct = total ? (int)(done * 100 / total) : 100;
    unsigned long long rows = rep ? (unsigned long long)rep->rows : 0;
    unsigned long long vars = rep ? (unsigned long long)rep->variables : 0;
    unsigned long long bytes = rep ? (unsigned long long)rep->bytes : 0;
    if (mo->json) {
        printf("{\"batch\":%zu,\"batches\":%zu,\"slots\":%zu,\"from\":%u,\"to\":%u,\"rows\":%llu,"
               "\"variables\":%llu,\"windows\":%llu,\"bytes\":%llu,\"version\":%" PRIu64
               ",\"percent\":%d,"
               "\"ms\":{\"record\":%" PRId64 ",\"send\":%" PRId64 ",\"flip\":%" PRId64
               ",\"commit\":%" PRId64 ",\"frozen\":%.1f},\"snapshot_bytes\":%llu,"
               "\"frozen_bytes\":%llu,\"snapshot_rows\":%llu,\"frozen_rows\":%llu}\n",
               b, nb, r->n, r->from, r->to, rows, vars,
               rep ? (unsigned long long)rep->windows : 0ULL, bytes, version, pct, ms[0], ms[1],
               ms[2], ms[3], rep ? (double)rep->frozen_us / 1000.0 + (double)(ms[2] + ms[3]) : 0.0,
               rep ? (unsigned long long)rep->snapshot_bytes : 0ULL,
               rep ? (unsigned long long)rep->frozen_bytes : 0ULL,
               rep ? (unsigned long long)rep->snapshot_rows : 0ULL,
               rep ? (unsigned long long)rep->frozen_rows : 0ULL);
    } else if (isatty(STDOUT_FILENO)) {
        char bar[31];
        int fill = pct * 30 / 100;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : ' ';
        bar[30] = '\0';
        printf("\r[%s] %3d%%  batch %zu/%zu: %zu slots ps %u -> ps %u, %llu rows, %llu "
               "variables, %llu bytes%s",
               bar, pct, b, nb, r->n, r->from, r->to, rows, vars, bytes, b == nb ? "\n" : "");
    } else {
        printf("batch %zu/%zu: %zu slots ps %u -> ps %u: %llu rows, %llu variables, %llu bytes, "
               "map version %" PRIu64 " (%d%%)\n",
               b, nb, r->n, r->from, r->to, rows, vars, bytes, version, pct);
    }
    fflush(stdout);
}

/* Moves one batch. Returns 0, or 1 (rolled back, or committed but not every COMMIT landed).
 * Per batch, etcd sees two writes: the record (overwriting the previous batch's, by CAS on
 * its revision) and the map's CAS; the map is read once per run (again only when a CAS finds
 * it changed). The record is deleted once the run ends (psctl_moves), unless a batch left it
 * for a rerun. */
static int move_batch(mover *m, move_rec *r, const Psd__V1__SlotMoveReply **rep_out,
                      uint64_t *version)
{
    char err[2048], msg[1024];
    int64_t t0 = mono_ms();
    if (!m->have_map) {
        if (slots_etcd_read(m->etcd, m->prefix, &m->map, &m->map_rev, err, sizeof(err)) != 0) {
            fprintf(stderr, "psctl: move %s: %s\n", r->id, err);
            return 1;
        }
        m->have_map = true;
    }
    slots_record *map = &m->map;
    r->updated_ms = wall_ms();
    char *text = rec_text(r);
    int64_t nrev = 0;
    int rc =
        text ? etcd_cas(m->etcd, m->key, m->rec_rev, text, strlen(text), &nrev, err, sizeof(err))
             : ETCD_EFAILED;
    free(text);
    if (rc != 0) {
        fprintf(stderr, "psctl: move %s: cannot record it in %s: %s\n", r->id, m->key,
                rc == ETCD_ECONFLICT ? "another move was recorded meanwhile" : err);
        if (rc == ETCD_ECONFLICT)
            m->rec_rev = 0; /* not ours to delete */
        return 1;
    }
    m->rec_rev = nrev;
    int64_t t1 = mono_ms();
    Psd__V1__SlotMoveReply *rep = NULL;
    /* The target's process before the SEND and after it: one that restarted in between (before
     * the flip) restored without the batch, as its map did not give it the slots, so the flip
     * would give it slots it does not hold. Before: as the previous batch to the same target
     * left it (a restart since then rolls this batch back too), else asked. */
    uint64_t inst0 = m->last_to == r->to ? m->last_inst : 0, inst1 = 0;
    m->last_inst = 0;
    if (inst0 == 0 && (!server_answers(m, map->addr[r->to], &inst0) || inst0 == 0)) {
        snprintf(msg, sizeof(msg), "the target does not answer (nothing sent)");
        rc = STATUS_UNAVAILABLE;
    } else {
        rc = slot_call(m, map->addr[r->from], PSD__V1__SLOT_MOVE_REQUEST__PHASE__SEND, r,
                       map->addr[r->to], 0, &rep, msg, sizeof(msg));
    }
    if (rc == STATUS_OK && !server_answers(m, map->addr[r->to], &inst1)) {
        snprintf(msg, sizeof(msg),
                 "the target stopped answering once it had installed them (what it installed "
                 "may be gone with it)");
        rc = STATUS_UNAVAILABLE;
    } else if (rc == STATUS_OK && inst1 != inst0) {
        snprintf(msg, sizeof(msg),
                 "the target restarted during the batch (its process %016llx before the SEND, "
                 "%016llx after): what it installed is gone",
                 (unsigned long long)inst0, (unsigned long long)inst1);
        rc = STATUS_UNAVAILABLE;
    } else if (rc == STATUS_OK) {
        m->last_to = r->to;
        m->last_inst = inst1;
    }
    int64_t t2 = mono_ms(), t3 = t2;
    *rep_out = rep;
    if (rc != STATUS_OK) {
        fprintf(stderr,
                "psctl: move %s: %zu slots from ps %u (%s) to ps %u (%s) failed: %s: "
                "rolled back, they stay on ps %u\n",
                r->id, r->n, r->from, map->addr[r->from], r->to, map->addr[r->to], msg, r->from);
        abort_both(m, map, r);
        return 1;
    }
    /* The flip: only this CAS decides who holds the slots. */
    for (int tries = 0;; tries++) {
        slot_move mv[SLOTS_DEFAULT];
        for (size_t i = 0; i < r->n; i++)
            mv[i] = (slot_move){r->slots[i], r->from, r->to};
        if (!slots_apply(map, mv, r->n)) {
            snprintf(err, sizeof(err),
                     "the slot map changed under the move (a slot is no longer ps %u's)", r->from);
            rc = -1;
            break;
        }
        rc = slots_etcd_cas(m->etcd, m->prefix, map, m->map_rev, &nrev, err, sizeof(err));
        if (rc == 0)
            m->map_rev = nrev;
        if (rc != ETCD_ECONFLICT || tries >= 20)
            break;
        slots_record_free(map); /* a server joined meanwhile: read and apply again */
        if (slots_etcd_read(m->etcd, m->prefix, map, &m->map_rev, err, sizeof(err)) != 0) {
            m->have_map = false;
            rc = -1;
            break;
        }
    }
    if (rc != 0) {
        /* Not flipped, or its answer lost: the map in etcd decides, once etcd answers. */
        slots_record_free(map);
        m->have_map = false;
        int rr;
        for (int64_t w0 = wall_ms();;) {
            rr = slots_etcd_read(m->etcd, m->prefix, map, &m->map_rev, msg, sizeof(msg));
            if (rr == 0 || wall_ms() - w0 >= MOVE_ETCD_WAIT_MS)
                break;
            nanosleep(&(struct timespec){0, 500000000L}, NULL);
        }
        if (rr != 0) {
            fprintf(stderr,
                    "psctl: move %s: the slot map was not changed (%s) and cannot be read "
                    "(%s) within %d s: the batch stays frozen on ps %u (updates of its "
                    "slots wait) and recorded in %s: rerun psctl once etcd answers, to "
                    "finish it or roll it back\n",
                    r->id, err, msg, MOVE_ETCD_WAIT_MS / 1000, r->from, m->key);
            m->keep_rec = true;
            return 1;
        }
        m->have_map = true;
        if (!flipped(map, r)) {
            fprintf(stderr,
                    "psctl: move %s: the slot map was not changed: %s: rolled back, its "
                    "%zu slots stay on ps %u\n",
                    r->id, err, r->n, r->from);
            abort_both(m, map, r);
            return 1;
        }
        /* the CAS took after all (a lost answer) */
    }
    t3 = mono_ms();
    *version = map->version;
    int failed = commit_all(m, map, r, map->version);
    int64_t t4 = mono_ms();
    m->ms[0] = t1 - t0;
    m->ms[1] = t2 - t1;
    m->ms[2] = t3 - t2;
    m->ms[3] = t4 - t3;
    if (failed != 0) {
        fprintf(stderr,
                "psctl: move %s is committed (map version %" PRIu64
                ") but not every server heard it: rerun psctl to finish it\n",
                r->id, map->version);
        m->keep_rec = true;
        return 1;
    }
    return 0;
}

/* The batch that starts at plan[i]: its pair's moves not taken yet, at most bs, into r. */
static void next_batch(const slot_move *plan, size_t nplan, size_t i, uint32_t bs, bool *taken,
                       move_rec *r)
{
    r->from = plan[i].from;
    r->to = plan[i].to;
    r->n = 0;
    for (size_t j = i; j < nplan && r->n < bs; j++)
        if (!taken[j] && plan[j].from == r->from && plan[j].to == r->to) {
            taken[j] = true;
            r->slots[r->n++] = plan[j].slot;
        }
}

/* The refusal of a move in a cluster with replicas > 1 (set, or read from its view in etcd):
 * what to do instead. Returns 2 (a usage error). */
static int refuse_replicas(const char *cmd, long long replicas, const char *where)
{
    fprintf(stderr,
            "psctl: %s: replicas %lld%s: slots move between the servers of clusters with "
            "replicas 1 only (a replica group's slots would move with its log, which is not "
            "done); to change the number of servers of a replicated cluster, stop it (final "
            "checkpoints), start the new servers once with replicas 1 on its checkpoint-dir "
            "(they restore and checkpoint), then with replicas %lld (docs/operations.md, "
            "\"Restoring onto another number of servers\")\n",
            cmd, replicas, where, replicas);
    return 2;
}

int psctl_moves(const options *o, const cluster_spec *cl, const char *cmd, const char *addr,
                const psctl_move_opts *mo)
{
    if (opt_int(o, OPT_REPLICAS) > 1)
        return refuse_replicas(cmd, (long long)opt_int(o, OPT_REPLICAS), "");
    mover m = {.mo = mo};
    int rc = psctl_coordinator_open(o, cl, cmd, &m.etcd, m.prefix, sizeof(m.prefix));
    if (rc != 0)
        return rc;
    snprintf(m.key, sizeof(m.key), "%s/moves/current", m.prefix);
    char err[2048];
    const char *token_file = opt_str(o, OPT_ADMIN_TOKEN_FILE);
    if (token_file && token_file[0] &&
        rpc_read_token(token_file, m.token, sizeof(m.token), err, sizeof(err)) != 0) {
        fprintf(stderr, "psctl: %s: %s\n", cmd, err);
        etcd_client_destroy(m.etcd);
        return 2;
    }
    m.tls = (rpc_tls){
        .ca = opt_str(o, OPT_TLS_CA),
        .cert = opt_str(o, OPT_TLS_CERT),
        .key = opt_str(o, OPT_TLS_KEY),
        .server_name = opt_str(o, OPT_TLS_SERVER_NAME),
        .engine = opt_enum(o, OPT_TLS_ENGINE),
    };
    slots_record map;
    rc = slots_etcd_read(m.etcd, m.prefix, &map, NULL, err, sizeof(err));
    static view_record vrec; /* large: not on the stack */
    if (rc == ETCD_ENOTFOUND &&
        view_etcd_read(m.etcd, m.prefix, &vrec, NULL, err, sizeof(err)) == 0 &&
        vrec.v.replicas > 1) {
        /* A replicated cluster publishes its view, never a slot map. */
        char where[600];
        snprintf(where, sizeof(where), " (the view under %s in etcd %s)", m.prefix,
                 etcd_client_endpoint(m.etcd));
        etcd_client_destroy(m.etcd);
        return refuse_replicas(cmd, (long long)vrec.v.replicas, where);
    }
    if (rc != 0) {
        if (rc == ETCD_ENOTFOUND)
            fprintf(stderr,
                    "psctl: %s: no slot map under %s in etcd %s (no server of this "
                    "cluster started with this coordinator yet, or another "
                    "coordinator-prefix)\n",
                    cmd, m.prefix, etcd_client_endpoint(m.etcd));
        else
            fprintf(stderr, "psctl: %s: %s\n", cmd, err);
        etcd_client_destroy(m.etcd);
        return rc == ETCD_ENOTFOUND ? 2 : 1;
    }
    /* The members the slots even out over. */
    bool *member = calloc(map.nservers, sizeof(bool));
    int at = addr ? slots_record_find(&map, addr) : -1;
    rc = 0;
    if (member == NULL) {
        rc = 1;
    } else if (addr && at < 0) {
        fprintf(stderr,
                "psctl: %s: %s is not a server of the slot map (psctl slots lists "
                "them)%s\n",
                cmd, addr,
                strcmp(cmd, "add-server") == 0
                    ? ": start it with ps-server --join first, which registers it"
                    : "");
        rc = 2;
    } else if (strcmp(cmd, "remove-server") == 0 && map.nservers == 1) {
        fprintf(stderr,
                "psctl: remove-server: %s is the cluster's last server: its slots "
                "have nowhere to go\n",
                addr);
        rc = 2;
    } else {
        for (uint32_t i = 0; i < map.nservers; i++)
            /* The servers that hold slots (one removed before holds none and stays out), and
             * the one added; less the one removed. */
            member[i] = (slots_record_count(&map, i) > 0 || (int)i == at) &&
                        !(strcmp(cmd, "remove-server") == 0 && (int)i == at);
    }
    slots_record_free(&map);
    if (rc == 0)
        rc = resume(&m);
    slot_move *plan = NULL;
    size_t nplan = 0;
    if (rc == 0) {
        /* Planned on the map as the resume left it. */
        if (slots_etcd_read(m.etcd, m.prefix, &map, NULL, err, sizeof(err)) != 0 ||
            slots_plan(&map, member, &plan, &nplan, err, sizeof(err)) != 0) {
            fprintf(stderr, "psctl: %s: %s\n", cmd, err);
            rc = 1;
        }
    }
    free(member);
    if (rc != 0) {
        etcd_client_destroy(m.etcd);
        return rc;
    }
    /* Batches: moves of one (from, to) pair, at most batch_slots each, in the plan's order of
     * first appearance. */
    uint32_t bs = mo->batch_slots ? mo->batch_slots : 16;
    bool *taken = calloc(nplan ? nplan : 1, sizeof(bool));
    move_rec r = {.slots = malloc(SLOTS_DEFAULT * sizeof(uint32_t))};
    size_t nb = 0;
    for (size_t i = 0; taken && r.slots && i < nplan; i++)
        if (!taken[i]) {
            next_batch(plan, nplan, i, bs, taken, &r);
            nb++;
        }
    if (taken)
        memset(taken, 0, (nplan ? nplan : 1) * sizeof(bool));
    size_t done = 0, b = 0;
    int64_t started = mono_ms();
    uint64_t rows = 0, vars = 0, bytes = 0, version = map.version;
    for (size_t i = 0; rc == 0 && taken && r.slots && i < nplan; i++) {
        if (taken[i])
            continue;
        next_batch(plan, nplan, i, bs, taken, &r);
        /* slots ascending (the plan is in slot order) */
        snprintf(r.id, sizeof(r.id), "%" PRId64 "-%u-%u-%u", wall_ms(), r.from, r.to, r.slots[0]);
        const Psd__V1__SlotMoveReply *rep = NULL;
        b++;
        snprintf(r.cmd, sizeof(r.cmd), "%s", cmd);
        r.run_done = done;
        r.run_total = nplan;
        r.run_bytes = bytes;
        rc = move_batch(&m, &r, &rep, &version);
        if (rc == 0) {
            done += r.n;
            if (rep) {
                rows += rep->rows;
                vars += rep->variables;
                bytes += rep->bytes;
            }
            progress(mo, done, nplan, b, nb, &r, rep, version, m.ms);
            progress_err(cmd, done, nplan, bytes, mono_ms() - started);
        }
        if (rep)
            psd__v1__slot_move_reply__free_unpacked((Psd__V1__SlotMoveReply *)rep, NULL);
    }
    if (m.rec_rev != 0 && !m.keep_rec && etcd_delete(m.etcd, m.key, err, sizeof(err)) != 0) {
        fprintf(stderr, "psctl: %s: %s\n", m.key, err);
        rc = 1;
    }
    slots_record_free(&m.map);
    if (rc == 0) {
        if (mo->json)
            printf("{\"done\":true,\"slots\":%zu,\"batches\":%zu,\"rows\":%" PRIu64
                   ",\"variables\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"version\":%" PRIu64 "}\n",
                   done, nb, rows, vars, bytes, version);
        else if (nplan == 0)
            printf("%s: nothing to move: the slots are even already (map version %" PRIu64 ")\n",
                   cmd, version);
        else
            printf("%s: done: %zu slots moved in %zu batches (%" PRIu64 " rows, %" PRIu64
                   " variables, %" PRIu64 " bytes); slot map version %" PRIu64 "\n",
                   cmd, done, nb, rows, vars, bytes, version);
        if (strcmp(cmd, "remove-server") == 0 && !mo->json)
            printf("%s holds no slot now; it may be stopped, unless it is a server of the "
                   "cluster spec and variables split in ranges (made before parts, or by clients "
                   "with split-parts false) still exist: those stay on the spec's servers\n",
                   addr);
    }
    free(r.slots);
    free(taken);
    free(plan);
    slots_record_free(&map);
    etcd_client_destroy(m.etcd);
    return rc;
}
