// The generic matmul y[t][r] = sum_k W[r][k] x[t][k] (+ b[r]) for every weight type: one warp
// per (row, token), each lane striding over the row's elements through the dq_ accessors, then
// a warp sum. The activations are rounded as ggml's CPU dots take them for the float types
// (F16 weights by f16 activations, BF16 by bf16, F32 by f32); the executor runs the quantized
// types through matmul_q8.cu (8-bit activations) instead, and keeps these for tests.
#include "quants.cuh"

__device__ __forceinline__ float act_f32(float x) { return x; }
__device__ __forceinline__ float act_f16(float x) { return f16_to_f32(f32_to_f16(x)); }
__device__ __forceinline__ float act_bf16(float x) { return bf16_round(x); }
#define act_q4_0 act_f32
#define act_q4_1 act_f32
#define act_q5_0 act_f32
#define act_q5_1 act_f32
#define act_q8_0 act_f32
#define act_q2_k act_f32
#define act_q3_k act_f32
#define act_q4_k act_f32
#define act_q5_k act_f32
#define act_q6_k act_f32

#define MATMUL_GENERIC(T)                                                                        \
    extern "C" __global__ void matmul_##T(const u8 *w, const float *x, const float *bias,         \
                                          float *y, int n_rows, int n_cols, int n_tokens,        \
                                          i64 row_bytes) {                                       \
        const int warps = blockDim.x / WARP;                                                     \
        const i64 item = (i64)blockIdx.x * warps + threadIdx.x / WARP;                           \
        if (item >= (i64)n_rows * n_tokens) return;                                              \
        const int r = item % n_rows, t = item / n_rows;                                          \
        const u8 *row = w + (i64)r * row_bytes;                                                  \
        const float *xt = x + (i64)t * n_cols;                                                   \
        float s = 0.0f;                                                                          \
        for (int k = threadIdx.x % WARP; k < n_cols; k += WARP) s += dq_##T(row, k) * act_##T(xt[k]);     \
        s = warp_sum(s);                                                                         \
        if (threadIdx.x % WARP == 0) y[(i64)t * n_rows + r] = s + (bias ? bias[r] : 0.0f);       \
    }
FOR_EACH_TYPE(MATMUL_GENERIC)
