/* view_agent.c - the failover agent of a replicated ps-server (view_agent.h): its lease, poll
 * and notify threads; the decision it applies is in view_decide.c. */
#include "view_agent.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "timeutil.h"
#include "util.h"

/* Events waiting for the callback at most; beyond, the oldest is dropped (logged). */
#define AGENT_QUEUE 64
/* Errors of etcd are logged at most this often (the count is in the metric). */
#define AGENT_ERROR_LOG_MS 5000

struct view_agent {
    view_agent_config cfg;
    char *endpoints, *prefix, *url;
    etcd_client *etcd;
    int64_t started_ms;

    pthread_mutex_t mu; /* everything below but the callback */
    pthread_cond_t cv;
    bool stopping;
    bool halted; /* view_agent_halt done (its caller's thread only) */
    /* the lease */
    int64_t lease_id;       /* 0: not registered */
    int64_t lease_ttl_ms;   /* as granted */
    int64_t lease_valid_ms; /* renewed until (monotonic ms; from the renewal's send time) */
    bool lease_uncertain;   /* LEASE_UNCERTAIN reported, not yet renewed */
    bool lease_was_lost;    /* LEASE_LOST reported, not yet registered again */
    /* the view */
    view_record known; /* the newest view given to the callback (epoch 0: none) */
    bool caught_up[VIEW_MAX_SERVERS];
    bool lacks[VIEW_MAX_SERVERS]; /* view_agent_set_lacks (under mu) */
    /* view_agent_mark_unreachable: how many of this server's group streams to each server
     * fail for long (under mu). */
    uint32_t unreachable[VIEW_MAX_SERVERS];
    char token[65]; /* prefix/token, the cluster token ("": not read yet; mu) */
    bool leaving;   /* view_agent_leave: registers no more (mu) */
    int64_t pending_rev, pending_since_ms;
    /* stats */
    uint64_t views_installed, failovers, errors;
    char last_error[512];
    log_every error_log; /* "failover waits for etcd" lines */
    bool etcd_failing;
    log_every mismatch_log; /* lines about a view or registration that is not ours */

    pthread_mutex_t cb_mu; /* held while the callback runs; never taken under mu */
    view_agent_fn fn;
    void *fn_arg;

    /* Events wait here for the notify thread, so that neither the lease thread nor the poll
     * thread ever waits for the callback (a slow callback must not delay a renewal). */
    struct queued_event {
        view_event ev;
        view v;
    } queue[AGENT_QUEUE];
    unsigned q_head, q_len;   /* under mu */
    uint64_t delivered_epoch; /* under cb_mu: the newest view given to the callback */

    pthread_t lease_thread, poll_thread, notify_thread;
    bool lease_started, poll_started, notify_started;
    metric *m_epoch, *m_failovers, *m_errors;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- callback, errors, logging ---- */

/* Queues an event for the notify thread; never waits for the callback. */
static void emit(view_agent *a, view_event ev, const view *v)
{
    bool dropped = false;
    pthread_mutex_lock(&a->mu);
    if (a->q_len == AGENT_QUEUE) {
        a->q_head = (a->q_head + 1) % AGENT_QUEUE;
        a->q_len--;
        dropped = true;
    }
    struct queued_event *q = &a->queue[(a->q_head + a->q_len) % AGENT_QUEUE];
    q->ev = ev;
    q->v = *v;
    a->q_len++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (dropped)
        log_warn("view agent: the callback is %d events behind; the oldest was dropped",
                 AGENT_QUEUE);
}

/* Delivers queued events in order, one at a time; a view not newer than one delivered is
 * skipped (view_agent_on_change may have given it already). */
static void *notify_main(void *arg)
{
    view_agent *a = arg;
    struct queued_event e;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (a->q_len == 0 && !a->stopping)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->q_len == 0) {
            pthread_mutex_unlock(&a->mu);
            break;
        }
        e = a->queue[a->q_head];
        a->q_head = (a->q_head + 1) % AGENT_QUEUE;
        a->q_len--;
        pthread_mutex_unlock(&a->mu);
        pthread_mutex_lock(&a->cb_mu);
        bool stale = e.ev == VIEW_EVENT_VIEW && e.v.epoch <= a->delivered_epoch;
        /* Without a callback yet, a view stays undelivered: view_agent_on_change gives it. */
        if (a->fn && !stale) {
            if (e.ev == VIEW_EVENT_VIEW)
                a->delivered_epoch = e.v.epoch;
            a->fn(a->fn_arg, e.ev, &e.v);
        }
        pthread_mutex_unlock(&a->cb_mu);
    }
    return NULL;
}

static void note_error(view_agent *a, const char *what, const char *err)
{
    metric_inc(a->m_errors);
    int64_t now = mono_ms();
    bool say;
    pthread_mutex_lock(&a->mu);
    a->errors++;
    snprintf(a->last_error, sizeof(a->last_error), "%s: %s", what, err);
    if (!a->etcd_failing)
        log_every_reset(&a->error_log); /* a new episode: said at once */
    say = log_every_due(&a->error_log, AGENT_ERROR_LOG_MS, (uint64_t)now * 1000000u);
    a->etcd_failing = true;
    pthread_mutex_unlock(&a->mu);
    if (say)
        log_warn("failover waits for etcd: %s: %s (the current view stays; retrying)", what, err);
}

static void note_ok(view_agent *a)
{
    pthread_mutex_lock(&a->mu);
    bool was = a->etcd_failing;
    a->etcd_failing = false;
    pthread_mutex_unlock(&a->mu);
    if (was)
        log_info("etcd answers again (%s)", etcd_client_endpoint(a->etcd));
}

static void describe(const view *v, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "epoch %" PRIu64 ", primaries [", v->epoch);
    for (uint32_t g = 0; g < v->num_servers && o < cap; g++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%d", g ? " " : "", (int)v->primary[g]);
    if (o < cap)
        o += (size_t)snprintf(buf + o, cap - o, "], live [");
    bool first = true;
    for (uint32_t i = 0; i < v->num_servers && o < cap; i++)
        if (v->live[i]) {
            o += (size_t)snprintf(buf + o, cap - o, "%s%u", first ? "" : " ", i);
            first = false;
        }
    if (o < cap)
        o += (size_t)snprintf(buf + o, cap - o, "]");
    /* The live members out of sync, by group: ", out of sync [g1: 0; g2: 0 1]". */
    bool any = false;
    for (uint32_t g = 0; g < v->num_servers && o < cap; g++) {
        bool group_said = false;
        for (uint32_t k = 0; k < v->replicas && o < cap; k++) {
            uint32_t s = view_member(v, g, k);
            if (!v->live[s] || view_in_sync(v, g, s))
                continue;
            if (!group_said)
                o +=
                    (size_t)snprintf(buf + o, cap - o, "%sg%u:", any ? "; " : ", out of sync [", g);
            if (o < cap)
                o += (size_t)snprintf(buf + o, cap - o, " %u", s);
            any = group_said = true;
        }
    }
    if (any && o < cap)
        snprintf(buf + o, cap - o, "]");
}

/* Waits on the agent's condition up to ms; returns whether the agent is stopping. */
static bool agent_sleep(view_agent *a, int64_t ms)
{
    pthread_mutex_lock(&a->mu);
    if (!a->stopping && ms > 0) {
        struct timespec ts = time_deadline(CLOCK_MONOTONIC, (uint64_t)ms);
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    }
    bool stop = a->stopping;
    pthread_mutex_unlock(&a->mu);
    return stop;
}

/* ---- the cluster token ---- */

/* Reads prefix/token, the secret the servers authenticate their server-to-server calls with,
 * making it (128 random bits, hex) when the cluster has none yet: the first server to put it
 * wins, the others read it. Once read, it never changes for this agent. */
static int cluster_token(view_agent *a, char *err, size_t errlen)
{
    pthread_mutex_lock(&a->mu);
    bool have = a->token[0] != '\0';
    pthread_mutex_unlock(&a->mu);
    if (have)
        return 0;
    char key[512];
    snprintf(key, sizeof(key), "%s/token", a->prefix);
    for (int tries = 0; tries < 3; tries++) {
        char *val = NULL;
        size_t len = 0;
        int rc = etcd_get(a->etcd, key, &val, &len, NULL, err, errlen);
        if (rc == 0) {
            bool ok = len >= 16 && len < sizeof(a->token);
            for (size_t i = 0; ok && i < len; i++)
                ok = (val[i] >= '0' && val[i] <= '9') || (val[i] >= 'a' && val[i] <= 'f');
            if (ok) {
                pthread_mutex_lock(&a->mu);
                memcpy(a->token, val, len);
                a->token[len] = '\0';
                pthread_mutex_unlock(&a->mu);
            } else {
                snprintf(err, errlen, "%s holds no cluster token (16 to %zu hex digits)", key,
                         sizeof(a->token) - 1);
            }
            free(val);
            return ok ? 0 : ETCD_EFAILED;
        }
        if (rc != ETCD_ENOTFOUND)
            return rc;
        uint8_t raw[16];
        char hex[33];
        FILE *f = fopen("/dev/urandom", "rb");
        bool got = f && fread(raw, 1, sizeof(raw), f) == sizeof(raw);
        if (f)
            fclose(f);
        if (!got) {
            snprintf(err, errlen, "cannot read /dev/urandom for the cluster token");
            return ETCD_EFAILED;
        }
        for (size_t i = 0; i < sizeof(raw); i++)
            snprintf(hex + 2 * i, 3, "%02x", raw[i]);
        rc = etcd_cas(a->etcd, key, 0, hex, 32, NULL, err, errlen);
        if (rc != 0 && rc != ETCD_ECONFLICT)
            return rc; /* ECONFLICT: another server put one first: read it */
    }
    snprintf(err, errlen, "%s: could not be made or read", key);
    return ETCD_EFAILED;
}

bool view_agent_token(view_agent *a, char *buf, size_t cap)
{
    pthread_mutex_lock(&a->mu);
    bool have = a->token[0] != '\0' && strlen(a->token) < cap;
    if (have)
        snprintf(buf, cap, "%s", a->token);
    pthread_mutex_unlock(&a->mu);
    return have;
}

/* ---- the lease thread ---- */

static void *lease_main(void *arg)
{
    view_agent *a = arg;
    char err[1536];
    for (;;) {
        pthread_mutex_lock(&a->mu);
        bool stopping = a->stopping || a->leaving;
        int64_t id = a->lease_id, ttl_ms = a->lease_ttl_ms, valid = a->lease_valid_ms;
        pthread_mutex_unlock(&a->mu);
        if (stopping)
            break;
        int64_t wait_ms;
        if (id == 0) {
            int64_t t0 = mono_ms(), ttl_s = 0, nid = 0;
            /* The cluster token first: a server registered is sent REPLICATE, and sends it. */
            int rc = cluster_token(a, err, sizeof(err));
            if (rc == 0)
                rc = etcd_lease_grant(a->etcd, a->cfg.lease_ms, &nid, &ttl_s, err, sizeof(err));
            /* The copies first: once registered, a first view may be decided. */
            if (rc == 0 && a->cfg.ncopies > 0)
                rc = view_etcd_put_copies(a->etcd, a->prefix, a->cfg.self, a->cfg.copies,
                                          a->cfg.ncopies, nid, err, sizeof(err));
            if (rc == 0)
                rc = view_etcd_register(a->etcd, a->prefix, a->cfg.self, a->url, nid, err,
                                        sizeof(err));
            if (rc != 0) {
                note_error(a, "cannot register this server", err);
                wait_ms = 200;
            } else {
                note_ok(a);
                pthread_mutex_lock(&a->mu);
                a->lease_id = nid;
                a->lease_ttl_ms = ttl_s * 1000;
                a->lease_valid_ms = t0 + ttl_s * 1000;
                a->lease_uncertain = false;
                bool was_lost = a->lease_was_lost;
                a->lease_was_lost = false;
                view v = a->known.v;
                pthread_mutex_unlock(&a->mu);
                log_info("registered in etcd %s as %s/servers/%u (lease %" PRId64 ", TTL %" PRId64
                         " s)",
                         etcd_client_endpoint(a->etcd), a->prefix, a->cfg.self, nid, ttl_s);
                if (was_lost)
                    emit(a, VIEW_EVENT_LEASE_OK, &v);
                wait_ms = ttl_s * 1000 / 3;
            }
        } else {
            int64_t t0 = mono_ms(), ttl_s = 0;
            int rc = etcd_lease_keepalive(a->etcd, id, &ttl_s, err, sizeof(err));
            if (rc == 0) {
                note_ok(a);
                pthread_mutex_lock(&a->mu);
                bool was = a->lease_uncertain;
                /* Ran out before this renewal came back, too soon to be reported: a primary
                 * alone held its acknowledgements meanwhile (view_agent_serving) and is told. */
                bool lapsed = mono_ms() >= a->lease_valid_ms;
                a->lease_uncertain = false;
                if (a->lease_id == id)
                    a->lease_valid_ms = t0 + ttl_s * 1000;
                view v = a->known.v;
                pthread_mutex_unlock(&a->mu);
                if (was)
                    log_info("lease %" PRId64 " renewed again", id);
                if (was || lapsed)
                    emit(a, VIEW_EVENT_LEASE_OK, &v);
                wait_ms = ttl_ms / 3;
            } else if (rc == ETCD_ELEASE) {
                pthread_mutex_lock(&a->mu);
                a->lease_id = 0;
                a->lease_uncertain = false;
                a->lease_was_lost = true;
                memset(a->caught_up, 0, sizeof(a->caught_up));
                view v = a->known.v;
                pthread_mutex_unlock(&a->mu);
                log_warn("lease lost: %s; this server is out of the view until it rejoins", err);
                emit(a, VIEW_EVENT_LEASE_LOST, &v);
                wait_ms = 0;
            } else {
                note_error(a, "cannot renew the lease", err);
                wait_ms = 200;
            }
            int64_t now = mono_ms();
            pthread_mutex_lock(&a->mu);
            bool report = a->lease_id == id && !a->lease_uncertain && now >= a->lease_valid_ms;
            if (report)
                a->lease_uncertain = true;
            valid = a->lease_valid_ms;
            view v = a->known.v;
            pthread_mutex_unlock(&a->mu);
            if (report) {
                log_warn("lease %" PRId64 " not renewed within its TTL: etcd cannot be reached "
                         "(%s)",
                         id, a->last_error);
                emit(a, VIEW_EVENT_LEASE_UNCERTAIN, &v);
            } else if (rc != 0 && rc != ETCD_ELEASE && valid - now < wait_ms) {
                wait_ms = valid - now; /* wake to report it in time */
            }
        }
        if (wait_ms < 20 && wait_ms != 0)
            wait_ms = 20;
        if (agent_sleep(a, wait_ms))
            break;
    }
    return NULL;
}

/* ---- the poll thread ---- */

/* Takes rec as the newest view when its epoch is higher than the known one's. */
static void adopt(view_agent *a, const view_record *rec)
{
    pthread_mutex_lock(&a->mu);
    if (rec->v.epoch <= a->known.v.epoch) {
        pthread_mutex_unlock(&a->mu);
        return;
    }
    uint64_t moved = 0;
    for (uint32_t g = 0; a->known.v.epoch > 0 && g < rec->v.num_servers; g++)
        if (a->known.v.primary[g] >= 0 && a->known.v.primary[g] != rec->v.primary[g])
            moved++;
    /* Taken out of sync in a group while live as this incarnation (its primary could not reach
     * it; a view that drops a previous process of this task is no such change, and a lost lease
     * clears every mark anyway): a mark of a catch-up before that is void, so that this server
     * never proposes itself in sync again before its server copied the group anew
     * (repl_rejoin_locked marks again once caught up). The primary acknowledges without it from
     * that view on. */
    uint32_t self = a->cfg.self;
    bool was_me = a->known.v.epoch > 0 && a->known.v.live[self] &&
                  a->known.lease[self] == a->lease_id && a->lease_id != 0;
    bool is_me = rec->v.live[self] && rec->lease[self] == a->lease_id && a->lease_id != 0;
    for (uint32_t g = 0; was_me && is_me && g < rec->v.num_servers; g++)
        if (view_in_sync(&a->known.v, g, self) && !view_in_sync(&rec->v, g, self))
            a->caught_up[g] = false;
    a->known = *rec;
    a->failovers += moved;
    pthread_mutex_unlock(&a->mu);
    metric_set(a->m_epoch, (double)rec->v.epoch);
    metric_add(a->m_failovers, moved);
    char d[VIEW_MAX_SERVERS * 24 + 64];
    describe(&rec->v, d, sizeof(d));
    log_info("view %s", d);
    emit(a, VIEW_EVENT_VIEW, &rec->v);
}

/* One round: read, decide, maybe compare-and-swap (a lost race reads again, up to 3 times). */
static void poll_once(view_agent *a)
{
    char err[1536];
    for (int attempt = 0; attempt < 3; attempt++) {
        view_record rec;
        int64_t rev = 0;
        int rc = view_etcd_read(a->etcd, a->prefix, &rec, &rev, err, sizeof(err));
        if (rc != 0 && rc != ETCD_ENOTFOUND) {
            note_error(a, "cannot read the view", err);
            return;
        }
        bool have = rc == 0;
        if (have &&
            (rec.v.num_servers != a->cfg.num_servers || rec.v.replicas != a->cfg.replicas)) {
            int64_t now = mono_ms();
            pthread_mutex_lock(&a->mu);
            bool say =
                log_every_due(&a->mismatch_log, AGENT_ERROR_LOG_MS, (uint64_t)now * 1000000u);
            pthread_mutex_unlock(&a->mu);
            if (say)
                log_error("the view in etcd (%s/view) is for %u servers with %u replicas, this "
                          "cluster has %u with %u: another cluster uses coordinator-prefix %s",
                          a->prefix, rec.v.num_servers, rec.v.replicas, a->cfg.num_servers,
                          a->cfg.replicas, a->prefix);
            return;
        }
        if (have)
            adopt(a, &rec);
        uint64_t known_epoch;
        pthread_mutex_lock(&a->mu);
        known_epoch = a->known.v.epoch;
        pthread_mutex_unlock(&a->mu);
        bool regressed = have && rec.v.epoch < known_epoch;
        if (regressed) {
            int64_t t = mono_ms();
            pthread_mutex_lock(&a->mu);
            regressed = log_every_due(&a->mismatch_log, AGENT_ERROR_LOG_MS, (uint64_t)t * 1000000u);
            pthread_mutex_unlock(&a->mu);
        }
        if (regressed)
            log_warn("the view in etcd (%s/view) is at epoch %" PRIu64 ", below epoch %" PRIu64
                     " seen before (etcd lost its data, or the key was deleted): installing it "
                     "again above that",
                     a->prefix, rec.v.epoch, known_epoch);
        int64_t reg[VIEW_MAX_SERVERS];
        rc = view_etcd_servers(a->etcd, a->prefix, a->cfg.num_servers, reg, NULL, err, sizeof(err));
        if (rc != 0) {
            note_error(a, "cannot read the registered servers", err);
            return;
        }
        note_ok(a);
        view_inputs in = {
            .cur = have ? &rec : NULL,
            .reg = reg,
            .self = a->cfg.self,
            .num_servers = a->cfg.num_servers,
            .replicas = a->cfg.replicas,
            .known_epoch = known_epoch,
        };
        view_copy *copies = NULL;
        if (view_from_scratch(in.cur, reg, a->cfg.num_servers)) {
            rc = view_etcd_copies(a->etcd, a->prefix, a->cfg.num_servers, reg, &copies, &in.ncopies,
                                  err, sizeof(err));
            if (rc != 0) {
                note_error(a, "cannot read the registered servers' copies", err);
                return;
            }
            in.copies = copies;
        } else if (have && view_waits(&rec.v)) {
            rc = view_etcd_forced(a->etcd, a->prefix, a->cfg.num_servers, rec.v.epoch, in.forced,
                                  in.forced_to, err, sizeof(err));
            if (rc != 0) {
                note_error(a, "cannot read the operators' overrides", err);
                return;
            }
        }
        int64_t now = mono_ms();
        pthread_mutex_lock(&a->mu);
        int64_t own = a->lease_id, own_valid = a->lease_valid_ms;
        pthread_mutex_unlock(&a->mu);
        /* Our key gone while our lease lives (deleted by hand): put it back. Another lease on
         * it: a second process runs as this task (the newest registration wins the key). */
        if (own != 0 && now < own_valid && reg[a->cfg.self] != own) {
            bool gone = reg[a->cfg.self] == 0;
            if (gone && view_etcd_register(a->etcd, a->prefix, a->cfg.self, a->url, own, err,
                                           sizeof(err)) == 0) {
                log_warn("%s/servers/%u had disappeared while lease %" PRId64
                         " lives: registered again",
                         a->prefix, a->cfg.self, own);
                reg[a->cfg.self] = own;
            } else if (!gone) {
                pthread_mutex_lock(&a->mu);
                bool say =
                    log_every_due(&a->mismatch_log, AGENT_ERROR_LOG_MS, (uint64_t)now * 1000000u);
                pthread_mutex_unlock(&a->mu);
                if (say)
                    log_error("%s/servers/%u holds lease %" PRId64 ", not this server's %" PRId64
                              ": another process runs as ps %u (one process per task)",
                              a->prefix, a->cfg.self, reg[a->cfg.self], own, a->cfg.self);
            }
        }
        pthread_mutex_lock(&a->mu);
        /* Only a server whose own registration is current and renewed proposes. */
        bool may = a->lease_id != 0 && reg[a->cfg.self] == a->lease_id && now < a->lease_valid_ms;
        memcpy(in.caught_up, a->caught_up, sizeof(in.caught_up));
        memcpy(in.lacks, a->lacks, sizeof(in.lacks));
        for (uint32_t i = 0; i < a->cfg.num_servers; i++)
            in.unreachable[i] = a->unreachable[i] > 0;
        in.grace_over = now - a->started_ms >= a->cfg.start_grace_ms;
        pthread_mutex_unlock(&a->mu);
        if (!may) {
            free(copies);
            return;
        }
        view_record next;
        view_change ch = view_decide(&in, &next);
        if (!have && ch == VIEW_KEEP) {
            uint32_t regs = 0;
            for (uint32_t i = 0; i < a->cfg.num_servers; i++)
                regs += reg[i] != 0;
            pthread_mutex_lock(&a->mu);
            bool say =
                log_every_due(&a->mismatch_log, AGENT_ERROR_LOG_MS, (uint64_t)now * 1000000u);
            pthread_mutex_unlock(&a->mu);
            if (say)
                log_info("the first view waits for every server to register: %u of %u so far "
                         "(at most %" PRId64 " s more)",
                         regs, a->cfg.num_servers,
                         (a->cfg.start_grace_ms - (now - a->started_ms)) / 1000);
        }
        pthread_mutex_lock(&a->mu);
        bool go = ch == VIEW_PROPOSE;
        if (ch == VIEW_FALLBACK) {
            if (a->pending_rev != rev) {
                a->pending_rev = rev;
                a->pending_since_ms = now;
            }
            go = now - a->pending_since_ms >= 2 * a->cfg.lease_ms;
        } else {
            a->pending_rev = -1;
        }
        pthread_mutex_unlock(&a->mu);
        if (!go) {
            free(copies);
            return;
        }
        int64_t new_rev = 0;
        rc = view_etcd_cas(a->etcd, a->prefix, &next, have ? rev : 0, &new_rev, err, sizeof(err));
        if (rc == ETCD_ECONFLICT) {
            free(copies);
            continue; /* another server installed a view first: decide on that one */
        }
        if (rc != 0) {
            free(copies);
            note_error(a, "cannot install a view", err);
            return;
        }
        char d[VIEW_MAX_SERVERS * 24 + 64];
        describe(&next.v, d, sizeof(d));
        log_info("installed the view %s%s", d,
                 ch == VIEW_FALLBACK ? " (in place of the server "
                                       "that should have)"
                                     : "");
        for (uint32_t g = 0; g < a->cfg.num_servers && copies; g++) {
            const view_copy *c = view_inputs_copy(&in, next.v.primary[g], g);
            if (c && next.v.primary[g] != view_first_live(&next.v, g))
                log_info("group %u: served by server %d, whose copy (epoch %" PRIu64
                         ", lsn %" PRIu64 ") is the newest of its live members",
                         g, next.v.primary[g], c->epoch, c->lsn);
        }
        free(copies);
        pthread_mutex_lock(&a->mu);
        a->views_installed++;
        a->pending_rev = -1;
        pthread_mutex_unlock(&a->mu);
        adopt(a, &next);
        return;
    }
}

static void *poll_main(void *arg)
{
    view_agent *a = arg;
    do
        poll_once(a);
    while (!agent_sleep(a, a->cfg.poll_ms));
    return NULL;
}

/* ---- life cycle ---- */

static void agent_free(view_agent *a)
{
    etcd_client_destroy(a->etcd);
    free(a->endpoints);
    free(a->prefix);
    free(a->url);
    free((void *)a->cfg.copies);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->cb_mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

int view_agent_start(view_agent **out, const view_agent_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->num_servers < 2 || cfg->num_servers > VIEW_MAX_SERVERS)
        return errf(err, errlen, "replicas > 1 needs 2 to %d ps tasks (the cluster has %u)",
                    VIEW_MAX_SERVERS, cfg->num_servers),
               ETCD_EFAILED;
    if (cfg->replicas < 2 || cfg->replicas > cfg->num_servers)
        return errf(err, errlen, "replicas %u: must be 2 to the number of ps tasks (%u)",
                    cfg->replicas, cfg->num_servers),
               ETCD_EFAILED;
    if (cfg->self >= cfg->num_servers || cfg->lease_ms < 1 || cfg->prefix == NULL ||
        cfg->prefix[0] != '/' || cfg->url == NULL || strlen(cfg->prefix) > 400)
        return errf(err, errlen,
                    "view agent: bad configuration (task index %u of %u, lease %" PRId64
                    " ms, prefix \"%s\": it must start with '/')",
                    cfg->self, cfg->num_servers, cfg->lease_ms, cfg->prefix ? cfg->prefix : ""),
               ETCD_EFAILED;
    view_agent *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return errf(err, errlen, "out of memory"), ETCD_EFAILED;
    a->cfg = *cfg;
    if (a->cfg.poll_ms <= 0) {
        a->cfg.poll_ms = cfg->lease_ms / 8;
        a->cfg.poll_ms = a->cfg.poll_ms < 25 ? 25 : a->cfg.poll_ms > 500 ? 500 : a->cfg.poll_ms;
    }
    if (a->cfg.start_grace_ms <= 0)
        a->cfg.start_grace_ms = 10 * cfg->lease_ms;
    if (a->cfg.request_timeout_ms <= 0) {
        int64_t t = cfg->lease_ms / 4;
        a->cfg.request_timeout_ms = t < 100 ? 100 : t > 2000 ? 2000 : (int)t;
    }
    a->endpoints = strdup(cfg->endpoints ? cfg->endpoints : "");
    a->prefix = strdup(cfg->prefix);
    a->url = strdup(cfg->url);
    view_copy *copies = NULL;
    if (cfg->ncopies > 0 && (copies = malloc(cfg->ncopies * sizeof(*copies))) != NULL)
        memcpy(copies, cfg->copies, cfg->ncopies * sizeof(*copies));
    a->cfg.copies = copies;
    a->cfg.ncopies = copies ? cfg->ncopies : 0;
    /* A group this server backs up and restored no copy of is empty here: never served
     * before it copied it (its in-sync members may all be down: the group waits for them). */
    for (uint32_t k = 1; k < cfg->replicas && k < cfg->num_servers; k++) {
        uint32_t g = (cfg->self + cfg->num_servers - k) % cfg->num_servers;
        a->lacks[g] = true;
        for (size_t i = 0; i < a->cfg.ncopies; i++)
            if (a->cfg.copies[i].group == g)
                a->lacks[g] = false;
    }
    size_t pl = a->prefix ? strlen(a->prefix) : 0;
    while (pl > 1 && a->prefix[pl - 1] == '/')
        a->prefix[--pl] = '\0';
    a->cfg.endpoints = a->endpoints;
    a->cfg.prefix = a->prefix;
    a->cfg.url = a->url;
    a->pending_rev = -1;
    a->started_ms = mono_ms();
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->cb_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (a->endpoints == NULL || a->prefix == NULL || a->url == NULL ||
        (cfg->ncopies > 0 && copies == NULL)) {
        agent_free(a);
        return errf(err, errlen, "out of memory"), ETCD_EFAILED;
    }
    int rc = etcd_client_create(&a->etcd, a->endpoints, a->cfg.request_timeout_ms, err, errlen);
    if (rc != 0) {
        agent_free(a);
        return rc;
    }
    a->m_epoch = metrics_gauge("psd_view_epoch",
                               "Epoch of the newest view of the replicated cluster this server "
                               "knows (0: none yet).");
    a->m_failovers = metrics_counter("psd_failovers_total",
                                     "Replica groups whose primary moved to another server, over "
                                     "the views this server saw.");
    a->m_errors = metrics_counter("psd_coordinator_errors_total",
                                  "Requests to the coordinator (etcd) that failed.");
    /* A view of another shape at the prefix is a configuration error: say so at start. */
    view_record rec;
    char e1[1536];
    rc = view_etcd_read(a->etcd, a->prefix, &rec, NULL, e1, sizeof(e1));
    if (rc == 0 && (rec.v.num_servers != cfg->num_servers || rec.v.replicas != cfg->replicas)) {
        errf(err, errlen,
             "the view in etcd (%s/view, epoch %" PRIu64 ") is for %u servers with %u replicas, "
             "this cluster has %u with %u: another cluster uses coordinator-prefix %s (set "
             "another prefix, or delete the key if that cluster is gone)",
             a->prefix, rec.v.epoch, rec.v.num_servers, rec.v.replicas, cfg->num_servers,
             cfg->replicas, a->prefix);
        agent_free(a);
        return ETCD_EFAILED;
    }
    if (rc == ETCD_EUNREACHABLE || rc == ETCD_EFAILED)
        note_error(a, "cannot read the view", e1);
    if (pthread_create(&a->lease_thread, NULL, lease_main, a) != 0) {
        agent_free(a);
        return errf(err, errlen, "cannot start a thread"), ETCD_EFAILED;
    }
    a->lease_started = true;
    if (pthread_create(&a->notify_thread, NULL, notify_main, a) != 0) {
        view_agent_stop(a);
        return errf(err, errlen, "cannot start a thread"), ETCD_EFAILED;
    }
    a->notify_started = true;
    if (pthread_create(&a->poll_thread, NULL, poll_main, a) != 0) {
        view_agent_stop(a);
        return errf(err, errlen, "cannot start a thread"), ETCD_EFAILED;
    }
    a->poll_started = true;
    log_info("view agent: ps %u of %u, %u replicas, coordinator %s, prefix %s, lease %" PRId64
             " ms, poll every %" PRId64 " ms",
             cfg->self, cfg->num_servers, cfg->replicas, a->endpoints, a->prefix, cfg->lease_ms,
             a->cfg.poll_ms);
    *out = a;
    return 0;
}

void view_agent_leave(view_agent *a)
{
    if (a == NULL)
        return;
    pthread_mutex_lock(&a->mu);
    a->leaving = true; /* the lease thread registers no more */
    int64_t id = a->lease_id;
    a->lease_id = 0; /* view_agent_serving: false from now on */
    pthread_mutex_unlock(&a->mu);
    if (id == 0)
        return;
    char err[1536];
    if (etcd_lease_revoke(a->etcd, id, err, sizeof(err)) == 0)
        log_info("revoked lease %" PRId64 ": the others fail over without waiting for it", id);
    else
        log_warn("cannot revoke lease %" PRId64 " (it expires by itself): %s", id, err);
}

void view_agent_stop(view_agent *a)
{
    view_agent_halt(a);
    view_agent_free(a);
}

void view_agent_free(view_agent *a)
{
    if (a)
        agent_free(a);
}

void view_agent_halt(view_agent *a)
{
    if (a == NULL || a->halted)
        return;
    a->halted = true;
    pthread_mutex_lock(&a->mu);
    a->stopping = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (a->lease_started)
        pthread_join(a->lease_thread, NULL);
    if (a->poll_started)
        pthread_join(a->poll_thread, NULL);
    if (a->notify_started) /* delivers what is queued, then ends */
        pthread_join(a->notify_thread, NULL);
    if (a->lease_id != 0) {
        char err[1536];
        if (etcd_lease_revoke(a->etcd, a->lease_id, err, sizeof(err)) == 0)
            log_info("revoked lease %" PRId64 ": the others fail over without waiting for it",
                     a->lease_id);
        else
            log_warn("cannot revoke lease %" PRId64 " (it expires by itself): %s", a->lease_id,
                     err);
    }
}

void view_agent_on_change(view_agent *a, view_agent_fn fn, void *arg)
{
    pthread_mutex_lock(&a->cb_mu);
    a->fn = fn;
    a->fn_arg = arg;
    pthread_mutex_lock(&a->mu);
    view v = a->known.v;
    pthread_mutex_unlock(&a->mu);
    if (fn && v.epoch > 0 && v.epoch > a->delivered_epoch) {
        a->delivered_epoch = v.epoch;
        fn(arg, VIEW_EVENT_VIEW, &v);
    }
    pthread_mutex_unlock(&a->cb_mu);
}

bool view_agent_current(view_agent *a, view *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->known.v;
    pthread_mutex_unlock(&a->mu);
    return out->epoch > 0;
}

void view_agent_mark_caught_up(view_agent *a, uint32_t g)
{
    if (g >= a->cfg.num_servers)
        return;
    pthread_mutex_lock(&a->mu);
    a->caught_up[g] = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void view_agent_unmark_caught_up(view_agent *a, uint32_t g)
{
    if (g >= a->cfg.num_servers)
        return;
    pthread_mutex_lock(&a->mu);
    a->caught_up[g] = false;
    pthread_mutex_unlock(&a->mu);
}

void view_agent_mark_unreachable(view_agent *a, uint32_t s, bool on)
{
    if (s >= a->cfg.num_servers)
        return;
    pthread_mutex_lock(&a->mu);
    if (on)
        a->unreachable[s]++;
    else if (a->unreachable[s] > 0)
        a->unreachable[s]--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void view_agent_set_lacks(view_agent *a, uint32_t g, bool lacks)
{
    if (g >= a->cfg.num_servers)
        return;
    pthread_mutex_lock(&a->mu);
    a->lacks[g] = lacks;
    pthread_mutex_unlock(&a->mu);
}

bool view_agent_serving(view_agent *a)
{
    int64_t now = mono_ms();
    pthread_mutex_lock(&a->mu);
    uint32_t s = a->cfg.self;
    bool ok = a->lease_id != 0 && now < a->lease_valid_ms && a->known.v.epoch > 0 &&
              a->known.v.live[s] && a->known.lease[s] == a->lease_id;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

bool view_agent_leaving(view_agent *a)
{
    pthread_mutex_lock(&a->mu);
    bool leaving = a->leaving;
    pthread_mutex_unlock(&a->mu);
    return leaving;
}

bool view_agent_in_view(view_agent *a)
{
    pthread_mutex_lock(&a->mu);
    uint32_t s = a->cfg.self;
    bool ok = a->lease_id != 0 && a->known.v.epoch > 0 && a->known.v.live[s] &&
              a->known.lease[s] == a->lease_id;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

void view_agent_get_stats(view_agent *a, view_agent_stats *out)
{
    int64_t now = mono_ms();
    pthread_mutex_lock(&a->mu);
    out->epoch = a->known.v.epoch;
    out->views_installed = a->views_installed;
    out->failovers = a->failovers;
    out->coordinator_errors = a->errors;
    out->lease_id = a->lease_id;
    out->lease_valid = a->lease_id != 0 && now < a->lease_valid_ms;
    snprintf(out->last_error, sizeof(out->last_error), "%s", a->last_error);
    pthread_mutex_unlock(&a->mu);
}
