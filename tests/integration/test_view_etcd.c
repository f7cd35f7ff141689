/* The etcd client (common/view_etcd.c) against a real etcd started by the test: leases, keys,
 * compare-and-swap, the view's JSON form, several endpoints, unreachable and silent ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "view_etcd.h"

static etcd_proc etcd;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static etcd_client *client(void)
{
    etcd_client *c = NULL;
    char err[512];
    int rc = etcd_client_create(&c, etcd.endpoint, 2000, err, sizeof(err));
    if (rc != 0)
        fail_msg("%s", err);
    return c;
}

static void test_endpoints_parse(void **state)
{
    (void)state;
    etcd_client *c;
    char err[512];
    const char *bad[] = {"",
                         "https://127.0.0.1:2379",
                         "127.0.0.1",
                         "http://127.0.0.1:0",
                         "http://h:2379/v3",
                         "ftp://h:1",
                         "http://h:99999",
                         "http://h:2379,,h:1",
                         "http://h:x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(etcd_client_create(&c, bad[i], 1000, err, sizeof(err)), ETCD_EFAILED);
        assert_null(c);
        assert_true(strlen(err) > 10);
    }
    assert_int_equal(
        etcd_client_create(&c, " http://a:1 , b:2,http://[::1]:3", 1000, err, sizeof(err)), 0);
    assert_string_equal(etcd_client_endpoint(c), "http://a:1");
    etcd_client_destroy(c);
}

static void test_keys_and_cas(void **state)
{
    (void)state;
    etcd_client *c = client();
    char err[512], *v = NULL;
    size_t len;
    int64_t rev = 0, rev2 = 0;
    assert_int_equal(etcd_get(c, "/t/missing", &v, &len, &rev, err, sizeof(err)), ETCD_ENOTFOUND);
    assert_non_null(strstr(err, "/t/missing"));
    assert_int_equal(etcd_put(c, "/t/a", "one\0two", 7, 0, err, sizeof(err)), 0);
    assert_int_equal(etcd_get(c, "/t/a", &v, &len, &rev, err, sizeof(err)), 0);
    assert_int_equal(len, 7);
    assert_memory_equal(v, "one\0two", 7);
    assert_true(rev > 0);
    free(v);
    /* CAS: 0 means "must not exist". */
    assert_int_equal(etcd_cas(c, "/t/a", 0, "x", 1, NULL, err, sizeof(err)), ETCD_ECONFLICT);
    assert_non_null(strstr(err, "changed since revision 0"));
    assert_int_equal(etcd_cas(c, "/t/b", 0, "b1", 2, &rev2, err, sizeof(err)), 0);
    assert_int_equal(etcd_cas(c, "/t/b", 0, "b2", 2, NULL, err, sizeof(err)), ETCD_ECONFLICT);
    assert_int_equal(etcd_cas(c, "/t/b", rev2 + 100, "b2", 2, NULL, err, sizeof(err)),
                     ETCD_ECONFLICT);
    int64_t rev3 = 0;
    assert_int_equal(etcd_cas(c, "/t/b", rev2, "b3", 2, &rev3, err, sizeof(err)), 0);
    assert_true(rev3 > rev2);
    assert_int_equal(etcd_cas(c, "/t/b", rev2, "b4", 2, NULL, err, sizeof(err)), ETCD_ECONFLICT);
    assert_int_equal(etcd_get(c, "/t/b", &v, &len, &rev, err, sizeof(err)), 0);
    assert_string_equal(v, "b3");
    assert_int_equal(rev, rev3);
    free(v);
    /* Prefix reads stop at the prefix: /t/ does not include /t0 or /u. */
    assert_int_equal(etcd_put(c, "/t0", "z", 1, 0, err, sizeof(err)), 0);
    etcd_kv *kvs;
    size_t n;
    assert_int_equal(etcd_get_prefix(c, "/t/", &kvs, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].key, "/t/a");
    assert_string_equal(kvs[1].key, "/t/b");
    assert_string_equal(kvs[1].value, "b3");
    etcd_kvs_free(kvs, n);
    assert_int_equal(etcd_delete(c, "/t/a", err, sizeof(err)), 0);
    assert_int_equal(etcd_get(c, "/t/a", &v, &len, &rev, err, sizeof(err)), ETCD_ENOTFOUND);
    assert_int_equal(etcd_get_prefix(c, "/nothing/", &kvs, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 0);
    etcd_client_destroy(c);
}

static void test_leases(void **state)
{
    (void)state;
    etcd_client *c = client();
    char err[512];
    int64_t id = 0, ttl = 0;
    /* 1500 ms rounds up to 2 s; 1 ms to the 1 s minimum. */
    assert_int_equal(etcd_lease_grant(c, 1500, &id, &ttl, err, sizeof(err)), 0);
    assert_true(id != 0);
    assert_int_equal(ttl, 2);
    assert_int_equal(etcd_lease_keepalive(c, id, &ttl, err, sizeof(err)), 0);
    assert_int_equal(ttl, 2);
    assert_int_equal(etcd_lease_revoke(c, id, err, sizeof(err)), 0);
    assert_int_equal(etcd_lease_keepalive(c, id, &ttl, err, sizeof(err)), ETCD_ELEASE);
    assert_non_null(strstr(err, "expired"));
    assert_int_equal(etcd_lease_revoke(c, id, err, sizeof(err)), ETCD_ELEASE);
    assert_int_equal(etcd_put(c, "/l/k", "v", 1, id, err, sizeof(err)), ETCD_ELEASE);

    /* A key under a lease that is not renewed disappears after the TTL (etcd raises TTLs
     * below 1.5 election timeouts, 2 s by default, to that). */
    int64_t id1 = 0;
    assert_int_equal(etcd_lease_grant(c, 1, &id1, &ttl, err, sizeof(err)), 0);
    assert_in_range(ttl, 1, 2);
    assert_int_equal(view_etcd_register(c, "/l", 1, "tcp://h:1", id1, err, sizeof(err)), 0);
    assert_int_equal(etcd_lease_grant(c, 60000, &id, NULL, err, sizeof(err)), 0);
    assert_int_equal(view_etcd_register(c, "/l", 0, "tcp://h:0", id, err, sizeof(err)), 0);
    assert_int_equal(etcd_put(c, "/l/servers/7", "out of range", 12, 0, err, sizeof(err)), 0);
    assert_int_equal(etcd_put(c, "/l/servers/x", "junk", 4, 0, err, sizeof(err)), 0);
    int64_t leases[VIEW_MAX_SERVERS];
    static char urls[VIEW_MAX_SERVERS][VIEW_URL_MAX];
    assert_int_equal(view_etcd_servers(c, "/l", 3, leases, urls, err, sizeof(err)), 0);
    assert_int_equal(leases[0], id);
    assert_int_equal(leases[1], id1);
    assert_int_equal(leases[2], 0);
    assert_string_equal(urls[1], "tcp://h:1");
    /* Restored copies: read back for a server whose registration holds the lease they were put
     * under; another lease's (a previous process of the task) do not count. */
    view_copy mine[] = {{.group = 0, .epoch = 3, .lsn = 18446744073709551615ull},
                        {.group = 2, .epoch = 1, .lsn = 7}};
    assert_int_equal(view_etcd_put_copies(c, "/l", 0, mine, 2, id, err, sizeof(err)), 0);
    assert_int_equal(view_etcd_put_copies(c, "/l", 1, mine, 1, id, err, sizeof(err)), 0);
    assert_int_equal(
        etcd_put(c, "/l/copies/2", "{\"copies\":[{\"group\":9}]}", 25, 0, err, sizeof(err)), 0);
    view_copy *got = NULL;
    size_t ngot = 0;
    assert_int_equal(view_etcd_copies(c, "/l", 3, leases, &got, &ngot, err, sizeof(err)), 0);
    assert_int_equal(ngot, 2);
    assert_int_equal(got[0].server, 0);
    assert_int_equal(got[0].group, 0);
    assert_int_equal(got[0].epoch, 3);
    assert_true(got[0].lsn == 18446744073709551615ull);
    assert_int_equal(got[1].group, 2);
    assert_int_equal(got[1].lsn, 7);
    free(got);
    int64_t t0 = now_ms();
    while (leases[1] != 0 && now_ms() - t0 < 6000) {
        usleep(100 * 1000);
        assert_int_equal(view_etcd_servers(c, "/l", 3, leases, NULL, err, sizeof(err)), 0);
    }
    assert_int_equal(leases[1], 0);
    assert_int_equal(leases[0], id);
    int64_t took = now_ms() - t0;
    print_message("a 1 s lease's key went after %lld ms\n", (long long)took);
    assert_true(took >= 500);
    assert_int_equal(etcd_lease_keepalive(c, id1, NULL, err, sizeof(err)), ETCD_ELEASE);
    etcd_client_destroy(c);
}

static void test_view_json(void **state)
{
    (void)state;
    view_record r = {0}, back;
    char err[512];
    r.v.epoch = 7;
    r.v.num_servers = 3;
    r.v.replicas = 2;
    r.v.primary[0] = 1; /* group 0 = {0, 1} */
    r.v.primary[1] = 1;
    r.v.primary[2] = -1;
    r.v.live[1] = 1;
    r.lease[1] = 0x7fffffffffff1234;
    r.lease[0] = 99; /* not live: not stored */
    char *text = view_to_json(&r);
    assert_non_null(text);
    assert_int_equal(view_from_json(text, &back, err, sizeof(err)), 0);
    free(text);
    assert_int_equal(back.v.epoch, 7);
    assert_int_equal(back.v.num_servers, 3);
    assert_int_equal(back.v.replicas, 2);
    assert_int_equal(back.v.primary[0], 1);
    assert_int_equal(back.v.primary[2], -1);
    assert_int_equal(back.v.live[0], 0);
    assert_int_equal(back.v.live[1], 1);
    assert_int_equal(back.lease[1], 0x7fffffffffff1234);
    assert_int_equal(back.lease[0], 0);
    const char *bad[] = {
        "",
        "[]",
        "{\"epoch\":1}",
        "{\"epoch\":0,\"num_servers\":1,\"replicas\":1,\"primary\":[0],\"live\":[0]}",
        "{\"epoch\":1,\"num_servers\":0,\"replicas\":1,\"primary\":[],\"live\":[]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":3,\"primary\":[0,1],\"live\":[0]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":1,\"primary\":[0],\"live\":[0]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":1,\"primary\":[0,0],\"live\":[0]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":1,\"primary\":[0,2],\"live\":[0]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":1,\"primary\":[0,1],\"live\":[2]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":1,\"primary\":[0,1],\"live\":[\"0\"]}",
        "{\"epoch\":1,\"num_servers\":2,\"replicas\":1,\"primary\":[0,1],\"live\":[0],"
        "\"lease\":[1]}",
        "{\"epoch\":1,\"num_servers\":300,\"replicas\":1,\"primary\":[],\"live\":[]}",
        "{\"epoch\":1,\"num_servers\":1,\"replicas\":1,\"primary\":[0],\"live\":[0]} x",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (view_from_json(bad[i], &back, err, sizeof(err)) != ETCD_EFAILED)
            fail_msg("accepted %s", bad[i]);
        assert_non_null(strstr(err, "view"));
    }

    /* Stored and compared-and-swapped in etcd. */
    etcd_client *c = client();
    int64_t rev = 0, rev2 = 0;
    assert_int_equal(view_etcd_read(c, "/vj", &back, &rev, err, sizeof(err)), ETCD_ENOTFOUND);
    assert_int_equal(view_etcd_cas(c, "/vj", &r, 0, &rev, err, sizeof(err)), 0);
    assert_int_equal(view_etcd_cas(c, "/vj", &r, 0, NULL, err, sizeof(err)), ETCD_ECONFLICT);
    assert_int_equal(view_etcd_read(c, "/vj", &back, &rev2, err, sizeof(err)), 0);
    assert_int_equal(rev2, rev);
    assert_int_equal(back.v.epoch, 7);
    assert_int_equal(etcd_put(c, "/vj/view", "{\"epoch\":1}", 11, 0, err, sizeof(err)), 0);
    assert_int_equal(view_etcd_read(c, "/vj", &back, &rev2, err, sizeof(err)), ETCD_EFAILED);
    assert_non_null(strstr(err, "/vj/view holds no valid view"));
    etcd_client_destroy(c);

    char prefix[64];
    const char *ps1[] = {"h0:1", "h1:1"}, *ps2[] = {"h0:1", "h1:2"};
    view_default_prefix(ps1, 2, prefix, sizeof(prefix));
    assert_int_equal(strlen(prefix), 21);
    assert_memory_equal(prefix, "/psd/", 5);
    char prefix2[64];
    view_default_prefix(ps2, 2, prefix2, sizeof(prefix2));
    assert_string_not_equal(prefix, prefix2);
}

/* A listening socket that never accepts nor answers: requests time out within the timeout. */
static void test_unreachable(void **state)
{
    (void)state;
    int dead = test_free_port();
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t sl = sizeof(sa);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    int silent = ntohs(sa.sin_port);

    char eps[256], err[1024];
    etcd_client *c;
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%d,http://127.0.0.1:%d", dead, silent);
    assert_int_equal(etcd_client_create(&c, eps, 300, err, sizeof(err)), 0);
    int64_t t0 = now_ms(), id;
    assert_int_equal(etcd_lease_grant(c, 2000, &id, NULL, err, sizeof(err)), ETCD_EUNREACHABLE);
    int64_t took = now_ms() - t0;
    print_message("unreachable: %s (%lld ms)\n", err, (long long)took);
    assert_true(took < 2000);
    char want[128];
    snprintf(want, sizeof(want), "http://127.0.0.1:%d: cannot connect", dead);
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof(want), "http://127.0.0.1:%d: no answer: timed out", silent);
    assert_non_null(strstr(err, want));
    etcd_client_destroy(c);

    /* The dead endpoint first, then etcd: etcd answers and is tried first from then on. */
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%d,%s", dead, etcd.endpoint);
    assert_int_equal(etcd_client_create(&c, eps, 1000, err, sizeof(err)), 0);
    assert_int_equal(etcd_put(c, "/u/k", "v", 1, 0, err, sizeof(err)), 0);
    assert_string_equal(etcd_client_endpoint(c), etcd.endpoint);
    etcd_client_destroy(c);
    close(lfd);
}

/* etcd killed: EUNREACHABLE naming it; restarted on the same data: the keys are back. */
static void test_etcd_restart(void **state)
{
    (void)state;
    etcd_client *c = client();
    char err[1024], *v = NULL;
    assert_int_equal(etcd_put(c, "/r/k", "kept", 4, 0, err, sizeof(err)), 0);
    etcd_proc_kill(&etcd);
    assert_int_equal(etcd_get(c, "/r/k", &v, NULL, NULL, err, sizeof(err)), ETCD_EUNREACHABLE);
    assert_non_null(strstr(err, etcd.endpoint));
    assert_non_null(strstr(err, "Connection refused"));
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    int rc = -1;
    for (int i = 0; i < 50 && rc != 0; i++) {
        rc = etcd_get(c, "/r/k", &v, NULL, NULL, err, sizeof(err));
        if (rc != 0)
            usleep(100 * 1000);
    }
    assert_int_equal(rc, 0);
    assert_string_equal(v, "kept");
    free(v);
    etcd_client_destroy(c);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    int rc = fputs(text, f) >= 0 ? 0 : -1;
    return fclose(f) == 0 ? rc : -1;
}

/* The child of test_dns_deadline_and_cache, in its own mount namespace: /etc/hosts names the
 * test's etcd "psd-etcd-test", /etc/resolv.conf points at a loopback address where a UDP
 * socket takes queries and never answers. Exit 0 when every check held, 77 when the
 * namespace cannot be made, 1 otherwise. */
static int dns_child(void)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        fprintf(stderr, "SKIP: no mount namespace (needs root): %s\n", strerror(errno));
        return 77;
    }
    char hosts[] = "/tmp/psd-hosts-XXXXXX", resolv[] = "/tmp/psd-resolv-XXXXXX";
    int hfd = mkstemp(hosts), rfd = mkstemp(resolv);
    if (hfd < 0 || rfd < 0)
        return 1;
    close(hfd);
    close(rfd);
    int rc = 1;
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    inet_pton(AF_INET, "127.0.0.77", &a.sin_addr);
    if (u < 0 || bind(u, (struct sockaddr *)&a, sizeof(a)) != 0) {
        fprintf(stderr, "SKIP: cannot take 127.0.0.77:53 for a silent DNS server: %s\n",
                strerror(errno));
        rc = 77;
        goto out;
    }
    char text[256];
    snprintf(text, sizeof(text), "127.0.0.1 psd-etcd-test\n");
    if (write_file(hosts, text) != 0 ||
        write_file(resolv, "nameserver 127.0.0.77\noptions timeout:5 attempts:2\n") != 0 ||
        mount(hosts, "/etc/hosts", NULL, MS_BIND, NULL) != 0 ||
        mount(resolv, "/etc/resolv.conf", NULL, MS_BIND, NULL) != 0) {
        fprintf(stderr, "SKIP: cannot bind-mount /etc/hosts and /etc/resolv.conf: %s\n",
                strerror(errno));
        rc = 77;
        goto out;
    }
    char ep[96], err[1024], *v = NULL;
    snprintf(ep, sizeof(ep), "http://psd-etcd-test:%d", etcd.client_port);
    etcd_client *c = NULL;
    if (etcd_client_create(&c, ep, 700, err, sizeof(err)) != 0)
        goto out;
    /* Resolved through /etc/hosts: the call works and the address is kept. */
    if (etcd_put(c, "/dns/k", "v", 1, 0, err, sizeof(err)) != 0) {
        fprintf(stderr, "put by name: %s\n", err);
        goto out;
    }
    /* The name gone from /etc/hosts (now only the silent DNS server could answer): calls go
     * on to the address resolved before, without asking. */
    if (write_file(hosts, "127.0.0.1 localhost\n") != 0)
        goto out;
    double t0 = mono_s();
    int g = etcd_get(c, "/dns/k", &v, NULL, NULL, err, sizeof(err));
    double dt = mono_s() - t0;
    if (g != 0 || v == NULL || strcmp(v, "v") != 0 || dt > 0.6) {
        fprintf(stderr, "get by the kept address: rc %d in %.2f s: %s\n", g, dt, g ? err : "");
        goto out;
    }
    free(v);
    etcd_client_destroy(c);
    /* A name only DNS could resolve, and DNS never answers: the call fails by its deadline
     * (700 ms), not after the resolver's 2 x 5 s, and says why. */
    snprintf(ep, sizeof(ep), "http://psd-silent-dns.invalid:%d", etcd.client_port);
    if (etcd_client_create(&c, ep, 700, err, sizeof(err)) != 0)
        goto out;
    t0 = mono_s();
    g = etcd_get(c, "/dns/k", &v, NULL, NULL, err, sizeof(err));
    dt = mono_s() - t0;
    etcd_client_destroy(c);
    fprintf(stderr, "silent DNS: rc %d after %.2f s: %s\n", g, dt, err);
    if (g != 0 && dt < 2.0 && strstr(err, "no answer from DNS within the deadline") != NULL)
        rc = 0;
out:
    if (u >= 0)
        close(u);
    unlink(hosts);
    unlink(resolv);
    return rc;
}

/* Name resolution cannot hold a call past its deadline (a renewal past its lease), and a
 * resolved address is kept: run in a child with its own /etc/hosts and a DNS server that
 * never answers. */
static void test_dns_deadline_and_cache(void **state)
{
    (void)state;
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(dns_child());
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    if (etcd_proc_binary() == NULL) {
        printf("SKIP: no etcd binary (/usr/bin/etcd, $PSD_ETCD or etcd on PATH); install "
               "Debian's etcd-server to run this test\n");
        return 77;
    }
    if (etcd_proc_start(&etcd) != 0) {
        etcd_proc_stop(&etcd);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints_parse),
        cmocka_unit_test(test_keys_and_cas),
        cmocka_unit_test(test_leases),
        cmocka_unit_test(test_view_json),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_etcd_restart),
        cmocka_unit_test(test_dns_deadline_and_cache),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    etcd_proc_stop(&etcd);
    return rc;
}
