/* error.c - rt_fail, the thread's last error and the names of the statuses
 * (error.h). */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[RT_ERROR_MESSAGE_SIZE];

smelt_status rt_fail(rt_error *e, smelt_status status, const char *fmt, ...) {
    if (!e) return status;
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

smelt_status rt_last_error_set(smelt_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

smelt_status rt_last_error_publish(const rt_error *e) {
    snprintf(last_error, sizeof last_error, "%s", e->message);
    return e->status;
}

const char *smelt_last_error(void) { return last_error; }

const char *smelt_status_name(smelt_status status) {
    switch (status) {
    case SMELT_OK: return "SMELT_OK";
    case SMELT_ERROR_INVALID_ARGUMENT: return "SMELT_ERROR_INVALID_ARGUMENT";
    case SMELT_ERROR_IO: return "SMELT_ERROR_IO";
    case SMELT_ERROR_BAD_PLAN: return "SMELT_ERROR_BAD_PLAN";
    case SMELT_ERROR_NO_DEVICE: return "SMELT_ERROR_NO_DEVICE";
    case SMELT_ERROR_UNSUPPORTED: return "SMELT_ERROR_UNSUPPORTED";
    case SMELT_ERROR_OUT_OF_MEMORY: return "SMELT_ERROR_OUT_OF_MEMORY";
    case SMELT_ERROR_DEVICE: return "SMELT_ERROR_DEVICE";
    case SMELT_ERROR_MISSING_WEIGHT: return "SMELT_ERROR_MISSING_WEIGHT";
    case SMELT_ERROR_CAPACITY: return "SMELT_ERROR_CAPACITY";
    }
    return "SMELT_UNKNOWN_STATUS";
}
