/* psctl view (psctl_view.h). */
#include "psctl_view.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "view_etcd.h"

/* Prints s as a JSON string. */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

int psctl_view(const options *o, const cluster_spec *cl, bool json)
{
    const char *eps = opt_str(o, OPT_COORDINATOR);
    if (eps == NULL || eps[0] == '\0') {
        fprintf(stderr, "psctl: view: set coordinator to the etcd endpoints of the cluster "
                        "(e.g. --coordinator http://127.0.0.1:2379): the view lives there\n");
        return 2;
    }
    char prefix[512];
    const char *pfx = opt_str(o, OPT_COORDINATOR_PREFIX);
    if (pfx && pfx[0])
        snprintf(prefix, sizeof(prefix), "%s", pfx);
    else
        view_default_prefix((const char *const *)cl->ps, cl->n_ps, prefix, sizeof(prefix));
    size_t pl = strlen(prefix);
    while (pl > 1 && prefix[pl - 1] == '/')
        prefix[--pl] = '\0';
    etcd_client *c;
    char err[2048];
    if (etcd_client_create(&c, eps, 3000, err, sizeof(err)) != 0) {
        fprintf(stderr, "psctl: view: %s\n", err);
        return 2;
    }
    static view_record r;
    int64_t rev = 0;
    int rc = view_etcd_read(c, prefix, &r, &rev, err, sizeof(err));
    if (rc == ETCD_ENOTFOUND) {
        fprintf(stderr,
                "psctl: view: no view under %s in etcd %s (replicas 1, no server started yet, "
                "or another coordinator-prefix)\n",
                prefix, eps);
        etcd_client_destroy(c);
        return 1;
    }
    static int64_t lease[VIEW_MAX_SERVERS];
    static char urls[VIEW_MAX_SERVERS][VIEW_URL_MAX];
    if (rc == 0)
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
        json_str(prefix);
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
            json_str(urls[i]);
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
