/* psctl view: the view of a replicated cluster, read from its coordinator (etcd); the
 * coordinator's connection, which psctl slots uses too. */
#ifndef PSD_CLIENT_PSCTL_VIEW_H
#define PSD_CLIENT_PSCTL_VIEW_H

#include <stdbool.h>

#include "cluster.h"
#include "options.h"
#include "view_etcd.h"

/* Connects to the cluster's coordinator: *c and its prefix (coordinator-prefix, else the
 * cluster's default, without a trailing '/'). Returns 0, or 2 with a message on stderr naming
 * the command `what` (coordinator not set or malformed). */
int psctl_coordinator_open(const options *o, const cluster_spec *cl, const char *what,
                           etcd_client **c, char *prefix, size_t cap);

/* Reads PREFIX/view and PREFIX/servers/ from the etcd of `coordinator` (prefix:
 * coordinator-prefix, else the cluster's default) and prints the epoch, each group's primary
 * and backups (live or missing), and each server (registered, live, rejoining) as text or one
 * JSON object on stdout. Returns 0; 1 when etcd cannot be read or holds no view; 2 when
 * coordinator is not set or is malformed (message on stderr). */
int psctl_view(const options *o, const cluster_spec *cl, bool json);

/* psctl force-primary GROUP SERVER: makes SERVER, a live member, the primary of GROUP while the
 * group waits without an in-sync member, giving up the updates only its missing in-sync members
 * hold. Puts PREFIX/force/GROUP for the view in force, waits up to wait_ms for a view with
 * SERVER as the group's primary, then removes the key. Returns 0 once it is; 1 when the group
 * has a primary, SERVER is not live, etcd fails, or the view does not follow in time; 2 on bad
 * arguments or no coordinator (message on stderr). */
int psctl_force_primary(const options *o, const cluster_spec *cl, const char *group_arg,
                        const char *server_arg, int wait_ms, bool json);

#endif
