/* log_handler.c - ps_set_log_handler: the library's log lines to a caller's callback, over the
 * process-wide sink of common/log.c. */
#include "psclient.h"

#include "log.h"

_Static_assert(PS_LOG_DEBUG == LOG_DEBUG && PS_LOG_INFO == LOG_INFO && PS_LOG_WARN == LOG_WARN &&
                   PS_LOG_ERROR == LOG_ERROR,
               "PS_LOG_* must match common/log.h's levels");

void ps_set_log_handler(ps_log_fn fn, void *arg)
{
    log_set_sink(fn, arg);
}

void ps_set_log_message_handler(int min_level, ps_log_message_fn fn, void *arg)
{
    log_set_message_sink((log_level)min_level, fn, arg);
}
