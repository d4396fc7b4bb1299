/* driver.c - runs a list of passes: verify, run, verify, print on request.
 *
 * The module is verified before the first pass, so that every pass may rely
 * on a well-formed module (valid ids, counts and attribute kinds), and after
 * each pass, so that a pass that breaks an invariant is named:
 *
 *   smelt: error: after pass 'canonicalize': the module does not verify
 *   <the verifier's errors>
 *
 * The first failing pass stops the run.
 */
#include "ir_io.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>

/* Does the module verify (1, or 0)? Asked of a private engine that keeps
 * quiet and stops at the first error, so that the caller can head the
 * errors. -1: out of memory, which says nothing of the module. */
static int verifies(const ir_module *m) {
    char *text = NULL;
    size_t size = 0;
    FILE *sink = open_memstream(&text, &size);
    if (!sink) return -1;
    diag_engine quiet;
    diag_init(&quiet, sink);
    quiet.max_errors = 1;
    bool ok = ir_verify(m, &quiet);
    diag_free(&quiet);
    /* The buffer is NULL when fclose could not make it (out of memory). */
    bool closed = fclose(sink) == 0 && text;
    int result = ok ? 1 : !closed || strstr(text, "out of memory") ? -1 : 0;
    free(text);
    return result;
}

/* Verifies; on failure reports every violation, after a headline naming the
 * pass that ran last (a bug of ours). An input module (pass_name NULL) that
 * does not verify is bad input: its errors speak for themselves. */
static bool verify_or_report(const ir_module *m, const char *pass_name, diag_engine *d) {
    int verified = verifies(m);
    if (verified == 1) return true;
    if (verified < 0) {
        diag_error(d, SMELT_NO_LOC, "out of memory verifying the module");
        return false;
    }
    if (pass_name) diag_error(d, SMELT_NO_LOC, "after pass '%s': the module does not verify", pass_name);
    ir_verify(m, d);
    return false;
}

static bool wants_print(const char *print_after, const char *pass_name) {
    return print_after && (strcmp(print_after, "all") == 0 || strcmp(print_after, pass_name) == 0);
}

bool pass_run_list(ir_module *m, const pass_info *const *passes, size_t count,
                   const pass_driver_options *options, diag_engine *d) {
    const char *print_after = options ? options->print_after : NULL;
    FILE *out = options && options->print_out ? options->print_out : stdout;
    if (print_after && strcmp(print_after, "all") != 0 && !pass_find(print_after)) {
        char known[512];
        diag_error(d, SMELT_NO_LOC, "cannot print the IR after unknown pass '%.*s%s'; known passes: %s",
                   DIAG_NAME(print_after), pass_names(known, sizeof known));
        return false;
    }
    arena_recovery recovery; /* a pass or a printout that runs out of memory */
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    if (!verify_or_report(m, NULL, d)) {
        arena_recovery_leave(&recovery);
        return false;
    }
    for (size_t i = 0; i < count; i++) {
        const pass_info *pass = passes[i];
        unsigned errors_before = d->error_count;
        if (!pass->run(m, options ? &options->pass : &(pass_options){0}, d)) {
            if (d->error_count == errors_before) diag_error(d, SMELT_NO_LOC, "pass '%s' failed", pass->name);
            arena_recovery_leave(&recovery);
            return false;
        }
        if (!verify_or_report(m, pass->name, d)) {
            arena_recovery_leave(&recovery);
            return false;
        }
        if (wants_print(print_after, pass->name)) {
            fprintf(out, "# -----// IR Dump After %s //----- #\n", pass->name);
            ir_print_text(m, out);
        }
    }
    arena_recovery_leave(&recovery);
    return true;
}
