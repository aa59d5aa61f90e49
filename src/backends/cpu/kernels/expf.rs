//! ggml's vectorized `expf` and the 16-lane horizontal sum, one lane at a time.
//!
//! [`v_expf`] is the scalar twin of `ggml_v_expf` as llama.cpp's AVX-512 build computes it
//! (`ggml-cpu/vec.h`, adapted from ARM's optimized routines; within 2.5 ulp of the true `exp`,
//! see the tests): the same FMAs in the same order, then `scalef`. The SIMD versions in
//! `simd_x86` compute exactly this per lane, so all paths agree bit for bit.
//!
//! ggml's AVX2 (and NEON) build uses a different final step (`k + k*j` instead of
//! `scalef(1 + …)`), which can differ in the last bit; minfer follows the AVX-512 one on every
//! CPU, so that its results do not depend on the machine.

use super::isa::{Isa, Kernels};

/// `0x1.8p23`: adding it rounds to an integer held in the low mantissa bits.
pub(crate) const ROUND: f32 = 12582912.0;
/// `0x1.715476p+0`, log2(e).
pub(crate) const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
/// `0x1.62e4p-1`, the high part of ln 2.
pub(crate) const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
/// `0x1.7f7d1cp-20`, the low part of ln 2.
pub(crate) const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// The polynomial's coefficients, `0x1.ffffecp-1` … `0x1.0e4020p-7`.
pub(crate) const C1: f32 = f32::from_bits(0x3f7f_fff6);
pub(crate) const C2: f32 = f32::from_bits(0x3eff_fedb);
pub(crate) const C3: f32 = f32::from_bits(0x3e2a_af33);
pub(crate) const C4: f32 = f32::from_bits(0x3d2b_9f17);
pub(crate) const C5: f32 = f32::from_bits(0x3c07_2010);
/// Beyond `|n| > 192` the result is 0 or infinity outright.
pub(crate) const N_LIMIT: f32 = 192.0;

/// `2^k` for `k` in `-126..=127`.
#[inline(always)]
pub(crate) fn pow2i(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `j * 2^n` rounded once, as `_mm512_scalef_ps` computes it, for an integral `n` with
/// `|n| <= 192`: `j` (within [0.7, 1.5]) times `2^(n/2)` is exact, the second factor rounds.
#[inline(always)]
pub(crate) fn scalef(j: f32, n: f32) -> f32 {
    let n = n as i32;
    let h = n >> 1;
    j * pow2i(h) * pow2i(n - h)
}

/// `ggml_v_expf` (AVX-512 build) on one lane.
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, ROUND);
    let n = z - ROUND;
    // _mm512_fnmadd_ps(a, b, c) = -(a*b) + c, one rounding: fma(-a, b, c).
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C5
        .mul_add(b, C4)
        .mul_add(u, C3.mul_add(b, C2))
        .mul_add(u, C1.mul_add(b, 1.0));
    // The comparisons are ordered: a NaN `n` takes the polynomial path (and stays NaN).
    if n.abs() > N_LIMIT {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `y[i] = v_expf(x[i])` for every `i`, with the kernels of `isa` (or the best supported below
/// it): whole 16-value blocks through SIMD, the rest through the scalar twin. Same bits on
/// every path (a checking and benchmarking aid; ggml has no such row function).
pub fn expf_row_with(isa: Isa, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    // exp(x - 0) is exp(x): subtracting +0 changes no value, not even -0.
    let (done, _) = match isa.kernels() {
        Kernels::Scalar => super::softmax::exp_sum_blocks_scalar(x, 0.0, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.exp_sum_blocks(x, 0.0, y),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.exp_sum_blocks(x, 0.0, y),
    };
    for (o, &v) in y[done..].iter_mut().zip(&x[done..]) {
        *o = v_expf(v);
    }
}

/// `ggml_v_silu` on one lane: `x / (1 + v_expf(0 - x))`.
#[inline(always)]
pub fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_silu_f32`, which ggml uses for the elements past the last whole vector: libm's
/// `expf` (Rust's `f32::exp` calls the same C library function on Linux).
#[inline(always)]
pub fn silu_libm(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `_mm512_reduce_add_ps` as GCC implements it: halves added pairwise, 16 → 8 → 4 → 2 → 1.
#[inline(always)]
pub(crate) fn reduce16(v: &[f32; 16]) -> f32 {
    let mut h8 = [0.0f32; 8];
    for i in 0..8 {
        h8[i] = v[i + 8] + v[i];
    }
    let h4 = [h8[4] + h8[0], h8[5] + h8[1], h8[6] + h8[2], h8[7] + h8[3]];
    let h2 = [h4[0] + h4[2], h4[1] + h4[3]];
    h2[0] + h2[1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_exp_and_saturates_like_ggml() {
        let mut worst = 0.0f64;
        let mut x = -103.0f32;
        while x < 88.0 {
            let got = v_expf(x) as f64;
            let want = (x as f64).exp();
            if want > f32::MIN_POSITIVE as f64 {
                // One f32 ulp at `want`.
                let ulp = 2f64.powi(want.log2().floor() as i32 - 23);
                worst = worst.max((got - want).abs() / ulp);
            }
            x += 0.0137;
        }
        // ggml states 1.45 ulp plus 0.5 for the routine it adapted; the AVX-512 variant, which
        // rounds `1 + c1*b` before the last FMA, reaches 2.15 ulp on this grid (its bits are
        // checked against ggml's in tests/ops_ggml_oracle.rs).
        assert!(worst < 2.5, "worst error {worst} ulp");
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(-0.0), 1.0);
        assert_eq!(v_expf(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(v_expf(-200.0).to_bits(), 0);
        assert_eq!(v_expf(200.0), f32::INFINITY);
        assert_eq!(v_expf(f32::INFINITY), f32::INFINITY);
        assert!(v_expf(f32::NAN).is_nan());
        // Subnormal results are rounded once (what scalef does), not flushed.
        let tiny = v_expf(-90.0);
        assert!(tiny > 0.0 && tiny < f32::MIN_POSITIVE);
        let quantum = 2f64.powi(-149);
        assert!((tiny as f64 - (-90.0f64).exp()).abs() <= quantum);
    }

    #[test]
    fn scalef_rounds_once() {
        // Against the exact product in f64, rounded once to f32.
        for n in -192..=192 {
            for j in [0.70710677f32, 1.0, 1.0000001, 1.2345678, 1.4142137] {
                let want = (j as f64 * 2f64.powi(n)) as f32;
                assert_eq!(scalef(j, n as f32).to_bits(), want.to_bits(), "j {j} n {n}");
            }
        }
    }

    #[test]
    fn reduce16_order() {
        let mut v = [0.0f32; 16];
        v[0] = 1e8;
        v[1] = 1.0;
        v[2] = -1e8;
        // Lanes 0 and 2 cancel before lane 1 is added (a left-to-right sum would lose the 1).
        assert_eq!(reduce16(&v), 1.0);
    }
}
