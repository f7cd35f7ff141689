/* cluster.h - the cluster spec: which tasks exist and where, TF_CONFIG style.
 *
 * Accepted JSON (TF_CONFIG):
 *   {"cluster": {"ps": ["h0:2222", ...], "worker": [...], "chief": [...]},
 *    "task": {"type": "ps", "index": 0}}
 * "task" is optional, other top-level keys (TF_CONFIG's "environment",
 * "rpc_layer") and other job names under "cluster" (e.g. "evaluator") are
 * ignored. A bare cluster object {"ps": [...], "worker": [...]} is accepted
 * too. Addresses are "host:port": host is a DNS name, an IPv4 address or a
 * bracketed IPv6 address ("[::1]:2222"), port is 1..65535. An address may
 * instead be an nng IPC URL "ipc://PATH" (e.g. "ipc:///run/psd/ps-0.sock",
 * a Unix domain socket for co-located processes; PATH non-empty, at most
 * CLUSTER_IPC_PATH_MAX bytes); other schemes ("tls+tcp://...", ...) are
 * rejected. ipc is local-only and never TLS: ps-server and the client refuse
 * TLS settings together with an ipc:// ps address (a configuration error).
 */
#ifndef PS_COMMON_CLUSTER_H
#define PS_COMMON_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include "options.h"

#define CLUSTER_IPC_PREFIX "ipc://"
#define CLUSTER_IPC_PATH_MAX 107 /* sizeof(sun_path) - 1 on Linux */

typedef struct cluster_spec {
    char **ps; /* "host:port" or "ipc://PATH" strings, owned; n_ps >= 1 after a parse */
    size_t n_ps;
    char **worker; /* may be empty */
    size_t n_worker;
    char **chief; /* may be empty */
    size_t n_chief;
    char task_type[16]; /* "ps", "worker", "chief", "evaluator", or "" if no task */
    int task_index;     /* -1 if no task (0 in a zeroed struct: test task_type) */
} cluster_spec;

/* Parses and validates a cluster spec from JSON text into *out, which is
 * overwritten (not freed first) and owned by the caller (cluster_fini).
 * Checks: ps is a non-empty array; every list is an array of host:port
 * strings; no address appears twice in the whole spec; the task, if any, has
 * a known type ("evaluator" needs no cluster entry, the others must have one)
 * and an index within range. Returns 0, or -1 with *out zeroed and a message in err (cap errlen)
 * naming the JSON path, e.g. `cluster.ps[1]: "127.0.0.1" is not host:port (missing :port)` or
 * `task.index 3 out of range: cluster has 2 ps tasks`. Non-blocking. */
int cluster_parse(const char *json, cluster_spec *out, char *err, size_t errlen);

/* Replaces the task of c with "type:index" (e.g. "worker:1"), validated as in
 * cluster_parse. Returns 0, or -1 with c unchanged and a message in err. */
int cluster_set_task(cluster_spec *c, const char *task, char *err, size_t errlen);

/* Builds *out from the options: the `cluster` option (JSON text, or "@path" of
 * a JSON file of at most 1 MiB) if non-empty, else the `tf-config` option
 * (TF_CONFIG); then a non-empty `task` option overrides the task. Options a
 * program's scope lacks read as their (empty) default. Returns 0, or -1 with
 * *out zeroed and a message naming the source, e.g. "TF_CONFIG: cluster.ps:
 * ..."; with neither source set: "no cluster spec: set TF_CONFIG or
 * --cluster". Blocks only to read an @file. */
int cluster_from_options(const options *o, cluster_spec *out, char *err, size_t errlen);

/* Frees every string and array of c and leaves it zeroed. Safe on a zeroed
 * struct, on a finished one, and on NULL. */
void cluster_fini(cluster_spec *c);

/* True if addr is an "ipc://PATH" address (false for NULL). */
bool cluster_is_ipc(const char *addr);

/* Writes the nng URL "tcp://host:port" for hostport into buf (cap bytes);
 * IPv6 hosts keep their brackets; an "ipc://PATH" address is copied as is. Returns 0, or -1 (buf
 * then holds "" if cap > 0) if hostport is NULL or empty or the URL does not fit. */
int cluster_url(const char *hostport, char *buf, size_t cap);

/* The address of c's own task ("host:port", owned by c), or NULL if c has no
 * task or its task (e.g. an evaluator) has no address in the cluster. */
const char *cluster_task_address(const cluster_spec *c);

#endif /* PS_COMMON_CLUSTER_H */
