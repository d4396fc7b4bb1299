/* executor.h - runs a decoded program on a device, one step of T tokens.
 *
 *   rt_executor x;
 *   rt_executor_init(&x, &program, device, weights, true, &e);  // arena + state buffers
 *   rt_executor_step(&x, ids, pos, 3, PROG_ROWS_ALL, logits, NULL, &e);   // logits of 3 tokens
 *   rt_executor_step(&x, ids, pos, 3, PROG_ROWS_LAST, logits, NULL, &e);  // the last one's alone
 *   rt_executor_step(&x, &next, &at, 1, PROG_ROWS_LAST, logits, NULL, &e);
 *                          // decode (from the second on, a replayed graph where the device has them)
 *   rt_executor_free(&x);
 *
 * A step writes ids and positions into the arena, evaluates every launch rule
 * and GEMM row count at T, resolves each prog_ref to a device address (arena,
 * weight or state buffer + offset), launches, and copies logits out. The
 * program was validated by program_decode, so every region is inside its
 * buffer at any T <= max_tokens; the step checks T, ids and positions.
 *
 * Scaled GEMMs (plan/program.h, prog_need). rt_executor_init asks the device
 * once whether it runs the scaled GEMMs of every code dtype the program's
 * use (rt_device_ops.runs_scaled_gemm; no member: no) and keeps the answer:
 * from then on the PROG_NEED_SCALED_GEMM instructions run and their
 * PROG_NEED_NO_SCALED_GEMM fallback kernels do not, or the other way round.
 * $SMELT_NO_SCALED_GEMM=1 makes the answer no on any device (the fallback
 * kernels everywhere: what tests compare the two with). Once weights are
 * bound (and again after a rebind), rt_executor_prepare_gemms hands the
 * device every scaled GEMM that will run (rt_device_ops.prepare_gemm), before
 * any capture; a device that answers SMELT_ERROR_UNSUPPORTED for one (it
 * cannot run that shape) moves the whole executor to the fallback kernels,
 * which the decoder guarantees every scaled GEMM has.
 */
#ifndef SMELT_RT_EXECUTOR_H
#define SMELT_RT_EXECUTOR_H

#include "device.h"
#include "program.h"

typedef struct rt_executor {
    const program *program;
    rt_device *device;
    void *arena;                 /* device address, program->arena_bytes */
    void **states;               /* [state_count] device addresses (NULL for an empty one) */
    void *const *weights;        /* [weight_count] device addresses, owned by the caller */
    bool use_graphs;             /* capture T = 1 steps once, replay them after */
    bool decode_warmed;          /* a T = 1 step has run outside a capture */
    bool graph_ready;            /* a T = 1 graph has been captured */
    uint32_t graph_launches;     /* launches + GEMMs in the captured graph */
    uint32_t launches_last_step; /* launches + GEMMs the last step ran */
    uint64_t graph_replays;
    /* [choice_count][PROG_CHOICE_MAX_TOKENS] the side each choice runs at T
     * = min_tokens + index (plan/program.h, "Choices") */
    uint8_t *choice_sides;
    bool scaled_gemms; /* the device runs the scaled GEMMs (not their fallbacks): decided at init */
} rt_executor;

/* Allocates the arena and the state buffers (zeroed). `weights` must stay
 * valid and complete (no NULL) for every step; graphs are used only when the
 * device can capture them. */
smelt_status rt_executor_init(rt_executor *x, const program *p, rt_device *device, void *const *weights,
                              bool use_graphs, rt_error *e);
void rt_executor_free(rt_executor *x);

/* Which side of each choice between a fused GEMV group's two lowerings
 * runs in a step of T tokens (plan/program.h, "Choices"):
 *   gemv_max_tokens > 0: the fused kernel up to that T, its ops one by one
 *     above (what tests use to run each side);
 *   else, on a device with figures (rt_device_ops.figures: the GPU's
 *     bandwidth, peaks and launch cost), the side of the smaller modeled
 *     time (program_choice_side);
 *   else (the host) the fixed rule: the fused kernel only up to the tokens
 *     it is made for alone (the choice's min_tokens - 1), so host runs are
 *     deterministic and the same on every machine.
 * rt_executor_init applies the rule of gemv_max_tokens 0. */
void rt_executor_choose(rt_executor *x, int64_t gemv_max_tokens);

/* Prepares on the device every scaled GEMM that will run and reads weight
 * `weight` as B (RT_NOT_A_WEIGHT: every one); call it once the weights'
 * addresses are set, after every (re)binding, before a step. A GEMM the
 * device cannot run (SMELT_ERROR_UNSUPPORTED) moves the executor to the
 * fallback kernels for good, and the call succeeds; any other failure is
 * returned, naming the instruction. */
smelt_status rt_executor_prepare_gemms(rt_executor *x, uint32_t weight, rt_error *e);

/* Zeroes the state buffers (a new sequence). */
smelt_status rt_executor_reset(rt_executor *x, rt_error *e);

/* Forgets the captured graph: call it when a weight moves to another address. */
void rt_executor_invalidate_graph(rt_executor *x);

/* One step of `tokens` tokens (1..max_tokens). ids must lie in the program's
 * id bound, positions in [0, max_positions). The output head runs on the
 * rows wanted (program.h, "Wanted rows"), whose logits are copied to logits:
 * all, tokens x vocab floats; the last, vocab floats; none, nothing (logits
 * may be NULL) — unless greedy_token is given (rows must be
 * PROG_ROWS_LAST) and the program has a greedy kernel: then the device
 * picks the argmax of the last row and only that id is copied to
 * *greedy_token (logits untouched). A program without one copies the logits
 * whatever greedy_token is. */
smelt_status rt_executor_step(rt_executor *x, const int32_t *ids, const int32_t *pos, uint32_t tokens,
                              prog_rows rows, float *logits, int32_t *greedy_token, rt_error *e);

#endif
