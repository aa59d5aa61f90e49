// Element-wise ops on f32: add and mul with a broadcast second operand (a bias row or a
// per-feature vector repeats every `nb` elements), SiLU, SwiGLU, GELU, GeGLU and scale. One
// thread per element, grid-stride.
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

// ggml's table GELU (tanh approximation): 0 at or below -10, x at or above 10, else the f16
// rounding of gelu(f16(x)) computed in f32 with the inner multiply-add fused, as GCC builds
// ggml's table. The device tanhf may differ from glibc's in the last bit, so a rare entry may
// round to the neighbouring f16 (a tolerance, not bits, as every CUDA op).
__device__ __forceinline__ float gelu_table(float x) {
    const float xh = f16_to_f32(f32_to_f16(x));
    const float inner = fmaf(0.044715f * xh, xh, 1.0f);
    const float g = 0.5f * xh * (1.0f + tanhf(0.7978846f * xh * inner));
    return f16_to_f32(f32_to_f16(g));
}

extern "C" __global__ void gelu_f32(const float *x, float *out, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const float v = x[i];
        out[i] = v <= -10.0f ? 0.0f : v >= 10.0f ? v : gelu_table(v);
    }
}

// out = gelu(gate) * up; `out` may alias `gate`.
extern "C" __global__ void geglu_f32(const float *gate, const float *up, float *out, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g <= -10.0f ? 0.0f : g >= 10.0f ? g * up[i] : gelu_table(g) * up[i];
    }
}
