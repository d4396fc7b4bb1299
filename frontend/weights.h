/* weights.h - binding the weight ops of an IR module to checkpoint tensors.
 *
 *   fe_weight_binding b;
 *   bool ok = fe_bind_weights(&module, &checkpoint, &diag, &b);  // reports every problem
 *   float *w = malloc(n * sizeof *w);            // n = elements of the weight's IR type
 *   fe_weight_read_f32(&b, op, w, n);            // dense, row-major, f32
 *   fe_weight_binding_free(&b);
 *
 * Every live `weight` op names its tensor by its "name" attribute. When its
 * "stack" attribute is not empty (say "e"), the name is a template holding
 * "{e}" and dim 0 of the op's type counts the parts: part i is the tensor
 * named with every "{e}" replaced by i, of shape dims[1..]; the parts are
 * stacked along a new dim 0 (Mixtral's per-expert w1/w2/w3). When its
 * "transposed" attribute is true (a matrix, not stacked), the tensor is the
 * transpose of the op's type and is read transposed.
 *
 * Each tensor must exist, have a float dtype (F32, F16, BF16, F8_E4M3,
 * F8_E5M2; it is converted on reading, whatever dtype the model declares)
 * and exactly the expected shape; weight dims must be constants. Errors are
 * reported at the weight's source location, one per problem. Checkpoint
 * tensors that no weight uses are listed in one error, except those that
 * match one of the module's `ignore` patterns (ir_tensor_is_ignored: a tied
 * lm_head.weight copy, rotary inv_freq buffers, what --allow-unused-tensor
 * names): a tensor left out is a part of the network not computed.
 *
 * A pre-quantized checkpoint (AWQ, GPTQ, FP8: fe_bind_weights_quantized)
 * binds each quantized Linear to its tensors and reads it dequantized.
 *
 * The binding points into the checkpoint, which must stay open while the
 * binding is used.
 */
#ifndef SMELT_FE_WEIGHTS_H
#define SMELT_FE_WEIGHTS_H

#include "checkpoint.h"
#include "ir.h"
#include "quant_checkpoint.h"

typedef struct fe_bound_weight {
    bool bound;              /* the op is a weight and all its parts were found and match */
    uint32_t part_count;     /* 1, or dim 0 of the type when stacked */
    const st_tensor **parts; /* part_count tensors, in stack order */
    uint64_t element_count;  /* of the whole weight: product of the IR type's dims */
    /* Pre-quantized (quant_checkpoint.h): each part is the Linear weight
     * names[i] of the checkpoint's scheme (parts[i] is then its first
     * tensor, qweight or the F8 weight). */
    bool quantized;
    const char **names;
    /* The op's value [N, K] is the transpose of the tensor parts[0]
     * [K, N] (the weight's "transposed" attribute, ops.def); read transposed. */
    bool transposed;
} fe_bound_weight;

typedef struct fe_weight_binding {
    arena arena;
    qck_scheme scheme; /* of a pre-quantized checkpoint; QCK_METHOD_NONE else */
    const ir_module *module;
    const st_checkpoint *checkpoint;
    diag_engine *diag;        /* fe_bind_weights's: fe_weight_read_f32 reports there */
    fe_bound_weight *weights; /* one per op of the module, by op index */
    uint32_t op_count;
    uint32_t unused_count; /* checkpoint tensors no weight uses (ignored ones included) */
} fe_weight_binding;

/* Binds every live weight op of m. `out` is initialised whatever the result:
 * free it with fe_weight_binding_free. False when any weight failed. */
bool fe_bind_weights(const ir_module *m, const st_checkpoint *ck, diag_engine *d, fe_weight_binding *out);
void fe_weight_binding_free(fe_weight_binding *b);

/* The same for a pre-quantized checkpoint of `scheme` (quant_checkpoint.h;
 * NULL: none): a weight whose Linear has quantized tensors binds to them
 * (all of them counted as used), its [out, in] checked against the op's
 * type, and reads as its exact dequantized values (quant_value). */
bool fe_bind_weights_quantized(const ir_module *m, const st_checkpoint *ck, const qck_scheme *scheme,
                               diag_engine *d, fe_weight_binding *out);

/* The binding of op `op`, or NULL when it is no successfully bound weight. */
const fe_bound_weight *fe_weight_binding_get(const fe_weight_binding *b, uint32_t op);

/* Writes the weight of op `op` as `count` f32 values in the row-major layout
 * of its IR type (parts one after the other when stacked). False, writing
 * nothing, when the op is not bound or `count` is not its element count;
 * false after an error (to the binding's diag engine) when the checkpoint
 * was truncated after it was opened (st_tensor_read_f32). */
bool fe_weight_read_f32(const fe_weight_binding *b, uint32_t op, float *dst, uint64_t count);

/* The name of part `index` of a stacked weight: `template` with every
 * "{var}" replaced by `index`, in arena a. */
char *fe_stacked_part_name(arena *a, const char *template, const char *var, uint64_t index);

/* A bound pre-quantized weight (unstacked) as the checkpoint packs it, in
 * quant.h's layout: *format (method "checkpoint") and, when dst is not NULL,
 * its layout's `bytes` bytes copied into dst exactly as qck_read_weight
 * unpacks them. False when the op is no bound pre-quantized weight, or
 * `bytes` is not its layout's size, or the read fails (reported to the
 * binding's diag engine). */
bool fe_weight_read_packed(const fe_weight_binding *b, uint32_t op, quant_format *format, uint8_t *dst,
                           uint64_t bytes);

#endif
