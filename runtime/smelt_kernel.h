/* smelt_kernel.h - the one header every generated kernel includes.
 *
 * A smelt kernel is written once, in a C-compatible subset of CUDA (no
 * templates, references, overloading or classes), and this header gives that
 * text two meanings (docs/design.md §4):
 *
 *   - under NVRTC (__CUDACC_RTC__) it maps to CUDA itself: SMELT_KERNEL is
 *     `extern "C" __global__`, the intrinsics are CUDA's own, tensor cores
 *     are inline PTX (mma.sync, ldmatrix, cp.async);
 *   - under the host C compiler (gcc/clang, C11) it defines SMELT_HOST and
 *     maps to the host simulator (runtime/sim/host_sim.h): every block runs on a
 *     worker thread, every CUDA thread of the block is a fiber, barriers
 *     switch fibers, `__shared__` is `static _Thread_local`, warp shuffles,
 *     votes and tensor-core operations exchange through a per-warp barrier.
 *
 * So a wrong index, a missing barrier or a bad fragment layout shows up on a
 * machine without a GPU. A kernel looks like this:
 *
 *   #include "smelt_kernel.h"
 *   // rms_norm: %9 = rms_norm(%3, %4) {eps = 1e-05} : f32[tokens, 64]
 *   SMELT_KERNEL void rms_norm_64(const float *x, const float *w, float *y, int tokens) {
 *       __shared__ float partial[SMELT_WARPS_MAX];
 *       int row = blockIdx.x, t = threadIdx.x;            // blockDim.x == 64
 *       float v = x[row * 64 + t], sum = v * v;
 *       for (int offset = 16; offset > 0; offset /= 2)
 *           sum += smelt_shfl_xor_f32(0xffffffffu, sum, offset);
 *       if (t % 32 == 0) partial[t / 32] = sum;
 *       __syncthreads();
 *       float total = partial[0] + partial[1];
 *       y[row * 64 + t] = v * rsqrtf(total / 64 + 1e-05f) * w[t];
 *   }
 *   #ifdef SMELT_HOST
 *   SMELT_HOST_ENTRY(rms_norm_64) {
 *       rms_norm_64(SMELT_ARG(const float *, 0), SMELT_ARG(const float *, 1),
 *                   SMELT_ARG(float *, 2), SMELT_ARG(int, 3));
 *   }
 *   #endif
 *
 * The host entry `void NAME__host_entry(void **args)` is what the simulator
 * calls on every fiber; `args` is the cuLaunchKernel parameter array (one
 * pointer to each argument's value), so both devices take the same array.
 *
 * What kernels may use, in both halves:
 *   indices      threadIdx, blockIdx, blockDim, gridDim (.x .y .z), warpSize,
 *                smelt_lane_id()
 *   qualifiers   SMELT_KERNEL, SMELT_DEVICE (helper functions), __shared__,
 *                __restrict__, __align__(n), SMELT_LAUNCH_BOUNDS(threads)
 *   shared       SMELT_DYNAMIC_SHARED(type, name) declares `type *name` at the
 *                dynamic shared memory (in place of `extern __shared__`)
 *   barriers     __syncthreads(), __syncwarp(mask), __threadfence()
 *   shuffles     smelt_shfl_{idx,up,down,xor}_{f32,i32,u32}(mask, value, lane)
 *                (C has no overloading: kernels use these typed names; on the
 *                host the CUDA names __shfl_xor_sync etc. also work, through
 *                _Generic, for float, int and unsigned values)
 *   votes        __ballot_sync, __any_sync, __all_sync
 *   atomics      smelt_atomic_add_{f32,i32,u32}, smelt_atomic_max_{f32,i32},
 *                smelt_atomic_cas_u32 (each returns the old value)
 *   math         expf logf sqrtf rsqrtf tanhf erff fmaxf fminf fabsf powf
 *                sinf cosf, __expf __logf __fdividef, __float_as_uint & co
 *   bf16         smelt_bf16 (16-bit storage), smelt_bf16_to_f32,
 *                smelt_f32_to_bf16 (round to nearest even), smelt_bf16x2_pack
 *   f16          smelt_f16 (16-bit storage), smelt_f16_to_f32,
 *                smelt_f32_to_f16 (round to nearest even), smelt_f16x2_pack
 *   vectors      uint4 (a 16-byte load: ld.global.v4), smelt_unpack_bf16x8,
 *                smelt_unpack_f16x8, smelt_unpack_f32x4 (its elements as floats)
 *   128-bit      smelt_u32x4 smelt_load_global_128(p): 16 bytes from a 16-byte
 *                aligned read-only global address in one load (ld.global.nc.v4)
 *   tensor core  smelt_mma_m16n8k16_bf16_f32, smelt_mma_m16n8k16_f16_f32, smelt_ldmatrix_x4,
 *                smelt_cp_async_16 / smelt_cp_async_commit / smelt_cp_async_wait_all /
 *                smelt_cp_async_wait_group(constant)
 *
 * Host-simulator rules a kernel must keep (they are CUDA's rules too; the
 * simulator turns breaking them into a launch error rather than a hang):
 *   - __syncthreads() is reached by every thread of the block, or by none;
 *     a thread that has returned never reaches it again.
 *   - A warp operation (shuffle, vote, __syncwarp, mma, ldmatrix) is executed
 *     by every live lane of the warp together (the simulator does not split a
 *     warp by `mask`; the caller's own lane must be in `mask`). A source lane
 *     that does not exist (a partial warp) or has returned yields the
 *     caller's own value. mma and ldmatrix need all 32 lanes.
 *   - A fiber has a 64 KiB stack (256 KiB under AddressSanitizer) with a
 *     guard page below it: a kernel that overflows it dies with SIGSEGV.
 */
#ifndef SMELT_KERNEL_H
#define SMELT_KERNEL_H

#define SMELT_WARP_SIZE 32
#define SMELT_WARPS_MAX 32 /* 1024 threads per block / 32 */

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
/* ======================================================================
 * Device half: CUDA. NVRTC has no standard headers, so the few integer
 * types kernels use are defined here.
 * ====================================================================== */
#define SMELT_DEVICE_CUDA 1

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef short int16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#else
#include <stdint.h> /* nvcc has the host's headers */
#endif

#define SMELT_KERNEL extern "C" __global__
#define SMELT_DEVICE static __device__ __forceinline__
#define SMELT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#define SMELT_DYNAMIC_SHARED(type, name)                                                                     \
    extern __shared__ __align__(16) unsigned char smelt_dynamic_shared_storage[];                            \
    type *name = (type *)smelt_dynamic_shared_storage

SMELT_DEVICE unsigned int smelt_lane_id(void) {
    unsigned int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

/* Typed shuffles: the CUDA overloads under C-compatible names. */
SMELT_DEVICE float smelt_shfl_idx_f32(unsigned int mask, float v, int src_lane) {
    return __shfl_sync(mask, v, src_lane);
}
SMELT_DEVICE int smelt_shfl_idx_i32(unsigned int mask, int v, int src_lane) {
    return __shfl_sync(mask, v, src_lane);
}
SMELT_DEVICE unsigned int smelt_shfl_idx_u32(unsigned int mask, unsigned int v, int src_lane) {
    return __shfl_sync(mask, v, src_lane);
}
SMELT_DEVICE float smelt_shfl_up_f32(unsigned int mask, float v, unsigned int delta) {
    return __shfl_up_sync(mask, v, delta);
}
SMELT_DEVICE int smelt_shfl_up_i32(unsigned int mask, int v, unsigned int delta) {
    return __shfl_up_sync(mask, v, delta);
}
SMELT_DEVICE unsigned int smelt_shfl_up_u32(unsigned int mask, unsigned int v, unsigned int delta) {
    return __shfl_up_sync(mask, v, delta);
}
SMELT_DEVICE float smelt_shfl_down_f32(unsigned int mask, float v, unsigned int delta) {
    return __shfl_down_sync(mask, v, delta);
}
SMELT_DEVICE int smelt_shfl_down_i32(unsigned int mask, int v, unsigned int delta) {
    return __shfl_down_sync(mask, v, delta);
}
SMELT_DEVICE unsigned int smelt_shfl_down_u32(unsigned int mask, unsigned int v, unsigned int delta) {
    return __shfl_down_sync(mask, v, delta);
}
SMELT_DEVICE float smelt_shfl_xor_f32(unsigned int mask, float v, int lane_mask) {
    return __shfl_xor_sync(mask, v, lane_mask);
}
SMELT_DEVICE int smelt_shfl_xor_i32(unsigned int mask, int v, int lane_mask) {
    return __shfl_xor_sync(mask, v, lane_mask);
}
SMELT_DEVICE unsigned int smelt_shfl_xor_u32(unsigned int mask, unsigned int v, int lane_mask) {
    return __shfl_xor_sync(mask, v, lane_mask);
}

/* Typed atomics; each returns the value before the update. */
SMELT_DEVICE float smelt_atomic_add_f32(float *p, float v) { return atomicAdd(p, v); }
SMELT_DEVICE int smelt_atomic_add_i32(int *p, int v) { return atomicAdd(p, v); }
SMELT_DEVICE unsigned int smelt_atomic_add_u32(unsigned int *p, unsigned int v) { return atomicAdd(p, v); }
SMELT_DEVICE int smelt_atomic_max_i32(int *p, int v) { return atomicMax(p, v); }
SMELT_DEVICE unsigned int smelt_atomic_cas_u32(unsigned int *p, unsigned int expected, unsigned int desired) {
    return atomicCAS(p, expected, desired);
}
/* Float max by compare-and-swap on the bits: only a larger value replaces
 * the stored one (a stored NaN stays). */
SMELT_DEVICE float smelt_atomic_max_f32(float *p, float v) {
    unsigned int *bits = (unsigned int *)p;
    unsigned int old = *bits;
    while (v > __uint_as_float(old)) {
        unsigned int seen = atomicCAS(bits, old, __float_as_uint(v));
        if (seen == old) break;
        old = seen;
    }
    return __uint_as_float(old);
}

/* 16 bytes in one vector load through the read-only path (ld.global.nc.v4.u32). */
typedef struct smelt_u32x4 {
    uint32_t x, y, z, w;
} smelt_u32x4;
SMELT_DEVICE smelt_u32x4 smelt_load_global_128(const void *p) {
    uint4 v = __ldg((const uint4 *)p);
    smelt_u32x4 r = {v.x, v.y, v.z, v.w};
    return r;
}

/* Tensor cores: D = A * B + C on one warp, m16n8k16, bf16 inputs, f32
 * accumulation. a: 4 registers of 2 bf16 (A 16x16 row-major fragment),
 * b: 2 registers of 2 bf16 (B 16x8 column fragment), c/d: 4 floats. */
SMELT_DEVICE void smelt_mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2],
                                              const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

/* The same with f16 inputs (the fragments' layout is bf16's). */
SMELT_DEVICE void smelt_mma_m16n8k16_f16_f32(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

/* Four 8x8 b16 matrices from shared memory: lane i gives the address of row
 * i % 8 of matrix i / 8; r[m] receives row lane/4, columns 2*(lane%4) and
 * 2*(lane%4)+1 of matrix m (lower column in the low half). */
SMELT_DEVICE void smelt_ldmatrix_x4(uint32_t r[4], const void *shared_row_address) {
    unsigned int address = (unsigned int)__cvta_generic_to_shared(shared_row_address);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

/* Asynchronous 16-byte copy global -> shared (sm_80+). */
SMELT_DEVICE void smelt_cp_async_16(void *shared_destination, const void *global_source) {
    unsigned int address = (unsigned int)__cvta_generic_to_shared(shared_destination);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global_source));
}
SMELT_DEVICE void smelt_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
SMELT_DEVICE void smelt_cp_async_wait_all(void) { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
/* Waits until at most `pending` (a constant) of this thread's committed
 * groups are still in flight: with one group per pipeline stage, the
 * stage being computed is complete while the next one loads. */
#define smelt_cp_async_wait_group(pending) asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory")

#else
/* ======================================================================
 * Host half: the simulator. Everything a kernel touches goes through
 * smelt_sim_current, the fiber now running on this worker thread.
 * ====================================================================== */
#define SMELT_HOST 1

#include <math.h>
#include <stdint.h>
#include <string.h>

/* CUDA's 16-byte vector: a uint4 load is one 128-bit access (ld.global.v4). */
typedef struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
} uint4;

typedef struct smelt_sim_dim3 {
    unsigned int x, y, z;
} smelt_sim_dim3;

/* What a kernel reads about the thread it runs as. The simulator keeps one
 * per fiber (runtime/sim/host_sim.c) and points smelt_sim_current at it. */
typedef struct smelt_sim_thread_view {
    smelt_sim_dim3 thread_index;
    smelt_sim_dim3 block_index;
    smelt_sim_dim3 block_dim;
    smelt_sim_dim3 grid_dim;
    unsigned int lane;             /* linear thread index % 32 */
    unsigned char *dynamic_shared; /* this worker's buffer, 16-byte aligned */
} smelt_sim_thread_view;

/* Defined by the simulator in the executable (static TLS), so the kernels'
 * shared object, dlopen()ed, reads it at a fixed offset from the thread
 * pointer instead of calling __tls_get_addr at every threadIdx. */
extern _Thread_local const smelt_sim_thread_view *smelt_sim_current
    __attribute__((tls_model("initial-exec")));

/* Entry points of the simulator (runtime/sim/host_sim.c). A host kernel object
 * resolves them from the process that loads it. */
void smelt_sim_syncthreads(void);
void smelt_sim_syncwarp(unsigned int mask);
enum smelt_sim_shuffle_mode {
    SMELT_SIM_SHFL_IDX,
    SMELT_SIM_SHFL_UP,
    SMELT_SIM_SHFL_DOWN,
    SMELT_SIM_SHFL_XOR
};
uint32_t smelt_sim_shuffle(enum smelt_sim_shuffle_mode mode, unsigned int mask, uint32_t value,
                           unsigned int lane_operand);
enum smelt_sim_vote_mode { SMELT_SIM_VOTE_BALLOT, SMELT_SIM_VOTE_ANY, SMELT_SIM_VOTE_ALL };
unsigned int smelt_sim_vote(enum smelt_sim_vote_mode mode, unsigned int mask, int predicate);
void smelt_sim_mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
void smelt_sim_mma_m16n8k16_f16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
void smelt_sim_ldmatrix_x4(uint32_t r[4], const void *shared_row_address);

#ifndef SMELT_SIM_ABI_ONLY /* host_sim.c wants the types above, not the CUDA names below */

/* A compiler barrier around every switch point: shared variables are
 * `static` and may never have their address taken, so without it a compiler
 * could keep one in a register across a barrier. */
#define SMELT_SIM_COMPILER_FENCE() __asm__ __volatile__("" ::: "memory")

#define SMELT_KERNEL
#define SMELT_DEVICE static inline
#define SMELT_LAUNCH_BOUNDS(threads)
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static _Thread_local
#define SMELT_DYNAMIC_SHARED(type, name) type *name = (type *)smelt_sim_current->dynamic_shared

#define threadIdx (smelt_sim_current->thread_index)
#define blockIdx (smelt_sim_current->block_index)
#define blockDim (smelt_sim_current->block_dim)
#define gridDim (smelt_sim_current->grid_dim)
#define warpSize SMELT_WARP_SIZE

/* The host entry: `SMELT_HOST_ENTRY(k) { k(SMELT_ARG(float *, 0), ...); }`. */
#define SMELT_HOST_ENTRY(kernel) void kernel##__host_entry(void **smelt_args)
#define SMELT_ARG(type, index) (*(type *)smelt_args[(index)])

static inline unsigned int smelt_lane_id(void) { return smelt_sim_current->lane; }

static inline void smelt_sim_syncthreads_fenced(void) {
    SMELT_SIM_COMPILER_FENCE();
    smelt_sim_syncthreads();
    SMELT_SIM_COMPILER_FENCE();
}
static inline void smelt_sim_syncwarp_fenced(unsigned int mask) {
    SMELT_SIM_COMPILER_FENCE();
    smelt_sim_syncwarp(mask);
    SMELT_SIM_COMPILER_FENCE();
}
#define __syncthreads() smelt_sim_syncthreads_fenced()
#define __syncwarp(mask) smelt_sim_syncwarp_fenced(mask)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() SMELT_SIM_COMPILER_FENCE()

/* Bit casts. */
static inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

/* Typed shuffles. Like every warp operation they switch fibers, so they
 * are fenced as __syncthreads is. */
static inline uint32_t smelt_sim_shuffle_fenced(enum smelt_sim_shuffle_mode mode, unsigned int mask,
                                                uint32_t value, unsigned int lane_operand) {
    SMELT_SIM_COMPILER_FENCE();
    uint32_t result = smelt_sim_shuffle(mode, mask, value, lane_operand);
    SMELT_SIM_COMPILER_FENCE();
    return result;
}
#define SMELT_SIM_SHUFFLE(mode, mask, bits, lane)                                                            \
    smelt_sim_shuffle_fenced((mode), (mask), (bits), (unsigned int)(lane))
static inline float smelt_shfl_idx_f32(unsigned int mask, float v, int src_lane) {
    return __uint_as_float(SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_IDX, mask, __float_as_uint(v), src_lane));
}
static inline int smelt_shfl_idx_i32(unsigned int mask, int v, int src_lane) {
    return (int)SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_IDX, mask, (uint32_t)v, src_lane);
}
static inline unsigned int smelt_shfl_idx_u32(unsigned int mask, unsigned int v, int src_lane) {
    return SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_IDX, mask, v, src_lane);
}
static inline float smelt_shfl_up_f32(unsigned int mask, float v, unsigned int delta) {
    return __uint_as_float(SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_UP, mask, __float_as_uint(v), delta));
}
static inline int smelt_shfl_up_i32(unsigned int mask, int v, unsigned int delta) {
    return (int)SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_UP, mask, (uint32_t)v, delta);
}
static inline unsigned int smelt_shfl_up_u32(unsigned int mask, unsigned int v, unsigned int delta) {
    return SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_UP, mask, v, delta);
}
static inline float smelt_shfl_down_f32(unsigned int mask, float v, unsigned int delta) {
    return __uint_as_float(SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_DOWN, mask, __float_as_uint(v), delta));
}
static inline int smelt_shfl_down_i32(unsigned int mask, int v, unsigned int delta) {
    return (int)SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_DOWN, mask, (uint32_t)v, delta);
}
static inline unsigned int smelt_shfl_down_u32(unsigned int mask, unsigned int v, unsigned int delta) {
    return SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_DOWN, mask, v, delta);
}
static inline float smelt_shfl_xor_f32(unsigned int mask, float v, int lane_mask) {
    return __uint_as_float(SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_XOR, mask, __float_as_uint(v), lane_mask));
}
static inline int smelt_shfl_xor_i32(unsigned int mask, int v, int lane_mask) {
    return (int)SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_XOR, mask, (uint32_t)v, lane_mask);
}
static inline unsigned int smelt_shfl_xor_u32(unsigned int mask, unsigned int v, int lane_mask) {
    return SMELT_SIM_SHUFFLE(SMELT_SIM_SHFL_XOR, mask, v, lane_mask);
}

/* The CUDA names, for hand-written kernels (CUDA overloads by type). */
#define SMELT_SIM_BY_TYPE(value, f32, i32, u32) _Generic((value), float : f32, int : i32, unsigned int : u32)
#define __shfl_sync(mask, v, lane)                                                                           \
    SMELT_SIM_BY_TYPE(v, smelt_shfl_idx_f32, smelt_shfl_idx_i32, smelt_shfl_idx_u32)(mask, v, lane)
#define __shfl_up_sync(mask, v, delta)                                                                       \
    SMELT_SIM_BY_TYPE(v, smelt_shfl_up_f32, smelt_shfl_up_i32, smelt_shfl_up_u32)(mask, v, delta)
#define __shfl_down_sync(mask, v, delta)                                                                     \
    SMELT_SIM_BY_TYPE(v, smelt_shfl_down_f32, smelt_shfl_down_i32, smelt_shfl_down_u32)(mask, v, delta)
#define __shfl_xor_sync(mask, v, lane_mask)                                                                  \
    SMELT_SIM_BY_TYPE(v, smelt_shfl_xor_f32, smelt_shfl_xor_i32, smelt_shfl_xor_u32)(mask, v, lane_mask)

/* Votes. */
static inline unsigned int smelt_sim_vote_fenced(enum smelt_sim_vote_mode mode, unsigned int mask,
                                                 int predicate) {
    SMELT_SIM_COMPILER_FENCE();
    unsigned int result = smelt_sim_vote(mode, mask, predicate);
    SMELT_SIM_COMPILER_FENCE();
    return result;
}
#define __ballot_sync(mask, predicate) smelt_sim_vote_fenced(SMELT_SIM_VOTE_BALLOT, (mask), (predicate))
#define __any_sync(mask, predicate) ((int)smelt_sim_vote_fenced(SMELT_SIM_VOTE_ANY, (mask), (predicate)))
#define __all_sync(mask, predicate) ((int)smelt_sim_vote_fenced(SMELT_SIM_VOTE_ALL, (mask), (predicate)))

/* Atomics: C11 memory model through the compiler's __atomic builtins (the
 * C11 atomic_* functions need _Atomic objects; kernel pointers are plain).
 * Relaxed, like CUDA's atomicAdd. */
static inline float smelt_atomic_add_f32(float *p, float v) {
    unsigned int *bits = (unsigned int *)p;
    unsigned int old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(bits, &old, __float_as_uint(__uint_as_float(old) + v), 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return __uint_as_float(old);
}
static inline int smelt_atomic_add_i32(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned int smelt_atomic_add_u32(unsigned int *p, unsigned int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int smelt_atomic_max_i32(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline unsigned int smelt_atomic_cas_u32(unsigned int *p, unsigned int expected,
                                                unsigned int desired) {
    __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected; /* the old value, whether or not it was replaced */
}
static inline float smelt_atomic_max_f32(float *p, float v) {
    unsigned int *bits = (unsigned int *)p;
    unsigned int old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (v > __uint_as_float(old) && !__atomic_compare_exchange_n(bits, &old, __float_as_uint(v), 1,
                                                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return __uint_as_float(old);
}
#define atomicAdd(p, v)                                                                                      \
    _Generic((p), float *: smelt_atomic_add_f32, int *: smelt_atomic_add_i32, unsigned int *: smelt_atomic_add_u32)(p, v)

/* Math: what CUDA has and C's <math.h> lacks. The fast intrinsics are the
 * exact functions here (the GPU's are within a few ulp of them). */
static inline float smelt_rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define rsqrtf(x) smelt_rsqrtf(x) /* a macro: C23's <math.h> may declare its own */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __powf(x, y) powf((x), (y))
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __fdividef(x, y) ((x) / (y))

/* Tensor cores and async copies: emulated by the simulator lane by lane. */
static inline void smelt_mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2],
                                               const float c[4]) {
    SMELT_SIM_COMPILER_FENCE();
    smelt_sim_mma_m16n8k16_bf16_f32(d, a, b, c);
    SMELT_SIM_COMPILER_FENCE();
}
static inline void smelt_mma_m16n8k16_f16_f32(float d[4], const uint32_t a[4], const uint32_t b[2],
                                              const float c[4]) {
    SMELT_SIM_COMPILER_FENCE();
    smelt_sim_mma_m16n8k16_f16_f32(d, a, b, c);
    SMELT_SIM_COMPILER_FENCE();
}
static inline void smelt_ldmatrix_x4(uint32_t r[4], const void *shared_row_address) {
    SMELT_SIM_COMPILER_FENCE();
    smelt_sim_ldmatrix_x4(r, shared_row_address);
    SMELT_SIM_COMPILER_FENCE();
}
typedef struct smelt_u32x4 {
    uint32_t x, y, z, w;
} smelt_u32x4;
static inline smelt_u32x4 smelt_load_global_128(const void *p) {
    smelt_u32x4 r;
    memcpy(&r, p, sizeof r);
    return r;
}
/* cp.async completes at once on the host; the copy is done when the call
 * returns, which is what waiting for it guarantees on the GPU. */
static inline void smelt_cp_async_16(void *shared_destination, const void *global_source) {
    memcpy(shared_destination, global_source, 16);
}
static inline void smelt_cp_async_commit(void) {}
static inline void smelt_cp_async_wait_all(void) {}
#define smelt_cp_async_wait_group(pending) ((void)(pending))

#endif /* SMELT_SIM_ABI_ONLY */
#endif /* host half */

/* ======================================================================
 * Both halves: plain C that means the same on either machine.
 * ====================================================================== */
#if !defined(SMELT_SIM_ABI_ONLY)

/* bf16 as 16-bit storage; arithmetic is always done in float. The
 * conversions are bit operations so that both halves give identical bits.
 *
 * They are the one copy of bf16 rounding outside plan/numeric.h, and the
 * same algorithm as its plan_bf16_to_f32 / plan_f32_to_bf16, because this
 * header must stand alone: codegen embeds its text and hands it, by itself,
 * to NVRTC (which has no standard headers and no include path) and to the
 * host compiler on the user's machine (where smelt's sources are not), so it
 * cannot include plan/numeric.h. tests/unit/test_host_sim.c checks that both
 * give the same bits. */
typedef unsigned short smelt_bf16;

SMELT_DEVICE float smelt_bf16_to_f32(smelt_bf16 h) { return __uint_as_float((unsigned int)h << 16); }

/* Round to nearest, ties to even; NaN stays a (quiet) NaN of the same sign. */
SMELT_DEVICE smelt_bf16 smelt_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (smelt_bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (smelt_bf16)(u >> 16);
}

/* Two bf16 in one 32-bit register, `low` in bits 0..15 (the element with the
 * smaller index in mma fragments). */
SMELT_DEVICE uint32_t smelt_bf16x2_pack(smelt_bf16 low, smelt_bf16 high) {
    return (uint32_t)low | ((uint32_t)high << 16);
}

/* f16 (IEEE binary16: 5 exponent bits, bias 15, 10 mantissa bits, largest
 * finite 65504) as 16-bit storage: f16 activations (--act f16) and a
 * quantized weight's group scales. Bit operations on both halves, the same
 * bits as plan/numeric.h's plan_f16_to_f32 / plan_f32_to_f16 (repeated
 * here for the reason given for bf16; tests/unit/test_host_sim.c checks
 * them against each other and against numpy's float16). Widening is exact;
 * narrowing rounds to nearest even, with subnormals (no flush to zero),
 * overflows to infinity above 65504 (from 65520 up) and keeps NaN a quiet
 * NaN of its sign. (E4M3 codes, of fp8 weights and KV caches:
 * smelt_f8e4m3_to_f32 below.) */
typedef unsigned short smelt_f16;

SMELT_DEVICE float smelt_f16_to_f32(uint16_t h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, exponent = (h >> 10) & 31u, mantissa = h & 1023u;
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24 */
        float v = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exponent == 31) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

SMELT_DEVICE smelt_f16 smelt_f32_to_f16(float f) {
    unsigned int bits = __float_as_uint(f);
    unsigned int sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (smelt_f16)(sign | 0x7e00u);  /* NaN: a quiet one */
    if (magnitude >= 0x477ff000u) return (smelt_f16)(sign | 0x7c00u); /* 65520 and up: infinity */
    if (magnitude >= 0x38800000u) { /* a normal (2^-14 and up): rebias 127 -> 15, keep 10 of 23 bits */
        unsigned int rebiased = magnitude - (112u << 23);
        return (smelt_f16)(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
    }
    if (magnitude <= 0x33000000u) return (smelt_f16)sign; /* 2^-25 and below: zero (2^-25 ties to even) */
    /* a subnormal: value * 2^24 as an integer, rounded to nearest even (2^-14 - tiny rounds up to the
     * smallest normal, whose bits follow the largest subnormal's) */
    unsigned int mantissa = (magnitude & 0x7fffffu) | 0x800000u, shift = 126u - (magnitude >> 23);
    unsigned int kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return (smelt_f16)(sign | (kept + (rest > half || (rest == half && (kept & 1u)))));
}

/* Two f16 in one 32-bit register, `low` in bits 0..15, as smelt_bf16x2_pack. */
SMELT_DEVICE uint32_t smelt_f16x2_pack(smelt_f16 low, smelt_f16 high) {
    return (uint32_t)low | ((uint32_t)high << 16);
}

/* A 16-byte chunk (one uint4 load) as floats, in memory order: eight bf16
 * (the lower half of each word first) or four f32. */
SMELT_DEVICE void smelt_unpack_bf16x8(uint4 chunk, float out[8]) {
    unsigned int words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    for (int i = 0; i < 4; i++) {
        out[2 * i] = smelt_bf16_to_f32((smelt_bf16)(words[i] & 0xffffu));
        out[2 * i + 1] = smelt_bf16_to_f32((smelt_bf16)(words[i] >> 16));
    }
}
/* Eight f16, the lower half of each word first. */
SMELT_DEVICE void smelt_unpack_f16x8(uint4 chunk, float out[8]) {
    unsigned int words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    for (int i = 0; i < 4; i++) {
        out[2 * i] = smelt_f16_to_f32((smelt_f16)(words[i] & 0xffffu));
        out[2 * i + 1] = smelt_f16_to_f32((smelt_f16)(words[i] >> 16));
    }
}
SMELT_DEVICE void smelt_unpack_f32x4(uint4 chunk, float out[4]) {
    out[0] = __uint_as_float(chunk.x);
    out[1] = __uint_as_float(chunk.y);
    out[2] = __uint_as_float(chunk.z);
    out[3] = __uint_as_float(chunk.w);
}

/* f8e4m3 (OCP "fn": 4 exponent bits, bias 7, 3 mantissa bits, no infinity,
 * 0x7f / 0xff NaN, largest finite 448) as 8-bit storage, with the same bits
 * as plan/numeric.h's plan_f8e4m3_to_f32 / plan_f32_to_f8e4m3 (round to
 * nearest even, saturating to +-448: CUDA's satfinite) and its row scale
 * plan_f8e4m3_row_scale — repeated here for the reason given for bf16;
 * tests/unit/test_host_sim.c checks every code and a sweep of floats. Bit
 * operations on every arch (sm_80 has no fp8 conversion instruction). An
 * f8e4m3 KV cache stores each row of a kv head as codes of x / scale with
 * the row's scale beside it. */
typedef unsigned char smelt_f8e4m3;

SMELT_DEVICE float smelt_f8e4m3_to_f32(smelt_f8e4m3 b) {
    unsigned int sign = (unsigned int)(b & 0x80u) << 24, magnitude = b & 0x7fu;
    float value;
    if (magnitude == 0x7fu)
        value = __uint_as_float(0x7fc00000u); /* NaN */
    else if (magnitude >= 0x08u)              /* normal: rebias the exponent, 7 -> 127 */
        value = __uint_as_float((magnitude << 20) + (120u << 23));
    else /* subnormal: mantissa * 2^-9 */
        value = (float)magnitude * 0.001953125f;
    return __uint_as_float(__float_as_uint(value) | sign);
}

SMELT_DEVICE smelt_f8e4m3 smelt_f32_to_f8e4m3(float f) {
    unsigned int bits = __float_as_uint(f);
    unsigned int sign = (bits >> 24) & 0x80u, magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (smelt_f8e4m3)(sign | 0x7fu); /* NaN */
    int exponent = (int)(magnitude >> 23) - 127 + 7;                  /* biased as in e4m3 */
    unsigned int mantissa = (magnitude & 0x7fffffu) | 0x800000u, shift, result;
    if (exponent >= 1) { /* a normal: keep 3 of 23 mantissa bits */
        if (exponent > 16) return (smelt_f8e4m3)(sign | 0x7eu);
        shift = 20u;
        result = ((unsigned int)(exponent - 1) << 3);
    } else { /* a subnormal (or zero): value * 2^9 as an integer */
        shift = (unsigned int)(21 - exponent);
        if ((magnitude >> 23) == 0 || shift > 25u) return (smelt_f8e4m3)sign;
        result = 0u;
    }
    unsigned int kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    result += kept + (rest > half || (rest == half && (kept & 1u)));
    return (smelt_f8e4m3)(sign | (result > 0x7eu ? 0x7eu : result));
}

SMELT_DEVICE float smelt_f8e4m3_row_scale(float absmax) { return absmax > 0.0f ? absmax / 448.0f : 1.0f; }

/* A 16-byte chunk (one uint4 load) of sixteen f8e4m3 codes as floats, in
 * memory order (the low byte of each word first). */
SMELT_DEVICE void smelt_unpack_f8e4m3x16(uint4 chunk, float out[16]) {
    unsigned int words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) {
            out[4 * i + j] = smelt_f8e4m3_to_f32((smelt_f8e4m3)((words[i] >> (8 * j)) & 0xffu));
        }
    }
}

SMELT_DEVICE int smelt_min_i32(int a, int b) { return a < b ? a : b; }
SMELT_DEVICE int smelt_max_i32(int a, int b) { return a > b ? a : b; }

#endif /* !SMELT_SIM_ABI_ONLY */

#endif /* SMELT_KERNEL_H */
