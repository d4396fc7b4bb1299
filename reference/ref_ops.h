/* ref_ops.h - inside the reference backend: tensors, op attributes, KV
 * caches, and one function per op (ref_ops.c, ref_ops_attention.c,
 * ref_ops_layout.c) that ref_model.c calls in program order.
 *
 * An op function reads its operands and fills its results, whose shapes the
 * step loop has already resolved (symbols bound) and allocated from the IR
 * types; ref_model_create has checked that those types are what the shape
 * rules give, so an op trusts the shapes it is handed. Only what depends on
 * runtime data (ids, positions) can fail: the op reports it at its location
 * and returns false.
 */
#ifndef SMELT_REF_OPS_H
#define SMELT_REF_OPS_H

#include "diag.h"
#include "ir.h"
#include "reference.h"
#include "quant.h"
#include "rope.h"

#include <stdbool.h>
#include <stdint.h>

/* Element type of a tensor: float values, or integer ones (ids, positions,
 * argmax results; i32 and i64 values are both held as int32). */
typedef enum ref_elem { REF_F32, REF_I32 } ref_elem;

typedef struct ref_tensor {
    ref_elem elem;
    uint8_t rank;
    uint64_t dims[IR_MAX_DIMS]; /* resolved: the token symbol bound to n */
    uint64_t count;             /* product of dims; 1 for a scalar */
    float *f;                   /* [count] when elem == REF_F32, else NULL */
    int32_t *i;                 /* [count] when elem == REF_I32, else NULL */
} ref_tensor;

_Static_assert(sizeof(float) == sizeof(int32_t), "layout ops move either element as 4 bytes");

/* The attributes an op runs with (its own, or its schema's defaults), read
 * once at create time; each op uses the fields its comment names. */
typedef struct ref_attrs {
    bool in_out;         /* matmul: w is [K, N] rather than [N, K] */
    bool bias;           /* matmul: operand 2 is the bias (ir_matmul_bias) */
    bool act_codes;      /* matmul: the last two operands are the codes and scales of x (ops.def) */
    quant_kind w8a8;     /* matmul: act_quant; quantize: dtype; QUANT_INT8 or QUANT_FP8 (else QUANT_NONE) */
    float w8a8_scale;    /* matmul with act_quant, quantize: the static per-tensor scale; 0: per token */
    double eps;          /* rms_norm, layer_norm */
    double offset;       /* rms_norm: added to the weight (Gemma: 1) */
    ir_rope_params rope; /* rope, rope_table: frequencies and rotated dims (ir/rope.h) */
    bool interleaved;    /* rope: GPT-J pairs (2i, 2i+1), else neox (i, i + r/2) */
    double scale;        /* attention: multiplies q.k */
    bool causal;         /* attention */
    int64_t window;      /* attention: > 0 keeps positions p > pos - window */
    double softcap;      /* attention: > 0 caps scores as softcap * tanh(s / softcap) */
    bool kv_fp8;         /* attention: the cache holds each kv head's row as f8e4m3 with its own
                            scale (kv_dtype "f8e4m3"): rows are rounded through it when written */
    bool gelu_tanh;      /* gelu: tanh approximation, else erf */
    int64_t top_k;       /* moe */
    bool normalize;      /* moe: renormalise the top_k weights */
    quant_kind gate_up_w8a8, down_w8a8;        /* moe: gate_up_act_quant, down_act_quant (QUANT_NONE: none) */
    float gate_up_w8a8_scale, down_w8a8_scale; /* moe, act_scale tensor: the static scales of x and of
                                                  the hidden rows; 0: per row */
    unsigned axis;                             /* softmax, concat, split, slice, argmax: in [0, rank) */
    int64_t start, end;                        /* slice: [start, end) */
    const int64_t *perm;                       /* transpose: result dim i is operand dim perm[i] */
    float value;                               /* const */
} ref_attrs;

/* The KV cache of one attention op. A position holds data once a step has
 * written it (written[p]); reset clears the flags and the data. */
typedef struct ref_kv_cache {
    uint64_t max_seq, kv_heads, head_dim, value_dim;
    float *keys;    /* [max_seq, kv_heads, head_dim] */
    float *values;  /* [max_seq, kv_heads, value_dim] */
    bool *written;  /* [max_seq] */
    uint64_t end;   /* one past the highest written position; 0 when empty */
    double *scores; /* [max_seq] scratch: one query's scores */
    double *mixed;  /* [value_dim] scratch: one query's weighted sum of values */
} ref_kv_cache;

/* One op to run: operands in, results out (allocated, shapes set). */
typedef struct ref_call {
    const ref_tensor *const *in;
    uint32_t in_count;
    ref_tensor *out;
    uint32_t out_count;
    const ref_attrs *attrs;
    ref_kv_cache *kv; /* attention only */
    smelt_loc loc;    /* where errors about the op's data are reported */
    diag_engine *d;
    uint32_t op;                         /* the op's index: for the observer */
    ref_expert_observer expert_observer; /* moe only; NULL: none */
    void *observer_context;
    /* A matmul with act_quant: its weight's packed layout (codes, scales,
     * column scales; in[1] holds their values). */
    const quant_tensor *weight_codes;
    /* A moe with gate_up_act_quant or down_act_quant: its gate, up and down
     * stacks' packed layouts (layout: one expert's; data: the whole stack,
     * expert e at e * expert_stride[i]). */
    const quant_tensor *expert_codes[3];
    uint64_t expert_stride[3];
} ref_call;

/* Runs a compute or layout op of kind `kind` (not input, weight, const or
 * output: the step loop handles those). False after reporting bad data. */
bool ref_run_op(ir_op_kind kind, const ref_call *c);

/* One row of activations row[0..K) becomes, in place, codes of kind `kind`
 * (int8 or E4M3; ops.def, quantize and matmul's act_quant), each as the
 * value it stands for before the scale; returns the row's scale
 * (static_scale when > 0, else its absmax / 127 or / 448, 1 for a row of
 * zeros). The one coding of activations in the reference. */
float ref_quantize_row(quant_kind kind, float *row, uint64_t inner, float static_scale);
/* W8A8 (ops.def, matmul act_quant): x[0..K) times w's column scales as
 * codes of kind `kind` (int8 or E4M3), each as the value it stands for
 * before the scale, into codes[K]; returns the row's scale (static_scale
 * when > 0, else its own absmax / 127 or / 448, 1 for a row of zeros). */
float ref_w8a8_row_codes(quant_kind kind, const float *x, const quant_tensor *w, uint64_t inner,
                         float static_scale, float *codes);
/* The value of w's code (row n, column k) without its scale: an int8
 * integer or an E4M3 value (exact in float). */
float ref_w8a8_weight_code(quant_kind kind, const quant_tensor *w, uint64_t n, uint64_t k);

/* ref_ops.c: math */
bool ref_op_embedding(const ref_call *c);
bool ref_op_matmul(const ref_call *c);
bool ref_op_quantize(const ref_call *c);
bool ref_op_add(const ref_call *c);
bool ref_op_mul(const ref_call *c);
bool ref_op_rms_norm(const ref_call *c);
bool ref_op_layer_norm(const ref_call *c);
bool ref_op_softmax(const ref_call *c);
bool ref_op_silu(const ref_call *c);
bool ref_op_gelu(const ref_call *c);
bool ref_op_tanh(const ref_call *c);
bool ref_op_sigmoid(const ref_call *c);
bool ref_op_argmax(const ref_call *c);
/* ref_ops_attention.c: positions, attention, experts */
bool ref_op_rope(const ref_call *c);
bool ref_op_rope_table(const ref_call *c);
bool ref_op_attention(const ref_call *c);
bool ref_op_moe(const ref_call *c);
/* ref_ops_layout.c: data moved, never changed */
bool ref_op_reshape(const ref_call *c);
bool ref_op_transpose(const ref_call *c);
bool ref_op_concat(const ref_call *c);
bool ref_op_split(const ref_call *c);
bool ref_op_slice(const ref_call *c);

/* Product of dims [from, to) of t (1 when empty). */
uint64_t ref_dims_product(const ref_tensor *t, unsigned from, unsigned to);

/* The tensor's elements as bytes, whatever their type (layout ops). */
static inline unsigned char *ref_bytes(const ref_tensor *t) {
    return t->elem == REF_F32 ? (unsigned char *)t->f : (unsigned char *)t->i;
}

#endif
