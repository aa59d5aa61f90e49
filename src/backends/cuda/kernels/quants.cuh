// Element accessors for every weight and KV storage type minfer loads, in ggml's block
// layouts (ggml-common.h). `dq_<type>(row, j)` returns element `j` of a row that starts at
// `row`; rows are whole blocks. One element at a time: the reference path of get_rows and the
// generic matmul, not the fast MMVQ/MMQ path.
#pragma once
#include "prelude.cuh"

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_K 256

// Bytes of one block.
#define BS_Q4_0 18
#define BS_Q4_1 20
#define BS_Q5_0 22
#define BS_Q5_1 24
#define BS_Q8_0 34
#define BS_Q2_K 84
#define BS_Q3_K 110
#define BS_Q4_K 144
#define BS_Q5_K 176
#define BS_Q6_K 210

__device__ __forceinline__ float dq_f32(const u8 *row, int j) {
    return __uint_as_float(ld_u32(row + 4 * j));
}

__device__ __forceinline__ float dq_f16(const u8 *row, int j) {
    return f16_to_f32(ld_u16(row + 2 * j));
}

__device__ __forceinline__ float dq_bf16(const u8 *row, int j) {
    return bf16_to_f32(ld_u16(row + 2 * j));
}

// Q4_0: d (f16), qs[16]; element i < 16 is the low nibble of qs[i], i >= 16 the high nibble
// of qs[i - 16]; value (q - 8) * d.
__device__ __forceinline__ float dq_q4_0(const u8 *row, int j) {
    const u8 *b = row + (j / QK4_0) * BS_Q4_0;
    const int i = j % QK4_0;
    const u8 q = b[2 + (i & 15)];
    const int v = (i < 16 ? (q & 0xF) : (q >> 4)) - 8;
    return f16_to_f32(ld_u16(b)) * (float)v;
}

// Q4_1: d, m (f16), qs[16]; q * d + m.
__device__ __forceinline__ float dq_q4_1(const u8 *row, int j) {
    const u8 *b = row + (j / QK4_1) * BS_Q4_1;
    const int i = j % QK4_1;
    const u8 q = b[4 + (i & 15)];
    const int v = i < 16 ? (q & 0xF) : (q >> 4);
    return f16_to_f32(ld_u16(b)) * (float)v + f16_to_f32(ld_u16(b + 2));
}

// Q5_0: d (f16), qh (u32: bit i is the fifth bit of element i), qs[16]; (q - 16) * d.
__device__ __forceinline__ float dq_q5_0(const u8 *row, int j) {
    const u8 *b = row + (j / QK5_0) * BS_Q5_0;
    const int i = j % QK5_0;
    const u32 qh = ld_u32(b + 2);
    const u8 q = b[6 + (i & 15)];
    const int lo = i < 16 ? (q & 0xF) : (q >> 4);
    const int v = (lo | (((qh >> i) & 1) << 4)) - 16;
    return f16_to_f32(ld_u16(b)) * (float)v;
}

// Q5_1: d, m (f16), qh (u32), qs[16]; q * d + m.
__device__ __forceinline__ float dq_q5_1(const u8 *row, int j) {
    const u8 *b = row + (j / QK5_1) * BS_Q5_1;
    const int i = j % QK5_1;
    const u32 qh = ld_u32(b + 4);
    const u8 q = b[8 + (i & 15)];
    const int lo = i < 16 ? (q & 0xF) : (q >> 4);
    const int v = lo | (((qh >> i) & 1) << 4);
    return f16_to_f32(ld_u16(b)) * (float)v + f16_to_f32(ld_u16(b + 2));
}

// Q8_0: d (f16), qs[32] (i8); q * d.
__device__ __forceinline__ float dq_q8_0(const u8 *row, int j) {
    const u8 *b = row + (j / QK8_0) * BS_Q8_0;
    return f16_to_f32(ld_u16(b)) * (float)(i8)b[2 + j % QK8_0];
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin (f16).
// Element e: half n = e / 128, w = e % 128, shift 2 * (w / 32), l = w % 32,
// scale index 8n + 2 (w / 32) + (l >= 16), byte qs[32n + l].
__device__ __forceinline__ float dq_q2_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q2_K;
    const int e = j % QK_K, n = e / 128, w = e % 128, g = w / 32, l = w % 32;
    const u8 sc = b[8 * n + 2 * g + (l >= 16)];
    const float d = f16_to_f32(ld_u16(b + 80)), dmin = f16_to_f32(ld_u16(b + 82));
    const int q = (b[16 + 32 * n + l] >> (2 * g)) & 3;
    return d * (float)(sc & 0xF) * (float)q - dmin * (float)(sc >> 4);
}

// Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales, offset 32), d (f16).
// Element e: n = e / 128, g = (e % 128) / 32, l = e % 32; low two bits from qs[32n + l] at
// shift 2g; the high bit is hmask[l] bit (4n + g), and a clear bit subtracts 4.
__device__ __forceinline__ float dq_q3_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q3_K;
    const int e = j % QK_K, n = e / 128, g = (e % 128) / 32, l = e % 32;
    const int is = 8 * n + 2 * g + (l >= 16);
    const u8 *scales = b + 96;
    const int low4 = is < 8 ? (scales[is] & 0xF) : (scales[is - 8] >> 4);
    const int high2 = (scales[8 + is % 4] >> (2 * (is / 4))) & 3;
    const int sc = (low4 | (high2 << 4)) - 32;
    const int q = (b[32 + 32 * n + l] >> (2 * g)) & 3;
    const int hbit = (b[l] >> (4 * n + g)) & 1;
    const float d = f16_to_f32(ld_u16(b + 108));
    return d * (float)sc * (float)(q - (hbit ? 0 : 4));
}

// The six-bit scale and min `is` (0..8) of a Q4_K / Q5_K block (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int is, const u8 *q, int *sc, int *m) {
    if (is < 4) {
        *sc = q[is] & 63;
        *m = q[is + 4] & 63;
    } else {
        *sc = (q[is + 4] & 0xF) | ((q[is - 4] >> 6) << 4);
        *m = (q[is + 4] >> 4) | ((q[is] >> 6) << 4);
    }
}

// Q4_K: d, dmin (f16), scales[12], qs[128]. Element e: chunk c = e / 64, l = e % 32,
// high nibble when e % 64 >= 32; byte qs[32c + l]; scale/min index 2c + high.
__device__ __forceinline__ float dq_q4_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q4_K;
    const int e = j % QK_K, c = e / 64, hi = (e % 64) >= 32, l = e % 32;
    int sc, m;
    scale_min_k4(2 * c + hi, b + 4, &sc, &m);
    const u8 q = b[16 + 32 * c + l];
    const int v = hi ? (q >> 4) : (q & 0xF);
    return f16_to_f32(ld_u16(b)) * (float)sc * (float)v - f16_to_f32(ld_u16(b + 2)) * (float)m;
}

// Q5_K: d, dmin (f16), scales[12], qh[32], qs[128]. As Q4_K, plus the fifth bit: qh[l] bit
// (2c + high).
__device__ __forceinline__ float dq_q5_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q5_K;
    const int e = j % QK_K, c = e / 64, hi = (e % 64) >= 32, l = e % 32;
    int sc, m;
    scale_min_k4(2 * c + hi, b + 4, &sc, &m);
    const u8 q = b[48 + 32 * c + l];
    const int v = (hi ? (q >> 4) : (q & 0xF)) + (((b[16 + l] >> (2 * c + hi)) & 1) << 4);
    return f16_to_f32(ld_u16(b)) * (float)sc * (float)v - f16_to_f32(ld_u16(b + 2)) * (float)m;
}

// Q6_K: ql[128], qh[64], scales[16] (i8), d (f16). Element e: n = e / 128, k = (e % 128) / 32,
// l = e % 32; low four bits from ql[64n + l + 32 (k & 1)] (high nibble when k >= 2), two high
// bits from qh[32n + l] at shift 2k; scale scales[8n + l / 16 + 2k]; value d * sc * (q - 32).
__device__ __forceinline__ float dq_q6_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q6_K;
    const int e = j % QK_K, n = e / 128, k = (e % 128) / 32, l = e % 32;
    const u8 lq = b[64 * n + l + 32 * (k & 1)];
    const int lo = k >= 2 ? (lq >> 4) : (lq & 0xF);
    const int hb = (b[128 + 32 * n + l] >> (2 * k)) & 3;
    const int sc = (i8)b[192 + 8 * n + l / 16 + 2 * k];
    return f16_to_f32(ld_u16(b + 208)) * (float)sc * (float)((lo | (hb << 4)) - 32);
}

// Every storage type by name, for kernels generated per type with FOR_EACH_TYPE(X): X(name).
#define FOR_EACH_TYPE(X) \
    X(f32) X(f16) X(bf16) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q2_k) X(q3_k) X(q4_k) X(q5_k) X(q6_k)

// ---- integer codes and affine maps, for the 8-bit activation matmul (matmul_q8.cu) ----
// Every quantized type's element e is a * q(e) + b, with an integer code q and (a, b)
// constant over each aligned group of 16 elements: `qi_<type>(row, e)` is the code and
// `ab_<type>(row, g, &a, &b)` the map of group g (elements 16g..16g+15).

__device__ __forceinline__ int qi_q4_0(const u8 *row, int j) {
    const u8 *b = row + (j / QK4_0) * BS_Q4_0;
    const int i = j % QK4_0;
    const u8 q = b[2 + (i & 15)];
    return i < 16 ? (q & 0xF) : (q >> 4);
}
__device__ __forceinline__ void ab_q4_0(const u8 *row, int g, float *a, float *b) {
    const float d = f16_to_f32(ld_u16(row + (g / 2) * BS_Q4_0));
    *a = d;
    *b = -8.0f * d;
}

__device__ __forceinline__ int qi_q4_1(const u8 *row, int j) {
    const u8 *b = row + (j / QK4_1) * BS_Q4_1;
    const int i = j % QK4_1;
    const u8 q = b[4 + (i & 15)];
    return i < 16 ? (q & 0xF) : (q >> 4);
}
// The Q4_1 / Q5_1 map: d and m are the block's first two f16s.
__device__ __forceinline__ void ab_dm(const u8 *blk, float *a, float *b) {
    *a = f16_to_f32(ld_u16(blk));
    *b = f16_to_f32(ld_u16(blk + 2));
}
__device__ __forceinline__ void ab_q4_1(const u8 *row, int g, float *a, float *b) {
    ab_dm(row + (g / 2) * BS_Q4_1, a, b);
}

__device__ __forceinline__ int qi_q5_0(const u8 *row, int j) {
    const u8 *b = row + (j / QK5_0) * BS_Q5_0;
    const int i = j % QK5_0;
    const u32 qh = ld_u32(b + 2);
    const u8 q = b[6 + (i & 15)];
    return (i < 16 ? (q & 0xF) : (q >> 4)) | (((qh >> i) & 1) << 4);
}
__device__ __forceinline__ void ab_q5_0(const u8 *row, int g, float *a, float *b) {
    const float d = f16_to_f32(ld_u16(row + (g / 2) * BS_Q5_0));
    *a = d;
    *b = -16.0f * d;
}

__device__ __forceinline__ int qi_q5_1(const u8 *row, int j) {
    const u8 *b = row + (j / QK5_1) * BS_Q5_1;
    const int i = j % QK5_1;
    const u32 qh = ld_u32(b + 4);
    const u8 q = b[8 + (i & 15)];
    return (i < 16 ? (q & 0xF) : (q >> 4)) | (((qh >> i) & 1) << 4);
}
__device__ __forceinline__ void ab_q5_1(const u8 *row, int g, float *a, float *b) {
    ab_dm(row + (g / 2) * BS_Q5_1, a, b);
}

__device__ __forceinline__ int qi_q8_0(const u8 *row, int j) {
    return (i8)row[(j / QK8_0) * BS_Q8_0 + 2 + j % QK8_0];
}
__device__ __forceinline__ void ab_q8_0(const u8 *row, int g, float *a, float *b) {
    *a = f16_to_f32(ld_u16(row + (g / 2) * BS_Q8_0));
    *b = 0.0f;
}

// Q2_K: group g of a block is scale byte g % 16: a = d * (sc & 15), b = -dmin * (sc >> 4).
__device__ __forceinline__ int qi_q2_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q2_K;
    const int e = j % QK_K, n = e / 128, w = e % 128, g = w / 32, l = w % 32;
    return (b[16 + 32 * n + l] >> (2 * g)) & 3;
}
__device__ __forceinline__ void ab_q2_k(const u8 *row, int g, float *a, float *b) {
    const u8 *blk = row + (g / 16) * BS_Q2_K;
    const u8 sc = blk[g % 16];
    *a = f16_to_f32(ld_u16(blk + 80)) * (float)(sc & 0xF);
    *b = -f16_to_f32(ld_u16(blk + 82)) * (float)(sc >> 4);
}

// Q3_K: the code is the signed 3-bit value (q - 4 when the high bit is clear); a = d * sc.
__device__ __forceinline__ int qi_q3_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q3_K;
    const int e = j % QK_K, n = e / 128, g = (e % 128) / 32, l = e % 32;
    const int q = (b[32 + 32 * n + l] >> (2 * g)) & 3;
    const int hbit = (b[l] >> (4 * n + g)) & 1;
    return q - (hbit ? 0 : 4);
}
__device__ __forceinline__ void ab_q3_k(const u8 *row, int g, float *a, float *b) {
    const u8 *blk = row + (g / 16) * BS_Q3_K;
    const int is = g % 16;
    const u8 *scales = blk + 96;
    const int low4 = is < 8 ? (scales[is] & 0xF) : (scales[is - 8] >> 4);
    const int high2 = (scales[8 + is % 4] >> (2 * (is / 4))) & 3;
    *a = f16_to_f32(ld_u16(blk + 108)) * (float)((low4 | (high2 << 4)) - 32);
    *b = 0.0f;
}

// Q4_K / Q5_K: the 32-element sub-block (g / 2) % 8 has scale sc and min m.
__device__ __forceinline__ int qi_q4_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q4_K;
    const int e = j % QK_K, c = e / 64, hi = (e % 64) >= 32, l = e % 32;
    const u8 q = b[16 + 32 * c + l];
    return hi ? (q >> 4) : (q & 0xF);
}
// The Q4_K / Q5_K map of group g: d * sc and -dmin * m of its 32-value sub-block.
__device__ __forceinline__ void ab_k4(const u8 *blk, int g, float *a, float *b) {
    int sc, m;
    scale_min_k4((g % 16) / 2, blk + 4, &sc, &m);
    *a = f16_to_f32(ld_u16(blk)) * (float)sc;
    *b = -f16_to_f32(ld_u16(blk + 2)) * (float)m;
}
__device__ __forceinline__ void ab_q4_k(const u8 *row, int g, float *a, float *b) {
    ab_k4(row + (g / 16) * BS_Q4_K, g, a, b);
}

__device__ __forceinline__ int qi_q5_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q5_K;
    const int e = j % QK_K, c = e / 64, hi = (e % 64) >= 32, l = e % 32;
    const u8 q = b[48 + 32 * c + l];
    return (hi ? (q >> 4) : (q & 0xF)) + (((b[16 + l] >> (2 * c + hi)) & 1) << 4);
}
__device__ __forceinline__ void ab_q5_k(const u8 *row, int g, float *a, float *b) {
    ab_k4(row + (g / 16) * BS_Q5_K, g, a, b);
}

// Q6_K: group g of a block has the signed scale scales[g % 16]; value d * sc * (q - 32).
__device__ __forceinline__ int qi_q6_k(const u8 *row, int j) {
    const u8 *b = row + (j / QK_K) * BS_Q6_K;
    const int e = j % QK_K, n = e / 128, k = (e % 128) / 32, l = e % 32;
    const u8 lq = b[64 * n + l + 32 * (k & 1)];
    const int lo = k >= 2 ? (lq >> 4) : (lq & 0xF);
    const int hb = (b[128 + 32 * n + l] >> (2 * k)) & 3;
    return lo | (hb << 4);
}
__device__ __forceinline__ void ab_q6_k(const u8 *row, int g, float *a, float *b) {
    const u8 *blk = row + (g / 16) * BS_Q6_K;
    const float s = f16_to_f32(ld_u16(blk + 208)) * (float)(i8)blk[192 + g % 16];
    *a = s;
    *b = -32.0f * s;
}
