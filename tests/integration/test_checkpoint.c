/* Integration: checkpoints and restarts of a real ps-server process.
 * (a) SIGTERM writes a checkpoint; the restarted server has the exact sums, and a push resent
 *     with the same client id and seq is still dropped as a duplicate.
 * (b) The Checkpoint RPC answers with a durable file's path and version; after SIGKILL the
 *     restart has the state of that checkpoint (the updates after it are lost).
 * (c) A crash halfway through writing (failpoint) leaves the previous checkpoint restorable.
 * (d) A corrupt (flipped byte) or truncated newest checkpoint falls back to the previous one
 *     with a warning naming the file.
 * (e) A server of a cluster of another size restores its slots from the files of the old
 *     cluster's tasks and writes its own checkpoint; without checkpoint-dir the RPC answers
 *     FAILED_PRECONDITION.
 * (f) What a restart says it lost follows from what it restored against the record of what
 *     the previous server wrote: a clean stop whose final checkpoint is corrupt is a loss, with
 *     its count.
 * (g) A second server of the task on a live server's directory exits 2 naming the holder's
 *     pid, and leaves the live one's files alone.
 * (h) A variable is durable from its creation: SIGKILLed before any periodic checkpoint, the
 *     restarted server has it (the client counts the pushes lost); without checkpoints the
 *     restarted server's NOT_FOUND says the server restarted.
 * (i) Failing checkpoints (a full disk) are counted and shown: metrics from the start,
 *     ServerStatus, /readyz's detail, a create that cannot be made durable.
 * (j) A checkpoint directory below a regular file, and a directory of damaged checkpoints
 *     only, exit 2 (a restart cannot cure them).
 * (k) A Checkpoint request resent while its checkpoint is written rides on it (no other). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "cluster_proc.h"
#include "frame.h"
#include "ps_proc.h"
#include "psclient.h"

#define N 1000

static const char *server_bin;

/* Starts the server with --checkpoint-dir dir (none when dir is NULL) and up to 4 more
 * arguments (NULL-terminated, may be NULL). */
static void ps_start_args(test_ps *p, const char *dir, const char *const *more)
{
    const char *extra[8] = {NULL};
    int n = 0;
    if (dir) {
        extra[n++] = "--checkpoint-dir";
        extra[n++] = dir;
    }
    for (int i = 0; more && more[i] && n < 6; i++)
        extra[n++] = more[i];
    test_ps_start(p, n ? extra : NULL);
}

static void ps_start_dir(test_ps *p, const char *dir)
{
    ps_start_args(p, dir, NULL);
}

static void ps_start(test_ps *p)
{
    ps_start_dir(p, p->dir);
}

/* A fresh server (its own directory, checkpoints there), a client of it in *c, and the
 * variable `name` of n elements made through it (its creation writes checkpoint 1). */
static ps_var *start_with_var(test_ps *p, ps_client **c, const char *name, uint64_t n)
{
    test_ps_init(p, server_bin, "psd-ckpt");
    ps_start(p);
    *c = test_ps_open_client(p, NULL, NULL);
    assert_non_null(*c);
    ps_var *v = test_make_var(*c, name, n);
    assert_non_null(v);
    return v;
}

/* Push of one float to element 0 of `name` as client `client` with sequence number seq, on a
 * connection of its own; the reply must be OK. */
static void raw_push(int port, const char *name, uint64_t client, uint64_t seq, float value,
                     bool *duplicate)
{
    nng_socket s = test_raw_dial(port, 15000);
    int st;
    test_raw_push(s, name, -1, client, seq, value, &st, duplicate);
    nng_close(s);
    assert_int_equal(st, 0);
}

/* Checkpoint RPC: returns the status; on OK fills path and version. */
static int raw_checkpoint(int port, char *path, size_t cap, uint64_t *version, char *msg,
                          size_t msgcap)
{
    Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
    uint8_t body[16];
    size_t blen = psd__v1__checkpoint_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CHECKPOINT;
    env.request_id = 1;
    env.body.data = body;
    env.body.len = blen;
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, NULL, 0, &f, &m);
    if (st < -999)
        return st;
    if (msg)
        snprintf(msg, msgcap, "%s", f.env->message ? f.env->message : "");
    if (st == 0) {
        Psd__V1__CheckpointReply *r =
            psd__v1__checkpoint_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        assert_non_null(r);
        snprintf(path, cap, "%s", r->path);
        *version = r->version;
        fprintf(stderr, "checkpoint %s: version %llu, %llu bytes, updates paused %llu us\n",
                r->path, (unsigned long long)r->version, (unsigned long long)r->bytes,
                (unsigned long long)r->pause_us);
        psd__v1__checkpoint_reply__free_unpacked(r, NULL);
    }
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

static void checkpoint_ok(const test_ps *p, uint64_t want_version)
{
    char path[4200];
    uint64_t version = 0;
    assert_int_equal(raw_checkpoint(p->port, path, sizeof(path), &version, NULL, 0), 0);
    assert_int_equal(version, want_version);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size > 64);
    char want[400];
    snprintf(want, sizeof(want), "%s/ckpt-0-%llu.psc", p->dir, (unsigned long long)want_version);
    assert_string_equal(path, want);
}

static float grad_of(int round, size_t i)
{
    return (float)((int)(i % 7) + round);
}

static void test_sigterm_restart_exact(void **state)
{
    (void)state;
    test_ps p;
    ps_client *c;
    ps_var *a = start_with_var(&p, &c, "ck/a", N);
    assert_non_null(test_make_var(c, "ck/replay", 1));
    float g[N];
    for (int r = 1; r <= 5; r++) {
        for (size_t i = 0; i < N; i++)
            g[i] = grad_of(r, i);
        assert_int_equal(ps_push(c, a, g), PS_OK);
    }
    bool dup;
    raw_push(p.port, "ck/replay", 0x5eed, 5, 2.0f, &dup);
    assert_false(dup);
    ps_client_close(c);

    test_ps_signal_wait(&p, SIGTERM, 0); /* checkpoints on the way out */
    char file[400];
    snprintf(file, sizeof(file), "%s/ckpt-0-1.psc", p.dir);
    assert_int_equal(access(file, R_OK), 0);
    ps_start(&p);
    assert_true(test_file_contains(p.log, "restored"));
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_var *a2 = test_find_var(c, "ck/a");
    assert_non_null(a2);
    float w[N];
    assert_int_equal(ps_pull(c, a2, w), PS_OK);
    for (size_t i = 0; i < N; i++) {
        float want = 0;
        for (int r = 1; r <= 5; r++)
            want -= grad_of(r, i);
        assert_true(w[i] == want);
    }
    test_expect_all(c, "ck/replay", 1, -2.0f);
    raw_push(p.port, "ck/replay", 0x5eed, 5, 2.0f, &dup); /* resent after the restart */
    assert_true(dup);
    raw_push(p.port, "ck/replay", 0x5eed, 6, 1.0f, &dup); /* a new one still applies */
    assert_false(dup);
    test_expect_all(c, "ck/replay", 1, -3.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void test_rpc_then_sigkill(void **state)
{
    (void)state;
    test_ps p;
    ps_client *c;
    ps_var *v = start_with_var(&p, &c, "ck/b", N);
    for (int r = 0; r < 3; r++)
        test_push_const(c, v, N, 1.0f);
    checkpoint_ok(&p, 2);       /* 1 made ck/b durable at its creation */
    for (int r = 0; r < 2; r++) /* after the checkpoint: lost with the SIGKILL */
        test_push_const(c, v, N, 1.0f);
    test_expect_all(c, "ck/b", N, -5.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    ps_start(&p);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/b", N, -3.0f);
    fprintf(stderr, "restart after SIGKILL: state of checkpoint 2, the 2 pushes after it lost\n");
    /* The sequence goes on after the restored checkpoint. */
    checkpoint_ok(&p, 3);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* A Checkpoint request that the client's transport sends again while the checkpoint it asked
 * for is being written (resend-ms 500 against a 3 s write, failpoint checkpoint-slow) rides on
 * that checkpoint: no checkpoint more is written for the resends. */
static void test_resent_request_one_checkpoint(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-ckpt");
    const char *slow[] = {"--test-failpoint", "checkpoint-slow", NULL};
    ps_start_args(&p, p.dir, slow);
    ps_client *c = test_ps_open_client(&p, "500", NULL);
    assert_non_null(c);
    assert_non_null(test_make_var(c, "ck/resent", N)); /* checkpoint 1 */
    assert_int_equal(ps_checkpoint(c), PS_OK);         /* checkpoint 2, sent about 6 times */
    checkpoint_ok(&p, 3); /* the next one: none was written for the resends */
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void test_crash_mid_write(void **state)
{
    (void)state;
    test_ps p;
    size_t big = 1u << 20; /* 4 MiB: the crash comes inside the parameters */
    ps_client *c;
    ps_var *v = start_with_var(&p, &c, "ck/c", big);
    test_push_const(c, v, big, 1.0f);
    checkpoint_ok(&p, 2);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);

    setenv("PS_TEST_FAILPOINT", "checkpoint-crash-mid-write", 1);
    ps_start(&p);
    unsetenv("PS_TEST_FAILPOINT");
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    v = test_find_var(c, "ck/c");
    assert_non_null(v);
    test_push_const(c, v, big, 1.0f);
    ps_client_close(c);
    char path[4200];
    uint64_t version;
    int st = raw_checkpoint(p.port, path, sizeof(path), &version, NULL, 0);
    assert_true(st != 0); /* no reply: the server died writing */
    assert_int_equal(test_wait_exit(p.pid, 20000), 1);
    p.pid = 0;
    char tmp[400];
    snprintf(tmp, sizeof(tmp), "%s/.ckpt-0-3.psc.tmp", p.dir);
    struct stat sb;
    assert_int_equal(stat(tmp, &sb), 0);
    fprintf(stderr, "failpoint left %s of %lld bytes\n", tmp, (long long)sb.st_size);
    char first[400];
    snprintf(first, sizeof(first), "%s/ckpt-0-2.psc", p.dir);
    struct stat sb1;
    assert_int_equal(stat(first, &sb1), 0);
    assert_true(sb.st_size > sb1.st_size / 4 && sb.st_size < sb1.st_size * 3 / 4); /* halfway */

    ps_start(&p);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/c", big, -1.0f);
    assert_true(test_file_contains(p.log, "an unfinished checkpoint"));
    assert_int_equal(access(tmp, F_OK), -1);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void corrupt_byte(const char *path)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_int_equal(fseek(f, size / 2, SEEK_SET), 0);
    int ch = fgetc(f);
    assert_int_equal(fseek(f, size / 2, SEEK_SET), 0);
    fputc(ch ^ 0x10, f);
    fclose(f);
}

static void test_corrupt_newest_falls_back(void **state)
{
    (void)state;
    test_ps p;
    ps_client *c;
    ps_var *v = start_with_var(&p, &c, "ck/d", N);
    test_push_const(c, v, N, 1.0f);
    checkpoint_ok(&p, 2); /* 1: ck/d at its creation */
    test_push_const(c, v, N, 1.0f);
    checkpoint_ok(&p, 3);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);

    char f2[400], f3[400];
    snprintf(f2, sizeof(f2), "%s/ckpt-0-3.psc", p.dir);
    snprintf(f3, sizeof(f3), "%s/ckpt-0-4.psc", p.dir);
    corrupt_byte(f2);
    ps_start(&p);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/d", N, -1.0f);
    assert_true(test_file_contains(p.log, "ckpt-0-3.psc is unusable (bad CRC"));

    /* A truncated newest one (4) falls back past the corrupt 3 to 2. */
    v = test_find_var(c, "ck/d");
    test_push_const(c, v, N, 5.0f);
    checkpoint_ok(&p, 4);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    struct stat sb;
    assert_int_equal(stat(f3, &sb), 0);
    assert_int_equal(truncate(f3, sb.st_size - 30), 0);
    ps_start(&p);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/d", N, -1.0f);
    assert_true(test_file_contains(p.log, "ckpt-0-4.psc is unusable (truncated"));
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void test_other_shape_restored(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-ckpt");
    /* Without checkpoint-dir the RPC says how to turn checkpoints on. */
    ps_start_dir(&p, NULL);
    char path[4200], msg[512];
    uint64_t version;
    assert_int_equal(raw_checkpoint(p.port, path, sizeof(path), &version, msg, sizeof(msg)),
                     PS_FAILED_PRECONDITION);
    assert_non_null(strstr(msg, "checkpoints are off: set checkpoint-dir"));
    test_ps_signal_wait(&p, SIGTERM, 0);

    ps_start(&p);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_non_null(test_make_var(c, "ck/e", 10));
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);

    /* Task 1 of a cluster of 2 restores the slots it holds there from task 0's files of the
     * cluster of 1 (the directory is shared), writes its own checkpoint, and serves. */
    int port2 = test_free_port();
    char spec2[160];
    snprintf(spec2, sizeof(spec2), "{\"ps\":[\"127.0.0.1:%d\",\"127.0.0.1:%d\"]}", p.port, port2);
    const char *extra[] = {"--checkpoint-dir", p.dir, NULL};
    pid_t pid = test_server_spawn(server_bin, spec2, 1, extra, p.log);
    assert_int_equal(test_wait_port(port2, 20000), 0);
    assert_true(test_file_contains(p.log, "restored the slots of ps 1 of 2 from the checkpoints "
                                          "of a cluster of 1 ps tasks"));
    char own[400];
    snprintf(own, sizeof(own), "%s/ckpt-1-1.psc", p.dir);
    assert_int_equal(access(own, F_OK), 0);
    kill(pid, SIGTERM);
    assert_int_equal(test_wait_exit(pid, 20000), 0);
    test_ps_cleanup(&p);
}

/* Waits up to ms for a checkpoint file ckpt-0-<seq>.psc in dir; returns whether it appeared. */
static bool wait_checkpoint_file(const char *dir, int seq, int ms)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/ckpt-0-%d.psc", dir, seq);
    for (int waited = 0; waited <= ms; waited += 50) {
        if (access(path, R_OK) == 0)
            return true;
        usleep(50 * 1000);
    }
    return false;
}

/* The periodic triggers: every N applied updates, and every S seconds (skipped while nothing
 * changed). A SIGKILL after a periodic checkpoint restores it. */
static void test_periodic_triggers(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-ckpt");
    const char *by_updates[] = {"--checkpoint-interval-updates", "3", NULL};
    ps_start_args(&p, p.dir, by_updates);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_var *v = test_make_var(c, "ck/periodic", N);
    assert_non_null(v);
    assert_true(wait_checkpoint_file(p.dir, 1, 0)); /* the creation's */
    test_push_const(c, v, N, 1.0f);
    test_push_const(c, v, N, 1.0f);
    assert_false(wait_checkpoint_file(p.dir, 2, 300)); /* 2 updates: not yet */
    test_push_const(c, v, N, 1.0f);
    assert_true(wait_checkpoint_file(p.dir, 2, 5000)); /* the 3rd update triggers it */
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);

    const char *by_time[] = {"--checkpoint-interval-s", "1", NULL};
    ps_start_args(&p, p.dir, by_time);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/periodic", N, -3.0f); /* restored from the update-triggered checkpoint */
    v = test_find_var(c, "ck/periodic");
    assert_non_null(v);
    test_push_const(c, v, N, 1.0f);
    assert_true(wait_checkpoint_file(p.dir, 3, 5000)); /* within about a second */
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    ps_start(&p);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/periodic", N, -4.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* Checkpoint files ckpt-0-<seq>.psc of dir. */
static void ckpt_file(char *buf, size_t cap, const char *dir, int seq)
{
    snprintf(buf, cap, "%s/ckpt-0-%d.psc", dir, seq);
}

static void test_loss_report_follows_restore(void **state)
{
    (void)state;
    test_ps p;
    ps_client *c;
    ps_var *v = start_with_var(&p, &c, "ck/f", 1); /* checkpoint 1 */
    for (int r = 0; r < 3; r++)
        test_push_const(c, v, 1, 1.0f);
    checkpoint_ok(&p, 2); /* version 3 */
    for (int r = 0; r < 5; r++)
        test_push_const(c, v, 1, 1.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0); /* the final checkpoint 3: version 8 */
    char f3[400];
    ckpt_file(f3, sizeof(f3), p.dir, 3);
    corrupt_byte(f3);
    ps_start(&p);
    assert_true(test_file_contains(p.log, "ckpt-0-3.psc is unusable"));
    assert_true(test_file_contains(p.log, "checkpoint 3, the newest the previous server wrote, "
                                          "could not be restored; checkpoint 2 was: 5 updates"));
    assert_true(test_file_contains(p.log, "it had shut down cleanly after writing it"));
    assert_false(test_file_contains(p.log, "nothing was lost"));
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/f", 1, -3.0f);
    ps_client_close(c);
    /* A clean stop whose final checkpoint is restored whole loses nothing, and says so. */
    test_ps_signal_wait(&p, SIGTERM, 0); /* checkpoint 4 */
    ps_start(&p);
    assert_true(test_file_contains(p.log, "shut down cleanly after writing checkpoint 4: nothing "
                                          "was lost"));
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void test_second_server_refused(void **state)
{
    (void)state;
    test_ps p;
    ps_client *c;
    ps_var *v = start_with_var(&p, &c, "ck/g", N); /* checkpoint 1 */
    test_push_const(c, v, N, 1.0f);
    /* Another ps 0 (its own port) on the same directory. */
    char spec2[128], log2[400], want[200];
    snprintf(spec2, sizeof(spec2), "{\"ps\":[\"127.0.0.1:%d\"]}", test_free_port());
    snprintf(log2, sizeof(log2), "%s/second.log", p.dir);
    const char *extra[] = {"--checkpoint-dir", p.dir, NULL};
    pid_t pid = test_server_spawn(server_bin, spec2, 0, extra, log2);
    assert_int_equal(test_wait_exit(pid, 20000), 2);
    snprintf(want, sizeof(want), "is in use by another ps 0 (pid %d holds", (int)p.pid);
    if (!test_file_contains(log2, want)) {
        char cmd[500];
        snprintf(cmd, sizeof(cmd), "cat %s >&2", log2);
        assert_int_equal(system(cmd), 0);
        fail_msg("the second server did not name the holder: %s", want);
    }
    assert_false(test_file_contains(log2, "restored"));
    /* The live one goes on, and its crash is still reported as one. */
    checkpoint_ok(&p, 2);
    test_push_const(c, v, N, 1.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    ps_start(&p);
    assert_true(test_file_contains(p.log, "did not shut down cleanly: the updates it applied "
                                          "after checkpoint 2 are lost"));
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    test_expect_all(c, "ck/g", N, -1.0f);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

static void test_durable_from_creation(void **state)
{
    (void)state;
    test_ps p;
    /* The server runs with the default checkpoint interval: 30 s, far beyond this test's life. */
    ps_client *c;
    ps_var *v = start_with_var(&p, &c, "ck/h", N);
    for (int r = 0; r < 4; r++)
        test_push_const(c, v, N, 1.0f);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    ps_start(&p);
    /* The same client goes on: the variable is there (as created), its 4 pushes are lost. */
    test_push_const(c, v, N, 1.0f);
    assert_int_equal(ps_client_lost_updates(c), 4);
    test_expect_all(c, "ck/h", N, -1.0f);
    assert_true(test_file_contains(p.log, "did not shut down cleanly: the updates it applied "
                                          "after checkpoint 1 are lost"));
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);

    /* Without checkpoints nothing survives: the error says the server restarted. */
    ps_start_dir(&p, NULL);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    v = test_make_var(c, "ck/i", 4);
    assert_non_null(v);
    test_push_const(c, v, 4, 1.0f);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    ps_start_dir(&p, NULL);
    float w[4];
    assert_int_equal(ps_pull(c, v, w), PS_NOT_FOUND);
    fprintf(stderr, "pull after the restart: %s\n", ps_last_error());
    assert_non_null(strstr(ps_last_error(), "not found on ps 0"));
    assert_non_null(strstr(ps_last_error(), "ps 0 restarted since this client's first call"));
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* A full disk under dir: a 1 MiB tmpfs mounted on it before the server starts (root:
 * disk_mount), room for small checkpoints only; else (no mount allowed) the directory swapped
 * for a regular file once the server runs (disk_fill), so that writes fail alike. */
typedef struct full_disk {
    char dir[300], moved[320];
    bool mounted;
    int mount_errno;
} full_disk;

static char mounted_dir[300]; /* unmounted by the test's teardown, even after a failure */

static int unmount_full_disk(void **state)
{
    (void)state;
    if (mounted_dir[0])
        umount2(mounted_dir, MNT_DETACH);
    mounted_dir[0] = '\0';
    return 0;
}

static void disk_mount(full_disk *d)
{
    d->mounted = mount("tmpfs", d->dir, "tmpfs", 0, "size=1m") == 0;
    d->mount_errno = errno;
    if (d->mounted) {
        snprintf(mounted_dir, sizeof(mounted_dir), "%s", d->dir);
        fprintf(stderr, "full disk: a 1 MiB tmpfs on %s\n", d->dir);
    }
}

static void disk_fill(full_disk *d)
{
    if (d->mounted)
        return;
    fprintf(stderr, "cannot mount a tmpfs (%s): %s replaced by a regular file instead\n",
            strerror(d->mount_errno), d->dir);
    snprintf(d->moved, sizeof(d->moved), "%s.moved", d->dir);
    assert_int_equal(rename(d->dir, d->moved), 0);
    FILE *f = fopen(d->dir, "w");
    assert_non_null(f);
    fclose(f);
}

static void disk_free(full_disk *d)
{
    if (d->mounted) {
        assert_int_equal(mount("tmpfs", d->dir, "tmpfs", MS_REMOUNT, "size=64m"), 0);
        return;
    }
    assert_int_equal(unlink(d->dir), 0);
    assert_int_equal(rename(d->moved, d->dir), 0);
}

static double metric_of(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1.0; /* absent */
}

static void test_failing_checkpoints_visible(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-ckpt");
    full_disk d = {0};
    snprintf(d.dir, sizeof(d.dir), "%s/ck", p.dir);
    assert_int_equal(mkdir(d.dir, 0755), 0);
    disk_mount(&d);
    int hport = test_free_port();
    char haddr[64];
    snprintf(haddr, sizeof(haddr), "127.0.0.1:%d", hport);
    const char *more[] = {"--http-listen", haddr, NULL};
    ps_start_args(&p, d.dir, more);
    /* Before any checkpoint: the age counts from the start, no failure yet. */
    char *body;
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    assert_true(metric_of(body, "psd_checkpoint_age_seconds") >= 0);
    assert_true(metric_of(body, "psd_checkpoint_failures_total") == 0);
    free(body);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    /* 4 MiB: its first checkpoint holds only its spec (never updated), the next its values,
     * for which the disk has no room. */
    size_t big = 1u << 20;
    ps_var *v = test_make_var(c, "ck/full", big);
    assert_non_null(v);
    test_push_const(c, v, big, 1.0f);
    disk_fill(&d);
    ps_var_spec s;
    ps_var_spec_init(&s, "ck/next");
    s.ndims = 1;
    s.dims[0] = 4;
    ps_var *v2;
    assert_int_equal(ps_var_create(c, &s, &v2), PS_UNAVAILABLE);
    fprintf(stderr, "create on a full disk: %s\n", ps_last_error());
    assert_non_null(strstr(ps_last_error(), "is not durable"));
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    assert_true(metric_of(body, "psd_checkpoint_failures_total") >= 1);
    assert_true(metric_of(body, "psd_checkpoint_failures_in_row") >= 1);
    free(body);
    assert_int_equal(test_http_get(hport, "/readyz", &body), 200); /* it still serves */
    fprintf(stderr, "/readyz: %s", body);
    assert_non_null(strstr(body, "ready\ncheckpoints failing:"));
    free(body);
    ps_checkpoint_status ck;
    assert_int_equal(ps_server_checkpoint_status(c, 0, &ck), PS_OK);
    assert_true(ck.enabled);
    assert_true(ck.failures >= 1 && ck.failures_in_row >= 1);
    assert_int_equal(ck.last_seq, 1); /* ck/full's creation */
    assert_true(strstr(ck.last_error, d.mounted ? "No space left on device" : "Not a directory") !=
                NULL);
    /* Room again: the create is retried, durable, and the failures in a row are over. */
    disk_free(&d);
    assert_int_equal(ps_var_create(c, &s, &v2), PS_OK);
    assert_int_equal(ps_server_checkpoint_status(c, 0, &ck), PS_OK);
    assert_int_equal(ck.failures_in_row, 0);
    assert_true(ck.last_seq >= 2);
    assert_int_equal(test_http_get(hport, "/readyz", &body), 200);
    assert_string_equal(body, "ready\n");
    free(body);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    if (d.mounted) {
        assert_int_equal(umount(d.dir), 0);
        mounted_dir[0] = '\0';
    }
    test_ps_cleanup(&p);
}

static void test_incurable_errors_exit_2(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-ckpt");
    /* A checkpoint directory below a regular file. */
    char file[300], below[320];
    snprintf(file, sizeof(file), "%s/a-file", p.dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(below, sizeof(below), "%s/ck", file);
    const char *extra[] = {"--checkpoint-dir", below, NULL};
    pid_t pid = test_server_spawn(server_bin, p.spec, 0, extra, p.log);
    assert_int_equal(test_wait_exit(pid, 20000), 2);
    assert_true(test_file_contains(p.log, "cannot create checkpoint directory"));
    /* Only damaged checkpoints. */
    ps_start(&p);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_non_null(test_make_var(c, "ck/j", 10)); /* checkpoint 1 */
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0); /* checkpoint 2 */
    for (int seq = 1; seq <= 2; seq++) {
        char path[400];
        ckpt_file(path, sizeof(path), p.dir, seq);
        corrupt_byte(path);
    }
    pid = test_server_spawn(server_bin, p.spec, 0,
                            (const char *const[]){"--checkpoint-dir", p.dir, NULL}, p.log);
    assert_int_equal(test_wait_exit(pid, 20000), 2);
    assert_true(test_file_contains(p.log, "no valid checkpoint of ps 0 in"));
    assert_true(test_file_contains(p.log, "move the unusable files out of the directory"));
    test_ps_cleanup(&p);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_restart_exact),
        cmocka_unit_test(test_rpc_then_sigkill),
        cmocka_unit_test(test_resent_request_one_checkpoint),
        cmocka_unit_test(test_crash_mid_write),
        cmocka_unit_test(test_corrupt_newest_falls_back),
        cmocka_unit_test(test_other_shape_restored),
        cmocka_unit_test(test_periodic_triggers),
        cmocka_unit_test(test_loss_report_follows_restore),
        cmocka_unit_test(test_second_server_refused),
        cmocka_unit_test(test_durable_from_creation),
        cmocka_unit_test_teardown(test_failing_checkpoints_visible, unmount_full_disk),
        cmocka_unit_test(test_incurable_errors_exit_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
