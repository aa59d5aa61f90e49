//! x86-64 AVX-512 (F, BW, VL) + VNNI kernels, mirroring llama.cpp's x86 build with AVX-512,
//! the build the reference logits come from.
//!
//! * 32-value blocks: ggml's AVX2 kernels with `mul_sum_us8_pairs_float` done by `vpdpbusd`
//!   (AVX512-VNNI on 256-bit registers), exactly as ggml's `__AVX512VNNI__ && __AVX512VL__`
//!   branch; same integers and float order as `x86_avx2.rs`, from the same macro.
//! * K-quants: ggml's AVX-512 build runs its `__AVX2__` K-quant kernels unchanged, so these are
//!   the AVX2 kernels of `x86_avx2.rs`.
//! * Repacked gemv rows (Q4_0, Q4_K; see `crate::quants::gemv`): integer sums then one FMA
//!   per block, the same in every x86 build, so the AVX2 kernels of `x86_avx2.rs`.
//! * F32 / F16: `ggml_vec_dot_f32` / `ggml_vec_dot_f16` with `GGML_F32_STEP = 64`: 4×16 FMA lanes,
//!   `GGML_F32x16_REDUCE` with GCC's `_mm512_reduce_add_ps` order.
//! * BF16: `ggml_vec_dot_bf16`'s `__AVX512BF16__` branch (two `vdpbf16ps` accumulators over
//!   steps of 64), with `vdpbf16ps` emulated in AVX-512F: each product of two bf16 is exact in
//!   f32, added odd element first, then even, as the instruction defines. Unlike the instruction,
//!   the emulation does not flush subnormals.

use std::arch::x86_64::*;

use super::x86_avx2::{
    bytes_from_bits_32, bytes_from_nibbles_32, entries, f16, f16_mul, f16x2, f32_tail,
    hsum_float_8, ld_half8, ld256, q5_0_quants,
};
use crate::quants::blocks::*;
use crate::quants::scalars::{Bf16Le, F16Le, F32Le};

/// Proof that this CPU runs AVX-512 F/BW/VL/VNNI (and AVX2, FMA, F16C): only
/// [`Avx512::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx512 {
    _proof: (),
}

impl Avx512 {
    /// `Some` if the CPU has every feature the kernels of this file enable.
    pub(super) fn detect() -> Option<Avx512> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        ok.then_some(Avx512 { _proof: () })
    }
}

entries! { Avx512, "avx2, fma, f16c, avx512f/bw/vl/vnni";
    f32 => f32_dot: (F32Le, f32);
    f16 => f16_dot: (F16Le, F16Le);
    bf16 => bf16_dot: (Bf16Le, Bf16Le);
    q4_0 => q4_0: (BlockQ4_0, BlockQ8_0);
    q4_1 => q4_1: (BlockQ4_1, BlockQ8_1);
    q5_0 => q5_0: (BlockQ5_0, BlockQ8_0);
    q5_1 => q5_1: (BlockQ5_1, BlockQ8_1);
    q8_0 => q8_0: (BlockQ8_0, BlockQ8_0);
    q2_k => super::x86_avx2::q2_k: (BlockQ2K, BlockQ8K);
    gemv_q2_k => super::x86_avx2::gemv_q2_k: (BlockQ2K, BlockQ8K);
    q3_k => super::x86_avx2::q3_k: (BlockQ3K, BlockQ8K);
    q4_k => super::x86_avx2::q4_k: (BlockQ4K, BlockQ8K);
    q5_k => super::x86_avx2::q5_k: (BlockQ5K, BlockQ8K);
    q6_k => super::x86_avx2::q6_k: (BlockQ6K, BlockQ8K);
    gemv_q4_0 => super::x86_avx2::gemv_q4_0: (BlockQ4_0, BlockQ8_0);
    gemv_q4_k => super::x86_avx2::gemv_q4_k: (BlockQ4K, BlockQ8K);
}

/// Unsigned × signed bytes, 4 neighbours summed into each i32 lane (`vpdpbusd`), as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy))
}

/// Signed × signed bytes via ggml's `sign_epi8` trick, then [`mul_sum_us8_pairs_float`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_us8_pairs_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

super::x86_avx2::block32_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

use super::x86_avx2::{gemv_q4_k_rows, q6_k_rows};

super::x86_avx2::rows_entries! { Avx512, "avx2, fma, f16c, avx512f/bw/vl/vnni";
    q5_0_rows => q5_0_rows: (BlockQ5_0, BlockQ8_0);
    q8_0_rows => q8_0_rows: (BlockQ8_0, BlockQ8_0);
    q6_k_rows => q6_k_rows: (BlockQ6K, BlockQ8K);
    gemv_q4_k_rows => gemv_q4_k_rows: (BlockQ4K, BlockQ8K);
}

// ---- float rows

/// 16 f32 from 64 little-endian bytes.
#[inline]
#[target_feature(enable = "avx512f")]
fn ld_f32x16(b: &[F32Le; 16]) -> __m512 {
    // SAFETY: `b` is 64 readable bytes; loadu needs no alignment; x86 is little-endian.
    unsafe { _mm512_loadu_ps(b.as_ptr().cast()) }
}

/// 16 f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn ld_f32x16n(b: &[f32; 16]) -> __m512 {
    // SAFETY: `b` is 16 readable f32; loadu needs no alignment.
    unsafe { _mm512_loadu_ps(b.as_ptr()) }
}

/// 16 halves (32 bytes) as a vector.
#[inline]
#[target_feature(enable = "avx512f")]
fn ld_half16<H: super::x86_avx2::Half>(b: &[H; 16]) -> __m256i {
    let (c, _) = b.as_chunks::<8>();
    _mm256_set_m128i(ld_half8(&c[1]), ld_half8(&c[0]))
}

/// 32 bf16 (64 bytes) as 16 u32 lanes: lane `j` holds elements `2j` (low half) and `2j+1`.
#[inline]
#[target_feature(enable = "avx512f")]
fn ld_bf16x32(b: &[Bf16Le; 32]) -> __m512i {
    let (c, _) = b.as_chunks::<16>();
    let lo = ld_half16(&c[0]);
    let hi = ld_half16(&c[1]);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// GCC's `_mm512_reduce_add_ps`: halves of 8, halves of 4, `t + shuffle(t, 2,3,0,1)`, then
/// lane 0 + lane 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
fn reduce_add_ps(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let t3 = _mm256_add_ps(hi, _mm512_castps512_ps256(v));
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    let t8 = _mm_add_ps(t6, _mm_shuffle_ps::<0b01_00_11_10>(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
}

/// `GGML_F32x16_REDUCE` of 4 accumulators: `(s0+s2)+(s1+s3)`, then [`reduce_add_ps`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
fn reduce4x16(s: [__m512; 4]) -> f32 {
    reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(s[0], s[2]),
        _mm512_add_ps(s[1], s[3]),
    ))
}

/// `ggml_vec_dot_f32` (AVX-512): 4×16 FMA lanes over steps of 64, tail in f32 as GCC compiles
/// it (`f32_tail`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f32_dot(x: &[F32Le], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let (xs, xt) = x[..n].as_chunks::<64>();
    let (ys, yt) = y[..n].as_chunks::<64>();
    let mut s = [_mm512_setzero_ps(); 4];
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<16>();
        let (yv, _) = yc.as_chunks::<16>();
        for j in 0..4 {
            s[j] = _mm512_fmadd_ps(ld_f32x16(&xv[j]), ld_f32x16n(&yv[j]), s[j]);
        }
    }
    let sumf = reduce4x16(s);
    f32_tail::<8>(xt, yt, sumf)
}

/// `ggml_vec_dot_f16` (AVX-512 without FP16): as [`f32_dot`] on converted halves, tail in f64.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f16_dot(x: &[F16Le], y: &[F16Le]) -> f32 {
    let n = x.len().min(y.len());
    let (xs, xt) = x[..n].as_chunks::<64>();
    let (ys, yt) = y[..n].as_chunks::<64>();
    let mut s = [_mm512_setzero_ps(); 4];
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<16>();
        let (yv, _) = yc.as_chunks::<16>();
        for j in 0..4 {
            let a = _mm512_cvtph_ps(ld_half16(&xv[j]));
            let b = _mm512_cvtph_ps(ld_half16(&yv[j]));
            s[j] = _mm512_fmadd_ps(a, b, s[j]);
        }
    }
    let mut sumf = f64::from(reduce4x16(s));
    for (a, b) in xt.iter().zip(yt) {
        sumf += f64::from(f16(*a) * f16(*b));
    }
    sumf as f32
}

/// `c = vdpbf16ps(c, x, y)` for 32 bf16 pairs: `c += x_odd*y_odd; c += x_even*y_even` per
/// lane, each product exact.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dpbf16(c: __m512, x: &[Bf16Le; 32], y: &[Bf16Le; 32]) -> __m512 {
    let (x, y) = (ld_bf16x32(x), ld_bf16x32(y));
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let odd = |v| _mm512_castsi512_ps(_mm512_and_si512(v, high));
    let even = |v| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
    let c = _mm512_add_ps(c, _mm512_mul_ps(odd(x), odd(y)));
    _mm512_add_ps(c, _mm512_mul_ps(even(x), even(y)))
}

/// `ggml_vec_dot_bf16` (`__AVX512BF16__`): two accumulators over steps of 64 (values
/// `i..i+32` into `c1`, `i+32..i+64` into `c2`), each reduced as `_mm512_reduce_add_ps` and
/// summed in f64 with the tail.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn bf16_dot(x: &[Bf16Le], y: &[Bf16Le]) -> f32 {
    let n = x.len().min(y.len());
    let (xs, xt) = x[..n].as_chunks::<64>();
    let (ys, yt) = y[..n].as_chunks::<64>();
    let mut c1 = _mm512_setzero_ps();
    let mut c2 = _mm512_setzero_ps();
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<32>();
        let (yv, _) = yc.as_chunks::<32>();
        c1 = dpbf16(c1, &xv[0], &yv[0]);
        c2 = dpbf16(c2, &xv[1], &yv[1]);
    }
    let mut sumf = f64::from(reduce_add_ps(c1));
    sumf += f64::from(reduce_add_ps(c2));
    for (a, b) in xt.iter().zip(yt) {
        sumf += f64::from(a.to_f32() * b.to_f32());
    }
    sumf as f32
}
