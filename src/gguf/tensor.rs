//! Tensor infos: name, shape, type and where the bytes are.

use crate::quants::{GgmlType, QuantError, ggml_type_name};

/// One tensor of a GGUF file, validated against the data section by the reader.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Position in the file's tensor table (the weight handle the graph records).
    pub index: u32,
    pub name: String,
    /// ggml `ne`: `dims[0]` is the row length (fastest), so a weight is `[in, out]`.
    pub dims: Vec<u64>,
    /// ggml type id as stored in the file.
    pub type_id: u32,
    /// The type, if minfer knows it (an I-quant is `None`).
    pub ty: Option<GgmlType>,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// ggml's name of the tensor's type (`"Q4_K"`, `"IQ2_XS"`).
    pub fn type_name(&self) -> &'static str {
        ggml_type_name(self.type_id).unwrap_or("?")
    }

    /// The tensor's type as a weight type minfer computes with, or an error naming the tensor.
    pub fn weight_type(&self) -> Result<GgmlType, QuantError> {
        crate::quants::weight_type(&self.name, self.type_id)
    }
}
