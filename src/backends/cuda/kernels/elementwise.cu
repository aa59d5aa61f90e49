// Element-wise ops on f32: add and mul with a broadcast second operand (a bias row or a
// per-feature vector repeats every `nb` elements), SiLU, SwiGLU, and scale. One thread per
// element, grid-stride.
#include "prelude.cuh"

extern "C" __global__ void add_f32(const float *a, const float *b, float *out, i64 n, i64 nb) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i % nb];
}

extern "C" __global__ void mul_f32(const float *a, const float *b, float *out, i64 n, i64 nb) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = a[i] * b[i % nb];
}

__device__ __forceinline__ float silu(float x) {
    return x / (1.0f + expf(-x));
}

extern "C" __global__ void silu_f32(const float *x, float *out, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = silu(x[i]);
}

// out = silu(gate) * up; `out` may alias `gate` (the CPU runs it in place too).
extern "C" __global__ void swiglu_f32(const float *gate, const float *up, float *out, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = silu(gate[i]) * up[i];
}

extern "C" __global__ void scale_f32(const float *x, float *out, float s, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = x[i] * s;
}
