/* host_sim_block.h - the simulator's inside: one running block, its threads
 * (fibers) and warps. Shared by host_sim.c (workers, block barrier,
 * scheduling) and host_sim_warp.c (warp barrier, shuffles, votes, mma);
 * nothing outside the simulator includes it.
 *
 * Scheduling inside a block is cooperative: a thread runs until it returns
 * or waits at a barrier, then switches straight to the next thread that may
 * run (one switch per arrival, no trip through a scheduler). The last thread
 * to arrive at a barrier releases the others and runs on. Released by the
 * block barrier, threads go to the back of the run queue, so threads take
 * turns. Released by a warp barrier, the lanes run next, in lane order,
 * before anything in the queue (they are kept as a mask, `resumed_lanes`,
 * not queued one by one): so a warp runs on through its shuffles (a
 * reduction is five of them) while its 32 stacks are still in the L1 cache,
 * and the next warp starts when this one waits at __syncthreads or returns.
 * CUDA promises no order among warps, so either is a valid execution; what
 * the simulator checks (every barrier reached by all the threads it waits
 * for) does not depend on it. Nothing left to run while some threads have
 * not returned is a deadlock.
 */
#ifndef SMELT_HOST_SIM_BLOCK_H
#define SMELT_HOST_SIM_BLOCK_H

#define SMELT_SIM_ABI_ONLY 1 /* the simulator's types, without the CUDA names */
#include "smelt_kernel.h"

#include "fiber.h"
#include "host_sim.h"

#include <stdint.h>

enum { SIM_MESSAGE_SIZE = 512, SIM_WARP_LANES = 32 };

typedef enum sim_warp_op {
    SIM_WARP_SYNC,
    SIM_WARP_SHUFFLE_IDX,
    SIM_WARP_SHUFFLE_UP,
    SIM_WARP_SHUFFLE_DOWN,
    SIM_WARP_SHUFFLE_XOR,
    SIM_WARP_VOTE_BALLOT,
    SIM_WARP_VOTE_ANY,
    SIM_WARP_VOTE_ALL,
    SIM_WARP_MMA_M16N8K16_BF16,
    SIM_WARP_MMA_M16N8K16_F16,
    SIM_WARP_LDMATRIX_X4,
} sim_warp_op;

/* The operands of a lane's mma or ldmatrix; lives on the lane's stack while
 * it waits. The lane that completes the warp barrier writes every lane's
 * output arrays. */
typedef struct sim_warp_matrix_request {
    float *mma_d;            /* [4] */
    const uint32_t *mma_a;   /* [4] */
    const uint32_t *mma_b;   /* [2] */
    const float *mma_c;      /* [4] */
    uint32_t *ldmatrix_rows; /* [4] */
    const void *ldmatrix_row_address;
} sim_warp_matrix_request;

typedef struct sim_block sim_block;

/* Two cache lines: the view the kernel reads, then what a switch reads. */
typedef struct sim_thread {
    _Alignas(64) smelt_sim_thread_view view; /* first: smelt_sim_current points here */
    sim_fiber fiber;
    sim_block *block;
    unsigned index; /* linear index in the block: x + y*dim.x + z*dim.x*dim.y */
} sim_thread;

/* A warp's barrier and what its lanes exchange through it, side by side so
 * the lane that completes the barrier reads and writes them in one sweep. */
typedef struct sim_warp {
    uint32_t live_lanes;              /* lanes that exist and have not returned */
    uint32_t arrived_lanes;           /* lanes waiting at the warp barrier */
    sim_warp_op op;                   /* what the arrived lanes wait at */
    uint32_t value[SIM_WARP_LANES];   /* shuffle input, or vote predicate (0 or 1) */
    uint32_t operand[SIM_WARP_LANES]; /* shuffle: source lane, delta or xor mask; vote: the mask */
    /* Written when the barrier completes, read by each lane when it resumes
     * (before it can arrive again, so before the next completion). */
    uint32_t result[SIM_WARP_LANES];
    sim_warp_matrix_request *matrix[SIM_WARP_LANES]; /* mma, ldmatrix */
} sim_warp;

struct sim_block {
    const sim_kernel *kernel;
    void **args;
    sim_dim3 index;
    sim_thread *threads; /* [thread_count] */
    unsigned thread_count;
    sim_warp *warps; /* [warp_count] */
    unsigned warp_count;
    unsigned live_count; /* threads that have not returned */
    unsigned returned_count;
    unsigned at_block_barrier; /* threads waiting in __syncthreads() */
    unsigned *run_queue;       /* ring of thread indices, capacity thread_count */
    unsigned queue_head, queue_length;
    uint32_t resumed_lanes; /* lanes of one warp that run before the queue */
    unsigned resumed_base;  /* the index of that warp's lane 0 */
    sim_fiber scheduler;    /* the worker thread's own context */
    sim_status status;
    char message[SIM_MESSAGE_SIZE];
};

/* The thread whose fiber is running on this worker. */
static inline sim_thread *sim_thread_running(void) { return (sim_thread *)smelt_sim_current; }

/* To the back of the run queue (block barrier). */
static inline void sim_block_make_runnable(sim_block *block, unsigned thread_index) {
    unsigned slot = block->queue_head + block->queue_length++;
    if (slot >= block->thread_count) slot -= block->thread_count;
    block->run_queue[slot] = thread_index;
}

/* The lanes of warp `base / 32` in `lanes` run next, in lane order (warp
 * barrier). */
static inline void sim_block_resume_lanes(sim_block *block, unsigned base, uint32_t lanes) {
    if (block->resumed_lanes) {
        /* Lanes of a warp released before still wait for their turn (no
         * kernel gets here: they would have to arrive at a warp barrier
         * first). Queued at the front, they keep it. */
        uint32_t earlier = block->resumed_lanes;
        while (earlier) {
            unsigned lane = 31u - (unsigned)__builtin_clz(earlier);
            earlier &= ~(1u << lane);
            if (block->queue_head == 0) block->queue_head = block->thread_count;
            block->run_queue[--block->queue_head] = block->resumed_base + lane;
            block->queue_length++;
        }
    }
    block->resumed_lanes = lanes;
    block->resumed_base = base;
}

/* The thread to run next, taken off the queue; NULL when there is none. */
static inline sim_thread *sim_block_pop_runnable(sim_block *block) {
    if (block->resumed_lanes) {
        unsigned lane = (unsigned)__builtin_ctz(block->resumed_lanes);
        block->resumed_lanes &= block->resumed_lanes - 1;
        return &block->threads[block->resumed_base + lane];
    }
    if (block->queue_length == 0) return NULL;
    unsigned index = block->run_queue[block->queue_head];
    if (++block->queue_head == block->thread_count) block->queue_head = 0;
    block->queue_length--;
    return &block->threads[index];
}

/* No thread can run but some have not returned: says who waits at what and
 * ends the block with a deadlock error. */
_Noreturn void sim_block_deadlock(sim_block *block, sim_thread *self);

/* `self` waits at a barrier: runs the other threads until one of them
 * releases `self`, then returns. Ends the block with a deadlock error when
 * no thread can run. */
static inline void sim_block_wait(sim_block *block, sim_thread *self) {
    sim_thread *next = sim_block_pop_runnable(block);
    if (__builtin_expect(!next, 0)) sim_block_deadlock(block, self);
    smelt_sim_current = &next->view;
    sim_fiber_switch(&self->fiber, &next->fiber);
    /* Released and resumed: whoever switched here set smelt_sim_current. */
}

/* Records "kernel 'NAME' block (x, y, z): <message>" and abandons the block. */
_Noreturn void sim_block_fail(sim_block *block, sim_thread *self, sim_status status, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

/* host_sim_warp.c */
const char *sim_warp_op_name(sim_warp_op op);
/* A lane returned: it no longer holds its warp's barrier back. */
void sim_warp_lane_returned(sim_block *block, sim_thread *thread);

#endif
