// The host emulator's CUDA dialect: what minfer's kernel sources use, defined for g++ so the
// same .cu text compiles as C++ and runs on the CPU (tests/support/cuda_emu.rs). Every CUDA
// thread of a block is a fiber of runtime.cpp; barriers and warp shuffles switch fibers.
// Only what the kernels use is here: a kernel that needs more fails to compile in the
// emulator, which is the signal to add it (with its semantics), not to work around it.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MINFER_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict

struct emu_dim3 {
    unsigned x, y, z;
};

extern "C" {
extern emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
void emu_syncthreads(void);
void emu_syncwarp(void);
uint32_t emu_shfl_xor(uint32_t bits, int lane_mask);
uint32_t emu_shfl(uint32_t bits, int src_lane);
}

inline void __syncthreads() { emu_syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_syncwarp(); }

inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __int_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }

inline float __shfl_xor_sync(unsigned, float v, int m, int = 32) { return __uint_as_float(emu_shfl_xor(__float_as_uint(v), m)); }
inline int __shfl_xor_sync(unsigned, int v, int m, int = 32) { return (int)emu_shfl_xor((uint32_t)v, m); }
inline float __shfl_sync(unsigned, float v, int src, int = 32) { return __uint_as_float(emu_shfl(__float_as_uint(v), src)); }
inline int __shfl_sync(unsigned, int v, int src, int = 32) { return (int)emu_shfl((uint32_t)v, src); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float a, float b) { return a / b; }

// Four signed bytes of a times those of b, plus c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
