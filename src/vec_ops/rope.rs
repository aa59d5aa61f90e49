//! Rotary position embedding, NeoX style (Qwen2/Qwen3), as ggml's `rope_ext` computes it with
//! `n_rot = head_dim`, no YaRN (`ext_factor` 0), `freq_scale` 1 and `attn_factor` 1.
//!
//! The cos/sin table of a token follows `ggml_rope_cache_init`: `theta` starts at the
//! position (converted to f32) and is multiplied by `theta_scale = powf(freq_base,
//! -2.0f/head_dim)` after each pair, iteratively (not one `powf` per dimension); each pair
//! stores `cosf(theta)`, `sinf(theta)` (the C library's, which Rust's `f32::cos`/`sin` call
//! on Linux as ggml does). Pair `i` rotates `x[i]` with `x[i + head_dim/2]`.
//!
//! A [`RopeCache`] holds the tables of a batch's positions, so Q and K (and every layer) share
//! them; the table of a token depends only on its position, so a token gets the same bits in
//! any batch.

use super::error::{OpsError, check_len, rows_of};

/// The cos/sin tables of a batch of positions for one head size and frequency base.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeCache {
    head_dim: usize,
    /// `[nt][head_dim / 2]` pairs of (cos, sin).
    cos_sin: Vec<[f32; 2]>,
}

impl RopeCache {
    /// The tables for `positions` (one per token). `head_dim` must be even and positive.
    pub fn new(positions: &[i32], head_dim: usize, freq_base: f32) -> Result<RopeCache, OpsError> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(OpsError::BadDim {
                what: "head_dim",
                value: head_dim,
                why: "RoPE needs an even, positive head size",
            });
        }
        let half = head_dim / 2;
        let theta_scale = theta_scale(freq_base, head_dim);
        let mut cos_sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            let mut theta = p as f32;
            for _ in 0..half {
                cos_sin.push([theta.cos(), theta.sin()]);
                theta *= theta_scale;
            }
        }
        Ok(RopeCache { head_dim, cos_sin })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The number of tokens (positions) covered.
    pub fn n_tokens(&self) -> usize {
        self.cos_sin.len() / (self.head_dim / 2)
    }

    /// Token `t`'s `head_dim / 2` (cos, sin) pairs.
    pub fn token(&self, t: usize) -> &[[f32; 2]] {
        let half = self.head_dim / 2;
        &self.cos_sin[t * half..(t + 1) * half]
    }

    /// Rotates `x`, `[nt][n_head * head_dim]`, in place with the tables of its tokens.
    // [n_head*head_dim, nt] feature-major, token-major memory
    pub fn apply(&self, x: &mut [f32], n_head: usize) -> Result<(), OpsError> {
        let hd = self.head_dim;
        let nt = self.n_tokens();
        let width = n_head * hd;
        check_len("rope input", nt * width, x.len())?;
        if width == 0 {
            return Ok(());
        }
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            let cs = self.token(t);
            for head in row.chunks_exact_mut(hd) {
                rotate_neox(head, cs);
            }
        }
        Ok(())
    }
}

/// `powf(freq_base, -2.0f / n_dims)`, the ratio of successive pair frequencies.
pub fn theta_scale(freq_base: f32, n_dims: usize) -> f32 {
    freq_base.powf(-2.0 / n_dims as f32)
}

/// NeoX RoPE in place on `x`, `[nt][n_head * head_dim]`, for the tokens at `positions`.
/// (To rotate Q and K of the same batch, build one [`RopeCache`] and `apply` it twice.)
// [n_head*head_dim, nt] feature-major, token-major memory
pub fn rope_neox(
    x: &mut [f32],
    positions: &[i32],
    n_head: usize,
    head_dim: usize,
    freq_base: f32,
) -> Result<(), OpsError> {
    let cache = RopeCache::new(positions, head_dim, freq_base)?;
    rows_of(
        "rope input (rows of n_head*head_dim)",
        x.len(),
        (n_head * head_dim).max(1),
    )?;
    cache.apply(x, n_head)
}

/// One head: `(x[i], x[i+h]) <- (x[i] cos - x[i+h] sin, x[i] sin + x[i+h] cos)`, `h` = half,
/// each as ggml's `rotate_pairs` compiles under GCC's `-ffp-contract=fast` (see `rot`).
fn rotate_neox(head: &mut [f32], cs: &[[f32; 2]]) {
    let half = head.len() / 2;
    let (lo, hi) = head.split_at_mut(half);
    for ((a, b), &[c, s]) in lo.iter_mut().zip(hi.iter_mut()).zip(cs) {
        let (x0, x1) = (*a, *b);
        let (y0, y1) = rot(x0, x1, c, s);
        *a = y0;
        *b = y1;
    }
}

/// `x0*c - x1*s` and `x0*s + x1*c`, GCC's contraction: the first product of each expression
/// fused with the rounded second one.
#[inline(always)]
fn rot(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_errors() {
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let orig = x.clone();
        rope_neox(&mut x, &[0, 0], 2, 4, 10000.0).unwrap();
        assert_eq!(x, orig);
        assert!(matches!(
            rope_neox(&mut x, &[0], 2, 3, 1e4),
            Err(OpsError::BadDim { .. })
        ));
        assert!(matches!(
            rope_neox(&mut x, &[0, 1, 2], 2, 4, 1e4),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            rope_neox(&mut x, &[0, 1], 3, 4, 1e4),
            Err(OpsError::Ragged { .. })
        ));
    }

    #[test]
    fn theta_is_iterative() {
        let c = RopeCache::new(&[7], 8, 10000.0).unwrap();
        let ts = theta_scale(10000.0, 8);
        let mut theta = 7.0f32;
        for pair in c.token(0) {
            assert_eq!(pair[0].to_bits(), theta.cos().to_bits());
            assert_eq!(pair[1].to_bits(), theta.sin().to_bits());
            theta *= ts;
        }
    }
}
