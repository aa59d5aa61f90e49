//! x86-64 AVX-512 + VNNI use of repacked Q6_K matrices ([`K6Packed`]): the product with one
//! token, 16 rows per register, every element bit-identical to the single-row
//! `ggml_vec_dot_q6_K_q8_K` order ([`q6k_cell_scalar`](crate::quants::gemm_k::q6k_cell_scalar)),
//! and the prefill tile ([`K6Tile`]) filled from the same copy, equal to the fill from the file's
//! blocks (so the file's pages of a packed matrix are not read again).

use std::arch::x86_64::*;

use super::x86_avx512::Avx512;
use super::x86_avx512_gemm::{bcast4, hsum_lanes8};
use crate::quants::blocks::BlockQ8K;
use crate::quants::gemm::reset;
use crate::quants::gemm_k::{K6Tile, LANES};
use crate::quants::packed_k6::{K6Packed, K6PackedBlock};

/// Bytes ahead of the block being read that the kernel asks the memory for: the next block (as
/// the packed Q4_K gemv, where one block ahead measured best).
const PREFETCH_AHEAD: usize = std::mem::size_of::<K6PackedBlock>();

/// One 64-byte register of a packed block.
#[inline]
#[target_feature(enable = "avx512f")]
fn ld(bytes: &[u8; 64]) -> __m512i {
    // SAFETY: 64 readable bytes; loadu needs no alignment.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

/// `(low & 0x0f) | high` per byte (`high` holds bits 4-5 only).
#[inline]
#[target_feature(enable = "avx512f")]
fn join(low: __m512i, high: __m512i) -> __m512i {
    // f(A, B, C) = (A & C) | B: 0xF0 & 0xAA | 0xCC.
    _mm512_ternarylogic_epi32::<0xEC>(low, high, _mm512_set1_epi8(0x0f))
}

/// The unsigned quants (0..=63) of chunks `4h..4h + 4`, ggml's lane `k` of each: register `c`
/// holds values `32(4h + c) + 4k..+4` of the 16 rows, 4 bytes per row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn quants(b: &K6PackedBlock, h: usize, k: usize) -> [__m512i; 4] {
    let two = _mm512_set1_epi8(0x30);
    let (l0, l1, hb) = (ld(&b.ql[16 * h + k]), ld(&b.ql[16 * h + 8 + k]), ld(&b.qh[8 * h + k]));
    // 16-bit shifts: a bit moved across a byte boundary lands outside the mask of its new byte.
    [
        join(l0, _mm512_and_si512(_mm512_slli_epi16::<4>(hb), two)),
        join(l1, _mm512_and_si512(_mm512_slli_epi16::<2>(hb), two)),
        join(_mm512_srli_epi16::<4>(l0), _mm512_and_si512(hb, two)),
        join(_mm512_srli_epi16::<4>(l1), _mm512_and_si512(_mm512_srli_epi16::<2>(hb), two)),
    ]
}

/// Row `r`'s `(sc_{2k}, sc_{2k+1})` as two i16 per lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scale_pairs(b: &K6PackedBlock, k: usize) -> __m512i {
    // SAFETY: `sp[k]` is 32 readable bytes; loadu needs no alignment.
    _mm512_cvtepi8_epi16(unsafe { _mm256_loadu_si256(b.sp[k].as_ptr().cast()) })
}

/// The 16 rows of one packed group against one token: per super-block ggml's 8 lanes as 8
/// registers of 16 rows (per chunk and lane `vpdpbusd` of 4 quants and 4 activation bytes into
/// a zero register, at most 4·63·128 in magnitude so exact in its low i16, then `vpdpwssd` with
/// the row's `(sc, 0)`; minus `32 ·` the `vpdpwssd` of `(sc_{2k}, sc_{2k+1})` and the token's
/// `(bsum_{2k}, bsum_{2k+1})`), then `acc_k = fma(d_a·d_w, f32(lane_k), acc_k)`; the result per
/// row `hsum_float_8` of its 8 accumulators.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group_gemv(blocks: &[K6PackedBlock], a: &[BlockQ8K]) -> __m512 {
    let low16 = _mm512_set1_epi32(0xffff);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); 8];
    for (b, y) in blocks.iter().zip(a) {
        let ahead = (b as *const K6PackedBlock).cast::<i8>().wrapping_add(PREFETCH_AHEAD);
        let mut off = 0;
        while off < std::mem::size_of::<K6PackedBlock>() {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off));
            off += 64;
        }
        let mut lanes = [_mm512_setzero_si512(); 8];
        for h in 0..2 {
            // (sc_{2j}, 0) for lanes 0..4 and (sc_{2j+1}, 0) for lanes 4..8 of chunk j = 4h + c.
            let mut first = [zero; 4];
            let mut second = [zero; 4];
            for c in 0..4 {
                let p = scale_pairs(b, 4 * h + c);
                first[c] = _mm512_and_si512(p, low16);
                second[c] = _mm512_srli_epi32::<16>(p);
            }
            for (k, lane) in lanes.iter_mut().enumerate() {
                let u = quants(b, h, k);
                for c in 0..4 {
                    let j = 4 * h + c;
                    let dot = _mm512_dpbusd_epi32(zero, u[c], bcast4(&y.qs, 8 * j + k));
                    *lane = _mm512_dpwssd_epi32(*lane, dot, if k < 4 { first[c] } else { second[c] });
                }
            }
        }
        // SAFETY: `d` is 16 readable f32; loadu needs no alignment.
        let d = _mm512_mul_ps(_mm512_set1_ps(y.d), unsafe { _mm512_loadu_ps(b.d.as_ptr()) });
        for (k, (lane, acc)) in lanes.iter().zip(acc.iter_mut()).enumerate() {
            let bsums = u32::from(y.bsums[2 * k] as u16) | u32::from(y.bsums[2 * k + 1] as u16) << 16;
            let corr = _mm512_dpwssd_epi32(zero, scale_pairs(b, k), _mm512_set1_epi32(bsums as i32));
            let lane = _mm512_sub_epi32(*lane, _mm512_slli_epi32::<5>(corr));
            *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), *acc);
        }
    }
    hsum_lanes8(&acc)
}

/// Stores 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn store(dst: &mut [u32; LANES], v: __m512i) {
    // SAFETY: `dst` is 16 writable u32; storeu needs no alignment.
    unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) }
}

/// `tile` holding row groups `first..first + groups` of `w`: the quants unpacked to bytes, the
/// scales as `(sc_j, 0)` and `(sc_{2k}, sc_{2k+1})` i16 pairs, `d` as f32 (see [`K6Tile`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn fill(tile: &mut K6Tile, w: &K6Packed, first: usize, groups: usize) {
    let blocks = w.groups_from(first, groups);
    let n = blocks.len();
    reset(&mut tile.q, n * 64, [0; 64]);
    reset(&mut tile.scp, n * 16, [0; LANES]);
    reset(&mut tile.sp, n * 8, [0; LANES]);
    reset(&mut tile.d, n, [0.0; LANES]);
    let low16 = _mm512_set1_epi32(0xffff);
    for (vs, b) in blocks.iter().enumerate() {
        let q = &mut tile.q[vs * 64..][..64];
        for h in 0..2 {
            for k in 0..8 {
                for (c, u) in quants(b, h, k).into_iter().enumerate() {
                    // SAFETY: a tile line is 64 writable bytes; storeu needs no alignment.
                    unsafe { _mm512_storeu_si512(q[8 * (4 * h + c) + k].as_mut_ptr().cast(), u) };
                }
            }
        }
        for k in 0..8 {
            let p = scale_pairs(b, k);
            store(&mut tile.sp[vs * 8 + k], p);
            store(&mut tile.scp[vs * 16 + 2 * k], _mm512_and_si512(p, low16));
            store(&mut tile.scp[vs * 16 + 2 * k + 1], _mm512_srli_epi32::<16>(p));
        }
        tile.d[vs] = b.d;
    }
    (tile.vecs, tile.per_row) = (groups, w.per_row);
}

impl Avx512 {
    /// `out[i]` for the rows of groups `first..` of `w` (`out` holds `16 · groups` rows or
    /// fewer at the matrix's end) against the one token `a`: bit for bit the single-row Q6_K
    /// `vec_dot` of each row. `false`, writing nothing, where the shapes do not fit.
    pub fn k6_packed_gemv(self, w: &K6Packed, first: usize, a: &[BlockQ8K], out: &mut [f32]) -> bool {
        let n = w.per_row;
        let groups = out.len().div_ceil(LANES);
        let end = first.checked_mul(LANES).and_then(|s| s.checked_add(out.len()));
        if a.len() != n || !w.consistent() || end.is_none_or(|end| end > w.rows) || w.groups_from(first, groups).len() != groups * n {
            return false;
        }
        for (i, o) in out.chunks_mut(LANES).enumerate() {
            // SAFETY: an Avx512 token exists only where detection found every feature enabled.
            let v = unsafe { group_gemv(w.groups_from(first + i, 1), a) };
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` is 16 writable f32; storeu needs no alignment.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
            o.copy_from_slice(&lanes[..o.len()]);
        }
        true
    }

    /// `tile` holding row groups `first..first + groups` of `w`, the same tile the fill from
    /// the matrix's blocks makes. `false`, leaving `tile` as it was, for groups past the end of
    /// `w`, a matrix whose last group is partial, or an inconsistent `w`.
    pub fn k6_fill_packed(self, tile: &mut K6Tile, w: &K6Packed, first: usize, groups: usize) -> bool {
        if !w.consistent() || !w.rows.is_multiple_of(LANES) || first.checked_add(groups).is_none_or(|end| end > w.groups()) {
            return false;
        }
        // SAFETY: an Avx512 token exists only where detection found every feature enabled.
        unsafe { fill(tile, w, first, groups) };
        true
    }
}
