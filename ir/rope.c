/* rope.c - the rotary frequency tables of a rope op (see rope.h). */
#include "rope.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* math.pi: C11 has no M_PI. */
#define ROPE_PI 3.14159265358979323846

static const char *const scaling_names[] = {
    [IR_ROPE_DEFAULT] = "default", [IR_ROPE_LINEAR] = "linear", [IR_ROPE_DYNAMIC] = "dynamic",
    [IR_ROPE_LLAMA3] = "llama3",   [IR_ROPE_YARN] = "yarn",     [IR_ROPE_LONGROPE] = "longrope",
};

const char *ir_rope_scaling_name(ir_rope_scaling s) {
    return (unsigned)s < sizeof scaling_names / sizeof scaling_names[0] ? scaling_names[s] : "?";
}

/* ---- reading the attributes ------------------------------------------------ */

/* The default text of attribute `name` of the op (a rope or a rope_table:
 * ops.def has them); NULL when it has none, or no such attribute
 * (rope_table has no partial_rotary_factor: its rotary_dim is resolved). */
static const char *default_of(const ir_module *m, uint32_t op, const char *name) {
    ir_op_kind kind = m->ops[op].kind;
    if (kind != IR_OP_ROPE && kind != IR_OP_ROPE_TABLE) SMELT_DIE("op %u is no rope", op);
    int slot = ir_attr_slot(kind, name);
    return slot < 0 ? NULL : ir_op_info_of(kind)->attrs[slot].default_text;
}

static double float_attr(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    if (a && a->kind == IR_ATTR_FLOAT) return a->as.f;
    const char *text = default_of(m, op, name);
    return text ? strtod(text, NULL) : 0.0;
}

static int64_t int_attr(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    if (a && a->kind == IR_ATTR_INT) return a->as.i;
    const char *text = default_of(m, op, name);
    return text ? strtoll(text, NULL, 10) : 0;
}

static bool bool_attr(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    if (a && a->kind == IR_ATTR_BOOL) return a->as.b;
    const char *text = default_of(m, op, name);
    return text && strcmp(text, "true") == 0;
}

static void floats_attr(const ir_module *m, uint32_t op, const char *name, const double **items,
                        uint32_t *count) {
    const ir_attr *a = ir_op_attr(m, op, name);
    bool given = a && a->kind == IR_ATTR_FLOATS;
    *items = given ? a->as.floats.items : NULL;
    *count = given ? a->as.floats.count : 0;
}

ir_rope_params ir_rope_params_of(const ir_module *m, uint32_t op, int64_t head_dim) {
    ir_rope_params p = {0};
    const ir_attr *scaling = ir_op_attr(m, op, "scaling");
    p.scaling = IR_ROPE_DEFAULT;
    for (unsigned s = 0; scaling && scaling->kind == IR_ATTR_STRING && scaling->as.s &&
                         s < sizeof scaling_names / sizeof scaling_names[0];
         s++)
        if (strcmp(scaling->as.s, scaling_names[s]) == 0) p.scaling = (ir_rope_scaling)s;
    p.theta = float_attr(m, op, "theta");
    p.rotary_dim = int_attr(m, op, "rotary_dim");
    if (p.rotary_dim == 0) {
        double rotary = (double)head_dim * float_attr(m, op, "partial_rotary_factor");
        /* int(head_dim * partial_rotary_factor), as transformers takes it */
        p.rotary_dim = rotary >= 0 && rotary < 1e15 ? (int64_t)rotary : -1;
    }
    p.factor = float_attr(m, op, "factor");
    p.low_freq_factor = float_attr(m, op, "low_freq_factor");
    p.high_freq_factor = float_attr(m, op, "high_freq_factor");
    p.max_positions = int_attr(m, op, "max_position_embeddings");
    p.original_max_positions = int_attr(m, op, "original_max_position_embeddings");
    if (p.original_max_positions == 0) p.original_max_positions = p.max_positions;
    p.attention_factor = float_attr(m, op, "attention_factor");
    p.beta_fast = float_attr(m, op, "beta_fast");
    p.beta_slow = float_attr(m, op, "beta_slow");
    if (p.beta_fast == 0) p.beta_fast = 32;
    if (p.beta_slow == 0) p.beta_slow = 1;
    p.mscale = float_attr(m, op, "mscale");
    p.mscale_all_dim = float_attr(m, op, "mscale_all_dim");
    p.truncate = bool_attr(m, op, "truncate");
    floats_attr(m, op, "short_factor", &p.short_factor, &p.short_count);
    floats_attr(m, op, "long_factor", &p.long_factor, &p.long_count);
    if ((p.scaling == IR_ROPE_YARN || p.scaling == IR_ROPE_LONGROPE) && p.factor == 0 &&
        p.original_max_positions > 0)
        p.factor = (double)p.max_positions / (double)p.original_max_positions;
    return p;
}

static bool same_factors(const double *a, uint32_t a_count, const double *b, uint32_t b_count) {
    if (a_count != b_count) return false;
    for (uint32_t i = 0; i < a_count; i++)
        if (!(a[i] == b[i])) return false;
    return true;
}

bool ir_rope_params_equal(const ir_rope_params *a, const ir_rope_params *b) {
    return a->scaling == b->scaling && a->theta == b->theta && a->rotary_dim == b->rotary_dim &&
           a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor &&
           a->original_max_positions == b->original_max_positions && a->max_positions == b->max_positions &&
           a->attention_factor == b->attention_factor && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->mscale == b->mscale && a->mscale_all_dim == b->mscale_all_dim &&
           a->truncate == b->truncate &&
           same_factors(a->short_factor, a->short_count, b->short_factor, b->short_count) &&
           same_factors(a->long_factor, a->long_count, b->long_factor, b->long_count);
}

/* ---- checks ------------------------------------------------------------------ */

static bool finite_positive(double v) { return isfinite(v) && v > 0; }

#define FAIL(...) return snprintf(why, why_size, __VA_ARGS__), false

static bool check_factors(const char *name, const double *items, uint32_t count, int64_t half, char *why,
                          size_t why_size) {
    if ((int64_t)count != half)
        FAIL("longrope's %s must have rotary_dim / 2 = %lld entries, found %u", name, (long long)half, count);
    for (uint32_t i = 0; i < count; i++)
        if (!finite_positive(items[i]))
            FAIL("longrope's %s[%u] must be a finite number > 0, found %g", name, i, items[i]);
    return true;
}

bool ir_rope_params_check(const ir_rope_params *p, int64_t head_dim, char *why, size_t why_size) {
    const char *name = ir_rope_scaling_name(p->scaling);
    if (!finite_positive(p->theta)) FAIL("theta must be > 0, found %g", p->theta);
    if (p->rotary_dim < 2 || p->rotary_dim % 2 || p->rotary_dim > head_dim)
        FAIL("the rotated dims (rotary_dim, or the head dim %lld times partial_rotary_factor) must be even, "
             ">= 2 and at most the head dim; found %lld",
             (long long)head_dim, (long long)p->rotary_dim);
    if (p->rotary_dim / 2 > 4096)
        FAIL("at most 8192 rotated dims are supported, found %lld", (long long)p->rotary_dim);
    if (p->max_positions < 0 || p->original_max_positions < 0)
        FAIL("max_position_embeddings and original_max_position_embeddings must be >= 0");
    switch (p->scaling) {
    case IR_ROPE_DEFAULT: return true;
    case IR_ROPE_LINEAR:
        if (!finite_positive(p->factor))
            FAIL("rope scaling '%s' needs a factor > 0, found %g", name, p->factor);
        return true;
    case IR_ROPE_DYNAMIC:
        if (!finite_positive(p->factor))
            FAIL("rope scaling '%s' needs a factor > 0, found %g", name, p->factor);
        if (p->max_positions < 1)
            FAIL("rope scaling 'dynamic' needs max_position_embeddings: its frequencies are static only "
                 "below it");
        return true;
    case IR_ROPE_LLAMA3:
        if (!finite_positive(p->factor))
            FAIL("rope scaling '%s' needs a factor > 0, found %g", name, p->factor);
        if (!finite_positive(p->low_freq_factor) || !finite_positive(p->high_freq_factor) ||
            !(p->high_freq_factor > p->low_freq_factor))
            FAIL("rope scaling 'llama3' needs 0 < low_freq_factor < high_freq_factor, found %g and %g",
                 p->low_freq_factor, p->high_freq_factor);
        if (p->original_max_positions < 1)
            FAIL("rope scaling 'llama3' needs original_max_position_embeddings (or max_position_embeddings)");
        return true;
    case IR_ROPE_YARN:
    case IR_ROPE_LONGROPE:
        if (p->original_max_positions < 1)
            FAIL("rope scaling '%s' needs original_max_position_embeddings (or max_position_embeddings)",
                 name);
        if (!finite_positive(p->factor))
            FAIL("rope scaling '%s' needs a factor > 0 (or max_position_embeddings), found %g", name,
                 p->factor);
        if (!(isfinite(p->attention_factor) && p->attention_factor >= 0))
            FAIL("attention_factor must be >= 0 (0: computed), found %g", p->attention_factor);
        if (p->scaling == IR_ROPE_YARN) {
            if (!isfinite(p->beta_fast) || !isfinite(p->beta_slow) || !isfinite(p->mscale) ||
                !isfinite(p->mscale_all_dim))
                FAIL("rope scaling 'yarn' needs finite beta_fast, beta_slow, mscale and mscale_all_dim");
            return true;
        }
        return check_factors("short_factor", p->short_factor, p->short_count, p->rotary_dim / 2, why,
                             why_size) &&
               check_factors("long_factor", p->long_factor, p->long_count, p->rotary_dim / 2, why, why_size);
    }
    FAIL("unknown rope scaling");
}

#undef FAIL

/* ---- the tables ---------------------------------------------------------------- */

/* theta^(2i / r) in float32: `base ** (torch.arange(0, r, 2).float() / r)`. */
static float base_power(double theta, int64_t i, int64_t rotary) {
    return powf((float)theta, (float)(2 * i) / (float)rotary);
}

/* yarn's find_correction_dim: the dim at which `rotations` turns fit in
 * original_max positions (Python floats). */
static double correction_dim(double rotations, int64_t rotary, double theta, int64_t original_max) {
    return ((double)rotary * log((double)original_max / (rotations * 2 * ROPE_PI))) / (2 * log(theta));
}

static double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static void yarn(const ir_rope_params *p, float *inv_freq, float *attention_factor) {
    int64_t half = p->rotary_dim / 2;
    double low = correction_dim(p->beta_fast, p->rotary_dim, p->theta, p->original_max_positions);
    double high = correction_dim(p->beta_slow, p->rotary_dim, p->theta, p->original_max_positions);
    if (p->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > (double)(p->rotary_dim - 1)) high = (double)(p->rotary_dim - 1);
    if (low == high) high += 0.001; /* linear_ramp_factor's guard against a singularity */
    for (int64_t i = 0; i < half; i++) {
        float power = base_power(p->theta, i, p->rotary_dim);
        float extrapolation = 1.0f / power, interpolation = 1.0f / ((float)p->factor * power);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extrapolation_share = 1.0f - ramp;
        inv_freq[i] = interpolation * (1.0f - extrapolation_share) + extrapolation * extrapolation_share;
    }
    double factor = p->attention_factor;
    if (factor == 0)
        factor = p->mscale != 0 && p->mscale_all_dim != 0
                     ? yarn_mscale(p->factor, p->mscale) / yarn_mscale(p->factor, p->mscale_all_dim)
                     : yarn_mscale(p->factor, 1);
    *attention_factor = (float)factor;
}

static void llama3(const ir_rope_params *p, float *inv_freq) {
    double old_context = (double)p->original_max_positions;
    float low_wavelength = (float)(old_context / p->low_freq_factor);
    float high_wavelength = (float)(old_context / p->high_freq_factor);
    float factor = (float)p->factor;
    for (int64_t i = 0; i < p->rotary_dim / 2; i++) {
        float base = 1.0f / base_power(p->theta, i, p->rotary_dim);
        float wavelength = (float)(2 * ROPE_PI) / base;
        float scaled = wavelength > low_wavelength ? base / factor : base;
        bool medium = !(wavelength < high_wavelength) && !(wavelength > low_wavelength);
        if (medium) {
            float smooth = ((float)old_context / wavelength - (float)p->low_freq_factor) /
                           (float)(p->high_freq_factor - p->low_freq_factor);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = scaled;
    }
}

static void longrope(const ir_rope_params *p, const double *factors, float *inv_freq) {
    for (int64_t i = 0; i < p->rotary_dim / 2; i++)
        inv_freq[i] = 1.0f / ((float)factors[i] * base_power(p->theta, i, p->rotary_dim));
}

size_t ir_rope_tables_floats(const ir_rope_params *p) {
    size_t half = p->rotary_dim > 1 ? (size_t)(p->rotary_dim / 2) : 1;
    return p->scaling == IR_ROPE_LONGROPE ? 2 * half : half;
}

void ir_rope_tables_compute(const ir_rope_params *p, float *storage, ir_rope_tables *out) {
    memset(out, 0, sizeof *out);
    out->half = (uint32_t)(p->rotary_dim / 2);
    out->attention_factor = 1.0f;
    out->inv_freq = storage;
    if (p->scaling == IR_ROPE_LONGROPE) out->long_inv_freq = storage + (out->half ? out->half : 1);
    double theta = p->theta;
    switch (p->scaling) {
    case IR_ROPE_DYNAMIC: {
        /* At seq_len = max_position_embeddings (all smelt runs) the base is
         * theta * (factor * L / L - (factor - 1))^(r / (r - 2)), which is theta
         * but for rounding; keep the rounding transformers has. */
        double length = (double)p->max_positions;
        double r = (double)p->rotary_dim;
        if (p->rotary_dim > 2) theta *= pow(p->factor * length / length - (p->factor - 1), r / (r - 2));
    } /* fall through */
    case IR_ROPE_DEFAULT:
    case IR_ROPE_LINEAR:
        for (uint32_t i = 0; i < out->half; i++) {
            out->inv_freq[i] = 1.0f / base_power(theta, i, p->rotary_dim);
            if (p->scaling == IR_ROPE_LINEAR) out->inv_freq[i] /= (float)p->factor;
        }
        break;
    case IR_ROPE_LLAMA3: llama3(p, out->inv_freq); break;
    case IR_ROPE_YARN: yarn(p, out->inv_freq, &out->attention_factor); break;
    case IR_ROPE_LONGROPE: {
        longrope(p, p->short_factor, out->inv_freq);
        longrope(p, p->long_factor, out->long_inv_freq);
        out->long_after = p->original_max_positions;
        double factor = p->attention_factor;
        if (factor == 0)
            factor = p->factor <= 1 ? 1.0 : sqrt(1 + log(p->factor) / log((double)p->original_max_positions));
        out->attention_factor = (float)factor;
        break;
    }
    }
}
