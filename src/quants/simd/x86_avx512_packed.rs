//! x86-64 AVX-512 + VNNI products of repacked matrices against one token, 16 rows per
//! register: Q4_K ([`K4Packed`]), every element bit-identical to
//! [`gemv_q4_k`](crate::quants::gemv::gemv_q4_k) (ggml's repacked gemv order), and Q5_0 /
//! Q8_0 / Q4_1 ([`B32Packed`]), bit-identical to the single-row `vec_dot` kernels.

use std::arch::x86_64::*;

use super::x86_avx512::Avx512;
use super::x86_avx512_gemm::{bcast4, hsum_lanes8};
use crate::quants::gemm::{B32Panel, B32Tile, LANES, reset};
use crate::quants::packed_b32::{B32Layout, B32Packed, Line};
use crate::quants::packed_k4::{K4Packed, K4PackedBlock, K8Row};

/// Bytes ahead of the block being read that the kernel asks the memory for: the next block
/// (`examples/packed_probe.rs`: 1 block ahead measured as good as none or 2, better than 4 or 8).
const PREFETCH_AHEAD: usize = std::mem::size_of::<K4PackedBlock>();

/// The 16 rows of one packed group against one token: per super-block the exact integers
/// `dot` (`vpdpbusd` of nibbles and activation bytes per sub-block, times the scale with
/// `vpmulld`) and `min` (`vpdpwssd` of the min pairs and `bsum` pairs), then the gemv's two
/// FMAs per row; the result `acc - acc_min` per row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group_gemv(blocks: &[K4PackedBlock], a: &K8Row) -> __m512 {
    let m4 = _mm512_set1_epi8(0x0f);
    let (mut acc, mut acc_min) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for ((b, y), bs) in blocks.iter().zip(a.y).zip(&a.bs) {
        let ahead = (b as *const K4PackedBlock).cast::<i8>().wrapping_add(PREFETCH_AHEAD);
        let mut off = 0;
        while off < std::mem::size_of::<K4PackedBlock>() {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off));
            off += 64;
        }
        let mut dot = _mm512_setzero_si512();
        for c in 0..4 {
            // Two chains per nibble half (even and odd `t`), summed after: integer sums, so the
            // order does not change a bit, and four chains hide `vpdpbusd`'s latency.
            let mut lo = [_mm512_setzero_si512(); 2];
            let mut hi = [_mm512_setzero_si512(); 2];
            for t in 0..8 {
                // SAFETY: `q[8c + t]` is 64 readable bytes, 64-aligned (`K4PackedBlock`).
                let w = unsafe { _mm512_load_si512(b.q[8 * c + t].as_ptr().cast()) };
                let at = 64 * c + 4 * t;
                let word = |i: usize| i32::from_le_bytes([y.qs[i] as u8, y.qs[i + 1] as u8, y.qs[i + 2] as u8, y.qs[i + 3] as u8]);
                lo[t % 2] = _mm512_dpbusd_epi32(lo[t % 2], _mm512_and_si512(w, m4), _mm512_set1_epi32(word(at)));
                hi[t % 2] = _mm512_dpbusd_epi32(hi[t % 2], _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4), _mm512_set1_epi32(word(at + 32)));
            }
            let (lo, hi) = (_mm512_add_epi32(lo[0], lo[1]), _mm512_add_epi32(hi[0], hi[1]));
            // SAFETY: `sc[j]` is 16 readable bytes; loadu needs no alignment.
            let (sl, sh) = unsafe {
                (_mm_loadu_si128(b.sc[2 * c].as_ptr().cast()), _mm_loadu_si128(b.sc[2 * c + 1].as_ptr().cast()))
            };
            dot = _mm512_add_epi32(dot, _mm512_mullo_epi32(lo, _mm512_cvtepu8_epi32(sl)));
            dot = _mm512_add_epi32(dot, _mm512_mullo_epi32(hi, _mm512_cvtepu8_epi32(sh)));
        }
        let mut min = _mm512_setzero_si512();
        for (pairs, &bsum) in b.m.iter().zip(bs) {
            // SAFETY: each row of `m` is 32 readable bytes; loadu needs no alignment.
            let m = unsafe { _mm256_loadu_si256(pairs.as_ptr().cast()) };
            min = _mm512_dpwssd_epi32(min, _mm512_cvtepu8_epi16(m), _mm512_set1_epi32(bsum as i32));
        }
        // SAFETY: `d` and `dmin` are 16 readable f16 each; loadu needs no alignment.
        let (d, dmin) = unsafe {
            (_mm512_cvtph_ps(_mm256_loadu_si256(b.d.as_ptr().cast())), _mm512_cvtph_ps(_mm256_loadu_si256(b.dmin.as_ptr().cast())))
        };
        let da = _mm512_set1_ps(y.d);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, da), acc);
        acc_min = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min), _mm512_mul_ps(dmin, da), acc_min);
    }
    _mm512_sub_ps(acc, acc_min)
}

/// One 64-byte line as a register.
#[inline]
#[target_feature(enable = "avx512f")]
fn ld_line(l: &Line) -> __m512i {
    // SAFETY: a `Line` is 64 readable bytes, 64-aligned.
    unsafe { _mm512_load_si512(l.0.as_ptr().cast()) }
}

/// Layouts of [`b32_group_gemv`] (a const parameter: [`B32Layout`] as a number).
const BYTES: u8 = 0;
const NIBBLES5: u8 = 1;
const NIBBLES4_MIN: u8 = 2;

/// Sixteen f16 as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ld_f16x16(h: &[crate::quants::F16Le; LANES]) -> __m512 {
    // SAFETY: `h` is 16 readable f16 (32 bytes); loadu needs no alignment.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(h.as_ptr().cast()) })
}

/// The unsigned quants of block `b` of a group's slots (`q`: its lines, `high`: its Q5_0 mask
/// lines) in row lanes: register `k` holds values `4k..4k+4` of the 16 rows, 4 bytes per row
/// (a [`B32Tile`](crate::quants::gemm::B32Tile)'s `q[vb * 8 + k]`). `L` is the layout.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn slot_quants<const L: u8>(q: &[Line], high: &[Line], b: usize) -> [__m512i; 8] {
    let m4 = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(16);
    let mut u = [_mm512_setzero_si512(); 8];
    if L == NIBBLES5 {
        let masks = high[b].0.as_ptr().cast::<u64>();
        // SAFETY: a `Line` is 64 readable bytes, 64-aligned: eight aligned u64 (x86 is
        // little-endian, as the masks are stored).
        let mask = |k: usize| unsafe { masks.add(k).read() };
        for j in 0..4 {
            let v = ld_line(&q[b * 4 + j]);
            let (lo, hi) = (_mm512_and_si512(v, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
            u[j] = _mm512_mask_add_epi8(lo, mask(j), lo, sixteen);
            u[j + 4] = _mm512_mask_add_epi8(hi, mask(j + 4), hi, sixteen);
        }
    } else if L == NIBBLES4_MIN {
        for j in 0..4 {
            let v = ld_line(&q[b * 4 + j]);
            u[j] = _mm512_and_si512(v, m4);
            u[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        }
    } else {
        for (k, uk) in u.iter_mut().enumerate() {
            *uk = ld_line(&q[b * 8 + k]);
        }
    }
    u
}

/// Row groups `first..first + groups` of `w` (Q5_0, Q8_0 or Q4_1) as a [`B32Tile`]: every
/// slot's quants through [`slot_quants`], its 16 scales (and Q4_1's mins) as f32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_fill<const L: u8>(tile: &mut B32Tile, w: &B32Packed, first: usize, groups: usize) {
    let n = w.per_row;
    let slots = first * n..(first + groups) * n;
    reset(&mut tile.q, slots.len() * 8, [0; 64]);
    reset(&mut tile.d, slots.len(), [0.0; LANES]);
    reset(&mut tile.m, if L == NIBBLES4_MIN { slots.len() } else { 0 }, [0.0; LANES]);
    if L == NIBBLES4_MIN {
        for (m, h) in tile.m.iter_mut().zip(&w.m[slots.clone()]) {
            // SAFETY: `m` is 16 writable f32; storeu needs no alignment.
            unsafe { _mm512_storeu_ps(m.as_mut_ptr(), ld_f16x16(h)) };
        }
    }
    let lines = w.lines();
    let q = &w.q[slots.start * lines..slots.end * lines];
    let high: &[Line] = if L == NIBBLES5 { &w.high[slots.clone()] } else { &[] };
    for (vb, (dq, dd)) in tile.q.chunks_exact_mut(8).zip(tile.d.iter_mut()).enumerate() {
        let u = slot_quants::<L>(q, high, vb);
        for (o, uk) in dq.iter_mut().zip(u) {
            // SAFETY: `o` is 64 writable bytes; storeu needs no alignment.
            unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), uk) };
        }
        // SAFETY: `dd` is 16 writable f32; storeu needs no alignment.
        unsafe { _mm512_storeu_ps(dd.as_mut_ptr(), ld_f16x16(&w.d[slots.start + vb])) };
    }
    (tile.vecs, tile.per_row, tile.offset) = (groups, n, w.offset());
}

/// The 16 rows of group `g` against one token: per block, lane `k` of 16 rows is
/// `corr_k + vpdpbusd(u_k, a[4k..4k+4])` (`u_k` from the packed lines, with Q5_0's fifth bits
/// added under their masks), then `acc[k] = fma(d_w·d_a, lane, acc[k])`; the result per row is
/// `hsum_float_8` of its 8 lanes, plus for Q4_1 `summs`, the rows' `fma(m_w, s_a, summs)` over
/// the blocks. `L` is `w`'s layout (checked by the caller, with the panel's `sa` for Q4_1).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn b32_group_gemv<const L: u8>(w: &B32Packed, g: usize, panel: &B32Panel) -> __m512 {
    let n = w.per_row;
    let (y, corr, da) = (&panel.acts[0][..n], &panel.corr[0][..n], &panel.da[0][..n]);
    let lines = w.lines();
    let q = &w.q[g * n * lines..][..n * lines];
    let d = &w.d[g * n..][..n];
    let high: &[Line] = if L == NIBBLES5 { &w.high[g * n..][..n] } else { &[] };
    let (mins, sa): (&[_], &[f32]) = if L == NIBBLES4_MIN { (&w.m[g * n..][..n], &panel.sa[0][..n]) } else { (&[], &[]) };
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut summs = _mm512_setzero_ps();
    for b in 0..n {
        let dd = _mm512_mul_ps(ld_f16x16(&d[b]), _mm512_set1_ps(da[b]));
        if L == NIBBLES4_MIN {
            summs = _mm512_fmadd_ps(ld_f16x16(&mins[b]), _mm512_set1_ps(sa[b]), summs);
        }
        let u = slot_quants::<L>(q, high, b);
        for k in 0..8 {
            let lane = _mm512_dpbusd_epi32(_mm512_set1_epi32(corr[b][k]), u[k], bcast4(&y[b].qs, k));
            acc[k] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lane), acc[k]);
        }
    }
    if L == NIBBLES4_MIN { _mm512_add_ps(hsum_lanes8(&acc), summs) } else { hsum_lanes8(&acc) }
}

impl Avx512 {
    /// `tile` holding row groups `first..first + groups` of `w` for [`Avx512::b32_tile`]: the
    /// same tile the scalar fill makes from the matrix's blocks, from the packed lines instead
    /// (no unpacking of the file's blocks per call). `false`, leaving `tile` as it was, for an
    /// inconsistent `w` or groups past its end.
    pub fn b32_fill_packed(self, tile: &mut B32Tile, w: &B32Packed, first: usize, groups: usize) -> bool {
        if !w.consistent() || first.checked_add(groups).is_none_or(|end| end > w.groups()) || w.rows % LANES != 0 {
            return false;
        }
        // SAFETY: an Avx512 token exists only where detection found every feature enabled;
        // `consistent` and the group check keep every slice in bounds.
        unsafe {
            match w.layout() {
                B32Layout::Bytes => b32_fill::<BYTES>(tile, w, first, groups),
                B32Layout::Nibbles5 => b32_fill::<NIBBLES5>(tile, w, first, groups),
                B32Layout::Nibbles4Min => b32_fill::<NIBBLES4_MIN>(tile, w, first, groups),
            }
        }
        true
    }

    /// `out[i]` for the rows of groups `first..` of `w` (`out` holds `16 · groups` rows or
    /// fewer at the matrix's end) against the one token of `panel`: bit for bit the
    /// single-row `vec_dot` of each row. `false`, writing nothing, where the shapes do not fit.
    pub fn b32_packed_gemv(self, w: &B32Packed, first: usize, panel: &B32Panel, out: &mut [f32]) -> bool {
        let n = w.per_row;
        let len = |v: Option<usize>| v == Some(n);
        let token_fits = panel.acts.len() == 1
            && len(panel.acts.first().map(|a| a.len()))
            && len(panel.corr.first().map(Vec::len))
            && len(panel.da.first().map(Vec::len));
        let layout = w.layout();
        let sums_fit = layout != B32Layout::Nibbles4Min || (panel.sa.len() == 1 && len(panel.sa.first().map(Vec::len)));
        if !token_fits || !sums_fit || !w.consistent() || first * LANES + out.len() > w.rows {
            return false;
        }
        for (i, o) in out.chunks_mut(LANES).enumerate() {
            // SAFETY: an Avx512 token exists only where detection found every feature enabled;
            // `consistent` and the row check above keep every slice in bounds.
            let v = unsafe {
                match layout {
                    B32Layout::Bytes => b32_group_gemv::<BYTES>(w, first + i, panel),
                    B32Layout::Nibbles5 => b32_group_gemv::<NIBBLES5>(w, first + i, panel),
                    B32Layout::Nibbles4Min => b32_group_gemv::<NIBBLES4_MIN>(w, first + i, panel),
                }
            };
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` is 16 writable f32; storeu needs no alignment.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
            o.copy_from_slice(&lanes[..o.len()]);
        }
        true
    }

    /// `out[i]` for the rows of groups `first..` of `w` (`out` holds `16 · groups` rows or
    /// fewer at the matrix's end): bit for bit
    /// [`gemv_q4_k`](crate::quants::gemv::gemv_q4_k) of each row against `a`. `false`, writing
    /// nothing, where the shapes do not fit.
    pub fn k4_packed_gemv(self, w: &K4Packed, first: usize, a: &K8Row, out: &mut [f32]) -> bool {
        let n = w.per_row;
        let start = first * LANES;
        if a.y.len() != n || a.bs.len() != n || start + out.len() > w.rows || (first + out.len().div_ceil(LANES)) * n > w.blocks.len() {
            return false;
        }
        for (i, o) in out.chunks_mut(LANES).enumerate() {
            // SAFETY: an Avx512 token exists only where detection found every feature enabled.
            let v = unsafe { group_gemv(w.group(first + i), a) };
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` is 16 writable f32; storeu needs no alignment.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
            o.copy_from_slice(&lanes[..o.len()]);
        }
        true
    }
}
