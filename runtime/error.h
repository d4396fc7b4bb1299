/* error.h - the runtime's one error style: a smelt_status and a message.
 *
 * Inside the runtime (devices, executor, sampler, weight binding) a function
 * that can fail takes an `rt_error *` and returns a smelt_status:
 *
 *   return rt_fail(e, SMELT_ERROR_DEVICE, "cuMemAlloc of %llu bytes: %s", ...);
 *
 * The public API (smelt.h) turns that into the thread's last error, which
 * smelt_last_error() returns, as it returns to the caller:
 *
 *   if (s != SMELT_OK) return rt_last_error_publish(&e);
 *   return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_forward: a NULL argument");
 *
 * So the devices never call into the public-API files, and only the public
 * entry points write the thread's last error.
 */
#ifndef SMELT_RT_ERROR_H
#define SMELT_RT_ERROR_H

#include <string.h>

#include "smelt.h"

enum { RT_ERROR_MESSAGE_SIZE = 1024 };

typedef struct rt_error {
    smelt_status status;
    char message[RT_ERROR_MESSAGE_SIZE];
} rt_error;

/* Records status and message in e (when e is not NULL) and returns status, so
 * that `return rt_fail(e, SMELT_ERROR_DEVICE, "...")` reads as one step. */
smelt_status rt_fail(rt_error *e, smelt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets the calling thread's last error (smelt_last_error) and returns status. */
smelt_status rt_last_error_set(smelt_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Makes e the calling thread's last error and returns its status. */
smelt_status rt_last_error_publish(const rt_error *e);

/* "%.*s%s" arguments for a name cut to 64 bytes, as in compiler messages. */
#define RT_NAME(s) (int)(strlen(s) > 64 ? 64 : strlen(s)), (s), (strlen(s) > 64 ? "..." : "")

#endif
