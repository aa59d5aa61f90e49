// The orthonormal Walsh-Hadamard rotation of quantized KV caches (see the CPU backend's
// kernels/hadamard.rs): x <- H x for one chunk of 64 values, H = Sylvester's 64x64 matrix / 8.
// Its own inverse. One thread does a whole chunk.
#pragma once

__device__ void fwht64(float *x) {
    for (int h = 1; h < 64; h *= 2)
        for (int i = 0; i < 64; i += 2 * h)
            for (int j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int j = 0; j < 64; ++j) x[j] *= 0.125f;
}
