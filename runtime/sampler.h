/* sampler.h - choosing the next token from a row of logits: greedy, or
 * sampled with temperature, top-k and top-p from a seeded PCG32 generator.
 *
 *   rt_sampler s;
 *   rt_sampler_init(&s, vocab, &e);
 *   rt_sampler_seed(&s, 1234);
 *   rt_sampler_settings settings = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
 *   int32_t token;
 *   rt_sampler_pick(&s, logits, &settings, &token, &e);
 *   rt_sampler_free(&s);
 *
 * Equal seeds and logits give equal tokens on every machine (the generator
 * and the arithmetic are fixed: double precision, ties broken by token id).
 */
#ifndef SMELT_RT_SAMPLER_H
#define SMELT_RT_SAMPLER_H

#include "error.h"

typedef struct rt_pcg32 {
    uint64_t state, increment;
} rt_pcg32;

void rt_pcg32_seed(rt_pcg32 *g, uint64_t seed, uint64_t stream);
uint32_t rt_pcg32_next(rt_pcg32 *g);
/* Uniform in [0, 1), 53 random bits. */
double rt_pcg32_uniform(rt_pcg32 *g);

typedef struct rt_sampler_settings {
    float temperature; /* <= 0 (or NaN): greedy */
    uint32_t top_k;    /* 0: no limit */
    float top_p;       /* >= 1 (or NaN): no limit */
} rt_sampler_settings;

typedef struct rt_sampler {
    uint64_t vocab;
    rt_pcg32 generator;
    struct rt_candidate *candidates; /* [vocab] scratch */
} rt_sampler;

smelt_status rt_sampler_init(rt_sampler *s, uint64_t vocab, rt_error *e);
void rt_sampler_free(rt_sampler *s);
void rt_sampler_seed(rt_sampler *s, uint64_t seed);

/* Argmax, ties to the lowest id, NaN ignored; SMELT_ERROR_DEVICE when every
 * logit is NaN. */
smelt_status rt_sampler_argmax(const float *logits, uint64_t vocab, int32_t *token, rt_error *e);

/* The next token from logits[vocab] under the settings. */
smelt_status rt_sampler_pick(rt_sampler *s, const float *logits, const rt_sampler_settings *settings,
                             int32_t *token, rt_error *e);

#endif
