// KV cache stores: this step's rows x[t] (width = n_head_kv * head_dim values) go to cell
// pos[t] of a layer's region, as f32, f16 (round to nearest even) or packed Q8_0 rows (as the
// CPU's quantize_row_q8_0, below). Q8_0 rows are rotated first, each 64-value chunk of a head by the orthonormal
// Walsh-Hadamard matrix (when head_dim is a multiple of 64), as the CPU backend does. A cell
// outside 0..n_ctx is not written (the engine validates positions before they reach a device).
#include "quants.cuh"
#include "hadamard.cuh"

// As the CPU's quantize_row_q8_0 (ggml's x86 path): d = amax / 127 stored as f16,
// q = rint(x * 127 / amax) (ties to even), saturated to i8.
__device__ void quantize_q8_0_block(const float *v, u8 *out) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const u16 dh = f32_to_f16(d);
    out[0] = dh & 0xFF;
    out[1] = dh >> 8;
    for (int i = 0; i < 32; ++i) {
        const int q = (int)rintf(v[i] * id);
        out[2 + i] = (u8)(i8)(q < -128 ? -128 : (q > 127 ? 127 : q));
    }
}

extern "C" __global__ void kv_store_f32(const float *x, const i32 *pos, u8 *region, int n_tokens, int width, int n_ctx) {
    const i64 total = (i64)n_tokens * width;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const int t = i / width, c = i % width;
        if (pos[t] < 0 || pos[t] >= n_ctx) continue;
        ((float *)region)[(i64)pos[t] * width + c] = x[i];
    }
}

extern "C" __global__ void kv_store_f16(const float *x, const i32 *pos, u8 *region, int n_tokens, int width, int n_ctx) {
    const i64 total = (i64)n_tokens * width;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const int t = i / width, c = i % width;
        if (pos[t] < 0 || pos[t] >= n_ctx) continue;
        ((u16 *)region)[(i64)pos[t] * width + c] = f32_to_f16(x[i]);
    }
}

// One thread per 64-value chunk (two Q8_0 blocks); `rotate` says whether heads are rotated.
extern "C" __global__ void kv_store_q8_0(const float *x, const i32 *pos, u8 *region, int n_tokens, int width, int n_ctx, int rotate) {
    const int chunks = width / 64;
    const i64 total = (i64)n_tokens * chunks;
    const i64 row_bytes = (i64)(width / 32) * BS_Q8_0;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const int t = i / chunks, c = i % chunks;
        if (pos[t] < 0 || pos[t] >= n_ctx) continue;
        float v[64];
        for (int j = 0; j < 64; ++j) v[j] = x[(i64)t * width + 64 * c + j];
        if (rotate) fwht64(v);
        u8 *row = region + (i64)pos[t] * row_bytes;
        quantize_q8_0_block(v, row + (2 * c) * BS_Q8_0);
        quantize_q8_0_block(v + 32, row + (2 * c + 1) * BS_Q8_0);
    }
}

// K-shift: re-rotates the K rows of cells with a non-zero delta by that many positions (RoPE
// of the delta, same style and n_rot as the model), decoding and re-encoding packed rows.
// One thread per (cell, head). Q8_0 rows: decode (and un-rotate) the head, RoPE, re-encode.
#define KV_SHIFT(T, LOAD, STORE)                                                                   \
    extern "C" __global__ void kv_shift_##T(u8 *region, const i32 *delta, int n_cells, int n_head,  \
                                            int head_dim, int n_rot, float theta_scale, int neox,   \
                                            int rotate) {                                          \
        const i64 total = (i64)n_cells * n_head;                                                   \
        for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) { \
            const int cell = i / n_head, h = i % n_head;                                           \
            if (delta[cell] == 0) continue;                                                        \
            float v[256];                                                                          \
            LOAD;                                                                                  \
            const int half = n_rot / 2;                                                            \
            float theta = (float)delta[cell];                                                      \
            for (int p = 0; p < half; ++p) {                                                       \
                const float c = cosf(theta), s = sinf(theta);                                      \
                const int i0 = neox ? p : 2 * p, i1 = neox ? p + half : 2 * p + 1;                 \
                const float x0 = v[i0], x1 = v[i1];                                                \
                v[i0] = x0 * c - x1 * s;                                                           \
                v[i1] = x0 * s + x1 * c;                                                           \
                theta *= theta_scale;                                                              \
            }                                                                                      \
            STORE;                                                                                 \
        }                                                                                          \
    }

#define WIDTH ((i64)n_head * head_dim)
KV_SHIFT(f32,
         for (int d = 0; d < head_dim; ++d) v[d] = ((float *)region)[cell * WIDTH + h * head_dim + d],
         for (int d = 0; d < head_dim; ++d) ((float *)region)[cell * WIDTH + h * head_dim + d] = v[d])
KV_SHIFT(f16,
         for (int d = 0; d < head_dim; ++d) v[d] = f16_to_f32(((u16 *)region)[cell * WIDTH + h * head_dim + d]),
         for (int d = 0; d < head_dim; ++d) ((u16 *)region)[cell * WIDTH + h * head_dim + d] = f32_to_f16(v[d]))
KV_SHIFT(q8_0,
         const u8 *row = region + cell * (WIDTH / 32) * BS_Q8_0;
         for (int d = 0; d < head_dim; ++d) v[d] = dq_q8_0(row, h * head_dim + d);
         if (rotate) for (int c = 0; c < head_dim / 64; ++c) fwht64(v + 64 * c),
         u8 *wrow = region + cell * (WIDTH / 32) * BS_Q8_0;
         if (rotate) for (int c = 0; c < head_dim / 64; ++c) fwht64(v + 64 * c);
         for (int b = 0; b < head_dim / 32; ++b) quantize_q8_0_block(v + 32 * b, wrow + (h * head_dim / 32 + b) * BS_Q8_0))
#undef WIDTH
