/* The credentials of RPC sockets, both ends (rpc_client.h): nng TLS configurations made from
 * the tls-* settings' files, tls+tcp:// URLs, and the admin token file. */
#include "rpc_client.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tls.h"

/* Reads a whole (small) file into a NUL-terminated buffer; NULL with err set on failure. */
static char *read_pem(const char *what, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read %s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1 || cap > (1u << 20))
            break;
        char *b = realloc(buf, cap * 2);
        if (b == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    if (buf == NULL || bad) {
        snprintf(err, errlen, "cannot read %s %s: %s", what, path,
                 buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

int rpc_tls_config(nng_tls_config **out, const rpc_tls *t, bool server, char *err, size_t errlen)
{
    nng_tls_config *cfg = NULL;
    char *cert = NULL, *key = NULL;
    int rv;
    if (tls_config_alloc(&cfg, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT, t->engine, err,
                         errlen) != 0)
        return -1;
    if ((rv = nng_tls_config_ca_file(cfg, t->ca)) != 0) {
        snprintf(err, errlen, "tls-ca %s: cannot load a PEM CA certificate from it: %s", t->ca,
                 nng_strerror(rv));
        goto fail;
    }
    bool has_cert = t->cert && t->cert[0], has_key = t->key && t->key[0];
    if (has_cert != has_key || (server && !has_cert)) {
        snprintf(err, errlen, "tls-ca is set but %s: set both tls-cert and tls-key%s",
                 !has_cert ? "tls-cert is not" : "tls-key is not",
                 server ? " (ps-server needs its own certificate)" : "");
        goto fail;
    }
    if (has_cert) {
        if ((cert = read_pem("tls-cert", t->cert, err, errlen)) == NULL ||
            (key = read_pem("tls-key", t->key, err, errlen)) == NULL)
            goto fail;
        if ((rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0) {
            snprintf(err, errlen,
                     "tls-cert %s / tls-key %s: not a PEM certificate and its unencrypted key: %s",
                     t->cert, t->key, nng_strerror(rv));
            goto fail;
        }
    }
    if (!server && t->server_name && t->server_name[0] &&
        (rv = nng_tls_config_server_name(cfg, t->server_name)) != 0) {
        snprintf(err, errlen, "tls-server-name %s: %s", t->server_name, nng_strerror(rv));
        goto fail;
    }
    /* A server verifies but accepts first, so that rpc_server can log and close a connection
     * without a valid certificate (nng reports nothing about a refused handshake). */
    rv = nng_tls_config_auth_mode(cfg,
                                  server ? NNG_TLS_AUTH_MODE_OPTIONAL : NNG_TLS_AUTH_MODE_REQUIRED);
    if (rv != 0) {
        snprintf(err, errlen, "cannot set the TLS authentication mode: %s", nng_strerror(rv));
        goto fail;
    }
    free(cert);
    free(key);
    *out = cfg;
    return 0;
fail:
    free(cert);
    free(key);
    nng_tls_config_free(cfg);
    return -1;
}

int rpc_tls_url(const char *url, bool tls, char *buf, size_t cap)
{
    int n;
    if (tls && strncmp(url, "tcp://", 6) == 0)
        n = snprintf(buf, cap, "tls+%s", url);
    else
        n = snprintf(buf, cap, "%s", url);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int rpc_read_token(const char *path, char *buf, size_t cap, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "admin-token-file %s: %s", path, strerror(errno));
        return -1;
    }
    bool got = fgets(buf, (int)cap, f) != NULL;
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad || !got) {
        snprintf(err, errlen, "admin-token-file %s: %s", path, bad ? "read error" : "empty file");
        return -1;
    }
    size_t n = strcspn(buf, "\r\n");
    if (buf[n] == '\0' && n == cap - 1) {
        snprintf(err, errlen, "admin-token-file %s: token longer than %zu bytes", path, cap - 2);
        return -1;
    }
    buf[n] = '\0';
    if (n == 0) {
        snprintf(err, errlen, "admin-token-file %s: the first line (the token) is empty", path);
        return -1;
    }
    if (strspn(buf, " \t\v\f") == n) {
        snprintf(err, errlen, "admin-token-file %s: the first line (the token) is only blanks",
                 path);
        return -1;
    }
    return 0;
}
