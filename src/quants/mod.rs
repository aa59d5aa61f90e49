//! Quantized tensor formats: ggml's block layouts, scalar dequantizers, activation quantizers
//! and scalar reference dot products.

mod types;

pub use types::{GgmlType, ggml_block_geometry, ggml_type_name};

/// Errors of the quant layer.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    /// A tensor is stored in a type minfer cannot compute with (an I-quant, say).
    #[error("tensor '{tensor}' has type {type_name} (id {type_id}), which minfer does not support")]
    UnsupportedType { tensor: String, type_name: String, type_id: u32 },
    /// A row length that is not a whole number of blocks.
    #[error("row of {n} values is not a multiple of the {ty} block size {block}")]
    RaggedRow { ty: GgmlType, n: usize, block: usize },
    /// A byte slice whose length does not match the values it should hold.
    #[error("{ty} data of {got} bytes, expected {expected} for {n} values")]
    BadLength { ty: GgmlType, n: usize, got: usize, expected: usize },
}
