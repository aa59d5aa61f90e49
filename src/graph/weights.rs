//! Weights by handle: a [`WeightId`] is the tensor's index in its GGUF file, resolved once when
//! the graph is built (the builder gets the tensor's info and records the id beside the name),
//! so no node looks a name up while it runs. The store keeps matrices in the memory map
//! (zero-copy) and converts small 1-D float tensors (norm weights, biases) to `f32` once at
//! load, since the map gives no alignment guarantee for a typed view. Backends are offered the
//! ids their nodes use ([`BackendImpl::load_weights`](super::BackendImpl::load_weights)) and
//! keep the mapped bytes or upload copies.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::error::GraphError;
use crate::gguf::GgufFile;
use crate::quants::{GgmlType, dequantize_row};

/// A weight's handle: its tensor index in the model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

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

/// One tensor of the file, as the store holds it.
#[derive(Debug)]
enum Entry {
    /// A 2-D tensor of a known type: its bytes stay in the map.
    Matrix { ty: GgmlType, rows: usize, cols: usize },
    /// A 1-D float tensor, converted.
    Vector(Vec<f32>),
    /// Anything else (not addressable by a node).
    Other,
}

/// A weight in another layout, made by a backend from the file's bytes.
type Prepared = Arc<dyn Any + Send + Sync>;

/// The weights of one model file, indexed by [`WeightId`].
#[derive(Debug)]
pub struct WeightStore {
    file: Arc<GgufFile>,
    entries: Vec<Entry>,
    /// Copies of weights in a layout a backend derived from them (a repacked matrix), keyed
    /// by weight and type: made once by the first backend that asks, shared by every engine of
    /// the model (a server's slots, a draft beside its target).
    prepared: Mutex<HashMap<(WeightId, TypeId), Prepared>>,
}

impl WeightStore {
    /// Indexes `file`'s tensors; 1-D tensors of a float type are converted to f32 now.
    pub fn new(file: Arc<GgufFile>) -> Result<WeightStore, GraphError> {
        let mut entries = Vec::with_capacity(file.tensors().len());
        for t in file.tensors() {
            let weight = |source| GraphError::Weight { name: t.name.clone(), source };
            let entry = match (t.dims.len(), t.ty) {
                (1, Some(ty @ (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))) => {
                    let data = file.tensor_data(t).map_err(|e| GraphError::WeightFile { name: t.name.clone(), reason: e.to_string() })?;
                    let mut v = vec![0.0f32; t.n_elements as usize];
                    dequantize_row(ty, data, &mut v).map_err(weight)?;
                    Entry::Vector(v)
                }
                (2, Some(ty)) => Entry::Matrix { ty, cols: t.dims[0] as usize, rows: t.dims[1] as usize },
                _ => Entry::Other,
            };
            entries.push(entry);
        }
        Ok(WeightStore { file, entries, prepared: Mutex::new(HashMap::new()) })
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// The tensor's name (for errors).
    pub fn name(&self, id: WeightId) -> &str {
        self.file.tensors().get(id.0 as usize).map_or("?", |t| t.name.as_str())
    }

    /// The id of the tensor called `name`.
    pub fn id_of(&self, name: &str) -> Option<WeightId> {
        self.file.tensors().iter().position(|t| t.name == name).map(|i| WeightId(i as u32))
    }

    /// A 1-D float weight (norm weight, bias) as f32.
    pub fn vector(&self, id: WeightId) -> Result<&[f32], GraphError> {
        match self.entries.get(id.0 as usize) {
            Some(Entry::Vector(v)) => Ok(v),
            _ => Err(GraphError::MissingWeight { name: self.name(id).to_string(), what: "a 1-D float tensor" }),
        }
    }

    /// A 2-D weight matrix, zero-copy from the map.
    pub fn matrix(&self, id: WeightId) -> Result<WeightView<'_>, GraphError> {
        let missing = || GraphError::MissingWeight { name: self.name(id).to_string(), what: "a 2-D tensor" };
        let (Some(&Entry::Matrix { ty, rows, cols }), Some(t)) = (self.entries.get(id.0 as usize), self.file.tensors().get(id.0 as usize)) else {
            return Err(missing());
        };
        let data = self.file.tensor_data(t).map_err(|e| GraphError::WeightFile { name: t.name.clone(), reason: e.to_string() })?;
        Ok(WeightView { ty, data, rows, cols })
    }

    /// Weight `id` in a backend's own layout `T`: the copy made earlier, else `make()`'s
    /// (kept for the next caller; `None` is not kept). The lock is held while `make` runs, so
    /// two engines never build the same copy twice.
    pub fn prepared<T: Any + Send + Sync>(&self, id: WeightId, make: impl FnOnce() -> Option<T>) -> Option<Arc<T>> {
        let mut map = self.prepared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (id, TypeId::of::<T>());
        if let Some(p) = map.get(&key) {
            return p.clone().downcast::<T>().ok();
        }
        let made = Arc::new(make()?);
        map.insert(key, made.clone());
        Some(made)
    }

    /// Releases the resident pages of matrix `id`'s bytes in the file's map, for a backend
    /// that has made its own copy and no longer reads them on its usual paths
    /// ([`GgufFile::release_tensor_pages`]: the bytes stay readable, a later read faults them
    /// back in).
    pub fn release_file_pages(&self, id: WeightId) {
        self.release_file_range(id, 0..usize::MAX);
    }

    /// [`WeightStore::release_file_pages`] for bytes `range` of the matrix (clipped to them),
    /// for a backend releasing them as its copy grows.
    pub fn release_file_range(&self, id: WeightId, range: std::ops::Range<usize>) {
        if let Some(t) = self.file.tensors().get(id.0 as usize) {
            self.file.release_tensor_range(t, range);
        }
    }

    /// Bytes of weight `id` as a backend would hold it (the matrix's blocks, or the f32
    /// vector).
    pub fn bytes(&self, id: WeightId) -> Result<&[u8], GraphError> {
        match self.entries.get(id.0 as usize) {
            Some(Entry::Vector(v)) => Ok(bytemuck::cast_slice(v)),
            _ => Ok(self.matrix(id)?.data),
        }
    }
}
