/* The HTTP endpoint: a small HTTP/1.1 server of its own on plain sockets, one thread, poll().
 *
 * Why not nng's HTTP server (nng 1.5.2): its API (handlers, TLS, error pages) has no
 * connection cap and no timeouts, so a connection that never finishes its headers, or an idle
 * keep-alive one, is held forever; 1,100 idle ones took every file descriptor (the data port's
 * clients and /livez were refused) and its accept loop then spun; and it renders concurrent
 * scrapes in parallel, each holding its own copy of the text. Three GET paths need none of its
 * generality, and one thread with bounded state is easy to reason about: at most
 * HTTP_MAX_CONNS connections (a newcomer closes the one that has waited longest for its peer,
 * whatever that peer does, so that probes are answered while others hold every slot), a
 * request's headers within HTTP_HEADER_TIMEOUT_MS, a keep-alive connection
 * closed after HTTP_IDLE_TIMEOUT_MS without a request, a reply written within
 * HTTP_WRITE_TIMEOUT_MS, accept paused (not retried in a loop) when out of descriptors, and
 * /metrics rendered one at a time, scrapes that arrive together sharing one text (metrics_body). */
#include "http_endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "timeutil.h"

enum {
    HTTP_MAX_CONNS = 64,           /* connections served at once */
    HTTP_HEADER_BYTES = 8192,      /* request line and headers */
    HTTP_HEADER_TIMEOUT_MS = 5000, /* a request's headers, from the connection or first byte */
    HTTP_IDLE_TIMEOUT_MS = 30000,  /* a keep-alive connection between requests */
    HTTP_WRITE_TIMEOUT_MS = 10000, /* one reply */
    HTTP_ACCEPT_BACKOFF_MS = 100,  /* after accept failed for want of descriptors */
    HTTP_LOG_EVERY_MS = 10000,     /* rate of the refusal warnings */
};

/* A rendered /metrics text, shared by the replies that send it. */
typedef struct http_body {
    int refs;
    char *data;
    size_t len;
    uint64_t born_ns;
} http_body;

typedef enum conn_state { CONN_READ, CONN_WRITE } conn_state;

typedef struct http_conn {
    int fd; /* -1: slot free */
    conn_state state;
    uint64_t deadline_ns;
    /* When it began to wait for its peer (accepted, its reply queued, its reply sent), as a
     * place in the order of such events: the smallest has waited longest. */
    uint64_t waiting_since;
    bool started; /* some bytes of the current request arrived */
    bool close_after;
    char in[HTTP_HEADER_BYTES];
    size_t in_len;
    char head[512]; /* status line and headers of the reply */
    size_t head_len, head_off;
    const char *body; /* into small[] or shared->data */
    size_t body_len, body_off;
    char small[1200];
    http_body *shared;
} http_conn;

struct http_endpoint {
    int lfd;
    int wake[2]; /* a byte on wake[1] stops the thread */
    pthread_t thread;
    int port;
    pthread_mutex_t lock; /* ready, reason, ready_fn */
    bool ready;
    char reason[256];
    http_ready_fn ready_fn;
    void *ready_arg;
    /* The thread's own state. */
    http_conn conns[HTTP_MAX_CONNS];
    int nconns;
    uint64_t events;          /* the last waiting_since given */
    uint64_t accept_after_ns; /* accept paused until then (no descriptors) */
    http_body *metrics;       /* the newest rendered text, or NULL */
    int old_bodies;           /* older texts still being sent */
    uint64_t evicted, fd_fail;
    log_every full_log, fd_log; /* the two refusal warnings, at most every HTTP_LOG_EVERY_MS */
    http_detail_fn detail_fn;
    void *detail_arg;
};

static void body_release(http_endpoint *e, http_body *b)
{
    if (b == NULL || --b->refs > 0)
        return;
    if (b != e->metrics)
        e->old_bodies--;
    free(b->data);
    free(b);
}

/* The /metrics text for a request that arrived at `arrived` (the time the poll round that read
 * it began). A text whose rendering began after that already holds every update the client
 * saw acknowledged before it asked, so requests read in the same round, or while a text was
 * rendered, share one rendering: a burst of scrapes costs one or two renderings, and scrapes
 * one after the other still see fresh values. While an older text is still being sent to a
 * slow reader and the newest one too, the newest is reused even if older than the request, so
 * that at most two texts exist however many scrapes run. */
static http_body *metrics_body(http_endpoint *e, uint64_t arrived)
{
    http_body *b = e->metrics;
    if (b && (b->born_ns >= arrived || (b->refs > 1 && e->old_bodies > 0)))
        goto share;
    uint64_t start = time_now_ns();
    size_t len = 0;
    char *text = metrics_render(&len);
    http_body *nb = text ? malloc(sizeof(*nb)) : NULL;
    if (nb == NULL) {
        free(text);
        if (b)
            goto share; /* stale beats nothing */
        return NULL;
    }
    *nb = (http_body){.refs = 1, .data = text, .len = len, .born_ns = start};
    if (b) {
        e->metrics = NULL;
        if (b->refs > 1) {
            e->old_bodies++;
            b->refs--;
        } else {
            free(b->data);
            free(b);
        }
    }
    e->metrics = b = nb;
share:
    b->refs++;
    return b;
}

static void conn_close(http_endpoint *e, http_conn *c)
{
    if (c->fd < 0)
        return;
    close(c->fd);
    c->fd = -1;
    body_release(e, c->shared);
    c->shared = NULL;
    e->nconns--;
}

/* Starts waiting for a request of c: a fresh connection (or one with part of its next request
 * in the buffer) within the header timeout, a kept-alive one within the idle timeout until its
 * next request begins. */
static void conn_read_next(http_conn *c, bool fresh, uint64_t now)
{
    c->state = CONN_READ;
    c->started = fresh || c->in_len > 0;
    c->deadline_ns =
        now + (uint64_t)(c->started ? HTTP_HEADER_TIMEOUT_MS : HTTP_IDLE_TIMEOUT_MS) * 1000000u;
}

/* Queues a reply; body points at memory that lives until it is sent (small, shared, static). */
static void respond(http_conn *c, int status, const char *reason, const char *type,
                    const char *body, size_t len, bool head_only, uint64_t now)
{
    int n = snprintf(c->head, sizeof(c->head),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Cache-Control: no-store\r\n%s\r\n",
                     status, reason, type, len, c->close_after ? "Connection: close\r\n" : "");
    c->head_len = n > 0 && (size_t)n < sizeof(c->head) ? (size_t)n : 0;
    c->head_off = 0;
    c->body = body;
    c->body_len = head_only ? 0 : len;
    c->body_off = 0;
    c->state = CONN_WRITE;
    c->deadline_ns = now + (uint64_t)HTTP_WRITE_TIMEOUT_MS * 1000000u;
}

static void respond_text(http_conn *c, int status, const char *reason, const char *text,
                         bool head_only, uint64_t now)
{
    int n = snprintf(c->small, sizeof(c->small), "%s\n", text);
    size_t len = n > 0 && (size_t)n < sizeof(c->small) ? (size_t)n : sizeof(c->small) - 1;
    respond(c, status, reason, "text/plain; charset=utf-8", c->small, len, head_only, now);
}

/* Whether the header block [hdrs, end) has header `name` (case-insensitive); its value (cut
 * to cap - 1 bytes, without leading blanks) in v when v is not NULL. */
static bool find_header(const char *hdrs, const char *end, const char *name, char *v, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = hdrs; p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL)
            eol = end;
        if ((size_t)(eol - p) > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *val = p + nl + 1;
            while (val < eol && (*val == ' ' || *val == '\t'))
                val++;
            if (v) {
                size_t vl = (size_t)(eol - val);
                vl = vl < cap - 1 ? vl : cap - 1;
                memcpy(v, val, vl);
                v[vl] = '\0';
            }
            return true;
        }
        p = eol + 1;
    }
    return false;
}

/* Handles the complete request in c->in[0, hlen) (headers end at hlen) and queues its reply. */
static void handle_request(http_endpoint *e, http_conn *c, size_t hlen, uint64_t now)
{
    char *req = c->in;
    char *line_end = memchr(req, '\n', hlen);
    char method[16], target[1024], version[16];
    int n = 0;
    if (line_end) {
        *line_end = '\0';
        n = sscanf(req, "%15s %1023s %15s", method, target, version);
    }
    const char *hdrs = line_end ? line_end + 1 : req + hlen, *hend = req + hlen;
    c->close_after = true;
    if (n != 3 || strncmp(version, "HTTP/1.", 7) != 0) {
        respond_text(c, 400, "Bad Request", "bad request line", false, now);
        return;
    }
    /* HTTP/1.1 keeps the connection unless told not to; 1.0 closes it. */
    char v[64];
    c->close_after =
        strcmp(version, "HTTP/1.1") != 0 ||
        (find_header(hdrs, hend, "Connection", v, sizeof(v)) && strcasestr(v, "close"));
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        c->close_after = true; /* a body we do not read may follow */
        respond_text(c, 405, "Method Not Allowed", "only GET and HEAD", false, now);
        return;
    }
    if (find_header(hdrs, hend, "Transfer-Encoding", NULL, 0) ||
        (find_header(hdrs, hend, "Content-Length", v, sizeof(v)) && strspn(v, "0") == 0)) {
        c->close_after = true;
        respond_text(c, 400, "Bad Request", "a GET carries no body", false, now);
        return;
    }
    char *q = strchr(target, '?');
    if (q)
        *q = '\0';
    if (strcmp(target, "/livez") == 0) {
        respond_text(c, 200, "OK", "ok", head, now);
    } else if (strcmp(target, "/readyz") == 0) {
        /* The readiness line, then a health detail that does not change it (e.g. that
         * checkpoints fail) on a second line. */
        char why[256] = "", detail[768] = "", text[1100];
        pthread_mutex_lock(&e->lock);
        bool ready = e->ready;
        if (e->ready_fn)
            ready = e->ready_fn(e->ready_arg, why, sizeof(why));
        else
            snprintf(why, sizeof(why), "%s", e->reason);
        if (e->detail_fn)
            e->detail_fn(e->detail_arg, detail, sizeof(detail));
        pthread_mutex_unlock(&e->lock);
        snprintf(text, sizeof(text), "%s%s%s", ready ? "ready" : why, detail[0] ? "\n" : "",
                 detail);
        if (ready)
            respond_text(c, 200, "OK", text, head, now);
        else
            respond_text(c, 503, "Service Unavailable", text, head, now);
    } else if (strcmp(target, "/metrics") == 0) {
        http_body *b = metrics_body(e, now);
        if (b == NULL) {
            respond_text(c, 500, "Internal Server Error", "out of memory rendering metrics", head,
                         now);
            return;
        }
        c->shared = b;
        respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", b->data, b->len, head,
                now);
    } else {
        respond_text(c, 404, "Not Found", "not found (/metrics, /livez, /readyz)", head, now);
    }
}

/* Reads what arrived; handles a request once its headers are complete. */
static void conn_readable(http_endpoint *e, http_conn *c, uint64_t now)
{
    ssize_t r = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_close(e, c);
        return;
    }
    if (r < 0)
        return;
    if (!c->started) {
        c->started = true;
        c->deadline_ns = now + (uint64_t)HTTP_HEADER_TIMEOUT_MS * 1000000u;
    }
    c->in_len += (size_t)r;
}

/* Looks for a complete request in c's buffer and answers it. */
static void conn_parse(http_endpoint *e, http_conn *c, uint64_t now)
{
    char *end = NULL;
    for (size_t i = 3; i < c->in_len && end == NULL; i++)
        if (c->in[i] == '\n' && c->in[i - 1] == '\r' && c->in[i - 2] == '\n' &&
            c->in[i - 3] == '\r')
            end = c->in + i + 1;
    if (end == NULL) {
        if (c->in_len == sizeof(c->in)) {
            c->close_after = true;
            c->in_len = 0;
            respond_text(c, 431, "Request Header Fields Too Large", "headers too large", false,
                         now);
            c->waiting_since = ++e->events;
        }
        return;
    }
    size_t hlen = (size_t)(end - c->in);
    handle_request(e, c, hlen, now);
    c->waiting_since = ++e->events;
    /* Keep what follows (a pipelined request) for after the reply. */
    memmove(c->in, c->in + hlen, c->in_len - hlen);
    c->in_len -= hlen;
}

/* Sends what it can of the reply; at its end closes or waits for the next request. */
static void conn_writable(http_endpoint *e, http_conn *c, uint64_t now)
{
    while (c->head_off < c->head_len || c->body_off < c->body_len) {
        struct iovec iov[2];
        int n = 0;
        if (c->head_off < c->head_len)
            iov[n++] = (struct iovec){c->head + c->head_off, c->head_len - c->head_off};
        if (c->body_off < c->body_len)
            iov[n++] = (struct iovec){(char *)c->body + c->body_off, c->body_len - c->body_off};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            conn_close(e, c);
            return;
        }
        size_t done = (size_t)w, h = c->head_len - c->head_off;
        if (done >= h) {
            c->head_off = c->head_len;
            c->body_off += done - h;
        } else {
            c->head_off += done;
        }
    }
    body_release(e, c->shared);
    c->shared = NULL;
    if (c->close_after) {
        conn_close(e, c);
        return;
    }
    c->waiting_since = ++e->events;
    conn_read_next(c, false, now);
    if (c->in_len > 0)
        conn_parse(e, c, now);
}

static void accept_some(http_endpoint *e, uint64_t now);

/* Accepts what waits (accept_some), logging at most every HTTP_LOG_EVERY_MS when full. */
static void accept_all(http_endpoint *e, uint64_t now)
{
    uint64_t evicted = e->evicted;
    accept_some(e, now);
    if (e->evicted != evicted && log_every_due(&e->full_log, HTTP_LOG_EVERY_MS, now)) {
        log_warn("http: %d connections open, the most served at once: %llu closed so far to make "
                 "room for new ones (each time the one that had waited longest for its client)",
                 HTTP_MAX_CONNS, (unsigned long long)e->evicted);
    }
}

/* The connection that has waited longest for its peer, whatever it waits for: a request
 * (none begun, or headers arriving however slowly) or the reading of its reply. */
static http_conn *longest_waiting(http_endpoint *e)
{
    http_conn *oldest = NULL;
    for (int i = 0; i < HTTP_MAX_CONNS; i++) {
        http_conn *c = &e->conns[i];
        if (c->fd >= 0 && (oldest == NULL || c->waiting_since < oldest->waiting_since))
            oldest = c;
    }
    return oldest;
}

/* Accepts what waits, into a free slot or, when all HTTP_MAX_CONNS are taken, into one made by
 * closing the connection that has waited longest for its peer: no client, idle, trickling
 * its headers a byte at a time or reading slowly, holds a slot against a newcomer such as a
 * liveness probe, which sends its request at once and so is answered before 63 more
 * newcomers could make it the oldest. While full, one newcomer per poll round: the round in
 * between reads what the one accepted before sent and closes those whose peers left, so a
 * connection whose request is still unread is never closed for a newer one in the same round. */
static void accept_some(http_endpoint *e, uint64_t now)
{
    for (;;) {
        int fd = accept4(e->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Waiting connections stay in the backlog; try again a little later instead
                 * of spinning on a listener that stays readable. */
                e->accept_after_ns = now + (uint64_t)HTTP_ACCEPT_BACKOFF_MS * 1000000u;
                e->fd_fail++;
                if (log_every_due(&e->fd_log, HTTP_LOG_EVERY_MS, now)) {
                    log_warn("http: cannot accept connections: %s (%llu times); the process is "
                             "out of file descriptors",
                             strerror(errno), (unsigned long long)e->fd_fail);
                }
            }
            return;
        }
        bool full = e->nconns >= HTTP_MAX_CONNS;
        if (full) {
            conn_close(e, longest_waiting(e));
            e->evicted++;
        }
        http_conn *c = NULL;
        for (int i = 0; i < HTTP_MAX_CONNS && c == NULL; i++)
            if (e->conns[i].fd < 0)
                c = &e->conns[i];
        c->fd = fd;
        c->waiting_since = ++e->events;
        c->in_len = 0;
        c->shared = NULL;
        c->close_after = false;
        conn_read_next(c, true, now);
        e->nconns++;
        if (full)
            return;
    }
}

static void *serve(void *arg)
{
    http_endpoint *e = arg;
    struct pollfd pfd[HTTP_MAX_CONNS + 2];
    int slot[HTTP_MAX_CONNS + 2];
    for (;;) {
        uint64_t now = time_now_ns();
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = e->wake[0], .events = POLLIN};
        bool listening = now >= e->accept_after_ns;
        pfd[n++] = (struct pollfd){.fd = listening ? e->lfd : -1, .events = POLLIN};
        uint64_t next = now + 1000000000u;
        if (!listening && e->accept_after_ns < next)
            next = e->accept_after_ns;
        for (int i = 0; i < HTTP_MAX_CONNS; i++) {
            http_conn *c = &e->conns[i];
            if (c->fd < 0)
                continue;
            slot[n] = i;
            pfd[n++] =
                (struct pollfd){.fd = c->fd, .events = c->state == CONN_READ ? POLLIN : POLLOUT};
            if (c->deadline_ns < next)
                next = c->deadline_ns;
        }
        int timeout = next > now ? (int)((next - now + 999999) / 1000000) : 0;
        int r = poll(pfd, (nfds_t)n, timeout);
        if (r < 0 && errno != EINTR) {
            log_error("http: poll failed: %s; the HTTP endpoint stops", strerror(errno));
            return NULL;
        }
        if (r > 0 && (pfd[0].revents & POLLIN))
            return NULL;
        now = time_now_ns();
        for (int k = 2; r > 0 && k < n; k++) {
            http_conn *c = &e->conns[slot[k]];
            if (pfd[k].revents == 0 || c->fd < 0)
                continue;
            if (c->state == CONN_READ) {
                conn_readable(e, c, now);
                if (c->fd >= 0)
                    conn_parse(e, c, now);
                if (c->fd >= 0 && c->state == CONN_WRITE)
                    conn_writable(e, c, now);
            } else {
                conn_writable(e, c, now);
            }
        }
        /* Timeouts: headers not complete, idle between requests, a reader too slow. */
        for (int i = 0; i < HTTP_MAX_CONNS; i++)
            if (e->conns[i].fd >= 0 && e->conns[i].deadline_ns <= now)
                conn_close(e, &e->conns[i]);
        if (r > 0 && (pfd[1].revents & POLLIN))
            accept_all(e, now);
    }
}

/* Opens the listening socket for host:port; returns the fd or -1 with err. */
static int listen_on(const char *host, const char *port, char *err, size_t errlen, const char *addr)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rv = getaddrinfo(host, port, &hints, &res);
    if (rv != 0) {
        snprintf(err, errlen, "http-listen %s: %s", addr, gai_strerror(rv));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen, "cannot serve HTTP on %s: %s", addr, strerror(saved));
    return fd;
}

int http_endpoint_start(http_endpoint **out, const char *addr, char *err, size_t errlen)
{
    *out = NULL;
    /* A bare PORT, like :PORT, means every interface (as Prometheus exporters take it). */
    const char *colon = strrchr(addr, ':');
    const char *port = colon ? colon + 1 : addr;
    if (port[0] == '\0' || strspn(port, "0123456789") != strlen(port) || strlen(port) > 5 ||
        atoi(port) > 65535) {
        snprintf(err, errlen, "http-listen \"%s\" is not host:port, :port or port", addr);
        return -1;
    }
    char host[256];
    size_t host_len = colon ? (size_t)(colon - addr) : 0;
    const char *h = addr;
    if (host_len >= 2 && addr[0] == '[' && addr[host_len - 1] == ']') {
        h = addr + 1;
        host_len -= 2;
    }
    if (host_len >= sizeof(host)) {
        snprintf(err, errlen, "http-listen \"%s\" is too long", addr);
        return -1;
    }
    memcpy(host, h, host_len);
    host[host_len] = '\0';
    if (host_len == 0 || strcmp(host, "*") == 0)
        snprintf(host, sizeof(host), "0.0.0.0");
    http_endpoint *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    e->wake[0] = e->wake[1] = -1;
    for (int i = 0; i < HTTP_MAX_CONNS; i++)
        e->conns[i].fd = -1;
    pthread_mutex_init(&e->lock, NULL);
    snprintf(e->reason, sizeof(e->reason), "starting");
    e->lfd = listen_on(host, port, err, errlen, addr);
    if (e->lfd < 0)
        goto fail;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(e->lfd, (struct sockaddr *)&ss, &sl) == 0)
        e->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (pipe2(e->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, errlen, "http-listen %s: pipe: %s", addr, strerror(errno));
        goto fail;
    }
    int rv = pthread_create(&e->thread, NULL, serve, e);
    if (rv != 0) {
        snprintf(err, errlen, "http-listen %s: cannot start its thread: %s", addr, strerror(rv));
        goto fail;
    }
    *out = e;
    return 0;
fail:
    if (e->wake[0] >= 0) {
        close(e->wake[0]);
        close(e->wake[1]);
    }
    if (e->lfd >= 0)
        close(e->lfd);
    pthread_mutex_destroy(&e->lock);
    free(e);
    return -1;
}

int http_endpoint_start_logged(http_endpoint **out, const char *addr)
{
    *out = NULL;
    if (addr == NULL || addr[0] == '\0')
        return 0;
    char err[512];
    if (http_endpoint_start(out, addr, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return -1;
    }
    log_info("metrics on http://%s/metrics (port %d)", addr, http_endpoint_port(*out));
    return 0;
}

int http_endpoint_port(const http_endpoint *e)
{
    return e ? e->port : 0;
}

void http_endpoint_set_ready(http_endpoint *e, bool ready, const char *reason)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->ready = ready;
    snprintf(e->reason, sizeof(e->reason), "%s", reason ? reason : "");
    pthread_mutex_unlock(&e->lock);
}

void http_endpoint_set_ready_fn(http_endpoint *e, http_ready_fn fn, void *arg)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->ready_fn = fn;
    e->ready_arg = arg;
    pthread_mutex_unlock(&e->lock);
}

void http_endpoint_set_detail_fn(http_endpoint *e, http_detail_fn fn, void *arg)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->detail_fn = fn;
    e->detail_arg = arg;
    pthread_mutex_unlock(&e->lock);
}

void http_endpoint_stop(http_endpoint *e)
{
    if (e == NULL)
        return;
    char b = 1;
    ssize_t w = write(e->wake[1], &b, 1);
    (void)w;
    pthread_join(e->thread, NULL);
    for (int i = 0; i < HTTP_MAX_CONNS; i++)
        conn_close(e, &e->conns[i]);
    if (e->metrics) {
        http_body *m = e->metrics;
        e->metrics = NULL;
        free(m->data);
        free(m);
    }
    close(e->lfd);
    close(e->wake[0]);
    close(e->wake[1]);
    pthread_mutex_destroy(&e->lock);
    free(e);
}
