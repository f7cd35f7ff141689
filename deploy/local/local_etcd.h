/* local_etcd.h - the etcd server ps-local starts for a replicated cluster (--replicas > 1):
 * its data in a private temporary directory removed when it stops, listening on loopback. */
#ifndef PSD_LOCAL_ETCD_H
#define PSD_LOCAL_ETCD_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct local_etcd {
    pid_t pid;          /* 0: not running */
    char dir[PATH_MAX]; /* data directory and log; "" when none */
    char endpoint[64];  /* http://127.0.0.1:PORT */
} local_etcd;

/* Finds the etcd executable: `configured` when not empty (a path, or a name looked up in
 * PATH), else /usr/bin/etcd, else etcd in PATH. Writes it into out; returns 0 or -1. */
int local_etcd_find(const char *configured, char *out, size_t cap);

/* Starts etcd (binary bin) on 127.0.0.1:client_port and peer_port with its data under a new
 * directory parent/ps-local-etcd.PID.XXXXXX, in its own process group (it dies with the
 * caller), and waits up to 15 s until it answers. Returns 0, or -1 with err saying why (the
 * log's path included); nothing is left running or on disk then. */
int local_etcd_start(local_etcd *e, const char *bin, const char *parent, int client_port,
                     int peer_port, char *err, size_t errlen);

/* Stops etcd (SIGTERM, SIGKILL after 3 s) and removes its directory. Safe to call twice. */
void local_etcd_stop(local_etcd *e);

#endif
