//! x86-64 AVX2 activation quantizers (Q8_0, Q8_1, Q8_K), bit-identical to the scalar ones of
//! [`q8`](crate::quants::q8) (their twins, which mirror ggml; see that module for which ggml
//! function each follows). Both x86 tokens run them: every AVX-512 CPU minfer accepts has AVX2.
//!
//! * Q8_0 / Q8_1: ggml's own AVX2 `quantize_row_q8_0/1`: `max |x|` over four 8-lane registers,
//!   then hi/lo halves, `movehl`, `movehdup` (the order decides only which NaN wins);
//!   `x * (127 / amax)` rounded to nearest even by `cvtps_epi32`; signed saturation to i8 by
//!   `packs`, put back in value order by a lane permute. Q8_1's `s` is `f16(d * Σ q)` over the
//!   int32 quants (wrapping sum, any order).
//! * Q8_K: `quantize_row_q8_K_ref` as the reference build compiles it: the value of largest
//!   magnitude (the first on ties; NaN never wins, as in the scalar `>` scan), `iscale =
//!   -127 / max`, then `iscale * x` rounded to f32 *and then* `+ 1.5·2^23` (a separate
//!   `mulps` and `addps`, never fused), the integer read from the low mantissa bits,
//!   `min(127, q)` kept as its low byte (C's conversion to `int8_t`), and `bsums` of 16.
//!
//! The f16 scales go through [`F16Le::from_f32`], as in the twins, so even a NaN scale has the
//! twins' bits.

use std::arch::x86_64::*;

use super::x86_avx2::Avx2;
use super::x86_avx512::Avx512;
use crate::quants::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK32};
use crate::quants::q8::{ActBlock, check_row};
use crate::quants::scalars::F16Le;
use crate::quants::{ActRow, GgmlType, QuantError};

/// The 32 values of one block as four registers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(x: &[f32; 32]) -> [__m256; 4] {
    // SAFETY: each load reads 8 of the block's 32 f32; loadu needs no alignment.
    std::array::from_fn(|r| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * r)) })
}

/// ggml's AVX `max |x|` of a block: `maxps(acc, |v_r|)` over the registers, then
/// `maxps(hi, lo)`, `movehl`, `movehdup` — the scalar `x86_absmax32`'s order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn absmax32(v: &[__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for r in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *r));
    }
    let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)))
}

/// One block's `(d, int32 quants)`: `d = amax / 127`, `q = cvtps_epi32(x * (127 / amax))`
/// (nearest even; out of range or NaN gives `i32::MIN`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_ints(x: &[f32; 32]) -> (f32, [__m256i; 4]) {
    let v = load32(x);
    let amax = absmax32(&v);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    (d, v.map(|r| _mm256_cvtps_epi32(_mm256_mul_ps(r, id))))
}

/// The dword order that undoes `packs_epi32` + `packs_epi16` across the two 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack_order() -> __m256i {
    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)
}

/// The 32 int32 values of `q` saturated to i8 (`packs_epi32`, `packs_epi16`), in value order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack_sat(q: &[__m256i; 4], out: &mut [i8; 32]) {
    let p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    let p = _mm256_permutevar8x32_epi32(p, pack_order());
    // SAFETY: out is 32 bytes; storeu needs no alignment.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), p) };
}

/// The first 32 values of each 32-value chunk of `x`, as arrays.
fn blocks32(x: &[f32]) -> impl Iterator<Item = &[f32; 32]> {
    x.chunks_exact(QK32).filter_map(|c| c.first_chunk())
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_row(x: &[f32], out: &mut [BlockQ8_0]) {
    for (o, x) in out.iter_mut().zip(blocks32(x)) {
        let (d, q) = q8_ints(x);
        o.d = F16Le::from_f32(d);
        pack_sat(&q, &mut o.qs);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_1_row(x: &[f32], out: &mut [BlockQ8_1]) {
    for (o, x) in out.iter_mut().zip(blocks32(x)) {
        let (d, q) = q8_ints(x);
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let mut lanes = [0i32; 8];
        // SAFETY: lanes is 8 i32; storeu needs no alignment.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
        let sum = lanes.iter().fold(0i32, |a, &l| a.wrapping_add(l));
        o.d = F16Le::from_f32(d);
        o.s = F16Le::from_f32(d * sum as f32);
        pack_sat(&q, &mut o.qs);
    }
}

/// Registers of 8 values in a Q8_K block.
const K_REGS: usize = QK_K / 8;

#[target_feature(enable = "avx2,fma,f16c")]
fn q8k_block(x: &[f32; QK_K], o: &mut BlockQ8K) {
    // SAFETY (all loads below): register `r` reads values 8r..8r+8 of the 256.
    let v: [__m256; K_REGS] = std::array::from_fn(|r| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * r)) });
    let sign = _mm256_set1_ps(-0.0);
    // `maxps(|v|, acc)`: a NaN in |v| yields acc, so NaN never counts, as in the scalar scan.
    let mut m = _mm256_setzero_ps();
    for r in &v {
        m = _mm256_max_ps(_mm256_andnot_ps(sign, *r), m);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: lanes is 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = lanes.iter().fold(0.0f32, |a, &l| if l > a { l } else { a });
    if amax == 0.0 {
        *o = BlockQ8K::default();
        return;
    }
    // The first value whose magnitude is amax: where the scalar scan's running max lands.
    let am = _mm256_set1_ps(amax);
    let max = v
        .iter()
        .enumerate()
        .find_map(|(r, reg)| {
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, *reg), am));
            (hit != 0).then(|| x[8 * r + hit.trailing_zeros() as usize])
        })
        .unwrap_or(amax);
    let iscale = -127.0 / max;
    let (is, magic) = (_mm256_set1_ps(iscale), _mm256_set1_ps(12_582_912.0));
    let (mant, half) = (_mm256_set1_epi32(0x007f_ffff), _mm256_set1_epi32(0x0040_0000));
    let (cap, low) = (_mm256_set1_epi32(127), _mm256_set1_epi32(0xff));
    let order = pack_order();
    for (c, regs) in v.chunks_exact(4).enumerate() {
        // Low byte of min(127, (bits(iscale*x + magic) & mant) - half), per value.
        let b: [__m256i; 4] = std::array::from_fn(|i| {
            let f = _mm256_add_ps(_mm256_mul_ps(regs[i], is), magic);
            let q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(f), mant), half);
            _mm256_and_si256(_mm256_min_epi32(q, cap), low)
        });
        // Values 0..=255 pack without saturating: the bytes are the low bytes, as C's cast.
        let p = _mm256_packus_epi16(_mm256_packus_epi32(b[0], b[1]), _mm256_packus_epi32(b[2], b[3]));
        let p = _mm256_permutevar8x32_epi32(p, order);
        // SAFETY: bytes 32c..32c+32 of the 256-byte qs.
        unsafe { _mm256_storeu_si256(o.qs.as_mut_ptr().add(32 * c).cast(), p) };
    }
    for (s, q) in o.bsums.iter_mut().zip(o.qs.chunks_exact(16)) {
        // SAFETY: q is 16 bytes. Σ(q + 128) by `psadbw`, minus 16 * 128.
        let u = _mm_xor_si128(unsafe { _mm_loadu_si128(q.as_ptr().cast()) }, _mm_set1_epi8(-128));
        let sad = _mm_sad_epu8(u, _mm_setzero_si128());
        let total = _mm_cvtsi128_si32(sad) + _mm_extract_epi16::<4>(sad);
        *s = (total - 2048) as i16;
    }
    o.d = 1.0 / iscale;
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8k_row(x: &[f32], out: &mut [BlockQ8K]) {
    for (o, x) in out.iter_mut().zip(x.chunks_exact(QK_K).filter_map(|c| c.first_chunk::<QK_K>())) {
        q8k_block(x, o);
    }
}

/// Blocks of `B` for `x`, after the scalar quantizers' length check.
fn blocks<B: ActBlock>(x: &[f32]) -> Result<Vec<B>, QuantError> {
    let n = x.len() / B::N;
    check_row::<B>(x, n)?;
    Ok(vec![B::default(); n])
}

/// `x` as an activation row of type `act` where this file has its quantizer (Q8_0, Q8_1,
/// Q8_K), else `None`.
#[target_feature(enable = "avx2,fma,f16c")]
fn act_row(act: GgmlType, x: &[f32]) -> Option<Result<ActRow, QuantError>> {
    let row = match act {
        GgmlType::Q8_0 => blocks(x).map(|mut b| {
            q8_0_row(x, &mut b);
            ActRow::Q8_0(b)
        }),
        GgmlType::Q8_1 => blocks(x).map(|mut b| {
            q8_1_row(x, &mut b);
            ActRow::Q8_1(b)
        }),
        GgmlType::Q8K => blocks(x).map(|mut b| {
            q8k_row(x, &mut b);
            ActRow::Q8K(b)
        }),
        _ => return None,
    };
    Some(row)
}

/// The safe entry point on both x86 tokens.
macro_rules! quantizers {
    ($($token:ty),*) => {$(
        impl $token {
            /// `x` as an activation row of type `act`, bit-identical to [`ActRow::quantize`],
            /// where the x86 quantizers have the type (Q8_0, Q8_1, Q8_K); else `None`.
            pub fn act_row(self, act: GgmlType, x: &[f32]) -> Option<Result<ActRow, QuantError>> {
                // SAFETY: a token exists only where detection found avx2, fma and f16c.
                unsafe { act_row(act, x) }
            }
        }
    )*};
}
quantizers!(Avx2, Avx512);
