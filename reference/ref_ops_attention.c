/* ref_ops_attention.c - the reference backend's sequence and expert ops:
 * rotary embeddings, attention over a KV cache, and mixture of experts.
 *
 * Matched to Hugging Face transformers (LlamaRotaryEmbedding,
 * eager attention, MixtralSparseMoeBlock); see each function.
 */
#include "ref_ops.h"

#include "numeric.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- rope ------------------------------------------------------------------------- */

/* The (cos, sin) of every rotated pair of every token into cos_sin
 * [tokens, r/2, 2]: the frequencies inv_freq[r/2] come from ir/rope.c
 * (theta^(-2i / r), or a scaled variant), angle = pos * inv_freq[i], and cos
 * and sin are multiplied by the variant's attention factor. longrope takes
 * its long set in a call whose largest position + 1 exceeds
 * original_max_position_embeddings, as transformers does per forward call;
 * dynamic runs only below max_position_embeddings, where its frequencies
 * are static.
 *
 * Precision: like Hugging Face, inv_freq, the angle and its cos/sin are
 * computed in float32 ((float)pos * inv_freq). Computing the angle in double
 * would be closer to the true value but would differ from PyTorch by up to
 * an ulp of the angle, which grows with the position. */
static bool rope_angles(const ref_call *c, const ir_rope_params *params, const int32_t *pos, uint64_t tokens,
                        float *cos_sin) {
    int32_t max_position = 0;
    for (uint64_t t = 0; t < tokens; t++)
        if (pos[t] > max_position) max_position = pos[t];
    if (params->scaling == IR_ROPE_DYNAMIC && (int64_t)max_position >= params->max_positions) {
        diag_error(c->d, c->loc,
                   "rope: position %d is past max_position_embeddings (%lld), where dynamic NTK scaling "
                   "recomputes its frequencies from the sequence length; smelt runs it only below that",
                   (int)max_position, (long long)params->max_positions);
        return false;
    }
    float *storage = malloc(ir_rope_tables_floats(params) * sizeof *storage);
    if (!storage) {
        diag_error(c->d, c->loc, "rope: out of memory");
        return false;
    }
    ir_rope_tables tables;
    ir_rope_tables_compute(params, storage, &tables);
    const float *inv_freq = tables.inv_freq; /* [r/2] */
    if (tables.long_inv_freq && (int64_t)max_position + 1 > tables.long_after)
        inv_freq = tables.long_inv_freq;
    for (uint64_t t = 0; t < tokens; t++)
        for (uint64_t i = 0; i < tables.half; i++) {
            float angle = (float)pos[t] * inv_freq[i];
            cos_sin[(t * tables.half + i) * 2] = cosf(angle) * tables.attention_factor;
            cos_sin[(t * tables.half + i) * 2 + 1] = sinf(angle) * tables.attention_factor;
        }
    free(storage);
    return true;
}

/* rope_table(pos[T]) -> [T, r/2, 2]: rope_angles, for the ropes that read it. */
bool ref_op_rope_table(const ref_call *c) {
    return rope_angles(c, &c->attrs->rope, c->in[0]->i, c->in[0]->dims[0], c->out[0].f);
}

/* rope(x[T, H, Dh], pos[T], table?) -> x, rotating the first r dims of each
 * head (r from rotary_dim or partial_rotary_factor) by the (cos, sin) of
 * rope_angles — the table's, when the op reads one (the shape rule has
 * checked it holds these positions' angles at these frequencies). neox
 * (Llama's rotate_half) pairs x[i] with x[i + r/2]; interleaved (GPT-J)
 * pairs x[2i] with x[2i + 1]; dims >= r pass through. The rotation is done
 * in float. */
bool ref_op_rope(const ref_call *c) {
    const ref_tensor *x = c->in[0], *pos = c->in[1];
    float *out = c->out[0].f; /* [T, H, Dh] */
    uint64_t tokens = x->dims[0], heads = x->dims[1], head_dim = x->dims[2];
    uint64_t half = (uint64_t)c->attrs->rope.rotary_dim / 2;
    float *computed = NULL;
    const float *cos_sin = c->in_count == 3 ? c->in[2]->f : NULL; /* [T, r/2, 2] */
    if (!cos_sin) {
        computed = malloc((tokens * half + 1) * 2 * sizeof *computed);
        if (!computed) {
            diag_error(c->d, c->loc, "rope: out of memory");
            return false;
        }
        if (!rope_angles(c, &c->attrs->rope, pos->i, tokens, computed)) {
            free(computed);
            return false;
        }
        cos_sin = computed;
    }
    memcpy(out, x->f, x->count * sizeof(float)); /* the dims >= r */
    for (uint64_t t = 0; t < tokens; t++) {
        for (uint64_t i = 0; i < half; i++) {
            float cosine = cos_sin[(t * half + i) * 2], sine = cos_sin[(t * half + i) * 2 + 1];
            uint64_t first = c->attrs->interleaved ? 2 * i : i;
            uint64_t second = c->attrs->interleaved ? 2 * i + 1 : i + half;
            for (uint64_t h = 0; h < heads; h++) {
                const float *xh = x->f + (t * heads + h) * head_dim; /* [Dh] */
                float *yh = out + (t * heads + h) * head_dim;
                float a = xh[first], b = xh[second];
                yh[first] = a * cosine - b * sine;
                yh[second] = b * cosine + a * sine;
            }
        }
    }
    free(computed);
    return true;
}

/* ---- attention ---------------------------------------------------------------------- */

/* Every position is inside the cache; nothing is written before this holds. */
static bool positions_fit(const ref_call *c, const ref_tensor *pos, uint64_t max_seq) {
    for (uint64_t t = 0; t < pos->count; t++) {
        int32_t p = pos->i[t];
        if (p < 0 || (uint64_t)p >= max_seq) {
            diag_error(c->d, c->loc,
                       "attention: position %d of token %llu is outside the KV cache, "
                       "expected 0 to %llu (max_seq %llu)",
                       (int)p, (unsigned long long)t, (unsigned long long)max_seq - 1,
                       (unsigned long long)max_seq);
            return false;
        }
    }
    return true;
}

/* Copies rows[heads][dims] into the cache at `to`; with an f8e4m3 cache
 * (kv_dtype, ir/ops.def) each head's row is rounded as the kernels store
 * it: codes of x / scale, scale = plan_f8e4m3_row_scale(max |x|), read back
 * as code * scale (the cache holds what a kernel reads back). */
static void cache_rows(float *to, const float *rows, uint64_t heads, uint64_t dims, bool fp8) {
    if (!fp8) {
        memcpy(to, rows, heads * dims * sizeof(float));
        return;
    }
    for (uint64_t h = 0; h < heads; h++) {
        const float *x = rows + h * dims; /* [dims] */
        float absmax = 0.0f;
        for (uint64_t i = 0; i < dims; i++)
            absmax = fmaxf(absmax, fabsf(x[i]));
        float scale = plan_f8e4m3_row_scale(absmax);
        for (uint64_t i = 0; i < dims; i++)
            to[h * dims + i] = plan_f8e4m3_to_f32(plan_f32_to_f8e4m3(x[i] / scale)) * scale;
    }
}

/* attention(q[T, Hq, D], k[T, Hkv, D], v[T, Hkv, Dv], pos[T]) -> [T, Hq, Dv]
 * First writes k and v of token t at cache position pos[t] (rounded through
 * E4M3 with a scale per kv head when the cache is f8e4m3); then query head h
 * of token t attends, through kv head h / (Hq / Hkv), to every written
 * position p with p <= pos[t] (causal; a non-causal op sees every written
 * position) and p > pos[t] - window when window > 0:
 * softmax(s) over those p (max subtracted), weighting v, of the scores
 * s = scale * q.k, or softcap * tanh(scale * q.k / softcap) when softcap > 0
 * (Gemma 2's attention logit soft-capping). */
bool ref_op_attention(const ref_call *c) {
    const ref_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *pos = c->in[3];
    ref_kv_cache *cache = c->kv;
    float *out = c->out[0].f; /* [T, Hq, Dv] */
    uint64_t tokens = q->dims[0], query_heads = q->dims[1];
    uint64_t kv_heads = cache->kv_heads, head_dim = cache->head_dim, value_dim = cache->value_dim;
    if (!positions_fit(c, pos, cache->max_seq)) return false;

    for (uint64_t t = 0; t < tokens; t++) {
        uint64_t p = (uint64_t)pos->i[t];
        cache_rows(cache->keys + p * kv_heads * head_dim, k->f + t * kv_heads * head_dim, kv_heads, head_dim,
                   c->attrs->kv_fp8);
        cache_rows(cache->values + p * kv_heads * value_dim, v->f + t * kv_heads * value_dim, kv_heads,
                   value_dim, c->attrs->kv_fp8);
        cache->written[p] = true;
        if (p + 1 > cache->end) cache->end = p + 1;
    }

    uint64_t group = query_heads / kv_heads; /* query heads per kv head */
    for (uint64_t t = 0; t < tokens; t++) {
        uint64_t at = (uint64_t)pos->i[t];
        uint64_t last = c->attrs->causal ? at : cache->end - 1; /* inclusive */
        uint64_t first = 0;
        if (c->attrs->window > 0 && at + 1 > (uint64_t)c->attrs->window)
            first = at + 1 - (uint64_t)c->attrs->window;
        for (uint64_t h = 0; h < query_heads; h++) {
            const float *qh = q->f + (t * query_heads + h) * head_dim; /* [D] */
            uint64_t kv_head = h / group;
            double max = -INFINITY;
            for (uint64_t p = first; p <= last; p++) {
                if (!cache->written[p]) continue;
                const float *kp = cache->keys + (p * kv_heads + kv_head) * head_dim; /* [D] */
                double dot = 0.0;
                for (uint64_t i = 0; i < head_dim; i++)
                    dot += (double)qh[i] * kp[i];
                double score = c->attrs->scale * dot;
                if (c->attrs->softcap > 0) score = c->attrs->softcap * tanh(score / c->attrs->softcap);
                cache->scores[p] = score;
                if (cache->scores[p] > max) max = cache->scores[p];
            }
            double total = 0.0;
            memset(cache->mixed, 0, value_dim * sizeof *cache->mixed);
            for (uint64_t p = first; p <= last; p++) {
                if (!cache->written[p]) continue;
                const float *vp = cache->values + (p * kv_heads + kv_head) * value_dim; /* [Dv] */
                double weight = exp(cache->scores[p] - max);
                total += weight;
                for (uint64_t i = 0; i < value_dim; i++)
                    cache->mixed[i] += weight * vp[i];
            }
            float *oh = out + (t * query_heads + h) * value_dim; /* [Dv] */
            for (uint64_t i = 0; i < value_dim; i++)
                oh[i] = (float)(cache->mixed[i] / total); /* total >= 1: position `at` itself */
        }
    }
    return true;
}

/* ---- mixture of experts --------------------------------------------------------------- */

static double dot_float(const float *a, const float *b, uint64_t n) {
    double sum = 0.0;
    for (uint64_t i = 0; i < n; i++)
        sum += (double)a[i] * b[i];
    return sum;
}

/* The top_k largest of probabilities[E] into chosen[top_k], largest first;
 * of equal ones the lower index comes first (what torch.topk does). */
static void pick_top_k(const double *probabilities, uint64_t experts, int64_t top_k, uint64_t *chosen,
                       bool *taken) {
    memset(taken, 0, experts * sizeof *taken);
    for (int64_t k = 0; k < top_k; k++) {
        uint64_t best = experts;
        for (uint64_t e = 0; e < experts; e++)
            if (!taken[e] && (best == experts || probabilities[e] > probabilities[best])) best = e;
        chosen[k] = best;
        taken[best] = true;
    }
}

/* W8A8 experts (ops.def, moe's gate_up_act_quant and down_act_quant):
 * out[n] = s * s_w[n] * sum_k code[k] * wcode[n, k] for the N rows of
 * expert e of stack `stack` (0 gate, 1 up, 2 down), row[K] quantized
 * against that expert's column scales into codes[K] (scratch) with the
 * static scale s = static_scale when it is > 0 (act_scale tensor), else
 * the row's own, the sum in double (exact for int8, each E4M3 product
 * exact). */
static void expert_project_w8a8(const ref_call *c, uint32_t stack, quant_kind kind, float static_scale,
                                uint64_t e, uint64_t rows, uint64_t inner, const float *row, float *codes,
                                double *out) {
    if (!c->expert_codes[stack] || !c->expert_codes[stack]->data) /* ir_verify: quantized experts */
        SMELT_DIE("a W8A8 moe without its experts' codes");
    quant_tensor expert = *c->expert_codes[stack];
    expert.data += e * c->expert_stride[stack];
    float scale = ref_w8a8_row_codes(kind, row, &expert, inner, static_scale, codes);
    for (uint64_t n = 0; n < rows; n++) {
        double dot = 0.0;
        for (uint64_t k = 0; k < inner; k++)
            dot += (double)codes[k] * ref_w8a8_weight_code(kind, &expert, n, k);
        out[n] = dot * ((double)scale * quant_scale(&expert, n, 0));
    }
}

/* moe(x[T, D], router[E, D], gate[E, F, D], up[E, F, D], down[E, D, F]) -> [T, D]
 * As Mixtral: router logits x @ router^T, softmax over E, the top_k experts
 * weighted by their probabilities (divided by their sum when normalize);
 * out = sum_k weight_k * down_e(silu(gate_e x) * up_e x). Under W8A8 the
 * projections multiply codes (expert_project_w8a8): gate and up those of
 * x, down those of the hidden row rounded to f32 (what the kernels store),
 * each of its row's own scale or, under act_scale tensor, of the static
 * scale of x or of the hidden rows. */
bool ref_op_moe(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    const float *router = c->in[1]->f, *gate = c->in[2]->f, *up = c->in[3]->f, *down = c->in[4]->f;
    uint64_t tokens = x->dims[0], model_dim = x->dims[1];
    uint64_t experts = c->in[1]->dims[0], ffn = c->in[2]->dims[1];
    int64_t top_k = c->attrs->top_k;
    if (top_k < 1 || (uint64_t)top_k > experts) {
        diag_error(c->d, c->loc, "moe: top_k %lld must be in [1, %llu] (the number of experts)",
                   (long long)top_k, (unsigned long long)experts);
        return false;
    }
    double *probabilities = calloc(experts ? experts : 1, sizeof(double)); /* [E] */
    uint64_t *chosen = calloc((size_t)top_k, sizeof(uint64_t));            /* [top_k] */
    bool *taken = calloc(experts ? experts : 1, sizeof(bool));             /* [E] */
    double *hidden = calloc(ffn ? ffn : 1, sizeof(double));                /* [F] */
    double *mixed = calloc(model_dim ? model_dim : 1, sizeof(double));     /* [D] */
    float *observed = calloc(ffn ? ffn : 1, sizeof(float));                /* [F]: hidden as f32 */
    uint64_t widest = ffn > model_dim ? ffn : model_dim;
    float *codes = calloc(widest ? widest : 1, sizeof(float));       /* [max(D, F)]: W8A8 */
    double *gated = calloc(ffn ? ffn : 1, sizeof(double));           /* [F]: W8A8 gate x */
    double *projected = calloc(widest ? widest : 1, sizeof(double)); /* [max(D, F)] */
    if (!probabilities || !chosen || !taken || !hidden || !mixed || !observed || !codes || !gated ||
        !projected) {
        free(codes);
        free(gated);
        free(projected);
        free(observed);
        free(probabilities);
        free(chosen);
        free(taken);
        free(hidden);
        free(mixed);
        diag_error(c->d, c->loc, "moe: out of memory");
        return false;
    }

    for (uint64_t t = 0; t < tokens; t++) {
        const float *xt = x->f + t * model_dim; /* [D] */
        double max = -INFINITY, total = 0.0;
        for (uint64_t e = 0; e < experts; e++) {
            probabilities[e] = dot_float(router + e * model_dim, xt, model_dim);
            if (probabilities[e] > max) max = probabilities[e];
        }
        for (uint64_t e = 0; e < experts; e++)
            total += probabilities[e] = exp(probabilities[e] - max);
        for (uint64_t e = 0; e < experts; e++)
            probabilities[e] /= total;
        pick_top_k(probabilities, experts, top_k, chosen, taken);
        double chosen_total = 0.0;
        for (int64_t k = 0; k < top_k; k++)
            chosen_total += probabilities[chosen[k]];

        memset(mixed, 0, model_dim * sizeof *mixed);
        for (int64_t k = 0; k < top_k; k++) {
            uint64_t e = chosen[k];
            double weight = probabilities[e] / (c->attrs->normalize ? chosen_total : 1.0);
            const float *gate_e = gate + e * ffn * model_dim; /* [F, D] */
            const float *up_e = up + e * ffn * model_dim;     /* [F, D] */
            const float *down_e = down + e * model_dim * ffn; /* [D, F] */
            quant_kind gate_up_kind = c->attrs->gate_up_w8a8, down_kind = c->attrs->down_w8a8;
            if (gate_up_kind != QUANT_NONE) {
                float scale = c->attrs->gate_up_w8a8_scale;
                expert_project_w8a8(c, 0, gate_up_kind, scale, e, ffn, model_dim, xt, codes, gated);
                expert_project_w8a8(c, 1, gate_up_kind, scale, e, ffn, model_dim, xt, codes, projected);
            }
            for (uint64_t f = 0; f < ffn; f++) {
                double g =
                    gate_up_kind != QUANT_NONE ? gated[f] : dot_float(gate_e + f * model_dim, xt, model_dim);
                double u = gate_up_kind != QUANT_NONE ? projected[f]
                                                      : dot_float(up_e + f * model_dim, xt, model_dim);
                hidden[f] = g / (1.0 + exp(-g)) * u;
                observed[f] = (float)hidden[f];
            }
            if (c->expert_observer) { /* what each of this expert's projections multiplies */
                c->expert_observer(c->observer_context, c->op, 0, e, xt, model_dim);
                c->expert_observer(c->observer_context, c->op, 1, e, observed, ffn);
            }
            if (down_kind != QUANT_NONE) {
                expert_project_w8a8(c, 2, down_kind, c->attrs->down_w8a8_scale, e, model_dim, ffn, observed,
                                    codes, projected);
                for (uint64_t d = 0; d < model_dim; d++)
                    mixed[d] += weight * projected[d];
                continue;
            }
            for (uint64_t d = 0; d < model_dim; d++) {
                double sum = 0.0;
                for (uint64_t f = 0; f < ffn; f++)
                    sum += down_e[d * ffn + f] * hidden[f];
                mixed[d] += weight * sum;
            }
        }
        for (uint64_t d = 0; d < model_dim; d++)
            c->out[0].f[t * model_dim + d] = (float)mixed[d];
    }
    free(probabilities);
    free(chosen);
    free(taken);
    free(hidden);
    free(mixed);
    free(observed);
    free(codes);
    free(gated);
    free(projected);
    return true;
}
