// Shared definitions of every minfer CUDA kernel source (included by name; NVRTC gets it as a
// header). No CUDA toolkit headers: half and bfloat16 conversions are PTX instructions.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;

#define WARP 32
#define NEG_INF __int_as_float(0xff800000)

#ifndef MINFER_EMU
// IEEE binary16 bits to f32 (exact).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// f32 to binary16 bits, round to nearest even (as ggml's F16C path).
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}
#else
// The host emulator (tests/support/cuda_emu): the compiler's binary16, same roundings.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    const _Float16 v = (_Float16)f;
    u16 h;
    memcpy(&h, &v, 2);
    return h;
}
#endif

// bfloat16 bits to f32 (exact: the high half of the f32).
__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// f32 to bfloat16 and back, round to nearest even (ggml's GGML_FP32_TO_BF16; NaN stays NaN).
__device__ __forceinline__ float bf16_round(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

// Little-endian loads from byte addresses of any alignment.
__device__ __forceinline__ u16 ld_u16(const u8 *p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}
__device__ __forceinline__ u32 ld_u32(const u8 *p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets
// the total. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}
