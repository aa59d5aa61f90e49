//! Element-wise ops: `add`, `mul` (with a row broadcast, as ggml's binary ops), `silu` and
//! the fused `swiglu` of the feed-forward block.
//!
//! `silu` and `swiglu` mirror `ggml_vec_silu_f32` / `ggml_vec_swiglu_f32` of llama.cpp's
//! AVX-512 build, row by row: the whole 16-value blocks of each row go through
//! `ggml_v_silu` (the polynomial `expf`, see [`v_expf`](super::expf::v_expf)), the last
//! `d % 16` values of the row through `x / (1 + expf(-x))` with libm's `expf`. The block/tail
//! split is per row, which is why these take the row length `d`. Every path (AVX-512, AVX2,
//! scalar) computes exactly this, bit for bit.

use super::error::{OpsError, check_len, rows_of};
use super::expf::{silu_libm, v_silu};
use super::isa::{Isa, Kernels};

/// `out = a + b`, `b` either as long as `a` or one row repeated over `a`'s rows.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), OpsError> {
    binary(a, b, out, |x, y| x + y)
}

/// `a += b`, `b` either as long as `a` or one row repeated over `a`'s rows.
pub fn add_inplace(a: &mut [f32], b: &[f32]) -> Result<(), OpsError> {
    binary_inplace(a, b, |x, y| x + y)
}

/// `out = a * b`, `b` either as long as `a` or one row repeated over `a`'s rows.
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), OpsError> {
    binary(a, b, out, |x, y| x * y)
}

/// `a *= b`, `b` either as long as `a` or one row repeated over `a`'s rows.
pub fn mul_inplace(a: &mut [f32], b: &[f32]) -> Result<(), OpsError> {
    binary_inplace(a, b, |x, y| x * y)
}

fn binary(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    op: impl Fn(f32, f32) -> f32,
) -> Result<(), OpsError> {
    check_len("binary op output", a.len(), out.len())?;
    if a.is_empty() && b.is_empty() {
        return Ok(());
    }
    rows_of(
        "binary op input (rows of the broadcast operand)",
        a.len(),
        b.len(),
    )?;
    for (ar, or) in a.chunks_exact(b.len()).zip(out.chunks_exact_mut(b.len())) {
        for ((o, &x), &y) in or.iter_mut().zip(ar).zip(b) {
            *o = op(x, y);
        }
    }
    Ok(())
}

fn binary_inplace(a: &mut [f32], b: &[f32], op: impl Fn(f32, f32) -> f32) -> Result<(), OpsError> {
    if a.is_empty() && b.is_empty() {
        return Ok(());
    }
    rows_of(
        "binary op input (rows of the broadcast operand)",
        a.len(),
        b.len(),
    )?;
    for ar in a.chunks_exact_mut(b.len()) {
        for (x, &y) in ar.iter_mut().zip(b) {
            *x = op(*x, y);
        }
    }
    Ok(())
}

/// `out = silu(x)` = `x / (1 + exp(-x))` on rows of `d` values, as ggml computes it.
// [d, nt] feature-major, token-major memory
pub fn silu(x: &[f32], d: usize, out: &mut [f32]) -> Result<(), OpsError> {
    silu_with(Isa::detected(), x, d, out)
}

/// [`silu`] with the kernels of `isa` (or the best supported below it); same result.
pub fn silu_with(isa: Isa, x: &[f32], d: usize, out: &mut [f32]) -> Result<(), OpsError> {
    rows_of("silu input", x.len(), d)?;
    check_len("silu output", x.len(), out.len())?;
    let k = isa.kernels();
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        silu_row(k, xr, yr);
    }
    Ok(())
}

/// `out[i] = silu(gate[i]) * up[i]` on rows of `d` values, in one pass (ggml's fused
/// `swiglu`: the silu is rounded to f32, then multiplied).
// [d, nt] feature-major, token-major memory
pub fn swiglu(gate: &[f32], up: &[f32], d: usize, out: &mut [f32]) -> Result<(), OpsError> {
    swiglu_with(Isa::detected(), gate, up, d, out)
}

/// [`swiglu`] with the kernels of `isa` (or the best supported below it); same result.
pub fn swiglu_with(
    isa: Isa,
    gate: &[f32],
    up: &[f32],
    d: usize,
    out: &mut [f32],
) -> Result<(), OpsError> {
    rows_of("swiglu gate", gate.len(), d)?;
    check_len("swiglu up", gate.len(), up.len())?;
    check_len("swiglu output", gate.len(), out.len())?;
    let k = isa.kernels();
    let rows = gate.chunks_exact(d).zip(up.chunks_exact(d));
    for ((gr, ur), yr) in rows.zip(out.chunks_exact_mut(d)) {
        swiglu_row(k, gr, ur, yr);
    }
    Ok(())
}

/// [`swiglu_with`] writing over `gate` (the allocator aliases the fused output onto its gate
/// when the SwiGLU is the gate's only reader): each row is copied once to a scratch row, so the
/// bits are those of the out-of-place kernel.
pub fn swiglu_inplace_with(isa: Isa, gate: &mut [f32], up: &[f32], d: usize) -> Result<(), OpsError> {
    rows_of("swiglu gate", gate.len(), d)?;
    check_len("swiglu up", gate.len(), up.len())?;
    let k = isa.kernels();
    let mut row = vec![0.0f32; d];
    for (yr, ur) in gate.chunks_exact_mut(d).zip(up.chunks_exact(d)) {
        row.copy_from_slice(yr);
        swiglu_row(k, &row, ur, yr);
    }
    Ok(())
}

/// `ggml_vec_silu_f32` on one row.
fn silu_row(k: Kernels, x: &[f32], y: &mut [f32]) {
    let done = match k {
        Kernels::Scalar => silu_blocks_scalar(x, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.silu_blocks(x, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.silu_blocks(x, y),
    };
    for (o, &v) in y[done..].iter_mut().zip(&x[done..]) {
        *o = silu_libm(v);
    }
}

/// `ggml_vec_swiglu_f32` on one row.
fn swiglu_row(k: Kernels, g: &[f32], u: &[f32], y: &mut [f32]) {
    let done = match k {
        Kernels::Scalar => swiglu_blocks_scalar(g, u, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.swiglu_blocks(g, u, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.swiglu_blocks(g, u, y),
    };
    for ((o, &gv), &uv) in y[done..].iter_mut().zip(&g[done..]).zip(&u[done..]) {
        *o = silu_libm(gv) * uv;
    }
}

/// The scalar twin of the SIMD silu blocks: whole 16-value blocks, polynomial `expf`.
fn silu_blocks_scalar(x: &[f32], y: &mut [f32]) -> usize {
    let n = x.len().min(y.len()) / 16 * 16;
    for (o, &v) in y[..n].iter_mut().zip(&x[..n]) {
        *o = v_silu(v);
    }
    n
}

/// The scalar twin of the SIMD swiglu blocks.
fn swiglu_blocks_scalar(g: &[f32], u: &[f32], y: &mut [f32]) -> usize {
    let n = g.len().min(u.len()).min(y.len()) / 16 * 16;
    for ((o, &gv), &uv) in y[..n].iter_mut().zip(&g[..n]).zip(&u[..n]) {
        *o = v_silu(gv) * uv;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        crate::backends::cpu::kernels::test_data(n, seed, 7, scale)
    }

    #[test]
    fn swiglu_matches_silu_then_mul() {
        for isa in Isa::supported() {
            for d in [1, 15, 16, 17, 64, 100, 4864] {
                let (g, u) = (data(3 * d, 1, 12.0), data(3 * d, 2, 3.0));
                let mut fused = vec![0.0; 3 * d];
                swiglu_with(isa, &g, &u, d, &mut fused).unwrap();
                let mut s = vec![0.0; 3 * d];
                silu_with(isa, &g, d, &mut s).unwrap();
                mul_inplace(&mut s, &u).unwrap();
                let (fb, sb): (Vec<u32>, Vec<u32>) = (
                    fused.iter().map(|v| v.to_bits()).collect(),
                    s.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(fb, sb, "{isa:?} d {d}");
            }
        }
    }

    #[test]
    fn silu_is_close_to_the_definition() {
        let x = data(1000, 3, 30.0);
        let mut y = vec![0.0; 1000];
        silu(&x, 100, &mut y).unwrap();
        for (a, b) in x.iter().zip(&y) {
            let want = *a as f64 / (1.0 + (-*a as f64).exp());
            assert!(
                (*b as f64 - want).abs() <= 4e-7 * want.abs().max(1e-3),
                "silu({a}) = {b}, want {want}"
            );
        }
    }

    #[test]
    fn broadcast_and_errors() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let mut out = [0.0; 4];
        add(&a, &[10.0, 20.0], &mut out).unwrap();
        assert_eq!(out, [11.0, 22.0, 13.0, 24.0]);
        mul(&a, &a, &mut out).unwrap();
        assert_eq!(out, [1.0, 4.0, 9.0, 16.0]);
        assert!(matches!(
            add(&a, &[1.0; 3], &mut out),
            Err(OpsError::Ragged { .. })
        ));
        assert!(matches!(
            mul(&a, &a, &mut [0.0; 3]),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            swiglu(&a, &a, 3, &mut out),
            Err(OpsError::Ragged { .. })
        ));
        assert!(matches!(
            silu(&a, 0, &mut out),
            Err(OpsError::BadDim { .. })
        ));
    }
}
