/* rope.h - the rotary frequencies of a rope op, from its attributes: the one
 * computation that the shape rule (checks), the reference backend and the
 * rope emitter (which bakes the tables into the kernel) share.
 *
 * The variants are Hugging Face transformers' rope_type values, computed as
 * its modeling_rope_utils.py does, in float32 where it computes in float32
 * (so that inv_freq matches bit for bit: an ulp of inv_freq is an error of
 * position * ulp in the angle), in double where it computes in Python floats:
 *
 *   default   inv_freq[i] = 1 / theta^(2i / r)
 *   linear    inv_freq / factor
 *   dynamic   NTK-aware: transformers recomputes the base from the running
 *             sequence length once it passes max_position_embeddings, which a
 *             static plan cannot; below that length the frequencies are the
 *             default ones exactly, so smelt runs dynamic only there (the
 *             reference refuses later positions, codegen bounds the plan's
 *             positions by max_position_embeddings)
 *   llama3    Llama 3.1: wavelengths past original_max / low_freq_factor
 *             divided by factor, those under original_max / high_freq_factor
 *             kept, a smooth blend between
 *   yarn      interpolation and extrapolation blended by a linear ramp over
 *             the dims between the correction range of beta_fast/beta_slow;
 *             cos and sin scaled by attention_factor (from mscale when absent)
 *   longrope  Phi-3: inv_freq / short_factor[i], or / long_factor[i] in a call
 *             whose largest position + 1 exceeds original_max (transformers
 *             chooses per forward call, by max(position_ids) + 1); cos and sin
 *             scaled by attention_factor (sqrt(1 + ln s / ln original_max)
 *             with s = factor, or max / original_max, when absent)
 *
 * An attribute of 0 is "not given": factor (yarn, longrope: max_position_embeddings
 * / original_max_position_embeddings), original_max_position_embeddings
 * (max_position_embeddings, as transformers' standardize_rope_params),
 * attention_factor (computed), beta_fast/beta_slow (32 and 1, as transformers'
 * `or 32`), mscale/mscale_all_dim (unused unless both are given).
 */
#ifndef SMELT_IR_ROPE_H
#define SMELT_IR_ROPE_H

#include "ir.h"

#include <stddef.h>

typedef enum ir_rope_scaling {
    IR_ROPE_DEFAULT,
    IR_ROPE_LINEAR,
    IR_ROPE_DYNAMIC,
    IR_ROPE_LLAMA3,
    IR_ROPE_YARN,
    IR_ROPE_LONGROPE,
} ir_rope_scaling;

/* The attributes of one rope op, defaults filled in. */
typedef struct ir_rope_params {
    ir_rope_scaling scaling;
    double theta;
    int64_t rotary_dim; /* rotary_dim, or int(head_dim * partial_rotary_factor) when 0 */
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max_positions, max_positions;
    double attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
    bool truncate;
    const double *short_factor, *long_factor; /* [short_count], [long_count] */
    uint32_t short_count, long_count;
} ir_rope_params;

/* The parameters of rope (or rope_table) op `op` whose x has head dim `head_dim`. */
ir_rope_params ir_rope_params_of(const ir_module *m, uint32_t op, int64_t head_dim);

/* The parameters of a rope_table op (its rotary_dim is resolved, so no head
 * dim is needed). */
static inline ir_rope_params ir_rope_table_params_of(const ir_module *m, uint32_t op) {
    const ir_attr *rotary = ir_op_attr(m, op, "rotary_dim");
    return ir_rope_params_of(m, op, rotary && rotary->kind == IR_ATTR_INT ? rotary->as.i : 0);
}

/* Do a and b give the same frequencies (every parameter equal)? */
bool ir_rope_params_equal(const ir_rope_params *a, const ir_rope_params *b);

/* Whether the parameters make sense for their variant (and `head_dim`); when
 * not, a message for the op's location in `why`. */
bool ir_rope_params_check(const ir_rope_params *p, int64_t head_dim, char *why, size_t why_size);

typedef struct ir_rope_tables {
    uint32_t half;          /* rotated pairs: rotary_dim / 2 */
    float *inv_freq;        /* [half], the caller's */
    float *long_inv_freq;   /* [half] longrope's long set (the caller's), else NULL */
    int64_t long_after;     /* longrope: the long set when max position + 1 > this */
    float attention_factor; /* cos and sin are multiplied by it (1 but for yarn, longrope) */
} ir_rope_tables;

/* The number of floats the tables of `p` need: rotary_dim / 2, twice for
 * longrope (at least 1). */
size_t ir_rope_tables_floats(const ir_rope_params *p);

/* Computes the tables of checked parameters into `storage`
 * [ir_rope_tables_floats(p)], which the caller owns (an arena's, so that an
 * out-of-memory unwind leaks nothing). */
void ir_rope_tables_compute(const ir_rope_params *p, float *storage, ir_rope_tables *out);

/* The name of a scaling, as the attribute spells it. */
const char *ir_rope_scaling_name(ir_rope_scaling s);

#endif
