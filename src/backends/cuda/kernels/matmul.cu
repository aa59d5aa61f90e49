// The generic matmul y[t][r] = sum_k W[r][k] x[t][k] (+ b[r]) for every weight type: one warp
// per (row, token), each lane striding over the row's elements through the dq_ accessors, then
// a warp sum. The reference path every type has; MMVQ (decode) and MMQ (prefill) replace it
// where they exist.
#include "quants.cuh"

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
        for (int k = threadIdx.x % WARP; k < n_cols; k += WARP) s += dq_##T(row, k) * xt[k];     \
        s = warp_sum(s);                                                                         \
        if (threadIdx.x % WARP == 0) y[(i64)t * n_rows + r] = s + (bias ? bias[r] : 0.0f);       \
    }
FOR_EACH_TYPE(MATMUL_GENERIC)
