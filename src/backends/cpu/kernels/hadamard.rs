//! The orthonormal Walsh-Hadamard rotation that llama.cpp applies to Q, K and V when the KV
//! cache is quantized (`attn_rot_k` / `attn_rot_v`, on by default).
//!
//! Qwen2's keys carry a few huge components (bias outliers over 100). A Q8_0 block that holds
//! one quantizes its other 31 values with a step near 1, which wrecks the scores: without the
//! rotation, llama.cpp's own q8_0 cache turns "The capital of France is Paris" into "... is
//! the capital of the country" (`LLAMA_ATTN_ROT_DISABLE=1`), and so did minfer's. The
//! rotation spreads every 64-value chunk of a head evenly, and since `H` is orthonormal and
//! symmetric (`H·H = I`), `(Hq)·(Hk) = q·k`, and `H` applied to `Σ p·Hv` gives back `Σ p·v`.
//!
//! `H` is Sylvester's matrix over 64 values scaled by 1/8 (llama.cpp's `ggml_gen_hadamard`),
//! applied to each 64-value chunk of a head when `head_dim` is a multiple of 64. llama.cpp
//! rotates K in chunks of the largest power of two dividing `head_dim` (128 for 128-value
//! heads); any orthonormal chunking keeps the dot products, so minfer uses 64 for K and V.

/// Rotation chunk.
pub const ROT: usize = 64;

/// Whether heads of `head_dim` values are rotated.
pub const fn rotates(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(ROT)
}

/// `x ← H x` for one chunk of [`ROT`] values (fast Walsh-Hadamard transform, normalized).
fn fwht(x: &mut [f32]) {
    let mut h = 1;
    while h < ROT {
        for i in (0..ROT).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let s = 1.0 / (ROT as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= s);
}

/// Rotates every head of rows of heads of `head_dim` values (a no-op when heads are not a
/// multiple of 64). Its own inverse.
pub fn rotate_heads(x: &mut [f32], head_dim: usize) {
    if rotates(head_dim) {
        x.chunks_exact_mut(ROT).for_each(fwht);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `H[i][j] = (-1)^popcount(i & j) / 8`, as `ggml_gen_hadamard` builds it.
    fn matrix_product(x: &[f32]) -> Vec<f32> {
        (0..ROT)
            .map(|i| (0..ROT).map(|j| if (i & j).count_ones() % 2 == 0 { x[j] } else { -x[j] }).sum::<f32>() / 8.0)
            .collect()
    }

    #[test]
    fn equals_the_matrix_keeps_dots_and_inverts_itself() {
        let x = crate::backends::cpu::kernels::test_data(128, 5, 1, 3.0);
        let y = crate::backends::cpu::kernels::test_data(128, 6, 2, 3.0);
        let (mut rx, mut ry) = (x.clone(), y.clone());
        rotate_heads(&mut rx, 128);
        rotate_heads(&mut ry, 128);
        let want = matrix_product(&x[..64]);
        assert!(rx[..64].iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5));
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&x, &y) - dot(&rx, &ry)).abs() < 1e-3);
        rotate_heads(&mut rx, 128);
        assert!(rx.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5));
        let mut z = x.clone();
        rotate_heads(&mut z, 96);
        assert_eq!(z, x);
    }
}
