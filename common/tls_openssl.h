/* An nng TLS engine over OpenSSL 3 (tls_openssl.c); common/tls.c registers it. */
#ifndef PSD_TLS_OPENSSL_H
#define PSD_TLS_OPENSSL_H

#include <stdbool.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/engine.h>

/* The engine, set up on the first call (thread-safe); NULL if OpenSSL cannot be initialised.
 * Its offer: TLS 1.3 and 1.2 (ECDHE with AES-GCM or ChaCha20-Poly1305), AES-GCM first when
 * tls_openssl_cpu_has_aes(), else ChaCha20-Poly1305 first; the server's order wins. */
const nng_tls_engine *tls_openssl_engine(void);

/* Whether this CPU has AES and carry-less multiply instructions (AES-NI and PCLMULQDQ on
 * x86, the AES and PMULL extensions on ARMv8), which make AES-GCM faster than ChaCha20. */
bool tls_openssl_cpu_has_aes(void);

/* OpenSSL's version line, as the library linked at run time reports it. */
const char *tls_openssl_version(void);

#endif
