/* Integration: ps_set_log_handler (issue "Observability"). A client of an address where no
 * server listens, with a short deadline, makes a call; the "waiting for ps 0" line that the
 * connection's watcher logs after about 2 s must reach the handler, at level warn, and nothing
 * may reach stderr meanwhile. Then ps_set_log_handler(NULL) must send such lines to stderr
 * again. ps_set_log_message_handler must get the message alone, and nothing else must. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "psclient.h"

typedef struct captured {
    pthread_mutex_t lock;
    char text[16384]; /* every line, one per row */
    size_t len;
    int lines;
    int waiting_level; /* level of the first "waiting for ps 0" line, -1 before */
} captured;

static captured cap = {.lock = PTHREAD_MUTEX_INITIALIZER, .waiting_level = -1};

static void handler(int level, const char *line, void *arg)
{
    captured *c = arg;

    pthread_mutex_lock(&c->lock);
    int n = snprintf(c->text + c->len, sizeof(c->text) - c->len, "%s\n", line);
    if (n > 0)
        c->len += (size_t)n < sizeof(c->text) - c->len ? (size_t)n : sizeof(c->text) - 1 - c->len;
    c->lines++;
    if (c->waiting_level < 0 && strstr(line, "waiting for ps 0") != NULL)
        c->waiting_level = level;
    pthread_mutex_unlock(&c->lock);
}

/* A loopback port where nothing listens (bound, then closed). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);

    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Opens a client of a dead address with deadline-ms 2500 and no retries, makes a call (which
 * must fail, after the watcher's first "waiting for" line at about 2 s) and closes it. */
static void call_dead_server(void)
{
    char cluster[128];
    ps_config *cfg;
    ps_client *c;
    ps_server_stats st;

    snprintf(cluster, sizeof(cluster), "{\"cluster\":{\"ps\":[\"127.0.0.1:%d\"]}}", free_port());
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "cluster", cluster), PS_OK);
    assert_int_equal(ps_config_set(cfg, "deadline-ms", "2500"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "retries", "0"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "log-format", "json"), PS_OK);
    assert_int_equal(ps_client_open(&c, cfg), PS_OK);
    ps_config_destroy(cfg);
    assert_int_not_equal(ps_server_status(c, 0, &st), PS_OK);
    ps_client_close(c);
}

/* Points fd 2 at a fresh temporary file; returns the saved stderr and the file. */
static int capture_stderr(FILE **file)
{
    fflush(stderr);
    *file = tmpfile();
    assert_non_null(*file);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(*file), STDERR_FILENO) >= 0);
    return saved;
}

/* Restores stderr and returns what was written to the file (caller frees). */
static char *restore_stderr(int saved, FILE *file)
{
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    long size = fseek(file, 0, SEEK_END) == 0 ? ftell(file) : -1;
    assert_true(size >= 0);
    char *text = calloc(1, (size_t)size + 1);
    assert_non_null(text);
    rewind(file);
    assert_int_equal(fread(text, 1, (size_t)size, file), (size_t)size);
    fclose(file);
    return text;
}

static void test_handler_gets_lines_not_stderr(void **state)
{
    FILE *file;
    (void)state;

    int saved = capture_stderr(&file);
    ps_set_log_handler(handler, &cap);
    call_dead_server();
    ps_set_log_handler(NULL, NULL);
    char *err = restore_stderr(saved, file);

    pthread_mutex_lock(&cap.lock);
    printf("handler got %d line(s):\n%s", cap.lines, cap.text);
    int level = cap.waiting_level;
    char *copy = strdup(cap.text);
    pthread_mutex_unlock(&cap.lock);
    if (err[0] != '\0')
        printf("stderr got:\n%s\n", err);
    assert_string_equal(err, "");
    assert_int_equal(level, PS_LOG_WARN);
    /* One line per call, no newline inside, in the JSON form. */
    assert_non_null(copy);
    assert_non_null(strstr(copy, "{\"ts\":\""));
    assert_non_null(strstr(copy, "\"level\":\"warn\""));
    free(copy);
    free(err);
}

static void test_null_restores_stderr(void **state)
{
    FILE *file;
    (void)state;

    pthread_mutex_lock(&cap.lock);
    int before = cap.lines;
    pthread_mutex_unlock(&cap.lock);

    int saved = capture_stderr(&file);
    ps_set_log_handler(handler, &cap);
    ps_set_log_handler(NULL, &cap); /* the default again */
    call_dead_server();
    char *err = restore_stderr(saved, file);

    pthread_mutex_lock(&cap.lock);
    int after = cap.lines;
    pthread_mutex_unlock(&cap.lock);
    printf("stderr got:\n%s", err);
    assert_non_null(strstr(err, "waiting for ps 0"));
    assert_int_equal(after, before);
    free(err);
}

/* ps_set_log_message_handler: the messages alone (no timestamp, level, role or JSON), at
 * their level, for the program's own logger; neither stderr nor the line handler gets them. */
typedef struct messages {
    pthread_mutex_t lock;
    int count, waiting_level;
    char first[1024];
} messages;

static messages msgs = {.lock = PTHREAD_MUTEX_INITIALIZER, .waiting_level = -1};

static void message_handler(int level, const char *message, const char *fields, void *arg)
{
    messages *m = arg;
    (void)fields;
    pthread_mutex_lock(&m->lock);
    if (m->count++ == 0)
        snprintf(m->first, sizeof(m->first), "%s", message);
    if (m->waiting_level < 0 && strncmp(message, "waiting for ps 0", 16) == 0)
        m->waiting_level = level;
    pthread_mutex_unlock(&m->lock);
}

static void test_message_handler_gets_messages(void **state)
{
    FILE *file;
    (void)state;

    pthread_mutex_lock(&cap.lock);
    int lines_before = cap.lines;
    pthread_mutex_unlock(&cap.lock);
    int saved = capture_stderr(&file);
    ps_set_log_handler(handler, &cap);
    ps_set_log_message_handler(PS_LOG_INFO, message_handler, &msgs);
    call_dead_server();
    ps_set_log_message_handler(PS_LOG_INFO, NULL, NULL);
    ps_set_log_handler(NULL, NULL);
    char *err = restore_stderr(saved, file);

    pthread_mutex_lock(&msgs.lock);
    printf("message handler got %d message(s), the first: %s\n", msgs.count, msgs.first);
    int level = msgs.waiting_level;
    char first[sizeof(msgs.first)];
    memcpy(first, msgs.first, sizeof(first));
    pthread_mutex_unlock(&msgs.lock);
    pthread_mutex_lock(&cap.lock);
    int lines_after = cap.lines;
    pthread_mutex_unlock(&cap.lock);
    assert_string_equal(err, "");
    assert_int_equal(lines_after, lines_before);
    assert_int_equal(level, PS_LOG_WARN);
    /* The message itself: the program's logger adds time, level and identity. */
    assert_int_equal(strncmp(first, "waiting for ps 0", 16), 0);
    assert_null(strstr(first, "\"ts\""));
    free(err);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv; /* the ps-server path: no server is started here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handler_gets_lines_not_stderr),
        cmocka_unit_test(test_null_restores_stderr),
        cmocka_unit_test(test_message_handler_gets_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
