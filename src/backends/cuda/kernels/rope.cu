// Rotary embedding as ggml's rope_ext without YaRN: for token t at position p, pair i of a head
// rotates by theta_i = p * freq_base^(-2i / n_rot), computed iteratively like
// ggml_rope_cache_init (theta *= theta_scale per pair). Styles: NeoX pairs (x[i], x[i+n_rot/2]),
// normal pairs (x[2i], x[2i+1]); dims n_rot..head_dim pass through. One thread per pair.
// In place is allowed (x == out).
#include "prelude.cuh"

extern "C" __global__ void rope_f32(const float *x, float *out, const i32 *pos, int n_tokens, int n_head,
                                    int head_dim, int n_rot, float theta_scale, int neox) {
    const int half = n_rot / 2;
    const i64 total = (i64)n_tokens * n_head * half;
    for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        const int i = idx % half;
        const i64 th = idx / half;              // token * n_head + head
        const int t = th / n_head;
        float theta = (float)pos[t];
        for (int k = 0; k < i; ++k) theta *= theta_scale;
        const float c = cosf(theta), s = sinf(theta);
        const i64 base = th * head_dim;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = x[base + i0], x1 = x[base + i1];
        out[base + i0] = x0 * c - x1 * s;
        out[base + i1] = x0 * s + x1 * c;
    }
    if (x != out) {
        const int pass = head_dim - n_rot;
        const i64 rest = (i64)n_tokens * n_head * pass;
        for (i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x; idx < rest; idx += (i64)gridDim.x * blockDim.x) {
            const i64 th = idx / pass;
            const i64 d = th * head_dim + n_rot + idx % pass;
            out[d] = x[d];
        }
    }
}
