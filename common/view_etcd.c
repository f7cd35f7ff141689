/* view_etcd.c - etcd's v3 HTTP/JSON gateway over a small blocking HTTP/1.1 client
 * (view_etcd.h; the view kept in it: view_record.c). */
#include "view_etcd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define ETCD_MAX_ENDPOINTS 16

#define ETCD_MAX_ADDRS 4

typedef struct endpoint {
    char host[280];
    char port[8];
    char name[320]; /* http://host:port */
    /* The addresses the host resolved to last (under the client's lock): calls connect to
     * them without asking DNS again, and resolve afresh only when none of them connects. */
    struct sockaddr_storage addr[ETCD_MAX_ADDRS];
    socklen_t addrlen[ETCD_MAX_ADDRS];
    int naddr;
} endpoint;

struct etcd_client {
    endpoint ep[ETCD_MAX_ENDPOINTS];
    int n_ep;
    int timeout_ms;
    atomic_int preferred; /* the endpoint that answered last */
    pthread_mutex_t lock; /* the endpoints' address caches */
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int etcd_client_create(etcd_client **out, const char *endpoints, int timeout_ms, char *err,
                       size_t errlen)
{
    *out = NULL;
    if (endpoints == NULL || endpoints[0] == '\0')
        return errf(err, errlen, "no etcd endpoint given (coordinator is empty)"), ETCD_EFAILED;
    if (timeout_ms < 1)
        timeout_ms = 1;
    etcd_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return errf(err, errlen, "out of memory"), ETCD_EFAILED;
    c->timeout_ms = timeout_ms;
    pthread_mutex_init(&c->lock, NULL);
    const char *p = endpoints;
    while (*p) {
        size_t len = strcspn(p, ",");
        char one[300];
        while (len > 0 && (*p == ' ' || *p == '\t'))
            p++, len--;
        size_t tl = len;
        while (tl > 0 && (p[tl - 1] == ' ' || p[tl - 1] == '\t'))
            tl--;
        if (tl == 0 || tl >= sizeof(one)) {
            errf(err, errlen, "coordinator \"%s\": %s endpoint", endpoints,
                 tl == 0 ? "an empty" : "a too long");
            free(c);
            return ETCD_EFAILED;
        }
        memcpy(one, p, tl);
        one[tl] = '\0';
        const char *hp = one;
        if (strncmp(one, "https://", 8) == 0) {
            errf(err, errlen,
                 "coordinator endpoint \"%s\": https is not supported (use http://, etcd's "
                 "client port on a trusted network)",
                 one);
            free(c);
            return ETCD_EFAILED;
        }
        if (strncmp(one, "http://", 7) == 0)
            hp += 7;
        else if (strstr(one, "://") != NULL) {
            errf(err, errlen, "coordinator endpoint \"%s\": not an http:// URL", one);
            free(c);
            return ETCD_EFAILED;
        }
        size_t hl = strcspn(hp, "/");
        if (hp[hl] == '/' && hp[hl + 1] != '\0') {
            errf(err, errlen, "coordinator endpoint \"%s\": a path is not allowed", one);
            free(c);
            return ETCD_EFAILED;
        }
        char hostport[280];
        snprintf(hostport, sizeof(hostport), "%.*s", (int)hl, hp);
        char *colon = strrchr(hostport, ':');
        char *host = hostport;
        if (c->n_ep == ETCD_MAX_ENDPOINTS || colon == NULL || colon == hostport ||
            colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
            strlen(colon + 1) > 5 || atoi(colon + 1) < 1 || atoi(colon + 1) > 65535) {
            errf(err, errlen,
                 c->n_ep == ETCD_MAX_ENDPOINTS
                     ? "coordinator: more than 16 endpoints"
                     : "coordinator endpoint \"%s\": expected http://host:port (port 1-65535)",
                 one);
            free(c);
            return ETCD_EFAILED;
        }
        *colon = '\0';
        if (host[0] == '[') { /* [::1] */
            size_t l = strlen(host);
            if (l < 3 || host[l - 1] != ']') {
                errf(err, errlen, "coordinator endpoint \"%s\": bad IPv6 address", one);
                free(c);
                return ETCD_EFAILED;
            }
            host[l - 1] = '\0';
            host++;
        }
        endpoint *e = &c->ep[c->n_ep++];
        snprintf(e->host, sizeof(e->host), "%s", host);
        snprintf(e->port, sizeof(e->port), "%s", colon + 1);
        snprintf(e->name, sizeof(e->name), "http://%s:%s", hp[0] == '[' ? hostport : host,
                 colon + 1);
        if (hp[0] == '[')
            snprintf(e->name, sizeof(e->name), "http://[%s]:%s", host, colon + 1);
        p += len;
        if (*p == ',')
            p++;
    }
    if (c->n_ep == 0) {
        free(c);
        return errf(err, errlen, "no etcd endpoint given (coordinator is empty)"), ETCD_EFAILED;
    }
    *out = c;
    return 0;
}

void etcd_client_destroy(etcd_client *c)
{
    if (c == NULL)
        return;
    pthread_mutex_destroy(&c->lock);
    free(c);
}

const char *etcd_client_endpoint(const etcd_client *c)
{
    return c->ep[atomic_load(&((etcd_client *)c)->preferred)].name;
}

/* ---- HTTP ---- */

/* Waits until fd is ready for events or the deadline passes: 0, or -1 with errno ETIMEDOUT. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {.fd = fd, .events = events};
        int r = poll(&pfd, 1, (int)left);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* getaddrinfo has no deadline: a slow or unanswering DNS server (a container network's, on a
 * loaded machine) would hold a lease renewal past the lease. A resolver thread does it; the
 * caller waits until its deadline and, if the answer is late, leaves it to the thread. */
typedef struct resolve_job {
    pthread_mutex_t lock;
    pthread_cond_t done_cv;
    int refs; /* the caller's and the thread's */
    bool done;
    int rc;
    struct addrinfo *res;
    char host[280], port[8];
} resolve_job;

static void job_release(resolve_job *j)
{
    pthread_mutex_lock(&j->lock);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->lock);
    if (last) {
        if (j->res)
            freeaddrinfo(j->res);
        pthread_cond_destroy(&j->done_cv);
        pthread_mutex_destroy(&j->lock);
        free(j);
    }
}

static void *resolve_main(void *arg)
{
    resolve_job *j = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(j->host, j->port, &hints, &res);
    pthread_mutex_lock(&j->lock);
    j->rc = rc;
    j->res = rc == 0 ? res : NULL;
    j->done = true;
    pthread_cond_signal(&j->done_cv);
    pthread_mutex_unlock(&j->lock);
    job_release(j);
    return NULL;
}

/* Resolves e's host into its address cache before the deadline: 0, or -1 with err set. */
static int resolve(etcd_client *c, endpoint *e, int64_t deadline, char *err, size_t errlen)
{
    resolve_job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return errf(err, errlen, "out of memory resolving %s", e->host);
    pthread_mutex_init(&j->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(j->host, sizeof(j->host), "%s", e->host);
    snprintf(j->port, sizeof(j->port), "%s", e->port);
    j->refs = 2;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int pe = pthread_create(&th, &attr, resolve_main, j);
    pthread_attr_destroy(&attr);
    if (pe != 0) {
        j->refs = 1;
        job_release(j);
        return errf(err, errlen, "cannot resolve %s: no thread for it: %s", e->host, strerror(pe));
    }
    struct timespec until = {(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
    pthread_mutex_lock(&j->lock);
    while (!j->done && pthread_cond_timedwait(&j->done_cv, &j->lock, &until) != ETIMEDOUT)
        ;
    bool done = j->done;
    int rc = j->rc;
    int n = 0;
    if (done && rc == 0) {
        pthread_mutex_lock(&c->lock);
        for (struct addrinfo *a = j->res; a != NULL && n < ETCD_MAX_ADDRS; a = a->ai_next) {
            if (a->ai_addrlen > sizeof(e->addr[n]))
                continue;
            memcpy(&e->addr[n], a->ai_addr, a->ai_addrlen);
            e->addrlen[n] = a->ai_addrlen;
            n++;
        }
        e->naddr = n;
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&j->lock);
    job_release(j);
    if (!done)
        return errf(err, errlen, "cannot resolve %s: no answer from DNS within the deadline",
                    e->host);
    if (rc != 0)
        return errf(err, errlen, "cannot resolve %s: %s", e->host, gai_strerror(rc));
    if (n == 0)
        return errf(err, errlen, "cannot resolve %s: no usable address", e->host);
    return 0;
}

/* Connects to one of the cached addresses: the fd, or -1 with *saved set to the last errno. */
static int connect_cached(etcd_client *c, endpoint *e, int64_t deadline, int *saved)
{
    struct sockaddr_storage addr[ETCD_MAX_ADDRS];
    socklen_t len[ETCD_MAX_ADDRS];
    pthread_mutex_lock(&c->lock);
    int n = e->naddr;
    memcpy(addr, e->addr, sizeof(addr));
    memcpy(len, e->addrlen, sizeof(len));
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < n; i++) {
        int fd = socket(addr[i].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *saved = errno;
            continue;
        }
        if (connect(fd, (struct sockaddr *)&addr[i], len[i]) == 0)
            return fd;
        if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0) {
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr == 0)
                return fd;
            errno = soerr;
        }
        *saved = errno;
        close(fd);
    }
    return -1;
}

/* Connects to e: its cached addresses first; when none answers (or none is known), the host is
 * resolved again, within the deadline, and tried once more. */
static int connect_to(etcd_client *c, endpoint *e, int64_t deadline, char *err, size_t errlen)
{
    int saved = 0;
    pthread_mutex_lock(&c->lock);
    bool known = e->naddr > 0;
    pthread_mutex_unlock(&c->lock);
    if (known) {
        int fd = connect_cached(c, e, deadline, &saved);
        if (fd >= 0)
            return fd;
        if (mono_ms() >= deadline)
            return errf(err, errlen, "cannot connect: timed out");
    }
    if (resolve(c, e, deadline, err, errlen) != 0)
        return -1;
    int fd = connect_cached(c, e, deadline, &saved);
    if (fd < 0)
        return errf(err, errlen, "cannot connect: %s",
                    saved == ETIMEDOUT ? "timed out" : strerror(saved));
    return fd;
}

typedef struct growbuf {
    char *p;
    size_t len, cap;
} growbuf;

static int buf_reserve(growbuf *b, size_t more)
{
    if (b->len + more + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Decodes a chunked body in place; returns its length, or -1 when it is malformed. */
static long dechunk(char *body, size_t len)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *end;
        if (in >= len)
            return -1;
        unsigned long n = strtoul(body + in, &end, 16);
        char *crlf = memmem(body + in, len - in, "\r\n", 2);
        if (crlf == NULL || end == body + in)
            return -1;
        in = (size_t)(crlf - body) + 2;
        if (n == 0)
            return (long)out;
        if (n > len - in)
            return -1;
        memmove(body + out, body + in, n);
        out += n;
        in += n;
        if (len - in < 2 || body[in] != '\r' || body[in + 1] != '\n')
            return -1;
        in += 2;
    }
}

/* One POST to one endpoint. Returns the HTTP status with the body in *out (NUL-terminated,
 * caller frees), or -1 for a transport failure (err says which). */
static int http_post(etcd_client *c, endpoint *e, int timeout_ms, const char *path,
                     const char *body, char **out, char *err, size_t errlen)
{
    *out = NULL;
    int64_t deadline = mono_ms() + timeout_ms;
    int fd = connect_to(c, e, deadline, err, errlen);
    if (fd < 0)
        return -1;
    size_t blen = strlen(body);
    char head[600];
    int hl = snprintf(head, sizeof(head),
                      "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      path, e->host, e->port, blen);
    const char *parts[2] = {head, body};
    size_t lens[2] = {(size_t)hl, blen};
    for (int k = 0; k < 2; k++) {
        size_t off = 0;
        while (off < lens[k]) {
            ssize_t w = send(fd, parts[k] + off, lens[k] - off, MSG_NOSIGNAL);
            if (w > 0) {
                off += (size_t)w;
                continue;
            }
            if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
                if (wait_fd(fd, POLLOUT, deadline) == 0)
                    continue;
            }
            int saved = errno;
            close(fd);
            return errf(err, errlen, "cannot send: %s",
                        saved == ETIMEDOUT ? "timed out" : strerror(saved));
        }
    }
    growbuf b = {0};
    for (;;) {
        if (b.len > ETCD_MAX_BODY + 16384) {
            close(fd);
            free(b.p);
            return errf(err, errlen, "answer larger than %u bytes", ETCD_MAX_BODY);
        }
        if (buf_reserve(&b, 16384) != 0) {
            close(fd);
            free(b.p);
            return errf(err, errlen, "out of memory");
        }
        ssize_t r = recv(fd, b.p + b.len, b.cap - b.len - 1, 0);
        if (r > 0) {
            b.len += (size_t)r;
            continue;
        }
        if (r == 0)
            break;
        if ((errno == EAGAIN || errno == EINTR) && wait_fd(fd, POLLIN, deadline) == 0)
            continue;
        int saved = errno;
        close(fd);
        free(b.p);
        return errf(err, errlen, "no answer: %s",
                    saved == ETIMEDOUT ? "timed out" : strerror(saved));
    }
    close(fd);
    if (b.p == NULL)
        return errf(err, errlen, "connection closed without an answer");
    b.p[b.len] = '\0';
    int status = 0;
    char *hend = memmem(b.p, b.len, "\r\n\r\n", 4);
    if (strncmp(b.p, "HTTP/1.", 7) != 0 || sscanf(b.p + 8, " %d", &status) != 1 || status < 100 ||
        status > 599 || hend == NULL) {
        free(b.p);
        return errf(err, errlen, "not an HTTP answer");
    }
    *hend = '\0';
    char *bodyp = hend + 4;
    size_t bodylen = b.len - (size_t)(bodyp - b.p);
    bool chunked = false;
    long clen = -1;
    for (char *line = strstr(b.p, "\r\n"); line != NULL; line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (strncasecmp(h, "transfer-encoding:", 18) == 0 && strcasestr(h, "chunked") != NULL)
            chunked = true;
        else if (strncasecmp(h, "content-length:", 15) == 0)
            clen = strtol(h + 15, NULL, 10);
    }
    if (chunked) {
        long n = dechunk(bodyp, bodylen);
        if (n < 0) {
            free(b.p);
            return errf(err, errlen, "malformed chunked answer");
        }
        bodylen = (size_t)n;
    } else if (clen >= 0) {
        if ((size_t)clen > bodylen) {
            free(b.p);
            return errf(err, errlen, "answer cut short (%zu of %ld bytes)", bodylen, clen);
        }
        bodylen = (size_t)clen;
    }
    memmove(b.p, bodyp, bodylen);
    b.p[bodylen] = '\0';
    *out = b.p;
    return status;
}

/* POSTs body to path, trying the endpoints from the preferred one on. On an answer of etcd
 * returns 0 with the parsed JSON in *res (caller puts), or ETCD_EFAILED / ETCD_ELEASE for an
 * error answer; ETCD_EUNREACHABLE when no endpoint answered. */
static int etcd_call(etcd_client *c, const char *path, json_object *req, json_object **res,
                     char *err, size_t errlen)
{
    *res = NULL;
    const char *body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    int first = atomic_load(&c->preferred);
    char all[1024] = "";
    size_t used = 0;
    for (int k = 0; k < c->n_ep; k++) {
        int i = (first + k) % c->n_ep;
        char e1[300];
        char *text = NULL;
        int status = http_post(c, &c->ep[i], c->timeout_ms, path, body, &text, e1, sizeof(e1));
        if (status < 0) {
            used += (size_t)snprintf(all + used, used < sizeof(all) ? sizeof(all) - used : 0,
                                     "%s%s: %s", used ? "; " : "", c->ep[i].name, e1);
            if (used >= sizeof(all))
                used = sizeof(all) - 1;
            continue;
        }
        atomic_store(&c->preferred, i);
        json_tokener *tok = json_tokener_new();
        json_object *j = tok ? json_tokener_parse_ex(tok, text, (int)strlen(text)) : NULL;
        bool complete = tok && json_tokener_get_error(tok) == json_tokener_success;
        json_tokener_free(tok);
        if (j == NULL || !complete || !json_object_is_type(j, json_type_object)) {
            char q[200];
            errf(err, errlen, "etcd %s%s: HTTP %d with a body that is not a JSON object: %s",
                 c->ep[i].name, path, status, quote_text(q, sizeof(q), text, 160));
            json_object_put(j);
            free(text);
            return ETCD_EFAILED;
        }
        free(text);
        json_object *e;
        if (status != 200 || json_object_object_get_ex(j, "error", &e)) {
            json_object *code = NULL;
            json_object_object_get_ex(j, "code", &code);
            const char *msg = json_object_object_get_ex(j, "message", &e) ||
                                      json_object_object_get_ex(j, "error", &e)
                                  ? json_object_get_string(e)
                                  : "no message";
            errf(err, errlen, "etcd %s%s: HTTP %d: %s (code %d)", c->ep[i].name, path, status, msg,
                 code ? json_object_get_int(code) : 0);
            int rc = strstr(msg, "lease not found") ? ETCD_ELEASE : ETCD_EFAILED;
            json_object_put(j);
            return rc;
        }
        *res = j;
        return 0;
    }
    errf(err, errlen, "etcd unreachable: %s", all);
    return ETCD_EUNREACHABLE;
}

/* ---- base64 (keys and values travel base64-encoded in the gateway's JSON) ---- */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const void *data, size_t len)
{
    const unsigned char *s = data;
    char *out = malloc(4 * ((len + 2) / 3) + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < len)
            v |= s[i + 2];
        *o++ = b64chars[(v >> 18) & 63];
        *o++ = b64chars[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64chars[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* Decodes text into a new NUL-terminated buffer; NULL when it is not base64 (or no memory). */
static char *b64_decode(const char *text, size_t *len)
{
    size_t n = strlen(text);
    if (n % 4 != 0)
        return NULL;
    char *out = malloc(n / 4 * 3 + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            char ch = text[i + k];
            const char *at = ch ? strchr(b64chars, ch) : NULL;
            if (ch == '=' && i + 4 == n && k >= 2) {
                pad++;
                v <<= 6;
                continue;
            }
            if (at == NULL || pad) {
                free(out);
                return NULL;
            }
            v = (v << 6) | (uint32_t)(at - b64chars);
        }
        out[o++] = (char)(v >> 16);
        if (pad < 2)
            out[o++] = (char)(v >> 8);
        if (pad < 1)
            out[o++] = (char)v;
    }
    out[o] = '\0';
    if (len)
        *len = o;
    return out;
}

/* ---- JSON helpers ---- */

static json_object *j_b64(const void *data, size_t len)
{
    char *s = b64_encode(data, len);
    json_object *j = s ? json_object_new_string(s) : NULL;
    free(s);
    return j;
}

/* The gateway writes 64-bit numbers as strings and leaves out zero values. */
static int64_t j_int64(json_object *obj, const char *field)
{
    json_object *f;
    if (obj == NULL || !json_object_object_get_ex(obj, field, &f))
        return 0;
    return json_object_get_int64(f);
}

static json_object *j_obj(json_object *obj, const char *field)
{
    json_object *f;
    return obj && json_object_object_get_ex(obj, field, &f) ? f : NULL;
}

static char *int64_str(int64_t v, char *buf)
{
    sprintf(buf, "%" PRId64, v);
    return buf;
}

/* ---- leases ---- */

int etcd_lease_grant(etcd_client *c, int64_t ttl_ms, int64_t *lease_id, int64_t *ttl_s, char *err,
                     size_t errlen)
{
    int64_t ttl = (ttl_ms + 999) / 1000;
    if (ttl < 1)
        ttl = 1;
    char n[24];
    json_object *req = json_object_new_object(), *res;
    json_object_object_add(req, "TTL", json_object_new_string(int64_str(ttl, n)));
    int rc = etcd_call(c, "/v3/lease/grant", req, &res, err, errlen);
    json_object_put(req);
    if (rc != 0)
        return rc;
    *lease_id = j_int64(res, "ID");
    if (ttl_s)
        *ttl_s = j_int64(res, "TTL");
    if (*lease_id == 0) {
        errf(err, errlen, "etcd %s/v3/lease/grant: the answer carries no lease ID (%s)",
             etcd_client_endpoint(c), json_object_get_string(j_obj(res, "error")));
        rc = ETCD_EFAILED;
    }
    json_object_put(res);
    return rc;
}

int etcd_lease_keepalive(etcd_client *c, int64_t lease_id, int64_t *ttl_s, char *err, size_t errlen)
{
    char n[24];
    json_object *req = json_object_new_object(), *res;
    json_object_object_add(req, "ID", json_object_new_string(int64_str(lease_id, n)));
    int rc = etcd_call(c, "/v3/lease/keepalive", req, &res, err, errlen);
    json_object_put(req);
    if (rc != 0)
        return rc;
    /* A stream of results; with one request there is one: {"result":{"ID":..,"TTL":..}}. */
    json_object *r = j_obj(res, "result");
    int64_t ttl = j_int64(r, "TTL");
    if (r == NULL)
        rc = (errf(err, errlen, "etcd %s/v3/lease/keepalive: no result in the answer",
                   etcd_client_endpoint(c)),
              ETCD_EFAILED);
    else if (ttl <= 0)
        rc = (errf(err, errlen, "etcd %s: lease %" PRId64 " has expired", etcd_client_endpoint(c),
                   lease_id),
              ETCD_ELEASE);
    if (ttl_s)
        *ttl_s = ttl;
    json_object_put(res);
    return rc;
}

int etcd_lease_revoke(etcd_client *c, int64_t lease_id, char *err, size_t errlen)
{
    char n[24];
    json_object *req = json_object_new_object(), *res;
    json_object_object_add(req, "ID", json_object_new_string(int64_str(lease_id, n)));
    int rc = etcd_call(c, "/v3/lease/revoke", req, &res, err, errlen);
    json_object_put(req);
    json_object_put(res);
    return rc;
}

/* ---- keys ---- */

int etcd_put(etcd_client *c, const char *key, const void *value, size_t vlen, int64_t lease_id,
             char *err, size_t errlen)
{
    char n[24];
    json_object *req = json_object_new_object(), *res;
    json_object_object_add(req, "key", j_b64(key, strlen(key)));
    json_object_object_add(req, "value", j_b64(value, vlen));
    if (lease_id != 0)
        json_object_object_add(req, "lease", json_object_new_string(int64_str(lease_id, n)));
    int rc = etcd_call(c, "/v3/kv/put", req, &res, err, errlen);
    json_object_put(req);
    json_object_put(res);
    return rc;
}

int etcd_delete(etcd_client *c, const char *key, char *err, size_t errlen)
{
    json_object *req = json_object_new_object(), *res;
    json_object_object_add(req, "key", j_b64(key, strlen(key)));
    int rc = etcd_call(c, "/v3/kv/deleterange", req, &res, err, errlen);
    json_object_put(req);
    json_object_put(res);
    return rc;
}

void etcd_kvs_free(etcd_kv *kvs, size_t n)
{
    for (size_t i = 0; kvs && i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    free(kvs);
}

/* Range request for key (..range_end when range_end is not NULL); fills *kvs. */
static int etcd_range(etcd_client *c, const char *key, const char *range_end, etcd_kv **kvs,
                      size_t *n, char *err, size_t errlen)
{
    *kvs = NULL;
    *n = 0;
    json_object *req = json_object_new_object(), *res;
    json_object_object_add(req, "key", j_b64(key, strlen(key)));
    if (range_end)
        json_object_object_add(req, "range_end", j_b64(range_end, strlen(range_end)));
    int rc = etcd_call(c, "/v3/kv/range", req, &res, err, errlen);
    json_object_put(req);
    if (rc != 0)
        return rc;
    json_object *arr = j_obj(res, "kvs");
    size_t cnt =
        arr && json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
    if (cnt > 0) {
        *kvs = calloc(cnt, sizeof(etcd_kv));
        if (*kvs == NULL)
            rc = (errf(err, errlen, "out of memory"), ETCD_EFAILED);
    }
    for (size_t i = 0; rc == 0 && i < cnt; i++) {
        json_object *kv = json_object_array_get_idx(arr, i);
        etcd_kv *o = &(*kvs)[i];
        json_object *k = j_obj(kv, "key"), *v = j_obj(kv, "value");
        o->key = k ? b64_decode(json_object_get_string(k), NULL) : NULL;
        o->value = b64_decode(v ? json_object_get_string(v) : "", &o->vlen);
        o->mod_rev = j_int64(kv, "mod_revision");
        o->lease = j_int64(kv, "lease");
        *n = i + 1;
        if (o->key == NULL || o->value == NULL)
            rc = (errf(err, errlen, "etcd %s/v3/kv/range: a key or value is not base64",
                       etcd_client_endpoint(c)),
                  ETCD_EFAILED);
    }
    json_object_put(res);
    if (rc != 0) {
        etcd_kvs_free(*kvs, *n);
        *kvs = NULL;
        *n = 0;
    }
    return rc;
}

int etcd_get(etcd_client *c, const char *key, char **value, size_t *vlen, int64_t *mod_rev,
             char *err, size_t errlen)
{
    etcd_kv *kvs;
    size_t n;
    *value = NULL;
    int rc = etcd_range(c, key, NULL, &kvs, &n, err, errlen);
    if (rc != 0)
        return rc;
    if (n == 0) {
        char q[300];
        errf(err, errlen, "etcd %s: no key %s", etcd_client_endpoint(c),
             quote_text(q, sizeof(q), key, 256));
        return ETCD_ENOTFOUND;
    }
    *value = kvs[0].value;
    kvs[0].value = NULL;
    if (vlen)
        *vlen = kvs[0].vlen;
    if (mod_rev)
        *mod_rev = kvs[0].mod_rev;
    etcd_kvs_free(kvs, n);
    return 0;
}

int etcd_get_prefix(etcd_client *c, const char *prefix, etcd_kv **kvs, size_t *n, char *err,
                    size_t errlen)
{
    size_t len = strlen(prefix);
    if (len == 0 || (unsigned char)prefix[len - 1] == 0xff)
        return errf(err, errlen, "bad key prefix"), ETCD_EFAILED;
    char *end = strdup(prefix);
    if (end == NULL)
        return errf(err, errlen, "out of memory"), ETCD_EFAILED;
    end[len - 1] = (char)((unsigned char)end[len - 1] + 1);
    int rc = etcd_range(c, prefix, end, kvs, n, err, errlen);
    free(end);
    return rc;
}

int etcd_cas(etcd_client *c, const char *key, int64_t expect_mod_rev, const void *value,
             size_t vlen, int64_t *new_rev, char *err, size_t errlen)
{
    char num[24];
    json_object *req = json_object_new_object(), *res;
    json_object *cmp = json_object_new_object(), *cmps = json_object_new_array();
    json_object_object_add(cmp, "key", j_b64(key, strlen(key)));
    json_object_object_add(cmp, "target", json_object_new_string("MOD"));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    json_object_object_add(cmp, "mod_revision",
                           json_object_new_string(int64_str(expect_mod_rev, num)));
    json_object_array_add(cmps, cmp);
    json_object_object_add(req, "compare", cmps);
    json_object *put = json_object_new_object(), *op = json_object_new_object();
    json_object_object_add(put, "key", j_b64(key, strlen(key)));
    json_object_object_add(put, "value", j_b64(value, vlen));
    json_object_object_add(op, "request_put", put);
    json_object *ops = json_object_new_array();
    json_object_array_add(ops, op);
    json_object_object_add(req, "success", ops);
    int rc = etcd_call(c, "/v3/kv/txn", req, &res, err, errlen);
    json_object_put(req);
    if (rc != 0)
        return rc;
    json_object *ok = j_obj(res, "succeeded");
    if (ok == NULL || !json_object_get_boolean(ok)) {
        char q[300];
        rc = (errf(err, errlen, "etcd %s: %s changed since revision %" PRId64,
                   etcd_client_endpoint(c), quote_text(q, sizeof(q), key, 256), expect_mod_rev),
              ETCD_ECONFLICT);
    } else if (new_rev) {
        *new_rev = j_int64(j_obj(res, "header"), "revision");
    }
    json_object_put(res);
    return rc;
}
