//! x86-64 AVX-512 + VNNI kernels of the many-token products (prefill), the SIMD side of
//! [`gemm`](crate::quants::gemm) and [`gemm_k`](crate::quants::gemm_k); every element
//! bit-identical to the single-token kernels of `x86_avx512.rs` and to the scalar twins.

use std::arch::x86_64::*;

use super::x86_avx512::Avx512;
use crate::quants::BlockQ8_0;
use crate::quants::gemm::{B32Panel, B32Tile};
use crate::quants::gemm_k::{K4Tile, K6Tile, K8Panel, LANES, k6_write};

// ---- many-token products: see `crate::quants::gemm`

/// Activation bytes `4g..4g+4` of `qs`, broadcast to 16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn bcast4(qs: &[i8], g: usize) -> __m512i {
    let four = &qs[4 * g..4 * g + 4];
    // SAFETY: `four` is 4 readable bytes; read_unaligned needs no alignment.
    _mm512_set1_epi32(unsafe { four.as_ptr().cast::<i32>().read_unaligned() })
}

/// `hsum_float_8` of 16 rows at once: `acc[k]` holds lane `k` of each row, summed
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` as ggml's `hsum_float_8`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn hsum_lanes8(acc: &[__m512; 8]) -> __m512 {
    _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
        _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])),
    )
}

/// Tokens per [`b32_step`].
const B32_T: usize = 2;

/// Row group `v` against `T` tokens over every block: per block, lane `k` of 16 rows is
/// `corr_k + vpdpbusd(u_k, a[4k..4k+4])`, then `acc[t][k] = fma(d_w * d_a, lane, acc[t][k])`;
/// the result per row is `hsum_float_8` of its 8 lanes, written to `out[t][16 rows]`. `MIN`
/// (Q4_1): per block also `summs[t] = fma(m_w, s_a, summs[t])`, added to the result last, as
/// ggml's `q4_1_q8_1` does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_step<const T: usize, const MIN: bool>(
    tile: &B32Tile,
    panel: &B32Panel,
    v: usize,
    t0: usize,
    out: &mut [&mut [f32]],
) {
    let n = tile.per_row;
    let q = &tile.q[v * n * 8..][..n * 8];
    let d = &tile.d[v * n..][..n];
    let m: &[[f32; LANES]] = if MIN { &tile.m[v * n..][..n] } else { &[] };
    let mut sa: [&[f32]; T] = [&[]; T];
    let mut acts: [&[BlockQ8_0]; T] = [&[]; T];
    let mut corr: [&[[i32; 8]]; T] = [&[]; T];
    let mut da: [&[f32]; T] = [&[]; T];
    for t in 0..T {
        acts[t] = &panel.acts[t0 + t][..n];
        corr[t] = &panel.corr[t0 + t][..n];
        da[t] = &panel.da[t0 + t][..n];
        if MIN {
            sa[t] = &panel.sa[t0 + t][..n];
        }
    }
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut summs = [_mm512_setzero_ps(); T];
    for b in 0..n {
        if MIN {
            // SAFETY: m[b] is 16 f32.
            let mw = unsafe { _mm512_loadu_ps(m[b].as_ptr()) };
            for t in 0..T {
                summs[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[t][b]), summs[t]);
            }
        }
        // SAFETY: d[b] is 16 f32.
        let dw = unsafe { _mm512_loadu_ps(d[b].as_ptr()) };
        let mut dd = [_mm512_setzero_ps(); T];
        for t in 0..T {
            dd[t] = _mm512_mul_ps(dw, _mm512_set1_ps(da[t][b]));
        }
        for k in 0..8 {
            // SAFETY: 64 readable bytes.
            let w = unsafe { _mm512_loadu_si512(q[b * 8 + k].as_ptr().cast()) };
            for t in 0..T {
                let x = bcast4(&acts[t][b].qs, k);
                let lane = _mm512_dpbusd_epi32(_mm512_set1_epi32(corr[t][b][k]), w, x);
                acc[t][k] = _mm512_fmadd_ps(dd[t], _mm512_cvtepi32_ps(lane), acc[t][k]);
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        let sum = if MIN { _mm512_add_ps(hsum_lanes8(acc), summs[t]) } else { hsum_lanes8(acc) };
        let o = &mut out[t0 + t][v * LANES..(v + 1) * LANES];
        // SAFETY: o is 16 f32.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), sum) };
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to the single-token
/// dots (and for Q5_0 / Q8_0 to [`b32_cell_scalar`](crate::quants::gemm::b32_cell_scalar)).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_tile(tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) -> bool {
    if !panel.fits(tile, out) {
        return false;
    }
    if tile.m.is_empty() {
        b32_steps::<false>(tile, panel, out);
    } else {
        b32_steps::<true>(tile, panel, out);
    }
    true
}

/// Every row group against every token, [`B32_T`] tokens per step.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_steps<const MIN: bool>(tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) {
    let tokens = panel.acts.len();
    for v in 0..tile.vecs {
        let mut t = 0;
        while t + B32_T <= tokens {
            b32_step::<B32_T, MIN>(tile, panel, v, t, out);
            t += B32_T;
        }
        while t < tokens {
            b32_step::<1, MIN>(tile, panel, v, t, out);
            t += 1;
        }
    }
}

impl Avx512 {
    /// [`b32_tile`]: `out[t][r] = dot(row r of tile, token t of panel)`.
    /// `false`, writing nothing, if the shapes do not fit.
    pub fn b32_tile(self, tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) -> bool {
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe { b32_tile(tile, panel, out) }
    }
}

// ---- Q4_K, repacked gemv order, row lanes (see `crate::quants::gemm_k`)

/// Row groups of 16 per [`k4_step`].
const K4_V: usize = 2;
/// Tokens per [`k4_step`].
const K4_T: usize = 4;

/// Per-token inputs of one super-block: the Q8_K block and its `bsum` pairs.
type K8Sb<'a> = (&'a crate::quants::BlockQ8K, &'a [u32; 4]);

/// One super-block `s` of row groups `v0..v0+V` for `T` tokens: the two integers of ggml's
/// gemv per (row, token), then `acc = fma(dot, d_w*d_a, acc)`, `accm = fma(min, dmin_w*d_a,
/// accm)` on `acc[t * V + v]` / `accm[t * V + v]` (16 rows each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k4_step<const V: usize, const T: usize>(
    tile: &K4Tile,
    v0: usize,
    s: usize,
    toks: [K8Sb; T],
    acc: &mut [[f32; LANES]],
    accm: &mut [[f32; LANES]],
) {
    let mut vs = [0usize; V];
    let mut q: [&[[u8; 64]]; V] = [&[]; V];
    for v in 0..V {
        vs[v] = (v0 + v) * tile.per_row + s;
        q[v] = &tile.q[vs[v] * 64..][..64];
    }
    let mut isum = [[_mm512_setzero_si512(); T]; V];
    for j in 0..8 {
        let mut part = [[_mm512_setzero_si512(); T]; V];
        for g in 0..8 {
            let i = 8 * j + g;
            let mut w = [_mm512_setzero_si512(); V];
            for v in 0..V {
                // SAFETY: q[v] holds 64 groups of 64 bytes; i < 64.
                w[v] = unsafe { _mm512_loadu_si512(q[v][i].as_ptr().cast()) };
            }
            for (t, (a, _)) in toks.iter().enumerate() {
                let x = bcast4(&a.qs, i);
                for v in 0..V {
                    part[v][t] = _mm512_dpbusd_epi32(part[v][t], w[v], x);
                }
            }
        }
        for v in 0..V {
            // SAFETY: sc holds 8 entries of 16 i32 per (row group, super-block).
            let sc = unsafe { _mm512_loadu_si512(tile.sc[vs[v] * 8 + j].as_ptr().cast()) };
            for t in 0..T {
                isum[v][t] = _mm512_add_epi32(isum[v][t], _mm512_mullo_epi32(part[v][t], sc));
            }
        }
    }
    for v in 0..V {
        // SAFETY: mp holds 4 entries, d and dmin 1, of 16 lanes per (row group, super-block).
        let (mp, d, dmin) = unsafe {
            let mp: [__m512i; 4] =
                std::array::from_fn(|k| _mm512_loadu_si512(tile.mp[vs[v] * 4 + k].as_ptr().cast()));
            let d = _mm512_loadu_ps(tile.d[vs[v]].as_ptr());
            (mp, d, _mm512_loadu_ps(tile.dmin[vs[v]].as_ptr()))
        };
        for (t, (a, bs)) in toks.iter().enumerate() {
            let mut imin = _mm512_setzero_si512();
            for k in 0..4 {
                imin = _mm512_dpwssd_epi32(imin, mp[k], _mm512_set1_epi32(bs[k] as i32));
            }
            let da = _mm512_set1_ps(a.d);
            let cell = t * V + v;
            // SAFETY: acc / accm hold T * V entries of 16 f32 (checked by the caller).
            unsafe {
                let pa = acc[cell].as_mut_ptr();
                let pm = accm[cell].as_mut_ptr();
                let f = _mm512_cvtepi32_ps(isum[v][t]);
                _mm512_storeu_ps(pa, _mm512_fmadd_ps(f, _mm512_mul_ps(d, da), _mm512_loadu_ps(pa)));
                let f = _mm512_cvtepi32_ps(imin);
                _mm512_storeu_ps(pm, _mm512_fmadd_ps(f, _mm512_mul_ps(dmin, da), _mm512_loadu_ps(pm)));
            }
        }
    }
}

/// Runs [`k4_step`] on every token of `panel` for row groups `v0..v0+V` and super-block `s`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k4_sweep<const V: usize>(
    tile: &K4Tile,
    panel: &K8Panel,
    v0: usize,
    s: usize,
    acc: &mut [[f32; LANES]],
    accm: &mut [[f32; LANES]],
) {
    let tokens = panel.acts.len();
    let sb = |t: usize| -> K8Sb { (&panel.acts[t][s], &panel.bs[t][s]) };
    let mut t = 0;
    while t + K4_T <= tokens {
        let mut toks: [K8Sb; K4_T] = [sb(t); K4_T];
        for (i, tok) in toks.iter_mut().enumerate().skip(1) {
            *tok = sb(t + i);
        }
        let cells = t * V..(t + K4_T) * V;
        k4_step::<V, K4_T>(tile, v0, s, toks, &mut acc[cells.clone()], &mut accm[cells]);
        t += K4_T;
    }
    while t < tokens {
        let cells = t * V..(t + 1) * V;
        k4_step::<V, 1>(tile, v0, s, [sb(t)], &mut acc[cells.clone()], &mut accm[cells]);
        t += 1;
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to ggml's repacked
/// gemv per element ([`gemv_q4_k`](crate::quants::gemv::gemv_q4_k)).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k4_tile(tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
    let n = tile.per_row;
    let tokens = panel.acts.len();
    if !panel.fits((tile.vecs, n), out) {
        return false;
    }
    let mut v0 = 0;
    while v0 < tile.vecs {
        let nv = if tile.vecs - v0 >= K4_V { K4_V } else { 1 };
        // [tokens][nv] accumulators of 16 rows
        let mut acc = vec![[0.0f32; LANES]; tokens * nv];
        let mut accm = vec![[0.0f32; LANES]; tokens * nv];
        for s in 0..n {
            if nv == K4_V {
                k4_sweep::<K4_V>(tile, panel, v0, s, &mut acc, &mut accm);
            } else {
                k4_sweep::<1>(tile, panel, v0, s, &mut acc, &mut accm);
            }
        }
        for (t, o) in out.iter_mut().enumerate().take(tokens) {
            for v in 0..nv {
                let cell = t * nv + v;
                let rows = &mut o[(v0 + v) * LANES..(v0 + v + 1) * LANES];
                for ((o, a), m) in rows.iter_mut().zip(&acc[cell]).zip(&accm[cell]) {
                    *o = a - m;
                }
            }
        }
        v0 += nv;
    }
    true
}

impl Avx512 {
    /// [`k4_tile`]: `out[t][r] = gemv_q4_k(row r of tile, token t of panel)`.
    /// `false`, writing nothing, if the shapes do not fit.
    pub fn k4_tile(self, tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe { k4_tile(tile, panel, out) }
    }
}

// ---- Q6_K, vec_dot order, row lanes (see `crate::quants::gemm_k`)

/// Tokens per [`k6_step`].
const K6_T: usize = 2;

/// One super-block `s` of row group `v` for `T` tokens: ggml's 8 lane integers per (row,
/// token), each in its own register of 16 rows, then `acc[t][k] = fma(d_a*d_w, lane_k,
/// acc[t][k])`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k6_step<const T: usize>(
    tile: &K6Tile,
    v: usize,
    s: usize,
    toks: [&crate::quants::BlockQ8K; T],
    acc: &mut [[[f32; LANES]; 8]],
) {
    let vs = v * tile.per_row + s;
    let q = &tile.q[vs * 64..][..64];
    let scp = &tile.scp[vs * 16..][..16];
    let mut lanes = [[_mm512_setzero_si512(); 8]; T];
    for c in 0..8 {
        for k in 0..8 {
            let i = 8 * c + k;
            // SAFETY: 64 readable bytes each (i < 64, i / 4 < 16).
            let (w, sc) = unsafe {
                (
                    _mm512_loadu_si512(q[i].as_ptr().cast()),
                    _mm512_loadu_si512(scp[i / 4].as_ptr().cast()),
                )
            };
            for (t, a) in toks.iter().enumerate() {
                let x = bcast4(&a.qs, i);
                let part = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
                lanes[t][k] = _mm512_dpwssd_epi32(lanes[t][k], part, sc);
            }
        }
    }
    // SAFETY: 8 entries of 16 lanes, and one of 16 f32, per (row group, super-block).
    let (sp, d): ([__m512i; 8], __m512) = unsafe {
        (
            std::array::from_fn(|k| _mm512_loadu_si512(tile.sp[vs * 8 + k].as_ptr().cast())),
            _mm512_loadu_ps(tile.d[vs].as_ptr()),
        )
    };
    for (t, a) in toks.iter().enumerate() {
        let dd = _mm512_mul_ps(_mm512_set1_ps(a.d), d);
        for k in 0..8 {
            let pair = i32::from(a.bsums[2 * k] as u16) | i32::from(a.bsums[2 * k + 1] as u16) << 16;
            let corr = _mm512_dpwssd_epi32(_mm512_setzero_si512(), sp[k], _mm512_set1_epi32(pair));
            let lane = _mm512_sub_epi32(lanes[t][k], _mm512_slli_epi32::<5>(corr));
            let p = acc[t][k].as_mut_ptr();
            // SAFETY: acc[t][k] is 16 f32.
            unsafe {
                _mm512_storeu_ps(p, _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lane), _mm512_loadu_ps(p)));
            }
        }
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to the single-token
/// Q6_K kernels ([`q6k_cell_scalar`](crate::quants::gemm_k::q6k_cell_scalar)).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k6_tile(tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
    let n = tile.per_row;
    let tokens = panel.acts.len();
    if !panel.fits((tile.vecs, n), out) {
        return false;
    }
    for v in 0..tile.vecs {
        // [tokens][8 lanes] accumulators of 16 rows
        let mut acc = vec![[[0.0f32; LANES]; 8]; tokens];
        for s in 0..n {
            let mut t = 0;
            while t + K6_T <= tokens {
                let mut toks = [&panel.acts[t][s]; K6_T];
                for (i, tok) in toks.iter_mut().enumerate().skip(1) {
                    *tok = &panel.acts[t + i][s];
                }
                k6_step::<K6_T>(tile, v, s, toks, &mut acc[t..t + K6_T]);
                t += K6_T;
            }
            if t < tokens {
                k6_step::<1>(tile, v, s, [&panel.acts[t][s]], &mut acc[t..t + 1]);
            }
        }
        k6_write(out, &acc, v);
    }
    true
}

impl Avx512 {
    /// [`k6_tile`]: `out[t][r] = q6_k dot(row r of tile, token t of panel)`.
    /// `false`, writing nothing, if the shapes do not fit.
    pub fn k6_tile(self, tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe { k6_tile(tile, panel, out) }
    }
}
