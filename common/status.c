/* Status codes (status.h): their names and the mapping from nng's errors. */
#include "status.h"

#include <nng/nng.h>

static const char *const status_names[STATUS_COUNT] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *status_name(int code)
{
    if (code < 0 || code >= STATUS_COUNT)
        return "UNKNOWN_STATUS";
    return status_names[code];
}

int status_from_nng(int nng_err)
{
    switch (nng_err) {
    case 0:
        return STATUS_OK;
    case NNG_ETIMEDOUT:
        return STATUS_DEADLINE_EXCEEDED;
    case NNG_ECLOSED:
    case NNG_ECANCELED:
        return STATUS_CANCELLED;
    case NNG_ENOMEM:
        return STATUS_RESOURCE_EXHAUSTED;
    case NNG_EMSGSIZE:
        return STATUS_RESOURCE_EXHAUSTED;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
        return STATUS_INVALID_ARGUMENT;
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
    case NNG_EUNREACHABLE:
    case NNG_EAGAIN:
    case NNG_ESTATE:
        return STATUS_UNAVAILABLE;
    case NNG_EPEERAUTH:
    case NNG_ECRYPTO:
        return STATUS_UNAUTHENTICATED;
    default:
        return STATUS_INTERNAL;
    }
}
