/* Failover agents (common/view_agent.c) in separate processes against a real etcd: the first
 * view, a primary killed with SIGKILL (one epoch bump, within the lease, installed by an agent
 * whose callback still takes 6 s over the first view), a rejoin (whose callback is set after its
 * agent read the view), etcd down (the view stays), a server frozen past its lease (it learns
 * "lease lost" and rejoins), a clean stop (no wait for the lease), and a view of another shape
 * refused at start.
 *
 * `test_view_agent --agent ENDPOINT PREFIX SELF N R LEASE_MS LOG` is one agent: it logs every
 * event ("EVENT view", "EVENT lease-lost", ...) to LOG and, like a rejoining server that is
 * caught up at once, marks its groups caught up whenever it is registered but not live. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "log.h"
#include "view_agent.h"

#define N 3
#define R 2
#define LEASE_MS 2000

static etcd_proc etcd;
static const char *self_path;
static char prefix[64] = "/psd/test-agent";
static pid_t agents[N];
static char logs[N][200];
static int late_callback_ms; /* > 0: the next agents set their callback that late */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the child: one agent ---- */

static view_agent *child_agent;
static uint32_t child_self;

static void child_mark_if_out(const view *v)
{
    if (v->epoch > 0 && !v->live[child_self])
        for (uint32_t k = 0; k < v->replicas; k++)
            view_agent_mark_caught_up(child_agent,
                                      (child_self + v->num_servers - k) % v->num_servers);
}

static void child_event(void *arg, view_event ev, const view *v)
{
    (void)arg;
    static const char *names[] = {"view", "lease-lost", "lease-uncertain", "lease-ok"};
    log_info("EVENT %s epoch %" PRIu64 " live %d%d%d primaries %d %d %d%s", names[ev], v->epoch,
             v->live[0], v->live[1], v->live[2], v->primary[0], v->primary[1], v->primary[2],
             ev == VIEW_EVENT_VIEW && view_agent_in_view(child_agent) ? " (in it)" : "");
    /* A slow callback (agent 2, first view) must not hold up what the agent proposes. */
    const char *slow = getenv("PSD_TEST_SLOW_VIEW_MS");
    if (slow && ev == VIEW_EVENT_VIEW && v->epoch == 1)
        usleep((useconds_t)atoi(slow) * 1000);
    if (ev == VIEW_EVENT_VIEW || ev == VIEW_EVENT_LEASE_OK) {
        view cur;
        if (view_agent_current(child_agent, &cur))
            child_mark_if_out(&cur);
    }
}

static int child_main(char **argv)
{
    int fd = open(argv[8], O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0)
        dup2(fd, 2);
    child_self = (uint32_t)atoi(argv[4]);
    log_init("ps", (int)child_self, LOG_INFO, LOG_FORMAT_TEXT);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    char url[64], err[2048];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%u", 7000 + child_self);
    view_agent_config cfg = {
        .endpoints = argv[2],
        .prefix = argv[3],
        .self = child_self,
        .num_servers = (uint32_t)atoi(argv[5]),
        .replicas = (uint32_t)atoi(argv[6]),
        .url = url,
        .lease_ms = atoi(argv[7]),
        .poll_ms = 100,
        .start_grace_ms = 20000,
    };
    if (view_agent_start(&child_agent, &cfg, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return 2;
    }
    /* A server sets its callback only once its groups are set up: a view the agent read
     * before must still reach it. */
    const char *late = getenv("PSD_TEST_LATE_CALLBACK_MS");
    if (late)
        usleep((useconds_t)atoi(late) * 1000);
    view_agent_on_change(child_agent, child_event, NULL);
    int sig;
    sigwait(&sigs, &sig);
    log_info("EVENT stopping");
    view_agent_stop(child_agent);
    return 0;
}

static pid_t spawn_agent(int i)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char self[8], n[8], r[8], lease[16];
        snprintf(self, sizeof(self), "%d", i);
        snprintf(n, sizeof(n), "%d", N);
        snprintf(r, sizeof(r), "%d", R);
        snprintf(lease, sizeof(lease), "%d", LEASE_MS);
        if (i == 2)
            setenv("PSD_TEST_SLOW_VIEW_MS", "6000", 1);
        if (late_callback_ms > 0) {
            char ms[16];
            snprintf(ms, sizeof(ms), "%d", late_callback_ms);
            setenv("PSD_TEST_LATE_CALLBACK_MS", ms, 1);
        }
        execl(self_path, self_path, "--agent", etcd.endpoint, prefix, self, n, r, lease, logs[i],
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* ---- the parent ---- */

static etcd_client *etc;

/* Reads the view; epoch 0 when there is none or etcd does not answer. */
static view_record read_view(void)
{
    view_record r;
    char err[1024];
    if (view_etcd_read(etc, prefix, &r, NULL, err, sizeof(err)) != 0)
        memset(&r, 0, sizeof(r));
    return r;
}

static bool live_is(const view *v, int a, int b, int c)
{
    return v->live[0] == a && v->live[1] == b && v->live[2] == c;
}

/* Polls the view until pred holds (at most ms); returns the time it took, -1 on timeout. */
static int64_t wait_view(bool (*pred)(const view *), int64_t ms, view_record *out)
{
    int64_t t0 = now_ms();
    do {
        *out = read_view();
        if (out->v.epoch > 0 && pred(&out->v))
            return now_ms() - t0;
        usleep(20 * 1000);
    } while (now_ms() - t0 < ms);
    return -1;
}

static bool all_live(const view *v)
{
    return live_is(v, 1, 1, 1);
}
static bool one_gone(const view *v)
{
    return live_is(v, 1, 0, 1) && v->primary[1] == 2;
}
static bool zero_gone(const view *v)
{
    return live_is(v, 0, 1, 1) && v->primary[0] == 1;
}

/* Waits up to ms for text in the log at path (an agent logs a view just after installing it). */
static bool wait_log(const char *path, const char *text, int64_t ms)
{
    int64_t t0 = now_ms();
    while (!test_file_contains(path, text)) {
        if (now_ms() - t0 >= ms)
            return false;
        usleep(20 * 1000);
    }
    return true;
}

static void dump_logs(void)
{
    for (int i = 0; i < N; i++) {
        char cmd[768];
        snprintf(cmd, sizeof(cmd), "echo '--- agent %d:'; tail -n 30 '%s'", i, logs[i]);
        if (system(cmd) != 0)
            print_message("cannot show %s\n", logs[i]);
    }
}

static void test_failover(void **state)
{
    (void)state;
    view_record v;
    /* First view: every server live, primary[g] = g, installed once. */
    for (int i = 0; i < N; i++)
        agents[i] = spawn_agent(i);
    int64_t took = wait_view(all_live, 15000, &v);
    if (took < 0)
        dump_logs();
    assert_true(took >= 0);
    assert_int_equal(v.v.epoch, 1);
    for (int g = 0; g < N; g++)
        assert_int_equal(v.v.primary[g], g);
    print_message("first view after %lld ms\n", (long long)took);
    usleep(500 * 1000);
    assert_int_equal(read_view().v.epoch, 1);

    /* SIGKILL server 1, primary of group 1 = {1, 2}: server 2 takes over, one epoch bump. */
    int64_t t0 = now_ms();
    kill(agents[1], SIGKILL);
    waitpid(agents[1], NULL, 0);
    took = wait_view(one_gone, 10000, &v);
    if (took < 0)
        dump_logs();
    assert_true(took >= 0);
    took = now_ms() - t0;
    print_message("failover (SIGKILL to the new view) took %lld ms with a %d ms lease\n",
                  (long long)took, LEASE_MS);
    assert_true(took <= LEASE_MS + 2500);
    assert_int_equal(v.v.epoch, 2);
    assert_int_equal(v.v.primary[0], 0);
    assert_int_equal(v.v.primary[2], 2);
    usleep(1000 * 1000);
    assert_int_equal(read_view().v.epoch, 2);
    assert_true(wait_log(logs[2], "installed the view epoch 2", 3000));
    assert_false(test_file_contains(logs[0], "installed the view epoch 2"));
    assert_true(wait_log(logs[0], "EVENT view epoch 2 live 101 primaries 0 2 2 (in it)", 3000));
    assert_true(test_file_contains(logs[2], "EVENT view epoch 1 live 111 primaries 0 1 2 (in it)"));

    /* Server 1 restarts and sets its callback only 1.5 s after its start, when its agent has
     * read the view (epoch 2) already: the callback still gets that view, so the server
     * marks itself caught up at once and is live again; group 1's primary stays 2. */
    late_callback_ms = 1500;
    agents[1] = spawn_agent(1);
    late_callback_ms = 0;
    took = wait_view(all_live, 10000, &v);
    if (took < 0)
        dump_logs();
    assert_true(took >= 0);
    assert_true(test_file_contains(logs[1], "EVENT view epoch 2 live 101 primaries 0 2 2"));
    assert_int_equal(v.v.epoch, 3);
    assert_int_equal(v.v.primary[1], 2);
    print_message("rejoin after %lld ms\n", (long long)took);
}

static void test_etcd_down(void **state)
{
    (void)state;
    view_record before = read_view();
    assert_true(all_live(&before.v));
    etcd_proc_kill(&etcd);
    sleep(3); /* longer than the lease */
    for (int i = 0; i < N; i++) {
        assert_int_equal(waitpid(agents[i], NULL, WNOHANG), 0);
        assert_true(test_file_contains(logs[i], "failover waits for etcd"));
        assert_true(test_file_contains(logs[i], "EVENT lease-uncertain"));
    }
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    /* etcd renews every lease when it comes back: nobody is dropped, the view stays. */
    sleep(3);
    view_record after = read_view();
    assert_int_equal(after.v.epoch, before.v.epoch);
    assert_true(all_live(&after.v));
    for (int i = 0; i < N; i++) {
        assert_true(test_file_contains(logs[i], "EVENT lease-ok"));
        assert_true(test_file_contains(logs[i], "etcd answers again"));
    }
}

static void test_lease_lost(void **state)
{
    (void)state;
    view_record v, before = read_view();
    /* Server 0 frozen past its lease: the others drop it (group 0's primary -> 1). */
    kill(agents[0], SIGSTOP);
    int64_t took = wait_view(zero_gone, 10000, &v);
    assert_true(took >= 0);
    assert_int_equal(v.v.epoch, before.v.epoch + 1);
    /* Thawed, it learns that its lease is gone, registers again and rejoins. */
    kill(agents[0], SIGCONT);
    took = wait_view(all_live, 10000, &v);
    if (took < 0)
        dump_logs();
    assert_true(took >= 0);
    assert_int_equal(v.v.epoch, before.v.epoch + 2);
    assert_int_equal(v.v.primary[0], 1);
    assert_true(test_file_contains(logs[0], "EVENT lease-lost"));
    /* Live again as its new incarnation. */
    char line[96];
    snprintf(line, sizeof(line), "EVENT view epoch %" PRIu64 " live 111 primaries 1 2 2 (in it)",
             before.v.epoch + 2);
    assert_true(wait_log(logs[0], line, 3000));
    assert_true(test_file_contains(logs[0], "lease lost"));
}

static uint64_t seen_epoch;
static bool above_seen(const view *v)
{
    return v->epoch > seen_epoch && live_is(v, 1, 1, 1);
}

/* The view key deleted (as if etcd lost its data): a view comes back above every epoch seen. */
static void test_view_deleted(void **state)
{
    (void)state;
    view_record v;
    char err[1024], key[128];
    seen_epoch = read_view().v.epoch;
    assert_true(seen_epoch > 0);
    snprintf(key, sizeof(key), "%s/view", prefix);
    assert_int_equal(etcd_delete(etc, key, err, sizeof(err)), 0);
    int64_t took = wait_view(above_seen, 10000, &v);
    assert_true(took >= 0);
    assert_int_equal(v.v.epoch, seen_epoch + 1);
    for (int g = 0; g < N; g++)
        assert_int_equal(v.v.primary[g], g);

    /* Server 2's key deleted while its lease lives: it puts the key back (and, dropped from
     * the view meanwhile or not, ends up live again). */
    seen_epoch = v.v.epoch;
    snprintf(key, sizeof(key), "%s/servers/2", prefix);
    assert_int_equal(etcd_delete(etc, key, err, sizeof(err)), 0);
    int64_t t0 = now_ms();
    while (!test_file_contains(logs[2], "had disappeared") && now_ms() - t0 < 5000)
        usleep(50 * 1000);
    assert_true(test_file_contains(logs[2], "registered again"));
    usleep(500 * 1000);
    assert_true(wait_view(all_live, 10000, &v) >= 0);
    assert_true(v.v.epoch >= seen_epoch);
}

static void test_clean_stop(void **state)
{
    (void)state;
    view_record v;
    /* SIGTERM revokes the lease: the others drop server 0 without waiting for the TTL. */
    int64_t t0 = now_ms();
    kill(agents[0], SIGTERM);
    assert_int_equal(test_wait_exit(agents[0], 5000), 0);
    int64_t took = wait_view(zero_gone, 5000, &v);
    assert_true(took >= 0);
    took = now_ms() - t0;
    print_message("clean stop to the new view: %lld ms\n", (long long)took);
    assert_true(took < LEASE_MS);
    for (int i = 1; i < N; i++) {
        kill(agents[i], SIGTERM);
        assert_int_equal(test_wait_exit(agents[i], 5000), 0);
    }
}

static void test_other_cluster(void **state)
{
    (void)state;
    /* The stored view is for 3 servers with 2 replicas: 3 replicas at the same prefix is
     * refused at start, naming the prefix. */
    view_agent *a = NULL;
    char err[2048];
    view_agent_config cfg = {
        .endpoints = etcd.endpoint,
        .prefix = prefix,
        .self = 0,
        .num_servers = 3,
        .replicas = 3,
        .url = "tcp://127.0.0.1:1",
        .lease_ms = LEASE_MS,
    };
    assert_int_equal(view_agent_start(&a, &cfg, err, sizeof(err)), ETCD_EFAILED);
    assert_null(a);
    assert_non_null(strstr(err, "another cluster uses coordinator-prefix /psd/test-agent"));
    cfg.replicas = 1;
    assert_int_equal(view_agent_start(&a, &cfg, err, sizeof(err)), ETCD_EFAILED);
    assert_non_null(strstr(err, "replicas 1"));
    /* etcd unreachable at start: starts anyway, and says why failover waits. */
    cfg.replicas = 2;
    cfg.endpoints = "http://127.0.0.1:1";
    cfg.prefix = "/psd/elsewhere";
    assert_int_equal(view_agent_start(&a, &cfg, err, sizeof(err)), 0);
    view_agent_stats st;
    view_agent_get_stats(a, &st);
    assert_true(st.coordinator_errors >= 1);
    assert_non_null(strstr(st.last_error, "http://127.0.0.1:1"));
    assert_false(view_agent_serving(a));
    view_agent_stop(a);
}

int main(int argc, char **argv)
{
    if (argc == 9 && strcmp(argv[1], "--agent") == 0)
        return child_main(argv);
    if (etcd_proc_binary() == NULL) {
        printf("SKIP: no etcd binary (/usr/bin/etcd, $PSD_ETCD or etcd on PATH); install "
               "Debian's etcd-server to run this test\n");
        return 77;
    }
    log_init("test", -1, LOG_WARN, LOG_FORMAT_TEXT);
    self_path = argv[0];
    if (etcd_proc_start(&etcd) != 0) {
        etcd_proc_stop(&etcd);
        return 1;
    }
    for (int i = 0; i < N; i++)
        snprintf(logs[i], sizeof(logs[i]), "%s/agent-%d.log", etcd.dir, i);
    char err[512];
    if (etcd_client_create(&etc, etcd.endpoint, 1000, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover),   cmocka_unit_test(test_etcd_down),
        cmocka_unit_test(test_lease_lost), cmocka_unit_test(test_view_deleted),
        cmocka_unit_test(test_clean_stop), cmocka_unit_test(test_other_cluster),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < N; i++)
        if (agents[i] > 0 && kill(agents[i], SIGKILL) == 0)
            waitpid(agents[i], NULL, 0);
    etcd_client_destroy(etc);
    if (rc == 0)
        etcd_proc_stop(&etcd);
    else
        fprintf(stderr, "kept %s for inspection\n", etcd.dir);
    return rc;
}
