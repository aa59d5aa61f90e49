//! Weights by name: the graph refers to a weight by its GGUF name (`MatMulMeta.weight_name`) and
//! a backend resolves the name here at execution time. Matrices stay in the memory map
//! (zero-copy); small 1-D F32 tensors (norm weights, biases) are converted to `f32` once at
//! load, since the map gives no alignment guarantee for a typed view.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::GraphError;
use crate::gguf::GgufFile;
use crate::quants::{GgmlType, dequantize_row};

/// A weight matrix in the file: `rows` rows of `cols` values, row-major blocks of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    /// ggml `ne[1]`: output features (vocabulary rows for an embedding).
    pub rows: usize,
    /// ggml `ne[0]`: input features.
    pub cols: usize,
}

/// The weights of one model file.
#[derive(Debug)]
pub struct WeightStore {
    file: Arc<GgufFile>,
    vectors: HashMap<String, Vec<f32>>,
}

impl WeightStore {
    /// Indexes `file`'s tensors; 1-D tensors of a float type are converted to f32 now.
    pub fn new(file: Arc<GgufFile>) -> Result<WeightStore, GraphError> {
        let mut vectors = HashMap::new();
        for t in file.tensors() {
            if t.dims.len() != 1 {
                continue;
            }
            let ty = t.weight_type().map_err(|source| GraphError::Weight { name: t.name.clone(), source })?;
            if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                continue;
            }
            let data = file.tensor_data(t).map_err(|e| GraphError::WeightFile { name: t.name.clone(), reason: e.to_string() })?;
            let mut v = vec![0.0f32; t.n_elements as usize];
            dequantize_row(ty, data, &mut v).map_err(|source| GraphError::Weight { name: t.name.clone(), source })?;
            vectors.insert(t.name.clone(), v);
        }
        Ok(WeightStore { file, vectors })
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// A 1-D float weight (norm weight, bias) as f32.
    pub fn vector(&self, name: &str) -> Result<&[f32], GraphError> {
        self.vectors
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| GraphError::MissingWeight { name: name.to_string(), what: "a 1-D float tensor" })
    }

    /// A 2-D weight matrix, zero-copy from the map.
    pub fn matrix(&self, name: &str) -> Result<WeightView<'_>, GraphError> {
        let missing = || GraphError::MissingWeight { name: name.to_string(), what: "a 2-D tensor" };
        let t = self.file.tensor(name).ok_or_else(missing)?;
        if t.dims.len() != 2 {
            return Err(missing());
        }
        let ty = t.weight_type().map_err(|source| GraphError::Weight { name: name.to_string(), source })?;
        let data = self.file.tensor_data(t).map_err(|e| GraphError::WeightFile { name: name.to_string(), reason: e.to_string() })?;
        Ok(WeightView { ty, data, cols: t.dims[0] as usize, rows: t.dims[1] as usize })
    }
}
