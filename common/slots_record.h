/* The slot map of a cluster with a coordinator, as published in etcd: its version, the slot
 * count, the servers with their addresses (those that joined after the start are not in the
 * static cluster spec) and who owns each slot; its JSON form and its key, PREFIX/slots
 * (proto/README.md, "The published slot map", gives the format for outside clients).
 *
 *     {"version":3,"slots":4096,"base":2,"servers":["10.0.0.1:2222","10.0.0.2:2222",
 *      "10.0.0.3:2222"],"moved":[[5,2],[17,2]]}
 *
 * owner(s) = the owner "moved" lists for s, else s mod base. "base" is the number of servers
 * of the static cluster spec (its "ps" list, the first "base" entries of "servers", in order);
 * "moved" lists the slots whose owner differs from s mod base, ascending. The key changes only
 * by compare-and-swap on its mod revision, each change with version + 1. */
#ifndef PSD_COMMON_SLOTS_RECORD_H
#define PSD_COMMON_SLOTS_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slots.h"
#include "view_etcd.h"

/* Most servers a published map lists. */
#define SLOTS_MAX_SERVERS 1024
/* Longest server address, NUL included. */
#define SLOTS_ADDR_MAX 256

typedef struct slots_record {
    uint64_t version;             /* 1 when made; + 1 at each change */
    uint32_t nslots;              /* a power of two (slots_count_valid) */
    uint32_t base;                /* servers of the static cluster spec: 1..nservers */
    uint32_t nservers;            /* servers listed */
    char (*addr)[SLOTS_ADDR_MAX]; /* [nservers]: each server's address, as the spec gives it */
    uint32_t *owner;              /* [nslots]: each slot's server, < nservers */
} slots_record;

/* Makes *r the static map (version 1) of the n servers at addrs over nslots slots. Returns 0,
 * or -1 when out of memory or the arguments are out of bounds (message in err). */
int slots_record_static(slots_record *r, uint32_t nslots, const char *const *addrs, uint32_t n,
                        char *err, size_t errlen);
/* Frees what *r holds and zeroes it (a zeroed record: nothing). */
void slots_record_free(slots_record *r);
/* True if some slot's owner differs from the static one (slot mod base). */
bool slots_record_moved(const slots_record *r);
/* The map r describes, for slots_owner: the static map of its base servers while no slot
 * moved (the map a cluster without a coordinator uses, so that nothing, checkpoints included,
 * tells the two apart), else the owner table (it points into r: valid while r lives
 * unchanged). */
slot_map slots_record_map(const slots_record *r);
/* Slots server `server` owns under r. */
uint32_t slots_record_count(const slots_record *r, uint32_t server);
/* Index of the server listed with address addr, or -1. */
int slots_record_find(const slots_record *r, const char *addr);
/* Appends a server with address addr that owns no slot (version unchanged: the caller bumps
 * it when publishing). Returns its index, or -1 (full, address too long, out of memory). */
int slots_record_add_server(slots_record *r, const char *addr);

/* The JSON text of r (caller frees; NULL when out of memory). */
char *slots_record_to_json(const slots_record *r);
/* Parses text made by slots_record_to_json, checking every bound (version >= 1, slots a
 * power of two, base 1..servers, servers 1..SLOTS_MAX_SERVERS distinct non-empty addresses,
 * moved slots ascending and in range, owners below the server count). Returns 0, or
 * ETCD_EFAILED with what is wrong in err. */
int slots_record_from_json(const char *text, slots_record *r, char *err, size_t errlen);

/* slots_etcd_read: the key holds something that is not a slot map. */
#define SLOTS_EMALFORMED (-16)

/* Reads PREFIX/slots into *r (free it) and its mod revision into *mod_rev (may be NULL).
 * ETCD_ENOTFOUND when no map was published; SLOTS_EMALFORMED when the text is not a map;
 * another ETCD_E* code when etcd did not answer or answered an error. */
int slots_etcd_read(etcd_client *c, const char *prefix, slots_record *r, int64_t *mod_rev,
                    char *err, size_t errlen);
/* Publishes *r as PREFIX/slots if its mod revision is still expect_mod_rev (0: none yet);
 * ETCD_ECONFLICT when it changed (re-read and decide again). */
int slots_etcd_cas(etcd_client *c, const char *prefix, const slots_record *r,
                   int64_t expect_mod_rev, int64_t *new_rev, char *err, size_t errlen);

#endif
