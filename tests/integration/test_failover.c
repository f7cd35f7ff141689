/* Integration: failover and rejoin of replica groups on real processes and a real etcd (the
 * test starts one; skipped, exit 77, without an etcd binary).
 *
 * 3 ps-servers with replicas 2. Client processes push integer gradients (SGD, lr 1, from zeros)
 * to a variable split over every group while server 1, primary of group 1, is killed with
 * SIGKILL. Every push must be acknowledged (the clients resend in-flight ones to the new
 * primary with the same seqs), and the final values must be minus the exact sum of the
 * acknowledged pushes: none lost, none applied twice. No client may report lost updates. Then
 * server 1 is started again: it copies its groups from their primaries while pushes go on,
 * catches up, is added back to the view, and its copies are bit-identical to the primaries'.
 * A worker's heartbeats follow its groups' primaries: killing one evicts no worker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "ps_proc.h"
#include "psclient.h"
#include "replicated_cluster.h"
#include "status.h"
#include "view_etcd.h"

#define NSERVERS 3
#define NCLIENTS 3
#define ROUNDS 1500
#define VAR_N (3 * 1024) /* split: 1024 elements on each server */

static const char *server_bin, *self_bin;
static test_cluster tc;
static etcd_proc etcd;
static test_repl_flags flags; /* the servers' flags, for test_cluster_respawn */
static const char *lease_ms = "1000";
static const char *more[3]; /* the test's own server flags */
static const char *client_replicas = "2";

static int start(const char *replicas)
{
    client_replicas = replicas;
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, 0, replicas, lease_ms,
                                 more);
}

static int setup(void **state)
{
    (void)state;
    return start("2");
}

static int teardown(void **state);
static char ckpt_dir[64];

static int setup_ckpt(void **state)
{
    (void)state;
    snprintf(ckpt_dir, sizeof(ckpt_dir), "/tmp/psd-fo-ckpt-XXXXXX");
    if (mkdtemp(ckpt_dir) == NULL)
        return -1;
    more[0] = "--checkpoint-dir";
    more[1] = ckpt_dir;
    return start("2");
}

static int teardown_ckpt(void **state)
{
    int rc = teardown(state);
    more[0] = more[1] = NULL;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", ckpt_dir);
    if (system(cmd) != 0)
        rc = -1;
    return rc;
}

static int setup3(void **state)
{
    (void)state;
    return start("3");
}

static int teardown(void **state)
{
    (void)state;
    return test_replicated_stop(&tc, &etcd); /* every server exits cleanly (0) */
}

static ps_client *open_client(void)
{
    static const char *const settings[] = {"split-threshold-bytes", "4K", NULL};
    return test_replicated_client(&tc, -1, client_replicas, settings);
}

static ps_var *make_var(ps_client *c)
{
    ps_var_spec s;
    ps_var_spec_init(&s, "fo/v");
    s.ndims = 1;
    s.dims[0] = VAR_N;
    s.learning_rate = 1.0;
    ps_var *v = NULL;
    if (ps_var_create(c, &s, &v) != PS_OK)
        fprintf(stderr, "create: %s\n", ps_last_error());
    return v;
}

/* A client process: ROUNDS pushes of (id + 1) to every element; exits 0 when every push was
 * acknowledged and the client saw no lost update. */
static int client_main(int id, int rounds)
{
    ps_client *c = open_client();
    if (c == NULL)
        return 10;
    ps_var *v = make_var(c);
    if (v == NULL)
        return 11;
    float *g = malloc(VAR_N * sizeof(float));
    for (size_t i = 0; i < VAR_N; i++)
        g[i] = (float)(id + 1);
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++) {
        if (ps_push(c, v, g) != PS_OK) {
            fprintf(stderr, "client %d push %d: %s\n", id, r, ps_last_error());
            rc = 12;
        }
    }
    uint64_t lost = ps_client_lost_updates(c);
    if (lost) {
        fprintf(stderr, "client %d reports %llu lost updates\n", id, (unsigned long long)lost);
        rc = 13;
    }
    free(g);
    ps_client_close(c);
    return rc;
}

/* The checksum and applied lsn of server `server`'s copy of group `group`. */
static int group_checksum(int server, uint32_t group, uint64_t *sum, uint64_t *lsn)
{
    return test_group_checksum(tc.ports[server], group, 0, sum, NULL, lsn);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void push_ok(ps_client *c, ps_var *v, const float *g)
{
    int rc = ps_push(c, v, g);
    if (rc != PS_OK)
        fprintf(stderr, "push: %s\n", ps_last_error());
    assert_int_equal(rc, PS_OK);
}

static uint64_t view_epoch_of(int server)
{
    return test_server_epoch(tc.ports[server]);
}

/* Whether every group's two copies (its placement server's and the next one's) agree, asked
 * for up to 5 s (a backup may still apply the last batch). */
static bool groups_agree(void)
{
    bool same = false;
    for (int tries = 0; tries < 50 && !same; tries++) {
        same = true;
        for (uint32_t grp = 0; grp < NSERVERS && same; grp++) {
            uint64_t a, b, la, lb;
            same = group_checksum((int)grp, grp, &a, &la) == 0 &&
                   group_checksum((int)((grp + 1) % NSERVERS), grp, &b, &lb) == 0 && a == b &&
                   la == lb;
        }
        if (!same)
            usleep(100 * 1000);
    }
    return same;
}

static void check_all(ps_client *c, ps_var *v, float want)
{
    float *w = malloc(VAR_N * sizeof(float));
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < VAR_N; i++)
        if (w[i] != want && wrong++ < 5)
            fprintf(stderr, "v[%zu] = %.1f, expected %.1f\n", i, w[i], want);
    free(w);
    assert_int_equal(wrong, 0);
}

/* SIGKILLs server i and reaps it (its pid slot then 0: the teardown skips it). */
static void kill_server(int i)
{
    assert_int_equal(kill(tc.pids[i], SIGKILL), 0);
    waitpid(tc.pids[i], NULL, 0);
    tc.pids[i] = 0;
}

/* A gradient of VAR_N ones (caller frees). */
static float *ones(void)
{
    float *g = malloc(VAR_N * sizeof(float));
    assert_non_null(g);
    for (size_t i = 0; i < VAR_N; i++)
        g[i] = 1.0f;
    return g;
}

static void test_kill_primary_exact_sums_then_rejoin(void **state)
{
    (void)state;
    /* Client processes: this binary run again (nng can't be used in a plain fork). */
    pid_t kids[NCLIENTS];
    for (int k = 0; k < NCLIENTS; k++) {
        kids[k] = test_spawn_child(self_bin, server_bin, client_replicas, k, ROUNDS, tc.spec);
        assert_true(kids[k] > 0);
    }
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    float *g = ones();
    usleep(1500 * 1000);
    double t_kill = now_s();
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    fprintf(stderr, "killed ps 1 (primary of group 1) while %d clients push\n", NCLIENTS);
    /* Failover time: from the kill to the first push acknowledged by every group (group 1
     * by its new primary). */
    push_ok(c, v, g);
    fprintf(stderr, "failover: first push acknowledged %.2f s after the kill\n", now_s() - t_kill);
    for (int k = 0; k < NCLIENTS; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    fprintf(stderr, "clients done %.1f s after the kill\n", now_s() - t_kill);
    /* Every push acknowledged, each applied once: v = -ROUNDS * (1 + 2 + 3) - 1 everywhere. */
    float want = -(float)ROUNDS * (float)(NCLIENTS * (NCLIENTS + 1) / 2) - 1.0f;
    check_all(c, v, want);
    /* Group 2 (servers 2 and 0) never lost a member: identical copies. */
    uint64_t s0, s1, l0, l1;
    assert_int_equal(group_checksum(2, 2, &s0, &l0), 0);
    assert_int_equal(group_checksum(0, 2, &s1, &l1), 0);
    assert_true(s0 == s1 && l0 == l1);

    /* Server 1 comes back: it copies groups 0 and 1 from their primaries (0 and 2) while pushes
     * go on (for seconds, more on a loaded machine or under ASan: up to 90 s allowed), and is
     * added back once caught up; pushes then wait for it again. */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    double t0 = now_s();
    bool same = false;
    int pushes = 0;
    uint64_t a0 = 0, a1 = 0, b0 = 0, b1 = 0, la0 = 0, la1 = 0, lb0 = 0, lb1 = 0;
    while (!same && now_s() - t0 < 90) {
        for (int k = 0; k < 20; k++, pushes++)
            push_ok(c, v, g);
        same = group_checksum(0, 0, &a0, &la0) == 0 && group_checksum(1, 0, &a1, &la1) == 0 &&
               group_checksum(2, 1, &b0, &lb0) == 0 && group_checksum(1, 1, &b1, &lb1) == 0 &&
               a0 == a1 && la0 == la1 && b0 == b1 && lb0 == lb1;
        if (!same)
            usleep(200 * 1000);
    }
    fprintf(stderr,
            "ps 1 rejoined: copies identical %.1f s after its restart (%d pushes "
            "meanwhile)\n",
            now_s() - t0, pushes);
    if (!same)
        fprintf(stderr,
                "group 0: ps 0 %016llx at lsn %llu, ps 1 %016llx at lsn %llu; group 1: ps 2 "
                "%016llx at lsn %llu, ps 1 %016llx at lsn %llu\n",
                (unsigned long long)a0, (unsigned long long)la0, (unsigned long long)a1,
                (unsigned long long)la1, (unsigned long long)b0, (unsigned long long)lb0,
                (unsigned long long)b1, (unsigned long long)lb1);
    assert_true(same);
    /* ... and is live in a newer view (epoch 3: the kill made 2), which every reply carries. */
    uint64_t epoch = 0;
    for (int i = 0; i < 100 && epoch < 3; i++) {
        epoch = view_epoch_of(0);
        if (epoch < 3)
            usleep(100 * 1000);
    }
    fprintf(stderr, "view epoch %llu\n", (unsigned long long)epoch);
    assert_true(epoch >= 3);
    for (int k = 0; k < 20; k++, pushes++)
        push_ok(c, v, g);
    assert_int_equal(group_checksum(0, 0, &a0, &la0), 0);
    assert_int_equal(group_checksum(1, 0, &a1, &la1), 0);
    assert_true(a0 == a1 && la0 == la1);
    check_all(c, v, want - (float)pushes);
    assert_int_equal(ps_client_lost_updates(c), 0);
    free(g);
    ps_client_close(c);
}

/* replicas 3 on 3 servers (each holds every group): kill the primary of group 0 (ps 0), then
 * the new one (ps 1) while clients push; ps 2 ends up serving every group; every push is
 * acknowledged and applied once. Then both come back, copy every group from ps 2 and rejoin:
 * the three copies of each group are identical. */
static void test_three_replicas_kill_two_then_rejoin(void **state)
{
    (void)state;
    pid_t kids[NCLIENTS];
    for (int k = 0; k < NCLIENTS; k++) {
        kids[k] = test_spawn_child(self_bin, server_bin, client_replicas, k, ROUNDS * 2, tc.spec);
        assert_true(kids[k] > 0);
    }
    usleep(1500 * 1000);
    assert_int_equal(kill(tc.pids[0], SIGKILL), 0);
    fprintf(stderr, "killed ps 0 (primary of group 0)\n");
    /* Wait until ps 1 took group 0 over (a view without ps 0), then kill it too. */
    double t0 = now_s();
    while (view_epoch_of(2) < 2 && now_s() - t0 < 20)
        usleep(100 * 1000);
    assert_true(view_epoch_of(2) >= 2);
    usleep(500 * 1000);
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    fprintf(stderr, "killed ps 1 (the new primary of group 0) %.1f s later\n", now_s() - t0);
    for (int k = 0; k < NCLIENTS; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    float want = -(float)(ROUNDS * 2) * (float)(NCLIENTS * (NCLIENTS + 1) / 2);
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    check_all(c, v, want);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 0, flags.v), 0);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    float *g = ones();
    t0 = now_s();
    bool same = false;
    int pushes = 0;
    while (!same && now_s() - t0 < 60) {
        for (int k = 0; k < 20; k++, pushes++)
            push_ok(c, v, g);
        same = true;
        for (uint32_t grp = 0; grp < NSERVERS && same; grp++) {
            uint64_t sum[NSERVERS], lsn[NSERVERS];
            for (int s = 0; s < NSERVERS && same; s++)
                same = group_checksum(s, grp, &sum[s], &lsn[s]) == 0 &&
                       (s == 0 || (sum[s] == sum[0] && lsn[s] == lsn[0]));
        }
        if (!same)
            usleep(200 * 1000);
    }
    fprintf(stderr,
            "ps 0 and ps 1 rejoined: 3 identical copies of every group %.1f s after "
            "their restart (%d pushes meanwhile)\n",
            now_s() - t0, pushes);
    assert_true(same);
    check_all(c, v, want - (float)pushes);
    assert_int_equal(ps_client_lost_updates(c), 0);
    free(g);
    ps_client_close(c);
}

/* Starts every server of the stopped cluster again: the variable holds the 50 pushes of g (all
 * ones) acknowledged before the stop, takes 10 more, and every group's copies agree (the
 * backups copied and followed their primaries). Frees g. */
static void restart_whole_and_check(float *g)
{
    for (int i = 0; i < NSERVERS; i++)
        assert_int_equal(test_cluster_respawn(&tc, server_bin, i, flags.v), 0);
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    check_all(c, v, -50.0f);
    for (int k = 0; k < 10; k++)
        push_ok(c, v, g);
    check_all(c, v, -60.0f);
    assert_true(groups_agree());
    assert_int_equal(ps_client_lost_updates(c), 0);
    free(g);
    ps_client_close(c);
}

/* A whole replicated cluster stopped and started again restores from the primaries'
 * checkpoints; the backups copy their groups from the primaries at the first view. */
static void test_whole_cluster_restart_restores(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    float *g = ones();
    for (int k = 0; k < 50; k++)
        push_ok(c, v, g);
    ps_client_close(c);
    assert_int_equal(test_cluster_stop(&tc), 0); /* SIGTERM: each writes a final checkpoint */
    restart_whole_and_check(g);
}

/* Checkpoint RPC to a server (its own group): 0 when it answered OK. */
static int checkpoint_now(int server)
{
    Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
    uint8_t body[16];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CHECKPOINT;
    env.request_id = 1;
    env.body.data = body;
    env.body.len = psd__v1__checkpoint_request__pack(&req, body);
    frame f;
    nng_msg *m;
    int st = test_raw_call(tc.ports[server], &env, NULL, 0, &f, &m);
    if (st > -1000) {
        frame_fini(&f);
        nng_msg_free(m);
    }
    return st;
}

/* A whole cluster stopped while a failover's new primary serves a group restores that group
 * from the new primary's checkpoints, not from the older ones of the server that died: ps 1,
 * primary of group 1, checkpoints after 20 pushes and is killed; ps 2 serves group 1 for 30
 * more pushes (and checkpoints it into group-copies-2/); the cluster stops with ps 1 still
 * down and starts again whole. Every acknowledged push is there, ps 1 copied group 1 from
 * ps 2, and the copies agree. */
static void test_restart_after_failover_restores_newest(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    float *g = ones();
    for (int k = 0; k < 20; k++)
        push_ok(c, v, g);
    assert_int_equal(checkpoint_now(1), 0); /* ps 1's newest file: 20 pushes */
    kill_server(1);
    for (int k = 0; k < 30; k++)
        push_ok(c, v, g);
    check_all(c, v, -50.0f);
    ps_client_close(c);
    assert_int_equal(test_cluster_stop(&tc), 0); /* SIGTERM: final checkpoints */
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "ls %s/group-copies-2/ckpt-1-*.psc >/dev/null 2>&1",
             ckpt_dir);
    assert_int_equal(system(pattern), 0);
    /* Group 1's primary is ps 2 (the newest copy); ps 1 copies it from there. */
    restart_whole_and_check(g);
}

/* The view in etcd (epoch 0 when none can be read). */
static view read_view(void)
{
    view_record r;
    memset(&r, 0, sizeof(r));
    char prefix[64], err[512];
    test_view_prefix(&tc, prefix, sizeof(prefix));
    etcd_client *e = NULL;
    if (etcd_client_create(&e, etcd.endpoint, 2000, err, sizeof(err)) == 0 &&
        view_etcd_read(e, prefix, &r, NULL, err, sizeof(err)) != 0)
        memset(&r, 0, sizeof(r));
    etcd_client_destroy(e);
    return r.v;
}

/* Polls the view until server s is live in it (at most 30 s). */
static view wait_live(int s)
{
    view v;
    for (int i = 0; i < 300; i++) {
        v = read_view();
        if (v.epoch > 0 && v.live[s])
            break;
        usleep(100 * 1000);
    }
    return v;
}

/* Leaves group 0 = {0, 1} without a live in-sync member: 20 pushes, ps 1 killed, 30 more that
 * ps 0 acknowledges alone (checkpointed), ps 0 killed, ps 1 restarted and live again (caught up
 * on group 1). Returns the view then; the all-ones gradient in *g (caller frees). */
static view strand_group0(float **g)
{
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    *g = ones();
    for (int k = 0; k < 20; k++)
        push_ok(c, v, *g);
    kill_server(1);
    for (int k = 0; k < 30; k++)
        push_ok(c, v, *g);
    check_all(c, v, -50.0f);
    ps_client_close(c);
    assert_int_equal(checkpoint_now(0), 0); /* ps 0's group 0: 50 pushes */
    view before = read_view();
    assert_false(view_in_sync(&before, 0, 1));
    kill_server(0);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    view w = wait_live(1);
    assert_int_equal(w.live[1], 1);
    assert_int_equal(w.primary[0], -1);
    assert_int_equal(w.primary[1], 2);
    return w;
}

/* A group with no live in-sync member waits for one; it never goes to a member that missed
 * what was acknowledged: ps 1 is killed and ps 0 serves group 0 = {0, 1} alone for 30 pushes
 * (checkpointed); ps 0 is killed; ps 1 comes back and rejoins (caught up on group 1 from ps 2),
 * but group 0 has no primary, and a pull of it is refused naming ps 0; ps 0 comes back with its
 * checkpoint and serves group 0 again with every acknowledged push, and ps 1 copies it. */
static void test_out_of_sync_member_never_takes_a_group(void **state)
{
    (void)state;
    float *g;
    view w = strand_group0(&g);
    ps_client *c;
    ps_var *v;
    /* Refused, naming the server that holds group 0's newest copy. */
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__PullRequest rq = PSD__V1__PULL_REQUEST__INIT;
    rq.name = "fo/v";
    uint8_t body[64];
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = VAR_N / NSERVERS; /* group 0's part */
    env.tensor = &tm;
    env.method = PSD__V1__METHOD__PULL;
    env.request_id = 7;
    env.group = 1; /* group 0 */
    env.body.data = body;
    env.body.len = psd__v1__pull_request__pack(&rq, body);
    frame f;
    nng_msg *m;
    int st = test_raw_call(tc.ports[1], &env, NULL, 0, &f, &m);
    fprintf(stderr, "ps 1 on group 0: %d %s\n", st, st > -1000 ? f.env->message : "");
    assert_int_equal(st, STATUS_UNAVAILABLE);
    assert_non_null(strstr(f.env->message, "ps 0"));
    frame_fini(&f);
    nng_msg_free(m);
    /* ps 0 comes back: group 0 is served again, whole. */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 0, flags.v), 0);
    w = wait_live(0);
    assert_int_equal(w.primary[0], 0);
    c = open_client();
    assert_non_null(c);
    v = make_var(c);
    assert_non_null(v);
    check_all(c, v, -50.0f);
    for (int k = 0; k < 10; k++)
        push_ok(c, v, g);
    check_all(c, v, -60.0f);
    assert_true(groups_agree());
    free(g);
    ps_client_close(c);
}

/* The psctl binary next to the server's in the build tree (build/server/ps-server ->
 * build/client/psctl). */
static void psctl_path(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", server_bin);
    char *slash = strrchr(buf, '/');
    if (slash && slash - buf >= 7 && strncmp(slash - 7, "/server", 7) == 0)
        snprintf(slash - 7, cap - (size_t)(slash - 7 - buf), "/client/psctl");
}

/* Runs psctl with args against the cluster and its etcd; its output in buf. Returns its exit
 * status. */
static int psctl(const char *args, char *buf, size_t cap)
{
    char bin[512], cmd[2048];
    psctl_path(bin, sizeof(bin));
    snprintf(cmd, sizeof(cmd), "'%s' --cluster '%s' --coordinator '%s' %s 2>&1", bin, tc.spec,
             etcd.endpoint, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    int st = pclose(f);
    fprintf(stderr, "psctl %s:\n%s", args, buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Group 0's only in-sync member (ps 0) is down for good: an operator forces the group onto ps 1,
 * which serves it from the copy it holds (nothing: it restarted), giving up ps 0's updates.
 * psctl refuses what makes no sense first. When ps 0 comes back it is behind in group 0: it
 * copies from ps 1 and never serves its older copy. */
static void test_forced_primary(void **state)
{
    (void)state;
    float *g;
    view w = strand_group0(&g);
    ps_client *c;
    ps_var *v;
    char out[4096];
    /* Refused: bad arguments, a server that is no member, a group that has a primary, a
     * member that is not live. */
    assert_int_equal(psctl("force-primary 0", out, sizeof(out)), 2);
    assert_int_equal(psctl("force-primary zero 1", out, sizeof(out)), 2);
    assert_int_equal(psctl("force-primary 0 2", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "not a member of group 0"));
    assert_int_equal(psctl("force-primary 1 2", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "nothing to force"));
    assert_int_equal(psctl("force-primary 0 0", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "not live"));
    /* Forced. */
    assert_int_equal(psctl("force-primary 0 1", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "group 0 is served by server 1"));
    w = read_view();
    assert_int_equal(w.primary[0], 1);
    assert_true(view_in_sync(&w, 0, 1));
    assert_false(view_in_sync(&w, 0, 0));
    /* The group is served again, from ps 1's copy: ps 0's pushes to group 0 are given up, the
     * other groups keep theirs. */
    c = open_client();
    assert_non_null(c);
    v = make_var(c);
    assert_non_null(v);
    float *all = calloc(VAR_N, sizeof(float));
    assert_non_null(all);
    assert_int_equal(ps_pull(c, v, all), PS_OK);
    for (int i = 0; i < VAR_N; i++)
        assert_true(all[i] == (i < VAR_N / NSERVERS ? 0.0f : -50.0f));
    push_ok(c, v, g);
    /* ps 0 comes back: behind in group 0, it copies from ps 1; ps 1 keeps serving it. */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 0, flags.v), 0);
    w = wait_live(0);
    assert_int_equal(w.primary[0], 1);
    for (int k = 0; k < 5; k++)
        push_ok(c, v, g);
    assert_int_equal(ps_pull(c, v, all), PS_OK);
    for (int i = 0; i < VAR_N; i++)
        assert_true(all[i] == (i < VAR_N / NSERVERS ? -6.0f : -56.0f));
    assert_true(groups_agree());
    free(all);
    free(g);
    ps_client_close(c);
}

/* A lease of 10 s: whether a stopping server revoked its lease shows as seconds. */
static int setup_long_lease(void **state)
{
    (void)state;
    lease_ms = "10000";
    return start("2");
}

static int teardown_long_lease(void **state)
{
    int rc = teardown(state);
    lease_ms = "1000";
    return rc;
}

static double since_s(double t0)
{
    return now_s() - t0;
}

/* A server stopped cleanly (SIGTERM) revokes its lease, also after it restarted and rejoined:
 * the others install the view without it at once, not after its 10 s lease. */
static void test_sigterm_after_rejoin_revokes(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *v = make_var(c);
    assert_non_null(v);
    float *g = ones();
    for (int k = 0; k < 10; k++)
        push_ok(c, v, g);
    /* A restart is a new incarnation: dropped at once (its new registration), then it rejoins. */
    kill_server(1);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    view w = wait_live(1);
    assert_int_equal(w.live[1], 1);
    for (int k = 0; k < 10; k++)
        push_ok(c, v, g);
    uint64_t e = w.epoch;
    double t0 = now_s();
    assert_int_equal(kill(tc.pids[1], SIGTERM), 0);
    view after;
    do {
        after = read_view();
        usleep(20 * 1000);
    } while ((after.epoch == e || after.live[1]) && since_s(t0) < 15.0);
    fprintf(stderr, "view without ps 1 %.2f s after its SIGTERM (lease 10 s)\n", since_s(t0));
    assert_int_equal(after.live[1], 0);
    assert_true(since_s(t0) < 5.0); /* revoked: well inside the lease, even on a busy machine */
    assert_int_equal(test_wait_exit(tc.pids[1], 20000), 0);
    tc.pids[1] = 0;
    check_all(c, v, -20.0f);
    free(g);
    ps_client_close(c);
}

/* Replicas 2 with --worker-timeout-ms 2000 on the servers: a worker client whose heartbeats
 * (every 100 ms) are its only calls outlives the death of ps 1, primary of group 1: its
 * heartbeats for group 1 follow the group to its new primary (ps 2), which never evicts it. */
static int setup_hb(void **state)
{
    (void)state;
    more[0] = "--worker-timeout-ms";
    more[1] = "2000";
    int rc = start("2");
    more[0] = more[1] = NULL;
    return rc;
}

/* Group `group`'s ServerStatus on `server` (the copy it holds): its evictions and whether
 * worker 0 is live there. -1 when the server did not answer. */
static int group_worker_status(int server, uint32_t group, uint64_t *evictions, bool *live)
{
    Psd__V1__ServerStatusRequest sr = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    uint8_t body[16];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__SERVER_STATUS;
    env.group = group + 1;
    env.body.data = body;
    env.body.len = psd__v1__server_status_request__pack(&sr, body);
    frame f;
    nng_msg *m;
    int st = test_raw_call(tc.ports[server], &env, NULL, 0, &f, &m);
    if (st != 0) {
        if (st > -1000) {
            frame_fini(&f);
            nng_msg_free(m);
        }
        return -1;
    }
    Psd__V1__ServerStatusReply *r =
        psd__v1__server_status_reply__unpack(NULL, f.env->body.len, f.env->body.data);
    int rc = -1;
    if (r) {
        *evictions = r->evictions;
        *live = false;
        for (size_t i = 0; i < r->n_workers; i++)
            if (r->workers[i]->id == 0 && r->workers[i]->live)
                *live = true;
        psd__v1__server_status_reply__free_unpacked(r, NULL);
        rc = 0;
    }
    frame_fini(&f);
    nng_msg_free(m);
    return rc;
}

static void test_heartbeats_follow_the_primary(void **state)
{
    (void)state;
    ps_config *cfg;
    ps_client *c = NULL;
    char tf[1200];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "cluster", tf), PS_OK);
    assert_int_equal(ps_config_set(cfg, "replicas", "2"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "worker-id", "0"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "heartbeat-ms", "100"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "deadline-ms", "30000"), PS_OK);
    if (ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    assert_non_null(c);
    int64_t clock = 0;
    assert_int_equal(ps_clock(c, &clock), PS_OK); /* registered as worker 0 everywhere */
    uint64_t ev = 0;
    bool live = false;
    assert_int_equal(group_worker_status(2, 1, &ev, &live), 0);
    assert_true(live);
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    double t_kill = now_s();
    int st;
    assert_int_equal(waitpid(tc.pids[1], &st, 0), tc.pids[1]);
    tc.pids[1] = 0; /* not stopped again by the teardown */
    fprintf(stderr, "killed ps 1 (primary of group 1); the worker only sends heartbeats\n");
    /* Past the failover (lease 1 s) and twice the worker timeout after it. */
    uint64_t epoch = 0;
    while (now_s() - t_kill < 10 && (epoch = view_epoch_of(2)) < 2)
        usleep(100 * 1000);
    assert_true(epoch >= 2);
    fprintf(stderr, "view epoch %llu %.1f s after the kill\n", (unsigned long long)epoch,
            now_s() - t_kill);
    usleep(4500 * 1000);
    for (uint32_t g = 0; g < NSERVERS; g++) {
        int server = g == 1 ? 2 : (int)g; /* ps 2 took group 1 over */
        assert_int_equal(group_worker_status(server, g, &ev, &live), 0);
        fprintf(stderr, "group %u on ps %d: worker 0 %s, %llu eviction(s)\n", g, server,
                live ? "live" : "not live", (unsigned long long)ev);
        assert_true(live);
        assert_int_equal(ev, 0);
    }
    /* The worker goes on as it was: its clock is taken by every group. */
    assert_int_equal(ps_clock(c, &clock), PS_OK);
    assert_int_equal(clock, 2);
    ps_client_close(c);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    self_bin = argv[0];
    if (argc >= 7 && strcmp(argv[2], "--child") == 0) {
        /* self SERVER_BIN --child REPLICAS ID ROUNDS SPEC: one client process */
        client_replicas = argv[3];
        snprintf(tc.spec, sizeof(tc.spec), "%s", argv[6]);
        return client_main(atoi(argv[4]), atoi(argv[5]));
    }
    if (etcd_proc_binary() == NULL) {
        fprintf(stderr, "SKIP: no etcd binary (/usr/bin/etcd, $PSD_ETCD or etcd on PATH): "
                        "replicated clusters need one as their coordinator\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill_primary_exact_sums_then_rejoin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_three_replicas_kill_two_then_rejoin, setup3, teardown),
        cmocka_unit_test_setup_teardown(test_whole_cluster_restart_restores, setup_ckpt,
                                        teardown_ckpt),
        cmocka_unit_test_setup_teardown(test_restart_after_failover_restores_newest, setup_ckpt,
                                        teardown_ckpt),
        cmocka_unit_test_setup_teardown(test_out_of_sync_member_never_takes_a_group, setup_ckpt,
                                        teardown_ckpt),
        cmocka_unit_test_setup_teardown(test_forced_primary, setup_ckpt, teardown_ckpt),
        cmocka_unit_test_setup_teardown(test_sigterm_after_rejoin_revokes, setup_long_lease,
                                        teardown_long_lease),
        cmocka_unit_test_setup_teardown(test_heartbeats_follow_the_primary, setup_hb, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
