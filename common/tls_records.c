/* TLS 1.3 application records sealed into and opened out of nng's TLS buffers in place
 * (tls_records.h). nng's buffers are rings: a record may wrap around the end of one, so every
 * read and write here goes through a position over up to two pieces. */
#include "tls_records.h"

#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/engine.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#define REC_HDR 5
#define REC_TAG 16
#define REC_MAX_PLAIN 16384                  /* 2^14 (5.1) */
#define REC_MAX_CIPHER (REC_MAX_PLAIN + 256) /* 2^14 + 256 (5.2) */
#define REC_OVERHEAD (REC_HDR + 1 + REC_TAG) /* header, inner type, tag */
#define REC_MIN_SPLIT 1024 /* a partly full buffer takes a shorter record down to this */

enum { CT_ALERT = 21, CT_HANDSHAKE = 22, CT_APPDATA = 23 };
enum { HS_NEW_SESSION_TICKET = 4, HS_KEY_UPDATE = 24 };

#ifdef NNG_TLS_ENGINE_DIRECT

/* ---- positions in nng's ring pieces ---- */

typedef struct {
    nng_iov *iov;
    unsigned n, i;
    size_t off;
} ring_pos;

static size_t ring_avail(const ring_pos *p)
{
    return p->i < p->n ? p->iov[p->i].iov_len - p->off : 0;
}

static void ring_step(ring_pos *p, size_t k)
{
    p->off += k;
    if (p->off == p->iov[p->i].iov_len) {
        p->i++;
        p->off = 0;
    }
}

static uint8_t *ring_at(const ring_pos *p)
{
    return (uint8_t *)p->iov[p->i].iov_buf + p->off;
}

/* Copies n bytes into (to_ring) or out of the ring. */
static void ring_copy(ring_pos *p, uint8_t *buf, size_t n, bool to_ring)
{
    while (n > 0) {
        size_t k = ring_avail(p) < n ? ring_avail(p) : n;
        if (to_ring)
            memcpy(ring_at(p), buf, k);
        else
            memcpy(buf, ring_at(p), k);
        ring_step(p, k);
        buf += k;
        n -= k;
    }
}

/* Runs n bytes through the cipher: from in into the ring (seal), or from the ring into out
 * (open). GCM and ChaCha20-Poly1305 put out as many bytes as they take. */
static int ring_cipher(EVP_CIPHER_CTX *ctx, ring_pos *p, const uint8_t *in, uint8_t *out, size_t n,
                       bool seal)
{
    while (n > 0) {
        size_t k = ring_avail(p) < n ? ring_avail(p) : n;
        int outl;
        int ok = seal ? EVP_EncryptUpdate(ctx, ring_at(p), &outl, in, (int)k)
                      : EVP_DecryptUpdate(ctx, out, &outl, ring_at(p), (int)k);
        if (!ok || (size_t)outl != k)
            return -1;
        ring_step(p, k);
        if (seal)
            in += k;
        else
            out += k;
        n -= k;
    }
    return 0;
}

/* ---- keys (7.1, 7.3) ---- */

/* HKDF-Expand-Label(secret, label, "", n) for n up to the hash's size (one HMAC block). */
static int expand_label(const tls_records *r, const uint8_t *secret, const char *label,
                        uint8_t *out, size_t n)
{
    uint8_t info[64], t[EVP_MAX_MD_SIZE];
    size_t ll = strlen(label), len = 0, tl;
    info[len++] = (uint8_t)(n >> 8);
    info[len++] = (uint8_t)n;
    info[len++] = (uint8_t)(6 + ll);
    memcpy(info + len, "tls13 ", 6);
    memcpy(info + len + 6, label, ll);
    len += 6 + ll;
    info[len++] = 0; /* empty context */
    info[len++] = 1; /* T(1) */
    if (EVP_Q_mac(NULL, "HMAC", NULL, r->md, NULL, secret, r->secret_len, info, len, t, sizeof(t),
                  &tl) == NULL ||
        tl < n)
        return -1;
    memcpy(out, t, n);
    OPENSSL_cleanse(t, sizeof(t));
    return 0;
}

/* (Re)keys d from d->secret: key and iv, sequence number 0. */
static int dir_key(const tls_records *r, tls_records_dir *d, bool seal)
{
    uint8_t key[32];
    int ok = expand_label(r, d->secret, "key", key, r->key_len) == 0 &&
             expand_label(r, d->secret, "iv", d->iv, sizeof(d->iv)) == 0 &&
             (seal ? EVP_EncryptInit_ex(d->ctx, r->cipher, NULL, key, NULL)
                   : EVP_DecryptInit_ex(d->ctx, r->cipher, NULL, key, NULL));
    OPENSSL_cleanse(key, sizeof(key));
    d->seq = 0;
    return ok ? 0 : -1;
}

/* KeyUpdate: the next traffic secret of d (7.2), and its keys. */
static int dir_update(const tls_records *r, tls_records_dir *d, bool seal)
{
    uint8_t next[TLS_RECORDS_SECRET_MAX];
    if (expand_label(r, d->secret, "traffic upd", next, r->secret_len) != 0)
        return -1;
    memcpy(d->secret, next, r->secret_len);
    OPENSSL_cleanse(next, sizeof(next));
    return dir_key(r, d, seal);
}

static void dir_nonce(const tls_records_dir *d, uint8_t nonce[12])
{
    memcpy(nonce, d->iv, 12);
    for (int i = 0; i < 8; i++)
        nonce[11 - i] ^= (uint8_t)(d->seq >> (8 * i));
}

bool tls_records_available(void)
{
    return true;
}

int tls_records_start(tls_records *r, const char *suite, const uint8_t *wr_secret,
                      const uint8_t *rd_secret, size_t secret_len)
{
    if (strcmp(suite, "TLS_AES_128_GCM_SHA256") == 0) {
        r->cipher = EVP_aes_128_gcm();
        r->md = "SHA256";
        r->key_len = 16;
    } else if (strcmp(suite, "TLS_AES_256_GCM_SHA384") == 0) {
        r->cipher = EVP_aes_256_gcm();
        r->md = "SHA384";
        r->key_len = 32;
    } else if (strcmp(suite, "TLS_CHACHA20_POLY1305_SHA256") == 0) {
        r->cipher = EVP_chacha20_poly1305();
        r->md = "SHA256";
        r->key_len = 32;
    } else {
        return -1;
    }
    r->secret_len = strcmp(r->md, "SHA384") == 0 ? 48 : 32;
    if (r->cipher == NULL || secret_len != r->secret_len)
        return -1;
    memcpy(r->wr.secret, wr_secret, secret_len);
    memcpy(r->rd.secret, rd_secret, secret_len);
    r->wr.ctx = EVP_CIPHER_CTX_new();
    r->rd.ctx = EVP_CIPHER_CTX_new();
    if (r->wr.ctx == NULL || r->rd.ctx == NULL || dir_key(r, &r->wr, true) != 0 ||
        dir_key(r, &r->rd, false) != 0) {
        tls_records_stop(r);
        return -1;
    }
    return 0;
}

void tls_records_stop(tls_records *r)
{
    EVP_CIPHER_CTX_free(r->wr.ctx);
    EVP_CIPHER_CTX_free(r->rd.ctx);
    r->wr.ctx = r->rd.ctx = NULL;
    OPENSSL_cleanse(r->wr.secret, sizeof(r->wr.secret));
    OPENSSL_cleanse(r->rd.secret, sizeof(r->rd.secret));
    if (r->plain != NULL)
        OPENSSL_clear_free(r->plain, REC_MAX_CIPHER);
    r->plain = NULL;
    r->plain_len = r->plain_off = 0;
}

/* ---- sealing (5.2) ---- */

/* Seals one record of n bytes of content of type into the ring at p (n + REC_OVERHEAD bytes). */
static int seal(tls_records *r, ring_pos *p, const uint8_t *in, size_t n, uint8_t type)
{
    tls_records_dir *d = &r->wr;
    size_t len = n + 1 + REC_TAG;
    uint8_t hdr[REC_HDR] = {CT_APPDATA, 3, 3, (uint8_t)(len >> 8), (uint8_t)len};
    uint8_t nonce[12], tag[REC_TAG], fin[16];
    int outl;
    dir_nonce(d, nonce);
    if (!EVP_EncryptInit_ex(d->ctx, NULL, NULL, NULL, nonce) ||
        !EVP_EncryptUpdate(d->ctx, NULL, &outl, hdr, REC_HDR))
        return -1;
    ring_copy(p, hdr, REC_HDR, true);
    if (ring_cipher(d->ctx, p, in, NULL, n, true) != 0 ||
        ring_cipher(d->ctx, p, &type, NULL, 1, true) != 0 ||
        !EVP_EncryptFinal_ex(d->ctx, fin, &outl) ||
        EVP_CIPHER_CTX_ctrl(d->ctx, EVP_CTRL_AEAD_GET_TAG, REC_TAG, tag) != 1)
        return -1;
    ring_copy(p, tag, REC_TAG, true);
    d->seq++;
    return 0;
}

/* Seals a control record (alert, KeyUpdate) if it fits; 0 sent, NNG_EAGAIN no room. */
static int send_control(tls_records *r, void *conn, const uint8_t *msg, size_t n, uint8_t type)
{
    nng_iov iov[2];
    unsigned niov;
    int rv = nng_tls_engine_send_space(conn, iov, &niov);
    if (rv != 0)
        return rv;
    size_t space = 0;
    for (unsigned i = 0; i < niov; i++)
        space += iov[i].iov_len;
    if (space < n + REC_OVERHEAD)
        return NNG_EAGAIN;
    ring_pos p = {iov, niov, 0, 0};
    if (seal(r, &p, msg, n, type) != 0)
        return NNG_ECRYPTO;
    nng_tls_engine_send_commit(conn, n + REC_OVERHEAD);
    return 0;
}

int tls_records_send(tls_records *r, void *conn, const uint8_t *buf, size_t *szp)
{
    if (r->err != 0)
        return r->err;
    if (r->update_due) {
        /* The peer asked for ours (4.6.3): update_not_requested, then new keys. */
        static const uint8_t key_update[5] = {HS_KEY_UPDATE, 0, 0, 1, 0};
        int rv = send_control(r, conn, key_update, sizeof(key_update), CT_HANDSHAKE);
        if (rv != 0)
            return rv;
        if (dir_update(r, &r->wr, true) != 0)
            return r->err = NNG_ECRYPTO;
        r->update_due = false;
    }
    nng_iov iov[2];
    unsigned niov;
    int rv = nng_tls_engine_send_space(conn, iov, &niov);
    if (rv != 0)
        return rv;
    size_t space = 0, used = 0, sent = 0, len = *szp;
    for (unsigned i = 0; i < niov; i++)
        space += iov[i].iov_len;
    ring_pos p = {iov, niov, 0, 0};
    while (sent < len) {
        size_t n = len - sent < REC_MAX_PLAIN ? len - sent : REC_MAX_PLAIN;
        if (space - used < n + REC_OVERHEAD) {
            /* A shorter record fills what is left, unless it is little. */
            if (space - used < REC_MIN_SPLIT + REC_OVERHEAD)
                break;
            n = space - used - REC_OVERHEAD;
        }
        if (seal(r, &p, buf + sent, n, CT_APPDATA) != 0) {
            r->err = NNG_ECRYPTO;
            break;
        }
        used += n + REC_OVERHEAD;
        sent += n;
    }
    if (used > 0)
        nng_tls_engine_send_commit(conn, used);
    if (sent == 0)
        return r->err != 0 ? r->err : NNG_EAGAIN;
    *szp = sent;
    return 0;
}

void tls_records_close_notify(tls_records *r, void *conn)
{
    static const uint8_t close_notify[2] = {1, 0}; /* warning, close_notify */
    if (r->err == 0 && r->wr.ctx != NULL)
        (void)send_control(r, conn, close_notify, sizeof(close_notify), CT_ALERT);
}

/* ---- opening (5.2, 5.4) ---- */

/* What a record's content of type asks for once opened: 0 go on (application data, tickets,
 * a KeyUpdate), or the error that ends the connection. A handshake record holds whole
 * messages (a KeyUpdate last: messages never span a key change, 5.1). */
static int on_control(tls_records *r, uint8_t type, const uint8_t *msg, size_t n)
{
    if (type == CT_ALERT) /* close_notify: the peer is done; any other: it failed */
        return n == 2 && msg[1] == 0 ? NNG_ECONNSHUT : NNG_ECRYPTO;
    if (type != CT_HANDSHAKE || n == 0)
        return NNG_ECRYPTO;
    for (size_t off = 0; off < n;) {
        if (n - off < 4)
            return NNG_ECRYPTO;
        const uint8_t *m = msg + off;
        size_t mlen = ((size_t)m[1] << 16) | ((size_t)m[2] << 8) | m[3];
        if (mlen > n - off - 4)
            return NNG_ECRYPTO;
        off += 4 + mlen;
        if (m[0] == HS_NEW_SESSION_TICKET)
            continue; /* we never resume */
        if (m[0] != HS_KEY_UPDATE || mlen != 1 || m[4] > 1 || off != n)
            return NNG_ECRYPTO;
        if (dir_update(r, &r->rd, false) != 0)
            return NNG_ECRYPTO;
        r->update_due = r->update_due || m[4] == 1;
    }
    return 0;
}

/* Opens the record at p (header already read: len bytes follow) into out, which has room for
 * len - REC_TAG - 1 bytes; the inner plaintext's last byte goes to *last. *n gets the
 * content's length, *type its type. */
static int open_record(tls_records *r, ring_pos *p, const uint8_t hdr[REC_HDR], size_t len,
                       uint8_t *out, size_t *n, uint8_t *type)
{
    tls_records_dir *d = &r->rd;
    size_t inner = len - REC_TAG;
    uint8_t nonce[12], tag[REC_TAG], last, fin[16];
    int outl;
    dir_nonce(d, nonce);
    if (!EVP_DecryptInit_ex(d->ctx, NULL, NULL, NULL, nonce) ||
        !EVP_DecryptUpdate(d->ctx, NULL, &outl, hdr, REC_HDR) ||
        ring_cipher(d->ctx, p, NULL, out, inner - 1, false) != 0 ||
        ring_cipher(d->ctx, p, NULL, &last, 1, false) != 0)
        return -1;
    ring_copy(p, tag, REC_TAG, false);
    if (EVP_CIPHER_CTX_ctrl(d->ctx, EVP_CTRL_AEAD_SET_TAG, REC_TAG, tag) != 1 ||
        EVP_DecryptFinal_ex(d->ctx, fin, &outl) != 1)
        return -1;
    d->seq++;
    /* The content type is the last non-zero byte; zeros after it are padding. */
    size_t k = inner - 1;
    if (last != 0) {
        *type = last;
    } else {
        while (k > 0 && out[k - 1] == 0)
            k--;
        if (k == 0)
            return -1;
        *type = out[--k];
    }
    *n = k;
    return 0;
}

int tls_records_recv(tls_records *r, void *conn, uint8_t *buf, size_t *szp)
{
    size_t want = *szp, got = 0;
    if (r->plain_len > 0) { /* a record's rest first */
        got = r->plain_len < want ? r->plain_len : want;
        memcpy(buf, r->plain + r->plain_off, got);
        r->plain_off += got;
        r->plain_len -= got;
    }
    while (got < want && r->plain_len == 0 && r->err == 0) {
        nng_iov iov[2];
        unsigned niov;
        int rv = nng_tls_engine_recv_peek(conn, iov, &niov);
        if (rv != 0) {
            r->err = rv;
            break;
        }
        size_t have = 0;
        for (unsigned i = 0; i < niov; i++)
            have += iov[i].iov_len;
        if (have < REC_HDR)
            break;
        ring_pos p = {iov, niov, 0, 0};
        uint8_t hdr[REC_HDR];
        ring_copy(&p, hdr, REC_HDR, false);
        size_t len = ((size_t)hdr[3] << 8) | hdr[4];
        if (hdr[0] != CT_APPDATA || hdr[1] != 3 || len > REC_MAX_CIPHER || len < REC_TAG + 1) {
            r->err = NNG_ECRYPTO;
            break;
        }
        if (have < REC_HDR + len)
            break; /* its rest is on its way: peek started a read */
        size_t room = want - got, n;
        uint8_t type, *out = buf + got;
        if (len - REC_TAG - 1 > room) { /* the caller has no room for all of it */
            if (r->plain == NULL && (r->plain = OPENSSL_malloc(REC_MAX_CIPHER)) == NULL) {
                r->err = NNG_ENOMEM;
                break;
            }
            out = r->plain;
        }
        if (open_record(r, &p, hdr, len, out, &n, &type) != 0) {
            r->err = NNG_ECRYPTO;
            break;
        }
        nng_tls_engine_recv_consume(conn, REC_HDR + len);
        if (type != CT_APPDATA) {
            if ((rv = on_control(r, type, out, n)) != 0)
                r->err = rv;
            continue;
        }
        if (out == r->plain) {
            size_t k = n < room ? n : room;
            memcpy(buf + got, r->plain, k);
            r->plain_off = k;
            r->plain_len = n - k;
            n = k;
        }
        got += n;
    }
    if (got > 0) { /* an error met after data waits for the next call */
        *szp = got;
        return 0;
    }
    return r->err != 0 ? r->err : NNG_EAGAIN;
}

#else /* nng without NNG_TLS_ENGINE_DIRECT: OpenSSL's own records serve every connection */

bool tls_records_available(void)
{
    return false;
}

int tls_records_start(tls_records *r, const char *suite, const uint8_t *wr_secret,
                      const uint8_t *rd_secret, size_t secret_len)
{
    (void)r;
    (void)suite;
    (void)wr_secret;
    (void)rd_secret;
    (void)secret_len;
    return -1;
}

void tls_records_stop(tls_records *r)
{
    (void)r;
}

int tls_records_send(tls_records *r, void *conn, const uint8_t *buf, size_t *szp)
{
    (void)r;
    (void)conn;
    (void)buf;
    (void)szp;
    return NNG_ENOTSUP;
}

int tls_records_recv(tls_records *r, void *conn, uint8_t *buf, size_t *szp)
{
    (void)r;
    (void)conn;
    (void)buf;
    (void)szp;
    return NNG_ENOTSUP;
}

void tls_records_close_notify(tls_records *r, void *conn)
{
    (void)r;
    (void)conn;
}

#endif
