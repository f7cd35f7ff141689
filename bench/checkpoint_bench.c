/* Checkpoint benchmark (not a test): a ps-server holding one variable of SIZE MiB (SGD, so
 * parameters only) writes a checkpoint on demand; the disk's own sequential write speed is
 * measured in the same run (write + fsync of as many bytes); then the server is SIGKILLed and
 * restarted, timing spawn-to-listening.
 * usage: ps-checkpoint-bench PATH-TO-ps-server DIR SIZE-MiB */
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
    snprintf(cmd, sizeof(cmd), "grep -o '%s[^\"]*' %s | tail -1 >&2", what, log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no \"%s\" line in %s)\n", what, log);
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
