//! x86-64 AVX2 + FMA + F16C kernels, mirroring the `__AVX2__` branches of ggml's
//! `ggml-cpu/arch/x86/quants.c` and the AVX (8-lane) build of `ggml-cpu/vec.cpp`.
//!
//! Every quantized kernel reproduces ggml's float arithmetic exactly: the per-block integer
//! lanes (`mul_sum_*_pairs_float` and the K-quant `madd` layout: lane `k` of a block takes the
//! values `i` with `(i % 32) / 4 == k`), one `fma` per block into 8 f32 lanes, then
//! `hsum_float_8`. Integer sums are exact, so how they are computed may differ from ggml; the
//! lane layout and float order may not. The 32-value-block kernels are written once, in
//! [`block32_kernels`], and expanded here and in `x86_avx512.rs` with that file's integer
//! multiply (`vpdpbusd`). The K-quant kernels are used by both files as they are.

use std::arch::x86_64::*;

use crate::quants::blocks::*;
use crate::quants::scalars::{Bf16Le, F16Le, F32Le};

/// Proof that this CPU runs AVX2, FMA and F16C: only [`Avx2::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx2 {
    _proof: (),
}

impl Avx2 {
    /// `Some` if the CPU has AVX2, FMA and F16C.
    pub(super) fn detect() -> Option<Avx2> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx2 { _proof: () })
    }
}

/// Safe entry points: each calls the `#[target_feature]` kernel of the same name.
macro_rules! entries {
    ($token:ty, $why:literal; $($name:ident => $kernel:path : ($w:ty, $a:ty);)*) => {
        impl $token {$(
            #[inline]
            pub fn $name(self, w: &[$w], a: &[$a]) -> f32 {
                // SAFETY: a token exists only where detection found every feature the kernel
                // enables ($why).
                unsafe { $kernel(w, a) }
            }
        )*}
    };
}
pub(super) use entries;

entries! { Avx2, "avx2, fma, f16c";
    f32 => f32_dot: (F32Le, f32);
    f16 => f16_dot: (F16Le, F16Le);
    bf16 => bf16_dot: (Bf16Le, Bf16Le);
    q4_0 => q4_0: (BlockQ4_0, BlockQ8_0);
    q4_1 => q4_1: (BlockQ4_1, BlockQ8_1);
    q5_0 => q5_0: (BlockQ5_0, BlockQ8_0);
    q5_1 => q5_1: (BlockQ5_1, BlockQ8_1);
    q8_0 => q8_0: (BlockQ8_0, BlockQ8_0);
    q2_k => q2_k: (BlockQ2K, BlockQ8K);
    gemv_q2_k => gemv_q2_k: (BlockQ2K, BlockQ8K);
    q3_k => q3_k: (BlockQ3K, BlockQ8K);
    q4_k => q4_k: (BlockQ4K, BlockQ8K);
    q5_k => q5_k: (BlockQ5K, BlockQ8K);
    q6_k => q6_k: (BlockQ6K, BlockQ8K);
    gemv_q4_0 => gemv_q4_0: (BlockQ4_0, BlockQ8_0);
    gemv_q4_k => gemv_q4_k: (BlockQ4K, BlockQ8K);
}

// ---- loads (the only unsafe code of the kernels: raw-pointer reads of whole arrays)

/// One-byte element types (`u8`, `i8`): an array of N of them is N readable bytes.
pub(super) trait Byte: Copy {}
impl Byte for u8 {}
impl Byte for i8 {}

/// Two-byte float storage types (`F16Le`, `Bf16Le`): an array of N is 2N readable bytes.
pub(super) trait Half: Copy {}
impl Half for F16Le {}
impl Half for Bf16Le {}

/// 16 bytes as a vector.
#[inline]
pub(super) fn ld128<T: Byte>(b: &[T; 16]) -> __m128i {
    // SAFETY: `T` is `u8` or `i8` (`Byte` is sealed to them), so `b` is 16 readable bytes;
    // loadu needs no alignment.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// 32 bytes as a vector.
#[inline]
#[target_feature(enable = "avx")]
pub(super) fn ld256<T: Byte>(b: &[T; 32]) -> __m256i {
    // SAFETY: `T` is `u8` or `i8`, so `b` is 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The 16 `i16` block sums of a Q8_K block as one vector.
#[inline]
#[target_feature(enable = "avx")]
pub(super) fn ld_bsums(b: &[i16; 16]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// 8 f32 from 32 little-endian bytes.
#[inline]
#[target_feature(enable = "avx")]
fn ld_f32x8(b: &[F32Le; 8]) -> __m256 {
    // SAFETY: `b` is 32 readable bytes; loadu needs no alignment; x86 is little-endian.
    unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
}

/// 8 f32 from a slice chunk.
#[inline]
#[target_feature(enable = "avx")]
fn ld_f32x8n(b: &[f32; 8]) -> __m256 {
    // SAFETY: `b` is 8 readable f32; loadu needs no alignment.
    unsafe { _mm256_loadu_ps(b.as_ptr()) }
}

/// 8 halves (f16 or bf16 bit patterns) as 16 bytes.
#[inline]
pub(super) fn ld_half8<H: Half>(b: &[H; 8]) -> __m128i {
    // SAFETY: `H` is `F16Le` or `Bf16Le` (two bytes each), so `b` is 16 readable bytes; loadu
    // needs no alignment.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

// ---- shared helpers (also used by x86_avx512.rs)

/// `GGML_CPU_FP16_TO_FP32`, exact for every input. Not F16C: for a scalar LLVM lowers
/// `vcvtph2ps` of one value to a `vpinsrw` merging into whatever register it likes, which in the
/// kernels was the accumulator, chaining every block behind the previous block's FMA. Here the
/// exponent and mantissa are moved into f32 position and scaled by 2^112 with one exact multiply
/// (which also turns subnormal halves into normal floats); infinities stay infinite, NaNs keep
/// their payload and come out quiet, as `vcvtph2ps` makes them.
#[inline]
pub(super) fn f16(h: F16Le) -> f32 {
    let h = u32::from(h.to_bits());
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let bits = if em == 0x7c00 {
        0x7f80_0000
    } else if em > 0x7c00 {
        0x7fc0_0000 | ((em & 0x3ff) << 13)
    } else {
        (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(bits | sign)
}

/// Two halves converted at once by F16C: `(f32(a), f32(b))`. Both lanes of the `vcvtph2ps`
/// result are used, so LLVM builds its input with one zeroing `vmovd` of the 32-bit pair
/// (converting a single half, it emits a `vpinsrw` that merges into an unrelated register —
/// in the kernels the accumulator — and so chains each block behind the previous FMA).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16x2(a: F16Le, b: F16Le) -> (f32, f32) {
    let v = f16_pair(a, b);
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// `[f32(a), f32(b), 0, 0]` by one `vcvtph2ps` of the zeroing `vmovd` of the 32-bit pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_pair(a: F16Le, b: F16Le) -> __m128 {
    let pair = u32::from(a.to_bits()) | (u32::from(b.to_bits()) << 16);
    _mm_cvtph_ps(_mm_cvtsi32_si128(pair as i32))
}

/// `f16(x.d) * f16(y.d)` with one conversion.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_mul(a: F16Le, b: F16Le) -> f32 {
    let (a, b) = f16x2(a, b);
    a * b
}

/// ggml's `hsum_float_8`: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_float_8(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// 32 nibbles → 32 bytes in value order: low nibbles of `qs` then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bytes_from_nibbles_32(qs: &[u8; 16]) -> __m256i {
    let t = ld128(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// Bit `i` of the little-endian `qh` → byte `i` = 0xFF if set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bytes_from_bits_32(qh: &[u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(*qh));
    // byte i takes source byte i / 8
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// Q5_0's 32 quants as signed bytes `q - 16` in value order: bytes whose fifth bit is clear
/// become `nibble | 0xF0` (= nibble - 16), ggml's `bytes_from_nibbles_32 | ~bits & 0xF0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_0_quants(x: &BlockQ5_0) -> __m256i {
    let hi = _mm256_andnot_si256(bytes_from_bits_32(&x.qh), _mm256_set1_epi8(-16));
    _mm256_or_si256(bytes_from_nibbles_32(&x.qs), hi)
}

/// Unsigned × signed bytes, 4 neighbours summed into each i32 lane, as f32 (AVX2 flavour:
/// `maddubs` then `madd` with ones; the i16 pair sums cannot saturate for ggml's operands).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// Signed × signed bytes via ggml's `sign_epi8` trick, then [`mul_sum_us8_pairs_float`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_us8_pairs_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// The 32-value-block kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), one definition for AVX2 and
/// AVX-512: expanded with the target features of the invoking file, and with that file's
/// `mul_sum_us8_pairs_float` / `mul_sum_i8_pairs_float` (looked up where the macro is used).
///
/// Per block: `lanes` = 8 i32 (lane `k` = values `4k..4k+4`), `acc = fma(d, lanes, acc)`;
/// result `hsum_float_8(acc)`, plus for Q4_1/Q5_1 `summs = fma(m, s, summs)` added last (GCC
/// contracts ggml's `summs += m * s` into an FMA).
macro_rules! block32_kernels {
    ($features:literal) => {
        #[target_feature(enable = $features)]
        fn q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = _mm256_set1_ps(f16_mul(x.d, y.d));
                let qx = _mm256_sub_epi8(bytes_from_nibbles_32(&x.qs), _mm256_set1_epi8(8));
                let q = mul_sum_i8_pairs_float(qx, ld256(&y.qs));
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc)
        }

        #[target_feature(enable = $features)]
        fn q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for (x, y) in w.iter().zip(a) {
                let (m, s) = f16x2(x.m, y.s);
                summs = m.mul_add(s, summs);
                let d = _mm256_set1_ps(f16_mul(x.d, y.d));
                let q = mul_sum_us8_pairs_float(bytes_from_nibbles_32(&x.qs), ld256(&y.qs));
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc) + summs
        }

        #[target_feature(enable = $features)]
        fn q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = _mm256_set1_ps(f16_mul(x.d, y.d));
                let q = mul_sum_i8_pairs_float(q5_0_quants(x), ld256(&y.qs));
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc)
        }

        #[target_feature(enable = $features)]
        fn q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for (x, y) in w.iter().zip(a) {
                let (m, s) = f16x2(x.m, y.s);
                summs = m.mul_add(s, summs);
                let hi = _mm256_and_si256(bytes_from_bits_32(&x.qh), _mm256_set1_epi8(0x10));
                let qx = _mm256_or_si256(bytes_from_nibbles_32(&x.qs), hi);
                let q = mul_sum_us8_pairs_float(qx, ld256(&y.qs));
                acc = _mm256_fmadd_ps(q, _mm256_set1_ps(f16_mul(x.d, y.d)), acc);
            }
            hsum_float_8(acc) + summs
        }

        #[target_feature(enable = $features)]
        fn q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = _mm256_set1_ps(f16_mul(x.d, y.d));
                let q = mul_sum_i8_pairs_float(ld256(&x.qs), ld256(&y.qs));
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc)
        }

        // ---- one weight row against N activation rows: each block unpacked once, each row
        // with its own accumulator in the single dot's order (so the same bits as `q5_0` /
        // `q8_0` per row). Blocks up to the shortest row, as the single dot's zip.

        /// `f16(wd) * f16(a[r][i].d)` for each row `r` (N <= 4): the halves converted by one
        /// `vcvtph2ps`, each product rounded once, as `f16_mul` gives it.
        #[inline]
        #[target_feature(enable = $features)]
        fn scales_x4<const N: usize>(wd: F16Le, a: &[&[BlockQ8_0]; N], i: usize) -> [f32; 4] {
            let mut halves = 0u64;
            for r in 0..N {
                halves |= u64::from(a[r][i].d.to_bits()) << (16 * r);
            }
            // The weight's half converted in the same `vcvtph2ps` (lane 4): converted alone,
            // LLVM builds its input with a `vpinsrw` merging into the accumulator's register,
            // which chained every block behind the previous block's FMA (2 tokens ran slower
            // than two single dots on AVX2).
            let all = _mm256_cvtph_ps(_mm_set_epi64x(i64::from(wd.to_bits()), halves as i64));
            let xd = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(all, _mm256_set1_epi32(4)));
            let mut d = [0.0f32; 4];
            // SAFETY: `d` is 4 writable f32; storeu needs no alignment.
            unsafe { _mm_storeu_ps(d.as_mut_ptr(), _mm_mul_ps(xd, _mm256_castps256_ps128(all))) };
            d
        }

        /// The body both `*_rows` kernels share: `unpack` gives a weight block's signed quants
        /// and scale.
        #[inline]
        #[target_feature(enable = $features)]
        fn b32_rows<W, const N: usize>(w: &[W], a: [&[BlockQ8_0]; N], unpack: impl Fn(&W) -> (__m256i, F16Le)) -> [f32; N] {
            let n = a.iter().fold(w.len(), |n, r| n.min(r.len()));
            let a = a.map(|r| &r[..n]);
            let mut acc = [_mm256_setzero_ps(); N];
            for (i, x) in w[..n].iter().enumerate() {
                let (qx, wd) = unpack(x);
                let (ax, d) = (_mm256_sign_epi8(qx, qx), scales_x4(wd, &a, i));
                for r in 0..N {
                    let sy = _mm256_sign_epi8(ld256(&a[r][i].qs), qx);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), mul_sum_us8_pairs_float(ax, sy), acc[r]);
                }
            }
            let mut out = [0.0f32; N];
            for r in 0..N {
                out[r] = hsum_float_8(acc[r]);
            }
            out
        }

        #[target_feature(enable = $features)]
        fn q5_0_rows<const N: usize>(w: &[BlockQ5_0], a: [&[BlockQ8_0]; N]) -> [f32; N] {
            b32_rows(w, a, |x| (q5_0_quants(x), x.d))
        }

        #[target_feature(enable = $features)]
        fn q8_0_rows<const N: usize>(w: &[BlockQ8_0], a: [&[BlockQ8_0]; N]) -> [f32; N] {
            b32_rows(w, a, |x| (ld256(&x.qs), x.d))
        }
    };
}

/// Safe entries of the `*_rows` kernels on an ISA token: `out[i] = dot(w, a[i])` for any
/// number of rows, four at a time.
macro_rules! rows_entries {
    ($token:ty, $why:literal; $($name:ident => $kernel:ident : ($w:ty, $a:ty);)*) => {
        impl $token {$(
            pub fn $name(self, w: &[$w], a: &[&[$a]], out: &mut [f32]) {
                for (acts, outs) in a.chunks(4).zip(out.chunks_mut(4)) {
                    // SAFETY: a token exists only where detection found every feature the
                    // kernel enables ($why).
                    let mut got = [0.0f32; 4];
                    match *acts {
                        [a0, a1, a2, a3] => got = unsafe { $kernel::<4>(w, [a0, a1, a2, a3]) },
                        [a0, a1, a2] => got[..3].copy_from_slice(&unsafe { $kernel::<3>(w, [a0, a1, a2]) }),
                        [a0, a1] => got[..2].copy_from_slice(&unsafe { $kernel::<2>(w, [a0, a1]) }),
                        [a0] => got[0] = unsafe { $kernel::<1>(w, [a0]) }[0],
                        _ => {}
                    }
                    outs.iter_mut().zip(got).for_each(|(o, g)| *o = g);
                }
            }
        )*}
    };
}
pub(super) use rows_entries;
pub(super) use block32_kernels;

block32_kernels!("avx2,fma,f16c");

rows_entries! { Avx2, "avx2, fma, f16c";
    q5_0_rows => q5_0_rows: (BlockQ5_0, BlockQ8_0);
    q8_0_rows => q8_0_rows: (BlockQ8_0, BlockQ8_0);
    q6_k_rows => q6_k_rows: (BlockQ6K, BlockQ8K);
    gemv_q4_k_rows => gemv_q4_k_rows: (BlockQ4K, BlockQ8K);
}

// ---- K-quants (shared with x86_avx512.rs, which runs them unchanged as ggml does)

/// The 32 quants of Q8_K block `y` starting at value `32c`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8(y: &BlockQ8K, c: usize) -> __m256i {
    let (chunks, _) = y.qs.as_chunks::<32>();
    ld256(&chunks[c])
}

/// `(i16 scale a for bytes 0..16, b for bytes 16..32)` as 16 i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales16(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// Lane-wise `sc * (q · q8)` for one 32-value chunk whose two halves have i16 scales `sc`:
/// `maddubs` into i16 pairs, `madd` with the scales into the 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scaled_chunk(q: __m256i, q8: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, q8))
}

/// The two i32 lane vectors of one Q2_K block in `ggml_vec_dot_q2_K_q8_K`'s AVX2 layout:
/// `(Σ scale·q·a, Σ min·bsum)`, lane by lane (exact integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k_lanes(x: &BlockQ2K, y: &BlockQ8K) -> (__m256i, __m256i) {
    let m3 = _mm256_set1_epi8(3);
    let packed = ld128(&x.scales);
    let scales = _mm_and_si128(packed, _mm_set1_epi8(0x0f));
    let mins = _mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0x0f));
    let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins), ld_bsums(&y.bsums));
    let sc: [i16; 16] = bytemuck::cast(_mm256_cvtepi8_epi16(scales));
    let mut sumi = _mm256_setzero_si256();
    for h in 0..2 {
        let (qs, _) = x.qs.as_chunks::<32>();
        let bits = ld256(&qs[h]);
        let s = |c: usize| scales16(sc[8 * h + 2 * c], sc[8 * h + 2 * c + 1]);
        let q0 = _mm256_and_si256(bits, m3);
        let q1 = _mm256_and_si256(_mm256_srli_epi16::<2>(bits), m3);
        let q2 = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m3);
        let q3 = _mm256_and_si256(_mm256_srli_epi16::<6>(bits), m3);
        let p0 = scaled_chunk(q0, q8(y, 4 * h), s(0));
        let p1 = scaled_chunk(q1, q8(y, 4 * h + 1), s(1));
        let p2 = scaled_chunk(q2, q8(y, 4 * h + 2), s(2));
        let p3 = scaled_chunk(q3, q8(y, 4 * h + 3), s(3));
        let p = _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
        sumi = _mm256_add_epi32(sumi, p);
    }
    (sumi, prod)
}

/// `ggml_vec_dot_q2_K_q8_K`: per block `acc = fma(-yd*dmin, mins·bsums lanes, acc)` then
/// `acc = fma(yd*d, lanes, acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (xd, xmin) = f16x2(x.d, x.dmin);
        let d = y.d * xd;
        let dmin = -y.d * xmin;
        let (sumi, prod) = q2_k_lanes(x, y);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// One row of ggml's `ggml_gemv_q2_K_8x8_q8_K` (x86, used where its build has AVX-512): per
/// super-block `acc = fma(Σ sc·q·a, d_w * d_a, acc)`, `acc_min = fma(Σ m·bsum, dmin_w * d_a,
/// acc_min)`, result `acc - acc_min`. Bit-identical to [`gemv_q2_k`](crate::quants::gemv::gemv_q2_k).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (x, y) in w.iter().zip(a) {
        let (sumi, prod) = q2_k_lanes(x, y);
        let (idot, imin) = (hsum_i32_8(sumi), hsum_i32_8(prod));
        acc = (idot as f32).mul_add(f16(x.d) * y.d, acc);
        acc_min = (imin as f32).mul_add(f16(x.dmin) * y.d, acc_min);
    }
    acc - acc_min
}

/// `ggml_vec_dot_q3_K_q8_K`: `q = low - 4 * !high`, computed as `low·q8 - (4 if high clear)·q8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q3_k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.d * f16(x.d);
        let sc = x.scales().map(i16::from);
        let hbits = ld256(&x.hmask);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let (qs, _) = x.qs.as_chunks::<32>();
            let bits = ld256(&qs[h]);
            for c in 0..4 {
                let low = _mm256_and_si256(shr16(bits, 2 * c), m3);
                let bit = _mm256_set1_epi8((1u8 << (4 * h + c)) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), _mm256_setzero_si256());
                let sub = _mm256_and_si256(clear, four);
                let yq = q8(y, 4 * h + c);
                let p16 =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(low, yq), _mm256_maddubs_epi16(sub, yq));
                let s = scales16(sc[8 * h + 2 * c], sc[8 * h + 2 * c + 1]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p16));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// Bytes of `v` shifted right by `n` (0, 2, 4 or 6) bits, as 16-bit shifts (callers mask).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn shr16(v: __m256i, n: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}

/// Shared body of Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales; `quant(j)` gives the
/// quants of values `64j..64j+32` and `64j+32..64j+64`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_lanes(sc: &[u8; 8], y: &BlockQ8K, quant: impl Fn(usize) -> (__m256i, __m256i)) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for j in 0..4 {
        let (lo, hi) = quant(j);
        let s0 = _mm256_set1_epi16(i16::from(sc[2 * j]));
        let s1 = _mm256_set1_epi16(i16::from(sc[2 * j + 1]));
        let p0 = scaled_chunk(lo, q8(y, 2 * j), s0);
        let p1 = scaled_chunk(hi, q8(y, 2 * j + 1), s1);
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    sumi
}

/// `mins[l]·(bsums of sub-block l)` summed in pairs: 4 i32 lanes, lane `l` = sub-blocks
/// `2l, 2l+1` (ggml's `hadd_epi16` + `madd_epi16`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_min_lanes(m: &[u8; 8], y: &BlockQ8K) -> __m128i {
    let bs = ld_bsums(&y.bsums);
    let sums32 = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    let mins = _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(*m)));
    _mm_madd_epi16(mins, sums32)
}

/// `ggml_vec_dot_q4_K_q8_K`: mins in a 4-lane accumulator added after `hsum_float_8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (xd, xmin) = f16x2(x.d, x.dmin);
        let d = y.d * xd;
        let dmin = -y.d * xmin;
        let (sc, m) = k4_scales_mins(&x.scales);
        let prod = k4_min_lanes(&m, y);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let (qs, _) = x.qs.as_chunks::<32>();
        let sumi = k4_lanes(&sc, y, |j| {
            let bits = ld256(&qs[j]);
            (
                _mm256_and_si256(bits, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
            )
        });
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    let acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

/// `ggml_vec_dot_q5_K_q8_K`: mins as one integer per block, `summs = fma(dmin, mins, summs)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (xd, xmin) = f16x2(x.d, x.dmin);
        let d = y.d * xd;
        let dmin = -y.d * xmin;
        let (sc, m) = k4_scales_mins(&x.scales);
        let mins: [i32; 4] = bytemuck::cast(k4_min_lanes(&m, y));
        let isum = (mins[0] + mins[1]) + (mins[2] + mins[3]);
        summs = dmin.mul_add(isum as f32, summs);
        let hbits = ld256(&x.qh);
        let (qs, _) = x.qs.as_chunks::<32>();
        let high = |b: usize| {
            let bit = _mm256_set1_epi8((1u8 << b) as i8);
            _mm256_and_si256(
                _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit),
                sixteen,
            )
        };
        let sumi = k4_lanes(&sc, y, |j| {
            let bits = ld256(&qs[j]);
            let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), high(2 * j));
            let hi = _mm256_srli_epi16::<4>(bits);
            let hi = _mm256_or_si256(_mm256_and_si256(hi, m4), high(2 * j + 1));
            (lo, hi)
        });
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc) + summs
}

/// A Q6_K block's 16 scales as i16: `(all, halves)`, `all` lane `k` = scale `k` (for the
/// bsums correction), `halves[h]` = scales `8h..8h+8` in both 128-bit halves (for
/// [`q6_chunk_scales`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_scales(x: &BlockQ6K) -> (__m256i, [__m256i; 2]) {
    let all = _mm256_cvtepi8_epi16(ld128(&x.scales));
    let halves = [
        _mm256_permute4x64_epi64::<0b01_00_01_00>(all),
        _mm256_permute4x64_epi64::<0b11_10_11_10>(all),
    ];
    (all, halves)
}

/// Chunk `k`'s two scales from [`q6_scales`]' halves: scale `2k` in the low 128 bits, `2k + 1`
/// in the high ones (ggml's `get_scale_shuffle`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_chunk_scales(halves: &[__m256i; 2], k: usize) -> __m256i {
    _mm256_shuffle_epi8(halves[k / 4], ld256(&Q6_SCALE_PICK[k % 4]))
}

/// `vpshufb` picks of chunk `c`'s two scales from scales `8h..8h+8` in both halves: i16 lane
/// `2c` into the low 128 bits, lane `2c + 1` into the high ones.
const Q6_SCALE_PICK: [[u8; 32]; 4] = i16_picks(2, 1);

/// `N` `vpshufb` controls over 8 i16 lanes repeated in both 128-bit halves: control `k` puts
/// lane `stride·k` in every i16 of the low half and lane `stride·k + high` in the high half.
const fn i16_picks<const N: usize>(stride: usize, high: usize) -> [[u8; 32]; N] {
    let mut picks = [[0u8; 32]; N];
    let mut k = 0;
    while k < N {
        let mut b = 0;
        while b < 32 {
            picks[k][b] = (2 * (stride * k + high * (b / 16)) + b % 2) as u8;
            b += 1;
        }
        k += 1;
    }
    picks
}

/// One Q6_K block against `y` as 8 exact i32 lanes (ggml's AVX2 order): the scaled chunks of
/// `q` (from [`q6_quants`]; `all` from [`q6_scales`], `chunk_scales(k)` chunk `k`'s scales)
/// summed, minus `32·Σ scale·bsum`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_lanes(q: &[__m256i; 8], all: __m256i, chunk_scales: impl Fn(usize) -> __m256i, y: &BlockQ8K) -> __m256i {
    let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(ld_bsums(&y.bsums), all));
    let mut sumi = _mm256_setzero_si256();
    for (k, &q) in q.iter().enumerate() {
        sumi = _mm256_add_epi32(sumi, scaled_chunk(q, q8(y, k), chunk_scales(k)));
    }
    _mm256_sub_epi32(sumi, sub)
}

/// `f16(h)` in lane 0 by one `vcvtph2ps` (the same value as [`f16`], without its branches).
/// LLVM builds the input with a `vpinsrw` merging into some register, the pattern [`f16`]
/// documents; in `q6_k` / `q6_k_rows` that register was last written earlier in the same
/// block (objdump, 2026-12-07), so no chain runs across blocks. Recheck where it is reused.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_lane0(h: F16Le) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h.to_bits())))
}

/// `d_a * f16(d_w)` (one rounding, as the scalar product) in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_x8(da: f32, dw: __m128) -> __m256 {
    _mm256_broadcastss_ps(_mm_mul_ss(_mm_set_ss(da), dw))
}

/// A Q6_K block's 256 quants as 8 vectors of 32 unsigned 6-bit values: vector `4h + c` holds
/// values `128h + 32c ..` (ggml's AVX2 unpack order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_quants(x: &BlockQ6K) -> [__m256i; 8] {
    let (m4, m3) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    let (ql, _) = x.ql.as_chunks::<32>();
    let (qh, _) = x.qh.as_chunks::<32>();
    let mut q = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let b1 = ld256(&ql[2 * h]);
        let b2 = ld256(&ql[2 * h + 1]);
        let hb = ld256(&qh[h]);
        let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(hb, m3));
        let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(hb, _mm256_set1_epi8(12)));
        let h2 = _mm256_and_si256(hb, _mm256_set1_epi8(48));
        let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(hb, _mm256_set1_epi8(-64)));
        q[4 * h] = _mm256_or_si256(_mm256_and_si256(b1, m4), h0);
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(b2, m4), h1);
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m4), h2);
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b2), m4), h3);
    }
    q
}

/// `ggml_vec_dot_q6_K_q8_K`: unsigned 6-bit quants, the `-32` applied per lane through
/// `32 * (bsums · scales)` (lane `k` = sub-blocks `2k, 2k+1`), one `fma` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (all, halves) = q6_scales(x);
        let sumi = q6_lanes(&q6_quants(x), all, |k| q6_chunk_scales(&halves, k), y);
        acc = _mm256_fmadd_ps(scale_x8(y.d, f16_lane0(x.d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// [`q6_k`] of one weight row against N activation rows: each block's quants and scales
/// unpacked once, each row's sums in `q6_k`'s order (the same bits per row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k_rows<const N: usize>(w: &[BlockQ6K], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let n = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let a = a.map(|r| &r[..n]);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, x) in w[..n].iter().enumerate() {
        let xd = f16_lane0(x.d);
        let (all, halves) = q6_scales(x);
        // Each chunk's scales picked once for all N rows.
        let chunks: [__m256i; 8] = std::array::from_fn(|k| q6_chunk_scales(&halves, k));
        let q = q6_quants(x);
        for r in 0..N {
            let y = &a[r][i];
            let sumi = q6_lanes(&q, all, |k| chunks[k], y);
            acc[r] = _mm256_fmadd_ps(scale_x8(y.d, xd), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    let mut out = [0.0f32; N];
    for r in 0..N {
        out[r] = hsum_float_8(acc[r]);
    }
    out
}

// ---- repacked gemv rows (shared with x86_avx512.rs): see `crate::quants::gemv`

/// The wrapping sum of 8 i32 lanes (exact for the block sums it is used on).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32_8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// One row of ggml's `ggml_gemv_q4_0_8x8_q8_0` (x86): per block the whole integer dot,
/// converted once, `acc = fma(isum, d_w * d_a, acc)`. Bit-identical to
/// [`gemv_q4_0`](crate::quants::gemv::gemv_q4_0).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let qx = _mm256_sub_epi8(bytes_from_nibbles_32(&x.qs), _mm256_set1_epi8(8));
        let qy = ld256(&y.qs);
        // |qx| * sign(qy, qx): i16 pairs (at most 2 * 8 * 127, no saturation), then i32.
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
        let isum = hsum_i32_8(_mm256_madd_epi16(ones, p));
        acc = (isum as f32).mul_add(f16_mul(x.d, y.d), acc);
    }
    acc
}

/// A Q4_K block's packed 6-bit scales and mins (`k4_scales_mins`, ggml's `utmp` shuffle done
/// on 32-bit lanes): `(scales, mins)`, the 8 scales as i16 in both 128-bit halves (for
/// [`K4_SCALE_PICK`]) and the 8 mins as i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales_mins_vec(x: &BlockQ4K) -> (__m256i, __m128i) {
    // The 12 scale bytes are at offset 4 of the 144-byte block: 16 bytes from there stay in
    // it (the last 4 are quants, masked out by the lane picks below).
    let (chunks, _) = bytemuck::bytes_of(x)[4..].as_chunks::<16>();
    let u = ld128(&chunks[0]); // u32 lanes [u0, u1, u2, -]
    // sc[0..4] = u0 & 63, sc[4..8] = (u2 & 0x0f) | (bits 6-7 of u0) << 4,
    // m[0..4] = u1 & 63, m[4..8] = (u2 >> 4 & 0x0f) | (bits 6-7 of u1) << 4.
    let low = _mm_shuffle_epi32::<0b10_01_10_00>(u); // [u0, u2, u1, u2]
    let low = _mm_and_si128(
        _mm_srlv_epi32(low, _mm_set_epi32(4, 0, 0, 0)),
        _mm_set_epi32(0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f),
    );
    let top = _mm_shuffle_epi32::<0b01_01_00_00>(u); // [u0, u0, u1, u1]
    let top = _mm_and_si128(_mm_srli_epi32::<2>(top), _mm_set_epi32(0x3030_3030, 0, 0x3030_3030, 0));
    let both = _mm256_cvtepu8_epi16(_mm_or_si128(low, top)); // [sc0..8, m0..8] as i16
    let scales = _mm256_permute4x64_epi64::<0b01_00_01_00>(both);
    (scales, _mm256_extracti128_si256::<1>(both))
}

/// `vpshufb` picks of i16 lane `k` into all 16 lanes, `k` 0..8.
const K4_SCALE_PICK: [[u8; 32]; 8] = i16_picks(1, 0);

/// Sub-block `k`'s scale in all 16 i16 lanes, from the scales of [`k4_scales_mins_vec`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_chunk_scales(scales: __m256i, k: usize) -> __m256i {
    _mm256_shuffle_epi8(scales, ld256(&K4_SCALE_PICK[k]))
}

/// One Q4_K block against `y` as `[Σ sc·(q·a), Σ m·bsum, same, same]` (exact i32; the
/// integers of ggml's repacked gemv, summed in a different but exact order); `chunk_scales(k)`
/// is sub-block `k`'s scale ([`k4_chunk_scales`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_gemv_sums(
    quants: &[(__m256i, __m256i); 4],
    chunk_scales: impl Fn(usize) -> __m256i,
    mins: __m128i,
    y: &BlockQ8K,
) -> __m128i {
    let mut sumi = _mm256_setzero_si256();
    for (j, &(lo, hi)) in quants.iter().enumerate() {
        let p0 = scaled_chunk(lo, q8(y, 2 * j), chunk_scales(2 * j));
        let p1 = scaled_chunk(hi, q8(y, 2 * j + 1), chunk_scales(2 * j + 1));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    let bs = ld_bsums(&y.bsums);
    let bsum_pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
    let min_lanes = _mm_madd_epi16(mins, bsum_pairs);
    let dot4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256::<1>(sumi));
    let pairs = _mm_hadd_epi32(dot4, min_lanes);
    _mm_hadd_epi32(pairs, pairs)
}

/// A Q4_K block's 256 quants as (low, high) nibble vectors of its 4 64-value chunks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_quants(x: &BlockQ4K) -> [(__m256i, __m256i); 4] {
    let m4 = _mm256_set1_epi8(0x0f);
    let (qs, _) = x.qs.as_chunks::<32>();
    let mut quants = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
    for (q, bits) in quants.iter_mut().zip(qs) {
        let bits = ld256(bits);
        *q = (_mm256_and_si256(bits, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4));
    }
    quants
}

/// One row of ggml's `ggml_gemv_q4_K_8x8_q8_K` (x86): per super-block
/// `acc = fma(Σ sc·dot, d_w * d_a, acc)`, `acc_min = fma(Σ m·bsum, dmin_w * d_a, acc_min)`,
/// result `acc - acc_min`. Bit-identical to [`gemv_q4_k`](crate::quants::gemv::gemv_q4_k):
/// the integers are exact in any order, and `acc` / `acc_min` are lanes 0 and 1 of one
/// vector, each lane rounded as the scalar steps are.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm_setzero_ps(); // [acc, acc_min, -, -]
    for (x, y) in w.iter().zip(a) {
        let (scales, mins) = k4_scales_mins_vec(x);
        let sums = _mm_cvtepi32_ps(k4_gemv_sums(&k4_quants(x), |k| k4_chunk_scales(scales, k), mins, y));
        let d = _mm_mul_ps(f16_pair(x.d, x.dmin), _mm_set1_ps(y.d));
        acc = _mm_fmadd_ps(sums, d, acc);
    }
    let [dot, min, _, _]: [f32; 4] = bytemuck::cast(acc);
    dot - min
}

/// [`gemv_q4_k`] of one weight row against N activation rows: each block's scales and quants
/// unpacked once, each row's sums in `gemv_q4_k`'s order (the same bits per row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q4_k_rows<const N: usize>(w: &[BlockQ4K], a: [&[BlockQ8K]; N]) -> [f32; N] {
    let n = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    let a = a.map(|r| &r[..n]);
    let mut acc = [_mm_setzero_ps(); N];
    for (i, x) in w[..n].iter().enumerate() {
        let (scales, mins) = k4_scales_mins_vec(x);
        // Each sub-block's scale picked once for all N rows.
        let chunks: [__m256i; 8] = std::array::from_fn(|k| k4_chunk_scales(scales, k));
        let quants = k4_quants(x);
        let dw = f16_pair(x.d, x.dmin);
        for r in 0..N {
            let y = &a[r][i];
            let sums = _mm_cvtepi32_ps(k4_gemv_sums(&quants, |k| chunks[k], mins, y));
            acc[r] = _mm_fmadd_ps(sums, _mm_mul_ps(dw, _mm_set1_ps(y.d)), acc[r]);
        }
    }
    acc.map(|v| {
        let [dot, min, _, _]: [f32; 4] = bytemuck::cast(v);
        dot - min
    })
}

// ---- float rows: ggml_vec_dot_{f32,f16,bf16} as an AVX2 build compiles them

/// `GGML_F32x8_REDUCE` of 4 accumulators: `(s0+s2)+(s1+s3)`, halves, then two `hadd`s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce4x8(s: [__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// The tail of `ggml_vec_dot_f32` (`for (; i < n; ++i) sumf += x[i]*y[i];`) as GCC 12 `-O3`
/// compiles it: the products of the first `M * (len / M)` values are vectorized (plain `mul`,
/// then added in order), the last `len % M` are contracted into FMAs. `M` is 4 in the AVX2
/// build, 8 in the AVX-512 build.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f32_tail<const M: usize>(x: &[F32Le], y: &[f32], mut sumf: f32) -> f32 {
    let unfused = x.len().min(y.len()) / M * M;
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        sumf = if i < unfused {
            sumf + a.to_f32() * b
        } else {
            a.to_f32().mul_add(*b, sumf)
        };
    }
    sumf
}

/// `ggml_vec_dot_f32` (AVX): 4×8 FMA lanes over steps of 32, `GGML_F32x8_REDUCE`, then the tail
/// in f32 ([`f32_tail`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_dot(x: &[F32Le], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let (xs, xt) = x.as_chunks::<32>();
    let (ys, yt) = y.as_chunks::<32>();
    let mut s = [_mm256_setzero_ps(); 4];
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<8>();
        let (yv, _) = yc.as_chunks::<8>();
        for j in 0..4 {
            s[j] = _mm256_fmadd_ps(ld_f32x8(&xv[j]), ld_f32x8n(&yv[j]), s[j]);
        }
    }
    let sumf = reduce4x8(s);
    f32_tail::<4>(xt, yt, sumf)
}

/// `ggml_vec_dot_f16` (AVX + F16C): as [`f32_dot`] on converted halves, tail in f64.
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_dot(x: &[F16Le], y: &[F16Le]) -> f32 {
    let n = x.len().min(y.len());
    let (xs, xt) = x[..n].as_chunks::<32>();
    let (ys, yt) = y[..n].as_chunks::<32>();
    let mut s = [_mm256_setzero_ps(); 4];
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<8>();
        let (yv, _) = yc.as_chunks::<8>();
        for j in 0..4 {
            let a = _mm256_cvtph_ps(ld_half8(&xv[j]));
            let b = _mm256_cvtph_ps(ld_half8(&yv[j]));
            s[j] = _mm256_fmadd_ps(a, b, s[j]);
        }
    }
    let mut sumf = f64::from(reduce4x8(s));
    for (a, b) in xt.iter().zip(yt) {
        sumf += f64::from(f16(*a) * f16(*b));
    }
    sumf as f32
}

/// 8 bf16 → 8 f32 (the 16 bits become the high half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16x8(b: &[Bf16Le; 8]) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(ld_half8(b))))
}

/// `ggml_vec_dot_bf16` (AVX2 branch): 4×8 lanes of `c = x*y + c` (no FMA) over steps of 32,
/// `(c1+c3)+(c2+c4)`, `hsum`, tail in f64.
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_dot(x: &[Bf16Le], y: &[Bf16Le]) -> f32 {
    let n = x.len().min(y.len());
    let (xs, xt) = x[..n].as_chunks::<32>();
    let (ys, yt) = y[..n].as_chunks::<32>();
    let mut c = [_mm256_setzero_ps(); 4];
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<8>();
        let (yv, _) = yc.as_chunks::<8>();
        for j in 0..4 {
            c[j] = _mm256_add_ps(_mm256_mul_ps(bf16x8(&xv[j]), bf16x8(&yv[j])), c[j]);
        }
    }
    let all = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
    let mut sumf = f64::from(hsum_float_8(all));
    for (a, b) in xt.iter().zip(yt) {
        sumf += f64::from(a.to_f32() * b.to_f32());
    }
    sumf as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_half() {
        for bits in 0..=u16::MAX {
            let h = F16Le::from_bits(bits);
            let (ours, reference) = (f16(h), half::f16::from_bits(bits).to_f32());
            assert_eq!(ours.to_bits(), reference.to_bits(), "{bits:#06x}");
        }
    }
}
