/* Test helper of test_replica_partition.sh and test_replica_etcd_down.sh: clients of a
 * replicated cluster whose every push is identifiable in the final values, and the checker of
 * their acknowledged histories.
 *
 * A variable of SLOTS elements per group it spans (SGD, learning rate 1, from zeros): split
 * over every group ("split"), or whole on one group ("group G"). Push number r of client k
 * takes slot k * PER_CLIENT + r and carries the gradient 1 at that slot of every group part,
 * 0 elsewhere: the final value at a slot is minus the number of times that push was applied in
 * that group.
 *
 *   replica_pusher push CLUSTER VAR SHAPE ID PER_CLIENT HISTORY STOPFILE INTERVAL_MS
 *       pushes until STOPFILE exists or PER_CLIENT pushes were made, one every INTERVAL_MS;
 *       appends "ack SLOT MS" to HISTORY for each acknowledged push (MS: wall clock in ms, the
 *       moment the acknowledgement arrived). Exit 0, or 1 when a push failed (named).
 *   replica_pusher check CLUSTER VAR SHAPE HISTORY...
 *       pulls VAR and checks that every acknowledged slot is -1 in every group part (applied
 *       exactly once) and every other slot is 0 (a push never acknowledged by a client that
 *       went on is not there; the slot of a failed push may be -1 or 0); prints the number of
 * acknowledged pushes. Exit 0, or 1 (every wrong slot named, up to 20).
 *
 * CLUSTER: the {"ps":[...]} spec; SHAPE: "split" or "groupG". Settings: replicas from
 * $PS_REPLICAS (default 2), deadline 60 s, split threshold 32 KiB (SLOTS is 4096: a split
 * variable is 48 KiB, a group's 16 KiB). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "placement.h"
#include "psclient.h"

#define SLOTS 4096

static int nservers_of(const char *spec)
{
    int n = 0;
    for (const char *p = strstr(spec, "["); p && *p && *p != ']'; p++)
        n += *p == ',';
    return n + 1;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static ps_client *open_client(const char *spec)
{
    ps_config *cfg;
    ps_client *c = NULL;
    char tf[2048];
    snprintf(tf, sizeof(tf), "{\"cluster\":%s}", spec);
    const char *rep = getenv("PS_REPLICAS");
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "cluster", tf) != PS_OK ||
        ps_config_set(cfg, "split-threshold-bytes", "32K") != PS_OK ||
        ps_config_set(cfg, "deadline-ms", "60000") != PS_OK ||
        ps_config_set(cfg, "replicas", rep && rep[0] ? rep : "2") != PS_OK)
        fprintf(stderr, "config: %s\n", ps_last_error());
    else if (ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

/* The variable's name on the cluster (for "groupG": VAR-n, the first n placed on G) and its
 * number of group parts. */
static int shape_of(const char *var, const char *shape, int nservers, char *name, size_t cap)
{
    if (strcmp(shape, "split") == 0) {
        snprintf(name, cap, "%s", var);
        return nservers;
    }
    if (strncmp(shape, "group", 5) != 0)
        return -1;
    int g = atoi(shape + 5);
    for (int n = 0; n < 10000; n++) {
        snprintf(name, cap, "%s-%d", var, n);
        if ((int)placement_owner(name, (uint32_t)nservers) == g)
            return 1;
    }
    return -1;
}

static ps_var *make_var(ps_client *c, const char *name, int parts)
{
    ps_var_spec s;
    ps_var_spec_init(&s, name);
    s.ndims = 1;
    s.dims[0] = (uint64_t)SLOTS * (uint64_t)parts;
    s.learning_rate = 1.0;
    s.staleness = PS_STALENESS_ASYNC;
    ps_var *v = NULL;
    if (ps_var_create(c, &s, &v) != PS_OK)
        fprintf(stderr, "create %s: %s\n", name, ps_last_error());
    return v;
}

static int do_push(char **a)
{
    const char *spec = a[0], *var = a[1], *shape = a[2];
    int id = atoi(a[3]), per = atoi(a[4]);
    const char *hist = a[5], *stop = a[6];
    int interval = atoi(a[7]);
    int ns = nservers_of(spec);
    char name[256];
    int parts = shape_of(var, shape, ns, name, sizeof(name));
    if (parts < 0 || per <= 0 || (id + 1) * per > SLOTS) {
        fprintf(stderr, "push: bad shape %s or slots (client %d, %d each, %d in all)\n", shape, id,
                per, SLOTS);
        return 2;
    }
    FILE *h = fopen(hist, "a");
    if (h == NULL) {
        perror(hist);
        return 2;
    }
    ps_client *c = open_client(spec);
    ps_var *v = c ? make_var(c, name, parts) : NULL;
    if (v == NULL) {
        fclose(h);
        if (c)
            ps_client_close(c);
        return 1;
    }
    size_t n = (size_t)SLOTS * (size_t)parts;
    float *g = calloc(n, sizeof(float));
    int rc = 0;
    for (int r = 0; r < per && access(stop, F_OK) != 0; r++) {
        int slot = id * per + r;
        for (int p = 0; p < parts; p++)
            g[(size_t)p * SLOTS + (size_t)slot] = 1.0f;
        long long t0 = now_ms();
        int st = ps_push(c, v, g);
        long long t1 = now_ms();
        if (st != PS_OK) {
            fprintf(stderr, "client %d: push of slot %d failed after %lld ms: %s\n", id, slot,
                    t1 - t0, ps_last_error());
            fprintf(h, "fail %d %lld\n", slot, t1);
            rc = 1;
            break;
        }
        fprintf(h, "ack %d %lld %lld\n", slot, t1, t1 - t0);
        fflush(h);
        for (int p = 0; p < parts; p++)
            g[(size_t)p * SLOTS + (size_t)slot] = 0.0f;
        if (interval > 0)
            usleep((useconds_t)interval * 1000);
    }
    uint64_t lost = ps_client_lost_updates(c);
    if (lost) {
        fprintf(stderr, "client %d: %llu lost updates reported\n", id, (unsigned long long)lost);
        rc = 1;
    }
    free(g);
    fclose(h);
    ps_client_close(c);
    return rc;
}

static int do_check(int nh, char **a)
{
    const char *spec = a[0], *var = a[1], *shape = a[2];
    int ns = nservers_of(spec);
    char name[256];
    int parts = shape_of(var, shape, ns, name, sizeof(name));
    if (parts < 0)
        return 2;
    static signed char acked[SLOTS];
    memset(acked, 0, sizeof(acked));
    int nacked = 0;
    for (int i = 0; i < nh; i++) {
        FILE *h = fopen(a[3 + i], "r");
        if (h == NULL) {
            perror(a[3 + i]);
            return 2;
        }
        char kind[16];
        int slot;
        long long t, d;
        while (fscanf(h, "%15s %d %lld", kind, &slot, &t) == 3) {
            if (strcmp(kind, "ack") == 0 && fscanf(h, "%lld", &d) != 1)
                break;
            if (slot < 0 || slot >= SLOTS)
                continue;
            if (strcmp(kind, "fail") == 0) {
                acked[slot] = 2; /* failed: applied or not, once at most */
            } else if (strcmp(kind, "ack") == 0) {
                if (acked[slot]) {
                    fprintf(stderr, "slot %d acknowledged twice in the histories\n", slot);
                    fclose(h);
                    return 1;
                }
                acked[slot] = 1;
                nacked++;
            }
        }
        fclose(h);
    }
    ps_client *c = open_client(spec);
    ps_var *v = c ? make_var(c, name, parts) : NULL;
    if (v == NULL)
        return 1;
    size_t n = (size_t)SLOTS * (size_t)parts;
    float *w = malloc(n * sizeof(float));
    if (ps_pull(c, v, w) != PS_OK) {
        fprintf(stderr, "pull %s: %s\n", name, ps_last_error());
        return 1;
    }
    int wrong = 0;
    for (int p = 0; p < parts; p++)
        for (int s = 0; s < SLOTS; s++) {
            float want = acked[s] ? -1.0f : 0.0f, got = w[(size_t)p * SLOTS + (size_t)s];
            if (acked[s] == 2 && got == 0.0f)
                want = 0.0f;
            if (got != want && wrong++ < 20)
                fprintf(stderr, "%s: slot %d in group part %d is %.0f: %s push %s\n", name, s, p,
                        got, acked[s] ? "an acknowledged" : "an unacknowledged",
                        got < -1.0f ? "applied more than once"
                        : acked[s]  ? "is missing"
                                    : "was applied");
        }
    printf("%s: %d acknowledged pushes, each in every one of its %d group part(s) exactly "
           "once%s\n",
           name, nacked, parts, wrong ? " -- NOT" : "");
    free(w);
    ps_client_close(c);
    return wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 10 && strcmp(argv[1], "push") == 0)
        return do_push(argv + 2);
    if (argc >= 6 && strcmp(argv[1], "check") == 0)
        return do_check(argc - 5, argv + 2);
    fprintf(stderr,
            "usage: %s push CLUSTER VAR SHAPE ID PER_CLIENT HISTORY STOPFILE "
            "INTERVAL_MS\n       %s check CLUSTER VAR SHAPE HISTORY...\n",
            argv[0], argv[0]);
    return 2;
}
