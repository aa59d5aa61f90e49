//! Quantized tensor formats: ggml's block layouts, scalar dequantizers, activation quantizers
//! and scalar reference dot products.
//!
//! # Map
//!
//! * [`types`](GgmlType): type ids, block geometry, names.
//! * `scalars`: [`F16Le`], [`Bf16Le`], [`F32Le`], alignment-1 storage scalars.
//! * `blocks`: the packed block structs ([`BlockQ4K`] …), size-checked at compile time, and
//!   their bit unpacking.
//! * [`dequant`]: the [`WeightBlock`] trait (one impl per storage type) and [`dequantize_row`].
//! * [`q8`]: the [`ActBlock`] trait and the activation quantizers ([`quantize_row_q8_0`],
//!   [`quantize_row_q8_1`], [`quantize_row_q8_k`] as llama.cpp's x86 build computes them, and
//!   the `_ref` variants); its docs list how x86 and ref differ.
//! * `act`: [`ActRow`], an activation row in the type a weight type is dotted with.
//! * [`dot`]: the [`VecDot`] trait (scalar reference dot per weight type) and [`vec_dot_row`].
//!
//! Everything is re-exported here; the public submodules exist for their documentation.
//!
//! # Using it
//!
//! ```
//! use minfer::quants::{ActRow, GgmlType, dequantize_row, vec_dot_row};
//! # fn main() -> Result<(), minfer::quants::QuantError> {
//! let ty = GgmlType::Q8_0;
//! let row: Vec<u8> = [&[0x00u8, 0x3c][..], &[1u8; 32][..]].concat(); // d = 1.0, qs = 1
//! let mut w = vec![0.0; 32];
//! dequantize_row(ty, &row, &mut w)?;
//! assert_eq!(w, vec![1.0; 32]);
//!
//! // Activations become Q8_0 as ggml's x86 build quantizes them: qs = 127, d = f16(0.5 / 127).
//! let act = ActRow::for_weight(ty, &vec![0.5; 32])?;
//! let dot = vec_dot_row(ty, &row, &act)?; // 32 * 127 * f16(0.5 / 127) = 15.999...
//! assert!((dot - 16.0).abs() < 2e-3);
//! # Ok(()) }
//! ```

mod act;
mod blocks;
pub mod dequant;
pub mod dot;
pub mod gemm;
pub mod gemm_k;
pub mod gemm_pairs;
pub mod gemv;
pub mod packed;
pub mod packed_b32;
pub mod packed_k4;
pub mod packed_k6;
pub mod q8;
mod scalars;
pub mod simd;
mod types;

pub use act::{ActRow, vec_dot_type};
pub use blocks::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K,
    BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK32, k4_scales_mins,
};
pub use dequant::{WeightBlock, blocks_of, dequantize_blocks, dequantize_row};
pub use dot::{VecDot, vec_dot, vec_dot_row};
pub use q8::{
    ActBlock, dequantize_act, quantize_row, quantize_row_q8_0, quantize_row_q8_0_ref,
    quantize_row_q8_1, quantize_row_q8_1_ref, quantize_row_q8_k, quantize_row_q8_k_fma,
};
pub use scalars::{Bf16Le, F16Le, F32Le};
pub use types::{GgmlType, ggml_block_geometry, ggml_type_name};

/// Errors of the quant layer.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    /// A tensor is stored in a type minfer cannot compute with (an I-quant, an activation-only
    /// type, an id ggml does not define).
    #[error("tensor '{tensor}' has type {type_name} (id {type_id}), which minfer does not support")]
    UnsupportedType { tensor: String, type_name: String, type_id: u32 },
    /// A row length that is not a whole number of blocks.
    #[error("row of {n} values is not a multiple of the {ty} block size {block}")]
    RaggedRow { ty: GgmlType, n: usize, block: usize },
    /// A byte slice whose length does not match the values it should hold.
    #[error("{ty} data of {got} bytes, expected {expected} for {n} values")]
    BadLength { ty: GgmlType, n: usize, got: usize, expected: usize },
    /// A block buffer whose length does not match the values it should hold.
    #[error("{got} {ty} blocks given for {n} values, expected {expected}")]
    BlockCount { ty: GgmlType, n: usize, got: usize, expected: usize },
    /// A weight-only operation asked of an activation-only type (Q8_1, Q8_K).
    #[error("{ty} is an activation format, not a weight storage type")]
    NotWeightType { ty: GgmlType },
    /// An activation conversion asked for a type that is no `vec_dot_type`.
    #[error("{ty} is not an activation type (F32, F16, BF16, Q8_0, Q8_1, Q8_K)")]
    NotActType { ty: GgmlType },
    /// A weight row dotted with an activation row of the wrong type.
    #[error("{weight} weights are dotted with {expected} activations, got {got}")]
    ActMismatch { weight: GgmlType, expected: GgmlType, got: GgmlType },
    /// Weight and activation rows of different lengths.
    #[error("{ty} dot product of {weights} weight values with {acts} activation values")]
    DotLength { ty: GgmlType, weights: usize, acts: usize },
}

/// The weight type of tensor `tensor` stored with ggml type id `type_id`, if minfer can
/// dequantize and multiply with it.
///
/// Errors: [`QuantError::UnsupportedType`] naming the tensor and the type for an id ggml
/// defines but minfer does not implement (I-quants, TQ, MXFP4, …), for the activation-only
/// Q8_1 and Q8_K, and for an id ggml does not define (named `"unknown"`).
pub fn weight_type(tensor: &str, type_id: u32) -> Result<GgmlType, QuantError> {
    match GgmlType::from_id(type_id) {
        Some(ty) if ty.is_weight_type() => Ok(ty),
        _ => Err(QuantError::UnsupportedType {
            tensor: tensor.to_string(),
            type_name: ggml_type_name(type_id).unwrap_or("unknown").to_string(),
            type_id,
        }),
    }
}

/// Runs `$body` with the type alias `$B` bound to the [`WeightBlock`] type of weight type
/// `$ty`; evaluates to `Err(NotWeightType)` for the activation-only types. `$body` must
/// evaluate to a `Result<_, QuantError>`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_weight_block {
    ($ty:expr, $B:ident => $body:expr) => {{
        use $crate::quants::GgmlType as T;
        match $ty {
            T::F32 => { type $B = $crate::quants::F32Le; $body }
            T::F16 => { type $B = $crate::quants::F16Le; $body }
            T::BF16 => { type $B = $crate::quants::Bf16Le; $body }
            T::Q4_0 => { type $B = $crate::quants::BlockQ4_0; $body }
            T::Q4_1 => { type $B = $crate::quants::BlockQ4_1; $body }
            T::Q5_0 => { type $B = $crate::quants::BlockQ5_0; $body }
            T::Q5_1 => { type $B = $crate::quants::BlockQ5_1; $body }
            T::Q8_0 => { type $B = $crate::quants::BlockQ8_0; $body }
            T::Q2K => { type $B = $crate::quants::BlockQ2K; $body }
            T::Q3K => { type $B = $crate::quants::BlockQ3K; $body }
            T::Q4K => { type $B = $crate::quants::BlockQ4K; $body }
            T::Q5K => { type $B = $crate::quants::BlockQ5K; $body }
            T::Q6K => { type $B = $crate::quants::BlockQ6K; $body }
            ty @ (T::Q8_1 | T::Q8K) => Err($crate::quants::QuantError::NotWeightType { ty }),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_type_rejects_iquants_activation_types_and_unknown_ids() {
        assert_eq!(weight_type("a", 12), Ok(GgmlType::Q4K));
        let err = weight_type("blk.0.ffn_down.weight", 16).unwrap_err();
        assert_eq!(
            err,
            QuantError::UnsupportedType {
                tensor: "blk.0.ffn_down.weight".into(),
                type_name: "IQ2_XXS".into(),
                type_id: 16
            }
        );
        assert!(err.to_string().contains("blk.0.ffn_down.weight"));
        assert!(err.to_string().contains("IQ2_XXS"));
        for id in [9, 15] {
            assert!(matches!(weight_type("t", id), Err(QuantError::UnsupportedType { .. })));
        }
        let unknown = weight_type("t", 77).unwrap_err();
        assert!(unknown.to_string().contains("unknown"));
    }
}
