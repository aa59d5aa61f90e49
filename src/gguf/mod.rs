//! GGUF reader (versions 2 and 3) over a read-only memory map.
//!
//! `GgufFile::open` validates the whole header up front (see [`reader`] for the rules); after
//! that every tensor's bytes are a zero-copy slice of the map, and metadata is read through typed
//! accessors whose errors name the key and the type found.

mod error;
mod mmap;
mod reader;
mod str_array;
mod tensor;
mod value;
pub mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use error::GgufError;
pub use str_array::StrArray;
pub use reader::{DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use tensor::TensorInfo;
pub use value::{MetaArray, MetaValue, ValueType};

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An opened, validated GGUF file.
pub struct GgufFile {
    path: Option<PathBuf>,
    storage: Storage,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates a GGUF file, mapping it read-only.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let map = mmap::map_readonly(&file).map_err(io)?;
        let mut f = Self::from_storage(Storage::Mapped(map))?;
        f.path = Some(path.to_path_buf());
        Ok(f)
    }

    /// Parses a GGUF image held in memory (tests, fuzzing, embedded files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let h = reader::parse(storage.bytes())?;
        let key_index = h.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = h.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            path: None,
            storage,
            version: h.version,
            metadata: h.metadata,
            key_index,
            tensors: h.tensors,
            tensor_index,
            alignment: h.alignment,
            data_offset: h.data_offset,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Reads one byte of every 4 KiB page of the tensor data, so that the first forward pass
    /// does not stop on page faults; `progress(done, total)` is called every 64 MiB (bytes).
    pub fn prefault(&self, mut progress: impl FnMut(u64, u64)) {
        let data = self.storage.bytes().get(self.data_offset as usize..).unwrap_or(&[]);
        let total = data.len() as u64;
        let mut sum = 0u8;
        for (i, chunk) in data.chunks(64 << 20).enumerate() {
            sum = chunk.iter().step_by(4096).fold(sum, |s, &b| s.wrapping_add(b));
            progress(((i as u64 + 1) * (64 << 20)).min(total), total);
        }
        std::hint::black_box(sum);
    }

    /// Total size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    fn wrong_type(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
        GgufError::WrongType { key: key.to_string(), expected, found: v.type_description() }
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<Option<T>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let i = v.as_i128().ok_or_else(|| Self::wrong_type(key, expected, v))?;
        T::try_from(i)
            .map(Some)
            .map_err(|_| GgufError::OutOfRange { key: key.to_string(), value: i.to_string(), expected })
    }

    /// An unsigned 32-bit integer; any integer type whose value fits is accepted.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.opt_u32(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    /// Like [`get_u32`](Self::get_u32), but an absent key is `Ok(None)`.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.int::<u32>(key, "u32")
    }

    /// A token id key such as `tokenizer.ggml.bos_token_id`: absent or `-1` (llama.cpp's "no such
    /// token") is `Ok(None)`. The reader already checked that every other value is in the vocabulary.
    pub fn opt_token_id(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.int::<i64>(key, "token id")? {
            None | Some(-1) => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| GgufError::OutOfRange { key: key.to_string(), value: v.to_string(), expected: "token id" }),
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.int::<u64>(key, "u64")?.ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    /// A float (f32, or f64 narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.opt_f32(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::F32(x)) => Ok(Some(*x)),
            Some(MetaValue::F64(x)) => Ok(Some(*x as f32)),
            Some(v) => Err(Self::wrong_type(key, "f32", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.opt_bool(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong_type(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.opt_str(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong_type(key, "string", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        match self.require(key)? {
            MetaValue::Array(a) => Ok(a),
            v => Err(Self::wrong_type(key, "array", v)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&StrArray, GgufError> {
        match self.get_array(key)? {
            MetaArray::String(v) => Ok(v),
            _ => Err(Self::wrong_type(key, "array of string", self.require(key)?)),
        }
    }

    /// An array of integers of any integer type whose values all fit in an i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let a = self.get_array(key)?;
        if !a.elem_type().is_integer() {
            return Err(Self::wrong_type(key, "array of integers", self.require(key)?));
        }
        (0..a.len())
            .map(|i| {
                let v = a.int_at(i).unwrap_or_default();
                i32::try_from(v).map_err(|_| GgufError::OutOfRange {
                    key: format!("{key}[{i}]"),
                    value: v.to_string(),
                    expected: "i32",
                })
            })
            .collect()
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Weights in all (the sum of every tensor's elements).
    pub fn n_params(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_elements).sum()
    }

    /// Per storage type, the count of tensors and their bytes.
    pub fn type_mix(&self) -> std::collections::BTreeMap<&'static str, (usize, u64)> {
        let mut mix = std::collections::BTreeMap::new();
        for t in &self.tensors {
            let e = mix.entry(t.type_name()).or_insert((0usize, 0u64));
            e.0 += 1;
            e.1 += t.n_bytes;
        }
        mix
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Releases the process's resident pages of tensor `t`'s bytes where the file is mapped
    /// ([`mmap::release`]: the bytes stay readable and unchanged, later reads fault them back
    /// in); nothing for a file held in memory or a tensor out of bounds.
    pub fn release_tensor_pages(&self, t: &TensorInfo) {
        self.release_tensor_range(t, 0..usize::MAX);
    }

    /// [`GgufFile::release_tensor_pages`] for bytes `range` of tensor `t`'s data (clipped to
    /// them; the pages that hold them, whole).
    pub fn release_tensor_range(&self, t: &TensorInfo, range: std::ops::Range<usize>) {
        if let (Storage::Mapped(map), Ok(data)) = (&self.storage, self.tensor_data(t)) {
            let (start, end) = (range.start.min(data.len()), range.end.min(data.len()));
            if start < end {
                let offset = data.as_ptr() as usize - map.as_ptr() as usize;
                mmap::release(map, offset + start, end - start);
            }
        }
    }

    /// The tensor's bytes: a zero-copy slice of the map. The range was checked when the file was
    /// opened; an info that does not come from this file is an error, not a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let bytes = self.storage.bytes();
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= bytes.len() as u64 => Ok(&bytes[s as usize..e as usize]),
            _ => Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(t.n_bytes),
                data_len: (bytes.len() as u64).saturating_sub(self.data_offset),
            }),
        }
    }

    /// Looks a tensor up by name and returns its info and bytes.
    pub fn tensor_by_name(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::MissingTensor { name: name.to_string() })?;
        Ok((t, self.tensor_data(t)?))
    }
}
