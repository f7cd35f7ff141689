/* etcd_proc.c - a throwaway etcd server for tests (etcd_proc.h). */
#include "etcd_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"

const char *etcd_proc_binary(void)
{
    const char *env = getenv("PSD_ETCD");
    if (env && env[0])
        return access(env, X_OK) == 0 ? env : NULL;
    if (access("/usr/bin/etcd", X_OK) == 0)
        return "/usr/bin/etcd";
    static char found[512];
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(found, sizeof(found), "%.*s/etcd", (int)n, path);
        if (n > 0 && access(found, X_OK) == 0)
            return found;
        path += n + (path[n] == ':');
    }
    return NULL;
}

static int spawn(etcd_proc *e)
{
    const char *bin = etcd_proc_binary();
    if (bin == NULL) {
        fprintf(stderr, "etcd_proc: no etcd binary\n");
        return -1;
    }
    char data[160], log[160], curl[64], purl[64], cluster[96];
    snprintf(data, sizeof(data), "%s/data", e->dir);
    snprintf(log, sizeof(log), "%s/etcd.log", e->dir);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", e->client_port);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", e->peer_port);
    snprintf(cluster, sizeof(cluster), "default=%s", purl);
    snprintf(e->endpoint, sizeof(e->endpoint), "%s", curl);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, "--data-dir", data, "--listen-client-urls", curl, "--advertise-client-urls",
              curl, "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
              "--initial-cluster", cluster, (char *)NULL);
        _exit(127);
    }
    e->pid = pid;
    if (test_wait_port(e->client_port, 15000) != 0) {
        fprintf(stderr, "etcd_proc: etcd did not listen on %d within 15 s (log %s)\n",
                e->client_port, log);
        return -1;
    }
    /* Listening comes before the member is ready to serve requests: wait for a leader. */
    struct timespec ts = {0, 300 * 1000000};
    nanosleep(&ts, NULL);
    return 0;
}

int etcd_proc_start(etcd_proc *e)
{
    memset(e, 0, sizeof(*e));
    /* On tmpfs when there is one: etcd's fsyncs on a busy disk stall it for seconds, which
     * expires leases and skews the failover timings the tests measure. */
    snprintf(e->dir, sizeof(e->dir), "%s/psd-etcd-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (mkdtemp(e->dir) == NULL)
        return -1;
    e->client_port = test_free_port();
    do
        e->peer_port = test_free_port();
    while (e->peer_port == e->client_port);
    return spawn(e);
}

void etcd_proc_kill(etcd_proc *e)
{
    if (e->pid > 0) {
        kill(e->pid, SIGKILL);
        waitpid(e->pid, NULL, 0);
        e->pid = 0;
    }
}

int etcd_proc_restart(etcd_proc *e)
{
    etcd_proc_kill(e);
    return spawn(e);
}

void etcd_proc_stop(etcd_proc *e)
{
    etcd_proc_kill(e);
    if (e->dir[0]) {
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "etcd_proc: cannot remove %s\n", e->dir);
        e->dir[0] = '\0';
    }
}
