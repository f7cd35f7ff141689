/* local_etcd.c - the etcd server of ps-local --replicas N (local_etcd.h). */
#define _XOPEN_SOURCE 700
#include "local_etcd.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "view_etcd.h"

static bool executable(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

static int in_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)n, path, name) < cap &&
            executable(out))
            return 0;
        path += n + (path[n] == ':');
    }
    return -1;
}

int local_etcd_find(const char *configured, char *out, size_t cap)
{
    if (configured && configured[0]) {
        if (strchr(configured, '/'))
            return executable(configured) && (size_t)snprintf(out, cap, "%s", configured) < cap
                       ? 0
                       : -1;
        return in_path(configured, out, cap);
    }
    if (executable("/usr/bin/etcd"))
        return snprintf(out, cap, "/usr/bin/etcd") < (int)cap ? 0 : -1;
    return in_path("etcd", out, cap);
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void remove_dir(local_etcd *e)
{
    if (e->dir[0]) {
        nftw(e->dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
        e->dir[0] = '\0';
    }
}

void local_etcd_stop(local_etcd *e)
{
    if (e->pid > 0) {
        kill(e->pid, SIGTERM);
        int st;
        for (int waited = 0; waitpid(e->pid, &st, WNOHANG) == 0; waited += 20) {
            if (waited >= 3000) {
                kill(e->pid, SIGKILL);
                waitpid(e->pid, &st, 0);
                break;
            }
            struct timespec ts = {0, 20 * 1000000};
            nanosleep(&ts, NULL);
        }
        e->pid = 0;
    }
    remove_dir(e);
}

int local_etcd_start(local_etcd *e, const char *bin, const char *parent, int client_port,
                     int peer_port, char *err, size_t errlen)
{
    memset(e, 0, sizeof(*e));
    if ((size_t)snprintf(e->dir, sizeof(e->dir), "%s/ps-local-etcd.%ld.XXXXXX", parent,
                         (long)getpid()) >= sizeof(e->dir) ||
        mkdtemp(e->dir) == NULL) {
        int saved = errno;
        e->dir[0] = '\0';
        return errf(err, errlen, "cannot create a directory for etcd under %s: %s", parent,
                    strerror(saved));
    }
    char data[PATH_MAX + 8], log[PATH_MAX + 16], curl[64], purl[64], cluster[96];
    snprintf(data, sizeof(data), "%s/data", e->dir);
    snprintf(log, sizeof(log), "%s/etcd.log", e->dir);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", client_port);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", peer_port);
    snprintf(cluster, sizeof(cluster), "ps-local=%s", purl);
    snprintf(e->endpoint, sizeof(e->endpoint), "%s", curl);
    pid_t parent_pid = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        remove_dir(e);
        return errf(err, errlen, "cannot start etcd: %s", strerror(errno));
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent_pid)
            _exit(127);
        setpgid(0, 0); /* not in the servers' group: it outlives their stop */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_IGN); /* a Ctrl-C is for ps-local, which stops etcd last */
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(bin, bin, "--name", "ps-local", "--data-dir", data, "--listen-client-urls", curl,
              "--advertise-client-urls", curl, "--listen-peer-urls", purl,
              "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster, (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    e->pid = pid;
    /* Ready once it answers a read (it listens before it has a leader). */
    etcd_client *c = NULL;
    char e1[1024] = "";
    if (etcd_client_create(&c, e->endpoint, 500, e1, sizeof(e1)) != 0) {
        local_etcd_stop(e);
        return errf(err, errlen, "%s", e1);
    }
    for (int waited = 0;; waited += 100) {
        char *v = NULL;
        int rc = etcd_get(c, "/ps-local/ready", &v, NULL, NULL, e1, sizeof(e1));
        free(v);
        if (rc == 0 || rc == ETCD_ENOTFOUND)
            break;
        int st;
        if (waitpid(e->pid, &st, WNOHANG) == e->pid || waited >= 15000) {
            char tail[600] = "";
            FILE *f = fopen(log, "r");
            if (f) { /* its last line says why */
                char line[600];
                while (fgets(line, sizeof(line), f))
                    snprintf(tail, sizeof(tail), "%s", line);
                fclose(f);
                tail[strcspn(tail, "\n")] = '\0';
            }
            if (waitpid(e->pid, &st, WNOHANG) == 0)
                kill(e->pid, SIGKILL), waitpid(e->pid, &st, 0);
            e->pid = 0;
            etcd_client_destroy(c);
            errf(err, errlen, "etcd (%s) did not come up within %d s: %s; its last line: %s", bin,
                 waited / 1000, e1, tail[0] ? tail : "(none)");
            remove_dir(e);
            return -1;
        }
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
    }
    etcd_client_destroy(c);
    return 0;
}
