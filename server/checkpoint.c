/* The checkpoints' identity of a cluster: the hash of its ps addresses that a checkpoint's
 * header records (checkpoint.h). */
#include "checkpoint.h"

#include <stdint.h>

uint64_t checkpoint_cluster_hash(char *const *ps, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        if (i) {
            h ^= (uint8_t)',';
            h *= 0x100000001b3ull;
        }
        for (const char *p = ps[i]; *p; p++) {
            h ^= (uint8_t)*p;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}
