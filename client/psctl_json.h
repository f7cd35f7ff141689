/* psctl's JSON output: strings escaped as JSON requires (names, paths, addresses, errors). */
#ifndef PSD_CLIENT_PSCTL_JSON_H
#define PSD_CLIENT_PSCTL_JSON_H

#include <stdio.h>

/* Writes s to out as a JSON string: quotes, '"' and '\\' escaped, control bytes as \uXXXX. */
void psctl_json_str(FILE *out, const char *s);

#endif
