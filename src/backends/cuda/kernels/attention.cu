// Grouped-query attention, split over the KV cells (flash-decoding): the cells of a token are
// cut into splits of `chunk` cells at fixed offsets (split s holds cells s*chunk ..
// (s+1)*chunk), one warp per (token, head, split) runs an online softmax over its cells, and
// a combine pass merges the splits of each (token, head) in split order. The split boundaries
// depend on n_ctx only, never on how many tokens are evaluated together, so a token's output is
// the same in a prefill and in a decode step. A long context keeps the whole GPU busy for one
// query: its splits run in parallel.
//
// Within a split, lanes own head dims (d = lane + 32i); K and V are read in their storage type
// (f32, f16 or packed Q8_0 rows). For rotated Q8_0 caches the query is rotated by the same
// Walsh-Hadamard chunks as K, and the combined output is rotated back (H is its own inverse).
// A sliding window (`window` > 0) leaves out the cells before `pos - window + 1`: the splits
// that hold none of the rest are empty. head_dim <= 256. A position outside 0..n_ctx attends nothing and gives NaNs (0 / 0), never a
// read outside the region.
//
// Sequences sharing the regions: token t's K and V are at cell cells[t], so its sequence's cells
// start at cells[t] - pos[t], and it attends those, positions 0..=pos[t] (`cells` is `pos`
// itself when one sequence owns the regions). Splits are in positions, so a token's splits are
// the same wherever its sequence's cells start.
//
// Partials: part[((t * n_head + h) * n_splits + s) * (head_dim + 2)] = running max, running sum,
// then head_dim unnormalized accumulators.
#include "quants.cuh"
#include "hadamard.cuh"

#define MAX_HD 256
#define PER_LANE (MAX_HD / WARP)
#define ATTN_WARPS 4

__device__ __forceinline__ i64 sizeof_row_f32(int width) { return (i64)width * 4; }
__device__ __forceinline__ i64 sizeof_row_f16(int width) { return (i64)width * 2; }
__device__ __forceinline__ i64 sizeof_row_q8_0(int width) { return (i64)(width / 32) * BS_Q8_0; }

#define ATTN_SPLIT(T)                                                                              \
    extern "C" __global__ void attn_split_##T(const float *q, const u8 *k, const u8 *v, const i32 *pos, \
                                              const i32 *cells, float *part, int n_tokens, int n_head, int n_head_kv,  \
                                              int head_dim, float scale, i64 q_stride, int rotate,   \
                                              int n_ctx, int chunk, int n_splits, int window) {      \
        __shared__ float qs_all[ATTN_WARPS][MAX_HD];                                               \
        const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;                            \
        const i64 item = (i64)blockIdx.x * ATTN_WARPS + warp;                                      \
        if (item >= (i64)n_tokens * n_head * n_splits) return;                                     \
        float *qs = qs_all[warp];                                                                  \
        const int s = item % n_splits;                                                             \
        const i64 th = item / n_splits;                                                            \
        const int t = th / n_head, h = th % n_head;                                                \
        const int hk = h / (n_head / n_head_kv);                                                   \
        const int width = n_head_kv * head_dim;                                                    \
        const i64 row_bytes = sizeof_row_##T(width);                                               \
        float *p = part + item * (head_dim + 2);                                                   \
        const i64 start = (i64)cells[t] - pos[t];                                                  \
        const int n_cells = pos[t] >= 0 && start >= 0 && cells[t] < n_ctx ? pos[t] + 1 : 0;        \
        const int first = window > 0 ? max(0, n_cells - window) : 0;                               \
        const int lo = max(s * chunk, first), hi = min(n_cells, s * chunk + chunk);                \
        if (hi <= lo) {                                                                            \
            if (lane == 0) {                                                                       \
                p[0] = NEG_INF;                                                                    \
                p[1] = 0.0f;                                                                       \
            }                                                                                      \
            for (int d = lane; d < head_dim; d += WARP) p[2 + d] = 0.0f;                           \
            return;                                                                                \
        }                                                                                          \
        for (int d = lane; d < head_dim; d += WARP) qs[d] = q[(i64)t * q_stride + h * head_dim + d]; \
        __syncwarp();                                                                              \
        if (rotate) {                                                                              \
            for (int c = lane; c < head_dim / 64; c += WARP) fwht64(qs + 64 * c);                  \
            __syncwarp();                                                                          \
        }                                                                                          \
        float acc[PER_LANE];                                                                       \
        for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.0f;                                          \
        float m = NEG_INF, l = 0.0f;                                                               \
        for (int j = lo; j < hi; ++j) {                                                            \
            const u8 *krow = k + (start + j) * row_bytes;                                          \
            float sc = 0.0f;                                                                       \
            for (int d = lane; d < head_dim; d += WARP) sc += qs[d] * dq_##T(krow, hk * head_dim + d); \
            sc = warp_sum(sc) * scale;                                                             \
            const float m_new = fmaxf(m, sc);                                                      \
            const float corr = expf(m - m_new), e = expf(sc - m_new);                              \
            l = l * corr + e;                                                                      \
            const u8 *vrow = v + (start + j) * row_bytes;                                          \
            for (int i = 0, d = lane; d < head_dim; ++i, d += WARP)                                \
                acc[i] = acc[i] * corr + e * dq_##T(vrow, hk * head_dim + d);                      \
            m = m_new;                                                                             \
        }                                                                                          \
        if (lane == 0) {                                                                           \
            p[0] = m;                                                                              \
            p[1] = l;                                                                              \
        }                                                                                          \
        for (int i = 0, d = lane; d < head_dim; ++i, d += WARP) p[2 + d] = acc[i];                 \
    }

ATTN_SPLIT(f32)
ATTN_SPLIT(f16)
ATTN_SPLIT(q8_0)

// One warp per (token, head): the splits merged in order, normalized, rotated back when the
// cache is rotated, written to out[t][h * head_dim ..].
extern "C" __global__ void attn_combine(const float *part, float *out, int n_tokens, int n_head, int head_dim,
                                        int n_splits, int rotate) {
    __shared__ float os_all[ATTN_WARPS][MAX_HD];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const i64 th = (i64)blockIdx.x * ATTN_WARPS + warp;
    if (th >= (i64)n_tokens * n_head) return;
    float *os = os_all[warp];
    const float *p = part + th * n_splits * (head_dim + 2);
    // The largest split maximum; a NaN one (a NaN score) wins, so it reaches the output as on
    // the CPU. An empty split's maximum is -inf and it weighs nothing.
    float m = NEG_INF;
    for (int s = 0; s < n_splits; ++s) {
        const float x = p[s * (head_dim + 2)];
        if (x > m || x != x) m = x;
        if (m != m) break;
    }
    float l = 0.0f;
    float acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
        const float *ps = p + s * (head_dim + 2);
        const float w = ps[0] == NEG_INF ? 0.0f : expf(ps[0] - m);
        l += w * ps[1];
        for (int i = 0, d = lane; d < head_dim; ++i, d += WARP) acc[i] += w * ps[2 + d];
    }
    for (int i = 0, d = lane; d < head_dim; ++i, d += WARP) os[d] = acc[i] / l;
    __syncwarp();
    if (rotate) {
        for (int c = lane; c < head_dim / 64; c += WARP) fwht64(os + 64 * c);
        __syncwarp();
    }
    for (int d = lane; d < head_dim; d += WARP) out[th * head_dim + d] = os[d];
}
