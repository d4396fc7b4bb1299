/* host_sim_warp.c - the warp barrier and what exchanges through it:
 * __syncwarp, shuffles, votes, and the tensor-core operations mma.m16n8k16
 * (bf16 or f16 -> f32) and ldmatrix.x4, emulated with the PTX ISA's fragment
 * layouts ("Matrix Fragments for mma.m16n8k16 with floating point type";
 * "Warp-level matrix load instruction: ldmatrix").
 *
 * Every lane of a warp posts its operands in the warp's record (sim_warp)
 * and waits; the lane that completes the barrier (the last live lane to
 * arrive, or a lane returning while all others wait) computes the results
 * of all lanes at once, then releases them. Each lane reads only its own
 * result, and reads it before it can arrive again, so nothing is
 * overwritten before it is read.
 */
#include "host_sim_block.h"
#include "numeric.h"

#include <string.h>

const char *sim_warp_op_name(sim_warp_op op) {
    switch (op) {
    case SIM_WARP_SYNC: return "__syncwarp()";
    case SIM_WARP_SHUFFLE_IDX: return "__shfl_sync()";
    case SIM_WARP_SHUFFLE_UP: return "__shfl_up_sync()";
    case SIM_WARP_SHUFFLE_DOWN: return "__shfl_down_sync()";
    case SIM_WARP_SHUFFLE_XOR: return "__shfl_xor_sync()";
    case SIM_WARP_VOTE_BALLOT: return "__ballot_sync()";
    case SIM_WARP_VOTE_ANY: return "__any_sync()";
    case SIM_WARP_VOTE_ALL: return "__all_sync()";
    case SIM_WARP_MMA_M16N8K16_BF16: return "smelt_mma_m16n8k16_bf16_f32()";
    case SIM_WARP_MMA_M16N8K16_F16: return "smelt_mma_m16n8k16_f16_f32()";
    case SIM_WARP_LDMATRIX_X4: return "smelt_ldmatrix_x4()";
    }
    return "a warp operation";
}

/* The lane a shuffle reads from (width 32, as PTX shfl.sync computes it),
 * or -1 when the lane keeps its own value. */
static inline int sim_shuffle_source(sim_warp_op op, unsigned lane, unsigned operand) {
    switch (op) {
    case SIM_WARP_SHUFFLE_IDX: return (int)(operand % SIM_WARP_LANES);
    case SIM_WARP_SHUFFLE_UP: return operand <= lane ? (int)(lane - operand) : -1;
    case SIM_WARP_SHUFFLE_DOWN: return operand < SIM_WARP_LANES - lane ? (int)(lane + operand) : -1;
    case SIM_WARP_SHUFFLE_XOR: return (lane ^ operand) < SIM_WARP_LANES ? (int)(lane ^ operand) : -1;
    default: return -1;
    }
}

/* Every lane's result, lanes that have not arrived (that do not exist or
 * have returned) included: nobody reads those. A source lane that has not
 * arrived has nothing to give: the reader keeps its own value. */
static void sim_resolve_shuffle(sim_warp *warp, sim_warp_op op, uint32_t lanes) {
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++) {
        int source = sim_shuffle_source(op, lane, warp->operand[lane]);
        bool present = source >= 0 && (lanes >> source & 1);
        warp->result[lane] = warp->value[present ? (unsigned)source : lane];
    }
}

/* A full warp xor-ing by one lane mask under 32, the butterfly of every
 * warp reduction: no lane falls outside, so no checks. */
static void sim_resolve_butterfly(sim_warp *warp, unsigned lane_mask) {
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++)
        warp->result[lane] = warp->value[lane ^ lane_mask];
}

static void sim_resolve_vote(sim_warp *warp, sim_warp_op op, uint32_t lanes) {
    uint32_t ballot = 0;
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++)
        ballot |= (warp->value[lane] & (lanes >> lane & 1)) << lane;
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++) {
        uint32_t voters = lanes & warp->operand[lane];
        switch (op) {
        case SIM_WARP_VOTE_BALLOT: warp->result[lane] = ballot & voters; break;
        case SIM_WARP_VOTE_ANY: warp->result[lane] = (ballot & voters) != 0; break;
        default: warp->result[lane] = (voters & ~ballot) == 0; break; /* all */
        }
    }
}

/* The low 16 bits of a fragment register, as bf16 or f16, widened. */
static float sim_b16_to_f32(uint32_t bits16, bool f16) {
    uint16_t h = (uint16_t)(bits16 & 0xffffu);
    return f16 ? plan_f16_to_f32(h) : plan_bf16_to_f32(h);
}

/* m16n8k16, A row-major 16x16, B 16x8 (column fragments), C/D 16x8 f32.
 * With g = lane / 4 and t = lane % 4, lane holds (PTX ISA):
 *   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
 *   a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
 *   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
 *   c[0], c[1] = C[g][2t], C[g][2t+1];  c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
 * the lower-indexed element of each pair in the low 16 bits; `f16`: the
 * 16-bit elements are f16 (else bf16). */
static void sim_resolve_mma(sim_warp *warp, bool f16) {
    float a[16][16], b[16][8];
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++) {
        const sim_warp_matrix_request *request = warp->matrix[lane];
        unsigned g = lane / 4, t = lane % 4;
        for (unsigned r = 0; r < 4; r++) {
            unsigned row = g + (r & 1) * 8, column = 2 * t + (r >> 1) * 8;
            a[row][column] = sim_b16_to_f32(request->mma_a[r], f16);
            a[row][column + 1] = sim_b16_to_f32(request->mma_a[r] >> 16, f16);
        }
        for (unsigned r = 0; r < 2; r++) {
            unsigned k = 2 * t + r * 8;
            b[k][g] = sim_b16_to_f32(request->mma_b[r], f16);
            b[k + 1][g] = sim_b16_to_f32(request->mma_b[r] >> 16, f16);
        }
    }
    float d[SIM_WARP_LANES][4];
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++) {
        const sim_warp_matrix_request *request = warp->matrix[lane];
        unsigned g = lane / 4, t = lane % 4;
        for (unsigned i = 0; i < 4; i++) {
            unsigned row = g + (i >> 1) * 8, column = 2 * t + (i & 1);
            /* f32 accumulation in k order; bf16 and f16 products are exact in f32. */
            float sum = request->mma_c[i];
            for (unsigned k = 0; k < 16; k++)
                sum += a[row][k] * b[k][column];
            d[lane][i] = sum;
        }
    }
    /* Written only now: a lane's d may be its own c. */
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++)
        memcpy(warp->matrix[lane]->mma_d, d[lane], sizeof d[lane]);
}

/* ldmatrix.x4: lane i gives the address of row i % 8 of matrix i / 8 (eight
 * b16 values, 16-byte aligned); lane t receives, for each matrix m, row t / 4,
 * columns 2(t % 4) and 2(t % 4) + 1 in rows[m] (low half first). */
static void sim_resolve_ldmatrix(sim_block *block, sim_thread *self, sim_warp *warp, unsigned warp_index) {
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++) {
        const void *address = warp->matrix[lane]->ldmatrix_row_address;
        if ((uintptr_t)address % 16 != 0)
            sim_block_fail(block, self, SIM_ERROR_WARP_MISUSE,
                           "smelt_ldmatrix_x4() in warp %u: lane %u gives the row address %p, "
                           "expected a 16-byte aligned one",
                           warp_index, lane, address);
    }
    uint32_t rows[SIM_WARP_LANES][4];
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++) {
        for (unsigned m = 0; m < 4; m++) {
            const unsigned char *row = warp->matrix[m * 8 + lane / 4]->ldmatrix_row_address;
            uint16_t pair[2];
            memcpy(pair, row + 4 * (lane % 4), sizeof pair);
            rows[lane][m] = (uint32_t)pair[0] | (uint32_t)pair[1] << 16;
        }
    }
    for (unsigned lane = 0; lane < SIM_WARP_LANES; lane++)
        memcpy(warp->matrix[lane]->ldmatrix_rows, rows[lane], sizeof rows[lane]);
}

/* Every live lane of the warp has arrived: compute, then release them all
 * except `self` (which runs on) to the front of the run queue, in lane
 * order. */
static void sim_warp_release(sim_block *block, sim_thread *self, unsigned warp_index) {
    sim_warp *warp = &block->warps[warp_index];
    uint32_t lanes = warp->arrived_lanes;
    switch (warp->op) {
    case SIM_WARP_SYNC: break;
    case SIM_WARP_SHUFFLE_XOR:
        if (lanes == 0xffffffffu) {
            unsigned lane_mask = warp->operand[0];
            bool uniform = lane_mask < SIM_WARP_LANES;
            for (unsigned lane = 1; lane < SIM_WARP_LANES; lane++)
                uniform &= warp->operand[lane] == lane_mask;
            if (uniform) {
                sim_resolve_butterfly(warp, lane_mask);
                break;
            }
        }
        sim_resolve_shuffle(warp, SIM_WARP_SHUFFLE_XOR, lanes);
        break;
    case SIM_WARP_SHUFFLE_IDX:
    case SIM_WARP_SHUFFLE_UP:
    case SIM_WARP_SHUFFLE_DOWN: sim_resolve_shuffle(warp, warp->op, lanes); break;
    case SIM_WARP_VOTE_BALLOT:
    case SIM_WARP_VOTE_ANY:
    case SIM_WARP_VOTE_ALL: sim_resolve_vote(warp, warp->op, lanes); break;
    case SIM_WARP_MMA_M16N8K16_BF16:
    case SIM_WARP_MMA_M16N8K16_F16:
    case SIM_WARP_LDMATRIX_X4:
        if (lanes != 0xffffffffu)
            sim_block_fail(block, self, SIM_ERROR_WARP_MISUSE,
                           "%s in warp %u needs all 32 lanes of the warp; %d take part",
                           sim_warp_op_name(warp->op), warp_index, __builtin_popcount(lanes));
        if (warp->op != SIM_WARP_LDMATRIX_X4)
            sim_resolve_mma(warp, warp->op == SIM_WARP_MMA_M16N8K16_F16);
        else
            sim_resolve_ldmatrix(block, self, warp, warp_index);
        break;
    }
    warp->arrived_lanes = 0;
    /* self's lane, when it is one of them, stays out: it runs on. */
    uint32_t waiting = lanes & ~(self->index / SIM_WARP_LANES == warp_index ? 1u << self->view.lane : 0u);
    if (waiting) sim_block_resume_lanes(block, warp_index * SIM_WARP_LANES, waiting);
}

/* The calling lane arrives at a warp operation with its operands posted
 * (or, for mma and ldmatrix, its request); returns when every live lane has
 * arrived and the results are in the warp record. */
/* A lane whose mask leaves it out, or that arrives at another operation
 * than the lanes waiting: ends the block. Out of line, so that the arrival
 * itself stays a few instructions. */
static _Noreturn __attribute__((noinline, cold)) void
sim_warp_misuse(sim_block *block, sim_thread *self, const sim_warp *warp, sim_warp_op op, unsigned mask) {
    unsigned lane = self->view.lane, warp_index = self->index / SIM_WARP_LANES;
    if (!(mask >> lane & 1))
        sim_block_fail(block, self, SIM_ERROR_WARP_MISUSE,
                       "%s in warp %u, lane %u: the mask 0x%08x does not include the calling lane",
                       sim_warp_op_name(op), warp_index, lane, mask);
    sim_block_fail(block, self, SIM_ERROR_WARP_MISUSE,
                   "threads of warp %u wait at different warp operations: %d at %s, lane %u at %s",
                   warp_index, __builtin_popcount(warp->arrived_lanes), sim_warp_op_name(warp->op), lane,
                   sim_warp_op_name(op));
}

static inline void sim_warp_arrive(sim_warp_op op, unsigned mask) {
    sim_thread *self = sim_thread_running();
    sim_block *block = self->block;
    unsigned lane = self->view.lane, warp_index = self->index / SIM_WARP_LANES;
    sim_warp *warp = &block->warps[warp_index];
    if (__builtin_expect(!(mask >> lane & 1) || (warp->arrived_lanes && warp->op != op), 0))
        sim_warp_misuse(block, self, warp, op, mask);
    warp->op = op;
    warp->arrived_lanes |= 1u << lane;
    if (warp->arrived_lanes == warp->live_lanes) {
        sim_warp_release(block, self, warp_index);
        return;
    }
    sim_block_wait(block, self);
}

/* The running lane's slot in its warp record. */
static inline sim_warp *sim_running_warp(unsigned *lane) {
    const sim_thread *self = sim_thread_running();
    *lane = self->view.lane;
    return &self->block->warps[self->index / SIM_WARP_LANES];
}

void sim_warp_lane_returned(sim_block *block, sim_thread *thread) {
    unsigned warp_index = thread->index / SIM_WARP_LANES;
    sim_warp *warp = &block->warps[warp_index];
    warp->live_lanes &= ~(1u << thread->view.lane);
    if (warp->arrived_lanes && warp->arrived_lanes == warp->live_lanes)
        sim_warp_release(block, thread, warp_index);
}

/* ---- what kernels call (declared in smelt_kernel.h) ---- */

void smelt_sim_syncwarp(unsigned int mask) { sim_warp_arrive(SIM_WARP_SYNC, mask); }

uint32_t smelt_sim_shuffle(enum smelt_sim_shuffle_mode mode, unsigned int mask, uint32_t value,
                           unsigned int lane_operand) {
    static const sim_warp_op ops[] = {
        [SMELT_SIM_SHFL_IDX] = SIM_WARP_SHUFFLE_IDX,
        [SMELT_SIM_SHFL_UP] = SIM_WARP_SHUFFLE_UP,
        [SMELT_SIM_SHFL_DOWN] = SIM_WARP_SHUFFLE_DOWN,
        [SMELT_SIM_SHFL_XOR] = SIM_WARP_SHUFFLE_XOR,
    };
    unsigned lane;
    sim_warp *warp = sim_running_warp(&lane);
    warp->value[lane] = value;
    warp->operand[lane] = lane_operand;
    sim_warp_arrive(ops[mode & 3], mask);
    return warp->result[lane];
}

unsigned int smelt_sim_vote(enum smelt_sim_vote_mode mode, unsigned int mask, int predicate) {
    sim_warp_op op = mode == SMELT_SIM_VOTE_BALLOT ? SIM_WARP_VOTE_BALLOT
                     : mode == SMELT_SIM_VOTE_ANY  ? SIM_WARP_VOTE_ANY
                                                   : SIM_WARP_VOTE_ALL;
    unsigned lane;
    sim_warp *warp = sim_running_warp(&lane);
    warp->value[lane] = predicate != 0;
    warp->operand[lane] = mask;
    sim_warp_arrive(op, mask);
    return warp->result[lane];
}

void smelt_sim_mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    sim_warp_matrix_request request = {.mma_d = d, .mma_a = a, .mma_b = b, .mma_c = c};
    unsigned lane;
    sim_running_warp(&lane)->matrix[lane] = &request;
    sim_warp_arrive(SIM_WARP_MMA_M16N8K16_BF16, 0xffffffffu);
}

void smelt_sim_mma_m16n8k16_f16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    sim_warp_matrix_request request = {.mma_d = d, .mma_a = a, .mma_b = b, .mma_c = c};
    unsigned lane;
    sim_running_warp(&lane)->matrix[lane] = &request;
    sim_warp_arrive(SIM_WARP_MMA_M16N8K16_F16, 0xffffffffu);
}

void smelt_sim_ldmatrix_x4(uint32_t r[4], const void *shared_row_address) {
    sim_warp_matrix_request request = {.ldmatrix_rows = r, .ldmatrix_row_address = shared_row_address};
    unsigned lane;
    sim_running_warp(&lane)->matrix[lane] = &request;
    sim_warp_arrive(SIM_WARP_LDMATRIX_X4, 0xffffffffu);
}
