//! Scalar reference dot products of a weight row with an activation row (ggml's `vec_dot`):
//! one [`VecDot`] impl per weight type, and the byte-level dispatcher [`vec_dot_row`].
//!
//! Each impl follows the arithmetic of ggml's generic (scalar) kernel, `ggml_vec_dot_*_generic`
//! in `ggml-cpu/quants.c` and `ggml_vec_dot_{f32,f16,bf16}` (scalar branch) in
//! `ggml-cpu/vec.cpp`: exact integer sums inside a block, then the same f32 products in the same
//! order, the same running f32 sum over blocks, and for Q3_K…Q6_K the same 8 f32 lane sums
//! (lane `l` takes values `i ≡ l mod 8`) added up after the last block. Float rows sum their f32
//! products in f64, as ggml's scalar path does. ggml's x86 SIMD kernels sum in other orders, so
//! they differ from these (and from each other) in the last bits.
//!
//! Checked bit for bit against ggml's generic kernels compiled with strict C semantics and
//! without auto-vectorization (`tests/quants_oracle.rs`): GCC 12's AVX-512 vectorizer
//! miscompiles `ggml_vec_dot_q5_0_q8_0_generic` at -O2/-O3 (harmless to llama.cpp, which never
//! runs the generic kernels on x86), and GCC's default FMA contraction changes the last bits of
//! the others.

use super::act::ActRow;
use super::blocks::*;
use super::dequant::{WeightBlock, blocks_of};
use super::q8::ActBlock;
use super::scalars::{Bf16Le, F16Le, F32Le};
use super::{GgmlType, QuantError};

/// A weight block type and the activation block type ggml dots it with.
pub trait VecDot: WeightBlock {
    /// ggml's `vec_dot_type` for this weight type.
    type Act: ActBlock;

    /// Dot product of a weight row with an activation row of the same number of values
    /// (`w.len() * Self::N == a.len() * Self::Act::N`; use [`vec_dot`] for a checked call).
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32;
}

/// Checked [`VecDot::vec_dot`]: errors with [`QuantError::DotLength`] unless both rows hold the
/// same number of values.
pub fn vec_dot<W: VecDot>(w: &[W], a: &[W::Act]) -> Result<f32, QuantError> {
    let (weights, acts) = (w.len() * W::N, a.len() * W::Act::N);
    if weights != acts {
        return Err(QuantError::DotLength {
            ty: W::TYPE,
            weights,
            acts,
        });
    }
    Ok(W::vec_dot(w, a))
}

/// Dot product of one weight row of type `ty`, given as raw bytes (any alignment, e.g. straight
/// from the memory-mapped GGUF file), with an activation row already converted to `ty`'s
/// activation type ([`ActRow::for_weight`]). The row length is the activation's.
///
/// Errors: [`QuantError::NotWeightType`] for Q8_1 / Q8_K weights, [`QuantError::ActMismatch`]
/// when `act` holds another type than [`vec_dot_type`](super::vec_dot_type)`(ty)`, [`QuantError::RaggedRow`] /
/// [`QuantError::BadLength`] when `w` is not exactly `act.len()` values of `ty`.
pub fn vec_dot_row(ty: GgmlType, w: &[u8], act: &ActRow) -> Result<f32, QuantError> {
    crate::with_weight_block!(ty, B => {
        let a = <B as VecDot>::Act::blocks_in(act).ok_or_else(|| QuantError::ActMismatch {
            weight: ty,
            expected: <<B as VecDot>::Act as ActBlock>::TYPE,
            got: act.act_type(),
        })?;
        let blocks = blocks_of::<B>(w, act.len())?;
        Ok(B::vec_dot(blocks, a))
    })
}

/// The activation type an impl pairs with (for the test that it is ggml's `vec_dot_type`).
#[cfg(test)]
fn act_type_of<W: VecDot>() -> GgmlType {
    W::Act::TYPE
}

/// ggml's scalar float dot: f32 products summed in f64 (`ggml_float`).
fn float_dot<W: Copy, A: Copy>(
    w: &[W],
    a: &[A],
    wf: impl Fn(W) -> f32,
    af: impl Fn(A) -> f32,
) -> f32 {
    let sum = w
        .iter()
        .zip(a)
        .fold(0.0f64, |s, (&w, &a)| s + f64::from(wf(w) * af(a)));
    sum as f32
}

impl VecDot for F32Le {
    type Act = f32;
    fn vec_dot(w: &[Self], a: &[f32]) -> f32 {
        float_dot(w, a, F32Le::to_f32, |a| a)
    }
}

impl VecDot for F16Le {
    type Act = F16Le;
    fn vec_dot(w: &[Self], a: &[F16Le]) -> f32 {
        float_dot(w, a, F16Le::to_f32, F16Le::to_f32)
    }
}

impl VecDot for Bf16Le {
    type Act = Bf16Le;
    fn vec_dot(w: &[Self], a: &[Bf16Le]) -> f32 {
        float_dot(w, a, Bf16Le::to_f32, Bf16Le::to_f32)
    }
}

/// Exact integer dot of a 32-value block's quants with Q8 quants.
#[inline]
fn isum32<Q: Into<i32>>(q: [Q; 32], y: &[i8; 32]) -> i32 {
    q.into_iter()
        .zip(y)
        .map(|(q, &y)| q.into() * i32::from(y))
        .sum()
}

/// Runs ggml's block loop of the 32-value formats: `sumf += term(block)` in f32.
#[inline]
fn block_sum<W, A>(w: &[W], a: &[A], term: impl Fn(&W, &A) -> f32) -> f32 {
    w.iter().zip(a).fold(0.0f32, |s, (w, a)| s + term(w, a))
}

impl VecDot for BlockQ4_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        // sumi * d_x * d_y, left to right
        block_sum(w, a, |x, y| {
            isum32(x.quants(), &y.qs) as f32 * x.d.to_f32() * y.d.to_f32()
        })
    }
}

/// Q4_1 / Q5_1 · Q8_1, given a block's `(d, m, quants)`: `(d_x * d_y) * sumi + m_x * s_y` per
/// block — the min meets the activations through Q8_1's precomputed `s`.
fn affine_dot<W>(w: &[W], a: &[BlockQ8_1], parts: impl Fn(&W) -> (F16Le, F16Le, [u8; 32])) -> f32 {
    block_sum(w, a, |x, y| {
        let (d, m, q) = parts(x);
        let sumi = isum32(q, &y.qs) as f32;
        (d.to_f32() * y.d.to_f32()) * sumi + m.to_f32() * y.s.to_f32()
    })
}

impl VecDot for BlockQ4_1 {
    type Act = BlockQ8_1;
    fn vec_dot(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        affine_dot(w, a, |x| (x.d, x.m, x.quants()))
    }
}

impl VecDot for BlockQ5_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        block_sum(w, a, |x, y| {
            (x.d.to_f32() * y.d.to_f32()) * isum32(x.quants(), &y.qs) as f32
        })
    }
}

impl VecDot for BlockQ5_1 {
    type Act = BlockQ8_1;
    fn vec_dot(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        affine_dot(w, a, |x| (x.d, x.m, x.quants()))
    }
}

impl VecDot for BlockQ8_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        block_sum(w, a, |x, y| {
            isum32(x.qs, &y.qs) as f32 * (x.d.to_f32() * y.d.to_f32())
        })
    }
}

impl VecDot for BlockQ2K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        block_sum(w, a, |x, y| {
            let summs: i32 = (0..16)
                .map(|k| i32::from(y.bsums[k]) * i32::from(x.min(k)))
                .sum();
            let dall = y.d * x.d.to_f32();
            let dmin = y.d * x.dmin.to_f32();
            let q = x.quants();
            let isum: i32 = (0..16)
                .map(|k| {
                    let r = 16 * k..16 * k + 16;
                    let isuml: i32 = q[r.clone()]
                        .iter()
                        .zip(&y.qs[r])
                        .map(|(&q, &y)| i32::from(q) * i32::from(y))
                        .sum();
                    i32::from(x.scale(k)) * isuml
                })
                .sum();
            dall * isum as f32 - dmin * summs as f32
        })
    }
}

/// One block's contribution to the 8 lanes of the generic K-quant kernels:
/// `lane[l] = Σ_{i ≡ l mod 8} scale(i / SUB) * q[i] * q8[i]`, exact in i32.
#[inline]
fn lanes8<const SUB: usize, Q: Copy + Into<i32>>(
    q: &[Q; QK_K],
    q8: &[i8; QK_K],
    scale: impl Fn(usize) -> i32,
) -> [i32; 8] {
    let mut aux = [0i32; 8];
    for (s, (q, q8)) in q.chunks_exact(SUB).zip(q8.chunks_exact(SUB)).enumerate() {
        let sc = scale(s);
        for (i, (&q, &q8)) in q.iter().zip(q8).enumerate() {
            aux[i % 8] += sc * (q.into() * i32::from(q8));
        }
    }
    aux
}

/// Per-block result of the lane-summing K kernels: the f32 scale `d` of the lanes, the lanes,
/// and the f32 "mins" term subtracted from the running sum (Q4_K/Q5_K only).
struct LaneBlock {
    d: f32,
    lanes: [i32; 8],
    min_term: Option<f32>,
}

/// ggml's generic Q3_K…Q6_K loop: `sums[l] += d * lanes[l]` per block, `sumf -= min_term` per
/// block, and the 8 lane sums added to `sumf` at the end.
fn lane_sum<W>(w: &[W], a: &[BlockQ8K], block: impl Fn(&W, &BlockQ8K) -> LaneBlock) -> f32 {
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let b = block(x, y);
        for (s, &l) in sums.iter_mut().zip(&b.lanes) {
            *s += b.d * l as f32;
        }
        if let Some(m) = b.min_term {
            sumf -= m;
        }
    }
    sums.iter().fold(sumf, |s, &l| s + l)
}

/// Q4_K / Q5_K: 32-value sub-blocks with 6-bit scales and mins; the mins meet the activation
/// through Q8_K's 16-value `bsums`.
fn k4_block<const N: usize>(
    d: F16Le,
    dmin: F16Le,
    (sc, m): ([u8; 8], [u8; 8]),
    q: &[u8; QK_K],
    y: &BlockQ8K,
) -> LaneBlock {
    let sumi: i32 = (0..16)
        .map(|j| i32::from(y.bsums[j]) * i32::from(m[j / 2]))
        .sum();
    LaneBlock {
        d: d.to_f32() * y.d,
        lanes: lanes8::<N, u8>(q, &y.qs, |s| i32::from(sc[s])),
        min_term: Some(dmin.to_f32() * y.d * sumi as f32),
    }
}

impl VecDot for BlockQ3K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        lane_sum(w, a, |x, y| {
            let sc = x.scales();
            LaneBlock {
                d: x.d.to_f32() * y.d,
                lanes: lanes8::<16, i8>(&x.quants(), &y.qs, |s| i32::from(sc[s])),
                min_term: None,
            }
        })
    }
}

impl VecDot for BlockQ4K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        lane_sum(w, a, |x, y| {
            k4_block::<32>(x.d, x.dmin, x.scales_mins(), &x.quants(), y)
        })
    }
}

impl VecDot for BlockQ5K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        lane_sum(w, a, |x, y| {
            k4_block::<32>(x.d, x.dmin, x.scales_mins(), &x.quants(), y)
        })
    }
}

impl VecDot for BlockQ6K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        lane_sum(w, a, |x, y| LaneBlock {
            d: x.d.to_f32() * y.d,
            lanes: lanes8::<16, i8>(&x.quants(), &y.qs, |s| i32::from(x.scales[s])),
            min_term: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quants::vec_dot_type;

    #[test]
    fn act_types_are_ggmls_vec_dot_types() {
        macro_rules! check {
            ($($w:ty),*) => {$(
                assert_eq!(act_type_of::<$w>(), vec_dot_type(<$w as WeightBlock>::TYPE).unwrap());
            )*};
        }
        check!(
            F32Le, F16Le, Bf16Le, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0
        );
        check!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K);
    }

    #[test]
    fn lanes_follow_value_index_mod_8() {
        let q = [1u8; QK_K];
        let mut q8 = [0i8; QK_K];
        q8[9] = 3; // lane 1, sub-block 0
        q8[250] = -2; // lane 2, sub-block 7
        let lanes = lanes8::<32, u8>(&q, &q8, |s| s as i32 + 1);
        assert_eq!(lanes, [0, 3, -16, 0, 0, 0, 0, 0]);
    }
}
