//! x86-64 AVX-512 fills of the K-quant row-lane tiles ([`K4Tile`], [`K6Tile`]): the same
//! tiles as the scalar [`RowLaneTile::fill`](crate::quants::gemm::RowLaneTile) (their twin,
//! compared field by field in the tests), built with 16×16 transposes of 32-bit words instead
//! of a scalar scatter of every 4-value group.
//!
//! A many-token product unpacks each weight row once per call; with a handful of tokens (a
//! speculative verify pass of 2–16) the scalar unpack cost several times the products
//! themselves.
//!
//! With rows `r` of a 16-row group in lanes, word `j` of a block's packed quants (4 bytes)
//! becomes one register whose lane `r` is row `r`'s word `j`; the 4-value groups of the tile
//! are then a mask or a shift of those words, because a K-quant word holds 4 consecutive values
//! (in their low or high nibbles).

use std::arch::x86_64::*;

use super::x86_avx512::Avx512;
use crate::quants::blocks::{BlockQ4K, BlockQ6K};
use crate::quants::gemm::{lane_groups, reset};
use crate::quants::gemm_k::{K4Tile, K6Tile, LANES};

/// `rows[i]` lane `j` → `out[j]` lane `i` (a 16×16 transpose of 32-bit words).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn transpose16(rows: &[__m512i; 16]) -> [__m512i; 16] {
    // Within 128-bit chunks: pairs of rows, then quads (4×4 transposes per chunk).
    let mut t = [_mm512_setzero_si512(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_epi32(rows[2 * k], rows[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(rows[2 * k], rows[2 * k + 1]);
    }
    // u[4k + m], chunk c: rows 4k..4k+4, word 4c + m.
    let mut u = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    // A 4×4 transpose of 128-bit chunks per m: out[4c + m] chunk k = u[4k + m] chunk c.
    let mut out = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let x = |k: usize| u[4 * k + m];
        let p0 = _mm512_shuffle_i32x4::<0x44>(x(0), x(1));
        let p1 = _mm512_shuffle_i32x4::<0xEE>(x(0), x(1));
        let p2 = _mm512_shuffle_i32x4::<0x44>(x(2), x(3));
        let p3 = _mm512_shuffle_i32x4::<0xEE>(x(2), x(3));
        out[m] = _mm512_shuffle_i32x4::<0x88>(p0, p2);
        out[4 + m] = _mm512_shuffle_i32x4::<0xDD>(p0, p2);
        out[8 + m] = _mm512_shuffle_i32x4::<0x88>(p1, p3);
        out[12 + m] = _mm512_shuffle_i32x4::<0xDD>(p1, p3);
    }
    out
}

/// Words `w0..w0+16` of `bytes(r)` for the 16 rows, transposed: lane `r` of `out[j]` is row
/// `r`'s word `w0 + j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn words16<'a>(bytes: impl Fn(usize) -> &'a [u8], w0: usize) -> [__m512i; 16] {
    let rows: [__m512i; 16] = std::array::from_fn(|r| {
        let b = &bytes(r)[4 * w0..4 * w0 + 64];
        // SAFETY: `b` is 64 readable bytes; loadu needs no alignment.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    });
    transpose16(&rows)
}

/// Words `w0..w0+n` (n ≤ 4) of `bytes(r)` with rows in lanes, by scalar reads (a few words of
/// block headers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn few_words<'a, const N: usize>(bytes: impl Fn(usize) -> &'a [u8], w0: usize) -> [__m512i; N] {
    let mut lanes = [[0u32; LANES]; N];
    for r in 0..LANES {
        let b = bytes(r);
        for (j, l) in lanes.iter_mut().enumerate() {
            let at = 4 * (w0 + j);
            l[r] = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        }
    }
    // SAFETY: each `l` is 16 u32.
    lanes.map(|l| unsafe { _mm512_loadu_si512(l.as_ptr().cast()) })
}

/// Stores 16 u32 / i32 / f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn put<T: bytemuck::Pod>(dst: &mut [T; LANES], v: __m512i) {
    const { assert!(size_of::<T>() == 4) };
    // SAFETY: `dst` is 64 writable bytes; storeu needs no alignment.
    unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) }
}

/// The f16 in bits `shift..shift+16` of each lane, as f32 (exact, as `F16Le::to_f32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn half_lanes(w: __m512i, shift: u32) -> __m512i {
    let h = _mm512_cvtepi32_epi16(_mm512_srl_epi32(w, _mm_cvtsi32_si128(shift as i32)));
    _mm512_castps_si512(_mm512_cvtph_ps(h))
}

/// Byte `n` of each lane's little-endian words `w` (n < 4·len).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn byte_lanes(w: &[__m512i], n: usize) -> __m512i {
    let shifted = _mm512_srl_epi32(w[n / 4], _mm_cvtsi32_si128(8 * (n % 4) as i32));
    _mm512_and_si512(shifted, _mm512_set1_epi32(0xff))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k4_fill(tile: &mut K4Tile, blocks: &[BlockQ4K], per_row: usize) {
    let (vecs, n) = lane_groups(blocks.len(), per_row);
    reset(&mut tile.q, n * 64, [0; 64]);
    reset(&mut tile.sc, n * 8, [0; LANES]);
    reset(&mut tile.mp, n * 4, [0; LANES]);
    reset(&mut tile.d, n, [0.0; LANES]);
    reset(&mut tile.dmin, n, [0.0; LANES]);
    let nib = _mm512_set1_epi32(0x0f0f_0f0f);
    for v in 0..vecs {
        prefetch_group(&blocks[v * LANES * per_row..(v + 1) * LANES * per_row]);
        for s in 0..per_row {
            let vs = v * per_row + s;
            let block = |r: usize| &blocks[(v * LANES + r) * per_row + s];
            // Word w = 8c + m of qs holds values 64c + 4m.. (low nibbles, group 16c + m) and
            // 64c + 32 + 4m.. (high nibbles, group 16c + 8 + m).
            for half in 0..2 {
                let words = words16(|r| &block(r).qs[..], 16 * half);
                for (j, &w) in words.iter().enumerate() {
                    let (c, m) = ((16 * half + j) / 8, j % 8);
                    let q = &mut tile.q[vs * 64..][..64];
                    put_bytes(&mut q[16 * c + m], _mm512_and_si512(w, nib));
                    put_bytes(&mut q[16 * c + 8 + m], _mm512_and_si512(_mm512_srli_epi32::<4>(w), nib));
                }
            }
            // Header: word 0 = d | dmin << 16, words 1..4 = the 12 scale bytes.
            let head: [__m512i; 4] = few_words(|r| bytemuck::bytes_of(block(r)), 0);
            put(&mut tile.d[vs], half_lanes(head[0], 0));
            put(&mut tile.dmin[vs], half_lanes(head[0], 16));
            let b = |i: usize| byte_lanes(&head[1..], i);
            let six = _mm512_set1_epi32(63);
            let top2 = |x: __m512i| _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(x));
            // ggml's get_scale_min_k4.
            let sm = |j: usize| {
                if j < 4 {
                    (_mm512_and_si512(b(j), six), _mm512_and_si512(b(j + 4), six))
                } else {
                    let sc = _mm512_or_si512(_mm512_and_si512(b(j + 4), _mm512_set1_epi32(0x0f)), top2(b(j - 4)));
                    let m = _mm512_or_si512(_mm512_srli_epi32::<4>(b(j + 4)), top2(b(j)));
                    (sc, m)
                }
            };
            let mut mins = [_mm512_setzero_si512(); 8];
            for (j, min) in mins.iter_mut().enumerate() {
                let (sc, m) = sm(j);
                put(&mut tile.sc[vs * 8 + j], sc);
                *min = m;
            }
            for k in 0..4 {
                put(&mut tile.mp[vs * 4 + k], _mm512_or_si512(mins[2 * k], _mm512_slli_epi32::<16>(mins[2 * k + 1])));
            }
        }
    }
    (tile.vecs, tile.per_row) = (vecs, per_row);
}

/// Asks for a row group's bytes in address order before the fill reads them by block columns
/// (16 strided streams, which the hardware prefetcher follows poorly); the group is contiguous.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn prefetch_group<B>(group: &[B]) {
    let p: *const i8 = group.as_ptr().cast();
    for line in (0..size_of_val(group)).step_by(64) {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(line));
    }
}

/// Stores 64 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn put_bytes(dst: &mut [u8; 64], v: __m512i) {
    // SAFETY: `dst` is 64 writable bytes; storeu needs no alignment.
    unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k6_fill(tile: &mut K6Tile, blocks: &[BlockQ6K], per_row: usize) {
    let (vecs, n) = lane_groups(blocks.len(), per_row);
    reset(&mut tile.q, n * 64, [0; 64]);
    reset(&mut tile.scp, n * 16, [0; LANES]);
    reset(&mut tile.sp, n * 8, [0; LANES]);
    reset(&mut tile.d, n, [0.0; LANES]);
    let nib = _mm512_set1_epi32(0x0f0f_0f0f);
    let two = _mm512_set1_epi32(0x0303_0303);
    for v in 0..vecs {
        prefetch_group(&blocks[v * LANES * per_row..(v + 1) * LANES * per_row]);
        for s in 0..per_row {
            let vs = v * per_row + s;
            let block = |r: usize| &blocks[(v * LANES + r) * per_row + s];
            let ql0 = words16(|r| &block(r).ql[..], 0);
            let ql1 = words16(|r| &block(r).ql[..], 16);
            let qh = words16(|r| &block(r).qh[..], 0);
            let q = &mut tile.q[vs * 64..][..64];
            // Group g = 32h + 8·quad + m: ql word 16h + 8(quad & 1) + m, nibble quad / 2; qh
            // word 8h + m, bits 2·quad.
            for (g, q) in q.iter_mut().enumerate() {
                let (h, quad, m) = (g / 32, (g % 32) / 8, g % 8);
                let wl = 16 * h + 8 * (quad & 1) + m;
                let lw = if wl < 16 { ql0[wl] } else { ql1[wl - 16] };
                let low = _mm512_and_si512(_mm512_srl_epi32(lw, _mm_cvtsi32_si128(4 * (quad / 2) as i32)), nib);
                let high = _mm512_and_si512(_mm512_srl_epi32(qh[8 * h + m], _mm_cvtsi32_si128(2 * quad as i32)), two);
                put_bytes(q, _mm512_or_si512(low, _mm512_slli_epi32::<4>(high)));
            }
            // scales: bytes 192..208 (words 48..52), d: bytes 208..210.
            let sw: [__m512i; 4] = few_words(|r| bytemuck::bytes_of(block(r)), 48);
            // Scale j sign-extended to an i16 in the low half of each lane.
            let sc = |j: usize| {
                let up = _mm512_sll_epi32(sw[j / 4], _mm_cvtsi32_si128(24 - 8 * (j % 4) as i32));
                _mm512_and_si512(_mm512_srai_epi32::<24>(up), _mm512_set1_epi32(0xffff))
            };
            for j in 0..16 {
                put(&mut tile.scp[vs * 16 + j], sc(j));
            }
            for k in 0..8 {
                put(&mut tile.sp[vs * 8 + k], _mm512_or_si512(sc(2 * k), _mm512_slli_epi32::<16>(sc(2 * k + 1))));
            }
            let d: [u32; LANES] = std::array::from_fn(|r| u32::from(block(r).d.0[0]) | u32::from(block(r).d.0[1]) << 8);
            // SAFETY: `d` is 16 u32.
            put(&mut tile.d[vs], half_lanes(unsafe { _mm512_loadu_si512(d.as_ptr().cast()) }, 0));
        }
    }
    (tile.vecs, tile.per_row) = (vecs, per_row);
}

impl Avx512 {
    /// [`K4Tile`] of `blocks` (`[rows][per_row]`), equal to the scalar fill.
    pub fn k4_fill(self, tile: &mut K4Tile, blocks: &[BlockQ4K], per_row: usize) {
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe { k4_fill(tile, blocks, per_row) }
    }

    /// [`K6Tile`] of `blocks` (`[rows][per_row]`), equal to the scalar fill.
    pub fn k6_fill(self, tile: &mut K6Tile, blocks: &[BlockQ6K], per_row: usize) {
        // SAFETY: as in `k4_fill`.
        unsafe { k6_fill(tile, blocks, per_row) }
    }
}
