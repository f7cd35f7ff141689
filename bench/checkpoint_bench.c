/* Checkpoint benchmark (not a test): a ps-server holding one variable of SIZE MiB (SGD, so
 * parameters only) writes a checkpoint on demand; the disk's own sequential write speed is
 * measured in the same run (write + fsync of as many bytes); then the server is SIGKILLed and
 * restarted, timing spawn-to-listening.
 * usage: ps-checkpoint-bench PATH-TO-ps-server DIR SIZE-MiB
 *
 * Table mode: ps-checkpoint-bench PATH-TO-ps-server DIR --table ROWS DIM PCT [EXTRA-FLAG...]
 * a ps-server (checkpoint-full-every 10, or what EXTRA-FLAGs say) holding a table of ROWS
 * rows of DIM floats (Adagrad) writes a full checkpoint, then PCT% of the rows are pushed
 * again and it writes a delta; the server's log lines say bytes, time and the pause of
 * each; then it is SIGKILLed and restarted from full + delta. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "program.h"
#include "psclient.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void show_lines(const char *log, const char *what)
{
    char cmd[600];
    fflush(stdout);
    snprintf(cmd, sizeof(cmd), "grep -o '%s[^\"]*' %s | tail -1 >&2", what, log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no \"%s\" line in %s)\n", what, log);
}

static ps_client *open_client(const char *spec)
{
    ps_config *cfg;
    ps_client *c;
    char tf[300];
    snprintf(tf, sizeof(tf), "{\"cluster\":%s}", spec);
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "deadline-ms", "600000");
    ps_config_set(cfg, "resend-ms", "600000"); /* one checkpoint, not one per resend */
    if (ps_client_open(&c, cfg) != PS_OK)
        c = NULL;
    ps_config_destroy(cfg);
    return c;
}

/* Pushes a constant gradient to ids first, first + stride, ... (n of them). */
static int push_ids(ps_table *t, uint64_t first, uint64_t stride, uint64_t n, uint32_t dim)
{
    size_t chunk = 1u << 16;
    int64_t *ids = malloc(chunk * sizeof(*ids));
    float *g = malloc(chunk * dim * sizeof(float));
    for (size_t i = 0; i < chunk * dim; i++)
        g[i] = 0.01f;
    int rc = PS_OK;
    for (uint64_t done = 0; done < n && rc == PS_OK;) {
        size_t k = n - done < chunk ? (size_t)(n - done) : chunk;
        for (size_t i = 0; i < k; i++)
            ids[i] = (int64_t)(first + (done + i) * stride);
        rc = ps_table_push(t, ids, k, g);
        done += k;
    }
    free(ids);
    free(g);
    return rc;
}

static int table_mode(const char *bin, const char *dir, int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr,
                "usage: ps-checkpoint-bench PS-SERVER DIR --table ROWS DIM PCT [FLAG...]\n");
        return 2;
    }
    uint64_t rows = strtoull(argv[4], NULL, 10);
    uint32_t dim = (uint32_t)atoi(argv[5]);
    double pct = atof(argv[6]);
    int port = test_free_port();
    char spec[128], log[600];
    snprintf(spec, sizeof(spec), "{\"ps\":[\"127.0.0.1:%d\"]}", port);
    snprintf(log, sizeof(log), "%s/bench-server.log", dir);
    const char *extra[32] = {
        "--checkpoint-dir",        dir, "--log-format", "text", "--checkpoint-interval-s", "0",
        "--checkpoint-full-every", "10"};
    int ne = 8;
    for (int i = 7; i < argc && ne < 31; i++)
        extra[ne++] = argv[i];
    extra[ne] = NULL;
    pid_t pid = test_server_spawn(bin, spec, 0, extra, log);
    if (test_wait_port(port, 20000) != 0)
        return 1;
    ps_client *c = open_client(spec);
    ps_table_spec ts;
    ps_table_spec_init(&ts, "bench/table", dim, PS_OPT_ADAGRAD);
    ts.initializer = PS_INIT_UNIFORM;
    ts.init_a = -0.1;
    ts.init_b = 0.1;
    ps_table *t;
    if (c == NULL || ps_table_create(c, &ts, &t) != PS_OK) {
        fprintf(stderr, "create: %s\n", ps_last_error());
        return 1;
    }
    double t0 = now_s();
    if (push_ids(t, 0, 1, rows, dim) != PS_OK) {
        fprintf(stderr, "push: %s\n", ps_last_error());
        return 1;
    }
    printf("%llu rows of dim %u made by pushes in %.1f s\n", (unsigned long long)rows, dim,
           now_s() - t0);
    t0 = now_s();
    if (ps_checkpoint(c) != PS_OK) {
        fprintf(stderr, "checkpoint: %s\n", ps_last_error());
        return 1;
    }
    printf("full checkpoint: %.3f s (RPC round trip)\n", now_s() - t0);
    show_lines(log, "checkpoint /");
    uint64_t n = (uint64_t)((double)rows * pct / 100.0);
    uint64_t stride = n ? rows / n : 1;
    if (push_ids(t, 7, stride, n, dim) != PS_OK) {
        fprintf(stderr, "push: %s\n", ps_last_error());
        return 1;
    }
    t0 = now_s();
    if (ps_checkpoint(c) != PS_OK) {
        fprintf(stderr, "checkpoint: %s\n", ps_last_error());
        return 1;
    }
    printf("checkpoint after %.2f%% of the rows pushed (%llu): %.3f s (RPC round trip)\n", pct,
           (unsigned long long)n, now_s() - t0);
    show_lines(log, "checkpoint /");
    ps_table_free(t);
    ps_client_close(c);
    kill(pid, SIGKILL);
    test_wait_exit(pid, 20000);
    t0 = now_s();
    pid = test_server_spawn(bin, spec, 0, extra, log);
    if (test_wait_port(port, 600000) != 0)
        return 1;
    printf("restart to listening: %.3f s\n", now_s() - t0);
    show_lines(log, "restored ");
    kill(pid, SIGKILL);
    test_wait_exit(pid, 20000);
    return 0;
}

int main(int argc, char **argv)
{
    if (program_wants_version(argc, argv)) {
        program_print_version(stdout, "ps-checkpoint-bench");
        return 0;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: %s PATH-TO-ps-server DIR SIZE-MiB\n", program_name(argv[0]));
        return 2;
    }
    const char *bin = argv[1], *dir = argv[2];
    if (strcmp(argv[3], "--table") == 0)
        return table_mode(bin, dir, argc, argv);
    size_t mib = (size_t)atol(argv[3]);
    size_t bytes = mib << 20;
    int port = test_free_port();
    char spec[128], log[600], tf[300];
    snprintf(spec, sizeof(spec), "{\"ps\":[\"127.0.0.1:%d\"]}", port);
    snprintf(log, sizeof(log), "%s/bench-server.log", dir);
    const char *extra[] = {"--checkpoint-dir", dir, "--log-format", "text", NULL};
    pid_t pid = test_server_spawn(bin, spec, 0, extra, log);
    if (test_wait_port(port, 20000) != 0)
        return 1;
    ps_config *cfg;
    ps_client *c;
    snprintf(tf, sizeof(tf), "{\"cluster\":%s}", spec);
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "deadline-ms", "600000");
    ps_config_set(cfg, "resend-ms", "600000"); /* one checkpoint, not one per resend */
    if (ps_client_open(&c, cfg) != PS_OK)
        return 1;
    ps_config_destroy(cfg);
    ps_var_spec s;
    ps_var_spec_init(&s, "bench/big");
    s.ndims = 1;
    s.dims[0] = bytes / 4;
    ps_var *v;
    if (ps_var_create(c, &s, &v) != PS_OK) {
        fprintf(stderr, "create: %s\n", ps_last_error());
        return 1;
    }
    double t0 = now_s();
    if (ps_checkpoint(c) != PS_OK) {
        fprintf(stderr, "checkpoint: %s\n", ps_last_error());
        return 1;
    }
    double tck = now_s() - t0;
    ps_client_close(c);
    printf("checkpoint of %zu MiB: %.3f s, %.0f MiB/s (RPC round trip)\n", mib, tck,
           (double)mib / tck);
    show_lines(log, "checkpoint /");

    /* The disk alone: the same bytes, written and fsynced. */
    char path[600];
    snprintf(path, sizeof(path), "%s/dd.tmp", dir);
    size_t chunk = 64u << 20;
    char *buf = malloc(chunk);
    memset(buf, 0x5a, chunk);
    t0 = now_s();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; done < bytes;) {
        size_t k = bytes - done < chunk ? bytes - done : chunk;
        ssize_t r = write(fd, buf, k);
        if (r <= 0)
            return 1;
        done += (size_t)r;
    }
    fsync(fd);
    close(fd);
    double tdd = now_s() - t0;
    unlink(path);
    free(buf);
    printf("disk write+fsync of %zu MiB: %.3f s, %.0f MiB/s\n", mib, tdd, (double)mib / tdd);

    kill(pid, SIGKILL);
    test_wait_exit(pid, 20000);
    t0 = now_s();
    pid = test_server_spawn(bin, spec, 0, extra, log);
    if (test_wait_port(port, 600000) != 0)
        return 1;
    double tready = now_s() - t0;
    printf("restart to listening with %zu MiB restored: %.3f s\n", mib, tready);
    show_lines(log, "restored ");
    kill(pid, SIGKILL);
    test_wait_exit(pid, 20000);
    return 0;
}
