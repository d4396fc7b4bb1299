/* reference.h - the fp32 reference backend: the IR interpreted on the CPU.
 *
 * `ref` is smelt's numeric oracle (docs/design.md §6, §7): every other backend
 * and every PyTorch fixture is compared against it. It runs the ops of an
 * inferred module in program order, one plain C function per op, in fp32
 * with double accumulation, whatever dtypes the IR names. It is written for
 * clarity, not speed; a 2-layer toy model still takes milliseconds.
 *
 *   ref_model *r = ref_model_create(&m, read_weight, &file, &diag);
 *   if (!r) ...                                       // errors reported
 *   int32_t ids[3] = {1, 5, 9}, pos[3] = {0, 1, 2};   // prefill
 *   float logits[3 * VOCAB];
 *   if (!ref_model_step(r, ids, pos, 3, logits, 3 * VOCAB, &diag)) ...
 *   int32_t next = 42, at = 3;                        // decode one token
 *   ref_model_step(r, &next, &at, 1, logits, VOCAB, &diag);
 *   ref_model_reset(r);                               // a new sequence
 *   ref_model_free(r);
 *
 * Conventions: the module's inputs are exactly the input ops named "ids" and
 * "pos" (integer, shape [tokens]); its output is the output op named
 * "logits" (float; written flattened row-major, [tokens, vocab] for a
 * language model). The only symbol it can bind is the token dim, dim 0 of
 * "ids", which each step binds to its token count.
 *
 * Every attention op owns a KV cache of max_seq positions, allocated at
 * create time: a step writes the keys and values of its tokens at their
 * positions, then attends over the cache. A step that fails may have
 * written part of the caches; call ref_model_reset before reusing it.
 */
#ifndef SMELT_REFERENCE_H
#define SMELT_REFERENCE_H

#include "diag.h"
#include "ir.h"

#include <stdbool.h>
#include <stdint.h>

/* Fills dst (count floats, row-major in the weight's IR type) with the data
 * of weight op `op` (an index into m->ops). False when it cannot. */
typedef bool (*ref_weight_reader)(void *context, uint32_t op, float *dst, uint64_t count);

/* Fills dst (bytes) with quantized weight op `op` in quant/quant.h's packed
 * layout, in the format its attributes give. False when it cannot. */
typedef bool (*ref_packed_weight_reader)(void *context, uint32_t op, uint8_t *dst, uint64_t bytes);

typedef struct ref_model ref_model;

/* Prepares to run module m (infer-shapes has run: all types known; it must
 * stay alive while the ref_model lives). Loads every weight through
 * read_weight once. NULL after reporting every problem found. */
ref_model *ref_model_create(const ir_module *m, ref_weight_reader read_weight, void *context, diag_engine *d);
/* The same, for a module with quantized weights (precision): each is read
 * packed through read_packed and dequantized once, element by element, as
 * quant_value defines; its matmuls then compute in f32 on those values, the
 * arithmetic every backend of a quantized plan is checked against. */
ref_model *ref_model_create_packed(const ir_module *m, ref_weight_reader read_weight,
                                   ref_packed_weight_reader read_packed, void *context, diag_engine *d);

/* One step: n tokens with their ids and positions (prefill: the prompt with
 * positions 0..n-1; decode: one token at the next position). Binds the token
 * symbol to n. Writes the output `logits` to logits (capacity given, in
 * floats); false with an error on bad input (n beyond the symbol's bound, a
 * position beyond an attention's max_seq, an id outside the embedding
 * table, too small a capacity). */
bool ref_model_step(ref_model *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits,
                    uint64_t logits_capacity, diag_engine *d);

/* The last dim of the `logits` output (1 for a scalar). */
uint64_t ref_model_vocab(const ref_model *r);
/* Floats that ref_model_step writes for n tokens (0 when n is beyond the
 * token bound). */
uint64_t ref_model_output_count(const ref_model *r, uint32_t n);
/* An observer of matmul inputs, for calibration (driver/calibrate.c):
 * called as each live matmul op `op` is about to run, with its input x as
 * `rows` rows of `cols` floats (x's leading dims flattened, row-major; cols
 * is its last dim, the matmul's inner dim). The pointer is valid during the
 * call only. With none set (the default) a step does nothing extra. */
typedef void (*ref_matmul_observer)(void *context, uint32_t op, const float *x, uint64_t rows, uint64_t cols);
/* Sets the observer (NULL: none) for the steps that follow. */
void ref_model_observe_matmuls(ref_model *r, ref_matmul_observer observer, void *context);
/* An observer of the experts' inputs inside moe op `op`, for calibration:
 * for every token and each expert it is routed to, the input x[cols] that
 * the expert's gate and up multiply (projection 0) and the hidden row
 * silu(gate x) * up x[cols] that its down multiplies (projection 1). Valid
 * during the call only. Set with the matmul observer's context (NULL: none). */
typedef void (*ref_expert_observer)(void *context, uint32_t op, uint32_t projection, uint64_t expert,
                                    const float *x, uint64_t cols);
void ref_model_observe_experts(ref_model *r, ref_expert_observer observer);

/* Forgets the KV caches (a new sequence). */
void ref_model_reset(ref_model *r);
void ref_model_free(ref_model *r);

#endif
