// Grouped-query attention, one warp per (token, head): lanes own head dims (d = lane + 32k),
// cells 0..=pos[t] are visited in order with an online softmax (running max and sum), K and
// V read directly in their storage type (f32, f16 or packed Q8_0 rows). For rotated Q8_0
// caches the query is rotated by the same Walsh-Hadamard chunks as K, and the output is
// rotated back (H is its own inverse). head_dim <= 256. A position outside 0..n_ctx attends
// nothing and gives NaNs (0 / 0), never a read outside the region.
#include "quants.cuh"
#include "hadamard.cuh"

#define MAX_HD 256
#define PER_LANE (MAX_HD / WARP)

#define ATTN(T)                                                                                    \
    extern "C" __global__ void attn_##T(const float *q, const u8 *k, const u8 *v, const i32 *pos,   \
                                        float *out, int n_head, int n_head_kv, int head_dim,       \
                                        float scale, i64 q_stride, int rotate, int n_ctx) {       \
        __shared__ float qs[MAX_HD];                                                               \
        const int lane = threadIdx.x;                                                              \
        const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;                                \
        const int hk = h / (n_head / n_head_kv);                                                   \
        const int width = n_head_kv * head_dim;                                                    \
        const i64 row_bytes = sizeof_row_##T(width);                                               \
        for (int d = lane; d < head_dim; d += WARP) qs[d] = q[(i64)t * q_stride + h * head_dim + d]; \
        __syncwarp();                                                                              \
        if (rotate) {                                                                              \
            for (int c = lane; c < head_dim / 64; c += WARP) fwht64(qs + 64 * c);           \
            __syncwarp();                                                                          \
        }                                                                                          \
        float acc[PER_LANE];                                                                       \
        for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.0f;                                          \
        float m = NEG_INF, l = 0.0f;                                                               \
        const int n_cells = pos[t] >= 0 && pos[t] < n_ctx ? pos[t] + 1 : 0;                        \
        for (int j = 0; j < n_cells; ++j) {                                                        \
            const u8 *krow = k + (i64)j * row_bytes;                                               \
            float s = 0.0f;                                                                        \
            for (int d = lane; d < head_dim; d += WARP) s += qs[d] * dq_##T(krow, hk * head_dim + d); \
            s = warp_sum(s) * scale;                                                               \
            const float m_new = fmaxf(m, s);                                                       \
            const float corr = expf(m - m_new), p = expf(s - m_new);                               \
            l = l * corr + p;                                                                      \
            const u8 *vrow = v + (i64)j * row_bytes;                                               \
            for (int i = 0, d = lane; d < head_dim; ++i, d += WARP)                                \
                acc[i] = acc[i] * corr + p * dq_##T(vrow, hk * head_dim + d);                      \
            m = m_new;                                                                             \
        }                                                                                          \
        __syncwarp();                                                                              \
        for (int i = 0, d = lane; d < head_dim; ++i, d += WARP) qs[d] = acc[i] / l;                \
        __syncwarp();                                                                              \
        if (rotate) {                                                                              \
            for (int c = lane; c < head_dim / 64; c += WARP) fwht64(qs + 64 * c);           \
            __syncwarp();                                                                          \
        }                                                                                          \
        for (int d = lane; d < head_dim; d += WARP) out[((i64)t * n_head + h) * head_dim + d] = qs[d]; \
    }

__device__ __forceinline__ i64 sizeof_row_f32(int width) { return (i64)width * 4; }
__device__ __forceinline__ i64 sizeof_row_f16(int width) { return (i64)width * 2; }
__device__ __forceinline__ i64 sizeof_row_q8_0(int width) { return (i64)(width / 32) * BS_Q8_0; }

ATTN(f32)
ATTN(f16)
ATTN(q8_0)
