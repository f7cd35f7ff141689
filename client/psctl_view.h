/* psctl view: the view of a replicated cluster, read from its coordinator (etcd). */
#ifndef PSD_CLIENT_PSCTL_VIEW_H
#define PSD_CLIENT_PSCTL_VIEW_H

#include <stdbool.h>

#include "cluster.h"
#include "options.h"

/* Reads PREFIX/view and PREFIX/servers/ from the etcd of `coordinator` (prefix:
 * coordinator-prefix, else the cluster's default) and prints the epoch, each group's primary
 * and backups (live or missing), and each server (registered, live, rejoining) as text or one
 * JSON object on stdout. Returns 0; 1 when etcd cannot be read or holds no view; 2 when
 * coordinator is not set or is malformed (message on stderr). */
int psctl_view(const options *o, const cluster_spec *cl, bool json);

#endif
