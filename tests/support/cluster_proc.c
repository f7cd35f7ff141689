#include "cluster_proc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *test_server_bin(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH-TO-ps-server\n", argv[0]);
        exit(2);
    }
    return argv[1];
}

/* A port the kernel gives for port 0 is free once closed, and the next such bind may give
 * the same one again (seen: two servers of one cluster spec given the same port). */
static int kernel_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int test_free_port(void)
{
    /* The ports this process was given lately: never the same one twice in a row of them. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int recent[64];
    static unsigned nrecent;
    pthread_mutex_lock(&lock);
    int port = -1;
    for (int tries = 0; tries < 100; tries++) {
        port = kernel_free_port();
        bool seen = false;
        for (unsigned i = 0; i < nrecent && i < 64; i++)
            if (recent[i] == port)
                seen = true;
        if (!seen || port < 0)
            break;
    }
    if (port > 0)
        recent[nrecent++ % 64] = port;
    pthread_mutex_unlock(&lock);
    return port;
}

void test_cluster_tf_config(const test_cluster *tc, const char *type, int index, char *buf,
                            size_t cap)
{
    if (type)
        snprintf(buf, cap, "{\"cluster\":%s,\"task\":{\"type\":\"%s\",\"index\":%d}}", tc->spec,
                 type, index);
    else
        snprintf(buf, cap, "{\"cluster\":%s}", tc->spec);
}

static bool port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int test_cluster_start(test_cluster *tc, const char *server_bin, int n, const char *const *extra)
{
    return test_cluster_start_workers(tc, server_bin, n, 0, extra);
}

int test_cluster_start_workers(test_cluster *tc, const char *server_bin, int n, int n_workers,
                               const char *const *extra)
{
    memset(tc, 0, sizeof(*tc));
    tc->n = n;
    size_t off = (size_t)snprintf(tc->spec, sizeof(tc->spec), "{\"ps\":[");
    for (int i = 0; i < n; i++) {
        tc->ports[i] = test_free_port();
        off += (size_t)snprintf(tc->spec + off, sizeof(tc->spec) - off, "%s\"127.0.0.1:%d\"",
                                i ? "," : "", tc->ports[i]);
    }
    off += (size_t)snprintf(tc->spec + off, sizeof(tc->spec) - off, "]");
    if (n_workers > 0) {
        off += (size_t)snprintf(tc->spec + off, sizeof(tc->spec) - off, ",\"worker\":[");
        for (int i = 0; i < n_workers; i++)
            off += (size_t)snprintf(tc->spec + off, sizeof(tc->spec) - off, "%s\"127.0.0.1:%d\"",
                                    i ? "," : "", 1 + i);
        off += (size_t)snprintf(tc->spec + off, sizeof(tc->spec) - off, "]");
    }
    snprintf(tc->spec + off, sizeof(tc->spec) - off, "}");
    for (int i = 0; i < n; i++) {
        char tf[1200];
        test_cluster_tf_config(tc, "ps", i, tf, sizeof(tf));
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            setenv("TF_CONFIG", tf, 1);
            const char *argv[32] = {server_bin, "--log-level", "warn"};
            int k = 3;
            for (int j = 0; extra && extra[j] && k < 31; j++)
                argv[k++] = extra[j];
            argv[k] = NULL;
            execv(server_bin, (char *const *)argv);
            perror("execv ps-server");
            _exit(127);
        }
        tc->pids[i] = pid;
    }
    for (int i = 0; i < n; i++) {
        int waited = 0;
        while (!port_open(tc->ports[i])) {
            if (waited++ > 1000) {
                fprintf(stderr, "ps %d did not start listening on %d\n", i, tc->ports[i]);
                return -1;
            }
            struct timespec ts = {0, 10 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

int test_cluster_stop(test_cluster *tc)
{
    int bad = 0;
    for (int i = 0; i < tc->n; i++)
        if (tc->pids[i] > 0)
            kill(tc->pids[i], SIGTERM);
    for (int i = 0; i < tc->n; i++) {
        if (tc->pids[i] <= 0)
            continue;
        int st = 0;
        if (waitpid(tc->pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
        tc->pids[i] = 0;
    }
    return bad ? -1 : 0;
}

int test_cluster_respawn(test_cluster *tc, const char *server_bin, int i, const char *const *extra)
{
    if (i < 0 || i >= tc->n)
        return -1;
    if (tc->pids[i] > 0) {
        int st;
        waitpid(tc->pids[i], &st, 0);
        tc->pids[i] = 0;
    }
    char tf[1200];
    test_cluster_tf_config(tc, "ps", i, tf, sizeof(tf));
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("TF_CONFIG", tf, 1);
        const char *argv[32] = {server_bin, "--log-level", "warn"};
        int k = 3;
        for (int j = 0; extra && extra[j] && k < 31; j++)
            argv[k++] = extra[j];
        argv[k] = NULL;
        execv(server_bin, (char *const *)argv);
        perror("execv ps-server");
        _exit(127);
    }
    tc->pids[i] = pid;
    for (int waited = 0; !port_open(tc->ports[i]); waited++) {
        if (waited > 1000) {
            fprintf(stderr, "restarted ps %d did not listen on %d\n", i, tc->ports[i]);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

pid_t test_server_spawn(const char *server_bin, const char *spec, int index,
                        const char *const *extra, const char *log_path)
{
    char tf[1200];
    snprintf(tf, sizeof(tf), "{\"cluster\":%s,\"task\":{\"type\":\"ps\",\"index\":%d}}", spec,
             index);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setenv("TF_CONFIG", tf, 1);
    if (log_path) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
    }
    const char *argv[32] = {server_bin, "--log-level", "info"};
    int k = 3;
    for (int j = 0; extra && extra[j] && k < 31; j++)
        argv[k++] = extra[j];
    argv[k] = NULL;
    execv(server_bin, (char *const *)argv);
    perror("execv ps-server");
    _exit(127);
}

int test_wait_port(int port, int ms)
{
    for (int waited = 0; !port_open(port); waited += 10) {
        if (waited >= ms)
            return -1;
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

int test_wait_exit(pid_t pid, int ms)
{
    for (int waited = 0;; waited += 10) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0)
            return -1;
        if (waited >= ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
}

bool test_file_contains(const char *path, const char *text)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    bool found = false;
    if (buf) {
        n = fread(buf, 1, cap, f);
        buf[n] = '\0';
        found = strstr(buf, text) != NULL;
        free(buf);
    }
    fclose(f);
    return found;
}

pid_t test_spawn_child(const char *self, const char *server_bin, const char *role, int id, int n,
                       const char *spec)
{
    char a[16], b[16];
    snprintf(a, sizeof(a), "%d", id);
    snprintf(b, sizeof(b), "%d", n);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, server_bin, "--child", role, a, b, spec, (char *)NULL);
        _exit(127);
    }
    return pid;
}
