/* emit_attention.h - what the three attention emitters share: the op's
 * shape as the kernels see it, the kernel names, the template writer and the
 * token-count rule that picks the decode or the prefill kernel of a step.
 *
 *   emit_attention.c          the op: shape checks, states, the KV cache
 *                             write (its own kernel, so that a fusion may
 *                             move it into the QKV epilogue), the scalar
 *                             tiled kernel (f32 prefill, and every step of
 *                             a shape the fast kernels do not take), and
 *                             which kernels an op gets
 *   emit_attention_decode.c   split-KV flash decoding (steps of at most
 *                             ATTENTION_DECODE_MAX_TOKENS tokens)
 *   emit_attention_prefill.c  FlashAttention-2 on tensor cores (longer
 *                             steps over bf16 or f16 caches)
 */
#ifndef SMELT_CG_EMIT_ATTENTION_H
#define SMELT_CG_EMIT_ATTENTION_H

#include "emit_internal.h"

/* Steps of at most this many tokens run the decode kernel, longer ones the
 * prefill kernel: decoding one token per sequence (and a few, for
 * speculative checks) has too few queries to fill an mma tile, and a prompt
 * has too many to be worth splitting the KV length for. */
enum { ATTENTION_DECODE_MAX_TOKENS = 4 };

typedef struct attention_shape {
    int64_t query_heads, kv_heads, head_dim, value_dim, max_seq, window;
    double softcap; /* > 0: scores are softcap * tanh(score / softcap) (Gemma 2) */
    bool causal;
    double scale;
    cg_count tokens;                    /* rows of q: T, or a constant */
    smelt_dtype key_dtype, value_dtype; /* of the caches: k's and v's own, or f8e4m3 (kv_dtype) */
    smelt_dtype input_dtype;            /* k's and v's storage dtype (the activations') */
    /* f8e4m3 caches: each row of a kv head has an f32 scale (states
     * CG_STATE_KEY_SCALES and CG_STATE_VALUE_SCALES, [max_seq, Hkv]); a
     * kernel reads code * scale, applying the key scale to the score and
     * the value scale to the softmax weight, never per element. */
    bool scaled;
} attention_shape;

/* "<prefix>_<dtypes>_h8_kv2_d32_ctx512[_kvf8e4m3][_win4][_noncausal][_scale0p3]":
 * everything the attention kernels' sources depend on besides what the
 * prefix (and the emitter's own suffix) names. */
const char *attention_kernel_name(cg_emit *e, const attention_shape *s, const char *prefix);

/* Grid rules that are 1 for the steps a kernel serves and 0 for the others
 * (the executor skips a launch with an empty grid). */
prog_affine attention_decode_steps(void);  /* T <= ATTENTION_DECODE_MAX_TOKENS */
prog_affine attention_prefill_steps(void); /* T > ATTENTION_DECODE_MAX_TOKENS */

/* Defines SCALE and CAPPED(score): the score as the op caps it,
 * SOFTCAP * tanhf(score / SOFTCAP) with a softcap, else the score itself. */
void attention_define_scoring(cg_emit *e, cg_text *t, const attention_shape *s);

/* Declares a kernel's k_scales and v_scales parameters (f8e4m3 caches,
 * read only) and defines KEY_SCALE(p) and VALUE_SCALE(p), the scales of
 * position p's row of kv head `kv_head` (a variable of the kernel); neither
 * without scales, where the templates' scale holes are empty. */
void attention_scale_params(cg_kernel_builder *b, const attention_shape *s);
void attention_define_scales(cg_text *t, const attention_shape *s);

/* Writes a kernel body kept as one readable template: each line of `text`
 * (leading blanks dropped; cg_line indents by braces). */
void attention_write_template(cg_text *t, const char *text);

/* A named hole of a template: `$name` in its text stands for `text`. */
typedef struct attention_hole {
    const char *name; /* letters and '_' */
    const char *text;
} attention_hole;

/* attention_write_template with each `$name` replaced by the text of the
 * hole of that name (every `$name` must have one); a line that held only
 * empty holes is left out. */
void attention_write_filled_template(cg_text *t, const char *text, const attention_hole *holes,
                                     int hole_count);

/* A statement snippet (cg_store's) without its ';', for a macro that is
 * used as a statement. */
const char *attention_without_semicolon(cg_emit *e, const char *statement);

/* The 16-byte-load emitters' conditions: whether rows of `dims` elements of
 * dtype `t` start on 16 bytes (so they can be read as uint4). */
bool attention_rows_vectorizable(int64_t dims, smelt_dtype t);

/* The kernels. Each adds one kernel to e->out. */
bool attention_decode_supported(const attention_shape *s);
void emit_attention_decode(cg_emit *e, const attention_shape *s);
bool attention_prefill_supported(const attention_shape *s);
/* `steps`: the grid rule of the steps it serves (every step, or the longer
 * ones when the decode kernel takes the short ones). */
void emit_attention_prefill(cg_emit *e, const attention_shape *s, prog_affine steps);

/* The decode kernel's workspace (states CG_STATE_PARTIALS and
 * CG_STATE_COUNTERS), in bytes. */
uint64_t attention_decode_partial_bytes(const attention_shape *s);
uint64_t attention_decode_counter_bytes(const attention_shape *s);

#endif
