//! x86-64 AVX-512 + VNNI pair kernels of the few-token products (see
//! [`gemm_pairs`](crate::quants::gemm_pairs)): each weight block unpacked once into registers
//! and met by up to 8 tokens, two per 512-bit register; every element bit-identical to the
//! single-token kernel of its type (twins: [`b32_cell_scalar`](crate::quants::gemm::b32_cell_scalar),
//! [`gemv_q4_k`](crate::quants::gemv::gemv_q4_k), [`q6k_cell_scalar`](crate::quants::gemm_k::q6k_cell_scalar)).

use std::arch::x86_64::*;

use super::x86_avx2::{hsum_float_8, ld128, ld256, q6_quants};
use super::x86_avx512::Avx512;
use crate::quants::blocks::{BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, k4_scales_mins};
use crate::quants::dequant::WeightBlock;
use crate::quants::gemm::Block32Gemm;
use crate::quants::gemm_pairs::{B32Pairs, B32Rows, K8Pairs, PAIR_TOKENS};
use crate::quants::F16Le;

/// The weight scale broadcast to 8 lanes as f32 (`vpbroadcastw` + `vcvtph2ps`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scale8(d: F16Le) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(d.to_bits() as i16))
}

/// Q5_0's 32 unsigned quants `nibble | bit << 4` (= q + 16) in value order (low nibbles then
/// high nibbles, byte `i` taking bit `i` of `qh`), in both 256-bit halves: the 16 packed bytes
/// broadcast to the four 128-bit chunks, chunks 1 and 3 shifted to their high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unpack_q5_0(x: &BlockQ5_0) -> __m512i {
    let packed = _mm512_broadcast_i32x4(ld128(&x.qs));
    let shifts = _mm512_set_epi64(0x0004_0004_0004_0004, 0x0004_0004_0004_0004, 0, 0, 0x0004_0004_0004_0004, 0x0004_0004_0004_0004, 0, 0);
    let nib = _mm512_and_si512(_mm512_srlv_epi16(packed, shifts), _mm512_set1_epi8(0x0f));
    add_bytes_masked(nib, high_bits(&x.qh), _mm512_set1_epi8(0x10))
}

/// The 32 fifth bits `qh` as a mask of both 256-bit halves' bytes: loaded straight into a mask
/// register and doubled (`kmovd`, `kunpckdq`). Through `_cvtu64_mask64` LLVM builds the 64
/// bits in a general register (a load, two shifts and an `or`), scalar work that competes for
/// the vector ports' issue slots.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn high_bits(qh: &[u8; 4]) -> __mmask64 {
    let k: __mmask64;
    // SAFETY: `qh` is 4 readable bytes, all that `kmovd` reads; the instructions (AVX-512BW,
    // enabled for this function) write nothing but `k`.
    unsafe {
        std::arch::asm!("kmovd {k}, dword ptr [{p}]", "kunpckdq {k}, {k}, {k}", p = in(reg) qh.as_ptr(), k = out(kreg) k,
            options(pure, readonly, nostack, preserves_flags));
    }
    k
}

/// `a + b` in the bytes `k` selects, `a` elsewhere: one masked `vpaddb`. Written as
/// `_mm512_mask_add_epi8`, LLVM sees that the nibbles leave bit 4 clear and emits an `or` and
/// a masked move instead, a vector operation more per block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn add_bytes_masked(a: __m512i, k: __mmask64, b: __m512i) -> __m512i {
    let mut r = a;
    // SAFETY: register-only instruction (AVX-512BW, enabled for this function); it writes `r`
    // only.
    unsafe {
        std::arch::asm!("vpaddb {r}{{{k}}}, {r}, {b}", r = inout(zmm_reg) r, k = in(kreg) k, b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// Q8_0's 32 quants as unsigned `q + 128`, in both 256-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unpack_q8_0(x: &BlockQ8_0) -> __m512i {
    let q = _mm512_broadcast_i64x4(ld256(&x.qs));
    _mm512_xor_si512(q, _mm512_set1_epi8(-128))
}

/// For each pair `p < P`, the permutation that spreads the tokens' scale products `d[2p]` over
/// lanes 0..8 and `d[2p + 1]` over lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pair_indices<const P: usize>() -> [__m512i; P] {
    let mut idx = [_mm512_setzero_si512(); P];
    for (p, i) in idx.iter_mut().enumerate() {
        let (lo, hi) = ((2 * p) as i32, (2 * p + 1) as i32);
        *i = _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
    }
    idx
}

/// The weight scale times each token's scale (`da`, one rounding each, as `f16_mul`), as 8
/// f32 in the low half: what [`fma_pair`] spreads over a pair's lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn token_scales(d: F16Le, da: &[f32; PAIR_TOKENS]) -> __m512 {
    // SAFETY: `da` is 8 readable f32; loadu needs no alignment.
    let da8 = unsafe { _mm256_loadu_ps(da.as_ptr()) };
    _mm512_zextps256_ps512(_mm256_mul_ps(scale8(d), da8))
}

/// One block of a pair: `acc = fma(d, f32(lanes), acc)` with pair `idx`'s two scales from `d16`
/// ([`token_scales`]) over their token's 8 lanes: the single dot's step for both tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn fma_pair(acc: __m512, idx: __m512i, d16: __m512, lanes: __m512i) -> __m512 {
    _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, d16), _mm512_cvtepi32_ps(lanes), acc)
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
            let idx = pair_indices::<P>();
            let (y, corr, da) = (&g.y[..n * P], &g.corr[..n * P], &g.da[..n]);
            for (r, row) in blocks.chunks_exact(n).enumerate() {
                let mut acc = [_mm512_setzero_ps(); P];
                for (b, x) in row.iter().enumerate() {
                    prefetch_block::<$w, 1>(x);
                    let u = $unpack(x);
                    let d16 = token_scales(x.d, &da[b]);
                    for p in 0..P {
                        let s = b * P + p;
                        // SAFETY: `corr[s]` is 16 i32 and `y[s]` 64 bytes, readable; loadu
                        // needs no alignment.
                        let (c, ys) = unsafe {
                            (_mm512_loadu_si512(corr[s].as_ptr().cast()), _mm512_loadu_si512(y[s].as_ptr().cast()))
                        };
                        acc[p] = fma_pair(acc[p], idx[p], d16, _mm512_dpbusd_epi32(c, u, ys));
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
        match g.rows(blocks, n_rows, out) {
            Some(B32Rows::Q5_0(b)) => by_pairs!(q5_0_pairs, b, g, out),
            Some(B32Rows::Q8_0(b)) => by_pairs!(q8_0_pairs, b, g, out),
            None => return false,
        }
        true
    }
}

// ---- K-quants (Q8_K activations, see `K8Pairs`)

/// Asks for the `BYTES` bytes (one line per 64, at least one) [`PREFETCH_BYTES`] ahead of `x`:
/// the weights stream from memory once per call (a prefetch never faults, so past the end is
/// harmless).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn prefetch_block<T, const BYTES: usize>(x: &T) {
    let at = (x as *const T).cast::<i8>().wrapping_add(PREFETCH_BYTES);
    let mut off = 0;
    while off < BYTES {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(off));
        off += 64;
    }
}

/// One 32-value chunk of two tokens (`y`, 64 bytes) times the broadcast unsigned quants `q`,
/// each i16 pair times its scale in `sc`, added to `acc`: `maddubs` (pairs of at most
/// 2·63·127, no saturation) then `vpdpwssd`, the same integers as ggml's `madd(sc, maddubs)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scaled_pair_chunk(acc: __m512i, q: __m512i, y: &[i8; 64], sc: __m512i) -> __m512i {
    // SAFETY: `y` is 64 readable bytes; loadu needs no alignment.
    let y = unsafe { _mm512_loadu_si512(y.as_ptr().cast()) };
    _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, y), sc)
}

/// Per 128-bit chunk `c` of `g` and `h` (4 i32 lanes each), the sums of its lanes: result lane
/// `c` = chunk `c` of `g`, lane `4 + c` = chunk `c` of `h` (exact, wrapping i32 sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn chunk_sums(g: __m512i, h: __m512i) -> __m256i {
    // per chunk: [g0+g2, h0+h2, g1+g3, h1+h3], then lane 0 = Σg, lane 1 = Σh
    let s = _mm512_add_epi32(_mm512_unpacklo_epi32(g, h), _mm512_unpackhi_epi32(g, h));
    let s = _mm512_add_epi32(s, _mm512_shuffle_epi32::<0b01_00_11_10>(s));
    let idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, s))
}

/// The 8 i32 lanes of each token in `sums` (pair `p`: token `2p` in lanes 0..8, `2p + 1` in
/// 8..16) summed: lane `t` of the result is token `t`'s sum (0 for pairs past `P`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn token_sums<const P: usize>(sums: &[__m512i; P]) -> __m256i {
    let mut f = [_mm512_setzero_si512(); 4];
    for p in 0..P {
        // chunk 0 += chunk 1 (token 2p), chunk 2 += chunk 3 (token 2p + 1)
        f[p] = _mm512_add_epi32(sums[p], _mm512_shuffle_i32x4::<0b10_11_00_01>(sums[p], sums[p]));
    }
    // chunks: tokens 0, 1, 2, 3 and 4, 5, 6, 7, four partial lanes each
    let g = _mm512_shuffle_i32x4::<0b10_00_10_00>(f[0], f[1]);
    let h = _mm512_shuffle_i32x4::<0b10_00_10_00>(f[2], f[3]);
    chunk_sums(g, h)
}

/// Writes lane `t` of `v` to `out[t][r]` for the tokens held.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn store_tokens(v: __m256, tokens: usize, out: &mut [&mut [f32]], r: usize) {
    let mut lanes = [0.0f32; PAIR_TOKENS];
    // SAFETY: `lanes` is 8 writable f32; storeu needs no alignment.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    for (o, &x) in out[..tokens].iter_mut().zip(&lanes) {
        o[r] = x;
    }
}

/// Q4_K rows in ggml's repacked gemv order against `P` pairs of tokens: per super-block each
/// token's `dot = Σ_j sc_j (q_j · a_j)` and `min = Σ_j m_j bsum32_j` (exact integers), then for
/// all tokens at once `acc = fma(dot, d_w * d_a, acc)`, `acc_min = fma(min, dmin_w * d_a,
/// acc_min)`; result `acc - acc_min`, as [`gemv_q4_k`](crate::quants::gemv::gemv_q4_k).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k_gemv_pairs<const P: usize>(blocks: &[BlockQ4K], g: &K8Pairs, out: &mut [&mut [f32]]) {
    let n = g.per_row;
    let (y, bs32, da) = (&g.y[..n * 8 * P], &g.bs32[..n], &g.da[..n]);
    let m4 = _mm256_set1_epi8(0x0f);
    for (r, row) in blocks.chunks_exact(n).enumerate() {
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for (s, x) in row.iter().enumerate() {
            prefetch_block::<BlockQ4K, 144>(x);
            let (sc, m) = k4_scales_mins(&x.scales);
            let (qs, _) = x.qs.as_chunks::<32>();
            let mut q = [_mm512_setzero_si512(); 8];
            for (c, bits) in qs.iter().enumerate() {
                let bits = ld256(bits);
                q[2 * c] = _mm512_broadcast_i64x4(_mm256_and_si256(bits, m4));
                q[2 * c + 1] = _mm512_broadcast_i64x4(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4));
            }
            let mut sums = [_mm512_setzero_si512(); P];
            for j in 0..8 {
                let scale = _mm512_set1_epi16(i16::from(sc[j]));
                for (p, sum) in sums.iter_mut().enumerate() {
                    *sum = scaled_pair_chunk(*sum, q[j], &y[(s * 8 + j) * P + p], scale);
                }
            }
            let dot = token_sums(&sums);
            // each token's 8 sums of 32 against the 8 mins (one token per 128-bit chunk)
            let mins = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(m))));
            // SAFETY: `bs32[s]` is 64 readable i16; loadu needs no alignment.
            let (b0, b1) = unsafe {
                (_mm512_loadu_si512(bs32[s].as_ptr().cast()), _mm512_loadu_si512(bs32[s][32..].as_ptr().cast()))
            };
            let min = chunk_sums(_mm512_madd_epi16(b0, mins), _mm512_madd_epi16(b1, mins));
            // SAFETY: `da[s]` is 8 readable f32; loadu needs no alignment.
            let da8 = unsafe { _mm256_loadu_ps(da[s].as_ptr()) };
            let d = _mm256_mul_ps(scale8(x.d), da8);
            let dmin = _mm256_mul_ps(scale8(x.dmin), da8);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min), dmin, acc_min);
        }
        store_tokens(_mm256_sub_ps(acc, acc_min), g.tokens, out, r);
    }
}

/// `vpermw` indices spreading scale `2j` over i16 lanes 0..8 and `2j + 1` over 8..16 of each
/// 256-bit half (a Q6_K chunk's two 16-value scales, for both tokens of a pair).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6_scale_index(j: usize) -> __m512i {
    let (a, b) = ((2 * j) as i16, (2 * j + 1) as i16);
    let half = _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a));
    _mm512_broadcast_i64x4(half)
}

/// Q6_K rows in `ggml_vec_dot_q6_K_q8_K`'s order against `P` pairs of tokens: each token's 8
/// lanes `Σ_c sc·(q · a) - 32 (bsums · scales)`, `acc = fma(d_a * d_w, lane, acc)` per
/// super-block, `hsum_float_8` at the end (as [`q6k_cell_scalar`](crate::quants::gemm_k::q6k_cell_scalar)).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6_k_pairs<const P: usize>(blocks: &[BlockQ6K], g: &K8Pairs, out: &mut [&mut [f32]]) {
    let n = g.per_row;
    let (y, bsums, da) = (&g.y[..n * 8 * P], &g.bsums[..n * P], &g.da[..n]);
    let idx = pair_indices::<P>();
    let mut sc_idx = [_mm512_setzero_si512(); 8];
    for (j, i) in sc_idx.iter_mut().enumerate() {
        *i = q6_scale_index(j);
    }
    for (r, row) in blocks.chunks_exact(n).enumerate() {
        let mut acc = [_mm512_setzero_ps(); P];
        for (s, x) in row.iter().enumerate() {
            prefetch_block::<BlockQ6K, 210>(x);
            let q6 = q6_quants(x);
            let mut q = [_mm512_setzero_si512(); 8];
            for (q, &v) in q.iter_mut().zip(&q6) {
                // (a loop, not `map`: a closure does not inherit the target features)
                *q = _mm512_broadcast_i64x4(v);
            }
            // the 16 scales as i16, in both halves
            let scales = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(ld128(&x.scales)));
            let d16 = token_scales(x.d, &da[s]);
            let mut sums = [_mm512_setzero_si512(); P];
            for j in 0..8 {
                let sc = _mm512_permutexvar_epi16(sc_idx[j], scales);
                for (p, sum) in sums.iter_mut().enumerate() {
                    *sum = scaled_pair_chunk(*sum, q[j], &y[(s * 8 + j) * P + p], sc);
                }
            }
            for p in 0..P {
                // SAFETY: `bsums[s * P + p]` is 32 readable i16; loadu needs no alignment.
                let b = unsafe { _mm512_loadu_si512(bsums[s * P + p].as_ptr().cast()) };
                let corr = _mm512_slli_epi32::<5>(_mm512_madd_epi16(b, scales));
                acc[p] = fma_pair(acc[p], idx[p], d16, _mm512_sub_epi32(sums[p], corr));
            }
        }
        for (p, &a) in acc.iter().enumerate() {
            store_pair(a, p, g.tokens, out, r);
        }
    }
}

impl Avx512 {
    /// `out[t][r]` for the `n_rows` Q4_K rows of `blocks` (`[n_rows][g.per_row]`) in ggml's
    /// repacked gemv order ([`gemv_q4_k`](crate::quants::gemv::gemv_q4_k), bit for bit).
    /// `false`, writing nothing, where the shapes do not fit.
    pub fn k4_gemv_pairs(self, blocks: &[BlockQ4K], n_rows: usize, g: &K8Pairs, out: &mut [&mut [f32]]) -> bool {
        if !g.fits(blocks, n_rows, out) || g.per_row == 0 {
            return false;
        }
        by_pairs!(q4_k_gemv_pairs, blocks, g, out);
        true
    }

    /// `out[t][r]` for the `n_rows` Q6_K rows of `blocks` (`[n_rows][g.per_row]`), bit for
    /// bit the single dot. `false`, writing nothing, where the shapes do not fit.
    pub fn k6_pairs(self, blocks: &[BlockQ6K], n_rows: usize, g: &K8Pairs, out: &mut [&mut [f32]]) -> bool {
        if !g.fits(blocks, n_rows, out) || g.per_row == 0 {
            return false;
        }
        by_pairs!(q6_k_pairs, blocks, g, out);
        true
    }
}
