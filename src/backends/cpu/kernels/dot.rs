//! The f32 dot product as `ggml_vec_dot_f32` computes it in llama.cpp's AVX-512 build, and
//! the fused multiply-add of a scaled row into an accumulator row.
//!
//! Layout mirrored: values `0..n & !63` go through four 16-lane accumulators (value `i` into
//! accumulator `(i / 16) % 4`, lane `i % 16`, by FMA in index order); the accumulators are
//! combined as `(a0 + a2) + (a1 + a3)` and the 16 lanes summed by GCC's
//! `_mm512_reduce_add_ps` tree; the leftover values `n & !63 .. n` are then added one by one
//! in f32, as GCC compiled that loop (see `leftover`: rounded products, then FMAs for the last
//! few). Leftovers never occur in Qwen's attention (head sizes 64 and 128, KV windows of 256).
//! This is what llama.cpp computes for attention's `mul_mat`s in its single-token path (the
//! f32 KV cache's `vec_dot`; the batched path goes through llamafile's sgemm instead).

use super::isa::{Isa, Kernels};

/// Values per step of the vector part: four accumulators of 16 lanes.
pub const DOT_STEP: usize = 64;

/// `ggml_vec_dot_f32(n, x, y)` (AVX-512 build), over `n = min(x.len(), y.len())` values.
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    dot_f32_with(Isa::detected(), x, y)
}

/// [`dot_f32`] with the kernels of `isa` (or the best supported below it); the result does not
/// depend on the choice.
pub fn dot_f32_with(isa: Isa, x: &[f32], y: &[f32]) -> f32 {
    dot_k(isa.kernels(), x, y)
}

#[inline]
pub(crate) fn dot_k(k: Kernels, x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let (done, sum) = match k {
        Kernels::Scalar => dot_blocks_scalar(&x[..n], &y[..n]),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.dot_blocks(&x[..n], &y[..n]),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.dot_blocks(&x[..n], &y[..n]),
    };
    leftover(&x[done..n], &y[done..n], sum)
}

/// The values past the last whole 64-block, added to `sum` as GCC 12 compiles ggml's
/// `for (i = np; i < n; ++i) sumf += x[i]*y[i];` at `-O3 -march=native` (AVX-512): the loop
/// is vectorized for the products only, the sum staying in order, so whole 16-value groups,
/// then one 8-value group if at least 8 remain, add rounded products one by one; the last
/// (fewer than 8) values go through the scalar epilogue, where the contraction makes each
/// step one FMA.
#[inline]
pub(crate) fn leftover(x: &[f32], y: &[f32], mut sum: f32) -> f32 {
    let n = x.len().min(y.len());
    let mut rounded = n / 16 * 16;
    if n - rounded >= 8 {
        rounded += 8;
    }
    for (a, b) in x[..rounded].iter().zip(&y[..rounded]) {
        sum += a * b;
    }
    for (a, b) in x[rounded..n].iter().zip(&y[rounded..n]) {
        sum = a.mul_add(*b, sum);
    }
    sum
}

/// The scalar twin of the vector part: returns the number of values done and their sum.
pub(crate) fn dot_blocks_scalar(x: &[f32], y: &[f32]) -> (usize, f32) {
    let n = x.len().min(y.len()) / DOT_STEP * DOT_STEP;
    let mut acc = [[0.0f32; 16]; 4];
    for (xs, ys) in x[..n]
        .chunks_exact(DOT_STEP)
        .zip(y[..n].chunks_exact(DOT_STEP))
    {
        for (i, (a, b)) in xs.iter().zip(ys).enumerate() {
            let lane = &mut acc[i / 16][i % 16];
            *lane = a.mul_add(*b, *lane);
        }
    }
    (n, reduce_acc(&acc))
}

/// `(a0 + a2) + (a1 + a3)` lane-wise, then the 16-lane tree.
pub(crate) fn reduce_acc(acc: &[[f32; 16]; 4]) -> f32 {
    let mut s = [0.0f32; 16];
    for (l, v) in s.iter_mut().enumerate() {
        *v = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    super::expf::reduce16(&s)
}

/// `out[j] = dot_f32(q, row j)` for every `j`, row `j` being `rows[j*stride..][..q.len()]`
/// (attention's scores: one query against the keys of a strided cache).
#[inline]
pub(crate) fn dot_rows_k(k: Kernels, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    match k {
        Kernels::Scalar => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = dot_k(Kernels::Scalar, q, &rows[j * stride..][..q.len()]);
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.dot_rows(q, rows, stride, out),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.dot_rows(q, rows, stride, out),
    }
}

/// For every `j < probs.len()`: `acc[slot] = fma(probs[j], row j, acc[slot])` element-wise,
/// slot `j % 64` being `acc[(j % 64) * hd..][..hd]` and row `j` `rows[j*stride..][..hd]`
/// (attention's V sum, see `attention`).
#[inline]
pub(crate) fn fma_rows_k(
    k: Kernels,
    acc: &mut [f32],
    hd: usize,
    probs: &[f32],
    rows: &[f32],
    stride: usize,
) {
    match k {
        Kernels::Scalar => {
            for (j, &p) in probs.iter().enumerate() {
                let slot = &mut acc[(j % DOT_STEP) * hd..][..hd];
                for (a, &v) in slot.iter_mut().zip(&rows[j * stride..][..hd]) {
                    *a = p.mul_add(v, *a);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2(t) => t.fma_rows(acc, hd, probs, rows, stride),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512(t) => t.fma_rows(acc, hd, probs, rows, stride),
    }
}

/// One query's part of [`fma_rows_group_k`]: its 64 slot accumulators (`64 * hd` values, slot
/// `s` at `acc[s * hd..][..hd]`) and its probabilities, `probs[i]` weighting cell `from + i`
/// (`from` a multiple of 64, so cell `j` goes to slot `j % 64`).
pub(crate) struct SlotSum<'a> {
    pub acc: &'a mut [f32],
    pub probs: &'a [f32],
    pub from: usize,
}

/// The reduction of ggml_vec_dot_f32 applied to `head_dim` dot products at once: slot `s`
/// (`s < 64`; absent slots are +0, what an accumulator lane holds when no cell reached it)
/// is lane `s % 16` of accumulator `s / 16`; the accumulators combine as
/// `(a0 + a2) + (a1 + a3)`, then the 16 lanes by the `_mm512_reduce_add_ps` tree. Every step
/// is an element-wise sum of rows, the same additions per output dim as ggml's.
pub(crate) fn reduce_slots(acc: &[f32], hd: usize, out: &mut [f32]) {
    let zero = vec![0.0f32; hd];
    let slot = |s: usize| acc.get(s * hd..(s + 1) * hd).unwrap_or(&zero);
    let mut lanes = vec![0.0f32; 16 * hd];
    for (l, lane) in lanes.chunks_exact_mut(hd).enumerate() {
        let (a0, a1, a2, a3) = (slot(l), slot(16 + l), slot(32 + l), slot(48 + l));
        for d in 0..hd {
            lane[d] = (a0[d] + a2[d]) + (a1[d] + a3[d]);
        }
    }
    // 16 -> 8 -> 4 -> 2 lanes: lane l += lane l + half, in place (IEEE addition commutes, so
    // GCC's `high + low` is the same sum).
    for half in [8, 4, 2] {
        let (lo, hi) = lanes.split_at_mut(half * hd);
        for (x, y) in lo.iter_mut().zip(&hi[..half * hd]) {
            *x += *y;
        }
    }
    for ((o, x), y) in out.iter_mut().zip(&lanes[..hd]).zip(&lanes[hd..2 * hd]) {
        *o = x + y;
    }
}

/// The V sums of queries over the same cells, each reduced into its `hd` values of `out`
/// (`[query][hd]`): `probs[q][i]` weights row `i` of `rows` (`rows[i*stride..][..hd]`, the
/// first row a multiple of 64 cells into the region, so row `i` goes to slot `i % 64`), every
/// `probs[q]` as long as the first. What [`fma_rows_k`] from zeroed slots then
/// [`reduce_slots`] give, bit for bit, without the slot rows in memory. `false`, writing
/// nothing, where the ISA has no such kernel (AVX-512 has, for `hd` a multiple of 16) or the
/// lengths differ.
pub(crate) fn v_sums_reduced_k(k: Kernels, hd: usize, probs: &[&[f32]], rows: &[f32], stride: usize, out: &mut [f32]) -> bool {
    let n = probs.first().map_or(0, |p| p.len());
    if probs.iter().any(|p| p.len() != n) || out.len() < probs.len() * hd {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if let Kernels::Avx512(t) = k
        && hd > 0
        && hd.is_multiple_of(16)
    {
        t.v_sums_reduced(hd, probs, rows, stride, out);
        return true;
    }
    let _ = (k, rows, stride);
    false
}

/// [`fma_rows_k`] for several queries over the same rows, restricted to `cells` (its start a
/// multiple of 64): for each query and each of its cells `j` in `cells`,
/// `acc[j % 64] = fma(probs[j - from], row j, acc[j % 64])`, row `j` being
/// `rows[j*stride..][..hd]`. Per query the same FMAs in the same order as [`fma_rows_k`] over
/// its whole row, whatever the ranges the caller splits the cells into.
pub(crate) fn fma_rows_group_k(
    k: Kernels,
    hd: usize,
    sums: &mut [SlotSum],
    rows: &[f32],
    stride: usize,
    cells: std::ops::Range<usize>,
) {
    debug_assert!(cells.start.is_multiple_of(DOT_STEP));
    debug_assert!(sums.iter().all(|s| s.from.is_multiple_of(DOT_STEP) && s.acc.len() == DOT_STEP * hd));
    #[cfg(target_arch = "x86_64")]
    if let Kernels::Avx512(t) = k
        && hd > 0
        && hd.is_multiple_of(DOT_STEP)
    {
        return t.fma_group(hd, sums, rows, stride, cells);
    }
    for s in sums.iter_mut() {
        let lo = s.from.max(cells.start);
        let hi = (s.from + s.probs.len()).min(cells.end);
        if lo < hi {
            // `lo` is a multiple of 64, so fma_rows_k's slot `(j - lo) % 64` is `j % 64`.
            fma_rows_k(k, s.acc, hd, &s.probs[lo - s.from..hi - s.from], &rows[lo * stride..], stride);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_isa_matches_the_scalar_twin_bitwise() {
        for n in [0, 1, 15, 16, 63, 64, 65, 127, 128, 130, 200, 256, 1000] {
            let (x, y) = (data(n, 1), data(n, 2));
            let want = dot_f32_with(Isa::Scalar, &x, &y);
            for isa in Isa::supported() {
                let got = dot_f32_with(isa, &x, &y);
                assert_eq!(got.to_bits(), want.to_bits(), "n {n} {isa:?}");
            }
            let exact: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!(
                (want as f64 - exact).abs() < 1e-5 * (n as f64 + 1.0),
                "n {n}"
            );
        }
    }

    /// The strided score rows (16 keys per pass on AVX-512, the rest one by one) keep every
    /// score's bits, for head sizes that take the in-register query (64, 128), the looped one
    /// (192, 256) and the per-key fallback (80, 40), and row counts around 16.
    #[test]
    fn dot_rows_match_the_scalar_twin_bitwise() {
        for hd in [64usize, 128, 192, 256, 80, 40] {
            let stride = 2 * hd + 3;
            for n in [1usize, 15, 16, 17, 40] {
                let q = data(hd, hd as u32);
                let rows = data(n * stride, 7 + n as u32);
                let mut want = vec![0.0f32; n];
                dot_rows_k(Kernels::Scalar, &q, &rows, stride, &mut want);
                for (j, w) in want.iter().enumerate() {
                    assert_eq!(w.to_bits(), dot_k(Kernels::Scalar, &q, &rows[j * stride..][..hd]).to_bits());
                }
                for isa in Isa::supported() {
                    let mut got = vec![f32::NAN; n];
                    dot_rows_k(isa.kernels(), &q, &rows, stride, &mut got);
                    let (g, w): (Vec<u32>, Vec<u32>) =
                        got.iter().zip(&want).map(|(g, w)| (g.to_bits(), w.to_bits())).unzip();
                    assert_eq!(g, w, "hd {hd} rows {n} {isa:?}");
                }
            }
        }
    }

    /// A group of queries summed over shared cell ranges (any split, queries starting and
    /// ending anywhere, more queries than one register pass holds) equals each query summed
    /// alone by the scalar [`fma_rows_k`] over its whole row, bit for bit.
    #[test]
    fn fma_rows_group_matches_each_query_alone_bitwise() {
        for hd in [64usize, 128, 40] {
            let stride = hd + 5;
            let n_cells = 700;
            let rows = data(n_cells * stride, 3);
            // (from, length) of each query's probabilities.
            let spans = [(0usize, 700usize), (0, 1), (64, 300), (128, 572), (0, 65), (256, 0), (448, 250), (0, 640)];
            let probs: Vec<Vec<f32>> = spans.iter().enumerate().map(|(i, &(_, n))| data(n, 11 + i as u32)).collect();
            let start: Vec<Vec<f32>> = spans.iter().enumerate().map(|(i, _)| data(DOT_STEP * hd, 50 + i as u32)).collect();
            let want: Vec<Vec<f32>> = spans
                .iter()
                .zip(&probs)
                .zip(&start)
                .map(|((&(from, _), p), a)| {
                    let mut a = a.clone();
                    fma_rows_k(Kernels::Scalar, &mut a, hd, p, &rows[from * stride..], stride);
                    a
                })
                .collect();
            for isa in Isa::supported() {
                for chunk in [64usize, 256, 704] {
                    for n_queries in [1usize, 3, spans.len()] {
                        let mut accs: Vec<Vec<f32>> = start[..n_queries].to_vec();
                        let mut sums: Vec<SlotSum> = accs
                            .iter_mut()
                            .zip(&spans)
                            .zip(&probs)
                            .map(|((acc, &(from, _)), p)| SlotSum { acc, probs: p, from })
                            .collect();
                        for c0 in (0..n_cells).step_by(chunk) {
                            let cells = c0..(c0 + chunk).min(n_cells);
                            fma_rows_group_k(isa.kernels(), hd, &mut sums, &rows, stride, cells);
                        }
                        for (q, (got, w)) in accs.iter().zip(&want).enumerate() {
                            let same = got.iter().zip(w).all(|(g, w)| g.to_bits() == w.to_bits());
                            assert!(same, "hd {hd} {isa:?} chunk {chunk} queries {n_queries}: query {q} differs");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn layout_is_the_avx512_one() {
        // Value 0 and value 32 share lane 0 of accumulators 0 and 2, combined first; value 16
        // (accumulator 1) joins after they cancel.
        let mut x = vec![0.0f32; 64];
        let y = vec![1.0f32; 64];
        x[0] = 1e8;
        x[16] = 1.0;
        x[32] = -1e8;
        assert_eq!(dot_f32_with(Isa::Scalar, &x, &y), 1.0);
        // A short leftover past 64 values is added after the reduction, by FMA.
        let mut x = vec![0.0f32; 65];
        let mut y = vec![0.0f32; 65];
        x[0] = -1.0;
        y[0] = 1.0;
        x[64] = 1.0 + f32::EPSILON;
        y[64] = 1.0 - f32::EPSILON;
        // (1 + e)(1 - e) - 1 = -e^2 when fused, 0 when the product is rounded first.
        let got = dot_f32_with(Isa::Scalar, &x, &y);
        assert_eq!(got, -f32::EPSILON * f32::EPSILON);
        // A leftover of 8 or more adds rounded products (GCC vectorized that part).
        let (mut x8, mut y8) = (vec![0.0f32; 72], vec![0.0f32; 72]);
        x8[0] = -1.0;
        y8[0] = 1.0;
        x8[64] = 1.0 + f32::EPSILON;
        y8[64] = 1.0 - f32::EPSILON;
        assert_eq!(dot_f32_with(Isa::Scalar, &x8, &y8), 0.0);
    }

    /// Whether this CPU runs the AVX-512 kernels.
    fn has_avx512() -> bool {
        #[cfg(target_arch = "x86_64")]
        return Isa::supported().iter().any(|i| matches!(i.kernels(), Kernels::Avx512(_)));
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The reduced V sums (AVX-512: slots in registers, reduced in the same pass, up to 8
    /// queries per pass) equal the scalar slot rows filled by [`fma_rows_k`] and reduced by
    /// [`reduce_slots`], bit for bit: 0 to 700 cells (slots reached or not, partial blocks of
    /// 16 and 64), 1 to 11 queries, heads of 16, 64, 80 and 128 values.
    #[test]
    fn reduced_v_sums_match_the_slot_rows_bitwise() {
        for hd in [16usize, 64, 80, 128] {
            let stride = 2 * hd + 16;
            let rows = data(700 * stride, 5);
            for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 160, 255, 256, 300, 700] {
                for n_queries in [1usize, 7, 11] {
                    let probs: Vec<Vec<f32>> = (0..n_queries).map(|q| data(n, 20 + (n * 16 + q) as u32)).collect();
                    let want: Vec<f32> = probs
                        .iter()
                        .flat_map(|p| {
                            let mut acc = vec![0.0f32; DOT_STEP * hd];
                            fma_rows_k(Kernels::Scalar, &mut acc, hd, p, &rows, stride);
                            let mut o = vec![0.0f32; hd];
                            reduce_slots(&acc, hd, &mut o);
                            o
                        })
                        .collect();
                    let refs: Vec<&[f32]> = probs.iter().map(Vec::as_slice).collect();
                    let mut ran = false;
                    for isa in Isa::supported() {
                        let mut got = vec![f32::NAN; want.len()];
                        if v_sums_reduced_k(isa.kernels(), hd, &refs, &rows, stride, &mut got) {
                            ran = true;
                            for (q, (g, w)) in got.chunks_exact(hd).zip(want.chunks_exact(hd)).enumerate() {
                                let same = g.iter().zip(w).all(|(g, w)| g.to_bits() == w.to_bits());
                                assert!(same, "hd {hd} {isa:?} {n} cells: query {q} of {n_queries} differs");
                            }
                        } else {
                            assert!(got.iter().all(|x| x.is_nan()), "{isa:?} declined but wrote");
                        }
                    }
                    assert_eq!(ran, has_avx512(), "hd {hd}: the kernel runs exactly where AVX-512 is");
                }
            }
        }
        let (a, b) = (data(5, 1), data(6, 2));
        let mut out = [0.0f32; 64];
        let rows = data(6 * 16, 3);
        assert!(!v_sums_reduced_k(Isa::detected().kernels(), 16, &[&a, &b], &rows, 16, &mut out), "queries over different cells");
        assert!(!v_sums_reduced_k(Isa::detected().kernels(), 40, &[&a], &rows, 40, &mut out), "40-wide heads keep the slot rows");
    }
}
