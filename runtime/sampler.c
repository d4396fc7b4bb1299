/* sampler.c - greedy and sampled token choice (sampler.h).
 *
 * Sampling: drop NaN logits; when top-k or top-p is on, sort the candidates
 * by logit (descending, ties by id) and keep the first k; weigh each by
 * exp((logit - max) / temperature) in double; with top-p keep the shortest
 * prefix whose weight reaches p of the total (at least one token); draw one
 * by a uniform number from PCG32 (O'Neill's pcg32, XSH-RR output).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

typedef struct rt_candidate {
    float logit;
    int32_t id;
    double weight;
} rt_candidate;

/* ---- PCG32 ---------------------------------------------------------------------- */

enum { PCG32_STREAM = 54 };
static const uint64_t PCG32_MULTIPLIER = 6364136223846793005ull;

void rt_pcg32_seed(rt_pcg32 *g, uint64_t seed, uint64_t stream) {
    g->state = 0;
    g->increment = (stream << 1) | 1u;
    rt_pcg32_next(g);
    g->state += seed;
    rt_pcg32_next(g);
}

uint32_t rt_pcg32_next(rt_pcg32 *g) {
    uint64_t old = g->state;
    g->state = old * PCG32_MULTIPLIER + g->increment;
    uint32_t xorshifted = (uint32_t)(((old >> 18) ^ old) >> 27);
    uint32_t rotation = (uint32_t)(old >> 59);
    return (xorshifted >> rotation) | (xorshifted << ((32 - rotation) & 31));
}

double rt_pcg32_uniform(rt_pcg32 *g) {
    uint64_t high = rt_pcg32_next(g) >> 5, low = rt_pcg32_next(g) >> 6; /* 27 + 26 bits */
    return (double)((high << 26) | low) * (1.0 / 9007199254740992.0);
}

/* ---- Sampler ---------------------------------------------------------------------- */

smelt_status rt_sampler_init(rt_sampler *s, uint64_t vocab, rt_error *e) {
    s->vocab = vocab;
    s->candidates =
        vocab <= SIZE_MAX / sizeof(rt_candidate) ? malloc((size_t)vocab * sizeof(rt_candidate)) : NULL;
    if (!s->candidates)
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for a sampler of %llu tokens",
                       (unsigned long long)vocab);
    rt_pcg32_seed(&s->generator, 0, PCG32_STREAM);
    return SMELT_OK;
}

void rt_sampler_free(rt_sampler *s) {
    free(s->candidates);
    s->candidates = NULL;
}

void rt_sampler_seed(rt_sampler *s, uint64_t seed) { rt_pcg32_seed(&s->generator, seed, PCG32_STREAM); }

smelt_status rt_sampler_argmax(const float *logits, uint64_t vocab, int32_t *token, rt_error *e) {
    int64_t best = -1;
    for (uint64_t i = 0; i < vocab; i++) {
        if (isnan(logits[i])) continue;
        if (best < 0 || logits[i] > logits[best]) best = (int64_t)i;
    }
    if (best < 0)
        return rt_fail(e, SMELT_ERROR_DEVICE, "every logit is NaN: the model's arithmetic broke down");
    *token = (int32_t)best;
    return SMELT_OK;
}

static int by_logit_descending(const void *a, const void *b) {
    const rt_candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

smelt_status rt_sampler_pick(rt_sampler *s, const float *logits, const rt_sampler_settings *settings,
                             int32_t *token, rt_error *e) {
    if (!(settings->temperature > 0.0f)) return rt_sampler_argmax(logits, s->vocab, token, e);
    uint64_t count = 0;
    for (uint64_t i = 0; i < s->vocab; i++)
        if (!isnan(logits[i])) s->candidates[count++] = (rt_candidate){logits[i], (int32_t)i, 0.0};
    if (count == 0)
        return rt_fail(e, SMELT_ERROR_DEVICE, "every logit is NaN: the model's arithmetic broke down");
    bool top_p = settings->top_p < 1.0f; /* false for NaN too */
    if (settings->top_k > 0 || top_p) {
        qsort(s->candidates, count, sizeof *s->candidates, by_logit_descending);
        if (settings->top_k > 0 && settings->top_k < count) count = settings->top_k;
    }
    float most = s->candidates[0].logit;
    for (uint64_t i = 1; i < count; i++)
        if (s->candidates[i].logit > most) most = s->candidates[i].logit;
    if (isinf(most) && most < 0) { /* nothing is possible: fall back to the first */
        *token = s->candidates[0].id;
        return SMELT_OK;
    }
    double total = 0.0;
    for (uint64_t i = 0; i < count; i++) {
        rt_candidate *c = &s->candidates[i];
        c->weight =
            isinf(c->logit) && c->logit > 0 ? 1.0 : exp(((double)c->logit - most) / settings->temperature);
        total += c->weight;
    }
    if (top_p) {
        double kept = 0.0, needed = (double)(settings->top_p > 0.0f ? settings->top_p : 0.0f) * total;
        uint64_t keep = 0;
        while (keep < count && (keep == 0 || kept < needed))
            kept += s->candidates[keep++].weight;
        count = keep;
        total = kept;
    }
    double target = rt_pcg32_uniform(&s->generator) * total;
    for (uint64_t i = 0; i < count; i++) {
        target -= s->candidates[i].weight;
        if (target < 0.0) {
            *token = s->candidates[i].id;
            return SMELT_OK;
        }
    }
    /* Rounding left a sliver: the last token with any weight. */
    for (uint64_t i = count; i-- > 0;)
        if (s->candidates[i].weight > 0.0) {
            *token = s->candidates[i].id;
            return SMELT_OK;
        }
    *token = s->candidates[0].id;
    return SMELT_OK;
}
