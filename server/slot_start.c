/* slot_start.c - the slot map a ps-server starts with (slot_start.h). */
#include "slot_start.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "program.h"
#include "util.h"

/* Checks that rec is the map of this cluster spec: PROGRAM_EXIT_CONFIG with why, else 0. */
static int check_map(const slot_start_config *cfg, const char *prefix, const slots_record *rec,
                     char *err, size_t errlen)
{
    const cluster_spec *cl = cfg->cl;
    if (rec->nslots != SLOTS_DEFAULT)
        return errf(err, errlen,
                    "the slot map under %s has %u slots and this server %u: the slot count "
                    "differs between servers (every server of a cluster must be of one release)",
                    prefix, rec->nslots, SLOTS_DEFAULT),
               PROGRAM_EXIT_CONFIG;
    bool same = rec->base == cl->n_ps;
    for (size_t i = 0; same && i < cl->n_ps; i++)
        same = strcmp(rec->addr[i], cl->ps[i]) == 0;
    if (!same)
        return errf(err, errlen,
                    "the slot map under %s starts with %u server(s) (first %s) but the cluster "
                    "spec names %zu (first %s): another cluster uses coordinator-prefix %s (set "
                    "coordinator-prefix, or give this server the spec the cluster started with)",
                    prefix, rec->base, rec->addr[0], cl->n_ps, cl->ps[0], prefix),
               PROGRAM_EXIT_CONFIG;
    return 0;
}

/* One attempt: 0 (done), an ETCD_E* code to retry (unreachable, conflict), or
 * PROGRAM_EXIT_CONFIG. */
static int attempt(const slot_start_config *cfg, etcd_client *c, const char *prefix,
                   slots_record *rec, uint32_t *self, char *err, size_t errlen)
{
    const cluster_spec *cl = cfg->cl;
    int64_t rev = 0;
    int rc = slots_etcd_read(c, prefix, rec, &rev, err, errlen);
    if (rc == SLOTS_EMALFORMED)
        return PROGRAM_EXIT_CONFIG;
    if (rc == ETCD_ENOTFOUND && cfg->join_addr)
        return errf(err, errlen,
                    "join: no slot map under %s in etcd %s: start the cluster's servers (with "
                    "this coordinator) before a server joins it",
                    prefix, etcd_client_endpoint(c)),
               PROGRAM_EXIT_CONFIG;
    if (rc == ETCD_ENOTFOUND) {
        if (slots_record_static(rec, SLOTS_DEFAULT, (const char *const *)cl->ps, (uint32_t)cl->n_ps,
                                err, errlen) != 0)
            return PROGRAM_EXIT_CONFIG;
        rc = slots_etcd_cas(c, prefix, rec, 0, NULL, err, errlen);
        if (rc != 0) {
            slots_record_free(rec);
            return rc;
        }
        log_info("published the static slot map of %zu servers under %s/slots", cl->n_ps, prefix);
        *self = (uint32_t)cl->task_index;
        return 0;
    }
    if (rc != 0)
        return rc;
    if ((rc = check_map(cfg, prefix, rec, err, errlen)) != 0) {
        slots_record_free(rec);
        return rc;
    }
    if (cfg->join_addr == NULL) {
        *self = (uint32_t)cl->task_index;
        return 0;
    }
    int at = slots_record_find(rec, cfg->join_addr);
    if (at >= 0 && (uint32_t)at < rec->base) {
        slots_record_free(rec);
        return errf(err, errlen,
                    "join: %s is ps %d of the cluster spec: a joining server listens at an "
                    "address that is not yet a member",
                    cfg->join_addr, at),
               PROGRAM_EXIT_CONFIG;
    }
    if (at >= 0) { /* registered before: a restart */
        log_info("join: %s is server %d of the slot map already (version %llu), owning %u slots",
                 cfg->join_addr, at, (unsigned long long)rec->version,
                 slots_record_count(rec, (uint32_t)at));
        *self = (uint32_t)at;
        return 0;
    }
    at = slots_record_add_server(rec, cfg->join_addr);
    if (at < 0) {
        slots_record_free(rec);
        return errf(err, errlen, "join: the slot map lists %d servers already (the most)",
                    SLOTS_MAX_SERVERS),
               PROGRAM_EXIT_CONFIG;
    }
    rec->version++;
    rc = slots_etcd_cas(c, prefix, rec, rev, NULL, err, errlen);
    if (rc != 0) {
        slots_record_free(rec);
        return rc;
    }
    log_info("join: registered %s as server %d of the slot map (version %llu), owning no slot",
             cfg->join_addr, at, (unsigned long long)rec->version);
    *self = (uint32_t)at;
    return 0;
}

void slot_prefix(const char *prefix, const cluster_spec *cl, char *buf, size_t cap)
{
    if (prefix && prefix[0])
        snprintf(buf, cap, "%s", prefix);
    else
        view_default_prefix((const char *const *)cl->ps, cl->n_ps, buf, cap);
    size_t pl = strlen(buf);
    while (pl > 1 && buf[pl - 1] == '/')
        buf[--pl] = '\0';
}

int slot_start(const slot_start_config *cfg, slots_record *rec, uint32_t *self, char *err,
               size_t errlen)
{
    char prefix[512];
    slot_prefix(cfg->prefix, cfg->cl, prefix, sizeof(prefix));
    etcd_client *c;
    if (etcd_client_create(&c, cfg->endpoints, 2000, err, errlen) != 0)
        return PROGRAM_EXIT_CONFIG;
    memset(rec, 0, sizeof(*rec));
    int waited_ms = 0, rc;
    for (;;) {
        rc = attempt(cfg, c, prefix, rec, self, err, errlen);
        if (rc == 0 || rc == PROGRAM_EXIT_CONFIG)
            break;
        if (rc == ETCD_ECONFLICT) /* another server changed the map: read it again */
            continue;
        /* Unreachable, or an error of etcd (no leader yet while it starts): wait and retry. */
        if (waited_ms >= cfg->wait_ms) {
            char why[1024];
            snprintf(why, sizeof(why), "%s", err);
            errf(err, errlen, "cannot read the slot map from the coordinator after %d ms: %s",
                 waited_ms, why);
            rc = 1;
            break;
        }
        if (waited_ms % 5000 == 0)
            log_warn("slot map: %s (retrying for up to %d ms)", err, cfg->wait_ms - waited_ms);
        struct timespec ts = {0, 500 * 1000000};
        nanosleep(&ts, NULL);
        waited_ms += 500;
    }
    etcd_client_destroy(c);
    return rc;
}

int slot_join_address(const char *listen, char *buf, size_t cap, char *err, size_t errlen)
{
    const char *hp = listen;
    if (strncmp(hp, "tcp://", 6) == 0)
        hp += 6;
    else if (strstr(hp, "://"))
        return errf(err, errlen,
                    "join: listen \"%s\": a joining server needs a tcp://host:port address "
                    "(clients and servers reach it there)",
                    listen),
               -1;
    const char *colon = strrchr(hp, ':');
    if (colon == NULL || colon == hp || colon[1] == '\0')
        return errf(err, errlen, "join: listen \"%s\": expected host:port", listen), -1;
    size_t hl = (size_t)(colon - hp);
    if ((hl == 7 && strncmp(hp, "0.0.0.0", 7) == 0) || (hl == 1 && hp[0] == '*') ||
        (hl == 4 && strncmp(hp, "[::]", 4) == 0))
        return errf(err, errlen,
                    "join: listen \"%s\": a wildcard host is not an address others can reach; "
                    "give this server's own host",
                    listen),
               -1;
    if (strlen(hp) >= cap || strlen(hp) >= SLOTS_ADDR_MAX)
        return errf(err, errlen, "join: listen \"%s\" is too long", listen), -1;
    snprintf(buf, cap, "%s", hp);
    return 0;
}

int slot_cluster_token(const char *endpoints, const char *prefix, char *buf, size_t cap, char *err,
                       size_t errlen)
{
    etcd_client *c;
    if (etcd_client_create(&c, endpoints, 2000, err, errlen) != 0)
        return -1;
    char key[600];
    snprintf(key, sizeof(key), "%s/token", prefix);
    int rc = -1;
    for (int tries = 0; tries < 3 && rc != 0; tries++) {
        char *val = NULL;
        size_t len = 0;
        int g = etcd_get(c, key, &val, &len, NULL, err, errlen);
        if (g == 0) {
            bool ok = len >= 16 && len < cap;
            for (size_t i = 0; ok && i < len; i++)
                ok = (val[i] >= '0' && val[i] <= '9') || (val[i] >= 'a' && val[i] <= 'f');
            if (ok) {
                memcpy(buf, val, len);
                buf[len] = '\0';
                rc = 0;
            } else {
                errf(err, errlen, "%s holds no cluster token (16 to %zu hex digits)", key, cap - 1);
            }
            free(val);
            break;
        }
        if (g != ETCD_ENOTFOUND)
            break;
        /* None yet: made as the replication's agent makes it (16 random bytes in hex, by CAS
         * on the absent key; a conflict means another server put one first: read it). */
        uint8_t raw[16];
        char hex[33];
        FILE *f = fopen("/dev/urandom", "rb");
        bool got = f && fread(raw, 1, sizeof(raw), f) == sizeof(raw);
        if (f)
            fclose(f);
        if (!got) {
            errf(err, errlen, "cannot read /dev/urandom for the cluster token");
            break;
        }
        for (size_t i = 0; i < sizeof(raw); i++)
            snprintf(hex + 2 * i, 3, "%02x", raw[i]);
        int cas = etcd_cas(c, key, 0, hex, 32, NULL, err, errlen);
        if (cas != 0 && cas != ETCD_ECONFLICT)
            break;
    }
    etcd_client_destroy(c);
    return rc;
}
