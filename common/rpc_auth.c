/* Who may call the RPC server (rpc_auth.h): the admin role and the TLS connection policy. */
#include "rpc_auth.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "rpc_server_internal.h"
#include "status.h"

/* ---- the admin role ---- */

/* The peer address of a pipe as text ("10.0.0.7:51234"), "unknown" if not available. */
static void pipe_peer(nng_pipe p, char *buf, size_t cap, bool *loopback)
{
    nng_sockaddr sa;
    char ip[INET6_ADDRSTRLEN] = "";
    *loopback = false;
    snprintf(buf, cap, "unknown peer");
    if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
        return;
    switch (sa.s_family) {
    case NNG_AF_INET:
        inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip));
        snprintf(buf, cap, "%s:%u", ip, ntohs(sa.s_in.sa_port));
        *loopback = (ntohl(sa.s_in.sa_addr) >> 24) == 127;
        break;
    case NNG_AF_INET6: {
        static const uint8_t lo6[16] = {[15] = 1};
        static const uint8_t v4mapped[12] = {[10] = 0xff, [11] = 0xff};
        inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip));
        snprintf(buf, cap, "[%s]:%u", ip, ntohs(sa.s_in6.sa_port));
        /* ::1, or 127.0.0.0/8 as a listener on [::] sees it (::ffff:127.x.y.z). */
        *loopback = memcmp(sa.s_in6.sa_addr, lo6, 16) == 0 ||
                    (memcmp(sa.s_in6.sa_addr, v4mapped, 12) == 0 && sa.s_in6.sa_addr[12] == 127);
        break;
    }
    case NNG_AF_IPC:
    case NNG_AF_INPROC:
    case NNG_AF_ABSTRACT:
        snprintf(buf, cap, "local (%s)", sa.s_family == NNG_AF_INPROC ? "inproc" : "ipc");
        *loopback = true; /* same host, guarded by the file system or the process */
        break;
    default:
        break;
    }
}

/* Constant-time comparison of the sent token with the server's. */
static bool token_equal(const uint8_t *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned diff = alen != blen;
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned)(b[i] ^ (i < alen ? a[i] : 0));
    return diff == 0;
}

bool rpc_auth_check_admin(rpc_call *c)
{
    const envelope *env = c->f.env;
    const char *tok = c->srv->cfg.admin_token;
    const char *name = c->method->name;
    char peer[96];
    bool loopback;
    if (c->req) {
        pipe_peer(nng_msg_get_pipe(c->req), peer, sizeof(peer), &loopback);
    } else {
        snprintf(peer, sizeof(peer), "in-process");
        loopback = false;
    }
    if (tok && tok[0]) {
        if (env->auth_token.len == 0) {
            log_warn("refused %s from %s: no admin token", name, peer);
            rpc_reply_error(c, STATUS_UNAUTHENTICATED,
                            "%s is an admin method and the request carries no admin token "
                            "(set admin-token-file on the client)",
                            name);
            return false;
        }
        if (!token_equal(env->auth_token.data, env->auth_token.len, tok)) {
            log_warn("refused %s from %s: wrong admin token", name, peer);
            rpc_reply_error(c, STATUS_PERMISSION_DENIED,
                            "%s is an admin method and the admin token sent does not match the "
                            "server's admin-token-file",
                            name);
            return false;
        }
        return true;
    }
    if (!loopback) {
        log_warn("refused %s from %s: admin methods are allowed from loopback only without an "
                 "admin-token-file",
                 name, peer);
        rpc_reply_error(c, STATUS_PERMISSION_DENIED,
                        "%s is an admin method, allowed only from loopback peers (this is %s) "
                        "while the server has no admin-token-file: set one on the server and "
                        "the client",
                        name, peer);
        return false;
    }
    return true;
}

bool rpc_call_check_admin(rpc_call *c)
{
    return c->srv->cfg.trusted || rpc_auth_check_admin(c);
}

bool rpc_call_carries_token(const rpc_call *c, const char *token)
{
    const envelope *env = c->f.env;
    return token && token[0] && env && env->auth_token.len > 0 &&
           token_equal(env->auth_token.data, env->auth_token.len, token);
}

/* ---- the TLS connection policy ---- */

/* The listener's authentication is OPTIONAL so that this can log the refusal: with REQUIRED,
 * mbed TLS refuses the handshake and nng 1.5 reports nothing at all. */
void rpc_auth_tls_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    rpc_server *s = arg;
    bool verified = false;
    int rv = nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified);
    if (ev != NNG_PIPE_EV_ADD_PRE || (rv == 0 && verified)) {
        /* one callback per event and socket: chain the connection count */
        rpc_conns_pipe_cb(p, ev, &s->conns);
        return;
    }
    char peer[96];
    bool loopback;
    pipe_peer(p, peer, sizeof(peer), &loopback);
    atomic_fetch_add(&s->conns.tls_refused, 1);
    uint64_t suppressed;
    double since_s;
    if (!rpc_conns_refusal_due(&s->conns, peer, &suppressed, &since_s)) {
        nng_pipe_close(p);
        return;
    }
    char more[96] = "";
    if (suppressed > 0)
        snprintf(more, sizeof(more),
                 " (and %llu more from this address in the last %.1f s, "
                 "not logged)",
                 (unsigned long long)suppressed, since_s);
    if (rv != 0)
        log_warn("refused TLS connection from %s: cannot tell whether its certificate was "
                 "verified: %s%s",
                 peer, nng_strerror(rv), more);
    else
        log_warn("refused TLS connection from %s: no client certificate, or one not verified "
                 "by tls-ca %s (signed by another CA, expired or not yet valid; nng 1.5 does "
                 "not say which)%s",
                 peer, s->cfg.tls.ca, more);
    nng_pipe_close(p);
}
