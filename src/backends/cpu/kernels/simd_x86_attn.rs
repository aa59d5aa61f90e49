//! AVX-512 attention kernels that serve several keys or several queries per pass, with the
//! arithmetic of the one-at-a-time kernels in `simd_x86` (their scalar twins are the same
//! as theirs: [`dot_rows_k`](super::dot::dot_rows_k) and
//! [`fma_rows_group_k`](super::dot::fma_rows_group_k) with `Kernels::Scalar`).
//!
//! * [`scores16`]: sixteen `ggml_vec_dot_f32` scores at once. Each key's four accumulators are
//!   formed and combined as `(a0 + a2) + (a1 + a3)` exactly as `dot_blocks` does; then, instead
//!   of sixteen `_mm512_reduce_add_ps` trees, one transpose-and-add network performs the same
//!   additions for all sixteen keys (lane `i + 8` onto `i`, then `i + 4`, `i + 2`, `i + 1`,
//!   the tree GCC writes for the reduction), so every score keeps its bits.
//! * [`fma_group`]: the V sum of up to [`GROUP`] queries over the same cells: each V row is
//!   loaded once and added, by FMA, into every query's slot `cell % 64`, the cells of a slot in
//!   increasing order, as `fma_rows` does one query at a time.
//! * [`v_sums_reduced`]: the V sums of up to [`REDUCED_GROUP`] queries over the same cells (a
//!   decode token's heads), reduced in the same pass: each slot is summed in registers, the
//!   four slots `l`, `16 + l`, `32 + l`, `48 + l` of each lane `l` combined as soon as they are
//!   done, so the 64 slot rows (`64 * head_dim` values a query) are never zeroed, written or
//!   read back. The FMAs of each slot and the additions of the reduction are those of
//!   `fma_rows` and `reduce_slots`.

use std::arch::x86_64::*;

use super::dot::SlotSum;
use super::simd_x86::Avx512;

/// Queries whose slot accumulators one pass of [`fma_group`] holds in registers (4 × 16
/// lanes each).
pub(crate) const GROUP: usize = 6;

impl Avx512 {
    /// `out[j] = dot_f32(q, row j)` for 16 rows (row `j` = `rows[j*stride..][..q.len()]`),
    /// `q.len()` a non-zero multiple of 64.
    pub(crate) fn scores16(self, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32; 16]) {
        // SAFETY: an `Avx512` token exists only when all its features were detected.
        unsafe { scores16(q, rows, stride, out) }
    }

    /// The V sums of queries over the same cells (`probs[q][i]` weights row `i` of `rows`,
    /// every `probs[q]` equally long), each reduced into its `hd` values of `out`
    /// (`[query][hd]`), `hd` a multiple of 16: [`fma_rows_k`](super::dot::fma_rows_k) from
    /// zeroed slots, then [`reduce_slots`](super::dot::reduce_slots), bit for bit.
    pub(crate) fn v_sums_reduced(self, hd: usize, probs: &[&[f32]], rows: &[f32], stride: usize, out: &mut [f32]) {
        // The kernel writes whole 16-value pieces of each query's `hd`.
        assert!(hd.is_multiple_of(16), "v_sums_reduced: head size {hd} is not a multiple of 16");
        for (batch, out) in probs.chunks(REDUCED_GROUP).zip(out.chunks_mut(REDUCED_GROUP * hd)) {
            // SAFETY: as in `scores16`.
            unsafe {
                match batch.len() {
                    1 => v_sums_reduced::<1>(hd, batch, rows, stride, out),
                    2 => v_sums_reduced::<2>(hd, batch, rows, stride, out),
                    3 => v_sums_reduced::<3>(hd, batch, rows, stride, out),
                    4 => v_sums_reduced::<4>(hd, batch, rows, stride, out),
                    5 => v_sums_reduced::<5>(hd, batch, rows, stride, out),
                    6 => v_sums_reduced::<6>(hd, batch, rows, stride, out),
                    7 => v_sums_reduced::<7>(hd, batch, rows, stride, out),
                    _ => v_sums_reduced::<8>(hd, batch, rows, stride, out),
                }
            }
        }
    }

    /// [`fma_rows_group_k`](super::dot::fma_rows_group_k) for `hd` a multiple of 64.
    pub(crate) fn fma_group(
        self,
        hd: usize,
        sums: &mut [SlotSum],
        rows: &[f32],
        stride: usize,
        cells: std::ops::Range<usize>,
    ) {
        for batch in sums.chunks_mut(GROUP) {
            // SAFETY: as in `scores16`.
            unsafe {
                match batch.len() {
                    1 => fma_group::<1>(hd, batch, rows, stride, cells.clone()),
                    2 => fma_group::<2>(hd, batch, rows, stride, cells.clone()),
                    3 => fma_group::<3>(hd, batch, rows, stride, cells.clone()),
                    4 => fma_group::<4>(hd, batch, rows, stride, cells.clone()),
                    5 => fma_group::<5>(hd, batch, rows, stride, cells.clone()),
                    _ => fma_group::<6>(hd, batch, rows, stride, cells.clone()),
                }
            }
        }
    }
}

/// Two 128-bit-lane shuffles of `a` and `b` added: `shuffle_f32x4::<X>(a, b) +
/// shuffle_f32x4::<Y>(a, b)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn add_x4<const X: i32, const Y: i32>(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<X>(a, b),
        _mm512_shuffle_f32x4::<Y>(a, b),
    )
}

/// [`add_x4`] with in-lane shuffles (`shuffle_ps`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn add_ps<const X: i32, const Y: i32>(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(_mm512_shuffle_ps::<X>(a, b), _mm512_shuffle_ps::<Y>(a, b))
}

/// The reduction of sixteen keys' combined accumulators `t[k]`, each lane sum being GCC's
/// `_mm512_reduce_add_ps` tree (`h8[i] = l[i] + l[i+8]`, `h4[i] = h8[i] + h8[i+4]`,
/// `h2[i] = h4[i] + h4[i+2]`, `h2[0] + h2[1]`), all sixteen keys per instruction.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn reduce16x16(t: &[__m512; 16]) -> __m512 {
    // Level 1: u[p] = [h8 of key 2p | h8 of key 2p+1] (128-bit chunks [a0,a1,b0,b1] + [a2,a3,b2,b3]).
    let u: [__m512; 8] = std::array::from_fn(|p| add_x4::<0x44, 0xEE>(t[2 * p], t[2 * p + 1]));
    // Level 2: w[r] = chunk c holds h4 of key 4r + c ([A0,B0,C0,D0] + [A1,B1,C1,D1]).
    let w: [__m512; 4] = std::array::from_fn(|r| add_x4::<0x88, 0xDD>(u[2 * r], u[2 * r + 1]));
    // Level 3: z[s] = chunk c holds [h2 of key 8s + c, h2 of key 8s + 4 + c] (lanes 0,1 + 2,3).
    let z: [__m512; 2] = std::array::from_fn(|s| add_ps::<0x44, 0xEE>(w[2 * s], w[2 * s + 1]));
    // Level 4: lane 4c + k holds key 4k + c (lane 0 + lane 1 of each h2).
    let f = add_ps::<0x88, 0xDD>(z[0], z[1]);
    // Back to key order: key j = 4k + c comes from lane 4c + k.
    let idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_permutexvar_ps(idx, f)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn scores16(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32; 16]) {
    let n = q.len();
    debug_assert!(n > 0 && n.is_multiple_of(64));
    match n / 64 {
        1 => scores16_with::<4>(q, rows, stride, out),
        2 => scores16_with::<8>(q, rows, stride, out),
        _ => {
            // Longer heads: q from memory (L1) 64 values at a time would change nothing in the
            // arithmetic; the registers are kept for the keys.
            let t: [__m512; 16] = std::array::from_fn(|j| {
                let row = &rows[j * stride..][..n];
                let mut acc = [_mm512_setzero_ps(); 4];
                for (xs, ys) in q.chunks_exact(64).zip(row.chunks_exact(64)) {
                    for (m, a) in acc.iter_mut().enumerate() {
                        // SAFETY: both chunks hold 64 f32, 16m + 16 <= 64.
                        *a = unsafe {
                            _mm512_fmadd_ps(
                                _mm512_loadu_ps(xs.as_ptr().add(16 * m)),
                                _mm512_loadu_ps(ys.as_ptr().add(16 * m)),
                                *a,
                            )
                        };
                    }
                }
                _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))
            });
            // SAFETY: `out` holds 16 f32.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), reduce16x16(&t)) }
        }
    }
}

/// [`scores16`] with the query held in `NQ` registers (`NQ = q.len() / 16`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn scores16_with<const NQ: usize>(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32; 16]) {
    let q = &q[..16 * NQ];
    // SAFETY: `q` holds 16 * NQ f32.
    let qv: [__m512; NQ] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(q.as_ptr().add(16 * i)) });
    // Each key's four accumulators, combined as `(a0 + a2) + (a1 + a3)` like `dot_blocks`
    // (written out here rather than as a helper: a helper call per key was not inlined and
    // cost a third of the loop).
    let mut t = [_mm512_setzero_ps(); 16];
    for (j, tj) in t.iter_mut().enumerate() {
        let row = &rows[j * stride..][..16 * NQ];
        let mut acc = [_mm512_setzero_ps(); 4];
        for (i, qi) in qv.iter().enumerate() {
            // SAFETY: i < NQ, so 16i + 16 <= row.len().
            acc[i % 4] = _mm512_fmadd_ps(
                *qi,
                unsafe { _mm512_loadu_ps(row.as_ptr().add(16 * i)) },
                acc[i % 4],
            );
        }
        *tj = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    }
    // SAFETY: `out` holds 16 f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), reduce16x16(&t)) }
}

/// The V sum of `R` queries over `cells` (the first a multiple of 64), 64 output dims at a
/// time: per slot `s`, the queries' slot accumulators stay in registers while the cells
/// `s, s + 64, …` of `cells` are added in order, each V row loaded once for all of them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn fma_group<const R: usize>(
    hd: usize,
    sums: &mut [SlotSum],
    rows: &[f32],
    stride: usize,
    cells: std::ops::Range<usize>,
) {
    debug_assert!(sums.len() == R && hd.is_multiple_of(64) && cells.start.is_multiple_of(64));
    // The cells each query takes from this range: lo[r]..hi[r] (empty when lo >= hi).
    let lo: [usize; R] = std::array::from_fn(|r| sums[r].from.max(cells.start));
    let hi: [usize; R] =
        std::array::from_fn(|r| (sums[r].from + sums[r].probs.len()).min(cells.end));
    let end = (0..R)
        .map(|r| if lo[r] < hi[r] { hi[r] } else { 0 })
        .max()
        .unwrap_or(0);
    for piece in (0..hd).step_by(64) {
        for s in 0..64 {
            let first = cells.start + s;
            if first >= end {
                break;
            }
            let at = s * hd + piece;
            // SAFETY: every slot accumulator holds 64 * hd f32 (checked by the caller), so
            // at + 64 <= 64 * hd.
            let mut acc: [[__m512; 4]; R] = std::array::from_fn(|r| {
                let p = sums[r].acc[at..at + 64].as_ptr();
                unsafe { std::array::from_fn(|m| _mm512_loadu_ps(p.add(16 * m))) }
            });
            let mut j = first;
            while j < end {
                let v = &rows[j * stride + piece..][..64];
                // SAFETY: `v` holds 64 f32.
                let vr: [__m512; 4] =
                    unsafe { std::array::from_fn(|m| _mm512_loadu_ps(v.as_ptr().add(16 * m))) };
                for (r, a) in acc.iter_mut().enumerate() {
                    if j >= lo[r] && j < hi[r] {
                        let p = _mm512_set1_ps(sums[r].probs[j - sums[r].from]);
                        for (a, v) in a.iter_mut().zip(&vr) {
                            *a = _mm512_fmadd_ps(p, *v, *a);
                        }
                    }
                }
                j += 64;
            }
            for (r, a) in acc.iter().enumerate() {
                let p = sums[r].acc[at..at + 64].as_mut_ptr();
                for (m, a) in a.iter().enumerate() {
                    // SAFETY: as for the loads.
                    unsafe { _mm512_storeu_ps(p.add(16 * m), *a) };
                }
            }
        }
    }
}

/// Queries one pass of [`v_sums_reduced`] serves (a decode token's heads of one KV head:
/// 7 for Qwen2.5-0.5B), each V row loaded once for all of them.
pub(crate) const REDUCED_GROUP: usize = 8;

/// [`Avx512::v_sums_reduced`] for `R` queries over the same cells (`probs[r][i]` weights row
/// `i` of `rows`, every `probs[r]` `n` long), 16 output dims at a time, slot by slot: slot `s`
/// takes rows `s`, `s + 64`, … in increasing order into a register per query (a slot no cell
/// reaches stays +0, as a zeroed slot row does). The four slots `l`, `16 + l`, `32 + l`,
/// `48 + l` of lane `l` are combined as `(s0 + s2) + (s1 + s3)` as soon as they are done, and
/// the 16 lane values then add as `reduce_slots` adds them (`l += l + 8`, `+ 4`, `+ 2`, then
/// lane 0 + lane 1). A slot's rows are 64 apart (32 KiB with the 0.5B's 512-byte rows, so
/// one L1 set holds them all), which is where the chunked slot rows win from about 2000 cells.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
fn v_sums_reduced<const R: usize>(hd: usize, probs: &[&[f32]], rows: &[f32], stride: usize, out: &mut [f32]) {
    let n = probs.first().map_or(0, |p| p.len());
    debug_assert!(probs.len() == R && probs.iter().all(|p| p.len() == n));
    debug_assert!(hd.is_multiple_of(16) && out.len() >= R * hd);
    let probs: [&[f32]; R] = std::array::from_fn(|r| &probs[r][..n]);
    for piece in (0..hd).step_by(16) {
        // Slot `s`'s sums of the 16 dims from `piece` on, one register per query.
        let slot = |s: usize| -> [__m512; R] {
            let mut acc = [_mm512_setzero_ps(); R];
            let mut j = s;
            while j < n {
                let row = &rows[j * stride + piece..][..16];
                // SAFETY: `row` holds 16 f32.
                let v = unsafe { _mm512_loadu_ps(row.as_ptr()) };
                for (a, p) in acc.iter_mut().zip(&probs) {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), v, *a);
                }
                j += 64;
            }
            acc
        };
        let mut lanes = [[_mm512_setzero_ps(); R]; 16];
        for (l, lane) in lanes.iter_mut().enumerate() {
            let (s0, s2) = (slot(l), slot(32 + l));
            let t: [__m512; R] = std::array::from_fn(|r| _mm512_add_ps(s0[r], s2[r]));
            let (s1, s3) = (slot(16 + l), slot(48 + l));
            *lane = std::array::from_fn(|r| _mm512_add_ps(t[r], _mm512_add_ps(s1[r], s3[r])));
        }
        for half in [8, 4, 2] {
            let (lo, hi) = lanes.split_at_mut(half);
            for (a, b) in lo.iter_mut().zip(hi.iter()) {
                for (x, y) in a.iter_mut().zip(b) {
                    *x = _mm512_add_ps(*x, *y);
                }
            }
        }
        for r in 0..R {
            let o = &mut out[r * hd + piece..][..16];
            // SAFETY: `o` holds 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(lanes[0][r], lanes[1][r])) };
        }
    }
}
