/* An nng TLS engine over OpenSSL 3 (nng/supplemental/tls/engine.h): nng keeps the TCP stream,
 * its send and receive buffers (256 KiB each with deploy/nng/patches/0008) and the framing; OpenSSL
 * does the handshake (through a BIO whose reads and writes are nng_tls_engine_recv/_send), and a
 * TLS 1.3 connection's records are then sealed and opened in place on nng's buffers (tls_records.c,
 * with the traffic secrets OpenSSL's key log reports); TLS 1.2 keeps OpenSSL's records.
 * Same contract as nng's own mbed TLS engine: a client verifies the server by default, a server
 * does not ask for a client certificate unless told; authentication OPTIONAL completes the
 * handshake whatever the peer presented and reports through `verified` whether its certificate was
 * verified (rpc_server closes such connections itself, to log them). */
#include "tls_openssl.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/engine.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/opensslv.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "tls_records.h"

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

/* TLS 1.2 suites: ECDHE with an AEAD only (forward secrecy, no CBC), AES-GCM first when the
 * CPU has AES instructions, else ChaCha20-Poly1305 first (faster in software). TLS 1.3:
 * likewise, AES-128 before AES-256 (10 rounds against 14). The server's order wins
 * (SSL_OP_CIPHER_SERVER_PREFERENCE). */
#define TLS12_AES                                                                                  \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                                   \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384"
#define TLS12_CHACHA "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define TLS13_AES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384"
#define TLS13_CHACHA "TLS_CHACHA20_POLY1305_SHA256"

struct nng_tls_engine_config {
    SSL_CTX *ctx;
    char *server_name;
    nng_tls_auth_mode auth;
    bool server;
};

struct nng_tls_engine_conn {
    void *tls; /* nng's connection: the argument of nng_tls_engine_send/_recv */
    SSL *ssl;
    nng_tls_engine_config *cfg;
    bool verify_failed; /* the verify callback saw a certificate error (OPTIONAL lets it by) */
    int pending_err;    /* an error met after a read returned data: the next read returns it */
    /* TLS 1.3 traffic secrets from the key log, client's [0] and server's [1], until the
     * handshake ends; then `direct` says whether records does the records. */
    uint8_t secret[2][TLS_RECORDS_SECRET_MAX];
    size_t secret_len[2];
    bool direct;
    bool openssl_records; /* application data went through OpenSSL's records: it stays there */
    tls_records records;
};

static BIO_METHOD *bio_method;
static bool aes_first;

bool tls_openssl_cpu_has_aes(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
#elif defined(__aarch64__) && defined(HWCAP_AES) && defined(HWCAP_PMULL)
    unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_AES) && (hw & HWCAP_PMULL);
#else
    return false;
#endif
}

/* ---- the BIO: OpenSSL's reads and writes go to nng's buffers ---- */

static int bio_write(BIO *b, const char *buf, size_t len, size_t *written)
{
    size_t n = len;
    BIO_clear_retry_flags(b);
    int rv = nng_tls_engine_send(BIO_get_data(b), (const uint8_t *)buf, &n);
    if (rv == 0) {
        *written = n;
        return 1;
    }
    if (rv == NNG_EAGAIN)
        BIO_set_retry_write(b);
    return 0;
}

static int bio_read(BIO *b, char *buf, size_t len, size_t *readbytes)
{
    size_t n = len;
    BIO_clear_retry_flags(b);
    int rv = nng_tls_engine_recv(BIO_get_data(b), (uint8_t *)buf, &n);
    if (rv == 0) {
        *readbytes = n;
        return 1;
    }
    if (rv == NNG_EAGAIN)
        BIO_set_retry_read(b);
    return 0;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    /* nng sends what is written as soon as it can: nothing to flush. */
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

/* ---- errors ---- */

/* The nng error for a failed SSL call (rc its return value); clears the thread's OpenSSL
 * error queue, which nng's threads share between connections. SSL_get_error reads that queue,
 * so every SSL call here starts with it empty (the calling thread may be the host program's,
 * with errors of its own OpenSSL use). */
static int ssl_error(nng_tls_engine_conn *ec, int rc)
{
    int e = SSL_get_error(ec->ssl, rc), rv;
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        return NNG_EAGAIN;
    case SSL_ERROR_ZERO_RETURN: /* the peer's close_notify */
        rv = NNG_ECONNSHUT;
        break;
    case SSL_ERROR_SYSCALL: /* the BIO failed: nng's stream is closed */
        rv = NNG_ECLOSED;
        break;
    default:
        rv = ec->verify_failed || SSL_get_verify_result(ec->ssl) != X509_V_OK ? NNG_EPEERAUTH
                                                                              : NNG_ECRYPTO;
        break;
    }
    ERR_clear_error();
    return rv;
}

/* ---- connections ---- */

static int verify_cb(int ok, X509_STORE_CTX *store)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx());
    nng_tls_engine_conn *ec = ssl != NULL ? SSL_get_app_data(ssl) : NULL;
    if (ec == NULL)
        return ok;
    if (!ok)
        ec->verify_failed = true;
    /* OPTIONAL: finish the handshake and let `verified` say no; else OpenSSL aborts it. */
    return ec->cfg->auth == NNG_TLS_AUTH_MODE_OPTIONAL ? 1 : ok;
}

/* OpenSSL's key log: keeps this connection's first TLS 1.3 application traffic secrets
 * ("CLIENT_TRAFFIC_SECRET_0 <client random> <secret>", hex), for tls_records. Nothing is
 * written anywhere. */
static void keylog_cb(const SSL *ssl, const char *line)
{
    static const char *labels[2] = {"CLIENT_TRAFFIC_SECRET_0 ", "SERVER_TRAFFIC_SECRET_0 "};
    nng_tls_engine_conn *ec = SSL_get_app_data(ssl);
    if (ec == NULL)
        return;
    for (int w = 0; w < 2; w++) {
        size_t ll = strlen(labels[w]);
        if (strncmp(line, labels[w], ll) != 0)
            continue;
        const char *hex = strchr(line + ll, ' '); /* past the client random */
        size_t n = 0;
        for (hex = hex != NULL ? hex + 1 : "";
             isxdigit((unsigned char)hex[0]) && isxdigit((unsigned char)hex[1]) &&
             n < TLS_RECORDS_SECRET_MAX;
             hex += 2) {
            char byte[3] = {hex[0], hex[1], '\0'};
            ec->secret[w][n++] = (uint8_t)strtoul(byte, NULL, 16);
        }
        ec->secret_len[w] = hex[0] == '\0' ? n : 0;
    }
}

/* At the end of a handshake: TLS 1.3 with a suite tls_records knows, both secrets seen and
 * nothing of the peer's left inside OpenSSL: the records are done in place from here on. The
 * secrets are wiped either way. */
static void records_begin(nng_tls_engine_conn *ec)
{
    const SSL_CIPHER *c = SSL_get_current_cipher(ec->ssl);
    int w = SSL_is_server(ec->ssl) ? 1 : 0;
    ec->direct = tls_records_available() && !ec->openssl_records &&
                 SSL_version(ec->ssl) == TLS1_3_VERSION && c != NULL && !SSL_has_pending(ec->ssl) &&
                 ec->secret_len[0] > 0 && ec->secret_len[0] == ec->secret_len[1] &&
                 tls_records_start(&ec->records, SSL_CIPHER_get_name(c), ec->secret[w],
                                   ec->secret[1 - w], ec->secret_len[0]) == 0;
    OPENSSL_cleanse(ec->secret, sizeof(ec->secret));
    ec->secret_len[0] = ec->secret_len[1] = 0;
}

static int conn_init(nng_tls_engine_conn *ec, void *tls, nng_tls_engine_config *cfg)
{
    ec->tls = tls;
    ec->cfg = cfg;
    if ((ec->ssl = SSL_new(cfg->ctx)) == NULL) {
        ERR_clear_error();
        return NNG_ENOMEM;
    }
    BIO *bio = BIO_new(bio_method);
    if (bio == NULL) {
        ERR_clear_error();
        return NNG_ENOMEM;
    }
    BIO_set_data(bio, tls);
    SSL_set_bio(ec->ssl, bio, bio); /* the SSL owns it */
    SSL_set_app_data(ec->ssl, ec);
    if (cfg->server_name != NULL) {
        unsigned char addr[16];
        bool literal = inet_pton(AF_INET, cfg->server_name, addr) == 1 ||
                       inet_pton(AF_INET6, cfg->server_name, addr) == 1;
        /* The name the peer's certificate must carry (CN or DNS name), as mbed TLS checks it;
         * SNI only for a name (RFC 6066 forbids address literals). */
        if (SSL_set1_host(ec->ssl, cfg->server_name) != 1 ||
            (!cfg->server && !literal &&
             SSL_set_tlsext_host_name(ec->ssl, cfg->server_name) != 1)) {
            ERR_clear_error();
            return NNG_ENOMEM;
        }
    }
    if (cfg->server)
        SSL_set_accept_state(ec->ssl);
    else
        SSL_set_connect_state(ec->ssl);
    return 0;
}

static void conn_fini(nng_tls_engine_conn *ec)
{
    tls_records_stop(&ec->records);
    OPENSSL_cleanse(ec->secret, sizeof(ec->secret));
    SSL_free(ec->ssl);
    ec->ssl = NULL;
}

static void conn_close(nng_tls_engine_conn *ec)
{
    /* A close_notify if it can go out now; nng closes the TCP connection either way. */
    if (ec->direct)
        tls_records_close_notify(&ec->records, ec->tls);
    else if (ec->ssl != NULL && SSL_is_init_finished(ec->ssl))
        (void)SSL_shutdown(ec->ssl);
    ERR_clear_error();
}

static int conn_handshake(nng_tls_engine_conn *ec)
{
    ERR_clear_error();
    int rc = SSL_do_handshake(ec->ssl);
    if (rc != 1)
        return ssl_error(ec, rc);
    records_begin(ec);
    return 0;
}

/* Reads records until buf is full or no whole record is buffered: one call of nng's, one
 * completion of its aio, for as much as is there. */
static int conn_recv(nng_tls_engine_conn *ec, uint8_t *buf, size_t *szp)
{
    size_t total = 0, n;
    if (ec->direct)
        return tls_records_recv(&ec->records, ec->tls, buf, szp);
    if (ec->pending_err != 0) {
        int rv = ec->pending_err;
        ec->pending_err = 0;
        return rv;
    }
    ERR_clear_error();
    while (total < *szp) {
        if (SSL_read_ex(ec->ssl, buf + total, *szp - total, &n) == 1) {
            ec->openssl_records = true;
            total += n;
            continue;
        }
        int rv = ssl_error(ec, 0);
        if (total == 0)
            return rv;
        if (rv != NNG_EAGAIN)
            ec->pending_err = rv;
        break;
    }
    *szp = total;
    return 0;
}

/* OpenSSL's records (TLS 1.2): the most of len whose records fit in space, at most
 * RECORD_SLACK bytes of header, explicit nonce, tag and padding each (29 for AES-GCM). */
#define RECORD_PLAIN 16384
#define RECORD_SLACK 64
static size_t fits_in(size_t space, size_t len)
{
    size_t whole = space / (RECORD_PLAIN + RECORD_SLACK) * RECORD_PLAIN;
    size_t rest = space % (RECORD_PLAIN + RECORD_SLACK);
    size_t n = whole + (rest > RECORD_SLACK ? rest - RECORD_SLACK : 0);
    return n < len ? n : len;
}

/* Sends what fits of buf and returns its count (nng hands over the rest once its send buffer
 * drains); NNG_EAGAIN when nothing fits. Nothing is held back: TLS 1.3 records are sealed
 * whole into nng's buffer, and OpenSSL is given only as much as its records fit in there, so
 * it never keeps a record of a buffer that must be written again. */
static int conn_send(nng_tls_engine_conn *ec, const uint8_t *buf, size_t *szp)
{
    size_t n, len = *szp;
    if (ec->direct)
        return tls_records_send(&ec->records, ec->tls, buf, szp);
#ifdef NNG_TLS_ENGINE_DIRECT
    nng_iov iov[2];
    unsigned niov;
    int rv = nng_tls_engine_send_space(ec->tls, iov, &niov);
    if (rv != 0)
        return rv;
    size_t space = 0;
    for (unsigned i = 0; i < niov; i++)
        space += iov[i].iov_len;
    if ((len = fits_in(space, len)) == 0)
        return NNG_EAGAIN;
#else
    (void)fits_in;
#endif
    ERR_clear_error();
    if (SSL_write_ex(ec->ssl, buf, len, &n) != 1)
        return ssl_error(ec, 0);
    ec->openssl_records = true;
    *szp = n;
    return 0;
}

static bool conn_verified(nng_tls_engine_conn *ec)
{
    /* OpenSSL's verify result is X509_V_OK also when the peer sent no certificate. */
    return ec->cfg->auth != NNG_TLS_AUTH_MODE_NONE && !ec->verify_failed &&
           SSL_get0_peer_certificate(ec->ssl) != NULL &&
           SSL_get_verify_result(ec->ssl) == X509_V_OK;
}

/* ---- configurations ---- */

static void config_set_verify(nng_tls_engine_config *cfg)
{
    int mode = SSL_VERIFY_NONE;
    if (cfg->auth == NNG_TLS_AUTH_MODE_OPTIONAL)
        mode = SSL_VERIFY_PEER;
    else if (cfg->auth == NNG_TLS_AUTH_MODE_REQUIRED)
        mode = SSL_VERIFY_PEER | (cfg->server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0);
    SSL_CTX_set_verify(cfg->ctx, mode, verify_cb);
}

static void config_fini(nng_tls_engine_config *cfg)
{
    SSL_CTX_free(cfg->ctx);
    free(cfg->server_name);
}

static int config_init(nng_tls_engine_config *cfg, nng_tls_mode mode)
{
    cfg->server = mode == NNG_TLS_MODE_SERVER;
    cfg->auth = cfg->server ? NNG_TLS_AUTH_MODE_NONE : NNG_TLS_AUTH_MODE_REQUIRED;
    cfg->ctx = SSL_CTX_new(cfg->server ? TLS_server_method() : TLS_client_method());
    if (cfg->ctx == NULL) {
        ERR_clear_error();
        return NNG_ENOMEM;
    }
    SSL_CTX *ctx = cfg->ctx;
    int ok = SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) &&
             SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) &&
             SSL_CTX_set_cipher_list(ctx, aes_first ? TLS12_AES ":" TLS12_CHACHA
                                                    : TLS12_CHACHA ":" TLS12_AES) &&
             SSL_CTX_set_ciphersuites(ctx, aes_first ? TLS13_AES ":" TLS13_CHACHA
                                                     : TLS13_CHACHA ":" TLS13_AES);
    if (!ok) {
        ERR_clear_error();
        SSL_CTX_free(ctx);
        cfg->ctx = NULL;
        return NNG_ECRYPTO;
    }
    SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET);
    /* Every connection is a fresh handshake, as with nng's mbed engine: no session cache, no
     * TLS 1.3 tickets (nng never resumes). */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_keylog_callback(ctx, keylog_cb);
    config_set_verify(cfg);
    return 0;
}

static int config_server_name(nng_tls_engine_config *cfg, const char *name)
{
    char *dup = strdup(name);
    if (dup == NULL)
        return NNG_ENOMEM;
    free(cfg->server_name);
    cfg->server_name = dup;
    return 0;
}

static int config_auth_mode(nng_tls_engine_config *cfg, nng_tls_auth_mode mode)
{
    switch (mode) {
    case NNG_TLS_AUTH_MODE_NONE:
    case NNG_TLS_AUTH_MODE_OPTIONAL:
    case NNG_TLS_AUTH_MODE_REQUIRED:
        cfg->auth = mode;
        config_set_verify(cfg);
        return 0;
    }
    return NNG_EINVAL;
}

/* CA certificates (one or more PEM blocks) and an optional CRL (PEM) into the CTX's store. */
static int config_ca_chain(nng_tls_engine_config *cfg, const char *certs, const char *crl)
{
    X509_STORE *store = SSL_CTX_get_cert_store(cfg->ctx);
    const char *pems[2] = {certs, crl};
    int added[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        if (pems[i] == NULL)
            continue;
        BIO *b = BIO_new_mem_buf(pems[i], -1);
        STACK_OF(X509_INFO) *infos = b != NULL ? PEM_X509_INFO_read_bio(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        if (infos == NULL) {
            ERR_clear_error();
            return NNG_ECRYPTO;
        }
        for (int j = 0; j < sk_X509_INFO_num(infos); j++) {
            X509_INFO *xi = sk_X509_INFO_value(infos, j);
            if (i == 0 && xi->x509 != NULL && X509_STORE_add_cert(store, xi->x509) == 1)
                added[i]++;
            if (i == 1 && xi->crl != NULL && X509_STORE_add_crl(store, xi->crl) == 1)
                added[i]++;
        }
        sk_X509_INFO_pop_free(infos, X509_INFO_free);
        ERR_clear_error();
        if (added[i] == 0)
            return NNG_ECRYPTO;
    }
    if (added[1] > 0)
        X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
    return 0;
}

static int pem_password(char *buf, int size, int rwflag, void *u)
{
    (void)rwflag;
    const char *pass = u;
    if (pass == NULL)
        return 0; /* never prompt on a terminal */
    size_t n = strlen(pass);
    if (n > (size_t)size)
        n = (size_t)size;
    memcpy(buf, pass, n);
    return (int)n;
}

/* Our certificate (its chain may follow it in cert) and its private key, encrypted when pass
 * is given. */
static int config_own_cert(nng_tls_engine_config *cfg, const char *cert, const char *key,
                           const char *pass)
{
    int rv = NNG_ECRYPTO;
    X509 *leaf = NULL;
    EVP_PKEY *pkey = NULL;
    BIO *cb = BIO_new_mem_buf(cert, -1), *kb = BIO_new_mem_buf(key, -1);
    if (cb == NULL || kb == NULL) {
        rv = NNG_ENOMEM;
        goto out;
    }
    if ((leaf = PEM_read_bio_X509(cb, NULL, pem_password, (void *)pass)) == NULL ||
        (pkey = PEM_read_bio_PrivateKey(kb, NULL, pem_password, (void *)pass)) == NULL)
        goto out;
    if (SSL_CTX_use_certificate(cfg->ctx, leaf) != 1 ||
        SSL_CTX_use_PrivateKey(cfg->ctx, pkey) != 1 || SSL_CTX_check_private_key(cfg->ctx) != 1)
        goto out;
    if (!SSL_CTX_clear_chain_certs(cfg->ctx))
        goto out;
    X509 *extra;
    while ((extra = PEM_read_bio_X509(cb, NULL, pem_password, (void *)pass)) != NULL) {
        if (SSL_CTX_add0_chain_cert(cfg->ctx, extra) != 1) {
            X509_free(extra);
            goto out;
        }
    }
    rv = 0;
out:
    ERR_clear_error();
    X509_free(leaf);
    EVP_PKEY_free(pkey);
    BIO_free(cb);
    BIO_free(kb);
    return rv;
}

static int config_version(nng_tls_engine_config *cfg, nng_tls_version min_ver,
                          nng_tls_version max_ver)
{
    static const struct {
        nng_tls_version nng;
        int ossl;
    } map[] = {{NNG_TLS_1_0, TLS1_VERSION},
               {NNG_TLS_1_1, TLS1_1_VERSION},
               {NNG_TLS_1_2, TLS1_2_VERSION},
               {NNG_TLS_1_3, TLS1_3_VERSION}};
    int lo = 0, hi = 0;
    if (min_ver > max_ver)
        return NNG_ENOTSUP;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (map[i].nng == min_ver)
            lo = map[i].ossl;
        if (map[i].nng == max_ver)
            hi = map[i].ossl;
    }
    if (lo == 0 || hi == 0)
        return NNG_ENOTSUP;
    if (!SSL_CTX_set_min_proto_version(cfg->ctx, lo) ||
        !SSL_CTX_set_max_proto_version(cfg->ctx, hi)) {
        ERR_clear_error();
        return NNG_ENOTSUP;
    }
    return 0;
}

static nng_tls_engine_config_ops config_ops = {
    .size = sizeof(nng_tls_engine_config),
    .init = config_init,
    .fini = config_fini,
    .server = config_server_name,
    .auth = config_auth_mode,
    .ca_chain = config_ca_chain,
    .own_cert = config_own_cert,
    .version = config_version,
};

static nng_tls_engine_conn_ops conn_ops = {
    .size = sizeof(nng_tls_engine_conn),
    .init = conn_init,
    .fini = conn_fini,
    .close = conn_close,
    .handshake = conn_handshake,
    .recv = conn_recv,
    .send = conn_send,
    .verified = conn_verified,
};

static nng_tls_engine engine = {
    .version = NNG_TLS_ENGINE_VERSION,
    .config_ops = &config_ops,
    .conn_ops = &conn_ops,
    .name = "openssl",
    .description = OPENSSL_VERSION_TEXT,
    .fips_mode = false,
};

static void setup(void)
{
    if (OPENSSL_init_ssl(0, NULL) != 1) {
        ERR_clear_error();
        return;
    }
    aes_first = tls_openssl_cpu_has_aes();
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "nng stream");
    if (m == NULL || !BIO_meth_set_write_ex(m, bio_write) || !BIO_meth_set_read_ex(m, bio_read) ||
        !BIO_meth_set_ctrl(m, bio_ctrl) || !BIO_meth_set_create(m, bio_create)) {
        BIO_meth_free(m);
        ERR_clear_error();
        return;
    }
    bio_method = m; /* lives as long as the process: connections may outlive any caller */
}

const nng_tls_engine *tls_openssl_engine(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, setup);
    return bio_method != NULL ? &engine : NULL;
}

const char *tls_openssl_version(void)
{
    return OpenSSL_version(OPENSSL_VERSION);
}
