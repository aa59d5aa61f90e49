//! RMS normalization, as llama.cpp composes it: ggml's `rms_norm` followed by a separate `mul`
//! by the weight.
//!
//! Per row of `d` values, exactly as `ggml_compute_forward_rms_norm_f32`: the squares are
//! rounded to f32 and summed in f64 in index order; `mean = (float)(sum / d)`;
//! `scale = 1.0f / sqrtf(mean + eps)`; `y = x * scale` (rounded), then `y * w` (rounded again:
//! two roundings, whether ggml runs the two ops apart or fused, `x*scale*w` being evaluated
//! left to right). Bit-identical to ggml on every CPU; no SIMD is needed (the per-element
//! products vectorize by themselves, and the f64 sum is sequential in ggml too).

use super::error::{OpsError, check_len, rows_of};

/// `out = rms_norm(x) * weight` over rows of `d` values (`weight` of `d` values, or none).
// [d, nt] feature-major, token-major memory
pub fn rms_norm(
    x: &[f32],
    weight: Option<&[f32]>,
    d: usize,
    eps: f32,
    out: &mut [f32],
) -> Result<(), OpsError> {
    rows_of("rms_norm input", x.len(), d)?;
    check_len("rms_norm output", x.len(), out.len())?;
    if let Some(w) = weight {
        check_len("rms_norm weight", d, w.len())?;
    }
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let scale = row_scale(xr, eps);
        for (y, &v) in yr.iter_mut().zip(xr) {
            *y = v * scale;
        }
        if let Some(w) = weight {
            for (y, &wi) in yr.iter_mut().zip(w) {
                *y *= wi;
            }
        }
    }
    Ok(())
}

/// [`rms_norm`] in place.
pub fn rms_norm_inplace(
    x: &mut [f32],
    weight: Option<&[f32]>,
    d: usize,
    eps: f32,
) -> Result<(), OpsError> {
    rows_of("rms_norm input", x.len(), d)?;
    if let Some(w) = weight {
        check_len("rms_norm weight", d, w.len())?;
    }
    for xr in x.chunks_exact_mut(d) {
        let scale = row_scale(xr, eps);
        for v in xr.iter_mut() {
            *v *= scale;
        }
        if let Some(w) = weight {
            for (v, &wi) in xr.iter_mut().zip(w) {
                *v *= wi;
            }
        }
    }
    Ok(())
}

/// Qwen3's per-head Q/K norm: [`rms_norm`] of every head of `head_dim` values with the
/// `head_dim` weights, treating `[nt][n_head * head_dim]` as `[nt * n_head][head_dim]`.
pub fn qk_norm(
    x: &[f32],
    weight: &[f32],
    head_dim: usize,
    eps: f32,
    out: &mut [f32],
) -> Result<(), OpsError> {
    rms_norm(x, Some(weight), head_dim, eps, out)
}

/// [`qk_norm`] in place.
pub fn qk_norm_inplace(
    x: &mut [f32],
    weight: &[f32],
    head_dim: usize,
    eps: f32,
) -> Result<(), OpsError> {
    rms_norm_inplace(x, Some(weight), head_dim, eps)
}

/// `1.0f / sqrtf((float)(Σ (double)(x*x) / d) + eps)`.
fn row_scale(x: &[f32], eps: f32) -> f32 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_row() {
        // Row [3, 4]: sum 25, mean 12.5, eps 0.5 -> scale = 1/sqrt(13).
        let mut out = [0.0; 4];
        rms_norm(&[3.0, 4.0, 0.0, 0.0], Some(&[2.0, 0.5]), 2, 0.5, &mut out).unwrap();
        let s = 1.0f32 / 13.0f32.sqrt();
        assert_eq!(out, [3.0 * s * 2.0, 4.0 * s * 0.5, 0.0, 0.0]);
        let mut x = [3.0, 4.0, 0.0, 0.0];
        rms_norm_inplace(&mut x, None, 2, 0.5).unwrap();
        assert_eq!(x, [3.0 * s, 4.0 * s, 0.0, 0.0]);
    }

    #[test]
    fn errors() {
        let mut out = [0.0; 4];
        assert!(matches!(
            rms_norm(&[1.0; 4], None, 3, 1e-6, &mut out),
            Err(OpsError::Ragged { .. })
        ));
        assert!(matches!(
            rms_norm(&[1.0; 4], Some(&[1.0; 3]), 2, 1e-6, &mut out),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            rms_norm(&[1.0; 4], None, 2, 1e-6, &mut out[..2]),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            qk_norm_inplace(&mut [1.0; 4], &[1.0; 2], 0, 1e-6),
            Err(OpsError::BadDim { .. })
        ));
    }
}
