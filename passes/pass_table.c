/* pass_table.c - the passes in pipeline order, and lists of them by name.
 *
 * docs/design.md §2 fixes the order: infer-shapes, canonicalize, decompose,
 * precision, partition, kv-paging, fuse, wanted-rows, schedule, plan-memory. A pass is
 * listed here once its file exists.
 */
#include "pass.h"

#include <string.h>

static bool run_infer_shapes(ir_module *m, const pass_options *o, diag_engine *d) {
    (void)o;
    return pass_infer_shapes(m, d);
}

static bool run_canonicalize(ir_module *m, const pass_options *o, diag_engine *d) {
    (void)o;
    return pass_canonicalize(m, d);
}

/* schedule comes before plan-memory: liveness needs the launch order. */
static const pass_info pipeline[] = {
    {"infer-shapes", "infer the dtype and shape of every value from the op shape rules", run_infer_shapes},
    {"canonicalize", "fold constants, simplify identities, merge equal ops (CSE), drop unused ops (DCE)",
     run_canonicalize},
    {"precision",
     "set the storage dtype of every value, and quantize matmul weights, from the precision preset (f32, "
     "bf16, int4-rtn, int8, fp8)",
     pass_precision},
    {"fuse", "assign every op that does work to a kernel group (one op per group today)", pass_fuse},
    {"wanted-rows", "mark the output head: the ops that compute only the rows whose logits a step wants",
     pass_wanted_rows},
    {"schedule", "give every kernel group its launch step", pass_schedule},
    {"plan-memory", "give every value its buffer: arena offsets by liveness (first fit), weight indices",
     pass_plan_memory},
};

const pass_info *pass_table(size_t *count) {
    *count = sizeof pipeline / sizeof pipeline[0];
    return pipeline;
}

static const pass_info *find_n(const char *name, size_t length) {
    for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0]; i++)
        if (strlen(pipeline[i].name) == length && memcmp(pipeline[i].name, name, length) == 0)
            return &pipeline[i];
    return NULL;
}

const pass_info *pass_find(const char *name) { return find_n(name, strlen(name)); }

const char *pass_names(char *buffer, size_t size) {
    size_t used = 0;
    buffer[0] = '\0';
    for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0] && used < size; i++) {
        int n = snprintf(buffer + used, size - used, "%s%s", i ? ", " : "", pipeline[i].name);
        if (n < 0) break;
        used += (size_t)n;
    }
    return buffer;
}

/* Reports `name` (length bytes, not terminated) as unknown. */
static void report_unknown(diag_engine *d, const char *name, size_t length) {
    char known[512];
    int shown = length > DIAG_NAME_MAX ? DIAG_NAME_MAX : (int)length;
    diag_error(d, SMELT_NO_LOC, "unknown pass '%.*s%s'; known passes: %s", shown, name,
               length > DIAG_NAME_MAX ? "..." : "", pass_names(known, sizeof known));
}

bool pass_parse_list(const char *text, pass_list *out, diag_engine *d) {
    out->count = 0;
    bool ok = true;
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *start = p;
        while (start < end && (*start == ' ' || *start == '\t'))
            start++;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        size_t length = (size_t)(end - start);
        const pass_info *pass = find_n(start, length);
        if (length == 0) {
            char known[512];
            diag_error(d, SMELT_NO_LOC,
                       "expected a pass name in the pass list '%.*s%s', found an empty one; "
                       "known passes: %s",
                       DIAG_NAME(text), pass_names(known, sizeof known));
            ok = false;
        } else if (!pass) {
            report_unknown(d, start, length);
            ok = false;
        } else if (out->count == PASS_LIST_MAX) {
            diag_error(d, SMELT_NO_LOC, "the pass list names more than %d passes", PASS_LIST_MAX);
            return false;
        } else {
            out->items[out->count++] = pass;
        }
        if (!comma) break;
        p = comma + 1;
    }
    return ok;
}

bool pass_pipeline_until(const char *name, pass_list *out, diag_engine *d) {
    out->count = 0;
    bool all = strcmp(name, "all") == 0;
    if (!all && !pass_find(name)) {
        report_unknown(d, name, strlen(name));
        return false;
    }
    for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0]; i++) {
        out->items[out->count++] = &pipeline[i];
        if (!all && strcmp(pipeline[i].name, name) == 0) break;
    }
    return true;
}
