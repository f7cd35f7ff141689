/* Status codes of every RPC: gRPC's canonical codes, same numbers. */
#ifndef PSD_COMMON_STATUS_H
#define PSD_COMMON_STATUS_H

typedef enum status_code {
    STATUS_OK = 0,
    STATUS_CANCELLED = 1,
    STATUS_UNKNOWN = 2,
    STATUS_INVALID_ARGUMENT = 3,
    STATUS_DEADLINE_EXCEEDED = 4,
    STATUS_NOT_FOUND = 5,
    STATUS_ALREADY_EXISTS = 6,
    STATUS_PERMISSION_DENIED = 7,
    STATUS_RESOURCE_EXHAUSTED = 8,
    STATUS_FAILED_PRECONDITION = 9,
    STATUS_ABORTED = 10,
    STATUS_OUT_OF_RANGE = 11,
    STATUS_UNIMPLEMENTED = 12,
    STATUS_INTERNAL = 13,
    STATUS_UNAVAILABLE = 14,
    STATUS_DATA_LOSS = 15,
    STATUS_UNAUTHENTICATED = 16,
} status_code;

#define STATUS_COUNT 17

/* Canonical upper-case name ("INVALID_ARGUMENT"); "UNKNOWN_STATUS" for values out of range. */
const char *status_name(int code);

/* Maps an nng error number to the status a caller should see (e.g. NNG_ETIMEDOUT ->
 * DEADLINE_EXCEEDED, NNG_ECLOSED -> CANCELLED, NNG_ECONNREFUSED -> UNAVAILABLE). */
int status_from_nng(int nng_err);

#endif
