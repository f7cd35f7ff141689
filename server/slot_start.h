/* slot_start.h - the slot map a ps-server starts with when a coordinator is set (replicas 1):
 * read from etcd (PREFIX/slots, common/slots_record.h), published as the static map of the
 * cluster spec by the first server when absent, or, for a server started with join, the
 * published map with this server appended, owning no slot; and the cluster token servers
 * send each other. */
#ifndef PSD_SERVER_SLOT_START_H
#define PSD_SERVER_SLOT_START_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "slots_record.h"

typedef struct slot_start_config {
    const char *endpoints; /* coordinator */
    const char *prefix;    /* coordinator-prefix; "" or NULL: the cluster's default */
    const cluster_spec *cl;
    /* join: this server's address (host:port) to register; NULL: the spec's task */
    const char *join_addr;
    int wait_ms; /* how long an unreachable coordinator is retried */
} slot_start_config;

/* Fills *rec (free it with slots_record_free) and *self, this server's index in it. Returns
 * 0; PROGRAM_EXIT_CONFIG (2) when the map cannot be this server's (another cluster's servers,
 * another slot count, a join address of the spec, no map to join), or 1 when the coordinator
 * did not answer within wait_ms; the message in err. */
int slot_start(const slot_start_config *cfg, slots_record *rec, uint32_t *self, char *err,
               size_t errlen);

/* The cluster's prefix in etcd: coordinator-prefix (prefix; "" or NULL: the default of the
 * spec's servers), without a trailing '/'. */
void slot_prefix(const char *prefix, const cluster_spec *cl, char *buf, size_t cap);

/* The address a joining server registers for the listen URL `listen` ("tcp://h:p" or "h:p"):
 * "h:p" in buf. Returns 0, or -1 with why in err (ipc://, a wildcard host, no port). */
int slot_join_address(const char *listen, char *buf, size_t cap, char *err, size_t errlen);

/* The cluster token, PREFIX/token in etcd (made there, 32 random hex digits, by the first
 * server that needs it, as the replication's agent makes it): what server-to-server requests
 * carry (SLOT_INSTALL). Returns 0 with it in buf, or -1 with why in err. */
int slot_cluster_token(const char *endpoints, const char *prefix, char *buf, size_t cap, char *err,
                       size_t errlen);

#endif
