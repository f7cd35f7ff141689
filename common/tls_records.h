/* TLS 1.3 application records done in place on nng's TLS buffers: once OpenSSL has finished a
 * TLS 1.3 handshake (tls_openssl.c), a connection seals each record straight from the caller's
 * message into nng's send buffer and opens each one straight from nng's receive buffer into the
 * caller's buffer (nng with deploy/nng/patches/0008, NNG_TLS_ENGINE_DIRECT), so the cipher is
 * the only copy. RFC 8446: records (5.1-5.4), the suites' AEADs with the per-record nonce, keys
 * from the traffic secrets (7.1-7.3), alerts (6) and KeyUpdate (4.6.3); NewSessionTicket is
 * ignored (we never resume). */
#ifndef PSD_TLS_RECORDS_H
#define PSD_TLS_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#define TLS_RECORDS_SECRET_MAX 48 /* SHA-384's */

/* One direction's AEAD: key set once, nonce = iv XOR the record's sequence number. */
typedef struct {
    EVP_CIPHER_CTX *ctx;
    uint8_t secret[TLS_RECORDS_SECRET_MAX]; /* the traffic secret, for KeyUpdate */
    uint8_t iv[12];
    uint64_t seq;
} tls_records_dir;

typedef struct {
    tls_records_dir wr, rd;
    const EVP_CIPHER *cipher;
    const char *md; /* the suite's hash: "SHA256" or "SHA384" */
    size_t secret_len, key_len;
    uint8_t *plain; /* a record's plaintext the caller had no room for (lazily allocated) */
    size_t plain_off, plain_len;
    bool update_due; /* the peer asked for a KeyUpdate: ours goes before the next record */
    int err;         /* sticky: the error every later call returns */
} tls_records;

/* Whether this build's nng lets an engine work on its buffers (NNG_TLS_ENGINE_DIRECT). */
bool tls_records_available(void);

/* Starts r (zeroed by the caller) for suite (SSL_CIPHER_get_name: TLS_AES_128_GCM_SHA256,
 * TLS_AES_256_GCM_SHA384 or TLS_CHACHA20_POLY1305_SHA256) with our write and the peer's
 * traffic secret (secret_len bytes each), both at sequence number 0. Returns 0, or -1 for
 * another suite or a failure (r is then stopped). */
int tls_records_start(tls_records *r, const char *suite, const uint8_t *wr_secret,
                      const uint8_t *rd_secret, size_t secret_len);

/* Frees r's ciphers and wipes its secrets. */
void tls_records_stop(tls_records *r);

/* The engine's send (nng's conn is the engine's nng argument): seals as much of buf as fits in
 * nng's send buffer as whole records and sends them; *szp gets the count, which is exactly what
 * was taken (nothing of buf is held back). NNG_EAGAIN when nothing fits. */
int tls_records_send(tls_records *r, void *conn, const uint8_t *buf, size_t *szp);

/* The engine's recv: opens whole records from nng's receive buffer into buf until it is full
 * or no whole record is there; *szp gets the count. NNG_EAGAIN when there is none yet,
 * NNG_ECONNSHUT after the peer's close_notify, NNG_ECRYPTO for a record that fails. */
int tls_records_recv(tls_records *r, void *conn, uint8_t *buf, size_t *szp);

/* Sends a close_notify alert if there is room for it now. */
void tls_records_close_notify(tls_records *r, void *conn);

#endif
