/* view_etcd.h - a client of etcd's v3 HTTP/JSON gateway (etcd 3.4: POST /v3/kv/range,
 * /v3/kv/txn, /v3/kv/put, /v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive,
 * /v3/lease/revoke), and the view of a replicated cluster (view.h) kept in it.
 *
 * Transport: plain HTTP/1.1 over TCP, one connection per request ("Connection: close"),
 * blocking, every step (resolve aside, connect, send, receive) bounded by the client's
 * timeout. Endpoints are tried in order, starting with the last one that answered; a
 * transport failure (refused, timed out, reset, not HTTP) moves to the next one, an answer
 * of etcd (even an error) does not. https:// endpoints are refused (no TLS to etcd yet).
 *
 * Every function returns 0 or one of the ETCD_E* codes below, with a message naming the
 * endpoint and the cause in err (capacity errlen, always NUL-terminated). An etcd_client may
 * be used by several threads at once.
 *
 * Keys of the view under a prefix P (coordinator-prefix, e.g. /psd/0123456789abcdef):
 *     P/view         the view as JSON (view_to_json), changed only by compare-and-swap on its
 *                    mod revision
 *     P/servers/<i>  ps task i's URL, put under that server's lease: present while it lives
 * (P/slots, the slot map of a cluster with replicas 1, is slots_record.h's.)
 */
#ifndef PSD_COMMON_VIEW_ETCD_H
#define PSD_COMMON_VIEW_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "view.h"

enum {
    ETCD_OK = 0,
    ETCD_EUNREACHABLE = -1, /* no endpoint answered (connect/send/receive failed or timed out) */
    ETCD_EFAILED = -2,      /* etcd answered with an error, or with something unreadable */
    ETCD_ENOTFOUND = -3,    /* the key does not exist */
    ETCD_ECONFLICT = -4,    /* a compare-and-swap found another mod revision */
    ETCD_ELEASE = -5,       /* the lease does not exist (expired or revoked) */
};

/* Largest value, and largest answer body, the client reads. */
#define ETCD_MAX_BODY (4u << 20)

typedef struct etcd_client etcd_client;

/* Parses endpoints ("http://h1:2379,http://h2:2379"; "h:2379" means http://h:2379; at most
 * 16) and makes a client whose requests each take at most timeout_ms (>= 1) per endpoint.
 * Resolves nothing yet. Returns 0, or ETCD_EFAILED with the bad endpoint named in err. */
int etcd_client_create(etcd_client **out, const char *endpoints, int timeout_ms, char *err,
                       size_t errlen);
/* Frees c (NULL: nothing). No request may be in progress. */
void etcd_client_destroy(etcd_client *c);
/* The endpoint that answered last ("http://h:p"), for messages. */
const char *etcd_client_endpoint(const etcd_client *c);

/* Grants a lease of ttl_ms rounded up to whole seconds (etcd's unit; at least 1 s). *lease_id
 * receives its id, *ttl_s (may be NULL) the TTL etcd granted in seconds. */
int etcd_lease_grant(etcd_client *c, int64_t ttl_ms, int64_t *lease_id, int64_t *ttl_s, char *err,
                     size_t errlen);
/* Renews the lease once; *ttl_s (may be NULL) receives its new TTL in seconds. ETCD_ELEASE
 * when etcd no longer has it (it expired: the holder must consider itself gone). */
int etcd_lease_keepalive(etcd_client *c, int64_t lease_id, int64_t *ttl_s, char *err,
                         size_t errlen);
/* Revokes the lease (its keys are deleted). ETCD_ELEASE when it was already gone. */
int etcd_lease_revoke(etcd_client *c, int64_t lease_id, char *err, size_t errlen);

/* Puts key = value (vlen bytes), attached to lease_id when it is not 0. */
int etcd_put(etcd_client *c, const char *key, const void *value, size_t vlen, int64_t lease_id,
             char *err, size_t errlen);
/* Reads key: *value (NUL-terminated, caller frees) and *vlen (may be NULL) its bytes,
 * *mod_rev (may be NULL) its mod revision. ETCD_ENOTFOUND when it does not exist. */
int etcd_get(etcd_client *c, const char *key, char **value, size_t *vlen, int64_t *mod_rev,
             char *err, size_t errlen);
/* Deletes key (absent: 0 as well). */
int etcd_delete(etcd_client *c, const char *key, char *err, size_t errlen);

/* One key of a prefix read. */
typedef struct etcd_kv {
    char *key;   /* NUL-terminated */
    char *value; /* NUL-terminated; vlen bytes */
    size_t vlen;
    int64_t mod_rev;
    int64_t lease; /* 0: none */
} etcd_kv;

/* Reads every key that starts with prefix, in key order: *kvs (free with etcd_kvs_free) and
 * *n. No key: 0 with *n = 0. */
int etcd_get_prefix(etcd_client *c, const char *prefix, etcd_kv **kvs, size_t *n, char *err,
                    size_t errlen);
void etcd_kvs_free(etcd_kv *kvs, size_t n);

/* Compare-and-swap: puts key = value if its mod revision is still expect_mod_rev (0: if the
 * key does not exist), as one etcd transaction. *new_rev (may be NULL) receives the key's new
 * mod revision. ETCD_ECONFLICT when the key changed (or exists, for 0): re-read it. */
int etcd_cas(etcd_client *c, const char *key, int64_t expect_mod_rev, const void *value,
             size_t vlen, int64_t *new_rev, char *err, size_t errlen);

/* ---- the view in etcd (view_record.c) ---- */

/* A view as stored: the view plus, for each live server, the lease it held when it joined
 * (a server that restarts gets another lease, so the view sees the restart even when the new
 * process registers before the old lease expired). */
typedef struct view_record {
    view v;
    int64_t lease[VIEW_MAX_SERVERS]; /* lease[i] of live server i; 0 for the others */
} view_record;

/* Serializes r as JSON text (caller frees):
 *   {"epoch":7,"num_servers":3,"replicas":2,"primary":[0,2,2],"live":[0,2],
 *    "lease":["7587869127369", "0", "7587869127372"],"behind":[2,0,0]}
 * ("behind"[g]: view.behind, the bit set of group g's members out of sync; absent: none).
 * Returns NULL when out of memory. */
char *view_to_json(const view_record *r);
/* Parses text made by view_to_json, checking every bound (num_servers 1..VIEW_MAX_SERVERS,
 * replicas 1..num_servers, primaries -1..num_servers-1 and members of their group, live
 * indices in range). Returns 0, or ETCD_EFAILED with what is wrong in err. */
int view_from_json(const char *text, view_record *r, char *err, size_t errlen);

/* The JSON value that text holds whole (only white space after it), NULL when text is not
 * one; free with json_object_put. For the records kept in etcd (views, slot maps). */
struct json_object *etcd_json_parse(const char *text);

/* Reads prefix/view into *r and its mod revision into *mod_rev (may be NULL). ETCD_ENOTFOUND
 * when no view was installed; ETCD_EFAILED when the stored text is not a view. */
int view_etcd_read(etcd_client *c, const char *prefix, view_record *r, int64_t *mod_rev, char *err,
                   size_t errlen);
/* Installs *r as prefix/view if the view's mod revision is still expect_mod_rev (0: no view
 * yet); ETCD_ECONFLICT when another server installed one first (re-read and decide again). */
int view_etcd_cas(etcd_client *c, const char *prefix, const view_record *r, int64_t expect_mod_rev,
                  int64_t *new_rev, char *err, size_t errlen);
/* Puts prefix/servers/<index> = url under lease_id. */
int view_etcd_register(etcd_client *c, const char *prefix, uint32_t index, const char *url,
                       int64_t lease_id, char *err, size_t errlen);
/* Reads the registered servers: lease[i] = the lease of prefix/servers/<i> (0: absent), for
 * i < num_servers (keys of other indices are ignored); urls (may be NULL) receives a copy of
 * each value, cut to VIEW_URL_MAX - 1 bytes. */
#define VIEW_URL_MAX 256
int view_etcd_servers(etcd_client *c, const char *prefix, uint32_t num_servers,
                      int64_t lease[VIEW_MAX_SERVERS], char (*urls)[VIEW_URL_MAX], char *err,
                      size_t errlen);

/* Puts prefix/copies/<index> under lease_id: the copies this server restored (view_copy, its
 * own index in each), as {"lease":"<lease_id>","copies":[{"group":1,"epoch":"4","lsn":"9001"}]}. */
int view_etcd_put_copies(etcd_client *c, const char *prefix, uint32_t index,
                         const view_copy *copies, size_t n, int64_t lease_id, char *err,
                         size_t errlen);
/* Reads the copies of the registered servers: those of server i count only when its entry
 * was put under reg[i], the lease its registration holds (reg as view_etcd_servers gives it).
 * *out (free it) gets *n entries; entries that do not parse are skipped. */
int view_etcd_copies(etcd_client *c, const char *prefix, uint32_t num_servers,
                     const int64_t reg[VIEW_MAX_SERVERS], view_copy **out, size_t *n, char *err,
                     size_t errlen);

/* Operator overrides (psctl force-primary): prefix/force/<group> = "<server>@<epoch>" asks that
 * the group, waiting without an in-sync member in the view of that epoch, be served by that
 * server from the copy it holds (updates only the missing members hold are given up). */
int view_etcd_force(etcd_client *c, const char *prefix, uint32_t group, uint32_t server,
                    uint64_t epoch, char *err, size_t errlen);
/* Removes prefix/force/<group>. */
int view_etcd_unforce(etcd_client *c, const char *prefix, uint32_t group, char *err, size_t errlen);
/* Reads the overrides made for the view of epoch: forced[g] and to[g] (the server) for each
 * group g < num_servers whose entry names that epoch; others (older views, bad values) are
 * ignored. */
int view_etcd_forced(etcd_client *c, const char *prefix, uint32_t num_servers, uint64_t epoch,
                     bool forced[VIEW_MAX_SERVERS], uint32_t to[VIEW_MAX_SERVERS], char *err,
                     size_t errlen);

/* The default coordinator prefix of a cluster: "/psd/" and 16 hex digits of a hash of the ps
 * addresses, written into buf (at least 22 bytes). */
void view_default_prefix(const char *const *ps, size_t n_ps, char *buf, size_t cap);

#endif
