/* quant_import.c - a pre-quantized checkpoint (AWQ, GPTQ, FP8:
 * frontend/quant_checkpoint.h) into a plan without re-quantizing: each
 * quantized weight op takes the checkpoint's format before the passes run
 * (the precision pass keeps method "checkpoint" under every preset), and
 * its bytes are the checkpoint's, unpacked into quant.h's layout. */
#include "driver_internal.h"

#include "pass.h"

#include <stdlib.h>
#include <string.h>

/* Appends the static activation scale of FP8 weight op `op` (its
 * checkpoint's input_scale) to *scales. */
static bool add_input_scale(const ir_module *m, uint32_t op, const qck_scheme *s, const st_checkpoint *ck,
                            pass_act_scale **scales, uint32_t *count, diag_engine *d) {
    const char *name = ir_op_string(m, op, "name");
    qck_weight w;
    if (qck_read_weight(s, ck, name, &w, d) != QCK_QUANTIZED) return false;
    bool ok = true;
    if (w.has_input_scale) {
        pass_act_scale *grown = realloc(*scales, (*count + 1) * sizeof *grown);
        if (grown) {
            *scales = grown;
            grown[(*count)++] =
                (pass_act_scale){.weight = name, .scale = w.input_scale * quant_column_scale(&w.tensor, 0)};
        } else {
            diag_error(d, SMELT_NO_LOC, "out of memory reading the checkpoint's input scales");
            ok = false;
        }
    }
    qck_weight_free(&w);
    return ok;
}

bool drv_import_checkpoint_formats(ir_module *m, const char *config_path, const char *weights_path,
                                   pass_act_scale **scales, uint32_t *count, diag_engine *d) {
    qck_scheme s;
    if (!qck_scheme_of_file(config_path, &s, d)) return false;
    if (s.method == QCK_METHOD_NONE || !weights_path) return true;
    st_checkpoint ck;
    if (!st_checkpoint_open(weights_path, &ck, d)) return false;
    quant_format *formats = malloc((m->op_count ? m->op_count : 1) * sizeof *formats);
    bool ok = formats != NULL;
    if (!ok) diag_error(d, SMELT_NO_LOC, "out of memory reading the checkpoint's quantization formats");
    ok = ok && qck_module_formats(m, &s, &ck, formats, d);
    for (uint32_t op = 0; ok && op < m->op_count; op++) {
        if (formats[op].kind == QUANT_NONE) continue;
        ir_weight_set_quant(m, op, &formats[op]);
        m->values[m->ops[op].results[0]].type.dtype = quant_code_dtype(formats[op].kind);
        if (s.method == QCK_METHOD_FP8 && s.fp8_static_input)
            ok = add_input_scale(m, op, &s, &ck, scales, count, d);
    }
    free(formats);
    st_checkpoint_close(&ck);
    return ok;
}

bool drv_read_checkpoint_packed(const drv_source_weights *w, uint32_t op, const quant_format *f, uint8_t *dst,
                                uint64_t bytes) {
    quant_format got, want = *f;
    if (!fe_weight_read_packed(&w->binding, op, &got, dst, bytes)) return false;
    want.interleaved = got.interleaved; /* the codes' order may differ: reordered below */
    if (!quant_format_same_storage(&got, &want)) return false;
    if (got.interleaved == f->interleaved) return true;
    /* the plan's codes are interleaved (precision): the checkpoint's row-major ones reordered */
    const ir_type *t = &w->module->values[w->module->ops[op].results[0]].type;
    quant_tensor q = {.format = got, .data = dst};
    return !quant_layout_of(&got, (uint64_t)t->dims[0].size, (uint64_t)t->dims[1].size, &q.layout) &&
           q.layout.total == bytes && !quant_set_interleaved(&q, f->interleaved);
}
