//! GELU (tanh approximation) and the gated `geglu`, as ggml's CPU computes them.
//!
//! ggml builds with `GGML_GELU_FP16`: at start-up it tabulates, for every f16 bit pattern `h`,
//! `f16(gelu(f32(h)))` with `gelu(x) = 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))` in f32
//! (libm's `tanhf`). `ggml_vec_gelu_f32` then maps `x <= -10` to `0`, `x >= 10` to `x`, and
//! any other `x` to the table entry of `f16(x)` (round to nearest even), widened back to f32;
//! `ggml_vec_geglu_f32` multiplies that by the up value (`x * up` above 10, `0` below -10).
//! The table is built once, on first use, and never changes.
//!
//! ggml's `ggml-cpu.c` is compiled as GNU C with FMA enabled, so GCC contracts
//! `1 + 0.044715·x·x` into `fma(0.044715·x, x, 1)` when it builds the table. That changes one
//! entry of the 65536 (the f16 value -1.99902: -0.0455017 instead of -0.0454712), and the one
//! entry matters: without the contraction Gemma-3-270M's logits drift by up to 0.5 from
//! llama.cpp's on a reference prompt (`quicksort_c`) from the step one FFN gate lands on it.

use std::sync::OnceLock;

use half::f16;

use super::error::{OpsError, check_len};

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// ggml's `ggml_gelu_f32` as GCC compiles it for the table: f32, with the inner
/// multiply-add contracted (see the module docs).
pub fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// `ggml_table_gelu_f16`: entry `h` is `f16(gelu(f32(h)))`.
fn table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|h| f16::from_f32(gelu_f32(f16::from_bits(h).to_f32()))).collect())
}

/// One value of `ggml_vec_gelu_f32`, `None` in the `x >= 10` pass-through range.
#[inline]
fn gelu_one(t: &[f16], x: f32) -> Option<f32> {
    if x <= -10.0 {
        Some(0.0)
    } else if x >= 10.0 {
        None
    } else {
        Some(t[usize::from(f16::from_f32(x).to_bits())].to_f32())
    }
}

/// `out = gelu(x)` element by element.
pub fn gelu(x: &[f32], out: &mut [f32]) -> Result<(), OpsError> {
    check_len("gelu output", x.len(), out.len())?;
    let t = table();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_one(t, v).unwrap_or(v);
    }
    Ok(())
}

/// `x = gelu(x)` in place.
pub fn gelu_inplace(x: &mut [f32]) {
    let t = table();
    for v in x.iter_mut() {
        *v = gelu_one(t, *v).unwrap_or(*v);
    }
}

/// `out = gelu(gate) * up` element by element (ggml's `geglu` with a separate up operand).
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), OpsError> {
    check_len("geglu up", gate.len(), up.len())?;
    check_len("geglu output", gate.len(), out.len())?;
    let t = table();
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = geglu_one(t, g, u);
    }
    Ok(())
}

/// `gate = gelu(gate) * up` in place over the gate.
pub fn geglu_inplace(gate: &mut [f32], up: &[f32]) -> Result<(), OpsError> {
    check_len("geglu up", gate.len(), up.len())?;
    let t = table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = geglu_one(t, *g, u);
    }
    Ok(())
}

#[inline]
fn geglu_one(t: &[f16], g: f32, u: f32) -> f32 {
    match gelu_one(t, g) {
        // ggml writes 0 below -10, without multiplying.
        Some(v) if g <= -10.0 => v,
        Some(v) => v * u,
        None => g * u,
    }
}

/// `out = x * s` (ggml `scale`).
pub fn scale(x: &[f32], s: f32, out: &mut [f32]) -> Result<(), OpsError> {
    check_len("scale output", x.len(), out.len())?;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * s;
    }
    Ok(())
}

/// `x *= s` in place.
pub fn scale_inplace(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same tanh approximation in f64: the reference the f16 table rounds.
    fn gelu_f64(x: f64) -> f64 {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * x * (1.0 + 0.044715 * x * x)).tanh())
    }

    #[test]
    fn table_values_are_f16_roundings_of_the_f64_gelu() {
        for &x in &[-9.5f32, -3.0, -1.0, -0.25, 0.0, 0.001, 0.5, 1.0, 2.5, 7.0, 9.99] {
            let mut y = [0.0f32];
            gelu(&[x], &mut y).unwrap();
            let want = gelu_f64(f64::from(f16::from_f32(x).to_f32()));
            // f16 has an 11-bit mantissa: half an ulp is 2^-11 relative, plus an absolute floor.
            assert!((f64::from(y[0]) - want).abs() <= want.abs() * 1e-3 + 1e-6, "gelu({x}) = {} vs {want}", y[0]);
        }
    }

    #[test]
    fn the_contracted_entry_is_ggmls() {
        // f16 0xbfff = -1.99902: the one entry where the FMA-contracted form differs.
        let x = f16::from_bits(0xbfff).to_f32();
        let mut y = [0.0f32];
        gelu(&[x], &mut y).unwrap();
        assert_eq!(y[0], f16::from_f32(-0.0455017).to_f32());
        let uncontracted = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh());
        assert_ne!(f16::from_f32(uncontracted).to_bits(), f16::from_f32(y[0]).to_bits());
    }

    #[test]
    fn range_ends_and_geglu() {
        let x = [-12.0f32, -10.0, 10.0, 11.5, 1.0];
        let up = [3.0f32, -2.0, 2.0, -1.0, 4.0];
        let mut out = [9.0f32; 5];
        geglu(&x, &up, &mut out).unwrap();
        let g1 = f16::from_f32(gelu_f32(1.0)).to_f32();
        assert_eq!(out, [0.0, 0.0, 20.0, -11.5, g1 * 4.0]);
        // Zero below -10 is +0 even when the up value is negative.
        assert!(out[1].is_sign_positive());
        let mut g = x;
        geglu_inplace(&mut g, &up).unwrap();
        assert_eq!(g, out);
        let mut s = [0.0f32; 5];
        scale(&x, 0.5, &mut s).unwrap();
        assert_eq!(s, [-6.0, -5.0, 5.0, 5.75, 0.5]);
    }
}
