//! x86-64 AVX-512 + VNNI pair kernels of the few-token products (see
//! [`gemm_pairs`](crate::quants::gemm_pairs)): each weight block unpacked once into a register
//! and met by up to 8 tokens, two per 512-bit register; every element bit-identical to the
//! single dot of `x86_avx512.rs` (and to [`b32_cell_scalar`](crate::quants::gemm::b32_cell_scalar)).

use std::arch::x86_64::*;

use super::x86_avx2::{hsum_float_8, ld128};
use super::x86_avx512::Avx512;
use crate::quants::blocks::{BlockQ5_0, BlockQ8_0};
use crate::quants::dequant::WeightBlock;
use crate::quants::gemm::Block32Gemm;
use crate::quants::gemm_pairs::B32Pairs;
use crate::quants::{F16Le, GgmlType};

/// The weight scale broadcast to 8 lanes as f32 (`vpbroadcastw` + `vcvtph2ps`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scale8(d: F16Le) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(d.to_bits() as i16))
}

/// Q5_0's 32 unsigned quants `nibble | bit << 4` (= q + 16) in value order: low nibbles then
/// high nibbles, byte `i` taking bit `i` of `qh`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unpack_q5_0(x: &BlockQ5_0) -> __m256i {
    let t = ld128(&x.qs);
    let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), _mm256_set1_epi8(0x0f));
    let high = _cvtu32_mask32(u32::from_le_bytes(x.qh));
    _mm256_mask_add_epi8(nib, high, nib, _mm256_set1_epi8(0x10))
}

/// Q8_0's 32 quants as unsigned `q + 128`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unpack_q8_0(x: &BlockQ8_0) -> __m256i {
    // SAFETY: `qs` is 32 readable bytes; loadu needs no alignment.
    let q = unsafe { _mm256_loadu_si256(x.qs.as_ptr().cast()) };
    _mm256_xor_si256(q, _mm256_set1_epi8(-128))
}

/// The permutation that spreads the tokens' scale products `d[2p]` over lanes 0..8 and
/// `d[2p + 1]` over lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pair_index(p: usize) -> __m512i {
    let (lo, hi) = ((2 * p) as i32, (2 * p + 1) as i32);
    _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo)
}

/// Writes `hsum_float_8` of each token half of `acc` to `out[2p + h][r]` for the tokens held.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn store_pair(acc: __m512, p: usize, tokens: usize, out: &mut [&mut [f32]], r: usize) {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    out[2 * p][r] = hsum_float_8(lo);
    if 2 * p + 1 < tokens {
        out[2 * p + 1][r] = hsum_float_8(hi);
    }
}

/// How far ahead of the block being multiplied the weights are prefetched.
const PREFETCH_BYTES: usize = 2048;

/// The pair kernel of one weight type, `P` registers of two tokens, for every row of `blocks`
/// (`[rows][per_row]`, shapes checked by the caller through [`B32Pairs::fits`]). `$unpack`
/// gives a block's unsigned quants (`q + OFFSET`). One row at a time: two rows interleaved
/// (twice the independent chains) measured faster with the weights in cache but 1.5x slower
/// with them streaming from memory, as they do in a decode step.
macro_rules! pairs_kernel {
    ($name:ident, $w:ty, $unpack:ident) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn $name<const P: usize>(blocks: &[$w], g: &B32Pairs, out: &mut [&mut [f32]]) {
            let n = g.per_row;
            let mut idx = [_mm512_setzero_si512(); P];
            for (p, i) in idx.iter_mut().enumerate() {
                *i = pair_index(p);
            }
            let (y, corr, da) = (&g.y[..n * P], &g.corr[..n * P], &g.da[..n]);
            for (r, row) in blocks.chunks_exact(n).enumerate() {
                let mut acc = [_mm512_setzero_ps(); P];
                for (b, x) in row.iter().enumerate() {
                    // The weights stream from memory once per call: ask for them ahead of
                    // this block (a prefetch never faults, so past the end is harmless).
                    _mm_prefetch::<_MM_HINT_T0>((x as *const $w).cast::<i8>().wrapping_add(PREFETCH_BYTES));
                    let u = _mm512_broadcast_i64x4($unpack(x));
                    // SAFETY: `da[b]` is 8 readable f32; loadu needs no alignment.
                    let da8 = unsafe { _mm256_loadu_ps(da[b].as_ptr()) };
                    let d16 = _mm512_zextps256_ps512(_mm256_mul_ps(scale8(x.d), da8));
                    for p in 0..P {
                        let s = b * P + p;
                        // SAFETY: `corr[s]` is 16 i32 and `y[s]` 64 bytes, readable; loadu
                        // needs no alignment.
                        let (c, ys) = unsafe {
                            (_mm512_loadu_si512(corr[s].as_ptr().cast()), _mm512_loadu_si512(y[s].as_ptr().cast()))
                        };
                        let lanes = _mm512_dpbusd_epi32(c, u, ys);
                        let d = _mm512_permutexvar_ps(idx[p], d16);
                        acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[p]);
                    }
                }
                for (p, &a) in acc.iter().enumerate() {
                    store_pair(a, p, g.tokens, out, r);
                }
            }
        }
    };
}

pairs_kernel!(q5_0_pairs, BlockQ5_0, unpack_q5_0);
pairs_kernel!(q8_0_pairs, BlockQ8_0, unpack_q8_0);

/// [`q5_0_pairs`] / [`q8_0_pairs`] for `g.pairs` registers.
macro_rules! by_pairs {
    ($kernel:ident, $blocks:expr, $g:expr, $out:expr) => {
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe {
            match $g.pairs {
                1 => $kernel::<1>($blocks, $g, $out),
                2 => $kernel::<2>($blocks, $g, $out),
                3 => $kernel::<3>($blocks, $g, $out),
                _ => $kernel::<4>($blocks, $g, $out),
            }
        }
    };
}

impl Avx512 {
    /// `out[t][r] = dot(row r of blocks, token t of g)` for the `n_rows` rows of `blocks`
    /// (`[n_rows][g.per_row]`), bit-identical to the single dot. `false`, writing nothing,
    /// where the shapes do not fit or `W` has no pair kernel (Q5_0 and Q8_0 do).
    pub fn b32_pairs<W: Block32Gemm + WeightBlock>(
        self,
        blocks: &[W],
        n_rows: usize,
        g: &B32Pairs,
        out: &mut [&mut [f32]],
    ) -> bool {
        if !g.fits(blocks, n_rows, out) || g.per_row == 0 {
            return false;
        }
        match W::TYPE {
            GgmlType::Q5_0 => match bytemuck::try_cast_slice::<W, BlockQ5_0>(blocks) {
                Ok(b) => by_pairs!(q5_0_pairs, b, g, out),
                Err(_) => return false,
            },
            GgmlType::Q8_0 => match bytemuck::try_cast_slice::<W, BlockQ8_0>(blocks) {
                Ok(b) => by_pairs!(q8_0_pairs, b, g, out),
                Err(_) => return false,
            },
            _ => return false,
        }
        true
    }
}
