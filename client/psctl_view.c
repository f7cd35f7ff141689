/* psctl view (psctl_view.h). */
#include "psctl_view.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psctl_json.h"
#include "view_etcd.h"

int psctl_coordinator_open(const options *o, const cluster_spec *cl, const char *what,
                           etcd_client **c, char *prefix, size_t cap)
{
    const char *eps = opt_str(o, OPT_COORDINATOR);
    if (eps == NULL || eps[0] == '\0') {
        fprintf(stderr,
                "psctl: %s: set coordinator to the etcd endpoints of the cluster "
                "(e.g. --coordinator http://127.0.0.1:2379): the %s lives there\n",
                what, strcmp(what, "slots") == 0 ? "slot map" : "view");
        return 2;
    }
    const char *pfx = opt_str(o, OPT_COORDINATOR_PREFIX);
    if (pfx && pfx[0])
        snprintf(prefix, cap, "%s", pfx);
    else
        view_default_prefix((const char *const *)cl->ps, cl->n_ps, prefix, cap);
    size_t pl = strlen(prefix);
    while (pl > 1 && prefix[pl - 1] == '/')
        prefix[--pl] = '\0';
    char err[2048];
    if (etcd_client_create(c, eps, 3000, err, sizeof(err)) != 0) {
        fprintf(stderr, "psctl: %s: %s\n", what, err);
        return 2;
    }
    return 0;
}

/* Reads the view into *r (rev: its revision). Returns 0, or 1 with a message on stderr. */
static int read_view(etcd_client *c, const char *prefix, const char *what, view_record *r,
                     int64_t *rev)
{
    char err[2048];
    int rc = view_etcd_read(c, prefix, r, rev, err, sizeof(err));
    if (rc == ETCD_ENOTFOUND) {
        fprintf(stderr,
                "psctl: %s: no view under %s in etcd %s (replicas 1, no server started yet, "
                "or another coordinator-prefix)\n",
                what, prefix, etcd_client_endpoint(c));
        return 1;
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: %s: %s\n", what, err);
        return 1;
    }
    return 0;
}

int psctl_view(const options *o, const cluster_spec *cl, bool json)
{
    char prefix[512], err[2048];
    etcd_client *c;
    int rc = psctl_coordinator_open(o, cl, "view", &c, prefix, sizeof(prefix));
    if (rc != 0)
        return rc;
    static view_record r;
    int64_t rev = 0;
    if (read_view(c, prefix, "view", &r, &rev) != 0) {
        etcd_client_destroy(c);
        return 1;
    }
    static int64_t lease[VIEW_MAX_SERVERS];
    static char urls[VIEW_MAX_SERVERS][VIEW_URL_MAX];
    rc = view_etcd_servers(c, prefix, r.v.num_servers, lease, urls, err, sizeof(err));
    etcd_client_destroy(c);
    if (rc != 0) {
        fprintf(stderr, "psctl: view: %s\n", err);
        return 1;
    }
    const view *v = &r.v;
    uint32_t n = v->num_servers;
    if (json) {
        printf("{\"command\":\"view\",\"prefix\":");
        psctl_json_str(stdout, prefix);
        printf(",\"epoch\":%" PRIu64 ",\"revision\":%" PRId64 ",\"num_servers\":%u,"
               "\"replicas\":%u,\"groups\":[",
               v->epoch, rev, n, v->replicas);
        for (uint32_t g = 0; g < n; g++) {
            printf("%s{\"group\":%u,\"primary\":%d,\"backups\":[", g ? "," : "", g,
                   (int)v->primary[g]);
            int k2 = 0;
            for (uint32_t k = 0; k < v->replicas; k++) {
                uint32_t s = view_member(v, g, k);
                if ((int32_t)s != v->primary[g] && v->live[s])
                    printf("%s%u", k2++ ? "," : "", s);
            }
            printf("],\"missing\":[");
            k2 = 0;
            for (uint32_t k = 0; k < v->replicas; k++) {
                uint32_t s = view_member(v, g, k);
                if (!v->live[s])
                    printf("%s%u", k2++ ? "," : "", s);
            }
            printf("],\"behind\":[");
            k2 = 0;
            for (uint32_t k = 0; k < v->replicas; k++) {
                uint32_t s = view_member(v, g, k);
                if (v->live[s] && !view_in_sync(v, g, s))
                    printf("%s%u", k2++ ? "," : "", s);
            }
            printf("]}");
        }
        printf("],\"servers\":[");
        for (uint32_t i = 0; i < n; i++) {
            bool reg = lease[i] != 0, cur = v->live[i] && lease[i] == r.lease[i];
            printf("%s{\"index\":%u,\"registered\":%s,\"live\":%s,\"rejoining\":%s,\"url\":",
                   i ? "," : "", i, reg ? "true" : "false", cur ? "true" : "false",
                   reg && !v->live[i] ? "true" : "false");
            psctl_json_str(stdout, urls[i]);
            printf("}");
        }
        printf("]}\n");
        return 0;
    }
    printf("view epoch %" PRIu64 " under %s: %u servers, %u replicas\n", v->epoch, prefix, n,
           v->replicas);
    printf("%-6s %-8s %-16s %s\n", "group", "primary", "live backups", "missing");
    for (uint32_t g = 0; g < n; g++) {
        char b[256] = "", m[256] = "";
        size_t bo = 0, mo = 0;
        for (uint32_t k = 0; k < v->replicas; k++) {
            uint32_t s = view_member(v, g, k);
            if (!v->live[s] && mo < sizeof(m))
                mo += (size_t)snprintf(m + mo, sizeof(m) - mo, "%s%u", mo ? " " : "", s);
            else if ((int32_t)s != v->primary[g] && bo < sizeof(b))
                bo += (size_t)snprintf(b + bo, sizeof(b) - bo, "%s%u", bo ? " " : "", s);
        }
        char p[16];
        snprintf(p, sizeof(p), "%d", (int)v->primary[g]);
        printf("%-6u %-8s %-16s %s\n", g, v->primary[g] < 0 ? "none" : p, bo ? b : "-",
               mo ? m : "-");
    }
    printf("%-6s %-10s %s\n", "server", "state", "url");
    for (uint32_t i = 0; i < n; i++) {
        bool reg = lease[i] != 0;
        const char *state = v->live[i] && lease[i] == r.lease[i] ? "live"
                            : v->live[i]                         ? "lease-gone"
                            : reg                                ? "rejoining"
                                                                 : "down";
        printf("%-6u %-10s %s\n", i, state, urls[i][0] ? urls[i] : "-");
    }
    return 0;
}

/* The in-sync members of group g in v other than s, as " ps 0, ps 2" into buf. */
static void others_in_sync(const view *v, uint32_t g, uint32_t s, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t k = 0; k < v->replicas && o < cap; k++) {
        uint32_t m = view_member(v, g, k);
        if (m != s && view_in_sync(v, g, m))
            o += (size_t)snprintf(buf + o, cap - o, "%sps %u", o ? ", " : "", m);
    }
}

int psctl_force_primary(const options *o, const cluster_spec *cl, const char *group_arg,
                        const char *server_arg, int wait_ms, bool json)
{
    char *end;
    unsigned long g = strtoul(group_arg, &end, 10);
    bool g_ok = group_arg[0] >= '0' && group_arg[0] <= '9' && *end == '\0';
    unsigned long s = strtoul(server_arg, &end, 10);
    bool s_ok = server_arg[0] >= '0' && server_arg[0] <= '9' && *end == '\0';
    if (!g_ok || !s_ok) {
        fprintf(stderr,
                "psctl: force-primary: GROUP and SERVER must be task indices (got \"%s\" "
                "and \"%s\")\n",
                group_arg, server_arg);
        return 2;
    }
    char prefix[512], err[2048];
    etcd_client *c;
    int rc = psctl_coordinator_open(o, cl, "force-primary", &c, prefix, sizeof(prefix));
    if (rc != 0)
        return rc;
    static view_record r;
    int64_t rev = 0;
    if (read_view(c, prefix, "force-primary", &r, &rev) != 0) {
        etcd_client_destroy(c);
        return 1;
    }
    const view *v = &r.v;
    rc = 0;
    bool member = false;
    for (uint32_t k = 0; g < v->num_servers && k < v->replicas; k++)
        member = member || view_member(v, (uint32_t)g, k) == s;
    if (g >= v->num_servers || s >= v->num_servers) {
        fprintf(stderr,
                "psctl: force-primary: the cluster has %u servers and groups (0..%u): "
                "no group %lu or server %lu\n",
                v->num_servers, v->num_servers - 1, g, s);
        rc = 2;
    } else if (!member) {
        char ms[160];
        size_t mo = 0;
        for (uint32_t k = 0; k < v->replicas && mo < sizeof(ms); k++)
            mo += (size_t)snprintf(ms + mo, sizeof(ms) - mo, "%s%u", k ? ", " : "",
                                   view_member(v, (uint32_t)g, k));
        fprintf(stderr,
                "psctl: force-primary: server %lu is not a member of group %lu (its "
                "members: %s)\n",
                s, g, ms);
        rc = 2;
    } else if (v->primary[g] >= 0) {
        fprintf(stderr,
                "psctl: force-primary: group %lu is served by server %d in view epoch "
                "%" PRIu64 ": nothing to force\n",
                g, v->primary[g], v->epoch);
        rc = 1;
    } else if (!v->live[s]) {
        fprintf(stderr,
                "psctl: force-primary: server %lu is not live in view epoch %" PRIu64
                ": start it (and let it register) first\n",
                s, v->epoch);
        rc = 1;
    }
    if (rc != 0) {
        etcd_client_destroy(c);
        return rc;
    }
    char lost[160];
    others_in_sync(v, (uint32_t)g, (uint32_t)s, lost, sizeof(lost));
    fprintf(stderr,
            "psctl: force-primary: group %lu goes to server %lu with the copy it holds; "
            "updates only %s held are given up\n",
            g, s, lost[0] ? lost : "the missing members");
    /* Put for the view in force; put again should the view move on while the group still
     * waits; removed once done or given up. */
    uint64_t asked = 0;
    bool done = false;
    for (int waited = 0; waited <= wait_ms; waited += 100) {
        if (r.v.primary[g] == (int32_t)s) {
            done = true;
            break;
        }
        if (r.v.primary[g] >= 0)
            break; /* an in-sync member came back first */
        if (asked != r.v.epoch) {
            if (view_etcd_force(c, prefix, (uint32_t)g, (uint32_t)s, r.v.epoch, err, sizeof(err)) !=
                0) {
                fprintf(stderr, "psctl: force-primary: %s\n", err);
                break;
            }
            asked = r.v.epoch;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (view_etcd_read(c, prefix, &r, &rev, err, sizeof(err)) != 0)
            continue;
    }
    if (view_etcd_unforce(c, prefix, (uint32_t)g, err, sizeof(err)) != 0)
        fprintf(stderr, "psctl: force-primary: could not remove %s/force/%lu: %s\n", prefix, g,
                err);
    etcd_client_destroy(c);
    if (json)
        printf("{\"command\":\"force-primary\",\"group\":%lu,\"server\":%lu,\"done\":%s,"
               "\"primary\":%d,\"epoch\":%" PRIu64 "}\n",
               g, s, done ? "true" : "false", r.v.primary[g], r.v.epoch);
    else if (done)
        printf("group %lu is served by server %lu from view epoch %" PRIu64 "\n", g, s, r.v.epoch);
    if (!done) {
        if (r.v.primary[g] >= 0 && r.v.primary[g] != (int32_t)s)
            fprintf(stderr,
                    "psctl: force-primary: server %d, an in-sync member, serves group %lu "
                    "again (view epoch %" PRIu64 "): nothing was forced\n",
                    r.v.primary[g], g, r.v.epoch);
        else
            fprintf(stderr,
                    "psctl: force-primary: the view did not make server %lu group %lu's "
                    "primary within %d ms (view epoch %" PRIu64 "; is the server still "
                    "live?)\n",
                    s, g, wait_ms, r.v.epoch);
        return 1;
    }
    return 0;
}
