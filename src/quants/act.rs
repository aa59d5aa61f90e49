//! [`ActRow`]: one activation row, converted to the `vec_dot_type` a weight type is dotted
//! with, ready to be multiplied with many weight rows.

use super::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use super::q8::{ActBlock, quantize_row};
use super::scalars::{Bf16Le, F16Le};
use super::{GgmlType, QuantError};

/// An activation row in one of ggml's activation types. Quantize it once per row of the input
/// and reuse it against every weight row of the matrix.
#[derive(Debug, Clone, PartialEq)]
pub enum ActRow {
    /// Plain f32 (for F32 weights).
    F32(Vec<f32>),
    /// f16, rounded to nearest even (for F16 weights).
    F16(Vec<F16Le>),
    /// bf16, rounded as ggml does (for BF16 weights).
    BF16(Vec<Bf16Le>),
    /// 32-value Q8_0 blocks (for Q4_0, Q5_0, Q8_0 weights).
    Q8_0(Vec<BlockQ8_0>),
    /// 32-value Q8_1 blocks (for Q4_1, Q5_1 weights).
    Q8_1(Vec<BlockQ8_1>),
    /// 256-value Q8_K blocks (for Q2_K … Q6_K weights).
    Q8K(Vec<BlockQ8K>),
}

/// The activation type ggml pairs with a weight type (`type_traits_cpu[ty].vec_dot_type`):
/// Q4_0/Q5_0/Q8_0 → Q8_0, Q4_1/Q5_1 → Q8_1, K-quants → Q8_K, F32/F16/BF16 → themselves.
///
/// Errors: [`QuantError::NotWeightType`] for the activation-only Q8_1 and Q8_K.
pub fn vec_dot_type(weight: GgmlType) -> Result<GgmlType, QuantError> {
    use GgmlType::*;
    Ok(match weight {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2K | Q3K | Q4K | Q5K | Q6K => Q8K,
        Q8_1 | Q8K => return Err(QuantError::NotWeightType { ty: weight }),
    })
}

fn quantized<B: ActBlock>(x: &[f32]) -> Result<Vec<B>, QuantError> {
    let mut v = vec![B::default(); x.len() / B::N];
    quantize_row(x, &mut v)?;
    Ok(v)
}

impl ActRow {
    /// Converts `x` to activation type `act` with ggml's x86 CPU conversion for that type
    /// (see [`q8`](super::q8) for which ggml function each one mirrors).
    ///
    /// Errors: [`QuantError::RaggedRow`] if `x.len()` is not a multiple of `act`'s block size,
    /// [`QuantError::NotActType`] if `act` is not an activation type.
    pub fn quantize(act: GgmlType, x: &[f32]) -> Result<ActRow, QuantError> {
        Ok(match act {
            GgmlType::F32 => ActRow::F32(x.to_vec()),
            GgmlType::F16 => ActRow::F16(quantized(x)?),
            GgmlType::BF16 => ActRow::BF16(quantized(x)?),
            GgmlType::Q8_0 => ActRow::Q8_0(quantized(x)?),
            GgmlType::Q8_1 => ActRow::Q8_1(quantized(x)?),
            GgmlType::Q8K => ActRow::Q8K(quantized(x)?),
            ty => return Err(QuantError::NotActType { ty }),
        })
    }

    /// Converts `x` to the activation type that `weight` rows are dotted with.
    pub fn for_weight(weight: GgmlType, x: &[f32]) -> Result<ActRow, QuantError> {
        ActRow::quantize(vec_dot_type(weight)?, x)
    }

    /// The activation type held.
    pub fn act_type(&self) -> GgmlType {
        match self {
            ActRow::F32(_) => GgmlType::F32,
            ActRow::F16(_) => GgmlType::F16,
            ActRow::BF16(_) => GgmlType::BF16,
            ActRow::Q8_0(_) => GgmlType::Q8_0,
            ActRow::Q8_1(_) => GgmlType::Q8_1,
            ActRow::Q8K(_) => GgmlType::Q8K,
        }
    }

    /// Number of values in the row.
    pub fn len(&self) -> usize {
        let blocks = match self {
            ActRow::F32(v) => v.len(),
            ActRow::F16(v) => v.len(),
            ActRow::BF16(v) => v.len(),
            ActRow::Q8_0(v) => v.len(),
            ActRow::Q8_1(v) => v.len(),
            ActRow::Q8K(v) => v.len(),
        };
        blocks * self.act_type().block_size()
    }

    /// Whether the row holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row's values as the dot products see them (each block dequantized).
    pub fn dequantize(&self) -> Vec<f32> {
        fn all<B: ActBlock>(blocks: &[B]) -> Vec<f32> {
            let mut out = vec![0.0; blocks.len() * B::N];
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::N)) {
                b.dequantize(o);
            }
            out
        }
        match self {
            ActRow::F32(v) => v.clone(),
            ActRow::F16(v) => all(v),
            ActRow::BF16(v) => all(v),
            ActRow::Q8_0(v) => all(v),
            ActRow::Q8_1(v) => all(v),
            ActRow::Q8K(v) => all(v),
        }
    }
}
