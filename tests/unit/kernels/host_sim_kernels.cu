/* host_sim_kernels.cu - kernels that exercise every primitive of
 * smelt_kernel.h. One text, two compilers: tests/unit/test_host_sim.c
 * #includes this file to run it on the host simulator, and hands the same
 * bytes to NVRTC for sm_80 and sm_90. */
#include "smelt_kernel.h"

#define SIM_TEST_FULL_MASK 0xffffffffu
#define SIM_TEST_INDEX_FIELDS 16 /* per thread in sim_test_indices */
#define SIM_TEST_WARP_FIELDS 12  /* per thread in sim_test_warp_ops */

/* Every index a thread can read, one record per thread of the grid. */
SMELT_KERNEL void sim_test_indices(unsigned int *out) {
    unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
    unsigned int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned int *record = out + (block * threads + thread) * SIM_TEST_INDEX_FIELDS;
    record[0] = threadIdx.x;
    record[1] = threadIdx.y;
    record[2] = threadIdx.z;
    record[3] = blockIdx.x;
    record[4] = blockIdx.y;
    record[5] = blockIdx.z;
    record[6] = blockDim.x;
    record[7] = blockDim.y;
    record[8] = blockDim.z;
    record[9] = gridDim.x;
    record[10] = gridDim.y;
    record[11] = gridDim.z;
    record[12] = smelt_lane_id();
    record[13] = warpSize;
    record[14] = 1; /* written */
}

/* Each thread reads what its right neighbour wrote. Correct only with the
 * barrier between the write and the read. */
SMELT_KERNEL void sim_test_neighbour(int *out, int with_barrier) {
    __shared__ int slots[1024];
    int t = threadIdx.x, n = blockDim.x;
    slots[t] = 0;
    __syncthreads();
    slots[t] = t + 1;
    if (with_barrier) __syncthreads();
    out[blockIdx.x * n + t] = slots[(t + 1) % n];
}

/* Tree reduction of 256 values per block in shared memory. */
SMELT_KERNEL void sim_test_reduce(const float *__restrict__ x, float *__restrict__ sums) {
    __shared__ float partial[256];
    int t = threadIdx.x;
    partial[t] = x[blockIdx.x * 256 + t];
    __syncthreads();
    for (int stride = 128; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

/* Static and dynamic shared memory belong to one block: over many rounds,
 * a block must only ever see its own values. */
SMELT_KERNEL void sim_test_shared_isolation(int *ok, int rounds) {
    __shared__ int owner;
    __shared__ int slots[128];
    SMELT_DYNAMIC_SHARED(int, dynamic_slots);
    int t = threadIdx.x, n = blockDim.x, b = blockIdx.x, good = 1;
    for (int r = 0; r < rounds; r++) {
        int stamp = b * 100000 + r * 100;
        if (t == 0) owner = stamp;
        slots[t] = stamp + t;
        dynamic_slots[t] = -(stamp + t);
        __syncthreads();
        int next = (t + 1) % n;
        good &= owner == stamp;
        good &= slots[next] == stamp + next;
        good &= dynamic_slots[next] == -(stamp + next);
        __syncthreads();
    }
    ok[b * n + t] = good;
}

/* Shuffles, votes and __syncwarp; launched with partial warps. */
SMELT_KERNEL void sim_test_warp_ops(int *out) {
    __shared__ int exchange[1024];
    int t = threadIdx.x, lane = t % 32;
    int v = t * 10 + 1;
    int *record = out + t * SIM_TEST_WARP_FIELDS;
    record[0] = smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 1);
    record[1] = smelt_shfl_down_i32(SIM_TEST_FULL_MASK, v, 3);
    record[2] = smelt_shfl_up_i32(SIM_TEST_FULL_MASK, v, 5);
    record[3] = smelt_shfl_idx_i32(SIM_TEST_FULL_MASK, v, 7);
    record[4] = smelt_shfl_idx_i32(SIM_TEST_FULL_MASK, v, 31 - lane);
    record[5] = (int)__ballot_sync(SIM_TEST_FULL_MASK, lane % 3 == 0);
    record[6] = __any_sync(SIM_TEST_FULL_MASK, t == 40);
    record[7] = __all_sync(SIM_TEST_FULL_MASK, t < 40);
    record[8] = (int)(2.0f * smelt_shfl_xor_f32(SIM_TEST_FULL_MASK, 0.5f * (float)t, 16));
    float sum = (float)v; /* the CUDA name, resolved by type on the host */
    for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(SIM_TEST_FULL_MASK, sum, offset);
    record[9] = (int)sum;
    exchange[t] = v;
    __syncwarp(SIM_TEST_FULL_MASK);
    record[10] = exchange[t ^ 1];
    record[11] = (int)smelt_shfl_down_u32(SIM_TEST_FULL_MASK, (unsigned int)v, 16);
}

/* The xor shuffle's paths: one lane mask for the whole warp (a butterfly),
 * a mask that differs by lane, and one that points past the warp (every
 * lane keeps its own value). Launched with full warps. */
SMELT_KERNEL void sim_test_xor_paths(int *out) {
    int t = threadIdx.x, lane = t % 32;
    int v = t * 10 + 1;
    out[3 * t] = smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 5);
    out[3 * t + 1] = smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, lane % 4);
    out[3 * t + 2] = smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 35);
}

/* Lanes 16-31 of a full warp return at once; lanes 0-15 shuffle among
 * themselves, so the last lane to return completes their first shuffle. */
SMELT_KERNEL void sim_test_return_completes_shuffle(int *out) {
    int t = threadIdx.x;
    if (t % 32 >= 16) return;
    int v = t * 10 + 1;
    int a = smelt_shfl_xor_i32(0x0000ffffu, v, 1);
    __syncwarp(0x0000ffffu);
    int b = smelt_shfl_down_i32(0x0000ffffu, a, 8);
    out[t] = a * 1000 + b;
}

/* Lane 5 of each warp leaves a reduction after its first step for
 * __syncthreads, where the other 31 lanes never come. */
SMELT_KERNEL void sim_test_lane_leaves_reduction(int *out) {
    int v = threadIdx.x;
    v += smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 1);
    if (threadIdx.x % 32 != 5) v += smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 2);
    __syncthreads();
    out[threadIdx.x] = v;
}

/* Atomics from every thread of the grid. */
SMELT_KERNEL void sim_test_atomics(int *count, float *sum, int *max_int, float *max_float,
                                   unsigned int *cas_winners) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    int key = (g * 7919) % 10007;
    smelt_atomic_add_i32(count, 1);
    atomicAdd(count + 1, 2);
    smelt_atomic_add_f32(sum, 0.1f);
    smelt_atomic_max_i32(max_int, key);
    smelt_atomic_max_f32(max_float, 0.5f * (float)key);
    /* Exactly one thread of each block wins the slot of its block. */
    if (smelt_atomic_cas_u32(cas_winners + blockIdx.x, 0u, (unsigned int)g + 1u) == 0u)
        smelt_atomic_add_u32(cas_winners + gridDim.x, 1u);
}

/* Half the block returns before the barrier: a deadlock on the GPU. */
SMELT_KERNEL void sim_test_half_return(int *out) {
    if (threadIdx.x >= blockDim.x / 2) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

/* Lanes 0-15 shuffle while 16-31 wait at __syncthreads. */
SMELT_KERNEL void sim_test_warp_divergence(int *out) {
    int v = threadIdx.x;
    if (threadIdx.x % 32 < 16) v = smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}

/* Lanes of one warp at two different warp operations. */
SMELT_KERNEL void sim_test_mixed_warp_ops(int *out) {
    int v = threadIdx.x;
    if (threadIdx.x % 32 < 16)
        v = smelt_shfl_xor_i32(SIM_TEST_FULL_MASK, v, 1);
    else
        v = (int)__ballot_sync(SIM_TEST_FULL_MASK, 1);
    out[threadIdx.x] = v;
}

/* A mask that leaves out half of the lanes that call. */
SMELT_KERNEL void sim_test_bad_mask(int *out) {
    out[threadIdx.x] = smelt_shfl_xor_i32(0x0000ffffu, (int)threadIdx.x, 1);
}

/* bf16 conversions on the device side of the header. */
SMELT_KERNEL void sim_test_bf16(const float *in, smelt_bf16 *bits, float *back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    bits[i] = smelt_f32_to_bf16(in[i]);
    back[i] = smelt_bf16_to_f32(bits[i]);
}

SMELT_KERNEL void sim_test_f16(const float *in, smelt_f16 *bits, float *back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    bits[i] = smelt_f32_to_f16(in[i]);
    back[i] = smelt_f16_to_f32(bits[i]);
}

/* ldmatrix.x4 alone: four 8x8 matrices stacked in a 32x8 tile; lane i gives
 * row i of the tile (row i % 8 of matrix i / 8). */
SMELT_KERNEL void sim_test_ldmatrix(const smelt_bf16 *tile, uint32_t *rows) {
    __shared__ __align__(16) smelt_bf16 staged[32 * 8];
    int lane = threadIdx.x;
    for (int i = lane; i < 32 * 8; i += 32)
        staged[i] = tile[i];
    __syncthreads();
    uint32_t r[4];
    smelt_ldmatrix_x4(r, &staged[lane * 8]);
    for (int m = 0; m < 4; m++)
        rows[lane * 4 + m] = r[m];
}

/* One m16n8k16 tile: D = A * B + C with A (16x16, row-major) through
 * ldmatrix, B (16x8, row-major [k][n]) and C, D (16x8, row-major) through
 * the fragment layouts. accumulate_in_place passes C as D. */
SMELT_KERNEL void sim_test_mma(const smelt_bf16 *a, const smelt_bf16 *b, const float *c, float *d,
                               int accumulate_in_place) {
    __shared__ __align__(16) smelt_bf16 a_tile[16 * 16];
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    for (int i = lane; i < 16 * 16; i += 32)
        a_tile[i] = a[i];
    __syncthreads();
    uint32_t a_fragment[4];
    smelt_ldmatrix_x4(a_fragment, &a_tile[(lane % 16) * 16 + (lane / 16) * 8]);
    uint32_t b_fragment[2];
    b_fragment[0] = smelt_bf16x2_pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
    b_fragment[1] = smelt_bf16x2_pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
    float c_fragment[4];
    c_fragment[0] = c[g * 8 + 2 * t];
    c_fragment[1] = c[g * 8 + 2 * t + 1];
    c_fragment[2] = c[(g + 8) * 8 + 2 * t];
    c_fragment[3] = c[(g + 8) * 8 + 2 * t + 1];
    float d_fragment[4];
    if (accumulate_in_place) {
        smelt_mma_m16n8k16_bf16_f32(c_fragment, a_fragment, b_fragment, c_fragment);
        for (int i = 0; i < 4; i++)
            d_fragment[i] = c_fragment[i];
    } else {
        smelt_mma_m16n8k16_bf16_f32(d_fragment, a_fragment, b_fragment, c_fragment);
    }
    d[g * 8 + 2 * t] = d_fragment[0];
    d[g * 8 + 2 * t + 1] = d_fragment[1];
    d[(g + 8) * 8 + 2 * t] = d_fragment[2];
    d[(g + 8) * 8 + 2 * t + 1] = d_fragment[3];
}

/* The same tile with f16 inputs: smelt_mma_m16n8k16_f16_f32 (B's fragment
 * built by smelt_f16x2_pack), C passed as D. */
SMELT_KERNEL void sim_test_mma_f16(const smelt_f16 *a, const smelt_f16 *b, const float *c, float *d) {
    __shared__ __align__(16) smelt_f16 a_tile[16 * 16];
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    for (int i = lane; i < 16 * 16; i += 32)
        a_tile[i] = a[i];
    __syncthreads();
    uint32_t a_fragment[4];
    smelt_ldmatrix_x4(a_fragment, &a_tile[(lane % 16) * 16 + (lane / 16) * 8]);
    uint32_t b_fragment[2];
    b_fragment[0] = smelt_f16x2_pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
    b_fragment[1] = smelt_f16x2_pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
    float fragment[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                         c[(g + 8) * 8 + 2 * t + 1]};
    smelt_mma_m16n8k16_f16_f32(fragment, a_fragment, b_fragment, fragment);
    d[g * 8 + 2 * t] = fragment[0];
    d[g * 8 + 2 * t + 1] = fragment[1];
    d[(g + 8) * 8 + 2 * t] = fragment[2];
    d[(g + 8) * 8 + 2 * t + 1] = fragment[3];
}

/* mma on a warp that is not whole (launched with 48 threads). */
SMELT_KERNEL void sim_test_mma_partial_warp(float *d) {
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0}, r[4];
    smelt_mma_m16n8k16_bf16_f32(r, a, b, c);
    d[threadIdx.x] = r[0];
}

/* The header's example: RMSNorm over rows of 64 with two warps. */
SMELT_KERNEL void sim_test_rms_norm_64(const float *x, const float *w, float *y, int tokens) {
    __shared__ float partial[SMELT_WARPS_MAX];
    int row = blockIdx.x, t = threadIdx.x;
    if (row >= tokens) return;
    float v = x[row * 64 + t], sum = v * v;
    for (int offset = 16; offset > 0; offset /= 2)
        sum += smelt_shfl_xor_f32(SIM_TEST_FULL_MASK, sum, offset);
    if (t % 32 == 0) partial[t / 32] = sum;
    __syncthreads();
    float total = partial[0] + partial[1];
    y[row * 64 + t] = v * rsqrtf(total / 64.0f + 1e-05f) * w[t];
}

/* cp.async: 32 threads each copy 16 bytes into shared memory, then read
 * another thread's piece. */
SMELT_KERNEL void sim_test_cp_async(const float *src, float *dst) {
    __shared__ __align__(16) float staged[32 * 4];
    int t = threadIdx.x;
    smelt_cp_async_16(&staged[t * 4], &src[t * 4]);
    smelt_cp_async_commit();
    smelt_cp_async_wait_all();
    __syncthreads();
    for (int i = 0; i < 4; i++)
        dst[t * 4 + i] = staged[(31 - t) * 4 + i];
}

/* The math the header promises in both halves. */
SMELT_KERNEL void sim_test_math(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float *out = y + i * 12;
    out[0] = expf(v);
    out[1] = logf(fabsf(v) + 1.0f);
    out[2] = sqrtf(fabsf(v));
    out[3] = rsqrtf(fabsf(v) + 1.0f);
    out[4] = tanhf(v);
    out[5] = erff(v);
    out[6] = fmaxf(v, 0.25f) + fminf(v, -0.25f);
    out[7] = __expf(v);
    out[8] = __fdividef(v, 3.0f);
    out[9] = __uint_as_float(__float_as_uint(v)) + __int_as_float(__float_as_int(v));
    out[10] = (float)(smelt_min_i32(i, 3) + smelt_max_i32(i, 3));
    out[11] = powf(fabsf(v), 1.5f);
    __threadfence();
}

/* The benchmark's shape: many barriers in a loop. Thread 0 counts the
 * rounds; every thread checks it sees each count (out[gridDim.x + block]
 * gathers the misses). */
SMELT_KERNEL void SMELT_LAUNCH_BOUNDS(256) sim_test_barrier_loop(int *out, int iterations) {
    __shared__ int counter;
    if (threadIdx.x == 0) counter = 0;
    __syncthreads();
    for (int i = 0; i < iterations; i++) {
        if (threadIdx.x == 0) counter++;
        __syncthreads();
        if (counter != i + 1) smelt_atomic_add_i32(out + gridDim.x + blockIdx.x, 1);
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = counter;
}

#ifdef SMELT_HOST
SMELT_HOST_ENTRY(sim_test_indices) { sim_test_indices(SMELT_ARG(unsigned int *, 0)); }
SMELT_HOST_ENTRY(sim_test_neighbour) { sim_test_neighbour(SMELT_ARG(int *, 0), SMELT_ARG(int, 1)); }
SMELT_HOST_ENTRY(sim_test_reduce) { sim_test_reduce(SMELT_ARG(const float *, 0), SMELT_ARG(float *, 1)); }
SMELT_HOST_ENTRY(sim_test_shared_isolation) {
    sim_test_shared_isolation(SMELT_ARG(int *, 0), SMELT_ARG(int, 1));
}
SMELT_HOST_ENTRY(sim_test_warp_ops) { sim_test_warp_ops(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_xor_paths) { sim_test_xor_paths(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_return_completes_shuffle) {
    sim_test_return_completes_shuffle(SMELT_ARG(int *, 0));
}
SMELT_HOST_ENTRY(sim_test_lane_leaves_reduction) { sim_test_lane_leaves_reduction(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_atomics) {
    sim_test_atomics(SMELT_ARG(int *, 0), SMELT_ARG(float *, 1), SMELT_ARG(int *, 2), SMELT_ARG(float *, 3),
                     SMELT_ARG(unsigned int *, 4));
}
SMELT_HOST_ENTRY(sim_test_half_return) { sim_test_half_return(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_warp_divergence) { sim_test_warp_divergence(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_mixed_warp_ops) { sim_test_mixed_warp_ops(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_bad_mask) { sim_test_bad_mask(SMELT_ARG(int *, 0)); }
SMELT_HOST_ENTRY(sim_test_bf16) {
    sim_test_bf16(SMELT_ARG(const float *, 0), SMELT_ARG(smelt_bf16 *, 1), SMELT_ARG(float *, 2),
                  SMELT_ARG(int, 3));
}
SMELT_HOST_ENTRY(sim_test_f16) {
    sim_test_f16(SMELT_ARG(const float *, 0), SMELT_ARG(smelt_f16 *, 1), SMELT_ARG(float *, 2),
                 SMELT_ARG(int, 3));
}
SMELT_HOST_ENTRY(sim_test_mma_f16) {
    sim_test_mma_f16(SMELT_ARG(const smelt_f16 *, 0), SMELT_ARG(const smelt_f16 *, 1),
                     SMELT_ARG(const float *, 2), SMELT_ARG(float *, 3));
}
SMELT_HOST_ENTRY(sim_test_ldmatrix) {
    sim_test_ldmatrix(SMELT_ARG(const smelt_bf16 *, 0), SMELT_ARG(uint32_t *, 1));
}
SMELT_HOST_ENTRY(sim_test_mma) {
    sim_test_mma(SMELT_ARG(const smelt_bf16 *, 0), SMELT_ARG(const smelt_bf16 *, 1),
                 SMELT_ARG(const float *, 2), SMELT_ARG(float *, 3), SMELT_ARG(int, 4));
}
SMELT_HOST_ENTRY(sim_test_mma_partial_warp) { sim_test_mma_partial_warp(SMELT_ARG(float *, 0)); }
SMELT_HOST_ENTRY(sim_test_rms_norm_64) {
    sim_test_rms_norm_64(SMELT_ARG(const float *, 0), SMELT_ARG(const float *, 1), SMELT_ARG(float *, 2),
                         SMELT_ARG(int, 3));
}
SMELT_HOST_ENTRY(sim_test_cp_async) { sim_test_cp_async(SMELT_ARG(const float *, 0), SMELT_ARG(float *, 1)); }
SMELT_HOST_ENTRY(sim_test_math) {
    sim_test_math(SMELT_ARG(const float *, 0), SMELT_ARG(float *, 1), SMELT_ARG(int, 2));
}
SMELT_HOST_ENTRY(sim_test_barrier_loop) { sim_test_barrier_loop(SMELT_ARG(int *, 0), SMELT_ARG(int, 1)); }
#endif
