/* Test helper of the replication fault tests (test_replica_partition.sh,
 * test_replica_etcd_down.sh, test_replica_lease_lost.sh, test_chaos.sh): clients of a
 * replicated cluster whose every push is identifiable in the final values, and the checker of
 * their acknowledged histories.
 *
 * A variable of SLOTS elements per group it spans (SGD, learning rate 1, from zeros): split
 * over every group ("split"), or whole on one group ("group G"). Push number r of client k
 * takes slot k * PER_CLIENT + r and carries the gradient 1 at that slot of every group part,
 * 0 elsewhere: the final value at a slot is minus the number of times that push was applied in
 * that group. Or a sparse table ("table": dim 1, SGD, learning rate 1, zero rows): push r of
 * client k carries the gradient 1 for one row per group, rows that exist only for that slot
 * (table_row_id), so their final values are minus the number of times each group applied it;
 * a table's slots go up to TABLE_SLOTS.
 *
 *   replica_pusher push CLUSTER VAR SHAPE ID PER_CLIENT HISTORY STOPFILE INTERVAL_MS
 *       pushes until STOPFILE exists or PER_CLIENT pushes were made, one every INTERVAL_MS;
 *       appends "ack SLOT MS" to HISTORY for each acknowledged push (MS: wall clock in ms, the
 *       moment the acknowledgement arrived). Exit 0, or 1 when a push failed (named).
 *   replica_pusher check CLUSTER VAR SHAPE HISTORY...
 *       pulls VAR and checks that every acknowledged slot is -1 in every group part (applied
 *       exactly once) and every other slot is 0 (a push never acknowledged by a client that
 *       went on is not there; the slot of a failed push may be -1 or 0); prints the number of
 *       acknowledged pushes. A table's check covers each history's slots and the one after its
 *       last. Exit 0, or 1 (every wrong slot named, up to 20).
 *
 * CLUSTER: the {"ps":[...]} spec; SHAPE: "split", "groupG" or "table". Settings: replicas from
 * $PS_REPLICAS (default 2), deadline 60 s, split threshold 32 KiB (SLOTS is 4096: a split
 * variable is 48 KiB, a group's 16 KiB). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "slots.h"
#include "psclient.h"

#define SLOTS 4096
#define TABLE_SLOTS (1 << 22)

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
        if ((int)slots_name_owner(&(slot_map){SLOTS_DEFAULT, (uint32_t)nservers, NULL}, name) == g)
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

static ps_table *make_table(ps_client *c, const char *name)
{
    ps_table_spec s;
    ps_table_spec_init(&s, name, 1, PS_OPT_SGD);
    s.learning_rate = 1.0;
    s.staleness = PS_STALENESS_ASYNC;
    ps_table *t = NULL;
    if (ps_table_create(c, &s, &t) != PS_OK)
        fprintf(stderr, "create table %s: %s\n", name, ps_last_error());
    return t;
}

/* The row of table `name` that slot's pushes carry for group g: the first id (slot << 8) + i
 * that group g owns (with n groups of equal chance, 256 tries miss with odds (1 - 1/n)^256). */
static int64_t table_row_id(const char *name, int slot, int g, int nservers)
{
    for (int64_t i = 0; i < 256; i++) {
        int64_t id = ((int64_t)slot << 8) + i;
        if ((int)slots_row_owner(&(slot_map){SLOTS_DEFAULT, (uint32_t)nservers, NULL}, name, id) ==
            g)
            return id;
    }
    return ((int64_t)slot << 8) + 255;
}

/* One client's target: a variable of `parts` group parts, or a table (t != NULL, parts: the
 * number of groups). */
typedef struct target {
    ps_client *c;
    ps_var *v;
    ps_table *t;
    char name[256];
    int parts, nservers;
    float *g;
    int64_t *ids;
} target;

static int target_open(target *x, ps_client *c, const char *var, const char *shape, int ns)
{
    memset(x, 0, sizeof(*x));
    x->c = c;
    x->nservers = ns;
    if (strcmp(shape, "table") == 0) {
        snprintf(x->name, sizeof(x->name), "%s", var);
        x->parts = ns;
        x->t = make_table(c, x->name);
        x->ids = calloc((size_t)ns, sizeof(int64_t));
        x->g = calloc((size_t)ns, sizeof(float));
        return x->t && x->ids && x->g ? 0 : -1;
    }
    x->parts = shape_of(var, shape, ns, x->name, sizeof(x->name));
    if (x->parts < 0)
        return -1;
    x->v = make_var(c, x->name, x->parts);
    x->g = calloc((size_t)SLOTS * (size_t)x->parts, sizeof(float));
    return x->v && x->g ? 0 : -1;
}

static void target_close(target *x)
{
    if (x->t)
        ps_table_free(x->t);
    free(x->g);
    free(x->ids);
}

static int target_slots(const target *x)
{
    return x->t ? TABLE_SLOTS : SLOTS;
}

/* Pushes slot's gradient: 1 at the slot of every group part, or 1 on each of its rows. */
static int target_push(target *x, int slot)
{
    if (x->t) {
        for (int p = 0; p < x->parts; p++) {
            x->ids[p] = table_row_id(x->name, slot, p, x->nservers);
            x->g[p] = 1.0f;
        }
        return ps_table_push(x->t, x->ids, (size_t)x->parts, x->g);
    }
    for (int p = 0; p < x->parts; p++)
        x->g[(size_t)p * SLOTS + (size_t)slot] = 1.0f;
    int st = ps_push(x->c, x->v, x->g);
    for (int p = 0; p < x->parts; p++)
        x->g[(size_t)p * SLOTS + (size_t)slot] = 0.0f;
    return st;
}

static int do_push(char **a)
{
    const char *spec = a[0], *var = a[1], *shape = a[2];
    int id = atoi(a[3]), per = atoi(a[4]);
    const char *hist = a[5], *stop = a[6];
    int interval = atoi(a[7]);
    int ns = nservers_of(spec);
    FILE *h = fopen(hist, "a");
    if (h == NULL) {
        perror(hist);
        return 2;
    }
    ps_client *c = open_client(spec);
    target x;
    if (c == NULL || target_open(&x, c, var, shape, ns) != 0) {
        fclose(h);
        if (c) {
            target_close(&x);
            ps_client_close(c);
        }
        return 1;
    }
    if (per <= 0 || (long long)(id + 1) * per > target_slots(&x)) {
        fprintf(stderr, "push: bad slots (client %d, %d each, %d in all)\n", id, per,
                target_slots(&x));
        target_close(&x);
        ps_client_close(c);
        fclose(h);
        return 2;
    }
    int rc = 0;
    for (int r = 0; r < per && access(stop, F_OK) != 0; r++) {
        int slot = id * per + r;
        long long t0 = now_ms();
        int st = target_push(&x, slot);
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
        if (interval > 0)
            usleep((useconds_t)interval * 1000);
    }
    uint64_t lost = ps_client_lost_updates(c);
    if (lost) {
        fprintf(stderr, "client %d: %llu lost updates reported\n", id, (unsigned long long)lost);
        rc = 1;
    }
    target_close(&x);
    fclose(h);
    ps_client_close(c);
    return rc;
}

/* The final values of slots [lo, hi): (*w)[p * SLOTS + s] for a variable (lo 0, hi SLOTS),
 * (*w)[(s - lo) * parts + p] for a table. */
static int target_values(target *x, ps_client *c, int lo, int hi, float **w)
{
    if (x->v) {
        *w = malloc((size_t)SLOTS * (size_t)x->parts * sizeof(float));
        if (*w && ps_pull(c, x->v, *w) == PS_OK)
            return 0;
        fprintf(stderr, "pull %s: %s\n", x->name, ps_last_error());
        return -1;
    }
    size_t n = (size_t)(hi - lo) * (size_t)x->parts;
    int64_t *ids = malloc(n * sizeof(int64_t));
    *w = malloc(n * sizeof(float));
    if (ids == NULL || *w == NULL) {
        free(ids);
        return -1;
    }
    for (int s = lo; s < hi; s++)
        for (int p = 0; p < x->parts; p++)
            ids[(size_t)(s - lo) * (size_t)x->parts + (size_t)p] =
                table_row_id(x->name, s, p, x->nservers);
    size_t step = ps_table_max_ids(x->t);
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        if (ps_table_pull(x->t, ids + i, k, *w + i) != PS_OK) {
            fprintf(stderr, "pull %s: %s\n", x->name, ps_last_error());
            free(ids);
            return -1;
        }
    }
    free(ids);
    return 0;
}

/* Reads one history: marks its slots in acked (1 acknowledged, 2 failed), counts the
 * acknowledged ones into *nacked and widens [*lo, *hi) to its slots and the one after its last.
 * Returns 0, 1 (a slot acknowledged twice) or 2 (unreadable). */
static int read_history(const char *path, signed char *acked, int nslots, int *nacked, int *lo,
                        int *hi)
{
    FILE *h = fopen(path, "r");
    if (h == NULL) {
        perror(path);
        return 2;
    }
    char kind[16];
    int slot;
    long long t, d;
    int rc = 0;
    while (fscanf(h, "%15s %d %lld", kind, &slot, &t) == 3) {
        if (strcmp(kind, "ack") == 0 && fscanf(h, "%lld", &d) != 1)
            break;
        if (slot < 0 || slot >= nslots)
            continue;
        if (slot < *lo)
            *lo = slot;
        if (slot + 2 > *hi)
            *hi = slot + 2 < nslots ? slot + 2 : nslots;
        if (strcmp(kind, "fail") == 0) {
            acked[slot] = 2; /* failed: applied or not, once at most */
        } else if (strcmp(kind, "ack") == 0) {
            if (acked[slot]) {
                fprintf(stderr, "slot %d acknowledged twice in the histories\n", slot);
                rc = 1;
                break;
            }
            acked[slot] = 1;
            (*nacked)++;
        }
    }
    fclose(h);
    return rc;
}

static int do_check(int nh, char **a)
{
    const char *spec = a[0], *var = a[1], *shape = a[2];
    int ns = nservers_of(spec);
    ps_client *c = open_client(spec);
    target x;
    if (c == NULL || target_open(&x, c, var, shape, ns) != 0) {
        if (c) {
            target_close(&x);
            ps_client_close(c);
        }
        return 1;
    }
    int nslots = target_slots(&x);
    signed char *acked = calloc((size_t)nslots, 1);
    int nacked = 0, rc = 0, wrong = 0;
    /* Per history, the slots to check: a table's come in ranges (a variable's are all of it). */
    int *lo = malloc((size_t)nh * sizeof(int)), *hi = malloc((size_t)nh * sizeof(int));
    for (int i = 0; i < nh && rc == 0; i++) {
        lo[i] = nslots;
        hi[i] = 0;
        rc = read_history(a[3 + i], acked, nslots, &nacked, &lo[i], &hi[i]);
    }
    for (int i = 0; i < nh && rc == 0; i++) {
        if (x.v) {
            lo[i] = 0;
            hi[i] = SLOTS;
        }
        if (lo[i] >= hi[i] || (x.v && i > 0))
            continue;
        float *w = NULL;
        if (target_values(&x, c, lo[i], hi[i], &w) != 0) {
            free(w);
            rc = 1;
            break;
        }
        for (int p = 0; p < x.parts; p++)
            for (int s = lo[i]; s < hi[i]; s++) {
                float want = acked[s] ? -1.0f : 0.0f;
                float got = x.v ? w[(size_t)p * SLOTS + (size_t)s]
                                : w[(size_t)(s - lo[i]) * (size_t)x.parts + (size_t)p];
                if (acked[s] == 2 && got == 0.0f)
                    want = 0.0f;
                if (got != want && wrong++ < 20)
                    fprintf(stderr, "%s: slot %d in group part %d is %.0f: %s push %s\n", x.name, s,
                            p, got, acked[s] ? "an acknowledged" : "an unacknowledged",
                            got < -1.0f ? "applied more than once"
                            : acked[s]  ? "is missing"
                                        : "was applied");
            }
        free(w);
    }
    if (rc == 0)
        printf("%s: %d acknowledged pushes, each in every one of its %d group part(s) exactly "
               "once%s\n",
               x.name, nacked, x.parts, wrong ? " -- NOT" : "");
    free(lo);
    free(hi);
    free(acked);
    target_close(&x);
    ps_client_close(c);
    return rc ? rc : wrong ? 1 : 0;
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
