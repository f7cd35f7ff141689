/* Restarts a TCP or TLS listener that nng stopped.
 *
 * nng 1.5.2 stops a listener for good when an accepted connection fails with NNG_ECLOSED
 * before it becomes a pipe, which a peer causes by closing its end while the server writes
 * the TLS handshake or the SP header (EPIPE maps to NNG_ECLOSED, which the listener takes for
 * its own close). Connections then still complete their handshakes in the transport but are
 * never handed to the socket: the server serves no new client, silently. The guard watches the
 * listener's nng statistics ("other" errors, "accept"s) and the host's TCP table: after such an
 * error, no accept for a second and a connection to the port that is not a pipe, it has the
 * owner close the listener and listen again (the listener's connections are closed with it;
 * their clients reconnect). */
#ifndef PSD_LISTEN_GUARD_H
#define PSD_LISTEN_GUARD_H

#include <stdint.h>
#include <nng/nng.h>

typedef struct listen_guard listen_guard;

typedef struct listen_guard_ops {
    /* Connections that are pipes of the socket now (open, past ADD_PRE). */
    int (*pipes)(void *arg);
    /* Closes *l and listens again on the same address: 0 and the new listener in *l. */
    int (*restart)(void *arg, nng_listener *l, char *err, size_t errlen);
} listen_guard_ops;

/* Starts watching l (listening on TCP port `port`, named `url` in log lines); NULL when the
 * guard cannot run (no nng statistics, no thread), which it logs. */
listen_guard *listen_guard_start(nng_listener l, unsigned port, const char *url,
                                 const listen_guard_ops *ops, void *arg);
/* Stops the guard (joins its thread) and frees it; NULL is fine. */
void listen_guard_stop(listen_guard *g);

/* Established TCP connections whose local port is `port` in a file of /proc/net/tcp's format
 * (tcp or tcp6), or -1 when it cannot be read. */
int listen_guard_established(const char *path, unsigned port);

#endif
