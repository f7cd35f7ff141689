/* Restarts a listener that nng 1.5.2 stopped (listen_guard.h). */
#include "listen_guard.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "log.h"
#include "timeutil.h"

#define GUARD_TICK_MS 200
/* How long connections must wait, after an accept error and with no accept since, for the
 * listener to count as stopped (one that is only cooling down after an error accepts again
 * after 100 ms, and a handshake on loopback takes milliseconds). */
#define GUARD_WAIT_NS 1000000000ull

struct listen_guard {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    nng_listener l;
    unsigned port;
    char url[256];
    listen_guard_ops ops;
    void *arg;
};

int listen_guard_established(const char *path, unsigned port)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[512];
    int n = 0;
    if (fgets(line, sizeof(line), f) == NULL) { /* the header line */
        fclose(f);
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        unsigned lport, st;
        if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", &lport, &st) == 2 &&
            lport == port && st == 0x01) /* TCP_ESTABLISHED */
            n++;
    }
    fclose(f);
    return n;
}

/* Connections to the port that are not pipes of the socket: 0 when none or unknown. */
static int waiting_connections(listen_guard *g)
{
    int v4 = listen_guard_established("/proc/self/net/tcp", g->port);
    int v6 = listen_guard_established("/proc/self/net/tcp6", g->port);
    if (v4 < 0 && v6 < 0)
        return 0;
    int n = (v4 > 0 ? v4 : 0) + (v6 > 0 ? v6 : 0) - g->ops.pipes(g->arg);
    return n > 0 ? n : 0;
}

/* The listener's accepts and accept errors of the kind that can stop it ("other": the
 * NNG_ECLOSED of a failed connection lands there, with other errors it recovers from). */
static int listener_counts(nng_listener l, uint64_t *accepts, uint64_t *others)
{
    nng_stat *all;
    if (nng_stats_get(&all) != 0)
        return -1;
    int rv = -1;
    nng_stat *ls = nng_stat_find_listener(all, l);
    nng_stat *a = ls ? nng_stat_find(ls, "accept") : NULL;
    nng_stat *o = ls ? nng_stat_find(ls, "other") : NULL;
    if (a && o) {
        *accepts = nng_stat_value(a);
        *others = nng_stat_value(o);
        rv = 0;
    }
    nng_stats_free(all);
    return rv;
}

/* Waits one tick; false when the guard is to stop. */
static bool guard_tick(listen_guard *g)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)GUARD_TICK_MS * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&g->lock);
    if (!g->stop)
        pthread_cond_timedwait(&g->cond, &g->lock, &ts);
    bool go_on = !g->stop;
    pthread_mutex_unlock(&g->lock);
    return go_on;
}

static void *guard_main(void *arg)
{
    listen_guard *g = arg;
    uint64_t accepts = 0, others = 0, last_others = 0, accepts_then = 0, waiting_since = 0;
    bool suspect = false;
    (void)listener_counts(g->l, &accepts, &last_others);
    while (guard_tick(g)) {
        if (listener_counts(g->l, &accepts, &others) != 0)
            continue;
        if (suspect && accepts != accepts_then)
            suspect = false; /* accepted since the error: it runs */
        if (others != last_others) {
            last_others = others;
            if (!suspect) {
                suspect = true;
                accepts_then = accepts;
            }
        }
        int waiting = suspect ? waiting_connections(g) : 0;
        if (waiting == 0) {
            waiting_since = 0;
            continue;
        }
        uint64_t now = time_now_ns();
        if (waiting_since == 0)
            waiting_since = now;
        if (now - waiting_since < GUARD_WAIT_NS)
            continue;
        log_warn("the listener on %s accepts no connection (%d waiting for %.1f s since a "
                 "connection failed mid-handshake; nng 1.5.2 stops a listener then): listening "
                 "again, which closes its open connections (their clients reconnect)",
                 g->url, waiting, (double)(now - waiting_since) / 1e9);
        char err[256];
        nng_listener l = g->l;
        if (g->ops.restart(g->arg, &l, err, sizeof(err)) != 0) {
            log_error("listening again on %s: %s (trying again)", g->url, err);
            waiting_since = 0;
            continue;
        }
        g->l = l;
        suspect = false;
        waiting_since = 0;
        accepts = others = 0;
        (void)listener_counts(g->l, &accepts, &last_others);
    }
    return NULL;
}

listen_guard *listen_guard_start(nng_listener l, unsigned port, const char *url,
                                 const listen_guard_ops *ops, void *arg)
{
    uint64_t a, o;
    if (listener_counts(l, &a, &o) != 0) {
        log_warn("no guard of the listener on %s: nng keeps no statistics of it", url);
        return NULL;
    }
    listen_guard *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    g->l = l;
    g->port = port;
    snprintf(g->url, sizeof(g->url), "%s", url);
    g->ops = *ops;
    g->arg = arg;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    if (pthread_create(&g->thread, NULL, guard_main, g) != 0) {
        log_warn("no guard of the listener on %s: cannot start its thread", url);
        pthread_mutex_destroy(&g->lock);
        pthread_cond_destroy(&g->cond);
        free(g);
        return NULL;
    }
    return g;
}

void listen_guard_stop(listen_guard *g)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->lock);
    g->stop = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free(g);
}
