/* precision.c - the precision pass: the storage dtype of every value.
 *
 * Requires: every value typed (infer-shapes).
 * Guarantees: each value's dtype is the dtype it is stored in, chosen by the
 *   policy in pass_options.precision, and m->precision names that policy;
 *   from then on float ops may mix float dtypes (they compute in f32 and
 *   store in their result's dtype), which the shape rules and the verifier
 *   accept. Integer values are stored as i32 under every policy (ids,
 *   positions and argmax results: the runtime bounds them below 2^31).
 * Policies:
 *   f32   every float value f32;
 *   bf16  every float value bf16, except what an `output` op consumes, which
 *         stays f32 (the runtime returns f32 logits) — and with it every
 *         value that shares its buffer through reshape views.
 * KV caches: their dtype, pass_options.kv_cache, is precision_kv_cache.c's.
 * Running it again recomputes every dtype from the float/integer class of
 * the value, so it is idempotent and a later policy replaces an earlier one.
 * Breaks: nothing; codegen refuses, at the op, a dtype it has no kernels for.
 */
#include "pass.h"

#include <stdlib.h>
#include <string.h>

static const char *const policies[] = {"f32", "bf16"};

bool pass_precision(ir_module *m, const pass_options *o, diag_engine *d) {
    const char *policy = o && o->precision ? o->precision : "f32";
    bool bf16 = strcmp(policy, "bf16") == 0;
    if (!bf16 && strcmp(policy, "f32") != 0) {
        diag_error(d, SMELT_NO_LOC, "unknown precision '%.*s%s'; known policies: %s, %s", DIAG_NAME(policy),
                   policies[0], policies[1]);
        return false;
    }
    ir_value_id *root = ir_view_roots(m);
    bool *read_by_output = calloc(m->value_count ? m->value_count : 1, sizeof *read_by_output);
    if (!root || !read_by_output) {
        free(root);
        free(read_by_output);
        diag_error(d, SMELT_NO_LOC, "out of memory assigning dtypes to %u values", m->value_count);
        return false;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (!op->dead && op->kind == IR_OP_OUTPUT && op->operand_count == 1)
            read_by_output[root[op->operands[0]]] = true;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        for (uint32_t r = 0; r < op->result_count; r++) {
            ir_value_id v = op->results[r];
            ir_type *t = &m->values[v].type;
            if (t->dtype == SMELT_DTYPE_UNKNOWN) continue; /* the verifier reports untyped values */
            if (!smelt_dtype_is_float(t->dtype))
                t->dtype = SMELT_DTYPE_I32;
            else
                t->dtype = bf16 && !read_by_output[root[v]] ? SMELT_DTYPE_BF16 : SMELT_DTYPE_F32;
        }
    }
    free(root);
    free(read_by_output);
    m->precision = bf16 ? "bf16" : "f32";
    return pass_precision_kv_cache(m, o ? o->kv_cache : NULL, m->precision, d);
}
