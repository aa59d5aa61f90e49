//! The per-row arithmetic of llama.cpp's *repacked* single-token matrix product, for the weight
//! types its x86 CPU backend repacks.
//!
//! # Why this exists
//!
//! llama.cpp loads some weight matrices into its `CPU_REPACK` buffer
//! (`ggml-cpu/repack.cpp`, `ggml_repack_get_optimal_repack_type`): on any CPU with AVX2, a
//! **Q4_0** or **Q4_K** matrix (and, in a build with AVX-512, a **Q2_K** one) whose row count
//! (`ne[1]`, the output features) is a multiple of 8
//! is interleaved 8 rows at a time (`block_q4_0x8`, `block_q4_Kx8`), and `ggml_mul_mat` on it
//! runs `ggml_gemv_q4_0_8x8_q8_0` / `ggml_gemv_q4_K_8x8_q8_K` (`arch/x86/repack.cpp`) for a
//! single token instead of `ggml_vec_dot_*`. The activations are quantized by the same
//! `from_float` (`quantize_row_q8_0` / `quantize_row_q8_K`), but the float arithmetic is not
//! `vec_dot`'s: each of the 8 float lanes is one output row, and per block the row's *whole*
//! integer dot is converted once and added with one FMA:
//!
//! * Q4_0 (`gemv_q4_b32_8x8_q8_0_lut_avx`): per 32-value block,
//!   `acc = fma(f32(Σ q_w q_a), d_w * d_a, acc)`; the result is `acc`.
//! * Q2_K (`ggml_gemv_q2_K_8x8_q8_K`, repacked only where the build has AVX-512): per
//!   super-block `acc = fma(f32(Σ_k sc_k Σ q_w q_a), d_w * d_a, acc)` and
//!   `acc_min = fma(f32(Σ_k m_k bsums_k), dmin_w * d_a, acc_min)` over its 16 sub-blocks of
//!   16; the result is `acc - acc_min`.
//! * Q4_K (`ggml_gemv_q4_K_8x8_q8_K`): per 256-value super-block,
//!   `acc = fma(f32(Σ_j sc_j Σ q_w q_a), d_w * d_a, acc)` and
//!   `acc_min = fma(f32(Σ_j m_j bsum_j), dmin_w * d_a, acc_min)` (`bsum_j` the sum of the 32
//!   activation quants of sub-block `j`); the result is `acc - acc_min`.
//!
//! `vec_dot` instead spreads each block over 8 lanes and sums them at the end, so the two
//! differ in the last bits of most outputs — which then flip the rounding of a later
//! activation quantization now and then. Every sum here is an exact integer (checked against
//! the SIMD code's i16/i32 ranges: Q8_0/Q8_K quants of finite input stay within ±127), so
//! only the float steps above decide the result, and [`gemv_q4_0`] / [`gemv_q4_k`] are
//! bit-identical to ggml's AVX2 and AVX-512 gemv (and to minfer's SIMD twins in
//! `simd/x86_*.rs`).
//!
//! ggml's own scalar fallbacks (`ggml_gemv_*_generic`) and its ARM repacks sum in other orders;
//! minfer follows the x86 build the reference data comes from.

use super::blocks::{BlockQ2K, BlockQ4_0, BlockQ4K, BlockQ8_0, BlockQ8K};

/// Rows llama.cpp's x86 backend interleaves when it repacks Q4_0, Q4_K and Q2_K: a matrix is repacked
/// (and multiplied by the gemv) when its row count is a multiple of this.
pub const REPACK_ROWS: usize = 8;

/// One row of `ggml_gemv_q4_0_8x8_q8_0` (x86): `acc = fma(f32(isum), d_w * d_a, acc)` per block.
pub fn gemv_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    w.iter().zip(a).fold(0.0f32, |acc, (x, y)| {
        let isum: i32 = x
            .quants()
            .iter()
            .zip(&y.qs)
            .map(|(&q, &v)| i32::from(q) * i32::from(v))
            .sum();
        (isum as f32).mul_add(x.d.to_f32() * y.d.to_f32(), acc)
    })
}

/// The two integers of a Q4_K super-block in `ggml_gemv_q4_K_8x8_q8_K`:
/// `(Σ_j sc_j Σ_i q_w q_a, Σ_j m_j bsum_j)` over its 8 sub-blocks of 32.
pub fn q4_k_block_sums(x: &BlockQ4K, y: &BlockQ8K) -> (i32, i32) {
    let (sc, m) = x.scales_mins();
    let q = x.quants();
    let mut dot = 0i32;
    let mut min = 0i32;
    for j in 0..8 {
        let s: i32 = q[32 * j..32 * j + 32]
            .iter()
            .zip(&y.qs[32 * j..32 * j + 32])
            .map(|(&q, &v)| i32::from(q) * i32::from(v))
            .sum();
        dot += i32::from(sc[j]) * s;
        let bsum = i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]);
        min += i32::from(m[j]) * bsum;
    }
    (dot, min)
}

/// One row of `ggml_gemv_q4_K_8x8_q8_K` (x86): per super-block
/// `acc = fma(f32(dot), d_w * d_a, acc)`, `acc_min = fma(f32(min), dmin_w * d_a, acc_min)`;
/// the result is `acc - acc_min`.
pub fn gemv_q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (x, y) in w.iter().zip(a) {
        let (dot, min) = q4_k_block_sums(x, y);
        acc = (dot as f32).mul_add(x.d.to_f32() * y.d, acc);
        acc_min = (min as f32).mul_add(x.dmin.to_f32() * y.d, acc_min);
    }
    acc - acc_min
}

/// The two integers of a Q2_K super-block in `ggml_gemv_q2_K_8x8_q8_K`:
/// `(Σ_k sc_k Σ_i q_w q_a, Σ_k m_k bsums_k)` over its 16 sub-blocks of 16.
pub fn q2_k_block_sums(x: &BlockQ2K, y: &BlockQ8K) -> (i32, i32) {
    let q = x.quants();
    let mut dot = 0i32;
    let mut min = 0i32;
    for k in 0..16 {
        let s: i32 = q[16 * k..16 * k + 16]
            .iter()
            .zip(&y.qs[16 * k..16 * k + 16])
            .map(|(&q, &v)| i32::from(q) * i32::from(v))
            .sum();
        dot += i32::from(x.scale(k)) * s;
        min += i32::from(x.min(k)) * i32::from(y.bsums[k]);
    }
    (dot, min)
}

/// One row of `ggml_gemv_q2_K_8x8_q8_K` (x86): per super-block
/// `acc = fma(f32(dot), d_w*d_a, acc)`, `acc_min = fma(f32(min), dmin_w*d_a, acc_min)`;
/// the result is `acc - acc_min`.
pub fn gemv_q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (x, y) in w.iter().zip(a) {
        let (dot, min) = q2_k_block_sums(x, y);
        acc = (dot as f32).mul_add(x.d.to_f32() * y.d, acc);
        acc_min = (min as f32).mul_add(x.dmin.to_f32() * y.d, acc_min);
    }
    acc - acc_min
}
