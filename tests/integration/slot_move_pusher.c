/* Test helper of test_slot_moves.sh: clients whose every acknowledged push is counted, against
 * the final values, while slots move between the servers.
 *
 *   slot_move_pusher push HISTORY STOPFILE
 *       creates NVARS variables "w0".. (8 floats, SGD, learning rate 1, zeros, held whole) and
 *       the table "emb" (dim 2, SGD, learning rate 1, zero rows), then 2 threads push until
 *       STOPFILE exists: each push adds 1 to every element of one variable, or to the rows of
 *       3 ids of the table. Writes to HISTORY how many pushes of each variable and each id
 *       were acknowledged (with SLOT_PUSHER_IDS=N, 1 to 64, each table push sends N ids spread
 *       over the table instead). With PS_SPLIT_PARTS set, the variable "big/w" (3 * 2^18 + 5
 *       floats, cut in 4 parts placed by slot) is created too and every 16th update of a thread
 *       adds 1 to all of it (a push, or a third item of the Step), its parts following the
 *       moves. Exit 0, or 1 when a push failed (named: it may or may not be
 *       applied, so the check could not be exact).
 *   slot_move_pusher step HISTORY STOPFILE
 *       the same, each thread's updates sent as Steps (ps_step_ex): one Step pushes 1 to two
 *       variables and to 3 ids of the table (a Step follows moved slots like the calls do);
 *       with PS_WORKER_ID set, each Step also moves the worker's clock (PS_STEP_CLOCK).
 *   slot_move_pusher check HISTORY...
 *       pulls every variable and row and checks each equals its acknowledged pushes, summed
 *       over the histories (never applied twice, never lost). Exit 0, or 1 naming the first values
 * that differ. The cluster and coordinator come from TF_CONFIG and PS_COORDINATOR. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "psclient.h"

#define NVARS 40
#define NIDS 600
#define NEL 8
#define NBIG (3 * 262144 + 5) /* cut in parts (PS_SPLIT_PARTS) */

static ps_client *cl;
static ps_var *vars[NVARS];
static ps_table *tab;
static ps_var *big; /* NULL without PS_SPLIT_PARTS */
static float big_grad[NBIG];
static atomic_long big_acks;
static atomic_long var_acks[NVARS];
static atomic_long id_acks[NIDS];
static const char *stopfile;
static atomic_int failed;
static bool steps;
/* SLOT_PUSHER_IDS=N (push mode): each table push sends N ids (at most MAX_WIDE_IDS), not 3. */
#define MAX_WIDE_IDS 64
static int wide_ids;

static void *pusher(void *arg)
{
    long t = (long)arg;
    float g[NEL];
    for (int k = 0; k < NEL; k++)
        g[k] = -1;
    for (long i = 0; access(stopfile, F_OK) != 0 && !atomic_load(&failed); i++) {
        int rc;
        bool with_big = big != NULL && i % 16 == 5;
        if (with_big && !steps) {
            rc = ps_push(cl, big, big_grad);
            if (rc == PS_OK)
                atomic_fetch_add(&big_acks, 1);
        } else if (steps) {
            int v[2] = {(int)((t * 13 + i * 7) % NVARS), (int)((t * 13 + i * 7 + 19) % NVARS)};
            int64_t ids[3] = {(t * 101 + i * 17) % NIDS, (t * 101 + i * 17 + 200) % NIDS,
                              (t * 101 + i * 17 + 400) % NIDS};
            float gg[6] = {-1, -1, -1, -1, -1, -1};
            ps_step_item it[3];
            memset(it, 0, sizeof(it));
            for (int k = 0; k < 2; k++) {
                it[k].var = vars[v[k]];
                it[k].count = NEL;
                it[k].grad = g;
            }
            it[2].var = big;
            it[2].count = NBIG;
            it[2].grad = big_grad;
            ps_table_item ti = PS_TABLE_ITEM_INIT;
            ti.table = tab;
            ti.ids = ids;
            ti.n = 3;
            ti.grads = gg;
            rc = ps_step_ex(cl, it, with_big ? 3 : 2, &ti, 1,
                            getenv("PS_WORKER_ID") ? PS_STEP_CLOCK : 0);
            if (rc == PS_OK && with_big)
                atomic_fetch_add(&big_acks, 1);
            if (rc == PS_OK) {
                for (int k = 0; k < 2; k++)
                    atomic_fetch_add(&var_acks[v[k]], 1);
                for (int k = 0; k < 3; k++)
                    atomic_fetch_add(&id_acks[ids[k]], 1);
            }
        } else if (i % 2 == 0) {
            int v = (int)((t * 13 + i * 7) % NVARS);
            rc = ps_push(cl, vars[v], g);
            if (rc == PS_OK)
                atomic_fetch_add(&var_acks[v], 1);
        } else if (wide_ids > 0) {
            /* wide_ids distinct ids, spread over the table. */
            int64_t ids[MAX_WIDE_IDS];
            float gg[2 * MAX_WIDE_IDS];
            int64_t step = NIDS / wide_ids, base = (t * 101 + i * 17) % step;
            for (int k = 0; k < wide_ids; k++) {
                ids[k] = base + k * step;
                gg[2 * k] = gg[2 * k + 1] = -1;
            }
            rc = ps_table_push(tab, ids, (uint64_t)wide_ids, gg);
            if (rc == PS_OK)
                for (int k = 0; k < wide_ids; k++)
                    atomic_fetch_add(&id_acks[ids[k]], 1);
        } else {
            int64_t ids[3] = {(t * 101 + i * 17) % NIDS, (t * 37 + i * 29 + 1) % NIDS,
                              (i * 53 + 7) % NIDS};
            if (ids[1] == ids[0])
                ids[1] = (ids[1] + 1) % NIDS;
            while (ids[2] == ids[0] || ids[2] == ids[1])
                ids[2] = (ids[2] + 1) % NIDS;
            float gg[6] = {-1, -1, -1, -1, -1, -1};
            rc = ps_table_push(tab, ids, 3, gg);
            if (rc == PS_OK)
                for (int k = 0; k < 3; k++)
                    atomic_fetch_add(&id_acks[ids[k]], 1);
        }
        if (rc != PS_OK) {
            fprintf(stderr, "thread %ld push %ld: %s: %s\n", t, i, ps_strerror(rc),
                    ps_last_error());
            atomic_store(&failed, 1);
        }
    }
    return NULL;
}

static int open_all(bool create)
{
    int rc = ps_client_open(&cl, NULL);
    if (rc != PS_OK) {
        fprintf(stderr, "open: %s: %s\n", ps_strerror(rc), ps_last_error());
        return 1;
    }
    for (int v = 0; v < NVARS && rc == PS_OK; v++) {
        char name[16];
        snprintf(name, sizeof(name), "w%d", v);
        ps_var_spec s;
        ps_var_spec_init(&s, name);
        s.ndims = 1;
        s.dims[0] = NEL;
        s.learning_rate = 1;
        s.staleness = PS_STALENESS_ASYNC;
        rc = ps_var_create(cl, &s, &vars[v]);
    }
    ps_table_spec ts;
    ps_table_spec_init(&ts, "emb", 2, PS_OPT_SGD);
    ts.learning_rate = 1;
    ts.staleness = PS_STALENESS_ASYNC;
    if (rc == PS_OK)
        rc = ps_table_create(cl, &ts, &tab);
    if (rc == PS_OK && getenv("PS_SPLIT_PARTS") != NULL) {
        ps_var_spec s;
        ps_var_spec_init(&s, "big/w");
        s.ndims = 1;
        s.dims[0] = NBIG;
        s.learning_rate = 1;
        s.staleness = PS_STALENESS_ASYNC;
        rc = ps_var_create(cl, &s, &big);
        if (rc == PS_OK && ps_var_num_shards(big) != 4) {
            fprintf(stderr, "\"big/w\" has %d parts, not 4 (is split-parts on?)\n",
                    ps_var_num_shards(big));
            return 1;
        }
        for (int k = 0; k < NBIG; k++)
            big_grad[k] = -1;
    }
    if (rc != PS_OK) {
        fprintf(stderr, "%s: %s: %s\n", create ? "create" : "open", ps_strerror(rc),
                ps_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    steps = strcmp(argv[1], "step") == 0;
    const char *w = getenv("SLOT_PUSHER_IDS");
    wide_ids = w ? atoi(w) : 0;
    if (wide_ids < 0 || wide_ids > MAX_WIDE_IDS)
        wide_ids = 0;
    if (argc < 3 || ((strcmp(argv[1], "push") == 0 || steps) && argc != 4)) {
        fprintf(stderr, "usage: %s push|step HISTORY STOPFILE | check HISTORY...\n", argv[0]);
        return 2;
    }
    if (open_all(true) != 0)
        return 1;
    if (strcmp(argv[1], "push") == 0 || steps) {
        stopfile = argv[3];
        pthread_t th[2];
        for (long t = 0; t < 2; t++)
            pthread_create(&th[t], NULL, pusher, (void *)t);
        for (int t = 0; t < 2; t++)
            pthread_join(th[t], NULL);
        FILE *f = fopen(argv[2], "w");
        long total = 0;
        for (int v = 0; v < NVARS; v++) {
            fprintf(f, "var %d %ld\n", v, atomic_load(&var_acks[v]));
            total += atomic_load(&var_acks[v]);
        }
        for (int i = 0; i < NIDS; i++) {
            fprintf(f, "id %d %ld\n", i, atomic_load(&id_acks[i]));
            total += atomic_load(&id_acks[i]);
        }
        fprintf(f, "big 0 %ld\n", atomic_load(&big_acks));
        total += atomic_load(&big_acks);
        fclose(f);
        printf("pushes acknowledged: %ld (counted per variable and per id)\n", total);
        ps_client_close(cl);
        return atomic_load(&failed) ? 1 : 0;
    }
    long want_var[NVARS] = {0}, want_id[NIDS] = {0}, want_big = 0;
    for (int a = 2; a < argc; a++) {
        FILE *f = fopen(argv[a], "r");
        if (f == NULL) {
            perror(argv[a]);
            return 1;
        }
        char kind[8];
        int k;
        long n;
        while (fscanf(f, "%7s %d %ld", kind, &k, &n) == 3) {
            if (strcmp(kind, "big") == 0)
                want_big += n;
            else if (strcmp(kind, "var") == 0 && k >= 0 && k < NVARS)
                want_var[k] += n;
            else if (k >= 0 && k < NIDS)
                want_id[k] += n;
        }
        fclose(f);
    }
    int bad = 0;
    for (int v = 0; v < NVARS; v++) {
        float x[NEL];
        int rc = ps_pull(cl, vars[v], x);
        for (int e = 0; e < NEL && bad < 20; e++)
            if (rc != PS_OK || x[e] != (float)want_var[v]) {
                fprintf(stderr, "w%d[%d] = %g, acknowledged pushes %ld (%s)\n", v, e,
                        rc == PS_OK ? x[e] : -1.0, want_var[v], ps_strerror(rc));
                bad++;
                break;
            }
    }
    if (big != NULL) {
        static float x[NBIG];
        int rc = ps_pull(cl, big, x);
        for (int e = 0; e < NBIG; e++)
            if (rc != PS_OK || x[e] != (float)want_big) {
                fprintf(stderr, "big/w[%d] = %g, acknowledged pushes %ld (%s: %s)\n", e,
                        rc == PS_OK ? x[e] : -1.0, want_big, ps_strerror(rc),
                        rc == PS_OK ? "" : ps_last_error());
                bad++;
                break;
            }
        if (rc == PS_OK && bad == 0)
            printf("\"big/w\" (4 parts) equals its %ld acknowledged pushes\n", want_big);
    }
    int64_t ids[NIDS];
    float rows[2 * NIDS];
    for (int i = 0; i < NIDS; i++)
        ids[i] = i;
    int rc = ps_table_pull(tab, ids, NIDS, rows);
    if (rc != PS_OK) {
        fprintf(stderr, "table pull: %s: %s\n", ps_strerror(rc), ps_last_error());
        bad++;
    }
    for (int i = 0; rc == PS_OK && i < NIDS && bad < 40; i++)
        if (rows[2 * i] != (float)want_id[i] || rows[2 * i + 1] != (float)want_id[i]) {
            fprintf(stderr, "emb[%d] = (%g, %g), acknowledged pushes %ld\n", i, rows[2 * i],
                    rows[2 * i + 1], want_id[i]);
            bad++;
        }
    ps_client_close(cl);
    if (bad == 0)
        printf("every variable and row equals its acknowledged pushes\n");
    return bad ? 1 : 0;
}
