// RMS norm: one block per row of `n` values, y = x / sqrt(mean(x^2) + eps) * w (w optional).
// The Qwen3 q/k head norm is the same kernel over rows of one head (`n = head_dim`) with the
// weight repeating per head. Sums in f32 per thread, then a block tree.
#include "prelude.cuh"

extern "C" __global__ void rms_norm_f32(const float *x, const float *w, float *out, int n, float eps) {
    __shared__ float scratch[32];
    const float *xr = x + (i64)blockIdx.x * n;
    float *yr = out + (i64)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    s = block_sum(s, scratch);
    const float scale = 1.0f / sqrtf(s / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}
