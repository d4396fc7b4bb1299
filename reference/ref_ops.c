/* ref_ops.c - the reference backend's math ops, one function per op, and the
 * dispatch from an op kind to its function.
 *
 * Semantics are those at the top of ir/ops.def, matched to Hugging Face
 * transformers: sums and dot products accumulate in double (this is the
 * oracle), results are stored as float. Shapes come resolved in the tensors
 * (see ref_ops.h); trailing comments give them, `...` being leading dims.
 */
#include "ref_ops.h"

#include "numeric.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t ref_dims_product(const ref_tensor *t, unsigned from, unsigned to) {
    uint64_t n = 1;
    for (unsigned i = from; i < to; i++)
        n *= t->dims[i];
    return n;
}

/* ---- dispatch ------------------------------------------------------------------ */

bool ref_run_op(ir_op_kind kind, const ref_call *c) {
    switch (kind) {
    case IR_OP_EMBEDDING: return ref_op_embedding(c);
    case IR_OP_MATMUL: return ref_op_matmul(c);
    case IR_OP_ADD: return ref_op_add(c);
    case IR_OP_MUL: return ref_op_mul(c);
    case IR_OP_RMS_NORM: return ref_op_rms_norm(c);
    case IR_OP_LAYER_NORM: return ref_op_layer_norm(c);
    case IR_OP_ROPE: return ref_op_rope(c);
    case IR_OP_ROPE_TABLE: return ref_op_rope_table(c);
    case IR_OP_ATTENTION: return ref_op_attention(c);
    case IR_OP_SOFTMAX: return ref_op_softmax(c);
    case IR_OP_SILU: return ref_op_silu(c);
    case IR_OP_GELU: return ref_op_gelu(c);
    case IR_OP_TANH: return ref_op_tanh(c);
    case IR_OP_SIGMOID: return ref_op_sigmoid(c);
    case IR_OP_MOE: return ref_op_moe(c);
    case IR_OP_RESHAPE: return ref_op_reshape(c);
    case IR_OP_TRANSPOSE: return ref_op_transpose(c);
    case IR_OP_CONCAT: return ref_op_concat(c);
    case IR_OP_SPLIT: return ref_op_split(c);
    case IR_OP_SLICE: return ref_op_slice(c);
    case IR_OP_ARGMAX: return ref_op_argmax(c);
    case IR_OP_QUANTIZE: return ref_op_quantize(c);
    /* Declarations: the step loop binds inputs, weights, constants and outputs. */
    case IR_OP_INPUT:
    case IR_OP_WEIGHT:
    case IR_OP_CONST:
    case IR_OP_OUTPUT:
    case IR_OP_COUNT: break;
    }
    SMELT_DIE("ref_run_op called for op kind %d, which the step loop handles", (int)kind);
}

/* ---- lookups and products ----------------------------------------------------------- */

/* embedding(table[V, D], ids[...]) -> [..., D]: row ids[t] of the table. A
 * quantized table (the int4 presets' int8 token embedding, one scale per
 * row) arrives dequantized: load_quantized (ref_model.c) turned its codes
 * into q * s once, as quant_value defines, so its rows are gathered as
 * floats like any table's. */
bool ref_op_embedding(const ref_call *c) {
    const ref_tensor *table = c->in[0], *ids = c->in[1];
    uint64_t rows = table->dims[0], width = table->dims[1];
    float *out = c->out[0].f; /* [..., D] */
    for (uint64_t t = 0; t < ids->count; t++) {
        int32_t id = ids->i[t];
        if (id < 0 || (uint64_t)id >= rows) {
            diag_error(c->d, c->loc,
                       "embedding: token id %d (index %llu of the ids) is outside the table, "
                       "which has %llu rows",
                       (int)id, (unsigned long long)t, (unsigned long long)rows);
            return false;
        }
        memcpy(out + t * width, table->f + (uint64_t)id * width, width * sizeof(float));
    }
    return true;
}

/* The code of an activation x / s (ir/ops.def, matmul's act_quant) as the
 * value it stands for before the scale: an int8 code rint(v) clamped to
 * +-127 (NaN: 0), or an E4M3 code's value (round to nearest even,
 * saturating to +-448). */
static float activation_code(quant_kind kind, float v) {
    if (kind == QUANT_FP8) return plan_f8e4m3_to_f32(plan_f32_to_f8e4m3(v));
    if (!(v == v)) return 0.0f;
    float r = rintf(v);
    return r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
}

float ref_quantize_row(quant_kind kind, float *row, uint64_t inner, float static_scale) {
    float absmax = 0.0f;
    for (uint64_t k = 0; k < inner; k++)
        absmax = fabsf(row[k]) > absmax ? fabsf(row[k]) : absmax;
    float scale = static_scale > 0.0f                   ? static_scale
                  : absmax > 0.0f && kind == QUANT_INT8 ? absmax / 127.0f
                  : absmax > 0.0f                       ? absmax / 448.0f
                                                        : 1.0f;
    for (uint64_t k = 0; k < inner; k++)
        row[k] = activation_code(kind, row[k] / scale);
    return scale;
}

float ref_w8a8_row_codes(quant_kind kind, const float *x, const quant_tensor *w, uint64_t inner,
                         float static_scale, float *codes) {
    for (uint64_t k = 0; k < inner; k++)
        codes[k] = x[k] * quant_column_scale(w, k);
    return ref_quantize_row(kind, codes, inner, static_scale);
}

float ref_w8a8_weight_code(quant_kind kind, const quant_tensor *w, uint64_t n, uint64_t k) {
    unsigned code = quant_code(w, n, k);
    return kind == QUANT_INT8 ? (float)(int8_t)code : plan_f8e4m3_to_f32((uint8_t)code);
}

/* matmul with act_quant (W8A8; ir/ops.def): row t of x times the weight's
 * column scales becomes codes of scale s_t (its own absmax / 127 or / 448,
 * or the static scale), and y[t, n] = s_t * s_w[n] * sum_k xcode * wcode,
 * summed in double: exact for int8 (integer products below 2^14, sums below
 * 2^53), each E4M3 product exact; then the bias. With act_codes the codes
 * and scales are the quantize op's (its last two operands, made by the same
 * ref_quantize_row from x, whose weight has no column scales): the same
 * numbers. The weight's codes are decoded once per call, to their values
 * (exact in float). */
static bool matmul_quantized_activations(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    const quant_tensor *w = c->weight_codes;
    const float *bias = c->attrs->bias ? c->in[2]->f : NULL;                              /* [N] */
    const ref_tensor *given_codes = c->attrs->act_codes ? c->in[c->in_count - 2] : NULL;  /* [..., K] */
    const ref_tensor *given_scales = c->attrs->act_codes ? c->in[c->in_count - 1] : NULL; /* [...] */
    ref_tensor *y = &c->out[0];
    uint64_t inner = w->layout.cols, columns = w->layout.rows;
    uint64_t rows = inner ? x->count / inner : 0;
    quant_kind kind = c->attrs->w8a8;
    float *codes = malloc((inner ? inner : 1) * sizeof *codes); /* [K], one row's activation codes */
    uint64_t elements = inner * columns;                        /* the weight's: the verifier sized it */
    float *weight = malloc((elements ? elements : 1) * sizeof *weight); /* [N, K] codes */
    if (!codes || !weight) {
        free(codes);
        free(weight);
        diag_error(c->d, c->loc, "matmul: out of memory");
        return false;
    }
    for (uint64_t n = 0; n < columns; n++)
        for (uint64_t k = 0; k < inner; k++)
            weight[n * inner + k] = ref_w8a8_weight_code(kind, w, n, k);
    for (uint64_t r = 0; r < rows; r++) {
        const float *row = codes; /* [K] */
        float scale;
        if (given_codes) {
            row = given_codes->f + r * inner;
            scale = given_scales->f[r];
        } else {
            scale = ref_w8a8_row_codes(kind, x->f + r * inner, w, inner, c->attrs->w8a8_scale, codes);
        }
        for (uint64_t n = 0; n < columns; n++) {
            const float *wn = weight + n * inner; /* [K] */
            double dot = 0.0;
            for (uint64_t k = 0; k < inner; k++)
                dot += (double)row[k] * wn[k];
            dot *= (double)scale * quant_scale(w, n, 0);
            y->f[r * columns + n] = (float)(dot + (bias ? bias[n] : 0.0));
        }
    }
    free(codes);
    free(weight);
    return true;
}

/* quantize(x[..., K]) -> codes[..., K], scales[...] (ir/ops.def): each row
 * of x coded by ref_quantize_row, the function a matmul's act_quant codes
 * its rows with; a code is held as the value it stands for (an int8 code
 * as its integer, an E4M3 code as its exact value). */
bool ref_op_quantize(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    uint64_t inner = x->dims[x->rank - 1], rows = inner ? x->count / inner : 0;
    float *codes = c->out[0].f, *scales = c->out[1].f; /* [..., K], [...] */
    memcpy(codes, x->f, x->count * sizeof *codes);
    for (uint64_t r = 0; r < rows; r++)
        scales[r] = ref_quantize_row(c->attrs->w8a8, codes + r * inner, inner, c->attrs->w8a8_scale);
    return true;
}

/* matmul(x[..., K], w, bias[N]?) -> [..., N]
 * out_in: w is [N, K] and y = x @ w^T (nn.Linear); in_out: w is [K, N] and
 * y = x @ w (GPT-2's Conv1D). The bias is added to the double sum. With
 * act_quant the input is quantized as well (matmul_quantized_activations). */
bool ref_op_matmul(const ref_call *c) {
    if (c->attrs->w8a8 != QUANT_NONE) {
        if (!c->weight_codes || !c->weight_codes->data) /* ir_verify: a quantized weight, loaded at create */
            SMELT_DIE("a W8A8 matmul without its weight's codes");
        return matmul_quantized_activations(c);
    }
    const ref_tensor *x = c->in[0], *w = c->in[1];
    const float *bias = c->attrs->bias ? c->in[2]->f : NULL; /* [N] */
    ref_tensor *y = &c->out[0];
    uint64_t inner = x->dims[x->rank - 1], columns = y->dims[y->rank - 1];
    uint64_t rows = inner ? x->count / inner : y->count / (columns ? columns : 1);
    double *sums = malloc((columns ? columns : 1) * sizeof *sums); /* [N], one row of y */
    if (!sums) {
        diag_error(c->d, c->loc, "matmul: out of memory");
        return false;
    }
    for (uint64_t r = 0; r < rows; r++) {
        const float *xr = x->f + r * inner; /* [K] */
        for (uint64_t n = 0; n < columns; n++)
            sums[n] = bias ? bias[n] : 0.0;
        if (c->attrs->in_out) {
            for (uint64_t k = 0; k < inner; k++) { /* row k of w is [N] */
                const float *wk = w->f + k * columns;
                for (uint64_t n = 0; n < columns; n++)
                    sums[n] += (double)xr[k] * wk[n];
            }
        } else {
            for (uint64_t n = 0; n < columns; n++) { /* row n of w is [K] */
                const float *wn = w->f + n * inner;
                double dot = 0.0;
                for (uint64_t k = 0; k < inner; k++)
                    dot += (double)xr[k] * wn[k];
                sums[n] += dot;
            }
        }
        for (uint64_t n = 0; n < columns; n++)
            y->f[r * columns + n] = (float)sums[n];
    }
    free(sums);
    return true;
}

/* ---- elementwise with broadcasting ------------------------------------------------- */

/* Strides that walk operand x along the dims of the broadcast result: a dim
 * that x lacks (leading) or has as 1 where the result does not gets stride 0. */
static void broadcast_strides(const ref_tensor *x, const ref_tensor *out, uint64_t *strides) {
    uint64_t stride = 1;
    for (int j = out->rank - 1; j >= 0; j--) {
        int jx = j - (out->rank - x->rank);
        if (jx < 0) {
            strides[j] = 0;
            continue;
        }
        strides[j] = x->dims[jx] == 1 ? 0 : stride;
        stride *= x->dims[jx];
    }
}

typedef enum binary_kind { BINARY_ADD, BINARY_MUL } binary_kind;

/* out = a (+ or *) b, numpy broadcasting over trailing dims. */
static bool broadcast_binary(const ref_call *c, binary_kind kind) {
    const ref_tensor *a = c->in[0], *b = c->in[1];
    ref_tensor *out = &c->out[0];
    uint64_t stride_a[IR_MAX_DIMS], stride_b[IR_MAX_DIMS], index[IR_MAX_DIMS] = {0};
    broadcast_strides(a, out, stride_a);
    broadcast_strides(b, out, stride_b);
    uint64_t at_a = 0, at_b = 0;
    for (uint64_t e = 0; e < out->count; e++) {
        float x = a->f[at_a], y = b->f[at_b];
        out->f[e] = kind == BINARY_ADD ? x + y : x * y;
        /* Odometer: step the last dim, carrying into earlier ones. */
        for (int j = out->rank - 1; j >= 0; j--) {
            at_a += stride_a[j];
            at_b += stride_b[j];
            if (++index[j] < out->dims[j]) break;
            at_a -= stride_a[j] * out->dims[j];
            at_b -= stride_b[j] * out->dims[j];
            index[j] = 0;
        }
    }
    return true;
}

/* add(a, b) -> broadcast(a, b) */
bool ref_op_add(const ref_call *c) { return broadcast_binary(c, BINARY_ADD); }

/* mul(a, b) -> broadcast(a, b) */
bool ref_op_mul(const ref_call *c) { return broadcast_binary(c, BINARY_MUL); }

/* ---- norms ----------------------------------------------------------------------- */

/* rms_norm(x[..., D], w[D]) -> x: x / sqrt(mean(x^2) + eps) * (offset + w),
 * the weight applied after normalising, as Hugging Face's LlamaRMSNorm does
 * (offset 0) and Gemma's RMSNorm with its (1 + weight) (offset 1). */
bool ref_op_rms_norm(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    const float *w = c->in[1]->f; /* [D] */
    uint64_t width = x->dims[x->rank - 1];
    if (width == 0) return true;
    for (uint64_t r = 0; r < x->count / width; r++) {
        const float *xr = x->f + r * width;
        float *yr = c->out[0].f + r * width;
        double squares = 0.0;
        for (uint64_t i = 0; i < width; i++)
            squares += (double)xr[i] * xr[i];
        double inverse_rms = 1.0 / sqrt(squares / (double)width + c->attrs->eps);
        for (uint64_t i = 0; i < width; i++)
            yr[i] = (float)(xr[i] * inverse_rms) * (float)(c->attrs->offset + w[i]);
    }
    return true;
}

/* layer_norm(x[..., D], w[D], b[D]?) -> x: (x - mean) / sqrt(var + eps) * w + b
 * with the biased variance (divided by D), as torch.nn.LayerNorm. */
bool ref_op_layer_norm(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    const float *w = c->in[1]->f;                           /* [D] */
    const float *b = c->in_count == 3 ? c->in[2]->f : NULL; /* [D] */
    uint64_t width = x->dims[x->rank - 1];
    if (width == 0) return true;
    for (uint64_t r = 0; r < x->count / width; r++) {
        const float *xr = x->f + r * width;
        float *yr = c->out[0].f + r * width;
        double sum = 0.0, squares = 0.0;
        for (uint64_t i = 0; i < width; i++)
            sum += xr[i];
        double mean = sum / (double)width;
        for (uint64_t i = 0; i < width; i++)
            squares += (xr[i] - mean) * (xr[i] - mean);
        double inverse_std = 1.0 / sqrt(squares / (double)width + c->attrs->eps);
        for (uint64_t i = 0; i < width; i++)
            yr[i] = (float)((xr[i] - mean) * inverse_std * w[i] + (b ? b[i] : 0.0));
    }
    return true;
}

/* ---- activations and softmax ------------------------------------------------------- */

/* softmax(x) -> x along axis: exp(x - max) / sum, the max subtracted first. */
bool ref_op_softmax(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    unsigned axis = c->attrs->axis;
    uint64_t outer = ref_dims_product(x, 0, axis), length = x->dims[axis];
    uint64_t inner = ref_dims_product(x, axis + 1, x->rank);
    for (uint64_t o = 0; o < outer; o++) {
        for (uint64_t in = 0; in < inner; in++) {
            const float *xs = x->f + o * length * inner + in; /* [length], stride inner */
            float *ys = c->out[0].f + o * length * inner + in;
            double max = -INFINITY, sum = 0.0;
            for (uint64_t i = 0; i < length; i++)
                if (xs[i * inner] > max) max = xs[i * inner];
            for (uint64_t i = 0; i < length; i++)
                sum += exp(xs[i * inner] - max);
            for (uint64_t i = 0; i < length; i++)
                ys[i * inner] = (float)(exp(xs[i * inner] - max) / sum);
        }
    }
    return true;
}

/* silu(x) -> x: x * sigmoid(x). */
bool ref_op_silu(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    for (uint64_t e = 0; e < x->count; e++) {
        double v = x->f[e];
        c->out[0].f[e] = (float)(v / (1.0 + exp(-v)));
    }
    return true;
}

/* gelu(x) -> x. none: 0.5 x (1 + erf(x / sqrt 2));
 * tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (GPT-2's gelu_new). */
bool ref_op_gelu(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    const double sqrt_2_over_pi = 0.79788456080286535588; /* sqrt(2 / pi) */
    for (uint64_t e = 0; e < x->count; e++) {
        double v = x->f[e];
        double y = c->attrs->gelu_tanh ? 0.5 * v * (1.0 + tanh(sqrt_2_over_pi * (v + 0.044715 * v * v * v)))
                                       : 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        c->out[0].f[e] = (float)y;
    }
    return true;
}

/* tanh(x) -> x. */
bool ref_op_tanh(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    for (uint64_t e = 0; e < x->count; e++)
        c->out[0].f[e] = (float)tanh((double)x->f[e]);
    return true;
}

/* sigmoid(x) -> x: 1 / (1 + exp(-x)). */
bool ref_op_sigmoid(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    for (uint64_t e = 0; e < x->count; e++)
        c->out[0].f[e] = (float)(1.0 / (1.0 + exp(-(double)x->f[e])));
    return true;
}

/* ---- argmax ---------------------------------------------------------------------- */

static double element_at(const ref_tensor *t, uint64_t i) {
    return t->elem == REF_F32 ? (double)t->f[i] : (double)t->i[i];
}

/* argmax(x) -> i32 with the axis removed: the index of the first maximum. */
bool ref_op_argmax(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    unsigned axis = c->attrs->axis;
    uint64_t outer = ref_dims_product(x, 0, axis), length = x->dims[axis];
    uint64_t inner = ref_dims_product(x, axis + 1, x->rank);
    for (uint64_t o = 0; o < outer; o++) {
        for (uint64_t in = 0; in < inner; in++) {
            uint64_t base = o * length * inner + in, best = 0;
            for (uint64_t i = 1; i < length; i++)
                if (element_at(x, base + i * inner) > element_at(x, base + best * inner)) best = i;
            c->out[0].i[o * inner + in] = (int32_t)best;
        }
    }
    return true;
}
