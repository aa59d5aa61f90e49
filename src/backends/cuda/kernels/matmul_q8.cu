// The matmul of quantized weights by 8-bit activations, as ggml's CPU dots compute it: the
// activations are quantized first, per token, in the block each weight type pairs with
// (vec_dot_type), then every weight row is dotted with them in integers, scaled per block.
//
// * 32-value blocks (for Q4_0, Q5_0, Q8_0 as Q8_0; for Q4_1, Q5_1 as Q8_1): d = amax / 127
//   rounded to f16, q = rint(x * 127 / amax) (ggml's x86 quantize_row_q8_0/1, ties to even);
//   Q8_1 also keeps s = f16(d * sum(q)). Stored as qs [nt][k] (i8) and ds [nt][k/32] (d, s).
// * 256-value blocks (for the K-quants, Q8_K): the value of largest magnitude max (first on
//   ties) maps to -127: iscale = -127 / max, q = min(127, rint(iscale * x)), d = 1 / iscale
//   (ggml's quantize_row_q8_K_ref). Stored as qs [nt][k] and ds [nt][k/256] (d, 0).
//
// The dot: one warp per (row, tile of up to TILE_T tokens), lanes striding over blocks
// (32-value types) or 16-value groups (K-quants), each weight block decoded once per tile, the
// per-lane sums reduced by a warp sum per token.
#include "quants.cuh"

// One thread per 32-value block of `x` [n_tokens][n_cols].
extern "C" __global__ void quantize_q8_32(const float *x, i8 *qs, float *ds, int n_cols, int n_tokens) {
    const i64 n_blocks = (i64)n_tokens * (n_cols / 32);
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n_blocks; i += (i64)gridDim.x * blockDim.x) {
        const float *v = x + i * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            int q = (int)rintf(v[j] * id);
            q = q < -128 ? -128 : (q > 127 ? 127 : q);
            qs[i * 32 + j] = (i8)q;
            sum += q;
        }
        ds[2 * i] = f16_to_f32(f32_to_f16(d));
        ds[2 * i + 1] = f16_to_f32(f32_to_f16(d * (float)sum));
    }
}

// One thread per 256-value block.
extern "C" __global__ void quantize_q8_k(const float *x, i8 *qs, float *ds, int n_cols, int n_tokens) {
    const i64 n_blocks = (i64)n_tokens * (n_cols / 256);
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n_blocks; i += (i64)gridDim.x * blockDim.x) {
        const float *v = x + i * 256;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; ++j) {
            if (fabsf(v[j]) > amax) {
                amax = fabsf(v[j]);
                max = v[j];
            }
        }
        if (amax == 0.0f) {
            for (int j = 0; j < 256; ++j) qs[i * 256 + j] = 0;
            ds[2 * i] = 0.0f;
            ds[2 * i + 1] = 0.0f;
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < 256; ++j) {
            const int q = (int)rintf(iscale * v[j]);
            qs[i * 256 + j] = (i8)(q < 127 ? q : 127);
        }
        ds[2 * i] = 1.0f / iscale;
        ds[2 * i + 1] = 0.0f;
    }
}

// Tokens per warp: a warp decodes each weight block once and dots it with the activations of
// up to TILE_T tokens (the prefill's weight reuse). Every (row, token) is summed by the same
// instructions in the same order whatever the tile holds, so a decode (one token) and a
// prefill give the same bits.
#define TILE_T 8

// A lane's share of the dots of one row with a tile of `nt` tokens (xq, xd at the tile's first
// token), into s[0..TILE_T]. 32-value types: per block, a * d * sum((q_w - O) * q_x) +
// b * (S ? s : d * sum(q_x)). O is the type's integer offset, folded into the integer sum as
// ggml's dots do (Q4_0: 8, Q5_0: 16; its b is then not used); S says the pair is Q8_1 (the
// float offset b uses the activation block's stored s, as ggml's q4_1/q5_1 dots do).
#define LANE_DOTS_32(T, S, O)                                                                        \
    __device__ __forceinline__ void lane_dots_##T(const u8 *row, const i8 *xq, const float *xd,      \
                                                  int n_cols, int nt, int lane, float *s) {          \
        const int nb = n_cols / 32;                                                                  \
        for (int blk = lane; blk < nb; blk += WARP) {                                                \
            int qw[32];                                                                              \
            for (int j = 0; j < 32; ++j) qw[j] = qi_##T(row, 32 * blk + j);                          \
            float a, b;                                                                              \
            ab_##T(row, 2 * blk, &a, &b);                                                            \
            _Pragma("unroll") for (int tt = 0; tt < TILE_T; ++tt) {                                  \
                if (tt >= nt) break;                                                                 \
                const i8 *xt = xq + (i64)tt * n_cols + 32 * blk;                                     \
                const float *dt = xd + ((i64)tt * nb + blk) * 2;                                     \
                int sumi = 0, sumx = 0;                                                              \
                for (int j = 0; j < 32; ++j) {                                                       \
                    sumi += qw[j] * xt[j];                                                           \
                    sumx += xt[j];                                                                   \
                }                                                                                    \
                if (O) s[tt] += a * dt[0] * (float)(sumi - O * sumx);                                \
                else s[tt] += a * dt[0] * (float)sumi + b * (S ? dt[1] : dt[0] * (float)sumx);       \
            }                                                                                        \
        }                                                                                            \
    }

// K-quants: per 16-value group, d_x * (a * sum((q_w - O) * q_x) + b * sum(q_x)), O folded
// into the integer sum where the type has one (Q6_K: 32; its b is then not used).
#define LANE_DOTS_K(T, O)                                                                            \
    __device__ __forceinline__ void lane_dots_##T(const u8 *row, const i8 *xq, const float *xd,      \
                                                  int n_cols, int nt, int lane, float *s) {          \
        const int nb = n_cols / 256;                                                                 \
        for (int g = lane; g < n_cols / 16; g += WARP) {                                             \
            int qw[16];                                                                              \
            for (int j = 0; j < 16; ++j) qw[j] = qi_##T(row, 16 * g + j);                            \
            float a, b;                                                                              \
            ab_##T(row, g, &a, &b);                                                                  \
            _Pragma("unroll") for (int tt = 0; tt < TILE_T; ++tt) {                                  \
                if (tt >= nt) break;                                                                 \
                const i8 *xt = xq + (i64)tt * n_cols + 16 * g;                                       \
                int sumi = 0, sumx = 0;                                                              \
                for (int j = 0; j < 16; ++j) {                                                       \
                    sumi += qw[j] * xt[j];                                                           \
                    sumx += xt[j];                                                                   \
                }                                                                                    \
                const float dx = xd[((i64)tt * nb + g / 16) * 2];                                    \
                if (O) s[tt] += dx * (a * (float)(sumi - O * sumx));                                 \
                else s[tt] += dx * (a * (float)sumi + b * (float)sumx);                              \
            }                                                                                        \
        }                                                                                            \
    }

// The kernel of type T whose activations come in blocks of B values: one warp per (row, tile of
// TILE_T tokens).
#define MATMUL_Q8(T, B)                                                                              \
    extern "C" __global__ void matmul_q8_##T(const u8 *w, const i8 *xq, const float *xd,             \
                                             const float *bias, float *y, int n_rows, int n_cols,    \
                                             int n_tokens, i64 row_bytes) {                          \
        const int warps = blockDim.x / WARP;                                                         \
        const i64 item = (i64)blockIdx.x * warps + threadIdx.x / WARP;                               \
        const int n_tiles = (n_tokens + TILE_T - 1) / TILE_T;                                        \
        if (item >= (i64)n_rows * n_tiles) return;                                                   \
        const int r = item % n_rows, t0 = (item / n_rows) * TILE_T;                                  \
        const int nt = min(TILE_T, n_tokens - t0);                                                   \
        float s[TILE_T];                                                                             \
        _Pragma("unroll") for (int tt = 0; tt < TILE_T; ++tt) s[tt] = 0.0f;                          \
        lane_dots_##T(w + (i64)r * row_bytes, xq + (i64)t0 * n_cols, xd + (i64)t0 * (n_cols / B) * 2, \
                      n_cols, nt, threadIdx.x % WARP, s);                                            \
        _Pragma("unroll") for (int tt = 0; tt < TILE_T; ++tt) {                                      \
            if (tt >= nt) break; /* nt is the warp's: every lane leaves together */                  \
            const float v = warp_sum(s[tt]);                                                         \
            if (threadIdx.x % WARP == 0)                                                             \
                y[(i64)(t0 + tt) * n_rows + r] = v + (bias ? bias[r] : 0.0f);                        \
        }                                                                                            \
    }

LANE_DOTS_32(q4_0, 0, 8)
LANE_DOTS_32(q4_1, 1, 0)
LANE_DOTS_32(q5_0, 0, 16)
LANE_DOTS_32(q5_1, 1, 0)
LANE_DOTS_32(q8_0, 0, 0)
LANE_DOTS_K(q2_k, 0)
LANE_DOTS_K(q3_k, 0)
LANE_DOTS_K(q4_k, 0)
LANE_DOTS_K(q5_k, 0)
LANE_DOTS_K(q6_k, 32)

MATMUL_Q8(q4_0, 32)
MATMUL_Q8(q4_1, 32)
MATMUL_Q8(q5_0, 32)
MATMUL_Q8(q5_1, 32)
MATMUL_Q8(q8_0, 32)
MATMUL_Q8(q2_k, 256)
MATMUL_Q8(q3_k, 256)
MATMUL_Q8(q4_k, 256)
MATMUL_Q8(q5_k, 256)
MATMUL_Q8(q6_k, 256)
