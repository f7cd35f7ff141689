/* The TLS engine of each nng TLS configuration (tls.h). */
#include "tls.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <nng/supplemental/tls/engine.h>

#include "tls_openssl.h"

#ifdef PSD_NNG_BUNDLED
/* nng's mbed TLS engine registers itself with this (tls/mbedtls/tls.c); only the static nng
 * built from subprojects/nng lets us call it again after another engine was registered. */
int nng_tls_engine_init_mbed(void);
#endif

static pthread_mutex_t engine_lock = PTHREAD_MUTEX_INITIALIZER;

static bool is_openssl(const char *engine)
{
    return engine == NULL || engine[0] == '\0' || strcmp(engine, "openssl") == 0;
}

/* Makes engine nng's current one; under engine_lock. */
static int engine_use(const char *engine, char *err, size_t errlen)
{
    const char *current = nng_tls_engine_name(); /* initialises nng first: that resets it */
    int rv;
    if (is_openssl(engine)) {
        const nng_tls_engine *e = tls_openssl_engine();
        if (e == NULL) {
            snprintf(err, errlen, "tls-engine openssl: OpenSSL cannot be initialised");
            return -1;
        }
        if (strcmp(current, e->name) != 0 && (rv = nng_tls_engine_register(e)) != 0) {
            snprintf(err, errlen, "tls-engine openssl: nng refuses the engine: %s",
                     nng_strerror(rv));
            return -1;
        }
        return 0;
    }
    if (strcmp(engine, "mbed") == 0) {
        if (strcmp(current, "mbed") == 0)
            return 0;
#ifdef PSD_NNG_BUNDLED
        if ((rv = nng_tls_engine_init_mbed()) == 0)
            return 0;
        snprintf(err, errlen, "tls-engine mbed: nng refuses the engine: %s", nng_strerror(rv));
#else
        snprintf(err, errlen,
                 "tls-engine mbed: this process already uses %s, and the system's nng cannot "
                 "switch back to mbed TLS (build with the bundled nng, or use one engine)",
                 current);
#endif
        return -1;
    }
    snprintf(err, errlen, "tls-engine \"%s\": not an engine (openssl or mbed)", engine);
    return -1;
}

int tls_config_alloc(nng_tls_config **out, nng_tls_mode mode, const char *engine, char *err,
                     size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&engine_lock);
    int rv = engine_use(engine, err, errlen) == 0 ? nng_tls_config_alloc(out, mode) : -1;
    pthread_mutex_unlock(&engine_lock);
    if (rv > 0)
        snprintf(err, errlen, "cannot set up TLS (engine %s): %s (is nng built with TLS?)",
                 is_openssl(engine) ? "openssl" : engine, nng_strerror(rv));
    return rv == 0 ? 0 : -1;
}

const char *tls_engine_describe(const char *engine)
{
    if (is_openssl(engine))
        return tls_openssl_version();
    return strcmp(engine, "mbed") == 0 ? "mbed TLS (nng's engine)" : "unknown";
}
