/* lower.h - renders a lowered module into what a plan executes: the kernels
 * (one per distinct source), the launch program, the memory plan and the
 * weight table (program.h). It decides nothing: the lowering passes did.
 *
 *   // after infer-shapes, canonicalize, precision, fuse, schedule, plan-memory
 *   cg_lowered l;
 *   if (!cg_lower_module(&m, &l, &diag)) ...   // errors reported
 *   ... l.kernels[i].source, l.program.instrs ...
 *   cg_lowered_free(&l);
 *
 * From the IR: storage dtypes (precision), kernel groups (fuse), their launch
 * order (schedule), every value's buffer and the arena size (plan-memory).
 * Each group becomes what its emitter says (codegen/emit.h): kernels, or a
 * GEMM (a matmul). Kernels with the same name have the same source (emitters
 * name kernels by their specialisation), so the 32 layers of a model share
 * one kernel per family. State buffers (the KV caches of attention) are the
 * emitters' (emit.h); the kv-paging pass will move them into the IR.
 */
#ifndef SMELT_CG_LOWER_H
#define SMELT_CG_LOWER_H

#include "emit.h"
#include "ir.h"
#include "program.h"

typedef struct cg_lowered {
    arena arena;
    cg_kernel *kernels; /* distinct kernels, indexed by prog_launch.kernel */
    uint32_t kernel_count;
    program program;            /* arrays in the arena */
    uint32_t launches_per_step; /* kernel launches + GEMMs of a decode step (T = 1; instructions
                                   guarded for larger steps are not counted) */
} cg_lowered;

/* `out` is initialised whatever the result. A module the lowering passes
 * have not run on is refused with a message that says which to run. */
bool cg_lower_module(const ir_module *m, cg_lowered *out, diag_engine *d);
void cg_lowered_free(cg_lowered *l);

#endif
