/* The client's slot map: with a coordinator (replicas 1) the one the servers published in etcd
 * (PREFIX/slots, common/slots_record.h), read at open; else, or while none is published, the
 * static map of the cluster spec. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "log.h"
#include "status.h"
#include "view_etcd.h"

int client_slots_load(ps_client *c, const options *o, const cluster_spec *cl)
{
    c->slots = slots_static(SLOTS_DEFAULT, (uint32_t)cl->n_ps);
    const char *eps = opt_str(o, OPT_COORDINATOR);
    if (c->replicated || eps == NULL || eps[0] == '\0')
        return 0;
    char prefix[512], err[2048];
    const char *pfx = opt_str(o, OPT_COORDINATOR_PREFIX);
    if (pfx && pfx[0])
        snprintf(prefix, sizeof(prefix), "%s", pfx);
    else
        view_default_prefix((const char *const *)cl->ps, cl->n_ps, prefix, sizeof(prefix));
    size_t pl = strlen(prefix);
    while (pl > 1 && prefix[pl - 1] == '/')
        prefix[--pl] = '\0';
    pthread_mutex_init(&c->slots_lock, NULL);
    snprintf(c->slots_eps, sizeof(c->slots_eps), "%s", eps);
    snprintf(c->slots_prefix, sizeof(c->slots_prefix), "%s", prefix);
    etcd_client *e;
    if (etcd_client_create(&e, eps, 3000, err, sizeof(err)) != 0)
        return client_fail(PS_INVALID_ARGUMENT, "%s", err);
    int rc = slots_etcd_read(e, prefix, &c->slots_rec, NULL, err, sizeof(err));
    etcd_client_destroy(e);
    if (rc == ETCD_ENOTFOUND) /* no server started yet, or replicas > 1: the static map */
        return 0;
    if (rc == SLOTS_EMALFORMED)
        return client_fail(PS_FAILED_PRECONDITION, "%s", err);
    if (rc != 0) {
        /* etcd down: the static map. The servers check every owner, so a request placed by it
         * for a slot that moved is refused, never applied on the wrong server. */
        log_warn("cannot read the slot map from the coordinator (%s): placing by the static map "
                 "of the cluster spec",
                 err);
        return 0;
    }
    bool same = c->slots_rec.nslots == SLOTS_DEFAULT && c->slots_rec.base == cl->n_ps;
    for (size_t i = 0; same && i < cl->n_ps; i++)
        same = strcmp(c->slots_rec.addr[i], cl->ps[i]) == 0;
    if (!same) {
        slots_record_free(&c->slots_rec);
        return client_fail(PS_FAILED_PRECONDITION,
                           "the slot map under %s is not this cluster's (other servers, or "
                           "another slot count): set coordinator-prefix, or give this client the "
                           "spec the cluster started with",
                           prefix);
    }
    /* Owners that joined the cluster are connected to after the spec's servers
     * (client_slots_connect). */
    slot_map m = slots_record_map(&c->slots_rec);
    c->slots = m;
    return 0;
}

/* Connects to the servers r lists past those this client reaches (servers that joined), as
 * far as its arrays go, and raises the count once each one's entries are in place. */
static void grow(ps_client *c, const slots_record *r)
{
    int n = client_reach(c);
    while (n < c->cap_servers && (uint32_t)n < r->nservers) {
        char plain[600], url[640], label[32], err[512];
        snprintf(plain, sizeof(plain), "tcp://%s", r->addr[n]);
        snprintf(label, sizeof(label), "ps %d", n);
        if (rpc_tls_url(plain, rpc_tls_on(&c->conn_cfg.tls), url, sizeof(url)) != 0)
            break;
        rpc_conn_config cc = c->conn_cfg;
        cc.url = url;
        cc.label = label;
        if (rpc_conn_open(&c->servers[n], &cc, err, sizeof(err)) != 0) {
            log_warn("cannot connect to ps %d (%s), which joined the cluster: %s", n, r->addr[n],
                     err);
            break;
        }
        if (c->hb_conns != NULL) { /* a worker's heartbeats go there too */
            cc.connections = 1;
            cc.watch = 0;
            if (rpc_conn_open(&c->hb_conns[n], &cc, err, sizeof(err)) != 0) {
                c->hb_conns[n] = NULL;
                log_warn("no heartbeats to ps %d (%s), which joined the cluster: %s", n, r->addr[n],
                         err);
            }
        }
        atomic_store(&c->route[n], n);
        log_info("connected to ps %d (%s), which joined the cluster", n, r->addr[n]);
        n++;
        atomic_store_explicit(&c->nreach, n, memory_order_release);
    }
}

int client_slots_connect(ps_client *c)
{
    if (c->slots_rec.nslots == 0)
        return 0;
    if (c->slots_rec.nservers > (uint32_t)client_reach(c))
        grow(c, &c->slots_rec);
    slot_map m = slots_record_map(&c->slots_rec);
    for (uint32_t s = 0; s < m.nslots; s++) {
        uint32_t to = slots_owner(&m, s);
        if (to >= (uint32_t)client_reach(c))
            return client_fail(
                PS_FAILED_PRECONDITION,
                "the slot map (version %llu) gives slot %u to server %u (%s), "
                "which joined the cluster: this client cannot reach it (%s)",
                (unsigned long long)c->slots_rec.version, s, to, c->slots_rec.addr[to],
                c->cap_servers <= c->nservers ? "it reaches only the servers of its cluster spec"
                                              : "see the log");
    }
    return 0;
}

void client_slots_refresh(ps_client *c, uint64_t version)
{
    if (c->slots_eps[0] == '\0')
        return;
    pthread_mutex_lock(&c->slots_lock);
    if (c->slots_rec.nslots != 0 && c->slots_rec.version >= version) {
        pthread_mutex_unlock(&c->slots_lock);
        return; /* another call read it meanwhile */
    }
    char err[2048];
    etcd_client *e;
    slots_record r;
    int rc = etcd_client_create(&e, c->slots_eps, 3000, err, sizeof(err));
    if (rc == 0) {
        rc = slots_etcd_read(e, c->slots_prefix, &r, NULL, err, sizeof(err));
        etcd_client_destroy(e);
    }
    bool reach = rc == 0 && r.nslots == SLOTS_DEFAULT;
    if (reach && r.nservers > (uint32_t)client_reach(c))
        grow(c, &r);
    for (uint32_t s = 0; reach && s < r.nslots; s++)
        reach = r.owner[s] < (uint32_t)client_reach(c);
    if (rc == 0 && !reach)
        snprintf(err, sizeof(err),
                 "the map (version %llu) gives slots to servers this client does not reach",
                 (unsigned long long)r.version);
    slots_record *g = reach ? realloc(c->old_recs, (c->nold_recs + 1) * sizeof(*g)) : NULL;
    if (reach && g != NULL) {
        c->old_recs = g;
        c->old_recs[c->nold_recs++] = c->slots_rec; /* calls in flight may read it */
        c->slots_rec = r;
        slot_map m = slots_record_map(&c->slots_rec);
        /* Owners this client does not reach (servers that joined) keep their old entry:
         * the servers redirect such requests. */
        c->slots.nslots = m.nslots;
        c->slots.nservers = m.nservers;
        __atomic_store_n(&c->slots.owner, m.owner, __ATOMIC_RELEASE);
        log_info("slot map version %llu read from the coordinator (slots moved)",
                 (unsigned long long)c->slots_rec.version);
    } else {
        if (rc == 0)
            slots_record_free(&r);
        log_warn("cannot use the slot map of the coordinator (%s): following the servers' "
                 "redirects",
                 rc || !reach ? err : "out of memory");
    }
    pthread_mutex_unlock(&c->slots_lock);
}

void client_slots_free(ps_client *c)
{
    slots_record_free(&c->slots_rec);
    for (size_t i = 0; i < c->nold_recs; i++)
        slots_record_free(&c->old_recs[i]);
    free(c->old_recs);
    c->old_recs = NULL;
    c->nold_recs = 0;
    if (c->slots_eps[0])
        pthread_mutex_destroy(&c->slots_lock);
}
