/* plan_error.h - the one way plan/ code words an error for its caller: a
 * message "PREFIX: what went wrong" (the plan's path, or a section's name)
 * written into the caller's buffer, as the readers and the writer return it.
 *
 *   if (size < 8) return plan_error(error, error_size, path, "%zu bytes is too short", size);
 *
 * plan/ code: it includes nothing from the compiler or the runtime.
 */
#ifndef SMELT_PLAN_ERROR_H
#define SMELT_PLAN_ERROR_H

#include <stdbool.h>
#include <stddef.h>

/* Writes "PREFIX: message" into error[0..error_size) (PREFIX NULL: "plan";
 * nothing when error is NULL or error_size 0; cut to fit); always returns
 * false, for `return plan_error(...)`. */
bool plan_error(char *error, size_t error_size, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
