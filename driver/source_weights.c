/* source_weights.c - a checkpoint bound to a model source's weight ops: the
 * weight reader the reference backend and the plan compiler take. */
#include "driver_internal.h"

#include <string.h>

bool drv_source_weights_open(drv_source_weights *w, const char *path, const char *config_path,
                             const ir_module *m, diag_engine *d) {
    memset(w, 0, sizeof *w);
    w->module = m;
    /* A pre-quantized checkpoint (quantization_config) binds its quantized tensors. */
    qck_scheme scheme;
    return qck_scheme_of_file(config_path, &scheme, d) && st_checkpoint_open(path, &w->checkpoint, d) &&
           fe_bind_weights_quantized(m, &w->checkpoint, &scheme, d, &w->binding);
}

bool drv_source_weights_read(void *context, uint32_t op, float *dst, uint64_t count) {
    const drv_source_weights *w = context;
    return fe_weight_read_f32(&w->binding, op, dst, count);
}

void drv_source_weights_close(drv_source_weights *w) {
    fe_weight_binding_free(&w->binding);
    st_checkpoint_close(&w->checkpoint);
}
