/* lower.h - from an inferred module to what a plan executes: the kernels
 * (one per distinct source), the launch program, the memory plan and the
 * weight table (runtime/program.h).
 *
 *   cg_lowered l;
 *   cg_options o = {.precision = CG_PRECISION_BF16};
 *   if (!cg_lower_module(&m, &o, 512, &l, &diag)) ...   // errors reported
 *   ... l.kernels[i].source, l.program.instrs ...
 *   cg_lowered_free(&l);
 *
 * Each live op becomes what its emitter says (codegen/emit.h): kernels,
 * a GEMM (matmul), an alias of its operand's buffer (reshape) or nothing
 * (inputs, weights, constants baked into their users, outputs). Kernels with
 * the same name have the same source (emitters name kernels by their
 * specialisation), so the 32 layers of a model share one kernel per family.
 *
 * Memory: every value that needs a buffer gets an arena offset from a
 * liveness scan over the op list (first fit; a value is freed after its last
 * use, aliases extend their root's life), sized for max_tokens tokens.
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
    program program; /* arrays in the arena */
    uint64_t *value_offsets; /* per IR value: arena offset, or UINT64_MAX (no arena buffer) */
    uint32_t launches_per_step; /* kernel launches + GEMMs of one step */
} cg_lowered;

/* max_tokens: the token bound the arena is sized for (<= the token symbol's
 * bound; 0 means that bound). `out` is initialised whatever the result. */
bool cg_lower_module(const ir_module *m, const cg_options *o, int64_t max_tokens, cg_lowered *out,
                     diag_engine *d);
void cg_lowered_free(cg_lowered *l);

#endif
