/* The view of a replicated cluster (replicas > 1): which servers hold a live lease and which
 * server serves each replica group as its primary, numbered by an epoch that every change bumps.
 *
 * A replica group is one placement task's whole state (store, tables, dedup window, clocks):
 * group g's members are servers g, g+1, ..., g+replicas-1 (mod num_servers) in ring order, its
 * primary is the first of them while it lives. The view is kept in a coordinator (etcd, through
 * its v3 HTTP/JSON gateway), never decided by a protocol of our own: a change is a compare-and-swap
 * of the view key on its mod revision, so two servers that both see a primary's lease expire cannot
 * both install a view. Every request and replication message carries the epoch it was sent under;
 * a server refuses older epochs. With replicas = 1 there is no view and no coordinator. */
#ifndef PSD_COMMON_VIEW_H
#define PSD_COMMON_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VIEW_MAX_SERVERS 256

typedef struct view {
    uint64_t epoch;       /* 0: no view installed yet */
    uint32_t num_servers; /* of the cluster spec */
    uint32_t replicas;    /* members per group, 1..num_servers */
    /* primary[g]: the server index that serves group g as primary, -1 when no member lives. */
    int32_t primary[VIEW_MAX_SERVERS];
    /* live[i]: server i is a member of this view (held a lease when it was installed). */
    uint8_t live[VIEW_MAX_SERVERS];
    /* behind[g]: bit k set when member k of group g (view_member) is out of sync: it may lack
     * updates acknowledged on g (it was out of the view while they were, or its copy is still
     * catching up). A member with its bit clear is in sync: it applied every update
     * acknowledged on g up to the moment it left the view, if it did. Only an in-sync member
     * becomes g's primary; a group whose in-sync members are all down has none (primary -1)
     * until one of them comes back. All clear (zero) is every member in sync. */
    uint64_t behind[VIEW_MAX_SERVERS];
} view;

/* A server's copy of a group as restored from its checkpoint, published with its registration
 * (prefix/copies/<server>) so that the first view after a whole-cluster restart makes the
 * member with the newest copy the group's primary, not a member whose copy is older (one that
 * was down while another served the group). Newer: the higher epoch, then the higher lsn. */
typedef struct view_copy {
    uint32_t server, group;
    uint64_t epoch; /* the view epoch the copy's server was at when it was checkpointed */
    uint64_t lsn;   /* the group's next log position: the copy holds every operation before it */
} view_copy;

/* Whether copy a is newer than b. */
static inline bool view_copy_newer(const view_copy *a, const view_copy *b)
{
    return a->epoch > b->epoch || (a->epoch == b->epoch && a->lsn > b->lsn);
}

/* The k-th member of group g in ring order (k = 0 is the placement server). */
static inline uint32_t view_member(const view *v, uint32_t g, uint32_t k)
{
    return (g + k) % v->num_servers;
}

/* Whether server s is a member (primary or backup) of group g. */
static inline bool view_is_member(const view *v, uint32_t g, uint32_t s)
{
    return (s + v->num_servers - g) % v->num_servers < v->replicas;
}

/* Whether server s is an in-sync member of group g (view.behind). */
static inline bool view_in_sync(const view *v, uint32_t g, uint32_t s)
{
    uint32_t k = (s + v->num_servers - g) % v->num_servers;
    return k < v->replicas && k < 64 && !((v->behind[g] >> k) & 1u);
}

/* Marks server s, a member of group g, in sync or behind. */
static inline void view_set_in_sync(view *v, uint32_t g, uint32_t s, bool in_sync)
{
    uint32_t k = (s + v->num_servers - g) % v->num_servers;
    if (k >= v->replicas || k >= 64)
        return;
    if (in_sync)
        v->behind[g] &= ~((uint64_t)1 << k);
    else
        v->behind[g] |= (uint64_t)1 << k;
}

#endif
