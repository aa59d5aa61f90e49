//! Softmax as ggml's `soft_max_ext` computes it (llama.cpp's AVX-512 build).
//!
//! Per row: `w[i] = x[i] * scale`, plus the mask (0, or -inf for a masked entry); the max (a
//! plain running `MAX`); `y[i] = expf(w[i] - max)` with the sum of the `y` in f64, where the
//! whole 16-value blocks use the polynomial [`v_expf`] and add their
//! 16-lane sum (GCC's `_mm512_reduce_add_ps` tree, in f32) to the f64 sum block by block, and
//! the last `len % 16` values use libm's `expf`, one by one; finally `y[i] *= (float)(1/sum)`
//! with the reciprocal taken in f64.
//!
//! Attention rows are masked causally: llama.cpp's row spans the KV window (a multiple of 256
//! cells) with the cells past the query's position masked, so its masked tail only adds exact
//! zeros. [`soft_max_row`] with `n_valid` reproduces that from any row whose length is a
//! multiple of 16 (attention pads to one).

use super::error::{OpsError, check_len, rows_of};
use super::expf::v_expf;
use super::isa::{Isa, Kernels};

/// Softmax of each row of `d` values of `x * scale` (no mask), into `out`.
// [d, nt] feature-major, token-major memory
pub fn soft_max(x: &[f32], d: usize, scale: f32, out: &mut [f32]) -> Result<(), OpsError> {
    soft_max_with(Isa::detected(), x, d, scale, out)
}

/// [`soft_max`] with the kernels of `isa` (or the best supported below it); same result.
pub fn soft_max_with(
    isa: Isa,
    x: &[f32],
    d: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), OpsError> {
    rows_of("soft_max input", x.len(), d)?;
    check_len("soft_max output", x.len(), out.len())?;
    let k = isa.kernels();
    let mut w = vec![0.0f32; d];
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        for (wi, &xi) in w.iter_mut().zip(xr) {
            *wi = xi * scale;
        }
        normalize_k(k, &w, yr);
    }
    Ok(())
}

/// Softmax of one row with a causal bound: entries `0..n_valid` are `x[i] * scale` (plus the
/// mask's 0), entries from `n_valid` on are masked (-inf, so 0 in `out`).
pub fn soft_max_row(
    x: &[f32],
    scale: f32,
    n_valid: usize,
    out: &mut [f32],
) -> Result<(), OpsError> {
    soft_max_row_with(Isa::detected(), x, scale, n_valid, out)
}

/// [`soft_max_row`] with the kernels of `isa` (or the best supported below it); same result.
pub fn soft_max_row_with(
    isa: Isa,
    x: &[f32],
    scale: f32,
    n_valid: usize,
    out: &mut [f32],
) -> Result<(), OpsError> {
    check_len("soft_max_row output", x.len(), out.len())?;
    if n_valid == 0 || n_valid > x.len() {
        return Err(OpsError::BadDim {
            what: "n_valid",
            value: n_valid,
            why: "a causal row needs between 1 and its length unmasked entries",
        });
    }
    let mut w = vec![0.0f32; x.len()];
    mask_scale(x, scale, 0..n_valid, &mut w);
    normalize_k(isa.kernels(), &w, out);
    Ok(())
}

/// `w[i] = x[i]*scale + 0` for `i` in `valid` (the mask's +0 turns -0 into +0, as in ggml),
/// `-inf` for the rest.
pub(crate) fn mask_scale(x: &[f32], scale: f32, valid: std::ops::Range<usize>, w: &mut [f32]) {
    let end = valid.end.min(x.len()).min(w.len());
    let start = valid.start.min(end);
    w[..start].fill(f32::NEG_INFINITY);
    for (wi, &xi) in w[start..end].iter_mut().zip(&x[start..end]) {
        *wi = xi * scale + 0.0;
    }
    w[end..].fill(f32::NEG_INFINITY);
}

/// The largest value of `w` as C's running `MAX(max, v)` (`max > v ? max : v`, from -inf)
/// finds it, in 16 interleaved runs: the maximum of non-NaN values does not depend on the
/// order, except for the sign of a zero maximum, which cannot reach the softmax (`w - max`
/// and `exp` give the same bits for either zero). A row holding a NaN ends all-NaN either way.
fn row_max(w: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut blocks = w.chunks_exact(16);
    for b in &mut blocks {
        for (m, &v) in lanes.iter_mut().zip(b) {
            *m = if *m > v { *m } else { v };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(blocks.remainder()) {
        max = if max > v { max } else { v };
    }
    max
}

/// The rest of ggml's row: max, `exp(w - max)` with the f64 sum, scale by `1/sum`.
pub(crate) fn normalize_k(k: Kernels, w: &[f32], y: &mut [f32]) {
    let max = row_max(w);
    let (done, mut sum) = match k {
        Kernels::Scalar => exp_sum_blocks_scalar(w, max, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.exp_sum_blocks(w, max, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.exp_sum_blocks(w, max, y),
    };
    for (yi, &wi) in y[done..].iter_mut().zip(&w[done..]) {
        let v = (wi - max).exp();
        sum += v as f64;
        *yi = v;
    }
    let inv = (1.0 / sum) as f32;
    for yi in y.iter_mut() {
        *yi *= inv;
    }
}

/// The scalar twin of the SIMD exp-and-sum blocks.
pub(crate) fn exp_sum_blocks_scalar(x: &[f32], max: f32, y: &mut [f32]) -> (usize, f64) {
    let n = x.len().min(y.len()) / 16 * 16;
    let mut sum = 0.0f64;
    for (xs, ys) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact_mut(16)) {
        let mut v = [0.0f32; 16];
        for ((vi, yi), &xi) in v.iter_mut().zip(ys.iter_mut()).zip(xs) {
            *vi = v_expf(xi - max);
            *yi = *vi;
        }
        sum += super::expf::reduce16(&v) as f64;
    }
    (n, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        crate::backends::cpu::kernels::test_data(n, seed, 3, scale)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn isas_agree_and_rows_sum_to_one() {
        for d in [1, 7, 16, 31, 64, 300] {
            let x = data(3 * d, d as u32, 20.0);
            let mut want = vec![0.0; 3 * d];
            soft_max_with(Isa::Scalar, &x, d, 0.125, &mut want).unwrap();
            for isa in Isa::supported() {
                let mut got = vec![0.0; 3 * d];
                soft_max_with(isa, &x, d, 0.125, &mut got).unwrap();
                assert_eq!(bits(&got), bits(&want), "{isa:?} d {d}");
            }
            for (r, row) in want.chunks(d).enumerate() {
                let s: f64 = row.iter().map(|v| *v as f64).sum();
                assert!((s - 1.0).abs() < 1e-5, "row {r} sums to {s}");
                let xr = &x[r * d..][..d];
                let m = xr
                    .iter()
                    .fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64 * 0.125));
                let z: f64 = xr.iter().map(|v| (*v as f64 * 0.125 - m).exp()).sum();
                for (p, v) in row.iter().zip(xr) {
                    let e = (*v as f64 * 0.125 - m).exp() / z;
                    assert!((*p as f64 - e).abs() < 1e-6 * e.max(1e-3), "{p} vs {e}");
                }
            }
        }
    }

    #[test]
    fn row_max_is_the_running_max() {
        for n in [0usize, 1, 15, 16, 17, 100, 4608] {
            let mut w = data(n, n as u32 + 3, 50.0);
            for (i, v) in w.iter_mut().enumerate() {
                if i % 7 == 3 {
                    *v = f32::NEG_INFINITY;
                }
            }
            let want = w.iter().fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
            assert_eq!(row_max(&w).to_bits(), want.to_bits(), "n {n}");
        }
    }

    #[test]
    fn masked_padding_only_adds_zeros() {
        // A causal row padded with masked entries gives the unmasked entries the same bits
        // whatever the padded length (a multiple of 16, as llama.cpp's KV window).
        let x = data(256, 9, 8.0);
        for n_valid in [1usize, 5, 16, 17, 40, 64, 100] {
            let len = n_valid.div_ceil(16) * 16;
            let mut short = vec![0.0; len];
            soft_max_row(&x[..len], 0.3, n_valid, &mut short).unwrap();
            let mut long = vec![0.0; 256];
            soft_max_row(&x, 0.3, n_valid, &mut long).unwrap();
            assert_eq!(bits(&short), bits(&long[..len]), "n_valid {n_valid}");
            assert!(long[n_valid..].iter().all(|v| v.to_bits() == 0));
        }
        let mut out = [0.0; 4];
        assert!(matches!(
            soft_max_row(&[1.0; 4], 1.0, 0, &mut out),
            Err(OpsError::BadDim { .. })
        ));
        assert!(matches!(
            soft_max_row(&[1.0; 4], 1.0, 5, &mut out),
            Err(OpsError::BadDim { .. })
        ));
    }
}
