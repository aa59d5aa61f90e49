//! The x86-64 SIMD kernels (AVX-512 and AVX2), the only `unsafe` code of the non-matmul ops.
//!
//! Each kernel here has a scalar twin elsewhere in `vec_ops` that performs the same operations
//! per lane in the same order; the two must stay bit-identical (tests compare them). The
//! AVX-512 kernels follow llama.cpp's AVX-512 build instruction for instruction; the AVX2
//! kernels compute the same 16-lane arithmetic with two 8-lane registers, and replace
//! `_mm512_scalef_ps` by two exact power-of-two multiplies (see `expf::scalef`).
//!
//! Kernels are reached through the tokens [`Avx512`] and [`Avx2`], which exist only after
//! runtime detection found their features; their methods are therefore safe. Target features
//! stop at `avx512f,avx512bw,avx512vl,avx512dq` (never AMX).
//!
//! Block kernels (`*_blocks`) process the longest prefix of whole 16-value blocks (64 for the
//! dot product) and return how many values they did; the caller finishes the tail the way
//! ggml does (libm `expf`, scalar FMAs).

use std::arch::x86_64::*;

use super::dot::{DOT_STEP, leftover};
use super::expf::{C1, C2, C3, C4, C5, LN2_HI, LN2_LO, LOG2E, N_LIMIT, ROUND};
use super::rope::RopeCache;

/// Proof that this CPU has AVX2 and FMA.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

/// Proof that this CPU has AVX-512 F/BW/VL/DQ (and AVX2, FMA).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

impl Avx2 {
    pub(crate) fn detect() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Avx2(()))
    }

    /// `y[i] = silu(x[i])` for the whole 16-blocks of `x`; returns the count done.
    pub(crate) fn silu_blocks(self, x: &[f32], y: &mut [f32]) -> usize {
        // SAFETY: an `Avx2` token exists only when AVX2 and FMA were detected.
        unsafe { avx2::silu_blocks(x, y) }
    }

    /// `y[i] = silu(g[i]) * u[i]` for the whole 16-blocks; returns the count done.
    pub(crate) fn swiglu_blocks(self, g: &[f32], u: &[f32], y: &mut [f32]) -> usize {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx2::swiglu_blocks(g, u, y) }
    }

    /// `y[i] = expf(x[i] - max)` for the whole 16-blocks, and the f64 sum of the blocks' sums.
    pub(crate) fn exp_sum_blocks(self, x: &[f32], max: f32, y: &mut [f32]) -> (usize, f64) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx2::exp_sum_blocks(x, max, y) }
    }

    /// ggml_vec_dot_f32's vector part over the whole 64-blocks: (count done, reduced sum).
    pub(crate) fn dot_blocks(self, x: &[f32], y: &[f32]) -> (usize, f32) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx2::dot_blocks(x, y) }
    }

    /// `out[j] = dot_f32(q, row j)` (row `j` = `rows[j*stride..][..q.len()]`) for every `j`.
    pub(crate) fn dot_rows(self, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx2::dot_rows(q, rows, stride, out) }
    }

    /// For every `j`: `acc[slot] = fma(probs[j], row j, acc[slot])`, slot `j % 64` being
    /// `acc[(j % 64) * hd..][..hd]` and row `j` `rows[j*stride..][..hd]`.
    pub(crate) fn fma_rows(
        self,
        acc: &mut [f32],
        hd: usize,
        probs: &[f32],
        rows: &[f32],
        stride: usize,
    ) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx2::fma_rows(acc, hd, probs, rows, stride) }
    }

    /// [`RopeCache::rotate_rows`] compiled with FMA (one `vfmadd` per `mul_add`, vectorized).
    pub(crate) fn rope_rows(self, table: &RopeCache, x: &mut [f32], width: usize) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx2::rope_rows(table, x, width) }
    }
}

impl Avx512 {
    pub(crate) fn detect() -> Option<Avx512> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma");
        ok.then_some(Avx512(()))
    }

    pub(crate) fn silu_blocks(self, x: &[f32], y: &mut [f32]) -> usize {
        // SAFETY: an `Avx512` token exists only when all its features were detected.
        unsafe { avx512::silu_blocks(x, y) }
    }

    pub(crate) fn swiglu_blocks(self, g: &[f32], u: &[f32], y: &mut [f32]) -> usize {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx512::swiglu_blocks(g, u, y) }
    }

    pub(crate) fn exp_sum_blocks(self, x: &[f32], max: f32, y: &mut [f32]) -> (usize, f64) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx512::exp_sum_blocks(x, max, y) }
    }

    pub(crate) fn dot_blocks(self, x: &[f32], y: &[f32]) -> (usize, f32) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx512::dot_blocks(x, y) }
    }

    /// Rows in groups of 16 through [`Avx512::scores16`] when `q.len()` is a multiple of 64,
    /// the rest one by one (same bits either way).
    pub(crate) fn dot_rows(self, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = q.len();
        let mut done = 0;
        if n > 0 && n.is_multiple_of(DOT_STEP) {
            for (g, o) in out.as_chunks_mut::<16>().0.iter_mut().enumerate() {
                self.scores16(q, &rows[16 * g * stride..], stride, o);
                done += 16;
            }
        }
        if done < out.len() {
            // SAFETY: as in `silu_blocks`.
            unsafe { avx512::dot_rows(q, &rows[done * stride..], stride, &mut out[done..]) }
        }
    }

    pub(crate) fn fma_rows(
        self,
        acc: &mut [f32],
        hd: usize,
        probs: &[f32],
        rows: &[f32],
        stride: usize,
    ) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx512::fma_rows(acc, hd, probs, rows, stride) }
    }

    /// [`RopeCache::rotate_rows`] compiled with AVX-512 and FMA.
    pub(crate) fn rope_rows(self, table: &RopeCache, x: &mut [f32], width: usize) {
        // SAFETY: as in `silu_blocks`.
        unsafe { avx512::rope_rows(table, x, width) }
    }
}

/// `_mm512_reduce_add_ps` as GCC writes it, on a 16-lane value held as two halves.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce16(lo: __m256, hi: __m256) -> f32 {
    let h8 = _mm256_add_ps(hi, lo);
    let h4 = _mm_add_ps(_mm256_extractf128_ps::<1>(h8), _mm256_castps256_ps128(h8));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    _mm_cvtss_f32(h2) + _mm_cvtss_f32(_mm_movehdup_ps(h2))
}

mod avx512 {
    use super::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn rope_rows(table: &RopeCache, x: &mut [f32], width: usize) {
        table.rotate_rows(x, width);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = q.len();
        for (j, o) in out.iter_mut().enumerate() {
            let r = &rows[j * stride..][..n];
            let (done, sum) = dot_blocks(q, r);
            *o = leftover(&q[done..], &r[done..], sum);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn fma_rows(acc: &mut [f32], hd: usize, probs: &[f32], rows: &[f32], stride: usize) {
        if hd == 64 {
            return fma_rows_64(acc, probs, rows, stride);
        }
        for (j, &p) in probs.iter().enumerate() {
            fma_row(
                &mut acc[(j % DOT_STEP) * hd..][..hd],
                p,
                &rows[j * stride..][..hd],
            );
        }
    }

    /// [`fma_rows`] for 64-value heads, slot by slot: slot `s` is held in 4 registers while the
    /// cells `s, s + 64, …` are added in order (the same FMAs, in the same order per slot, as
    /// the cell-by-cell loop, without reloading and storing the slot for every cell).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    fn fma_rows_64(acc: &mut [f32], probs: &[f32], rows: &[f32], stride: usize) {
        for (s, slot) in acc.chunks_exact_mut(64).take(probs.len().min(DOT_STEP)).enumerate() {
            // SAFETY: `slot` holds 64 f32; unaligned loads.
            let mut r: [__m512; 4] = unsafe {
                let p = slot.as_ptr();
                [
                    _mm512_loadu_ps(p),
                    _mm512_loadu_ps(p.add(16)),
                    _mm512_loadu_ps(p.add(32)),
                    _mm512_loadu_ps(p.add(48)),
                ]
            };
            for (j, &p) in probs.iter().enumerate().skip(s).step_by(DOT_STEP) {
                let v = &rows[j * stride..][..64];
                let vp = _mm512_set1_ps(p);
                for (m, r) in r.iter_mut().enumerate() {
                    // SAFETY: v holds 64 f32, 16m + 16 <= 64.
                    *r = _mm512_fmadd_ps(vp, unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * m)) }, *r);
                }
            }
            for (m, r) in r.iter().enumerate() {
                // SAFETY: slot holds 64 f32, 16m + 16 <= 64.
                unsafe { _mm512_storeu_ps(slot.as_mut_ptr().add(16 * m), *r) };
            }
        }
    }

    /// `ggml_v_expf`, AVX-512 build.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn expf(x: __m512) -> __m512 {
        let r = _mm512_set1_ps(ROUND);
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(LN2_LO),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
        );
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(N_LIMIT));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(C5), b, _mm512_set1_ps(C4)),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(C3), b, _mm512_set1_ps(C2)),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(C1), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let alt = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
            _mm512_set1_ps(f32::INFINITY),
            zero,
        );
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// `ggml_v_silu`, AVX-512 build.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    fn silu(x: __m512) -> __m512 {
        let e = expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    fn reduce(v: __m512) -> f32 {
        reduce16(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn silu_blocks(x: &[f32], y: &mut [f32]) -> usize {
        let n = x.len().min(y.len()) / 16 * 16;
        for (xs, ys) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact_mut(16)) {
            // SAFETY: both chunks hold exactly 16 f32; unaligned loads and stores.
            unsafe { _mm512_storeu_ps(ys.as_mut_ptr(), silu(_mm512_loadu_ps(xs.as_ptr()))) }
        }
        n
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn swiglu_blocks(g: &[f32], u: &[f32], y: &mut [f32]) -> usize {
        let n = g.len().min(u.len()).min(y.len()) / 16 * 16;
        let blocks = g[..n].chunks_exact(16).zip(u[..n].chunks_exact(16));
        for ((gs, us), ys) in blocks.zip(y[..n].chunks_exact_mut(16)) {
            // SAFETY: all three chunks hold exactly 16 f32; unaligned loads and stores.
            unsafe {
                let s = silu(_mm512_loadu_ps(gs.as_ptr()));
                _mm512_storeu_ps(
                    ys.as_mut_ptr(),
                    _mm512_mul_ps(s, _mm512_loadu_ps(us.as_ptr())),
                );
            }
        }
        n
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn exp_sum_blocks(x: &[f32], max: f32, y: &mut [f32]) -> (usize, f64) {
        let n = x.len().min(y.len()) / 16 * 16;
        let vmax = _mm512_set1_ps(max);
        let mut sum = 0.0f64;
        for (xs, ys) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact_mut(16)) {
            // SAFETY: both chunks hold exactly 16 f32; unaligned loads and stores.
            let v = unsafe {
                let v = expf(_mm512_sub_ps(_mm512_loadu_ps(xs.as_ptr()), vmax));
                _mm512_storeu_ps(ys.as_mut_ptr(), v);
                v
            };
            sum += reduce(v) as f64;
        }
        (n, sum)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn dot_blocks(x: &[f32], y: &[f32]) -> (usize, f32) {
        let n = x.len().min(y.len()) / 64 * 64;
        let mut acc = [_mm512_setzero_ps(); 4];
        for (xs, ys) in x[..n].chunks_exact(64).zip(y[..n].chunks_exact(64)) {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: each chunk holds 64 f32, so offsets 16k..16k+16 (k < 4) are in bounds.
                unsafe {
                    let vx = _mm512_loadu_ps(xs.as_ptr().add(16 * k));
                    let vy = _mm512_loadu_ps(ys.as_ptr().add(16 * k));
                    *a = _mm512_fmadd_ps(vx, vy, *a);
                }
            }
        }
        let s02 = _mm512_add_ps(acc[0], acc[2]);
        let s13 = _mm512_add_ps(acc[1], acc[3]);
        (n, reduce(_mm512_add_ps(s02, s13)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    fn fma_row(acc: &mut [f32], p: f32, v: &[f32]) {
        let n = acc.len().min(v.len());
        let n16 = n / 16 * 16;
        let vp = _mm512_set1_ps(p);
        for (a, vs) in acc[..n16]
            .chunks_exact_mut(16)
            .zip(v[..n16].chunks_exact(16))
        {
            // SAFETY: both chunks hold exactly 16 f32; unaligned loads and stores.
            unsafe {
                let r = _mm512_fmadd_ps(
                    vp,
                    _mm512_loadu_ps(vs.as_ptr()),
                    _mm512_loadu_ps(a.as_ptr()),
                );
                _mm512_storeu_ps(a.as_mut_ptr(), r);
            }
        }
        for (a, &vi) in acc[n16..n].iter_mut().zip(&v[n16..n]) {
            *a = p.mul_add(vi, *a);
        }
    }
}

mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn rope_rows(table: &RopeCache, x: &mut [f32], width: usize) {
        table.rotate_rows(x, width);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_rows(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        let n = q.len();
        for (j, o) in out.iter_mut().enumerate() {
            let r = &rows[j * stride..][..n];
            let (done, sum) = dot_blocks(q, r);
            *o = leftover(&q[done..], &r[done..], sum);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn fma_rows(acc: &mut [f32], hd: usize, probs: &[f32], rows: &[f32], stride: usize) {
        for (j, &p) in probs.iter().enumerate() {
            fma_row(
                &mut acc[(j % DOT_STEP) * hd..][..hd],
                p,
                &rows[j * stride..][..hd],
            );
        }
    }

    /// `ggml_v_expf` of the AVX-512 build on 8 lanes (not ggml's own AVX2 variant).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn expf(x: __m256) -> __m256 {
        let r = _mm256_set1_ps(ROUND);
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(LN2_LO),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x),
        );
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(N_LIMIT));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(_mm256_set1_ps(C5), b, _mm256_set1_ps(C4)),
                u,
                _mm256_fmadd_ps(_mm256_set1_ps(C3), b, _mm256_set1_ps(C2)),
            ),
            u,
            _mm256_fmadd_ps(_mm256_set1_ps(C1), b, _mm256_set1_ps(1.0)),
        );
        // scalef(j, n) = (j * 2^h) * 2^(n-h), h = n >> 1: the first product is exact.
        let ni = _mm256_cvtps_epi32(n);
        let h = _mm256_srai_epi32::<1>(ni);
        let bias = _mm256_set1_epi32(127);
        let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(h, bias)));
        let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_sub_epi32(ni, h),
            bias,
        )));
        let res = _mm256_mul_ps(_mm256_mul_ps(j, p1), p2);
        if _mm256_movemask_ps(d) == 0 {
            return res;
        }
        let zero = _mm256_setzero_ps();
        let le = _mm256_cmp_ps::<_CMP_LE_OQ>(n, zero);
        let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), zero, le);
        _mm256_blendv_ps(res, alt, d)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn silu(x: __m256) -> __m256 {
        let e = expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn silu_blocks(x: &[f32], y: &mut [f32]) -> usize {
        let n = x.len().min(y.len()) / 16 * 16;
        for (xs, ys) in x[..n].chunks_exact(8).zip(y[..n].chunks_exact_mut(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads and stores.
            unsafe { _mm256_storeu_ps(ys.as_mut_ptr(), silu(_mm256_loadu_ps(xs.as_ptr()))) }
        }
        n
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn swiglu_blocks(g: &[f32], u: &[f32], y: &mut [f32]) -> usize {
        let n = g.len().min(u.len()).min(y.len()) / 16 * 16;
        let blocks = g[..n].chunks_exact(8).zip(u[..n].chunks_exact(8));
        for ((gs, us), ys) in blocks.zip(y[..n].chunks_exact_mut(8)) {
            // SAFETY: all three chunks hold exactly 8 f32; unaligned loads and stores.
            unsafe {
                let s = silu(_mm256_loadu_ps(gs.as_ptr()));
                _mm256_storeu_ps(
                    ys.as_mut_ptr(),
                    _mm256_mul_ps(s, _mm256_loadu_ps(us.as_ptr())),
                );
            }
        }
        n
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_sum_blocks(x: &[f32], max: f32, y: &mut [f32]) -> (usize, f64) {
        let n = x.len().min(y.len()) / 16 * 16;
        let vmax = _mm256_set1_ps(max);
        let mut sum = 0.0f64;
        for (xs, ys) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact_mut(16)) {
            // SAFETY: both chunks hold exactly 16 f32, so offsets 0 and 8 are in bounds.
            let (lo, hi) = unsafe {
                let lo = expf(_mm256_sub_ps(_mm256_loadu_ps(xs.as_ptr()), vmax));
                let hi = expf(_mm256_sub_ps(_mm256_loadu_ps(xs.as_ptr().add(8)), vmax));
                _mm256_storeu_ps(ys.as_mut_ptr(), lo);
                _mm256_storeu_ps(ys.as_mut_ptr().add(8), hi);
                (lo, hi)
            };
            sum += reduce16(lo, hi) as f64;
        }
        (n, sum)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_blocks(x: &[f32], y: &[f32]) -> (usize, f32) {
        let n = x.len().min(y.len()) / 64 * 64;
        // The four 16-lane accumulators of the AVX-512 layout, as (low, high) halves.
        let mut acc = [_mm256_setzero_ps(); 8];
        for (xs, ys) in x[..n].chunks_exact(64).zip(y[..n].chunks_exact(64)) {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: each chunk holds 64 f32, so offsets 8k..8k+8 (k < 8) are in bounds.
                unsafe {
                    let vx = _mm256_loadu_ps(xs.as_ptr().add(8 * k));
                    let vy = _mm256_loadu_ps(ys.as_ptr().add(8 * k));
                    *a = _mm256_fmadd_ps(vx, vy, *a);
                }
            }
        }
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        (n, reduce16(lo, hi))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fma_row(acc: &mut [f32], p: f32, v: &[f32]) {
        let n = acc.len().min(v.len());
        let n8 = n / 8 * 8;
        let vp = _mm256_set1_ps(p);
        for (a, vs) in acc[..n8].chunks_exact_mut(8).zip(v[..n8].chunks_exact(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads and stores.
            unsafe {
                let r = _mm256_fmadd_ps(
                    vp,
                    _mm256_loadu_ps(vs.as_ptr()),
                    _mm256_loadu_ps(a.as_ptr()),
                );
                _mm256_storeu_ps(a.as_mut_ptr(), r);
            }
        }
        for (a, &vi) in acc[n8..n].iter_mut().zip(&v[n8..n]) {
            *a = p.mul_add(vi, *a);
        }
    }
}
