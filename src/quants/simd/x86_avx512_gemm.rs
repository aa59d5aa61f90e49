//! x86-64 AVX-512 + VNNI kernels of the many-token products (prefill), the SIMD side of
//! [`gemm`](crate::quants::gemm) and [`gemm_k`](crate::quants::gemm_k); every element
//! bit-identical to the single-token kernels of `x86_avx512.rs` and to the scalar twins.

use std::arch::x86_64::*;

use super::x86_avx2::hsum_float_8;
use super::x86_avx512::Avx512;
use crate::quants::gemm::{B32Panel, B32Tile, PairBlock};
use crate::quants::gemm_k::{K4Tile, K6Tile, K8Panel, LANES};

// ---- many-token products: see `crate::quants::gemm`

/// Token pairs per micro-kernel call of [`b32_tile`].
const B32_P: usize = 3;
/// Weight rows per micro-kernel call of [`b32_tile`].
const B32_R: usize = 4;

/// `R` rows × `P` token pairs over every block: per block and cell
/// `acc = fma(d_w * d_a, f32(corr + vpdpbusd(u, a)), acc)`, two tokens per register.
/// `rows[r]` / `pairs[p]` hold `n` blocks each (checked by the caller).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_micro<const R: usize, const P: usize>(
    rows: [(&[[u8; 32]], &[f32]); R],
    pairs: [&[PairBlock]; P],
    n: usize,
) -> [[__m512; P]; R] {
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    for b in 0..n {
        let mut a = [_mm512_setzero_si512(); P];
        let mut c = [_mm512_setzero_si512(); P];
        let mut da = [_mm512_setzero_ps(); P];
        for p in 0..P {
            // SAFETY: b < n <= pairs[p].len(); PairBlock is 64-aligned and 192 bytes:
            // qs, corr and da are 64 bytes each.
            let blk: *const PairBlock = unsafe { pairs[p].as_ptr().add(b) };
            unsafe {
                a[p] = _mm512_load_si512((&raw const (*blk).qs).cast());
                c[p] = _mm512_load_si512((&raw const (*blk).corr).cast());
                da[p] = _mm512_load_ps((&raw const (*blk).da).cast());
            }
        }
        for r in 0..R {
            // SAFETY: b < n <= rows[r].0.len() and rows[r].1.len(); 32 readable bytes.
            let (w, dw) = unsafe {
                let q = rows[r].0.as_ptr().add(b);
                let w = _mm512_broadcast_i64x4(_mm256_loadu_si256(q.cast()));
                (w, _mm512_set1_ps(*rows[r].1.as_ptr().add(b)))
            };
            for p in 0..P {
                let i = _mm512_dpbusd_epi32(c[p], w, a[p]);
                let d = _mm512_mul_ps(dw, da[p]);
                acc[r][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(i), acc[r][p]);
            }
        }
    }
    acc
}

/// Both tokens' results of one cell: `hsum_float_8` of each 256-bit half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn split_hsum(v: __m512) -> [f32; 2] {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    [hsum_float_8(_mm512_castps512_ps256(v)), hsum_float_8(hi)]
}

/// Runs [`b32_micro`] on rows `r0..r0+R` and pairs `p0..p0+P`, writing `out[t][r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_block<const R: usize, const P: usize>(
    tile: &B32Tile,
    panel: &B32Panel,
    r0: usize,
    p0: usize,
    out: &mut [&mut [f32]],
) {
    let n = tile.per_row;
    let rows: [(&[[u8; 32]], &[f32]); R] = std::array::from_fn(|i| tile.row(r0 + i));
    let pairs: [&[PairBlock]; P] = std::array::from_fn(|i| panel.pair(p0 + i));
    let acc = b32_micro::<R, P>(rows, pairs, n);
    for (i, acc) in acc.iter().enumerate() {
        for (j, v) in acc.iter().enumerate() {
            for (h, x) in split_hsum(*v).into_iter().enumerate() {
                if let Some(o) = out.get_mut(2 * (p0 + j) + h) {
                    o[r0 + i] = x;
                }
            }
        }
    }
}

/// `out[t][r]` for every row of `tile` and token of `panel`, bit-identical to
/// [`b32_tile_scalar`](crate::quants::gemm::b32_tile_scalar) and to the single-token dots.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_tile(tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) {
    if tile.per_row != panel.per_row || tile.q.len() < tile.rows * tile.per_row {
        return;
    }
    let (rows, pairs) = (tile.rows, panel.pairs());
    let mut p = 0;
    while p < pairs {
        let np = (pairs - p).min(B32_P);
        let mut r = 0;
        while r < rows {
            let nr = (rows - r).min(B32_R);
            match (nr, np) {
                (B32_R, B32_P) => b32_block::<B32_R, B32_P>(tile, panel, r, p, out),
                (B32_R, _) => b32_block::<B32_R, 1>(tile, panel, r, p, out),
                (_, B32_P) => b32_block::<1, B32_P>(tile, panel, r, p, out),
                _ => b32_block::<1, 1>(tile, panel, r, p, out),
            }
            r += if nr == B32_R { B32_R } else { 1 };
        }
        p += if np == B32_P { B32_P } else { 1 };
    }
}

impl Avx512 {
    /// [`b32_tile`]: `out[t][r] = dot(row r of tile, token t of panel)`.
    pub fn b32_tile(self, tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) {
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
    let vs: [usize; V] = std::array::from_fn(|v| (v0 + v) * tile.per_row + s);
    let q: [&[[u8; 64]]; V] = std::array::from_fn(|v| &tile.q[vs[v] * 64..][..64]);
    let mut isum = [[_mm512_setzero_si512(); T]; V];
    for j in 0..8 {
        let mut part = [[_mm512_setzero_si512(); T]; V];
        for g in 0..8 {
            let i = 8 * j + g;
            // SAFETY: q[v] holds 64 groups of 64 bytes; i < 64.
            let w: [__m512i; V] =
                std::array::from_fn(|v| unsafe { _mm512_loadu_si512(q[v][i].as_ptr().cast()) });
            for (t, (a, _)) in toks.iter().enumerate() {
                let (groups, _) = a.qs.as_chunks::<4>();
                let x = _mm512_set1_epi32(i32::from_le_bytes(groups[i].map(|b| b as u8)));
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
        let toks: [K8Sb; K4_T] = std::array::from_fn(|i| sb(t + i));
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
/// gemv per element ([`k4_tile_scalar`](crate::quants::gemm_k::k4_tile_scalar)).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k4_tile(tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) {
    let n = tile.per_row;
    let tokens = panel.acts.len();
    if panel.acts.iter().any(|a| a.len() != n) || panel.bs.iter().any(|b| b.len() != n) {
        return;
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
}

impl Avx512 {
    /// [`k4_tile`]: `out[t][r] = gemv_q4_k(row r of tile, token t of panel)`.
    pub fn k4_tile(self, tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) {
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
    for (i, q) in q.iter().enumerate() {
        // SAFETY: 64 readable bytes each.
        let (w, sc) = unsafe {
            (
                _mm512_loadu_si512(q.as_ptr().cast()),
                _mm512_loadu_si512(scp[i / 4].as_ptr().cast()),
            )
        };
        for (t, a) in toks.iter().enumerate() {
            let (groups, _) = a.qs.as_chunks::<4>();
            let x = _mm512_set1_epi32(i32::from_le_bytes(groups[i].map(|b| b as u8)));
            let part = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
            lanes[t][i % 8] = _mm512_dpwssd_epi32(lanes[t][i % 8], part, sc);
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
/// Q6_K kernels ([`k6_tile_scalar`](crate::quants::gemm_k::k6_tile_scalar)).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k6_tile(tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) {
    let n = tile.per_row;
    let tokens = panel.acts.len();
    if panel.acts.iter().any(|a| a.len() != n) {
        return;
    }
    for v in 0..tile.vecs {
        // [tokens][8 lanes] accumulators of 16 rows
        let mut acc = vec![[[0.0f32; LANES]; 8]; tokens];
        for s in 0..n {
            let mut t = 0;
            while t + K6_T <= tokens {
                let toks = std::array::from_fn(|i| &panel.acts[t + i][s]);
                k6_step::<K6_T>(tile, v, s, toks, &mut acc[t..t + K6_T]);
                t += K6_T;
            }
            if t < tokens {
                k6_step::<1>(tile, v, s, [&panel.acts[t][s]], &mut acc[t..t + 1]);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            let rows = &mut o[v * LANES..(v + 1) * LANES];
            for (lane, o) in rows.iter_mut().enumerate() {
                let l: [f32; 8] = std::array::from_fn(|k| a[k][lane]);
                *o = crate::quants::gemm::hsum_float_8(&l);
            }
        }
    }
}

impl Avx512 {
    /// [`k6_tile`]: `out[t][r] = q6_k dot(row r of tile, token t of panel)`.
    pub fn k6_tile(self, tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) {
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe { k6_tile(tile, panel, out) }
    }
}
