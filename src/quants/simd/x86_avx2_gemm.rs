//! x86-64 AVX2 kernels of the many-token products (prefill), for CPUs without AVX-512: the
//! same row-lane tiles as `x86_avx512_gemm.rs` ([`gemm`](crate::quants::gemm),
//! [`gemm_k`](crate::quants::gemm_k)), each 16-row group taken as two 8-row halves, and every
//! element bit-identical to the single-token x86 kernels and to the scalar twins.
//!
//! # Integers without VNNI
//!
//! `vpdpbusd` (4 u8 × 4 i8 into an i32) becomes `vpmaddubsw` (pairs of u8 × i8 into an i16,
//! *saturating*) then `vpmaddwd` (pairs of i16 into an i32). The result is exact when no pair
//! sum leaves the i16 range, which holds for every operand here (activations are Q8 quants
//! within ±127):
//!
//! * Q5_0 (`u = q + 16 ≤ 31`): a pair is at most 2·31·127 = 7874;
//! * Q8_0 (`u = q + 128` would reach 2·255·127): the signed quant `q = u ^ 0x80` is used
//!   instead, as ggml's `mul_sum_i8_pairs` does: `|q|` times the activation with `q`'s sign
//!   (`vpsignb`), at most 2·128·127 = 32512, and the lane is `Σ q·a` directly, which is the
//!   `corr + Σ u·a` of the other types (no correction is added);
//! * Q4_K (`u ≤ 15`): 8 groups of a 32-value sub-block summed in i16 stay within
//!   16·15·127 = 30480, and `vpmaddwd` with `(sc, sc)` pairs multiplies by the scale on the way
//!   to i32 (`sc · Σ`, exact);
//! * Q6_K (`u ≤ 63`): a pair is at most 2·63·127 = 16002; `vpmaddwd` with `(sc, sc)` gives
//!   `sc · Σ` of the 4-value group; the `bsums` corrections are `vpmaddwd` of i16 pairs, as in
//!   the AVX-512 kernel.
//!
//! The float steps (which products meet which accumulator, in which order) are the AVX-512
//! kernels' and the scalar twins', so the results are the same bits.

use std::arch::x86_64::*;

use super::x86_avx2::Avx2;
use crate::quants::gemm::{B32Panel, B32Tile};
use crate::quants::gemm_k::{K4Tile, K6Tile, K8Panel, LANES, k6_write};
use crate::quants::BlockQ8K;

/// Rows per 256-bit register (half of a 16-row group).
const HALF: usize = LANES / 2;

/// Activation bytes `4g..4g+4` of `qs`, broadcast to 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bcast4(qs: &[i8], g: usize) -> __m256i {
    let four = &qs[4 * g..4 * g + 4];
    // SAFETY: `four` is 4 readable bytes; read_unaligned needs no alignment.
    _mm256_set1_epi32(unsafe { four.as_ptr().cast::<i32>().read_unaligned() })
}

/// Bytes `32h..32h+32` of a 64-byte row-lane group: rows `8h..8h+8`, 4 bytes each.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld_half(g: &[u8; 64], h: usize) -> __m256i {
    let half = &g[32 * h..32 * h + 32];
    // SAFETY: `half` is 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(half.as_ptr().cast()) }
}

/// Floats `8h..8h+8` of a 16-row lane array.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld_f32(v: &[f32; LANES], h: usize) -> __m256 {
    // SAFETY: 8 readable f32 at 8h (h < 2).
    unsafe { _mm256_loadu_ps(v[HALF * h..].as_ptr()) }
}

/// Lanes `8h..8h+8` of a 16-lane array of 32-bit words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld_i32<T: Copy>(v: &[T; LANES], h: usize) -> __m256i {
    const { assert!(size_of::<T>() == 4) };
    // SAFETY: T is 4 bytes (checked above), so 8 of them at 8h (h < 2) are 32 readable bytes.
    unsafe { _mm256_loadu_si256(v[HALF * h..].as_ptr().cast()) }
}

/// `(x, x)` as two i16 per lane, for lanes whose upper 16 bits are zero (`x` the low half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair16(x: __m256i) -> __m256i {
    _mm256_or_si256(x, _mm256_slli_epi32::<16>(x))
}

// ---- 32-value blocks (Q5_0, Q8_0): see `crate::quants::gemm`

/// Half `h` of row group `v` against token `t` over every block: per block
/// `lane_k = Σ (u - off)·a` over values `4k..4k+4`, then `acc[k] = fma(d_w * d_a, lane_k,
/// acc[k])` in block order (the dots' float order); the 8 accumulators stay in registers.
/// `SIGNED`: the Q8_0 form (signed quants, no correction).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn b32_pass<const SIGNED: bool>(tile: &B32Tile, panel: &B32Panel, v: usize, h: usize, t: usize) -> [__m256; 8] {
    let n = tile.per_row;
    let q = &tile.q[v * n * 8..][..n * 8];
    let d = &tile.d[v * n..][..n];
    // The token's rows, cut to `n` blocks once (no bounds checks in the loop).
    let (acts, corr, da) = (&panel.acts[t][..n], &panel.corr[t][..n], &panel.da[t][..n]);
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [_mm256_setzero_ps(); 8];
    for ((((groups, dw), a), c), &da) in q.chunks_exact(8).zip(d).zip(acts).zip(corr).zip(da) {
        let dd = _mm256_mul_ps(ld_f32(dw, h), _mm256_set1_ps(da));
        for (k, acc) in acc.iter_mut().enumerate() {
            let w = ld_half(&groups[k], h);
            let x = bcast4(&a.qs, k);
            let lane = if SIGNED {
                let s = _mm256_xor_si256(w, flip);
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(s), _mm256_sign_epi8(x, s)), ones)
            } else {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
                _mm256_add_epi32(_mm256_set1_epi32(c[k]), p)
            };
            *acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lane), *acc);
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
fn b32_tile_as<const SIGNED: bool>(tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) {
    for v in 0..tile.vecs {
        for (t, o) in out.iter_mut().enumerate().take(panel.acts.len()) {
            for h in 0..2 {
                let l = b32_pass::<SIGNED>(tile, panel, v, h, t);
                let sum = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                    _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])),
                );
                let o = &mut o[v * LANES + HALF * h..][..HALF];
                // SAFETY: o is 8 f32.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), sum) };
            }
        }
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to
/// [`b32_cell_scalar`](crate::quants::gemm::b32_cell_scalar) and to the single-token dots.
/// Tiles with mins (Q4_1) have no AVX2 kernel: `false`.
#[target_feature(enable = "avx2,fma,f16c")]
fn b32_tile(tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) -> bool {
    if !tile.m.is_empty() || !panel.fits(tile, out) {
        return false;
    }
    match tile.offset {
        // Q8_0: unsigned bytes would overflow vpmaddubsw's pairs; signed quants do not.
        128 => b32_tile_as::<true>(tile, panel, out),
        // Q5_0 (and any offset whose bytes stay below 64): pairs within i16.
        off if (0..=32).contains(&off) => b32_tile_as::<false>(tile, panel, out),
        _ => return false,
    }
    true
}

// ---- Q4_K, repacked gemv order, row lanes (see `crate::quants::gemm_k`)

/// Tokens per [`k4_step`].
const K4_T: usize = 4;

/// Per-token inputs of one super-block: the Q8_K block and its `bsum` pairs.
type K8Sb<'a> = (&'a BlockQ8K, &'a [u32; 4]);

/// Super-block `s` of half `h` of row group `v` for `T` tokens: per (row, token) ggml's two
/// gemv integers, then `acc = fma(dot, d_w*d_a, acc)`, `accm = fma(min, dmin_w*d_a, accm)` on
/// rows `8h..8h+8` of `acc[t]` / `accm[t]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_step<const T: usize>(
    tile: &K4Tile,
    (v, h, s): (usize, usize, usize),
    toks: [K8Sb; T],
    acc: &mut [[f32; LANES]],
    accm: &mut [[f32; LANES]],
) {
    let vs = v * tile.per_row + s;
    let q = &tile.q[vs * 64..][..64];
    let mut isum = [_mm256_setzero_si256(); T];
    for j in 0..8 {
        // i16 pairs: 8 groups of 4 values, at most 16·15·127 per pair
        let mut part = [_mm256_setzero_si256(); T];
        for g in 0..8 {
            let i = 8 * j + g;
            let w = ld_half(&q[i], h);
            for (t, (a, _)) in toks.iter().enumerate() {
                part[t] = _mm256_add_epi16(part[t], _mm256_maddubs_epi16(w, bcast4(&a.qs, i)));
            }
        }
        let sc = pair16(ld_i32(&tile.sc[vs * 8 + j], h));
        for t in 0..T {
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(part[t], sc));
        }
    }
    let mp: [__m256i; 4] = std::array::from_fn(|k| ld_i32(&tile.mp[vs * 4 + k], h));
    let (d, dmin) = (ld_f32(&tile.d[vs], h), ld_f32(&tile.dmin[vs], h));
    for (t, (a, bs)) in toks.iter().enumerate() {
        let mut imin = _mm256_setzero_si256();
        for k in 0..4 {
            imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mp[k], _mm256_set1_epi32(bs[k] as i32)));
        }
        let da = _mm256_set1_ps(a.d);
        let pa = acc[t][HALF * h..].as_mut_ptr();
        let pm = accm[t][HALF * h..].as_mut_ptr();
        // SAFETY: acc[t] / accm[t] are 16 f32, so 8 at 8h (h < 2).
        unsafe {
            let f = _mm256_cvtepi32_ps(isum[t]);
            _mm256_storeu_ps(pa, _mm256_fmadd_ps(f, _mm256_mul_ps(d, da), _mm256_loadu_ps(pa)));
            let f = _mm256_cvtepi32_ps(imin);
            _mm256_storeu_ps(pm, _mm256_fmadd_ps(f, _mm256_mul_ps(dmin, da), _mm256_loadu_ps(pm)));
        }
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to ggml's repacked
/// gemv per element ([`gemv_q4_k`](crate::quants::gemv::gemv_q4_k)).
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_tile(tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
    let n = tile.per_row;
    let tokens = panel.acts.len();
    if !panel.fits((tile.vecs, n), out) {
        return false;
    }
    let sb = |t: usize, s: usize| -> K8Sb { (&panel.acts[t][s], &panel.bs[t][s]) };
    // [tokens] accumulators of 16 rows
    let mut acc = vec![[0.0f32; LANES]; tokens];
    let mut accm = vec![[0.0f32; LANES]; tokens];
    for v in 0..tile.vecs {
        acc.fill([0.0; LANES]);
        accm.fill([0.0; LANES]);
        for s in 0..n {
            for h in 0..2 {
                let mut t = 0;
                while t + K4_T <= tokens {
                    let toks: [K8Sb; K4_T] = std::array::from_fn(|i| sb(t + i, s));
                    k4_step::<K4_T>(tile, (v, h, s), toks, &mut acc[t..], &mut accm[t..]);
                    t += K4_T;
                }
                while t < tokens {
                    k4_step::<1>(tile, (v, h, s), [sb(t, s)], &mut acc[t..], &mut accm[t..]);
                    t += 1;
                }
            }
        }
        for ((o, a), m) in out.iter_mut().zip(&acc).zip(&accm) {
            let rows = &mut o[v * LANES..(v + 1) * LANES];
            for ((o, a), m) in rows.iter_mut().zip(a).zip(m) {
                *o = a - m;
            }
        }
    }
    true
}

// ---- Q6_K, vec_dot order, row lanes (see `crate::quants::gemm_k`)

/// Tokens per [`k6_step`].
const K6_T: usize = 4;

/// Super-block `s` of half `h` of row group `v` for `T` tokens: ggml's 8 lane integers per
/// (row, token), lane by lane, then `acc[t][k] = fma(d_a*d_w, lane_k, acc[t][k])` on rows
/// `8h..8h+8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k6_step<const T: usize>(
    tile: &K6Tile,
    (v, h, s): (usize, usize, usize),
    toks: [&BlockQ8K; T],
    acc: &mut [[[f32; LANES]; 8]],
) {
    let vs = v * tile.per_row + s;
    let q = &tile.q[vs * 64..][..64];
    let scp = &tile.scp[vs * 16..][..16];
    let d = ld_f32(&tile.d[vs], h);
    let mut dd = [_mm256_setzero_ps(); T];
    for (t, a) in toks.iter().enumerate() {
        dd[t] = _mm256_mul_ps(_mm256_set1_ps(a.d), d);
    }
    for k in 0..8 {
        let mut lane = [_mm256_setzero_si256(); T];
        for c in 0..8 {
            let i = 8 * c + k;
            let w = ld_half(&q[i], h);
            // (sc, sc) of the value group's 16-value sub-block (the tile holds (sc, 0))
            let sc = pair16(_mm256_and_si256(ld_i32(&scp[i / 4], h), _mm256_set1_epi32(0xffff)));
            for (t, a) in toks.iter().enumerate() {
                let p = _mm256_maddubs_epi16(w, bcast4(&a.qs, i));
                lane[t] = _mm256_add_epi32(lane[t], _mm256_madd_epi16(p, sc));
            }
        }
        let sp = ld_i32(&tile.sp[vs * 8 + k], h);
        for (t, a) in toks.iter().enumerate() {
            let pair = i32::from(a.bsums[2 * k] as u16) | i32::from(a.bsums[2 * k + 1] as u16) << 16;
            let corr = _mm256_madd_epi16(sp, _mm256_set1_epi32(pair));
            let l = _mm256_sub_epi32(lane[t], _mm256_slli_epi32::<5>(corr));
            let p = acc[t][k][HALF * h..].as_mut_ptr();
            // SAFETY: acc[t][k] is 16 f32, so 8 at 8h (h < 2).
            unsafe {
                _mm256_storeu_ps(p, _mm256_fmadd_ps(dd[t], _mm256_cvtepi32_ps(l), _mm256_loadu_ps(p)));
            }
        }
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to the single-token
/// Q6_K kernels ([`q6k_cell_scalar`](crate::quants::gemm_k::q6k_cell_scalar)).
#[target_feature(enable = "avx2,fma,f16c")]
fn k6_tile(tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
    let n = tile.per_row;
    let tokens = panel.acts.len();
    if !panel.fits((tile.vecs, n), out) {
        return false;
    }
    // [tokens][8 lanes] accumulators of 16 rows
    let mut acc = vec![[[0.0f32; LANES]; 8]; tokens];
    for v in 0..tile.vecs {
        acc.fill([[0.0; LANES]; 8]);
        for s in 0..n {
            for h in 0..2 {
                let mut t = 0;
                while t + K6_T <= tokens {
                    let toks: [&BlockQ8K; K6_T] = std::array::from_fn(|i| &panel.acts[t + i][s]);
                    k6_step::<K6_T>(tile, (v, h, s), toks, &mut acc[t..]);
                    t += K6_T;
                }
                while t < tokens {
                    k6_step::<1>(tile, (v, h, s), [&panel.acts[t][s]], &mut acc[t..]);
                    t += 1;
                }
            }
        }
        k6_write(out, &acc, v);
    }
    true
}

impl Avx2 {
    /// [`b32_tile`]: `out[t][r] = dot(row r of tile, token t of panel)`.
    /// `false`, writing nothing, if the shapes do not fit.
    pub fn b32_tile(self, tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) -> bool {
        // SAFETY: an Avx2 token exists only where detection found AVX2, FMA and F16C.
        unsafe { b32_tile(tile, panel, out) }
    }

    /// [`k4_tile`]: `out[t][r] = gemv_q4_k(row r of tile, token t of panel)`.
    pub fn k4_tile(self, tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
        // SAFETY: as above.
        unsafe { k4_tile(tile, panel, out) }
    }

    /// [`k6_tile`]: `out[t][r] = q6_k dot(row r of tile, token t of panel)`.
    pub fn k6_tile(self, tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
        // SAFETY: as above.
        unsafe { k6_tile(tile, panel, out) }
    }
}
