/* plan_error.c - see plan_error.h. */
#include "plan_error.h"

#include <stdarg.h>
#include <stdio.h>

bool plan_error(char *error, size_t error_size, const char *prefix, const char *fmt, ...) {
    if (!error || error_size == 0) return false;
    int used = snprintf(error, error_size, "%s: ", prefix ? prefix : "plan");
    if (used < 0 || (size_t)used >= error_size) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error + used, error_size - (size_t)used, fmt, ap);
    va_end(ap);
    return false;
}
