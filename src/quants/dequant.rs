//! Scalar dequantizers: one [`WeightBlock`] impl per storage type, and [`dequantize_row`].
//!
//! Every formula evaluates in f32 in the same order as ggml's `dequantize_row_*` and gguf-py's
//! `dequantize_blocks` (they agree), e.g. Q6_K is `(d * sc) * q`, Q4_K is `(d * sc) * q -
//! dmin * m` with two separate roundings (never a fused multiply-add), so the output is
//! bit-identical to theirs.

use bytemuck::Pod;

use super::blocks::*;
use super::scalars::{Bf16Le, F16Le, F32Le};
use super::{GgmlType, QuantError};

/// A block of a weight storage type, as it lies in a file.
///
/// Implemented for the block structs and for the scalar element types [`F32Le`], [`F16Le`],
/// [`Bf16Le`] (blocks of one value). All implementors have alignment 1 and no padding, so
/// `bytemuck::cast_slice::<u8, Self>` works on any byte slice whose length is a multiple of
/// `size_of::<Self>()`.
pub trait WeightBlock: Pod {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Values per block.
    const N: usize = Self::TYPE.block_size();

    /// Writes the block's `N` values to `out[..N]`. `out` must hold at least `N` values.
    fn dequantize(&self, out: &mut [f32]);
}

const _: () = {
    // Each impl's byte size must be ggml's type_size.
    macro_rules! check {
        ($($t:ty),*) => {$(
            assert!(std::mem::size_of::<$t>() == <$t as WeightBlock>::TYPE.type_size());
            assert!(std::mem::align_of::<$t>() == 1);
        )*};
    }
    check!(
        F32Le, F16Le, Bf16Le, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0
    );
    check!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K);
};

impl WeightBlock for F32Le {
    const TYPE: GgmlType = GgmlType::F32;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
}

impl WeightBlock for F16Le {
    const TYPE: GgmlType = GgmlType::F16;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
}

impl WeightBlock for Bf16Le {
    const TYPE: GgmlType = GgmlType::BF16;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
}

/// `out[i] = d * q[i]` for a symmetric block.
#[inline]
fn scaled<const N: usize>(d: f32, q: [i8; N], out: &mut [f32]) {
    for (o, q) in out[..N].iter_mut().zip(q) {
        *o = d * f32::from(q);
    }
}

/// `out[i] = d * q[i] + m` for an affine 32-value block (ggml's `x0*d + m`).
#[inline]
fn affine(d: f32, m: f32, q: [u8; 32], out: &mut [f32]) {
    for (o, q) in out[..32].iter_mut().zip(q) {
        *o = d * f32::from(q) + m;
    }
}

impl WeightBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        scaled(self.d.to_f32(), self.quants(), out);
    }
}

impl WeightBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        affine(self.d.to_f32(), self.m.to_f32(), self.quants(), out);
    }
}

impl WeightBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        scaled(self.d.to_f32(), self.quants(), out);
    }
}

impl WeightBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        affine(self.d.to_f32(), self.m.to_f32(), self.quants(), out);
    }
}

impl WeightBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        scaled(self.d.to_f32(), self.qs, out);
    }
}

/// The K-quant form `(d * sc[s]) * q[i] - dmin * m[s]` over sub-blocks of `SUB` values, with
/// the two products rounded separately as ggml and gguf-py do. `mins` is `None` for the
/// symmetric Q3_K and Q6_K (no subtraction at all, so `-0.0` stays `-0.0`).
#[inline]
fn k_quant<const SUB: usize>(
    d: f32,
    scales: &[i32],
    mins: Option<(f32, &[i32])>,
    q: &[i32; QK_K],
    out: &mut [f32],
) {
    for (s, (out, q)) in out[..QK_K]
        .chunks_exact_mut(SUB)
        .zip(q.chunks_exact(SUB))
        .enumerate()
    {
        let dl = d * scales[s] as f32;
        match mins {
            Some((dmin, m)) => {
                let ml = dmin * m[s] as f32;
                for (o, &q) in out.iter_mut().zip(q) {
                    *o = dl * q as f32 - ml;
                }
            }
            None => {
                for (o, &q) in out.iter_mut().zip(q) {
                    *o = dl * q as f32;
                }
            }
        }
    }
}

/// Widens a value-order quant array for [`k_quant`].
#[inline]
fn widen<T: Copy + Into<i32>>(q: [T; QK_K]) -> [i32; QK_K] {
    q.map(Into::into)
}

impl WeightBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2K;
    fn dequantize(&self, out: &mut [f32]) {
        let sc: [i32; 16] = std::array::from_fn(|k| self.scale(k).into());
        let m: [i32; 16] = std::array::from_fn(|k| self.min(k).into());
        let mins = Some((self.dmin.to_f32(), &m[..]));
        k_quant::<16>(self.d.to_f32(), &sc, mins, &widen(self.quants()), out);
    }
}

impl WeightBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3K;
    fn dequantize(&self, out: &mut [f32]) {
        let sc = self.scales().map(i32::from);
        k_quant::<16>(self.d.to_f32(), &sc, None, &widen(self.quants()), out);
    }
}

/// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
fn k4_dequant(d: F16Le, dmin: F16Le, (sc, m): ([u8; 8], [u8; 8]), q: [u8; QK_K], out: &mut [f32]) {
    let m = m.map(i32::from);
    let mins = Some((dmin.to_f32(), &m[..]));
    k_quant::<32>(d.to_f32(), &sc.map(i32::from), mins, &widen(q), out);
}

impl WeightBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    fn dequantize(&self, out: &mut [f32]) {
        k4_dequant(self.d, self.dmin, self.scales_mins(), self.quants(), out);
    }
}

impl WeightBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    fn dequantize(&self, out: &mut [f32]) {
        k4_dequant(self.d, self.dmin, self.scales_mins(), self.quants(), out);
    }
}

impl WeightBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    fn dequantize(&self, out: &mut [f32]) {
        let sc = self.scales.map(i32::from);
        k_quant::<16>(self.d.to_f32(), &sc, None, &widen(self.quants()), out);
    }
}

/// Dequantizes whole blocks: `out.len()` must be `blocks.len() * B::N` (checked by callers).
pub fn dequantize_blocks<B: WeightBlock>(blocks: &[B], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::N)) {
        b.dequantize(o);
    }
}

/// Checks that `bytes` holds exactly the `n` values of a `ty` row and views it as blocks.
///
/// Errors: [`QuantError::RaggedRow`] when `n` is not a whole number of blocks,
/// [`QuantError::BadLength`] when the byte count is not `n / block_size * type_size`.
pub fn blocks_of<B: WeightBlock>(bytes: &[u8], n: usize) -> Result<&[B], QuantError> {
    let ty = B::TYPE;
    if !n.is_multiple_of(B::N) {
        return Err(QuantError::RaggedRow { ty, n, block: B::N });
    }
    let expected = n / B::N * ty.type_size();
    if bytes.len() != expected {
        return Err(QuantError::BadLength {
            ty,
            n,
            got: bytes.len(),
            expected,
        });
    }
    // Alignment 1 and an exact length: the cast cannot fail, but stay panic-free anyway.
    bytemuck::try_cast_slice(bytes).map_err(|_| QuantError::BadLength {
        ty,
        n,
        got: bytes.len(),
        expected,
    })
}

/// Dequantizes one row of `out.len()` values of weight type `ty` from its raw bytes (as they lie
/// in the GGUF file, at any alignment) into `out`.
///
/// Errors: [`QuantError::NotWeightType`] for Q8_1 / Q8_K, [`QuantError::RaggedRow`] and
/// [`QuantError::BadLength`] for lengths that do not fit `ty`'s block geometry.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    crate::with_weight_block!(ty, B => {
        let blocks = blocks_of::<B>(bytes, out.len())?;
        dequantize_blocks(blocks, out);
        Ok(())
    })
}
