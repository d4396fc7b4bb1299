/* host_sim_block.h - the simulator's inside: one running block, its threads
 * (fibers) and warps. Shared by host_sim.c (workers, block barrier,
 * scheduling) and host_sim_warp.c (warp barrier, shuffles, votes, mma);
 * nothing outside the simulator includes it.
 *
 * Scheduling inside a block is cooperative and round-robin: a run queue
 * holds the threads that may run; a thread runs until it returns or waits
 * at a barrier, then switches straight to the next thread in the queue (one
 * switch per arrival, no trip through a scheduler). The last thread to
 * arrive at a barrier releases the others into the queue and runs on. An
 * empty queue with live threads left is a deadlock.
 */
#ifndef SMELT_HOST_SIM_BLOCK_H
#define SMELT_HOST_SIM_BLOCK_H

#define SMELT_SIM_ABI_ONLY 1 /* the simulator's types, without the CUDA names */
#include "smelt_kernel.h"

#include "fiber.h"
#include "host_sim.h"

#include <stdint.h>

enum { SIM_MESSAGE_SIZE = 512, SIM_WARP_LANES = 32 };

typedef enum sim_thread_state {
    SIM_THREAD_RUNNABLE,         /* in the run queue, or running */
    SIM_THREAD_AT_BLOCK_BARRIER, /* in __syncthreads() */
    SIM_THREAD_AT_WARP_BARRIER,  /* in a warp operation */
    SIM_THREAD_RETURNED,
} sim_thread_state;

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
    SIM_WARP_LDMATRIX_X4,
} sim_warp_op;

/* What a lane asks of a warp operation; lives on the lane's stack while it
 * waits. The lane that completes the warp barrier computes every lane's
 * result into it (or straight into the lane's output arrays). */
typedef struct sim_warp_request {
    sim_warp_op op;
    unsigned mask;
    uint32_t value;        /* shuffle input, or vote predicate (0 or not) */
    unsigned lane_operand; /* source lane, delta, or xor mask */
    uint32_t result;
    float *mma_d;            /* [4] */
    const uint32_t *mma_a;   /* [4] */
    const uint32_t *mma_b;   /* [2] */
    const float *mma_c;      /* [4] */
    uint32_t *ldmatrix_rows; /* [4] */
    const void *ldmatrix_row_address;
} sim_warp_request;

typedef struct sim_block sim_block;

typedef struct sim_thread {
    smelt_sim_thread_view view; /* first: smelt_sim_current points here */
    sim_fiber fiber;
    sim_block *block;
    unsigned index; /* linear index in the block: x + y*dim.x + z*dim.x*dim.y */
    sim_thread_state state;
    sim_warp_request *request; /* valid while at the warp barrier */
} sim_thread;

typedef struct sim_warp {
    uint32_t live_lanes;    /* lanes that exist and have not returned */
    uint32_t arrived_lanes; /* lanes waiting at the warp barrier */
    sim_warp_op op;         /* what the arrived lanes wait at */
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
    sim_fiber scheduler; /* the worker thread's own context */
    sim_status status;
    char message[SIM_MESSAGE_SIZE];
};

/* The thread whose fiber is running on this worker. */
static inline sim_thread *sim_thread_running(void) { return (sim_thread *)smelt_sim_current; }

static inline void sim_block_make_runnable(sim_block *block, sim_thread *thread) {
    thread->state = SIM_THREAD_RUNNABLE;
    unsigned slot = block->queue_head + block->queue_length++;
    if (slot >= block->thread_count) slot -= block->thread_count;
    block->run_queue[slot] = thread->index;
}

/* `self` has marked itself waiting: runs the other threads until one of them
 * releases `self`, then returns. Ends the block with a deadlock error when
 * no thread can run. */
void sim_block_wait(sim_block *block, sim_thread *self);

/* Records "kernel 'NAME' block (x, y, z): <message>" and abandons the block. */
_Noreturn void sim_block_fail(sim_block *block, sim_thread *self, sim_status status, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

/* host_sim_warp.c */
const char *sim_warp_op_name(sim_warp_op op);
/* A lane returned: it no longer holds its warp's barrier back. */
void sim_warp_lane_returned(sim_block *block, sim_thread *thread);

#endif
