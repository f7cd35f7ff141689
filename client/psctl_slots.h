/* psctl slots: the slot map a cluster with a coordinator published in etcd. */
#ifndef PSD_CLIENT_PSCTL_SLOTS_H
#define PSD_CLIENT_PSCTL_SLOTS_H

#include <stdbool.h>

#include "cluster.h"
#include "options.h"

/* Reads PREFIX/slots from the etcd of `coordinator` and prints the map's version, each server
 * (task, address, slots owned, whether it joined after the start) and the moves in progress,
 * as text or one JSON object on stdout:
 *   {"version":2,"slots":4096,"prefix":"/psd/...","servers":[{"task":0,
 *    "address":"10.0.0.1:2222","slots":2048,"joined":false},...],"moves":[],
 *    "split_servers":2}
 * Returns 0; 1 when etcd cannot be read or holds no map; 2 when coordinator is not set or is
 * malformed (message on stderr). */
int psctl_slots(const options *o, const cluster_spec *cl, bool json);

#endif
