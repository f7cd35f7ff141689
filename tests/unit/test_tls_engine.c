/* The OpenSSL TLS engine (common/tls_openssl.c) through nng's TLS streams on loopback, with
 * certificates made here: what it offers to a plain OpenSSL peer (TLS 1.3, AES-GCM first on a
 * CPU with AES instructions, TLS 1.2 with an ECDHE AEAD suite when the peer stops there), bytes
 * intact both ways at sizes spanning many records (TLS 1.3's records done in place by
 * tls_records.c: with each suite against a client that pads its records and asks for a
 * KeyUpdate, and on our client's side against a plain OpenSSL server that sends tickets), the
 * `verified` answer of authentication OPTIONAL for a client of the CA, one without a certificate,
 * one of another CA and an expired one (all complete the handshake), refusals by a client
 * (REQUIRED) of a server it does not trust or of the wrong name, interworking with nng's mbed TLS
 * engine both ways, a send that times out with the engine's buffer full (the next one fails or goes
 * out intact after what went before, never mixed with the first), and clear errors for an unknown
 * engine and bad PEM. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "tls.h"
#include "tls_openssl.h"

#define BULK (3u << 20) /* 3 MiB: ~190 records each way */

/* ---- certificates ---- */

typedef struct {
    EVP_PKEY *key;
    X509 *cert;
    char *key_pem, *cert_pem;
} ident;

static ident ca, other_ca, server_id, client_id, stranger_id, expired_id;

static char *pem_of(int (*write)(BIO *, void *), void *obj)
{
    BIO *b = BIO_new(BIO_s_mem());
    assert_non_null(b);
    assert_int_equal(write(b, obj), 1);
    char *data;
    long n = BIO_get_mem_data(b, &data);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    memcpy(s, data, (size_t)n);
    s[n] = '\0';
    BIO_free(b);
    return s;
}

static int write_key(BIO *b, void *k)
{
    return PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL);
}

static int write_cert(BIO *b, void *c)
{
    return PEM_write_bio_X509(b, c);
}

/* A P-256 key and a certificate for cn (also its DNS name), signed by issuer (NULL: itself, a
 * CA), valid from not_before to not_after days from now. */
static void make_ident(ident *id, const char *cn, const ident *issuer, long not_before,
                       long not_after)
{
    id->key = EVP_EC_gen("P-256");
    assert_non_null(id->key);
    X509 *c = X509_new();
    assert_non_null(c);
    static long serial = 1;
    ASN1_INTEGER_set(X509_get_serialNumber(c), serial++);
    X509_set_version(c, 2);
    X509_gmtime_adj(X509_getm_notBefore(c), not_before * 86400);
    X509_gmtime_adj(X509_getm_notAfter(c), not_after * 86400);
    X509_set_pubkey(c, id->key);
    X509_NAME *name = X509_get_subject_name(c);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(c, issuer ? X509_get_subject_name(issuer->cert) : name);
    X509V3_CTX v3;
    X509V3_set_ctx(&v3, issuer ? issuer->cert : c, c, NULL, NULL, 0);
    char san[128];
    snprintf(san, sizeof(san), "DNS:%s", cn);
    X509_EXTENSION *ext =
        X509V3_EXT_conf_nid(NULL, &v3, issuer ? NID_subject_alt_name : NID_basic_constraints,
                            issuer ? san : "critical,CA:TRUE");
    assert_non_null(ext);
    X509_add_ext(c, ext, -1);
    X509_EXTENSION_free(ext);
    assert_true(X509_sign(c, issuer ? issuer->key : id->key, EVP_sha256()) > 0);
    id->cert = c;
    id->key_pem = pem_of(write_key, id->key);
    id->cert_pem = pem_of(write_cert, id->cert);
}

static void free_ident(ident *id)
{
    EVP_PKEY_free(id->key);
    X509_free(id->cert);
    free(id->key_pem);
    free(id->cert_pem);
}

static int setup_certs(void **state)
{
    (void)state;
    make_ident(&ca, "ca", NULL, -1, 3);
    make_ident(&other_ca, "other-ca", NULL, -1, 3);
    make_ident(&server_id, "ps-server", &ca, -1, 2);
    make_ident(&client_id, "worker-0", &ca, -1, 2);
    make_ident(&stranger_id, "worker-0", &other_ca, -1, 2);
    make_ident(&expired_id, "worker-0", &ca, -10, -9);
    return 0;
}

static int teardown_certs(void **state)
{
    (void)state;
    ident *all[] = {&ca, &other_ca, &server_id, &client_id, &stranger_id, &expired_id};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        free_ident(all[i]);
    return 0;
}

/* ---- nng ends ---- */

/* A TLS configuration of engine: trusts trust (NULL: no CA), presents id (NULL: nothing). */
static nng_tls_config *config(nng_tls_mode mode, const char *engine, const ident *trust,
                              const ident *id, nng_tls_auth_mode auth)
{
    nng_tls_config *cfg;
    char err[256];
    assert_int_equal(tls_config_alloc(&cfg, mode, engine, err, sizeof(err)), 0);
    if (trust)
        assert_int_equal(nng_tls_config_ca_chain(cfg, trust->cert_pem, NULL), 0);
    if (id)
        assert_int_equal(nng_tls_config_own_cert(cfg, id->cert_pem, id->key_pem, NULL), 0);
    assert_int_equal(nng_tls_config_auth_mode(cfg, auth), 0);
    return cfg;
}

/* A listener of engine on 127.0.0.1 (authentication OPTIONAL, as ps-server's); *port gets its
 * port. */
static nng_stream_listener *listen_on(const char *engine, int *port)
{
    nng_stream_listener *l;
    assert_int_equal(nng_stream_listener_alloc(&l, "tls+tcp://127.0.0.1:0"), 0);
    nng_tls_config *cfg =
        config(NNG_TLS_MODE_SERVER, engine, &ca, &server_id, NNG_TLS_AUTH_MODE_OPTIONAL);
    assert_int_equal(nng_stream_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg), 0);
    nng_tls_config_free(cfg);
    assert_int_equal(nng_stream_listener_listen(l), 0);
    assert_int_equal(nng_stream_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, port), 0);
    return l;
}

static void pattern(uint8_t *buf, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        buf[i] = (uint8_t)(seed >> 16);
    }
}

/* Receives exactly n bytes (several calls: a TLS stream returns what it has). */
static int stream_recv_all(nng_stream *s, uint8_t *buf, size_t n)
{
    nng_aio *aio;
    assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_aio_set_timeout(aio, 10000);
    int rv = 0;
    for (size_t got = 0; got < n && rv == 0;) {
        nng_iov iov = {.iov_buf = buf + got, .iov_len = n - got};
        nng_aio_set_iov(aio, 1, &iov);
        nng_stream_recv(s, aio);
        nng_aio_wait(aio);
        if ((rv = nng_aio_result(aio)) == 0)
            got += nng_aio_count(aio);
    }
    nng_aio_free(aio);
    return rv;
}

static int stream_send_all(nng_stream *s, const uint8_t *buf, size_t n)
{
    nng_aio *aio;
    assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_aio_set_timeout(aio, 10000);
    int rv = 0;
    for (size_t sent = 0; sent < n && rv == 0;) {
        nng_iov iov = {.iov_buf = (void *)(buf + sent), .iov_len = n - sent};
        nng_aio_set_iov(aio, 1, &iov);
        nng_stream_send(s, aio);
        nng_aio_wait(aio);
        if ((rv = nng_aio_result(aio)) == 0)
            sent += nng_aio_count(aio);
    }
    nng_aio_free(aio);
    return rv;
}

/* ---- a plain OpenSSL client, in a thread ---- */

typedef struct {
    int port;
    const ident *id;   /* certificate presented; NULL: none */
    int max_version;   /* TLS1_2_VERSION or TLS1_3_VERSION */
    size_t bulk;       /* bytes sent, then read back (the server echoes them) */
    const char *suite; /* the only TLS 1.3 suite offered; NULL: all, ChaCha20 first */
    bool key_update;   /* asks for a KeyUpdate after the first byte */
    size_t padding;    /* pads records to a multiple of this (0: none) */
    int handshake_ok;  /* out */
    int version;       /* out: SSL_version */
    char cipher[64];   /* out */
    int echo_ok;       /* out: the bytes came back intact */
} raw_client;

static void *raw_client_run(void *arg)
{
    raw_client *rc = arg;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(ctx, rc->max_version);
    /* ChaCha20 first on our side: the server's order must win. */
    SSL_CTX_set_ciphersuites(ctx, rc->suite ? rc->suite
                                            : "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384:"
                                              "TLS_AES_128_GCM_SHA256");
    if (rc->padding > 0)
        SSL_CTX_set_block_padding(ctx, rc->padding);
    SSL_CTX_set_cipher_list(ctx, "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES256-GCM-SHA384:"
                                 "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-SHA");
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca.cert);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (rc->id) {
        SSL_CTX_use_certificate(ctx, rc->id->cert);
        SSL_CTX_use_PrivateKey(ctx, rc->id->key);
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)rc->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        goto out;
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set1_host(ssl, "ps-server");
    SSL_set_tlsext_host_name(ssl, "ps-server");
    if (SSL_connect(ssl) == 1) {
        rc->handshake_ok = 1;
        rc->version = SSL_version(ssl);
        snprintf(rc->cipher, sizeof(rc->cipher), "%s", SSL_get_cipher_name(ssl));
        uint8_t *out = malloc(rc->bulk + 1), *back = malloc(rc->bulk + 1);
        pattern(out, rc->bulk + 1, 7);
        size_t n = 0, done = 0;
        /* A first byte, then the rest: the server has read and judged us before we wait. */
        int ok = SSL_write_ex(ssl, out, 1, &n) == 1 &&
                 (!rc->key_update || SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) == 1) &&
                 SSL_write_ex(ssl, out + 1, rc->bulk, &n);
        while (ok && done < rc->bulk + 1) {
            ok = SSL_read_ex(ssl, back + done, rc->bulk + 1 - done, &n) == 1;
            done += ok ? n : 0;
        }
        rc->echo_ok = ok && memcmp(out, back, rc->bulk + 1) == 0;
        free(out);
        free(back);
        SSL_shutdown(ssl);
    }
    SSL_free(ssl);
out:
    if (fd >= 0)
        close(fd);
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return NULL;
}

/* Runs a raw client against an OpenSSL-engine listener that echoes what it receives;
 * *verified gets the server's NNG_OPT_TLS_VERIFIED. */
static void serve_raw(raw_client *rc, bool *verified)
{
    nng_stream_listener *l = listen_on("openssl", &rc->port);
    nng_aio *aio;
    assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_aio_set_timeout(aio, 10000);
    nng_stream_listener_accept(l, aio);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, raw_client_run, rc), 0);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);
    nng_stream *s = nng_aio_get_output(aio, 0);
    size_t n = rc->bulk + 1;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    assert_int_equal(stream_recv_all(s, buf, 1), 0);
    assert_int_equal(nng_stream_get_bool(s, NNG_OPT_TLS_VERIFIED, verified), 0);
    assert_int_equal(stream_recv_all(s, buf + 1, n - 1), 0);
    assert_int_equal(stream_send_all(s, buf, n), 0);
    pthread_join(t, NULL);
    free(buf);
    nng_stream_close(s);
    nng_stream_free(s);
    nng_aio_free(aio);
    nng_stream_listener_free(l);
}

static void test_offer_tls13(void **state)
{
    (void)state;
    raw_client rc = {.id = &client_id, .max_version = TLS1_3_VERSION, .bulk = BULK};
    bool verified = false;
    serve_raw(&rc, &verified);
    assert_true(rc.handshake_ok);
    assert_int_equal(rc.version, TLS1_3_VERSION);
    assert_string_equal(rc.cipher, tls_openssl_cpu_has_aes() ? "TLS_AES_128_GCM_SHA256"
                                                             : "TLS_CHACHA20_POLY1305_SHA256");
    assert_true(rc.echo_ok);
    assert_true(verified);
}

static void test_offer_tls12(void **state)
{
    (void)state;
    raw_client rc = {.id = &client_id, .max_version = TLS1_2_VERSION, .bulk = BULK};
    bool verified = false;
    serve_raw(&rc, &verified);
    assert_true(rc.handshake_ok);
    assert_int_equal(rc.version, TLS1_2_VERSION);
    assert_string_equal(rc.cipher, tls_openssl_cpu_has_aes() ? "ECDHE-ECDSA-AES128-GCM-SHA256"
                                                             : "ECDHE-ECDSA-CHACHA20-POLY1305");
    assert_true(rc.echo_ok);
    assert_true(verified);
}

/* TLS 1.3's other suites, done in place (tls_records.c), against a peer that pads its records
 * (so even the first byte's record does not fit the 1-byte read) and asks for a KeyUpdate
 * (answered with ours before the echo). */
static void test_tls13_suites(void **state)
{
    (void)state;
    static const struct {
        const char *suite;
        bool key_update;
        size_t padding;
    } cases[] = {{"TLS_CHACHA20_POLY1305_SHA256", true, 512},
                 {"TLS_AES_256_GCM_SHA384", true, 0},
                 {"TLS_AES_128_GCM_SHA256", false, 4096}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        raw_client rc = {.id = &client_id,
                         .max_version = TLS1_3_VERSION,
                         .bulk = BULK,
                         .suite = cases[i].suite,
                         .key_update = cases[i].key_update,
                         .padding = cases[i].padding};
        bool verified = false;
        serve_raw(&rc, &verified);
        assert_true(rc.handshake_ok);
        assert_string_equal(rc.cipher, cases[i].suite);
        assert_true(rc.echo_ok);
        assert_true(verified);
    }
}

/* ---- a plain OpenSSL server, in a thread ---- */

typedef struct {
    int fd;          /* listening socket */
    size_t bulk;     /* bytes read, then echoed */
    int echo_ok;     /* out: read and echoed them all */
    char cipher[64]; /* out */
} raw_server;

/* Accepts one connection, with OpenSSL's defaults for tickets (two NewSessionTickets after
 * the handshake), reads bulk bytes and echoes them. */
static void *raw_server_run(void *arg)
{
    raw_server *rs = arg;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate(ctx, server_id.cert);
    SSL_CTX_use_PrivateKey(ctx, server_id.key);
    int fd = accept(rs->fd, NULL, NULL);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    uint8_t *buf = malloc(rs->bulk);
    size_t done = 0, n;
    int ok = fd >= 0 && buf != NULL && SSL_accept(ssl) == 1;
    if (ok)
        snprintf(rs->cipher, sizeof(rs->cipher), "%s", SSL_get_cipher_name(ssl));
    while (ok && done < rs->bulk) {
        ok = SSL_read_ex(ssl, buf + done, rs->bulk - done, &n) == 1;
        done += ok ? n : 0;
    }
    rs->echo_ok = ok && SSL_write_ex(ssl, buf, rs->bulk, &n) == 1 && n == rs->bulk;
    SSL_shutdown(ssl);
    SSL_free(ssl);
    free(buf);
    if (fd >= 0)
        close(fd);
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return NULL;
}

/* Our client against a plain OpenSSL server: TLS 1.3 records done in place on the client's
 * side, the server's tickets ignored, bytes intact both ways. */
static void test_client_to_raw_server(void **state)
{
    (void)state;
    raw_server rs = {.bulk = BULK};
    rs.fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(rs.fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(rs.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(rs.fd, 1), 0);
    assert_int_equal(getsockname(rs.fd, (struct sockaddr *)&sa, &sl), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, raw_server_run, &rs), 0);

    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    nng_stream_dialer *d;
    assert_int_equal(nng_stream_dialer_alloc(&d, url), 0);
    nng_tls_config *cfg =
        config(NNG_TLS_MODE_CLIENT, "openssl", &ca, &client_id, NNG_TLS_AUTH_MODE_REQUIRED);
    assert_int_equal(nng_tls_config_server_name(cfg, "ps-server"), 0);
    assert_int_equal(nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg), 0);
    nng_tls_config_free(cfg);
    nng_aio *dial;
    assert_int_equal(nng_aio_alloc(&dial, NULL, NULL), 0);
    nng_aio_set_timeout(dial, 10000);
    nng_stream_dialer_dial(d, dial);
    nng_aio_wait(dial);
    assert_int_equal(nng_aio_result(dial), 0);
    nng_stream *cs = nng_aio_get_output(dial, 0);
    uint8_t *out = malloc(BULK), *in = malloc(BULK);
    assert_non_null(out);
    assert_non_null(in);
    pattern(out, BULK, 31);
    assert_int_equal(stream_send_all(cs, out, BULK), 0);
    assert_int_equal(stream_recv_all(cs, in, BULK), 0);
    pthread_join(t, NULL);
    assert_true(rs.echo_ok);
    assert_memory_equal(out, in, BULK);
    assert_string_equal(rs.cipher, tls_openssl_cpu_has_aes() ? "TLS_AES_128_GCM_SHA256"
                                                             : "TLS_CHACHA20_POLY1305_SHA256");
    free(out);
    free(in);
    nng_stream_free(cs);
    nng_aio_free(dial);
    nng_stream_dialer_free(d);
    close(rs.fd);
}

/* OPTIONAL: every one completes the handshake; only a certificate of the CA is verified. */
static void test_optional_verified(void **state)
{
    (void)state;
    const ident *ids[] = {NULL, &stranger_id, &expired_id};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        for (int v = TLS1_2_VERSION; v <= TLS1_3_VERSION; v++) {
            raw_client rc = {.id = ids[i], .max_version = v, .bulk = 100};
            bool verified = true;
            serve_raw(&rc, &verified);
            assert_true(rc.handshake_ok);
            assert_true(rc.echo_ok);
            assert_false(verified);
        }
    }
}

/* ---- nng to nng: engines on both ends ---- */

typedef struct {
    nng_stream *s;
    const uint8_t *buf;
    size_t n;
    int rv;
} send_job;

static void *send_run(void *arg)
{
    send_job *j = arg;
    /* The sending thread stands for a host program's thread with an OpenSSL error of its own
     * queued: the engine must not take it for its own (nng runs the first write on the
     * caller's thread). */
    ERR_raise(ERR_LIB_USER, 42);
    j->rv = stream_send_all(j->s, j->buf, j->n);
    return NULL;
}

/* Dials a listener of server_engine with a client of client_engine trusting trust and
 * expecting name; returns the dial's result, and when it is 0 checks BULK bytes both ways and
 * the server's verified. */
static int pair_run(const char *server_engine, const char *client_engine, const ident *trust,
                    const char *name)
{
    int port;
    nng_stream_listener *l = listen_on(server_engine, &port);
    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    nng_stream_dialer *d;
    assert_int_equal(nng_stream_dialer_alloc(&d, url), 0);
    nng_tls_config *cfg =
        config(NNG_TLS_MODE_CLIENT, client_engine, trust, &client_id, NNG_TLS_AUTH_MODE_REQUIRED);
    assert_int_equal(nng_tls_config_server_name(cfg, name), 0);
    assert_int_equal(nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg), 0);
    nng_tls_config_free(cfg);
    nng_aio *acc, *dial;
    assert_int_equal(nng_aio_alloc(&acc, NULL, NULL), 0);
    assert_int_equal(nng_aio_alloc(&dial, NULL, NULL), 0);
    nng_aio_set_timeout(acc, 10000);
    nng_aio_set_timeout(dial, 10000);
    nng_stream_listener_accept(l, acc);
    nng_stream_dialer_dial(d, dial);
    nng_aio_wait(dial);
    nng_aio_wait(acc);
    assert_int_equal(nng_aio_result(dial), 0);
    assert_int_equal(nng_aio_result(acc), 0);
    nng_stream *cs = nng_aio_get_output(dial, 0), *ss = nng_aio_get_output(acc, 0);
    uint8_t *out = malloc(BULK), *in = malloc(BULK);
    assert_non_null(out);
    assert_non_null(in);
    pattern(out, BULK, 11);
    /* The client writes first; the handshake happens then. */
    send_job job = {.s = cs, .buf = out, .n = BULK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_run, &job), 0);
    int rv = stream_recv_all(ss, in, BULK);
    pthread_join(t, NULL);
    if (rv == 0 && job.rv == 0) {
        assert_memory_equal(out, in, BULK);
        bool verified = false;
        assert_int_equal(nng_stream_get_bool(ss, NNG_OPT_TLS_VERIFIED, &verified), 0);
        assert_true(verified);
        memset(in, 0, BULK);
        job = (send_job){.s = ss, .buf = out, .n = BULK};
        assert_int_equal(pthread_create(&t, NULL, send_run, &job), 0);
        assert_int_equal(stream_recv_all(cs, in, BULK), 0);
        pthread_join(t, NULL);
        assert_int_equal(job.rv, 0);
        assert_memory_equal(out, in, BULK);
    } else if (rv == 0) {
        rv = job.rv;
    }
    free(out);
    free(in);
    nng_stream_free(cs);
    nng_stream_free(ss);
    nng_aio_free(acc);
    nng_aio_free(dial);
    nng_stream_dialer_free(d);
    nng_stream_listener_free(l);
    return rv;
}

static void test_engines_interwork(void **state)
{
    (void)state;
    assert_int_equal(pair_run("openssl", "openssl", &ca, "ps-server"), 0);
#ifdef PSD_NNG_BUNDLED
    assert_int_equal(pair_run("openssl", "mbed", &ca, "ps-server"), 0);
    assert_int_equal(pair_run("mbed", "openssl", &ca, "ps-server"), 0);
#else
    /* The system's nng cannot register its mbed engine again once OpenSSL's was: refused with
     * a message saying so (tls.h). */
    nng_tls_config *cfg = NULL;
    char err[256] = "";
    assert_int_equal(tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT, "mbed", err, sizeof(err)), -1);
    assert_null(cfg);
    assert_non_null(strstr(err, "cannot switch back to mbed TLS"));
#endif
}

/* Connects an OpenSSL-engine client to an OpenSSL-engine listener with TLS up to max (an nng
 * version), and sends one byte through, so the handshake is over: *cs and *ss get the ends. */
static void pair_open(nng_tls_version max, nng_stream_listener **lp, nng_stream_dialer **dp,
                      nng_stream **cs, nng_stream **ss)
{
    int port;
    *lp = listen_on("openssl", &port);
    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    assert_int_equal(nng_stream_dialer_alloc(dp, url), 0);
    nng_tls_config *cfg =
        config(NNG_TLS_MODE_CLIENT, "openssl", &ca, &client_id, NNG_TLS_AUTH_MODE_REQUIRED);
    assert_int_equal(nng_tls_config_server_name(cfg, "ps-server"), 0);
    assert_int_equal(nng_tls_config_version(cfg, NNG_TLS_1_2, max), 0);
    assert_int_equal(nng_stream_dialer_set_ptr(*dp, NNG_OPT_TLS_CONFIG, cfg), 0);
    nng_tls_config_free(cfg);
    nng_aio *acc, *dial;
    assert_int_equal(nng_aio_alloc(&acc, NULL, NULL), 0);
    assert_int_equal(nng_aio_alloc(&dial, NULL, NULL), 0);
    nng_aio_set_timeout(acc, 10000);
    nng_aio_set_timeout(dial, 10000);
    nng_stream_listener_accept(*lp, acc);
    nng_stream_dialer_dial(*dp, dial);
    nng_aio_wait(dial);
    nng_aio_wait(acc);
    assert_int_equal(nng_aio_result(dial), 0);
    assert_int_equal(nng_aio_result(acc), 0);
    *cs = nng_aio_get_output(dial, 0);
    *ss = nng_aio_get_output(acc, 0);
    nng_aio_free(acc);
    nng_aio_free(dial);
    uint8_t one = 1;
    send_job job = {.s = *cs, .buf = &one, .n = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_run, &job), 0);
    assert_int_equal(stream_recv_all(*ss, &one, 1), 0);
    pthread_join(t, NULL);
    assert_int_equal(job.rv, 0);
}

/* A send times out while the engine's buffer is full (the peer reads nothing), then a different
 * buffer is sent: it must fail, or arrive intact right after some prefix of the first, never
 * with the first's bytes in it nor missing its own (an engine holding back part of the first
 * buffer to be "written again" would mix them). TLS 1.3 (records done in place) and TLS 1.2
 * (OpenSSL's records). */
static void test_send_after_timeout(void **state)
{
    (void)state;
    const size_t big = 32u << 20, small = 1u << 20; /* big: more than loopback TCP holds */
    uint8_t *a = malloc(big), *b = malloc(small), *in = malloc(big + small);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(in);
    pattern(a, big, 21);
    pattern(b, small, 22);
    nng_tls_version maxes[] = {NNG_TLS_1_3, NNG_TLS_1_2};
    for (size_t v = 0; v < sizeof(maxes) / sizeof(maxes[0]); v++) {
        nng_stream_listener *l;
        nng_stream_dialer *d;
        nng_stream *cs, *ss;
        pair_open(maxes[v], &l, &d, &cs, &ss);
        nng_aio *aio;
        assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
        nng_iov iov = {.iov_buf = a, .iov_len = big};
        nng_aio_set_iov(aio, 1, &iov);
        nng_aio_set_timeout(aio, 200);
        nng_stream_send(cs, aio);
        nng_aio_wait(aio);
        assert_int_not_equal(nng_aio_result(aio), 0);
        nng_aio_free(aio);

        send_job job = {.s = cs, .buf = b, .n = small};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, send_run, &job), 0);
        /* Reads until b's bytes end what came, or the stream ends. */
        size_t got = 0;
        assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
        nng_aio_set_timeout(aio, 10000);
        while (got < big + small) {
            nng_iov rv_iov = {.iov_buf = in + got, .iov_len = big + small - got};
            nng_aio_set_iov(aio, 1, &rv_iov);
            nng_stream_recv(ss, aio);
            nng_aio_wait(aio);
            if (nng_aio_result(aio) != 0)
                break;
            got += nng_aio_count(aio);
            if (got >= small && memcmp(in + got - small, b, small) == 0)
                break;
        }
        nng_aio_free(aio);
        nng_stream_close(cs);
        pthread_join(t, NULL);
        /* What came is a prefix of a, then a prefix of b (all of b when its send succeeded). */
        size_t k = 0;
        while (k < got && k < big && in[k] == a[k])
            k++;
        size_t rest = got - k;
        if (job.rv == 0)
            assert_int_equal(rest, small);
        assert_true(rest <= small);
        assert_memory_equal(in + k, b, rest);
        nng_stream_free(cs);
        nng_stream_free(ss);
        nng_stream_dialer_free(d);
        nng_stream_listener_free(l);
    }
    free(a);
    free(b);
    free(in);
}

/* A client (REQUIRED) refuses a server of another CA or of another name: no bytes pass. */
static void test_client_refuses(void **state)
{
    (void)state;
    assert_int_not_equal(pair_run("openssl", "openssl", &other_ca, "ps-server"), 0);
    assert_int_not_equal(pair_run("openssl", "openssl", &ca, "ps-server-2"), 0);
#ifdef PSD_NNG_BUNDLED
    assert_int_not_equal(pair_run("mbed", "openssl", &ca, "other-name"), 0);
#endif
}

static void test_bad_input(void **state)
{
    (void)state;
    nng_tls_config *cfg = NULL;
    char err[256] = "";
    assert_int_equal(tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT, "gnutls", err, sizeof(err)), -1);
    assert_null(cfg);
    assert_non_null(strstr(err, "gnutls"));
    assert_int_equal(tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT, "", err, sizeof(err)), 0);
    assert_int_not_equal(nng_tls_config_ca_chain(cfg, "not a certificate", NULL), 0);
    assert_int_not_equal(nng_tls_config_ca_chain(cfg, client_id.key_pem, NULL), 0);
    /* A key that is not the certificate's. */
    assert_int_not_equal(nng_tls_config_own_cert(cfg, client_id.cert_pem, server_id.key_pem, NULL),
                         0);
    assert_int_not_equal(nng_tls_config_own_cert(cfg, "garbage", client_id.key_pem, NULL), 0);
    assert_int_equal(nng_tls_config_own_cert(cfg, client_id.cert_pem, client_id.key_pem, NULL), 0);
    assert_int_not_equal(nng_tls_config_version(cfg, NNG_TLS_1_3, NNG_TLS_1_2), 0);
    assert_int_equal(nng_tls_config_version(cfg, NNG_TLS_1_2, NNG_TLS_1_3), 0);
    assert_int_equal(ERR_peek_error(), 0); /* the engine leaves OpenSSL's error queue empty */
    nng_tls_config_free(cfg);
    assert_string_equal(nng_tls_engine_name(), "openssl");
    assert_non_null(strstr(tls_engine_describe("openssl"), "OpenSSL 3"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offer_tls13),          cmocka_unit_test(test_offer_tls12),
        cmocka_unit_test(test_optional_verified),    cmocka_unit_test(test_engines_interwork),
        cmocka_unit_test(test_client_refuses),       cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_tls13_suites),         cmocka_unit_test(test_send_after_timeout),
        cmocka_unit_test(test_client_to_raw_server),
    };
    return cmocka_run_group_tests(tests, setup_certs, teardown_certs);
}
