/* quant_synthetic.h - synthetic calibration data for the quantizer tests:
 * a weight with normal entries and inputs whose few outlier channels carry
 * activations many times larger than the rest, as in trained transformers
 * (the case AWQ, GPTQ and SmoothQuant are for). Deterministic. */
#ifndef SMELT_TEST_QUANT_SYNTHETIC_H
#define SMELT_TEST_QUANT_SYNTHETIC_H

#include <math.h>
#include <stdint.h>

/* A standard normal from a 32-bit LCG state (Box-Muller). */
static inline float synthetic_normal(uint32_t *state) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        *state = *state * 1664525u + 1013904223u;
        u[i] = ((double)(*state >> 8) + 0.5) / 16777216.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* w[rows][cols] ~ N(0, 0.05^2); x[tokens][cols]: N(0, 1) noise plus four
 * shared latent factors (so channels correlate, as real activations do),
 * every `outlier_every`-th channel (from channel 3) scaled by `outlier`. */
static inline void synthetic_layer(float *w, uint64_t rows, float *x, uint64_t tokens, uint64_t cols,
                                   uint64_t outlier_every, float outlier, uint32_t seed) {
    uint32_t state = seed;
    for (uint64_t i = 0; i < rows * cols; i++)
        w[i] = 0.05f * synthetic_normal(&state);
    enum { FACTORS = 4 };
    float loading[FACTORS][64]; /* factor r's weight on channel k % 64 */
    for (int r = 0; r < FACTORS; r++)
        for (int k = 0; k < 64; k++)
            loading[r][k] = synthetic_normal(&state);
    for (uint64_t t = 0; t < tokens; t++) {
        float factor[FACTORS];
        for (int r = 0; r < FACTORS; r++)
            factor[r] = synthetic_normal(&state);
        for (uint64_t k = 0; k < cols; k++) {
            float v = synthetic_normal(&state);
            for (int r = 0; r < FACTORS; r++)
                v += factor[r] * loading[r][k % 64];
            x[t * cols + k] = v * (k % outlier_every == 3 ? outlier : 1.0f);
        }
    }
}

#endif
