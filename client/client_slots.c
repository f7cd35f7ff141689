/* The client's slot map: with a coordinator (replicas 1) the one the servers published in etcd
 * (PREFIX/slots, common/slots_record.h), read at open; else, or while none is published, the
 * static map of the cluster spec. */
#include <stdio.h>
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
    slot_map m = slots_record_map(&c->slots_rec);
    for (uint32_t s = 0; s < m.nslots; s++)
        if (slots_owner(&m, s) >= cl->n_ps) {
            uint32_t to = slots_owner(&m, s);
            client_fail(PS_FAILED_PRECONDITION,
                        "the slot map (version %llu) gives slot %u to server %u (%s), which "
                        "joined the cluster: this client reaches only the %zu servers of its "
                        "cluster spec",
                        (unsigned long long)c->slots_rec.version, s, to, c->slots_rec.addr[to],
                        cl->n_ps);
            slots_record_free(&c->slots_rec);
            return PS_FAILED_PRECONDITION;
        }
    c->slots = m;
    return 0;
}
