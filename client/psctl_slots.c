/* psctl slots (psctl_slots.h). */
#include "psctl_slots.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psctl_json.h"
#include "psctl_moves.h"
#include "psctl_view.h"
#include "slots_record.h"

int psctl_slots(const options *o, const cluster_spec *cl, bool json)
{
    char prefix[512], err[2048];
    etcd_client *c;
    int rc = psctl_coordinator_open(o, cl, "slots", &c, prefix, sizeof(prefix));
    if (rc != 0)
        return rc;
    slots_record r;
    rc = slots_etcd_read(c, prefix, &r, NULL, err, sizeof(err));
    if (rc == ETCD_ENOTFOUND) {
        fprintf(stderr,
                "psctl: slots: no slot map under %s in etcd %s (no server of this cluster "
                "started with this coordinator yet, replicas > 1, or another "
                "coordinator-prefix)\n",
                prefix, etcd_client_endpoint(c));
        etcd_client_destroy(c);
        return 1;
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: slots: %s\n", err);
        etcd_client_destroy(c);
        return 1;
    }
    /* The move in progress: psctl's record (psctl_moves.c), if any. */
    char key[600], *mv = NULL;
    size_t mvlen = 0;
    snprintf(key, sizeof(key), "%s/moves/current", prefix);
    if (etcd_get(c, key, &mv, &mvlen, NULL, err, sizeof(err)) != 0)
        mv = NULL;
    if (json) {
        printf("{\"version\":%" PRIu64 ",\"slots\":%u,\"prefix\":", r.version, r.nslots);
        psctl_json_str(stdout, prefix);
        printf(",\"servers\":[");
        for (uint32_t i = 0; i < r.nservers; i++) {
            printf("%s{\"task\":%u,\"address\":", i ? "," : "", i);
            psctl_json_str(stdout, r.addr[i]);
            printf(",\"slots\":%u,\"joined\":%s}", slots_record_count(&r, i),
                   i >= r.base ? "true" : "false");
        }
        printf("],\"moves\":[");
        if (mv) {
            char *t = strndup(mv, mvlen);
            if (t)
                psctl_json_str(stdout, t);
            free(t);
        }
        printf("],\"split_servers\":%u}\n", r.base);
    } else {
        printf("slot map version %" PRIu64 ": %u slots over %u servers (%s/slots in etcd %s)\n",
               r.version, r.nslots, r.nservers, prefix, etcd_client_endpoint(c));
        printf("%-6s %-40s %8s\n", "task", "address", "slots");
        for (uint32_t i = 0; i < r.nservers; i++)
            printf("%-6u %-40s %8u%s\n", i, r.addr[i], slots_record_count(&r, i),
                   i >= r.base ? "  (joined)" : "");
        if (mv) {
            char line[1024];
            psctl_move_describe(mv, mvlen, line, sizeof(line));
            printf("moves in progress: %s\n", line);
        } else
            printf("moves in progress: none\n");
        printf("variables split in ranges stay over the %u servers of the cluster spec (those in "
               "parts move with their slots)\n",
               r.base);
    }
    free(mv);
    slots_record_free(&r);
    etcd_client_destroy(c);
    return 0;
}
