/* weights.c - the CLI's bridge from a checkpoint to the weight readers that
 * the reference backend and the plan compiler take. */
#include "cli.h"

#include <string.h>

bool cli_weights_open(cli_weights *w, const char *path, const ir_module *m, diag_engine *d) {
    memset(w, 0, sizeof *w);
    return st_checkpoint_open(path, &w->checkpoint, d) && fe_bind_weights(m, &w->checkpoint, d, &w->binding);
}

bool cli_weights_read(void *context, uint32_t op, float *dst, uint64_t count) {
    const cli_weights *w = context;
    return fe_weight_read_f32(&w->binding, op, dst, count);
}

void cli_weights_close(cli_weights *w) {
    fe_weight_binding_free(&w->binding);
    st_checkpoint_close(&w->checkpoint);
}
