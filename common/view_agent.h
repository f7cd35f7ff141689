/* view_agent.h - the failover agent of one ps-server of a replicated cluster (replicas > 1):
 * keeps the server's lease in etcd, installs and changes the view (view.h) by compare-and-swap,
 * and tells the server about every new view and about its own lease.
 *
 * What it does (two threads):
 *   - lease: grants a lease of lease_ms (etcd rounds up to whole seconds, and raises TTLs below
 *     its minimum, 2 s with etcd's defaults), puts prefix/servers/<self> = url under it and
 *     renews it every third of its TTL. A lease etcd no longer has (it expired while this server
 *     could not renew it) is LOST: this server's incarnation is out of every later view; the
 *     agent registers again with a new lease, as a rejoining server.
 *   - poll (every poll_ms): reads prefix/view and prefix/servers/, and proposes a new view when
 *       * there is none (or none of its live servers still holds the lease it joined with: the
 *         whole cluster restarted): epoch (old + 1, or 1), every registered server live,
 *         primary[g] = the live member of g with the newest restored copy (the first in ring
 *         order among equals), and in sync (view.behind) the live members whose copy is as
 *         new; it waits up to start_grace_ms for every server to register first;
 *       * a live server's lease is gone (absent key, or another lease: it restarted): the view
 *         without it, out of sync in its groups when an in-sync member lives on; each group
 *         whose primary it was gets its first live in-sync member in ring order as primary
 *         (-1 when none lives: the group waits for one of its in-sync members);
 *       * the view in etcd has a lower epoch than one this server saw (etcd lost its data, or
 *         the key was deleted): the same view again above the highest epoch seen, so that
 *         epochs never go back;
 *       * this server is registered but not live, and view_agent_mark_caught_up was called for
 *         every group it is a member of that has a primary: the view with it live and in sync
 *         in those groups (and primary of its groups that had none where it is in sync and
 *         does not lack the group's copy, view_agent_set_lacks);
 *       * this server is live but out of sync in a group that has a primary, and
 *         view_agent_mark_caught_up was called for it: the view with it in sync there;
 *       * this server is the primary of a group and view_agent_mark_unreachable stands for a
 *         live in-sync member of it: the view with that member out of sync there (proposed by
 *         this server).
 *     Each proposal is epoch + 1 and a compare-and-swap on the view's mod revision: of servers
 *     that see the same change, one installs it and the others re-read. A change is proposed
 *     by the server it concerns first (the new primary; for a gone backup the lowest live
 *     server; a rejoin by the rejoining server), by anyone once it waited 2 lease_ms.
 *   - etcd unreachable: the current view stays, the server keeps serving on it; the agent logs
 *     "failover waits for etcd: <cause>" (at most every 5 s) and counts the errors.
 *
 * Metrics (metrics.h registry): psd_view_epoch, psd_failovers_total (groups whose primary
 * moved, over the views this server saw), psd_coordinator_errors_total (failed etcd requests).
 *
 * Thread-safety: every function may be called from any thread once view_agent_start returned,
 * view_agent_stop aside, which must be the last call (no other thread may use the agent during
 * or after it: stop the server's users of the agent, or detach them, first). */
#ifndef PSD_COMMON_VIEW_AGENT_H
#define PSD_COMMON_VIEW_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "view.h"
#include "view_etcd.h"

typedef struct view_agent view_agent;

typedef enum view_event {
    /* A view with a higher epoch than any before (v: it). */
    VIEW_EVENT_VIEW,
    /* etcd says this server's lease is gone: other servers may already have installed a view
     * without it, so it must not acknowledge anything (as primary or backup) until it rejoined.
     * v: the last view this server knew. */
    VIEW_EVENT_LEASE_LOST,
    /* The lease was not renewed within its TTL because etcd could not be reached. If etcd is
     * only down, no view can change (and etcd keeps the lease when it comes back); if this
     * server is cut off from etcd but not from the others, they may install a view without
     * it. Acknowledging what every other replica of the current view applied stays safe (a
     * new primary, a replica of the current view, refuses the old epoch as soon as it
     * installed the new view); acknowledging alone (no other live replica) is not. */
    VIEW_EVENT_LEASE_UNCERTAIN,
    /* The lease is renewed again after LEASE_UNCERTAIN (same incarnation), or a new one was
     * registered after LEASE_LOST (a new incarnation: rejoin before serving). */
    VIEW_EVENT_LEASE_OK,
} view_event;

/* Called on the agent's notify thread, one call at a time and in the order the events
 * happened, never with an agent lock held: it may call any view_agent_* function but
 * view_agent_stop. The lease and poll threads never wait for it (events queue up, 64 at
 * most), but a slow callback delays the events after it: to decide whether it may
 * acknowledge, a server asks view_agent_serving() at that moment rather than relying on when
 * LEASE_UNCERTAIN arrives. */
typedef void (*view_agent_fn)(void *arg, view_event ev, const view *v);

typedef struct view_agent_config {
    const char *endpoints;  /* coordinator: "http://h1:2379,http://h2:2379" */
    const char *prefix;     /* coordinator-prefix, e.g. /psd/0123456789abcdef */
    uint32_t self;          /* this server's ps task index */
    uint32_t num_servers;   /* ps tasks of the cluster spec (2..VIEW_MAX_SERVERS) */
    uint32_t replicas;      /* 2..num_servers */
    const char *url;        /* this server's address, the value of prefix/servers/<self> */
    int64_t lease_ms;       /* lease TTL (>= 1) */
    int64_t poll_ms;        /* 0: lease_ms / 8, within 25..500 */
    int64_t start_grace_ms; /* 0: 10 * lease_ms */
    int request_timeout_ms; /* 0: lease_ms / 4, within 100..2000 */
    /* The copies of groups this server restored from its checkpoints (view_copy, server =
     * self), published at each registration (prefix/copies/<self>, under the same lease). */
    const view_copy *copies;
    size_t ncopies;
} view_agent_config;

/* Checks cfg, makes one attempt at registering and reading the view, and starts the threads.
 * Returns 0; or ETCD_EFAILED with err saying why for a bad configuration, or a view in etcd
 * made for another number of servers or replicas (a configuration error: another cluster uses
 * the prefix). etcd being unreachable is not an error: the agent keeps trying (logged). */
int view_agent_start(view_agent **out, const view_agent_config *cfg, char *err, size_t errlen);

/* Stops the threads and revokes the lease (so that the others fail over at once instead of
 * after the TTL), then frees a. NULL: nothing. Call it after the server stopped acknowledging. */
void view_agent_stop(view_agent *a);
/* view_agent_stop in two: halt stops the threads and revokes the lease (no view reaches the
 * callback after it); a stays readable (view_agent_token, view_agent_serving: replication's
 * threads may still ask it) until view_agent_free. */
void view_agent_halt(view_agent *a);
void view_agent_free(view_agent *a);

/* Sets the one callback (NULL: none). If a view is known already, fn is called with it
 * (VIEW_EVENT_VIEW) before this returns. */
void view_agent_on_change(view_agent *a, view_agent_fn fn, void *arg);

/* Leaves the cluster at a clean stop: revokes the lease now (the others install the view
 * without this server at once, instead of after the lease's TTL) and registers no more;
 * view_agent_serving is false from then on. view_agent_stop must still be called. */
void view_agent_leave(view_agent *a);

/* The cluster token (prefix/token in etcd, made by the first server that registers): the
 * secret that server-to-server calls (REPLICATE) carry, so that only the cluster's servers
 * make them. Copies it into buf and returns true once read (before this server first
 * registers); false before, or when cap is too small. */
bool view_agent_token(view_agent *a, char *buf, size_t cap);

/* Copies the newest view this agent knows into *out; false (and epoch 0) when none yet. */
bool view_agent_current(view_agent *a, view *out);

/* This server (rejoining: registered, not live) has a copy of group g's state that is caught
 * up with the primary's stream. Once every group it is a member of that has a primary is
 * marked, the agent installs a view with this server live. Marks are cleared when the lease
 * is lost. g >= num_servers: ignored. */
void view_agent_mark_caught_up(view_agent *a, uint32_t g);

/* Clears group g's mark: this server copies g again (from another primary, or after its copy
 * diverged). g >= num_servers: ignored. */
void view_agent_unmark_caught_up(view_agent *a, uint32_t g);

/* This server, as a group's primary, could not reach server s for long while s keeps its
 * lease (on: one more group's stream to s fails; off: one of them got through again). While
 * any mark stands, the agent proposes a view with s out of sync in every group this server is
 * the primary of and s an in-sync member of: s copies those groups again, and the primary
 * acknowledges without it meanwhile (an asymmetric partition). s >= num_servers: ignored. */
void view_agent_mark_unreachable(view_agent *a, uint32_t s, bool on);

/* Whether this server's copy of group g lacks what it held while in sync: a group it backs up
 * and restored no checkpoint of at start (true), or one it has kept in sync since (false, the
 * default). A server that lacks a group never becomes its primary without copying it first.
 * g >= num_servers: ignored. */
void view_agent_set_lacks(view_agent *a, uint32_t g, bool lacks);

/* Whether this server is live in the newest view with its current lease, and that lease was
 * renewed within its TTL. */
bool view_agent_serving(view_agent *a);

/* Whether view_agent_leave was called: the server is stopping and its groups move on. */
bool view_agent_leaving(view_agent *a);

/* Whether the newest view names this server live with its current lease (this incarnation, not
 * a previous process of the same task), whether or not the lease was renewed in time: the test
 * for "is a view that names me about me" that a late renewal on a busy machine does not
 * disturb. */
bool view_agent_in_view(view_agent *a);

typedef struct view_agent_stats {
    uint64_t epoch;              /* of the newest view known; 0: none */
    uint64_t views_installed;    /* by this agent's compare-and-swaps */
    uint64_t failovers;          /* groups whose primary moved, over the views seen */
    uint64_t coordinator_errors; /* failed etcd requests */
    int64_t lease_id;            /* 0: none */
    bool lease_valid;            /* renewed within its TTL */
    char last_error[512];        /* the last etcd error ("" if none yet) */
} view_agent_stats;
void view_agent_get_stats(view_agent *a, view_agent_stats *out);

/* ---- the decision, apart for tests ---- */

typedef struct view_inputs {
    const view_record *cur; /* the installed view, NULL when none */
    const int64_t *reg;     /* reg[i]: lease of registered server i, 0 when absent */
    uint32_t self, num_servers, replicas;
    bool caught_up[VIEW_MAX_SERVERS]; /* view_agent_mark_caught_up marks of self */
    /* lacks[g]: self's copy of group g is not one it kept in sync or restored from a
     * checkpoint (view_agent_set_lacks): it does not serve g without copying it first. */
    bool lacks[VIEW_MAX_SERVERS];
    /* forced[g]: an operator asked that group g, waiting without an in-sync member in cur,
     * be served by server forced_to[g] from its copy (psctl force-primary): that member is
     * then the only one in sync. */
    bool forced[VIEW_MAX_SERVERS];
    uint32_t forced_to[VIEW_MAX_SERVERS];
    /* unreachable[s]: self, a primary, could not reach server s for long
     * (view_agent_mark_unreachable): s falls out of sync in the groups self is the primary of. */
    bool unreachable[VIEW_MAX_SERVERS];
    bool grace_over;      /* start_grace_ms passed since the agent started */
    uint64_t known_epoch; /* the highest epoch this server saw: a new view goes above it */
    /* The registered servers' restored copies (view_etcd_copies), read when a new view is made
     * from scratch: no view yet, or one left over from a cluster that stopped. */
    const view_copy *copies;
    size_t ncopies;
} view_inputs;

typedef enum view_change {
    VIEW_KEEP = 0, /* nothing to change */
    VIEW_PROPOSE,  /* self is the first to propose *next */
    VIEW_FALLBACK, /* a change is due but another server should propose it first */
} view_change;

/* The next view from the inputs (rules above); next->v.epoch = 1 + the higher of cur's and
 * known_epoch. */
view_change view_decide(const view_inputs *in, view_record *next);

/* Whether a new view is made from scratch: there is none, or none of its live servers still
 * holds the lease it joined with (left over from a cluster that stopped, or whose every server
 * died). reg as in view_inputs, n servers. */
bool view_from_scratch(const view_record *cur, const int64_t *reg, uint32_t n);
/* Some group of v waits without a primary (operators' overrides are read only then). */
bool view_waits(const view *v);
/* Server s's restored copy of group g among the inputs, NULL when it registered none. */
const view_copy *view_inputs_copy(const view_inputs *in, int32_t s, uint32_t g);
/* The first live member of group g in ring order, -1 when none lives. */
int32_t view_first_live(const view *v, uint32_t g);

#endif
