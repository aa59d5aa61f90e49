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
}
