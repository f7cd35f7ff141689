/* Integration: faults injected into real ps-server processes on loopback.
 * (a) The server drops 10% of its requests unanswered and handles 10% twice
 *     (test-drop-percent, test-dup-percent); two client processes with a short resend-ms push
 *     integer gradients and the sums stay exact: every drop is resent, every duplicate is
 *     dropped by the exactly-once table.
 * (b) Updates lost to a SIGKILL are counted by the client: a checkpoint at version 10, 7 more
 *     acknowledged pushes, kill -9, restart on the same directory: the next push reply tells
 *     the client the server restarted at version 10, it logs that 7 acknowledged updates are
 *     lost and ps_client_lost_updates says 7; the server's restore line says it had not shut
 *     down cleanly. Then a SIGTERM and a restart lose nothing, and the server says so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"

static const char *server_bin;

/* The number after `key` in the file (the last occurrence), or -1. */
static long long number_after(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[2048];
    long long v = -1;
    while (fgets(line, sizeof(line), f)) {
        const char *k = strstr(line, key);
        if (k)
            v = strtoll(k + strlen(key), NULL, 10);
    }
    fclose(f);
    return v;
}

/* ---- (a) drops and duplicates -------------------------------------------------------------- */

#define NCLIENTS 2
#define ROUNDS 30
#define BIG_N (64 * 1024) /* 256 KiB in 16 KiB chunks: 16 requests a push */
#define SMALL_N 8

static float grad_of(int client, int round, size_t i)
{
    return (float)((client + 1) * ((int)((i + (size_t)round) % 7) + 1));
}

static int client_main(int id, const void *arg)
{
    ps_client *c = test_ps_open_client(arg, "50", "16K");
    if (c == NULL)
        return 10;
    ps_var *big = test_make_var(c, "faults/big", BIG_N),
           *small = test_make_var(c, "faults/small", SMALL_N);
    if (big == NULL || small == NULL)
        return 11;
    float *g = malloc(BIG_N * sizeof(float)), *back = malloc(BIG_N * sizeof(float));
    if (g == NULL || back == NULL)
        return 12;
    float sg[SMALL_N];
    for (int r = 0; r < ROUNDS; r++) {
        for (size_t i = 0; i < BIG_N; i++)
            g[i] = grad_of(id, r, i);
        for (int i = 0; i < SMALL_N; i++)
            sg[i] = (float)(id + 1);
        ps_op *op;
        if (ps_push_async(c, big, 0, BIG_N, g, NULL, NULL, &op) != PS_OK)
            return 13;
        int rc = r % 2 ? ps_push(c, small, sg) : ps_push_pull(c, small, sg, back);
        int rc2 = ps_op_wait(op);
        ps_op_destroy(op);
        if (rc != PS_OK || rc2 != PS_OK) {
            fprintf(stderr, "client %d round %d push: %s\n", id, r, ps_last_error());
            return 14;
        }
    }
    free(g);
    free(back);
    ps_client_close(c);
    return 0;
}

static void test_drops_and_duplicates_stay_exact(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-faults");
    const char *extra[] = {"--test-drop-percent", "10", "--test-dup-percent", "10", NULL};
    test_ps_start(&p, extra);
    test_fork_clients(NCLIENTS, client_main, &p);
    ps_client *c = test_ps_open_client(&p, "50", NULL);
    assert_non_null(c);
    ps_var *big, *small;
    assert_int_equal(ps_var_lookup(c, "faults/big", &big), PS_OK);
    assert_int_equal(ps_var_lookup(c, "faults/small", &small), PS_OK);
    float *w = malloc(BIG_N * sizeof(float));
    assert_non_null(w);
    assert_int_equal(ps_pull(c, big, w), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < BIG_N; i++) {
        float expect = 0;
        for (int k = 0; k < NCLIENTS; k++)
            for (int r = 0; r < ROUNDS; r++)
                expect -= grad_of(k, r, i);
        if (w[i] != expect && wrong++ < 5)
            fprintf(stderr, "big[%zu] = %g, expected %g\n", i, w[i], expect);
    }
    assert_int_equal(wrong, 0);
    float sv[SMALL_N];
    assert_int_equal(ps_pull(c, small, sv), PS_OK);
    for (int i = 0; i < SMALL_N; i++) {
        if (sv[i] != -(float)(ROUNDS * (1 + 2)))
            fprintf(stderr, "small[%d] = %g, expected %d\n", i, sv[i], -ROUNDS * 3);
        assert_true(sv[i] == -(float)(ROUNDS * (1 + 2)));
    }
    ps_server_stats st;
    assert_int_equal(ps_server_status(c, 0, &st), PS_OK);
    fprintf(stderr, "server applied %llu updates, dropped %llu duplicates\n",
            (unsigned long long)st.updates_applied, (unsigned long long)st.duplicates_dropped);
    /* Every push applied once: ROUNDS * (16 chunks + 1) per client. */
    assert_int_equal(st.updates_applied, (uint64_t)NCLIENTS * ROUNDS * (BIG_N / 4096 + 1));
    assert_true(st.duplicates_dropped > 0); /* the duplicates really happened */
    ps_client_close(c);
    free(w);
    test_ps_signal_wait(&p, SIGTERM, 0);
    long long dropped = number_after(p.log, "fault injection: ");
    fprintf(stderr, "server dropped %lld requests\n", dropped);
    assert_true(dropped > 0); /* the drops really happened */
    assert_true(test_file_contains(p.log, "handled twice"));
    test_ps_cleanup(&p);
}

/* ---- (b) updates lost to a SIGKILL ---------------------------------------------------------- */

/* Runs one push with this process's stderr (where the client logs) appended to path. */
static int push_logged(ps_client *c, ps_var *v, const float *g, const char *path)
{
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    int rc = ps_push(c, v, g);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    return rc;
}

static void test_lost_updates_are_counted(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-faults");
    char ckdir[300], clog[300];
    snprintf(ckdir, sizeof(ckdir), "%s/ckpt", p.dir);
    snprintf(clog, sizeof(clog), "%s/client.log", p.dir);
    const char *extra[] = {"--checkpoint-dir", ckdir, "--checkpoint-interval-s", "0", NULL};
    test_ps_start(&p, extra);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_var *v = test_make_var(c, "faults/w", 4);
    assert_non_null(v);
    float g[4] = {1, 1, 1, 1}, w[4];
    for (int i = 0; i < 10; i++)
        assert_int_equal(ps_push(c, v, g), PS_OK);
    assert_int_equal(ps_checkpoint(c), PS_OK); /* version 10 */
    for (int i = 0; i < 7; i++)
        assert_int_equal(ps_push(c, v, g), PS_OK); /* 11..17: acknowledged, then lost */
    assert_int_equal(ps_client_lost_updates(c), 0);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&p, extra);
    assert_int_equal(push_logged(c, v, g, clog), PS_OK); /* the client retries until it is up */
    /* (the name is quoted, and escaped when the log is JSON) */
    if (!test_file_contains(clog, "ps 0 restarted (checkpoint version 10): 7 acknowledged "
                                  "updates to ") ||
        !test_file_contains(clog, "faults/w") || !test_file_contains(clog, "since it are lost")) {
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "cat %s >&2", clog);
        assert_int_equal(system(cmd), 0);
        fail_msg("the client did not log the 7 lost updates");
    }
    assert_int_equal(ps_client_lost_updates(c), 7);
    assert_true(test_file_contains(p.log, "did not shut down cleanly: the updates it applied "
                                          "after checkpoint 2 are lost")); /* 1: the creation */
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    assert_true(w[0] == -11.0f); /* 10 restored + 1 since */
    /* A clean stop loses nothing, and nobody says otherwise. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(ps_push(c, v, g), PS_OK);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_start(&p, extra);
    assert_int_equal(push_logged(c, v, g, clog), PS_OK);
    assert_int_equal(ps_client_lost_updates(c), 7);
    assert_true(test_file_contains(p.log, "shut down cleanly after writing checkpoint 3: nothing "
                                          "was lost"));
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    assert_true(w[0] == -15.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drops_and_duplicates_stay_exact),
        cmocka_unit_test(test_lost_updates_are_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
