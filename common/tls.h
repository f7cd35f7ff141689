/* The TLS engine behind nng's TLS configurations: OpenSSL 3 (tls_openssl.c) or nng's own
 * mbed TLS, chosen per configuration by the tls-engine setting (docs/operations.md, TLS). */
#ifndef PSD_TLS_H
#define PSD_TLS_H

#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

/* Allocates an nng TLS configuration of mode on engine "openssl" or "mbed" (NULL or "":
 * "openssl"). nng binds a configuration to the engine registered when it is allocated and
 * keeps one process-wide engine, which its first initialisation resets to mbed TLS: this
 * registers the engine asked for, after nng's initialisation, and allocates under one lock, so
 * configurations of either engine can be made in one process (connections keep the engine of
 * their configuration). Returns 0, or -1 with a message naming the engine or the failure in
 * err. Thread-safe. */
int tls_config_alloc(nng_tls_config **out, nng_tls_mode mode, const char *engine, char *err,
                     size_t errlen);

/* The library behind engine, for logs ("OpenSSL 3.0.11 19 Sep 2023", "mbed TLS (nng's
 * engine)"); the default engine's for NULL or "", "unknown" for other names. */
const char *tls_engine_describe(const char *engine);

#endif
